#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for a fixed time.
#
#   scripts/fuzz.sh [seconds-per-target] [target ...]
#
# Default 20 s per target (CI); e.g. `scripts/fuzz.sh 3600` for a long run. Targets: the names
# of tests/fuzz/fuzz_*.c (all when none given). Build dir: ${XTE_FUZZ_BUILD_DIR:-build-fuzz};
# each target's working corpus (seeded from tests/fuzz/corpus/<target>), crash artifacts and log
# go to <build dir>/fuzz-out/<target>/, never into the repository. Prints per target the
# executions, exec/s and PASS / FAIL; exits non-zero when any target crashed (a sanitizer report,
# a contract violation, a timeout or running out of memory).
#
# Environment: XTE_FUZZ_RUNS (stop each target after this many executions, e.g. 1000000 for the
# long run; the seconds stay a cap), XTE_FUZZ_JOBS (parallel fuzzing processes per target, default 1),
# XTE_FUZZ_TIMEOUT (seconds one input may take, default 25), XTE_FUZZ_RSS_MB (default 2048),
# XTE_FUZZ_AVOID (known open defects the decoders stay out of, see tests/fuzz/fuzz_common.h;
# empty by default: CI fuzzes everything), CC / CXX (default clang / clang++).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
secs=${1:-20}
shift || true
build=${XTE_FUZZ_BUILD_DIR:-build-fuzz}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
export CC=${CC:-clang} CXX=${CXX:-clang++}

if ! grep -qi clang <<<"$("$CC" --version 2>/dev/null)"; then
  echo "fuzz: CC=$CC is not clang (libFuzzer needs clang and libclang-rt-dev)" >&2
  exit 2
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXTE_FUZZ=ON \
  -DXTE_SANITIZE=address,undefined -DXTE_CUDA=OFF -DXTE_MUSA=OFF -DXTE_BUILD_BENCH=OFF \
  -DXTE_BUILD_TESTS=OFF -DXTE_SIMDE=OFF >/dev/null || exit 2
cmake --build "$build" --target xte_fuzz -j"${XTE_JOBS:-$(nproc)}" || exit 2

if [ $# -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for f in tests/fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_leaks=1:allocator_may_return_null=1:print_summary=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1:print_summary=1}
export XTE_NUM_THREADS=${XTE_NUM_THREADS:-2}

fail=0
printf '%-20s %12s %10s  %s\n' target executions exec/s result
for t in "${targets[@]}"; do
  exe="$build/tests/fuzz/$t"
  out="$build/fuzz-out/$t"
  mkdir -p "$out/corpus"
  if [ ! -x "$exe" ]; then
    echo "fuzz: no target $t" >&2
    fail=1
    continue
  fi
  seeds=()
  [ -d "tests/fuzz/corpus/$t" ] && seeds=("$root/tests/fuzz/corpus/$t")
  log="$out/fuzz.log"
  # artifacts of an earlier run move aside, so that this run's verdict is its own
  mkdir -p "$out/earlier"
  find "$out" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
    -o -name 'oom-*' \) -exec mv -f {} "$out/earlier/" \;
  par=()
  jobs=${XTE_FUZZ_JOBS:-1}
  [ "$jobs" -gt 1 ] && par=(-jobs="$jobs" -workers="$jobs")
  runs=()
  [ -n "${XTE_FUZZ_RUNS:-}" ] && runs=(-runs="$XTE_FUZZ_RUNS")
  rm -f "$out"/fuzz-*.log
  t0=$SECONDS
  (cd "$out" && "$exe" "$out/corpus" "${seeds[@]}" -max_total_time="$secs" "${runs[@]}" \
    -timeout="${XTE_FUZZ_TIMEOUT:-25}" -rss_limit_mb="${XTE_FUZZ_RSS_MB:-2048}" \
    -artifact_prefix="$out/" -print_final_stats=1 "${par[@]}" >"$log" 2>&1)
  rc=$?
  # with -jobs > 1 the workers log to fuzz-<n>.log in the working directory ($out), and the
  # parent's log repeats a worker's final stats: count the workers' logs only
  logs=("$log")
  [ "$jobs" -gt 1 ] && logs=("$out"/fuzz-*.log)
  execs=$(grep -ho 'stat::number_of_executed_units: *[0-9]*' "${logs[@]}" 2>/dev/null |
          awk '{s += $2} END {print s + 0}')
  el=$((SECONDS - t0))
  rate=$(( execs / (el > 0 ? el : 1) ))
  crashes=$(ls "$out" | grep -cE '^(crash|leak|timeout|oom)-')
  if [ $rc -eq 0 ] && [ "$crashes" -eq 0 ]; then
    res=PASS
  else
    res="FAIL (rc $rc; artifacts in $out; log $log)"
    fail=1
    grep -E 'VIOLATION|ERROR: |runtime error|SUMMARY' "$log" | head -5 | sed 's/^/    /'
  fi
  printf '%-20s %12s %10s  %s\n' "$t" "$execs" "$rate" "$res"
done
exit $fail
