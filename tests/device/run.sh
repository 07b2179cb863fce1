#!/usr/bin/env bash
# The one script a session with a lent GPU machine runs, from the repository root:
#   bash tests/device/run.sh
# Installs what is missing when it can (the machine may have no network), configures with the
# CUDA plugin for sm_90a, builds, runs the GPU tests (ctest -R gpu) and `xte info`, all in under
# five minutes. Logs go to $OUT when it is set (else <build>/device-logs); summary.txt says what
# ran and what did not. Exit status: 0 when every step that ran passed and the GPU tests ran.
#
#   XTE_BUILD_DIR        build directory (default build-device)
#   XTE_CUDA_ARCH        CMAKE_CUDA_ARCHITECTURES (default 90a)
#   XTE_DEVICE_DEADLINE  seconds for the whole script (default 290)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

start=$(date +%s)
deadline=${XTE_DEVICE_DEADLINE:-290}
bdir=${XTE_BUILD_DIR:-build-device}
arch=${XTE_CUDA_ARCH:-90a}
logs=${OUT:-$bdir/device-logs}
mkdir -p "$logs" "$bdir"
summary=$logs/summary.txt
rm -f "$logs"/*.log # a rerun's logs (and what is read back from them) are its own
: >"$summary"
rc=0

note() { echo "$*" | tee -a "$summary"; }
left() { echo $((deadline - ($(date +%s) - start))); }
# step NAME SECONDS CMD...: runs CMD with a time limit (capped by what is left), logging to NAME.log
step() {
  local name=$1 limit=$2 t s
  shift 2
  t=$(left)
  [ "$t" -lt "$limit" ] && limit=$t
  if [ "$limit" -le 5 ]; then
    note "$name: NOT RUN (out of time)"
    return 124
  fi
  echo "== $name (limit ${limit}s): $*" | tee -a "$logs/$name.log"
  timeout --kill-after=5 "$limit" "$@" >>"$logs/$name.log" 2>&1
  s=$?
  note "$name: exit $s ($(($(date +%s) - start))s elapsed)"
  return $s
}

# ---------------------------------------------------------------- the machine
{
  echo "date: $(date -u)"
  uname -a
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>&1
  cmake --version 2>&1 | head -1
  gcc --version 2>&1 | head -1
} >"$logs/machine.log" 2>&1
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

# ---------------------------------------------------------------- dependencies
have_pc() { pkg-config --exists "$1" 2>/dev/null; }
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v python3 >/dev/null || missing+=(python3)
have_pc hwloc || missing+=(libhwloc-dev)
have_pc criterion || missing+=(libcriterion-dev)
have_pc openblas || missing+=(libopenblas-dev)
[ -e /usr/include/benchmark/benchmark.h ] || [ -e /usr/local/include/benchmark/benchmark.h ] ||
  missing+=(libbenchmark-dev)
[ -e /usr/include/simde/x86/avx512.h ] || missing+=(libsimde-dev)
if [ ${#missing[@]} -gt 0 ]; then
  note "deps: missing ${missing[*]}; trying apt-get (may fail without network)"
  sudo=()
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && sudo=(sudo -n)
  # Without network apt-get update fails (or hangs until its limit): then install nothing.
  if step apt-update 40 "${sudo[@]}" apt-get update -qq; then
    step apt-install 70 "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${missing[@]}"
  fi
fi

# ---------------------------------------------------------------- configure
cfg=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" -DXTE_CUDA=ON
  -DXTE_MUSA=OFF -DXTE_WERROR=OFF)
command -v ninja >/dev/null && cfg+=(-G Ninja)
if ! have_pc criterion; then
  cfg+=(-DXTE_BUILD_TESTS=OFF)
  note "criterion: NOT FOUND, the Criterion tests (test_gpu_quantize) cannot be built"
  rc=1
fi
if ! have_pc openblas || ! { [ -e /usr/include/benchmark/benchmark.h ] ||
  [ -e /usr/local/include/benchmark/benchmark.h ]; }; then
  cfg+=(-DXTE_BUILD_BENCH=OFF)
  note "bench: google-benchmark or openblas missing, the xte program is not built"
fi
if command -v nvcc >/dev/null; then
  cfg+=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
fi
if ! step configure 60 cmake -S . -B "$bdir" "${cfg[@]}"; then
  note "configure FAILED: see $logs/configure.log"
  tail -30 "$logs/configure.log"
  exit 1
fi

# ---------------------------------------------------------------- build
# What the GPU checks need first, so that a broken unrelated target cannot hold them up.
targets=(xte xte_cuda)
have_pc criterion && targets+=(test_gpu_quantize)
if ! step build-gpu 150 cmake --build "$bdir" -j"$(nproc)" --target "${targets[@]}"; then
  note "build of ${targets[*]} FAILED: see $logs/build-gpu.log"
  tail -40 "$logs/build-gpu.log"
  rc=1
fi
if ! step build-all 90 cmake --build "$bdir" -j"$(nproc)"; then
  note "build of the other targets FAILED (or ran out of time): see $logs/build-all.log"
  rc=1
fi
ls -l "$bdir"/libxte*.so* >>"$logs/build-all.log" 2>&1

# ---------------------------------------------------------------- run
if [ -x "$bdir/xte" ]; then
  step xte-info 20 "$bdir/xte" info || rc=1
  cat "$logs/xte-info.log"
fi
if [ -f "$bdir/CTestTestfile.cmake" ]; then
  step ctest-gpu 200 ctest --test-dir "$bdir" -R gpu --output-on-failure --timeout 180 -V || rc=1
  grep -E "tests passed|Passed|Failed|Skipped|SKIPPED|\[FAIL\]|\[SKIP\]|cases compared|Synthesis" \
    "$logs/ctest-gpu.log" | tee -a "$summary"
  if grep -q "SKIPPED: " "$logs/ctest-gpu.log"; then
    note "GPU tests were SKIPPED on this machine: no usable CUDA device (see above)"
    rc=1
  fi
else
  note "ctest: nothing to run (no tests configured)"
  rc=1
fi
note "total: $(($(date +%s) - start))s, exit $rc"
exit $rc
