#!/usr/bin/env bash
# test_buffer_budget.sh: the service-wide budget of central buffer memory (max-buffer-memory,
# here from the service's config file) through the real consumer socket and real agents: with
# three hosts connected, `tracerelay record` of a config whose buffers on every host would pass
# it is refused, the error naming the product (buffers x hosts) and writing no trace; a session
# that fits runs, and a second one that would pass the budget with what the first reserves is
# refused saying so; a fourth host joining the running session past the budget is logged by
# the service with the reason (its chunks are refused and counted: test_session_budget).
# Usage: test_buffer_budget.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/common.sh"
fail() { echo "FAIL: $*"; exit 1; }
log() { echo "FAIL: $*"; }

cluster_init "$1"
cluster_hosts web-1 web-2 web-3 web-4
printf '%s\n' '# 3.5 MiB: three hosts of 1 MiB fit, four do not' 'max-buffer-memory = 3584K' \
  >"$WORK/service.conf"
cluster_start_service --config "$WORK/service.conf"
grep -q "at most 3.5 MiB (--max-buffer-memory)" "$WORK/service.log" ||
  fail "the service did not log its budget: $(cat "$WORK/service.log")"
for h in web-1 web-2 web-3; do cluster_start_agent "$h"; done
cluster_wait_hosts 60 web-1 web-2 web-3


printf '%s\n' 'buffers { size_kb: 1024 }' 'buffers { size_kb: 1024 }' 'duration_ms: 500' \
  'data_sources { config { name: "track_event" } }' >"$WORK/two.pbtxt"
record_refused two "buffers of 2 x 1 MiB on each of 3 hosts = 6 MiB, over --max-buffer-memory 3.5 MiB" \
  -c "$WORK/two.pbtxt"

# One 1 MiB buffer on three hosts fits; it runs until the checks are done.
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 1mb -t 0 \
  -o "$WORK/fits.pftrace" >"$WORK/fits.log" 2>&1 &
RECORD_PID=$!
CLUSTER_PIDS+=("$RECORD_PID")
session_hosts() {
  "$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json 2>/dev/null | python3 -c '
import json, sys
print(sum(any(s["state"] == "STARTED" for s in h["sessions"]) for h in json.load(sys.stdin)["hosts"]))'
}
ok=0
for _ in $(seq 240); do
  [ "$(session_hosts || echo 0)" = 3 ] && { ok=1; break; }
  kill -0 "$RECORD_PID" 2>/dev/null || fail "record exited: $(cat "$WORK/fits.log")"
  sleep 0.25
done
[ "$ok" = 1 ] || fail "the session that fits did not start on the three hosts"

record_refused second "buffers of 1 x 1 MiB on each of 3 hosts = 3 MiB, over --max-buffer-memory 3.5 MiB with the 3 MiB running sessions reserve" \
  --data-source track_event -b 1mb -t 500ms

cluster_start_agent web-4
ok=0
for _ in $(seq 240); do
  grep -q "host web-4 joined past the buffer budget" "$WORK/service.log" && { ok=1; break; }
  sleep 0.25
done
[ "$ok" = 1 ] || fail "web-4 joining past the budget was not logged"
grep "host web-4 joined past the buffer budget" "$WORK/service.log"
n=$(grep -c "joined past the buffer budget" "$WORK/service.log")
[ "$n" = 1 ] || fail "$n budget lines, not one (web-4's)"
kill -TERM "$RECORD_PID"
wait "$RECORD_PID" || fail "the session that fit did not end cleanly: $(cat "$WORK/fits.log")"
echo "PASS: test_buffer_budget"
