"""scripts/perf_tables.py: docs/performance.md's generated tables come from the bench JSON.

The rendering is checked on small reports written here (the shapes `xte bench --json` and
bench_torch_anchors.py --json write), and the repository's docs/performance.md must be up to date
with the reports it names (no generated table edited by hand, no marker pointing nowhere)."""

# ctest: no-isa-variants

import json
import pathlib
import subprocess
import sys

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
            "gemm/dgemm/128/4096x7168 | Test CPU 6/1/2, avx2, 2 threads | 2026-12-07, abcdef1234 | "
            "`xte bench gemm --filter /128/` |") in text
    assert run("--check", doc).returncode == 0  # idempotent


def test_unclosed_marker_fails(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- perf_tables: summary\n-->\nno end marker\n")
    r = run("--check", doc)
    assert r.returncode != 0 and "no <!-- /perf_tables -->" in (r.stdout + r.stderr)


def test_repository_doc_is_up_to_date():
    r = run("--check", ROOT / "docs" / "performance.md", cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
