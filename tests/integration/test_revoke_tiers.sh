#!/usr/bin/env bash
# test_revoke_tiers.sh: a regional with --crl cuts a relayed host (issue 39 item 2). On
# loopback: a root allowing regional-a to relay web-*, regional-a with --crl (empty at first),
# web-1 and web-2 under it, a session recording at the root. web-1's certificate is revoked
# (make-certs.sh --revoke web-1) and the regional gets SIGHUP: it closes web-1's link within that
# reload (its log says why, web-1's agent logs the Goodbye), the root sees web-1 gone, web-1's
# reconnections are refused at the regional's handshake as revoked, and web-2, relayed by the
# same regional, loses nothing: its loadgen's packets are in the trace exactly.
# Usage: test_revoke_tiers.sh BIN_DIR. Exits 77 (skip) without openssl.
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
command -v openssl >/dev/null || { echo "SKIP: openssl not installed"; exit 77; }
export TR_NO_NETNS=1
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
cluster_init "$1"
fail() { echo "FAIL: $*"; for f in "$WORK"/*.log; do echo "== $f"; tail -25 "$f"; done; exit 1; }
MC="$TR_SRC/certs/make-certs.sh"
ST="$TR_BIN/tracerelay status --socket $CONSUMER_SOCK"

cluster_tree "regional-a=web-1,web-2"
"$MC" "$WORK/pki" --update-crl >/dev/null
cluster_start_service --relay-allow 'regional-a=web-*'
cluster_start_regional regional-a --crl "$WORK/pki/ca.crl" || fail "the regional did not start"
REGIONAL=$REGIONAL_PID
cluster_start_agent web-1
cluster_start_agent web-2
cluster_start_loadgen web-1 --name app-web-1 --rate 300
cluster_start_loadgen web-2 --name steady-web-2 --writers 2 --rate 200 --packets 2400
STEADY=$LOADGEN_PID
cluster_wait_hosts 30 web-1:1 web-2:1 || fail "the relayed hosts did not connect"
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 32mb -t 0 \
  -o "$WORK/tiers.pftrace" >"$WORK/record.log" 2>&1 &
RECORD=$!; CLUSTER_PIDS+=("$RECORD")
cluster_wait_session 60 web-1 web-2 || fail "the session did not start on both hosts"

wait_log() { # wait_log REGEX FILE: up to 30 s for a line matching REGEX
  for _ in $(seq 300); do grep -q -- "$1" "$2" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
connected() { cluster_status_hosts | awk -v h="$1" '$1 == h { print $2 }'; }

"$MC" "$WORK/pki" --revoke web-1 >/dev/null || fail "make-certs.sh --revoke web-1"
kill -HUP "$REGIONAL"
wait_log "host web-1 (.*): closing its link, certificate of web-1 is revoked" \
  "$WORK/regional-a.log" || fail "the regional's reload did not close the revoked web-1"
wait_log "said goodbye (reason .*certificate of web-1 is revoked" "$WORK/agent-web-1.log" ||
  fail "web-1's agent did not log the Goodbye saying why"
for _ in $(seq 120); do [ "$(connected web-1)" = 0 ] && break; sleep 0.25; done
[ "$(connected web-1)" = 0 ] || fail "the root still sees web-1 connected: $($ST)"
wait_log "client certificate 'web-1' is revoked" "$WORK/regional-a.log" ||
  fail "web-1's reconnection was not refused at the regional as revoked"
[ "$(connected web-1)" = 0 ] || fail "web-1 came back through the regional"

[ "$(connected web-2)" = 1 ] || fail "web-2 lost its link: $($ST)"
kill -TERM "$RECORD"
wait "$RECORD" || fail "record failed: $(cat "$WORK/record.log")"
# The loadgen writes its count once the session has stopped its data source.
for _ in $(seq 300); do kill -0 "$STEADY" 2>/dev/null || break; sleep 0.1; done
wait "$STEADY" || fail "web-2's loadgen failed or did not stop with the session"
fault_check_accounting "$WORK/tiers.pftrace" lossless web-2 || fail "web-2 lost data"
echo "PASS: test_revoke_tiers"
