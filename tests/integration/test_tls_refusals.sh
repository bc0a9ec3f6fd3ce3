#!/usr/bin/env bash
# test_tls_refusals.sh: hostile or broken peers on the service's TLS port, while a connected
# agent (web-1) relays a steady loadgen into a running session. Each must be refused with a
# service log line naming the peer's address and the reason, and none may disturb web-1:
#   - an agent whose certificate has expired, and one not valid yet;
#   - a second agent with web-1's own (valid) certificate: a duplicate host;
#   - plain TCP garbage on the TLS port;
#   - a slow-loris client that connects and says nothing (TLS handshake deadline, made short
#     with --handshake-timeout-ms);
#   - a TLS client with a valid certificate (web-3) that completes the handshake and never
#     sends Hello (Hello deadline);
#   - a TLS client (openssl: our agent refuses to load such a certificate) whose certificate
#     has serverAuth instead of clientAuth.
# Then every packet web-1's loadgen wrote must be in the trace, with no loss counted.
# (Wrong CA, and an agent refusing its own certificate without clientAuth, are in
# test_cluster.sh.)
# Usage: test_tls_refusals.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
fault_init "$1"
HOSTS=(web-1 web-2)
cluster_hosts "${HOSTS[@]}"
HS_MS=1000
cluster_start_service --handshake-timeout-ms "$HS_MS"
cluster_start_agent web-1 --machine-name web-1
"$TR_SRC/certs/make-certs.sh" "$WORK/pki" --agent old-host --expired >/dev/null
"$TR_SRC/certs/make-certs.sh" "$WORK/pki" --agent new-host --not-yet-valid >/dev/null
"$TR_SRC/certs/make-certs.sh" "$WORK/pki" --agent web-3 >/dev/null
"$TR_SRC/certs/make-certs.sh" "$WORK/pki" --agent noclient --no-client-auth >/dev/null

PACKETS=3000
cluster_start_loadgen web-1 --name steady-web-1 --writers 2 --rate 500 --packets "$PACKETS" \
  --packet-size 200
LOADGEN=$LOADGEN_PID
cluster_wait_hosts 30 web-1:1 || { echo "FAIL: the loadgen did not connect"; exit 1; }
# The session runs until every refusal is logged (-t 0, SIGTERM then), not for a fixed time.
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 32mb -t 0 \
  -o "$WORK/trace.pftrace" >"$WORK/record.log" 2>&1 &
RECORD=$!
CLUSTER_PIDS+=("$RECORD")
cluster_wait_session 60 web-1 || { echo "FAIL: the session did not start"; exit 1; }

ADDR2="$(service_addr_for 2)" # the attackers run on host web-2's side of the network
NS2="$(host_ns 2)"
# An agent of host web-2 with CERT/KEY, its own producer socket, in the background.
rogue_agent() { # rogue_agent TAG CERT KEY
  mkdir -p "$WORK/$1"
  $(ns_prefix "$NS2") "$TR_BIN/tracerelay-agent" --producer-socket "$WORK/$1/p.sock" \
    --service "$ADDR2:$SERVICE_PORT" --service-name "$SERVICE_NAME" --ca "$WORK/pki/ca.crt" \
    --cert "$2" --key "$3" >"$WORK/$1.log" 2>&1 &
  CLUSTER_PIDS+=($!)
}
rogue_agent expired "$WORK/pki/agent-old-host.crt" "$WORK/pki/agent-old-host.key"
rogue_agent notyet "$WORK/pki/agent-new-host.crt" "$WORK/pki/agent-new-host.key"
rogue_agent duplicate "$WORK/pki/agent-web-1.crt" "$WORK/pki/agent-web-1.key"

# Plain TCP garbage, and a silent slow-loris client holding its connection for 3 handshake
# deadlines (bash's /dev/tcp; closed when the subshell ends).
in_ns "$NS2" bash -c "exec 3<>/dev/tcp/$ADDR2/$SERVICE_PORT; \
  printf 'GET / HTTP/1.1\r\nHost: x\r\n\r\n' >&3; head -c 4096 /dev/urandom >&3; sleep 0.5" \
  2>/dev/null || true
in_ns "$NS2" bash -c "exec 3<>/dev/tcp/$ADDR2/$SERVICE_PORT; sleep 3" &
LORIS=$!
# TLS with web-3's valid certificate, then silence (stdin stays open, nothing is sent).
in_ns "$NS2" bash -c "sleep 3 | timeout 5 openssl s_client -quiet -tls1_2 \
  -connect $ADDR2:$SERVICE_PORT -cert $WORK/pki/agent-web-3.crt -key $WORK/pki/agent-web-3.key \
  -CAfile $WORK/pki/ca.crt >$WORK/openssl.log 2>&1" &
NOHELLO=$!
wait "$LORIS" || true
wait "$NOHELLO" || true
in_ns "$NS2" bash -c "timeout 5 openssl s_client -quiet -tls1_2 -connect $ADDR2:$SERVICE_PORT \
  -cert $WORK/pki/agent-noclient.crt -key $WORK/pki/agent-noclient.key -CAfile $WORK/pki/ca.crt \
  </dev/null >$WORK/openssl-noclient.log 2>&1" || true

LOG="$WORK/service.log"
# The attackers' address as the service sees it: web-2's end of its veth.
A="10\\.200\\.2\\.2:[0-9]+"
if [ "$USE_NETNS" != 1 ]; then A="127\\.0\\.0\\.1:[0-9]+"; fi
EXPECT=( # WHAT REGEX pairs: a service log line for each peer
  "expired certificate" "refused connection from $A: .*certificate 'old-host' expired"
  "not-yet-valid certificate" "refused connection from $A: .*'new-host'.*not valid (yet|before)"
  "duplicate host" "closing the link of web-1 \\($A\\): host web-1 is already connected"
  "plain TCP garbage" "refused connection from $A: the peer is not speaking TLS"
  "slow-loris (handshake deadline)"
  "refused connection from $A: TLS handshake not finished after $HS_MS ms \\(0 bytes received\\)"
  "certificate without clientAuth" "refused connection from $A: .*'noclient'.*missing the clientAuth usage"
  "TLS but no Hello (Hello deadline)"
  "closing the link of web-3 \\($A\\): protocol error: no Hello within $HS_MS ms"
)
all_logged() {
  local i
  for ((i = 1; i < ${#EXPECT[@]}; i += 2)); do grep -Eq "${EXPECT[i]}" "$LOG" || return 1; done
}
for _ in $(seq 300); do all_logged && break; sleep 0.1; done # up to 30 s
kill -TERM "$RECORD"
wait "$RECORD" || { echo "FAIL: tracerelay record"; cat "$WORK/record.log"; exit 1; }
fault_wait_pid "$LOADGEN" 10 || { echo "FAIL: loadgen did not finish"; exit 1; }

fails=0
for ((i = 0; i < ${#EXPECT[@]}; i += 2)); do
  if ! grep -Eq "${EXPECT[i + 1]}" "$LOG"; then
    echo "FAIL: no service log line for ${EXPECT[i]} (wanted /${EXPECT[i + 1]}/)"; fails=$((fails + 1))
  else
    echo "ok: ${EXPECT[i]}: $(grep -Em1 "${EXPECT[i + 1]}" "$LOG" | sed 's/.*msg=//')"
  fi
done
# web-1 was never disturbed: one connection, never dropped.
n=$(grep -c "host web-1 connected from" "$LOG" || true)
[ "$n" = 1 ] || { echo "FAIL: web-1 connected $n times (its link was disturbed)"; fails=$((fails + 1)); }
if grep -q "host web-1 disconnected" "$LOG"; then
  echo "FAIL: web-1's link dropped"; fails=$((fails + 1))
fi
fault_check_accounting "$WORK/trace.pftrace" lossless web-1 || fails=$((fails + 1))
[ "$fails" = 0 ] || exit 1
echo "PASS"
