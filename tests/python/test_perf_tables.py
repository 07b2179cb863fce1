"""scripts/perf_tables.py: docs/performance.md's generated tables come from the bench JSON.

The rendering is checked on small reports written here (the shapes `xte bench --json` and
bench_torch_anchors.py --json write), and the repository's docs/performance.md must be up to date
with the reports it names (no generated table edited by hand, no marker pointing nowhere)."""

# ctest: no-isa-variants

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "perf_tables.py"


def run(*args, cwd=None):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, cwd=cwd)


def bench_report():
    return {
        "context": {"date": "2026-12-07T10:00:00+00:00", "cpu_model": "Test CPU",
                    "cpu_family_model_stepping": "6/1/2", "cores": "2", "xte_cpu_isa": "avx2",
                    "xte_cpu_isa_best": "avx512", "bench_threads": "2", "l1d_bytes": "49152",
                    "l2_bytes": "2097152", "l3_bytes": "33554432",
                    "transparent_hugepage": "always [madvise] never",
                    "load_avg_1_5_15": "0.31 0.2 0.1 1/2 3", "openblas_corename": "Haswell",
                    "openblas_num_threads": "2", "openblas_coretype": "Haswell (set by xte bench)",
                    "openblas_anchor": "trusted"},
        "benchmarks": [],
        "xte_ratios": [
            {"name": "gemm/dgemm/128/4096x7168", "metric": "GFLOP/s", "rate": 80.0, "anchor": "",
             "anchor_rate": None, "ratio": None},
            {"name": "gemm/fp8_exact_1x128_128x128_bf16/128/4096x7168", "metric": "GFLOP/s",
             "rate": 160.0, "anchor": "gemm/dgemm/128/4096x7168", "anchor_rate": 80.0,
             "ratio": 1.987},
            {"name": "gemm/sgemm/128/4096x7168", "metric": "GFLOP/s", "rate": 140.0,
             "anchor": "gemm/dgemm/128/4096x7168", "anchor_rate": 80.0, "ratio": None,
             "refused": "OpenBLAS runs Prescott"},
        ],
    }


def torch_report():
    return {"machine": {"cpu_model": "Test CPU", "cpu_family_model_stepping": "6/1/2",
                        "xte_cpu_isa": "avx512", "xte_cpu_threads": 2, "torch_version": "2.15.0",
                        "torch_num_threads": 2, "torch_cpu_capability": "AVX512", "gap_s": 0.05,
                        "transparent_hugepage": "madvise", "load_avg": "0.5 0.4 0.3 1/2 3"},
            "results": [{"case": "attention/fwd/fp32/s1024/full", "gflops": 1.0,
                         "xte_gflop_s": 120.04, "anchor_gflop_s": 118.0, "ratio_median": 1.017,
                         "ratio_min": 0.99, "ratio_max": 1.08, "reps": 3}]}


def test_render_record_check(tmp_path):
    (tmp_path / "raw.json").write_text(json.dumps(bench_report()))
    rec = run("record", "--command", "xte bench gemm --filter /128/", "--commit", "abcdef1234567",
              "raw.json", "gemm.json", cwd=tmp_path)
    assert rec.returncode == 0, rec.stderr
    stored = json.loads((tmp_path / "gemm.json").read_text())
    assert stored["xte_record"]["command"] == "xte bench gemm --filter /128/"
    assert stored["xte_ratios"] == bench_report()["xte_ratios"]  # the report itself unchanged
    (tmp_path / "t.json").write_text(json.dumps(torch_report()))
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# doc\nA marker quoted in prose is not one: `<!-- perf_tables: bench x -->`.\n\n"
        f"<!-- perf_tables: bench {tmp_path / 'gemm.json'} filter=fp8 -->\ntyped by hand\n"
        "<!-- /perf_tables -->\n\n"
        f"<!-- perf_tables: bench {tmp_path / 'gemm.json'} -->\n<!-- /perf_tables -->\n\n"
        f"<!-- perf_tables: torch {tmp_path / 't.json'} -->\n<!-- /perf_tables -->\n\n"
        f"<!-- perf_tables: summary\nDense GEMM | {tmp_path / 'gemm.json'} | "
        "gemm/fp8_exact_1x128_128x128_bf16/128/4096x7168\n-->\n<!-- /perf_tables -->\ntail\n")
    assert run("--check", doc).returncode == 1  # stale: a table typed by hand
    assert run(doc).returncode == 0
    text = doc.read_text()
    assert "typed by hand" not in text and text.endswith("tail\n")
    assert "`<!-- perf_tables: bench x -->`" in text
    first = text.split("<!-- /perf_tables -->")[0]
    assert "Command: `xte bench gemm --filter /128/`" in first
    assert "commit abcdef1234" in first and "Test CPU (family/model/stepping 6/1/2)" in first
    assert ("| gemm/fp8_exact_1x128_128x128_bf16/128/4096x7168 | 160.00 GFLOP/s | "
            "gemm/dgemm/128/4096x7168 | 80.00 | 1.99 |") in first
    assert "sgemm" not in first.split("| case |")[1]  # filter=fp8
    second = text.split("<!-- /perf_tables -->")[1]
    assert "| gemm/sgemm/128/4096x7168 | 140.00 GFLOP/s | gemm/dgemm/128/4096x7168 | 80.00 | " \
           "refused: OpenBLAS runs Prescott |" in second
    assert not any(l.startswith("| gemm/dgemm/") for l in second.splitlines())  # anchors alone
    assert "| attention/fwd/fp32/s1024/full | 120.0 | 118.0 | 1.02 [0.99, 1.08] |" in text
    assert ("| Dense GEMM | gemm/fp8_exact_1x128_128x128_bf16/128/4096x7168 | 1.99 | "
            "gemm/dgemm/128/4096x7168 | R1 |") in text
    assert (f"- R1: `{tmp_path / 'gemm.json'}`: Test CPU 6/1/2, avx2, 2 threads; 2026-12-07, "
            "commit abcdef1234; `xte bench gemm --filter /128/`") in text
    assert run("--check", doc).returncode == 0  # idempotent


CTX = {"cpu_model": "Test CPU", "cpu_family_model_stepping": "6/1/2", "cores": "2",
       "xte_cpu_isa": "avx512", "xte_cpu_isa_best": "avx512", "xte_cpu_threads": "1",
       "bench_threads": "1", "l1d_bytes": "49152", "l2_bytes": "2097152",
       "l3_bytes": "33554432", "transparent_hugepage": "madvise",
       "load_avg_1_5_15": "0.42 0.2 0.1 1/2 3", "openblas_corename": "SkylakeX"}


def ep_report(ranks, layout, dispatch_ratio):
    return {"command": "bench ep", "context": CTX,
            "config": {"ranks": ranks, "transport": "mpi", "mpi_library": "Open MPI v4.1.4",
                       "tokens_per_rank": 2048, "hidden": 7168, "experts": 64, "topk": 8,
                       "dtype": "e4m3", "iters": 6, "dispatch": layout},
            "ops": [{"op": "dispatch", "mb_per_rank": 40.5, "xte_ms": 20.0,
                     "anchor": "MPI_Alltoallv", "anchor_ms": 20.0 * dispatch_ratio,
                     "ratio": dispatch_ratio, "gb_s": 2.025,
                     "pack_share": 0.1, "exchange_share": 0.7, "local_share": 0.2},
                    {"op": "combine", "mb_per_rank": 58.7, "xte_ms": 30.0,
                     "anchor": "MPI_Alltoallv", "anchor_ms": 27.0, "ratio": 0.9, "gb_s": 1.96,
                     "pack_share": 0.25, "exchange_share": 0.75, "local_share": 0.0}]}


def moe_report():
    return {"command": "moe", "preset": "kimi-k2", "context": CTX,
            "config": {"tokens": 4096, "experts": 384, "hidden": 7168, "ffn": 2048, "topk": 8,
                       "isa": "avx512", "threads": 2, "backward": 0, "mode": "exact"},
            "totals": {"forward_s": 3.016, "backward_s": 0.0, "layer_s": 3.016,
                       "gemm_fp8_share": 0.81, "gemm_fp8_gflops": 412.3, "setup_s": 4.2},
            "numerics": {"checked_tokens": 8, "pass": True,
                         "tensors": [{"name": "y", "rel_err": 1.5e-3},
                                     {"name": "h", "rel_err": 2.5e-3}]}}


def overhead_report():
    return {"command": "bench_overhead",
            "machine": {"cpu_model": "Test CPU", "cpu_family_model_stepping": "6/1/2",
                        "xte_version": "0.1.0", "xte_cpu_isa": "avx512", "xte_cpu_threads": 2,
                        "python_version": "3.11.7", "numpy_version": "2.4.6",
                        "torch_version": "2.15.0", "input": "[4, 128] fp32", "reps": 5000,
                        "statistic": "median", "load_avg": "0.3 0.2 0.1 1/2 3"},
            "results": [{"call": "bare ctypes xte_quantize", "us": 1.5,
                         "anchor": "bare ctypes xte_quantize", "anchor_us": 1.5, "ratio": 1.0},
                        {"call": "xte.quantize(numpy)", "us": 7.125,
                         "anchor": "bare ctypes xte_quantize", "anchor_us": 1.5, "ratio": 4.75}]}


def write_recorded(tmp_path, name, rep, command):
    (tmp_path / f"raw_{name}").write_text(json.dumps(rep))
    r = run("record", "--command", command, "--commit", "0123456789abcdef", f"raw_{name}", name,
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return tmp_path / name


def test_ep_moe_overhead_kinds(tmp_path):
    ep2 = write_recorded(tmp_path, "ep2.json", ep_report(2, "token-major", 0.95),
                         "mpirun -np 2 xte bench ep --token-major --json F")
    ep4 = write_recorded(tmp_path, "ep4.json", ep_report(4, "expert-major", 0.5),
                         "mpirun -np 4 xte bench ep --json F")
    moe = write_recorded(tmp_path, "moe.json", moe_report(), "xte moe --preset kimi-k2 --json")
    ov = write_recorded(tmp_path, "ov.json", overhead_report(), "bench_overhead.py --json F")
    doc = tmp_path / "doc.md"
    doc.write_text(
        f"<!-- perf_tables: ep {ep2} {ep4} -->\n<!-- /perf_tables -->\n"
        f"<!-- perf_tables: moe {moe} -->\nold\n<!-- /perf_tables -->\n"
        f"<!-- perf_tables: overhead {ov} -->\n<!-- /perf_tables -->\n"
        f"<!-- perf_tables: summary\nEP | {ep2} | dispatch | 0.8\nEP | {ep4} | * | 0.8\n"
        f"MoE layer | {moe} | layer\nPython | {ov} | xte.quantize(numpy) | at most 15 us\n"
        "-->\n<!-- /perf_tables -->\n")
    assert run("--check", doc).returncode == 1
    assert run(doc).returncode == 0, run(doc).stderr
    text = doc.read_text()
    ep_t, moe_t, ov_t, sm_t = text.split("<!-- /perf_tables -->")[:4]
    assert "Open MPI v4.1.4" in ep_t and "SkylakeX" not in ep_t  # no OpenBLAS: MPI's anchor
    assert "- `mpirun -np 2 xte bench ep --token-major --json F`: " in ep_t
    assert "| 2 | token-major | dispatch | 2048 | 40.50 | 20.00 | 19.00 | 0.95 | 2.02 | " \
           "10 / 70 / 20 |" in ep_t
    assert "| 4 | expert-major | combine | 2048 | 58.70 | 30.00 | 27.00 | 0.90 | 1.96 | " \
           "25 / 75 / 0 |" in ep_t
    assert "old" not in moe_t
    assert "| kimi-k2 | exact | avx512, 2 | 4096 | 3.016 | - | 3.016 | 4.200 | 0.81 | 412.3 | " \
           "pass (8 tokens, worst rel. error 2.50e-03) |" in moe_t
    assert "| xte.quantize(numpy) | 7.12 | bare ctypes xte_quantize | 1.50 | 4.75 |" in ov_t
    assert "torch 2.15.0" in ov_t and "commit 0123456789" in ov_t
    assert "| EP | dispatch, token-major, 2 ranks, 2048 tokens | 0.95 (0.8) | MPI_Alltoallv | " \
           "R1 |" in sm_t
    assert sum(l.startswith("| EP | ") for l in sm_t.splitlines()) == 3  # the glob: both ops
    assert "| EP | combine, expert-major, 4 ranks, 2048 tokens | 0.90 (0.8) | MPI_Alltoallv | " \
           "R2 |" in sm_t
    assert "| MoE layer | kimi-k2 exact, layer | 3.016 s | (seconds) | R3 |" in sm_t
    assert "| Python | xte.quantize(numpy) | 7.12 us = 4.75 x (at most 15 us) | " \
           "bare ctypes xte_quantize | R4 |" in sm_t
    assert f"- R2: `{ep4}`: Test CPU 6/1/2, 4 ranks x 1 thread(s); " in sm_t
    assert "- R3: " in sm_t and "`xte moe --preset kimi-k2 --json`" in sm_t
    assert sum(l.startswith("- R") for l in sm_t.splitlines()) == 4  # one line per report
    assert run("--check", doc).returncode == 0
    # a report that changes after the table was rendered: the table is stale
    rep = json.loads(ep4.read_text())
    rep["ops"][1]["ratio"] = 0.91
    ep4.write_text(json.dumps(rep))
    r = run("--check", doc)
    assert r.returncode == 1 and "out of date" in r.stdout
    # shows each kind alone
    for f, want in ((ep2, "token-major"), (moe, "kimi-k2"), (ov, "xte.quantize(numpy)")):
        r = run("show", f)
        assert r.returncode == 0 and want in r.stdout, r.stderr


def test_reports_the_tools_write_render(tmp_path):
    """`xte moe --json` and bench_overhead.py --json, as the built tools write them (skipped where
    ctest did not name the program / library)."""
    xte_bin, lib = os.environ.get("XTE_BIN"), os.environ.get("XTE_LIBRARY")
    if not xte_bin and not lib:
        pytest.skip("no XTE_BIN / XTE_LIBRARY")
    if xte_bin:
        r = subprocess.run([xte_bin, "moe", "--hidden", "256", "--ffn", "128", "--experts", "8",
                            "--topk", "2", "--tokens", "16", "--check-tokens", "4", "--iters", "1",
                            "--json"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        (tmp_path / "moe.json").write_text(r.stdout)
        assert json.loads(r.stdout)["context"]["cpu_model"]  # the machine record
        out = run("show", tmp_path / "moe.json")
        assert out.returncode == 0, out.stderr
        assert "| default | exact | " in out.stdout and "| pass (4 tokens" in out.stdout
    if lib:
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "python" / "bench_overhead.py"),
                            "--reps", "20", "--json", str(tmp_path / "ov.json")],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        out = run("show", tmp_path / "ov.json")
        assert out.returncode == 0, out.stderr
        assert "| xte.quantize(numpy) | " in out.stdout
        assert "| bare ctypes xte_cast | " in out.stdout


def test_summary_unknown_case_fails(tmp_path):
    ep2 = write_recorded(tmp_path, "ep2.json", ep_report(2, "token-major", 0.95), "x")
    doc = tmp_path / "doc.md"
    doc.write_text(f"<!-- perf_tables: summary\nEP | {ep2} | dispatchx\n-->\n"
                   "<!-- /perf_tables -->\n")
    r = run("--check", doc)
    assert r.returncode != 0 and "no case 'dispatchx'" in (r.stdout + r.stderr)


def test_unclosed_marker_fails(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- perf_tables: summary\n-->\nno end marker\n")
    r = run("--check", doc)
    assert r.returncode != 0 and "no <!-- /perf_tables -->" in (r.stdout + r.stderr)


def test_repository_doc_is_up_to_date():
    r = run("--check", ROOT / "docs" / "performance.md", cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
