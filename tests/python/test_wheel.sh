#!/bin/sh
# The Python wheel, end to end: builds it from the source tree with pip (pyproject.toml,
# scikit-build-core, the CMake build in a fresh temporary build directory, as from a clean clone),
# checks its contents (xte/lib/libxte.so with an $ORIGIN run path, the plugins CMake built, the
# Python sources and the py.typed marker, one py3 wheel for every Python), installs it into a
# fresh virtual environment and, from outside the source tree with XTE_LIBRARY and PYTHONPATH
# unset, imports xte and calls the library: it must be the one inside the package, and each
# plugin in the wheel must load.
# Usage: test_wheel.sh SOURCE_DIR WORK_DIR PYTHON     (WORK_DIR is emptied first)
# Needs the package index (PyPI: scikit-build-core for the build, numpy and ml_dtypes for the
# install). Exit 77 (ctest: skipped) when no virtual environment or no index; a failure instead
# with XTE_REQUIRE_PYTHON_TESTS=1 (CI). About 2-3 minutes (the C library is compiled again).
set -u
export PYTHONDONTWRITEBYTECODE=1
skip=77
[ "${XTE_REQUIRE_PYTHON_TESTS:-0}" = 1 ] && skip=1
src=$(cd "$1" && pwd)
work=$2
python=$3
t0=$(date +%s)
fail() { echo "test_wheel: FAILED: $*"; exit 1; }

rm -rf "$work"
mkdir -p "$work/dist" "$work/run" || fail "cannot make $work"
work=$(cd "$work" && pwd)
if ! "$python" -m venv "$work/build-venv" >/dev/null; then
  echo "test_wheel: cannot create a virtual environment with $python -m venv: skipped"
  exit $skip
fi
# the package index must answer (the isolated build environment installs scikit-build-core)
if ! "$work/build-venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
       -d "$work/probe" scikit-build-core >/dev/null 2>&1; then
  echo "test_wheel: pip cannot reach the package index: skipped"
  exit $skip
fi

echo "test_wheel: pip wheel --no-deps $src"
if ! (unset XTE_LIBRARY PYTHONPATH CMAKE_ARGS
      "$work/build-venv/bin/python" -m pip wheel --no-deps --disable-pip-version-check \
        -w "$work/dist" "$src") >"$work/build.log" 2>&1; then
  tail -40 "$work/build.log"
  fail "pip wheel (log: $work/build.log)"
fi
t1=$(date +%s)
set -- "$work"/dist/xte-*.whl
[ $# -eq 1 ] && [ -f "$1" ] || fail "expected one xte wheel in $work/dist, found: $*"
wheel=$1
echo "test_wheel: built $(basename "$wheel") ($(wc -c <"$wheel") bytes) in $((t1 - t0)) s"

# contents: the tag, the libraries, the Python sources
"$work/build-venv/bin/python" - "$wheel" "$src" <<'EOF' || fail "wheel contents"
import os, sys, zipfile
wheel, src = sys.argv[1], sys.argv[2]
name = os.path.basename(wheel)
names = zipfile.ZipFile(wheel).namelist()
for n in sorted(names):
    print("  ", n)
errors = []
if "-py3-none-" not in name:
    errors.append(f"{name}: not a py3-none wheel (wheel.py-api = \"py3\")")
libs = [n for n in names if n.startswith("xte/lib/")]
if "xte/lib/libxte.so" not in libs:
    errors.append("no xte/lib/libxte.so")
if any(n.startswith("xte/lib/") and ("/cmake/" in n or "/pkgconfig/" in n) for n in names) \
        or any(n.startswith("xte/include/") for n in names):
    errors.append("C install files (headers, CMake or pkg-config files) in the wheel")
pysrc = os.path.join(src, "python", "xte")
for root, _, files in os.walk(pysrc):
    for f in files:
        if f.endswith(".py"):
            rel = "xte/" + os.path.relpath(os.path.join(root, f), pysrc).replace(os.sep, "/")
            if rel not in names:
                errors.append(f"{rel} (python/{rel}) missing")
if "xte/py.typed" not in names:  # PEP 561: the package's type hints are for its users
    errors.append("xte/py.typed (python/xte/py.typed) missing")
for e in errors:
    print("test_wheel:", e)
sys.exit(1 if errors else 0)
EOF

# the run path of every library in the wheel is $ORIGIN (libxte finds what lies next to it)
mkdir -p "$work/unzipped"
"$work/build-venv/bin/python" -m zipfile -e "$wheel" "$work/unzipped" || fail "unzip"
if command -v readelf >/dev/null 2>&1; then
  for so in "$work"/unzipped/xte/lib/*.so*; do
    readelf -d "$so" | grep -q 'R.*PATH.*\$ORIGIN' || fail "$(basename "$so") has no \$ORIGIN run path"
  done
fi

echo "test_wheel: pip install into a fresh virtual environment"
"$python" -m venv "$work/venv" >/dev/null || fail "venv"
if ! "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" \
       >"$work/install.log" 2>&1; then
  cat "$work/install.log"
  fail "pip install $(basename "$wheel")"
fi

# import from outside the source tree with nothing pointing at the build tree
cd "$work/run" || fail "cd"
env -u XTE_LIBRARY -u PYTHONPATH -u XTE_PLUGIN_DIR -u LD_LIBRARY_PATH \
  "$work/venv/bin/python" - <<'EOF' || fail "import xte from the installed wheel"
import ctypes, glob, importlib.metadata, os, sys
import xte
pkg = os.path.dirname(os.path.abspath(xte.__file__))
assert pkg.startswith(sys.prefix), f"xte imported from {pkg}, not from the venv {sys.prefix}"
libdir = os.path.join(pkg, "lib")
path = getattr(xte, "library_path", None) or xte._lib.library_path
assert os.path.dirname(os.path.abspath(path)) == libdir, f"libxte loaded from {path}, not {libdir}"
dist = importlib.metadata.version("xte")
print(f"test_wheel: xte {getattr(xte, '__version__', '?')} (wheel {dist}) from {path}")
if hasattr(xte, "__version__"):
    assert xte.__version__ == dist, f"xte.__version__ {xte.__version__} != wheel version {dist}"
lib = ctypes.CDLL(path)
buf = ctypes.create_string_buffer(8192)
assert lib.xte_backend_info_string(buf, ctypes.c_size_t(8192)) == 0
info = buf.value.decode()
print(info.rstrip())
for so in sorted(glob.glob(os.path.join(libdir, "libxte_*.so"))):
    plugin = os.path.basename(so)
    assert f"{plugin} loaded" in info, f"{plugin} is in the wheel but libxte did not load it"
# one operator through the package API on NumPy (the installed numpy / ml_dtypes dependencies)
import numpy as np
x = np.linspace(-4, 4, 256, dtype=np.float32).reshape(2, 128)
data, scales = xte.quantize(x, recipe="te_block")
assert str(data.dtype) == "float8_e4m3fn" and data.shape == (2, 128), (data.dtype, data.shape)
err = float(np.abs(xte.dequantize(xte.quantize(x)) - x).max())
assert 0 < err <= 4 / 16, f"quantize -> dequantize error {err}"  # e4m3: 3 mantissa bits
print(f"test_wheel: xte.quantize / dequantize on NumPy: max error {err:.4f}")
EOF
echo "test_wheel: passed in $(( $(date +%s) - t0 )) s"
