#!/usr/bin/env bash
# run-tests-busy.sh: the test command (tools/run-tests.sh, same arguments) on a busy machine:
# CPU-burning loops (TR_BUSY_LOOPS, default 2) run beside it for its whole length and are
# killed when it ends, however it ends. The tests wait for what they check, not for a time, so
# they must pass like this too (issue 24: 3 runs in a row on a 2-CPU machine).
#   tools/run-tests-busy.sh                      everything, with 2 busy loops
#   TR_BUSY_LOOPS=4 tools/run-tests-busy.sh -R test_status    one test, 4 loops
set -euo pipefail
cd "$(dirname "$0")/.."
LOOPS=${TR_BUSY_LOOPS:-2}
BURNERS=()
stop_burners() {
  local pid
  for pid in "${BURNERS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${BURNERS[@]}"; do wait "$pid" 2>/dev/null || true; done
  BURNERS=()
}
trap stop_burners EXIT
trap 'exit 130' INT TERM
for _ in $(seq "$LOOPS"); do
  bash -c 'while :; do :; done' &
  BURNERS+=($!)
done
echo "run-tests-busy: $LOOPS CPU-burning loops beside the tests (pids ${BURNERS[*]})"
tools/run-tests.sh "$@"
