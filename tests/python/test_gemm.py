"""xte.gemm and DeepGEMM's fp8_gemm_{nt,nn,tn,tt} (python/xte/ops/gemm.py) against the exact
oracle of test_gemm_oracle.py (NumPy / fractions / ml_dtypes, written from docs/numerics.md),
byte for byte; framework in / out, zero-copy out=, errors that name the argument and leave the
output untouched. torch is needed only by the tests marked so (importorskip; CI installs it)."""

import ml_dtypes
import numpy as np
import pytest

import xte
from xte.ops.gemm import fp8_gemm_nn, fp8_gemm_nt, fp8_gemm_tn, fp8_gemm_tt, gemm

from test_gemm_oracle import (E4M3, E5M2, KB, BF16, decode, gemm_oracle, make_pair, make_q,
                              rand_codes, rand_grid, row_scales)

PAIRS = [("1x128", "128x128"), ("128x128", "1x128"), ("1x128", "1x128"),
         ("per_tensor", "per_tensor"), ("1x32", "1x32")]
FMTS = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)]


def _case(rng, ma, mb, M, N, K, fa, fb, specials=False):
    qa, qb = rand_codes(rng, (M, K), fa, specials), rand_codes(rng, (N, K), fb, specials)
    ga, gb = rand_grid(rng, ma, M, K), rand_grid(rng, mb, N, K)
    return qa, ga, qb, gb


def _oracle(qa, fa, ma, ga, qb, fb, mb, gb, **kw):
    M, K = qa.shape
    N = qb.shape[0]
    return gemm_oracle(qa, fa, row_scales(ma, ga, M, K), qb, fb, row_scales(mb, gb, N, K),
                       KB[ma], **kw)


def _dims(ma, mb):
    # rows past one 128-tile on the 128x128 side; K with a short last block
    M = 130 if ma == "128x128" else 7
    N = 131 if mb == "128x128" else 5
    K = 72 if ma == "1x32" else 300
    return M, N, K


def bytes_of(x):
    if hasattr(x, "detach"):
        import torch
        return x.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return np.ascontiguousarray(x).tobytes()


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [True, False])
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_gemm_exact_matches_oracle(pair, ta, tb):
    """xte.gemm(a, b, trans_a, trans_b) with QuantizedTensors = the exact contract, byte for
    byte, for every supported scaling pair and transpose (the copy read: columnwise for a
    transposed 1x128 / MXFP8 operand; decoy scales on the copy that must not be read)."""
    ma, mb = pair
    i = PAIRS.index(pair) * 4 + ta * 2 + tb
    fa, fb = FMTS[i % 3]
    out = "float32" if i % 2 else "bfloat16"
    rng = np.random.default_rng(100 + i)
    M, N, K = _dims(ma, mb)
    qa, ga, qb, gb = _case(rng, ma, mb, M, N, K, fa, fb)
    A = make_q(qa, fa, ma, ga, transposed=ta, rng=rng)
    # xte.gemm: op(b) = b^T when trans_b (b holds op(B) [N, K]); else b is [K, N]
    B = make_q(qb, fb, mb, gb, transposed=not tb, rng=rng)
    d = gemm(A, B, trans_a=ta, trans_b=tb, out_dtype=out)
    assert isinstance(d, np.ndarray) and d.shape == (M, N)
    want = _oracle(qa, fa, ma, ga, qb, fb, mb, gb, out=out)
    assert d.dtype == want.dtype
    assert bytes_of(d) == bytes_of(want)


DG = {"nt": (fp8_gemm_nt, False, False), "nn": (fp8_gemm_nn, False, True),
      "tn": (fp8_gemm_tn, True, True), "tt": (fp8_gemm_tt, True, False)}


@pytest.mark.parametrize("name", list(DG))
@pytest.mark.parametrize("recipe", [(1, 128, 128), (1, 1, 128), (1, 1, 32)],
                         ids=["1d2d", "1d1d", "mx"])
def test_deepgemm_names_on_pairs(name, recipe):
    """fp8_gemm_{nt,nn,tn,tt}(a, b, d) with DeepGEMM (data, scales) pairs in DeepGEMM's storage
    for each name (a [M, K] or [K, M], b [N, K] or [K, N]); scaling inferred from the scale
    shapes; = the oracle, byte for byte, and d is written in place."""
    fn, a_t, b_t = DG[name]
    ma = "1x32" if recipe[2] == 32 else "1x128"
    mb = "1x32" if recipe[2] == 32 else ("128x128" if recipe[1] == 128 else "1x128")
    rng = np.random.default_rng(hash((name, recipe)) % 2**32)
    M, N, K = (6, 130, 300) if mb == "128x128" else (6, 9, 300 if ma == "1x128" else 72)
    qa, ga, qb, gb = _case(rng, ma, mb, M, N, K, E4M3, E4M3)
    a = make_pair(qa, E4M3, ma, ga, a_t)
    b = make_pair(qb, E4M3, mb, gb, b_t)
    d = np.full((M, N), np.nan, np.float32)
    p0 = d.ctypes.data
    r = fn(a, b, d)
    assert r is d and d.ctypes.data == p0
    want = _oracle(qa, E4M3, ma, ga, qb, E4M3, mb, gb, out="float32")
    assert bytes_of(d) == bytes_of(want)
    # the same call with the recipe given explicitly
    d2 = np.zeros((M, N), BF16)
    fn(a, b, d2, recipe=recipe)
    assert bytes_of(d2) == bytes_of(_oracle(qa, E4M3, ma, ga, qb, E4M3, mb, gb, out="bfloat16"))


def test_pair_equals_quantized_tensor():
    """A DeepGEMM pair and a QuantizedTensor of the same codes and scales give the same bytes."""
    rng = np.random.default_rng(5)
    M, N, K = 9, 140, 260
    qa, ga, qb, gb = _case(rng, "1x128", "128x128", M, N, K, E4M3, E5M2)
    d1 = fp8_gemm_nt(make_pair(qa, E4M3, "1x128", ga, False),
                     make_pair(qb, E5M2, "128x128", gb, False), np.empty((M, N), BF16))
    d2 = gemm(make_q(qa, E4M3, "1x128", ga, False), make_q(qb, E5M2, "128x128", gb, False))
    assert bytes_of(d1) == bytes_of(d2)


@pytest.mark.parametrize("pair", [("1x128", "128x128"), ("1x32", "1x32"),
                                  ("per_tensor", "per_tensor")], ids=lambda p: p[0])
def test_specials_nan_inf_subnormal(pair):
    """NaN codes, e5m2 infinities (inf * 0 -> NaN, +inf + -inf -> NaN), subnormal codes, tiny
    scales (subnormal scale products) and huge ones (overflow to inf): = the oracle, with the
    canonical NaN (fp32 0x7FC00000, bf16 0x7FC0)."""
    ma, mb = pair
    rng = np.random.default_rng(11)
    M, N, K = (5, 130, 200) if mb == "128x128" else (6, 7, 200)
    qa, ga, qb, gb = _case(rng, ma, mb, M, N, K, E4M3, E5M2, specials=True)
    if ma != "1x32":
        ga = ga.copy()
        gb = gb.copy()
        ga.reshape(-1)[0] = np.float32(2.0 ** -70)   # s below 2^-126: subnormal / zero
        gb.reshape(-1)[0] = np.float32(2.0 ** -80)
        if gb.size > 1:
            gb.reshape(-1)[-1] = np.float32(2.0 ** 100)  # with large partials: inf
    else:
        ga = ga.copy()
        ga[0, 0] = 1    # 2^-126
        gb = gb.copy()
        gb[0, 0] = 2    # 2^-125: product 2^-251 -> 0 in fp32
        gb[-1, -1] = 250
    # all-zero row and a row of subnormal codes
    qa[1] = 0
    qa[2] = rng.integers(1, 8, size=K).astype(np.uint8)
    for out in ("float32", "bfloat16"):
        d = gemm(make_q(qa, E4M3, ma, ga, False), make_q(qb, E5M2, mb, gb, False),
                 out_dtype=out)
        want = _oracle(qa, E4M3, ma, ga, qb, E5M2, mb, gb, out=out)
        assert bytes_of(d) == bytes_of(want)
        assert np.isnan(want.astype(np.float32)).any()


def test_accumulate_and_bias():
    """c (fp32 and bf16), in-place accumulation (c = out), and bias: = the oracle's
    t = RNE(acc + C), then RNE(t + bias[n]); c given implies accumulate."""
    rng = np.random.default_rng(21)
    M, N, K = 6, 130, 300
    qa, ga, qb, gb = _case(rng, "1x128", "128x128", M, N, K, E4M3, E4M3)
    A = make_q(qa, E4M3, "1x128", ga, False)
    B = make_q(qb, E4M3, "128x128", gb, False)
    bias = (rng.standard_normal(N) * 1e3).astype(np.float32)
    c32 = (rng.standard_normal((M, N)) * 1e4).astype(np.float32)
    c16 = c32.astype(BF16)
    # fp32 c, bf16 out, bias
    d = gemm(A, B, c=c32, bias=bias)
    assert bytes_of(d) == bytes_of(_oracle(qa, E4M3, "1x128", ga, qb, E4M3, "128x128", gb,
                                           c=c32, bias=bias, out="bfloat16"))
    # bf16 c into an fp32 out
    d = gemm(A, B, c=c16, out=np.empty((M, N), np.float32))
    assert bytes_of(d) == bytes_of(_oracle(qa, E4M3, "1x128", ga, qb, E4M3, "128x128", gb,
                                           c=c16, out="float32"))
    # in place: out is C
    d = c32.copy()
    r = gemm(A, B, out=d, accumulate=True, bias=bias)
    assert r is d
    assert bytes_of(d) == bytes_of(_oracle(qa, E4M3, "1x128", ga, qb, E4M3, "128x128", gb,
                                           c=c32, bias=bias, out="float32"))
    # fp8_gemm_nt(a, b, d, c): DeepGEMM's accumulate
    d = np.empty((M, N), np.float32)
    fp8_gemm_nt(make_pair(qa, E4M3, "1x128", ga, False),
                make_pair(qb, E4M3, "128x128", gb, False), d, c32)
    assert bytes_of(d) == bytes_of(_oracle(qa, E4M3, "1x128", ga, qb, E4M3, "128x128", gb,
                                           c=c32, out="float32"))
    # without c, accumulate=False ignores what out holds
    d = np.full((M, N), 7.0, np.float32)
    gemm(A, B, out=d)
    assert bytes_of(d) == bytes_of(_oracle(qa, E4M3, "1x128", ga, qb, E4M3, "128x128", gb,
                                           out="float32"))


def test_empty_k_and_m():
    """K = 0 gives D = C + bias (acc = 0); M = 0 gives an empty out."""
    rng = np.random.default_rng(3)
    N = 4
    qa = np.zeros((3, 0), np.uint8)
    qb = np.zeros((N, 0), np.uint8)
    A = make_q(qa, E4M3, "1x128", np.zeros((3, 0), np.float32), False)
    B = make_q(qb, E4M3, "1x128", np.zeros((N, 0), np.float32), False)
    c = rng.standard_normal((3, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    d = gemm(A, B, c=c, bias=bias, out_dtype="float32")
    assert bytes_of(d) == bytes_of((c + bias).astype(np.float32))
    qa0 = rand_codes(rng, (0, 200), E4M3)
    qb0 = rand_codes(rng, (N, 200), E4M3)
    A0 = make_q(qa0, E4M3, "1x128", rand_grid(rng, "1x128", 0, 200), False)
    B0 = make_q(qb0, E4M3, "1x128", rand_grid(rng, "1x128", N, 200), False)
    assert gemm(A0, B0).shape == (0, N)


@pytest.mark.parametrize("fa,fb", FMTS)
def test_fast_mode_within_the_bound_on_cpu(fa, fb):
    """mode='fast' on the CPU (docs/numerics.md, XTE_GEMM_FAST): every element within
    (KB 2^-13 + (nb + 2) 2^-23) S of the fp64 product (S = sum |a b sa sb|, the scales' fp64
    products; the scales here are normal), NaN where the exact contract gives NaN."""
    rng = np.random.default_rng(8)
    M, N, K = 37, 45, 300
    qa, ga, qb, gb = _case(rng, "1x128", "1x128", M, N, K, fa, fb)
    A, B = make_q(qa, fa, "1x128", ga, False), make_q(qb, fb, "1x128", gb, False)
    d = np.asarray(gemm(A, B, mode="fast", out_dtype="float32"), np.float64)
    va, vb = decode(qa, fa), decode(qb, fb)
    sa, sb = row_scales("1x128", ga, M, K), row_scales("1x128", gb, N, K)
    nb = sa.shape[1]
    v = np.zeros((M, N))
    s = np.zeros((M, N))
    for b in range(nb):
        ks = slice(b * 128, min(K, (b + 1) * 128))
        sc = sa[:, b][:, None] * sb[:, b][None, :]
        v += (va[:, ks] @ vb[:, ks].T) * sc
        s += (np.abs(va[:, ks]) @ np.abs(vb[:, ks]).T) * np.abs(sc)
    tol = (128 * 2.0**-13 + (nb + 2) * 2.0**-23) * s + 2.0**-23 * np.abs(v)
    assert np.all(np.abs(d - v) <= tol)


def test_fast_mode_few_rows_on_cpu():
    """mode='fast' on the CPU with few rows of A (the streaming small-M path): within the FAST
    bound of gemm.h (xte.check's judge), the same bytes run to run."""
    from xte.check import check_gemm
    rng = np.random.default_rng(8)
    qa, ga, qb, gb = _case(rng, "1x128", "1x128", 5, 6, 300, E4M3, E4M3)
    A, B = make_q(qa, E4M3, "1x128", ga, False), make_q(qb, E4M3, "1x128", gb, False)
    d = gemm(A, B, mode="fast")
    assert bytes_of(gemm(A, B, mode="fast")) == bytes_of(d)
    assert check_gemm(A, B, d, mode="fast").ok
    with pytest.raises(xte.XteValueError, match="mode"):
        gemm(A, B, mode="fastest")


def test_fast_mode_exact_partials_give_exact_bytes_on_cpu():
    """Where every block sum is exact in fp32 (e4m3 codes below 0.5), FAST gives EXACT's bytes:
    the scale step and everything after the partial are the contract's."""
    rng = np.random.default_rng(9)
    M, N, K = 5, 6, 300
    qa = (rng.integers(0, 0x30, size=(M, K)) | (rng.integers(0, 2, size=(M, K)) << 7))
    qb = (rng.integers(0, 0x30, size=(N, K)) | (rng.integers(0, 2, size=(N, K)) << 7))
    qa, qb = qa.astype(np.uint8), qb.astype(np.uint8)
    ga, gb = rand_grid(rng, "1x128", M, K), rand_grid(rng, "1x128", N, K)
    A, B = make_q(qa, E4M3, "1x128", ga, False), make_q(qb, E4M3, "1x128", gb, False)
    assert bytes_of(gemm(A, B, mode="fast")) == bytes_of(gemm(A, B, mode="exact"))


def test_out_zero_copy_and_framework_numpy():
    rng = np.random.default_rng(9)
    qa, ga, qb, gb = _case(rng, "1x128", "1x128", 5, 6, 300, E4M3, E4M3)
    A, B = make_q(qa, E4M3, "1x128", ga, False), make_q(qb, E4M3, "1x128", gb, False)
    out = np.empty((5, 6), np.float32)
    p = out.ctypes.data
    r = gemm(A, B, out=out)
    assert r is out and out.ctypes.data == p
    # a strided out (row stride > N) is written in place too
    big = np.zeros((5, 10), BF16)
    view = big[:, :6]
    gemm(A, B, out=view)
    assert bytes_of(view) == bytes_of(gemm(A, B))
    assert not big[:, 6:].astype(np.float32).any()


def _torch_q(q, torch):
    def t(x):
        if x is None:
            return None
        if x.dtype == E4M3:
            return torch.from_numpy(x.view(np.uint8).copy()).view(torch.float8_e4m3fn)
        if x.dtype == E5M2:
            return torch.from_numpy(x.view(np.uint8).copy()).view(torch.float8_e5m2)
        if x.dtype == np.dtype(ml_dtypes.float8_e8m0fnu):
            return torch.from_numpy(x.view(np.uint8).copy()).view(torch.float8_e8m0fnu)
        return torch.from_numpy(x.copy())
    return xte.QuantizedTensor(t(q.data), t(q.scale_inv), scaling_mode=q.scaling_mode,
                               recipe=q.recipe, layout=q.layout,
                               columnwise_data=t(q.columnwise_data),
                               columnwise_scale_inv=t(q.columnwise_scale_inv))


@pytest.mark.parametrize("pair", [("1x128", "128x128"), ("1x32", "1x32")], ids=lambda p: p[0])
def test_torch_in_torch_out_same_bytes(pair):
    """torch tensors in -> a torch tensor out with the bytes NumPy inputs give; out= keeps its
    data pointer; c and bias as torch tensors. (needs torch; CI installs it)"""
    torch = pytest.importorskip("torch")
    ma, mb = pair
    rng = np.random.default_rng(31)
    M, N, K = (6, 130, 300) if mb == "128x128" else (6, 9, 72)
    qa, ga, qb, gb = _case(rng, ma, mb, M, N, K, E4M3, E4M3)
    A, B = make_q(qa, E4M3, ma, ga, True, rng), make_q(qb, E4M3, mb, gb, False, rng)
    c = rng.standard_normal((M, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    dn = gemm(A, B, trans_a=True, c=c, bias=bias)
    dt = gemm(_torch_q(A, torch), _torch_q(B, torch), trans_a=True, c=torch.from_numpy(c),
              bias=torch.from_numpy(bias))
    assert isinstance(dt, torch.Tensor) and dt.dtype == torch.bfloat16 and dt.shape == (M, N)
    assert bytes_of(dt) == bytes_of(dn)
    out = torch.empty((M, N), dtype=torch.float32)
    p = out.data_ptr()
    r = gemm(_torch_q(A, torch), _torch_q(B, torch), trans_a=True, out=out)
    assert r is out and out.data_ptr() == p
    assert bytes_of(out) == bytes_of(gemm(A, B, trans_a=True, out_dtype="float32"))
    # DeepGEMM names with torch pairs
    a = tuple(_torch_q(xte.QuantizedTensor(*make_pair(qa, E4M3, ma, ga, False),
                                           scaling_mode=ma, recipe="deepgemm"
                                           if ma != "1x32" else "mx_te"), torch))
    b = tuple(_torch_q(xte.QuantizedTensor(*make_pair(qb, E4M3, mb, gb, False),
                                           scaling_mode=mb, recipe="deepgemm"
                                           if mb != "1x32" else "mx_te"), torch))
    d = torch.empty((M, N), dtype=torch.bfloat16)
    fp8_gemm_nt(a, b, d)
    assert bytes_of(d) == bytes_of(gemm(make_q(qa, E4M3, ma, ga, False), B))


# ------------------------------------------------------------------------------- errors


def _ok_operands(rng, M=5, N=6, K=300):
    qa, ga, qb, gb = _case(rng, "1x128", "128x128", M, N, K, E4M3, E4M3)
    return (make_pair(qa, E4M3, "1x128", ga, False), make_pair(qb, E4M3, "128x128", gb, False),
            make_q(qa, E4M3, "1x128", ga, False), make_q(qb, E4M3, "128x128", gb, False))


def _untouched(d):
    return bytes_of(d)


def test_error_k_mismatch_names_b_and_leaves_d():
    rng = np.random.default_rng(41)
    a, b, A, B = _ok_operands(rng)
    qb = rand_codes(rng, (6, 200), E4M3)
    b2 = make_pair(qb, E4M3, "128x128", rand_grid(rng, "128x128", 6, 200), False)
    d = np.full((5, 6), 3.0, np.float32)
    before = _untouched(d)
    with pytest.raises(xte.XteShapeError, match=r"(^|: )b: K = 200 does not match a's K = 300"):
        fp8_gemm_nt(a, b2, d)
    assert _untouched(d) == before
    with pytest.raises(xte.XteShapeError, match="b: K"):
        gemm(A, make_q(qb, E4M3, "128x128", rand_grid(rng, "128x128", 6, 200), False), out=d)
    assert _untouched(d) == before


def test_error_out_shape_and_dtype_name_the_argument():
    rng = np.random.default_rng(42)
    a, b, A, B = _ok_operands(rng)
    d = np.full((5, 7), 3.0, np.float32)
    before = _untouched(d)
    with pytest.raises(xte.XteShapeError, match=r"(^|: )d: .*D is \[5, 7\]"):
        fp8_gemm_nt(a, b, d)
    assert _untouched(d) == before
    d = np.zeros((5, 6), np.float16)
    with pytest.raises(xte.XteDTypeError, match=r"(^|: )out: .*want fp32 or bf16"):
        gemm(A, B, out=d)
    assert not d.any()
    with pytest.raises(xte.XteDTypeError, match="d: .*int64"):
        fp8_gemm_nt(a, b, np.zeros((5, 6), np.int64))
    with pytest.raises(xte.XteDTypeError, match="out_dtype"):
        gemm(A, B, out_dtype="float16")


def test_error_operand_dtype_and_kind():
    rng = np.random.default_rng(43)
    a, b, A, B = _ok_operands(rng)
    d = np.full((5, 6), 3.0, np.float32)
    before = _untouched(d)
    with pytest.raises(xte.XteDTypeError, match=r"a\[0\]: dtype float32"):
        fp8_gemm_nt((a[0].astype(np.float32), a[1]), b, d)
    with pytest.raises(xte.XteDTypeError, match=r"b\[1\]: dtype float16"):
        fp8_gemm_nt(a, (b[0], b[1].astype(np.float16)), d)
    with pytest.raises(xte.XteDTypeError, match="(^|: )a: ndarray is neither"):
        gemm(a[0], B, out=d)
    with pytest.raises(xte.XteDTypeError, match=r"bias: dtype float64"):
        gemm(A, B, out=d, bias=np.zeros(6))
    with pytest.raises(xte.XteShapeError, match=r"(^|: )bias: "):
        gemm(A, B, out=d, bias=np.zeros(5, np.float32))
    with pytest.raises(xte.XteShapeError, match=r"(^|: )c: .*C is \[5, 5\]"):
        gemm(A, B, out=d, c=np.zeros((5, 5), np.float32))
    with pytest.raises(xte.XteShapeError, match=r"(^|: )b\[1\]: scales of shape"):
        fp8_gemm_nt(a, (b[0], np.ones((3, 3), np.float32)), d)
    with pytest.raises(xte.XteValueError, match="accumulate"):
        gemm(A, B, accumulate=True)
    assert _untouched(d) == before


def test_error_unsupported_pairs():
    """128x128 x 128x128 and e5m2 x e5m2 are XteUnsupportedError (as cuBLASLt / cuBLAS), from
    the C library for QuantizedTensors and from the pair resolution for (data, scales)."""
    rng = np.random.default_rng(44)
    M, N, K = 5, 6, 300
    qa, qb = rand_codes(rng, (M, K), E5M2), rand_codes(rng, (N, K), E5M2)
    ga, gb = rand_grid(rng, "128x128", M, K), rand_grid(rng, "128x128", N, K)
    d = np.full((M, N), 3.0, np.float32)
    before = _untouched(d)
    with pytest.raises(xte.XteUnsupportedError, match="a, b: .*128x128 x .*128x128.*not supported"):
        gemm(make_q(qa, E5M2, "128x128", ga, False), make_q(qb, E5M2, "128x128", gb, False),
             out=d)
    with pytest.raises(xte.XteUnsupportedError, match="not supported"):
        fp8_gemm_nt(make_pair(qa, E5M2, "128x128", ga, False),
                    make_pair(qb, E5M2, "128x128", gb, False), d, recipe_a=(128, 128))
    g1a, g1b = rand_grid(rng, "1x128", M, K), rand_grid(rng, "1x128", N, K)
    with pytest.raises(xte.XteUnsupportedError, match="e5m2"):
        gemm(make_q(qa, E5M2, "1x128", g1a, False), make_q(qb, E5M2, "1x128", g1b, False),
             out=d)
    with pytest.raises(xte.XteUnsupportedError, match="alpha"):
        fp8_gemm_nt(make_pair(qa, E4M3, "1x128", g1a, False),
                    make_pair(qb, E4M3, "1x128", g1b, False), d, alpha=2.0)
    # mixed families: MXFP8 x 1x128
    gmx = rand_grid(rng, "1x32", M, K)
    with pytest.raises(xte.XteUnsupportedError, match="not supported"):
        gemm(make_q(qa, E4M3, "1x32", gmx, False), make_q(qb, E4M3, "1x128", g1b, False),
             out=d)
    # a 1x128 operand used transposed without its columnwise copy
    A_row_only = xte.QuantizedTensor(make_pair(qa, E4M3, "1x128", g1a, False)[0], g1a,
                                     scaling_mode="1x128", recipe="te_block")
    with pytest.raises(xte.XteUnsupportedError, match=r"(^|: )a: .*columnwise"):
        qb5 = rand_codes(rng, (N, M), E4M3)  # op(A) = X^T is [K, M]: B's K is M
        gemm(A_row_only, make_q(qb5, E4M3, "1x128", rand_grid(rng, "1x128", N, M), False),
             trans_a=True, out=np.empty((K, N), np.float32))
    assert _untouched(d) == before


def test_error_non_contiguous_views():
    """A view xte cannot read without a copy is an XteLayoutError naming the argument."""
    rng = np.random.default_rng(45)
    a, b, A, B = _ok_operands(rng)
    d = np.full((5, 12), 3.0, np.float32)
    before = _untouched(d)
    with pytest.raises(xte.XteLayoutError, match="(^|: )d: the last dimension has stride 2"):
        fp8_gemm_nt(a, b, d[:, ::2])
    assert _untouched(d) == before
    with pytest.raises(xte.XteLayoutError, match=r"(^|: )a\[0\]: the last dimension"):
        fp8_gemm_nt((a[0].T, a[1]), b, d[:, :6])
    with pytest.raises(xte.XteLayoutError, match=r"(^|: )b\.data: the last dimension"):
        gemm(A, xte.QuantizedTensor(B.data[:, ::2], B.scale_inv, scaling_mode="128x128",
                                    recipe="te_block"))
    with pytest.raises(xte.XteLayoutError, match=r"(^|: )c: "):
        gemm(A, B, c=np.zeros((6, 5), np.float32).T)
    assert _untouched(d) == before


def test_pair_ambiguity_asks_for_layout():
    """A 1x128 pair whose scale shape is both the compact [R, ceil(K/128)] and DeepGEMM's
    MN-major [ceil(K/128), roundup(R, 4)] cannot be inferred: an error asking for layout=;
    with layout= both readings work and differ as they should."""
    rng = np.random.default_rng(46)
    M, N, K = 4, 6, 512  # ceil(K/128) = 4 = M = roundup(M, 4)
    qa, ga, qb, gb = _case(rng, "1x128", "1x128", M, N, K, E4M3, E4M3)
    a = make_pair(qa, E4M3, "1x128", ga, False)
    b = make_pair(qb, E4M3, "1x128", gb, False)
    d = np.zeros((M, N), np.float32)
    with pytest.raises(xte.XteValueError, match=r"a\[1\]: .*layout="):
        fp8_gemm_nt(a, b, d)
    fp8_gemm_nt(a, b, d, layout=("compact", None))
    assert bytes_of(d) == bytes_of(_oracle(qa, E4M3, "1x128", ga, qb, E4M3, "1x128", gb))
    # the same grid stored MN-major (DeepGEMM's TMA-aligned layout: [ceil(K/128), M])
    a_mn = (a[0], np.ascontiguousarray(ga.T))
    d2 = np.zeros((M, N), np.float32)
    fp8_gemm_nt(a_mn, b, d2, layout=("deepgemm", "compact"))
    assert bytes_of(d2) == bytes_of(d)


LAYOUTS = {"1x128": ["compact", "te_gemm", "deepgemm"], "128x128": ["compact", "te_gemm",
                                                                    "deepgemm"],
           "1x32": ["compact", "mx_swizzled"], "per_tensor": ["compact", "te_gemm"]}
RECIPE = {"1x128": "te_block", "128x128": "te_block", "1x32": "mx_te", "per_tensor": "te_current"}


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_scale_layouts_give_the_same_bytes(pair):
    """Operands quantized by the C library (both copies) in every scale layout give the same
    bytes for every transpose; the compact, non-transposed result = the oracle on the stored
    codes and scales."""
    from test_gemm_oracle import c_quantize
    ma, mb = pair
    rng = np.random.default_rng(61)
    M, N, K = (130, 6, 300) if ma == "128x128" else (6, 130, 300 if ma != "1x32" else 72)
    checked = 0
    for ta in (False, True):
        for tb in (True, False):
            xa = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
            xb = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
            outs = []
            for la, lb in [(la, lb) for la in LAYOUTS[ma] for lb in LAYOUTS[mb]]:
                A = c_quantize(xa, ma, RECIPE[ma], la)
                B = c_quantize(xb, mb, RECIPE[mb], lb)
                outs.append(bytes_of(gemm(A, B, trans_a=ta, trans_b=tb, out_dtype="float32")))
                if la == "compact" and lb == "compact" and not ta and tb:
                    qa = np.asarray(A.data).view(np.uint8)
                    qb = np.asarray(B.data).view(np.uint8)
                    ga = np.asarray(A.scale_inv)
                    gb = np.asarray(B.scale_inv)
                    if ma == "1x32":
                        ga, gb = ga.view(np.uint8), gb.view(np.uint8)
                    want = _oracle(qa, E4M3, ma, ga, qb, E4M3, mb, gb, out="float32")
                    assert outs[-1] == bytes_of(want)
                    checked += 1
            assert len(set(outs)) == 1, (ta, tb)
    assert checked == 1
