"""xte.quantize / dequantize / cast / quantize_scale_shape and DeepGEMM's casts against the NumPy
oracles of xte.testing (written from docs/numerics.md, not from the C code), byte for byte:
data, scales in every layout, both copies, fp32 / bf16 / fp16 input with NaN, inf, subnormals,
zeros and odd shapes; errors (class, argument named, out= untouched) and zero-copy.

torch is needed only by the tests marked so (pytest.importorskip("torch")); CI installs it."""

import ml_dtypes
import numpy as np
import pytest

import xte
from xte import testing as T
from xte._lib import (Recipe, ScaleLayout, XteBufferTooSmallError, XteDTypeError, XteError,
                      XteShapeError, XteUnsupportedError, XteValueError)
from xte._qtensor import QuantizedTensor
from xte._tensor import XteLayoutError
from xte.ops import quantize as Q

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E5M2 = ml_dtypes.float8_e5m2
E8M0 = ml_dtypes.float8_e8m0fnu
NP_DT = {"float32": np.float32, "bfloat16": BF16, "float16": np.float16}

# (recipe, block) pairs the library defines
RECIPE_BLOCKS = [
    ("te_block", "1x128"), ("te_block", "128x128"),
    ("deepgemm", "1x128"), ("deepgemm", "128x128"),
    ("deepgemm_ue8m0", "1x128"), ("deepgemm_ue8m0", "128x128"),
    ("mtfp8", "1x128"), ("mtfp8", "128x128"),
    ("mx_te", "1x32"), ("mx_ocp", "1x32"),
    ("te_current", "per_tensor"), ("te_delayed", "per_tensor"),
]
LAYOUTS = ["compact", "te_gemm", "deepgemm", "mx_swizzled"]
SHAPES = [(1, 1), (1, 200), (3, 257), (130, 129), (33, 64), (0, 64), (5, 0)]
DELAYED_SCALE = 0.3710937


def make_input(M, K, dtype, seed=0):
    """Normal values with per-row magnitudes over many binades, plus NaN (both signs), +-inf,
    +-0, the input format's subnormals and maxima, an all-zero block, an all-subnormal block and
    an all-NaN block (where the shape has room)."""
    rng = np.random.default_rng(seed * 7919 + M * 131 + K)
    lo, hi = {"float32": (-30, 30), "bfloat16": (-30, 30), "float16": (-8, 8)}[dtype]
    mag = np.exp2(rng.integers(lo, hi, size=(M, 1))).astype(np.float32)
    x = (rng.standard_normal((M, K)).astype(np.float32) * mag)
    sub = {"float32": 1e-40, "bfloat16": 1e-39, "float16": 2.0 ** -20}[dtype]
    big = {"float32": 3.0e38, "bfloat16": 3.0e38, "float16": 60000.0}[dtype]
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, sub, -sub, big, -big,
                         464.0, 465.0, 448.0, 61440.0], dtype=np.float32)
    specials[1] = -np.float32(np.nan)
    n = x.size
    if n:
        idx = rng.choice(n, size=min(n, len(specials) * 2), replace=False)
        x.reshape(-1)[idx] = np.resize(specials, len(idx))
    if M >= 3 and K >= 40:
        x[1, :32] = 0.0                       # an all-zero 1x32 block, and part of a 1x128 one
        x[2, :] = np.float32(sub) * np.sign(rng.standard_normal(K)).astype(np.float32)
    if M >= 33 and K >= 64:
        x[32, 32:64] = np.nan                 # an all-NaN 1x32 block
    return x.astype(NP_DT[dtype])


def _valid_layouts(recipe, block):
    """The layouts the library accepts for this (recipe, block), checked with the shape query."""
    out = []
    for lay in LAYOUTS:
        try:
            Q.quantize_scale_shape(7, 70, block, recipe, lay)
            out.append(lay)
        except XteError:
            pass
    return out


CASES = [(r, b, lay) for r, b in RECIPE_BLOCKS for lay in _valid_layouts(r, b)]


def test_layout_validity():
    # MX recipes take COMPACT or MX_SWIZZLED, the others COMPACT, TE_GEMM or DEEPGEMM
    for r, b in RECIPE_BLOCKS:
        lays = _valid_layouts(r, b)
        want = ["compact", "mx_swizzled"] if r.startswith("mx") else ["compact", "te_gemm",
                                                                       "deepgemm"]
        assert lays == want, (r, b, lays)
    with pytest.raises(XteUnsupportedError, match="layout"):
        Q.quantize_scale_shape(4, 64, "1x128", "te_block", "mx_swizzled")
    with pytest.raises(XteUnsupportedError, match="layout"):
        Q.quantize(np.ones((4, 64), np.float32), "mx_te", layout="te_gemm")
    with pytest.raises(XteUnsupportedError, match="scaling_mode"):
        Q.quantize(np.ones((4, 64), np.float32), "te_current", "1x128")


def _ref(x, recipe, block, layout, columnwise, **kw):
    if recipe == "te_delayed":
        kw.setdefault("scale", DELAYED_SCALE)
    d, s = T.reference_quantize(x, recipe, block, columnwise=columnwise, **kw)
    kind = T.reference_grid_kind(recipe, block, columnwise)
    return d, T.reference_scale_layout(s, kind, layout), s, kind


def _quant(x, recipe, block, layout, **kw):
    if recipe == "te_delayed":
        kw.setdefault("scale", DELAYED_SCALE)
    return Q.quantize(x, recipe, block, layout, **kw)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("recipe,block,layout", CASES)
def test_quantize_vs_reference(recipe, block, layout, dtype):
    for (M, K) in SHAPES:
        x = make_input(M, K, dtype)
        q = _quant(x, recipe, block, layout, rowwise=True, columnwise=True)
        where = f"{recipe} {block} {layout} {dtype} [{M}, {K}]"
        assert q.shape == (M, K)
        for cw in (False, True):
            d, s, _, _ = _ref(x, recipe, block, layout, cw)
            got_d = q.columnwise_data if cw else q.data
            got_s = q.columnwise_scale_inv if cw else q.scale_inv
            copy = "columnwise" if cw else "rowwise"
            assert type(got_d) is np.ndarray
            T.assert_bitwise_equal(got_d, d, f"{where} {copy} data")
            T.assert_bitwise_equal(got_s, s, f"{where} {copy} scales")
            assert got_s.shape == Q.quantize_scale_shape(M, K, block, recipe, layout, cw)


@pytest.mark.parametrize("recipe,block", RECIPE_BLOCKS)
def test_options_vs_reference(recipe, block):
    """e5m2, non-saturating, amax_epsilon and force_pow_2 both ways, each copy alone."""
    x = make_input(130, 300, "bfloat16", seed=3)
    opts = [dict(fmt="e5m2"), dict(saturate=False), dict(fmt="e5m2", saturate=False)]
    if recipe in ("te_block", "te_current"):
        opts += [dict(force_pow_2=False), dict(force_pow_2=True),
                 dict(amax_epsilon=1.5, force_pow_2=False), dict(amax_epsilon=1e-3)]
    for kw in opts:
        for rw, cw in ((True, False), (False, True)):
            q = _quant(x, recipe, block, "compact", rowwise=rw, columnwise=cw, **kw)
            assert (q.data is None) == (not rw) and (q.columnwise_data is None) == (not cw)
            d, s, _, _ = _ref(x, recipe, block, "compact", cw, **kw)
            where = f"{recipe} {block} {kw} columnwise={cw}"
            T.assert_bitwise_equal(q.columnwise_data if cw else q.data, d, where + " data")
            T.assert_bitwise_equal(q.columnwise_scale_inv if cw else q.scale_inv, s,
                                   where + " scales")


def test_force_pow_2_defaults_differ():
    """None is the C default -1: on for TE_BLOCK, off for TE_CURRENT."""
    x = np.full((1, 128), 3.0, np.float32)
    assert Q.quantize(x, "te_block").scale_inv[0, 0] == 0.0078125        # 448/3 -> 128
    assert Q.quantize(x, "te_current").scale_inv[0, 0] == np.float32(1) / (np.float32(448) / 3)
    assert Q.quantize(x, "te_current", force_pow_2=True).scale_inv[0, 0] == 0.0078125
    assert Q.quantize(x, "te_block", force_pow_2=False).scale_inv[0, 0] != 0.0078125


def test_per_tensor_amax_and_scale():
    x = make_input(9, 77, "float32", seed=5)
    x[~np.isfinite(x)] = -1e30               # a finite amax (inf is the scale = 1 case below)
    amax_ref = np.fmax.reduce(np.abs(x.reshape(-1)), initial=np.float32(0))
    q = Q.quantize(x, "te_current")
    assert q.amax.shape == (1,) and q.amax.dtype == np.float32 and q.amax[0] == amax_ref
    assert q.scale.shape == (1,) and q.scale[0] == np.float32(448) / amax_ref
    assert q.scale_inv.reshape(-1)[0] == np.float32(1) / q.scale[0]
    qd = Q.quantize(x, "te_delayed", scale=np.array([0.5], np.float32))
    assert qd.scale_inv.reshape(-1)[0] == 2.0 and qd.amax[0] == amax_ref
    amax = np.zeros(1, np.float32)
    qb = Q.quantize(x, "te_block", amax=amax)
    assert qb.amax is amax and amax[0] == amax_ref
    x[0, 3] = -np.inf
    x[1, 3] = np.nan
    q = Q.quantize(x, "te_current")
    assert q.amax[0] == np.inf and q.scale[0] == 1.0 and q.scale_inv.reshape(-1)[0] == 1.0


def test_recipe_objects():
    from xte import recipe as R
    x = make_input(130, 260, "float32", seed=9)
    for obj, name, kw in [
            (R.Float8BlockScaling(), "te_block", {}),
            (R.Float8BlockScaling(fp8_quant_fwd_inp=R.QParams(False, 0.5)), "te_block",
             dict(force_pow_2=False, amax_epsilon=0.5)),
            (R.Float8CurrentScaling(), "te_current", dict(force_pow_2=False)),
            (R.Float8CurrentScaling(fp8_format=R.Format.E5M2), "te_current", dict(fmt="e5m2")),
            (R.MXFP8BlockScaling(), "mx_te", {}), (R.OCPMXScaling(), "mx_ocp", {}),
            (R.DeepGEMMScaling(use_ue8m0=True), "deepgemm_ue8m0", {}),
            (R.MTFP8BlockScaling(), "mtfp8", {})]:
        q = Q.quantize(x, obj)
        d, s = T.reference_quantize(x, name, **kw)
        T.assert_bitwise_equal(q.data, d, repr(obj))
        T.assert_bitwise_equal(q.scale_inv, s, repr(obj))
    assert R.Float8BlockScaling().quantize_kwargs("weight")["block"] == "128x128"
    assert R.Float8CurrentScaling().quantize_kwargs("grad")["fmt"] == "e5m2"    # HYBRID
    q = Q.quantize(x, R.DelayedScaling(), scale=2.0)
    assert q.recipe == Recipe.TE_DELAYED and q.scale_inv.reshape(-1)[0] == 0.5


def test_deepgemm_casts():
    """DeepGEMM's names and return conventions: (data [M, K], fp32 scales compact)."""
    for dtype in ("float32", "bfloat16"):
        x = make_input(130, 300, dtype, seed=1)
        for ue in (False, True):
            r = "deepgemm_ue8m0" if ue else "deepgemm"
            d, s = Q.per_token_cast_to_fp8(x, use_ue8m0=ue)
            assert d.shape == (130, 300) and s.shape == (130, 3) and s.dtype == np.float32
            rd, rs = T.reference_quantize(x, r, "1x128")
            T.assert_bitwise_equal(d, rd)
            T.assert_bitwise_equal(s, rs)
            d, s = Q.per_block_cast_to_fp8(x, use_ue8m0=ue)
            assert d.shape == (130, 300) and s.shape == (2, 3)
            rd, rs = T.reference_quantize(x, r, "128x128")
            T.assert_bitwise_equal(d, rd)
            T.assert_bitwise_equal(s, rs)
            if ue:
                assert np.all((s.view(np.uint32) & 0x7FFFFF) == 0)
    d, s = Q.quantize(x, "deepgemm")             # unpacks as (data, scales)
    assert d.shape == (130, 300)


def test_default_block_and_layout():
    x = make_input(3, 70, "float32")
    assert Q.quantize(x).scaling_mode == xte.ScalingMode.BLOCK_1x128
    assert Q.quantize(x).layout == ScaleLayout.COMPACT
    assert Q.quantize(x, "mx_te").scaling_mode == xte.ScalingMode.MXFP8_1x32
    assert Q.quantize(x, "mx_te").scale_inv.dtype == E8M0
    assert Q.quantize(x, "te_current").scaling_mode == xte.ScalingMode.PER_TENSOR
    assert Q.quantize_scale_shape(3, 70, None, "te_block", None) == (3, 1)
    assert Q.quantize_scale_shape(3, 70, "1x128", "te_block", "te_gemm") == (1, 4)
    assert Q.quantize_scale_shape(3, 70, None, "mx_te", "mx_swizzled") == (128, 4)
    assert Q.quantize_scale_shape(3, 70, None, "mtfp8", None, columnwise=True) == (1, 70)


# ----------------------------------------------------------------------------- dequantize

@pytest.mark.parametrize("recipe,block", RECIPE_BLOCKS)
def test_dequantize_vs_reference(recipe, block):
    x = make_input(130, 150, "bfloat16", seed=2)
    for layout in ("compact", "mx_swizzled") if recipe.startswith("mx") else ("compact",
                                                                              "te_gemm"):
        q = _quant(x, recipe, block, layout, rowwise=True, columnwise=True)
        for cw in (False, True):
            _, _, s_compact, kind = _ref(x, recipe, block, layout, cw)
            data = q.columnwise_data if cw else q.data
            for od in ("float32", "bfloat16", "float16"):
                got = Q.dequantize(q, columnwise=cw, dtype=od)
                ref = T.reference_dequantize(data, s_compact, kind, block, od)
                assert got.shape == data.shape
                T.assert_bitwise_equal(_canon_nan(got), _canon_nan(ref),
                                       f"{recipe} {block} {layout} cw={cw} {od}")
                assert np.array_equal(np.signbit(got.astype(np.float32)),
                                      np.signbit(ref.astype(np.float32)))


def _canon_nan(a):
    """NaN payloads are not part of the contract for decoded NaN codes: one NaN pattern."""
    a = np.array(a)
    a[np.isnan(a.astype(np.float32))] = np.nan
    return a


def test_dequantize_out():
    x = make_input(4, 256, "float32", seed=4)
    q = Q.quantize(x)
    out = np.empty((4, 256), np.float32)
    assert Q.dequantize(q, out=out) is out
    T.assert_bitwise_equal(_canon_nan(out), _canon_nan(Q.dequantize(q)))
    with pytest.raises(XteValueError, match="columnwise"):
        Q.dequantize(q, columnwise=True)
    with pytest.raises(XteDTypeError, match="q"):
        Q.dequantize((q.data, q.scale_inv))


# ----------------------------------------------------------------------------- cast

def _cast_inputs():
    rng = np.random.default_rng(11)
    v = (rng.standard_normal(4000) * np.exp2(rng.integers(-30, 30, 4000))).astype(np.float32)
    edges = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 448, 464, 464.0001, 465, 480,
                      57344, 61439, 61440, 65504, 65520, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11,
                      2.0 ** -16, 2.0 ** -17, 1e-40, -1e-40, 1.5 * 2.0 ** 127, 2.0 ** 127,
                      1.4999 * 2.0 ** 127, 3.0e38, 1.5 * 2.0 ** -127, 2.0 ** -127, 1e-45],
                     dtype=np.float32)
    edges[3] = -np.float32(np.nan)
    return np.concatenate([v, edges, -edges])


@pytest.mark.parametrize("src", ["float32", "bfloat16", "float16"])
def test_cast_to_fp8(src):
    x = _cast_inputs().astype(NP_DT[src])
    for fmt, dt in (("e4m3", E4M3), ("e5m2", E5M2)):
        for sat in (True, False):
            got = Q.cast(x, fmt, saturate=sat)
            assert got.dtype == dt and got.shape == x.shape
            T.assert_bitwise_equal(got, T.reference_fp8(x.astype(np.float32), fmt, sat),
                                   f"{src}->{fmt} sat={sat}")


def test_cast_from_fp8_and_between_floats():
    codes = np.arange(256, dtype=np.uint8)
    for dt in (E4M3, E5M2):
        src = codes.view(dt)
        for od, np_od in (("float32", np.float32), ("bfloat16", BF16), ("float16", np.float16)):
            got = Q.cast(src, od)
            T.assert_bitwise_equal(_canon_nan(got), _canon_nan(src.astype(np_od)), f"{dt}->{od}")
            assert np.array_equal(np.signbit(got.astype(np.float32)),
                                  np.signbit(src.astype(np.float32)))
    x = _cast_inputs()
    T.assert_bitwise_equal(_canon_nan(Q.cast(x, "bfloat16")), _canon_nan(x.astype(BF16)))
    T.assert_bitwise_equal(_canon_nan(Q.cast(x, "float16")), _canon_nan(x.astype(np.float16)))


def test_cast_e8m0_both_ways():
    """docs/numerics.md section 3: encode as ml_dtypes' float8_e8m0fnu (nearest power of two,
    ties up; zero, negatives, NaN -> 0xFF); past 2^127 and +inf -> 0xFE saturating, 0xFF not.
    Decode 2^(e - 127), 0xFF NaN, then the target's rounding."""
    x = _cast_inputs()
    x = np.concatenate([x, np.exp2(np.arange(-149, 128, dtype=np.float64)).astype(np.float32),
                        (1.5 * np.exp2(np.arange(-127, 127, dtype=np.float64))).astype(np.float32)])
    for src, np_src in (("float32", np.float32), ("bfloat16", BF16), ("float16", np.float16)):
        xs = x.astype(np_src)
        x32 = xs.astype(np.float32)
        for sat in (True, False):
            got = Q.cast(xs, "e8m0", saturate=sat)
            assert got.dtype == E8M0
            ref = x32.astype(E8M0).view(np.uint8).copy()
            ref[(x32 == 0) | (x32 < 0) | np.isnan(x32)] = 0xFF
            ref[x32 >= np.float32(1.5 * 2.0 ** 127)] = 0xFE if sat else 0xFF
            T.assert_bitwise_equal(got.view(np.uint8), ref, f"{src}->e8m0 sat={sat}")
    e = np.arange(256, dtype=np.uint8).view(E8M0)
    for od, np_od in (("float32", np.float32), ("bfloat16", BF16), ("float16", np.float16)):
        got = Q.cast(e, od)
        T.assert_bitwise_equal(_canon_nan(got), _canon_nan(e.astype(np.float32).astype(np_od)),
                               f"e8m0->{od}")
    for fmt, dt in (("e4m3", E4M3), ("e5m2", E5M2)):
        T.assert_bitwise_equal(Q.cast(e, fmt), T.reference_fp8(e.astype(np.float32), fmt, True))


def test_cast_out_and_errors():
    x = np.linspace(-500, 500, 64, dtype=np.float32).reshape(8, 8)
    out = np.full(64, 0x55, np.uint8).view(E4M3)
    assert Q.cast(x, None, out=out) is out
    T.assert_bitwise_equal(out.reshape(8, 8), T.reference_fp8(x, "e4m3"))
    before = out.copy()
    with pytest.raises(XteDTypeError, match="out"):
        Q.cast(x, "e5m2", out=out)
    with pytest.raises(XteShapeError):
        Q.cast(x, None, out=np.empty(63, E4M3))
    with pytest.raises(XteDTypeError, match="dtype"):
        Q.cast(x, "int8")
    with pytest.raises(XteDTypeError, match="x"):
        Q.cast(x.astype(np.int32), "e4m3")
    with pytest.raises(XteLayoutError, match="x"):
        Q.cast(x[:, ::2], "e4m3")
    T.assert_bitwise_equal(out, before)


# ----------------------------------------------------------------------------- torch

def test_torch_in_torch_out_same_bytes():
    torch = pytest.importorskip("torch")
    for dtype, tdt in (("float32", torch.float32), ("bfloat16", torch.bfloat16),
                       ("float16", torch.float16)):
        xn = make_input(130, 257, dtype, seed=6)
        xt = torch.from_numpy(xn.view(np.int16) if dtype == "bfloat16" else xn)
        if dtype == "bfloat16":
            xt = xt.view(torch.bfloat16)
        assert xt.dtype == tdt
        for recipe, block in RECIPE_BLOCKS:
            if recipe.startswith("mx") and not hasattr(torch, "float8_e8m0fnu"):
                continue
            qn = _quant(xn, recipe, block, "compact", columnwise=True)
            qt = _quant(xt, recipe, block, "compact", columnwise=True)
            for a, b in ((qt.data, qn.data), (qt.scale_inv, qn.scale_inv),
                         (qt.columnwise_data, qn.columnwise_data),
                         (qt.columnwise_scale_inv, qn.columnwise_scale_inv)):
                assert isinstance(a, torch.Tensor) and isinstance(b, np.ndarray)
                T.assert_bitwise_equal(a, b, f"{recipe} {block} {dtype}")
            if recipe in ("te_current", "te_delayed"):
                assert isinstance(qt.amax, torch.Tensor)
            dt = Q.dequantize(qt, dtype="bfloat16")
            assert isinstance(dt, torch.Tensor) and dt.dtype == torch.bfloat16
            T.assert_bitwise_equal(_canon_nan(T.to_numpy(dt)),
                                   _canon_nan(Q.dequantize(qn, dtype="bfloat16")))
        c = Q.cast(xt, "e4m3")
        assert c.dtype == torch.float8_e4m3fn
        T.assert_bitwise_equal(c, Q.cast(xn, "e4m3"))


def test_torch_deepgemm_casts():
    torch = pytest.importorskip("torch")
    x = torch.randn(130, 300, dtype=torch.bfloat16)
    d, s = Q.per_token_cast_to_fp8(x)
    assert d.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (130, 3)
    rd, rs = T.reference_quantize(x, "deepgemm", "1x128")
    T.assert_bitwise_equal(d, rd)
    T.assert_bitwise_equal(s, rs)
    # the DeepGEMM-style dequantized result is close to x
    deq = d.float().view(130, 300) * s.repeat_interleave(128, dim=1)[:, :300]
    assert T.calc_diff(deq, x) < 1e-3


# ----------------------------------------------------------------------------- errors

def _filled_out(x, recipe="te_block", block="1x128", layout="compact", columnwise=True):
    """A QuantizedTensor of the right shapes filled with 0xA5 bytes."""
    q = _quant(x, recipe, block, layout, columnwise=columnwise)
    for name in ("data", "scale_inv", "columnwise_data", "columnwise_scale_inv"):
        a = getattr(q, name)
        if a is not None:
            a.view(np.uint8)[...] = 0xA5
    return q


def _snapshot(q):
    return [None if a is None else a.copy() for a in
            (q.data, q.scale_inv, q.columnwise_data, q.columnwise_scale_inv)]


def _assert_untouched(q, snap):
    for a, b in zip((q.data, q.scale_inv, q.columnwise_data, q.columnwise_scale_inv), snap):
        if a is not None:
            T.assert_bitwise_equal(a, b, "out was written on error")


def test_quantize_errors_name_argument_and_leave_out_untouched():
    x = make_input(6, 200, "float32")
    out = _filled_out(x)
    snap = _snapshot(out)
    cases = [
        (XteDTypeError, "x", lambda: Q.quantize(x.astype(np.int32), out=out)),
        (XteDTypeError, "x", lambda: Q.quantize(x.astype(np.float64), out=out)),
        (XteShapeError, "x", lambda: Q.quantize(x.reshape(2, 3, 200), out=out)),
        (XteLayoutError, "x", lambda: Q.quantize(x[:, ::2], out=out)),
        (XteLayoutError, "x", lambda: Q.quantize(np.asfortranarray(x), out=out)),
        (XteDTypeError, "fmt", lambda: Q.quantize(x, fmt="e3m4", out=out)),
        (XteDTypeError, "out.data", lambda: Q.quantize(x, fmt="e5m2", out=out)),
        (XteValueError, "recipe", lambda: Q.quantize(x, recipe="nope", out=out)),
        (XteValueError, "block", lambda: Q.quantize(x, block="2x64", out=out)),
        (XteValueError, "layout", lambda: Q.quantize(x, layout="weird", out=out)),
        (XteValueError, "out", lambda: Q.quantize(x, recipe="deepgemm", out=out)),
        (XteValueError, "out", lambda: Q.quantize(x, block="128x128", out=out)),
        (XteValueError, "force_pow_2", lambda: Q.quantize(x, force_pow_2=2, out=out)),
        (XteValueError, "scale", lambda: Q.quantize(x, scale=1.0, out=out)),
        (XteShapeError, "amax", lambda: Q.quantize(x, amax=np.zeros(2, np.float32), out=out)),
        (XteDTypeError, "amax", lambda: Q.quantize(x, amax=np.zeros(1, np.float64), out=out)),
        (XteValueError, "rowwise", lambda: Q.quantize(x, rowwise=False, out=out)),
        (XteShapeError, None, lambda: Q.quantize(x[:, :100], out=out)),   # C: shape mismatch
    ]
    for cls, name, fn in cases:
        with pytest.raises(cls) as ei:
            fn()
        if name is not None:
            assert str(ei.value).startswith(name) or f"{name}:" in str(ei.value), \
                (name, str(ei.value))
        assert ei.value.message, "empty message"
        _assert_untouched(out, snap)


def test_quantize_out_errors_from_c_leave_out_untouched():
    x = make_input(6, 200, "bfloat16")
    out = _filled_out(x)
    snap = _snapshot(out)
    small = QuantizedTensor(out.data, out.scale_inv[:, :1].copy(), scaling_mode="1x128",
                            recipe="te_block")
    s_snap = small.scale_inv.copy()
    with pytest.raises((XteBufferTooSmallError, XteShapeError)) as ei:
        Q.quantize(x, out=small)
    assert "scale" in str(ei.value)
    T.assert_bitwise_equal(small.scale_inv, s_snap)
    ro = out.data.copy()
    ro.flags.writeable = False
    bad = QuantizedTensor(ro, out.scale_inv, scaling_mode="1x128", recipe="te_block")
    with pytest.raises(XteLayoutError, match="out.data"):
        Q.quantize(x, out=bad)
    with pytest.raises(XteValueError, match="scale"):
        Q.quantize(x, "te_delayed")
    _assert_untouched(out, snap)


def test_delayed_scale_forms():
    """TE_DELAYED's scale as a float, a 1-element fp32 array, or out.scale (with out=)."""
    x = make_input(5, 140, "float16", seed=12)
    rd, rs = T.reference_quantize(x, "te_delayed", scale=0.75)
    for sc in (0.75, np.array([0.75], np.float32)):
        q = Q.quantize(x, "te_delayed", scale=sc)
        T.assert_bitwise_equal(q.data, rd)
        T.assert_bitwise_equal(q.scale_inv, rs)
    out = Q.quantize(x, "te_delayed", scale=np.array([0.75], np.float32), columnwise=True)
    out.data[...] = 0
    got = Q.quantize(x, "te_delayed", columnwise=True, out=out)
    T.assert_bitwise_equal(got.data, rd)
    with pytest.raises(XteDTypeError, match="scale"):
        Q.quantize(x, "te_delayed", scale=np.array([0.75], np.float64))
    with pytest.raises(XteShapeError, match="scale"):
        Q.quantize(x, "te_delayed", scale=np.array([0.75, 1.0], np.float32))


def test_delayed_scale_must_be_on_host():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA tensor")
    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(XteValueError, match="scale"):
        Q.quantize(x, "te_delayed", scale=torch.ones(1, device="cuda"))


# ----------------------------------------------------------------------------- zero copy

@pytest.mark.parametrize("recipe,block,layout", [("te_block", "1x128", "te_gemm"),
                                                 ("mx_te", "1x32", "mx_swizzled"),
                                                 ("te_current", "per_tensor", "compact"),
                                                 ("mtfp8", "128x128", "deepgemm")])
def test_out_zero_copy(recipe, block, layout):
    x = make_input(130, 257, "bfloat16", seed=8)
    ref = _quant(x, recipe, block, layout, columnwise=True)
    out = _filled_out(x, recipe, block, layout)
    arrays = (out.data, out.scale_inv, out.columnwise_data, out.columnwise_scale_inv)
    ptrs = [a.ctypes.data for a in arrays]
    got = _quant(x, recipe, block, None, columnwise=True, out=out)
    assert got is out
    for a, b, p in zip((got.data, got.scale_inv, got.columnwise_data, got.columnwise_scale_inv),
                       arrays, ptrs):
        assert a is b and a.ctypes.data == p
    for name in ("data", "scale_inv", "columnwise_data", "columnwise_scale_inv"):
        T.assert_bitwise_equal(getattr(got, name), getattr(ref, name), name)


def test_out_zero_copy_torch():
    torch = pytest.importorskip("torch")
    x = torch.randn(130, 257, dtype=torch.bfloat16)
    out = Q.quantize(x, columnwise=True)
    ptrs = [out.data.data_ptr(), out.scale_inv.data_ptr(), out.columnwise_data.data_ptr(),
            out.columnwise_scale_inv.data_ptr()]
    out.data.zero_()
    got = Q.quantize(x, columnwise=True, out=out)
    assert [got.data.data_ptr(), got.scale_inv.data_ptr(), got.columnwise_data.data_ptr(),
            got.columnwise_scale_inv.data_ptr()] == ptrs
    rd, rs = T.reference_quantize(x, "te_block")
    T.assert_bitwise_equal(got.data, rd)
    # a strided (non-contiguous) torch view is an error naming the argument, not a copy
    with pytest.raises(XteLayoutError, match="x"):
        Q.quantize(x.t())
