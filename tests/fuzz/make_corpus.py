#!/usr/bin/env python3
"""Writes the seed corpora tests/fuzz/corpus/<target>/ from built fuzz targets.

    tests/fuzz/make_corpus.py <fuzz build dir> [--per-call N] [--tries N] [--targets T ...]

The targets decode bytes into calls; a byte below 200 at a choice point takes the usual path
(small shapes, valid enums, matching dtypes). This script draws candidate inputs from a fixed
seed with bytes biased that way, runs each target over them once with XTE_FUZZ_REPORT=1 (every
checked call prints "xte-fuzz-call <entry point> <status>"), and keeps, for every entry point,
the first N inputs whose last call succeeded: a corpus of valid calls for the fuzzer to start
from. Deterministic for a given build.
"""
import argparse
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile

TARGETS = ["fuzz_quantize", "fuzz_gemm", "fuzz_gemm_grouped", "fuzz_router", "fuzz_permute",
           "fuzz_swiglu", "fuzz_attention", "fuzz_ep"]


def candidate(rng):
    n = rng.choice([48, 96, 160, 256, 512, 1024])
    lim = rng.choice([200, 200, 120, 64, 16])
    return bytes(rng.randrange(lim) for _ in range(n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--per-call", type=int, default=6)
    ap.add_argument("--tries", type=int, default=1500)
    ap.add_argument("--targets", nargs="*", default=TARGETS, help="a subset of the targets")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "corpus"))
    args = ap.parse_args()
    env = dict(os.environ, XTE_FUZZ_REPORT="1", ASAN_OPTIONS="detect_leaks=0")
    total = 0
    for t in args.targets:
        exe = os.path.join(args.build, "tests", "fuzz", t)
        if not os.path.exists(exe):
            print(f"make_corpus: {exe} is missing", file=sys.stderr)
            return 1
        rng = random.Random(t)
        kept = {}
        with tempfile.TemporaryDirectory() as tmp:
            files = []
            for i in range(args.tries):
                p = os.path.join(tmp, f"c{i:05d}")
                with open(p, "wb") as fh:
                    fh.write(candidate(rng))
                files.append(p)
            # one process per chunk: libFuzzer runs every file given once
            for c0 in range(0, len(files), 100):
                chunk = files[c0:c0 + 100]
                r = subprocess.run([exe, "-runs=1"] + chunk, env=env, capture_output=True,
                                   text=True, errors="replace")
                cur, last = None, {}
                for line in r.stderr.splitlines():
                    if line.startswith("Running: "):
                        cur = line.split(" ", 1)[1].strip()
                    elif line.startswith("xte-fuzz-call ") and cur:
                        _, call, st = line.split()
                        last[cur] = (call, st)
                if r.returncode != 0:
                    print(f"make_corpus: {t} crashed on a candidate (rc {r.returncode}); "
                          "the inputs before it are kept", file=sys.stderr)
                for p in chunk:
                    if p in last and last[p][1] == "XTE_SUCCESS":
                        lst = kept.setdefault(last[p][0], [])
                        if len(lst) < args.per_call:
                            lst.append(p)
            out = os.path.join(args.out, t)
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            for call, lst in sorted(kept.items()):
                for p in lst:
                    data = open(p, "rb").read()
                    name = f"{call}-{hashlib.sha1(data).hexdigest()[:12]}"
                    with open(os.path.join(out, name), "wb") as fh:
                        fh.write(data)
                    total += len(data)
            print(f"make_corpus: {t}: " +
                  ", ".join(f"{c} {len(v)}" for c, v in sorted(kept.items())))
    print(f"make_corpus: {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
