#!/usr/bin/env bash
# test_startup_errors.sh: mistakes an operator makes at start are refused at once with a message
# that names the file, line or flag and the fix (issue 13), not found later at the first
# connection: the service given an agent's certificate (clientAuth only); a certificate file
# that does not exist; a bad value in a config file (its file and line); an out-of-range port
# (exit 2, as any bad flag); a warning for an agent certificate that is not valid yet; an
# open-file limit too low for --max-agents (issue 14), and the descriptor table sized for it at
# start; an agent past --max-agents refused
# with a Goodbye that names the limit; --max-handshakes-per-source and --max-waiting-per-source
# out of range refused, and honoured by a root and a regional; a producer past the agent's
# --max-producers refused with a log line that names it; and a regional's flags misused (tiers).
# Usage: test_startup_errors.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$(cd "$1" && pwd)
source "$TR_SRC/tools/cluster-lib.sh" # cluster_on_exit: stops CLUSTER_PIDS, then cluster_finish
W=$(mktemp -d /tmp/tracerelay-startup.XXXXXX)
CLUSTER_RUN_DIR=$W # removed after a pass, kept after a failure
trap cluster_on_exit EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$TR_SRC/certs/make-certs.sh" "$W/pki" --service-name svc --agent web-1 >/dev/null
"$TR_SRC/certs/make-certs.sh" "$W/pki" --agent later --not-yet-valid >/dev/null
P=$W/pki
# expect EXIT PATTERN CMD...: CMD (bounded to 5 s) exits EXIT with PATTERN in its output.
expect() {
  local want=$1 pattern=$2 rc=0; shift 2
  timeout 5 "$@" >"$W/out" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || fail "$* exited $rc, not $want: $(cat "$W/out")"
  grep -q -- "$pattern" "$W/out" || fail "$*: no '$pattern' in: $(cat "$W/out")"
  echo "ok: $(basename "$1") -> $(head -c 160 "$W/out" | tr '\n' ' ')"
}
svc=(--consumer-socket "$W/c.sock" --ca "$P/ca.crt")
agent=(--producer-socket "$W/p.sock" --ca "$P/ca.crt")
expect 1 "not a service certificate" "$BIN/tracerelay-service" --listen 127.0.0.1:0 "${svc[@]}" \
  --cert "$P/agent-web-1.crt" --key "$P/agent-web-1.key"
expect 1 "nope.crt: No such file or directory" "$BIN/tracerelay-agent" --service 127.0.0.1:9 \
  "${agent[@]}" --cert "$P/nope.crt" --key "$P/agent-web-1.key"
printf '# agent\nservice = 127.0.0.1:9\nqueue-mb = lots\n' >"$W/agent.conf"
expect 2 "in config file $W/agent.conf, line 3" "$BIN/tracerelay-agent" --config "$W/agent.conf" \
  "${agent[@]}" --cert "$P/agent-web-1.crt" --key "$P/agent-web-1.key"
expect 2 "invalid value 'localhost:99999' for --service" "$BIN/tracerelay-agent" \
  --service localhost:99999 "${agent[@]}" --cert "$P/agent-web-1.crt" --key "$P/agent-web-1.key"
expect 2 "invalid value '0.0.0.0:70000' for --listen" "$BIN/tracerelay-service" \
  --listen 0.0.0.0:70000 "${svc[@]}" --cert "$P/service.crt" --key "$P/service.key"
# A misspelled flag and a flag without its value: one line each, naming the flag (issue 27:
# getopt's own message came before ours).
expect_one_line() {
  expect 2 "$@"
  [ "$(wc -l <"$W/out")" = 1 ] || fail "$*: not one line: $(cat "$W/out")"
}
expect_one_line "^tracerelay-service: unknown option '--listne' (see --help)$" \
  "$BIN/tracerelay-service" --listne 127.0.0.1:0 "${svc[@]}"
expect_one_line "^tracerelay-agent: option '--service' needs a value (see --help)$" \
  "$BIN/tracerelay-agent" "${agent[@]}" --service
# Tiers: a malformed --relay-allow rule, a regional without its own certificate, and a
# regional's flag without --upstream are refused with the fix.
expect 2 "invalid value 'eu-\*' for --relay-allow" "$BIN/tracerelay-service" --relay-allow 'eu-*' \
  "${svc[@]}" --cert "$P/service.crt" --key "$P/service.key"
expect 2 "needs --upstream-cert and --upstream-key" "$BIN/tracerelay-service" \
  --upstream 127.0.0.1:9 "${svc[@]}" --cert "$P/service.crt" --key "$P/service.key"
expect 2 "give --upstream" "$BIN/tracerelay-service" --upstream-cert "$P/agent-web-1.crt" \
  "${svc[@]}" --cert "$P/service.crt" --key "$P/service.key"
expect 1 "upstream TLS setup failed" "$BIN/tracerelay-service" --listen 127.0.0.1:0 \
  --upstream 127.0.0.1:9 --upstream-cert "$P/service.crt" --upstream-key "$P/service.key" \
  "${svc[@]}" --cert "$P/service.crt" --key "$P/service.key"
# Not valid yet: the agent starts (its link retries), but says so at once; stopped by timeout.
expect 124 "is not valid yet" "$BIN/tracerelay-agent" --service 127.0.0.1:9 "${agent[@]}" \
  --cert "$P/agent-later.crt" --key "$P/agent-later.key"
# No service at --service: the agent says once what failed and when it tries again (issue 27:
# the address came twice, and not that it retries). Stopped once it has tried twice.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN/tracerelay-agent" --service "127.0.0.1:$port" --service-name svc "${agent[@]}" \
  --cert "$P/agent-web-1.crt" --key "$P/agent-web-1.key" >"$W/retry.log" 2>&1 &
AGENT=$!
CLUSTER_PIDS+=("$AGENT")
for _ in $(seq 100); do [ "$(grep -c "trying again" "$W/retry.log")" -ge 2 ] && break; sleep 0.1; done
kill $AGENT; wait $AGENT || true
line=$(grep -m1 "cannot connect" "$W/retry.log") || fail "no connect failure logged: $(cat "$W/retry.log")"
[[ "$line" =~ msg=\"cannot\ connect\ to\ 127\.0\.0\.1:$port:\ connection\ refused\;\ trying\ again\ in\ [0-9]+\.[0-9]\ s\"$ ]] ||
  fail "the agent's connect failure does not read once and true: $line"
echo "ok: tracerelay-agent -> $line"
# --max-agents 2000 under an open-file limit of 512 (soft and hard): refused at start.
expect 1 "max-agents 2000 needs about 2256 open files" bash -c 'ulimit -n 512 && exec "$@"' _ \
  "$BIN/tracerelay-service" --listen 127.0.0.1:0 "${svc[@]}" --cert "$P/service.crt" \
  --key "$P/service.key" --max-agents 2000
# --max-agents 1: the second agent is refused, and its log says why.
"$TR_SRC/certs/make-certs.sh" "$W/pki" --agent web-2 >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN/tracerelay-service" --listen "127.0.0.1:$port" "${svc[@]}" --cert "$P/service.crt" \
  --key "$P/service.key" --max-agents 1 >"$W/svc.log" 2>&1 &
svc_pid=$!
CLUSTER_PIDS+=("$svc_pid")
wait_line() { # wait_line REGEX FILE: up to 30 s
  for _ in $(seq 300); do grep -q "$1" "$2" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
# Its descriptor table sized at start for --max-agents and the reserve (257 descriptors: a
# table of 512), not grown by the accepts, each growth an RCU wait on the loop (issue 25).
wait_line "listening" "$W/svc.log" || fail "the service did not start: $(cat "$W/svc.log")"
fdsize=$(awk '/^FDSize:/ {print $2}' "/proc/$svc_pid/status")
[ "$fdsize" -ge 257 ] || fail "descriptor table of $fdsize at start, not sized for --max-agents"
echo "ok: the descriptor table is sized at start ($fdsize)"
# web-1 first (once it is in), then web-2, which must be refused.
for h in web-1 web-2; do
  "$BIN/tracerelay-agent" --service "127.0.0.1:$port" --service-name svc --ca "$P/ca.crt" \
    --producer-socket "$W/$h.sock" --cert "$P/agent-$h.crt" --key "$P/agent-$h.key" \
    >"$W/agent-$h.log" 2>&1 &
  [ $h = web-2 ] || wait_line "host web-1 connected" "$W/svc.log" || fail "web-1 did not connect"
done
wait_line "host web-2 refused" "$W/svc.log" || true
wait_line "host web-2 refused" "$W/agent-web-2.log" || true
kill $(jobs -p) 2>/dev/null || true
wait 2>/dev/null || true
grep -q "already serves 1 agents, its --max-agents; host web-2 refused" "$W/agent-web-2.log" ||
  fail "the second agent was not told why: $(cat "$W/agent-web-2.log")"
grep -q "host web-2 refused: 1 agents are connected" "$W/svc.log" ||
  fail "the service did not log the refusal: $(cat "$W/svc.log")"
echo "ok: --max-agents 1 refuses the second agent by name"
# --max-handshakes-per-source and --max-waiting-per-source: out of range refused with the range
# (the service runs 32 handshakes and keeps 4096 waiting in all), from a config file by line.
expect 2 "invalid value '0' for --max-handshakes-per-source: give a number of handshakes from 1 to 32" \
  "$BIN/tracerelay-service" --max-handshakes-per-source 0 "${svc[@]}" --cert "$P/service.crt" \
  --key "$P/service.key"
expect 2 "invalid value '33' for --max-handshakes-per-source" "$BIN/tracerelay-service" \
  --max-handshakes-per-source 33 "${svc[@]}" --cert "$P/service.crt" --key "$P/service.key"
expect 2 "invalid value '4097' for --max-waiting-per-source: give a number of connections from 1 to 4096" \
  "$BIN/tracerelay-service" --max-waiting-per-source 4097 "${svc[@]}" --cert "$P/service.crt" \
  --key "$P/service.key"
printf 'max-handshakes-per-source = 2\nmax-waiting-per-source = many\n' >"$W/bad-source.conf"
expect 2 "for --max-waiting-per-source.* in config file $W/bad-source.conf, line 2" \
  "$BIN/tracerelay-service" --config "$W/bad-source.conf" "${svc[@]}" --cert "$P/service.crt" \
  --key "$P/service.key"
# Both limits at 1, from a config file: a root, and a regional for its agents, run one
# handshake and keep one connection waiting from one address, and refuse its third connection
# at once, saying so (at the defaults it would be the 133rd). The three say nothing, so the
# first holds its handshake (60 s deadline) and the second waits.
printf 'max-handshakes-per-source = 1\nmax-waiting-per-source = 1\n' >"$W/source.conf"
third_refused() { # third_refused NAME FLAGS...
  local name=$1 port; shift
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$BIN/tracerelay-service" --listen "127.0.0.1:$port" --config "$W/source.conf" \
    --handshake-timeout-ms 60000 "$@" >"$W/$name.log" 2>&1 &
  local pid=$!
  CLUSTER_PIDS+=("$pid")
  wait_line "listening for agents on 127.0.0.1:$port" "$W/$name.log" ||
    fail "the $name did not start: $(cat "$W/$name.log")"
  bash -c "exec 3<>/dev/tcp/127.0.0.1/$port 4<>/dev/tcp/127.0.0.1/$port \
    5<>/dev/tcp/127.0.0.1/$port; exec sleep 60" &
  local holder=$!
  CLUSTER_PIDS+=("$holder")
  wait_line "127.0.0.1:[0-9]* holds 1 TLS handshakes and 1 connections waiting, the most one address may" \
    "$W/$name.log" || fail "the $name did not refuse the third connection: $(cat "$W/$name.log")"
  kill "$holder" "$pid"
  wait "$holder" "$pid" 2>/dev/null || true
  echo "ok: the $name refuses one address's third connection with both limits at 1"
}
third_refused root "${svc[@]}" --cert "$P/service.crt" --key "$P/service.key"
third_refused regional "${svc[@]}" --cert "$P/service.crt" --key "$P/service.key" \
  --upstream 127.0.0.1:9 --upstream-cert "$P/agent-web-1.crt" --upstream-key "$P/agent-web-1.key" \
  --producer-socket "$W/regional-producer.sock"
# --max-producers 1: the agent refuses a second producer and its log names the flag (no
# service needed: producers connect to the agent whether its link is up or not).
"$BIN/tracerelay-agent" --service "127.0.0.1:9" --service-name svc --ca "$P/ca.crt" \
  --producer-socket "$W/mp.sock" --cert "$P/agent-web-1.crt" --key "$P/agent-web-1.key" \
  --max-producers 1 >"$W/agent-mp.log" 2>&1 &
AGENT=$!
CLUSTER_PIDS+=("$AGENT")
for _ in $(seq 50); do [ -S "$W/mp.sock" ] && break; sleep 0.1; done
"$BIN/tracerelay-loadgen" --socket "$W/mp.sock" --name first >"$W/lg1.log" 2>&1 &
LG1=$!
wait_line "connected: first" "$W/agent-mp.log" || fail "the first producer did not connect"
rc=0
timeout 5 "$BIN/tracerelay-loadgen" --socket "$W/mp.sock" --name second >"$W/lg2.log" 2>&1 || rc=$?
kill $LG1 $AGENT 2>/dev/null || true
wait 2>/dev/null || true
[ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "the second producer was not refused (rc $rc)"
grep -q "refused a connection from pid [0-9]* (uid [0-9]*): it serves at most 1 connections at once (--max-producers)" \
  "$W/agent-mp.log" || fail "the agent did not log the refusal by name: $(cat "$W/agent-mp.log")"
echo "ok: --max-producers 1 refuses the second producer, naming the flag"
echo "PASS: test_startup_errors"
