#!/usr/bin/env bash
# test_overload.sh: more producers than their shared memory can hold at the configured rate.
# On web-1, 6 loadgens write 1 KB events at 2 x 4000 a second each into a small SMB (32 KB asked
# for), and web-1's agent is held (SIGSTOP) for 0.5 s meanwhile: the SMB fills up (the
# producers count their dropped packets, the agent counts SMB-full events, which the trace
# and record's summary show), and everything the producers did write is accounted for exactly: written = in
# trace + counted lost. web-1's agent has a 1 MiB queue, so that its link usually falls behind
# too and whole chunks are dropped in the agent, drop markers and all (the count that was off by
# up to 41 packets in Release runs, issue 24 item 2). web-2 runs a steady producer next to it:
# lossless. Meanwhile a probe
# producer on web-1 serves a second session whose Flush, and a QueryServiceState, must each
# be answered within 2 s (a liveness check of the service and of the loaded agent, loose on
# purpose: the probe's FlushAck follows what web-1's producers committed before it through the
# flooded agent's queue, so a flush waits for that backlog; with the sanitizers on 2 CPUs its
# longest took 0.3-1.0 s in 2026-11-25's runs, and the 1 s bound of before failed CI now and
# then). Usage: test_overload.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
fault_init "$1"
HOSTS=(web-1 web-2)
cluster_hosts "${HOSTS[@]}"
cluster_start_service
cluster_start_agent web-1 --queue-mb 1
cluster_start_agent web-2
for n in 1 2 3 4 5 6; do
  cluster_start_loadgen web-1 --name "flood-$n" --writers 2 --rate 4000 --packet-size 1000 \
    --smb-size 32 --page-size 4 --duration 4
done
cluster_start_loadgen web-2 --name steady-web-2 --writers 2 --rate 500 --duration 4 \
  --commit-latency
LOADGENS=("${CLUSTER_PIDS[@]: -7}")
# The probe's producer: its own data source, so the probe's session is not the recorded one.
mkdir -p "$WORK/probe"
$(ns_prefix "$(host_ns 1)") "$TR_BIN/tracerelay-loadgen" --socket "$WORK/web-1/producer.sock" \
  --name probe --data-source probe_source --rate 10 >"$WORK/probe/loadgen.log" 2>&1 &
CLUSTER_PIDS+=($!)
sleep 1
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 256mb \
  -t 9s -o "$WORK/overload.pftrace" >"$WORK/record.log" 2>&1 &
RECORD=$!; CLUSTER_PIDS+=("$RECORD")
sleep 1.5
# web-1's agent held for half a second, as a starved host holds it: on an idle machine the
# Release agent keeps up with the six producers (the SMB never filled there, 2026-11-27, and
# the test skipped), so the overload it checks is made here, while the writers write (4 s).
kill -STOP "$AGENT_PID_1"
sleep 0.5
kill -CONT "$AGENT_PID_1"
"$TR_BIN/consumer_probe" --socket "$CONSUMER_SOCK" --data-source probe_source --rounds 8 \
  --interval-ms 200 --bound-ms 2000 >"$WORK/probe.json" 2>"$WORK/probe.log" || {
  echo "FAIL: the service or agent did not answer within 2 s under load: $(cat "$WORK/probe.json")"
  cat "$WORK/probe.log"; exit 1; }
cluster_log "probe under load: $(cat "$WORK/probe.json")"
fault_wait_pid "$RECORD" 40 || { echo "FAIL: record did not finish"; exit 1; }
wait "$RECORD" || { echo "FAIL: record failed"; cat "$WORK/record.log"; exit 1; }
for pid in "${LOADGENS[@]}"; do
  fault_wait_pid "$pid" 10 || { echo "FAIL: loadgen $pid did not stop"; exit 1; }
  wait "$pid" || { echo "FAIL: loadgen $pid failed"; exit 1; }
done
dropped=$(python3 -c 'import json,glob,sys; print(sum(json.load(open(f))["total"]["packets_dropped"] for f in glob.glob(sys.argv[1]+"/loadgen-web-1-*.json")))' "$WORK")
cluster_log "web-1 producers dropped $dropped packets (SMB full)"
FAULT_EXPECT_LOSS= fault_check_accounting "$WORK/overload.pftrace" exact web-1
fault_check_accounting "$WORK/overload.pftrace" lossless web-2
# The overload is a precondition a machine could still take away (writers that got no CPU
# while the agent was held): then the lossless accounting above is all there is to check:
# said, not failed.
if [ "$dropped" -eq 0 ]; then
  echo "SKIP: the SMB never filled (the producers wrote too little while the agent was held): no"
  echo "overload happened, so only the lossless accounting was checked (written = in trace)"
  exit 77
fi
# The producers' drops are visible without their own counts: the agent found web-1's shared
# memory full (loss events), in the trace's stats and in record's closing line.
python3 - "$WORK/overload.pftrace.json" "$dropped" <<'PY' || exit 1
import json, sys
hosts = {m.get("name"): m for m in json.load(open(sys.argv[1]))["hosts"]}
full = {h: (hosts[h].get("host_stats") or {}).get("session_smb_full", 0) for h in ("web-1", "web-2")}
full_ms = {h: (hosts[h].get("host_stats") or {}).get("session_smb_full_ms") for h in ("web-1", "web-2")}
print(f"SMB-full events in the trace: {full}, full for at most {full_ms} ms")
if full["web-1"] == 0:
    sys.exit(f"FAIL: web-1's producers dropped {sys.argv[2]} packets, the trace says SMB full 0 times")
if not full_ms["web-1"]:
    sys.exit(f"FAIL: web-1's SMB was full {full['web-1']} times, for {full_ms['web-1']} ms")
if full["web-2"] == 0 and full_ms["web-2"] != 0:
    sys.exit(f"FAIL: web-2's SMB was never full, yet full for {full_ms['web-2']} ms")
PY
# The steady producer's commit-to-free samples: taken, and every chunk freed.
python3 - "$WORK" <<'PY' || exit 1
import glob, json, sys
lat = [json.load(open(f)).get("commit_to_free_us") for f in glob.glob(sys.argv[1] + "/loadgen-web-2-*.json")]
print(f"web-2 commit to free: {lat}")
if not lat or not lat[0] or lat[0]["samples"] == 0 or lat[0]["unfinished"] or lat[0]["max"] <= 0:
    sys.exit(f"FAIL: no commit-to-free samples, or chunks never freed: {lat}")
# Each sample splits where the loadgen's IPC thread took the commit: both parts are there, and
# neither exceeds the longest whole wait.
l = lat[0]
if not all(k in l and 0 <= l[k] <= l["max"] for k in ("to_send_p50", "to_send_p99", "after_send_p50", "after_send_p99")):
    sys.exit(f"FAIL: the commit-to-free split is missing or larger than the whole: {l}")
PY
# The SMB sizes: the producers' hint where they gave one, else the agent's default (1 MiB).
grep -q "shared memory: 32 KiB" "$WORK"/loadgen-web-1-0.log || {
  echo "FAIL: the flood producer's 32 KiB hint was not honoured"; exit 1; }
grep -q "shared memory: 1024 KiB" "$WORK"/loadgen-web-2-*.log || {
  echo "FAIL: the agent's default SMB is not 1024 KiB"; exit 1; }
grep -q "shared memory full [1-9][0-9]* times" "$WORK/record.log" || {
  echo "FAIL: record's summary does not report the full shared memory:"; cat "$WORK/record.log"
  exit 1; }
echo "PASS: test_overload"
