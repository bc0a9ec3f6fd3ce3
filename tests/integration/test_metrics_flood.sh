#!/usr/bin/env bash
# test_metrics_flood.sh: /healthz and /readyz keep answering while slow clients hold connections
# to the metrics port (issue 39 item 6: 16 slow clients starved /healthz, and the liveness probe
# restarted a healthy root). A service serves --metrics-listen on 127.0.0.1; 64 clients that
# send half a request and wait hold connections, first all from one address (127.0.0.2), then
# each from its own (127.0.1.1-64); every time, probes from 127.0.0.1 answer 200, and so does a
# scrape of /metrics. Loopback's whole 127/8 is this host, so each client binds the source
# address it stands for.
# Usage: test_metrics_flood.sh BIN_DIR. Exits 77 (skip) without curl.
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
export TR_NO_NETNS=1
fail() { echo "FAIL: $*"; exit 1; }
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }

cluster_init "$1"
M=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cluster_hosts web-1
cluster_start_service --metrics-listen "127.0.0.1:$M"

# slow_clients TAG N SOURCE...: N connections, the i-th from SOURCE[i % count], each sending a
# request line and one header, never the blank line that ends the request; writes "held" to
# $WORK/TAG.out once all are connected and sent, then holds them until killed (SLOW: its pid).
slow_clients() {
  local tag=$1; shift
  python3 - "$M" "$@" >"$WORK/$tag.out" 2>&1 <<'PY' &
import socket, sys, time
port, n, sources = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
held = []
for i in range(n):
    s = socket.socket()
    s.bind((sources[i % len(sources)], 0))
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: flood\r\n")
    held.append(s)
print("held", flush=True)
while True:
    time.sleep(1)
PY
  SLOW=$!
  CLUSTER_PIDS+=("$SLOW")
  for _ in $(seq 300); do
    grep -qx held "$WORK/$tag.out" && return 0
    kill -0 "$SLOW" 2>/dev/null || break
    sleep 0.1
  done
  fail "the slow clients ($tag) did not connect: $(cat "$WORK/$tag.out")"
}

code() { curl -s -o /dev/null --max-time 5 -w '%{http_code}' "$@" || true; }
# probes WHO: /healthz, /readyz and /metrics answer 200 to 127.0.0.1, the probes' address.
probes() {
  for path in healthz readyz metrics; do
    c=$(code "http://127.0.0.1:$M/$path")
    [ "$c" = 200 ] || fail "/$path answered '$c' with $1 holding connections"
  done
  echo "ok: /healthz, /readyz and /metrics answer with $1 holding connections"
}

probes "no one"
slow_clients one 64 127.0.0.2
probes "64 slow clients from one address"
kill "$SLOW"; wait "$SLOW" 2>/dev/null || true
sources=(); for i in $(seq 64); do sources+=("127.0.1.$i"); done
slow_clients many 64 "${sources[@]}"
probes "64 slow clients from 64 addresses"
echo "PASS"
