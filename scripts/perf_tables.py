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
  ep FILE...              `xte bench ep --json FILE` reports (rank 0's "context", "config",
                          "ops"): one row per report and op (dispatch, combine): ranks, layout,
                          MB per rank, xte ms, MPI_Alltoallv ms, ratio, GB/s, time shares.
  moe FILE...             `xte moe --json` reports ("context", "config", "totals", "numerics"):
                          one row per report: preset, mode, ISA, threads, tokens, forward /
                          backward / layer / setup seconds, the FP8 GEMM share, the fp64 check.
  overhead FILE           a `bench/python/bench_overhead.py --json FILE` report ("machine",
                          "results"): call, microseconds, the bare ctypes call, ratio.
  summary                 the lines after "summary" inside the marker, one per row,
                          "operator | FILE | case [| target]": the case's ratio to its anchor
                          (ep: case dispatch or combine; moe: layer or setup, in seconds;
                          overhead: the call, in microseconds) and the report's number; after
                          the table, each report's machine, date, commit and command. A case
                          with `*` is a glob: one row per match.

`record` copies a report and adds "xte_record": {"command", "commit", "recorded"}, which the
tables print (the reports themselves do not know their command line or commit). `--check`
renders without writing and exits 1 when the document differs (a table typed by hand or stale).
FILE paths are relative to the repository root. Only the standard library is used.
"""

import argparse
import datetime
import fnmatch
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


def machine_bench(ctx, openblas=True):
    """One line from an xte bench report's "context" (the machine record); openblas False leaves
    out OpenBLAS's configuration (reports whose anchor is not OpenBLAS)."""
    parts = [f"{ctx.get('cpu_model', '?')} (family/model/stepping "
             f"{ctx.get('cpu_family_model_stepping', '?')})"]
    if ctx.get("backend") == "cuda":
        parts.append(f"GPU {ctx.get('gpu_name', '?')} (compute capability "
                     f"{ctx.get('gpu_compute_capability', '?')}, {ctx.get('gpu_sm_count', '?')} SMs), "
                     f"CUDA runtime {ctx.get('cuda_runtime', '?')}, driver {ctx.get('cuda_driver', '?')}")
    parts.append(f"{ctx.get('cores', '?')} cores, xte ISA {ctx.get('xte_cpu_isa', '?')} "
                 f"(best {ctx.get('xte_cpu_isa_best', '?')}), {ctx.get('bench_threads', '?')} threads")
    if openblas and ctx.get("xte_gemm_e4m3"):
        parts.append(f"exact e4m3 GEMM: {ctx['xte_gemm_e4m3']}; "
                     f"{ctx.get('xte_gemm_e4m3_small_m', '?')}")
    parts.append(f"L1d {kib(ctx.get('l1d_bytes'))}, L2 {kib(ctx.get('l2_bytes'))}, "
                 f"L3 {kib(ctx.get('l3_bytes'))}")
    parts.append(f"THP `{ctx.get('transparent_hugepage', '?')}`")
    if openblas and ctx.get("openblas_corename"):
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


def report_kind(rep):
    """bench, torch, ep, moe or overhead, from a report's keys."""
    if "xte_ratios" in rep:
        return "bench"
    cmd = rep.get("command")
    if cmd == "bench ep":
        return "ep"
    if cmd == "moe":
        return "moe"
    if cmd == "bench_overhead":
        return "overhead"
    if "results" in rep and "machine" in rep:
        return "torch"
    raise SystemExit(f"perf_tables: a report of unknown kind (keys {sorted(rep)})")


def when(rep):
    """The date of a report: the bench's own, else the day `record` stored it."""
    d = (rep.get("context", {}).get("date") or rep.get("machine", {}).get("date")
         or rep.get("xte_record", {}).get("recorded", "?"))
    return str(d)


def sources(paths, reps):
    """The command and commit of each report of a multi-report table."""
    lines = []
    for path, rep in zip(paths, reps):
        r = rep.get("xte_record", {})
        lines.append(f"- `{r.get('command', '?')}`: {when(rep)[:16]}, commit "
                     f"{str(r.get('commit', '?'))[:10]}, data `{path}`")
    return lines


def render_ep(paths):
    reps = [load(p) for p in paths]
    ctx = reps[0].get("context", {})
    mpi = reps[0].get("config", {}).get("mpi_library", "?")
    lines = [f"Machine: {machine_bench(ctx, openblas=False)}; {mpi}.  ",
             "Times: the median over iterations of the slowest rank; ratio = MPI_Alltoallv of the "
             "same bytes / xte (1.0: as fast as the bare exchange); shares: rank 0's time in "
             "packing, the exchange and the local permute.", ""] + sources(paths, reps) + [
        "", "| ranks | dispatch layout | op | tokens per rank | MB per rank | xte ms | "
        "MPI_Alltoallv ms | ratio | GB/s | pack / exchange / local % |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for rep in reps:
        c = rep.get("config", {})
        for o in rep.get("ops", []):
            shares = " / ".join(f"{100 * o.get(k, 0):.0f}" for k in
                                ("pack_share", "exchange_share", "local_share"))
            lines.append(f"| {c.get('ranks', '?')} | {c.get('dispatch', '?')} | {o['op']} | "
                         f"{c.get('tokens_per_rank', '?')} | {num(o.get('mb_per_rank'))} | "
                         f"{num(o.get('xte_ms'))} | {num(o.get('anchor_ms'))} | "
                         f"{num(o.get('ratio'))} | {num(o.get('gb_s'))} | {shares} |")
    return lines


def moe_check(rep):
    n = rep.get("numerics")
    if not n:
        return "not run"
    worst = max((t.get("rel_err", 0) for t in n.get("tensors", [])), default=None)
    return (f"{'pass' if n.get('pass') else 'FAIL'} ({n.get('checked_tokens', '?')} tokens, "
            f"worst rel. error {num(worst, 4) if worst is None else f'{worst:.2e}'})")


def render_moe(paths):
    reps = [load(p) for p in paths]
    ctx = reps[0].get("context", {})
    lines = [f"Machine: {machine_bench(ctx, openblas=False)}.  ",
             "Seconds per layer call (mean of the iterations); setup: allocation and the synthetic "
             "FP8 weights; check: the layer against an fp64 reference on a few tokens.", ""] + \
        sources(paths, reps) + [
        "", "| preset | mode | ISA, threads | tokens | forward s | backward s | layer s | "
        "setup s | FP8 GEMM share | FP8 GEMM GFLOP/s | fp64 check |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for rep in reps:
        c, t = rep.get("config", {}), rep.get("totals", {})
        bwd = num(t.get("backward_s"), 3) if c.get("backward") else "-"
        lines.append(f"| {rep.get('preset', '?')} | {c.get('mode', '?')} | {c.get('isa', '?')}, "
                     f"{c.get('threads', '?')} | {c.get('tokens', '?')} | "
                     f"{num(t.get('forward_s'), 3)} | {bwd} | {num(t.get('layer_s'), 3)} | "
                     f"{num(t.get('setup_s'), 3)} | {num(t.get('gemm_fp8_share'))} | "
                     f"{num(t.get('gemm_fp8_gflops'), 1)} | {moe_check(rep)} |")
    return lines


def render_overhead(path):
    rep = load(path)
    m = rep.get("machine", {})
    head, bits = record_line(rep)
    lines = head + [
        f"Machine: {m.get('cpu_model', '?')} (family/model/stepping "
        f"{m.get('cpu_family_model_stepping', '?')}), xte {m.get('xte_version', '?')} ISA "
        f"{m.get('xte_cpu_isa', '?')}, {m.get('xte_cpu_threads', '?')} threads; Python "
        f"{m.get('python_version', '?')}, NumPy {m.get('numpy_version', '?')}, torch "
        f"{m.get('torch_version') or '-'}; input {m.get('input', '?')}; {m.get('statistic', '?')} "
        f"of {m.get('reps', '?')} calls; load at start {str(m.get('load_avg', '?')).split()[0]}.  ",
        "; ".join(bits + [f"{when(rep)[:10]}", f"data `{path}`"]) + ".", "",
        "| call | us | anchor | anchor us | ratio |", "|---|---|---|---|---|"]
    for r in rep.get("results", []):
        lines.append(f"| {r['call']} | {num(r['us'])} | {r['anchor']} | {num(r['anchor_us'])} | "
                     f"{num(r['ratio'])} |")
    return lines


def summary_rows(rep, case):
    """(case, value, anchor, machine, date) of each row of a report that case names."""
    kind = report_kind(rep)
    glob = "*" in case

    def pick(items, key):
        got = [r for r in items if (fnmatch.fnmatchcase(r[key], case) if glob else r[key] == case)]
        if not got:
            raise SystemExit(f"perf_tables: no case {case!r} in the report")
        return got

    if kind == "bench":
        ctx = rep.get("context", {})
        machine = (f"{ctx.get('cpu_model', '?')} {ctx.get('cpu_family_model_stepping', '')}, "
                   f"{ctx.get('xte_cpu_isa', '?')}, {ctx.get('bench_threads', '?')} threads")
        return [(r["name"], f"refused: {r['refused']}" if r.get("refused") else num(r.get("ratio")),
                 r.get("anchor", ""), machine, when(rep)[:10])
                for r in pick(rep["xte_ratios"], "name")]
    if kind == "torch":
        m = rep.get("machine", {})
        machine = (f"{m.get('cpu_model', '?')} {m.get('cpu_family_model_stepping', '')}, "
                   f"{m.get('xte_cpu_isa', '?')}, {m.get('xte_cpu_threads', '?')} threads")
        return [(r["case"], num(r["ratio_median"]), f"torch {m.get('torch_version', '')}".strip(),
                 machine, when(rep)[:10]) for r in pick(rep["results"], "case")]
    if kind == "ep":
        ctx, c = rep.get("context", {}), rep.get("config", {})
        machine = (f"{ctx.get('cpu_model', '?')} {ctx.get('cpu_family_model_stepping', '')}, "
                   f"{c.get('ranks', '?')} ranks x {ctx.get('xte_cpu_threads', '?')} thread(s)")
        return [(f"{o['op']}, {c.get('dispatch', '?')}, {c.get('ranks', '?')} ranks, "
                 f"{c.get('tokens_per_rank', '?')} tokens", num(o.get("ratio")),
                 o.get("anchor", "MPI_Alltoallv"), machine, when(rep)[:10])
                for o in pick(rep.get("ops", []), "op")]
    if kind == "moe":
        ctx, c, t = rep.get("context", {}), rep.get("config", {}), rep.get("totals", {})
        machine = (f"{ctx.get('cpu_model', '?')} {ctx.get('cpu_family_model_stepping', '')}, "
                   f"{c.get('isa', '?')}, {c.get('threads', '?')} threads")
        keys = {"layer": "layer_s", "setup": "setup_s", "forward": "forward_s",
                "backward": "backward_s"}
        if case not in keys:
            raise SystemExit(f"perf_tables: moe summary case {case!r}: one of {sorted(keys)}")
        return [(f"{rep.get('preset', '?')} {c.get('mode', '?')}, {case}",
                 f"{num(t.get(keys[case]), 3)} s", "(seconds)", machine, when(rep)[:10])]
    m = rep.get("machine", {})  # overhead
    machine = (f"{m.get('cpu_model', '?')} {m.get('cpu_family_model_stepping', '')}, "
               f"{m.get('xte_cpu_isa', '?')}, {m.get('xte_cpu_threads', '?')} threads")
    return [(r["call"], f"{num(r['us'])} us = {num(r['ratio'])} x", r["anchor"], machine,
             when(rep)[:10]) for r in pick(rep["results"], "call")]



def render_summary(spec_lines):
    """One row per case (operator, case, ratio with its target, anchor, the report's number), then
    one line per report: its machine, date, commit and command."""
    spec_lines = [s for s in spec_lines if s.strip()]
    if not spec_lines:
        return ["(No report listed yet: one line \"operator | docs/perf/FILE.json | case\" per row"
                " inside this marker.)"]
    lines = ["| operator | case | ratio (target) | anchor | report |", "|---|---|---|---|---|"]
    reports = {}  # path -> (number, description)
    for spec in spec_lines:
        parts = [p.strip() for p in spec.split("|")]
        if len(parts) not in (3, 4):
            raise SystemExit(f"perf_tables: summary line {spec!r}: \"operator | FILE | case "
                             "[| target]\"")
        op, path, case = parts[:3]
        target = f" ({parts[3]})" if len(parts) == 4 and parts[3] else ""
        rep = load(path)
        rows = summary_rows(rep, case)
        if path not in reports:
            rec = rep.get("xte_record", {})
            _, _, _, machine, date = rows[0]
            reports[path] = (len(reports) + 1,
                             f"`{path}`: {machine}; {date}, commit "
                             f"{str(rec.get('commit', '?'))[:10]}; `{rec.get('command', '?')}`")
        n = reports[path][0]
        for name, value, anchor, _, _ in rows:
            lines.append(f"| {op} | {name} | {value}{target} | {anchor} | R{n} |")
    lines.append("")
    lines += [f"- R{n}: {d}" for n, d in reports.values()]
    return lines


def render(spec):
    words = spec.strip().split("\n", 1)
    first = shlex.split(words[0])
    kind = first[0]
    if kind == "summary":
        return render_summary(words[1].splitlines() if len(words) > 1 else [])
    opts = dict(w.split("=", 1) for w in first[2:] if "=" in w)
    files = [w for w in first[1:] if "=" not in w]
    if kind in ("ep", "moe", "overhead") and not files:
        raise SystemExit(f"perf_tables: marker {spec!r} names no report")
    if kind == "ep":
        return render_ep(files)
    if kind == "moe":
        return render_moe(files)
    if kind == "overhead":
        return render_overhead(files[0])
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
        kind = report_kind(load(a.report))
        if kind in ("bench", "torch"):
            lines = (render_bench if kind == "bench" else render_torch)(a.report, a.filter)
        else:
            lines = {"ep": render_ep, "moe": render_moe,
                     "overhead": lambda p: render_overhead(p[0])}[kind]([a.report])
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
