#!/usr/bin/env bash
# The AVX2-only machine, on any x86-64 machine: the build's programs and a subset of its byte
# tests under qemu-user with a Haswell CPU (AVX2, FMA, F16C; no AVX-512). qemu's CPUID reports no
# AVX-512 and an AVX-512 instruction is a SIGILL there, as on AMD Zen 3 or an Intel Haswell, so
# an AVX-512 instruction that reached the AVX2, SIMDe or baseline code, or an ISA chosen from the
# wrong CPUID bits, fails here even on an AVX-512 CI machine. (scripts/isa_gate.sh reads the
# same objects statically; this runs them.)
#
#   scripts/qemu_avx2.sh [BUILD_DIR]      (default build; built first, e.g. scripts/build.sh)
#   exit 0: every check passed; 1: a check failed; 2: cannot run (no qemu-x86_64: apt-get install
#   qemu-user, scripts/deps.sh; no C compiler; not built). About 5 minutes on 2 cores.
#
# The checks, each under qemu-x86_64 -cpu Haswell:
#  0. the emulator itself: CPUID shows AVX2, FMA and F16C and no AVX-512F; AVX2 / FMA / F16C
#     instructions give the right results; an AVX-512F and an AVX-512VL (EVEX ymm) instruction
#     die of SIGILL; a program that executes itself again (as Criterion runs every test) is still
#     emulated (tests/qemu/isa_probe.c, tests/qemu/exec_shim.c).
#  1. xte info runs and lists avx2 and avx512_simde as available and avx512 as not.
#  2. avx512 asked for is refused cleanly: XTE_CPU_ISA=avx512 xte info runs on avx2 and says so,
#     xte_isa_run avx512 exits 77 (SKIPPED), xte moe --isa avx512 exits with a message; no signal.
#  3. byte tests at their small cases (the list below): the tests that sweep the ISAs themselves
#     run once (scalar, avx2, avx512_simde; avx512 is skipped inside them, which is no failure),
#     the tests of the default ISA once per ISA (XTE_CPU_ISA=scalar, avx2, avx512_simde).
#  4. xte_isa_digest --small (every CPU entry point, 1,618 cases) under XTE_CPU_ISA=avx2 and
#     avx512_simde gives the bytes recorded in tests/data/isa_digest_small.txt.
#  5. xte moe at a small shape (hidden 128, FFN 128, 4 experts, 16 tokens, top-2, every token
#     checked against the fp64 layer) under XTE_CPU_ISA=avx2 and avx512_simde.
#
# Criterion starts each test by executing the test binary again; qemu-user would run that
# natively, so tests/qemu/exec_shim.c (LD_PRELOAD in the emulated process) runs every program the
# emulated process executes under the same qemu, and each test run must show that it did.
#
#   XTE_QEMU       qemu-user binary (default qemu-x86_64)
#   XTE_QEMU_CPU   CPU model (default Haswell, less the features TCG lacks, which it warns about)
#   XTE_QEMU_TIMEOUT  seconds one test program may take (default 240)
# Logs: BUILD_DIR/qemu_avx2/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=${1:-build}
if ! build=$(cd "$build" 2>/dev/null && pwd); then
  echo "qemu_avx2: no build directory ${1:-build}" >&2
  exit 2
fi
qemu_name=${XTE_QEMU:-qemu-x86_64}
cpu=${XTE_QEMU_CPU:-Haswell,-pcid,-x2apic,-tsc-deadline,-hle,-invpcid,-rtm}
tmo=${XTE_QEMU_TIMEOUT:-240}
t0=$SECONDS
ulimit -c 0 # qemu dumps core on the guest's SIGILL otherwise
unset XTE_CPU_ISA # each check sets it where it means to

# ---------------------------------------------------------------- the byte tests (check 3)
# "ISA TEST FILTER COUNT": ISA "sweep" runs the test once with no XTE_CPU_ISA (it sweeps the ISAs
# itself); "each" runs it once per ISA of $per_isa. FILTER is Criterion's (extglob: @(a|b)) and
# must select exactly COUNT tests, so a renamed test cannot drop out unnoticed. The cases are the
# small ones of each kernel family: qemu's AVX2 runs some 30-300x slower than the hardware, and
# this list takes about 3-4 minutes on 2 cores (qemu 7.2). Left out: gemm_exact's
# amx_in_use_where_the_cpu_has_it and vnni_in_use_where_the_cpu_has_it, which read the host's
# /proc/cpuinfo (qemu-user does not emulate it) and so fail under qemu on an AMX / VNNI host.
per_isa="scalar avx2 avx512_simde"
tests=(
  # quantize and cast (the block, MX and power-of-two paths), scale layouts, streaming stores
  "sweep test_quantize_recipes recipes/@(te_block_default_pow2|anchors_scales|anchors_special_values|te_current_edges_fp64) 4"
  "sweep test_quantize_cast_e8m0 cast_e8m0/* 3"
  "sweep test_quantize_layouts layouts/@(swizzle_formula_anchor|strided_views_and_empty) 2"
  "sweep test_quantize_streaming quantize_streaming/* 2"
  "sweep test_nan_rule nan_rule/* 6"
  # exact GEMM, dense (blocking edges, every small-M path) and grouped
  "sweep test_gemm_exact gemm_exact/@(blocking_edges|small_m_every_path|small_m_e4m3_codes|nan_inf_and_extreme_codes|nan_codes_in_a_transposed_operand|hybrid_double_rounding_cases|dense_path_nan_and_extreme_e4m3_codes|accumulate_and_bias) 8"
  "sweep test_gemm_grouped gemm_grouped/@(small_groups_special_codes|k_grouped_wgrad|masked_m_out_of_range) 3"
  "sweep test_gemm_fast gemm_fast/@(nan_inf_subnormal|empty_shapes|grouped_masked_same_bytes) 3"
  "sweep test_gemm_fast_small gemm_fast_small/@(nan_inf_rule|subnormals_exact|mxfp8|empty) 4"
  # MoE: router, token movement, SwiGLU
  "sweep test_moe_router moe_router/@(simd_lanes_exact|simd_selection_paths|simd_fused_pass_shapes|sigmoid_bias_groups|backward_documented_order_bits|aux_scores_normalised_every_topk|softmax_pre_and_post|sqrtsoftplus) 8"
  "sweep test_moe_permute moe_permute/@(unpermute_isas_agree|unpermute_round_trip_and_backward|map_and_index_all_dtypes|capacity_and_alignment|dispatch_layout|sort_chunks) 6"
  "sweep test_moe_swiglu moe_swiglu/@(special_values_plain_bits|special_values_fused_bits|fused_forward_equals_composed) 3"
  # attention
  "sweep test_attention_bitident attention_bitident/fp32_specials_in_place 1"
  "sweep test_attention_order attention_order/@(no_mask_odd_dims|thd_varlen_padding) 2"
  "sweep test_attention_lanes attention_lanes/exp_short_lengths 1"
  "each test_attention_fwd attention_fwd/@(softcap_alibi|padding_bshd|nan_key_gives_nan_rows|windows) 4"
  "each test_attention_bwd attention_bwd/@(thd_max_seqlen_far_above|no_query_rows_many_heads|finite_differences) 3"
  "each test_attention_fp8 attention_fp8/e4m3_fp32_out 1"
  "each test_threads threads/cast_invariance 1"
  "each test_moe_swiglu moe_swiglu/forward_backward_contract 1"
)

work=$build/qemu_avx2
mkdir -p "$work" || exit 2
fail=0
failed=()
bad() {
  echo "qemu_avx2: FAIL: $*"
  failed+=("$*")
  fail=1
}
stamp() { printf '%3d s' $((SECONDS - t0)); }

# ---------------------------------------------------------------- can it run
qemu=$(command -v "$qemu_name" || true)
if [ -z "$qemu" ]; then
  echo "qemu_avx2: $qemu_name is missing: install qemu-user (apt-get install qemu-user;" \
    "scripts/deps.sh lists it)" >&2
  exit 2
fi
cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null | head -n1)
[ -x "$cc" ] || cc=$(command -v cc || command -v gcc || true)
if [ -z "$cc" ]; then
  echo "qemu_avx2: no C compiler for the probe programs" >&2
  exit 2
fi
for f in "$build/xte" "$build/tests/xte_isa_run"; do
  if [ ! -x "$f" ]; then
    echo "qemu_avx2: $f is missing: build first (scripts/build.sh; XTE_BUILD_BENCH and" \
      "XTE_BUILD_TESTS on)" >&2
    exit 2
  fi
done
echo "== qemu_avx2: $($qemu -version | head -n1), -cpu $cpu, build $build"
if ! "$cc" -O1 -std=c11 -Wall -Wextra -Werror -o "$work/isa_probe" tests/qemu/isa_probe.c \
  >"$work/cc.log" 2>&1 ||
  ! "$cc" -O2 -std=c11 -Wall -Wextra -Werror -shared -fPIC -o "$work/exec_shim.so" \
    tests/qemu/exec_shim.c -ldl >>"$work/cc.log" 2>&1; then
  cat "$work/cc.log" >&2
  echo "qemu_avx2: the probe programs do not compile" >&2
  exit 2
fi

# q CMD...: CMD under qemu, every program it executes as well (the shim)
export XTE_QEMU_BIN=$qemu XTE_QEMU_CPU=$cpu
q() { "$qemu" -cpu "$cpu" -E "LD_PRELOAD=$work/exec_shim.so" "$@"; }

# ---------------------------------------------------------------- 0. the emulator
echo "== 0. the emulator: $cpu"
probe=$work/isa_probe
out=$(q "$probe" cpuid 2>&1)
if [ "$out" != "avx2 1 fma 1 f16c 1 avx512f 0" ]; then
  bad "CPUID under qemu -cpu $cpu reads '$out', want 'avx2 1 fma 1 f16c 1 avx512f 0'"
fi
if ! out=$(q "$probe" avx2 2>&1); then
  bad "AVX2 / FMA / F16C instructions under qemu: $out"
fi
for m in avx512 avx512vl; do
  q "$probe" $m >"$work/probe_$m.log" 2>&1
  rc=$?
  if [ "$rc" != 132 ]; then
    bad "an ${m^^} instruction under qemu -cpu $cpu exited $rc, not SIGILL (132): this qemu" \
      "runs AVX-512, so it cannot show what an AVX2-only CPU does" \
      "($(tail -n1 "$work/probe_$m.log"))"
  fi
done
rm -f "$work/shim.log"
out=$(XTE_QEMU_SHIM_LOG=$work/shim.log q "$probe" exec 2>&1)
if [ "$out" != "avx2 1 fma 1 f16c 1 avx512f 0" ] ||
  ! grep -q isa_probe "$work/shim.log" 2>/dev/null; then
  bad "a program executed by an emulated one is not emulated (read '$out'; tests/qemu/exec_shim.c)"
fi
if [ "$fail" != 0 ]; then
  echo "qemu_avx2: FAILED: the emulator does not stand for an AVX2-only CPU here; nothing else run"
  exit 1
fi
echo "   CPUID avx2 fma f16c, no avx512f; AVX-512F and AVX-512VL instructions: SIGILL;" \
  "re-executed programs emulated ($(stamp))"

# ---------------------------------------------------------------- 1. xte info
echo "== 1. xte info"
q "$build/xte" info >"$work/info.log" 2>&1
rc=$?
avail=$(sed -n 's/.*isa in use .*available:\(.*\)$/\1/p' "$work/info.log" | head -n1)
inuse=$(sed -n 's/.*isa in use \([a-z0-9_]*\),.*/\1/p' "$work/info.log" | head -n1)
grep -a -E '^ +(isa |exact )' "$work/info.log" | sed 's/^ */   /'
if [ "$rc" != 0 ]; then
  bad "xte info exited $rc under qemu ($(tail -n2 "$work/info.log" | tr '\n' ' '))"
elif [ -z "$avail" ]; then
  bad "xte info: no 'isa in use ..., available: ...' line (log $work/info.log)"
else
  case " $avail " in
    *" avx512 "*) bad "xte info lists avx512 as available on a CPU without AVX-512: '$avail'" ;;
  esac
  case " $avail " in
    *" avx2 "*) ;;
    *) bad "xte info does not list avx2 as available: '$avail'" ;;
  esac
  case " $avail " in
    *" avx512_simde "*) ;;
    *) bad "xte info does not list avx512_simde as available: '$avail' (XTE_SIMDE=$(sed -n \
      's/^XTE_SIMDE:[A-Z]*=//p' "$build/CMakeCache.txt"))" ;;
  esac
  [ "$inuse" = avx2 ] || bad "xte info: ISA in use '$inuse' under qemu, want avx2 (the best there)"
fi

# ---------------------------------------------------------------- 2. avx512 refused cleanly
echo "== 2. avx512 asked for on a CPU without it"
XTE_CPU_ISA=avx512 q "$build/xte" info >"$work/info_avx512.log" 2>&1
rc=$?
inuse=$(sed -n 's/.*isa in use \([a-z0-9_]*\),.*/\1/p' "$work/info_avx512.log" | head -n1)
note=$(grep -a 'XTE_CPU_ISA=avx512' "$work/info_avx512.log" | head -n1 | sed 's/^ *//')
if [ "$rc" != 0 ] || [ "$inuse" = avx512 ] || [ -z "$inuse" ]; then
  bad "XTE_CPU_ISA=avx512 xte info: exit $rc, ISA in use '$inuse' (want exit 0, not avx512)"
elif [ -z "$note" ]; then
  bad "XTE_CPU_ISA=avx512 xte info: runs on $inuse but does not say what became of" \
    "XTE_CPU_ISA=avx512 (no 'XTE_CPU_ISA=avx512: ...' line; log $work/info_avx512.log)"
else
  echo "   XTE_CPU_ISA=avx512 xte info: exit 0, isa in use $inuse; $note"
fi
out=$(q "$build/tests/xte_isa_run" avx512 true 2>&1)
rc=$?
if [ "$rc" != 77 ] || [[ "$out" != SKIPPED* ]]; then
  bad "xte_isa_run avx512 true: exit $rc, '$out' (want 77, SKIPPED: ...)"
else
  echo "   xte_isa_run avx512 true: exit 77, $out"
fi
q "$build/xte" moe --hidden 128 --ffn 128 --experts 4 --tokens 16 --topk 2 --isa avx512 --quiet \
  >"$work/moe_avx512.log" 2>&1
rc=$?
if [ "$rc" = 0 ] || [ "$rc" -ge 128 ] || ! grep -q "avx512" "$work/moe_avx512.log"; then
  bad "xte moe --isa avx512: exit $rc (want a refusal, 1 or 2, with a message, never a signal):" \
    "$(tail -n2 "$work/moe_avx512.log" | tr '\n' ' ')"
else
  echo "   xte moe --isa avx512: exit $rc, $(tail -n1 "$work/moe_avx512.log")"
fi

# ---------------------------------------------------------------- 3. byte tests
echo "== 3. byte tests (scalar, avx2, avx512_simde; each run's log in $work/)"
# run_test LABEL ISA EXE FILTER COUNT: ISA "" runs it with no XTE_CPU_ISA
run_test() {
  local label=$1 isa=$2 exe=$3 filt=$4 want=$5 log rc s syn n p f c
  log="$work/$label.log"
  s=$SECONDS
  rm -f "$work/shim.log"
  if [ -n "$isa" ]; then
    XTE_CPU_ISA=$isa XTE_QEMU_SHIM_LOG=$work/shim.log timeout -k 10 "$tmo" \
      "$qemu" -cpu "$cpu" -E "LD_PRELOAD=$work/exec_shim.so" "$build/tests/$exe" --jobs 1 \
      --filter "$filt" >"$log" 2>&1
  else
    env -u XTE_CPU_ISA XTE_QEMU_SHIM_LOG="$work/shim.log" timeout -k 10 "$tmo" \
      "$qemu" -cpu "$cpu" -E "LD_PRELOAD=$work/exec_shim.so" "$build/tests/$exe" --jobs 1 \
      --filter "$filt" >"$log" 2>&1
  fi
  rc=$?
  syn=$(grep -a 'Synthesis:' "$log" | tail -n1)
  n=$(printf '%s' "$syn" | sed -n 's/.*Tested: \([0-9]*\).*/\1/p')
  p=$(printf '%s' "$syn" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
  f=$(printf '%s' "$syn" | sed -n 's/.*Failing: \([0-9]*\).*/\1/p')
  c=$(printf '%s' "$syn" | sed -n 's/.*Crashing: \([0-9]*\).*/\1/p')
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    bad "$label: over ${tmo} s under qemu (XTE_QEMU_TIMEOUT); log $log"
  elif [ "$rc" != 0 ] || [ -z "$n" ] || [ "${f:-1}" != 0 ] || [ "${c:-1}" != 0 ]; then
    bad "$label: exit $rc, ${syn:-no Criterion summary}; log $log"
    grep -a -E '\[FAIL\]|Assertion|Expected|expression|SIGILL|signal|CRASH' "$log" | head -n 9 |
      sed 's/^/     /'
  elif [ "$n" != "$want" ]; then
    bad "$label: filter '$filt' ran $n tests, want $want (renamed or removed?)"
  elif ! grep -q "/$exe\$" "$work/shim.log" 2>/dev/null; then
    bad "$label: the test processes were not emulated (no exec through tests/qemu/exec_shim.c)"
  else
    printf '   %-58s %2d passed' "$label" "$p"
    [ "$p" != "$n" ] && printf ', %d skipped' $((n - p))
    printf '  %4d s\n' $((SECONDS - s))
  fi
}
for entry in "${tests[@]}"; do
  read -r mode exe filt want <<<"$entry"
  if [ ! -x "$build/tests/$exe" ]; then
    bad "$exe is not built ($build/tests/$exe)"
    continue
  fi
  if [ "$mode" = sweep ]; then
    run_test "$exe" "" "$exe" "$filt" "$want"
  else
    for isa in $per_isa; do
      run_test "$exe@$isa" "$isa" "$exe" "$filt" "$want"
    done
  fi
done

# ---------------------------------------------------------------- 4. xte_isa_digest
# every CPU entry point on fixed inputs with NaN, inf, subnormals and odd shapes (tests/isa_digest/,
# --small: 1,618 cases), byte for byte against the recorded digest (ctest isa_digest_golden)
echo "== 4. xte_isa_digest --small against tests/data/isa_digest_small.txt"
digest=$build/tests/xte_isa_digest
golden=tests/data/isa_digest_small.txt
if [ ! -f "$golden" ] && [ ! -x "$digest" ]; then
  echo "   (no tests/isa_digest/ in this tree: left out)"
elif [ ! -x "$digest" ] || [ ! -f "$golden" ]; then
  bad "xte_isa_digest: $digest or $golden is missing (build first)"
else
  for isa in avx2 avx512_simde; do
    s=$SECONDS
    XTE_CPU_ISA=$isa timeout -k 10 "$tmo" "$qemu" -cpu "$cpu" "$digest" --small \
      >"$work/digest_$isa.out" 2>"$work/digest_$isa.err" </dev/null
    rc=$?
    summary=$(tail -n1 "$work/digest_$isa.err" | sed 's/^xte_isa_digest: //')
    if [ "$rc" != 0 ]; then
      bad "xte_isa_digest --small (XTE_CPU_ISA=$isa): exit $rc; $(tail -n3 "$work/digest_$isa.err" |
        tr '\n' ' ')"
    elif [[ "$summary" != *"isa $isa" ]]; then
      bad "xte_isa_digest --small (XTE_CPU_ISA=$isa) ran on another ISA: $summary"
    elif ! diff -q "$golden" "$work/digest_$isa.out" >/dev/null; then
      bad "xte_isa_digest --small (XTE_CPU_ISA=$isa): $(diff "$golden" "$work/digest_$isa.out" |
        grep -c '^>') lines differ from $golden; the first:"
      diff "$golden" "$work/digest_$isa.out" | grep '^[<>]' | head -n 6 | sed 's/^/     /'
    else
      printf '   %-58s %s  %4d s\n' "xte_isa_digest --small XTE_CPU_ISA=$isa" "same bytes" \
        $((SECONDS - s))
    fi
  done
fi

# ---------------------------------------------------------------- 5. xte moe
echo "== 5. xte moe, small shape, against the fp64 layer"
for isa in avx2 avx512_simde; do
  s=$SECONDS
  log=$work/moe_$isa.log
  XTE_CPU_ISA=$isa timeout -k 10 "$tmo" "$qemu" -cpu "$cpu" "$build/xte" moe --hidden 128 \
    --ffn 128 --experts 4 --tokens 16 --topk 2 --check-tokens 16 --quiet >"$log" 2>&1
  rc=$?
  if [ "$rc" != 0 ] || ! grep -q "numerics: PASS" "$log"; then
    bad "xte moe (XTE_CPU_ISA=$isa): exit $rc; $(grep -a -E 'numerics:|error|Illegal|signal' "$log" |
      tail -n 3 | tr '\n' ' ') log $log"
  elif ! grep -q "backend   cpu ($isa," "$log"; then
    bad "xte moe (XTE_CPU_ISA=$isa) ran on another ISA: $(grep -a 'backend' "$log" | head -n1)"
  else
    printf '   %-58s %s  %4d s\n' "xte moe XTE_CPU_ISA=$isa" \
      "$(grep -a -o 'numerics: PASS' "$log")" $((SECONDS - s))
  fi
done

echo "qemu_avx2: $((SECONDS - t0)) s in all"
if [ "$fail" != 0 ]; then
  echo "qemu_avx2: FAILED (${#failed[@]}):"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "qemu_avx2: all checks passed on the emulated AVX2-only CPU"
