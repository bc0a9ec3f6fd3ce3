#!/usr/bin/env bash
# fault-lib.sh: helpers shared by the fault tests (test_partition.sh, test_restarts.sh...), on
# top of tools/cluster-lib.sh. Sourced after it, not run.
#
#   fault_require_netns                 exit 77 (skip) when the cluster runs without namespaces
#   fault_link HOST down|up             the host's veth, inside its own namespace
#   fault_wait_pid PID SECONDS          waits for a process to exit by itself (0) or times out (1)
#   fault_check_accounting TRACE MODE HOST...
#                                       the exactness check: per host, packets written by its
#                                       loadgens = packets in the trace (+ packets counted lost)
#   fault_nft HOST RULES                adds an nft table "trfault" inside the host's namespace
#                                       (deleted with the namespace)

# fault_init BIN_DIR: cluster_init with the work dir from $TR_FAULT_WORK (kept) or a fresh one
# (deleted on exit unless the test failed or TR_KEEP_WORK=1: cluster_finish).
fault_init() {
  cluster_init "$1" "${TR_FAULT_WORK:-}"
  trap fault_cleanup EXIT
}

fault_cleanup() {
  local status=$? f
  cluster_cleanup
  if [ "$status" != 0 ] && [ "$status" != 77 ]; then
    for f in "$WORK"/*.log; do
      [ -f "$f" ] || continue
      echo "---- $(basename "$f") (last 15 lines)"; tail -n 15 "$f"
    done
  fi
  cluster_finish "$status"
  return $status
}

fault_require_netns() {
  if [ "$USE_NETNS" != 1 ]; then
    echo "SKIP: needs network namespaces"
    exit 77
  fi
}

fault_link() { # fault_link HOST down|up
  local i; i=$(host_index "$1") || return 1
  ip -n "$(host_ns "$i")" link set "tr${CLUSTER_ID}h$i" "$2"
}

fault_nft() { # fault_nft HOST 'nft script'
  local i; i=$(host_index "$1") || return 1
  printf '%s\n' "$2" | ip netns exec "$(host_ns "$i")" nft -f -
}

fault_wait_pid() { # fault_wait_pid PID SECONDS
  local n=$(($2 * 10))
  for _ in $(seq "$n"); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  return 1
}

# fault_check_accounting TRACE MODE HOST...: MODE "lossless" wants every written packet in the
# trace and no counted loss but a producer's own drops in its full shared memory (a busy
# machine; said when it happens); "exact" wants written = in trace + counted lost (packets), and
# prints the figures. Extra python checks may follow on stdin-less env: FAULT_EXPECT_LOSS=HOST,...
# names hosts that must have counted losses (the test would prove nothing otherwise).
fault_check_accounting() {
  local trace=$1 mode=$2; shift 2
  "$TR_BIN/tracerelay" inspect --json "$trace" >"$trace.json"
  python3 - "$WORK" "$trace.json" "$mode" "${FAULT_EXPECT_LOSS:-}" "$@" <<'PY'
import json, sys, glob
work, report_path, mode, expect_loss, hosts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
expect_loss = [h for h in expect_loss.split(",") if h]
report = json.load(open(report_path))
machines = {m.get("name"): m for m in report["hosts"]}
failures = []
for h in hosts:
    written = dropped_smb = 0
    for f in glob.glob(f"{work}/loadgen-{h}-*.json"):
        t = json.load(open(f))["total"]
        written += t["packets_written"]
        dropped_smb += t.get("packets_dropped", 0)
    m = machines.get(h)
    if m is None:
        failures.append(f"machine {h} missing from the trace (machines: {sorted(machines)})")
        continue
    got = sum(n for seq, n in m["sequences"].items() if int(seq) >= 2)
    hs = m.get("host_stats") or {}
    lost_pk = hs.get("lost_packets", 0)
    losses = {k: v for k, v in m["losses"].items() if k != "trace_stats_packets" and v}
    counted = {k: v for k, v in hs.items() if k not in ("connected",) and isinstance(v, int) and v}
    print(f"{h}: written {written} (SMB-dropped {dropped_smb}), in trace {got}, "
          f"counted lost packets {lost_pk}, losses {losses or 'none'}, host_stats {counted or 'none'}")
    if mode == "lossless":
        if got != written:
            failures.append(f"{h}: {written} packets written, {got} in the trace")
        # On a busy machine the agent may not keep up with a producer, whose writer then drops
        # packets in its full shared memory: its own, counted by it and marked in the trace
        # (at most one mark per dropped packet). A precondition of "lossless" that a starved
        # machine cannot give: said, not failed. Anything else lost is the relay's.
        writer_marks = {"trace_writer_packet_loss", "previous_packet_dropped"}
        relay_losses = {k: v for k, v in losses.items()
                        if not (k in writer_marks and v <= dropped_smb)}
        if relay_losses or lost_pk:
            failures.append(f"{h}: losses reported on a lossless run: {losses} {counted}")
        elif losses:
            print(f"{h}: note: its producer dropped {dropped_smb} packets in its full shared "
                  f"memory (the machine was too busy for the agent to keep up with it); marked "
                  f"in the trace ({losses}), nothing else lost")
    else:
        if got + lost_pk != written:
            failures.append(f"{h}: written {written} != in trace {got} + counted lost {lost_pk}"
                            f" (unexplained: {written - got - lost_pk})")
        if h in expect_loss and lost_pk == 0:
            failures.append(f"{h}: expected counted losses, got none")
    if m.get("unresolved", 0):
        failures.append(f"{h}: {m['unresolved']} packets with unresolvable timestamps")
if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
PY
}
