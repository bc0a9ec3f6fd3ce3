#!/usr/bin/env bash
# test_hostile_agent.sh: hostile agents with valid certificates against the root
# (docs/security.md, "Agents"; issue 39 item 1), next to an honest one. One service, one honest
# agent (web-1) whose loadgen writes an exact number of packets into a session recorded with
# `tracerelay record`; while it writes, hostile_agent runs each of its modes from its own
# certificate (evil-1 .. evil-4), one after the other:
#   replies  64 CommandReplies of 4 MiB to no command, ordered after a batch that never comes:
#            refused unheld and counted (tracerelay_host_replies_unexpected_total = 64), the
#            link kept (before: held, 1,024 of them a host, 4 GiB);
#   ends     48 producer ends of 4 MiB after that batch: the root closes the link once its
#            bound of held bytes is passed, with a Goodbye naming it (before: held);
#   sources  one ProducerUpdate with 100,000 data sources: refused at once with a Goodbye
#            naming the limit of 256 (before: taken one by one, each with a search over the
#            ones before it: the root's loop stalled for minutes);
#   names    a producer name of 4 MiB: refused with a Goodbye naming the byte limit.
# Then: the root's RSS grew by less than RSS_BOUND_MB over the attack (before: 256 MiB for
# replies alone), every packet of the loadgen is in the trace and nothing of web-1 was lost
# (fault_check_accounting lossless). Prints the root's RSS before, at its highest during and
# after the attack, and the honest host's packet counts.
# Usage: test_hostile_agent.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
export TR_NO_NETNS=${TR_NO_NETNS:-1}
SERVICE_PORT=$((20000 + RANDOM % 20000)) # loopback: not the port of a test running alongside
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
fault_init "$1"
# Under ASan freed memory waits in a quarantine (256 MiB by default) before it is reused: the
# frames the root decodes and frees would show in its RSS as if held. A small one keeps the
# figure about what is held.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=8"
cluster_hosts web-1
"$TR_SRC/certs/make-certs.sh" "$WORK/pki" --agent evil-1 --agent evil-2 --agent evil-3 \
  --agent evil-4 >/dev/null
METRICS_PORT=$((SERVICE_PORT + 1))
cluster_start_service --metrics-listen "127.0.0.1:$METRICS_PORT"
cluster_start_agent web-1 --machine-name web-1

PACKETS=4000
cluster_start_loadgen web-1 --name steady-web-1 --writers 2 --rate 400 --packets "$PACKETS" \
  --packet-size 200
LOADGEN=$LOADGEN_PID
cluster_wait_hosts 30 web-1:1 || { echo "FAIL: the loadgen did not connect"; exit 1; }
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 32mb -t 0 \
  -o "$WORK/trace.pftrace" >"$WORK/record.log" 2>&1 &
RECORD=$!
CLUSTER_PIDS+=("$RECORD")
cluster_wait_session 60 web-1 || { echo "FAIL: the session did not start"; exit 1; }

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$SERVICE_PID/status"; }
RSS_BEFORE=$(rss_kb)
RSS_MAX=$RSS_BEFORE
sample_rss() { # the root's RSS every 50 ms while PID runs, its highest kept in $WORK/rss.max
  local max=$RSS_BEFORE r
  while kill -0 "$1" 2>/dev/null; do
    r=$(rss_kb) && [ "$r" -gt "$max" ] && max=$r
    sleep 0.05
  done
  echo "$max" >"$WORK/rss.max"
}

fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
declare -A COUNT=([replies]=64 [ends]=48 [sources]=1 [names]=1)
declare -A EXPECT=([replies]="" [ends]="waiting for their batches"
  [sources]="over the limit of 256" [names]="over the limit of 1024 bytes")
i=0
for m in replies ends sources names; do
  i=$((i + 1))
  args=(--service "127.0.0.1:$SERVICE_PORT" --server-name "$SERVICE_NAME" --ca "$WORK/pki/ca.crt"
    --cert "$WORK/pki/agent-evil-$i.crt" --key "$WORK/pki/agent-evil-$i.key" --mode "$m"
    --count "${COUNT[$m]}" --timeout-ms 90000)
  [ -n "${EXPECT[$m]}" ] && args+=(--expect "${EXPECT[$m]}")
  "$TR_BIN/hostile_agent" "${args[@]}" >"$WORK/hostile-$m.log" 2>&1 &
  pid=$!
  CLUSTER_PIDS+=("$pid")
  sample_rss "$pid"
  r=$(cat "$WORK/rss.max"); [ "$r" -gt "$RSS_MAX" ] && RSS_MAX=$r
  rc=0; wait "$pid" || rc=$?
  if [ "$rc" = 0 ]; then
    echo "ok: $(grep '^hostile agent' "$WORK/hostile-$m.log")"
  elif [ "$rc" = 3 ] && grep -q "evil-$i.*${EXPECT[$m]}" "$WORK/service.log"; then
    # The root's Goodbye was lost in the reset of a link that was still sending to it.
    echo "ok: hostile $m: the root closed the link: $(grep -m1 "evil-$i.*${EXPECT[$m]}" "$WORK/service.log")"
  else
    fail "hostile $m: $(tr '\n' ' ' <"$WORK/hostile-$m.log")"
  fi
done
kill -0 "$SERVICE_PID" 2>/dev/null || fail "the root died during the attack"
metric() { curl -s "http://127.0.0.1:$METRICS_PORT/metrics" | awk -v n="$1" '$1 == n {print $2}'; }
unexpected=$(metric 'tracerelay_host_replies_unexpected_total{host="evil-1"}')
if [ "${unexpected:-0}" = 64 ]; then
  echo "ok: tracerelay_host_replies_unexpected_total{host=\"evil-1\"} = 64"
else
  fail "tracerelay_host_replies_unexpected_total{host=\"evil-1\"} is '${unexpected:-absent}', not 64"
fi
grep -q "host evil-1: reply to request [0-9]*, which no command in flight has" "$WORK/service.log" ||
  fail "the root did not log the unexpected replies"

# The session stops once the root has most of what the loadgen writes (2 x 4000 packets of
# 200 bytes; stopping flushes the rest, and the loadgen's own count of what it wrote is what
# the trace is checked against), then the loadgen ends with it.
for _ in $(seq 240); do
  b=$(metric 'tracerelay_host_received_bytes_total{host="web-1"}')
  [ "${b%.*}" -ge 1500000 ] 2>/dev/null && break
  sleep 0.25
done
kill -TERM "$RECORD"
fault_wait_pid "$RECORD" 60 || fail "record did not finish"
wait "$RECORD" || { fail "tracerelay record failed"; cat "$WORK/record.log"; }
fault_wait_pid "$LOADGEN" 30 || fail "the loadgen did not finish"
wait "$LOADGEN" || fail "the loadgen failed: $(tail -3 "$WORK/loadgen-web-1-0.log")"
RSS_AFTER=$(rss_kb)
RSS_BOUND_MB=${RSS_BOUND_MB:-96}
echo "root RSS: before the attack $((RSS_BEFORE / 1024)) MiB, highest during it" \
  "$((RSS_MAX / 1024)) MiB, after it $((RSS_AFTER / 1024)) MiB (bound: +$RSS_BOUND_MB MiB;" \
  "the attack sent $(((64 + 48) * 4)) MiB of frames to hold)"
[ $((RSS_MAX - RSS_BEFORE)) -lt $((RSS_BOUND_MB * 1024)) ] ||
  fail "the root's RSS grew by $(((RSS_MAX - RSS_BEFORE) / 1024)) MiB during the attack"
fault_check_accounting "$WORK/trace.pftrace" lossless web-1 || fails=$((fails + 1))
if [ "$fails" -gt 0 ]; then
  echo "FAIL: $fails check(s) failed; service log tail:"
  tail -20 "$WORK/service.log"
  exit 1
fi
echo "PASS"
