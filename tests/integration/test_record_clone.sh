#!/usr/bin/env bash
# test_record_clone.sh: snapshots of a live session (issue 38 item 2). Three hosts (agents in
# network namespaces, a loadgen each) record into a session with unique_session_name "live";
# `tracerelay record --clone-by-name live` gives a trace holding every host's data while the
# session keeps running, which later ends normally with every host in its trace; a second
# session of that name is refused with traced's text; --clone of an unknown id fails cleanly.
# Usage: test_record_clone.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
fail() { echo "FAIL: $*"; exit 1; }
cluster_init "$1"
HOSTS=(web-1 web-2 web-3)
cluster_hosts "${HOSTS[@]}"
cluster_start_service
for h in "${HOSTS[@]}"; do cluster_start_agent "$h" --machine-name "$h"; done
for h in "${HOSTS[@]}"; do cluster_start_loadgen "$h" --name "app-$h" --rate 500; done
cluster_wait_hosts 60 web-1:1 web-2:1 web-3:1 || fail "the loadgens did not connect"

printf '%s\n' 'buffers { size_kb: 8192 fill_policy: RING_BUFFER }' 'unique_session_name: "live"' \
  'data_sources { config { name: "track_event" } }' >"$WORK/live.pbtxt"
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/live.pbtxt" -t 0 \
  -o "$WORK/live.pftrace" 2>"$WORK/live.err" &
LIVE_PID=$!
CLUSTER_PIDS+=("$LIVE_PID")
cluster_wait_session 60 "${HOSTS[@]}" || fail "the session does not run on every host"

# A second session of the same name: refused in traced's words.
if "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/live.pbtxt" -t 1s \
  -o "$WORK/dup.pftrace" 2>"$WORK/dup.err"; then
  fail "a second session named live was recorded"
fi
grep -q "A trace with this unique session name (live) already exists" "$WORK/dup.err" ||
  fail "the refusal does not say why: $(cat "$WORK/dup.err")"

"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --clone-by-name live \
  -o "$WORK/clone.pftrace" 2>"$WORK/clone.err" || fail "the clone failed: $(cat "$WORK/clone.err")"
cat "$WORK/clone.err"
grep -q "^tracerelay record: wrote .*clone.pftrace; 3 hosts" "$WORK/clone.err" ||
  fail "the clone's summary does not count the three hosts"
! grep -q "link was down" "$WORK/clone.err" || fail "the clone says live links were down"
kill -0 "$LIVE_PID" || fail "the session's record ended with the clone"
if "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --clone 999999 \
  -o "$WORK/none.pftrace" 2>"$WORK/none.err"; then
  fail "--clone of an unknown session succeeded"
fi
grep -q "failed to clone tracing session 999999: Tracing session not found" "$WORK/none.err" ||
  fail "--clone of an unknown id: $(cat "$WORK/none.err")"
[ ! -e "$WORK/none.pftrace" ] || fail "a failed clone left a file"

# The session goes on after the clone, and ends normally.
cluster_wait_session 30 "${HOSTS[@]}" || fail "the session stopped running after the clone"
kill -TERM "$LIVE_PID"
wait "$LIVE_PID" || fail "the session's record exited $?: $(cat "$WORK/live.err")"

for t in clone live; do
  "$TR_BIN/tracerelay" inspect --json "$WORK/$t.pftrace" >"$WORK/$t.json" ||
    fail "$t.pftrace does not read back"
done
python3 - "$WORK" "${HOSTS[@]}" <<'PY'
import json, sys
work, hosts = sys.argv[1], sys.argv[2:]
failures = []
for t in ("clone", "live"):
    machines = {m.get("name"): m for m in json.load(open(f"{work}/{t}.json"))["hosts"]}
    for h in hosts:
        m = machines.get(h)
        got = sum(n for seq, n in m["sequences"].items() if int(seq) >= 2) if m else 0
        print(f"{t}: {h} holds {got} packets")
        if got == 0:
            failures.append(f"{t}.pftrace holds nothing of {h}")
if failures:
    print("FAIL: " + "; ".join(failures))
    sys.exit(1)
PY
echo "PASS: test_record_clone"
