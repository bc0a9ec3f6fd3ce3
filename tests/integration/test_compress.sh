#!/usr/bin/env bash
# test_compress.sh: TraceConfig's compression honoured as traced v58.2 does it (issue 38, item
# 4), through a real service, agent and loadgen and `tracerelay record -c`. Three sessions,
# each with a loadgen of its own writing the same events (2 writers x 3000, seq-numbered):
#   plain   no compression, read with ReadBuffers;
#   deflate compression_type: COMPRESSION_TYPE_DEFLATE, read with ReadBuffers;
#   zstd    compression { zstd { level: 3 } } with write_into_file (the service's file).
# Checked: every top-level packet of a compressed trace is a compressed one (compressed_packets,
# zstd_compressed_packets), none left plain; decompressed (zlib, the zstd CLI), each trace holds
# exactly the events its loadgen wrote, every one once, and the same events as the plain trace
# (writer, seq, type, name, categories: all but timestamps, uuids, pids and padding, which
# differ between runs), and the service's packets of the same kinds; `tracerelay inspect`
# reads the compressed traces and finds the same packets on web-1. The sizes are printed (ratio
# to plain; the loadgen's padding is one repeated string, so it compresses far better than
# real trace data: docs/compat.md gives ratios on recorded traces).
# Usage: test_compress.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
export TR_NO_NETNS=1
fail() { echo "FAIL: $*"; exit 1; }
command -v zstd >/dev/null || { echo "SKIP: the zstd CLI is not installed (tools/install-deps.sh)"; exit 77; }

cluster_init "$1"
cluster_hosts web-1
cluster_start_service
cluster_start_agent web-1 --machine-name web-1

base='buffers { size_kb: 16384 } data_sources { config { name: "track_event" } }'
echo "$base" >"$WORK/plain.cfg"
echo "$base compression_type: COMPRESSION_TYPE_DEFLATE" >"$WORK/deflate.cfg"
echo "$base compression { zstd { level: 3 } } write_into_file: true file_write_period_ms: 500" \
  >"$WORK/zstd.cfg"

# web-1's bytes in the last progress line, in tenths of a MB (0 before one).
host_tenths() {
  local mb
  mb=$(grep -Eo " web-1 [0-9]+\.[0-9] MB" "$1" | tail -1 | grep -Eo "[0-9]+\.[0-9]") || { echo 0; return; }
  echo "${mb/./}"
}

# record MODE: a loadgen of its own, a session lasting until web-1's buffers hold about all of
# its events (-t 0, then SIGTERM), then the loadgen's counts.
record() {
  local mode=$1
  cluster_start_loadgen web-1 --writers 2 --rate 5000 --packets 3000 --packet-size 300
  local lg=$LOADGEN_PID lg_n=$((LOADGEN_SEQ - 1))
  cluster_wait_hosts 30 web-1:1 || fail "$mode: the loadgen did not connect"
  "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/$mode.cfg" --txt -t 0 --progress \
    -o "$WORK/$mode.pftrace" 2>"$WORK/record-$mode.err" &
  local rec=$!
  CLUSTER_PIDS+=("$rec")
  # 6000 events of 300 bytes: 1.8 MB and descriptors; the stop flushes what is left.
  for _ in $(seq 600); do [ "$(host_tenths "$WORK/record-$mode.err")" -ge 17 ] && break; sleep 0.1; done
  [ "$(host_tenths "$WORK/record-$mode.err")" -ge 17 ] ||
    fail "$mode: web-1's data did not reach the buffers: $(cat "$WORK/record-$mode.err")"
  kill -TERM "$rec"
  wait "$rec" || fail "$mode: record exited $?: $(cat "$WORK/record-$mode.err")"
  for _ in $(seq 300); do kill -0 "$lg" 2>/dev/null || break; sleep 0.1; done
  wait "$lg" || fail "$mode: the loadgen did not stop cleanly"
  cp "$WORK/loadgen-web-1-$lg_n.json" "$WORK/loadgen-$mode.json"
  "$TR_BIN/tracerelay" inspect --json "$WORK/$mode.pftrace" >"$WORK/inspect-$mode.json" ||
    fail "$mode: inspect cannot read the trace"
}

for mode in plain deflate zstd; do record "$mode"; done

python3 - "$WORK" "$TR_SRC/tools" <<'PY'
import json, subprocess, sys, zlib
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import pbwire

def records(b):
    return [v for f, wt, v in pbwire.fields(b) if f == 1 and wt == 2]

def unpack(mode):
    data = open(f"{work}/{mode}.pftrace", "rb").read()
    outer, packets, kinds = records(data), [], set()
    for p in outer:
        fs = pbwire.fields(p)
        z = [(f, v) for f, wt, v in fs if f in (50, 133)]
        if not z:
            kinds.add("plain")
            packets.append(p)
            continue
        if len(fs) != 1:
            sys.exit(f"FAIL: {mode}: a compressed packet carries other fields: {[f for f, _, _ in fs]}")
        f, v = z[0]
        kinds.add(f)
        raw = zlib.decompress(v) if f == 50 else \
            subprocess.run(["zstd", "-dc"], input=v, capture_output=True, check=True).stdout
        packets += records(raw)
    return len(data), len(outer), kinds, packets

def events(mode, packets):
    """(writer, seq) -> what the event is, without its timestamp, uuids and pids; and the
    field numbers of the service's packets (sequence 1)."""
    ev, service = {}, set()
    for p in packets:
        seq_id = pbwire.first(p, 10)
        if seq_id == 1:
            service |= {f for f, _, _ in pbwire.fields(p) if f not in (3, 8, 10, 58)}
        te = pbwire.first(p, 11)
        if te is None:
            continue
        ann = {pbwire.first(a, 1): pbwire.first(a, 3) for a in pbwire.all_of(te, 4)}
        key = (ann.get(1), ann.get(2))
        if None in key:
            continue
        if key in ev:
            sys.exit(f"FAIL: {mode}: event {key} twice")
        # all but the track's uuid, the counter's value and the padding (its length follows
        # the timestamp delta's varint): type, name, categories, writer and seq
        ev[key] = [(f, v) for f, _, v in pbwire.fields(te)
                   if f not in (11, 30) and not (f == 4 and pbwire.first(v, 1) == 3)]
    return ev, service

res = {}
for mode, want in (("plain", {"plain"}), ("deflate", {50}), ("zstd", {133})):
    size, n_outer, kinds, packets = unpack(mode)
    if kinds != want:
        sys.exit(f"FAIL: {mode}: top-level packets are {kinds}, expected only {want}")
    ev, service = events(mode, packets)
    lg = json.load(open(f"{work}/loadgen-{mode}.json"))
    for w in lg["writers"]:
        if w["events_dropped"]:
            sys.exit(f"FAIL: {mode}: precondition broken: the loadgen dropped {w['events_dropped']} "
                     "events (its shared memory filled: a starved machine)")
        got = sorted(s for (wr, s) in ev if wr == w["writer_id"])
        if got != list(range(w["events_written"])):
            sys.exit(f"FAIL: {mode}: writer {w['writer_id']} wrote {w['events_written']} events, "
                     f"the trace holds {len(got)} (first missing: "
                     f"{next((i for i, s in enumerate(got) if i != s), len(got))})")
    rep = json.load(open(f"{work}/inspect-{mode}.json"))
    host = [h for h in rep["hosts"] if h.get("name") == "web-1"]
    web1 = sum(n for s, n in host[0]["sequences"].items() if int(s) >= 2) if host else 0
    ours = sum(1 for p in packets if (pbwire.first(p, 10) or 0) >= 2)
    if web1 != ours:
        sys.exit(f"FAIL: {mode}: inspect finds {web1} packets of web-1's producer, we {ours}")
    res[mode] = (size, n_outer, len(packets), ev, service, web1)
    print(f"{mode}: {size} bytes, {n_outer} top-level packets holding {len(packets)}; "
          f"{len(ev)} loadgen events; inspect: {web1} packets of web-1's producer")

plain = res["plain"]
for mode in ("deflate", "zstd"):
    size, _, n, ev, service, web1 = res[mode]
    common = set(ev) & set(plain[3])
    if len(common) < 0.9 * len(plain[3]):
        sys.exit(f"FAIL: {mode}: only {len(common)} events in common with the plain trace")
    diff = [k for k in sorted(common) if ev[k] != plain[3][k]]
    if diff:
        sys.exit(f"FAIL: {mode}: events differ from the plain trace's, first {diff[0]}: "
                 f"{ev[diff[0]]} vs {plain[3][diff[0]]}")
    if service != plain[4]:
        sys.exit(f"FAIL: {mode}: service packet kinds {sorted(service)} vs plain {sorted(plain[4])}")
    print(f"{mode}: same events and service packet kinds as plain; size {size} bytes = "
          f"{size / plain[0]:.3f} of plain ({plain[0]} bytes)")
PY
echo "PASS: test_compress"
