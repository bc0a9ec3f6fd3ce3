#!/usr/bin/env bash
# test_consumer_access.sh: who may use the consumer socket, and whose sessions they may touch.
# One host (web-1) with a loadgen per session; the consumers are root and uid/gid 65534 (nobody,
# through setpriv). The socket is made world-writable (--consumer-mode 0666) so that what is
# tested is the service's peer-credential check, not the file mode.
#   1. --consumer-allow-uid 4242 (not nobody): nobody's `tracerelay record` fails, the service
#      logs "consumer refused: uid 65534 gid 65534 pid N", and root's record still works.
#   2. --consumer-allow-gid 65534: nobody's `tracerelay record` gets a trace with web-1's data.
#      A session root detached under a key cannot be attached (nor read) by nobody, and the
#      refusal is logged; nobody's `tracerelay status` does not list it, root's does; root
#      attaches and reads it.
#   3. mode 0660 and no allow-list (the default): nobody cannot even connect (file mode).
# Usage: test_consumer_access.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
fault_init "$1"
cluster_hosts web-1
chmod 0755 "$WORK" # nobody must reach the socket and the binaries' outputs
OUT="$WORK/nobody-out"
mkdir -p "$OUT" && chmod 0777 "$OUT"
NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups)
LOG="$WORK/service.log"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

restart_service() {
  if [ -n "${SERVICE_PID:-}" ]; then
    kill -TERM "$SERVICE_PID"; fault_wait_pid "$SERVICE_PID" 10 || true
  fi
  cluster_start_service --consumer-mode 0666 "$@"
}

record() { # record WHO OUTFILE: a 1 s trace of track_event
  local who=$1 out=$2
  if [ "$who" = nobody ]; then
    "${NOBODY[@]}" "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" \
      --data-source track_event -b 4mb -t 1s -o "$out"
  else
    "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 4mb \
      -t 1s -o "$out"
  fi
}

has_web1_packets() { # has_web1_packets TRACE
  "$TR_BIN/tracerelay" inspect --json "$1" | python3 -c '
import json, sys
r = json.load(sys.stdin)
m = {h.get("name"): h for h in r["hosts"]}.get("web-1")
n = sum(v for k, v in m["sequences"].items() if int(k) >= 2) if m else 0
print(f"web-1 packets: {n}")
sys.exit(0 if n > 0 else 1)'
}

# ---- 1: an allow-list that does not name nobody ----
restart_service --consumer-allow-uid 4242
cluster_start_agent web-1
cluster_start_loadgen web-1 --name steady-1 --writers 1 --rate 200
cluster_wait_hosts 30 web-1:1 || fail "the loadgen did not connect"
if record nobody "$OUT/refused.pftrace" >"$WORK/record-refused.log" 2>&1; then
  fail "nobody's record succeeded despite the allow-list"
fi
grep -Eq "consumer refused: uid 65534 gid 65534 pid [0-9]+ is not allowed" "$LOG" ||
  fail "no log line for nobody's refused connection"
grep -Eq "closing connection of pid [0-9]+ uid 65534: refused by the service" "$LOG" ||
  fail "nobody's connection was not closed at once"
record root "$WORK/root-1.pftrace" >"$WORK/record-root-1.log" 2>&1 || fail "root's record failed"
has_web1_packets "$WORK/root-1.pftrace" || fail "root's trace has no web-1 data"

# ---- 2: nobody's group allowed; sessions stay their owner's ----
restart_service --consumer-allow-gid 65534
cluster_start_loadgen web-1 --name steady-2 --writers 1 --rate 200 # one session each
cluster_wait_hosts 30 web-1:1 || fail "the agent did not reconnect with the new loadgen"
record nobody "$OUT/nobody.pftrace" >"$WORK/record-nobody.log" 2>&1 ||
  { cat "$WORK/record-nobody.log"; fail "nobody's record failed although its gid is allowed"; }
[ -f "$OUT/nobody.pftrace" ] && has_web1_packets "$OUT/nobody.pftrace" ||
  fail "nobody's trace has no web-1 data"
"$TR_BIN/consumer_attach" --socket "$CONSUMER_SOCK" --detach rootkey >"$WORK/detach.log" 2>&1 ||
  fail "root could not detach its session: $(cat "$WORK/detach.log")"
# QueryServiceState: root sees its detached session (top level and under web-1), nobody not.
sessions_seen() { # who -> "<top-level sessions> <web-1's sessions>"
  local pre=(); [ "$1" = nobody ] && pre=("${NOBODY[@]}")
  "${pre[@]}" "$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json | python3 -c '
import json, sys
st = json.load(sys.stdin)
web = [h for h in st["hosts"] if h["machine_name"] == "web-1"]
print(len(st["sessions"]), len(web[0]["sessions"]) if web else -1)'
}
[ "$(sessions_seen root)" = "1 1" ] || fail "root's status shows $(sessions_seen root), wanted '1 1'"
[ "$(sessions_seen nobody)" = "0 0" ] ||
  fail "nobody's status shows root's session: $(sessions_seen nobody), wanted '0 0'"
rc=0
"${NOBODY[@]}" "$TR_BIN/consumer_attach" --socket "$CONSUMER_SOCK" --attach rootkey \
  >"$WORK/attach-nobody.log" 2>&1 || rc=$?
[ "$rc" = 3 ] || fail "nobody attaching root's session: exit $rc, wanted 3 (refused)"
grep -Eq "Attach from uid 65534 pid [0-9]+ refused: the session detached under that key belongs to uid 0" \
  "$LOG" || fail "no log line for the refused Attach"
"$TR_BIN/consumer_attach" --socket "$CONSUMER_SOCK" --attach rootkey >"$WORK/attach-root.log" 2>&1 ||
  fail "root could not attach and read its own session: $(cat "$WORK/attach-root.log")"

# ---- 3: the default: mode 0660, no allow-list ----
kill -TERM "$SERVICE_PID"; fault_wait_pid "$SERVICE_PID" 10 || true
cluster_start_service
if record nobody "$OUT/mode.pftrace" >"$WORK/record-mode.log" 2>&1; then
  fail "nobody's record succeeded on a 0660 root socket"
fi
grep -qi "permission denied" "$WORK/record-mode.log" || fail "no EACCES for nobody on mode 0660"

[ "$fails" = 0 ] || exit 1
echo "PASS"
