"""Grouped GEMMs (xte.gemm_grouped and DeepGEMM's m_grouped_fp8_gemm_nt_contiguous /
_nt_masked, k_grouped_fp8_gemm_tn_contiguous): each group byte-equal to the plain GEMM on its
slices and to the exact oracle (test_gemm_oracle.py); padding / masked rows never read (the
DeepGEMM names write zeros into d's padding rows, as DeepGEMM); errors name the argument and
leave d untouched."""

import numpy as np
import pytest

import xte
from xte.ops.gemm import (fp8_gemm_nt, fp8_gemm_tn, gemm, gemm_grouped,
                          k_grouped_fp8_gemm_tn_contiguous, m_grouped_fp8_gemm_nt_contiguous,
                          m_grouped_fp8_gemm_nt_masked)

from test_gemm_oracle import (BF16, E4M3, E5M2, fp8_array, gemm_oracle, rand_codes, rand_grid,
                              row_scales)

SENTINEL = np.float32(-12345.0)


def _bytes(x):
    return np.ascontiguousarray(x).tobytes()


def _contiguous_case(rng, sizes, align, N=128, K=300, fb=E4M3):
    """A [sum roundup(m_g, align), K] 1x128 with NaN codes on padding rows; B [G, N, K] 128x128
    (N = 128: the per-group tile grids tile the [G * N, K] tensor)."""
    G = len(sizes)
    padded = [-(-m // align) * align for m in sizes]
    R = sum(padded)
    qa = rand_codes(rng, (R, K), E4M3)
    ga = rand_grid(rng, "1x128", R, K)
    starts = np.cumsum([0] + padded[:-1])
    for s, m, p in zip(starts, sizes, padded):
        qa[s + m:s + p] = 0x7F  # NaN: must never be read
    qb = rand_codes(rng, (G, N, K), fb)
    gb = rand_grid(rng, "128x128", G * N, K).reshape(G, -(-N // 128), -1)
    return qa, ga, qb, gb, starts, padded


@pytest.mark.parametrize("how", ["gemm_grouped", "group_sizes", "m_indices", "list"])
def test_contiguous_with_alignment(how):
    rng = np.random.default_rng(1)
    sizes, align = [5, 0, 9], 8
    qa, ga, qb, gb, starts, padded = _contiguous_case(rng, sizes, align, fb=E5M2)
    R, K = qa.shape
    G, N, _ = qb.shape
    a = (fp8_array(qa, E4M3), ga)
    b = (fp8_array(qb.reshape(G * N, K), E5M2).reshape(G, N, K), gb)  # 3-D data and scales
    d = np.full((R, N), SENTINEL, np.float32)
    if how == "gemm_grouped":
        A = xte.QuantizedTensor(*a, scaling_mode="1x128", recipe="deepgemm")
        B = xte.QuantizedTensor(*b, scaling_mode="128x128", recipe="deepgemm")
        r = gemm_grouped(A, B, d, kind="contiguous", group_sizes=sizes, alignment=align)
    elif how == "group_sizes":
        r = m_grouped_fp8_gemm_nt_contiguous(a, b, d, group_sizes=np.array(sizes),
                                             alignment=align)
    elif how == "list":
        r = m_grouped_fp8_gemm_nt_contiguous(a, b, d, sizes, alignment=align)
    else:
        m_indices = np.full(R, -1, np.int32)
        for g, (s, m) in enumerate(zip(starts, sizes)):
            m_indices[s:s + m] = g
        r = m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, alignment=align)
    assert r is d
    for g, (s, m, p) in enumerate(zip(starts, sizes, padded)):
        want = np.full((m, N), SENTINEL, np.float32)
        fp8_gemm_nt((a[0][s:s + m], ga[s:s + m]), (b[0][g], gb[g]), want)
        assert _bytes(d[s:s + m]) == _bytes(want), g
        # DeepGEMM's functions write zeros into d's padding rows (ensure_zero_padding, the
        # default); xte.gemm_grouped never writes them
        pad = np.float32(0) if how != "gemm_grouped" else SENTINEL
        assert _bytes(d[s + m:s + p]) == _bytes(np.full((p - m, N), pad)), "padding"
    # group 2 against the oracle
    s, m = starts[2], sizes[2]
    o = gemm_oracle(qa[s:s + m], E4M3, ga[s:s + m], qb[2], E5M2,
                    row_scales("128x128", gb[2], N, K), 128)
    assert _bytes(d[s:s + m]) == _bytes(o)


def test_contiguous_bf16_out_allocated_and_bias():
    """out=None allocates [rows of a, N] bf16 in a's framework; bias applies to every group."""
    rng = np.random.default_rng(2)
    sizes = [3, 4]
    qa, ga, qb, gb, starts, _ = _contiguous_case(rng, sizes, 1, K=200)
    G, N, K = qb.shape
    A = xte.QuantizedTensor(fp8_array(qa, E4M3), ga, scaling_mode="1x128", recipe="te_block")
    B = xte.QuantizedTensor(fp8_array(qb.reshape(-1, K), E4M3), gb.reshape(G, -1),
                            scaling_mode="128x128", recipe="te_block")
    bias = rng.standard_normal(N).astype(np.float32)
    d = gemm_grouped(A, B, kind="contiguous", group_sizes=sizes, bias=bias)
    assert d.dtype == BF16 and d.shape == (7, N)
    for g, (s, m) in enumerate(zip(starts, sizes)):
        Ag = xte.QuantizedTensor(fp8_array(qa[s:s + m], E4M3), ga[s:s + m],
                                 scaling_mode="1x128", recipe="te_block")
        Bg = xte.QuantizedTensor(fp8_array(qb[g], E4M3), gb[g], scaling_mode="128x128",
                                 recipe="te_block")
        assert _bytes(d[s:s + m]) == _bytes(gemm(Ag, Bg, bias=bias))


@pytest.mark.parametrize("via", ["deepgemm", "gemm_grouped"])
def test_masked(via):
    rng = np.random.default_rng(3)
    G, m_max, N, K = 3, 8, 10, 300
    masked = np.array([3, 0, 8], np.int32)
    qa = rand_codes(rng, (G, m_max, K), E4M3)
    for g in range(G):
        qa[g, masked[g]:] = 0xFF  # NaN: never read
    ga = rand_grid(rng, "1x128", G * m_max, K).reshape(G, m_max, -1)
    qb = rand_codes(rng, (G, N, K), E4M3)
    gb = rand_grid(rng, "1x128", G * N, K).reshape(G, N, -1)
    a = (fp8_array(qa.reshape(-1, K), E4M3).reshape(G, m_max, K), ga)
    b = (fp8_array(qb.reshape(-1, K), E4M3).reshape(G, N, K), gb)
    d = np.full((G, m_max, N), SENTINEL, np.float32)
    if via == "deepgemm":
        r = m_grouped_fp8_gemm_nt_masked(a, b, d, masked, expected_m=4)
    else:
        A = xte.QuantizedTensor(*a, scaling_mode="1x128", recipe="deepgemm")
        B = xte.QuantizedTensor(*b, scaling_mode="1x128", recipe="deepgemm")
        r = gemm_grouped(A, B, d, kind="masked", masked_m=masked, num_groups=G)
    assert r is d
    for g in range(G):
        m = masked[g]
        want = np.empty((m, N), np.float32)
        fp8_gemm_nt((a[0][g, :m], ga[g, :m]), (b[0][g], gb[g]), want)
        assert _bytes(d[g, :m]) == _bytes(want)
        assert (d[g, m:] == SENTINEL).all(), "masked rows written"
    o = gemm_oracle(qa[2], E4M3, ga[2], qb[2], E4M3, gb[2], 128)
    assert _bytes(d[2]) == _bytes(o)


@pytest.mark.parametrize("with_c", [False, True])
def test_k_grouped(with_c):
    """k_grouped_fp8_gemm_tn_contiguous(a [sum_k, M], b [sum_k, N], d [G, M, N], ks): each group
    = fp8_gemm_tn on its K segment (and + c[g]); = xte.gemm_grouped(kind='k') on the K-major
    QuantizedTensors of the same codes and scales; = the oracle."""
    rng = np.random.default_rng(4)
    ks = [128, 256, 100]
    M, N, S = 6, 10, sum(ks)
    qa = rand_codes(rng, (M, S), E4M3)  # op(A) [M, sum_k]
    qb = rand_codes(rng, (N, S), E5M2)
    ga = rand_grid(rng, "1x128", M, S)  # [M, nb]
    gb = rand_grid(rng, "1x128", N, S)
    a = (fp8_array(qa.T, E4M3), np.ascontiguousarray(ga.T))  # DeepGEMM: [sum_k, M], [nb, M]
    b = (fp8_array(qb.T, E5M2), np.ascontiguousarray(gb.T))
    G = len(ks)
    c = (rng.standard_normal((G, M, N)) * 100).astype(np.float32) if with_c else None
    d = np.full((G, M, N), SENTINEL, np.float32)
    r = k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks, None, c)
    assert r is d
    k0 = 0
    for g, k in enumerate(ks):
        b0, b1 = k0 // 128, -(-(k0 + k) // 128)
        want = np.empty((M, N), np.float32)
        fp8_gemm_tn((a[0][k0:k0 + k], a[1][b0:b1]), (b[0][k0:k0 + k], b[1][b0:b1]), want,
                    None if c is None else c[g])
        assert _bytes(d[g]) == _bytes(want), g
        o = gemm_oracle(qa[:, k0:k0 + k], E4M3, ga[:, b0:b1], qb[:, k0:k0 + k], E5M2,
                        gb[:, b0:b1], 128, c=None if c is None else c[g])
        assert _bytes(d[g]) == _bytes(o), g
        k0 += k
    # the K-major QuantizedTensor path (rowwise copies, trans_a=False, trans_b=True)
    A = xte.QuantizedTensor(fp8_array(qa, E4M3), ga, scaling_mode="1x128", recipe="te_block")
    B = xte.QuantizedTensor(fp8_array(qb, E5M2), gb, scaling_mode="1x128", recipe="te_block")
    d2 = gemm_grouped(A, B, kind="k", group_sizes=ks, c=c, out_dtype="float32")
    assert d2.shape == (G, M, N) and _bytes(d2) == _bytes(d)
    # ks from DeepGEMM's grouped_layout tensor
    d3 = np.full((G, M, N), SENTINEL, np.float32)
    k_grouped_fp8_gemm_tn_contiguous(a, b, d3, None, np.array(ks, np.int32), c)
    assert _bytes(d3) == _bytes(d)


# ------------------------------------------------------------------------------- errors


def test_grouped_errors_name_the_argument_and_leave_d():
    rng = np.random.default_rng(5)
    sizes, align = [5, 0, 9], 8
    qa, ga, qb, gb, starts, padded = _contiguous_case(rng, sizes, align)
    G, N, K = qb.shape
    a = (fp8_array(qa, E4M3), ga)
    b = (fp8_array(qb.reshape(-1, K), E4M3).reshape(G, N, K), gb)
    d = np.full((qa.shape[0], N), SENTINEL, np.float32)
    before = _bytes(d)
    with pytest.raises(xte.XteShapeError, match=r"group_sizes: .*group_sizes\[2\]"):
        m_grouped_fp8_gemm_nt_contiguous(a, b, d, group_sizes=[5, 0, 20], alignment=align)
    with pytest.raises(xte.XteValueError, match=r"grouped_layout: row 8 holds 0: groups"):
        m = np.full(qa.shape[0], -1, np.int32)
        m[:5] = 1
        m[8:17] = 0
        m_grouped_fp8_gemm_nt_contiguous(a, b, d, m, alignment=align)
    with pytest.raises(xte.XteValueError, match=r"grouped_layout: row 0 holds -1 where a "
                       r"group starts, but row 8 holds 1"):
        m = np.full(qa.shape[0], -1, np.int32)
        m[8:13] = 1
        m_grouped_fp8_gemm_nt_contiguous(a, b, d, m, alignment=align)
    with pytest.raises(xte.XteValueError, match=r"grouped_layout: group 0 has 5 rows"):
        m = np.zeros(qa.shape[0], np.int32)
        m[5:] = 1
        m_grouped_fp8_gemm_nt_contiguous(a, b, d, m, alignment=align)
    with pytest.raises(xte.XteDTypeError, match=r"grouped_layout: dtype int64"):
        m_grouped_fp8_gemm_nt_contiguous(a, b, d, np.zeros(qa.shape[0], np.int64))
    with pytest.raises(xte.XteShapeError, match=r"group_sizes: 3 groups, but b holds 2"):
        m_grouped_fp8_gemm_nt_contiguous(a, (b[0][:2], gb[:2]), d, group_sizes=sizes,
                                         alignment=align)
    with pytest.raises(xte.XteValueError, match="grouped_layout: group 1 ends at M = 4"):
        m_grouped_fp8_gemm_nt_contiguous(a, b, d, np.array([5, 4, 20], np.int32),
                                         use_psum_layout=True, alignment=align)
    A = xte.QuantizedTensor(*a, scaling_mode="1x128", recipe="deepgemm")
    B = xte.QuantizedTensor(*b, scaling_mode="128x128", recipe="deepgemm")
    with pytest.raises(xte.XteUnsupportedError, match=r"trans_a: "):
        gemm_grouped(A, B, d, kind="contiguous", group_sizes=sizes, trans_a=True)
    with pytest.raises(xte.XteValueError, match=r"kind: 'rows'"):
        gemm_grouped(A, B, d, kind="rows", group_sizes=sizes)
    with pytest.raises(xte.XteValueError, match=r"group_sizes: required"):
        gemm_grouped(A, B, d, kind="contiguous")
    assert _bytes(d) == before
    # masked
    dm = np.full((G, 8, N), SENTINEL, np.float32)
    am = (fp8_array(rand_codes(rng, (G * 8, K), E4M3), E4M3).reshape(G, 8, K),
          rand_grid(rng, "1x128", G * 8, K).reshape(G, 8, -1))
    bm = (b[0], rand_grid(rng, "1x128", G * N, K).reshape(G, N, -1))
    before = _bytes(dm)
    with pytest.raises(xte.XteDTypeError, match=r"masked_m: dtype int64"):
        m_grouped_fp8_gemm_nt_masked(am, bm, dm, np.array([1, 2, 3]))
    with pytest.raises(xte.XteShapeError, match=r"masked_m: 2 groups, but b holds 3"):
        m_grouped_fp8_gemm_nt_masked(am, bm, dm, np.array([1, 2], np.int32))
    with pytest.raises(xte.XteShapeError, match=r"num_groups: 2"):
        gemm_grouped(xte.QuantizedTensor(*am, scaling_mode="1x128", recipe="deepgemm"),
                     xte.QuantizedTensor(*bm, scaling_mode="1x128", recipe="deepgemm"), dm,
                     kind="masked", masked_m=np.array([1, 2, 3], np.int32), num_groups=2)
    assert _bytes(dm) == before
    # k-grouped: a segment that does not end on a K block
    ks = [100, 100]
    S = sum(ks)
    ak = (fp8_array(rand_codes(rng, (S, 4), E4M3), E4M3), rand_grid(rng, "1x128", 4, S).T.copy())
    bk = (fp8_array(rand_codes(rng, (S, 5), E4M3), E4M3), rand_grid(rng, "1x128", 5, S).T.copy())
    dk = np.full((2, 4, 5), SENTINEL, np.float32)
    before = _bytes(dk)
    with pytest.raises(xte.XteShapeError, match=r"grouped_layout: group 1 .*runs past"):
        k_grouped_fp8_gemm_tn_contiguous(ak, bk, dk, None, np.array([100, 201], np.int32),
                                         use_psum_layout=True, alignment=1)
    with pytest.raises(xte.XteShapeError, match=r"ks: .*sum to"):
        k_grouped_fp8_gemm_tn_contiguous(ak, bk, dk, [128, 10])
    with pytest.raises(xte.XteValueError, match=r"ks: required"):
        k_grouped_fp8_gemm_tn_contiguous(ak, bk, dk)
    assert _bytes(dk) == before
