#!/usr/bin/env bash
# test_triggers.sh: Perfetto's flight recorder across a cluster (issue 38). Three hosts in
# network namespaces, a loadgen on each writing into ring buffers; a trigger raised by a
# producer on ONE host acts on the whole cluster's session:
# - STOP_TRACING: `tracerelay record` of a config with a STOP_TRACING trigger returns once the
#   loadgen on web-3 activated it (ActivateTriggers on web-3's agent), well before the
#   trigger_timeout; the trace holds a `trigger` packet naming the trigger, the producer and
#   web-3, and every host's data up to stop_delay_ms after the trigger;
# - Perfetto v58.2 CLI's own `activate_triggers` bytes (a recorded vector) on web-1's agent
#   stop a session of the recorded flight-recorder config;
# - the same trigger raised on the service's own host (`tracerelay trigger`, no agent);
# - START_TRACING: the session waits, starts when web-2's loadgen raises the trigger and runs
#   stop_delay_ms: every host's data lies after the trigger;
# - CLONE_SNAPSHOT: a trigger on web-3, then one on the service's host, each clone the live
#   session; record writes OUT.0 and OUT.1 (as the perfetto CLI does), each with every host;
# - no trigger within trigger_timeout_ms: the session ends with an empty trace, as traced's;
# - traced's config checks refuse a bad trigger config with traced's words.
# Usage: test_triggers.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
fail() { echo "FAIL: $*"; exit 1; }
cluster_init "$1"
HOSTS=(web-1 web-2 web-3)
cluster_hosts "${HOSTS[@]}"
cluster_start_service
# web-3's agent serves its metrics (its triggers sent and lost), in its own namespace.
AGENT3_METRICS=$(python3 -c '
import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for h in web-1 web-2; do cluster_start_agent "$h"; done
cluster_start_agent web-3 --metrics-listen "127.0.0.1:$AGENT3_METRICS"
agent3_metric() { # agent3_metric NAME: its value at web-3's agent
  $(ns_prefix "$(host_ns 3)") curl -s "http://127.0.0.1:$AGENT3_METRICS/metrics" |
    awk -v n="$1" '$1 == n { print $2 }'
}

# record_with MODE TRIGGER_BLOCK OUT: records a ring-buffer session of config TRIGGER_BLOCK;
# the elapsed seconds in ELAPSED.
record_with() {
  local out=$1 trigger=$2 start end
  printf '%s\n' 'buffers { size_kb: 8192 fill_policy: RING_BUFFER }' \
    'data_sources { config { name: "track_event" } }' "$trigger" >"$WORK/$out.cfg"
  start=$(date +%s%N)
  "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/$out.cfg" --txt \
    -o "$WORK/$out.pftrace" 2>"$WORK/$out.log" || fail "record $out exited $? ($(cat "$WORK/$out.log"))"
  end=$(date +%s%N)
  ELAPSED=$(((end - start) / 1000000))
  cat "$WORK/$out.log"
}

# host_span TRACE HOST: "FIRST_TS LAST_TS PACKETS" of HOST's own packets on the trace's
# timeline (its producers' sequences: not the service's packets that name the host, such as
# its clock anchor, which may lie before a START_TRACING trigger).
host_span() {
  "$TR_BIN/tracerelay" inspect --json --packets "$1" | python3 -c '
import json, sys
d = json.load(sys.stdin)
ids = [h["machine_id"] for h in d["hosts"] if h["name"] == sys.argv[1]]
ts = [p["trace_ts"] for p in d["points"] if ids and p["machine_id"] == ids[0] and p["seq"] != 1
      and p["trace_ts"] is not None]
print(min(ts), max(ts), len(ts)) if ts else print("none none 0")' "$2"
}

# Each phase's loadgens serve one session (a loadgen ends with its data source).
loadgens() { # loadgens TAG [extra args of web-3's]
  local tag=$1 h; shift
  for h in web-1 web-2; do cluster_start_loadgen "$h" --name "$tag-$h" --rate 500; done
  cluster_start_loadgen web-3 --name "$tag-web-3" --rate 500 "$@"
}

# expect_trigger NAME PATTERN: NAME.pftrace has one trigger packet ("TS NAME PRODUCER UID
# DELAY", trigger_packets.py) matching PATTERN, and data of every host.
expect_trigger() {
  local n
  python3 "$TR_SRC/tests/integration/trigger_packets.py" "$WORK/$1.pftrace" >"$WORK/$1.triggers"
  grep -Eq "$2" "$WORK/$1.triggers" || fail "$1: the trigger packet is '$(cat "$WORK/$1.triggers")'"
  for h in "${HOSTS[@]}"; do
    read -r _ _ n < <(host_span "$WORK/$1.pftrace" "$h")
    [ "$n" -gt 0 ] || fail "$1: the trace has nothing of $h"
  done
}

# ---- STOP_TRACING, raised by a producer on web-3 ----
loadgens app --trigger boom --trigger-after 2000
cluster_wait_hosts 30 web-1:1 web-2:1 web-3:1 || fail "the loadgens did not connect"
record_with stop 'trigger_config { trigger_mode: STOP_TRACING triggers { name: "boom" stop_delay_ms: 500 } trigger_timeout_ms: 120000 }'
[ "$ELAPSED" -lt 60000 ] || fail "the STOP_TRACING session took ${ELAPSED} ms: the trigger did not stop it"
python3 "$TR_SRC/tests/integration/trigger_packets.py" "$WORK/stop.pftrace" >"$WORK/stop.triggers"
read -r trig_ts trig_name trig_producer trig_uid trig_delay <"$WORK/stop.triggers" ||
  fail "no trigger packet in the trace"
[ "$(wc -l <"$WORK/stop.triggers")" = 1 ] || fail "more than one trigger packet: $(cat "$WORK/stop.triggers")"
[ "$trig_name" = boom ] && [ "$trig_producer" = "web-3/app-web-3" ] && [ "$trig_delay" = 500 ] &&
  [ "$trig_uid" = "$(id -u)" ] || fail "the trigger packet is '$(cat "$WORK/stop.triggers")'"
grep -q 'trigger "boom" from producer app-web-3 on web-3: STOP_TRACING, stopping in 500 ms' \
  "$WORK/service.log" || fail "the service did not log the trigger"
[ "$(agent3_metric tracerelay_agent_triggers_sent_total)" = 1 ] &&
  [ "$(agent3_metric tracerelay_agent_triggers_lost_total)" = 0 ] ||
  fail "web-3's agent counts $(agent3_metric tracerelay_agent_triggers_sent_total) triggers sent, $(agent3_metric tracerelay_agent_triggers_lost_total) lost, not 1 and 0"
for h in "${HOSTS[@]}"; do
  read -r first last n < <(host_span "$WORK/stop.pftrace" "$h")
  [ "$n" -gt 500 ] || fail "$h has $n packets in the trace"
  # Its data reaches past the trigger by most of stop_delay_ms (written up to the stop), and
  # the ring holds its seconds before the trigger.
  [ "$last" -ge $((trig_ts + 400000000)) ] ||
    fail "$h's last packet is $(((last - trig_ts) / 1000000)) ms after the trigger, not ~500"
  [ "$first" -le $((trig_ts - 1000000000)) ] ||
    fail "$h's first packet is only $(((trig_ts - first) / 1000000)) ms before the trigger"
  echo "STOP_TRACING: $h: $n packets, from $(((trig_ts - first) / 1000000)) ms before the trigger to $(((last - trig_ts) / 1000000)) ms after"
done

# ---- the real CLI's trigger: v58.2's `activate_triggers` bytes (tests/vectors) replayed on
# web-1's producer socket, in a session of the recorded flight-recorder config ----
loadgens cli
cp "$TR_SRC/tests/vectors/ipc/consumer-trigger-stop.config.pbtxt" "$WORK/cli.cfg"
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/cli.cfg" --txt \
  -o "$WORK/cli.pftrace" 2>"$WORK/cli.log" &
RECORD_PID=$!
cluster_wait_session 60 web-1 web-2 web-3 || fail "the recorded config's session did not run"
python3 "$TR_SRC/tests/integration/replay_ipc.py" "$WORK/web-1/producer.sock" \
  "$TR_SRC/tests/vectors/ipc/producer-activate-triggers.to-service.bin" 2 ||
  fail "the agent did not answer the CLI's bytes"
wait "$RECORD_PID" || fail "record of the recorded config failed: $(cat "$WORK/cli.log")"
expect_trigger cli "^[0-9]+ boom web-1/perfetto_cmd_producer [0-9]+ 500$"

# ---- the same, raised on the service's own host: once every host's data flows ----
loadgens local
( cluster_wait_session 60 web-1 web-2 web-3 && "$TR_BIN/tracerelay" trigger --socket "$CONSUMER_SOCK" boom ) \
  >"$WORK/local.log" 2>&1 &
TRIGGER_PID=$!
record_with local 'trigger_config { trigger_mode: STOP_TRACING triggers { name: "boom" stop_delay_ms: 200 } trigger_timeout_ms: 120000 }'
wait "$TRIGGER_PID" || fail "tracerelay trigger failed: $(cat "$WORK/local.log")"
[ "$ELAPSED" -lt 60000 ] || fail "tracerelay trigger did not stop the session (${ELAPSED} ms)"
expect_trigger local "^[0-9]+ boom .*/tracerelay_trigger_\(pid_[0-9]+\) $(id -u) 200$"

# ---- START_TRACING, raised on web-2 once the session waits for it ----
loadgens start
record_with start 'trigger_config { trigger_mode: START_TRACING triggers { name: "go" stop_delay_ms: 1500 } trigger_timeout_ms: 120000 }' &
RECORD_PID=$!
for _ in $(seq 600); do grep -q "session 4: enabled" "$WORK/service.log" && break; sleep 0.1; done
grep -q "session 4: enabled" "$WORK/service.log" || fail "the START_TRACING session was not enabled"
cluster_start_loadgen web-2 --name starter --data-source none --trigger go --trigger-from connect
wait "$RECORD_PID" || fail "the START_TRACING record failed"
python3 "$TR_SRC/tests/integration/trigger_packets.py" "$WORK/start.pftrace" >"$WORK/start.triggers"
read -r trig_ts trig_name trig_producer _ _ <"$WORK/start.triggers" || fail "no START trigger packet"
[ "$trig_name" = go ] && [ "$trig_producer" = web-2/starter ] || fail "START trigger packet: $(cat "$WORK/start.triggers")"
for h in "${HOSTS[@]}"; do
  read -r first last n < <(host_span "$WORK/start.pftrace" "$h")
  [ "$n" -gt 100 ] || fail "START_TRACING: $h has $n packets"
  [ "$first" -ge "$trig_ts" ] || fail "START_TRACING: $h has data $(((trig_ts - first) / 1000000)) ms before the trigger"
  echo "START_TRACING: $h: $n packets, $(((first - trig_ts) / 1000000)) to $(((last - trig_ts) / 1000000)) ms after the trigger"
done

# ---- CLONE_SNAPSHOT: web-3's loadgen, then the service's host, snapshot the live session;
# record writes snap.pftrace.0 and .1 (as the perfetto CLI does) and the session goes on ----
loadgens snap --trigger snap --trigger-after 1500
record_with snap 'trigger_config { trigger_mode: CLONE_SNAPSHOT triggers { name: "snap" stop_delay_ms: 100 } trigger_timeout_ms: 15000 }' &
RECORD_PID=$!
for _ in $(seq 600); do [ -s "$WORK/snap.pftrace.0" ] && break; sleep 0.1; done
[ -s "$WORK/snap.pftrace.0" ] || fail "no snapshot after web-3's trigger: $(cat "$WORK/snap.log")"
"$TR_BIN/tracerelay" trigger --socket "$CONSUMER_SOCK" snap || fail "tracerelay trigger snap failed"
wait "$RECORD_PID" || fail "the CLONE_SNAPSHOT record failed: $(cat "$WORK/snap.log")"
grep -q "2 snapshot(s) written to $WORK/snap.pftrace.N" "$WORK/snap.log" || fail "record's snapshots: $(cat "$WORK/snap.log")"
[ ! -e "$WORK/snap.pftrace" ] || fail "the CLONE_SNAPSHOT session's own -o file was left"
for n in 0 1; do
  for h in "${HOSTS[@]}"; do
    read -r _ _ c < <(host_span "$WORK/snap.pftrace.$n" "$h")
    [ "$c" -gt 100 ] || fail "snapshot $n holds $c packets of $h"
  done
  echo "CLONE_SNAPSHOT: snapshot $n holds every host's data ($(stat -c %s "$WORK/snap.pftrace.$n") bytes)"
done
grep -q 'trigger "snap" from producer snap-web-3 on web-3: CLONE_SNAPSHOT' "$WORK/service.log" ||
  fail "the service did not log web-3's CLONE_SNAPSHOT trigger"

# ---- no trigger: an empty trace at trigger_timeout_ms ----
record_with none 'trigger_config { trigger_mode: STOP_TRACING triggers { name: "never" stop_delay_ms: 0 } trigger_timeout_ms: 1500 }'
[ ! -e "$WORK/none.pftrace" ] || fail "a session never triggered left $(stat -c %s "$WORK/none.pftrace") bytes"
grep -q "no trigger came within trigger_timeout_ms" "$WORK/none.log" || fail "record did not say why the trace is empty"

# ---- traced's config checks ----
refused() { # refused TRIGGER_BLOCK TEXT
  printf '%s\n' 'buffers { size_kb: 1024 }' 'data_sources { config { name: "track_event" } }' \
    "$1" >"$WORK/bad.cfg"
  if "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/bad.cfg" --txt \
    -o "$WORK/bad.pftrace" 2>"$WORK/bad.log"; then fail "accepted: $1"; fi
  grep -qF "$2" "$WORK/bad.log" || fail "'$1' refused without '$2': $(cat "$WORK/bad.log")"
}
refused 'trigger_config { trigger_mode: STOP_TRACING triggers { name: "a" } }' \
  "Traces with START_TRACING triggers must provide a positive trigger_timeout_ms < 7 days (received 0ms)"
refused 'duration_ms: 1000 trigger_config { trigger_mode: STOP_TRACING triggers { name: "a" } trigger_timeout_ms: 1000 }' \
  "duration_ms was set, this must not be set for traces with triggers."
refused 'trigger_config { trigger_mode: START_TRACING triggers { name: "a" } triggers { name: "a" } trigger_timeout_ms: 1000 }' \
  "Duplicate trigger name: a"
refused 'write_into_file: true trigger_config { trigger_mode: STOP_TRACING triggers { name: "a" } trigger_timeout_ms: 1000 }' \
  "Specifying trigger mode STOP_TRACING/CLONE_SNAPSHOT and write_into_file together is unsupported"
echo "PASS"
