#!/usr/bin/env bash
# The one script a session with a lent GPU machine runs, from the repository root:
#   bash tests/device/run.sh [OUTPUT_DIR]
# It must work on the first try and return the most evidence from one command of at most ten
# minutes: offline (no apt, pip or network), every step under one deadline (XTE_DEVICE_DEADLINE,
# default 540 s), steps ordered by the value of what they prove:
#   tools, driver    the tools it needs (each missing one named); the driver: GPU name, driver
#                    version, the CUDA runtime the plugin needs (linked statically) against the one
#                    the driver supports, persistence mode. An unusable driver stops the run here,
#                    within seconds, with the reason.
#   build            the carried build (tests/device/build.sh, made on the CPU machine) when its
#                    source hash matches this tree, else a build here (the fallback)
#   plugin           xte info and a FAST probe: the plugin's FAST status as the plugin reports it
#   1. byte equality of every GPU operator with the CPU, each GPU call twice: quantize family,
#      the MoE kernels (permute / unpermute, sort chunks, dispatch layout; router, aux, SwiGLU
#      and its fused quantize: test_device_moe / _router), the exact GEMM with the automatic
#      kernel, attention
#   2. the other exact GEMM kernels forced (simt, dmma4, dmma16, imma): every row names the kernel
#      the plugin reports it ran; a forced kernel that did not run FAILS
#   3. FAST: the path of every call as the plugin reports it, a case with a bias, the error of
#      one-block partials and of whole outputs against the bound of include/xte/gemm.h
#   4. expert parallelism over NCCL (one rank per GPU; more than one needs more GPUs)
#   5. timings against their anchors (a device-to-device copy; cuBLASLt bf16 and FP8 of the same
#      shape; `xte bench --backend cuda`)
#   6. more than 2^31 elements; compute-sanitizer memcheck and racecheck
# Verdicts, one line per step in OUTPUT_DIR/summary.txt: PASSED, FAILED (why), SKIPPED (why: not
# a failure, never a pass) and NOT RUN (the deadline: not started, or cut off by it). A step that
# runs past its own cap (not cut by the deadline) FAILED (a hang or far too slow).
#
# Exit status: 0 nothing FAILED and nothing NOT RUN; 1 something FAILED (or the driver is
# unusable); 3 nothing FAILED but a step was NOT RUN.
#
#   XTE_BUILD_DIR        the build (default build-device: the carried one)
#   XTE_CUDA_ARCH        architectures of a build made here (default 80;89;90a)
#   XTE_DEVICE_DEADLINE  seconds for the whole script (default 540)
#   XTE_DEVICE_ONLY      an extended regex: only the steps whose name matches run (the others
#                        say SKIPPED: not selected); the tools, driver and plugin steps always run
#   XTE_DEVICE_HUGE=0    leave out the > 2^31-element step (about 20 GiB of host memory)
#   XTE_DEVICE_CUDA_RUNTIME  the CUDA runtime the plugin links (default: the carried build's
#                        record, else nvcc's version; the dry run says 13.0)
#   XTE_DEVICE_DRYRUN=1  the CI dry run (tests/device/dryrun.sh): the build as it is, the plugin
#                        XTE_PLUGIN_DIR names (the host SIMT runner's), small shapes, host memory
#   run.sh --targets     prints the build targets it needs (tests/device/build.sh builds them)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

targets="xte xte_cuda test_gpu_quantize test_device_moe test_device_router xte_device_info \
test_ep_nccl_device xte_cli"
if [ "${1:-}" = "--targets" ]; then
  echo "$targets"
  exit 0
fi

start=$(date +%s)
deadline=${XTE_DEVICE_DEADLINE:-540}
dry=${XTE_DEVICE_DRYRUN:-0}
bdir=${XTE_BUILD_DIR:-build-device}
only=${XTE_DEVICE_ONLY:-}
logs=${1:-${OUT:-$bdir/device-logs}}
mkdir -p "$logs" || exit 1
logs=$(cd "$logs" && pwd)
summary=$logs/summary.txt
rm -f "$logs"/*.log "$logs/gpu_report.txt"
: >"$summary"
n_pass=0 n_fail=0 n_skip=0 n_notrun=0

note() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(($(date +%s) - start)); }
left() { echo $((deadline - $(elapsed))); }
# verdict NAME PASSED|FAILED|SKIPPED|"NOT RUN" TEXT
verdict() {
  case $2 in
    PASSED) n_pass=$((n_pass + 1)) ;;
    FAILED) n_fail=$((n_fail + 1)) ;;
    SKIPPED) n_skip=$((n_skip + 1)) ;;
    *) n_notrun=$((n_notrun + 1)) ;;
  esac
  note "$1: $2${3:+ ($3)}"
}
finish() {
  local rc=0
  [ $n_notrun -gt 0 ] && rc=3
  [ $n_fail -gt 0 ] && rc=1
  note "verdicts: $n_pass PASSED, $n_fail FAILED, $n_skip SKIPPED, $n_notrun NOT RUN"
  note "total: $(elapsed)s of ${deadline}s, exit $rc"
  exit $rc
}
selected() { [ -z "$only" ] || [[ $1 =~ $only ]]; }

# run_step NAME CAP CMD...: CMD with a time limit (its cap, or what is left of the deadline),
# logged to NAME.log. Sets ST (the exit status; 124 timed out) and CUT (1: the deadline, not the
# cap, limited it). Returns 1 without running when it was not selected or no time is left (the
# verdict is then given here).
ST=0 CUT=0
run_step() {
  local name=$1 cap=$2 t limit
  shift 2
  ST=0 CUT=0
  if [ "$name" != plugin ] && [ "$name" != build ] && ! selected "$name"; then
    verdict "$name" SKIPPED "not selected: XTE_DEVICE_ONLY=$only"
    return 1
  fi
  t=$(left)
  if [ "$t" -lt 10 ]; then
    verdict "$name" "NOT RUN" "deadline: ${t}s left of ${deadline}s"
    return 1
  fi
  limit=$cap
  [ "$t" -lt "$cap" ] && limit=$t CUT=1
  echo "== $name (limit ${limit}s of its cap ${cap}s, $(elapsed)s elapsed): $*" >"$logs/$name.log"
  timeout --kill-after=5 "$limit" "$@" >>"$logs/$name.log" 2>&1
  ST=$?
  [ $ST -eq 137 ] && ST=124
  [ $ST -eq 124 ] && echo "== $name: TIMED OUT after ${limit}s" >>"$logs/$name.log"
  echo "== $name: exit $ST ($(elapsed)s elapsed)" >>"$logs/$name.log"
  return 0
}
# judge NAME PASS_TEXT: the verdict of the step just run: exit 0 PASSED, 77 SKIPPED (the log's
# "SKIPPED: why"), a time-out cut by the deadline NOT RUN, anything else FAILED.
judge() {
  local name=$1 text=$2 why
  if [ $ST -eq 0 ]; then
    verdict "$name" PASSED "$text"
  elif [ $ST -eq 77 ]; then
    why=$(grep -m1 -o 'SKIPPED: .*' "$logs/$name.log" | sed 's/^SKIPPED: //')
    verdict "$name" SKIPPED "${why:-exit 77}"
  elif [ $ST -eq 124 ] && [ $CUT -eq 1 ]; then
    verdict "$name" "NOT RUN" "deadline: cut off after $(sed -n 's/.*limit \([0-9]*\)s.*/\1/p' \
      "$logs/$name.log" | head -1)s (see $name.log)"
  elif [ $ST -eq 124 ]; then
    verdict "$name" FAILED "timed out at its cap: a hang or far too slow (see $name.log)"
  else
    why=$(grep -m1 -o 'FAILED: .*\|MISMATCH .*\|FATAL.*' "$logs/$name.log" | sed 's/[ |]*$//' | cut -c1-200)
    verdict "$name" FAILED "exit $ST${why:+: $why} (see $name.log)"
  fi
}
# show NAME REGEX: the log lines matching REGEX into the summary, indented
show() { grep -E "$2" "$logs/$1.log" 2>/dev/null | head -60 | sed 's/^/   /' | tee -a "$summary"; }

# ---------------------------------------------------------------- tools
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
missing=() need_build_tools=()
command -v timeout >/dev/null || missing+=("timeout (coreutils): needed for every step")
for t in cmake "${CC:-cc}" "${CXX:-c++}" nvcc; do
  command -v "$t" >/dev/null || need_build_tools+=("$t")
done
cmv=$(cmake --version 2>/dev/null | sed -n 's/cmake version \([0-9]*\.[0-9]*\).*/\1/p')
if [ -n "$cmv" ] && [ "$(printf '%s\n3.25\n' "$cmv" | sort -V | head -1)" != 3.25 ]; then
  need_build_tools+=("cmake >= 3.25 (found $cmv)")
fi
{
  echo "date: $(date -u)"
  uname -a
  echo "cores: $(nproc)"
  grep -E 'MemTotal|MemAvailable' /proc/meminfo
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  command -v nvcc && nvcc --version | tail -2
  cmake --version 2>&1 | head -1
  "${CC:-cc}" --version 2>&1 | head -1
  command -v compute-sanitizer || echo "compute-sanitizer: not in PATH"
} >"$logs/machine.log" 2>&1
if [ ${#missing[@]} -gt 0 ]; then
  verdict tools FAILED "missing: ${missing[*]}"
  finish
fi
verdict tools PASSED "timeout$([ ${#need_build_tools[@]} -eq 0 ] && echo ', cmake, cc, c++, nvcc' ||
  echo "; missing for a build here: ${need_build_tools[*]}")"

# ---------------------------------------------------------------- driver
# The plugin links the CUDA runtime statically (src/cuda/CMakeLists.txt): the driver must
# support that runtime's version (CUDA 13.x: the R580 branch or newer; 12.x: R525 or newer).
rt_needed=${XTE_DEVICE_CUDA_RUNTIME:-}
[ -z "$rt_needed" ] && [ -f "$bdir/xte_carried.txt" ] && rt_needed=$(sed -n 's/^cuda_runtime //p' "$bdir/xte_carried.txt")
[ -z "$rt_needed" ] && command -v nvcc >/dev/null &&
  rt_needed=$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' | head -1)
have_gpu=0 cc_major=0
if ! command -v nvidia-smi >/dev/null; then
  verdict driver SKIPPED "no nvidia-smi: no NVIDIA driver on this machine; the GPU steps are skipped"
else
  q=$(nvidia-smi --query-gpu=name,driver_version,persistence_mode,compute_cap \
    --format=csv,noheader 2>&1 | head -1)
  cuda_sup=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1 | awk '{print $3}')
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  IFS=',' read -r gname gdrv gpers gcc <<<"$q"
  gdrv=${gdrv# } gpers=${gpers# } gcc=${gcc# }
  if [ "$ngpu" -eq 0 ] || [ -z "$gdrv" ]; then
    verdict driver SKIPPED "nvidia-smi lists no GPU: ${q:-no answer}"
  else
    note "gpu: $gname ($ngpu listed), compute capability ${gcc:-?}"
    note "driver: $gdrv, supports CUDA ${cuda_sup:-?}; plugin needs CUDA ${rt_needed:-?} (static runtime); persistence mode ${gpers:-?}"
    cc_major=${gcc%%.*}
    [[ $cc_major =~ ^[0-9]+$ ]] || cc_major=0
    need_drv=525
    [ "${rt_needed%%.*}" = 13 ] && need_drv=580
    drv_major=${gdrv%%.*}
    if ! [[ $drv_major =~ ^[0-9]+$ ]] || [ "$drv_major" -lt $need_drv ]; then
      verdict driver FAILED "driver $gdrv is older than R$need_drv, which the plugin's static CUDA ${rt_needed:-?} runtime needs: every GPU step would fail; stopping"
      finish
    fi
    if [ -n "$cuda_sup" ] && [ -n "$rt_needed" ] &&
      [ "$(printf '%s\n%s\n' "$rt_needed" "$cuda_sup" | sort -V | head -1)" != "$rt_needed" ]; then
      verdict driver FAILED "the driver supports CUDA $cuda_sup, older than the plugin's runtime $rt_needed; stopping"
      finish
    fi
    verdict driver PASSED "R$drv_major >= R$need_drv for CUDA ${rt_needed:-?}"
    have_gpu=1
  fi
fi

# ---------------------------------------------------------------- build
have() { for t in "$@"; do [ -e "$bdir/$t" ] || return 1; done; }
bins=(libxte_cuda.so tests/test_gpu_quantize tests/test_device_moe tests/test_device_router
  tests/xte_device_info xte)
if [ "$dry" = 1 ]; then
  if have tests/xte_device_info xte; then
    verdict build PASSED "dry run: $bdir as it is"
  else
    verdict build FAILED "dry run: $bdir lacks xte_device_info / the xte program"
    finish
  fi
else
  hash_now=$(bash tests/device/srchash.sh 2>/dev/null)
  hash_built=$(sed -n 's/^srchash //p' "$bdir/xte_carried.txt" 2>/dev/null)
  why=""
  if [ -z "$hash_built" ] || ! have "${bins[@]}"; then
    why="no carried build in $bdir"
  elif [ "$hash_built" != "$hash_now" ]; then
    why="the carried build's sources ($hash_built) are not this tree's ($hash_now)"
  elif ! XTE_PLUGIN_DIR=$(cd "$bdir" && pwd) LD_LIBRARY_PATH=$bdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    "$bdir/tests/xte_device_info" >"$logs/carried-check.log" 2>&1 ||
    ! grep -q 'libxte_cuda.so loaded' "$logs/carried-check.log"; then
    # built on another system: its C / C++ runtime may be older here (GLIBC_2.xx not found)
    why="the carried binaries do not run here: $(grep -m1 -iE 'glibc|not found|error|not loaded' \
      "$logs/carried-check.log" | cut -c1-160)"
  fi
  if [ -z "$why" ]; then
    verdict build PASSED "carried: $(grep -E '^(arch|built)' "$bdir/xte_carried.txt" | tr '\n' ' ')"
  else
    note "build: $why: building here"
    if [ ${#need_build_tools[@]} -gt 0 ]; then
      verdict build FAILED "$why, and no build here: missing ${need_build_tools[*]}"
      finish
    fi
    bdir=$bdir-local
    if run_step build 300 bash -c 'XTE_DEVICE_JOBS=$(nproc) bash tests/device/build.sh "$1"' _ "$bdir"; then
      judge build "built here: $bdir"
      [ $ST -eq 0 ] || finish
    else
      finish
    fi
  fi
fi
bdir=$(cd "$bdir" && pwd)
export LD_LIBRARY_PATH=$bdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ "$dry" = 1 ] || export XTE_PLUGIN_DIR=$bdir
export XTE_GPU_REPORT=$logs/gpu_report.txt # the plugin's report of every GEMM call
T=$bdir/tests
small=()
if [ "$dry" = 1 ]; then
  export XTE_DEVICE_BENCH_SMALL=1 XTE_TEST_GPU_REDUCED=1 SIMT_DEVICE_MEMORY=host
  small=(--reduced)
  have_gpu=1 # the stand-in plugin is the device
fi

# ---------------------------------------------------------------- plugin, FAST status
run_step plugin 60 "$T/xte_device_info" --fast
pst=$ST
show plugin '^cuda:|^fast probe:'
expect_lt=0
probe=$(grep -m1 '^fast probe:' "$logs/plugin.log")
if [ $pst -ne 0 ] && [ $pst -ne 77 ]; then
  verdict plugin FAILED "xte_device_info --fast exit $pst (see plugin.log)"
elif [ $have_gpu -eq 1 ] && grep -q '^fast probe: SKIPPED' "$logs/plugin.log"; then
  verdict plugin FAILED "the driver lists a GPU but xte has no CUDA device: $(grep -m1 '^cuda:' "$logs/plugin.log"); stopping"
  finish
elif [ $have_gpu -eq 0 ]; then
  verdict plugin SKIPPED "no GPU: $(grep -m1 '^cuda:' "$logs/plugin.log")"
elif [[ $probe == *"path=cublaslt"* ]]; then
  expect_lt=1
  verdict plugin PASSED "FAST runs cuBLASLt: ${probe#fast probe: }"
elif [[ $probe =~ why=\"(libcublasLt|compute capability|.*has no |.*is version) ]]; then
  verdict plugin PASSED "FAST is the exact kernel on this machine: ${probe#fast probe: }"
else
  expect_lt=1 # nothing on the machine rules cuBLASLt out: the FAST step expects it too
  verdict plugin FAILED "FAST fell back to the exact kernel where cuBLASLt should run: ${probe#fast probe: }"
fi
gpu_step_ok() { # gpu_step_ok NAME: 0 when there is a device to run on, else the verdict
  [ $have_gpu -eq 1 ] && return 0
  verdict "$1" SKIPPED "no GPU"
  return 1
}

# ---------------------------------------------------------------- 1. byte equality
# quantize family: quantize (every recipe, mode, layout), dequantize, cast, copies and fills
if gpu_step_ok bytes-quantize && run_step bytes-quantize 150 "$T/test_gpu_quantize"; then
  show bytes-quantize '\[(FAIL|CRASH)\]|Synthesis|cases differ|differences over'
  if [ $ST -eq 0 ] && grep -q 'SKIPPED: ' "$logs/bytes-quantize.log"; then
    verdict bytes-quantize FAILED "a test SKIPPED on a machine with a device: $(grep -m1 -o 'SKIPPED: .*' "$logs/bytes-quantize.log")"
  else
    judge bytes-quantize "quantize, dequantize, cast: CUDA = CPU bytes, twice"
  fi
fi
for what in moe router; do
  desc="permute / unpermute and backwards, sort chunks, dispatch layout"
  [ $what = router ] && desc="router fwd / bwd, aux scores / loss, SwiGLU and its fused quantize"
  if gpu_step_ok bytes-$what && run_step bytes-$what 120 "$T/test_device_$what" "${small[@]}"; then
    show bytes-$what 'device mode|cases \(|MISMATCH|FATAL'
    judge bytes-$what "$desc: CUDA = CPU bytes"
  fi
done
# the exact GEMM with the automatic kernel, and its rate
gemm_args=()
[ "$dry" = 1 ] && gemm_args=(64 64 256 1)
exp_auto=simt # the host runner's stand-in runs SIMT unless asked
if [ "$dry" != 1 ]; then
  if [ "$cc_major" -ge 9 ]; then exp_auto=dmma16; elif [ "$cc_major" -ge 8 ]; then exp_auto=dmma4; fi
fi
if gpu_step_ok bytes-gemm &&
  run_step bytes-gemm 120 env -u XTE_CUDA_GEMM_KERNEL "$bdir/xte" bench device gemm "${gemm_args[@]}"; then
  show bytes-gemm '^\||^\(|FAILED'
  if [ $ST -eq 0 ] && grep -E '^\| (dense|grouped)' "$logs/bytes-gemm.log" | grep -vq "| $exp_auto (auto) |"; then
    verdict bytes-gemm FAILED "the automatic kernel is not $exp_auto on compute capability $cc_major.x (see the rows)"
  else
    judge bytes-gemm "exact GEMM, automatic kernel $exp_auto: CUDA = CPU bytes, twice"
  fi
fi
attn_args=()
[ "$dry" = 1 ] && attn_args=(64 1)
if gpu_step_ok bytes-attention &&
  run_step bytes-attention 150 "$bdir/xte" bench device attention "${attn_args[@]}"; then
  show bytes-attention '^\||^attention|FAILED'
  judge bytes-attention "exact attention fwd + bwd: CUDA = CPU bytes, twice"
fi

# ---------------------------------------------------------------- 2. the other GEMM kernels
for k in simt dmma4 dmma16 imma; do
  if gpu_step_ok gemm-$k &&
    run_step gemm-$k 100 env XTE_CUDA_GEMM_KERNEL=$k "$bdir/xte" bench device gemm "${gemm_args[@]}"; then
    show gemm-$k '^\||FAILED'
    judge gemm-$k "forced $k ran (plugin's report) and gave the CPU's bytes"
  fi
done

# ---------------------------------------------------------------- 3. FAST
fast_args=()
[ $expect_lt -eq 1 ] && fast_args+=(--expect-cublaslt)
[ "$dry" = 1 ] && fast_args+=(--no-timing)
if gpu_step_ok fast && run_step fast 120 "$bdir/xte" bench device fast "${fast_args[@]}"; then
  show fast '^\||^fast path|^FAST calls|^expect|^\(|FAILED'
  if [ $ST -eq 0 ] && [ $expect_lt -eq 0 ]; then
    verdict fast SKIPPED "cuBLASLt did not run here (${probe#fast probe: }); the exact kernel met the bound"
  else
    judge fast "every FAST call ran cuBLASLt (plugin's report), every output within the bound of gemm.h"
  fi
fi

# ---------------------------------------------------------------- 4. expert parallelism over NCCL
if gpu_step_ok ep-nccl && selected ep-nccl; then
  if [ -z "${XTE_NCCL_LIBRARY:-}" ] && ! grep -q 'libnccl.so.2 ' <<<"$(ldconfig -p 2>/dev/null)"; then
    for f in /usr/local/cuda*/lib*/libnccl.so.2 /usr/local/cuda*/targets/*/lib/libnccl.so.2 \
      /usr/lib/x86_64-linux-gnu/libnccl.so.2; do
      [ -e "$f" ] && export XTE_NCCL_LIBRARY="$f" && break
    done
  fi
  ep_skipped=0
  if [ -z "${XTE_NCCL_LIBRARY:-}" ] && ! grep -q 'libnccl.so.2 ' <<<"$(ldconfig -p 2>/dev/null)"; then
    verdict ep-nccl SKIPPED "no libnccl.so.2 (ldconfig, /usr/local/cuda*) and no XTE_NCCL_LIBRARY"
    ep_skipped=1
  fi
  ep=("$T/test_ep_nccl_device")
  # the dry run in a build without nvcc: the same program built for the runner, in its real mode
  [ "$dry" = 1 ] && [ ! -x "${ep[0]}" ] && ep=("$T/simt/test_simt_ep" --real)
  if [ $ep_skipped = 1 ]; then
    : # SKIPPED above
  elif [ ! -x "${ep[0]}" ]; then
    verdict ep-nccl FAILED "test_ep_nccl_device is not in the build"
  elif run_step ep-nccl 90 "${ep[@]}"; then
    show ep-nccl '^test_simt_ep|^FAIL'
    ranks=$(sed -n 's/.*up to \([0-9]*\) ranks.*/\1/p' "$logs/ep-nccl.log" | tail -1)
    judge ep-nccl "NCCL EP on device memory = CPU bytes, 1 to ${ranks:-?} rank(s)"
    if [ $ST -eq 0 ] && [ "${ranks:-1}" -lt 2 ]; then
      verdict ep-nccl-ranks SKIPPED "one GPU: NCCL takes one GPU per rank, so no peer traffic was tested"
    elif [ $ST -eq 0 ]; then
      verdict ep-nccl-ranks PASSED "$ranks ranks exchanged tokens over NCCL"
    fi
  fi
fi

# ---------------------------------------------------------------- 5. timings against anchors
bench_args=()
[ "$dry" = 1 ] && bench_args=(256 256 2)
if gpu_step_ok time-quantize && run_step time-quantize 40 "$bdir/xte" bench device "${bench_args[@]}"; then
  show time-quantize '^\||^\('
  judge time-quantize "quantize / dequantize / cast against a device-to-device copy"
fi
anchor_args=()
[ "$dry" = 1 ] && anchor_args=(64 64 256 1)
if gpu_step_ok time-anchors &&
  run_step time-anchors 60 "$bdir/xte" bench device anchors "${anchor_args[@]}"; then
  show time-anchors '^\||^\(|FAILED'
  judge time-anchors "xte GEMMs beside cuBLASLt bf16 and FP8 of the same shape"
fi
if [ "$dry" = 1 ]; then
  verdict time-bench-cuda SKIPPED "dry run: bench_cuda_backend_smoke runs it on the host"
elif gpu_step_ok time-bench-cuda && selected time-bench-cuda; then
  if [ ! -x "$bdir/xte" ]; then
    verdict time-bench-cuda SKIPPED "the GPU-only xte program is not in the build"
  else
    for suite in quantize moe; do
      run_step time-bench-cuda-$suite 30 "$bdir/xte" bench "$suite" --backend cuda --min-time 0.05 \
        --json "$logs/bench-cuda-$suite.json" || continue
      sed -n '/^case  /,$p' "$logs/time-bench-cuda-$suite.log" | sed 's/^/   /' | tee -a "$summary"
      judge time-bench-cuda-$suite "ratios to a d2d copy of the same bytes, CUDA events, L2 flushed"
    done
  fi
fi

# ---------------------------------------------------------------- 6. > 2^31 elements, sanitizer
mem_kb=$(sed -n 's/^MemAvailable: *\([0-9]*\).*/\1/p' /proc/meminfo)
if [ "${XTE_DEVICE_HUGE:-1}" = 0 ]; then
  verdict huge SKIPPED "XTE_DEVICE_HUGE=0"
elif [ "${mem_kb:-0}" -lt $((24 * 1024 * 1024)) ]; then
  verdict huge SKIPPED "$((${mem_kb:-0} / 1048576)) GiB of host memory available, 24 needed"
elif gpu_step_ok huge && run_step huge 120 env XTE_TEST_GPU_HUGE=1 "$T/test_gpu_quantize" \
  --filter 'gpu_quantize/huge_*'; then
  show huge '\[(PASS|FAIL|CRASH)\]|Synthesis'
  judge huge "quantize, dequantize, cast of 524289 x 4096 elements = CPU bytes"
fi
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
  /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck racecheck; do
  if [ "$dry" = 1 ]; then
    verdict $tool SKIPPED "dry run: no device to sanitize"
  elif [ -z "$san" ]; then
    verdict $tool SKIPPED "compute-sanitizer not found"
  elif gpu_step_ok $tool && run_step $tool 60 env XTE_TEST_GPU_REDUCED=1 "$san" --tool $tool \
    --error-exitcode 99 --print-limit 20 "$T/test_gpu_quantize" --no-fork; then
    show $tool 'ERROR SUMMARY|RACECHECK SUMMARY|Synthesis'
    if [ $ST -ne 0 ] && grep -qE 'Device not supported|error 999' "$logs/$tool.log"; then
      verdict $tool SKIPPED "compute-sanitizer cannot use this device (see $tool.log)"
    else
      judge $tool "no error on a reduced quantize case"
    fi
  fi
done

# ---------------------------------------------------------------- targets (information, not verdicts)
# The rates of the CUDA issues' targets beside what this run measured (in the dry run the host
# runner's rates, far below: the lines only show that the logs are read).
target() { # target WHAT MEASURED MIN UNIT
  [ -n "$2" ] || return 0
  local met
  met=$(awk -v m="$2" -v t="$3" 'BEGIN { print (m + 0 >= t + 0) ? "met" : "MISSED" }')
  note "target: $1 >= $3$4: measured $2$4 ($met)"
}
col() { # col LOG ROW-REGEX N: field N of the first table row matching ROW-REGEX
  [ -f "$logs/$1.log" ] && grep -m1 -E "$2" "$logs/$1.log" | awk -F'|' -v n="$3" '{ gsub(/[^0-9.]/, "", $n); print $n }'
}
target "quantize 1x128 rowwise, x d2d copy" "$(col time-quantize '^\| quantize 1x128 rowwise' 5)" 0.6 ""
target "exact GEMM simt" "$(col gemm-simt '^\| exact GEMM \(kernel' 4)" 15 " TFLOPS"
target "exact GEMM dmma16" "$(col gemm-dmma16 '^\| exact GEMM \(kernel' 4)" 40 " TFLOPS"
target "exact GEMM dmma4" "$(col gemm-dmma4 '^\| exact GEMM \(kernel' 4)" 40 " TFLOPS"
target "exact GEMM imma (int8 digits)" "$(col gemm-imma '^\| exact GEMM \(kernel' 4)" 100 " TFLOPS"
target "exact attention fwd (full)" "$(col bytes-attention '^\| full fwd' 4)" 25 " TFLOPS"
target "exact attention bwd (full)" "$(col bytes-attention '^\| full bwd' 4)" 15 " TFLOPS"

finish
