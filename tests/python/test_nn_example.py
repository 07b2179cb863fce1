"""examples/python/train_moe.py, short: the tiny MoE model with xte's FP8 modules beside the
same model in bf16, 30 training steps with seed 0 and 10 with seed 1; the loss curves stay within
the example's stated distance (max_t |l_xte - l_bf16| / l_bf16(0) <= DISTANCE = 0.0075; measured
0.0020 and 0.0052, reached at steps 25 and 3, so these prefixes hold the maxima of the example's
200-step runs) and both losses fall. Needs torch (CI installs it)."""

# ctest: no-isa-variants  (as test_nn.py; and it is the slowest file)

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "python", "train_moe.py")


def _load():
    spec = importlib.util.spec_from_file_location("train_moe", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_train_moe_30_steps_within_stated_distance():
    ex = _load()
    assert ex.DISTANCE == 0.0075  # the value the docstrings and docs/python.md state
    for seed, steps in ((0, 30), (1, 10)):  # seed 1's maximum is at step 3
        lx, lb, dist = ex.train(steps, seed=seed, log=None)
        assert len(lx) == len(lb) == steps
        assert dist <= ex.DISTANCE, (seed, dist)
        assert 0 < dist, seed  # the FP8 and bf16 models do differ
        if steps == 30:
            assert lx[-1] < 0.5 * lx[0] and lb[-1] < 0.5 * lb[0], (lx[0], lx[-1], lb[0], lb[-1])
    assert ex.main(["--steps", "3", "--every", "1", "--check", str(ex.DISTANCE)]) == 0
