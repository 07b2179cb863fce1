"""xte's attention and exact FP8 GEMM beside the anchors PyTorch users would pick, in one run.

    XTE_LIBRARY=build/libxte.so PYTHONPATH=python python bench/python/bench_torch_anchors.py \
        [--full] [--threads N] [--reps R] [--only attention|gemm] [--json FILE]

Anchors (the same shapes, the same threads: torch.set_num_threads(N) and xte's pool of N):
  attention  torch.nn.functional.scaled_dot_product_attention on the CPU (fp32 and bf16,
             b 1, h 8, d 128, causal and not; forward, and backward alone: torch.autograd.grad
             on one retained graph) beside xte.attention_fwd / xte.attention_bwd (BSHD, the same
             values; xte's backward is given the forward's out and lse, as PyTorch's is), each
             case in mode="exact" and mode="fast" side by side (one line each, the two xte
             modes and torch interleaved in every repetition).
             FLOPs: 4 s^2 d h forward (half causal), 2.5x that backward, for both.
  gemm       torch.matmul on fp64 (the dgemm of `xte bench gemm`) and fp32 [M, K] x [K, N]
             beside xte.gemm (exact mode, e4m3 1x128 activations x 128x128 weights, TE block
             recipe, TE_GEMM scales, bf16 out), the operands quantized once outside the loop.
             FLOPs: 2 M N K. xte.gemm mode="fast" beside torch.matmul in fp32 and bf16 (oneDNN,
             AMX-BF16 where the CPU has it) and torch._scaled_mm (FP8) where the build runs it on
             the CPU (else a line says why not).
Each case runs --reps times (default 3), xte and its anchor interleaved (after a warm-up call each); a line
gives both medians in GFLOP/s and the median of the per-repetition ratios xte / anchor (with its
min and max). Every timed call starts --gap seconds (default 0.05) after the previous one returned:
an OpenMP runtime's workers spin after each parallel region (libgomp: GOMP_SPINCOUNT, 300,000
pauses by default), and so do xte's pool threads (0.2 ms); without the gap one library's spinning
threads take cores from the other's timed call. The record gives what each spun, measured
(`torch_idle_spin_ms`, `xte_idle_spin_ms`: CPU milliseconds of the process's threads in the 0.2 s
after one call). --gap 0 times them back to back. Default: a short set (< 1 minute on 2 cores): attention at s 1024, GEMM at M 128.
--full: attention at s 1024 and 4096, GEMM at M 128, 512, 2048 on the three shapes of
`xte bench gemm` (minutes). The first lines record the machine, xte's ISA and threads, and
torch's version, threads and build (torch.__config__.show(), summarised). With xte held to AVX2
(XTE_CPU_ISA=avx2) on an AVX-512 CPU, torch is held to AVX2 too (ATEN_CPU_CAPABILITY=avx2,
MKL_ENABLE_INSTRUCTIONS=AVX2, ONEDNN_MAX_CPU_ISA=AVX2, each unless already set), as
`xte bench --isa avx2` holds OpenBLAS to its Haswell kernels.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

# xte held to AVX2 (XTE_CPU_ISA=avx2) on a CPU with AVX-512: torch held there too, or a ratio sets
# xte's AVX2 kernels against torch's AVX-512 (and AMX) ones. ATen's dispatch, MKL and oneDNN read
# these once, when torch loads; a variable the user set is left alone. Recorded as torch_isa_env.
TORCH_AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                  "ONEDNN_MAX_CPU_ISA": "AVX2"}
TORCH_ISA_ENV = {}


def _hold_torch_to_avx2():
    try:
        flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo")
                      if l.startswith("flags")), [])
    except OSError:
        flags = []
    held = os.environ.get("XTE_CPU_ISA", "").strip().lower() == "avx2" and "avx512f" in flags
    for k, v in TORCH_AVX2_ENV.items():
        if k in os.environ:
            TORCH_ISA_ENV[k] = os.environ[k] + " (set by the user)"
        elif held:
            os.environ[k] = v
            TORCH_ISA_ENV[k] = v + " (set by the bench: xte is held to AVX2)"


_hold_torch_to_avx2()

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - the script is only useful with torch
    print("bench_torch_anchors: torch is not installed; nothing to compare with")
    sys.exit(0)

import xte
from xte import _lib

H, D = 8, 128


def _cpu_field(key):
    try:
        for line in open("/proc/cpuinfo"):
            k, _, v = line.partition(":")
            if k.strip() == key:
                return v.strip()
    except OSError:
        pass
    return ""


def _read(path):
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return "(unknown)"


def machine_record(threads):
    lib = _lib.lib
    isa = lib.xte_cpu_isa_name(lib.xte_cpu_get_isa())
    cfg = torch.__config__.show()
    keep = [l.strip() for l in cfg.splitlines()
            if any(w in l for w in ("CPU capability", "BLAS_INFO", "LAPACK_INFO", "OpenMP",
                                    "MKL", "oneDNN", "MKL-DNN", "USE_OPENMP", "CXX_FLAGS"))]
    build = {}
    for l in keep:  # "Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, ...": the CPU-relevant ones
        if "Build settings" in l:
            for kv in l.split(":", 1)[1].split(","):
                k, _, v = kv.strip().partition("=")
                if k in ("BLAS_INFO", "LAPACK_INFO", "BUILD_TYPE", "USE_OPENMP", "USE_MKL",
                         "USE_MKLDNN", "TORCH_VERSION"):
                    build[k] = v
    keep = [l for l in keep if "Build settings" not in l]
    rec = {
        "cpu_model": _cpu_field("model name") or platform.processor(),
        "cpu_family_model_stepping": "/".join(_cpu_field(k) or "?"
                                              for k in ("cpu family", "model", "stepping")),
        "logical_cpus": os.cpu_count(),
        "transparent_hugepage": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "load_avg": _read("/proc/loadavg"),
        "xte_version": xte.__version__,
        "xte_library": xte.library_path,
        "xte_cpu_isa": isa.decode() if isinstance(isa, bytes) else str(isa),
        "xte_cpu_threads": lib.xte_cpu_get_num_threads(),
        "torch_version": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        "torch_cpu_capability": getattr(torch.backends.cpu, "get_cpu_capability", lambda: "?")(),
        "torch_isa_env": TORCH_ISA_ENV or "(none: torch's own choice)",
        "torch_config": keep,
        "torch_build": build,
        "threads": threads,
    }
    return rec


def _thread_cpu_ms():
    """CPU milliseconds of all of this process's threads so far (/proc/self/task/*/schedstat)."""
    tot = 0.0
    try:
        for t in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{t}/schedstat") as f:
                tot += int(f.read().split()[0]) / 1e6
    except (OSError, ValueError, IndexError):
        return None
    return tot


def idle_spin_ms(fn, window=0.2):
    """The CPU milliseconds the process's threads use in the window after fn() returns (the
    caller sleeps): how long a runtime's idle workers spin before they sleep."""
    fn()
    a = _thread_cpu_ms()
    time.sleep(window)
    b = _thread_cpu_ms()
    return None if a is None or b is None else round(b - a, 2)


def spin_record():
    q = torch.tanh(torch.randn(1, 256, H, D, generator=torch.Generator().manual_seed(3)))
    tq = q.transpose(1, 2).contiguous()

    def t_call():
        with torch.no_grad():
            F.scaled_dot_product_attention(tq, tq, tq)

    def x_call():
        xte.attention_fwd(q, q, q)

    t_call()
    x_call()
    return {"torch_idle_spin_ms": idle_spin_ms(t_call), "xte_idle_spin_ms": idle_spin_ms(x_call)}


GAP = 0.05


def _time(fn):
    if GAP > 0:
        time.sleep(GAP)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def compare(name, flops, fx, fa, reps):
    """xte fx and anchor fa interleaved: a result dict with medians and the ratio."""
    fx()
    fa()
    tx, ta, q = [], [], []
    for _ in range(reps):
        a = _time(fx)
        b = _time(fa)
        tx.append(a)
        ta.append(b)
        q.append(b / a)  # xte rate / anchor rate
    r = {"case": name, "gflops": flops / 1e9,
         "xte_gflop_s": flops / statistics.median(tx) / 1e9,
         "anchor_gflop_s": flops / statistics.median(ta) / 1e9,
         "ratio_median": statistics.median(q), "ratio_min": min(q), "ratio_max": max(q),
         "reps": reps}
    print(f"{name:<44} {r['xte_gflop_s']:9.1f} {r['anchor_gflop_s']:9.1f} "
          f"{r['ratio_median']:7.3f} [{r['ratio_min']:.3f}, {r['ratio_max']:.3f}]", flush=True)
    return r


def compare_modes(name, flops, fe, ff, fa, reps):
    """xte EXACT fe, xte FAST ff and anchor fa interleaved: two result dicts (name/exact,
    name/fast), each with its medians and its ratio to the anchor of the same repetitions."""
    fe()
    ff()
    fa()
    te, tf, ta = [], [], []
    for _ in range(reps):
        te.append(_time(fe))
        tf.append(_time(ff))
        ta.append(_time(fa))
    out = []
    for mode, tx in (("exact", te), ("fast", tf)):
        q = [b / a for a, b in zip(tx, ta)]
        r = {"case": f"{name}/{mode}", "gflops": flops / 1e9,
             "xte_gflop_s": flops / statistics.median(tx) / 1e9,
             "anchor_gflop_s": flops / statistics.median(ta) / 1e9,
             "ratio_median": statistics.median(q), "ratio_min": min(q), "ratio_max": max(q),
             "reps": reps}
        print(f"{r['case']:<44} {r['xte_gflop_s']:9.1f} {r['anchor_gflop_s']:9.1f} "
              f"{r['ratio_median']:7.3f} [{r['ratio_min']:.3f}, {r['ratio_max']:.3f}]", flush=True)
        out.append(r)
    return out


def bench_attention(seqlens, reps):
    out = []
    gen = torch.Generator().manual_seed(1)
    for s in seqlens:
        base = [torch.tanh(torch.randn(1, s, H, D, generator=gen)) for _ in range(4)]
        for dt in (torch.float32, torch.bfloat16):
            q, k, v, do = (t.to(dt) for t in base)  # xte: BSHD
            tq, tk, tv, tdo = (t.transpose(1, 2).contiguous() for t in (q, k, v, do))  # BHSD
            tq.requires_grad_(True)
            tk.requires_grad_(True)
            tv.requires_grad_(True)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            dname = "fp32" if dt == torch.float32 else "bf16"
            for causal in (False, True):
                mask = "causal" if causal else "none"
                f = 4.0 * s * s * D * H * (0.5 if causal else 1.0)
                o, lse = xte.attention_fwd(q, k, v, mask=mask)
                ob = torch.empty_like(o)
                lb = torch.empty_like(lse)

                def x_fwd():
                    xte.attention_fwd(q, k, v, mask=mask, out=ob, lse=lb)

                def x_fwd_fast():
                    xte.attention_fwd(q, k, v, mask=mask, out=ob, lse=lb, mode="fast")

                def t_fwd():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

                tag = f"{dname}/s{s}/{'causal' if causal else 'full'}"
                out += compare_modes(f"attention/fwd/{tag}", f, x_fwd, x_fwd_fast, t_fwd, reps)
                to = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

                def x_bwd():
                    xte.attention_bwd(q, k, v, o, do, lse, mask=mask, dq=dq, dk=dk, dv=dv)

                def x_bwd_fast():
                    xte.attention_bwd(q, k, v, o, do, lse, mask=mask, dq=dq, dk=dk, dv=dv,
                                      mode="fast")

                def t_bwd():
                    torch.autograd.grad(to, (tq, tk, tv), tdo, retain_graph=True)

                out += compare_modes(f"attention/bwd/{tag}", 2.5 * f, x_bwd, x_bwd_fast, t_bwd,
                                     reps)
                del to
    return out


def bench_gemm(Ms, shapes, reps):
    out = []
    gen = torch.Generator().manual_seed(2)
    for M in Ms:
        for N, K in shapes:
            a = torch.randn(M, K, generator=gen)
            b = torch.randn(N, K, generator=gen)
            qa = xte.quantize(a, recipe="te_block", block="1x128", layout="te_gemm")
            qb = xte.quantize(b, recipe="te_block", block="128x128", layout="te_gemm")
            d = torch.empty(M, N, dtype=torch.bfloat16)
            f = 2.0 * M * N * K

            def x_gemm():
                xte.gemm(qa, qb, out=d, mode="exact")

            for dt, dname in ((torch.float64, "dgemm"), (torch.float32, "sgemm")):
                ta = a.to(dt)
                tbt = b.to(dt).t()  # [K, N] view of B [N, K]: the "NT" product of xte bench gemm
                tout = torch.empty(M, N, dtype=dt)

                def t_mm():
                    torch.matmul(ta, tbt, out=tout)

                out.append(compare(f"gemm/fp8_exact_vs_torch_{dname}/{M}/{N}x{K}", f, x_gemm,
                                   t_mm, reps))
            out += bench_gemm_fast(M, N, K, a, b, qa, qb, d, reps)
    return out


def _scaled_mm_call(M, N, K):
    """torch._scaled_mm on the CPU (e4m3, per-tensor scales, bf16 out), or None with the reason
    printed: this build does not run it there, or runs it so slowly (a reference loop: 0.02
    GFLOP/s in torch 2.15) that one call at this shape would take minutes (a probe at 256 x 256 x
    512 decides: below 1 GFLOP/s it is reported, not timed)."""
    try:
        def operands(m, n, k):
            a8 = torch.randn(m, k).to(torch.float8_e4m3fn)
            b8 = torch.randn(n, k).to(torch.float8_e4m3fn).t()  # column-major [K, N], as it asks
            return a8, b8

        one = torch.tensor(1.0)
        pa, pb = operands(256, 256, 512)
        t0 = time.perf_counter()
        torch._scaled_mm(pa, pb, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        rate = 2.0 * 256 * 256 * 512 / (time.perf_counter() - t0) / 1e9
        if rate < 1.0:
            print(f"torch._scaled_mm on the CPU: runs, at {rate:.3f} GFLOP/s (256 x 256 x 512): "
                  f"not timed at {M} x {N} x {K}", flush=True)
            return None
        a8, b8 = operands(M, N, K)

        def call():
            torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        return call
    except Exception as e:  # noqa: BLE001 (any failure means: not on this build's CPU)
        print(f"torch._scaled_mm on the CPU: not supported by this build "
              f"({type(e).__name__}: {str(e).splitlines()[0][:100]})", flush=True)
        return None


def bench_gemm_fast(M, N, K, a, b, qa, qb, d, reps):
    """xte.gemm mode="fast" beside torch.matmul in fp32 (sgemm) and bf16 (oneDNN; AMX-BF16 where
    the CPU has it) of the same shape, and torch._scaled_mm (FP8, per-tensor scales) where the
    build runs it on the CPU."""
    out = []
    f = 2.0 * M * N * K

    def x_fast():
        xte.gemm(qa, qb, out=d, mode="fast")

    for dt, dname in ((torch.float32, "sgemm"), (torch.bfloat16, "bf16")):
        ta = a.to(dt)
        tbt = b.to(dt).t()
        tout = torch.empty(M, N, dtype=dt)

        def t_mm():
            torch.matmul(ta, tbt, out=tout)

        out.append(compare(f"gemm/fp8_fast_vs_torch_{dname}/{M}/{N}x{K}", f, x_fast, t_mm, reps))
    smm = _scaled_mm_call(M, N, K)
    if smm is not None:
        out.append(compare(f"gemm/fp8_fast_vs_torch_scaled_mm/{M}/{N}x{K}", f, x_fast, smm, reps))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="every shape (minutes)")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads of xte and torch (0: xte's default pool size)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per case (default 3)")
    ap.add_argument("--only", choices=("attention", "gemm"), default=None)
    ap.add_argument("--json", default=None, help="also write the record and results here")
    ap.add_argument("--gap", type=float, default=0.05,
                    help="seconds of idle before each timed call (default 0.05; 0: none)")
    a = ap.parse_args()
    global GAP
    GAP = max(0.0, a.gap)
    lib = _lib.lib
    if a.threads:
        _lib.check(lib.xte_cpu_set_num_threads(a.threads))
    n = lib.xte_cpu_get_num_threads()
    torch.set_num_threads(n)
    reps = max(1, a.reps)
    rec = machine_record(n)
    rec["gap_s"] = GAP
    rec.update(spin_record())
    print("machine:")
    for k, v in rec.items():
        if k == "torch_config":
            for line in v:
                print(f"  {'torch_config':<26} {line}")
        else:
            print(f"  {k:<26} {v}")
    if rec["torch_num_threads"] != rec["xte_cpu_threads"]:
        print(f"threads differ (torch {rec['torch_num_threads']}, xte {rec['xte_cpu_threads']}):"
              " ratios refused")
        return 1
    print(f"\n{'case':<44} {'xte':>9} {'torch':>9} {'ratio':>7} [min, max]   (GFLOP/s; ratio: "
          f"xte / torch, median of {reps})")
    results = []
    if a.only in (None, "attention"):
        results += bench_attention((1024, 4096) if a.full else (1024,), reps)
    if a.only in (None, "gemm"):
        shapes = ((4096, 7168), (7168, 2048), (2112, 7168))
        results += bench_gemm((128, 512, 2048) if a.full else (128,),
                              shapes if a.full else ((7168, 2048),), reps)
    rec["load_avg_after"] = _read("/proc/loadavg")
    print(f"load after: {rec['load_avg_after']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": rec, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
