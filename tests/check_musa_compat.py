#!/usr/bin/env python3
"""Fails when src/cuda/ uses a CUDA runtime / library name that src/musa/xte_musa_compat.h does
not map, so that the MUSA build cannot silently fall behind the CUDA one.

Scans every source under src/cuda/ (comments and string literals removed) for the identifiers of
NVIDIA's APIs: cuda[A-Z]..., CUDA_..., the driver API (cu[A-Z]..., CU_...), cuBLAS(Lt), cuDNN,
cuRAND, cuSPARSE, cuFFT, NVRTC, NCCL, __nv_... and __CUDA_ARCH__, and for #include lines naming
an NVIDIA header outside the runtime shim (src/cuda/xte_gpu_runtime.h). Each identifier needs a
`#define <name> ...` in the compat header. Run by ctest (tests/cmake/gpu.cmake) as check_gpu_musa_compat.

usage: check_musa_compat.py [--cuda-dir DIR] [--compat FILE]
"""
import argparse
import os
import re
import sys

IDENT = re.compile(
    r"\b(cuda[A-Z]\w*|CUDA_\w+|cu[A-Z][a-z]\w*|CU_[A-Z]\w*|cublas\w*|cudnn\w*|curand\w*"
    r"|cusparse\w*|cufft\w*|cusolver\w*|nvrtc\w*|nccl\w*|__nv_\w+|__CUDA_ARCH\w*)")
NV_INCLUDE = re.compile(
    r'^\s*#\s*include\s*[<"]((?:cuda|cu[a-z]+|nv|nccl|cub/|thrust/|mma\.h|cooperative_groups)'
    r'[^>"]*)[>"]', re.M)
DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)", re.M)
SOURCE_EXT = (".cu", ".cuh", ".h", ".hpp", ".c", ".cc", ".cpp", ".inl")
SHIM = "xte_gpu_runtime.h"


def strip_comments_and_strings(text):
    """Blanks comments and string / char literals, keeping line breaks (for line numbers)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            out.append("\n" * text.count("\n", i, j))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda-dir", default=os.path.join(root, "src", "cuda"))
    ap.add_argument("--compat", default=os.path.join(root, "src", "musa", "xte_musa_compat.h"))
    args = ap.parse_args()

    try:
        with open(args.compat, encoding="utf-8") as f:
            mapped = set(DEFINE.findall(strip_comments_and_strings(f.read())))
    except OSError as e:
        print(f"check_musa_compat: cannot read the compat header: {e}")
        return 1

    used = {}  # name -> [file:line, ...]
    bad_includes = []
    files = 0
    for dirpath, _, names in os.walk(args.cuda_dir):
        for name in sorted(names):
            if not name.endswith(SOURCE_EXT):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8", errors="replace") as f:
                raw = f.read()
            files += 1
            if name != SHIM:
                for m in NV_INCLUDE.finditer(raw):
                    inc = m.group(1)
                    if any(os.path.exists(os.path.join(d, inc))
                           for d in (dirpath, os.path.join(root, "src"))):
                        continue  # one of ours (cuda/xte_gpu.h)
                    line = raw.count("\n", 0, m.start()) + 1
                    bad_includes.append(f"{rel}:{line}: #include <{m.group(1)}>")
            text = strip_comments_and_strings(raw)
            text = re.sub(r"^\s*#\s*include[^\n]*", "", text, flags=re.M)  # checked above
            for m in IDENT.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                used.setdefault(m.group(1), []).append(f"{rel}:{line}")

    if files == 0:
        print(f"check_musa_compat: no sources under {args.cuda_dir}")
        return 1
    missing = sorted(n for n in used if n not in mapped)
    for n in missing:
        where = ", ".join(used[n][:3]) + (" ..." if len(used[n]) > 3 else "")
        print(f"unmapped: {n} (used at {where}): add '#define {n} musa...' to {args.compat}")
    for b in bad_includes:
        print(f"{b}: include NVIDIA headers only through src/cuda/{SHIM} (mapped for MUSA there)")
    if missing or bad_includes:
        print(f"check_musa_compat: FAILED: {len(missing)} unmapped identifier(s), "
              f"{len(bad_includes)} direct NVIDIA include(s)")
        return 1
    print(f"check_musa_compat: {len(used)} CUDA identifiers in {files} files under "
          f"{os.path.relpath(args.cuda_dir, root)}, all mapped in "
          f"{os.path.relpath(args.compat, root)}: {' '.join(sorted(used))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
