#!/usr/bin/env bash
# test_metrics.sh: --metrics-listen with the real Prometheus (Debian's prometheus package). A
# service and two agents on loopback serve /metrics; a loadgen on each host writes while
# `tracerelay record` records 3 s. Prometheus (its own process, config and data directory in
# the work directory, loopback only) scrapes all three every second. The test waits until
# Prometheus has scraped the figures after the record, then checks through its HTTP query API:
# every target up; hosts connected = 2; per host, chunks and bytes received, SMB-full events
# and disconnects equal what `tracerelay status --json` says, and a second job scraping the
# service's /metrics?hosts=none sees their sums and no per-host series; each agent's link_up = 1 and
# producers = 1; the flush duration histogram holds the record's final flush; the service's loop
# lag histogram has iterations in it, and no TLS handshake step ran on its loop's thread. It also checks /healthz and /readyz (an agent is ready once its link is up, a
# service at once), a 404 and a 405, and that a bad --metrics-listen is refused at start.
# Usage: test_metrics.sh BIN_DIR. Exits 77 (skip) without prometheus or curl.
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
export TR_NO_NETNS=1
fail() { echo "FAIL: $*"; exit 1; }
command -v prometheus >/dev/null || { echo "SKIP: prometheus not installed (apt-get install prometheus)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }

cluster_init "$1"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
SVC_M=$(free_port); A1_M=$(free_port); A2_M=$(free_port); PROM=$(free_port)

cluster_hosts web-1 web-2
# A bad address is refused at start, naming the flag.
rc=0; "$TR_BIN/tracerelay-agent" --service 127.0.0.1:1 --ca "$WORK/pki/ca.crt" \
  --cert "$WORK/pki/agent-web-1.crt" --key "$WORK/pki/agent-web-1.key" \
  --producer-socket "$WORK/bad.sock" --metrics-listen localhost:9 >"$WORK/bad.log" 2>&1 || rc=$?
[ "$rc" != 0 ] && grep -q "metrics-listen" "$WORK/bad.log" ||
  fail "--metrics-listen localhost:9 was not refused by name: rc $rc, $(cat "$WORK/bad.log")"

cluster_start_service --metrics-listen "127.0.0.1:$SVC_M"
cluster_start_agent web-1 --metrics-listen "127.0.0.1:$A1_M"
cluster_start_agent web-2 --metrics-listen "127.0.0.1:$A2_M"
for h in web-1 web-2; do cluster_start_loadgen "$h" --rate 500 --duration 8; done

code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
[ "$(code "http://127.0.0.1:$SVC_M/healthz")" = 200 ] || fail "service /healthz"
[ "$(code "http://127.0.0.1:$SVC_M/readyz")" = 200 ] || fail "service /readyz"
for _ in $(seq 50); do [ "$(code "http://127.0.0.1:$A1_M/readyz")" = 200 ] && break; sleep 0.1; done
[ "$(code "http://127.0.0.1:$A1_M/readyz")" = 200 ] || fail "agent /readyz not 200 with its link up"
[ "$(code "http://127.0.0.1:$A1_M/nothing")" = 404 ] || fail "unknown path not 404"
[ "$(code -X POST "http://127.0.0.1:$A1_M/metrics")" = 405 ] || fail "POST not 405"
[ "$(code "http://127.0.0.1:$SVC_M/metrics?hosts=some")" = 400 ] || fail "hosts=some not 400"

cluster_wait_hosts 30 web-1:1 web-2:1 || fail "the loadgens did not connect"
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -t 3s \
  -o "$WORK/trace.pftrace" 2>"$WORK/record.log" || fail "record failed: $(cat "$WORK/record.log")"
"$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json >"$WORK/status.json" ||
  fail "status --json failed"

mkdir -p "$WORK/prom"
cat >"$WORK/prom/prometheus.yml" <<EOF
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: tracerelay-service
    static_configs: [{targets: ["127.0.0.1:$SVC_M"]}]
  - job_name: tracerelay-fleet
    params: {hosts: [none]}
    static_configs: [{targets: ["127.0.0.1:$SVC_M"]}]
  - job_name: tracerelay-agent
    static_configs: [{targets: ["127.0.0.1:$A1_M", "127.0.0.1:$A2_M"]}]
EOF
prometheus --config.file="$WORK/prom/prometheus.yml" --storage.tsdb.path="$WORK/prom/data" \
  --web.listen-address="127.0.0.1:$PROM" >"$WORK/prometheus.log" 2>&1 &
CLUSTER_PIDS+=($!)

python3 - "$PROM" "$WORK/status.json" <<'PY'
import json, sys, time, urllib.parse, urllib.request
prom, status = sys.argv[1], json.load(open(sys.argv[2]))
def query(q):
    url = f"http://127.0.0.1:{prom}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]["result"]
def by(q, label):
    return {s["metric"].get(label, ""): float(s["value"][1]) for s in query(q)}
hosts = {h["machine_name"]: h for h in status["hosts"]}
want = {}
for name in ("web-1", "web-2"):
    h = hosts[name]
    want[name] = {"tracerelay_host_received_chunks_total": h["chunks_relayed"],
                  "tracerelay_host_received_bytes_total": h["bytes_relayed"],
                  "tracerelay_host_received_batches_total": h["batches_received"],
                  "tracerelay_host_agent_smb_full_total": h["losses"]["agent_smb_full"],
                  "tracerelay_host_disconnects_total": h["disconnects"]}
if any(w["tracerelay_host_received_chunks_total"] == 0 for w in want.values()):
    sys.exit(f"FAIL: a host relayed nothing: {want}")
deadline, last = time.time() + 60, None
while time.time() < deadline:
    try:
        got = {m: by(m, "host") for m in want["web-1"]}
        fleet = {m: by(m.replace("_host_", "_hosts_"), "job").get("tracerelay-fleet")
                 for m in want["web-1"]}
        up = [float(s["value"][1]) for s in query("up")]  # the service twice: two jobs
        ready = len(up) == 4 and all(v == 1 for v in up) and all(
            got[m].get(h) == want[h][m] for h in want for m in want[h]) and all(
            fleet[m] == sum(want[h][m] for h in want) for m in fleet)
        last = (up, got, fleet)
        if ready:
            break
    except OSError as e:
        last = str(e)
    time.sleep(1)
else:
    sys.exit(f"FAIL: Prometheus never showed the status figures {want}; last: {last}")
checks = {"tracerelay_service_hosts_connected": 2}
for q, v in checks.items():
    r = by(q, "instance")
    if list(r.values()) != [v]:
        sys.exit(f"FAIL: {q} = {r}, want {v}")
for q in ("tracerelay_agent_link_up", "tracerelay_agent_link_connects_total"):
    r = by(q, "instance")
    if len(r) != 2 or any(x != 1 for x in r.values()):
        sys.exit(f"FAIL: {q} = {r}, want 1 on both agents")
for q in ("tracerelay_host_session_chunks_discarded", "tracerelay_host_session_chunks_overwritten",
          "tracerelay_host_session_writer_packet_loss", "tracerelay_host_link_lost_bytes_total",
          "tracerelay_host_agent_queue_dropped_packets_total",
          "tracerelay_host_agent_spill_dropped_packets_total"):
    r = by(q, "host")  # a lossless run; and the record's session is gone
    if r != {"web-1": 0.0, "web-2": 0.0}:
        sys.exit(f"FAIL: {q} = {r}, want 0 for both hosts")
# The record's final flush went through both hosts' producers: one flush observed, and the
# histogram is one Prometheus understands (histogram_quantile works on its buckets).
flushes = by("tracerelay_flush_duration_seconds_count", "instance")
p99 = by("histogram_quantile(0.99, tracerelay_flush_duration_seconds_bucket)", "instance")
if list(flushes.values()) != [1.0] or len(p99) != 1 or not 0 < list(p99.values())[0] <= 5:
    sys.exit(f"FAIL: flush duration histogram: count {flushes}, p99 {p99}")
# Both producers answered it: the service's own part of it observed once, no longer than it.
parts = by("tracerelay_flush_service_seconds_count", "instance")
part_s = by("tracerelay_flush_service_seconds_sum", "instance")
total_s = by("tracerelay_flush_duration_seconds_sum", "instance")
if (list(parts.values()) != [1.0] or len(part_s) != 1
        or not 0 <= list(part_s.values())[0] <= list(total_s.values())[0]):
    sys.exit(f"FAIL: flush service part: count {parts}, sum {part_s}, round trip {total_s}")
# The loop's lag: iterations observed, the histogram usable, its maximum a real duration.
lag = by("tracerelay_service_loop_lag_seconds_count", "instance")
lag_p99 = by("histogram_quantile(0.99, tracerelay_service_loop_lag_seconds_bucket)", "instance")
lag_max = by("tracerelay_service_loop_lag_max_seconds", "instance")
if (len(lag) != 1 or list(lag.values())[0] < 10 or len(lag_p99) != 1 or len(lag_max) != 1
        or not 0 < list(lag_max.values())[0] < 60):
    sys.exit(f"FAIL: loop lag histogram: count {lag}, p99 {lag_p99}, max {lag_max}")
stalls = by("tracerelay_service_loop_stalls_total", "instance")
if len(stalls) != 1 or list(stalls.values())[0] < 0:
    sys.exit(f"FAIL: loop stalls counter missing: {stalls}")
# Both agents' handshakes ran on worker threads, none on the loop's (issue 25), none refused.
on_loop = by("tracerelay_service_tls_handshake_steps_on_loop_total", "instance")
on_workers = by("tracerelay_service_tls_handshake_steps_on_workers_total", "instance")
refused = by("tracerelay_service_tls_refused_total", "instance")
if (list(on_loop.values()) != [0.0] or len(on_workers) != 1
        or list(on_workers.values())[0] < 2 or list(refused.values()) != [0.0]):
    sys.exit(f"FAIL: handshake steps on the loop {on_loop}, on workers {on_workers}, "
             f"refused {refused}")
# The fleet-wide families of the scrape without per-host series: no host label in it at all.
per_host = query('count({job="tracerelay-fleet", host!=""})')
bound_max = by('tracerelay_hosts_clock_error_bound_max_seconds{job="tracerelay-fleet"}', "job")
if per_host or list(bound_max) != ["tracerelay-fleet"] or not 0 <= bound_max["tracerelay-fleet"] < 1:
    sys.exit(f"FAIL: /metrics?hosts=none: {per_host} series with a host label, "
             f"largest clock bound {bound_max}")
bound = by("tracerelay_host_clock_error_bound_seconds", "host")
if set(bound) != {"web-1", "web-2"} or any(not 0 <= b < 1 for b in bound.values()):
    sys.exit(f"FAIL: clock error bounds {bound}")
# Each host's exchanges: at least the first dense probes' worth (TR_CLOCK_PROBE_DENSE, 10).
exchanges = by("tracerelay_host_clock_exchanges_total", "host")
if set(exchanges) != {"web-1", "web-2"} or any(n < 10 for n in exchanges.values()):
    sys.exit(f"FAIL: clock exchanges {exchanges}")
print("Prometheus agrees with status:", {h: want[h]["tracerelay_host_received_chunks_total"] for h in want},
      "chunks; bounds (s):", bound)
PY
echo "PASS: test_metrics"
