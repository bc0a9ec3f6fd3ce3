#!/usr/bin/env bash
# test_cipher.sh: --cipher on both daemons, with real processes and TLS. The service accepts
# aes-128-ccm and chacha20-poly1305, in that order: an agent with the default list gets
# AES-128-CCM (the service's first choice), an agent offering chacha20-poly1305 alone gets it,
# and an agent offering only aes-128-gcm is refused, the agent's log and the service's both
# saying that no cipher is in common and naming their own lists. A bad --cipher is a bad flag.
# Usage: test_cipher.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
fault_init "$1"
cluster_hosts web-1 web-2 web-3
cluster_start_service --cipher aes-128-ccm,chacha20-poly1305
cluster_start_agent web-1
cluster_start_agent web-2 --cipher chacha20-poly1305
cluster_start_agent web-3 --cipher aes-128-gcm

# wait_log FILE TEXT: up to 60 s for TEXT to appear in FILE.
wait_log() {
  for _ in $(seq 600); do
    grep -qF -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "FAIL: no '$2' in $1"; return 1
}
wait_log "$WORK/agent-web-1.log" "TLS-ECDHE-ECDSA-WITH-AES-128-CCM)"
wait_log "$WORK/agent-web-2.log" "TLS-ECDHE-ECDSA-WITH-CHACHA20-POLY1305-SHA256)"
wait_log "$WORK/agent-web-3.log" "no cipher in common, most likely; this side offers aes-128-gcm (--cipher)"
wait_log "$WORK/service.log" "no cipher in common: this side accepts aes-128-ccm,chacha20-poly1305 (--cipher)"
if grep -q "host web-3 connected" "$WORK/service.log"; then
  echo "FAIL: web-3 connected without a cipher in common"; exit 1
fi

out=$("$TR_BIN/tracerelay-agent" --service 127.0.0.1:1 --ca x --cert x --key x \
  --cipher aes-128-cbc 2>&1) && { echo "FAIL: a bad --cipher was accepted"; exit 1; }
case "$out" in
*"invalid value 'aes-128-cbc' for --cipher: unknown cipher 'aes-128-cbc'"*) ;;
*) echo "FAIL: unexpected message for a bad --cipher: $out"; exit 1 ;;
esac
echo "PASS: --cipher: CCM by default, the service's order decides, a disjoint list refused on both sides"
