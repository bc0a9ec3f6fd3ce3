#!/usr/bin/env bash
# run-tests.sh: the test command. Installs dependencies, builds everything with
# AddressSanitizer + UndefinedBehaviorSanitizer, and runs every registered test with ctest.
#   tools/run-tests.sh            all tests (unit + integration)
#   tools/run-tests.sh -L unit    only the fast unit tests (any ctest arguments pass through)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${TR_SKIP_INSTALL:-0}" != 1 ]; then
  tools/install-deps.sh
fi
BUILD=${TR_BUILD_DIR:-build-test}
cmake -S . -B "$BUILD" -G Ninja -DTR_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
ninja -C "$BUILD"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$BUILD" --output-on-failure --timeout 300 "$@"
