#!/usr/bin/env bash
# test_cluster.sh: the whole relay with real processes. One service and three agents, each
# agent in its own network namespace with its own certificate, loadgen producers on every
# host, `tracerelay record` on the consumer socket. Checks that the trace decodes, names
# every machine, and holds exactly the packets every loadgen wrote (nothing was lost here, so
# nothing may be missing or counted lost), that `record --progress` shows bytes per host, and
# that agents with a certificate from another CA or without the clientAuth usage are refused
# while the others keep working, and that an agent given a valid certificate under another
# name than its --machine-name refuses to start.
# Usage: test_cluster.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
cluster_init "$1"
HOSTS=(web-1 web-2 web-3)
cluster_hosts "${HOSTS[@]}"
cluster_start_service
for h in "${HOSTS[@]}"; do cluster_start_agent "$h" --machine-name "$h"; done

PACKETS=1500
for h in "${HOSTS[@]}"; do
  cluster_start_loadgen "$h" --name "app-$h" --writers 2 --rate 3000 --packets "$PACKETS" --packet-size 200
done
LOADGENS=("${CLUSTER_PIDS[@]: -3}")

# An agent whose certificate comes from another CA (the service refuses it), and one without
# clientAuth (the agent itself refuses to start with it): neither reaches the trace.
"$TR_SRC/certs/make-certs.sh" "$WORK/rogue" --ca-name "rogue CA" --agent web-1 >/dev/null
"$TR_SRC/certs/make-certs.sh" "$WORK/pki" --agent web-4 --no-client-auth >/dev/null
mkdir -p "$WORK/rogue-agent" "$WORK/noauth-agent"
$(ns_prefix "$(host_ns 1)") "$TR_BIN/tracerelay-agent" --producer-socket "$WORK/rogue-agent/p.sock" \
  --service "$(service_addr_for 1):$SERVICE_PORT" --service-name "$SERVICE_NAME" \
  --ca "$WORK/pki/ca.crt" --cert "$WORK/rogue/agent-web-1.crt" --key "$WORK/rogue/agent-web-1.key" \
  >"$WORK/rogue-agent.log" 2>&1 &
CLUSTER_PIDS+=($!)
$(ns_prefix "$(host_ns 2)") "$TR_BIN/tracerelay-agent" --producer-socket "$WORK/noauth-agent/p.sock" \
  --service "$(service_addr_for 2):$SERVICE_PORT" --service-name "$SERVICE_NAME" \
  --ca "$WORK/pki/ca.crt" --cert "$WORK/pki/agent-web-4.crt" --key "$WORK/pki/agent-web-4.key" \
  >"$WORK/noauth-agent.log" 2>&1 &
CLUSTER_PIDS+=($!)

# web-1's valid certificate, but the agent is meant to be web-9: it must not start.
if "$TR_BIN/tracerelay-agent" --producer-socket "$WORK/misnamed.sock" \
  --service "$(service_addr_for 1):$SERVICE_PORT" --service-name "$SERVICE_NAME" \
  --ca "$WORK/pki/ca.crt" --cert "$WORK/pki/agent-web-1.crt" --key "$WORK/pki/agent-web-1.key" \
  --machine-name web-9 >"$WORK/misnamed-agent.log" 2>&1; then
  echo "FAIL: an agent with web-1's certificate started as --machine-name web-9"; exit 1
fi
grep -q "is for machine 'web-1', not 'web-9'" "$WORK/misnamed-agent.log" || {
  echo "FAIL: the misnamed agent did not say why it refused"; cat "$WORK/misnamed-agent.log"; exit 1; }

cluster_wait_hosts 30 web-1:1 web-2:1 web-3:1 || { echo "FAIL: the loadgens did not connect"; exit 1; }
# The session lasts until record's progress showed bytes for every host (-t 0, then SIGTERM):
# a fixed length could end before that on a busy machine.
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 32mb -t 0 \
  --progress -o "$WORK/cluster.pftrace" 2>"$WORK/record.err" &
RECORD_PID=$!
CLUSTER_PIDS+=("$RECORD_PID")
progress_shows() { # progress_shows HOST: a progress line with bytes for HOST
  grep -Eq "^tracerelay record: recording .* $1 ([1-9][0-9]*|0)\.[0-9] MB" "$WORK/record.err" &&
    grep -Eq " $1 ([1-9][0-9]*\.[0-9]|0\.[1-9]) MB" "$WORK/record.err"
}
for h in "${HOSTS[@]}"; do
  for _ in $(seq 600); do progress_shows "$h" && break; sleep 0.1; done
  progress_shows "$h" || { echo "FAIL: no progress with bytes for $h"; cat "$WORK/record.err"; exit 1; }
done
kill -TERM "$RECORD_PID"
wait "$RECORD_PID" || { echo "FAIL: tracerelay record"; cat "$WORK/record.err"; exit 1; }

for pid in "${LOADGENS[@]}"; do
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  wait "$pid" || { echo "FAIL: loadgen $pid did not stop cleanly"; exit 1; }
done

protoc --decode=perfetto.protos.Trace -I "$TR_SRC/protos" perfetto/trace/trace.proto \
  <"$WORK/cluster.pftrace" >"$WORK/cluster.txt"
"$TR_BIN/tracerelay" inspect --json "$WORK/cluster.pftrace" >"$WORK/inspect.json"

python3 - "$WORK" "${HOSTS[@]}" <<'PY'
import json, sys, glob
work, hosts = sys.argv[1], sys.argv[2:]
report = json.load(open(f"{work}/inspect.json"))
machines = {m.get("name"): m for m in report["hosts"]}
failures = []
for h in hosts:
    written = 0
    for f in glob.glob(f"{work}/loadgen-{h}-*.json"):
        written += json.load(open(f))["total"]["packets_written"]
    m = machines.get(h)
    if m is None:
        failures.append(f"machine {h} missing from the trace (machines: {sorted(machines)})")
        continue
    # Sequence 1 is the service's own (system info, clock sync); producers start at 2.
    got = sum(n for seq, n in m["sequences"].items() if int(seq) >= 2)
    lost = {k: v for k, v in m["losses"].items() if k != "trace_stats_packets" and v}
    print(f"{h}: loadgen wrote {written} packets, trace holds {got}, losses {lost or 'none'}")
    if got != written:
        failures.append(f"{h}: {written} packets written, {got} in the trace")
    if lost:
        failures.append(f"{h}: losses reported on a lossless run: {lost}")
    if m.get("unresolved", 0):
        failures.append(f"{h}: {m['unresolved']} packets with unresolvable timestamps")
for name in ("web-4",):
    if name in machines:
        failures.append(f"{name} (no clientAuth) reached the trace")
if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("cluster trace: every written packet present on its machine")
PY

grep -q "web-1" "$WORK/service.log" || { echo "FAIL: service log does not name web-1"; exit 1; }
for _ in $(seq 300); do grep -Eiq "refus|reject|verify" "$WORK/service.log" && break; sleep 0.1; done
grep -Eiq "refus|reject|verify" "$WORK/service.log" || {
  echo "FAIL: the service did not log refusing the rogue agents"; cat "$WORK/service.log"; exit 1; }
echo "PASS: test_cluster"
