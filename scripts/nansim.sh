#!/usr/bin/env bash
# The NaN rule in CI (docs/numerics.md, section 2, "NaN bits"): builds the library with
# XTE_NAN_SIM (cmake/XteNanSim.cmake; the shared numerics then give 0x7FFFFFFF for every NaN an
# operation produces, as a GPU does) and runs the byte-equality tests with the scalar ISA, which
# runs those numerics, against their oracles and against the real x86 SIMD ISAs (the tests that
# sweep the ISAs themselves). A NaN whose bits are left to the hardware fails here.
#
#   scripts/nansim.sh [extra ctest-style test names to run as well]
#
# Build directory ${XTE_NANSIM_BUILD_DIR:-build-nansim} (Release, no SIMDe, no benchmarks, no
# GPU plugins). Exits non-zero when a test fails or the simulation is not in effect.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${XTE_NANSIM_BUILD_DIR:-build-nansim}
jobs=${XTE_JOBS:-$(nproc)}

# The byte-equality tests (oracle and ISA-identity), a lean subset: a few minutes on 2 cores.
tests=(test_nan_rule test_quantize_recipes test_quantize_layouts test_quantize_streaming
       test_quantize_cast_e8m0 test_gemm_exact test_gemm_grouped test_attention_order
       test_attention_bitident test_moe_router test_moe_swiglu test_moe_permute test_moe_hostile
       test_gemm_fast test_gemm_fast_small)
tests+=("$@")

if ! command -v ninja >/dev/null 2>&1; then
  echo "nansim: ninja is missing (scripts/deps.sh)" >&2
  exit 2
fi
extra=()
if ! grep -q 'XteNanSim' CMakeLists.txt; then
  # not yet included by the top-level CMakeLists.txt: the module defers itself to its end
  extra+=(-DCMAKE_PROJECT_INCLUDE="$PWD/cmake/XteNanSim.cmake")
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DXTE_NAN_SIM=ON -DXTE_WERROR=ON \
  -DXTE_CUDA=OFF -DXTE_MUSA=OFF -DXTE_BUILD_TESTS=ON -DXTE_BUILD_BENCH=OFF -DXTE_SIMDE=OFF \
  "${extra[@]}" >/dev/null
# the simulation must reach the scalar ISA (and must not reach the SIMD kernels)
if ! grep -q 'XTE_NAN_SIM=1' <<<"$(grep -A3 'src/cpu/scalar/quantize_scalar.c' "$build/build.ninja")"; then
  echo "nansim: XTE_NAN_SIM=1 is not on src/cpu/scalar/quantize_scalar.c: not a NaN-simulating build" >&2
  exit 1
fi
if grep -q 'XTE_NAN_SIM=1' <<<"$(grep -A3 'src/cpu/avx2/quantize_avx2.c' "$build/build.ninja")"; then
  echo "nansim: XTE_NAN_SIM reached the AVX2 kernels (they are real hardware)" >&2
  exit 1
fi
cmake --build "$build" -j"$jobs" --target "${tests[@]}"

fail=0
for t in "${tests[@]}"; do
  start=$(date +%s)
  if XTE_CPU_ISA=scalar "$build/tests/$t" --jobs 1 >"$build/nansim-$t.log" 2>&1; then
    echo "nansim: $t passed ($(($(date +%s) - start)) s)"
  else
    echo "nansim: $t FAILED ($(($(date +%s) - start)) s); its log, $build/nansim-$t.log, ends:"
    tail -n 30 "$build/nansim-$t.log"
    fail=1
  fi
done
if [ "$fail" != 0 ]; then
  echo "nansim: FAILED: a NaN made by hardware reaches an output byte (docs/numerics.md, NaN bits)"
  exit 1
fi
echo "nansim: all ${#tests[@]} tests passed"
