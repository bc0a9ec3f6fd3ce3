#!/usr/bin/env bash
# test_make_certs.sh: certs/make-certs.sh issues several service certificates from one CA
# directory (--service-file), as tiers need (a root and its regionals), without the CA's key
# leaving it: a root's service.{crt,key} and a regional's service-site-a.{crt,key} in the same
# directory, both issued by its one CA (openssl verify), each with its own name in its
# subjectAltName and the serverAuth usage; the first certificate and the CA untouched by the
# second run; a bad or ambiguous --service-file refused; a run asking for the existing
# service.crt under another name refused, saying so, the certificate untouched (the same names
# again keep it). Then the two services are used: the
# root's and the regional's certificates each load in a tracerelay-service (it starts and
# listens), which checks the key matches the certificate and the usage.
# Usage: test_make_certs.sh BIN_DIR. Exits 77 (skip) without openssl.
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$1
fail() { echo "FAIL: $*"; exit 1; }
command -v openssl >/dev/null || { echo "SKIP: openssl not installed"; exit 77; }
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
MC="$TR_SRC/certs/make-certs.sh"
PKI="$WORK/pki"

"$MC" "$PKI" --service-name root.example.net --agent site-a >/dev/null
fp() { openssl x509 -in "$1" -noout -fingerprint -sha256; }
root_fp=$(fp "$PKI/service.crt"); ca_fp=$(fp "$PKI/ca.crt"); ca_key=$(sha256sum <"$PKI/ca.key")
"$MC" "$PKI" --service-name relay.site-a.example.net --service-file service-site-a >/dev/null ||
  fail "--service-file was not accepted"
for f in service-site-a.crt service-site-a.key; do [ -f "$PKI/$f" ] || fail "no $f"; done
[ "$(stat -c %a "$PKI/service-site-a.key")" = 600 ] || fail "the regional's key is not mode 0600"
[ "$(fp "$PKI/service.crt")" = "$root_fp" ] || fail "the root's service.crt was replaced"
[ "$(fp "$PKI/ca.crt")" = "$ca_fp" ] && [ "$(sha256sum <"$PKI/ca.key")" = "$ca_key" ] ||
  fail "the CA changed"
for c in service service-site-a; do
  openssl verify -CAfile "$PKI/ca.crt" "$PKI/$c.crt" >/dev/null || fail "$c.crt does not chain to the CA"
  openssl x509 -in "$PKI/$c.crt" -noout -ext extendedKeyUsage | grep -q "TLS Web Server Authentication" ||
    fail "$c.crt lacks serverAuth"
done
openssl x509 -in "$PKI/service-site-a.crt" -noout -ext subjectAltName | grep -q "DNS:relay.site-a.example.net" ||
  fail "service-site-a.crt does not carry its name"
! openssl x509 -in "$PKI/service-site-a.crt" -noout -ext subjectAltName | grep -q "root.example.net" ||
  fail "service-site-a.crt carries the root's name"
# Refused: a name that would overwrite the CA or an agent's files, and the flag alone.
for bad in ca agent-site-a "a/b"; do
  ! "$MC" "$PKI" --service-name x.example --service-file "$bad" >/dev/null 2>&1 ||
    fail "--service-file $bad was accepted"
done
! "$MC" "$PKI" --service-file lonely >/dev/null 2>&1 || fail "--service-file without --service-name accepted"
[ "$(fp "$PKI/ca.crt")" = "$ca_fp" ] || fail "a refused run changed the CA"
# The same names keep the certificate; another name is refused, not silently kept.
"$MC" "$PKI" --service-name root.example.net >/dev/null || fail "the same name again was refused"
if "$MC" "$PKI" --service-name other.example.net >/dev/null 2>"$WORK/err"; then
  fail "service.crt for root.example.net was kept for other.example.net"
fi
grep -q "service.crt exists for DNS:root.example.net, not DNS:other.example.net: --force" "$WORK/err" ||
  fail "the refusal does not say why: $(cat "$WORK/err")"
[ "$(fp "$PKI/service.crt")" = "$root_fp" ] || fail "a refused run replaced service.crt"

# Both certificates serve: each loads in a service (key pair and usage checked at start).
for c in service service-site-a; do
  "$BIN/tracerelay-service" --listen 127.0.0.1:0 --consumer-socket "$WORK/$c.sock" \
    --ca "$PKI/ca.crt" --cert "$PKI/$c.crt" --key "$PKI/$c.key" >"$WORK/$c.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do [ -S "$WORK/$c.sock" ] && break; sleep 0.1; done
  [ -S "$WORK/$c.sock" ] || fail "a service with $c.crt did not start: $(cat "$WORK/$c.log")"
done
echo "PASS: test_make_certs"
