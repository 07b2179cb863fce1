#!/usr/bin/env python3
"""Render the generated tables of docs/performance.md from the benchmarks' JSON reports.

    python3 scripts/perf_tables.py [--check] [DOC]           (default DOC: docs/performance.md)
    python3 scripts/perf_tables.py record --command CMD [--commit SHA] REPORT.json OUT.json
    python3 scripts/perf_tables.py show REPORT.json [--filter S]

A generated table sits between two marker comments, each at the start of a line; everything
between them is replaced:

    <!-- perf_tables: bench docs/perf/gemm-m512.json [filter=S] -->
    ...
    <!-- /perf_tables -->

Kinds of marker:
  bench FILE [filter=S]   an `xte bench <suite> --json FILE` report (Google Benchmark's JSON with
                          the machine record in "context" and xte's "xte_ratios"; also the
                          `--backend cuda` report): the command line, the machine, then one row
                          per case that has an anchor: case, rate, anchor, anchor rate, ratio.
  torch FILE [filter=S]   a `bench/python/bench_torch_anchors.py --json FILE` report ("machine",
                          "results"): case, xte GFLOP/s, torch GFLOP/s, xte / torch.
  summary                 the lines after "summary" inside the marker, one per row,
                          "operator | FILE | case": the case's ratio to its anchor with the
                          machine, date, commit and command of FILE.

`record` copies a report and adds "xte_record": {"command", "commit", "recorded"}, which the
tables print (the reports themselves do not know their command line or commit). `--check`
renders without writing and exits 1 when the document differs (a table typed by hand or stale).
FILE paths are relative to the repository root. Only the standard library is used.
"""

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN = re.compile(r"^<!-- perf_tables: (.*?)-->\n", re.S | re.M)  # markers start a line
END = "<!-- /perf_tables -->"


def load(path):
    """A report by its path: relative to the working directory, else to the repository root."""
    if not (os.path.isabs(path) or os.path.exists(path)):
        path = os.path.join(ROOT, path)
    with open(path) as f:
        return json.load(f)


def num(v, digits=2):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return f"{v:.{digits}f}"


def kib(v):
    try:
        return f"{int(v) // 1024} KiB"
    except (TypeError, ValueError):
        return "?"


def record_line(rep):
    r = rep.get("xte_record", {})
    out = []
    if r.get("command"):
        out.append(f"Command: `{r['command']}`  ")
    bits = []
    if r.get("commit"):
        bits.append(f"commit {r['commit'][:10]}")
    return out, bits


def machine_bench(ctx):
    """One line from an xte bench report's "context" (the machine record)."""
    parts = [f"{ctx.get('cpu_model', '?')} (family/model/stepping "
             f"{ctx.get('cpu_family_model_stepping', '?')})"]
    if ctx.get("backend") == "cuda":
        parts.append(f"GPU {ctx.get('gpu_name', '?')} (compute capability "
                     f"{ctx.get('gpu_compute_capability', '?')}, {ctx.get('gpu_sm_count', '?')} SMs), "
                     f"CUDA runtime {ctx.get('cuda_runtime', '?')}, driver {ctx.get('cuda_driver', '?')}")
    parts.append(f"{ctx.get('cores', '?')} cores, xte ISA {ctx.get('xte_cpu_isa', '?')} "
                 f"(best {ctx.get('xte_cpu_isa_best', '?')}), {ctx.get('bench_threads', '?')} threads")
    if ctx.get("xte_gemm_e4m3"):
        parts.append(f"exact e4m3 GEMM: {ctx['xte_gemm_e4m3']}; "
                     f"{ctx.get('xte_gemm_e4m3_small_m', '?')}")
    parts.append(f"L1d {kib(ctx.get('l1d_bytes'))}, L2 {kib(ctx.get('l2_bytes'))}, "
                 f"L3 {kib(ctx.get('l3_bytes'))}")
    parts.append(f"THP `{ctx.get('transparent_hugepage', '?')}`")
    if ctx.get("openblas_corename"):
        parts.append(f"OpenBLAS {ctx['openblas_corename']}, {ctx.get('openblas_num_threads', '?')} "
                     f"threads, OPENBLAS_CORETYPE {ctx.get('openblas_coretype', '?')}, anchor "
                     f"{ctx.get('openblas_anchor', '?')}")
    load_avg = str(ctx.get("load_avg_1_5_15", "?")).split()
    parts.append(f"load at start {load_avg[0] if load_avg else '?'}")
    return "; ".join(parts)


def render_bench(path, flt):
    rep = load(path)
    ctx = rep.get("context", {})
    head, bits = record_line(rep)
    date = ctx.get("date", "?")
    lines = head + [f"Machine: {machine_bench(ctx)}.  ",
                    f"Date {date}; " + "; ".join(bits + [f"data `{path}`"]) + ".", "",
                    "| case | rate | anchor | anchor rate | ratio (median of rounds) |",
                    "|---|---|---|---|---|"]
    for r in rep.get("xte_ratios", []):
        if not r.get("anchor") or (flt and flt not in r["name"]):
            continue
        ratio = r.get("ratio")
        ratio = f"refused: {r['refused']}" if r.get("refused") else num(ratio)
        lines.append(f"| {r['name']} | {num(r.get('rate'))} {r.get('metric', '')} | {r['anchor']} | "
                     f"{num(r.get('anchor_rate'))} | {ratio} |")
    return lines


def render_torch(path, flt):
    rep = load(path)
    m = rep.get("machine", {})
    head, bits = record_line(rep)
    reps = {r.get("reps") for r in rep.get("results", [])}
    reps = reps.pop() if len(reps) == 1 else "R"
    lines = head + [
        f"Machine: {m.get('cpu_model', '?')} (family/model/stepping "
        f"{m.get('cpu_family_model_stepping', '?')}), xte ISA {m.get('xte_cpu_isa', '?')}, "
        f"{m.get('xte_cpu_threads', '?')} threads; torch {m.get('torch_version', '?')}, "
        f"{m.get('torch_num_threads', '?')} threads, CPU capability "
        f"{m.get('torch_cpu_capability', '?')}; gap {m.get('gap_s', '?')} s; THP "
        f"`{m.get('transparent_hugepage', '?')}`; load at start "
        f"{str(m.get('load_avg', '?')).split()[0]}.  ",
        "; ".join(bits + [f"data `{path}`"]) + ".", "",
        f"| case | xte GFLOP/s | torch GFLOP/s | xte / torch (median [min, max] of {reps}) |",
        "|---|---|---|---|"]
    for r in rep.get("results", []):
        if flt and flt not in r["case"]:
            continue
        lines.append(f"| {r['case']} | {num(r['xte_gflop_s'], 1)} | {num(r['anchor_gflop_s'], 1)} | "
                     f"{num(r['ratio_median'])} [{num(r['ratio_min'])}, {num(r['ratio_max'])}] |")
    return lines


def render_summary(spec_lines):
    spec_lines = [s for s in spec_lines if s.strip()]
    if not spec_lines:
        return ["(No report listed yet: one line \"operator | docs/perf/FILE.json | case\" per row"
                " inside this marker.)"]
    lines = ["| operator | case | ratio | anchor | machine | date, commit | command |",
             "|---|---|---|---|---|---|---|"]
    for spec in spec_lines:
        if not spec.strip():
            continue
        op, path, case = (p.strip() for p in spec.split("|"))
        rep = load(path)
        rec = rep.get("xte_record", {})
        if "xte_ratios" in rep:
            ctx = rep.get("context", {})
            row = next(r for r in rep["xte_ratios"] if r["name"] == case)
            ratio, anchor = num(row.get("ratio")), row.get("anchor", "")
            machine = (f"{ctx.get('cpu_model', '?')} {ctx.get('cpu_family_model_stepping', '')}, "
                       f"{ctx.get('xte_cpu_isa', '?')}, {ctx.get('bench_threads', '?')} threads")
            date = str(ctx.get("date", "?"))[:10]
        else:
            m = rep.get("machine", {})
            row = next(r for r in rep["results"] if r["case"] == case)
            ratio, anchor = num(row["ratio_median"]), "torch"
            machine = (f"{m.get('cpu_model', '?')} {m.get('cpu_family_model_stepping', '')}, "
                       f"{m.get('xte_cpu_isa', '?')}, {m.get('xte_cpu_threads', '?')} threads")
            date = str(rec.get("recorded", "?"))[:10]
        commit = rec.get("commit", "?")[:10]
        lines.append(f"| {op} | {case} | {ratio} | {anchor} | {machine} | {date}, {commit} | "
                     f"`{rec.get('command', '?')}` |")
    return lines


def render(spec):
    words = spec.strip().split("\n", 1)
    first = shlex.split(words[0])
    kind = first[0]
    if kind == "summary":
        return render_summary(words[1].splitlines() if len(words) > 1 else [])
    opts = dict(w.split("=", 1) for w in first[2:] if "=" in w)
    if kind == "bench":
        return render_bench(first[1], opts.get("filter"))
    if kind == "torch":
        return render_torch(first[1], opts.get("filter"))
    raise SystemExit(f"perf_tables: unknown kind {kind!r} in marker {spec!r}")


def regenerate(text):
    out, pos = [], 0
    for m in BEGIN.finditer(text):
        if m.start() < pos:
            continue
        end = text.find("\n" + END, m.end() - 1) + 1
        if end <= 0:
            raise SystemExit(f"perf_tables: no {END} after {m.group(0).strip()}")
        out.append(text[pos:m.end()])
        out.append("\n".join(render(m.group(1))) + "\n")
        pos = end
    out.append(text[pos:])
    return "".join(out)


def cmd_record(a):
    rep = load(a.report)
    commit = a.commit
    if commit is None:
        try:
            commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                                    text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "?"
    rep["xte_record"] = {"command": a.command, "commit": commit,
                         "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    with open(a.out, "w") as f:
        json.dump(rep, f, indent=1)
        f.write("\n")
    return 0


def main(argv):
    if argv and argv[0] == "record":
        ap = argparse.ArgumentParser(prog="perf_tables.py record")
        ap.add_argument("--command", required=True, help="the command line that wrote REPORT")
        ap.add_argument("--commit", default=None, help="the commit measured (default: HEAD)")
        ap.add_argument("report")
        ap.add_argument("out")
        return cmd_record(ap.parse_args(argv[1:]))
    if argv and argv[0] == "show":
        ap = argparse.ArgumentParser(prog="perf_tables.py show")
        ap.add_argument("report")
        ap.add_argument("--filter", default=None)
        a = ap.parse_args(argv[1:])
        kind = "bench" if "xte_ratios" in load(a.report) else "torch"
        lines = (render_bench if kind == "bench" else render_torch)(a.report, a.filter)
        print("\n".join(lines))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if DOC is not up to date")
    ap.add_argument("doc", nargs="?", default=os.path.join(ROOT, "docs", "performance.md"))
    a = ap.parse_args(argv)
    with open(a.doc) as f:
        text = f.read()
    new = regenerate(text)
    if a.check:
        if new != text:
            print(f"{a.doc}: generated tables are out of date (run scripts/perf_tables.py)")
            return 1
        return 0
    if new != text:
        with open(a.doc, "w") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
