#!/usr/bin/env bash
# common.sh: helpers of the end-to-end tests that relay one host's tracerelay-loadgen along a
# path of their own and check the trace names the host (test_container.sh, test_ssh_tunnel.sh).
# Sourced, not run; the caller defines log() and TR_SRC, and sources tools/cluster-lib.sh.
#
#   free_port                      a TCP port on 127.0.0.1 nobody listens on (checked, not
#                                  guaranteed: bind can still race)
#   stop_started                   stops every PID in CLUSTER_PIDS and its direct children
#   dump_logs DIR                  the last 30 lines of every DIR/*.log, for a failed run
#   wait_producer AGENT_LOG NAME PID
#                                  waits until the agent logged the loadgen NAME (PID) connected
#   record_trace SOCKET TRACE      `tracerelay record` of 3 s of track_event through SOCKET
#   record_refused NAME EXPECTED [ARGS...]
#                                  `tracerelay record ARGS` through CONSUMER_SOCK must fail,
#                                  printing EXPECTED, and write no trace (WORK/NAME.*); also
#                                  for tests of refusals (test_config_refused.sh)
#   wait_loadgen PID LOG JSON      waits for the loadgen to end with the session; sets WRITTEN
#                                  to the packets it wrote (from its --stats-json JSON)
#   machine_id NAME                machine_id of a remote host's packets
#   decode_trace TRACE OUT         the trace as protoc's text, into OUT
# The checks exit 1 after saying what failed.

free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 40000))
    [ -z "$(ss -Hltn "sport = :$p" 2>/dev/null)" ] && { echo "$p"; return 0; }
  done
  return 1
}

# To be called before cluster_cleanup deletes the namespaces. cluster-lib's cluster_start_*
# background a shell function, so a PID there can be a subshell whose child is the real program,
# and `unshare --fork` ignores SIGTERM while its child runs: signal each PID's direct children as
# well, then wait (bounded) and SIGKILL what is left.
stop_started() {
  local pids=() pid
  for pid in "${CLUSTER_PIDS[@]}"; do
    # shellcheck disable=SC2207 # PIDs: no spaces
    pids+=($(pgrep -P "$pid") "$pid")
  done
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
}

dump_logs() {
  local f
  for f in "$1"/*.log; do
    [ -f "$f" ] || continue
    echo "---- $(basename "$f") (last 30 lines)"; tail -n 30 "$f"
  done
}

# The producer should be known to the agent (and so to the service) before the session starts,
# or it would only join it late.
wait_producer() {
  local alog=$1 name=$2 pid=$3
  for _ in $(seq 100); do
    grep -q "connected: $name" "$alog" && break
    kill -0 "$pid" 2>/dev/null || { log "the loadgen exited at once"; exit 1; }
    sleep 0.1
  done
  grep -q "connected: $name" "$alog" ||
    { log "the loadgen did not connect to the agent within 10 s"; exit 1; }
  sleep 0.5 # the agent's ProducerUpdate to the service
}

record_trace() {
  local sock=$1 trace=$2 rlog
  rlog="$(dirname "$trace")/record.log"
  timeout 60 "$TR_BIN/tracerelay" record --socket "$sock" -t 3s --data-source track_event \
    -o "$trace" >"$rlog" 2>&1 || { log "tracerelay record failed: $(cat "$rlog")"; exit 1; }
  [ -s "$trace" ] || { log "tracerelay record wrote an empty trace"; exit 1; }
}

record_refused() {
  local name=$1 expected=$2 rc=0
  shift 2
  "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" "$@" -o "$WORK/$name.pftrace" \
    2>"$WORK/$name.log" || rc=$?
  [ "$rc" != 0 ] || { log "$name: record exited 0"; exit 1; }
  grep -qF "$expected" "$WORK/$name.log" ||
    { log "$name: record did not print '$expected': $(cat "$WORK/$name.log")"; exit 1; }
  [ ! -s "$WORK/$name.pftrace" ] || { log "$name: a trace was written"; exit 1; }
  echo "$name refused: $(grep -F "$expected" "$WORK/$name.log")"
}

# The loadgen exits once the service has stopped its data source.
wait_loadgen() {
  local pid=$1 lg_log=$2 json=$3
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    log "the loadgen still runs 15 s after the session ended (was it stopped?)"; exit 1
  fi
  wait "$pid" || { log "the loadgen failed: $(cat "$lg_log")"; exit 1; }
  WRITTEN=$(sed -n 's/.*"total":{[^}]*"packets_written":\([0-9]*\).*/\1/p' "$json")
  [ -n "$WRITTEN" ] || { log "no packets_written in $json"; exit 1; }
}

# Low 32 bits of FNV-1a-64 of the name, 0 -> 1 (relay/base/fnv1a.h tr_machine_id).
machine_id() {
  local s=$1 h=$((0xcbf29ce484222325)) i c
  for ((i = 0; i < ${#s}; i++)); do
    printf -v c '%d' "'${s:i:1}"
    h=$(((h ^ c) * 0x100000001b3))
  done
  h=$((h & 0xffffffff))
  [ "$h" -eq 0 ] && h=1
  echo "$h"
}

decode_trace() {
  local plog
  plog="$(dirname "$2")/protoc.log"
  protoc --decode=perfetto.protos.Trace -I "$TR_SRC/protos" perfetto/trace/trace.proto \
    <"$1" >"$2" 2>"$plog" ||
    { log "the trace does not decode as perfetto.protos.Trace: $(head -c 500 "$plog")"; exit 1; }
}
