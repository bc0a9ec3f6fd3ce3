#!/usr/bin/env bash
# test_netloss.sh: random packet loss on the relay link. Inside the namespaces of web-1 and
# web-2, nft drops a random share of every IP packet in and out (`numgen random mod 100 < N`):
# 5% on web-1, 20% on web-2; web-3 is clean. TCP retransmits, so nothing may be lost: every
# packet each loadgen wrote is in the trace and no loss is counted. The nft counters must show
# that packets really were dropped (else the test would prove nothing).
# Usage: test_netloss.sh BIN_DIR [TRACE_S]
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
TRACE_S=${2:-12}
fault_init "$1"
fault_require_netns
command -v nft >/dev/null || { echo "SKIP: nft is not installed"; exit 77; }
HOSTS=(web-1 web-2 web-3)
cluster_hosts "${HOSTS[@]}"
cluster_start_service
for h in "${HOSTS[@]}"; do cluster_start_agent "$h"; done

drop_rules() { # drop_rules PERCENT: a table of its own, in the host's namespace only
  cat <<EOF
table inet trfault {
  chain in { type filter hook input priority 0; policy accept;
    meta l4proto tcp numgen random mod 100 < $1 counter drop
  }
  chain out { type filter hook output priority 0; policy accept;
    meta l4proto tcp numgen random mod 100 < $1 counter drop
  }
}
EOF
}
fault_nft web-1 "$(drop_rules 5)"
fault_nft web-2 "$(drop_rules 20)"

WRITE_S=$((TRACE_S - 4))
for h in "${HOSTS[@]}"; do
  cluster_start_loadgen "$h" --name "app-$h" --writers 2 --rate 500 --packet-size 300 \
    --duration "$WRITE_S"
done
LOADGENS=("${CLUSTER_PIDS[@]: -3}")
cluster_wait_hosts 60 web-1:1 web-2:1 web-3:1 || { echo "FAIL: the loadgens did not connect"; exit 1; }
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 32mb \
  -t "${TRACE_S}s" -o "$WORK/netloss.pftrace" >"$WORK/record.log" 2>&1 ||
  { echo "FAIL: record failed"; cat "$WORK/record.log"; exit 1; }
for pid in "${LOADGENS[@]}"; do
  fault_wait_pid "$pid" 15 || { echo "FAIL: loadgen $pid did not stop"; exit 1; }
  wait "$pid" || { echo "FAIL: loadgen $pid did not stop cleanly"; exit 1; }
done

for h in web-1 web-2; do
  i=$(host_index "$h")
  dropped=$(ip netns exec "$(host_ns "$i")" nft list table inet trfault |
    awk '/counter/ { for (k = 1; k < NF; k++) if ($k == "packets") s += $(k + 1) } END { print s + 0 }')
  cluster_log "$h: nft dropped $dropped packets"
  [ "$dropped" -gt 0 ] || { echo "FAIL: nft dropped nothing on $h"; exit 1; }
done
fault_check_accounting "$WORK/netloss.pftrace" lossless "${HOSTS[@]}"
echo "PASS: test_netloss"
