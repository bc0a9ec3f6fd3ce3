#!/usr/bin/env bash
# test_upgrade.sh: a fleet upgraded without a stop. The previous release (RELEASES; built from
# this repository's history by tools/build-release.sh, cached under CACHE_DIR) runs beside this
# tree in two clusters (tools/cluster-lib.sh, CLUSTER_BIN_OF / CLUSTER_SERVICE_BIN):
#   1. a new root: an old agent and a new one on it directly, an old regional relaying two new
#      agents (the middle tier upgraded last), a new regional relaying an old agent and a new
#      one (the edge upgraded last);
#   2. an old root: an old agent and a new one on it directly, a new regional relaying an old
#      agent and a new one (the regionals upgraded first).
# Every host (and each regional's own, with a loadgen on its producer socket) records through
# the root with `tracerelay record` (this tree's). Asserted, per cluster:
#  - every host's data complete: each host's loadgens' packets exactly in the trace, no loss
#    counted (fault_check_accounting lossless);
#  - the features the older side lacks are not used: FEATURE_TRIGGERS (0x100) is in the set the
#    root logs for a host ("host H connected ... features 0x..") and the agent logs ("connected
#    to ... (features 0x..") exactly when the agent, every regional on its way and the root are
#    all new, and a new root logs why a new agent behind an old regional goes without it;
#  - each new agent's loadgen activates a trigger: where the feature was negotiated the agent
#    sends it ("sent to the service"), elsewhere it logs it lost with the reason (the service,
#    or a regional on the way, does not take triggers: upgrade it); no agent's link is cut for
#    it (each connects once) and no process logs a protocol error or a refusal (no combination
#    of 0.2.0 and this tree is refused).
# (Before link_server.c withheld TR_RELAY_FEATURES_CARRIED from hosts behind a carrier that did
# not offer them, an old regional passed FEATURE_TRIGGERS on and closed each new agent's link at
# its first trigger: "a frame of 36 bytes does not decode to a known message".)
# The release's first build is part of the test's time (about 30 s on 2 CPUs), later runs reuse it.
# Exit 77 (skip) when the history does not hold the release (a shallow clone).
# Usage: test_upgrade.sh BIN_DIR CACHE_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$(cd "$1" && pwd)
CACHE=$2
source "$TR_SRC/tools/cluster-lib.sh"
source "$TR_SRC/tests/integration/fault-lib.sh"
TRIGGERS=0x100 # 1 << FEATURE_TRIGGERS (relay.proto)

rc=0
OLD=$("$TR_SRC/tools/build-release.sh" "$TR_SRC" "$CACHE" | tail -n 1) || rc=$?
[ "$rc" != 77 ] || { echo "SKIP: the previous release cannot be built here (above)"; exit 77; }
[ "$rc" = 0 ] || { echo "FAIL: the previous release did not build"; exit 1; }
OLD_VERSION=$("$OLD/tracerelay-service" --version)
NEW_VERSION=$("$BIN/tracerelay-service" --version)
echo "old: $OLD_VERSION ($OLD), new: $NEW_VERSION"
[ "$OLD_VERSION" != "$NEW_VERSION" ] || { echo "FAIL: both builds say $NEW_VERSION"; exit 1; }

BASE=$(mktemp -d /tmp/tracerelay-upgrade.XXXXXX)
CLUSTER_RUN_DIR=$BASE # removed after a pass, kept after a failure (cluster_finish)
STATUS=0
fail() { echo "FAIL: $*"; STATUS=1; }

# has_triggers LOG PATTERN: the features of LOG's first line matching PATTERN (a "features
# 0x..." line) hold FEATURE_TRIGGERS; 2 when no line matches.
has_triggers() {
  local f
  f=$(grep -m1 -E "$2" "$1" | sed -n 's/.*features \(0x[0-9a-f]*\|0\).*/\1/p')
  [ -n "$f" ] || return 2
  (((f & TRIGGERS) != 0))
}

is_regional() { regional_index "$1" >/dev/null; }

# phase NAME ROOT_BIN TREE DIRECT OLD: one cluster. TREE: REGIONAL=HOST,... specs (cluster_tree)
# separated by spaces; DIRECT: the root's own hosts; OLD: the hosts and regionals that run the
# old release (the others run this tree's); ROOT_BIN: the root's bin dir ("": this tree's).
phase() {
  local name=$1 root_bin=$2 tree=$3 direct=$4 old=$5 h r
  CLUSTER_SERVICE_VIA=() CLUSTER_BIN_OF=() LOADGEN_SEQ=0
  cluster_init "$BIN" "$BASE/$name"
  trap fault_cleanup EXIT
  CLUSTER_SERVICE_BIN=$root_bin
  # shellcheck disable=SC2086 # specs and host names: no spaces
  cluster_tree $tree
  # shellcheck disable=SC2086
  cluster_tree_direct $direct
  for h in $old; do CLUSTER_BIN_OF[$h]=$OLD; done
  local allow=()
  for h in "${!CLUSTER_REGIONAL_OF[@]}"; do
    allow+=(--relay-allow "${CLUSTER_REGIONAL_OF[$h]}=$h")
  done
  cluster_start_service "${allow[@]}" || { fail "$name: the root did not start"; exit 1; }
  for r in "${CLUSTER_REGIONALS[@]}"; do
    cluster_start_regional "$r" || { fail "$name: regional $r did not start"; exit 1; }
  done
  local hosts=() new=()
  for h in "${CLUSTER_HOSTS[@]}"; do
    hosts+=("$h")
    if is_regional "$h"; then # its own host: a loadgen on its producer socket
      cluster_start_loadgen "$h" --name "app-$h" --writers 2 --rate 2000 --packets 1000 \
        --packet-size 200
      continue
    fi
    cluster_start_agent "$h" || { fail "$name: agent $h did not start"; exit 1; }
    # Old loadgens have no --trigger; each new agent's loadgen activates one.
    if [ -z "${CLUSTER_BIN_OF[$h]:-}" ]; then
      new+=("$h")
      cluster_start_loadgen "$h" --name "app-$h" --writers 2 --rate 2000 --packets 1000 \
        --packet-size 200 --trigger upgrade-probe --trigger-after 300
    else
      cluster_start_loadgen "$h" --name "app-$h" --writers 2 --rate 2000 --packets 1000 \
        --packet-size 200
    fi
  done
  local specs=()
  for h in "${hosts[@]}"; do specs+=("$h:1"); done
  cluster_wait_hosts 30 "${specs[@]}" || { fail "$name: not every host connected"; exit 1; }

  "$TR_BIN/tracerelay" record --socket "$CONSUMER_SOCK" --data-source track_event -b 32mb -t 0 \
    -o "$WORK/trace.pftrace" >"$WORK/record.log" 2>&1 &
  local record=$!
  CLUSTER_PIDS+=("$record")
  cluster_wait_session 60 "${hosts[@]}" || { fail "$name: not every host in the session"; exit 1; }
  # The session lasts until each new agent has handled its loadgen's trigger.
  for h in "${new[@]}"; do
    for _ in $(seq 300); do
      grep -q 'trigger "upgrade-probe" of producer' "$WORK/agent-$h.log" && break
      sleep 0.1
    done
  done
  kill -TERM "$record"
  wait "$record" || { fail "$name: record exited $?: $(tail -n 5 "$WORK/record.log")"; exit 1; }
  local lg
  for lg in "${CLUSTER_PIDS[@]}"; do
    [ "${CLUSTER_STOP_STEP[$lg]:-}" = 0 ] || continue
    fault_wait_pid "$lg" 20 || fail "$name: loadgen $lg still runs 20 s after the session"
  done

  fault_check_accounting "$WORK/trace.pftrace" lossless "${hosts[@]}" ||
    fail "$name: a host's data is not complete"

  # The negotiated features, and each new agent's trigger.
  local root_new=0 via want log
  [ "$root_bin" != "$OLD" ] && root_new=1
  for h in "${hosts[@]}"; do
    is_regional "$h" && log="$WORK/$h.log" || log="$WORK/agent-$h.log"
    via=${CLUSTER_REGIONAL_OF[$h]:-}
    want=1
    [ -n "${CLUSTER_BIN_OF[$h]:-}" ] && want=0
    [ "$root_new" = 1 ] || want=0
    [ -n "$via" ] && [ -n "${CLUSTER_BIN_OF[$via]:-}" ] && want=0
    local at_root=0 at_agent=0
    has_triggers "$WORK/service.log" "host $h connected from" && at_root=1 || [ $? = 1 ] ||
      fail "$name: the root logged no features for $h"
    has_triggers "$log" "connected to .* as $h " && at_agent=1 || [ $? = 1 ] ||
      fail "$name: $h's agent logged no features"
    local kind=new
    [ -n "${CLUSTER_BIN_OF[$h]:-}" ] && kind=old
    echo "$name: $h ($kind agent${via:+, via $via})" \
      "triggers negotiated: root says $at_root, agent says $at_agent, want $want"
    if [ "$at_root" != "$want" ] || [ "$at_agent" != "$want" ]; then
      fail "$name: $h: FEATURE_TRIGGERS negotiated root=$at_root agent=$at_agent, want $want"
    fi
    # A new root says why a new agent behind an old regional goes without.
    if [ "$root_new" = 1 ] && [ -n "$via" ] && [ -n "${CLUSTER_BIN_OF[$via]:-}" ] &&
       [ -z "${CLUSTER_BIN_OF[$h]:-}" ]; then
      grep -q "host $h: its regional $via does not pass on features $TRIGGERS" \
        "$WORK/service.log" ||
        fail "$name: the root did not log why $h goes without triggers"
    fi
    is_regional "$h" && continue
    local n
    n=$(grep -c "connected to .* as $h " "$log" || true)
    [ "$n" = 1 ] || fail "$name: $h's agent connected $n times, not once"
    [ -n "${CLUSTER_BIN_OF[$h]:-}" ] && continue
    if [ "$want" = 1 ]; then
      grep -q "trigger \"upgrade-probe\" of producer app-$h sent to the service" "$log" ||
        fail "$name: $h's trigger was not sent: $(grep trigger "$log")"
    else
      grep -Eq "\"upgrade-probe\" of producer app-$h is lost: .*does not take triggers.*upgrade" \
        "$log" ||
        fail "$name: $h's trigger is not logged lost with its reason: $(grep trigger "$log")"
    fi
  done
  local f bad="protocol error|does not decode|without the feature|refus|not authorized"
  bad+="|upgrade it first"
  for f in "$WORK"/*.log; do
    ! grep -Eiq "$bad" "$f" || fail "$name: $(basename "$f"): $(grep -Eim3 "$bad" "$f")"
    ! grep -Eq "ERROR: (Address|Leak)Sanitizer|runtime error:" "$f" ||
      fail "$name: sanitizer report in $(basename "$f")"
  done
  cluster_cleanup
}

phase new-root "" "regional-old=ro-new-1,ro-new-2 regional-new=rn-old-1,rn-new-1" \
  "a-old a-new" "regional-old rn-old-1 a-old"
phase old-root "$OLD" "regional-new=rn-old-1,rn-new-1" "b-old b-new" "rn-old-1 b-old"
[ "$STATUS" = 0 ] || exit 1
echo "PASS: test_upgrade ($OLD_VERSION beside $NEW_VERSION)"
