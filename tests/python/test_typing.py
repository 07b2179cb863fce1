"""The package's type hints are consistent: mypy over python/xte with pyproject.toml's
[tool.mypy] configuration finds no error, and the PEP 561 marker python/xte/py.typed exists (the
wheel ships it: test_wheel.sh). The mypy case skips where mypy is not installed (run_pytest.sh
does not install it: a developer's check, ~20 s of CPU with torch's stubs)."""

# ctest: no-isa-variants  (static analysis of the Python sources)

import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_py_typed_marker():
    assert os.path.isfile(os.path.join(ROOT, "python", "xte", "py.typed"))


def test_mypy_clean(tmp_path):
    pytest.importorskip("mypy")
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                        os.path.join(ROOT, "pyproject.toml"), "--cache-dir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
