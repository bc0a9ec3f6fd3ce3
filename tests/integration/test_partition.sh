#!/usr/bin/env bash
# test_partition.sh: a 10 s network partition in the middle of a steady-rate trace.
# Three hosts, each with a loadgen writing at a steady rate for the whole trace:
#   web-1: default spill queue (64 MiB); its link goes down for 10 s: nothing may be lost,
#          every written packet is in the trace, no loss is counted.
#   web-2: a 1 MiB spill queue without compression; its link goes down for the same 10 s,
#          which holds far more than 1 MiB: losses happen and are counted exactly:
#          packets written = packets in the trace + packets counted lost (host_stats).
#   web-3: never partitioned: lossless, and unaffected by the others.
# The partition is `ip link set down` of the host's veth inside its namespace (the agent's
# and the service's heartbeats both time out after 8 s, so the link really is torn down and
# rebuilt). It starts once the session runs (status), and the session lasts until both hosts
# are back (record -t 0, then SIGTERM; a stop timeout of 60 s lets the backlog in): a fixed
# session length could end it first on a busy machine; it ends 2 s after the loadgens stopped
# writing (TRACE_S - 6 s after they began), or after both hosts are back if that is later.
# Usage: test_partition.sh BIN_DIR [TRACE_S] [PARTITION_S]
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
TRACE_S=${2:-24}
PART_S=${3:-10}
fault_init "$1"
fault_require_netns
HOSTS=(web-1 web-2 web-3)
cluster_hosts "${HOSTS[@]}"
cluster_start_service
cluster_start_agent web-1
cluster_start_agent web-2 --spill-mb 1 --no-compress
cluster_start_agent web-3

# 2 writers x 250 events/s x 1000 bytes: about 500 KB/s per host, 5 MB per partition.
WRITE_S=$((TRACE_S - 6))
WRITE_START=$SECONDS
for h in "${HOSTS[@]}"; do
  cluster_start_loadgen "$h" --name "app-$h" --writers 2 --rate 250 --packet-size 1000 \
    --duration "$WRITE_S"
done
LOADGENS=("${CLUSTER_PIDS[@]: -3}")
cluster_wait_hosts 30 web-1:1 web-2:1 web-3:1 || { echo "FAIL: the loadgens did not connect"; exit 1; }

echo "data_source_stop_timeout_ms: 60000" |
  "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c - --data-source track_event -b 48mb \
    -t 0 -o "$WORK/partition.pftrace" >"$WORK/record.log" 2>&1 &
RECORD_PID=$!
CLUSTER_PIDS+=("$RECORD_PID")

cluster_wait_session 60 "${HOSTS[@]}" || { echo "FAIL: the session did not start"; exit 1; }
sleep 3 # the hosts write a while before the partition
cluster_log "partition: web-1 and web-2 down for ${PART_S}s"
T0=$SECONDS
fault_link web-1 down
fault_link web-2 down
sleep "$PART_S"
fault_link web-1 up
fault_link web-2 up
cluster_log "partition over after $((SECONDS - T0))s"
cluster_wait_session 60 web-1 web-2 || { echo "FAIL: web-1 and web-2 did not come back"; exit 1; }
# The loadgens' writing time over, and 2 s for the backlog: as long as the fixed session was.
while [ $((SECONDS - WRITE_START)) -lt $((WRITE_S + 2)) ]; do sleep 0.5; done
kill -TERM "$RECORD_PID"
fault_wait_pid "$RECORD_PID" 90 || { echo "FAIL: record did not finish"; exit 1; }
wait "$RECORD_PID" || { echo "FAIL: record failed"; cat "$WORK/record.log"; exit 1; }
for pid in "${LOADGENS[@]}"; do
  fault_wait_pid "$pid" 10 || { echo "FAIL: loadgen $pid did not stop"; exit 1; }
  wait "$pid" || { echo "FAIL: loadgen $pid did not stop cleanly"; exit 1; }
done

# The partition really broke both links (else the test proves nothing).
for h in web-1 web-2; do
  grep -q "$h" "$WORK/service.log" || true
done
n_reconnect=$(grep -c "agent restarted\|connected" "$WORK/service.log" || true)
cluster_log "service log: $n_reconnect connection lines"

fault_check_accounting "$WORK/partition.pftrace" lossless web-1 web-3
FAULT_EXPECT_LOSS=web-2 fault_check_accounting "$WORK/partition.pftrace" exact web-2
echo "PASS: test_partition"
