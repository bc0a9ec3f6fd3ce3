#!/usr/bin/env bash
# test_regional_metrics.sh: a regional's forwarding on its /metrics and in `tracerelay status`
# at its consumer socket (issue 25), on loopback: a
# root, a regional (--metrics-listen) and two agents behind it. Once both hosts are connected
# at the root, the regional's /metrics (its own agent's figures, then its forwarding's) says 2
# agents, both forwarded, none held, bytes received from the agents and from the upstream, no
# upstream link lost, its one carrier to the root up (made once, frames written to it, and
# more frames than writes); its own agent's link to the root is up. The root tells it whether a
# session runs (tracerelay_regional_upstream_session: 0, 1 while a `record` at the root runs, 0
# after), so it probes its agents at the session rate only then, and how far its clock drifts
# against the root's (the regional runs 150 ppm fast: tracerelay_regional_upstream_drift_ratio,
# the drift of the root's clock minus the regional's, within 30 ppm of -150e-6), so it paces its agents by their drift against the root: in the session
# each agent's clock exchanges at the root are under a quarter of the regional's own. Then the root stops: the
# regional counts both agents' upstream links lost, forwards none, and its carrier is down. No sanitizer report in any
# log (the regional's /metrics used to run the service's tr_metrics_write: a symbol clash).
# Usage: test_regional_metrics.sh BIN_DIR. Exits 77 (skip) without curl.
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
export TR_NO_NETNS=1
fail() { echo "FAIL: $*"; exit 1; }
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
SERVICE_PORT=$(free_port)
cluster_init "$1"
M=$(free_port)

cluster_tree "regional-a=web-1,web-2"
cluster_start_service --relay-allow 'regional-a=web-*'
# The regional's clock runs 150 ppm fast (its agents' on the real clock): the root measures
# that on the regional's own host and tells it, and the regional paces its agents' probes by
# their drift against the root (about 0 here), not against itself (about -150 ppm).
cluster_start_regional regional-a --metrics-listen "127.0.0.1:$M" --fake-clock 0,150 ||
  fail "the regional did not start"
for h in web-1 web-2; do cluster_start_agent "$h" || fail "agent $h did not start"; done
cluster_wait_hosts 30 web-1 web-2 regional-a || fail "the hosts did not all reach the root"

metric() { curl -s "http://127.0.0.1:$M/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }
want() { # want NAME OP VALUE: polls up to 10 s (the figures follow the links' events)
  local v
  for _ in $(seq 100); do
    v=$(metric "$1")
    [ -n "$v" ] && python3 -c "import sys; sys.exit(0 if float('$v') $2 $3 else 1)" && return 0
    sleep 0.1
  done
  fail "regional /metrics: $1 = '${v}', want $2 $3"
}
want tracerelay_regional_agents == 2
want tracerelay_regional_agents_forwarded == 2
want tracerelay_regional_agents_held == 0
want tracerelay_regional_received_from_agents_bytes_total '>' 0
want tracerelay_regional_received_from_upstream_bytes_total '>' 0
want tracerelay_regional_upstream_lost_total == 0
want tracerelay_agent_link_up == 1 # the regional's own agent, to the root
want tracerelay_regional_carrier_up == 1
want tracerelay_regional_upstream_session == 0
want tracerelay_regional_upstream_drift_ratio '<' -120e-6
want tracerelay_regional_upstream_drift_ratio '>' -180e-6
# Clock exchanges the root's estimators took, per host (its status).
exchanges() {
  "$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json | python3 -c '
import json, sys
print(json.dumps({h["machine_name"]: h["clock"].get("probes", 0) for h in json.load(sys.stdin)["hosts"]}))'
}
before=$(exchanges)
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -t 4s \
  -o "$WORK/session.pftrace" >"$WORK/session-record.log" 2>&1 &
rec_pid=$!
want tracerelay_regional_upstream_session == 1
wait "$rec_pid" || fail "record at the root: $(tail -n 3 "$WORK/session-record.log")"
want tracerelay_regional_upstream_session == 0
# In the session the root probes the regional's own host at its drift's pace (1 us / 150 ppm:
# every 6.7 ms); the regional probes its agents at theirs against the root (1 s at ~0 ppm),
# where its own estimate alone (150 ppm) would have paced them as often as itself.
python3 - "$before" "$(exchanges)" <<'PY' || fail "the agents' probes are not paced by their drift against the root"
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
d = {h: b[h] - a.get(h, 0) for h in b}
print("clock exchanges in the session:", d)
if d["regional-a"] < 40 or any(d[h] * 4 > d["regional-a"] for h in ("web-1", "web-2")):
    sys.exit(1)
PY
want tracerelay_regional_carrier_connects_total == 1
want tracerelay_regional_carrier_frames_total '>' 0
# Both from one scrape: frames and writes go on between two.
scrape=$(curl -s "http://127.0.0.1:$M/metrics")
frames=$(echo "$scrape" | awk '$1 == "tracerelay_regional_carrier_frames_total" { print $2 }')
writes=$(echo "$scrape" | awk '$1 == "tracerelay_regional_carrier_writes_total" { print $2 }')
echo "carrier: $frames frames in $writes writes"
python3 -c "import sys; sys.exit(0 if 0 < $writes <= $frames else 1)" ||
  fail "carrier: $frames frames in $writes writes"

# `tracerelay status` reads the regional too: its upstream, and both agents forwarded.
RSOCK="$WORK/regional-a/consumer.sock"
st=$("$TR_BIN/tracerelay" status --socket "$RSOCK") || fail "status cannot read the regional"
echo "$st"
echo "$st" | grep -q "^regional .* forwarding to 127.0.0.1:$SERVICE_PORT: 2 agents (2 forwarded, 0 held)" ||
  fail "status: no regional line with 2 agents forwarded"
for h in web-1 web-2; do
  echo "$st" | grep -q "^$h .* forwarded " || fail "status: $h not forwarded"
done
"$TR_BIN/tracerelay" status --socket "$RSOCK" --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert s["regional"]["agents"] == 2 and s["regional"]["forwarded"] == 2, s["regional"]
assert sorted(h["machine_name"] for h in s["hosts"]) == ["web-1", "web-2"], s["hosts"]
assert all(h["regional_upstream_state"] == "forwarded" and h["bytes_relayed"] > 0
           for h in s["hosts"]), s["hosts"]' || fail "status --json of the regional"
# Recording there is refused, saying where to record instead.
if "$TR_BIN/tracerelay" record --socket "$RSOCK" --data-source track_event -t 1s -o "$WORK/none.pftrace" 2>"$WORK/rec.err"; then
  fail "record at a regional succeeded"
fi
cat "$WORK/rec.err"
grep -q "this is a regional tracerelay-service: it forwards its agents to 127.0.0.1:$SERVICE_PORT" \
  "$WORK/rec.err" || fail "record at a regional: no clear refusal"

kill -TERM "$SERVICE_PID"
wait "$SERVICE_PID" 2>/dev/null || true
want tracerelay_regional_upstream_lost_total '>=' 2
want tracerelay_regional_agents_forwarded == 0
want tracerelay_agent_link_up == 0
want tracerelay_regional_carrier_up == 0
cluster_cleanup || true
! grep -l "Sanitizer\|runtime error" "$WORK"/*.log || fail "a sanitizer report in a log above"
echo "PASS: test_regional_metrics"
