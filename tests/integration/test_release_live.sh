#!/usr/bin/env bash
# test_release_live.sh: real clients of other Perfetto releases against agents and the service
# (issue 40 item 1), when TR_PERFETTO_RELEASES names a folder with one subfolder per release
# holding that release's `perfetto` CLI and `compat_producer` (the SDK app of tests/vectors/
# releases/README.md), built outside the repository as docs/compat.md says; skipped (77)
# without it. Per release: the SDK app on two hosts' agents; the release's `perfetto --query`
# must list its producer and data sources; the release's CLI records
# tests/vectors/releases' config through the service's consumer socket; the CLI must exit 0
# and its trace hold, for each host, every burst whole (release_trace_check.py), every packet
# placed on the timeline (tracerelay inspect: unresolved 0).
# Usage: test_release_live.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
RELEASES=${TR_PERFETTO_RELEASES:-}
if [ -z "$RELEASES" ] || [ ! -d "$RELEASES" ]; then
  echo "SKIP: TR_PERFETTO_RELEASES does not name a folder of Perfetto releases"
  exit 77
fi
source "$TR_SRC/tools/cluster-lib.sh"
export TR_NO_NETNS=1
fail() { echo "FAIL: $*"; exit 1; }
cluster_init "$1"
cluster_hosts web-1 web-2
cluster_start_service
for h in web-1 web-2; do cluster_start_agent "$h"; done
cluster_wait_hosts 30 web-1 web-2 || fail "the agents did not connect"
# producers_gone: waits (up to 30 s) until no host lists a producer.
producers_gone() {
  for _ in $(seq 120); do
    "$TR_BIN/tracerelay" status --socket "$CONSUMER_SOCK" --json | python3 -c '
import json, sys
sys.exit(1 if any(h.get("producer_names") for h in json.load(sys.stdin)["hosts"]) else 0)' && return 0
    sleep 0.25
  done
  return 1
}
cfg=$TR_SRC/tests/vectors/releases/v58.2/config.pbtxt
failed=0
for dir in "$RELEASES"/*/; do
  release=$(basename "$dir")
  [ -x "$dir/perfetto" ] && [ -x "$dir/compat_producer" ] || continue
  pids=()
  for h in web-1 web-2; do
    PERFETTO_PRODUCER_SOCK_NAME=$WORK/$h/producer.sock "$dir/compat_producer" -n 20 -t 30 \
      >"$WORK/producer-$release-$h.log" 2>&1 &
    pids+=($!)
  done
  cluster_wait_hosts 30 web-1:1 web-2:1 || fail "$release: the SDK apps did not connect"
  # The release's `perfetto --query` (QueryServiceState, decoded by that release's classes)
  # lists the app's producer and both its data sources.
  PERFETTO_CONSUMER_SOCK_NAME=$CONSUMER_SOCK "$dir/perfetto" --query >"$WORK/query-$release.txt" 2>&1 ||
    true
  if ! grep -q "compat_producer" "$WORK/query-$release.txt" ||
      ! grep -q "tracerelay.compat" "$WORK/query-$release.txt" ||
      ! grep -q "track_event" "$WORK/query-$release.txt"; then
    echo "$release: FAILED: --query does not list the app: $(head -c 300 "$WORK/query-$release.txt")"
    failed=1
  fi
  if PERFETTO_CONSUMER_SOCK_NAME=$CONSUMER_SOCK "$dir/perfetto" --txt -c "$cfg" \
      -o "$WORK/$release.pftrace" >"$WORK/cli-$release.log" 2>&1 &&
      python3 "$TR_SRC/tests/integration/release_trace_check.py" "$WORK/$release.pftrace" 2 \
        >"$WORK/check-$release.txt" &&
      "$TR_BIN/tracerelay" inspect --json "$WORK/$release.pftrace" | python3 -c '
import json, sys
bad = [h["name"] for h in json.load(sys.stdin)["hosts"] if h["unresolved"]]
print("packets off the timeline on %s" % bad if bad else "every packet on the timeline")
sys.exit(1 if bad else 0)' >>"$WORK/check-$release.txt"; then
    echo "$release: OK ($(tr '\n' ';' <"$WORK/check-$release.txt"))"
  else
    echo "$release: FAILED: $(tail -3 "$WORK/cli-$release.log" | tr '\n' ' ') $(cat "$WORK/check-$release.txt" 2>/dev/null)"
    failed=1
  fi
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  producers_gone || fail "$release: the SDK apps' producers stayed listed"
done
[ "$failed" = 0 ] || fail "a release failed"
echo PASS
