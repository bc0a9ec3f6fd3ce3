#!/usr/bin/env bash
# test_demo.sh: what a newcomer's first commands leave behind (issue 27). tools/demo.sh (its
# install skipped, built into this build tree) leaves the source tree as it found it (`git
# status` unchanged) and the build tree's configuration as it was, writes its trace outside it
# and says where; and cluster-lib, which every cluster test uses, removes its run directory
# after a pass or a skip and keeps it after a failure, saying where.
# Usage: test_demo.sh BUILD_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$1" && pwd)
log="" run=""
fail() { echo "FAIL: $*"; [ -z "$log$run" ] || echo "the demo's output and files are kept: $log $run"; exit 1; }

# cluster-lib's run directory after exit 0, 77 and 1.
for rc in 0 77 1; do
  out=$(TR_NO_NETNS=1 bash -c 'source "$1/tools/cluster-lib.sh"; cluster_init "$2/bin"
                              echo "WORK=$WORK"; exit "$3"' _ "$TR_SRC" "$BUILD" "$rc" 2>&1) || true
  work=$(sed -n 's/^WORK=//p' <<<"$out")
  [ -n "$work" ] || fail "no work dir: $out"
  if [ "$rc" = 1 ]; then
    [ -d "$work" ] || fail "a failed run's files were removed"
    grep -q "failed (exit 1): this run's files are kept in $work" <<<"$out" ||
      fail "a failed run does not say where its files are: $out"
    rm -rf "$work"
  else
    [ ! -e "$work" ] || { rm -rf "$work"; fail "exit $rc left $work behind"; }
  fi
done
echo "ok: cluster-lib removes its files after exit 0 and 77, keeps and names them after exit 1"

# The demo, 3 s of recording.
git_state() { git -C "$TR_SRC" status --porcelain --ignored=no 2>/dev/null || true; }
build_type() { grep '^CMAKE_BUILD_TYPE:' "$BUILD/CMakeCache.txt" || true; }
before=$(git_state) type_before=$(build_type)
log=$(mktemp /tmp/tracerelay-demo-test.XXXXXX)
TR_SKIP_INSTALL=1 TR_BUILD_DIR=$BUILD bash "$TR_SRC/tools/demo.sh" --seconds 3 >"$log" 2>&1 ||
  fail "the demo exited $?"
trace=$(sed -n 's/^The trace is at //p' "$log")
run=$(sed -n 's/^Logs of this run: \([^ ]*\).*/\1/p' "$log")
[ -n "$trace" ] && [ -s "$trace" ] || fail "the demo's closing lines name no trace: $log"
case "$trace" in "$TR_SRC"/*) fail "the demo wrote its trace into the source tree: $trace" ;; esac
[ "$(git_state)" = "$before" ] || fail "the demo changed git status: $(git_state)"
[ "$(build_type)" = "$type_before" ] ||
  fail "the demo reconfigured this build tree: $type_before became $(build_type)"
rm -rf "$run" "$log"
echo "ok: the demo wrote $trace (outside the tree), git status unchanged"
echo "PASS: test_demo"
