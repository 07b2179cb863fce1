#!/usr/bin/env bash
# The device script's dry run (ctest device_dryrun_*): tests/device/run.sh end to end on the CPU
# machine, with stand-ins for what only a GPU machine has:
#   the device   the host SIMT runner's plugin (tests/simt/simt_plugin.cpp: the CUDA kernel text
#                run on the host, reporting what it ran as the CUDA plugin does; its FAST is
#                cublaslt.cu's applicability decision computed by the exact kernel)
#   nvidia-smi   tests/device/stub/nvidia-smi (driver, CUDA version, persistence, name)
#   libnccl      tests/simt/fake_nccl.c (ranks as threads)
# so that the ordering, the verdicts, the deadline, the kernel naming and the summary are tested
# before any GPU is seen. Modes (each asserts its own outcome; "dryrun: PASS" / "dryrun: FAIL"):
#   full          every step reached, in order, with a verdict; nothing FAILED or NOT RUN; the
#                 forced kernels named as the plugin reported them; every FAST call on the
#                 cuBLASLt path (the stand-in's), a bias case among them; exit 0
#   plant-kernel  planted bug: a forced kernel does not run (XTE_DEVICE_PLANT=kernel): red
#   plant-fast    planted bug: every FAST call falls back (XTE_DEVICE_PLANT=fast): red
#   plant-bias    planted bug: a FAST call with a bias falls back (XTE_DEVICE_PLANT=fast-bias),
#                 the old bias-dtype bug: red
#   driver        a driver older than the plugin's runtime needs: the run stops within seconds
#                 with that reason, no step after it runs
#   deadline      a deadline too short for the steps: later steps NOT RUN (never FAILED for it),
#                 exit 3, and the script ends within the deadline
#   tests/device/dryrun.sh BUILD_DIR MODE
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
b=$(cd "${1:?BUILD_DIR}" && pwd)
mode=${2:?MODE}
out=$b/device_dryrun_$mode
rm -rf "$out"
mkdir -p "$out"
unset XTE_CUDA_GEMM_KERNEL XTE_DEVICE_PLANT XTE_DEVICE_ONLY XTE_GPU_REPORT XTE_DEVICE_DEADLINE
export XTE_DEVICE_DRYRUN=1 XTE_BUILD_DIR=$b XTE_PLUGIN_DIR=$b/tests/simt/plugin XTE_DEVICE_HUGE=0
export PATH=$src/tests/device/stub:$PATH
# the runtime a CUDA 13 plugin links (the stand-in has none; without nvcc run.sh could not tell)
export XTE_DEVICE_CUDA_RUNTIME=13.0
export XTE_NCCL_LIBRARY=$b/tests/simt/fake_nccl/libxte_fake_nccl.so
# no cuBLASLt for the anchors (the toolkit's would find no device): the step says SKIPPED
export XTE_CUBLASLT_LIBRARY=/nonexistent/libcublasLt-dry-run.so.13
unset XTE_STUB_DRIVER XTE_STUB_CUDA
fails=0
fail() {
  echo "dryrun $mode: $*"
  fails=$((fails + 1))
}
expect() { grep -qE "$1" "$out/summary.txt" || fail "summary lacks /$1/"; }
expect_not() { ! grep -qE "$1" "$out/summary.txt" || fail "summary has /$1/: $(grep -m1 -E "$1" "$out/summary.txt")"; }

case $mode in
  plant-kernel) export XTE_DEVICE_PLANT=kernel XTE_DEVICE_ONLY='^gemm-dmma4$' ;;
  plant-fast) export XTE_DEVICE_PLANT=fast XTE_DEVICE_ONLY='^fast$' ;;
  plant-bias) export XTE_DEVICE_PLANT=fast-bias XTE_DEVICE_ONLY='^fast$' ;;
  driver) export XTE_STUB_DRIVER=550.54.15 XTE_STUB_CUDA=12.4 ;;
  deadline) export XTE_DEVICE_DEADLINE=${XTE_DRYRUN_DEADLINE:-14} ;;
  full) ;;
  *)
    echo "dryrun: unknown mode $mode"
    exit 2
    ;;
esac
t0=$(date +%s)
bash "$src/tests/device/run.sh" "$out" >"$out/run.out" 2>&1
rc=$?
secs=$(($(date +%s) - t0))
echo "---- summary ($mode, exit $rc, ${secs}s)"
cat "$out/summary.txt"
echo "----"

steps=(tools driver build plugin bytes-quantize bytes-moe bytes-router bytes-gemm bytes-attention
  gemm-simt gemm-dmma4 gemm-dmma16 gemm-imma fast ep-nccl ep-nccl-ranks time-quantize time-anchors
  time-bench-cuda huge memcheck racecheck)
case $mode in
  full)
    [ $rc -eq 0 ] || fail "exit $rc, expected 0"
    expect_not ': FAILED'
    expect_not ': NOT RUN'
    # every step reached, in this order, the machine's lines first
    prev=0
    for s in "${steps[@]}"; do
      n=$(grep -n -m1 -E "^$s: (PASSED|FAILED|SKIPPED|NOT RUN)" "$out/summary.txt" | cut -d: -f1)
      if [ -z "$n" ]; then
        fail "no verdict for step $s"
      elif [ "$n" -le "$prev" ]; then
        fail "step $s out of order (line $n after line $prev)"
      else
        prev=$n
      fi
    done
    head -1 "$out/summary.txt" | grep -q '^tools: PASSED' || fail "the first line is not the tools'"
    sed -n 2p "$out/summary.txt" | grep -q '^gpu: .*compute capability' || fail "line 2 is not the GPU's"
    sed -n 3p "$out/summary.txt" | grep -q '^driver: 580.* supports CUDA 13.0; plugin needs CUDA .*persistence mode Enabled' ||
      fail "line 3 is not the driver's"
    grep -q '^plugin: PASSED (FAST runs cuBLASLt: gemm mode=fast path=cublaslt' "$out/summary.txt" ||
      fail "the plugin's FAST status is not the plugin-reported cuBLASLt path"
    for k in simt dmma4 dmma16 imma; do
      expect "^gemm-$k: PASSED"
      grep -q "| $k (forced) |" "$out/gemm-$k.log" || fail "gemm-$k: no row names $k as run"
      grep -q "FAILED" "$out/gemm-$k.log" && fail "gemm-$k: a FAILED row"
    done
    grep -q 'imma does not take e5m2' "$out/gemm-imma.log" || fail "gemm-imma: the e5m2 row does not say why imma did not run"
    grep -q '| simt (auto) |' "$out/bytes-gemm.log" || fail "bytes-gemm: the automatic kernel is not named"
    grep -qE '^FAST calls: ([0-9]+), through cuBLASLt: \1 ' "$out/fast.log" ||
      fail "fast: not every FAST call reported the cuBLASLt path"
    grep -q '+ bias.*| cublaslt |' "$out/fast.log" || fail "fast: no bias case on the cuBLASLt path"
    grep -q 'one block partial' "$out/fast.log" || fail "fast: no one-block-partial case"
    grep -q 'bias=fp32-epilogue' "$out/gpu_report.txt" || fail "the plugin's report has no fp32-epilogue bias"
    expect '^ep-nccl: PASSED'
    expect '^ep-nccl-ranks: SKIPPED \(one GPU'
    expect '^verdicts: [0-9]+ PASSED, 0 FAILED, [0-9]+ SKIPPED, 0 NOT RUN'
    for t in 'quantize 1x128 rowwise' 'exact GEMM simt' 'exact GEMM dmma16' 'exact GEMM imma' \
      'exact attention fwd' 'exact attention bwd'; do
      expect "^target: $t.*: measured [0-9.]+"
    done
    ;;
  plant-kernel)
    [ $rc -eq 1 ] || fail "exit $rc, expected 1 (the planted bug must turn the run red)"
    expect '^gemm-dmma4: FAILED'
    grep -q 'forced dmma4 did not run: ran simt' "$out/gemm-dmma4.log" || fail "the row does not say dmma4 did not run"
    ;;
  plant-fast)
    [ $rc -eq 1 ] || fail "exit $rc, expected 1"
    expect '^plugin: FAILED \(FAST fell back to the exact kernel where cuBLASLt should run: .*planted fallback'
    expect '^fast: FAILED'
    ;;
  plant-bias)
    [ $rc -eq 1 ] || fail "exit $rc, expected 1"
    expect '^plugin: PASSED \(FAST runs cuBLASLt'
    expect '^fast: FAILED'
    grep -q 'FAILED: FAST fell back to the exact kernel where cuBLASLt was expected: planted' "$out/fast.log" ||
      fail "fast.log does not name the fallback"
    ;;
  driver)
    [ $rc -eq 1 ] || fail "exit $rc, expected 1"
    expect '^driver: FAILED \(driver 550.54.15 is older than R580'
    expect_not '^(build|plugin|bytes-)'
    [ $secs -le 10 ] || fail "took ${secs}s to stop, expected seconds"
    ;;
  deadline)
    dl=${XTE_DEVICE_DEADLINE}
    [ $rc -eq 3 ] || fail "exit $rc, expected 3 (NOT RUN, nothing FAILED)"
    expect_not ': FAILED'
    expect ': NOT RUN \(deadline'
    expect '^racecheck: '
    [ $secs -le $((dl + 10)) ] || fail "took ${secs}s, deadline ${dl}s"
    ;;
esac
if [ $fails -eq 0 ]; then
  echo "dryrun: PASS ($mode)"
else
  echo "dryrun: FAIL ($mode: $fails)"
  exit 1
fi
