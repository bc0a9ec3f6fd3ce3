#!/usr/bin/env bash
# test_trace_filter.sh: TraceConfig.trace_filter through the real service (issue 38, item 3).
# A session with the recorded vector's config (its bytecode_v2 allow-list: TracePacket keeps
# timestamp, sequence id, track_event without debug_annotations, interned_data, sequence
# flags, clock_snapshot, trace_stats, track_descriptor, timestamp_clock_id and defaults) gives,
# through `tracerelay record -c` and through write_into_file, a trace whose every packet but the
# TraceStats holds only those fields, as traced's does; TraceStats (one per pass of a file)
# bypasses the filter, and the last carries filter_stats. A filter that does not parse refuses the session with traced's
# words. Real service, agent and loadgen on loopback.
# Usage: test_trace_filter.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
export TR_NO_NETNS=1
fail() { echo "FAIL: $*"; exit 1; }

cluster_init "$1"
cluster_hosts web-1
cluster_start_service
cluster_start_agent web-1
cluster_start_loadgen web-1 --rate 500
cluster_wait_hosts 30 web-1:1 || fail "the loadgen did not connect"

# The vector's config, with a shorter session: the filter is what is checked.
sed 's/duration_ms: 3000/duration_ms: 2000/' "$TR_SRC/tests/vectors/ipc/consumer-trace-filter.config.pbtxt" \
  >"$WORK/filter.pbtxt"
grep -q "bytecode_v2" "$WORK/filter.pbtxt" || fail "the vector's config has no bytecode_v2"
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/filter.pbtxt" --txt \
  -o "$WORK/filtered.pftrace" 2>"$WORK/record.log" || fail "record exited $? ($(cat "$WORK/record.log"))"
# The same through write_into_file: the file's passes go through the filter too. A loadgen
# serves one session: the next one starts once the first has gone.
wait "$LOADGEN_PID" || fail "the first loadgen exited $?"
cluster_start_loadgen web-1 --rate 500
cluster_wait_hosts 30 web-1:1 || fail "the second loadgen did not connect"
{ cat "$WORK/filter.pbtxt"; echo "write_into_file: true"; echo "file_write_period_ms: 1000"; } \
  >"$WORK/filter-file.pbtxt"
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/filter-file.pbtxt" --txt \
  -o "$WORK/filtered-file.pftrace" 2>"$WORK/record-file.log" ||
  fail "record (write_into_file) exited $? ($(cat "$WORK/record-file.log"))"

python3 - "$TR_SRC/tools" "$WORK/filtered.pftrace" "$WORK/filtered-file.pftrace" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from pbwire import fields, first, all_of
KEPT = {8, 10, 11, 12, 13, 6, 35, 60, 58, 59}  # TracePacket fields the allow-list keeps
for path in sys.argv[2:]:
    packets = [v for f, wt, v in fields(open(path, "rb").read()) if f == 1]
    if len(packets) < 200:
        sys.exit(f"FAIL: {path}: {len(packets)} packets, the loadgen's are missing")
    events = 0
    for i, p in enumerate(packets):
        got = {f for f, wt, v in fields(p)}
        if 35 in got:  # TraceStats (a file gets one per pass): never filtered, as in traced
            if first(p, 3) is None:
                sys.exit(f"FAIL: {path}: TraceStats packet {i} went through the filter")
            continue
        if got - KEPT:
            sys.exit(f"FAIL: {path}: packet {i} keeps fields {sorted(got - KEPT)} the filter drops")
        te = first(p, 11)
        if te is not None:
            events += 1
            if first(te, 4) is not None:
                sys.exit(f"FAIL: {path}: packet {i} keeps a debug annotation")
    if events < 100:
        sys.exit(f"FAIL: {path}: only {events} track events kept")
    last = packets[-1]
    stats = first(last, 35)
    if stats is None or first(last, 3) is None:
        sys.exit(f"FAIL: {path}: the last packet is not an unfiltered TraceStats (trusted_uid kept)")
    fs = first(stats, 11)
    if fs is None:
        sys.exit(f"FAIL: {path}: TraceStats has no filter_stats")
    inp, in_bytes, out_bytes, errors = (first(fs, n, 0) for n in (1, 2, 3, 4))
    discarded = all_of(fs, 20)
    # Every packet before the last went through the filter or (the TraceStats of earlier
    # passes) around it, and is counted, as traced counts them.
    if inp != len(packets) - 1 or errors != 0 or not 0 < out_bytes < in_bytes or \
            len(discarded) != 1 or discarded[0] <= 0:
        sys.exit(f"FAIL: {path}: filter_stats {inp} packets ({len(packets) - 1} filtered), "
                 f"{in_bytes} -> {out_bytes} bytes, {errors} errors, discarded {discarded}")
    print(f"{path}: {len(packets)} packets, {events} track events, filter {in_bytes} -> {out_bytes} B")
PY

# A filter that does not parse refuses the session, with traced's reason.
printf '%s\n' 'buffers { size_kb: 1024 }' 'duration_ms: 1000' \
  'data_sources { config { name: "track_event" } }' \
  'trace_filter { bytecode_v2: "\377\377\377" }' >"$WORK/bad.pbtxt"
rc=0
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/bad.pbtxt" --txt \
  -o "$WORK/bad.pftrace" 2>"$WORK/bad.log" || rc=$?
[ "$rc" != 0 ] || fail "a session with an invalid filter was not refused"
grep -q "Trace filter bytecode invalid" "$WORK/bad.log" ||
  fail "the refusal does not give traced's reason: $(cat "$WORK/bad.log")"
echo "invalid filter refused: $(grep -m1 "Trace filter" "$WORK/bad.log")"
echo "PASS: test_trace_filter"
