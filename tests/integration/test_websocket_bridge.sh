#!/usr/bin/env bash
# test_websocket_bridge.sh: a whole cluster recorded from the Perfetto UI's "Record new trace"
# page, through Perfetto's own websocket_bridge pointed at the service's consumer socket
# (docs/querying.md#recording-from-the-perfetto-ui). Three hosts with loadgens; the bridge
# runs in the service's network namespace (its port, 8037, is fixed: there it is the
# cluster's own) with PERFETTO_CONSUMER_SOCK_NAME naming the consumer socket; ui_record.py
# speaks to it as the UI v58.2 does (management connection and QueryServiceState, then
# EnableTracing, GetTraceStats every second, Stop = Flush + DisableTracing, ReadBuffers).
# Three sessions: one of a data source no host has, whose buffer usage must read 0 % (not
# NaN %); one stopped with Stop once every host relays data and the page shows a buffer usage;
# one that ends with its duration. The last two traces must name every host and hold exactly
# the packets its loadgens wrote (every host's app wrote some, in the stopped one), with no
# losses and 0 unresolved timestamps (fault-lib's lossless check: a producer's own drops in its
# full shared memory on a starved machine are said, not failed), and the page's checks table
# must list every host's producer.
# Runs only when TR_WEBSOCKET_BRIDGE names a websocket_bridge binary (Perfetto is not built
# here: docs/compat.md says how to get one); exit 77 (skipped) otherwise.
# Usage: test_websocket_bridge.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
BRIDGE_BIN=${TR_WEBSOCKET_BRIDGE:-}
if [ -z "$BRIDGE_BIN" ] || [ ! -x "$BRIDGE_BIN" ]; then
  echo "SKIP: set TR_WEBSOCKET_BRIDGE=/path/to/websocket_bridge to run this test"
  exit 77
fi
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
cluster_init "$1"
HOSTS=(web-1 web-2 web-3)
cluster_hosts "${HOSTS[@]}"
BNS=$(svc_ns || true) # empty without namespaces
if [ -z "$BNS" ] && [ -n "$(ss -Hltn 'sport = :8037' 2>/dev/null)" ]; then
  echo "SKIP: no network namespaces here and port 8037 (websocket_bridge's, fixed) is in use"
  exit 77
fi
cluster_start_service
for h in "${HOSTS[@]}"; do cluster_start_agent "$h" --machine-name "$h"; done

PERFETTO_CONSUMER_SOCK_NAME=$CONSUMER_SOCK $(ns_prefix "$BNS") "$BRIDGE_BIN" \
  >"$WORK/bridge.log" 2>&1 &
CLUSTER_PIDS+=($!)
for _ in $(seq 100); do grep -qs "Listening on" "$WORK/bridge.log" && break; sleep 0.1; done
grep -qs "Listening on" "$WORK/bridge.log" ||
  { echo "FAIL: websocket_bridge is not listening"; cat "$WORK/bridge.log"; exit 1; }

# start_loadgens RUN: one loadgen per host (2 writers, at most 1500 events each).
start_loadgens() {
  LOADGENS=()
  for h in "${HOSTS[@]}"; do
    cluster_start_loadgen "$h" --name "app-$h" --writers 2 --rate 2000 --packets 1500 \
      --packet-size 200
    LOADGENS+=("$LOADGEN_PID")
  done
  cluster_wait_hosts 30 web-1:1 web-2:1 web-3:1 || { echo "FAIL: $1: loadgens not connected"; exit 1; }
}

# check_trace RUN: the loadgens have ended with the session; the trace holds every packet they
# wrote, on its host, nothing lost and every timestamp resolved (fault-lib's lossless check);
# the page's checks table listed every host's producer.
check_trace() {
  local run=$1 pid
  for pid in "${LOADGENS[@]}"; do
    fault_wait_pid "$pid" 15 || { echo "FAIL: $run: loadgen $pid still runs after the session"; exit 1; }
    wait "$pid" || { echo "FAIL: $run: loadgen $pid did not stop cleanly"; exit 1; }
  done
  fault_check_accounting "$WORK/$run.pftrace" lossless "${HOSTS[@]}" || { echo "FAIL: $run"; exit 1; }
  mkdir -p "$WORK/$run.loadgens"
  mv "$WORK"/loadgen-*.json "$WORK/$run.loadgens/"
  python3 - "$WORK/$run.summary.json" "$WORK/$run.loadgens" "$run" "${HOSTS[@]}" <<'PY'
import glob, json, sys
ui, loadgens, run, hosts = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4:]
state = ui["preflight"]["last_state"]
listed = {(p["name"], p["machine_name"]) for p in state["producers"]}
print(f"{run}: the page's checks: {ui['preflight']['replies']} QueryServiceState reply(s), "
      f"#producers {len(state['producers'])}, #datasources {state['data_sources']}; "
      f"buffer usage polls {ui['buffer_usage']}; {ui['packets']} packets read back")
missing = [h for h in hosts if (f"app-{h}", h) not in listed]
if missing:
    print(f"FAIL: {run}: the checks list no producer app-HOST on machine HOST for {missing}: "
          f"{sorted(listed)}")
    sys.exit(1)
# Stopped only once every host relayed data: each host's app wrote packets (all in the trace).
idle = [h for h in hosts if not sum(json.load(open(f))["total"]["packets_written"]
                                    for f in glob.glob(f"{loadgens}/loadgen-{h}-*.json"))]
if run == "stop" and idle:
    print(f"FAIL: {run}: no packets written on {idle}")
    sys.exit(1)
PY
}

ui_record() { # ui_record RUN [ui_record.py flags]: in the bridge's namespace
  local run=$1; shift
  $(ns_prefix "$BNS") python3 "$TR_SRC/tests/integration/ui_record.py" \
    --out "$WORK/$run.pftrace" --summary "$WORK/$run.summary.json" --category loadgen "$@"
}

# ui_record_stopped RUN [ui_record.py flags]: the Stop button, pressed once the page shows a
# buffer usage and every host relays data in a started session (when loadgens run); a long
# duration, so that Stop ends it.
ui_record_stopped() {
  local run=$1; shift
  mkfifo "$WORK/$run.ctl"
  ui_record "$run" --duration-ms 600000 "$@" <"$WORK/$run.ctl" >"$WORK/$run.out" \
    2>"$WORK/$run.err" &
  UI_PID=$!
  CLUSTER_PIDS+=("$UI_PID")
  exec 3>"$WORK/$run.ctl"
  for _ in $(seq 300); do
    grep -q "buffer usage" "$WORK/$run.out" && break
    kill -0 "$UI_PID" 2>/dev/null || break
    sleep 0.1
  done
  grep -q "buffer usage" "$WORK/$run.out" ||
    { echo "FAIL: $run: no buffer usage shown"; cat "$WORK/$run.out" "$WORK/$run.err"; exit 1; }
  if [ "${#LOADGENS[@]}" -gt 0 ]; then
    cluster_wait_session 60 web-1 web-2 web-3 || { echo "FAIL: $run: hosts not recording"; exit 1; }
  fi
  echo stop >&3
  exec 3>&-
  wait "$UI_PID" || { echo "FAIL: $run: the UI's recording"; cat "$WORK/$run.err"; exit 1; }
}

# Run 0: a data source no host has (the Linux page's ftrace without traced_probes anywhere):
# the page's buffer usage must read 0 %, as with traced, not NaN % (no buffer_stats at all).
LOADGENS=()
ui_record_stopped unmatched --data-source linux.ftrace
BAD=$(grep "buffer usage" "$WORK/unmatched.out" | grep -v "buffer usage 0 %" || true)
[ -z "$BAD" ] || { echo "FAIL: unmatched: the page shows '${BAD%%$'\n'*}' (0 % expected)"; exit 1; }
echo "unmatched: the page's buffer usage reads $(grep -m1 "buffer usage" "$WORK/unmatched.out" |
  sed 's/ui_record: buffer usage //') with no host's data"

# Run 1: Stop, with every host's loadgen.
start_loadgens stop
ui_record_stopped stop
grep -q "buffer usage [0-9]" "$WORK/stop.out" ||
  { echo "FAIL: stop: $(grep -m1 "buffer usage" "$WORK/stop.out")"; exit 1; }
check_trace stop

# Run 2: the session ends with its duration (the page's default flow), read back at once.
start_loadgens duration
ui_record duration --duration-ms 2000 </dev/null >"$WORK/duration.out" 2>"$WORK/duration.err" ||
  { echo "FAIL: duration: the UI's recording"; cat "$WORK/duration.err"; exit 1; }
check_trace duration
echo "PASS: test_websocket_bridge"
