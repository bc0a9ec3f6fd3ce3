#!/usr/bin/env bash
# test_revoke.sh: revoking a host (issue 39 item 2). One service on loopback, its flags in a
# config file with `crl` (certs/make-certs.sh --update-crl, empty at first); agents web-1, web-2,
# web-3 relay a session that records until the checks are done:
#  - the stolen key: a second agent holding a NEW certificate for web-1 (make-certs.sh --revoke
#    web-1 --agent web-1) is refused as a duplicate while the old web-1 (the squatter) holds
#    the name; SIGHUP: the squatter's link is closed within that one reload (service log, and
#    Goodbye REASON_NOT_AUTHORIZED in its agent's log), it cannot reconnect (the handshake
#    refuses the revoked certificate, saying so), and the holder of the new certificate gets
#    the name web-1;
#  - `deny = web-3` added to the config file; SIGHUP: web-3 is cut the same way and refused
#    when it tries again;
#  - web-2 loses nothing: its loadgen's packets are in the trace exactly, and it never
#    disconnected.
# Usage: test_revoke.sh BIN_DIR. Exits 77 (skip) without openssl.
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
command -v openssl >/dev/null || { echo "SKIP: openssl not installed"; exit 77; }
export TR_NO_NETNS=1
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
cluster_init "$1"
cluster_hosts web-1 web-2 web-3
fail() { echo "FAIL: $*"; for f in "$WORK"/*.log; do echo "== $f"; tail -25 "$f"; done; exit 1; }
MC="$TR_SRC/certs/make-certs.sh"
ST="$TR_BIN/tracerelay status --socket $CONSUMER_SOCK"

"$MC" "$WORK/pki" --update-crl >/dev/null
[ -s "$WORK/pki/ca.crl" ] || fail "make-certs.sh --update-crl wrote no ca.crl"
cat >"$WORK/service.conf" <<EOF
listen = 127.0.0.1:$SERVICE_PORT
consumer-socket = $CONSUMER_SOCK
ca = $WORK/pki/ca.crt
cert = $WORK/pki/service.crt
key = $WORK/pki/service.key
crl = $WORK/pki/ca.crl
EOF
"$TR_BIN/tracerelay-service" --config "$WORK/service.conf" >>"$WORK/service.log" 2>&1 &
SERVICE_PID=$!
CLUSTER_PIDS+=("$SERVICE_PID")
CLUSTER_STOP_STEP[$SERVICE_PID]=4
wait_for_socket "$CONSUMER_SOCK" "$SERVICE_PID"
for h in web-1 web-2 web-3; do cluster_start_agent "$h"; done
SQUATTER=$AGENT_PID_1

cluster_start_loadgen web-1 --name app-web-1 --rate 300
cluster_start_loadgen web-2 --name steady-web-2 --writers 2 --rate 200 --packets 3000
STEADY=$LOADGEN_PID
cluster_start_loadgen web-3 --name app-web-3 --rate 300
cluster_wait_hosts 30 web-1:1 web-2:1 web-3:1 || fail "the producers did not connect"
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 32mb -t 0 \
  -o "$WORK/revoke.pftrace" >"$WORK/record.log" 2>&1 &
RECORD=$!; CLUSTER_PIDS+=("$RECORD")
cluster_wait_session 60 web-1 web-2 web-3 || fail "the session did not start on every host"

host_field() { # host_field NAME EXPR: a Python expression over host h of `status --json`
  $ST --json 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin)
h = {x["machine_name"]: x for x in s["hosts"]}.get(sys.argv[1])
print(eval(sys.argv[2]) if h else "")' "$1" "$2"
}
wait_log() { # wait_log REGEX FILE: up to 30 s for a line matching REGEX
  for _ in $(seq 300); do grep -q -- "$1" "$2" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
count() { grep -c -- "$1" "$2" 2>/dev/null || true; }

# ---- the squatter: web-1's old certificate holds the name against its new owner ----
"$MC" "$WORK/pki" --revoke web-1 --agent web-1 >"$WORK/make-certs.out" ||
  fail "make-certs.sh --revoke web-1 --agent web-1"
ls "$WORK"/pki/agent-web-1.revoked-*.crt >/dev/null 2>&1 || fail "the revoked certificate was not moved aside"
openssl crl -in "$WORK/pki/ca.crl" -noout -text | grep -q "Serial Number" ||
  fail "ca.crl lists no revoked certificate"
mkdir -p "$WORK/web-1-new"
"$TR_BIN/tracerelay-agent" --producer-socket "$WORK/web-1-new/producer.sock" \
  --service "127.0.0.1:$SERVICE_PORT" --service-name "$SERVICE_NAME" --ca "$WORK/pki/ca.crt" \
  --cert "$WORK/pki/agent-web-1.crt" --key "$WORK/pki/agent-web-1.key" \
  >>"$WORK/agent-web-1-new.log" 2>&1 &
NEW1=$!; CLUSTER_PIDS+=("$NEW1"); CLUSTER_STOP_STEP[$NEW1]=1
wait_for_socket "$WORK/web-1-new/producer.sock" "$NEW1"
wait_log "the service refused us: host web-1 is already connected" "$WORK/agent-web-1-new.log" ||
  fail "the new web-1 was not refused as a duplicate while the squatter held the name"
SINCE2=$(host_field web-2 'h["connected_since_unix_ns"]')

kill -HUP "$SERVICE_PID"
wait_log "host web-1 (.*): closing its link, certificate of web-1 is revoked" "$WORK/service.log" ||
  fail "the reload did not close the revoked web-1"
wait_log "said goodbye (reason .*certificate of web-1 is revoked" "$WORK/agent-web-1.log" ||
  fail "the squatter's agent did not log the Goodbye saying why"
grep -q "1 connected link(s) closed as revoked or denied" "$WORK/service.log" ||
  fail "the reload did not say it closed exactly one link"
# It cannot come back: its next handshake is refused, saying why.
wait_log "client certificate 'web-1' is revoked" "$WORK/service.log" ||
  fail "the squatter's reconnection was not refused as revoked"
# The name is free for its owner: the new certificate's agent is web-1 now.
for _ in $(seq 240); do
  [ "$(host_field web-1 'h["connected"]')" = True ] && break
  sleep 0.25
done
[ "$(host_field web-1 'h["connected"]')" = True ] || fail "the new web-1 never got its name"
wait_log "connected to .* as web-1" "$WORK/agent-web-1-new.log" ||
  fail "web-1 is connected, but not by the agent with the new certificate"
kill -0 "$SQUATTER" || fail "the squatter's agent exited (it should keep retrying, refused)"
cluster_log "web-1: the squatter was refused $(count "client certificate 'web-1' is revoked" \
  "$WORK/service.log") time(s) since the reload; the new agent holds the name"

# ---- --deny in the config file ----
echo "deny = web-3" >>"$WORK/service.conf"
kill -HUP "$SERVICE_PID"
wait_log "host web-3 (.*): closing its link, web-3 is denied (--deny)" "$WORK/service.log" ||
  fail "the reload did not close the denied web-3"
wait_log "said goodbye (reason .*web-3 is denied" "$WORK/agent-web-3.log" ||
  fail "web-3's agent did not log the Goodbye saying why"
wait_log "client 'web-3' is denied (--deny)" "$WORK/service.log" ||
  fail "web-3's reconnection was not refused as denied"
[ "$(host_field web-3 'h["connected"]')" = False ] || fail "web-3 is still connected"

# ---- web-2 lost nothing ----
[ "$(host_field web-2 "h['connected'] and h['disconnects'] == 0 and abs(h['connected_since_unix_ns'] - $SINCE2) < 50_000_000")" = True ] ||
  fail "web-2 lost its link across the reloads: $($ST)"
kill -TERM "$RECORD"
wait "$RECORD" || fail "record failed: $(cat "$WORK/record.log")"
# The loadgen writes its count once the session has stopped its data source.
for _ in $(seq 300); do kill -0 "$STEADY" 2>/dev/null || break; sleep 0.1; done
wait "$STEADY" || fail "web-2's loadgen failed or did not stop with the session"
fault_check_accounting "$WORK/revoke.pftrace" lossless web-2 || fail "web-2 lost data"
echo "PASS: test_revoke"
