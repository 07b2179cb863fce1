#!/usr/bin/env python3
"""The entry files' layer rule (docs/architecture.md): no src/*_api.c includes or calls another
entry file's internals.

Fails (exit 1, one line per violation) when an entry file src/<op>_api.c
  - references a function or object defined with external linkage in another src/*_api.c that the
    public API (include/xte/*.h) does not declare (an entry file may call the public API, as any
    caller does; what two entry files share lives in src/core/), or
  - includes a private header of another layer: src/cpu/, src/cuda/, src/musa/, another
    operator's ops header (src/xte_<other>_ops.h) or another folder of src/ than its own
    (src/ep/ for ep_api.c), src/core/ and src/numerics/.

Usage: check_layers.py [repository root] (default: this script's repository).
       check_layers.py --self-test [root]: copies the entry files and the public headers of root
       into a temporary tree, plants one violation of each kind and fails unless both are
       reported (and the unplanted copy passes)."""
import os
import re
import shutil
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "src")

COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
# a definition at file scope: a line starting at column 0 with a type, the name, "(", whose
# declarator ends with "{" (functions), or a file-scope object with an initialiser / ";"
FUNC_DEF = re.compile(r"^(?!static\b|typedef\b|extern\b|#)[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*"
                      r"\([^;{]*\)\s*\{", re.M | re.S)
OBJ_DEF = re.compile(r"^(?!static\b|typedef\b|extern\b|#|return\b)[A-Za-z_][\w \t\*]*?\b"
                     r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*(?:=[^;]*)?;", re.M)
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def strip(text):
    return STRING.sub('""', COMMENT.sub(" ", text))


def public_names():
    names = set()
    inc = os.path.join(ROOT, "include", "xte")
    for f in sorted(os.listdir(inc)):
        if f.endswith(".h"):
            names.update(IDENT.findall(strip(read(os.path.join(inc, f)))))
    return names


def defined(code):
    names = set(m.group(1) for m in FUNC_DEF.finditer(code))
    # file-scope objects: only lines outside any brace (depth 0)
    depth, top = 0, []
    for line in code.split("\n"):
        if depth == 0:
            top.append(line)
        depth += line.count("{") - line.count("}")
    names.update(m.group(1) for m in OBJ_DEF.finditer("\n".join(top)))
    return names


def allowed_include(op, inc):
    if inc.startswith("xte/") or inc.startswith("core/") or inc.startswith("numerics/"):
        return True
    if inc in ("xte_internal.h", "xte_backend.h", "xte_kernel_args.h"):
        return True
    if "/" not in inc:
        m = re.fullmatch(r"xte_(\w+)_ops\.h", inc)
        return bool(m) and m.group(1) == op
    return inc.split("/")[0] == op  # its own folder (src/ep/ for ep_api.c)


def check(root, quiet=False):
    global ROOT, SRC
    ROOT, SRC = root, os.path.join(root, "src")
    entries = sorted(f for f in os.listdir(SRC) if re.fullmatch(r"\w+_api\.c", f))
    if not entries:
        print("check_layers: no src/*_api.c found under %s" % SRC)
        return 1
    public = public_names()
    code = {f: strip(read(os.path.join(SRC, f))) for f in entries}
    raw = {f: COMMENT.sub(" ", read(os.path.join(SRC, f))) for f in entries}
    defs = {f: defined(code[f]) - public for f in entries}
    bad = []
    for f in entries:
        op = f[: -len("_api.c")]
        used = set(IDENT.findall(code[f]))
        for g in entries:
            if g == f:
                continue
            for name in sorted(used & defs[g]):
                bad.append("src/%s uses %s, an internal of src/%s (move it to src/core/)" %
                           (f, name, g))
        for inc in INCLUDE.findall(raw[f]):
            if not allowed_include(op, inc):
                bad.append('src/%s includes "%s", a private header of another layer' % (f, inc))
    if not quiet:
        for line in bad:
            print("check_layers: " + line)
        if not bad:
            print("check_layers: %d entry files, none uses another's internals" % len(entries))
    return bad


def self_test(root):
    """Plants an internal shared between two entry files and a private include; both must be
    reported, and the tree without them must pass."""
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "src"))
        shutil.copytree(os.path.join(root, "include"), os.path.join(tmp, "include"))
        for f in os.listdir(os.path.join(root, "src")):
            if re.fullmatch(r"\w+_api\.c", f):
                shutil.copy(os.path.join(root, "src", f), os.path.join(tmp, "src", f))
        if check(tmp, quiet=True):
            print("check_layers self-test: the copy fails before anything is planted")
            return 1
        with open(os.path.join(tmp, "src", "quantize_api.c"), "a") as f:
            f.write("\nint xte_planted_internal(int x) {\n  return x + 1;\n}\n")
        with open(os.path.join(tmp, "src", "gemm_api.c"), "a") as f:
            f.write('\n#include "cpu/xte_cpu.h"\nint xte_planted_user(void);\n'
                    "int xte_planted_user(void) {\n  return xte_planted_internal(1);\n}\n")
        bad = check(tmp, quiet=True)
        want = ["uses xte_planted_internal, an internal of src/quantize_api.c",
                'includes "cpu/xte_cpu.h"']
        missed = [w for w in want if not any(w in b for b in bad)]
        extra = [b for b in bad if not any(w in b for w in want)]
        for w in missed:
            print("check_layers self-test: the planted violation was not reported: " + w)
        for b in extra:
            print("check_layers self-test: reported what was not planted: " + b)
        if missed or extra:
            return 1
        print("check_layers self-test: both planted violations reported")
        return 0


def main(argv):
    if argv and argv[0] == "--self-test":
        return self_test(argv[1] if len(argv) > 1 else ROOT)
    return 1 if check(argv[0] if argv else ROOT) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
