#!/bin/sh
# Runs pytest on tests/python in a virtual environment kept in the build tree.
# Usage: run_pytest.sh VENV_DIR PYTHON --setup          make the environment only (ctest fixture)
#        run_pytest.sh VENV_DIR PYTHON [pytest args...] make it when needed, then run pytest
# The environment gets numpy, ml_dtypes, pytest, safetensors and torch from the package index with pip, each
# only when missing (torch from PyPI: its CUDA build, ~3 min and ~5 GB once; the tests use it on
# the CPU; the CPU-only index download.pytorch.org/whl/cpu is added when it answers). ctest sets
# XTE_LIBRARY (the built libxte.so) and PYTHONPATH (<repo>/python) for the xte package.
# Exit 77 (ctest: skipped) when the environment cannot be made (no venv module, no package
# index); pytest's exit code 5 (no tests collected) is a failure. Without torch (it could not be
# installed, or XTE_PYTHON_TORCH=0 to save the download) the torch tests skip themselves.
# With XTE_REQUIRE_PYTHON_TESTS=1 (CI) every one of those cases fails instead, torch included.
# Concurrent runs (ctest -j) take a lock while they make the environment.
export PYTHONDONTWRITEBYTECODE=1
skip=77
require=0
if [ "${XTE_REQUIRE_PYTHON_TESTS:-0}" = 1 ]; then
  skip=1
  require=1
fi
venv=$1
python=$2
shift 2

# 0 when every module named is importable in the environment (found, not imported: fast)
have() {
  "$venv/bin/python" - "$@" <<'EOF' 2>/dev/null
import importlib.util, sys
sys.exit(0 if all(importlib.util.find_spec(m) for m in sys.argv[1:]) else 1)
EOF
}

pip_install() {
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}

want_torch=1
[ "${XTE_PYTHON_TORCH:-1}" = 0 ] && [ "$require" = 0 ] && want_torch=0

prepare() {
  if [ ! -x "$venv/bin/python" ]; then
    if ! "$python" -m venv "$venv"; then
      echo "run_pytest: cannot create a virtual environment with $python -m venv: skipped"
      return $skip
    fi
  fi
  if ! have numpy ml_dtypes pytest; then
    echo "run_pytest: installing numpy, ml_dtypes, pytest into $venv"
    if ! pip_install numpy ml_dtypes pytest; then
      echo "run_pytest: pip could not install numpy, ml_dtypes, pytest: skipped"
      return $skip
    fi
  fi
  # safetensors for xte.check's file reader (test_check.py skips its safetensors cases without)
  if ! have safetensors; then
    echo "run_pytest: installing safetensors into $venv"
    if ! pip_install safetensors && [ "$require" = 1 ]; then
      echo "run_pytest: pip could not install safetensors (XTE_REQUIRE_PYTHON_TESTS=1): failed"
      return 1
    fi
  fi
  # a failed torch install is tried once per environment (again with XTE_REQUIRE_PYTHON_TESTS=1)
  if [ "$want_torch" = 1 ] && ! have torch && { [ "$require" = 1 ] || [ ! -e "$venv/xte-no-torch" ]; }; then
    extra=""
    if "$venv/bin/python" -c "import urllib.request as u; u.urlopen('https://download.pytorch.org/whl/cpu/torch/', timeout=5)" 2>/dev/null; then
      extra="--extra-index-url https://download.pytorch.org/whl/cpu"
    fi
    echo "run_pytest: installing torch into $venv (${extra:-PyPI; a few minutes})"
    t0=$(date +%s)
    # shellcheck disable=SC2086
    if pip_install $extra torch; then
      rm -f "$venv/xte-no-torch"
      echo "run_pytest: torch installed in $(( $(date +%s) - t0 )) s"
    elif [ "$require" = 1 ]; then
      echo "run_pytest: pip could not install torch (XTE_REQUIRE_PYTHON_TESTS=1): failed"
      return 1
    else
      echo "run_pytest: pip could not install torch: the tests that need it skip"
      : >"$venv/xte-no-torch"
    fi
  fi
  # mpi4py for the expert-parallel tests over MPI (only where Open MPI / MPICH is installed)
  if command -v mpiexec >/dev/null 2>&1 && ! have mpi4py; then
    echo "run_pytest: installing mpi4py into $venv"
    if ! pip_install mpi4py; then
      if [ "$require" = 1 ]; then
        echo "run_pytest: pip could not install mpi4py (XTE_REQUIRE_PYTHON_TESTS=1): failed"
        return 1
      fi
      echo "run_pytest: pip could not install mpi4py: the MPI tests skip"
    fi
  fi
  return 0
}

# make the environment under a lock (flock where it exists), so parallel tests install once
if command -v flock >/dev/null 2>&1; then
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
fi
prepare
rc=$?
[ "$rc" -eq 0 ] || exit "$rc"
if command -v flock >/dev/null 2>&1; then
  flock -u 9
fi

if [ "${1:-}" = --setup ]; then
  "$venv/bin/python" -c "import sys, numpy, ml_dtypes, pytest; print('run_pytest: python', sys.version.split()[0], 'numpy', numpy.__version__, 'ml_dtypes', ml_dtypes.__version__)"
  if have torch; then
    "$venv/bin/python" -c "import torch; print('run_pytest: torch', torch.__version__)" ||
      { echo "run_pytest: torch is installed but does not import"; exit 1; }
  fi
  exit 0
fi

"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run_pytest: pytest collected no tests"
  exit 1
fi
exit "$rc"
