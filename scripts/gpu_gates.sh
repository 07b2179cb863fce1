#!/usr/bin/env bash
# Compile gates for the CUDA plugin (CI; needs nvcc, no GPU). One build of libxte_cuda.so for
# every CI architecture at once (sm_80, sm_89, sm_90a by default), warnings as errors, then:
#
#  1. warnings: nvcc, the host compiler and ptxas warnings are errors (XTE_WERROR=ON:
#     -Werror=all-warnings, -Xptxas=-Werror; src/cuda/CMakeLists.txt).
#  2. spills and local memory: ptxas -warn-spills,-warn-lmem-usage (errors under 1.), and the
#     -Xptxas=-v report of every function of every architecture is read here: any non-zero
#     "bytes stack frame", "bytes spill stores", "bytes spill loads" or "bytes lmem" fails.
#  3. no fma the source did not write, in the PTX of every src/cuda/*.cu (all of them are
#     numerics-critical: quantize, dequantize, cast and what follows share the CPU's bits), for
#     every architecture. The rule: the source writes a fused multiply-add only as an explicit
#     call, __fmaf_rn / __fma_rn (device code; src/numerics/xte_math.h's xte_fmaf) or fmaf / fma.
#     Each .cu is compiled to PTX with the plugin's own flags (from compile_commands.json) plus a
#     forced include that routes every such call through one __noinline__ function
#     (xte_gate_fmaf / xte_gate_fma). In that PTX the only fma / mad.r* floating-point
#     instructions allowed are inside those functions: one anywhere else was made by the compiler
#     (a libdevice call such as expf, an fma intrinsic not listed here) and fails the gate.
#     Contraction itself happens in ptxas, not in the PTX: under -fmad=true nvcc writes mul.f32 /
#     add.f32 with no rounding modifier, which ptxas may fuse; -fmad=false writes mul.rn / add.rn /
#     sub.rn, which it never fuses. So a floating-point mul / add / sub without an explicit
#     rounding modifier anywhere in the PTX fails the gate too.
#     (__hfma / half2 fmas are not routed: none are written today; they would fail the gate.)
#
#   scripts/gpu_gates.sh                 exit 0 when every gate passes, 1 when one fails,
#                                        2 when it cannot run (no nvcc, no python3, configure)
#   XTE_GATES_BUILD_DIR   build directory (default build-gates)
#   XTE_GATES_ARCHS       CMAKE_CUDA_ARCHITECTURES (default "80;89;90a")
#   XTE_JOBS              build jobs (default 2: CI has 2 cores; about 2-3 minutes there)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=${XTE_GATES_BUILD_DIR:-build-gates}
archs=${XTE_GATES_ARCHS:-80;89;90a}
jobs=${XTE_JOBS:-2}
t0=$SECONDS

nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc" ]; then
  echo "gpu_gates: nvcc not found (PATH, /usr/local/cuda/bin): cannot run" >&2
  exit 2
fi
command -v python3 >/dev/null || { echo "gpu_gates: python3 is missing" >&2; exit 2; }
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)

echo "== gpu_gates: configure $build (archs $archs, nvcc $nvcc)"
if ! cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DXTE_WERROR=ON \
  -DXTE_CUDA=ON -DXTE_MUSA=OFF -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$archs" \
  -DXTE_CUDA_PTXAS_VERBOSE=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DXTE_SIMDE=OFF \
  -DXTE_BUILD_BENCH=OFF -DXTE_BUILD_TESTS=OFF >"$build.configure.log" 2>&1; then
  cat "$build.configure.log" >&2
  echo "gpu_gates: configure FAILED" >&2
  exit 2
fi
rm -f "$build.configure.log"
fail=0

# ---------------------------------------------------------------- 1. build, warnings as errors
# Every .cu is recompiled so that ptxas's report is complete (not only the changed files').
log=$build/gpu_gates_build.log
find "$build" -path '*xte_cuda.dir*' -name '*.cu.o' -delete 2>/dev/null
echo "== gpu_gates: build xte_cuda (-j$jobs)"
if ! cmake --build "$build" -j"$jobs" --target xte_cuda >"$log" 2>&1; then
  grep -E "error|warning" "$log" | head -40
  echo "gpu_gates: FAIL: the CUDA plugin does not build with warnings as errors (log: $log)"
  exit 1
fi
echo "   built in $((SECONDS - t0)) s"

# ---------------------------------------------------------------- 2. spills and local memory
n_funcs=$(grep -c "Function properties for" "$log")
if [ "$n_funcs" -eq 0 ]; then
  echo "gpu_gates: FAIL: no ptxas -v report in $log (XTE_CUDA_PTXAS_VERBOSE not in effect?)"
  fail=1
fi
# "ptxas info : Function properties for F" is followed by its "N bytes stack frame, ..." line;
# "Compiling entry function 'F' for 'sm_XX'" names the architecture.
bad=$(awk '
  /Compiling entry function/ { arch = $NF }
  /Function properties for/ { fn = $NF }
  /bytes stack frame|bytes lmem|bytes spill/ {
    line = $0
    while (match(line, /[0-9]+ bytes (stack frame|spill stores|spill loads|lmem)/)) {
      item = substr(line, RSTART, RLENGTH); line = substr(line, RSTART + RLENGTH)
      split(item, w, " ")
      if (w[1] + 0 > 0) print arch " " fn ": " item
    }
  }' "$log" | sort -u)
if [ -n "$bad" ]; then
  echo "gpu_gates: FAIL: register spills or local memory:"
  echo "$bad" | sed 's/^/   /'
  fail=1
else
  echo "   ptxas: $n_funcs function reports, no stack frame, spill or local memory"
fi

# ---------------------------------------------------------------- 3. fma only where written
ptxdir=$(cd "$build" && pwd)/gpu_gates_ptx
rm -rf "$ptxdir"
mkdir -p "$ptxdir"
cat >"$ptxdir/gate_fma.h" <<'EOF'
/* gpu_gates.sh: every explicit fused multiply-add of the source becomes a call of one of these
 * __noinline__ functions, so that an fma anywhere else in the PTX is one the compiler made. */
#include <cuda_runtime.h>
#include <math.h>
static __host__ __device__ __noinline__ float xte_gate_fmaf(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}
static __host__ __device__ __noinline__ double xte_gate_fma(double a, double b, double c) {
#ifdef __CUDA_ARCH__
  return __fma_rn(a, b, c);
#else
  return __builtin_fma(a, b, c);
#endif
}
#define __fmaf_rn(a, b, c) xte_gate_fmaf(a, b, c)
#define __fma_rn(a, b, c) xte_gate_fma(a, b, c)
#define fmaf(a, b, c) xte_gate_fmaf(a, b, c)
#define fma(a, b, c) xte_gate_fma(a, b, c)
EOF
echo "== gpu_gates: PTX fma check"
python3 - "$build/compile_commands.json" "$ptxdir" "$archs" <<'EOF'
import json, os, re, shlex, subprocess, sys

db, outdir, archs = sys.argv[1], sys.argv[2], [a for a in sys.argv[3].split(";") if a]
root = os.getcwd()
cuda_dir = os.path.join(root, "src", "cuda")
entries = [e for e in json.load(open(db))
           if os.path.dirname(os.path.abspath(os.path.join(e["directory"], e["file"]))) == cuda_dir
           and e["file"].endswith(".cu")]
if not entries:
    print("gpu_gates: FAIL: no src/cuda/*.cu in compile_commands.json")
    sys.exit(1)
FMA = re.compile(r"^\s*(?:@!?%\w+\s+)?((?:fma|mad)\.r[nzmp][\w.]*\.(?:f16|f16x2|bf16|bf16x2|f32|f64))\b")
LOOSE = re.compile(r"^\s*(?:@!?%\w+\s+)?((?:mul|add|sub)(?:\.ftz)?(?:\.sat)?\.(?:f16|f16x2|bf16|bf16x2|f32|f64))\b")
FUNC = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)*\.(entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)")
bad = 0
for e in entries:
    args = shlex.split(e["command"]) if "command" in e else list(e["arguments"])
    src = os.path.abspath(os.path.join(e["directory"], e["file"]))
    keep, skip = [], 0
    for i, a in enumerate(args):
        if skip:
            skip -= 1
            continue
        if a in ("-o", "-MF", "-MT", "-MQ", "-arch", "-gencode", "--generate-code", "-code"):
            skip = 1
            continue
        if a in ("-c", "-MD", "-MMD") or a == src or a == e["file"] \
           or a.startswith(("--generate-code=", "-gencode=", "-arch=", "--gpu-architecture=", "-code=",
                            "--gpu-code=", "-Xptxas=-v", "--options-file")) \
           or a in ("-Xptxas=-warn-spills,-warn-lmem-usage", "-Xptxas=-Werror"):
            continue
        keep.append(a)
    name = os.path.basename(src)[:-3]
    for arch in archs:
        virt = "compute_" + re.sub(r"[^0-9a-z]", "", arch.split("-")[0])
        out = os.path.join(outdir, f"{name}.{virt}.ptx")
        cmd = keep + ["-ptx", f"-arch={virt}", "-include", os.path.join(outdir, "gate_fma.h"),
                      src, "-o", out]
        r = subprocess.run(cmd, cwd=e["directory"], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"gpu_gates: FAIL: PTX of {name}.cu for {virt} does not compile:\n{r.stdout}{r.stderr}"
                  f"   command: {shlex.join(cmd)}")
            bad += 1
            continue
        fn, counts, written, nfunc = None, {}, 0, 0
        for line in open(out):
            m = FUNC.match(line)
            if m:
                fn, nfunc = m.group(2), nfunc + 1
                continue
            m = LOOSE.match(line)
            if m:  # ptxas may contract it into an fma
                counts.setdefault(fn or "?", []).append(m.group(1) + " (no rounding modifier)")
                continue
            m = FMA.match(line)
            if m:
                if fn and "xte_gate_fma" in fn:
                    written += 1
                else:
                    counts.setdefault(fn or "?", []).append(m.group(1))
        for f, ins in sorted(counts.items()):
            print(f"gpu_gates: FAIL: {name}.cu {virt}: {len(ins)} instructions that are or may become an fma the source did not write, in {f}"
                  f" ({', '.join(sorted(set(ins)))}); PTX: {out}")
            print("   (the source writes fmas only as __fmaf_rn / __fma_rn / fmaf / fma calls; "
                  "the plugin builds with -fmad=false)")
            bad += 1
        print(f"   {name}.cu {virt}: {nfunc} PTX functions, "
              f"{'no unwritten fma' if not counts else 'UNWRITTEN FMA'}"
              f" ({written} fma in the explicit-fma helpers)")
sys.exit(1 if bad else 0)
EOF
[ $? -eq 0 ] || fail=1

echo "== gpu_gates: $([ $fail -eq 0 ] && echo PASSED || echo FAILED) in $((SECONDS - t0)) s"
exit $fail
