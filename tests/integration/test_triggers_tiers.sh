#!/usr/bin/env bash
# test_triggers_tiers.sh: a trigger crosses a regional (issue 38). A root, one regional
# (regional-a, allowed pool-a-*) with two hosts behind it, in network namespaces; a loadgen on
# each host. A STOP_TRACING session at the root is stopped by a trigger that pool-a-2's
# loadgen raises on its agent, which the regional forwards with the host's link: the trace's
# trigger packet names pool-a-2, and both hosts' data reaches past the trigger.
# Usage: test_triggers_tiers.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
fail() { echo "FAIL: $*"; exit 1; }
cluster_init "$1"
if [ "$USE_NETNS" != 1 ]; then
  echo "SKIP: test_triggers_tiers needs network namespaces"
  exit 77
fi
cluster_tree regional-a=pool-a-1,pool-a-2
cluster_start_service --relay-allow 'regional-a=pool-a-*'
cluster_start_regional regional-a
for h in pool-a-1 pool-a-2; do cluster_start_agent "$h"; done
cluster_start_loadgen pool-a-1 --name app --rate 500
cluster_start_loadgen pool-a-2 --name app --rate 500 --trigger boom --trigger-after 1500
cluster_wait_hosts 30 pool-a-1:1 pool-a-2:1 || fail "the hosts did not connect through the regional"
printf '%s\n' 'buffers { size_kb: 8192 fill_policy: RING_BUFFER }' \
  'data_sources { config { name: "track_event" } }' \
  'trigger_config { trigger_mode: STOP_TRACING triggers { name: "boom" stop_delay_ms: 300 } trigger_timeout_ms: 120000 }' \
  >"$WORK/stop.cfg"
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" -c "$WORK/stop.cfg" --txt \
  -o "$WORK/stop.pftrace" 2>"$WORK/stop.log" || fail "record exited $? ($(cat "$WORK/stop.log"))"
python3 "$TR_SRC/tests/integration/trigger_packets.py" "$WORK/stop.pftrace" >"$WORK/triggers"
read -r trig_ts name producer _ delay <"$WORK/triggers" || fail "no trigger packet"
[ "$name $producer $delay" = "boom pool-a-2/app 300" ] || fail "the trigger packet is '$(cat "$WORK/triggers")'"
"$TR_BIN/tracerelay" inspect --json "$WORK/stop.pftrace" >"$WORK/inspect.json"
for h in pool-a-1 pool-a-2; do
  last=$(python3 -c '
import json, sys
print([h for h in json.load(open(sys.argv[1]))["hosts"] if h["name"] == sys.argv[2]][0]["last_ts"])' \
    "$WORK/inspect.json" "$h")
  [ "$last" -ge $((trig_ts + 200000000)) ] || fail "$h ends $(((last - trig_ts) / 1000000)) ms after the trigger"
  echo "$h: data up to $(((last - trig_ts) / 1000000)) ms after the trigger"
done
echo PASS
