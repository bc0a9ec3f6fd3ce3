#!/usr/bin/env bash
# test_tiers.sh: tiers (issue 14 part 2), end to end on a real tree of network namespaces: a
# root service (real clock, --relay-allow regional-a=pool-a-* --relay-allow regional-b=pool-b-*),
# two regional services each linked only to the root's namespace, and four agents, two under
# each regional and linked only to it (tools/cluster-lib.sh, cluster_tree). Every agent, its
# loadgen and each regional run on a simulated clock (--fake-clock: offsets up to 2 h, drift up
# to +-200 ppm); each regional also has a loadgen on its own --producer-socket (its embedded
# agent, seen at the root as the host named by its upstream certificate).
# Asserted (each failure is a FAIL line; the work directory is kept and log tails printed):
#  1. every host and both regionals show as connected in the root's `tracerelay status --json`
#     (within 30 s), with their loadgens' producers; each host with relayed_by its own
#     regional, the regionals' own hosts with none.
#  2. per encoding (--timeline machines, then global-clocks; a fresh tree each): `tracerelay
#     record` of SECONDS of track_event at the root; tracerelay-timeline-check --bound-us 1000
#     --check-own-bound: every loadgen event (no order inversion within a sequence, issue 41)
#     of the 4 hosts two tiers down and of the 2 regionals within 1000 us of its true instant
#     and within the clock error
#     bound the trace shows for its host; exact accounting: each loadgen writer's packets
#     (--stats-json) are exactly one sequence of its host in the trace, no loss counted;
#     flows around the ring pool-a-1 -> pool-a-2 -> pool-b-1 -> pool-b-2 -> pool-a-1 (half of
#     them cross regionals): `tracerelay inspect --check-order` finds >= 100 crossing flows and
#     none arriving before it departs beyond the hosts' bounds; in `machines`, the per-machine
#     packet order trace_processor v58 needs (as test_timeline.sh).
#  3. (first tree) refusals: an agent with pool-b-9's certificate under regional-a (allowed
#     pool-a-* only), and a regional regional-c, listed in no --relay-allow, relaying
#     pool-c-1: the root logs a "not authorized" line naming pool-b-9, and one naming
#     regional-c (its carrier is refused before any host rides on it); neither host
#     ever appears in the root's status (polled for 10 s), each agent logs the refusal
#     (goodbye/refused/not authorized), and the legitimate hosts stay connected. Whether
#     regional-c's own host appears at the root is printed, not asserted.
#  4. (third tree, `machines`) regional-a is killed with SIGKILL about 3 s into a recording
#     (its own loadgen dies with it) and restarted 1 s later: the record completes (exit 0,
#     stopped by SIGTERM once done); within 30 s the root's status shows pool-a-1, pool-a-2
#     and regional-a connected again; in the trace pool-a-1, pool-a-2 and regional-a carry
#     session_disconnects >= 1 with their first disconnected_at_ns within 10 s after the kill;
#     a loadgen started on pool-a-1 and one on regional-a after the restart land in the same
#     session exactly (their writer's exact sequence); pool-a-1/pool-a-2 are not silent about
#     what the kill cost: every writer's packets are in the trace exactly (the agents resume
#     across the regional's restart), else the host counts the unclean exit
#     (session_agent_exits_unclean >= 1) -- which case it was is printed; pool-b-1, pool-b-2
#     and regional-b are exact, lossless and never disconnected; record's summary counts each
#     host once (regional-a's own agent restarted: two entries, one host).
#  5. no AddressSanitizer/LeakSanitizer/UBSan report in any log of any phase.
#  5. (third tree, after 4) regional-b is stopped (SIGSTOP) for 5.5 s, longer than the flush
#     timeout (4 s, the session's) and shorter than the heartbeat timeout (8 s), while a record
#     flushes every
#     second: the root's log names exactly pool-b-1, pool-b-2 and regional-b as not answering a
#     flush within the timeout, the trace counts session_flushes_missed for those three and for
#     no other host, none of them is disconnected, and no host counts a loss.
# Exit 77 (skip) without network namespaces.
# Usage: test_tiers.sh BIN_DIR [SECONDS]   (SECONDS: trace length per encoding, default 10, >= 6)
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$(cd "$1" && pwd)
SECONDS_PER_TRACE=${2:-10}
[ "$SECONDS_PER_TRACE" -ge 6 ] || { echo "SECONDS must be at least 6"; exit 2; }
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"

HOSTS=(pool-a-1 pool-a-2 pool-b-1 pool-b-2)
REGIONALS=(regional-a regional-b)
TREE=("regional-a=pool-a-1,pool-a-2" "regional-b=pool-b-1,pool-b-2")
RELAY_ALLOW=(--relay-allow 'regional-a=pool-a-*' --relay-allow 'regional-b=pool-b-*')
# offset_ns,drift_ppm (test_timeline.sh's style): 2 h ahead and fast, a small offset with a
# large drift, 37 min behind and slow, an NTP-like clock; regional-a 1 h ahead, regional-b
# 30 min behind. A negative offset must not make the simulated BOOTTIME negative: keep it
# within uptime.
declare -A FAKE=([pool-a-1]="7200000000000,200" [pool-a-2]="1234567,87.5"
                 [pool-b-1]="-2220000000000,-150" [pool-b-2]="600000000000,0.8"
                 [regional-a]="3600000000000,50" [regional-b]="-1800000000000,-80")
UPTIME_NS=$(awk '{printf "%d", $1 * 1e9}' /proc/uptime)
[ "$UPTIME_NS" -gt 2300000000000 ] || FAKE[pool-b-1]="-$((UPTIME_NS / 3)),-150"
[ "$UPTIME_NS" -gt 1900000000000 ] || FAKE[regional-b]="-$((UPTIME_NS / 2)),-80"

BASE=$(mktemp -d /tmp/tracerelay-tiers.XXXXXX)
STATUS=0
fail() { echo "FAIL: $*"; STATUS=1; }
on_exit() {
  local rc=$?
  cluster_cleanup
  [ "$rc" = 0 ] && [ "$STATUS" = 0 ] && return 0
  echo "test_tiers: failed; everything kept in $BASE"
  local f
  for f in "$WORK"/*.log; do
    [ -f "$f" ] || continue
    echo "---- $(basename "$f") (last 20 lines)"; tail -n 20 "$f"
  done
  [ "$rc" != 0 ] || exit 1
}
die() { echo "FAIL: $*"; STATUS=1; exit 1; }

# A fresh tree in $BASE/PHASE: root with the relay rules (+ flags), regionals, agents; waits
# until all are connected (check 1).
start_tree() {
  local phase=$1 h r; shift
  cluster_init "$BIN" "$BASE/$phase"
  trap on_exit EXIT
  if [ "$USE_NETNS" != 1 ]; then
    echo "SKIP: test_tiers needs network namespaces"; rm -rf "$BASE"; trap - EXIT; exit 77
  fi
  cluster_tree "${TREE[@]}"
  cluster_start_service "${RELAY_ALLOW[@]}" "$@" || die "$phase: the root did not start"
  for r in "${REGIONALS[@]}"; do
    cluster_start_regional "$r" --fake-clock "${FAKE[$r]}" || die "$phase: regional $r did not start"
  done
  for h in "${HOSTS[@]}"; do
    cluster_start_agent "$h" --fake-clock "${FAKE[$h]}" || die "$phase: agent $h did not start"
  done
  cluster_wait_hosts 30 "${HOSTS[@]}" "${REGIONALS[@]}" ||
    die "$phase: not every host and regional connected at the root within 30 s"
  echo "$phase: ${HOSTS[*]} ${REGIONALS[*]} connected at the root"
  # Each host is shown relayed by its own regional; the regionals' own hosts by none.
  local want=()
  for h in "${HOSTS[@]}"; do want+=("$h=${CLUSTER_REGIONAL_OF[$h]}"); done
  for r in "${REGIONALS[@]}"; do want+=("$r="); done
  "$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json | python3 -c '
import json, sys
got = {h["machine_name"]: h.get("relayed_by", "") for h in json.load(sys.stdin)["hosts"]}
want = dict(w.split("=", 1) for w in sys.argv[1:])
bad = ["%s=%s: %r" % (h, r, got.get(h)) for h, r in want.items() if got.get(h) != r]
if bad:
    print("FAIL: relayed_by in the root status (host=want: got):", ", ".join(bad)); sys.exit(1)
' "${want[@]}" || fail "$phase: status does not name each host's regional"
}

wait_loadgens() { # wait_loadgens PID...: each must end by itself (session stopped) and exit 0
  local pid
  for pid in "$@"; do
    fault_wait_pid "$pid" 20 || { fail "loadgen $pid still runs 20 s after the session ended"; continue; }
    wait "$pid" || fail "loadgen $pid exited $?"
  done
}

# After a phase's processes ended: no sanitizer report in any of its logs.
check_sanitizers() {
  local f
  for f in "$WORK"/*.log; do
    ! grep -Eq "ERROR: (Address|Leak)Sanitizer|runtime error:" "$f" ||
      fail "$1: sanitizer report in $(basename "$f"): $(grep -Em 2 "Sanitizer|runtime error:" "$f")"
  done
}

boottime_ns() { python3 -c 'import time; print(time.clock_gettime_ns(time.CLOCK_BOOTTIME))'; }

# check_accounting TRACE SPEC...: per-sequence exactness from `tracerelay inspect --json` (into
# TRACE.json) and the loadgens' --stats-json. SPEC is HOST:MODE[:JSON]:
#   lossless  every writer of every loadgen of HOST has a sequence holding exactly the packets
#             it wrote; the host counts no loss and has no unresolved timestamp.
#   killed    the same, or else the host counts an unclean exit (a loss of unknown size, not a
#             silent one); which of the two is printed.
#   late      every writer of the loadgen whose stats are JSON has its exact sequence.
# Writers are matched to sequences by count (a host's own sequences, whose ids differ per
# encoding, are left over and printed), so a packet missing or duplicated anywhere fails.
check_accounting() {
  local trace=$1; shift
  "$TR_BIN/tracerelay" inspect --json "$trace" >"$trace.json" || { fail "inspect $trace"; return 1; }
  python3 - "$WORK" "$trace.json" "$@" <<'PY'
import glob, json, sys
work, report, specs = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3:]
hosts = {m.get("name"): m for m in report["hosts"]}
fail = []
def writers(files):
    return [w["packets_written"] for f in files for w in json.load(open(f))["writers"]]
for spec in specs:
    h, mode, *rest = spec.split(":")
    m = hosts.get(h)
    if m is None:
        fail.append(f"{h}: missing from the trace (hosts: {sorted(hosts, key=str)})"); continue
    files = rest if mode == "late" else sorted(glob.glob(f"{work}/loadgen-{h}-*.json"))
    want, seqs = writers(files), dict(m["sequences"])
    unmatched = []
    for n in want:
        s = next((s for s, c in seqs.items() if c == n), None)
        if s is None: unmatched.append(n)
        else: del seqs[s]
    hs = m.get("host_stats") or {}
    losses = {k: v for k, v in m["losses"].items() if k != "trace_stats_packets" and v}
    print(f"{h} [{mode}]: writers {want}, sequences {m['sequences']}, left over {seqs}, "
          f"unmatched writers {unmatched or 'none'}, losses {losses or 'none'}, "
          f"host_stats { {k: v for k, v in hs.items() if v and k != 'connected'} or 'none'}")
    if mode == "killed" and unmatched:
        if hs.get("session_agent_exits_unclean"):
            print(f"{h}: not exact across the kill, declared by session_agent_exits_unclean="
                  f"{hs['session_agent_exits_unclean']}")
        else:
            fail.append(f"{h}: writers {unmatched} have no exact sequence and no unclean exit is "
                        f"counted: the kill's cost is silent")
    elif mode == "killed":
        print(f"{h}: exact across the kill")
    elif unmatched:
        fail.append(f"{h}: writers that wrote {unmatched} packets have no sequence of that many "
                    f"({m['sequences']})")
    if mode == "lossless" and (losses or hs.get("lost_packets")):
        fail.append(f"{h}: losses counted on a lossless run: {losses} {hs}")
    if mode != "late" and m.get("unresolved", 0):
        fail.append(f"{h}: {m['unresolved']} packets with unresolvable timestamps")
if fail:
    print("FAIL:\n  " + "\n  ".join(fail)); sys.exit(1)
PY
}

# ---- 3. refusals: a host outside its regional's patterns, and a regional not allowed at all.
check_refusals() {
  local spoof_pid rc_pid rcagent_pid seen="" deadline
  # pool-b-9 under regional-a, from pool-a-1's namespace (the only one reaching regional-a).
  # regional-c: in regional-a's namespace on another port, its agent pool-c-1 from pool-a-1's.
  "$TR_SRC/certs/make-certs.sh" "$WORK/pki" --agent pool-b-9 --agent regional-c --agent pool-c-1 \
    >/dev/null
  local ns_a1 ns_ra rc_port=$(($(regional_port regional-a) + 10))
  ns_a1=$(host_ns "$(host_index pool-a-1)"); ns_ra=$(host_ns "$(host_index regional-a)")
  mkdir -p "$WORK/pool-b-9" "$WORK/regional-c" "$WORK/pool-c-1"
  ip netns exec "$ns_a1" "$TR_BIN/tracerelay-agent" --producer-socket "$WORK/pool-b-9/producer.sock" \
    --service "${CLUSTER_SERVICE_VIA[pool-a-1]}" --service-name "$SERVICE_NAME" \
    --ca "$WORK/pki/ca.crt" --cert "$WORK/pki/agent-pool-b-9.crt" --key "$WORK/pki/agent-pool-b-9.key" \
    >>"$WORK/agent-pool-b-9.log" 2>&1 &
  spoof_pid=$!; CLUSTER_PIDS+=("$spoof_pid")
  ip netns exec "$ns_ra" "$TR_BIN/tracerelay-service" --listen "0.0.0.0:$rc_port" \
    --ca "$WORK/pki/ca.crt" --cert "$WORK/pki/service.crt" --key "$WORK/pki/service.key" \
    --upstream "$(root_addr_for regional-a):$SERVICE_PORT" --upstream-name "$SERVICE_NAME" \
    --upstream-cert "$WORK/pki/agent-regional-c.crt" --upstream-key "$WORK/pki/agent-regional-c.key" \
    --upstream-ca "$WORK/pki/ca.crt" --producer-socket "$WORK/regional-c/producer.sock" \
    >>"$WORK/regional-c.log" 2>&1 &
  rc_pid=$!; CLUSTER_PIDS+=("$rc_pid")
  ip netns exec "$ns_a1" "$TR_BIN/tracerelay-agent" --producer-socket "$WORK/pool-c-1/producer.sock" \
    --service "$(regional_addr_for pool-a-1):$rc_port" --service-name "$SERVICE_NAME" \
    --ca "$WORK/pki/ca.crt" --cert "$WORK/pki/agent-pool-c-1.crt" --key "$WORK/pki/agent-pool-c-1.key" \
    >>"$WORK/agent-pool-c-1.log" 2>&1 &
  rcagent_pid=$!; CLUSTER_PIDS+=("$rcagent_pid")
  # The refused hosts must never show at the root: polled until both were refused (at most
  # 15 s) and for 3 s more, their agents retrying meanwhile.
  deadline=$((SECONDS + 15))
  local quiet_until=$((SECONDS + 3))
  while [ "$SECONDS" -lt "$deadline" ]; do
    seen+=$(cluster_status_hosts | awk '$1 == "pool-b-9" || $1 == "pool-c-1" { printf "%s ", $1 }' || true)
    if ! grep -q "not authorized to relay host pool-b-9:" "$WORK/service.log" ||
      ! grep -q "regional-c .*not authorized to relay hosts" "$WORK/service.log"; then
      quiet_until=$((SECONDS + 3))
    elif [ "$SECONDS" -ge "$quiet_until" ]; then
      break
    fi
    sleep 0.25
  done
  [ -z "$seen" ] || fail "refused hosts appeared in the root's status: $(tr ' ' '\n' <<<"$seen" | sort -u | xargs)"
  local h who named
  for h in pool-b-9:regional-a:pool-b-9 pool-c-1:regional-c:regional-c; do
    named=${h##*:} h=${h%:*}
    who=${h#*:} h=${h%%:*}
    grep "not authorized" "$WORK/service.log" | grep -q -- "$named" ||
      fail "the root logged no 'not authorized' line naming $named (host $h under $who)$(
        grep -i "not authorized" "$WORK/service.log" | head -n 3 | sed 's/^/\n    root: /')"
    grep -Eiq "not authorized|refused|goodbye" "$WORK/agent-$h.log" ||
      fail "agent $h (under $who) did not log its refusal: $(tail -n 5 "$WORK/agent-$h.log")"
  done
  echo "refusals: root says:"; grep -i "not authorized" "$WORK/service.log" | head -n 4 | sed 's/^/  /'
  echo "refusals: agents say:"
  grep -Eih "not authorized|refused|goodbye" "$WORK/agent-pool-b-9.log" "$WORK/agent-pool-c-1.log" |
    sort -u | head -n 4 | sed 's/^/  /'
  echo "refusals: regional-c's own host at the root: $(cluster_status_hosts | awk '$1 == "regional-c"' ||
    true) (not asserted)"
  for pid in "$rcagent_pid" "$spoof_pid" "$rc_pid"; do
    kill -TERM "$pid" 2>/dev/null || true
    fault_wait_pid "$pid" 5 || kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  cluster_wait_hosts 5 "${HOSTS[@]}" "${REGIONALS[@]}" ||
    fail "the legitimate hosts did not all stay connected through the refusals"
}

# ---- 2. one encoding: timeline, order and exact accounting through two tiers.
record_encoding() {
  local enc=$1 i h next lg=()
  start_tree "$enc" --timeline "$enc"
  [ "$enc" != machines ] || check_refusals
  for i in "${!HOSTS[@]}"; do mkfifo "$WORK/flows-${HOSTS[$i]}"; done
  for i in "${!HOSTS[@]}"; do
    h=${HOSTS[$i]} next=${HOSTS[$(((i + 1) % ${#HOSTS[@]}))]}
    cluster_start_loadgen "$h" --name "app-$h" --writers 2 --rate 500 --fake-clock "${FAKE[$h]}" \
      --duration $((SECONDS_PER_TRACE - 3)) --flow-send "$WORK/flows-$next" --flow-recv "$WORK/flows-$h"
    lg+=("$LOADGEN_PID")
  done
  for h in "${REGIONALS[@]}"; do
    cluster_start_loadgen "$h" --name "app-$h" --writers 2 --rate 500 --fake-clock "${FAKE[$h]}" \
      --duration $((SECONDS_PER_TRACE - 3))
    lg+=("$LOADGEN_PID")
  done
  local all=()
  for h in "${HOSTS[@]}" "${REGIONALS[@]}"; do all+=("$h:1"); done
  cluster_wait_hosts 15 "${all[@]}" || die "$enc: the loadgens' producers did not all reach the root"
  sleep 2 # the estimators' dense probes, on both tiers
  local t0=$SECONDS
  if ! timeout $((SECONDS_PER_TRACE + 60)) "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" \
    --data-source track_event -b 64mb -t "${SECONDS_PER_TRACE}s" \
    -o "$WORK/trace.pftrace" >"$WORK/record.log" 2>&1; then
    fail "$enc: record: $(tail -n 5 "$WORK/record.log")"; cluster_cleanup; return
  fi
  echo "$enc: recorded in $((SECONDS - t0)) s: $(tail -n 1 "$WORK/record.log")"
  wait_loadgens "${lg[@]}"
  local args=(--bound-us 1000 --check-own-bound "$WORK/trace.pftrace")
  for h in "${HOSTS[@]}" "${REGIONALS[@]}"; do args+=("$h=${FAKE[$h]}"); done
  echo "== $enc, ${SECONDS_PER_TRACE} s, bound 1000 us"
  "$TR_BIN/tracerelay-timeline-check" "${args[@]}" ||
    fail "$enc: events off their true instants or beyond their hosts' error bounds"
  local specs=()
  for h in "${HOSTS[@]}" "${REGIONALS[@]}"; do specs+=("$h:lossless"); done
  check_accounting "$WORK/trace.pftrace" "${specs[@]}" || fail "$enc: packets written != packets in the trace"
  "$TR_BIN/tracerelay" inspect --json --check-order "$WORK/trace.pftrace" >"$WORK/inspect.json" ||
    fail "$enc: inspect --check-order (exit $?)"
  python3 - "$WORK/inspect.json" "$enc" <<'PY' || fail "$enc: flow order"
import json, sys
report, enc = json.load(open(sys.argv[1])), sys.argv[2]
order = report.get("order_check") or {}
print(f"{enc}: flow order {order}")
if order.get("crossing_flows", 0) < 100 or order.get("beyond_bounds") or order.get("bounds_unknown"):
    print(f"FAIL: {enc}: too few crossing flows, or one arrives before it departs by more "
          f"than the hosts' clock error bounds: {order}")
    sys.exit(1)
PY
  if [ "$enc" = machines ]; then
    # The order trace_processor v58 needs, as in test_timeline.sh.
    python3 "$TR_SRC/tools/machines_order.py" "$WORK/trace.pftrace" || fail "machines: packet order"
  fi
  cluster_cleanup
  check_sanitizers "$enc"
}

# ---- 4. a regional killed mid-record, and restarted.
kill_regional() {
  local lg=() h late=() late_json=() t_rec rec_pid rc
  start_tree kill
  for h in pool-a-1 pool-a-2; do # writing across the kill and the reconnection
    cluster_start_loadgen "$h" --name "app-$h" --writers 2 --rate 300 --fake-clock "${FAKE[$h]}" --duration 7
    lg+=("$LOADGEN_PID")
  done
  for h in pool-b-1 pool-b-2 regional-b; do
    cluster_start_loadgen "$h" --name "app-$h" --writers 2 --rate 300 --fake-clock "${FAKE[$h]}" --duration 5
    lg+=("$LOADGEN_PID")
  done
  # regional-a's own producer dies with it (not waited for: it fails, as it should).
  cluster_start_loadgen regional-a --name app-regional-a --writers 1 --rate 300 \
    --fake-clock "${FAKE[regional-a]}"
  cluster_wait_hosts 15 pool-a-1:1 pool-a-2:1 pool-b-1:1 pool-b-2:1 regional-a:1 regional-b:1 ||
    die "kill: the loadgens' producers did not all reach the root"
  sleep 1
  "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 64mb -t 60s \
    -o "$WORK/kill.pftrace" >"$WORK/record.log" 2>&1 &
  rec_pid=$!; CLUSTER_PIDS+=("$rec_pid")
  t_rec=$SECONDS
  cluster_wait_session 60 pool-a-1 pool-a-2 regional-a pool-b-1 pool-b-2 regional-b ||
    die "kill: the session did not start on every host"
  sleep 1 # mid-writing
  boottime_ns >"$WORK/kill.ns" # the root's trace clock is the real BOOTTIME
  kill -KILL "${CLUSTER_REGIONAL_PID[regional-a]}"
  wait "${CLUSTER_REGIONAL_PID[regional-a]}" 2>/dev/null || true
  echo "kill: regional-a killed $((SECONDS - t_rec)) s into the recording"
  sleep 1
  rm -f "$WORK/regional-a/producer.sock"
  cluster_start_regional regional-a --fake-clock "${FAKE[regional-a]}" || die "kill: regional-a did not restart"
  local t_up=$SECONDS
  if cluster_wait_hosts 30 pool-a-1 pool-a-2 regional-a; then
    echo "kill: pool-a-1, pool-a-2, regional-a connected again $((SECONDS - t_up)) s after the restart"
  else
    fail "kill: pool-a-1, pool-a-2 and regional-a not all back at the root within 30 s of the restart"
  fi
  for h in pool-a-1 regional-a; do
    cluster_start_loadgen "$h" --name "late-$h" --writers 1 --rate 250 --packets 250 --fake-clock "${FAKE[$h]}"
    late+=("$LOADGEN_PID")
    late_json+=("$h:late:$WORK/loadgen-$h-$((LOADGEN_SEQ - 1)).json")
  done
  # The late producers join the running session (the root logs their data source instances),
  # then write their 250 packets (1 s).
  local joined=0
  for _ in $(seq 60); do
    joined=$(grep -Ec "data source track_event on (pool-a-1/late-pool-a-1|regional-a/late-regional-a) " \
      "$WORK/service.log" || true)
    [ "$joined" -ge 2 ] && break
    sleep 0.25
  done
  [ "$joined" -ge 2 ] || echo "kill: the late producers' data sources not started at the root within 15 s"
  sleep 2
  while [ $((SECONDS - t_rec)) -lt 9 ]; do sleep 0.5; done # the first loadgens are done
  kill -TERM "$rec_pid"
  fault_wait_pid "$rec_pid" 30 || die "kill: record still runs 30 s after SIGTERM"
  rc=0; wait "$rec_pid" || rc=$?
  echo "kill: record exit $rc after $((SECONDS - t_rec)) s:"; sed 's/^/  /' "$WORK/record.log" | tail -n 6
  [ "$rc" = 0 ] || { fail "kill: record failed (exit $rc)"; cluster_cleanup; return; }
  # regional-a's own agent restarted with it (a retired entry and a new one): one host still.
  local said known
  said=$(grep -o '; [0-9]* hosts,' "$WORK/record.log" | tail -n 1 | tr -dc 0-9)
  known=$(cluster_status_hosts | wc -l)
  [ "$said" = "$known" ] || fail "kill: record says ${said:-no} hosts, the root knows $known"
  wait_loadgens "${lg[@]}" "${late[@]}"
  check_accounting "$WORK/kill.pftrace" pool-b-1:lossless pool-b-2:lossless regional-b:lossless \
    pool-a-1:killed pool-a-2:killed "${late_json[@]}" ||
    fail "kill: packets missing, or lost silently, in the trace"
  python3 - "$WORK" <<'PY' || fail "kill: the trace does not show what the kill did"
import json, sys
work = sys.argv[1]
report = json.load(open(f"{work}/kill.pftrace.json"))
m = {h.get("name"): h for h in report["hosts"]}
kill_ns = int(open(f"{work}/kill.ns").read())
fail = []
for h in ("pool-a-1", "pool-a-2", "regional-a", "pool-b-1", "pool-b-2", "regional-b"):
    if h not in m:
        fail.append(f"{h} missing from the trace ({sorted(m, key=str)})"); continue
    hs = m[h].get("host_stats") or {}
    print(f"{h}: session_disconnects {hs.get('session_disconnects', 0)}, "
          f"disconnected_at_ns {m[h].get('disconnected_at_ns')}")
    marks = m[h].get("disconnected_at_ns") or []
    if h.startswith("pool-b") or h == "regional-b":
        if hs.get("session_disconnects") or marks:
            fail.append(f"{h}: marked disconnected, but its regional lived")
        continue
    if not hs.get("session_disconnects"):
        fail.append(f"{h}: no session_disconnects after its regional was killed")
    if not marks or not kill_ns <= marks[0] <= kill_ns + 10**10:
        fail.append(f"{h}: first disconnect mark {marks[:1]} not within 10 s after the kill at {kill_ns}")
print("service marks", [(mk["ts"], mk["name"]) for mk in report.get("service_marks", [])])
if fail:
    print("FAIL:\n  " + "\n  ".join(fail)); sys.exit(1)
PY
  stall_regional
  cluster_cleanup
  check_sanitizers kill
}

# ---- 5. (same tree) regional-b stalls (SIGSTOP, shorter than the heartbeat timeout, longer
# than the flush timeout) in a session flushing every second: flushes time out naming exactly
# its hosts, the session and the links carry on, and nothing of pool-b is lost once it resumes.
stall_regional() {
  local stop_s=5.5 rc=0 h
  for h in pool-a-1 pool-b-1 pool-b-2 regional-b; do # each ends with the session
    cluster_start_loadgen "$h" --name "stall-$h" --rate 100 --fake-clock "${FAKE[$h]}"
  done
  cluster_wait_hosts 15 pool-a-1:1 pool-b-1:1 pool-b-2:1 regional-b:1 ||
    { fail "stall: the loadgens' producers did not all reach the root"; return; }
  # The session runs until 3 s after the stall (-t 0, SIGTERM), not for a fixed 12 s that a busy
  # machine could end before the stall does.
  # A flush timeout of 4 s, not the default 5, leaves the stall room on both sides: 6.5 s
  # between 5 and 8 made the links' silence pass 8 s at load 13 (the regional resumed late).
  echo 'flush_timeout_ms: 4000' >"$WORK/stall-cfg.pbtxt"
  "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/stall-cfg.pbtxt" \
    --data-source track_event -b 64mb -t 0 --flush-period 1s -o "$WORK/stall.pftrace" \
    >"$WORK/stall-record.log" 2>&1 &
  local rec_pid=$!; CLUSTER_PIDS+=("$rec_pid")
  cluster_wait_session 60 pool-a-1 pool-b-1 pool-b-2 regional-b ||
    { fail "stall: the session did not start on every host"; return; }
  sleep 1 # a flush or two before the stall
  local from; from=$(wc -l <"$WORK/service.log")
  kill -STOP "${CLUSTER_REGIONAL_PID[regional-b]}"
  sleep "$stop_s"
  kill -CONT "${CLUSTER_REGIONAL_PID[regional-b]}"
  sleep 3 # the session carries on
  kill -TERM "$rec_pid"
  wait "$rec_pid" || rc=$?
  [ "$rc" = 0 ] || { fail "stall: record failed (exit $rc): $(tail -n 3 "$WORK/stall-record.log")"; return; }
  local missed
  missed=$(tail -n +"$from" "$WORK/service.log" | grep -o "host [a-z0-9-]* did not answer within the timeout" |
           awk '{print $2}' | sort -u | tr '\n' ' ')
  echo "stall: flushes timed out naming: $missed"
  [ "$missed" = "pool-b-1 pool-b-2 regional-b " ] ||
    fail "stall: the flushes during regional-b's stall should name exactly pool-b-1, pool-b-2 and regional-b, not '$missed'"
  "$TR_BIN/tracerelay" inspect --json "$WORK/stall.pftrace" >"$WORK/stall.json" 2>/dev/null || true
  python3 - "$WORK/stall.json" <<'PY' || fail "stall: the trace does not count the missed flushes, or pool-b lost data"
import json, sys
m = {h.get("name"): h for h in json.load(open(sys.argv[1]))["hosts"]}
bad = []
for h in ("pool-a-1", "pool-a-2", "regional-a", "pool-b-1", "pool-b-2", "regional-b"):
    hs = (m.get(h) or {}).get("host_stats") or {}
    missed, disc = hs.get("session_flushes_missed", 0), hs.get("session_disconnects", 0)
    lost = {k: v for k, v in ((m.get(h) or {}).get("losses") or {}).items() if v}
    print(f"stall: {h}: session_flushes_missed {missed}, session_disconnects {disc}, losses {lost}")
    if h.startswith("pool-b") or h == "regional-b":
        if not missed: bad.append(f"{h}: no missed flush counted")
        if disc: bad.append(f"{h}: disconnected by a stall shorter than the heartbeat timeout")
    elif missed:
        bad.append(f"{h}: missed flushes counted, but its regional ran")
    if lost: bad.append(f"{h}: losses {lost}")
if bad:
    print("FAIL:\n  " + "\n  ".join(bad)); sys.exit(1)
PY
}

T0=$SECONDS
for enc in machines global-clocks; do record_encoding "$enc"; done
kill_regional
echo "test_tiers: $((SECONDS - T0)) s"
[ "$STATUS" = 0 ] || exit 1
echo "PASS: test_tiers"
rm -rf "$BASE"
