#!/usr/bin/env bash
# test_trace_processor.sh: our traces as Perfetto's own trace_processor reads them, in both
# timeline encodings. test_timeline.sh records a trace per encoding from three hosts with
# simulated clocks and keeps it with tracerelay-timeline-check's verdict on every loadgen event
# (where our resolver puts it on the trace timeline, and its true instant); trace_processor then
# loads the same trace, and every loadgen event must land at exactly the same trace time there
# (slice begins and ends, counter values): so the accuracy that test and bench/bench_timeline.sh
# measure with our resolver is the accuracy trace_processor and the UI show. Also checked: in
# `machines` each host is its own machine (three remote machines, named by their SystemInfo).
# Runs only when TR_TRACE_PROCESSOR names a trace_processor_shell binary (Perfetto is not built
# here: docs/compat.md says how to get one); exit 77 (skipped) otherwise.
# Usage: test_trace_processor.sh BIN_DIR [SECONDS]   (SECONDS per encoding, default 5)
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
TP=${TR_TRACE_PROCESSOR:-}
if [ -z "$TP" ] || [ ! -x "$TP" ]; then
  echo "SKIP: set TR_TRACE_PROCESSOR=/path/to/trace_processor_shell to run this test"
  exit 77
fi
KEEP=$(mktemp -d /tmp/tracerelay-tp.XXXXXX)
TR_TIMELINE_KEEP=$KEEP bash "$TR_SRC/tests/integration/test_timeline.sh" "$1" "${2:-5}"

STATUS=0
for enc in machines global-clocks; do
  cat >"$KEEP/events.sql" <<'SQL'
SELECT 'ts', s.ts FROM slice s WHERE s.category = 'loadgen'
UNION ALL
SELECT 'ts', s.ts + s.dur FROM slice s WHERE s.category = 'loadgen' AND s.dur >= 0
UNION ALL
SELECT 'ts', c.ts FROM counter c JOIN counter_track t ON c.track_id = t.id
  WHERE t.name GLOB 'loadgen.counter.*';
SELECT 'machine', raw_id, IFNULL(name, '') FROM machine WHERE id != 0;
SQL
  if ! "$TP" -q "$KEEP/events.sql" "$KEEP/$enc.pftrace" >"$KEEP/$enc.tp.csv" 2>"$KEEP/$enc.tp.log"; then
    echo "FAIL: $enc: trace_processor could not load the trace (kept in $KEEP)"
    tail -5 "$KEEP/$enc.tp.log"
    STATUS=1
    continue
  fi
  python3 - "$enc" "$KEEP/$enc.dump" "$KEEP/$enc.tp.csv" <<'PY' || STATUS=1
import sys
enc, dump, tp = sys.argv[1:]
ours = sorted(int(t) + int(e) for _, t, e in (l.split() for l in open(dump) if l.strip()))
theirs, machines = [], []
for line in open(tp):
    cells = [c.strip().strip('"') for c in line.strip().split(',')]
    if cells[0] == 'ts':
        theirs.append(int(cells[1]))
    elif cells[0] == 'machine':
        machines.append(cells[2])
theirs.sort()
print(f"{enc}: our resolver placed {len(ours)} loadgen events, trace_processor {len(theirs)}; "
      f"remote machines: {machines or 'none'}")
bad = []
if len(ours) != len(theirs) or not ours:
    bad.append("not the same events")
else:
    diffs = [a - b for a, b in zip(ours, theirs) if a != b]
    if diffs:
        bad.append(f"{len(diffs)} events at other trace times (first difference {diffs[0]} ns)")
want = sorted(['web-1', 'web-2', 'web-3']) if enc == 'machines' else []
if sorted(machines) != want:
    bad.append(f"machines {sorted(machines)}, expected {want}")
if bad:
    print(f"FAIL: {enc}: " + "; ".join(bad))
    sys.exit(1)
print(f"{enc}: every event at the same trace time in both")
PY
done
if [ "$STATUS" = 0 ]; then
  echo "PASS: test_trace_processor"
  rm -rf "$KEEP"
else
  echo "traces and trace_processor output kept in $KEEP"
fi
exit "$STATUS"
