#!/usr/bin/env bash
# valgrind.sh: a memcheck pass over the real-process integration tests. Builds without
# sanitizers in its own directory (build-valgrind, or $TR_BUILD_DIR), then runs the chosen
# shell tests with the service and every agent under valgrind (TR_WRAP, honoured by
# tools/cluster-lib.sh), one log per process, and fails if any log reports a memory error or
# a definite leak.
#   tools/valgrind.sh                       test_restarts test_netloss test_partition
#   tools/valgrind.sh test_cluster ...      the named tests (tests/integration/NAME.sh)
# Timing-sensitive figures run slower under valgrind (about 20x): the chosen tests keep their
# rates low enough; a test that fails only on timing says so in its own output.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)
if [ "${TR_SKIP_INSTALL:-0}" != 1 ]; then
  tools/install-deps.sh
  command -v valgrind >/dev/null || apt-get install -y valgrind
fi
BUILD=${TR_BUILD_DIR:-build-valgrind}
cmake -S . -B "$BUILD" -G Ninja -DTR_SANITIZE=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
# Only what the shell tests run: the rest of the tree is not needed here.
ninja -C "$BUILD" tracerelay-service tracerelay-agent tracerelay-loadgen tracerelay consumer_probe
BIN=$(cd "$BUILD/bin" && pwd)
TESTS=("$@")
[ ${#TESTS[@]} -gt 0 ] || TESTS=(test_restarts test_netloss test_partition)

LOGS=$(mktemp -d /tmp/tracerelay-valgrind.XXXXXX)
export TR_WRAP="valgrind --tool=memcheck --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=99 --track-fds=no --log-file=$LOGS/vg.%p.log"
failed=()
for t in "${TESTS[@]}"; do
  echo "== $t under valgrind (logs in $LOGS)"
  before=$(ls "$LOGS" | wc -l)
  st=0
  bash "$SRC/tests/integration/$t.sh" "$BIN" || st=$?
  if [ "$st" = 77 ]; then echo "== $t skipped"; continue; fi
  [ "$st" = 0 ] || failed+=("$t (exit $st)")
  echo "== $t: $(( $(ls "$LOGS" | wc -l) - before )) processes checked"
done

bad=()
for f in "$LOGS"/vg.*.log; do
  [ -f "$f" ] || continue
  if grep -Eq "ERROR SUMMARY: [1-9]" "$f"; then bad+=("$f"); fi
done
for f in "${bad[@]}"; do
  echo "---- $f"; grep -E "ERROR SUMMARY|Command:" "$f"; sed -n '/Invalid\|uninitialised\|definitely lost/,+12p' "$f" | head -40
done
if [ ${#bad[@]} -gt 0 ] || [ ${#failed[@]} -gt 0 ]; then
  echo "valgrind: ${#bad[@]} process(es) with memory errors; failed tests: ${failed[*]:-none}"
  exit 1
fi
echo "valgrind: no memory errors or definite leaks in $(ls "$LOGS" | wc -l) processes"
rm -rf "$LOGS"
