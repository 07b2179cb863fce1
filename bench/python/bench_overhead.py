"""Per-call overhead of the Python package on a small tensor, beside a bare ctypes call.

    XTE_LIBRARY=build/libxte.so PYTHONPATH=python python bench/python/bench_overhead.py [--torch]
        [--json FILE]

Each line: the median of --reps timed calls (after a warm-up) in microseconds, and its ratio to
the bare ctypes call of the same C function (structs built once, outside the loop): the anchor a
hand-written ctypes binding would give. The pool keeps its default size (a call this small
runs on the calling thread: src/cpu/xte_cpu.h, xte_threads_for). Reported with the machine's
CPU model, the library's ISA and the Python / NumPy / torch versions. --json FILE also writes
{"machine": {...}, "results": [{"call", "us", "anchor", "anchor_us", "ratio"}, ...]}, which
scripts/perf_tables.py renders (marker kind `overhead`).
"""

import argparse
import ctypes
import datetime
import importlib
import json
import platform
import statistics
import sys
import time

import numpy as np

import xte
from xte import _lib


def _median_us(fn, reps):
    for _ in range(min(reps, 500)):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1e3


def _cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _family_model_stepping():
    want, got = ("cpu family", "model", "stepping"), {}
    try:
        for line in open("/proc/cpuinfo"):
            k, _, v = line.partition(":")
            if k.strip() in want and k.strip() not in got:
                got[k.strip()] = v.strip()
            if not line.strip():
                break
    except OSError:
        pass
    return "/".join(got.get(k, "?") for k in want)


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5000)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--cols", type=int, default=128)
    ap.add_argument("--torch", action="store_true", help="also torch tensors and custom ops")
    ap.add_argument("--threads", type=int, default=0, help="pool size (0: the default)")
    ap.add_argument("--json", default=None, help="also write the machine and the rows here")
    a = ap.parse_args()
    lib = _lib.lib
    if a.threads:
        _lib.check(lib.xte_cpu_set_num_threads(a.threads))
    M, K = a.rows, a.cols
    load_avg = _read("/proc/loadavg")
    x = np.random.default_rng(0).standard_normal((M, K)).astype(np.float32)
    q = xte.quantize(x, recipe="te_block", block="1x128", layout="compact")
    bf = np.empty((M, K), dtype=xte._tensor._np_dtype(_lib.DType.BF16))

    # the anchor: bare ctypes calls with prebuilt structs
    tin = _lib.Tensor(x.ctypes.data, int(_lib.DType.FP32), 2, (ctypes.c_int64 * 8)(M, K), 0)
    tbf = _lib.Tensor(bf.ctypes.data, int(_lib.DType.BF16), 2, (ctypes.c_int64 * 8)(M, K), 0)
    qs, _keep = xte._qtensor.qview(q, "q", writable=True)
    cfg = lib.xte_quant_config_default()
    s = xte._tensor.stream_of()
    bare_q = _median_us(lambda: lib.xte_quantize(ctypes.byref(tin), ctypes.byref(qs),
                                                 ctypes.byref(cfg), s), a.reps)
    bare_c = _median_us(lambda: lib.xte_cast(ctypes.byref(tin), ctypes.byref(tbf), 1, s), a.reps)

    rows = [("bare ctypes xte_quantize", bare_q, bare_q),
            ("xte.quantize(numpy)", _median_us(lambda: xte.quantize(x), a.reps), bare_q),
            ("xte.quantize(numpy, out=)", _median_us(lambda: xte.quantize(x, out=q), a.reps),
             bare_q),
            ("bare ctypes xte_cast", bare_c, bare_c),
            ("xte.cast(numpy, out=)", _median_us(lambda: xte.cast(x, "bfloat16", out=bf),
                                                 a.reps), bare_c)]
    tv = None
    if a.torch:
        import torch
        tv = torch.__version__
        xt = torch.from_numpy(x)
        qt = xte.quantize(xt, recipe="te_block", block="1x128", layout="compact")
        bt = torch.empty(M, K, dtype=torch.bfloat16)
        rows += [("xte.quantize(torch)", _median_us(lambda: xte.quantize(xt), a.reps), bare_q),
                 ("xte.quantize(torch, out=)",
                  _median_us(lambda: xte.quantize(xt, out=qt), a.reps), bare_q),
                 ("xte.cast(torch, out=)",
                  _median_us(lambda: xte.cast(xt, "bfloat16", out=bt), a.reps), bare_c)]
        try:
            xt_ops = importlib.import_module("xte.torch")  # registers torch.ops.xte.*
            rows.append(("xte.torch.quantize (custom op)",
                         _median_us(lambda: xt_ops.quantize(xt), a.reps), bare_q))
        except (ImportError, AttributeError, TypeError) as e:
            print(f"(custom op not measured: {e})")
    info = _lib.BackendInfo()
    _lib.check(lib.xte_get_backend_info(ctypes.byref(info)))
    print(f"machine: {_cpu_name()}; xte {xte.__version__} ISA "
          f"{lib.xte_cpu_isa_name(lib.xte_cpu_get_isa()).decode()}, "
          f"{lib.xte_cpu_get_num_threads()} threads; Python "
          f"{platform.python_version()}, NumPy {np.__version__}, torch {tv or '-'}; "
          f"input [{M}, {K}] fp32, TE 1x128 e4m3, compact scales; median of {a.reps}")
    print(f"{'call':42s} {'us':>8s} {'x bare':>7s}")
    for name, us, anchor in rows:
        print(f"{name:42s} {us:8.2f} {us / anchor:7.2f}")
    if a.json:
        isa = lib.xte_cpu_isa_name(lib.xte_cpu_get_isa()).decode()
        machine = {"cpu_model": _cpu_name(), "cpu_family_model_stepping": _family_model_stepping(),
                   "xte_version": xte.__version__, "xte_cpu_isa": isa,
                   "xte_cpu_threads": lib.xte_cpu_get_num_threads(),
                   "python_version": platform.python_version(), "numpy_version": np.__version__,
                   "torch_version": tv, "input": f"[{M}, {K}] fp32, TE 1x128 e4m3, compact scales",
                   "reps": a.reps, "statistic": "median", "load_avg": load_avg,
                   "load_avg_after": _read("/proc/loadavg"),
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                       timespec="seconds")}
        results = [{"call": name, "us": us, "anchor": "bare ctypes xte_quantize"
                    if anchor is bare_q else "bare ctypes xte_cast", "anchor_us": anchor,
                    "ratio": us / anchor} for name, us, anchor in rows]
        with open(a.json, "w") as f:
            json.dump({"command": "bench_overhead", "machine": machine, "results": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
