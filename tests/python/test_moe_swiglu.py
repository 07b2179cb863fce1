"""xte.ops.moe SwiGLU, its backward and the fused quantize, against NumPy (docs/numerics.md
section 8, "SwiGLU"): y = silu(gate) * up with gate = x[:, :F], up = x[:, F:].

silu is xte's deterministic silu (<= 3.5 ulp against libm, docs/numerics.md table), so fp32 y is
compared with an fp64 oracle within 3.5 ulp + the product's rounding; bf16 y must be the RNE of
the fp32 y bit for bit (ml_dtypes). swiglu_quantize must be byte for byte xte_quantize(swiglu(x))
(the C library's promise) and, for TE_BLOCK rowwise, byte for byte an independent NumPy /
ml_dtypes restatement of the TE_BLOCK recipe (docs/numerics.md section 4) applied to y."""

import ctypes

import ml_dtypes
import numpy as np
import pytest

import xte
from xte import _lib
from xte._qtensor import qview
from xte._tensor import stream_of, view
from xte.ops import moe

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn


def silu64(g):
    g = g.astype(np.float64)
    return g / (1 + np.exp(-g))


def inputs(rng, T, F, dtype=np.float32):
    return (rng.standard_normal((T, 2 * F)) * 3).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
def test_swiglu_vs_numpy(dtype):
    rng = np.random.default_rng(1)
    T, F = 9, 40
    x = inputs(rng, T, F, dtype)
    y = moe.swiglu(x, out_dtype="float32")
    assert isinstance(y, np.ndarray) and y.shape == (T, F) and y.dtype == np.float32
    g, up = x[:, :F], x[:, F:].astype(np.float64)
    s = silu64(g)
    want = s * up
    tol = (3.5 * 2.0 ** -23 * np.abs(s) + 2.0 ** -126) * np.abs(up) + 2.0 ** -24 * np.abs(want)
    assert np.all(np.abs(y - want) <= tol)
    # bf16 output: RNE of the fp32 result, bit for bit
    yb = moe.swiglu(x, out_dtype="bfloat16")
    assert yb.dtype == BF16
    assert yb.tobytes() == y.astype(BF16).tobytes()
    if dtype == BF16:
        assert moe.swiglu(x).dtype == BF16  # default: the input's dtype


def test_swiglu_nan_inf_and_out():
    x = np.array([[np.nan, 0.0, 1.0, 2.0, 3.0, np.nan]], np.float32)  # gate | up, F = 3
    out = np.full((1, 3), 5.0, np.float32)
    y = moe.swiglu(x, out=out)
    assert y is out
    assert np.isnan(y[0, 0]) and np.isnan(y[0, 2])  # NaN gate, NaN up
    assert y[0, 1] == 0.0  # silu(0) * 3 = 0
    big = np.array([[np.inf, 1.0, 2.0, 4.0]], np.float32)  # silu(+inf) = +inf
    yb = moe.swiglu(big)
    assert yb[0, 0] == np.inf and yb[0, 1] == np.float32(silu64(np.float32(1.0)) * 4)
    with pytest.raises(xte.XteShapeError):
        moe.swiglu(np.zeros((2, 5), np.float32))  # odd columns
    with pytest.raises(xte.XteDTypeError, match="inp"):
        moe.swiglu(np.zeros((2, 4), np.float64))
    with pytest.raises(xte.XteLayoutError, match="inp"):
        moe.swiglu(np.zeros((2, 8), np.float32)[:, ::2])
    o = np.full((2, 3), 1.0, np.float32)
    with pytest.raises(xte.XteShapeError):
        moe.swiglu(np.zeros((2, 4), np.float32), out=o)
    assert np.all(o == 1.0)


def test_dswiglu_vs_numpy():
    rng = np.random.default_rng(2)
    T, F = 7, 24
    x = inputs(rng, T, F)
    dy = rng.standard_normal((T, F)).astype(np.float32)
    gi = moe.dswiglu(dy, x)
    assert gi.shape == (T, 2 * F) and gi.dtype == np.float32
    g, up, d = x[:, :F].astype(np.float64), x[:, F:].astype(np.float64), dy.astype(np.float64)
    sig = 1 / (1 + np.exp(-g))
    dsilu = sig * (1 + g * (1 - sig))
    want_g = d * up * dsilu
    want_u = d * g * sig
    scale = np.abs(d * up) * (1 + np.abs(g))
    assert np.all(np.abs(gi[:, :F] - want_g) <= 2.0 ** -20 * scale + 1e-30)
    assert np.all(np.abs(gi[:, F:] - want_u) <= 2.0 ** -21 * np.abs(want_u) + 2.0 ** -126)


def _xte_quantize(y, like_q, cfg_kw):
    """xte_quantize(y) into a QuantizedTensor allocated like like_q (the C call, via ctypes)."""
    q = xte.QuantizedTensor(
        None if like_q.data is None else np.empty_like(like_q.data),
        None if like_q.scale_inv is None else np.empty_like(like_q.scale_inv),
        scaling_mode=like_q.scaling_mode, recipe=like_q.recipe, layout=like_q.layout,
        columnwise_data=(None if like_q.columnwise_data is None
                         else np.empty_like(like_q.columnwise_data)),
        columnwise_scale_inv=(None if like_q.columnwise_scale_inv is None
                              else np.empty_like(like_q.columnwise_scale_inv)))
    vy = view(y, "y")
    qs, qv = qview(q, "q", writable=True)
    cfg = _lib.lib.xte_quant_config_default()
    for k, v in cfg_kw.items():
        setattr(cfg, k, v)
    _lib.call("xte_quantize", vy.ptr, ctypes.byref(qs), ctypes.byref(cfg), stream_of(vy, *qv))
    return q


def _same(a, b):
    for f in ("data", "scale_inv", "columnwise_data", "columnwise_scale_inv"):
        u, v = getattr(a, f), getattr(b, f)
        assert (u is None) == (v is None), f
        if u is not None:
            assert u.shape == v.shape and u.tobytes() == v.tobytes(), f


@pytest.mark.parametrize("recipe,layout", [("te_block", "compact"), ("deepgemm", "deepgemm"),
                                           ("deepgemm_ue8m0", "te_gemm"), ("mtfp8", "compact")])
@pytest.mark.parametrize("act", ["float32", "bfloat16"])
def test_swiglu_quantize_equals_quantize_of_swiglu(recipe, layout, act):
    rng = np.random.default_rng(3)
    T, F = 5, 200  # a short last block
    x = inputs(rng, T, F)
    q = moe.swiglu_quantize(x, recipe, layout, "e4m3", True, True, act_dtype=act)
    assert isinstance(q, xte.QuantizedTensor)
    y = moe.swiglu(x, out_dtype=act)
    _same(q, _xte_quantize(y, q, {}))
    dy = rng.standard_normal((T, F)).astype(np.float32)
    dq = moe.dswiglu_quantize(dy, x, recipe, layout, "e5m2", True, False, act_dtype=act)
    _same(dq, _xte_quantize(moe.dswiglu(dy, x, out_dtype=act), dq, {}))


def test_swiglu_quantize_te_block_oracle():
    rng = np.random.default_rng(4)
    T, F = 6, 256
    x = inputs(rng, T, F)
    amax = np.full(1, -1.0, np.float32)
    q = moe.swiglu_quantize(x, "te_block", "compact", amax=amax)
    y = moe.swiglu(x)
    assert amax[0] == np.max(np.abs(y))
    blocks = y.reshape(T, F // 128, 128)
    bamax = np.abs(blocks).max(-1).astype(np.float32)
    scale = (np.float32(448) / bamax).astype(np.float32)
    scale = (scale.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)  # pow2 down
    want = (blocks * scale[..., None]).astype(E4M3).reshape(T, F)
    assert q.data.tobytes() == want.tobytes()
    assert q.scale_inv.tobytes() == (np.float32(1) / scale).astype(np.float32).tobytes()


def test_swiglu_quantize_bad_args():
    x = np.zeros((2, 256), np.float32)
    with pytest.raises(xte.XteUnsupportedError):
        moe.swiglu_quantize(x, "mx_te")
    with pytest.raises(xte.XteDTypeError, match="act_dtype"):
        moe.swiglu_quantize(x, act_dtype="float16")
    with pytest.raises(xte.XteDTypeError, match="fmt"):
        moe.swiglu_quantize(x, fmt="int8")


def test_swiglu_torch_same_bytes():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = inputs(rng, 4, 128)
    yn = moe.swiglu(x)
    yt = moe.swiglu(torch.from_numpy(x))
    assert isinstance(yt, torch.Tensor) and yt.numpy().tobytes() == yn.tobytes()
    qn = moe.swiglu_quantize(x, "deepgemm", "compact")
    qt = moe.swiglu_quantize(torch.from_numpy(x), "deepgemm", "compact")
    assert isinstance(qt.data, torch.Tensor)
    assert qt.data.view(torch.uint8).numpy().tobytes() == qn.data.tobytes()
    assert qt.scale_inv.numpy().tobytes() == qn.scale_inv.tobytes()
