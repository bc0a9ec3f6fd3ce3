#!/usr/bin/env bash
# test_restarts.sh: processes that die or freeze in the middle of a trace.
# Session 1 (three hosts, steady loadgens on each):
#   - web-1's agent is killed with SIGKILL, then restarted, and a new producer starts there:
#     the trace marks web-1 as disconnected (its HostStats: session_disconnects >= 1, and
#     session_disconnected_at_ns just after the kill, in the trace clock; on the timeline, the
#     instants "host web-1 disconnected" then "host web-1 agent restarted"), holds
#     web-1's data from before the kill and from the new agent, and web-2/web-3 are exact;
#     web-1's HostStats count one agent exit without an orderly stop (session_agent_exits_unclean,
#     a loss of unknown size), which `tracerelay record` names in a warning.
#   - on web-2, next to a steady producer, one producer is frozen with SIGSTOP in the middle
#     of its writing (mid-chunk: it writes 2000 1 KB events a second) and one is killed with
#     SIGKILL mid-packet: the steady producer's sequences are exact, the session still ends
#     (the frozen producer's missing flush ack and stop are counted, not waited for forever).
# Each fault waits for the session to run (status), and session 1 lasts until the restarted
# agent's new producer has started in it (record -t 0, then SIGTERM): fixed sleeps and a fixed
# session length were too short on a busy machine.
# Session 2: the service is killed with SIGKILL while it runs: `tracerelay record` exits
#   non-zero with a message naming the lost connection.
# Session 3: the service is restarted; every agent reconnects and re-advertises its
#   producers, and a new session gets every host's new producers, exactly.
# Usage: test_restarts.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
fault_init "$1"
HOSTS=(web-1 web-2 web-3)
cluster_hosts "${HOSTS[@]}"
cluster_start_service
for h in "${HOSTS[@]}"; do cluster_start_agent "$h"; done
AGENT1=$AGENT_PID_1

# ---- session 1 ----
cluster_start_loadgen web-1 --name old-web-1 --writers 1 --rate 300 --duration 20
OLD1=$LOADGEN_PID
cluster_start_loadgen web-2 --name steady-web-2 --writers 2 --rate 300 --packets 2400
STEADY2=$LOADGEN_PID; STEADY2_JSON="$WORK/loadgen-web-2-$((LOADGEN_SEQ - 1)).json"
cluster_start_loadgen web-2 --name frozen-web-2 --writers 1 --rate 2000 --packet-size 1000
FROZEN=$LOADGEN_PID
cluster_start_loadgen web-2 --name killed-web-2 --writers 1 --rate 2000 --packet-size 1000
KILLED=$LOADGEN_PID
cluster_start_loadgen web-3 --name steady-web-3 --writers 2 --rate 300 --packets 2400
STEADY3=$LOADGEN_PID
cluster_wait_hosts 30 web-1:1 web-2:3 web-3:1 || { echo "FAIL: the producers did not connect"; exit 1; }
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 64mb \
  -t 0 -o "$WORK/s1.pftrace" >"$WORK/record-1.log" 2>&1 &
RECORD=$!; CLUSTER_PIDS+=("$RECORD")
cluster_wait_session 60 web-1 web-2 web-3 || { echo "FAIL: session 1 did not start"; exit 1; }
sleep 1 # mid-writing: the producers write on, whatever the machine's speed
kill -STOP "$FROZEN"
kill -KILL "$KILLED"
boottime_ns() { python3 -c 'import time; print(time.clock_gettime_ns(time.CLOCK_BOOTTIME))'; }
boottime_ns >"$WORK/kill-web-1.ns" # the service's trace clock is BOOTTIME too
kill -KILL "$AGENT1"
wait "$AGENT1" 2>/dev/null || true
cluster_log "web-1's agent killed; frozen/killed producers on web-2"
fault_wait_pid "$OLD1" 10 || { echo "FAIL: web-1's producer did not notice its agent died"; exit 1; }
sleep 1
rm -f "$WORK/web-1/producer.sock"
cluster_start_agent web-1
cluster_start_loadgen web-1 --name new-web-1 --writers 1 --rate 300 --packets 2400
NEW1=$LOADGEN_PID
cluster_wait_session 60 web-1 || { echo "FAIL: the new producer on web-1 never started"; exit 1; }
sleep 1 # the new producer writes a while in the session
kill -TERM "$RECORD"
T0=$SECONDS
# The flush timeout and the stop timeout (5 s each) for the frozen producer, and slack.
fault_wait_pid "$RECORD" 60 || { echo "FAIL: session 1 did not end: the frozen producer held it"; exit 1; }
wait "$RECORD" || { echo "FAIL: record of session 1 failed"; cat "$WORK/record-1.log"; exit 1; }
cluster_log "session 1 ended $((SECONDS - T0)) s after record was told to stop"
for pid in "$STEADY2" "$STEADY3" "$NEW1"; do
  fault_wait_pid "$pid" 10 || { echo "FAIL: loadgen $pid did not stop"; exit 1; }
  wait "$pid" || { echo "FAIL: loadgen $pid failed"; exit 1; }
done
kill -KILL "$FROZEN" 2>/dev/null || true

"$TR_BIN/tracerelay" inspect --json "$WORK/s1.pftrace" >"$WORK/s1.json"
python3 - "$WORK/s1.json" "$STEADY2_JSON" "$WORK" <<'PY'
import json, sys, glob
report, steady2, work = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
m = {h.get("name"): h for h in report["hosts"]}
fail = []
def seqs(h): return sorted(n for s, n in m[h]["sequences"].items() if int(s) >= 2)
# web-3: exact, nothing lost, never disconnected.
w3 = json.load(open(glob.glob(f"{work}/loadgen-web-3-*.json")[0]))["total"]["packets_written"]
if sum(seqs("web-3")) != w3: fail.append(f"web-3: {w3} written, {sum(seqs('web-3'))} in trace")
hs3 = m["web-3"].get("host_stats") or {}
if hs3.get("session_disconnects"): fail.append("web-3 marked disconnected")
# web-2: the steady producer's two sequences are there, exactly.
have = seqs("web-2")
for w in steady2["writers"] if "writers" in steady2 else []:
    n = w["packets_written"]
    if n in have: have.remove(n)
    else: fail.append(f"web-2: no sequence with the steady writer's {n} packets ({seqs('web-2')})")
if "writers" not in steady2:
    fail.append(f"loadgen stats have no per-writer counts: {list(steady2)}")
hs2 = m["web-2"].get("host_stats") or {}
# The frozen producer answered neither the session's last flush nor its stop: both counted.
if not hs2.get("session_flushes_missed") or not hs2.get("session_stops_timed_out"):
    fail.append(f"web-2: the frozen producer's flush and stop are not counted: {hs2}")
lost2 = {k: v for k, v in m["web-2"]["losses"].items() if v and k in ("chunks_overwritten", "chunks_discarded")}
if lost2: fail.append(f"web-2: the central buffer lost data, the test is too big for it: {lost2}")
print("web-2 sequences", seqs("web-2"), "host_stats", {k: v for k, v in hs2.items() if v})
# web-1: data from both agents; marked disconnected.
hs1 = m["web-1"].get("host_stats") or {}
print("web-1 sequences", seqs("web-1"), "host_stats", {k: v for k, v in hs1.items() if v})
if not hs1.get("session_disconnects"): fail.append("web-1 not marked disconnected in the trace")
# ...and when: the mark follows the kill, within the heartbeat timeout (8 s) and some slack.
kill_ns = int(open(f"{work}/kill-web-1.ns").read())
marks = m["web-1"].get("disconnected_at_ns") or []
if not marks or not kill_ns <= marks[0] <= kill_ns + 10**10:
    fail.append(f"web-1: disconnect mark {marks} not just after the kill at {kill_ns}")
# ...and on the timeline: instants on the service's track.
service_marks = [(mk["ts"], mk["name"]) for mk in report.get("service_marks", [])]
print("service marks", service_marks)
down = [t for t, n in service_marks if n == "host web-1 disconnected"]
if not down or not kill_ns <= down[0] <= kill_ns + 10**10:
    fail.append(f"web-1: no 'host web-1 disconnected' instant just after the kill: {service_marks}")
elif not any(n == "host web-1 agent restarted" and t > down[0] for t, n in service_marks):
    fail.append(f"web-1: no 'host web-1 agent restarted' instant after it: {service_marks}")
# The same marks on web-1's own track, and none on the others'.
own = [(mk["ts"], mk["name"]) for mk in m["web-1"].get("host_track_marks", [])]
print("web-1 track marks", own)
if not any(n == "disconnected" for _, n in own) or not any(n == "agent restarted" for _, n in own):
    fail.append(f"web-1: its own track lacks the disconnected/agent restarted instants: {own}")
if m["web-2"].get("host_track_marks") or m["web-3"].get("host_track_marks"):
    fail.append("marks on the tracks of hosts that stayed connected")
if any("web-2" in n or "web-3" in n for _, n in service_marks):
    fail.append(f"marks for hosts that stayed connected: {service_marks}")
new1 = [json.load(open(f))["total"]["packets_written"] for f in glob.glob(f"{work}/loadgen-web-1-*.json")]
if not new1: fail.append("web-1: the new producer wrote no stats")
elif new1[0] not in seqs("web-1"): fail.append(f"web-1: the new producer's {new1[0]} packets not in {seqs('web-1')}")
if len(seqs("web-1")) < 2: fail.append("web-1: the old agent's data is missing")
# The kill is counted as a loss of unknown size on web-1, nowhere else, and record says so.
if hs1.get("session_agent_exits_unclean") != 1:
    fail.append(f"web-1: session_agent_exits_unclean {hs1.get('session_agent_exits_unclean')}, want 1")
if hs2.get("session_agent_exits_unclean") or hs3.get("session_agent_exits_unclean"):
    fail.append("an agent exit without an orderly stop counted on a host whose agent lived")
rec = open(f"{work}/record-1.log").read()
if "agents that were killed or crashed" not in rec or "web-1 (1)" not in rec:
    fail.append(f"record did not warn about web-1's killed agent:\n{rec}")
if fail: print("FAIL:\n  " + "\n  ".join(fail)); sys.exit(1)
PY

# ---- session 2: the service dies under a running session ----
mkdir -p "$WORK/session1"; mv "$WORK"/loadgen-* "$WORK/session1/"
for h in "${HOSTS[@]}"; do cluster_start_loadgen "$h" --name "s2-$h" --writers 1 --rate 200; done
S2_LOADGENS=("${CLUSTER_PIDS[@]: -3}")
cluster_wait_hosts 30 web-1:1 web-2:1 web-3:1 || { echo "FAIL: session 2's producers did not connect"; exit 1; }
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -t 0 \
  -o "$WORK/s2.pftrace" >"$WORK/record-2.log" 2>&1 &
RECORD=$!; CLUSTER_PIDS+=("$RECORD")
cluster_wait_session 60 web-1 web-2 web-3 || { echo "FAIL: session 2 did not start"; exit 1; }
kill -KILL "$SERVICE_PID"
wait "$SERVICE_PID" 2>/dev/null || true
T0=$SECONDS
fault_wait_pid "$RECORD" 5 || { echo "FAIL: record still running 5 s after the service died"; exit 1; }
if wait "$RECORD"; then echo "FAIL: record exited 0 after the service died"; exit 1; fi
cluster_log "record exited non-zero after $((SECONDS - T0)) s: $(tail -n 1 "$WORK/record-2.log")"
grep -Eiq "lost|closed|disconnect|service" "$WORK/record-2.log" || {
  echo "FAIL: record gave no clear message"; cat "$WORK/record-2.log"; exit 1; }
for pid in "${S2_LOADGENS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
for pid in "${S2_LOADGENS[@]}"; do fault_wait_pid "$pid" 5 || kill -KILL "$pid"; wait "$pid" 2>/dev/null || true; done
mkdir -p "$WORK/session2"; mv "$WORK"/loadgen-* "$WORK/session2/" 2>/dev/null || true

# ---- session 3: the restarted service gets every host back ----
rm -f "$CONSUMER_SOCK"
mv "$WORK/service.log" "$WORK/service-1.log"
cluster_start_service
T0=$SECONDS
for _ in $(seq 150); do
  n=$(grep -c "host web-[123] connected" "$WORK/service.log" || true)
  [ "$n" -ge 3 ] && break
  sleep 0.1
done
[ "$n" -ge 3 ] || { echo "FAIL: only $n agents reconnected to the restarted service"; exit 1; }
cluster_log "all agents back $((SECONDS - T0)) s after the service restart"
for h in "${HOSTS[@]}"; do
  cluster_start_loadgen "$h" --name "s3-$h" --writers 2 --rate 300 --packets 1200
done
S3_LOADGENS=("${CLUSTER_PIDS[@]: -3}")
cluster_wait_hosts 30 web-1:1 web-2:1 web-3:1 || { echo "FAIL: session 3's producers did not connect"; exit 1; }
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 32mb -t 7s \
  --machines web-1,web-2,web-3 -o "$WORK/s3.pftrace" >"$WORK/record-3.log" 2>&1 ||
  { echo "FAIL: record of session 3 failed"; cat "$WORK/record-3.log"; exit 1; }
for pid in "${S3_LOADGENS[@]}"; do
  fault_wait_pid "$pid" 10 || { echo "FAIL: loadgen $pid did not stop"; exit 1; }
  wait "$pid" || { echo "FAIL: loadgen $pid failed"; exit 1; }
done
fault_check_accounting "$WORK/s3.pftrace" lossless "${HOSTS[@]}"
echo "PASS: test_restarts"
