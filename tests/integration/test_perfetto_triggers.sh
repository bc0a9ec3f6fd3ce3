#!/usr/bin/env bash
# test_perfetto_triggers.sh: the flight recorder with Perfetto's own CLI (issue 38), when
# TR_PERFETTO names a perfetto v58.2 binary (skipped, exit 77, without it). Two hosts on
# loopback, a loadgen on each; `perfetto --txt -c` records the issue's config (ring buffer,
# STOP_TRACING trigger "boom", stop_delay_ms 500, trigger_timeout_ms 15000) through the
# service's consumer socket, and a second perfetto CLI sends `activate_triggers: "boom"` on
# web-2's agent's producer socket once both hosts' data flows, as on a host with traced. The
# first CLI must exit 0 with a trace, well before the trigger timeout, holding the trigger
# packet (producer perfetto_cmd_producer, on web-2) and data of both hosts up to ~0.5 s after
# the trigger. Then CLONE_SNAPSHOT: two triggers make the CLI clone the live session into
# OUT.0 and OUT.1, each holding both hosts' data. And `perfetto --clone-by-name` of a live
# session gives both hosts' data while the session goes on.
# Usage: test_perfetto_triggers.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
PERFETTO=${TR_PERFETTO:-}
if [ -z "$PERFETTO" ] || [ ! -x "$PERFETTO" ]; then
  echo "SKIP: TR_PERFETTO does not name a perfetto CLI"
  exit 77
fi
source "$TR_SRC/tools/cluster-lib.sh"
export TR_NO_NETNS=1
fail() { echo "FAIL: $*"; exit 1; }
cluster_init "$1"
cluster_hosts web-1 web-2
cluster_start_service
for h in web-1 web-2; do
  cluster_start_agent "$h"
  cluster_start_loadgen "$h" --name "app-$h" --rate 1000
done
cluster_wait_hosts 30 web-1:1 web-2:1 || fail "the loadgens did not connect"
# host_packets TRACE HOST: how many of HOST's packets TRACE holds.
host_packets() {
  "$TR_BIN/tracerelay" inspect --json "$1" | python3 -c '
import json, sys
print(sum(h["packets"] for h in json.load(sys.stdin)["hosts"] if h["name"] == sys.argv[1]))' "$2"
}

cat >"$WORK/flight.cfg" <<'CFG'
buffers { size_kb: 32768 fill_policy: RING_BUFFER }
data_sources { config { name: "track_event" } }
trigger_config { trigger_mode: STOP_TRACING triggers { name: "boom" stop_delay_ms: 500 } trigger_timeout_ms: 15000 }
CFG
echo 'activate_triggers: "boom"' >"$WORK/trigger.cfg"
start=$(date +%s%N)
PERFETTO_CONSUMER_SOCK_NAME=$CONSUMER_SOCK "$PERFETTO" --txt -c "$WORK/flight.cfg" \
  -o "$WORK/flight.pftrace" >"$WORK/cli.log" 2>&1 &
CLI_PID=$!
cluster_wait_session 30 web-1 web-2 || fail "the CLI's session did not run on both hosts"
PERFETTO_PRODUCER_SOCK_NAME=$WORK/web-2/producer.sock "$PERFETTO" --txt -c "$WORK/trigger.cfg" \
  >"$WORK/trigger-cli.log" 2>&1 || fail "perfetto activate_triggers exited $?: $(cat "$WORK/trigger-cli.log")"
wait "$CLI_PID" || fail "the recording CLI exited $?: $(cat "$WORK/cli.log")"
elapsed=$((($(date +%s%N) - start) / 1000000))
[ "$elapsed" -lt 14000 ] || fail "the CLI took ${elapsed} ms: the trigger did not stop the session"
[ -s "$WORK/flight.pftrace" ] || fail "the CLI wrote no trace: $(cat "$WORK/cli.log")"
python3 "$TR_SRC/tests/integration/trigger_packets.py" "$WORK/flight.pftrace" >"$WORK/triggers"
read -r trig_ts name producer _ delay <"$WORK/triggers" || fail "no trigger packet"
[ "$name $producer $delay" = "boom web-2/perfetto_cmd_producer 500" ] ||
  fail "the trigger packet is '$(cat "$WORK/triggers")'"
for h in web-1 web-2; do
  read -r first last n < <("$TR_BIN/tracerelay" inspect --json "$WORK/flight.pftrace" | python3 -c '
import json, sys
h = [h for h in json.load(sys.stdin)["hosts"] if h["name"] == sys.argv[1]][0]
print(h["first_ts"], h["last_ts"], h["packets"])' "$h")
  [ "$n" -gt 100 ] || fail "$h has $n packets"
  [ "$last" -ge $((trig_ts + 400000000)) ] || fail "$h ends $(((last - trig_ts) / 1000000)) ms after the trigger"
  echo "$h: $n packets, up to $(((last - trig_ts) / 1000000)) ms after the trigger"
done
echo "STOP_TRACING: the CLI stopped ${elapsed} ms after it started, $(stat -c %s "$WORK/flight.pftrace") bytes"

# CLONE_SNAPSHOT: each trigger makes the CLI clone the live session into OUT.N; the session
# goes on until trigger_timeout_ms.
for h in web-1 web-2; do cluster_start_loadgen "$h" --name "snap-$h" --rate 1000; done
cat >"$WORK/snap.cfg" <<'CFG'
buffers { size_kb: 32768 fill_policy: RING_BUFFER }
data_sources { config { name: "track_event" } }
trigger_config { trigger_mode: CLONE_SNAPSHOT triggers { name: "snap" stop_delay_ms: 100 } trigger_timeout_ms: 10000 }
CFG
echo 'activate_triggers: "snap"' >"$WORK/snap-trigger.cfg"
PERFETTO_CONSUMER_SOCK_NAME=$CONSUMER_SOCK "$PERFETTO" --txt -c "$WORK/snap.cfg" \
  -o "$WORK/snap.pftrace" >"$WORK/snap-cli.log" 2>&1 &
CLI_PID=$!
cluster_wait_session 30 web-1 web-2 || fail "the CLONE_SNAPSHOT session did not run on both hosts"
for n in 0 1; do
  PERFETTO_PRODUCER_SOCK_NAME=$WORK/web-1/producer.sock "$PERFETTO" --txt -c "$WORK/snap-trigger.cfg" \
    >>"$WORK/snap-trigger.log" 2>&1 || fail "activate_triggers snap exited $?"
  for _ in $(seq 300); do [ -s "$WORK/snap.pftrace.$n" ] && break; sleep 0.1; done
  [ -s "$WORK/snap.pftrace.$n" ] || fail "no snapshot $n: $(cat "$WORK/snap-cli.log")"
done
wait "$CLI_PID" || fail "the CLONE_SNAPSHOT CLI exited $?: $(cat "$WORK/snap-cli.log")"
for n in 0 1; do
  for h in web-1 web-2; do
    c=$(host_packets "$WORK/snap.pftrace.$n" "$h")
    [ "$c" -gt 100 ] || fail "snapshot $n holds $c packets of $h"
  done
  echo "CLONE_SNAPSHOT: snapshot $n: $(stat -c %s "$WORK/snap.pftrace.$n") bytes, both hosts"
done

# `perfetto --clone-by-name` of a live session: a snapshot while the session goes on.
for h in web-1 web-2; do cluster_start_loadgen "$h" --name "live-$h" --rate 1000; done
cat >"$WORK/live.cfg" <<'CFG'
buffers { size_kb: 32768 fill_policy: RING_BUFFER }
data_sources { config { name: "track_event" } }
duration_ms: 60000
unique_session_name: "live"
CFG
PERFETTO_CONSUMER_SOCK_NAME=$CONSUMER_SOCK "$PERFETTO" --txt -c "$WORK/live.cfg" \
  -o "$WORK/live.pftrace" >"$WORK/live-cli.log" 2>&1 &
CLI_PID=$!
cluster_wait_session 30 web-1 web-2 || fail "the live session did not run on both hosts"
PERFETTO_CONSUMER_SOCK_NAME=$CONSUMER_SOCK "$PERFETTO" --clone-by-name live -o "$WORK/clone.pftrace" \
  >"$WORK/clone-cli.log" 2>&1 || fail "perfetto --clone-by-name exited $?: $(cat "$WORK/clone-cli.log")"
kill -0 "$CLI_PID" || fail "the live session's CLI ended with the clone"
for h in web-1 web-2; do
  c=$(host_packets "$WORK/clone.pftrace" "$h")
  [ "$c" -gt 100 ] || fail "the clone holds $c packets of $h"
done
kill -INT "$CLI_PID"
wait "$CLI_PID" || fail "the live session's CLI exited $? after SIGINT: $(cat "$WORK/live-cli.log")"
[ -s "$WORK/live.pftrace" ] || fail "the live session wrote no trace after its clone"
echo "perfetto --clone-by-name: $(stat -c %s "$WORK/clone.pftrace") bytes while the session went on"
echo PASS
