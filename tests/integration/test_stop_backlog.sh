#!/usr/bin/env bash
# test_stop_backlog.sh: a session stops while the agent still holds a backlog of batches for a
# slow link, and the producer leaves right after it stopped (as an app does at exit). The
# producer's "gone" notice must not overtake its own data: the service may end the session only
# once every batch queued before the notice is in. Before that order was kept, the notice went
# out at once, ahead of the backlog, and the session ended without it, with no loss counted.
# web-1's link is limited by tbf in its namespace (8 Mbit/s) and its agent sends uncompressed,
# while its loadgen writes about 2 MB/s, so several MB wait in the agent's spill queue when the
# session stops.
# Every packet written must be in the trace or counted lost.
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

cluster_start_loadgen web-1 --name app-web-1 --writers 2 --rate 5000 --packet-size 200
LOADGEN=$LOADGEN_PID
sleep 0.5
start=$(date +%s%N)
# The stop waits for the backlog (several seconds here): more than the default 5 s is allowed.
echo "data_source_stop_timeout_ms: 30000" |
  "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c - --data-source track_event -b 64mb \
    -t 3s -o "$WORK/backlog.pftrace" >"$WORK/record.log" 2>&1 ||
  { echo "FAIL: record failed"; cat "$WORK/record.log"; exit 1; }
took_ms=$((($(date +%s%N) - start) / 1000000))
fault_wait_pid "$LOADGEN" 15 || { echo "FAIL: the loadgen did not stop"; exit 1; }
wait "$LOADGEN" || { echo "FAIL: the loadgen did not stop cleanly"; exit 1; }
cluster_log "record took ${took_ms} ms for a 3 s session"
fault_check_accounting "$WORK/backlog.pftrace" exact web-1
echo "PASS: test_stop_backlog"
