#!/usr/bin/env bash
# test_stop_backlog.sh: a session stops while the agent still holds a backlog of batches for a
# slow link, and the producer leaves right after it stopped (as an app does at exit). The
# producer's "gone" notice must not overtake its own data: the service may end the session only
# once every batch queued before the notice is in. Before that order was kept, the notice went
# out at once, ahead of the backlog, and the session ended without it, with no loss counted.
# web-1's link is limited by tbf in its namespace (8 Mbit/s) and its agent sends uncompressed,
# while its loadgen writes about 2 MB/s, so several MB wait in the agent's spill queue when the
# session stops.
# Every packet written must be in the trace or counted lost; and when the session's stop
# timeout runs out before the backlog is in, that is flagged as a loss of unknown size.
# Usage: test_stop_backlog.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
fault_init "$1"
fault_require_netns
command -v tc >/dev/null || { echo "SKIP: tc is not installed"; exit 77; }
cluster_hosts web-1
cluster_start_service
cluster_start_agent web-1 --no-compress
i=$(host_index web-1)
ip netns exec "$(host_ns "$i")" tc qdisc add dev "tr${CLUSTER_ID}h$i" root tbf \
  rate 8mbit burst 64kb latency 200ms

# record_over_backlog STOP_TIMEOUT_MS OUT: one 3 s session over a loadgen writing 2 MB/s.
record_over_backlog() {
  cluster_start_loadgen web-1 --name app-web-1 --writers 2 --rate 5000 --packet-size 200
  local loadgen=$LOADGEN_PID start rc=0
  cluster_wait_hosts 30 web-1:1 || { echo "FAIL: the loadgen did not connect"; exit 1; }
  start=$(date +%s%N)
  echo "data_source_stop_timeout_ms: $1" |
    "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c - --data-source track_event \
      -b 64mb -t 3s -o "$2" >"$2.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { echo "FAIL: record failed"; cat "$2.log"; exit 1; }
  cluster_log "record took $((($(date +%s%N) - start) / 1000000)) ms for a 3 s session"
  fault_wait_pid "$loadgen" 15 || { echo "FAIL: the loadgen did not stop"; exit 1; }
  wait "$loadgen" || { echo "FAIL: the loadgen did not stop cleanly"; exit 1; }
}

# 1. The stop waits for the backlog (several seconds here): more than the default 5 s is
#    allowed, and then every packet is in the trace.
record_over_backlog 30000 "$WORK/backlog.pftrace"
fault_check_accounting "$WORK/backlog.pftrace" exact web-1

# 2. With a 1 s stop timeout the session ends before the backlog is in: that loss has no
#    packet count, but it must be flagged, in the trace and by record.
record_over_backlog 1000 "$WORK/timeout.pftrace"
grep -q "had not confirmed their stop when the stop timeout ran out.*web-1 (1)" \
  "$WORK/timeout.pftrace.log" ||
  { echo "FAIL: record did not warn about the stop that timed out"; cat "$WORK/timeout.pftrace.log"; exit 1; }
"$TR_BIN/tracerelay" inspect --json "$WORK/timeout.pftrace" >"$WORK/timeout.json"
python3 - "$WORK/timeout.json" <<'PY'
import json, sys
hosts = {h["name"]: h for h in json.load(open(sys.argv[1]))["hosts"]}
got = (hosts["web-1"].get("host_stats") or {}).get("session_stops_timed_out")
if got != 1:
    sys.exit(f"FAIL: web-1's session_stops_timed_out is {got}, want 1")
PY
echo "PASS: test_stop_backlog"
