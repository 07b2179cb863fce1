#!/bin/sh
# Runs the pytest suite of tests/python in a virtual environment kept in the build tree.
# Usage: run_pytest.sh VENV_DIR PYTHON [pytest args...]
# numpy, ml_dtypes and pytest are installed with pip only when missing. Exit 77 (ctest: skipped)
# when the environment cannot be made (no venv module, no package index); pytest's exit code 5
# (no tests collected) is a failure.
# With XTE_REQUIRE_PYTHON_TESTS=1 (CI) those cases fail instead of skipping.
export PYTHONDONTWRITEBYTECODE=1
skip=77
[ "${XTE_REQUIRE_PYTHON_TESTS:-0}" = 1 ] && skip=1
venv=$1
python=$2
shift 2
if [ ! -x "$venv/bin/python" ]; then
  if ! "$python" -m venv "$venv"; then
    echo "run_pytest: cannot create a virtual environment with $python -m venv: skipped"
    exit $skip
  fi
fi
if ! "$venv/bin/python" -c "import numpy, ml_dtypes, pytest" 2>/dev/null; then
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check numpy ml_dtypes pytest; then
    echo "run_pytest: pip could not install numpy, ml_dtypes, pytest: skipped"
    exit $skip
  fi
fi
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run_pytest: pytest collected no tests"
  exit 1
fi
exit "$rc"
