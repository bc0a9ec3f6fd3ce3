#!/usr/bin/env bash
# test_service_restart.sh: the service dies under a session while the producers stay connected
# (issue 13, rows 1, 2 and 3).
# Session 1: the service is killed with SIGKILL once the record runs (status shows it):
#   record exits non-zero and removes its empty output (no 0-byte .pftrace left behind as if
#   it were a trace).
# Session 2: the service is restarted while the loadgen (never restarted, --duration 60) is
#   still connected to the same agent: the agent stops the dead session's data source instance
#   when the link comes back to the new service instance (the loadgen, which serves one
#   instance, then reports and exits 0 instead of writing for a minute into a session nobody
#   has); a new session then gets a new producer on that host exactly (every packet it wrote is
#   in the trace, no losses), and record exits 0.
# Session 3: SIGTERM to the service once two sessions run, one read by record, one
#   write_into_file: the service flushes, ends them with an error, waits for the consumers to
#   read and only then exits 0; both records exit non-zero saying the service shut down, both
#   traces hold the host's packets (never more than its loadgen wrote), the reading record says
#   how many it kept. The restarted service's agent then stops the loadgens' stale instances.
# Then web-1's agent is killed with SIGKILL next to a connected producer: status shows the
#   host disconnected with no producers (not the stale count it had before).
# inspect: fails on an empty file; on a file cut in the middle of a packet it prints the summary
#   of what precedes the cut and fails, naming the byte offset.
# Usage: test_service_restart.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
fault_init "$1"
cluster_hosts web-1
cluster_start_service
cluster_start_agent web-1
cluster_start_loadgen web-1 --name steady --writers 1 --rate 200 --duration 60
LOADGEN=$LOADGEN_PID; LOADGEN_LOG="$WORK/loadgen-web-1-$((LOADGEN_SEQ - 1)).log"
cluster_wait_hosts 30 web-1:1 || { echo "FAIL: the loadgen did not connect"; exit 1; }

# ---- session 1: SIGKILL the service ----
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -t 0 \
  -o "$WORK/s1.pftrace" >"$WORK/record-1.log" 2>&1 &
RECORD=$!; CLUSTER_PIDS+=("$RECORD")
cluster_wait_session 60 web-1 || { echo "FAIL: session 1 did not start"; exit 1; }
kill -KILL "$SERVICE_PID"
wait "$SERVICE_PID" 2>/dev/null || true
fault_wait_pid "$RECORD" 5 || { echo "FAIL: record still running 5 s after the service died"; exit 1; }
rc=0; wait "$RECORD" || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: record exited 0 after the service died"; exit 1; }
[ ! -e "$WORK/s1.pftrace" ] || {
  echo "FAIL: record left $(stat -c %s "$WORK/s1.pftrace") bytes behind"; cat "$WORK/record-1.log"; exit 1; }
grep -q "no trace data was received; removed the empty $WORK/s1.pftrace" "$WORK/record-1.log" || {
  echo "FAIL: record did not say it removed the empty output"; cat "$WORK/record-1.log"; exit 1; }
cluster_log "session 1: record exited $rc: $(tr '\n' '|' <"$WORK/record-1.log")"

# ---- session 2: the restarted service, the same producer ----
rm -f "$CONSUMER_SOCK"
mv "$WORK/service.log" "$WORK/service-1.log"
cluster_start_service
for _ in $(seq 150); do
  grep -q "host web-1 connected" "$WORK/service.log" && break
  sleep 0.1
done
grep -q "host web-1 connected" "$WORK/service.log" || { echo "FAIL: the agent did not reconnect"; exit 1; }
fault_wait_pid "$LOADGEN" 10 || { echo "FAIL: the old session's instance was not stopped"; exit 1; }
wait "$LOADGEN" || { echo "FAIL: the loadgen failed after its stop"; cat "$LOADGEN_LOG"; exit 1; }
grep -q "did not set up the 1 data source instance(s) still running here: stopping them" \
  "$WORK/agent-web-1.log" || { echo "FAIL: the agent did not say why it stopped it"; exit 1; }
mkdir -p "$WORK/session1"; mv "$WORK"/loadgen-* "$WORK/session1/"
cluster_start_loadgen web-1 --name fresh --writers 2 --rate 200 --packets 400
FRESH=$LOADGEN_PID
cluster_wait_hosts 30 web-1:1 || { echo "FAIL: the new loadgen did not connect"; exit 1; }
T0=$SECONDS
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -t 4s \
  -o "$WORK/s2.pftrace" >"$WORK/record-2.log" 2>&1 ||
  { echo "FAIL: record of session 2 failed"; cat "$WORK/record-2.log"; exit 1; }
cluster_log "session 2 took $((SECONDS - T0)) s"
fault_wait_pid "$FRESH" 10 || { echo "FAIL: the new loadgen did not stop"; exit 1; }
wait "$FRESH" || { echo "FAIL: the new loadgen failed"; exit 1; }
if grep -q "ignored" "$WORK"/loadgen-web-1-*.log; then
  echo "FAIL: the loadgen ignored a start"; exit 1; fi
fault_check_accounting "$WORK/s2.pftrace" lossless web-1
cp "$WORK/s2.pftrace.json" "$WORK/s2.json"

# ---- session 3: SIGTERM the service, a consumer reading and a write_into_file one ----
mkdir -p "$WORK/session2"; mv "$WORK"/loadgen-* "$WORK/session2/"
cluster_start_loadgen web-1 --name term-read --writers 1 --rate 200
TERM_READ=$LOADGEN_PID; TERM_READ_JSON="$WORK/loadgen-web-1-$((LOADGEN_SEQ - 1)).json"
cluster_start_loadgen web-1 --name term-file --writers 1 --rate 200 --data-source file_ds
TERM_FILE=$LOADGEN_PID; TERM_FILE_JSON="$WORK/loadgen-web-1-$((LOADGEN_SEQ - 1)).json"
cluster_wait_hosts 30 web-1:2 || { echo "FAIL: the loadgens did not connect"; exit 1; }
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -t 0 \
  -o "$WORK/s3-read.pftrace" >"$WORK/record-3r.log" 2>&1 &
REC_READ=$!; CLUSTER_PIDS+=("$REC_READ")
printf 'buffers { size_kb: 8192 }\ndata_sources { config { name: "file_ds" } }\nwrite_into_file: true\n' \
  >"$WORK/file.pbtxt"
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/file.pbtxt" \
  -o "$WORK/s3-file.pftrace" >"$WORK/record-3f.log" 2>&1 &
REC_FILE=$!; CLUSTER_PIDS+=("$REC_FILE")
cluster_wait_session 60 web-1:2 || { echo "FAIL: the two sessions did not start"; exit 1; }
kill -TERM "$SERVICE_PID"
fault_wait_pid "$SERVICE_PID" 15 || { echo "FAIL: the service did not exit after SIGTERM"; exit 1; }
wait "$SERVICE_PID" || { echo "FAIL: the service exited non-zero after SIGTERM"; exit 1; }
for p in "$REC_READ" "$REC_FILE"; do
  fault_wait_pid "$p" 5 || { echo "FAIL: record still running after the service left"; exit 1; }
done
for x in read file; do
  pid=$REC_READ; [ $x = file ] && pid=$REC_FILE
  rc=0; wait "$pid" || rc=$?
  [ "$rc" -ne 0 ] || { echo "FAIL: record ($x) exited 0 for a session the service cut short"; exit 1; }
  grep -q "shutting down" "$WORK/record-3$(echo $x | cut -c1).log" || {
    echo "FAIL: record ($x) did not say why"; cat "$WORK/record-3$(echo $x | cut -c1).log"; exit 1; }
  [ -s "$WORK/s3-$x.pftrace" ] || { echo "FAIL: SIGTERM left an empty $x trace"; exit 1; }
done
grep -q "holds the [0-9]* packets read before the session ended" "$WORK/record-3r.log" || {
  echo "FAIL: record did not say what it kept"; cat "$WORK/record-3r.log"; exit 1; }
# The restarted service (or the shutdown's stop) ends the loadgens' instances: their counts
# bound what each trace may hold.
rm -f "$CONSUMER_SOCK"; mv "$WORK/service.log" "$WORK/service-2.log"
cluster_start_service
for p in "$TERM_READ" "$TERM_FILE"; do
  fault_wait_pid "$p" 15 || { echo "FAIL: a loadgen's instance was never stopped"; exit 1; }
  wait "$p" || { echo "FAIL: loadgen $p failed"; exit 1; }
done
python3 - "$TR_BIN/tracerelay" "$WORK" "$TERM_READ_JSON" "$TERM_FILE_JSON" <<'PY'
import json, subprocess, sys
tool, work, read_json, file_json = sys.argv[1:5]
fail = []
for x, stats in (("read", read_json), ("file", file_json)):
    written = json.load(open(stats))["total"]["packets_written"]
    out = subprocess.run([tool, "inspect", "--json", f"{work}/s3-{x}.pftrace"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        fail.append(f"{x}: inspect failed: {out.stderr.strip()}"); continue
    h = {m.get("name"): m for m in json.loads(out.stdout)["hosts"]}.get("web-1") or {}
    got = sum(n for s, n in h.get("sequences", {}).items() if int(s) >= 2)
    print(f"SIGTERM, {x}: web-1 wrote {written} packets (until its instance stopped), "
          f"{got} in the trace (written before the shutdown flush)")
    if not 0 < got <= written: fail.append(f"{x}: {got} packets in the trace, {written} written")
if fail: print("FAIL:\n  " + "\n  ".join(fail)); sys.exit(1)
PY

# ---- an agent killed with SIGKILL: status shows its producers gone while it is away ----
cluster_start_loadgen web-1 --name idle --writers 1 --rate 10
IDLE=$LOADGEN_PID
status_of_web1() { # prints "connected producers names" of web-1 from status --json
  "$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json 2>/dev/null | python3 -c '
import json, sys
h = {x["machine_name"]: x for x in json.load(sys.stdin)["hosts"]}.get("web-1", {})
print(h.get("connected"), h.get("producers"), ",".join(h.get("producer_names", [])) or "-")'
}
seen=""
for _ in $(seq 300); do
  seen=$(status_of_web1 || true); [ "$seen" = "True 1 idle" ] && break; sleep 0.1
done
[ "$seen" = "True 1 idle" ] || { echo "FAIL: status before the kill: $seen"; exit 1; }
kill -KILL "$AGENT_PID_1"; wait "$AGENT_PID_1" 2>/dev/null || true
for _ in $(seq 300); do
  seen=$(status_of_web1 || true); [ "${seen%% *}" = False ] && break; sleep 0.1
done
[ "$seen" = "False 0 -" ] || { echo "FAIL: status of a host whose agent died: $seen"; exit 1; }
cluster_log "status of web-1 after its agent was killed: connected/producers/names = $seen"
fault_wait_pid "$IDLE" 10 || kill -KILL "$IDLE" 2>/dev/null || true
wait "$IDLE" 2>/dev/null || true

# ---- inspect on an empty and a truncated file ----
: >"$WORK/empty.pftrace"
if "$TR_BIN/tracerelay" inspect "$WORK/empty.pftrace" >"$WORK/inspect-empty.out" 2>&1; then
  echo "FAIL: inspect accepted an empty file"; exit 1; fi
grep -q "empty file: not a trace" "$WORK/inspect-empty.out" || {
  echo "FAIL: inspect's message for an empty file"; cat "$WORK/inspect-empty.out"; exit 1; }
SIZE=$(stat -c %s "$WORK/s2.pftrace")
head -c $((SIZE - 7)) "$WORK/s2.pftrace" >"$WORK/cut.pftrace"
rc=0; "$TR_BIN/tracerelay" inspect --json "$WORK/cut.pftrace" >"$WORK/cut.json" 2>"$WORK/cut.err" || rc=$?
[ "$rc" = 1 ] || { echo "FAIL: inspect of a truncated file exited $rc"; cat "$WORK/cut.err"; exit 1; }
grep -q "truncated trace at byte [0-9]*: " "$WORK/cut.err" || {
  echo "FAIL: inspect's message for a truncated file"; cat "$WORK/cut.err"; exit 1; }
python3 - "$WORK/s2.json" "$WORK/cut.json" <<'PY'
import json, sys
whole, cut = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
# The summary covers every packet but the one that was cut.
if cut["packets"] != whole["packets"] - 1:
    sys.exit(f"FAIL: truncated summary has {cut['packets']} packets, the whole {whole['packets']}")
PY
echo "PASS: test_service_restart"
