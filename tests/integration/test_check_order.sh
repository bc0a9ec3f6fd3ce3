#!/usr/bin/env bash
# test_check_order.sh: `tracerelay inspect --check-order` catches a clock that is wrong. Two
# hosts; flows go from web-1's loadgen to web-2's through a FIFO (each arrival truly after its
# departure). web-2's loadgen stamps its events 50 ms behind the clock its agent reports to the
# service (--fake-clock on the loadgen only), as an app with a broken clock source would: its
# arrivals land before their departures, by more than the two hosts' clock error bounds. A
# control run with the loadgen's clock right must have no such flow.
# Usage: test_check_order.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
export TR_NO_NETNS=${TR_NO_NETNS:-1} # the clocks are what matters here, not the network

wait_clocks_synced() { # wait_clocks_synced HOST...: up to 60 s for a clock estimate of each
  for _ in $(seq 240); do
    "$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json 2>/dev/null | python3 -c '
import json, sys
hosts = {h["machine_name"]: h for h in json.load(sys.stdin)["hosts"]}
sys.exit(0 if all(n in hosts and hosts[n]["clock"]["synced"] for n in sys.argv[1:]) else 1)' "$@" &&
      return 0
    sleep 0.25
  done
  cluster_log "no clock estimate for all of $* after 60 s"
  return 1
}

run_case() { # run_case NAME LOADGEN_FAKE_CLOCK EXPECTED_EXIT
  cluster_init "$1" "$BASE/$2"
  cluster_hosts web-1 web-2
  cluster_start_service || return 1 # (set -e does not stop a function called before ||)
  cluster_start_agent web-1 || return 1
  cluster_start_agent web-2 || return 1
  mkfifo "$WORK/flows"
  cluster_start_loadgen web-1 --name app-1 --rate 300 --flow-send "$WORK/flows"
  cluster_start_loadgen web-2 --name app-2 --rate 300 --fake-clock "$3" --flow-recv "$WORK/flows"
  cluster_wait_hosts 30 web-1:1 web-2:1 || return 1
  wait_clocks_synced web-1 web-2 || return 1
  "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -t 3s \
    -o "$WORK/trace.pftrace" >"$WORK/record.log" 2>&1 || { cat "$WORK/record.log"; return 1; }
  local rc=0
  "$TR_BIN/tracerelay" inspect --check-order "$WORK/trace.pftrace" >"$WORK/inspect.txt" || rc=$?
  sed -n '/^flow order/,$p' "$WORK/inspect.txt" | head -5
  "$TR_BIN/tracerelay" inspect --json --check-order "$WORK/trace.pftrace" >"$WORK/inspect.json" || true
  cluster_cleanup
  python3 - "$WORK/inspect.json" "$2" "$rc" "$4" <<'PY'
import json, sys
order = json.load(open(sys.argv[1]))["order_check"]
case, rc, expect = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
print(case, "exit", rc, order)
ok = order["crossing_flows"] >= 100 and rc == expect
if expect == 3:
    ok = ok and order["arrival_before_departure"] > 0 and order["beyond_bounds"] > 0
else:
    ok = ok and order["arrival_before_departure"] == 0
sys.exit(0 if ok else 1)
PY
}

BIN=$(cd "$1" && pwd)
BASE=$(mktemp -d /tmp/tracerelay-order.XXXXXX)
CLUSTER_RUN_DIR=$BASE # removed on exit after a pass, kept after a failure (cluster-lib)
STATUS=0
run_case "$BIN" right 0,0 0 || { echo "FAIL: a right clock reported a flow against time"; STATUS=1; }
run_case "$BIN" wrong -50000000,0 3 || { echo "FAIL: a clock 50 ms wrong went unnoticed"; STATUS=1; }
[ "$STATUS" != 0 ] || echo "PASS: test_check_order"
exit $STATUS
