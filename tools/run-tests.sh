#!/usr/bin/env bash
# run-tests.sh: the test command (what CI runs). Installs dependencies, then:
#  1. builds everything with AddressSanitizer + UndefinedBehaviorSanitizer (build-test) and runs
#     every registered test with ctest;
#  2. builds the Release configuration users install (-O3 -DNDEBUG, build-release, what the
#     Debian package is made from) and runs the unit tests and the loss accounting tests
#     (ctest label "accounting": overload, restarts, stop_backlog, slow_stop, the 60 s soak) on it.
# Without arguments the tests run two at a time (ctest -j2: most wait for what they check, and
# two halve the run), but for those tests/CMakeLists.txt marks RUN_SERIAL (the timeline tests,
# tiers, the soak), and the Release build's accounting tests, which run one at a time.
# Arguments go to ctest, for both builds, one test at a time:
#   tools/run-tests.sh            as above
#   tools/run-tests.sh -L unit    only the fast unit tests, on both builds
#   tools/run-tests.sh -R NAME    one test, on both builds
# TR_RELEASE=0 skips the Release build; TR_BUILD_DIR / TR_RELEASE_DIR name the build dirs.
# Both builds' tests run even if the first has failures; the output ends with both ctest
# summaries, and the exit status is non-zero if either build or any of its tests failed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${TR_SKIP_INSTALL:-0}" != 1 ]; then
  tools/install-deps.sh
fi
BUILD=${TR_BUILD_DIR:-build-test}
RELEASE=${TR_RELEASE_DIR:-build-release}
LOGS=$(mktemp -d /tmp/run-tests.XXXXXX)
trap 'rm -rf "$LOGS"' EXIT

# run_ctest NAME DIR ARGS...: ctest on DIR, its output also kept for the recap; its status.
run_ctest() {
  local name=$1 dir=$2; shift 2
  echo "==== run-tests: $name ($dir): ctest $*"
  set +e
  ctest --test-dir "$dir" --output-on-failure --timeout 300 "$@" 2>&1 | tee "$LOGS/$name.log"
  local status=${PIPESTATUS[0]}
  set -e
  return "$status"
}

cmake -S . -B "$BUILD" -G Ninja -DTR_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
ninja -C "$BUILD"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
RUNS=()
# run_build NAME DIR DEFAULT_REST: the unit tests two at a time, then DEFAULT_REST (ctest
# arguments); with the script's arguments, only those, one at a time.
run_build() {
  local name=$1 dir=$2 rest=$3
  if [ "${#ARGS[@]}" -gt 0 ]; then
    RUNS+=("$name"); run_ctest "$name" "$dir" "${ARGS[@]}" || status=1
    return
  fi
  RUNS+=("$name-unit"); run_ctest "$name-unit" "$dir" -L unit -j2 || status=1
  RUNS+=("$name-rest"); run_ctest "$name-rest" "$dir" $rest || status=1
}
ARGS=("$@")
run_build sanitizers "$BUILD" "-LE unit -j2"
[ "${TR_RELEASE:-1}" = 0 ] && exit "$status"

cmake -S . -B "$RELEASE" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTR_SANITIZE=OFF
ninja -C "$RELEASE"
run_build release "$RELEASE" "-L accounting"

# Recap: each run's ctest summary (from its "% tests passed" line on), the last lines.
for name in "${RUNS[@]}"; do
  echo "==== run-tests: $name build"
  sed -n '/% tests passed, /,$p' "$LOGS/$name.log"
done
exit "$status"
