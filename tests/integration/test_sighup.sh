#!/usr/bin/env bash
# test_sighup.sh: both daemons from config files (docs/configuration.md), the service's SIGHUP
# and SIGTERM. On loopback:
#  - service and agent read their flags from --config files; a flag on the command line
#    overrides the file's;
#  - while a session records from web-1, the service's certificate is replaced by a new one
#    from the same CA, issued for ANOTHER name, and the config file pointed at it; SIGHUP;
#    a new agent (web-2) that accepts only the new name connects, and the running session
#    goes on: web-1 never disconnected and both hosts are in the trace;
#  - a SIGHUP with a config file naming a missing certificate is logged and changes nothing;
#  - the agent's SIGHUP reloads its certificates without dropping its link;
#  - SIGTERM during a session: the consumer gets an error saying the service is shutting
#    down, and the service exits 0.
# Usage: test_sighup.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
export TR_NO_NETNS=1
SERVICE_PORT=$((20000 + RANDOM % 20000))
source "$TR_SRC/tools/cluster-lib.sh"
cluster_init "$1"
cluster_hosts web-1 web-2
fail() { echo "FAIL: $*"; for f in "$WORK"/*.log; do echo "== $f"; tail -20 "$f"; done; exit 1; }
ST="$TR_BIN/tracerelay status --socket $CONSUMER_SOCK"

# A second service certificate from the same CA, for another name.
mkdir -p "$WORK/pki2"
cp "$WORK/pki/ca.crt" "$WORK/pki/ca.key" "$WORK/pki2/"
"$TR_SRC/certs/make-certs.sh" "$WORK/pki2" --service-name relay-renewed >/dev/null
cmp -s "$WORK/pki/ca.crt" "$WORK/pki2/ca.crt" || fail "make-certs did not reuse the CA"

write_service_conf() { # write_service_conf PKI_DIR
  cat >"$WORK/service.conf" <<EOF
# tracerelay-service, test configuration
listen = 127.0.0.1:$SERVICE_PORT
consumer-socket = $CONSUMER_SOCK
ca = $WORK/pki/ca.crt
cert = "$1/service.crt"
key = $1/service.key
log-level = error
EOF
}
write_service_conf "$WORK/pki"
# --log-level on the command line overrides the file's "error": the info lines must appear.
"$TR_BIN/tracerelay-service" --config "$WORK/service.conf" --log-level info \
  >>"$WORK/service.log" 2>&1 &
SERVICE_PID=$!
CLUSTER_PIDS+=("$SERVICE_PID")
wait_for_socket "$CONSUMER_SOCK" "$SERVICE_PID"
grep -q "listening for agents on 127.0.0.1:$SERVICE_PORT" "$WORK/service.log" ||
  fail "the service did not log its listen address at info level"

mkdir -p "$WORK/web-1"
cat >"$WORK/agent-web-1.conf" <<EOF
service = 127.0.0.1:$SERVICE_PORT
service-name = $SERVICE_NAME
producer-socket = $WORK/web-1/producer.sock
ca = $WORK/pki/ca.crt
cert = $WORK/pki/agent-web-1.crt
key = $WORK/pki/agent-web-1.key
no-compress
EOF
"$TR_BIN/tracerelay-agent" --config "$WORK/agent-web-1.conf" --compress \
  >>"$WORK/agent-web-1.log" 2>&1 &
AGENT1_PID=$!
CLUSTER_PIDS+=("$AGENT1_PID")
wait_for_socket "$WORK/web-1/producer.sock" "$AGENT1_PID"

# Bad config files are refused with the line, exit status 2.
printf 'service = x:1\nbogus-flag = 1\n' >"$WORK/bad.conf"
set +e
"$TR_BIN/tracerelay-agent" --config "$WORK/bad.conf" >"$WORK/bad.out" 2>&1
[ $? = 2 ] && grep -q "line 2: unknown key 'bogus-flag'" "$WORK/bad.out" || fail "bad agent config"
"$TR_BIN/tracerelay-service" --config "$WORK/missing.conf" >"$WORK/bad.out" 2>&1
[ $? = 2 ] && grep -q "cannot read" "$WORK/bad.out" || fail "missing service config"
set -e

cluster_start_loadgen web-1 --name app-web-1 --rate 1000
# The session lasts until the checks below are done (-t 0, SIGTERM after them): on a busy
# machine a fixed length could end it before them.
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 8mb -t 0 \
  -o "$WORK/hup.pftrace" >"$WORK/record.log" 2>&1 &
RECORD_PID=$!
CLUSTER_PIDS+=("$RECORD_PID")

host_field() { # host_field NAME EXPR: a Python expression over host h of `status --json`
  $ST --json 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin)
h = {x["machine_name"]: x for x in s["hosts"]}.get(sys.argv[1])
print(eval(sys.argv[2]) if h else "")' "$1" "$2"
}
wait_until() { # wait_until WHAT NAME EXPR: up to 60 s (a starved machine) for EXPR to print True
  for _ in $(seq 240); do
    [ "$(host_field "$2" "$3")" = True ] && return 0
    sleep 0.25
  done
  fail "$1"
}
wait_log() { # wait_log REGEX FILE: up to 30 s for a line matching REGEX
  for _ in $(seq 300); do grep -q "$1" "$2" && return 0; sleep 0.1; done
  return 1
}
wait_until "web-1 never relayed" web-1 'h["connected"] and h["bytes_relayed"] > 0 and bool(h["sessions"])'
SINCE1=$(host_field web-1 'h["connected_since_unix_ns"]')

# The agent's own SIGHUP: certificates reloaded, link kept.
kill -HUP "$AGENT1_PID"
wait_log "certificates reloaded" "$WORK/agent-web-1.log" || fail "agent SIGHUP not logged"

# Renew the service's certificate: point the config at the new files, SIGHUP.
write_service_conf "$WORK/pki2"
kill -HUP "$SERVICE_PID"
wait_log "certificates reloaded (ca .*pki2/service.crt" "$WORK/service.log" ||
  fail "service SIGHUP not logged"
kill -0 "$SERVICE_PID" || fail "SIGHUP ended the service"

# A new agent that only accepts the new certificate's name gets in.
mkdir -p "$WORK/web-2"
"$TR_BIN/tracerelay-agent" --producer-socket "$WORK/web-2/producer.sock" \
  --service "127.0.0.1:$SERVICE_PORT" --service-name relay-renewed --ca "$WORK/pki/ca.crt" \
  --cert "$WORK/pki/agent-web-2.crt" --key "$WORK/pki/agent-web-2.key" \
  >>"$WORK/agent-web-2.log" 2>&1 &
CLUSTER_PIDS+=($!)
wait_for_socket "$WORK/web-2/producer.sock" "$!"
cluster_start_loadgen web-2 --name app-web-2 --rate 1000
wait_until "web-2 (new service certificate) never connected and relayed" web-2 \
  'h["connected"] and h["bytes_relayed"] > 0 and bool(h["sessions"])'
[ "$(host_field web-1 'h["connected"] and h["disconnects"] == 0 and h["sessions"][0]["state"]')" = STARTED ] ||
  fail "web-1 lost its link or its session across the SIGHUP: $($ST)"
# connected_since is derived from two clocks at each query: equal within a few ms.
[ "$(host_field web-1 "abs(h['connected_since_unix_ns'] - $SINCE1) < 50_000_000")" = True ] ||
  fail "web-1 reconnected"

# A reload that cannot load: logged, nothing changes.
sed -i "s|^key = .*|key = $WORK/nonexistent.key|" "$WORK/service.conf"
kill -HUP "$SERVICE_PID"
wait_log "NOT reloaded" "$WORK/service.log" || fail "a failed reload was not logged"
kill -0 "$SERVICE_PID" || fail "a failed reload ended the service"
printf 'listen = 127.0.0.1:1\nnot a line\n' >"$WORK/service.conf"
kill -HUP "$SERVICE_PID"
wait_log "nothing reloaded" "$WORK/service.log" || fail "a broken config file on SIGHUP was not logged"
$ST >/dev/null || fail "status after the failed reloads"

kill -TERM "$RECORD_PID"
wait "$RECORD_PID" || fail "record across the SIGHUP"
"$TR_BIN/tracerelay" inspect --json "$WORK/hup.pftrace" >"$WORK/inspect.json"
python3 - "$WORK/inspect.json" <<'PY' || fail "trace across the SIGHUP"
import json, sys
r = json.load(open(sys.argv[1]))
names = sorted(m.get("name") for m in r["hosts"] if m.get("name"))
assert "web-1" in names and "web-2" in names, names
print("trace across the SIGHUP holds", names)
PY

# SIGTERM during a session: the consumer is told, the service exits 0.
"$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 8mb -t 60s \
  -o "$WORK/term.pftrace" >"$WORK/record-term.log" 2>&1 &
RECORD_PID=$!
CLUSTER_PIDS+=("$RECORD_PID")
wait_until "the second session never started" web-1 \
  'any(x["state"] == "STARTED" for x in h["sessions"])'
kill -TERM "$SERVICE_PID"
status=0
wait "$SERVICE_PID" || status=$?
[ "$status" = 0 ] || fail "the service exited $status after SIGTERM"
set +e
wait "$RECORD_PID"
rstatus=$?
set -e
[ "$rstatus" != 0 ] || fail "record succeeded although the service shut down"
grep -q "shutting down" "$WORK/record-term.log" || fail "the consumer was not told why: $(cat "$WORK/record-term.log")"
grep -q "stopped" "$WORK/service.log" || fail "the service did not log its stop"
echo "PASS: test_sighup"
