"""The GEMM mode (xte_gemm_config.mode: XTE_GEMM_EXACT / XTE_GEMM_FAST) chosen by each Python
layer reaches the C call: xte.gemm / gemm_grouped, the xte.torch ops and their DeepGEMM forms,
xte.nn (functional and modules: forward and both backward GEMMs), the recipe field
(xte.recipe.Recipe.gemm_mode) read by xte.nn and by xte.transformer_engine's modules under
autocast, and xte.deep_gemm's set_gemm_mode.

A spy replaces the library's xte_gemm / xte_gemm_grouped entry points for the test (every
Python call goes through xte._lib.call, which looks the function up on xte._lib.lib), records
config->mode of each call and calls the real function. Default everywhere: EXACT.
The numerics of each mode are tested by the GEMM tests (test_gemm*.py, tests/test_gemm_*.c)."""

# ctest: no-isa-variants  (Python plumbing: which mode is passed, not what the kernel computes)

import pytest

torch = pytest.importorskip("torch")

import xte  # noqa: E402
import xte.deep_gemm as deep_gemm  # noqa: E402
import xte.nn as xnn  # noqa: E402
import xte.nn.functional as XF  # noqa: E402
import xte.torch as xt  # noqa: E402
from xte import _lib  # noqa: E402
from xte.recipe import Float8BlockScaling  # noqa: E402

EXACT, FAST = int(xte.GemmMode.EXACT), int(xte.GemmMode.FAST)


@pytest.fixture
def modes(monkeypatch):
    """The config->mode of every xte_gemm / xte_gemm_grouped call, in order."""
    seen = []
    for name, cfg_arg in (("xte_gemm", 4), ("xte_gemm_grouped", 5)):
        real = getattr(_lib.lib, name)

        def spy(*args, _real=real, _i=cfg_arg):
            seen.append(int(args[_i]._obj.mode))  # args[_i]: ctypes.byref(config)
            return _real(*args)
        monkeypatch.setattr(_lib.lib, name, spy)
    return seen


def _qt(x, block):
    return xte.quantize(x, "te_block", block, columnwise=False)


def _pair(x, tile):
    return (xte.per_block_cast_to_fp8 if tile else xte.per_token_cast_to_fp8)(x)


g = torch.Generator().manual_seed(3)
X = torch.randn(32, 256, generator=g)
W = torch.randn(128, 256, generator=g)


# ----------------------------------------------------------------------------- plain / torch ops


@pytest.mark.parametrize("mode", [None, "exact", "fast", xte.GemmMode.FAST])
def test_plain_and_torch_gemm(modes, mode):
    kw = {} if mode is None else {"mode": mode}
    want = FAST if mode in ("fast", xte.GemmMode.FAST) else EXACT
    a, b = _qt(X, "1x128"), _qt(W, "128x128")
    y0 = xte.gemm(a, b, **kw)
    y1 = xt.gemm(a, b, **kw)
    assert modes == [want, want]
    assert torch.equal(y0.view(torch.int16), y1.view(torch.int16))
    modes.clear()
    sizes = torch.tensor([16, 16])
    bg = _qt(torch.cat([W, W]), "128x128")
    xte.gemm_grouped(a, bg, group_sizes=sizes, **kw)
    xt.gemm_grouped(a, bg, group_sizes=sizes, **kw)
    assert modes == [want, want]


def test_torch_deepgemm_ops(modes):
    a, b = _pair(X, False), _pair(W, True)
    d = torch.empty(32, 128, dtype=torch.bfloat16)
    for mode, want in (("exact", EXACT), ("fast", FAST)):
        modes.clear()
        xt.fp8_gemm_nt(a, b, d, mode=mode)
        xt.m_grouped_fp8_gemm_nt_contiguous(a, (torch.stack([b[0]] * 2), torch.stack([b[1]] * 2)),
                                            d, group_sizes=[16, 16], mode=mode)
        xt.m_grouped_fp8_gemm_nt_masked(
            (a[0].view(2, 16, 256), a[1].view(2, 16, 2)),
            (torch.stack([b[0]] * 2), torch.stack([b[1]] * 2)), d.view(2, 16, 128),
            torch.tensor([16, 9], dtype=torch.int32), mode=mode)
        ka, kb = _pair(X.t().contiguous(), False), _pair(W[:32].t().contiguous(), False)
        xt.k_grouped_fp8_gemm_tn_contiguous(
            (ka[0].t().contiguous(), ka[1].t().contiguous()),
            (kb[0].t().contiguous(), kb[1].t().contiguous()),
            torch.empty(1, 256, 256), ks=[32], mode=mode)
        assert modes and set(modes) == {want}, (mode, modes)
    modes.clear()
    xt.fp8_gemm_nt(a, b, d)
    assert modes == [EXACT]  # the default


def test_bad_mode_names_the_argument(modes):
    a, b = _qt(X, "1x128"), _qt(W, "128x128")
    for f in (xte.gemm, xt.gemm):
        with pytest.raises(xte.XteValueError, match="mode"):
            f(a, b, mode="fastest")
    with pytest.raises(xte.XteValueError, match="mode"):
        XF.linear(X, W, gemm_mode="quick")
    with pytest.raises(xte.XteValueError, match="mode"):
        xnn.Linear(256, 128, gemm_mode="quick")
    with pytest.raises(xte.XteValueError, match="mode"):
        deep_gemm.set_gemm_mode("quick")
    assert modes == []


# ----------------------------------------------------------------------------- xte.nn


def _linear_fwd_bwd(f):
    x = X.clone().requires_grad_(True)
    w = W.clone().requires_grad_(True)
    f(x, w).sum().backward()
    return x.grad, w.grad


@pytest.mark.parametrize("gemm_mode,recipe_mode,want", [
    (None, None, EXACT), ("fast", None, FAST), ("exact", None, EXACT), (None, "fast", FAST),
    ("exact", "fast", EXACT), ("fast", "exact", FAST)])
def test_nn_linear_all_three_gemms(modes, gemm_mode, recipe_mode, want):
    r = Float8BlockScaling()
    if recipe_mode is not None:
        r.gemm_mode = recipe_mode
    assert XF.gemm_mode_of(r, gemm_mode) == want
    _linear_fwd_bwd(lambda x, w: XF.linear(x, w, recipe=r, gemm_mode=gemm_mode))
    assert modes == [want] * 3  # fprop, dgrad, wgrad
    modes.clear()
    m = xnn.Linear(256, 128, recipe=r, gemm_mode=gemm_mode)
    x = X.clone().requires_grad_(True)
    m(x).sum().backward()
    assert modes == [want] * 3
    assert m.gemm_mode == gemm_mode
    assert f"gemm_mode={'fast' if want == FAST else 'exact'}" in repr(m)


def test_recipe_default_is_exact():
    r = Float8BlockScaling()
    assert r.gemm_mode == "exact" and xte.recipe.Recipe.gemm_mode == "exact"
    assert XF.gemm_mode_of(r) == EXACT and XF.gemm_mode_of("te_block") == EXACT


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_nn_grouped_linear_and_moe(modes, mode):
    want = FAST if mode == "fast" else EXACT
    gl = xnn.GroupedLinear(2, 256, 128, gemm_mode=mode)
    x = X.clone().requires_grad_(True)
    gl(x, torch.tensor([0, 32])).sum().backward()  # aligned groups: one grouped GEMM each
    assert modes == [want] * 3  # grouped fprop, dgrad, K-grouped wgrad
    modes.clear()
    # unaligned groups: each expert through linear(), the mode passed on
    gl(x, torch.tensor([5, 27])).sum().backward()
    assert modes == [want] * 6
    modes.clear()
    moe = xnn.MoE(128, 128, 4, 2, num_shared_experts=1, gemm_mode=mode)
    moe(torch.randn(8, 128, generator=g).requires_grad_(True)).sum().backward()
    assert modes and set(modes) == {want}
    assert len(modes) == 12  # fc1, fc2, shared fc1, fc2: 3 GEMMs each


# ----------------------------------------------------------------------------- TE modules


@pytest.mark.parametrize("mode", [None, "fast"])
def test_te_modules_read_the_recipe(modes, mode):
    import xte.transformer_engine.pytorch as te
    from xte.transformer_engine.common import recipe
    r = recipe.Float8BlockScaling()
    if mode is not None:
        r.gemm_mode = mode
    want = FAST if mode == "fast" else EXACT
    lin = te.Linear(256, 128, device="cpu")
    gl = te.GroupedLinear(2, 256, 128, device="cpu")
    with te.autocast(enabled=True, recipe=r):
        lin(X).sum().backward()
        gl(X, [16, 16]).sum().backward()
    assert modes and set(modes) == {want}
    modes.clear()
    lin(X)  # outside autocast: torch's matmul, no xte GEMM
    assert modes == []


# ----------------------------------------------------------------------------- xte.deep_gemm


def test_deep_gemm_set_gemm_mode(modes):
    a, b = _pair(X, False), _pair(W, True)
    d = torch.empty(32, 128, dtype=torch.bfloat16)
    assert deep_gemm.get_gemm_mode() == "exact"
    align = deep_gemm.get_mk_alignment_for_contiguous_layout()
    deep_gemm.set_mk_alignment_for_contiguous_layout(16)  # two groups of 16 rows in a
    try:
        for mode, want in (("fast", FAST), ("exact", EXACT), (xte.GemmMode.FAST, FAST)):
            deep_gemm.set_gemm_mode(mode)
            assert deep_gemm.get_gemm_mode() == ("fast" if want == FAST else "exact")
            modes.clear()
            deep_gemm.fp8_gemm_nt(a, b, d)
            deep_gemm.fp8_gemm_nn(a, (b[0].t(), b[1].t()), d)
            bg = (torch.stack([b[0]] * 2), torch.stack([b[1]] * 2))
            deep_gemm.m_grouped_fp8_gemm_nt_contiguous(
                a, bg, d, torch.tensor([0] * 16 + [1] * 16, dtype=torch.int32))
            deep_gemm.m_grouped_fp8_gemm_nt_masked(
                (a[0].view(2, 16, 256), a[1].view(2, 16, 2)), bg, d.view(2, 16, 128),
                torch.tensor([16, 3], dtype=torch.int32), 16)
            ka, kb = _pair(X.t().contiguous(), False), _pair(W[:32].t().contiguous(), False)
            deep_gemm.k_grouped_fp8_gemm_tn_contiguous(
                (ka[0].t().contiguous(), ka[1].t().contiguous()),
                (kb[0].t().contiguous(), kb[1].t().contiguous()), torch.empty(1, 256, 256),
                [32], None)
            deep_gemm.cublaslt_gemm_nt(a[0], b[0], torch.empty(32, 128))
            assert len(modes) >= 6 and set(modes) == {want}, (mode, modes)
    finally:
        deep_gemm.set_gemm_mode("exact")
        deep_gemm.set_mk_alignment_for_contiguous_layout(align)
