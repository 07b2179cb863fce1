#!/usr/bin/env python3
"""The entry files' layer rule (docs/architecture.md): no src/*_api.c includes or calls another
entry file's internals.

Fails (exit 1, one line per violation) when an entry file src/<op>_api.c
  - references a function or object defined with external linkage in another src/*_api.c that the
    public API (include/xte/*.h) does not declare (an entry file may call the public API, as any
    caller does; what two entry files share lives in src/core/), or
  - includes a private header of another layer: src/cpu/, src/cuda/, src/musa/, another
    operator's ops header (src/xte_<other>_ops.h) or another folder of src/ than its own
    (src/ep/ for ep_api.c), src/core/ and src/numerics/;
and when a module of the Python package python/xte imports another module's private name
(`from .moe import _dtype`, or `M._name` on a module M imported from the package): what two
modules share gets a name without the underscore in a shared module (python/xte/ops/_common.py,
python/xte/torch/_common.py). Importing a private module (`from .. import _lib`) is allowed.

Usage: check_layers.py [repository root] (default: this script's repository).
       check_layers.py --self-test [root]: copies the entry files and the public headers of root
       and the Python package of root into a temporary tree, plants one violation of each kind
       and fails unless each is reported (and the unplanted copy passes)."""
import ast
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


def python_modules(pkg_root):
    """{dotted module name: path} of every .py file under pkg_root's parent's package tree."""
    base = os.path.dirname(pkg_root)
    mods = {}
    for dp, _, fn in os.walk(pkg_root):
        for f in sorted(fn):
            if f.endswith(".py"):
                path = os.path.join(dp, f)
                name = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                mods[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return mods


def private(name):
    return name.startswith("_") and not name.startswith("__")


def check_python(root, quiet=False):
    """Violations of the Python rule: a module of python/xte importing another's private name."""
    pkg_root = os.path.join(root, "python", "xte")
    if not os.path.isdir(pkg_root):
        return []
    mods = python_modules(pkg_root)
    top = "xte"
    bad = []
    for me, path in sorted(mods.items()):
        is_pkg = os.path.basename(path) == "__init__.py"
        pkg = me if is_pkg else me.rsplit(".", 1)[0]
        rel = os.path.relpath(path, root)
        tree = ast.parse(read(path), path)
        aliases = {}  # local name -> module of the package it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = pkg.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    target = ".".join(parts + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target != top and not target.startswith(top + "."):
                    continue
                for a in node.names:
                    if target + "." + a.name in mods:
                        aliases[a.asname or a.name] = target + "." + a.name
                    elif private(a.name) and target != me:
                        bad.append("%s:%d imports %s from %s, a private name of another module "
                                   "(give it a public name in a shared module)" %
                                   (rel, node.lineno, a.name, target))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname and a.name in mods:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and
                    node.value.id in aliases and private(node.attr) and
                    aliases[node.value.id] + "." + node.attr not in mods):
                bad.append("%s:%d uses %s.%s, a private name of %s (give it a public name in a "
                           "shared module)" % (rel, node.lineno, node.value.id, node.attr,
                                               aliases[node.value.id]))
    if not quiet:
        for line in bad:
            print("check_layers: " + line)
        if not bad:
            print("check_layers: %d Python modules, none imports another's private names" %
                  len(mods))
    return bad


def planted_verdict(bad, want, what):
    """0 when every planted violation (want: a substring of its report) is among the reports bad
    and nothing else is; else 1, naming what was missed or reported in excess."""
    missed = [w for w in want if not any(w in b for b in bad)]
    extra = [b for b in bad if not any(w in b for w in want)]
    for w in missed:
        print("check_layers self-test: the planted %s was not reported: %s" % (what, w))
    for b in extra:
        print("check_layers self-test: reported what was not planted: " + b)
    if missed or extra:
        return 1
    print("check_layers self-test: every planted %s reported (%d)" % (what, len(want)))
    return 0


def self_test_python(root):
    """Plants a private import and a private attribute use between two modules of a copy of
    python/xte; both must be reported, and the copy without them must pass."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(root, "python", "xte"), os.path.join(tmp, "python", "xte"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        if check_python(tmp, quiet=True):
            print("check_layers self-test: the Python copy fails before anything is planted")
            return 1
        ops = os.path.join(tmp, "python", "xte", "ops")
        with open(os.path.join(ops, "planted_a.py"), "w") as f:
            f.write("def _helper():\n    return 1\n")
        with open(os.path.join(ops, "planted_b.py"), "w") as f:
            f.write("from .planted_a import _helper\nfrom . import planted_a as A\n"
                    "from .. import _lib\n\n\ndef f():\n    return _helper() + A._helper()\n")
        bad = check_python(tmp, quiet=True)
        want = ["planted_b.py:1 imports _helper from xte.ops.planted_a",
                "planted_b.py:7 uses A._helper, a private name of xte.ops.planted_a"]
        return planted_verdict(bad, want, "Python violation")


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
        return planted_verdict(bad, want, "violation")


def main(argv):
    if argv and argv[0] == "--self-test":
        root = argv[1] if len(argv) > 1 else ROOT
        return self_test(root) or self_test_python(root)
    root = argv[0] if argv else ROOT
    entries_bad = check(root)
    return 1 if entries_bad or check_python(root) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
