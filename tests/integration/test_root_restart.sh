#!/usr/bin/env bash
# test_root_restart.sh: a root service restarted under a regional keeps the agents' links to
# the regional up (issue 25 item 4: a root restart under a 1,000-host regional did not recover
# in 8 minutes, because the regional closed every agent's link and 2,000 handshakes followed).
# On loopback: a root, regional-a and three agents behind it (each with --metrics-listen).
# Asserted:
#  1. all three hosts and regional-a connected at the root; each agent's link came up once
#     (tracerelay_agent_link_connects_total 1).
#  2. the root stops (SIGTERM); a fourth agent, web-4, connects to the regional meanwhile and
#     says Hello (the regional counts 4 agents); the root starts again on the same port: within
#     60 s the four hosts are connected at the new root, each agent's link to the regional
#     never closed (connects_total 1: web-4 waited at the regional, heartbeated, instead of
#     being sent away), the three heard that their upstream was lost
#     (tracerelay_agent_link_upstream_losses_total >= 1); the regional counts the three
#     upstream links lost and has none still relinking.
#  3. a session at the new root gets every host's data: a loadgen on each host writes (at
#     most 400 packets) until the session stops, and `tracerelay inspect --json` of the
#     recording finds each writer's packets, however many, as one sequence, with nothing
#     unresolved and no loss counted.
#  4. no sanitizer report in any log.
# Usage: test_root_restart.sh BIN_DIR. Exits 77 (skip) without curl.
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
export TR_NO_NETNS=1
fail() { echo "FAIL: $*"; exit 1; }
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
SERVICE_PORT=$(free_port)
cluster_init "$1"
HOSTS=(web-1 web-2 web-3)
ALL=(web-1 web-2 web-3 web-4)
declare -A MPORT=()

cluster_tree "regional-a=web-1,web-2,web-3,web-4"
cluster_start_service --relay-allow 'regional-a=web-*' || fail "the root did not start"
RM=$(free_port)
cluster_start_regional regional-a --metrics-listen "127.0.0.1:$RM" || fail "the regional did not start"
for h in "${HOSTS[@]}"; do
  MPORT[$h]=$(free_port)
  cluster_start_agent "$h" --metrics-listen "127.0.0.1:${MPORT[$h]}" || fail "agent $h did not start"
done
cluster_wait_hosts 60 "${HOSTS[@]}" regional-a || fail "the hosts did not all reach the root"

metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n { print $2 }'; }
want() { # want PORT NAME OP VALUE: polls up to 30 s (the figures follow the links' events)
  local v
  for _ in $(seq 300); do
    v=$(metric "$1" "$2")
    [ -n "$v" ] && python3 -c "import sys; sys.exit(0 if float('$v') $3 $4 else 1)" && return 0
    sleep 0.1
  done
  fail "/metrics on port $1: $2 = '${v}', want $3 $4"
}
for h in "${HOSTS[@]}"; do
  want "${MPORT[$h]}" tracerelay_agent_link_up == 1
  want "${MPORT[$h]}" tracerelay_agent_link_connects_total == 1
done

echo "restarting the root"
kill -TERM "$SERVICE_PID"
wait "$SERVICE_PID" 2>/dev/null || true
want "$RM" tracerelay_regional_agents_forwarded == 0 # the regional saw the root go
MPORT[web-4]=$(free_port)
cluster_start_agent web-4 --metrics-listen "127.0.0.1:${MPORT[web-4]}" || fail "agent web-4 did not start"
want "$RM" tracerelay_regional_agents == 4 # its Hello is in, no upstream to take it
cluster_start_service --relay-allow 'regional-a=web-*' || fail "the root did not start again"
T0=$SECONDS
cluster_wait_hosts 60 "${ALL[@]}" regional-a || fail "the hosts did not all reach the restarted root within 60 s"
echo "every host back at the root $((SECONDS - T0)) s after its restart"
for h in "${ALL[@]}"; do
  want "${MPORT[$h]}" tracerelay_agent_link_up == 1
  v=$(metric "${MPORT[$h]}" tracerelay_agent_link_connects_total)
  [ "$v" = 1 ] || fail "$h: its link to the regional came up $v times: it was closed by the root's restart"
done
for h in "${HOSTS[@]}"; do
  want "${MPORT[$h]}" tracerelay_agent_link_upstream_losses_total '>=' 1
done
want "$RM" tracerelay_regional_agents_forwarded == 4
want "$RM" tracerelay_regional_agents_relinking == 0
want "$RM" tracerelay_regional_upstream_lost_total '>=' 3
echo "regional: $(curl -s "http://127.0.0.1:$RM/metrics" | grep -E '^tracerelay_regional_(upstream_lost|relink)' | tr '\n' ' ')"

# A session at the new root: every host's loadgen, its packets in the trace.
LG=()
for h in "${HOSTS[@]}"; do
  cluster_start_loadgen "$h" --name "app-$h" --writers 1 --rate 200 --packets 400
  LG+=("$LOADGEN_PID")
done
cluster_wait_hosts 30 web-1:1 web-2:1 web-3:1 || fail "the loadgens' producers did not all reach the root"
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 16mb -t 0 \
  -o "$WORK/after.pftrace" >"$WORK/record.log" 2>&1 &
REC=$!
CLUSTER_PIDS+=("$REC")
cluster_wait_session 60 "${HOSTS[@]}" || fail "the session did not start on every host"
sleep 2 # some writing (what was written is checked, however much it is)
kill -TERM "$REC"
wait "$REC" || fail "record failed: $(tail -n 3 "$WORK/record.log")"
for pid in "${LG[@]}"; do # each ends once the session stopped its data source
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  wait "$pid" || fail "loadgen $pid failed"
done
"$TR_BIN/tracerelay" inspect --json "$WORK/after.pftrace" >"$WORK/after.json" || fail "inspect"
python3 - "$WORK" "$WORK/after.json" "${HOSTS[@]}" <<'PY' || fail "a host's data is missing from the session after the restart"
import glob, json, sys
work, report, hosts = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3:]
by = {m.get("name"): m for m in report["hosts"]}
bad = []
for h in hosts:
    m = by.get(h)
    if m is None:
        bad.append(f"{h}: not in the trace ({sorted(by, key=str)})"); continue
    want = [w["packets_written"] for f in glob.glob(f"{work}/loadgen-{h}-*.json")
            for w in json.load(open(f))["writers"]]
    seqs = list(m["sequences"].values()) if isinstance(m["sequences"], dict) else [c for _, c in m["sequences"]]
    losses = {k: v for k, v in m["losses"].items() if k != "trace_stats_packets" and v}
    print(f"{h}: writers {want}, sequences {m['sequences']}, losses {losses or 'none'}, "
          f"unresolved {m.get('unresolved', 0)}")
    if not want or 0 in want or any(n not in seqs for n in want):
        bad.append(f"{h}: writers {want} not each one sequence in the trace")
    if losses or m.get("unresolved", 0):
        bad.append(f"{h}: losses {losses}, unresolved {m.get('unresolved', 0)}")
if bad:
    print("FAIL:\n  " + "\n  ".join(bad)); sys.exit(1)
PY
cluster_cleanup || true
! grep -l "Sanitizer\|runtime error" "$WORK"/*.log || fail "a sanitizer report in a log above"
echo "PASS: test_root_restart"
