#!/usr/bin/env bash
# test_cert_expiry.sh: certificates seen before they expire (issue 39 item 3). On loopback, with
# certificates made short-lived by make-certs.sh --days: the service's valid 20 days (within
# the 30-day warning), web-1's 5 days (within the 7-day one), web-2's and the CA's the default.
#  - logs: the service warns about its certificate at start and again on SIGHUP ("expires in
#    19 days", a whole day not yet gone; 20 while the certificate is under a second old), and
#    on SIGHUP about web-1's, the earliest of its connected agents'; web-1's agent logs its own certificate's 4 (or 5) days at the urgent level;
#    web-2's agent, whose certificates are far from expiry, logs nothing of the kind;
#  - /metrics: tracerelay_tls_certificate_expiry_timestamp_seconds{cert="service"}, {cert="ca"}
#    and {cert="peers"} at the service, {cert="agent"} and {cert="ca"} at web-1's agent, each
#    exactly the certificate's notAfter as openssl reads it;
#  - `tracerelay status` says the days left of the service's, the CA's and web-1's
#    certificates, and --json carries web-1's notAfter.
# Usage: test_cert_expiry.sh BIN_DIR. Exits 77 (skip) without openssl or curl.
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
command -v openssl >/dev/null || { echo "SKIP: openssl not installed"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
export TR_NO_NETNS=1
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/common.sh"
cluster_init "$1"
fail() { echo "FAIL: $*"; for f in "$WORK"/*.log; do echo "== $f"; tail -25 "$f"; done; exit 1; }
MC="$TR_SRC/certs/make-certs.sh"

cluster_hosts web-1 web-2
"$MC" "$WORK/pki" --service-name "$SERVICE_NAME" --force --days 20 >/dev/null
"$MC" "$WORK/pki" --agent web-1 --force --days 5 >/dev/null
not_after() { date -u -d "$(openssl x509 -in "$1" -noout -enddate | cut -d= -f2)" +%s; }
SVC_T=$(not_after "$WORK/pki/service.crt"); CA_T=$(not_after "$WORK/pki/ca.crt")
W1_T=$(not_after "$WORK/pki/agent-web-1.crt")

# A free port may be taken by a test running beside this one before the daemon binds it: the
# daemon then refuses to start, and is started again on another.
for _ in 1 2 3 4 5; do
  SVC_M=$(free_port)
  cluster_start_service --metrics-listen "127.0.0.1:$SVC_M" && break
done
[ -S "$CONSUMER_SOCK" ] || fail "the service did not start"
for _ in 1 2 3 4 5; do
  A1_M=$(free_port)
  cluster_start_agent web-1 --metrics-listen "127.0.0.1:$A1_M" && break
done
[ -S "$WORK/web-1/producer.sock" ] || fail "web-1's agent did not start"
cluster_start_agent web-2
cluster_wait_hosts 30 web-1 web-2 || fail "the agents did not connect"

grep -Eq "the service's certificate .*service.crt expires in (19|20) days" "$WORK/service.log" ||
  fail "the service did not warn at start about its certificate's 19 days"
grep -Eq "level=error comp=agent msg=\"the agent's certificate .*agent-web-1.crt expires in (4|5) days" "$WORK/agent-web-1.log" ||
  fail "web-1's agent did not warn urgently about its certificate's 4 days"
! grep -q "expires in\|EXPIRED" "$WORK/agent-web-2.log" || fail "web-2's agent warned with nothing near expiry"
! grep -q "the CA certificate" "$WORK/service.log" || fail "the service warned about the CA's 10 years"

kill -HUP "$SERVICE_PID"
for _ in $(seq 300); do
  [ "$(grep -Ec "the service's certificate .*expires in (19|20) days" "$WORK/service.log")" -ge 2 ] && break
  sleep 0.1
done
[ "$(grep -Ec "the service's certificate .*expires in (19|20) days" "$WORK/service.log")" -ge 2 ] ||
  fail "the service did not warn again on SIGHUP"
grep -Eq "the first to expire of the connected agents' certificates: web-1 expires in (4|5) days" \
  "$WORK/service.log" || fail "the service did not warn about web-1's certificate"

metric() { # metric PORT CERT: the sample's value
  curl -s "http://127.0.0.1:$1/metrics" |
    awk -v c="$2" '$1 == "tracerelay_tls_certificate_expiry_timestamp_seconds{cert=\"" c "\"}" { print $2 }'
}
[ "$(metric "$SVC_M" service)" = "$SVC_T" ] || fail "service: {cert=\"service\"} $(metric "$SVC_M" service), not $SVC_T"
[ "$(metric "$SVC_M" ca)" = "$CA_T" ] || fail "service: {cert=\"ca\"} $(metric "$SVC_M" ca), not $CA_T"
[ "$(metric "$SVC_M" peers)" = "$W1_T" ] || fail "service: {cert=\"peers\"} $(metric "$SVC_M" peers), not web-1's $W1_T"
[ "$(metric "$A1_M" agent)" = "$W1_T" ] || fail "web-1: {cert=\"agent\"} $(metric "$A1_M" agent), not $W1_T"
[ "$(metric "$A1_M" ca)" = "$CA_T" ] || fail "web-1: {cert=\"ca\"} $(metric "$A1_M" ca), not $CA_T"
curl -s "http://127.0.0.1:$SVC_M/metrics" | grep -c "^# TYPE tracerelay_tls_certificate_expiry" |
  grep -qx 1 || fail "the family is not written exactly once"

now=$(date +%s)
ca_days=$(( (CA_T - now) / 86400 )) svc_days=$(( (SVC_T - now) / 86400 )) w1_days=$(( (W1_T - now) / 86400 ))
"$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" >"$WORK/status.txt" || fail "status"
grep -q "^certificates: service $svc_days days left, CA $ca_days days left, agents' first to expire web-1 $w1_days days left" \
  "$WORK/status.txt" || fail "status does not say the days left: $(cat "$WORK/status.txt")"
"$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
h = {x["machine_name"]: x for x in s["hosts"]}
assert s["service"]["cert_not_after_unix"] == int(sys.argv[1]), s["service"]
assert h["web-1"]["cert_not_after_unix"] == int(sys.argv[2]), h["web-1"]' "$SVC_T" "$W1_T" ||
  fail "status --json lacks the notAfter times"
echo "PASS: test_cert_expiry"
