#!/usr/bin/env bash
# test_status.sh: `tracerelay status` against a small cluster on loopback (two agents, one of
# them on a simulated clock 5 ms ahead), while a recording runs (until the checks are done).
# Checks the JSON lists each host, connected, with its producer, a started session, non-zero
# bytes and chunks relayed, no losses (a producer's shared memory that filled on a busy machine
# is noted, not failed) and a synced clock (web-2's offset near -5 ms); that the text output has
# one line per host; that --watch repeats blocks when stdout is not a terminal; and that the
# real `perfetto --query` (when installed, or $TR_PERFETTO) still reads the same replies.
# Usage: test_status.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
export TR_NO_NETNS=1
SERVICE_PORT=$((20000 + RANDOM % 20000))
source "$TR_SRC/tools/cluster-lib.sh"
cluster_init "$1"
HOSTS=(web-1 web-2)
cluster_hosts "${HOSTS[@]}"
cluster_start_service
cluster_start_agent web-1
cluster_start_agent web-2 --fake-clock 5000000,0
for h in "${HOSTS[@]}"; do
  cluster_start_loadgen "$h" --name "app-$h" --rate 2000 --packet-size 100
done
ST="$TR_BIN/tracerelay status --socket $CONSUMER_SOCK"

# The session lasts until the checks are done (-t 0, SIGTERM at the end): on a busy machine a
# fixed length could end it before them.
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 32mb -t 0 \
  -o "$WORK/status.pftrace" >"$WORK/record.log" 2>&1 &
RECORD_PID=$!
CLUSTER_PIDS+=("$RECORD_PID")

# Wait until both hosts relayed data and have a clock estimate (probes run every second; up to
# 60 s, for a starved machine).
ok=0
for _ in $(seq 240); do
  sleep 0.25
  $ST --json >"$WORK/status.json" 2>"$WORK/status.err" || continue
  if python3 - "$WORK/status.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
hosts = {h["machine_name"]: h for h in s["hosts"]}
sys.exit(0 if all(n in hosts and hosts[n]["bytes_relayed"] > 0 and hosts[n]["clock"]["synced"]
                  for n in ("web-1", "web-2")) else 1)
PY
  then ok=1; break; fi
done
[ "$ok" = 1 ] || { echo "FAIL: status never showed both hosts relaying with a clock"; \
  cat "$WORK/status.json" "$WORK/status.err" 2>/dev/null; exit 1; }

python3 - "$WORK/status.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
hosts = {h["machine_name"]: h for h in s["hosts"]}
fail = []
if sorted(hosts) != ["web-1", "web-2"]:
    fail.append(f"hosts {sorted(hosts)}")
if s["service"]["num_sessions_started"] != 1:
    fail.append(f"service: {s['service']}")
for name, h in sorted(hosts.items()):
    if not h["connected"] or "connected_since_unix_ns" not in h:
        fail.append(f"{name}: not connected: {h}")
    if h["producers"] != 1 or h["data_sources"] < 1 or h["producer_names"] != [f"app-{name}"]:
        fail.append(f"{name}: producers {h['producers']} {h['producer_names']} ds {h['data_sources']}")
    if [x["state"] for x in h["sessions"]] != ["STARTED"] or h["sessions"][0]["instances_started"] != 1:
        fail.append(f"{name}: sessions {h['sessions']}")
    if h["bytes_relayed"] <= 0 or h["chunks_relayed"] <= 0:
        fail.append(f"{name}: nothing relayed")
    lost = {k: v for k, v in h["losses"].items() if v}
    # A producer whose shared memory filled while the machine was too busy to drain it: not
    # the relay's loss, and a precondition of this test that a starved machine breaks.
    if lost.pop("agent_smb_full", 0):
        print(f"{name}: its producer's shared memory filled (a busy machine): "
              f"agent_smb_full {h['losses']['agent_smb_full']}")
    if lost:
        fail.append(f"{name}: losses {lost}")
    c = h["clock"]
    if not c["synced"] or c["rtt_ns"] <= 0 or c["error_bound_ns"] <= 0 or c["probes"] < 1:
        fail.append(f"{name}: clock {c}")
    print(f"{name}: {h['bytes_relayed']} bytes, {h['chunks_relayed']} chunks, "
          f"offset {c.get('offset_ns')} ns, drift {c.get('drift_ppm')} ppm, "
          f"rtt {c.get('rtt_ns')} ns, bound {c.get('error_bound_ns')} ns")
off1 = hosts["web-1"]["clock"].get("offset_ns", 0)
off2 = hosts["web-2"]["clock"].get("offset_ns", 0)
if abs(off1) > 2_000_000:
    fail.append(f"web-1 (real clock) offset {off1} ns")
if abs(off2 + 5_000_000) > 2_000_000:
    fail.append(f"web-2 (clock 5 ms ahead) offset {off2} ns, expected about -5000000")
if fail:
    print("FAIL:\n  " + "\n  ".join(fail))
    sys.exit(1)
PY

# Text: a summary line, a header, one line per host with its session and no loss (but the
# producer's full shared memory, on a busy machine: see above).
$ST >"$WORK/status.txt"
cat "$WORK/status.txt"
grep -q '^service .*: 2 hosts (2 connected)' "$WORK/status.txt" || { echo "FAIL: summary line"; exit 1; }
grep -q '^buffer memory: 64 MiB reserved of .* (--max-buffer-memory)$' "$WORK/status.txt" ||
  { echo "FAIL: buffer memory line (32 MiB on each of 2 hosts)"; exit 1; }
grep -q '^HOST ' "$WORK/status.txt" || { echo "FAIL: header"; exit 1; }
for h in "${HOSTS[@]}"; do
  grep -Eq "^$h +[0-9-]+ [0-9:]+ \([0-9hms]+\) +1 +[0-9]+ +#[0-9]+ STARTED 1/1 .*ppm.* (none|smb=[0-9]+)$" \
    "$WORK/status.txt" || { echo "FAIL: no status line for $h"; exit 1; }
done

# watch_until_two OUT REGEX [flags]: `status --watch 1` into OUT until two lines match REGEX
# (two blocks; up to 30 s), then stopped. 1 if it printed fewer or exited by itself.
watch_until_two() {
  local out=$1 re=$2 pid n=0; shift 2
  $ST --watch 1 "$@" >"$out" &
  pid=$!
  for _ in $(seq 300); do
    n=$(grep -c "$re" "$out" || true)
    [ "$n" -ge 2 ] || ! kill -0 "$pid" 2>/dev/null && break
    sleep 0.1
  done
  kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  [ "$n" -ge 2 ]
}
# --watch without a terminal: plain blocks separated by blank lines, no escape codes.
watch_until_two "$WORK/watch.txt" '^service ' ||
  { echo "FAIL: --watch printed fewer than 2 blocks"; cat "$WORK/watch.txt"; exit 1; }
if grep -q $'\033' "$WORK/watch.txt"; then echo "FAIL: escape codes without a terminal"; exit 1; fi
watch_until_two "$WORK/watch.json" '^{.*}$' --json || { echo "FAIL: --watch --json"; exit 1; }
python3 -c 'import json,sys; l=[json.loads(x) for x in open(sys.argv[1]) if x.endswith("\n")]; assert len(l)>=2, l' \
  "$WORK/watch.json" || { echo "FAIL: --watch --json"; exit 1; }

# The extension must not disturb Perfetto's own client.
# TR_PERFETTO=/path/to/perfetto picks a CLI that is not on PATH.
PERFETTO=${TR_PERFETTO:-$(command -v perfetto || true)}
if [ -n "$PERFETTO" ]; then
  PERFETTO_CONSUMER_SOCK_NAME="$CONSUMER_SOCK" "$PERFETTO" --query >"$WORK/query.txt" 2>&1 || {
    echo "FAIL: perfetto --query"; cat "$WORK/query.txt"; exit 1; }
  grep -q "app-web-1" "$WORK/query.txt" || { echo "FAIL: perfetto --query lacks producers"; exit 1; }
else
  echo "(perfetto CLI not installed: perfetto --query not checked)"
fi

# Bad usage.
set +e
$ST --watch 0 >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: --watch 0 accepted"; exit 1; }
"$TR_BIN/tracerelay" status --socket "$WORK/nonexistent.sock" >/dev/null 2>&1
[ $? = 1 ] || { echo "FAIL: a missing socket is not exit status 1"; exit 1; }
set -e

kill -TERM "$RECORD_PID"
wait "$RECORD_PID" || { echo "FAIL: record"; cat "$WORK/record.log"; exit 1; }
echo "PASS: test_status"
