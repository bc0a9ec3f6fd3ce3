#!/usr/bin/env bash
# test_container.sh: the agent in a container relays a producer that runs OUTSIDE it, through
# the producer socket directory bind-mounted into the container, under the machine name of the
# certificate mounted read-only (deploy/container/, docs/operations.md "Containers").
#
# Builds the static agent and its FROM-scratch image with deploy/container/build-agent-image.sh
# (static build in BUILD/static-agent, kept between runs), then runs it with podman in a network
# namespace the test made (--network ns:/run/netns/..., never podman's default bridge), read-only,
# with no capability, and a decoy --hostname. The service runs in the cluster's central
# namespace (tools/cluster-lib.sh), a tracerelay-loadgen in the root namespaces connects to the
# mounted socket, `tracerelay record` records 3 s, and the trace (decoded with protoc) must hold
# the loadgen's track events under machine_id(certificate name), with a SystemInfo naming it.
# Where podman cannot run a container, the same agent root filesystem runs under
# `unshare --pid --fork --mount-proc --mount --uts` + chroot instead, with the socket directory and
# the certificates bind-mounted (read-only) the same way.
#
#   tests/integration/test_container.sh BUILD/bin
# TR_CONTAINER_MODE=podman|unshare forces one way (default: podman, else unshare).
# TR_AGENT_BINARY=PATH puts that agent in the image instead of the static build (near-static).
# Exit 0 pass, 1 fail, 77 skip (neither way can run here; the reasons are printed). Everything
# started is stopped by PID or by the container name the test chose; the image, namespaces and
# files it made are removed on exit (TR_KEEP_WORK=1 keeps the work directory).
set -euo pipefail

BIN=${1:?usage: test_container.sh BUILD/bin}
BIN=$(cd "$BIN" && pwd)
TR_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MACHINE=ctr-node-1
DECOY_HOSTNAME="decoy-hostname"
ULIMITS=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
STATIC_BUILD=${TR_STATIC_BUILD_DIR:-$(cd "$BIN/.." && pwd)/static-agent}

log() { printf '[container-test] %s\n' "$*" >&2; }
skip() { echo "SKIP: $*"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "needs root: namespaces, bind mounts and rootful podman"
command -v protoc >/dev/null || { log "protoc not found (apt-get install protobuf-compiler)"; exit 1; }
for p in tracerelay-service tracerelay-loadgen tracerelay; do
  [ -x "$BIN/$p" ] || { log "$BIN/$p is not built"; exit 1; }
done

# shellcheck source=tools/cluster-lib.sh
source "$TR_SRC/tools/cluster-lib.sh"
# shellcheck source=tests/integration/common.sh
source "$TR_SRC/tests/integration/common.sh"
SERVICE_PORT=$(free_port)
export SERVICE_PORT
WORK_DIR=$(mktemp -d /tmp/tr-ctr.XXXXXX)
CLUSTER_RUN_DIR=$WORK_DIR # removed by cleanup after a pass, kept after a failure
cluster_init "$BIN" "$WORK_DIR"

CT_NAME=""
IMAGE=""
AGENT_PID=""
PASSED=0
cleanup() {
  local rc=$?
  set +e # tear everything down even when one step fails
  if [ -n "$CT_NAME" ]; then
    podman stop -t 10 "$CT_NAME" >/dev/null 2>&1
    podman rm -f "$CT_NAME" >/dev/null 2>&1
  fi
  stop_started # AGENT_PID too: it is in CLUSTER_PIDS
  cluster_cleanup
  [ -n "$IMAGE" ] && podman rmi -f "$IMAGE" >/dev/null 2>&1
  [ "$PASSED" != 1 ] && [ "$rc" -ne 77 ] && dump_logs "$WORK_DIR"
  cluster_finish "$rc"
  exit "$rc"
}
trap cleanup EXIT

cluster_hosts "$MACHINE" # certificates, and the namespaces when allowed
AGENT_NS=$(host_ns 1)
SERVICE_ADDR="$(service_addr_for 1):$SERVICE_PORT"

# What the container gets: the producer socket directory (shared with the producer outside) and
# the certificates under the names the image expects.
SOCK_DIR="$WORK_DIR/perfetto"
PKI_DIR="$WORK_DIR/ctr-pki"
mkdir -m 0755 "$SOCK_DIR"
mkdir -m 0700 "$PKI_DIR"
cp "$WORK_DIR/pki/ca.crt" "$PKI_DIR/ca.crt"
cp "$WORK_DIR/pki/agent-$MACHINE.crt" "$PKI_DIR/agent.crt"
cp "$WORK_DIR/pki/agent-$MACHINE.key" "$PKI_DIR/agent.key"
PRODUCER_SOCK="$SOCK_DIR/traced-producer.sock"

BUILD_ARGS=(--build-dir "$STATIC_BUILD")
[ -n "${TR_AGENT_BINARY:-}" ] && BUILD_ARGS=(--binary "$TR_AGENT_BINARY")

# --- choose how to run the agent.
MODE=${TR_CONTAINER_MODE:-auto}
why_not_podman=""
RUNTIME_ARGS=()
if [ "$MODE" = auto ] || [ "$MODE" = podman ]; then
  if ! command -v podman >/dev/null; then
    why_not_podman="podman is not installed (apt-get install podman)"
  elif [ "$USE_NETNS" != 1 ]; then
    why_not_podman="no network namespaces here, and the test uses no other podman network"
  else
    IMAGE="localhost/tracerelay-agent:test-$CLUSTER_ID"
    log "building $IMAGE (static agent in $STATIC_BUILD)"
    if ! "$TR_SRC/deploy/container/build-agent-image.sh" --tag "$IMAGE" "${BUILD_ARGS[@]}" \
      >"$WORK_DIR/image-build.log" 2>&1; then
      log "building the image failed: $(tail -n 20 "$WORK_DIR/image-build.log")"
      exit 1
    fi
    # crun refuses hybrid cgroup hierarchies; runc copes. Take the first runtime that can run
    # the image's default command (the agent's --help).
    for rt in default runc; do
      args=()
      if [ "$rt" != default ]; then
        command -v "$rt" >/dev/null || continue
        args=(--runtime "$rt")
      fi
      if out=$(podman run --rm "${args[@]}" "${ULIMITS[@]}" --network none "$IMAGE" 2>&1) &&
        echo "$out" | grep -q tracerelay-agent; then
        RUNTIME_ARGS=("${args[@]}")
        MODE=podman
        break
      fi
      why_not_podman+="runtime $rt: $(echo "$out" | tail -n 1); "
    done
    [ "$MODE" = podman ] || why_not_podman="podman cannot run a container here: $why_not_podman"
  fi
  if [ "$MODE" != podman ]; then
    [ "${TR_CONTAINER_MODE:-auto}" = podman ] && skip "$why_not_podman"
    log "not using podman: $why_not_podman"
  fi
fi
if [ "$MODE" = auto ] || [ "$MODE" = unshare ]; then
  if ! unshare --pid --fork --mount-proc --mount --uts true 2>"$WORK_DIR/unshare-probe.log"; then
    skip "${why_not_podman:+$why_not_podman; }unshare cannot make PID/mount/UTS namespaces: $(cat "$WORK_DIR/unshare-probe.log")"
  fi
  MODE=unshare
  ROOTFS="$WORK_DIR/rootfs"
  log "staging the agent's root filesystem in $ROOTFS"
  if ! "$TR_SRC/deploy/container/build-agent-image.sh" --rootfs "$ROOTFS" "${BUILD_ARGS[@]}" \
    >"$WORK_DIR/image-build.log" 2>&1; then
    log "staging the root filesystem failed: $(tail -n 20 "$WORK_DIR/image-build.log")"
    exit 1
  fi
fi
log "agent runs under $MODE${RUNTIME_ARGS[*]:+ (${RUNTIME_ARGS[*]})}"

cluster_start_service

# exec_in_ns NS CMD...: in_ns that replaces the (background) subshell, so $! is CMD's PID.
exec_in_ns() {
  local ns=$1; shift
  if [ -n "$ns" ]; then exec ip netns exec "$ns" "$@"; else exec "$@"; fi
}

# --- the agent, contained. Its network is the host namespace the test made (veth to the service).
AGENT_ARGS=(--service "$SERVICE_ADDR" --service-name "$SERVICE_NAME")
AGENT_LOG="$WORK_DIR/agent-$MODE.log"
if [ "$MODE" = podman ]; then
  CT_NAME="tracerelay-test-$CLUSTER_ID"
  podman run --rm --name "$CT_NAME" "${RUNTIME_ARGS[@]}" "${ULIMITS[@]}" \
    --network "ns:/run/netns/$AGENT_NS" --hostname "$DECOY_HOSTNAME" \
    --read-only --cap-drop=all --security-opt no-new-privileges \
    -v "$SOCK_DIR:/run/perfetto" \
    -v "$PKI_DIR/ca.crt:/etc/tracerelay/pki/ca.crt:ro" \
    -v "$PKI_DIR/agent.crt:/etc/tracerelay/pki/agent.crt:ro" \
    -v "$PKI_DIR/agent.key:/etc/tracerelay/pki/agent.key:ro" \
    "$IMAGE" "${AGENT_ARGS[@]}" >>"$AGENT_LOG" 2>&1 &
  AGENT_PID=$!
else
  # The same layout as the image: the root filesystem read-only, a private /dev with the three
  # devices a process may open, /proc of the new PID namespace, the socket directory read-write
  # and the certificates read-only. --kill-child: the agent (PID 1 inside) gets SIGTERM when
  # unshare is killed.
  # shellcheck disable=SC2016 # expanded by the inner bash
  exec_in_ns "$AGENT_NS" unshare --pid --fork --mount-proc --mount --uts --kill-child=SIGTERM \
    bash -c 'set -e
      r=$1 sock=$2 pki=$3 name=$4; shift 4
      hostname "$name"
      mount --bind "$r" "$r"
      mount -o remount,bind,ro "$r"
      mount -t tmpfs -o mode=0755,nosuid,noexec tmpfs "$r/dev"
      for d in null zero urandom; do touch "$r/dev/$d"; mount --bind "/dev/$d" "$r/dev/$d"; done
      mount -t proc proc "$r/proc"
      mount --bind "$sock" "$r/run/perfetto"
      mount --bind "$pki" "$r/etc/tracerelay/pki"
      mount -o remount,bind,ro "$r/etc/tracerelay/pki"
      exec chroot "$r" "$@"' \
    _ "$ROOTFS" "$SOCK_DIR" "$PKI_DIR" "$DECOY_HOSTNAME" \
    /usr/local/bin/tracerelay-agent --producer-socket /run/perfetto/traced-producer.sock \
    --ca /etc/tracerelay/pki/ca.crt --cert /etc/tracerelay/pki/agent.crt \
    --key /etc/tracerelay/pki/agent.key "${AGENT_ARGS[@]}" >>"$AGENT_LOG" 2>&1 &
  AGENT_PID=$!
fi
CLUSTER_PIDS+=("$AGENT_PID")
for _ in $(seq 300); do
  [ -S "$PRODUCER_SOCK" ] && break
  kill -0 "$AGENT_PID" 2>/dev/null || { log "the contained agent exited before creating its socket"; exit 1; }
  sleep 0.1
done
[ -S "$PRODUCER_SOCK" ] || { log "no $PRODUCER_SOCK from the contained agent after 30 s"; exit 1; }
log "contained agent up (pid $AGENT_PID), socket $PRODUCER_SOCK"

# --- the producer, outside the container: root network, PID and mount namespaces.
STATS_JSON="$WORK_DIR/loadgen.json"
"$BIN/tracerelay-loadgen" --socket "$PRODUCER_SOCK" --name container-test-producer \
  --writers 2 --rate 500 --stats-json "$STATS_JSON" >>"$WORK_DIR/loadgen.log" 2>&1 &
LOADGEN=$!
CLUSTER_PIDS+=("$LOADGEN")
wait_producer "$AGENT_LOG" container-test-producer "$LOADGEN"

TRACE="$WORK_DIR/trace.pftrace"
record_trace "$CONSUMER_SOCK" "$TRACE"
wait_loadgen "$LOADGEN" "$WORK_DIR/loadgen.log" "$STATS_JSON"
written=$WRITTEN

MID=$(machine_id "$MACHINE")
decode_trace "$TRACE" "$WORK_DIR/trace.txt"
read -r events total sysinfo decoy < <(awk -v id="$MID" -v name="\"$MACHINE\"" \
  -v decoy="\"$DECOY_HOSTNAME\"" '
  /^packet \{/ { te = 0; m = ""; next }
  /^  track_event \{/ { te = 1 }
  /^  machine_id: / { m = $2 }
  /^    machine_name: / { if ($2 == name) sysinfo = 1; if ($2 == decoy) bad = 1 }
  /^\}/ { if (te) { total++; if (m == id) n++ } }
  END { print n + 0, total + 0, sysinfo + 0, bad + 0 }' "$WORK_DIR/trace.txt")
log "trace: $events track events with machine_id $MID of $total; loadgen wrote $written packets"
[ "$sysinfo" = 1 ] || { log "no SystemInfo with machine_name \"$MACHINE\" (the certificate's CN)"; exit 1; }
[ "$decoy" = 0 ] || { log "the machine was named after the container's hostname, not its certificate"; exit 1; }
[ "$events" -gt 0 ] || { log "no track event of machine $MACHINE in the trace"; exit 1; }
[ "$events" -le "$written" ] || { log "more track events ($events) than the loadgen wrote ($written)"; exit 1; }
[ $((events * 10)) -ge $((written * 9)) ] ||
  { log "only $events of $written loadgen packets reached the trace"; exit 1; }

PASSED=1
echo "PASS: agent under $MODE relayed $events of $written packets of a producer outside it, as $MACHINE"
