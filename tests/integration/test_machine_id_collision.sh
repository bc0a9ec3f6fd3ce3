#!/usr/bin/env bash
# test_machine_id_collision.sh: two hosts whose names hash alike stay two hosts in the trace
# (issue 39 item 4; docs/timeline.md, Machine ids). For each encoding, a pair of names found by
# a birthday search (tests/unit/test_machine_ids.c checks that they collide):
#   machines       host-1222881, host-1414990: the same machine_id, tr_machine_id(name)
#   global-clocks  gc-215768, gc-1038902: the same global BOOTTIME clock id, machine_ids apart
# Both agents connect (the first listed first), each with a loadgen writing a known number of
# packets; a recording later, `tracerelay inspect` must list both hosts, the second as NAME#1
# (its trace name), each with a sequence per writer holding exactly what that writer wrote, and
# `tracerelay status` must show the second's trace name and a machine_id of its own.
# Before the fix the two merged into one host of the trace.
# Usage: test_machine_id_collision.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
export TR_NO_NETNS=1
source "$TR_SRC/tools/cluster-lib.sh"
cluster_init "$1"
BASE=$WORK
STATUS=0
fail() { echo "FAIL: $*"; STATUS=1; }

run() { # run ENCODING FIRST SECOND
  local enc=$1 first=$2 second=$3
  WORK=$BASE/$enc CONSUMER_SOCK=$BASE/$enc/consumer.sock LOADGEN_SEQ=0
  mkdir -p "$WORK"
  cluster_hosts "$first" "$second"
  cluster_start_service --timeline "$enc"
  cluster_start_agent "$first"
  cluster_start_loadgen "$first" --name "app-$first" --writers 2 --rate 500 --packets 400
  cluster_wait_hosts 60 "$first:1" || { fail "$enc: $first did not connect"; return; }
  cluster_start_agent "$second"
  cluster_start_loadgen "$second" --name "app-$second" --writers 2 --rate 500 --packets 300
  cluster_wait_hosts 60 "$first:1" "$second:1" || { fail "$enc: the hosts did not connect"; return; }
  grep -q "collide with those of $first" "$WORK/service.log" ||
    fail "$enc: the service did not log the collision"
  "$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json >"$WORK/status-$enc.json"
  "$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" >"$WORK/status-$enc.txt"
  grep -q "^$second is $second#1 in traces" "$WORK/status-$enc.txt" ||
    fail "$enc: status's text does not say how traces name $second: $(cat "$WORK/status-$enc.txt")"
  # The loadgens write their counts when the session stops them: after the record.
  timeout 120 "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event \
    -b 16mb -t 3s -o "$WORK/$enc.pftrace" >"$WORK/record-$enc.log" 2>&1 ||
    { fail "$enc: record: $(tail -n 3 "$WORK/record-$enc.log")"; return; }
  for _ in $(seq 120); do
    [ -s "$WORK/loadgen-$first-0.json" ] && [ -s "$WORK/loadgen-$second-1.json" ] && break
    sleep 0.25
  done
  "$TR_BIN/tracerelay" inspect --json "$WORK/$enc.pftrace" >"$WORK/inspect-$enc.json" ||
    { fail "$enc: inspect"; return; }
  python3 - "$WORK" "$enc" "$first" "$second" <<'PY' || fail "$enc: the hosts are not kept apart"
import json, sys
work, enc, first, second = sys.argv[1:]
fail = []
status = {h["machine_name"]: h for h in json.load(open(f"{work}/status-{enc}.json"))["hosts"]}
a, b = status.get(first), status.get(second)
if not a or not b:
    sys.exit(f"status lacks a host: {sorted(status)}")
if "trace_machine_name" in a or b.get("trace_machine_name") != second + "#1":
    fail.append(f"status trace names: {a.get('trace_machine_name')}, {b.get('trace_machine_name')}")
if a["machine_id"] == b["machine_id"]:
    fail.append(f"status: one machine_id for both, {a['machine_id']}")
report = json.load(open(f"{work}/inspect-{enc}.json"))
hosts = {m.get("name"): m for m in report["hosts"]}
print(f"{enc}: trace hosts " + ", ".join(f"{n} (machine {m['machine_id']}, domain {m['domain']}, "
                                         f"{m['packets']} packets)" for n, m in hosts.items()))
for name, trace_name, n in ((first, first, 0), (second, second + "#1", 1)):
    m = hosts.get(trace_name)
    if m is None:
        fail.append(f"{trace_name} is not a host of the trace"); continue
    wrote = [w["packets_written"] for w in json.load(open(f"{work}/loadgen-{name}-{n}.json"))["writers"]]
    seqs = dict(m["sequences"])
    for w in wrote:
        s = next((s for s, c in seqs.items() if c == w), None)
        if s is None:
            fail.append(f"{trace_name}: a writer wrote {w} packets, no sequence holds that many: "
                        f"{m['sequences']}")
        else:
            del seqs[s]
    print(f"{trace_name}: writers {wrote}, sequences {m['sequences']}")
    if m.get("unresolved", 0):
        fail.append(f"{trace_name}: {m['unresolved']} packets with unresolvable timestamps")
if fail:
    print("FAIL:\n  " + "\n  ".join(fail)); sys.exit(1)
PY
  cluster_cleanup
}

run machines host-1222881 host-1414990
run global-clocks gc-215768 gc-1038902
[ "$STATUS" != 0 ] || echo "PASS: test_machine_id_collision"
exit "$STATUS"
