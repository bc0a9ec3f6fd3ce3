#!/usr/bin/env bash
# test_traced_relay.sh: Perfetto's own traced_relay (v58.2 or another release, unmodified) joins the cluster
# through an agent's relay endpoint (issue 40 item 2), when TR_TRACED_RELAY names the binary
# (skipped, exit 77, without it). Two "guests", each a network namespace of its own bridged to
# web-1's (the agent's), each running traced_relay (PERFETTO_MACHINE_NAME guest1 / guest2,
# PERFETTO_RELAY_SOCK_NAME the agent's --relay-listen address) and an SDK producer app
# (TR_PERFETTO_PRODUCER, default apps/producer next to the Perfetto build) on its local
# producer socket, as in a VM. A `tracerelay record` session must hold each guest as a machine
# of its own, web-1/guest1 and web-1/guest2, with its data, every packet of each placed on the
# timeline (inspect: unresolved 0) and a clock error bound track like every host's. Without
# namespaces (not root) the guests run on loopback, still two machines by their names. A
# traced_relay older than v53 names no machine: both guests, on one kernel, are then the one
# machine web-1/guest-<boot id hint>, as in traced, which must hold both guests' data; one
# older than v48 has no RelayPort (SyncClock): its guests' data is in the trace, unplaced, and
# the service must say so in its log.
# Usage: test_traced_relay.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
RELAY=${TR_TRACED_RELAY:-}
if [ -z "$RELAY" ] || [ ! -x "$RELAY" ]; then
  echo "SKIP: TR_TRACED_RELAY does not name Perfetto's traced_relay"
  exit 77
fi
PRODUCER=${TR_PERFETTO_PRODUCER:-$(dirname "$RELAY")/../../apps/producer}
[ -x "$PRODUCER" ] || { echo "SKIP: no SDK producer app (TR_PERFETTO_PRODUCER)"; exit 77; }
source "$TR_SRC/tools/cluster-lib.sh"
fail() { echo "FAIL: $*"; exit 1; }
cluster_init "$1"
cluster_hosts web-1
GUESTS=(guest1 guest2)
if [ "$USE_NETNS" = 1 ]; then
  # The guests' network: a bridge in web-1's namespace (gone with it), a veth per guest.
  H=$(host_ns 1)
  ip -n "$H" link add trbr type bridge
  ip -n "$H" addr add 10.201.0.1/24 dev trbr
  ip -n "$H" link set trbr up
  for i in 1 2; do
    G="tr${CLUSTER_ID}-g$i"
    ip netns add "$G"; CLUSTER_NETNS+=("$G")
    ip -n "$G" link set lo up
    ip link add "trga$i" netns "$H" type veth peer name "trgb$i" netns "$G"
    ip -n "$H" link set "trga$i" master trbr up
    ip -n "$G" addr add "10.201.0.$((i + 1))/24" dev "trgb$i"
    ip -n "$G" link set "trgb$i" up
  done
  RELAY_ADDR=10.201.0.1:20001
else
  RELAY_ADDR=127.0.0.1:$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi
cluster_start_service
cluster_start_agent web-1 --relay-listen "$RELAY_ADDR"
cluster_wait_hosts 30 web-1 || fail "the agent did not connect"
for i in 1 2; do
  g=${GUESTS[$((i - 1))]}
  G=""; [ "$USE_NETNS" = 1 ] && G="tr${CLUSTER_ID}-g$i"
  mkdir -p "$WORK/$g"
  $(ns_prefix "$G") env PERFETTO_MACHINE_NAME="$g" PERFETTO_PRODUCER_SOCK_NAME="$WORK/$g/producer.sock" \
    PERFETTO_RELAY_SOCK_NAME="$RELAY_ADDR" "$RELAY" >"$WORK/relay-$g.log" 2>&1 &
  CLUSTER_PIDS+=($!)
  wait_for_socket "$WORK/$g/producer.sock" $!
  $(ns_prefix "$G") env PERFETTO_PRODUCER_SOCK_NAME="$WORK/$g/producer.sock" \
    "$PRODUCER" -n 20 -t 120 >"$WORK/producer-$g.log" 2>&1 &
  CLUSTER_PIDS+=($!)
done
# The guests' machines: web-1/guest1 and web-1/guest2 from traced_relay v53 on, whose
# SetPeerIdentity names its machine; an older one sends only machine_id_hint (its boot id) and
# becomes web-1/guest-<hint>, the two guests on this one kernel one machine with both
# producers, as traced makes of them (docs/compat.md).
guest_machines() {
  for _ in $(seq 120); do
    cluster_status_hosts | python3 -c '
import sys
rows = [l.split() for l in sys.stdin]
named = {n: int(p) for n, c, p in rows if n in ("web-1/guest1", "web-1/guest2") and c == "1"}
unnamed = [n for n, c, p in rows if n.startswith("web-1/guest-") and c == "1" and int(p) >= 2]
if len(named) == 2 and min(named.values()) >= 1:
    print("web-1/guest1 web-1/guest2")
elif unnamed and not named:
    print(unnamed[0])
else:
    sys.exit(1)' && return 0
    sleep 0.25
  done
  return 1
}
read -r -a GUEST_MACHINES <<<"$(guest_machines)" || true
[ "${#GUEST_MACHINES[@]}" -gt 0 ] ||
  fail "the guests did not join with their producers: $(cluster_status_hosts | tr '\n' ';')"
echo "guest machines: ${GUEST_MACHINES[*]}"
# traced_relay has RelayPort (SyncClock) from v48: an older one's guests have no clock mapping.
RELEASE=$("$RELAY" --version 2>&1 | sed -n 's/^Perfetto v\([0-9]*\)\..*/\1/p' | head -1)
SYNCED=1
[ -n "$RELEASE" ] && [ "$RELEASE" -lt 48 ] && SYNCED=0

"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -t 0 \
  -o "$WORK/trace.pftrace" 2>"$WORK/record.err" &
REC_PID=$!
CLUSTER_PIDS+=("$REC_PID")
cluster_wait_session 60 "${GUEST_MACHINES[@]}" || fail "the session does not run on the guests"
kill -TERM "$REC_PID"
wait "$REC_PID" || fail "record exited $?: $(cat "$WORK/record.err")"
"$TR_BIN/tracerelay" inspect --json "$WORK/trace.pftrace" >"$WORK/trace.json" ||
  fail "the trace does not read back"
python3 - "$WORK/trace.json" "$SYNCED" "${GUEST_MACHINES[@]}" <<'PY' || fail "the guests are not machines of their own on the timeline"
import json, sys
hosts = {h["name"]: h for h in json.load(open(sys.argv[1]))["hosts"]}
synced, guests = sys.argv[2] == "1", sys.argv[3:]
for g in guests:
    h = hosts.get(g)
    if h is None:
        sys.exit("no machine %s in the trace (machines: %s)" % (g, sorted(hosts)))
    if h["packets"] < 100 * (3 - len(guests)):  # one machine of both guests holds both's
        sys.exit("%s has %d packets" % (g, h["packets"]))
    if not synced:  # no SyncClock: nothing places the guest's data; the service said so
        if h["unresolved"] == 0:
            sys.exit("%s: a relay without SyncClock, yet its packets are placed" % g)
        print("%s: %d of %d packets unplaced (a traced_relay without SyncClock)" % (
            g, h["unresolved"], h["packets"]))
        continue
    if h["unresolved"] != 0:
        sys.exit("%s: %d packets not placed on the timeline" % (g, h["unresolved"]))
    if not h.get("clock_error_bound_track", {}).get("samples"):
        sys.exit("%s has no clock error bound track" % g)
    if h["machine_id"] == hosts["web-1"]["machine_id"]:
        sys.exit("%s shares web-1's machine id" % g)
    print("%s: %d packets, all placed, error bound track of %d samples (largest %.1f us)" % (
        g, h["packets"], h["clock_error_bound_track"]["samples"],
        h["clock_error_bound_track"]["largest_us"]))
PY
if [ "$SYNCED" = 0 ]; then
  for g in "${GUEST_MACHINES[@]}"; do
    grep -q "guest machine $g sent data but its traced_relay made no clock exchange" "$WORK/service.log" ||
      fail "the service did not say that $g's data has no place on the timeline"
  done
  echo "traced_relay v$RELEASE has no SyncClock: the service says its guests' data has no place"
fi
echo PASS
