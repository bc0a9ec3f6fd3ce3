#!/usr/bin/env bash
# test_relay_endpoint.sh: the agent's relay endpoint (--relay-listen, issue 40 item 2) answers
# Perfetto v58.2's traced_relay as traced does, checked with the recorded streams (always run;
# test_traced_relay.sh runs the real binary). Over TCP to the agent: relay-client.to-service.bin
# (traced_relay's RelayPort connection: SetPeerIdentity, BindService, InitRelay, two SyncClock)
# must get its 4 replies, all successful, and make guest machine "web-1/guest1" appear at the
# service; producer-emulated.to-service.bin (a producer behind traced_relay) must be told
# use_shmem_emulation and appear as that guest's producer, never as web-1's; when both
# connections close the guest is gone.
# With `regional`, web-1 sits behind a regional (regional-a), which must carry the guest up.
# Usage: test_relay_endpoint.sh BIN_DIR [regional]
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
VEC=$TR_SRC/tests/vectors/ipc
source "$TR_SRC/tools/cluster-lib.sh"
export TR_NO_NETNS=1
fail() { echo "FAIL: $*"; exit 1; }
cluster_init "$1"
if [ "${2:-}" = regional ]; then # web-1 behind a regional: the guest's frames cross it
  cluster_tree regional-a=web-1
  cluster_start_service --relay-allow 'regional-a=web-*'
  cluster_start_regional regional-a
else
  cluster_hosts web-1
  cluster_start_service
fi
RPORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cluster_start_agent web-1 --relay-listen "127.0.0.1:$RPORT"
cluster_wait_hosts 30 web-1 || fail "the agent did not connect"

# guest_json NAME: the service's status entry of NAME ({} if none).
guest_json() {
  "$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json | python3 -c '
import json, sys
print(json.dumps(next((h for h in json.load(sys.stdin)["hosts"] if h["machine_name"] == sys.argv[1]), {})))' "$1"
}
wait_for() { # wait_for SECONDS PYTHON-CONDITION-ON-h (the guest's entry)
  local n=$(($1 * 4))
  for _ in $(seq "$n"); do
    python3 -c "import json, sys; h = json.loads(sys.argv[1]); sys.exit(0 if ($2) else 1)" \
      "$(guest_json web-1/guest1)" && return 0
    sleep 0.25
  done
  echo "status of web-1/guest1: $(guest_json web-1/guest1)"
  return 1
}

touch "$WORK/hold-relay" "$WORK/hold-producer"
python3 "$TR_SRC/tests/integration/replay_ipc.py" "127.0.0.1:$RPORT" \
  "$VEC/relay-client.to-service.bin" 4 "$WORK/hold-relay" >"$WORK/relay.out" 2>&1 &
RELAY_PID=$!
wait_for 30 'h.get("connected")' || fail "the replayed traced_relay made no guest machine"
expected=$'1 bind_reply ok\n2 reply ok \n3 reply ok \n4 reply ok '
for _ in $(seq 40); do [ "$(wc -l <"$WORK/relay.out")" -ge 4 ] && break; sleep 0.25; done
[ "$(cat "$WORK/relay.out")" = "$expected" ] || fail "RelayPort replies: $(cat "$WORK/relay.out")"
echo "RelayPort: 4 replies as traced gives them; guest web-1/guest1 connected"

python3 "$TR_SRC/tests/integration/replay_ipc.py" "127.0.0.1:$RPORT" \
  "$VEC/producer-emulated.to-service.bin" 3 "$WORK/hold-producer" >"$WORK/producer.out" 2>&1 &
PRODUCER_PID=$!
wait_for 30 '"/opt/perfetto-demo/bin/producer01" in h.get("producer_names", [])' ||
  fail "the replayed producer is not web-1/guest1's"
grep -q "^2 reply ok use_shmem_emulation=1$" "$WORK/producer.out" ||
  fail "InitializeConnection did not say use_shmem_emulation: $(cat "$WORK/producer.out")"
python3 -c '
import json, sys
h = json.loads(sys.argv[1])
sys.exit("the guest producer is listed under web-1" if "/opt/perfetto-demo/bin/producer01" in h.get("producer_names", []) else 0)' \
  "$(guest_json web-1)" || fail "a guest's producer passed for the host's"
echo "producer behind traced_relay: emulated shared memory, listed under web-1/guest1 only"

rm -f "$WORK/hold-producer" "$WORK/hold-relay"
wait "$PRODUCER_PID" || fail "producer replay: $(cat "$WORK/producer.out")"
wait "$RELAY_PID" || fail "relay replay: $(cat "$WORK/relay.out")"
wait_for 30 'not h.get("connected")' || fail "the guest stayed after its relay left"
grep -q 'guest machine 1 "guest1" left' "$WORK/agent-web-1.log" || fail "the agent did not log the guest's departure"
echo "guest gone with its connections"
echo PASS
