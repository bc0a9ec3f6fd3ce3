#!/usr/bin/env bash
# fuzz.sh: builds every libFuzzer target (clang, ASan + UBSan) and runs each for a while.
#   tools/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     default 60 s, every target in fuzz/
#   TR_FUZZ_RUNS=10000000 tools/fuzz.sh 1800 fuzz_ipc_frame   stops at 10M executions or 30 min
# Targets run one after another, niced (TR_FUZZ_NICE, default 10), -timeout=10 s per input,
# -rss_limit_mb=2048. Results (executions, exec/s, coverage) are printed per target.
# The build is RelWithDebInfo (-O2): without a build type the targets are built -O0 and run 2 to
# 5 times slower; cov/ft counts of the two are not comparable (-O2 has fewer edges to count).
# Seeds come from fuzz/corpus/<name>/ (recorded traffic); new inputs go to a scratch corpus
# in the build tree, and crashes to build-fuzz/crashes/. A crash fails the run: turn it into
# a regression test before fixing it.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
shift || true
[ "${TR_SKIP_INSTALL:-0}" = 1 ] || tools/install-deps.sh clang
BUILD=${TR_FUZZ_BUILD_DIR:-build-fuzz}
CC=clang cmake -S . -B "$BUILD" -G Ninja -DTR_FUZZ=ON -DTR_SANITIZE=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  mapfile -t TARGETS < <(sed -n 's/^tr_fuzz(\([a-z_]*\).*/\1/p' fuzz/CMakeLists.txt)
fi
ninja -C "$BUILD" "${TARGETS[@]}"
mkdir -p "$BUILD/crashes"
status=0
for t in "${TARGETS[@]}"; do
  seeds="fuzz/corpus/${t#fuzz_}"
  scratch="$BUILD/corpus/$t"
  mkdir -p "$scratch"
  echo "== $t for ${SECS}s"
  args=("$scratch")
  [ -d "$seeds" ] && args+=("$seeds")
  limits=(-max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048)
  [ -n "${TR_FUZZ_RUNS:-}" ] && limits+=(-runs="$TR_FUZZ_RUNS")
  if ! nice -n "${TR_FUZZ_NICE:-10}" "$BUILD/fuzz/$t" "${limits[@]}" -print_final_stats=1 \
       -artifact_prefix="$BUILD/crashes/$t-" "${args[@]}" 2>"$BUILD/$t.log"; then
    echo "!! $t found a crash: see $BUILD/$t.log and $BUILD/crashes/"; status=1
  fi
  grep -E "stat::(number_of_executed_units|average_exec_per_sec)" "$BUILD/$t.log" || true
  grep -E "cov: " "$BUILD/$t.log" | tail -1 || true
done
exit $status
