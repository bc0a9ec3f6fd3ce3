#!/usr/bin/env bash
# cluster-lib.sh: builds a tracerelay cluster on this one machine, for the demo and the
# integration tests. Sourced, not run. Each "host" is a network namespace with a veth link
# to a central namespace where the service runs (addresses 10.200.N.0/24 exist only inside
# the namespaces made here, so no traffic can leave the machine). Where namespaces are not
# allowed (TR_NO_NETNS=1, or `ip netns add` fails), every process runs on loopback instead.
#
# Usage:
#   source tools/cluster-lib.sh
#   cluster_init "$BIN_DIR" [WORKDIR]        # sets a trap that tears everything down
#   cluster_hosts web-1 web-2 web-3          # namespaces + certificates
#   cluster_start_service [service flags...]
#   cluster_start_agent web-1 [agent flags...]    # CLUSTER_SERVICE_VIA[web-1]=H:P: dial a proxy
#   cluster_start_loadgen web-1 [loadgen flags...]   # prints nothing; PID in LOADGEN_PID
#   "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" ...
# Every process started here is killed by PID, and every namespace deleted, on exit.
# Files: without WORKDIR, cluster_init makes a fresh /tmp/tracerelay-cluster.XXXXXX. The run's
# directory (that one, or CLUSTER_RUN_DIR when the caller set it, e.g. to the parent of several
# WORKDIRs) is removed on exit after a pass or a skip (exit 0 or 77), and kept after a failure,
# saying where; TR_KEEP_WORK=1 keeps it always. A given WORKDIR alone is never removed.
# TR_WRAP (e.g. "valgrind --log-file=/tmp/vg.%p") prefixes the service and agent commands
# (tools/valgrind.sh); the wrapper must exec or be the daemon, so that its PID is the daemon's.
# Mixed versions (test_upgrade.sh): CLUSTER_BIN_OF[NAME]=DIR runs host NAME's agent, loadgens or
# regional from DIR instead of the cluster's bin dir, CLUSTER_SERVICE_BIN=DIR the service.

CLUSTER_PIDS=()
# The order cluster_cleanup stops them in: producers, agents, whatever else (proxies, load),
# regionals, services, so each process ends while what it talks to is still up (an agent with
# data not yet acknowledged would otherwise wait its shutdown timeout for the service).
declare -gA CLUSTER_STOP_STEP=()
CLUSTER_NETNS=()
CLUSTER_HOSTS=()
declare -gA CLUSTER_SERVICE_VIA=() # host name -> HOST:PORT its agent dials instead (a proxy)
declare -gA CLUSTER_BIN_OF=()      # host name -> bin dir of its agent, loadgens, regional
CLUSTER_SERVICE_BIN=               # bin dir of the service (default: the cluster's)

cluster_log() { printf '[cluster] %s\n' "$*" >&2; }

cluster_init() {
  TR_BIN=$(cd "$1" && pwd)
  if [ -n "${2:-}" ]; then
    WORK=$2
    mkdir -p "$WORK"
  else
    WORK=$(mktemp -d /tmp/tracerelay-cluster.XXXXXX)
    CLUSTER_RUN_DIR=${CLUSTER_RUN_DIR:-$WORK}
  fi
  # Six hex digits: clusters running at once (tools/run-tests.sh runs two tests at a time) must
  # not share namespace or interface names ("tr" + id + a letter + a host number stays within
  # the kernel's 15 characters up to host 9999).
  CLUSTER_ID=$(printf '%06x' $(((RANDOM << 15 | RANDOM) % 16777216)))
  CONSUMER_SOCK="$WORK/consumer.sock"
  SERVICE_NAME=tracerelay-service
  USE_NETNS=1
  if [ "${TR_NO_NETNS:-0}" = 1 ] || ! ip netns add "tr${CLUSTER_ID}-probe" 2>/dev/null; then
    USE_NETNS=0
    cluster_log "network namespaces unavailable: every host runs on loopback"
  else
    ip netns del "tr${CLUSTER_ID}-probe"
  fi
  # In namespaces the port is the cluster's own; on loopback it is shared with whatever else
  # runs on this machine (another test, another suite): a free one, unless the caller chose.
  if [ -z "${SERVICE_PORT:-}" ]; then
    SERVICE_PORT=7393
    [ "$USE_NETNS" = 1 ] || SERVICE_PORT=$(python3 -c '
import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  fi
  trap cluster_on_exit EXIT
  trap 'exit 130' INT TERM
}

cluster_on_exit() {
  local status=$?
  cluster_cleanup
  cluster_finish "$status"
  return $status
}

# cluster_finish STATUS: the run's directory (CLUSTER_RUN_DIR, see above) removed after a pass
# or a skip, kept after a failure (or with TR_KEEP_WORK=1), saying where.
cluster_finish() {
  [ -n "${CLUSTER_RUN_DIR:-}" ] && [ -d "$CLUSTER_RUN_DIR" ] || return 0
  if [ "${TR_KEEP_WORK:-0}" = 1 ]; then
    cluster_log "TR_KEEP_WORK=1: this run's files are kept in $CLUSTER_RUN_DIR"
  elif [ "$1" = 0 ] || [ "$1" = 77 ]; then
    rm -rf "$CLUSTER_RUN_DIR"
  else
    cluster_log "failed (exit $1): this run's files are kept in $CLUSTER_RUN_DIR"
  fi
}

cluster_cleanup() {
  local status=$?
  set +e # a failing kill or wait must not change the script's own exit status
  local pid step
  for step in 0 1 2 3 4; do
    for pid in "${CLUSTER_PIDS[@]}"; do
      [ "${CLUSTER_STOP_STEP[$pid]:-2}" = "$step" ] && kill -TERM "$pid" 2>/dev/null
    done
    for pid in "${CLUSTER_PIDS[@]}"; do
      [ "${CLUSTER_STOP_STEP[$pid]:-2}" = "$step" ] || continue
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
    done
  done
  CLUSTER_PIDS=()
  CLUSTER_STOP_STEP=()
  local ns
  for ns in "${CLUSTER_NETNS[@]}"; do
    ip netns del "$ns" 2>/dev/null
  done
  CLUSTER_NETNS=()
  return $status
}

# The namespace of the service and of host N, or nothing without namespaces.
svc_ns() { [ "$USE_NETNS" = 1 ] && echo "tr${CLUSTER_ID}-svc"; }
host_ns() { [ "$USE_NETNS" = 1 ] && echo "tr${CLUSTER_ID}-h$1"; }
in_ns() { # in_ns NS CMD...: runs CMD in NS (or here, without namespaces)
  local ns=$1; shift
  if [ -n "$ns" ]; then ip netns exec "$ns" "$@"; else "$@"; fi
}
# The command prefix that enters NS. Used unquoted for background daemons, so that $! is
# the daemon itself (`ip netns exec` execs it) rather than a subshell running a function.
ns_prefix() { if [ -n "$1" ]; then echo "ip netns exec $1"; fi; }
bin_of() { echo "${CLUSTER_BIN_OF[$1]:-$TR_BIN}"; } # bin_of NAME: its programs' directory
host_index() { # host_index NAME -> 1-based index in CLUSTER_HOSTS
  local i
  for i in "${!CLUSTER_HOSTS[@]}"; do
    [ "${CLUSTER_HOSTS[$i]}" = "$1" ] && { echo $((i + 1)); return; }
  done
  return 1
}
# Address agents of host N dial to reach the service.
service_addr_for() { if [ "$USE_NETNS" = 1 ]; then echo "10.200.$1.1"; else echo 127.0.0.1; fi; }

cluster_hosts() {
  CLUSTER_HOSTS=("$@")
  local args=(--service-name "$SERVICE_NAME")
  local name i
  for name in "$@"; do args+=(--agent "$name"); done
  "$TR_SRC/certs/make-certs.sh" "$WORK/pki" "${args[@]}" >/dev/null
  [ "$USE_NETNS" = 1 ] || return 0
  local svc
  svc=$(svc_ns)
  ip netns add "$svc"; CLUSTER_NETNS+=("$svc")
  ip -n "$svc" link set lo up
  i=0
  for name in "$@"; do
    i=$((i + 1))
    link_to_service "$i"
  done
}

# ns_linked UP NS UP_IF NS_IF NET: makes namespace NS, linked to namespace UP by a veth (UP_IF
# in UP holds NET.1/24, NS_IF in NS NET.2/24).
ns_linked() {
  local up=$1 ns=$2 a=$3 b=$4 net=$5
  ip netns add "$ns"; CLUSTER_NETNS+=("$ns")
  ip -n "$ns" link set lo up
  ip link add "$a" netns "$up" type veth peer name "$b" netns "$ns"
  ip -n "$up" addr add "$net.1/24" dev "$a"
  ip -n "$ns" addr add "$net.2/24" dev "$b"
  ip -n "$up" link set "$a" up
  ip -n "$ns" link set "$b" up
}

# link_to_service N: host N's namespace, linked to the service's (10.200.N.0/24).
link_to_service() {
  ns_linked "$(svc_ns)" "$(host_ns "$1")" "tr${CLUSTER_ID}s$1" "tr${CLUSTER_ID}h$1" "10.200.$1"
}

wait_for_socket() { # wait_for_socket PATH PID: up to 10 s
  for _ in $(seq 100); do
    [ -S "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || { cluster_log "process $2 exited before creating $1"; return 1; }
    sleep 0.1
  done
  cluster_log "timed out waiting for $1"; return 1
}

cluster_start_service() {
  $(ns_prefix "$(svc_ns)") ${TR_WRAP:-} "${CLUSTER_SERVICE_BIN:-$TR_BIN}/tracerelay-service" --listen "0.0.0.0:$SERVICE_PORT" \
    --consumer-socket "$CONSUMER_SOCK" --ca "$WORK/pki/ca.crt" \
    --cert "$WORK/pki/service.crt" --key "$WORK/pki/service.key" "$@" \
    >>"$WORK/service.log" 2>&1 &
  SERVICE_PID=$!
  CLUSTER_PIDS+=("$SERVICE_PID")
  CLUSTER_STOP_STEP[$SERVICE_PID]=4
  wait_for_socket "$CONSUMER_SOCK" "$SERVICE_PID"
}

cluster_start_agent() {
  local name=$1; shift
  local i; i=$(host_index "$name") || { cluster_log "unknown host $name"; return 1; }
  mkdir -p "$WORK/$name"
  $(ns_prefix "$(host_ns "$i")") ${TR_WRAP:-} "$(bin_of "$name")/tracerelay-agent" --producer-socket "$WORK/$name/producer.sock" \
    --service "${CLUSTER_SERVICE_VIA[$name]:-$(service_addr_for "$i"):$SERVICE_PORT}" \
    --service-name "$SERVICE_NAME" \
    --ca "$WORK/pki/ca.crt" --cert "$WORK/pki/agent-$name.crt" --key "$WORK/pki/agent-$name.key" \
    "$@" >>"$WORK/agent-$name.log" 2>&1 &
  AGENT_PID=$!
  CLUSTER_PIDS+=("$AGENT_PID")
  CLUSTER_STOP_STEP[$AGENT_PID]=1
  eval "AGENT_PID_${i}=$AGENT_PID"
  wait_for_socket "$WORK/$name/producer.sock" "$AGENT_PID"
}

cluster_start_loadgen() {
  local name=$1; shift
  local i; i=$(host_index "$name") || { cluster_log "unknown host $name"; return 1; }
  local n=${LOADGEN_SEQ:-0}; LOADGEN_SEQ=$((n + 1))
  $(ns_prefix "$(host_ns "$i")") "$(bin_of "$name")/tracerelay-loadgen" --socket "$WORK/$name/producer.sock" \
    --stats-json "$WORK/loadgen-$name-$n.json" "$@" >>"$WORK/loadgen-$name-$n.log" 2>&1 &
  LOADGEN_PID=$!
  CLUSTER_PIDS+=("$LOADGEN_PID")
  CLUSTER_STOP_STEP[$LOADGEN_PID]=0
}

# ---- Tiers (issue 14): a root service, regional services under it, agents under each regional.
#   cluster_tree REGIONAL=HOST[,HOST...]...   namespaces + certificates of a two-tier tree
#   cluster_tree_direct HOST...               (after cluster_tree) hosts of the root's own
#   cluster_start_regional REGIONAL [flags]   a regional tracerelay-service
#   cluster_status_hosts                      every host the root knows: "NAME 1|0 PRODUCERS"
#   cluster_wait_hosts SECONDS NAME[:N]...    until each is connected (with >= N producers)
#   cluster_wait_session SECONDS NAME[:N]...  until each relays data in N started sessions
# cluster_tree makes the root's namespace (svc_ns: cluster_start_service runs the root there),
# one namespace per regional linked to the root's by a veth (10.201.R.0/24: root .1, regional
# .2) and one per host linked to ITS regional's by a veth (10.202.H.0/24: regional .1, host
# .2), no forwarding: a host reaches only its regional, a regional only the root. CLUSTER_HOSTS
# holds the hosts, then the regionals (so cluster_start_agent and cluster_start_loadgen take
# any of them: a regional's loadgen connects to the regional's own --producer-socket), every
# host's agent dials its regional (CLUSTER_SERVICE_VIA) and CLUSTER_REGIONAL_OF[host] names it.
# Certificates: the service's (the root and every regional present it, one --service-name) and
# agent-NAME for every host and regional (a regional's upstream certificate).
# Without namespaces everything is on loopback, regional R listening on SERVICE_PORT + R.
declare -gA CLUSTER_REGIONAL_OF=() CLUSTER_REGIONAL_PID=()
CLUSTER_REGIONALS=()

cluster_tree() {
  local spec r h i ri hosts=() regionals=() args=(--service-name "$SERVICE_NAME")
  CLUSTER_REGIONAL_OF=()
  for spec in "$@"; do
    r=${spec%%=*}; regionals+=("$r")
    local members
    IFS=, read -r -a members <<<"${spec#*=}"
    for h in "${members[@]}"; do hosts+=("$h"); CLUSTER_REGIONAL_OF[$h]=$r; done
  done
  CLUSTER_REGIONALS=("${regionals[@]}")
  CLUSTER_HOSTS=("${hosts[@]}" "${regionals[@]}")
  for h in "${CLUSTER_HOSTS[@]}"; do args+=(--agent "$h"); done
  "$TR_SRC/certs/make-certs.sh" "$WORK/pki" "${args[@]}" >/dev/null
  for h in "${hosts[@]}"; do
    CLUSTER_SERVICE_VIA[$h]=$(regional_addr_for "$h"):$(regional_port "${CLUSTER_REGIONAL_OF[$h]}")
  done
  [ "$USE_NETNS" = 1 ] || return 0
  local svc
  svc=$(svc_ns)
  ip netns add "$svc"; CLUSTER_NETNS+=("$svc")
  ip -n "$svc" link set lo up
  for r in "${regionals[@]}"; do
    ri=$(regional_index "$r")
    ns_linked "$svc" "$(host_ns "$(host_index "$r")")" "tr${CLUSTER_ID}u$ri" "tr${CLUSTER_ID}r$ri" \
      "10.201.$ri"
  done
  for h in "${hosts[@]}"; do
    i=$(host_index "$h")
    ns_linked "$(host_ns "$(host_index "${CLUSTER_REGIONAL_OF[$h]}")")" "$(host_ns "$i")" \
      "tr${CLUSTER_ID}d$i" "tr${CLUSTER_ID}h$i" "10.202.$i"
  done
}

# Hosts beside the tree, linked to the root's namespace as cluster_hosts links its hosts (their
# agents dial the root); appended to CLUSTER_HOSTS, with certificates.
cluster_tree_direct() {
  local h args=()
  for h in "$@"; do CLUSTER_HOSTS+=("$h"); args+=(--agent "$h"); done
  "$TR_SRC/certs/make-certs.sh" "$WORK/pki" "${args[@]}" >/dev/null
  [ "$USE_NETNS" = 1 ] || return 0
  for h in "$@"; do link_to_service "$(host_index "$h")"; done
}

regional_index() { # regional_index REGIONAL -> 1-based index in CLUSTER_REGIONALS
  local i
  for i in "${!CLUSTER_REGIONALS[@]}"; do
    [ "${CLUSTER_REGIONALS[$i]}" = "$1" ] && { echo $((i + 1)); return; }
  done
  return 1
}
# The port regional R listens on for its agents.
regional_port() {
  if [ "$USE_NETNS" = 1 ]; then echo "${REGIONAL_PORT:-$((SERVICE_PORT + 1))}"
  else echo $((SERVICE_PORT + $(regional_index "$1"))); fi
}
# Address host H's agent dials to reach its regional; address regional R dials to reach the root.
regional_addr_for() {
  if [ "$USE_NETNS" = 1 ]; then echo "10.202.$(host_index "$1").1"; else echo 127.0.0.1; fi
}
root_addr_for() {
  if [ "$USE_NETNS" = 1 ]; then echo "10.201.$(regional_index "$1").1"; else echo 127.0.0.1; fi
}

# cluster_start_regional REGIONAL [flags]: in the regional's namespace, listening for its agents
# on regional_port with the service certificate, upstream to the root with agent-REGIONAL's
# certificate; its own agent's producer socket is $WORK/REGIONAL/producer.sock (waited for).
# Log: $WORK/REGIONAL.log. PID in REGIONAL_PID and CLUSTER_REGIONAL_PID[REGIONAL].
cluster_start_regional() {
  local name=$1; shift
  local i
  if ! regional_index "$name" >/dev/null || ! i=$(host_index "$name"); then
    cluster_log "unknown regional $name"; return 1
  fi
  mkdir -p "$WORK/$name"
  $(ns_prefix "$(host_ns "$i")") ${TR_WRAP:-} "$(bin_of "$name")/tracerelay-service" \
    --listen "0.0.0.0:$(regional_port "$name")" \
    --ca "$WORK/pki/ca.crt" --cert "$WORK/pki/service.crt" --key "$WORK/pki/service.key" \
    --upstream "$(root_addr_for "$name"):$SERVICE_PORT" --upstream-name "$SERVICE_NAME" \
    --upstream-cert "$WORK/pki/agent-$name.crt" --upstream-key "$WORK/pki/agent-$name.key" \
    --upstream-ca "$WORK/pki/ca.crt" --producer-socket "$WORK/$name/producer.sock" \
    --consumer-socket "$WORK/$name/consumer.sock" "$@" >>"$WORK/$name.log" 2>&1 &
  REGIONAL_PID=$!
  CLUSTER_PIDS+=("$REGIONAL_PID")
  CLUSTER_STOP_STEP[$REGIONAL_PID]=3
  CLUSTER_REGIONAL_PID[$name]=$REGIONAL_PID
  wait_for_socket "$WORK/$name/producer.sock" "$REGIONAL_PID"
}

cluster_status_hosts() {
  "$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json 2>/dev/null | python3 -c '
import json, sys
for h in json.load(sys.stdin)["hosts"]:
    print(h["machine_name"], int(h["connected"]), h.get("producers", 0))'
}

cluster_wait_hosts() { # cluster_wait_hosts SECONDS NAME[:MIN_PRODUCERS]...
  local n=$(($1 * 4)) want missing st; shift
  for _ in $(seq "$n"); do
    st=$(cluster_status_hosts || true)
    missing=()
    for want in "$@"; do
      awk -v h="${want%%:*}" -v p="${want#*:}" '$1 == h && $2 == 1 && (p == h || $3 >= p) { f = 1 }
        END { exit !f }' <<<"$st" || missing+=("$want")
    done
    [ "${#missing[@]}" = 0 ] && return 0
    sleep 0.25
  done
  cluster_log "not connected (NAME[:producers]) after $((n / 4)) s: ${missing[*]}; the root sees:"
  printf '  %s\n' "$st" >&2
  return 1
}

# cluster_wait_session SECONDS NAME[:N]...: until each host is connected, has relayed data and
# has a started instance in N sessions (default 1), as `status` shows it: what a test waits for
# before it disturbs a running session (a fixed sleep would be too short on a busy machine).
cluster_wait_session() {
  local n=$(($1 * 4)); shift
  for _ in $(seq "$n"); do
    "$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json 2>/dev/null | python3 -c '
import json, sys
hosts = {h["machine_name"]: h for h in json.load(sys.stdin)["hosts"]}
def running(want):
    name, _, n = want.partition(":")
    h = hosts.get(name)
    return h is not None and h["connected"] and h["bytes_relayed"] > 0 and sum(
        s["state"] == "STARTED" and s["instances_started"] > 0 for s in h["sessions"]) >= int(n or 1)
sys.exit(0 if all(running(w) for w in sys.argv[1:]) else 1)' "$@" && return 0
    sleep 0.25
  done
  cluster_log "no running session (NAME[:sessions]) relaying data on all of $* after $((n / 4)) s"
  return 1
}
