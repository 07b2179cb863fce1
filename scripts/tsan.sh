#!/usr/bin/env bash
# ThreadSanitizer run: builds the library and the plain-C call table (tests/calls) with
# -fsanitize=thread into ${XTE_TSAN_BUILD_DIR:-build-tsan} and runs test_thread_races (every
# entry point with 1, 2, 3 and 7 pool threads, byte-identical, plus concurrent callers).
# Criterion cannot start under TSan, hence the plain-C runner.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bdir=${XTE_TSAN_BUILD_DIR:-build-tsan}
cmake -S . -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXTE_WERROR=ON \
  -DXTE_SANITIZE=thread -DXTE_SIMDE=OFF -DXTE_CUDA=OFF -DXTE_MUSA=OFF -DXTE_BUILD_BENCH=OFF \
  >/dev/null
cmake --build "$bdir" -j"$(nproc)" --target test_thread_races
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
[ -f tests/calls/tsan.supp ] && export TSAN_OPTIONS="$TSAN_OPTIONS suppressions=$PWD/tests/calls/tsan.supp"
cd "$bdir"
ctest --output-on-failure --timeout 900 -R '^test_thread_races$'
