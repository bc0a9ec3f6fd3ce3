#!/usr/bin/env bash
# test_traced_probes.sh: Perfetto's own traced_probes (ftrace) through the agent, in both
# timeline encodings. traced_probes connects to web-1's agent as it would to traced (from
# the root namespace: the producer socket is a file, and tracefs is only mounted there), and
# a 4 s session records sched_switch/sched_wakeup. ftrace bundles carry raw BOOTTIME
# timestamps that ignore timestamp_clock_id, so `global-clocks` must anchor them (docs/
# timeline.md#ftrace) and `machines` relies on the machine's own BOOTTIME. The agent runs on
# the service's kernel with no simulated clock, so the true mapping is the identity: every
# ftrace event must resolve, with |trace time - raw time| within BOUND_US (default 1000: the
# estimator's error under ASan on a loaded machine), and fall inside the session.
# With TR_TRACE_PROCESSOR naming a trace_processor_shell too, every ftrace event of Perfetto's
# trace_processor must be at a trace time where our resolver puts one.
# Runs only when TR_TRACED_PROBES names a traced_probes binary (Perfetto is not built here:
# docs/compat.md says how to get one); exit 77 (skipped) otherwise, or without tracefs.
# Usage: test_traced_probes.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
PROBES_BIN=${TR_TRACED_PROBES:-}
if [ -z "$PROBES_BIN" ] || [ ! -x "$PROBES_BIN" ]; then
  echo "SKIP: set TR_TRACED_PROBES=/path/to/traced_probes to run this test"
  exit 77
fi
if [ ! -e /sys/kernel/tracing/trace ] && ! mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null; then
  echo "SKIP: no tracefs at /sys/kernel/tracing"
  exit 77
fi
source "$TR_SRC/tools/cluster-lib.sh"
BOUND_US=${BOUND_US:-1000}
BASE=$(mktemp -d /tmp/tracerelay-probes.XXXXXX)
CLUSTER_RUN_DIR=$BASE # removed on exit after a pass, kept after a failure (cluster-lib)
STATUS=0
for enc in machines global-clocks; do
  cluster_init "$1" "$BASE/$enc"
  cluster_hosts web-1
  cluster_start_service --timeline "$enc"
  cluster_start_agent web-1
  PERFETTO_PRODUCER_SOCK_NAME="$WORK/web-1/producer.sock" "$PROBES_BIN" >"$WORK/probes.log" 2>&1 &
  PROBES=$!
  sleep 2 # traced_probes registers linux.ftrace; the estimator's dense probes
  cat >"$WORK/cfg.pbtxt" <<'CFG'
buffers { size_kb: 16384 }
duration_ms: 4000
data_sources {
  config {
    name: "linux.ftrace"
    ftrace_config { ftrace_events: "sched/sched_switch" ftrace_events: "sched/sched_wakeup" }
  }
}
CFG
  if ! "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/cfg.pbtxt" \
      -o "$WORK/trace.pftrace" >"$WORK/record.log" 2>&1; then
    echo "FAIL: $enc: record"; cat "$WORK/record.log"; STATUS=1
  elif ! "$TR_BIN/tracerelay" inspect --packets --json "$WORK/trace.pftrace" >"$WORK/inspect.json"; then
    echo "FAIL: $enc: inspect"; STATUS=1
  elif ! python3 - "$WORK/inspect.json" "$enc" "$BOUND_US" <<'PY'; then
import json, sys
report, enc, bound_ns = json.load(open(sys.argv[1])), sys.argv[2], float(sys.argv[3]) * 1000
hosts = [h for h in report["hosts"] if h.get("name") == "web-1"]
svc = [h for h in report["hosts"] if h["machine_id"] == 0 and not h.get("domain")]
fail = []
if not hosts: fail.append("no web-1 in the trace")
ftrace = [p for p in report["points"] if p["source"] != "packet"] # bundle events, compact or not
if len(ftrace) < 100: fail.append(f"only {len(ftrace)} ftrace events")
unres = [p for p in ftrace if p["trace_ts"] is None]
if unres: fail.append(f"{len(unres)} ftrace events unresolved, first {unres[0]}")
ok = [p for p in ftrace if p["trace_ts"] is not None]
worst = max((abs(p["trace_ts"] - p["raw_ts"]) for p in ok), default=0)
if worst > bound_ns: fail.append(f"an ftrace event {worst / 1000:.1f} us off its BOOTTIME")
if svc and svc[0].get("first_ts") is not None and ok:
    first, last = svc[0]["first_ts"], svc[0]["last_ts"]
    out = [p for p in ok if not first - bound_ns <= p["trace_ts"] <= last + bound_ns]
    if out: fail.append(f"{len(out)} ftrace events outside the session [{first}, {last}]")
print(f"{enc}: {len(ftrace)} ftrace events, worst |trace - BOOTTIME| {worst / 1000:.3f} us")
if fail:
    print(f"FAIL: {enc}: " + "; ".join(fail)); sys.exit(1)
PY
    STATUS=1
  elif [ -n "${TR_TRACE_PROCESSOR:-}" ]; then
    echo "SELECT 'ts', ts FROM ftrace_event;" >"$WORK/ftrace.sql"
    "$TR_TRACE_PROCESSOR" -q "$WORK/ftrace.sql" "$WORK/trace.pftrace" >"$WORK/tp.csv" 2>"$WORK/tp.log" &&
      python3 - "$WORK/inspect.json" "$WORK/tp.csv" "$enc" <<'PY' || STATUS=1
import collections, json, os, sys
report, tp, enc = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
ours = collections.Counter(p["trace_ts"] for p in report["points"] if p["source"] != "packet")
theirs = collections.Counter(int(l.split(",")[1]) for l in open(tp)
                             if l.startswith('"ts"') and l.split(",")[1].strip().isdigit())
# trace_processor leaves a few compact sched_switch events out of ftrace_event (one per CPU,
# at the start of its first bundle, in our runs), but each event it has must be one of ours.
extra, missing = theirs - ours, ours - theirs
print(f"{enc}: trace_processor has {sum(theirs.values())} ftrace events, ours "
      f"{sum(ours.values())}: {sum(extra.values())} of its at a trace time we have not, "
      f"{sum(missing.values())} of ours not in it")
if extra or sum(missing.values()) > 2 * os.cpu_count():
    print(f"FAIL: {enc}: trace_processor places ftrace events elsewhere: {sorted(extra)[:3]}")
    sys.exit(1)
PY
  fi
  kill "$PROBES" 2>/dev/null || true
  wait "$PROBES" 2>/dev/null || true
  if [ "$STATUS" != 0 ]; then tail -5 "$WORK/probes.log"; fi
  cluster_cleanup
done
[ "$STATUS" != 0 ] || echo "PASS: test_traced_probes"
exit "$STATUS"
