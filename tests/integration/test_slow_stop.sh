#!/usr/bin/env bash
# test_slow_stop.sh: a producer that confirms its stop 6 s after it was asked (a data source
# whose teardown takes that long; tracerelay-loadgen --stop-delay), under a session whose
# data_source_stop_timeout_ms is 20 s. The agent must wait for it as long as the session says
# (issue 24: it gave every producer 5 s, answered the service that the stop had failed, and the
# session ended without what the producer wrote in its last second: about 1100 packets). So:
# no stop reported as timed out, and every packet written is in the trace, no loss counted.
# Usage: test_slow_stop.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
fault_init "$1"
cluster_hosts web-1
cluster_start_service
cluster_start_agent web-1
cluster_start_loadgen web-1 --name slow-stop --rate 1000 --stop-delay 6
LOADGEN=$LOADGEN_PID
cluster_wait_hosts 20 web-1:1 || { echo "FAIL: the loadgen did not connect"; exit 1; }

echo "data_source_stop_timeout_ms: 20000" |
  "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c - --data-source track_event \
    -b 16mb -t 1s -o "$WORK/slow-stop.pftrace" >"$WORK/record.log" 2>&1 ||
  { echo "FAIL: record failed"; cat "$WORK/record.log"; exit 1; }
fault_wait_pid "$LOADGEN" 30 || { echo "FAIL: the loadgen did not stop"; exit 1; }
wait "$LOADGEN" || { echo "FAIL: the loadgen did not stop cleanly"; exit 1; }

if grep -q "had not confirmed their stop" "$WORK/record.log"; then
  echo "FAIL: record warned about a stop that timed out"; cat "$WORK/record.log"; exit 1
fi
fault_check_accounting "$WORK/slow-stop.pftrace" lossless web-1
echo "PASS: test_slow_stop"
