#!/usr/bin/env bash
# The one script a session with a lent GPU machine runs, from the repository root:
#   bash tests/device/run.sh [OUTPUT_DIR]
# Offline and fast: needs cmake, a C compiler and nvcc, nothing else (no network, no SIMDe, no
# hwloc, no Criterion, no OpenBLAS / google-benchmark). It configures a build with the CUDA plugin
# for sm_90a only, builds only what it runs, then runs under one deadline (default 290 s), in this
# order: `xte info`; every GPU byte-equality test (each GPU op runs twice and must give the same
# bytes); quantize, dequantize and cast over more than 2^31 elements against the CPU;
# compute-sanitizer memcheck and racecheck on a reduced case (when compute-sanitizer exists); a
# short benchmark table against a device-to-device copy. Everything it writes goes under the
# output folder (OUTPUT_DIR, else $OUT, else <build>/device-logs): summary.txt (one line per step
# and the verdict) and one log per step.
#
# Exit status: 0 when nothing failed, which includes a machine with no GPU (every GPU step then
# says "SKIPPED: <why>"); 1 when a step failed, crashed or ran out of time, or when the machine has
# a GPU (nvidia-smi lists one) that xte cannot use.
#
#   XTE_BUILD_DIR        build directory (default build-device)
#   XTE_CUDA_ARCH        CMAKE_CUDA_ARCHITECTURES (default 90a)
#   XTE_DEVICE_DEADLINE  seconds for the whole script (default 290)
#   XTE_DEVICE_BUILD_LIMIT  seconds for the build step (default 180; 16 cores need 40-70 s,
#                        a first build on 2 cores about 6 minutes: raise both for a dry run)
#   XTE_DEVICE_HUGE=0    leave out the > 2^31-element step (about 20 GiB of host memory)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

start=$(date +%s)
deadline=${XTE_DEVICE_DEADLINE:-290}
bdir=${XTE_BUILD_DIR:-build-device}
arch=${XTE_CUDA_ARCH:-90a}
logs=${1:-${OUT:-$bdir/device-logs}}
mkdir -p "$logs" "$bdir" || exit 1
logs=$(cd "$logs" && pwd)
summary=$logs/summary.txt
rm -f "$logs"/*.log # a rerun's logs (and what is read back from them) are its own
: >"$summary"
rc=0

note() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(($(date +%s) - start)); }
left() { echo $((deadline - $(elapsed))); }
failed() { # failed STEP WHY: a real failure
  note "$1: FAILED: $2"
  rc=1
}
# step NAME SECONDS CMD...: runs CMD with a time limit (capped by what is left), logging to
# NAME.log; returns CMD's status, 124 when it ran out of time or was not started for lack of it.
step() {
  local name=$1 limit=$2 t s
  shift 2
  t=$(left)
  [ "$t" -lt "$limit" ] && limit=$t
  if [ "$limit" -le 5 ]; then
    note "$name: NOT RUN (out of time, $(elapsed)s elapsed)"
    return 124
  fi
  echo "== $name (limit ${limit}s): $*" >>"$logs/$name.log"
  timeout --kill-after=5 "$limit" "$@" >>"$logs/$name.log" 2>&1
  s=$?
  [ $s -eq 124 ] || [ $s -eq 137 ] && echo "== $name: TIMED OUT after ${limit}s" >>"$logs/$name.log"
  echo "   $name: exit $s ($(elapsed)s elapsed)" >>"$summary"
  return $s
}

# ---------------------------------------------------------------- the machine
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
{
  echo "date: $(date -u)"
  uname -a
  nproc
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  command -v nvcc && nvcc --version | tail -2
  cmake --version 2>&1 | head -1
  ${CC:-cc} --version 2>&1 | head -1
  command -v compute-sanitizer || echo "compute-sanitizer: not found"
} >"$logs/machine.log" 2>&1
gpu_listed=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  gpu_listed=1
  note "machine: $(nvidia-smi -L 2>/dev/null | head -1)"
else
  note "machine: no NVIDIA GPU listed by nvidia-smi (the GPU steps will say SKIPPED)"
fi

# ---------------------------------------------------------------- configure and build
# Only what the checks need: libxte, libxte_cuda.so, the GPU tests on the plain-C Criterion
# shim, the info and benchmark programs. No SIMDe, no benchmarks, hwloc only if present.
cfg=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" -DXTE_CUDA=ON -DXTE_MUSA=OFF
  -DXTE_WERROR=OFF -DXTE_SIMDE=OFF -DXTE_BUILD_BENCH=OFF -DXTE_BUILD_TESTS=ON
  -DXTE_NO_CRITERION=ON)
command -v ninja >/dev/null && [ ! -f "$bdir/CMakeCache.txt" ] && cfg+=(-G Ninja)
command -v nvcc >/dev/null && cfg+=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
if ! command -v nvcc >/dev/null; then
  failed configure "nvcc not found (PATH, /usr/local/cuda/bin)"
  note "total: $(elapsed)s, exit 1"
  exit 1
fi
if ! step configure 60 cmake -S . -B "$bdir" "${cfg[@]}"; then
  tail -30 "$logs/configure.log"
  failed configure "see configure.log"
  note "total: $(elapsed)s, exit 1"
  exit 1
fi
note "configure: done ($(elapsed)s)"
targets=(xte xte_cuda test_gpu_quantize test_gpu_fast_lt xte_device_info xte_device_bench)
if ! step build "${XTE_DEVICE_BUILD_LIMIT:-180}" cmake --build "$bdir" -j"$(nproc)" --target "${targets[@]}"; then
  tail -40 "$logs/build.log"
  failed build "${targets[*]} (see build.log)"
  note "total: $(elapsed)s, exit 1"
  exit 1
fi
note "build: done ($(elapsed)s)"
tq=$bdir/tests/test_gpu_quantize

# ---------------------------------------------------------------- 1. xte info
info=$bdir/tests/xte_device_info
[ -x "$bdir/xte" ] && info=$bdir/xte
if [ "$info" = "$bdir/xte" ]; then step info 20 "$info" info; else step info 20 "$info"; fi
s=$?
sed -n '2,$p' "$logs/info.log"
[ $s -eq 0 ] || failed info "exit $s (see info.log)"
have_gpu=0
grep -qE '^  gpu [0-9]+: ' <(sed -n '/^cuda:/,/^musa:/p' "$logs/info.log") && have_gpu=1
if [ $have_gpu -eq 1 ]; then
  note "info: $(grep -m1 -E '^  gpu 0: ' "$logs/info.log" | sed 's/^ *//')"
else
  why=$(grep -m1 '^cuda:' "$logs/info.log")
  if [ $gpu_listed -eq 1 ]; then
    failed info "nvidia-smi lists a GPU but xte sees no CUDA device: ${why:-no report}"
  else
    note "info: SKIPPED: no CUDA device for xte: ${why:-no report}"
  fi
fi

# ---------------------------------------------------------------- 2. byte equality, twice
# test_gpu_quantize runs every GPU op twice (same bytes) and compares with the CPU backend;
# check_gpu_musa_compat runs too (ctest -R gpu).
step ctest-gpu 120 ctest --test-dir "$bdir" -R gpu --output-on-failure --timeout 150 -V
s=$?
grep -E "\[(PASS|FAIL|CRASH|SKIP)\]|Synthesis|cases compared|cases differ|differences over" \
  "$logs/ctest-gpu.log" | head -40 | sed 's/^/   /' | tee -a "$summary"
grep -E "tests passed|Test +#" "$logs/ctest-gpu.log" | sed 's/^/   /' | tee -a "$summary"
if [ $s -ne 0 ]; then
  failed byte-equality "ctest -R gpu exit $s (see ctest-gpu.log)"
elif [ $have_gpu -eq 1 ] && grep -q "SKIPPED: " "$logs/ctest-gpu.log"; then
  failed byte-equality "a GPU test was SKIPPED on a machine with a CUDA device"
elif [ $have_gpu -eq 1 ]; then
  note "byte-equality: PASSED (every op twice, same bytes)"
else
  note "byte-equality: SKIPPED: no CUDA device (the tests ran and skipped; plugin checks passed)"
fi

# ---------------------------------------------------------------- 3. more than 2^31 elements
if [ "${XTE_DEVICE_HUGE:-1}" = 0 ]; then
  note "huge: NOT RUN (XTE_DEVICE_HUGE=0)"
elif [ $have_gpu -eq 0 ]; then
  note "huge: SKIPPED: no CUDA device"
else
  step huge 90 env XTE_TEST_GPU_HUGE=1 "$tq" --filter 'gpu_quantize/huge_*'
  s=$?
  grep -E "\[(PASS|FAIL|CRASH)\]|Synthesis" "$logs/huge.log" | sed 's/^/   /' | tee -a "$summary"
  [ $s -eq 0 ] && note "huge: PASSED (quantize, dequantize, cast of $((524289 * 4096)) elements)" ||
    failed huge "exit $s (see huge.log)"
fi

# ---------------------------------------------------------------- 4. compute-sanitizer
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
  /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
if [ $have_gpu -eq 0 ]; then
  note "sanitizer: SKIPPED: no CUDA device"
elif [ -z "$san" ]; then
  note "sanitizer: SKIPPED: compute-sanitizer not found"
else
  for tool in memcheck racecheck; do
    # --no-fork: the tests run in the sanitized process itself; reduced shapes and casts.
    step "$tool" 45 env XTE_TEST_GPU_REDUCED=1 "$san" --tool "$tool" --error-exitcode 99 \
      --print-limit 20 "$tq" --no-fork
    s=$?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Synthesis" "$logs/$tool.log" | sed 's/^/   /' |
      tee -a "$summary"
    if [ $s -eq 0 ]; then
      note "$tool: PASSED (reduced case)"
    elif grep -qE "Device not supported|error 999" "$logs/$tool.log"; then
      note "$tool: SKIPPED: compute-sanitizer cannot use this device (see $tool.log)"
    else
      failed "$tool" "exit $s (see $tool.log)"
    fi
  done
fi

# ---------------------------------------------------------------- 5. benchmark table
if [ $have_gpu -eq 0 ]; then
  note "bench: SKIPPED: no CUDA device"
else
  step bench 30 "$bdir/tests/xte_device_bench"
  s=$?
  grep -E "^\||^\(" "$logs/bench.log" | tee -a "$summary"
  [ $s -eq 0 ] || failed bench "exit $s (see bench.log)"
fi

# ---------------------------------------------------------------- 6. exact GEMM
# xte_device_bench gemm: the CUDA exact GEMM against the CPU backend byte for byte (dense on odd
# shapes, e4m3 x e4m3 / e5m2, C + bias, bf16 out; contiguous and masked grouped; every GPU call
# twice), then the time of 4096 x 7168 x 16384, 1x128 x 128x128, in TFLOPS. Once per kernel, so
# that one run gives every kernel's bytes against the CPU and every rate of the same shape:
#   6  the automatic choice (m16n8k16 DMMA on sm_90, m8n8k4 on sm_80 / 89; stage 2)
#   6b XTE_CUDA_GEMM_KERNEL=simt   the SIMT fp64 kernel (stage 1)
#   6c XTE_CUDA_GEMM_KERNEL=dmma4  the m8n8k4 DMMA kernel
#   6d XTE_CUDA_GEMM_KERNEL=imma   the int8 digit kernel (stage 3, e4m3 x e4m3: the e5m2 cases of
#                                  the check fall back to the automatic choice; not automatic yet)
# gpu_step NAME SECONDS LINES LABEL PASSED CMD...: CMD under `step` when there is a GPU (else
# "NAME: SKIPPED"); the log lines matching LINES go to the summary prefixed with LABEL, then
# "NAME: PASSED (PASSED)" or a failure.
gpu_step() {
  local name=$1 secs=$2 lines=$3 label=$4 passed=$5 s
  shift 5
  if [ $have_gpu -eq 0 ]; then
    note "$name: SKIPPED: no CUDA device"
    return
  fi
  step "$name" "$secs" "$@"
  s=$?
  grep -E "$lines" "$logs/$name.log" | sed "s/^/$label/" | tee -a "$summary"
  [ $s -eq 0 ] && note "$name: PASSED ($passed)" || failed "$name" "exit $s (see $name.log)"
}
# gemm_step NAME KERNEL LABEL (KERNEL empty: the automatic choice)
gemm_step() {
  gpu_step "$1" 90 "^\||^\(|FAILED" "$3" "${3:-automatic kernel: }CUDA exact GEMM = CPU bytes, twice" \
    env ${2:+XTE_CUDA_GEMM_KERNEL=$2} "$bdir/tests/xte_device_bench" gemm
}
gemm_step gemm "" ""
gemm_step gemm_simt simt "simt kernel: "
gemm_step gemm_dmma4 dmma4 "dmma m8n8k4 kernel: "
gemm_step gemm_imma imma "imma int8 digit kernel: "

# ---------------------------------------------------------------- 7. exact attention
# xte_device_bench attention: the CUDA exact attention against the CPU backend byte for byte
# (bf16 / fp32, BSHD causal + GQA, THD varlen + window, softcap + ALiBi; O, LSE, dQ, dK, dV;
# every GPU call twice), then forward and backward at head dim 128, seqlen 4096, causal and not,
# in TFLOPS and as a fraction of the fp32 CUDA-core peak.
gpu_step attention 120 "^\||^attention|FAILED" "" "CUDA exact attention = CPU bytes, twice" \
  "$bdir/tests/xte_device_bench" attention

# ---------------------------------------------------------------- 8. FAST GEMM (cuBLASLt)
# xte_device_bench fast: XTE_GEMM_FAST (cuBLASLt block scaling on sm_90, else the exact kernel;
# the "fast path" line says which) against the exact kernel on the same device, every output
# within the FAST bound of include/xte/gemm.h (1x128 x 128x128, 128x128 x 1x128, 1x128 x 1x128;
# COMPACT and TE_GEMM scales), then FAST and exact TFLOPS at 4096 x 7168 x 16384.
gpu_step fast 60 "^\||^fast path|^\(|FAILED" "" "FAST GEMM within the bound of gemm.h" \
  "$bdir/tests/xte_device_bench" fast

# ---------------------------------------------------------------- 8b. expert parallelism over NCCL
# test_ep_nccl_device (tests/simt/test_simt_ep.c built for the GPU): xte_ep_group_create_nccl over
# the real libnccl.so.2 (the CUDA toolkit's, or $XTE_NCCL_LIBRARY), one rank on GPU 0 (more ranks
# need one process per GPU): prepare, dispatch, dispatch_tokens, combine and both backwards on
# device memory, byte for byte against the one-process CPU calls; a bad argument refused. Built
# here, so that a problem in it costs no other step; "SKIPPED" without a libnccl.
gpu_step ep_nccl 90 "^test_simt_ep|^FAIL|^SKIPPED" "" "NCCL EP on device memory = CPU bytes, 1 rank" \
  bash -c 'if [ -z "${XTE_NCCL_LIBRARY:-}" ] && ! ldconfig -p | grep -q "libnccl.so.2 "; then
    for f in /usr/local/cuda*/lib*/libnccl.so.2 /usr/local/cuda*/targets/*/lib/libnccl.so.2; do
      [ -e "$f" ] && export XTE_NCCL_LIBRARY="$f" && break; done
    [ -n "${XTE_NCCL_LIBRARY:-}" ] ||
      { echo "SKIPPED: no libnccl.so.2 (ldconfig, /usr/local/cuda*) and no XTE_NCCL_LIBRARY"; exit 0; }
    fi
    cmake --build "$1" -j"$(nproc)" --target test_ep_nccl_device &&
    "$1/tests/test_ep_nccl_device"' _ "$bdir"

# ---------------------------------------------------------------- 9. xte bench --backend cuda
# `xte bench quantize|moe --backend cuda` (bench/bench_gpu.h): each case on the CUDA backend, CUDA
# events on the bench's stream, the L2 flushed (memset of 2 x L2) before every iteration outside
# the timed interval, beside a device-to-device copy of the same bytes from the same run. The
# xte program is the GPU-only build (bench/CMakeLists.txt XTE_BENCH_GPU_ONLY: no Google Benchmark,
# no OpenBLAS), configured and built here, last, so that a problem in it costs no other step.
# Without a GPU it runs too and must print one line "SKIPPED: <why>" (exit 77). Under 60 s left:
# not run, not a failure (the steps above come first; raise XTE_DEVICE_DEADLINE).
if [ "$(left)" -lt 60 ]; then
  note "bench-cuda: NOT RUN ($(left)s left of ${deadline}s; XTE_DEVICE_DEADLINE=400 leaves it time)"
elif step bench-cuda-build 90 bash -c 'cmake -S . -B "$1" -DXTE_BUILD_BENCH=ON -DXTE_BENCH_GPU_ONLY=ON &&
  cmake --build "$1" -j"$(nproc)" --target xte_cli' _ "$bdir"; then
  for suite in quantize moe; do
    step "bench-cuda-$suite" 25 "$bdir/xte" bench "$suite" --backend cuda --min-time 0.05 \
      --json "$logs/bench-cuda-$suite.json"
    s=$?
    if [ $s -eq 77 ] && [ $have_gpu -eq 0 ]; then
      note "bench-cuda-$suite: $(grep -m1 '^SKIPPED: ' "$logs/bench-cuda-$suite.log")"
    elif [ $s -eq 0 ]; then
      grep -E '^  (gpu_name|gpu_sm_count|gpu_l2_bytes|gpu_clock_khz) ' "$logs/bench-cuda-$suite.log" |
        sed 's/^ */   /' | tee -a "$summary"
      sed -n '/^case  /,$p' "$logs/bench-cuda-$suite.log" | tee -a "$summary"
      note "bench-cuda-$suite: done (ratios to a d2d copy of the same bytes)"
    else
      grep -m3 -E 'SKIPPED|FAILED|xte bench' "$logs/bench-cuda-$suite.log" | sed 's/^/   /' |
        tee -a "$summary"
      failed "bench-cuda-$suite" "exit $s (see bench-cuda-$suite.log)"
    fi
  done
else
  tail -20 "$logs/bench-cuda-build.log"
  failed bench-cuda-build "the GPU-only xte program (see bench-cuda-build.log)"
fi

note "total: $(elapsed)s of ${deadline}s, exit $rc ($([ $rc -eq 0 ] && echo 'nothing failed' || echo FAILED))"
exit $rc
