# ctest: no-isa-variants (argument checks of the Python layer: no kernel result depends on the ISA)
"""Hostile arguments to the Python layer: every pointer the package hands to C comes from an
array of the size, dtype, layout and writability C assumes, or the call raises naming the
argument and writes nothing. (Each case failed before its fix: C wrote into immutable bytes,
read past a 1-element alibi array, read padded scale rows as dense, ran a typo'd GEMM mode.)"""

import numpy as np
import pytest

import xte


def _x(m=4, k=256, seed=0):
    return np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)


@pytest.mark.parametrize("fn", ["swiglu_quantize", "quantize_out"])
def test_amax_must_be_one_writable_float(fn):
    x = _x(4, 256)
    for amax, exc in ((np.frombuffer(bytes(4), np.float32), xte.XteLayoutError),
                      (np.zeros(0, np.float32), xte.XteShapeError),
                      (np.zeros(2, np.float32), xte.XteShapeError),
                      (np.zeros(1, np.float64), xte.XteDTypeError)):
        if fn == "swiglu_quantize":
            with pytest.raises(exc, match="amax"):
                xte.swiglu_quantize(x, amax=amax)
        else:
            q = xte.quantize(x, recipe="te_current")
            before = q.data.tobytes()
            q.amax = amax
            with pytest.raises(exc, match="amax"):
                xte.quantize(x, recipe="te_current", out=q)
            assert q.data.tobytes() == before


def test_swiglu_quantize_out_unchanged_on_error():
    x = _x(4, 256)
    out = xte.swiglu_quantize(x)
    bad = np.zeros(0, np.float32)
    with pytest.raises(xte.XteShapeError):
        xte.swiglu_quantize(x, amax=bad, out=out)
    assert out.amax is None  # the caller's QuantizedTensor is not modified by a failed call


def test_padded_scale_views_raise():
    q = xte.quantize(_x(4, 256), recipe="deepgemm")
    big = np.full((4, 5), 1000, np.float32)
    big[:, :2] = q.scale_inv
    padded = xte.QuantizedTensor(q.data, big[:, :2], scaling_mode="1x128", recipe="deepgemm")
    with pytest.raises(xte.XteLayoutError, match="scale_inv"):
        xte.dequantize(padded)
    w = xte.quantize(_x(128, 256, 1), recipe="deepgemm", block="128x128")
    d = np.zeros((4, 128), np.float32)
    with pytest.raises(xte.XteLayoutError, match="scale"):
        xte.fp8_gemm_nt((q.data, big[:, :2]), (w.data, w.scale_inv), d)
    assert not d.any()


def test_numpy_scalar_types_as_dtypes():
    x = _x(2, 128)
    assert xte.cast(x, np.float16).dtype == np.float16
    q = xte.quantize(x)
    assert xte.dequantize(q, dtype=np.float32).dtype == np.float32


def test_torch_attention_config_arrays_checked():
    torch = pytest.importorskip("torch")
    import xte.torch as xt
    q, k, v = (torch.randn(1, 8, 4, 16, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    with pytest.raises(xte.XteShapeError, match="alibi_slopes"):
        xt.attention_fwd(q, k, v, alibi_slopes=torch.zeros(1))
    with pytest.raises(xte.XteShapeError, match="cu_seqlens_q"):
        xt.attention_fwd(q, k, v, cu_seqlens_q=torch.tensor([0], dtype=torch.int32),
                         cu_seqlens_kv=torch.tensor([0, 8], dtype=torch.int32))
    o, lse = xt.attention_fwd(q, k, v, mask="padding_causal")
    o2, lse2 = xte.attention_fwd(q, k, v, mask="causal")
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    # THD without max_seqlen: the tokens of the tensor bound every sequence
    t = torch.randn(8, 4, 16)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    o, _ = xt.attention_fwd(t, t, t, layout="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    ref, _ = xte.attention_fwd(t, t, t, layout="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert torch.equal(o, ref)


def test_torch_gemm_mode_and_quantize_scale_checked():
    torch = pytest.importorskip("torch")
    import xte.torch as xt
    qa = xt.quantize(torch.randn(4, 256))
    qb = xt.quantize(torch.randn(128, 256), block="128x128")
    with pytest.raises(xte.XteValueError, match="mode"):
        xt.gemm(qa, qb, mode="fats")
    sc = torch.zeros(1)
    with pytest.raises(xte.XteValueError, match="scale"):
        xt.quantize(torch.randn(4, 128), recipe="te_current", scale=sc)
    assert not sc.any()  # never written behind the op's declared (functional) signature
    with pytest.raises(xte.XteValueError, match="scale"):
        xt.quantize(torch.randn(4, 128), recipe="te_delayed", scale=torch.ones(2))
