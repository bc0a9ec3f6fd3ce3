#!/usr/bin/env bash
# demo.sh: the main job in one command. Installs what building and running it needs (only what
# is missing, upgrading nothing it does not need), builds tracerelay, and runs a demo cluster on
# this machine: a service, three agents in network namespaces (on loopback where namespaces are
# not allowed) with their own certificates and machine names, a loadgen producer on each, a 10 s
# recording with `tracerelay record` (`tracerelay status` half-way), then `tracerelay inspect`
# on the result. The trace and the logs are kept in a fresh /tmp/tracerelay-demo.XXXXXX, outside
# the source tree (its closing lines say where); everything the demo started is stopped on exit.
#   tools/demo.sh [--seconds N] [--out FILE]
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_TO_RECORD=10
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_TO_RECORD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "${TR_SKIP_INSTALL:-0}" = 1 ] || "$TR_SRC/tools/install-deps.sh" --demo
BUILD=${TR_BUILD_DIR:-$TR_SRC/build}
# A build tree configured before (TR_BUILD_DIR=build-test, say) keeps its own settings.
[ -f "$BUILD/CMakeCache.txt" ] ||
  cmake -S "$TR_SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C "$BUILD" tracerelay-service tracerelay-agent tracerelay-loadgen tracerelay

source "$TR_SRC/tools/cluster-lib.sh"
RUN_DIR=$(mktemp -d /tmp/tracerelay-demo.XXXXXX)
OUT=${OUT:-$RUN_DIR/tracerelay-demo.pftrace}
cluster_init "$BUILD/bin" "$RUN_DIR"
HOSTS=(web-1 web-2 db-1)
cluster_hosts "${HOSTS[@]}"
cluster_start_service
for h in "${HOSTS[@]}"; do cluster_start_agent "$h"; done
for h in "${HOSTS[@]}"; do
  cluster_start_loadgen "$h" --name "demo-app-$h" --writers 2 --rate 2000 --packet-size 120
done
# Record once every agent's link is up and its producer registered (up to 10 s), so that each
# host's data covers the whole recording.
for _ in $(seq 50); do
  "$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json 2>/dev/null | python3 -c '
import json, sys
hosts = [h for h in json.load(sys.stdin)["hosts"] if h["connected"] and h["producers"] > 0]
sys.exit(0 if len(hosts) >= int(sys.argv[1]) else 1)' "${#HOSTS[@]}" && break
  sleep 0.2
done
cluster_log "service, 3 agents and 3 producers running; recording ${SECONDS_TO_RECORD}s"
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 64mb \
  -t "${SECONDS_TO_RECORD}s" -o "$OUT" &
RECORD_PID=$!
# Half-way through, what the service sees: one line per host (`tracerelay status`).
sleep $((SECONDS_TO_RECORD / 2 > 3 ? SECONDS_TO_RECORD / 2 : 3))
"$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" || true
wait "$RECORD_PID"
"$TR_BIN/tracerelay" inspect "$OUT"
cat <<TXT

The trace is at $OUT
Open it in the Perfetto UI (https://ui.perfetto.dev: "Open trace file"), or query it with
trace_processor: every host is a row of the machine table, with its own processes and threads
(docs/querying.md has example queries). While a cluster runs,
  tracerelay status --socket CONSUMER_SOCKET --watch
shows each host's link, data, clock and losses (docs/troubleshooting.md).
Logs of this run: $WORK (remove it when done: rm -rf $WORK)
TXT
