#!/usr/bin/env bash
# test_ssh_tunnel.sh: `tracerelay record` drives the service through an OpenSSH stream-local
# forward of its consumer socket, as docs/ssh.md tells operators to do.
#
# Starts a real sshd (Debian's openssh-server) on 127.0.0.1 with a config, host key and user key
# of its own, a service, one agent and one tracerelay-loadgen producer on loopback (cluster-lib.sh
# with TR_NO_NETNS=1), forwards the consumer socket with `ssh -N -L LOCAL.sock:consumer.sock`,
# records 3 s through LOCAL.sock, and checks the trace (decoded with protoc and protos/): the
# loadgen's track events are there under the agent's machine_id, with a SystemInfo naming it.
#
#   tests/integration/test_ssh_tunnel.sh BUILD/bin
# Exit 0 pass, 1 fail, 77 skip (sshd cannot run here: not root, not installed, or it will not
# start; the reason is printed). Everything started is killed by PID and every file made is
# deleted on exit; TR_KEEP_WORK=1 keeps the work directory for a post-mortem.
set -euo pipefail

BIN=${1:?usage: test_ssh_tunnel.sh BUILD/bin}
TR_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MACHINE=ssh-host-1

log() { printf '[ssh-test] %s\n' "$*" >&2; }
skip() { echo "SKIP: $*"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "needs root: the test sshd runs as root and logs in as root"
SSHD=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$SSHD" ] || skip "sshd not found (apt-get install openssh-server)"
command -v ssh >/dev/null || skip "ssh not found (apt-get install openssh-client)"
command -v ssh-keygen >/dev/null || skip "ssh-keygen not found (apt-get install openssh-client)"
command -v protoc >/dev/null || { log "protoc not found (apt-get install protobuf-compiler)"; exit 1; }
for p in tracerelay-service tracerelay-agent tracerelay-loadgen tracerelay; do
  [ -x "$BIN/$p" ] || { log "$BIN/$p is not built"; exit 1; }
done

# shellcheck source=tools/cluster-lib.sh
source "$TR_SRC/tools/cluster-lib.sh"
# shellcheck source=tests/integration/common.sh
source "$TR_SRC/tests/integration/common.sh"
export TR_NO_NETNS=1
SERVICE_PORT=$(free_port)
export SERVICE_PORT
WORK_DIR=$(mktemp -d /tmp/tr-ssh.XXXXXX) # short: UNIX socket paths are limited to 107 bytes
CLUSTER_RUN_DIR=$WORK_DIR # removed by cleanup after a pass, kept after a failure
cluster_init "$BIN" "$WORK_DIR"

SSH_PID=""
SSHD_PID=""
MADE_RUN_SSHD=0
PASSED=0
cleanup() {
  local rc=$?
  set +e # tear everything down even when one step fails
  # The client first, so sshd's session process for it ends with it.
  local pid
  for pid in $SSH_PID $SSHD_PID; do
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  stop_started
  cluster_cleanup
  [ "$PASSED" != 1 ] && [ "$rc" -ne 77 ] && dump_logs "$WORK_DIR"
  [ "$MADE_RUN_SSHD" = 1 ] && rmdir /run/sshd
  cluster_finish "$rc"
  exit "$rc"
}
trap cleanup EXIT

# --- sshd: its own config, host key and authorized key; nothing of the system's is used.
SSH_PORT=$(free_port)
ssh-keygen -q -t ed25519 -N '' -C tr-test-host -f "$WORK_DIR/host_key"
ssh-keygen -q -t ed25519 -N '' -C tr-test-user -f "$WORK_DIR/user_key"
cp "$WORK_DIR/user_key.pub" "$WORK_DIR/authorized_keys"
echo "[127.0.0.1]:$SSH_PORT $(cat "$WORK_DIR/host_key.pub")" >"$WORK_DIR/known_hosts"
cat >"$WORK_DIR/sshd_config" <<EOF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $WORK_DIR/host_key
PidFile $WORK_DIR/sshd.pid
AuthorizedKeysFile $WORK_DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
# The hardened recipe of docs/ssh.md: -L to sockets only, no shell. AllowTcpForwarding gates
# ssh -L to UNIX sockets as well, so it must allow "local".
AllowStreamLocalForwarding local
AllowTcpForwarding local
StreamLocalBindUnlink yes
PermitListen none
X11Forwarding no
PermitTTY no
ForceCommand /usr/sbin/nologin
LogLevel VERBOSE
EOF
if [ ! -d /run/sshd ]; then # privilege separation directory, normally made by the package's unit
  mkdir -m 0755 /run/sshd
  MADE_RUN_SSHD=1
fi
"$SSHD" -t -f "$WORK_DIR/sshd_config" 2>"$WORK_DIR/sshd-check.log" ||
  skip "sshd rejects the test config: $(tr '\n' ' ' <"$WORK_DIR/sshd-check.log")"
"$SSHD" -D -e -f "$WORK_DIR/sshd_config" >>"$WORK_DIR/sshd.log" 2>&1 &
SSHD_PID=$!
for _ in $(seq 100); do
  [ -n "$(ss -Hltn "sport = :$SSH_PORT" 2>/dev/null)" ] && break
  kill -0 "$SSHD_PID" 2>/dev/null || skip "sshd exited at start: $(tail -n 3 "$WORK_DIR/sshd.log" | tr '\n' ' ')"
  sleep 0.1
done
[ -n "$(ss -Hltn "sport = :$SSH_PORT" 2>/dev/null)" ] || skip "sshd is not listening on 127.0.0.1:$SSH_PORT after 10 s"
log "sshd pid $SSHD_PID on 127.0.0.1:$SSH_PORT"

# --- the cluster: one service, one agent, one producer, all on loopback.
cluster_hosts "$MACHINE"
cluster_start_service
cluster_start_agent "$MACHINE"
cluster_start_loadgen "$MACHINE" --name ssh-test-producer --writers 2 --rate 500
LOADGEN=$LOADGEN_PID
STATS_JSON="$WORK_DIR/loadgen-$MACHINE-0.json"

# --- the tunnel: LOCAL.sock on "the laptop" to the service's consumer socket on "the device".
FWD_SOCK="$WORK_DIR/fwd.sock"
ssh -N -F /dev/null -i "$WORK_DIR/user_key" -p "$SSH_PORT" \
  -o BatchMode=yes -o IdentitiesOnly=yes -o ExitOnForwardFailure=yes \
  -o StreamLocalBindUnlink=yes -o StrictHostKeyChecking=yes \
  -o UserKnownHostsFile="$WORK_DIR/known_hosts" -o GlobalKnownHostsFile=/dev/null \
  -L "$FWD_SOCK:$CONSUMER_SOCK" root@127.0.0.1 >>"$WORK_DIR/ssh.log" 2>&1 &
SSH_PID=$!
for _ in $(seq 150); do
  [ -S "$FWD_SOCK" ] && break
  kill -0 "$SSH_PID" 2>/dev/null || { log "ssh exited before forwarding: $(cat "$WORK_DIR/ssh.log")"; exit 1; }
  sleep 0.1
done
[ -S "$FWD_SOCK" ] || { log "no forwarded socket $FWD_SOCK after 15 s"; exit 1; }
log "forwarding $FWD_SOCK -> $CONSUMER_SOCK through ssh pid $SSH_PID"

wait_producer "$WORK_DIR/agent-$MACHINE.log" ssh-test-producer "$LOADGEN"

TRACE="$WORK_DIR/trace.pftrace"
record_trace "$FWD_SOCK" "$TRACE"
wait_loadgen "$LOADGEN" "$WORK_DIR/loadgen-$MACHINE-0.log" "$STATS_JSON"
written=$WRITTEN

MID=$(machine_id "$MACHINE")
decode_trace "$TRACE" "$WORK_DIR/trace.txt"
# Per top-level packet: does it hold a track_event, and which machine_id; and is there a
# SystemInfo naming the machine.
read -r events total sysinfo < <(awk -v id="$MID" -v name="\"$MACHINE\"" '
  /^packet \{/ { te = 0; m = ""; next }
  /^  track_event \{/ { te = 1 }
  /^  machine_id: / { m = $2 }
  /^    machine_name: / { if ($2 == name) sysinfo = 1 }
  /^\}/ { if (te) { total++; if (m == id) n++ } }
  END { print n + 0, total + 0, sysinfo + 0 }' "$WORK_DIR/trace.txt")
log "trace: $events track events with machine_id $MID of $total; loadgen wrote $written packets"
[ "$sysinfo" = 1 ] || { log "no SystemInfo with machine_name \"$MACHINE\" in the trace"; exit 1; }
[ "$events" -gt 0 ] || { log "no track event of machine $MACHINE in the trace"; exit 1; }
# Nothing is lost on loopback at 1000 events/s: every packet the loadgen wrote (its track
# events plus the clock snapshot and descriptors of each sequence) is in the trace.
packets=$(awk -v id="$MID" '
  /^packet \{/ { m = ""; seq = 0; next }
  /^  machine_id: / { m = $2 }
  /^  trusted_packet_sequence_id: / { seq = $2 }
  /^\}/ { if (m == id && seq >= 2) n++ }
  END { print n + 0 }' "$WORK_DIR/trace.txt")
if [ "$packets" -ne "$written" ]; then
  # Say what the trace counted as lost (a stop that timed out, packets lost at the session's
  # end), so that a loss on a busy machine tells whether it was counted.
  counted=$("$BIN/tracerelay" inspect --json "$TRACE" | python3 -c 'import json, sys
h = [m for m in json.load(sys.stdin)["hosts"] if m.get("name") == sys.argv[1]]
hs = (h[0].get("host_stats") or {}) if h else {}
print({k: v for k, v in hs.items() if isinstance(v, int) and not isinstance(v, bool) and v})' "$MACHINE")
  log "the loadgen wrote $written packets, the trace holds $packets of them; counted: $counted"
  exit 1
fi

# The real perfetto CLI through the same tunnel, when one is available (TR_PERFETTO=/path, or
# on PATH): a 1 s session must come back as a trace that names the machine.
PERFETTO=${TR_PERFETTO:-$(command -v perfetto || true)}
if [ -n "$PERFETTO" ]; then
  printf 'buffers { size_kb: 4096 }\ndata_sources { config { name: "track_event" } }\nduration_ms: 1000\n' \
    >"$WORK_DIR/cli.pbtxt"
  PERFETTO_CONSUMER_SOCK_NAME="$FWD_SOCK" timeout 60 "$PERFETTO" --txt -c "$WORK_DIR/cli.pbtxt" \
    -o "$WORK_DIR/cli.pftrace" >"$WORK_DIR/cli.log" 2>&1 ||
    { log "perfetto CLI through the tunnel failed: $(cat "$WORK_DIR/cli.log")"; exit 1; }
  protoc --decode=perfetto.protos.Trace -I "$TR_SRC/protos" perfetto/trace/trace.proto \
    <"$WORK_DIR/cli.pftrace" | grep -q "machine_name: \"$MACHINE\"" ||
    { log "the perfetto CLI's trace through the tunnel does not name $MACHINE"; exit 1; }
  log "the real perfetto CLI ($("$PERFETTO" --version | head -1)) recorded through the tunnel"
else
  log "no perfetto CLI (set TR_PERFETTO): only tracerelay record was checked through the tunnel"
fi

PASSED=1
echo "PASS: recorded through ssh -L: all $written loadgen packets ($events track events) under machine $MACHINE"
