#!/usr/bin/env bash
# test_config_refused.sh: a TraceConfig field tracerelay does not support is refused at
# EnableTracing through the real consumer socket, the text naming the field reaching the
# consumer (`tracerelay record` prints it and exits non-zero, writing no trace): a refused field
# (producers), a refused value (primary_trace_clock MONOTONIC), and a field Perfetto v58.2 does
# not define (49, in a binary config); an ignorable Android field (notify_traceur) is recorded
# and logged by the service once. Real service on loopback; no agent is needed for the refusals.
# Usage: test_config_refused.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/common.sh"
export TR_NO_NETNS=1
fail() { echo "FAIL: $*"; exit 1; }
log() { echo "FAIL: $*"; }

cluster_init "$1"
cluster_hosts web-1
cluster_start_service


printf '%s\n' 'buffers { size_kb: 1024 }' 'duration_ms: 500' \
  'data_sources { config { name: "track_event" } }' \
  'producers { producer_name: "app" shm_size_kb: 8192 }' >"$WORK/producers.pbtxt"
record_refused producers "trace_config.producers is not supported by tracerelay: the agents size" \
  -c "$WORK/producers.pbtxt"

printf '%s\n' 'buffers { size_kb: 1024 }' 'duration_ms: 500' \
  'data_sources { config { name: "track_event" } }' \
  'builtin_data_sources { primary_trace_clock: BUILTIN_CLOCK_MONOTONIC }' >"$WORK/clock.pbtxt"
record_refused clock "trace_config.builtin_data_sources.primary_trace_clock is not supported by tracerelay" \
  -c "$WORK/clock.pbtxt"

# buffers { size_kb: 1024 } data_sources { config { name: "track_event" } }, then field 49 = 1.
printf '\x0a\x03\x08\x80\x08\x12\x0f\x0a\x0d\x0a\x0btrack_event\x88\x03\x01' >"$WORK/unknown.pb"
record_refused unknown "trace_config holds field 49, which Perfetto v58.2 does not define" \
  -c "$WORK/unknown.pb" -t 500ms

printf '%s\n' 'buffers { size_kb: 1024 }' 'duration_ms: 500' \
  'data_sources { config { name: "track_event" } }' 'notify_traceur: true' >"$WORK/traceur.pbtxt"
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/traceur.pbtxt" \
  -o "$WORK/traceur.pftrace" 2>"$WORK/traceur.log" ||
  fail "notify_traceur: record exited $?: $(cat "$WORK/traceur.log")"
[ -s "$WORK/traceur.pftrace" ] || fail "notify_traceur: no trace"
n=$(grep -c "trace_config.notify_traceur ignored: read on Android only" "$WORK"/service*.log || true)
[ "$n" = 1 ] || fail "the service logged notify_traceur $n times, not once"
echo "PASS: test_config_refused"
