"""xte.check: planted faults are found and named, correct outputs pass, files round-trip, and
the CLI runs through `python -m xte.check` and the built `xte` program (`xte check`).

Correct outputs come from xte itself and from independent NumPy references (xte.testing's
recipe oracles, the fp64 / naive attention of xte.check.attention, NumPy permutes). Each planted
fault is one the issue names: a flipped scale bit, a non-power-of-two scale, a saturating cast
where the recipe does not saturate, a transposed scale layout, a GEMM output perturbed just
inside and just outside the FAST bound, an attention gradient computed in a worse order, a
router breaking ties the other way (and a permutation with two rows swapped).
"""
# ctest: no-isa-variants

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import xte
from xte import testing
from xte.check import (attention_reference, check_attention, check_aux_loss, check_cast,
                       check_gemm,
                       check_gemm_grouped, check_permute, check_quantize, check_router,
                       check_router_backward,
                       check_unpermute,
                       fast_bound, load, save)
from xte.check.__main__ import main as cli_main
from xte.check.gemm import _rows_along_k

BF16 = ml_dtypes.bfloat16


def _x(M, K, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((M, K)) * np.exp(rng.uniform(-3, 3, (M, 1)))).astype(np.float32)


# ----------------------------------------------------------------------------- quantize

@pytest.mark.parametrize("recipe,block,layout,columnwise", [
    ("te_block", "1x128", "compact", False), ("te_block", "1x128", "te_gemm", False),
    ("te_block", "128x128", "te_gemm", False), ("te_block", "1x128", "compact", True),
    ("deepgemm", "1x128", "deepgemm", False), ("deepgemm_ue8m0", "128x128", "compact", False),
    ("mtfp8", "1x128", "compact", True), ("mx_te", "1x32", "mx_swizzled", False),
    ("mx_ocp", "1x32", "compact", False), ("te_current", "per_tensor", "compact", False)])
def test_quantize_correct_passes_xte_and_numpy(recipe, block, layout, columnwise):
    x = _x(70, 300)
    q = xte.quantize(x, recipe, block=block, layout=layout, rowwise=not columnwise,
                     columnwise=columnwise)
    d, s = (q.columnwise_data, q.columnwise_scale_inv) if columnwise else (q.data, q.scale_inv)
    rep = check_quantize(x, d, s, recipe, block, layout, columnwise=columnwise)
    assert rep.ok, rep.table()
    # the independent NumPy oracle's bytes pass too
    rd, rs = testing.reference_quantize(x, recipe, block, columnwise=columnwise)
    kind = testing.reference_grid_kind(recipe, block, columnwise)
    rs = testing.reference_scale_layout(rs, kind, layout)
    rep = check_quantize(x, rd, rs, recipe, block, layout, columnwise=columnwise)
    assert rep.ok, rep.table()


def test_quantize_flipped_scale_bit():
    x = _x(16, 256)
    q = xte.quantize(x, "te_block")
    s = np.asarray(q.scale_inv).copy()
    s.view(np.uint32)[5, 1] ^= np.uint32(1 << 9)
    rep = check_quantize(x, q.data, s, "te_block", "1x128")
    v = rep["scale_inv"]
    assert not v.passed and v.classes == {"scale bit flip": 1}, rep.table()
    assert v.examples[0]["block"] == [5, 1]
    assert rep["data"].passed
    # an E8M0 scale (MXFP8) with one bit flipped
    q = xte.quantize(x, "mx_te")
    s = np.asarray(q.scale_inv).view(np.uint8).copy()
    s[3, 2] ^= 0x10
    rep = check_quantize(x, q.data, s, "mx_te", "1x32")
    assert rep["scale_inv"].classes == {"scale bit flip": 1}, rep.table()


def test_quantize_non_power_of_two_scale():
    x = _x(16, 256, seed=1)
    # TE's Float8BlockScaling rounds the scale down to a power of two; this producer did not
    q = xte.quantize(x, "te_block", force_pow_2=False)
    rep = check_quantize(x, q.data, q.scale_inv, "te_block", "1x128")
    v = rep["scale_inv"]
    assert not v.passed
    assert list(v.classes) == ["power-of-two rounding missing (equals the recipe without "
                               "force_pow_2)"], rep.table()
    # its codes are those its own scales give
    assert list(rep["data"].classes) == ["follows its block's (differing) scale"], rep.table()
    # one scale replaced by a value that is no recipe's: still named as a non-power-of-two
    q = xte.quantize(x, "te_block")
    s = np.asarray(q.scale_inv).copy()
    s[2, 0] = np.float32(s[2, 0] * np.float32(1.3))
    rep = check_quantize(x, q.data, s, "te_block", "1x128")
    assert list(rep["scale_inv"].classes) == [
        "power-of-two rounding missing (scale not a power of two)"], rep.table()


def test_saturating_cast_where_recipe_does_not_saturate():
    x = np.array([[1.0, 500.0, -1e6, np.inf, -np.inf, np.nan, 2.0 ** -12, 464.0]], np.float32)
    sat = testing.reference_fp8(x, "e4m3", saturate=True)
    rep = check_cast(x, sat, "e4m3", saturate=False)
    v = rep["y"]
    assert not v.passed
    assert v.classes == {"saturating cast where the recipe does not saturate": 4}, rep.table()
    assert check_cast(x, sat, "e4m3", saturate=True).ok
    assert check_cast(x, testing.reference_fp8(x, "e4m3", saturate=False), "e4m3",
                      saturate=False).ok
    # the reverse: a non-saturating cast where the recipe saturates
    rep = check_cast(x, testing.reference_fp8(x, "e4m3", saturate=False), "e4m3")
    assert rep["y"].classes == {"non-saturating cast where the recipe saturates": 4}
    # delayed scaling claimed non-saturating, a producer that saturated
    xs = _x(8, 64) * 100
    q = xte.quantize(xs, "te_delayed", scale=8.0)
    rep = check_quantize(xs, q.data, q.scale_inv, "te_delayed", saturate=False, scale=8.0)
    d = rep["data"]
    assert not d.passed and set(d.classes) == {
        "saturating cast where the recipe does not saturate"}, rep.table()


def test_saturating_cast_torch():
    torch = pytest.importorskip("torch")
    x = np.array([[3.0, 600.0, -7e4, np.inf]], np.float32)
    y = torch.from_numpy(x).to(torch.float8_e4m3fn)
    rep = check_cast(x, y, "e4m3", saturate=False)
    if not rep.ok:  # torch >= 2.12 saturates its e4m3 casts
        assert set(rep["y"].classes) == {"saturating cast where the recipe does not saturate"}
    assert check_cast(x, y, "e4m3", saturate=True).ok or not rep.ok


@pytest.mark.parametrize("M", [16, 70])
def test_quantize_transposed_scale_layout(M):
    x = _x(M, 384, seed=2)
    q = xte.quantize(x, "te_block", layout="te_gemm")
    s = np.ascontiguousarray(np.asarray(q.scale_inv).T)
    rep = check_quantize(x, q.data, s, "te_block", "1x128", "te_gemm")
    v = rep["scale_inv"]
    assert not v.passed and list(v.classes) == ["scale layout mix-up"], rep.table()
    assert "transposed te_gemm" in v.why
    assert rep["data"].passed
    # compact scales given where te_gemm is claimed
    qc = xte.quantize(x, "te_block")
    rep = check_quantize(x, qc.data, qc.scale_inv, "te_block", "1x128", "te_gemm")
    assert list(rep["scale_inv"].classes) == ["scale layout mix-up"], rep.table()


def test_quantize_block_size_mix_up():
    x = _x(8, 512, seed=17)
    q = xte.quantize(x, "te_block", block="128x128")
    rep = check_quantize(x, q.data, q.scale_inv, "te_block", "1x128")
    v = rep["scale_inv"]
    assert v.classes == {"block size or layout mix-up (scale shape)": 1}, rep.table()
    assert "128x128 blocks in the compact layout" in v.why


def test_quantize_data_faults_named():
    x = _x(4, 128, seed=3)
    x[3, :8] *= 1e-4                      # a few elements far below the block's amax
    x[0, 5] = np.nan
    x[1, 3] = 1e-30 * 0  # a zero: its sign
    q = xte.quantize(x, "te_block")
    d = np.asarray(q.data).view(np.uint8).copy()
    d[0, 5] ^= 0x80                      # NaN sign
    d[1, 3] = 0x80                       # -0 for +0
    code = int(d[2, 7])
    d[2, 7] = (code & 0x80) | ((code & 0x7F) - 1 if code & 0x7F else 1)
    sub = np.argwhere(((d & 0x78) == 0) & ((d & 0x07) != 0))   # subnormal codes
    assert len(sub)
    d[tuple(sub[0])] &= 0x80             # flushed to zero (FTZ)
    d = d.T.copy().T                     # same bytes, another memory order
    rep = check_quantize(x, d.view(ml_dtypes.float8_e4m3fn), q.scale_inv, "te_block")
    cls = rep["data"].classes
    assert cls.get("NaN encoding") == 1 and cls.get("sign of zero") == 1, rep.table()
    assert cls.get("subnormal flushed to zero") == 1, rep.table()
    assert sum(cls.values()) == 4
    # the data transposed (square)
    xs = _x(128, 128, seed=4)
    q = xte.quantize(xs, "te_block", block="128x128")
    rep = check_quantize(xs, np.ascontiguousarray(np.asarray(q.data).T), q.scale_inv,
                         "te_block", "128x128")
    assert "data transposed (layout mix-up)" in rep["data"].classes


# ----------------------------------------------------------------------------- GEMM

def _gemm_case(M=24, N=40, K=300, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    return xte.per_token_cast_to_fp8(x), xte.per_block_cast_to_fp8(w)


def _dequant(pair, block):
    """fp64 values of a DeepGEMM (data, compact scales) pair, written here from the layout."""
    data, sf = (np.asarray(t) for t in pair)
    v = data.astype(np.float64)
    bm = 128 if block == "128x128" else 1
    full = np.repeat(np.repeat(sf.astype(np.float64), bm, axis=0), 128, axis=1)
    return v * full[:v.shape[0], :v.shape[1]]


def _bound(a, b, d, out_dtype="float32"):
    """include/xte/gemm.h's FAST bound restated: (KB 2^-13 + (nb + 2) 2^-23) S + u_out |D|
    with normal scales (KB = 128, u_out = 2^-8 for bf16, 0 for fp32)."""
    A, B = _dequant(a, "1x128"), _dequant(b, "128x128")
    K = A.shape[1]
    nb = -(-K // 128)
    u_out = 2.0 ** -8 if out_dtype == "bfloat16" else 0.0
    S = np.abs(A) @ np.abs(B).T
    return (128 * 2.0 ** -13 + (nb + 2) * 2.0 ** -23) * S + u_out * np.abs(
        np.asarray(d, np.float64))


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_gemm_correct_passes(out_dtype):
    a, b = _gemm_case()
    d = xte.gemm(a, b, out_dtype=out_dtype)
    for mode in ("fast", "exact"):
        rep = check_gemm(a, b, d, block_a="1x128", block_b="128x128", mode=mode)
        assert rep.ok, rep.table()
    assert rep["out"].stats["bit_identical"] == d.size
    # an fp64 product of the dequantized operands rounded once (the NumPy reference) is within
    # the FAST bound, and DeepGEMM's calc_diff against fp64 is tiny
    qa, qb = xte.as_quantized(*a, block="1x128"), xte.as_quantized(*b, block="128x128")
    ref = (_rows_along_k(qa, False) @ _rows_along_k(qb, False).T).astype(np.float32)
    if out_dtype == "bfloat16":
        ref = ref.astype(BF16)
    rep = check_gemm(a, b, ref, block_a="1x128", block_b="128x128")
    assert rep.ok, rep.table()
    assert rep["out"].stats["calc_diff"] < 1e-5


@pytest.mark.parametrize("recipe,block,fmt_b", [("mx_te", "1x32", "e4m3"),
                                                ("te_current", "per_tensor", "e4m3"),
                                                ("te_block", "1x128", "e5m2")])
def test_gemm_other_scalings_and_wgrad(recipe, block, fmt_b):
    rng = np.random.default_rng(18)
    x = rng.standard_normal((16, 200)).astype(np.float32)
    w = rng.standard_normal((24, 200)).astype(np.float32)
    a = xte.quantize(x, recipe, block=block)
    b = xte.quantize(w, recipe, block=block, fmt=fmt_b)
    d = np.asarray(xte.gemm(a, b, out_dtype="float32"))
    assert check_gemm(a, b, d).ok
    assert check_gemm((a.data, a.scale_inv), (b.data, b.scale_inv), d, block_a=block,
                      block_b=block, recipe_a=recipe, recipe_b=recipe).ok
    p = d.copy()
    p[1, 1] += np.float32(0.5) * np.abs(p).max()
    assert check_gemm(a, b, p)["out"].classes == {"beyond the FAST bound": 1}
    # wgrad: dW = dY^T X from the columnwise (transposed) copies
    dy = rng.standard_normal((160, 24)).astype(np.float32)
    xx = rng.standard_normal((160, 200)).astype(np.float32)
    qa = xte.quantize(dy, "te_block", columnwise=True)
    qb = xte.quantize(xx, "te_block", columnwise=True)
    dw = np.asarray(xte.gemm(qa, qb, trans_a=True, trans_b=False, out_dtype="float32"))
    rep = check_gemm(qa, qb, dw, trans_a=True, trans_b=False)
    assert rep.ok and rep["out"].stats["outputs"] == 24 * 200, rep.table()


def _round_bits(v, bits):
    m, e = np.frexp(v)
    return np.ldexp(np.round(m * 2.0 ** bits) / 2.0 ** bits, e)


def test_gemm_tensor_core_like_output_passes_fast_only():
    """A DeepGEMM-like FAST product: each 128-block partial kept to 14 significant bits (as
    Hopper's FP8 tensor cores accumulate), then acc += (sa sb) p in fp32 block by block."""
    a, b = _gemm_case(M=32, N=136, K=640, seed=24)
    A8, sa = np.asarray(a[0]).astype(np.float64), np.asarray(a[1])
    B8, sb = np.asarray(b[0]).astype(np.float64), np.asarray(b[1])
    M, K = A8.shape
    N = B8.shape[0]
    acc = np.zeros((M, N), np.float32)
    for kb in range(K // 128):
        p = _round_bits(A8[:, kb * 128:(kb + 1) * 128] @ B8[:, kb * 128:(kb + 1) * 128].T, 14)
        s = (sa[:, kb][:, None] * np.repeat(sb[:, kb], 128)[None, :N]).astype(np.float32)
        acc = (acc + (p.astype(np.float32) * s).astype(np.float32)).astype(np.float32)
    d = acc.astype(BF16)
    rep = check_gemm(a, b, d, block_a="1x128", block_b="128x128", calc_diff_max=1e-3)
    v = rep["out"]
    assert v.passed and v.stats["max_error_in_bounds"] < 0.5, rep.table()
    assert v.stats["bit_identical"] < d.size
    assert not check_gemm(a, b, d, block_a="1x128", block_b="128x128", mode="exact").ok


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_gemm_perturbed_inside_and_outside_the_fast_bound(out_dtype):
    a, b = _gemm_case(seed=6)
    d = np.asarray(xte.gemm(a, b, out_dtype=out_dtype))
    bnd = _bound(a, b, d, out_dtype)
    A, B = _dequant(a, "1x128"), _dequant(b, "128x128")
    np.testing.assert_allclose(fast_bound(np.abs(A) @ np.abs(B).T, A.shape[1], 128, out_dtype,
                                          d.astype(np.float64)), bnd, rtol=1e-12)
    for frac, ok in ((0.9, True), (1.1, False)):
        p = d.astype(np.float64)
        for (i, j), sgn in (((3, 5), 1), ((17, 30), -1)):
            p[i, j] += sgn * frac * bnd[i, j]
        p = p.astype(np.float32).astype(d.dtype)
        err = np.abs(p.astype(np.float64) - d.astype(np.float64))
        assert (err[3, 5] <= bnd[3, 5]) == ok  # the planted error really is inside / outside
        rep = check_gemm(a, b, p, block_a="1x128", block_b="128x128")
        v = rep["out"]
        assert v.passed == ok, rep.table()
        if ok:
            assert v.classes == {"within the FAST bound, not bit-identical": 2}
            assert 0.8 < v.stats["max_error_in_bounds"] <= 1
            # exact mode wants xte's bytes
            assert not check_gemm(a, b, p, block_a="1x128", block_b="128x128",
                                  mode="exact").ok
        else:
            assert v.classes == {"beyond the FAST bound": 2}, rep.table()
            assert {tuple(e["index"]) for e in v.examples} == {(3, 5), (17, 30)}
    # NaN where the exact product is finite
    p = d.copy()
    p[0, 0] = np.nan
    rep = check_gemm(a, b, p, block_a="1x128", block_b="128x128")
    assert rep["out"].classes == {"NaN where the exact result is finite": 1}


def test_gemm_grouped_padding_rows():
    rng = np.random.default_rng(7)
    sizes, align, K, N = [5, 0, 9], 8, 256, 40
    rows = sum(-(-m // align) * align for m in sizes)
    x = rng.standard_normal((rows, K)).astype(np.float32)
    w = rng.standard_normal((3, N, K)).astype(np.float32)
    a = xte.per_token_cast_to_fp8(x)
    # the 128x128 tiles of B tile the [G * N, K] tensor
    bd, bs = xte.per_block_cast_to_fp8(w.reshape(3 * N, K))
    b = (np.asarray(bd).reshape(3, N, K), np.asarray(bs))
    before = np.full((rows, N), 7.0, np.float32)
    qa = xte.as_quantized(*a, block="1x128")
    qb = xte.as_quantized(*b, block="128x128")
    d = xte.gemm_grouped(qa, qb, before.copy(), group_sizes=sizes, alignment=align)
    kw = dict(group_sizes=sizes, alignment=align, block_a="1x128", block_b="128x128")
    rep = check_gemm_grouped(a, b, d, out_before=before, **kw)
    assert rep.ok, rep.table()
    assert rep["out.padding_rows"].stats["padding_rows"] == rows - sum(sizes)
    bad = np.asarray(d).copy()
    bad[5:8] = 0.0                      # a producer that zeroes the padding rows of group 0
    rep = check_gemm_grouped(a, b, bad, out_before=before, **kw)
    assert rep["out"].passed and not rep["out.padding_rows"].passed
    assert rep["out.padding_rows"].classes == {"padding rows written": 3}
    assert check_gemm_grouped(a, b, bad, padding="zero", **kw)["out.padding_rows"].passed \
        is False  # rows 14.. still hold 7.0


def test_gemm_k_grouped_and_masked():
    rng = np.random.default_rng(13)
    ks, M, N = [128, 256, 100], 6, 10
    x = rng.standard_normal((M, sum(ks))).astype(np.float32)
    y = rng.standard_normal((N, sum(ks))).astype(np.float32)
    A, B = xte.quantize(x, "te_block"), xte.quantize(y, "te_block")
    d = np.asarray(xte.gemm_grouped(A, B, kind="k", group_sizes=ks, out_dtype="float32"))
    rep = check_gemm_grouped(A, B, d, kind="k", group_sizes=ks)
    assert rep.ok, rep.table()
    # each group's bound has its own K: 0.9 of group 2's (K = 100) passes, 1.1 fails
    Ar, Br = _rows_along_k(A, False)[:, 384:], _rows_along_k(B, False)[:, 384:]
    bnd = (128 * 2.0 ** -13 + 3 * 2.0 ** -23) * (np.abs(Ar) @ np.abs(Br).T)  # nb = 1
    for frac, ok in ((0.9, True), (1.1, False)):
        p = d.astype(np.float64)
        p[2, 1, 2] += frac * bnd[1, 2]
        rep = check_gemm_grouped(A, B, p.astype(np.float32), kind="k", group_sizes=ks)
        assert rep["out"].passed == ok, rep.table()
    # masked: rows past masked_m are padding
    G, mmax, K = 2, 12, 256
    xa = rng.standard_normal((G * mmax, K)).astype(np.float32)
    wb = rng.standard_normal((G * 128, K)).astype(np.float32)
    ad, asf = xte.per_token_cast_to_fp8(xa)
    bd, bsf = xte.per_block_cast_to_fp8(wb)
    qa = xte.as_quantized(np.asarray(ad).reshape(G, mmax, K), np.asarray(asf).reshape(G, mmax, -1),
                          block="1x128")
    qb = xte.as_quantized(np.asarray(bd).reshape(G, 128, K), np.asarray(bsf).reshape(G, 1, -1),
                          block="128x128")
    mm = np.array([7, 0], np.int32)
    before = np.zeros((G, mmax, 128), np.float32)
    d = xte.gemm_grouped(qa, qb, before.copy(), kind="masked", masked_m=mm)
    rep = check_gemm_grouped(qa, qb, d, kind="masked", masked_m=mm, out_before=before)
    assert rep.ok, rep.table()
    assert rep["out.padding_rows"].stats["padding_rows"] == 2 * mmax - 7


# ----------------------------------------------------------------------------- attention

def _attn_case(dtype=BF16, b=1, s=192, h=2, hk=1, d=16, seed=8):
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((b, s, hh, d)).astype(dtype)
                   for hh in (h, hk, hk, h))
    return q, k, v, do


def test_attention_correct_passes():
    q, k, v, do = _attn_case()
    kw = dict(mask="causal", window=(40, -1))
    o, lse = xte.attention_fwd(q, k, v, **kw)
    dq, dk, dv = xte.attention_bwd(q, k, v, o, do, lse, **kw)
    rep = check_attention(q, k, v, o, lse, d_out=do, dq=dq, dk=dk, dv=dv, **kw)
    assert rep.ok and len(rep) == 5, rep.table()
    # the naive computation in the input precision passes its own criterion
    nai = attention_reference(q, k, v, do, prec="naive", **kw)
    rep = check_attention(q, k, v, nai["out"].astype(BF16), nai["lse"], d_out=do,
                          dq=nai["dq"].astype(BF16), dk=nai["dk"].astype(BF16),
                          dv=nai["dv"].astype(BF16), **kw)
    assert rep.ok, rep.table()


def test_attention_naive_is_the_input_precision_computation():
    """The naive reference is FlashAttention's reference with upcast off: fp32 logits and
    softmax, P rounded to the dtype before P V, the output rounded to the dtype; restated."""
    q, k, v, do = _attn_case(s=64, h=1, hk=1, seed=16)
    nai = attention_reference(q, k, v, do, prec="naive")
    q32, k32, v32 = (t[0, :, 0].astype(np.float32) for t in (q, k, v))
    s = (q32 @ k32.T) * np.float32(1 / np.sqrt(np.float32(16)))
    p = np.exp(s - s.max(axis=1, keepdims=True))
    P = (p / p.sum(axis=1, keepdims=True)).astype(BF16).astype(np.float32)
    o = (P @ v32).astype(BF16)
    testing.assert_bitwise_equal(nai["out"][0, :, 0].astype(BF16), o)
    dv = (P.T @ do[0, :, 0].astype(np.float32)).astype(BF16)
    testing.assert_bitwise_equal(nai["dv"][0, :, 0].astype(BF16), dv)


def test_attention_gradient_in_a_worse_order():
    q, k, v, do = _attn_case(s=256, seed=9)
    o, lse = xte.attention_fwd(q, k, v)
    dq, dk, dv = xte.attention_bwd(q, k, v, o, do, lse)
    # dV = P^T dO accumulated query row by query row in bf16 (a running bf16 sum)
    ref = attention_reference(q, k, v, do)
    qf, kf = q.astype(np.float64), k.astype(np.float64)
    s = np.einsum("bqhd,bkhd->bhqk", qf, np.repeat(kf, 2, axis=2)) / np.sqrt(16.0)
    P = np.exp(s - ref["lse"][..., None]).astype(np.float32)
    worse = np.zeros(dv.shape, BF16)
    for h in range(2):
        acc = np.zeros((256, 16), BF16)
        for i in range(256):
            acc = (acc.astype(np.float32) + P[0, h, i][:, None] *
                   do[0, i, h].astype(np.float32)[None, :]).astype(BF16)
        worse[0, :, 0] = (worse[0, :, 0].astype(np.float32) + acc.astype(np.float32)).astype(BF16)
    rep = check_attention(q, k, v, d_out=do, dq=dq, dk=dk, dv=worse)
    v_ = rep["dv"]
    assert not v_.passed, rep.table()
    assert v_.classes == {"beyond 2x the naive error (FlashAttention's criterion)": 1}
    assert v_.stats["ratio_to_naive"] > 2
    assert rep["dq"].passed and rep["dk"].passed


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_attention_thd_softcap_alibi(dtype):
    rng = np.random.default_rng(15)
    cu = np.array([0, 40, 40, 105], np.int32)     # an empty sequence in the middle
    q = rng.standard_normal((105, 4, 16)).astype(dtype)
    k = rng.standard_normal((105, 2, 16)).astype(dtype)
    v = rng.standard_normal((105, 2, 8)).astype(dtype)
    do = rng.standard_normal((105, 4, 8)).astype(dtype)
    kw = dict(layout="thd", mask="causal", softcap=5.0, cu_seqlens_q=cu, cu_seqlens_kv=cu,
              alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625], np.float32))
    o, lse = xte.attention_fwd(q, k, v, **kw)
    dq, dk, dv = xte.attention_bwd(q, k, v, o, do, lse, **kw)
    rep = check_attention(q, k, v, o, lse, d_out=do, dq=dq, dk=dk, dv=dv, **kw)
    assert rep.ok, rep.table()
    # the same outputs judged without the ALiBi claim fail
    kw.pop("alibi_slopes")
    assert not check_attention(q, k, v, o, lse, **kw).ok


def test_attention_fp8_forward():
    rng = np.random.default_rng(23)
    b, sq, h, d = 2, 40, 2, 16
    q8, k8, v8 = (rng.standard_normal((b, sq, h, d)).astype(ml_dtypes.float8_e4m3fn)
                  for _ in range(3))
    ds = [rng.uniform(0.5, 2, (b, h)).astype(np.float32) for _ in range(3)]
    kw = dict(descale_q=ds[0], descale_k=ds[1], descale_v=ds[2], mask="causal")
    for od in ("float32", "bfloat16"):
        o, lse = xte.attention_fwd(q8, k8, v8, out_dtype=od, **kw)
        rep = check_attention(q8, k8, v8, o, lse, **kw)
        assert rep.ok, rep.table()
    # the descale of v left out by the producer
    o2, lse2 = xte.attention_fwd(q8, k8, v8, out_dtype="float32", descale_q=ds[0],
                                 descale_k=ds[1], mask="causal")
    rep = check_attention(q8, k8, v8, o2, lse2, **kw)
    assert not rep["out"].passed and rep["lse"].passed, rep.table()


def test_attention_rows_that_see_no_key():
    # bottom-right causal with more queries than keys: the first rows see no key
    rng = np.random.default_rng(10)
    q = rng.standard_normal((1, 12, 1, 8)).astype(np.float32)
    k = rng.standard_normal((1, 5, 1, 8)).astype(np.float32)
    v = rng.standard_normal((1, 5, 1, 8)).astype(np.float32)
    o, lse = xte.attention_fwd(q, k, v, mask="causal_bottom_right")
    rep = check_attention(q, k, v, o, lse, mask="causal_bottom_right")
    assert rep.ok, rep.table()
    assert rep["lse"].stats["no_key_rows"] == 7
    l2 = np.asarray(lse).copy()
    l2[np.isinf(l2)] = np.inf          # FlashAttention's +inf
    o2 = np.asarray(o).copy()
    o2[0, 0, 0, :] = np.nan
    rep = check_attention(q, k, v, o2, l2, mask="causal_bottom_right")
    assert list(rep["lse"].classes) == [
        "no-key rows: lse +inf (FlashAttention's convention; contract -inf)"]
    assert rep["out"].classes == {"no-key rows: out NaN (contract 0)": 8}


# ----------------------------------------------------------------------------- MoE

def _tie_logits():
    rng = np.random.default_rng(11)
    lg = rng.standard_normal((16, 8)).astype(np.float32)
    # token 3: experts 1 and 6 tie for the last (4th) place
    lg[3] = [3.0, 0.5, 2.5, -1.0, 2.0, -2.0, 0.5, -0.5]
    return lg


@pytest.mark.parametrize("score", ["sigmoid", "softmax"])
def test_router_breaks_ties_the_other_way(score):
    lg = _tie_logits()
    p, m = xte.fused_topk_with_score_function(lg, 4, score_function=score)
    m = np.asarray(m)
    assert m[3, 1] and not m[3, 6]     # the documented rule: the lower index wins
    assert check_router(lg, p, m, topk=4, score_function=score).ok
    m2 = m.copy()
    m2[3, 1], m2[3, 6] = False, True
    p2 = np.asarray(p).copy()
    p2[3, 6], p2[3, 1] = p2[3, 1], 0
    rep = check_router(lg, p2, m2, topk=4, score_function=score)
    v = rep["selection"]
    assert not v.passed and v.classes == {"tie broken toward the higher expert index": 1}
    assert v.examples[0]["token"] == 3
    # with topk indices in place of the map, and a wrong (non-tied) choice
    ti = np.argsort(-np.asarray(lg), axis=1, kind="stable")[:, :4].copy()
    ti[5, 3] = np.argsort(-lg[5])[6]
    rep = check_router(lg, topk_idx=ti, topk=4, score_function=score)
    assert rep["selection"].classes == {"wrong selection": 1}, rep.table()


def test_router_key_rounding_and_group_ties():
    # two logits two ulps apart whose sigmoid keys xte's fp32 orders one way, fp64 the other
    lg = np.array([[0xBF62CC0F, 0xBF62CC0D]], np.uint32).view(np.float32)
    # token 1: keys a few ulps apart that fp32 and fp64 order alike (expert 1 first)
    lg = np.concatenate([lg, np.array([[1.0, 1.0 + 4 * 2.0 ** -23]], np.float32)])
    p, m, s = xte.fused_topk_with_score_function(lg, 1, score_function="sigmoid",
                                                 return_intermediate=True)
    s = np.asarray(s)
    assert s[0, 0] > s[0, 1]
    k64 = 1 / (1 + np.exp(-lg.astype(np.float64)))
    assert k64[0, 0] < k64[0, 1]
    ti = np.array([[1], [0]])          # a producer with exact keys on token 0; wrong on token 1
    rep = check_router(lg, topk_idx=ti, topk=1, score_function="sigmoid")
    assert rep["selection"].classes == {
        "key rounding (fp64 keys side with the producer)": 1,
        "key rounding (fp64 keys side with xte)": 1}, rep.table()
    assert not rep.ok
    assert check_router(lg, topk_idx=ti, topk=1, score_function="sigmoid",
                        allow_key_rounding=True).ok
    # group-limited: groups 0 and 1 tie; the rule keeps group 0
    lg = np.array([[2.0, 1.0, 1.0, 2.0, 0.0, -1.0, -3.0, -2.0]], np.float32)
    kw = dict(topk=2, score_function="sigmoid", num_groups=4, group_topk=1)
    p, m = xte.fused_topk_with_score_function(lg, **kw)
    assert check_router(lg, p, m, **kw).ok
    m2 = np.zeros_like(np.asarray(m))
    m2[0, [2, 3]] = True
    rep = check_router(lg, None, m2, **kw)
    assert rep["selection"].classes == {"group tie order": 1}, rep.table()


def test_router_probs_ulps():
    lg = _tie_logits()
    p, m = xte.fused_topk_with_score_function(lg, 2, score_function="sigmoid")
    p2 = np.asarray(p).copy()
    sel = np.argwhere(np.asarray(m))[0]
    p2[tuple(sel)] = np.nextafter(p2[tuple(sel)], np.float32(2), dtype=np.float32)
    rep = check_router(lg, p2, m, topk=2, score_function="sigmoid")
    assert rep["probs"].classes == {"probs beyond 0 ulps": 1}
    assert check_router(lg, p2, m, topk=2, score_function="sigmoid", prob_ulps=1).ok


def test_permute_bytes():
    rng = np.random.default_rng(12)
    T, E, H = 10, 4, 6
    m = np.zeros((T, E), np.uint8)
    for t in range(T):
        m[t, rng.choice(E, 2, replace=False)] = 1
    x = rng.standard_normal((T, H)).astype(np.float32)
    # the NumPy reference: expert-major, tokens ascending, each expert padded to 4 rows
    rows = []
    for e in range(E):
        toks = np.nonzero(m[:, e])[0]
        rows += [x[t] for t in toks] + [np.zeros(H, np.float32)] * (-len(toks) % 4)
    ref = np.stack(rows)
    assert check_permute(x, m, ref, align=4).ok
    bad = ref.copy()
    bad[[0, 1]] = bad[[1, 0]]
    rep = check_permute(x, m, bad, align=4)
    assert rep["permuted"].classes == {"row order (the row belongs elsewhere)": 2}


# ----------------------------------------------------------------------------- files, CLI

def _arrays():
    x = _x(4, 160)
    q = xte.quantize(x, "te_block")
    mq = xte.quantize(x, "mx_te")
    return {"x": x, "xb": x.astype(BF16), "data": np.asarray(q.data),
            "scale_inv": np.asarray(q.scale_inv),
            "e8m0": np.asarray(mq.scale_inv).view(ml_dtypes.float8_e8m0fnu),
            "e5": x.astype(ml_dtypes.float8_e5m2), "idx": np.arange(5, dtype=np.int64)}


@pytest.mark.parametrize("ext", [".safetensors", "torch.safetensors", "numpy.safetensors",
                                 "raw.safetensors", ".npz", ".pt", ".npy"])
def test_file_round_trips(tmp_path, ext):
    arrays = _arrays()
    if ext in (".pt", "torch.safetensors"):
        pytest.importorskip("torch")
    if ext.endswith(".safetensors") and ext != "raw.safetensors":
        pytest.importorskip("safetensors")
    if ext == "numpy.safetensors":  # the package's NumPy loader: dtypes NumPy names
        arrays = {k: a for k, a in arrays.items() if a.dtype.name in ("float32", "int64")}
    if ext == ".npy":
        for k, a in arrays.items():
            p = tmp_path / f"{k}.npy"
            save(p, {k: a})
            got = load(p, dtypes={k: a.dtype.name})[k]
            testing.assert_bitwise_equal(got, a)
        return
    p = tmp_path / ("t" + ext)
    if ext == "raw.safetensors":  # the NumPy-only writer and reader (no torch)
        from xte.check import _io
        _io._save_safetensors_raw(p, arrays)
        got = _io._safetensors_raw(p)
    else:
        save(p, arrays)
        got = load(p, _reader=ext.split(".")[0] or None)
    assert set(got) == set(arrays)
    for k, a in arrays.items():
        testing.assert_bitwise_equal(got[k], a, msg=k)


def test_live_torch_tensors():
    torch = pytest.importorskip("torch")
    x = _x(8, 256)
    q = xte.quantize(torch.from_numpy(x), "te_block")
    assert isinstance(q.data, torch.Tensor)
    rep = check_quantize(torch.from_numpy(x), q.data, q.scale_inv, "te_block")
    assert rep.ok, rep.table()
    assert rep.notes == []  # CPU tensors: nothing copied


def _write_cases(tmp_path):
    x = _x(8, 256)
    q = xte.quantize(x, "te_block", layout="te_gemm")
    s = np.asarray(q.scale_inv).copy()
    save(tmp_path / "good.safetensors", {"x": x, "data": q.data, "scale_inv": s})
    s2 = s.copy()
    s2.view(np.uint32)[1, 2] ^= np.uint32(1)
    save(tmp_path / "bad.npz", {"x": x, "data": q.data, "scale_inv": s2})
    a, b = _gemm_case(M=8, N=16, K=256)
    d = xte.gemm(a, b, out_dtype="bfloat16")
    save(tmp_path / "gemm.pt" if _have("torch") else tmp_path / "gemm.npz",
         {"a": a[0], "a_scales": a[1], "b": b[0], "b_scales": b[1], "out": d})
    return tmp_path / ("gemm.pt" if _have("torch") else "gemm.npz")


def _have(m):
    import importlib.util
    return importlib.util.find_spec(m) is not None


def test_cli_python_module(tmp_path, capsys):
    pytest.importorskip("safetensors")
    g = _write_cases(tmp_path)
    good = str(tmp_path / "good.safetensors")
    assert cli_main(["quantize", good, "--recipe", "te_block", "--block", "1x128",
                     "--layout", "te_gemm"]) == 0
    out = capsys.readouterr().out
    assert "PASS    quantize  data" in out
    js = tmp_path / "r.json"
    assert cli_main(["quantize", str(tmp_path / "bad.npz"), "--layout", "te_gemm",
                     "--json", str(js), "--quiet"]) == 1
    r = json.loads(js.read_text())
    assert not r["ok"]
    v = {x["name"]: x for x in r["verdicts"]}
    assert v["scale_inv"]["status"] == "FAIL" and v["scale_inv"]["classes"] == {
        "scale bit flip": 1}
    assert cli_main(["gemm", str(g), "--mode", "exact"]) == 0
    assert cli_main(["quantize", good, "--data", "missing"]) == 2
    # attention, router, permute from .npz files
    q, k, v, do = _attn_case(s=64, seed=19)
    o, lse = xte.attention_fwd(q, k, v, mask="causal")
    save(tmp_path / "attn.npz", {"q": q, "k": k, "v": v, "out": o, "lse": lse})
    assert cli_main(["attention", str(tmp_path / "attn.npz"), "--mask", "causal"]) == 0
    assert cli_main(["attention", str(tmp_path / "attn.npz")]) == 1  # not the mask it used
    lg = _tie_logits()
    p, m = xte.fused_topk_with_score_function(lg, 4, score_function="sigmoid")
    m2 = np.asarray(m).copy()
    m2[3, 1], m2[3, 6] = False, True
    save(tmp_path / "router.npz", {"logits": lg, "probs": p, "routing_map": m2})
    capsys.readouterr()
    assert cli_main(["router", str(tmp_path / "router.npz"), "--topk", "4",
                     "--score-function", "sigmoid", "--quiet"]) == 1
    assert "tie broken toward the higher expert index" in capsys.readouterr().out
    x = _x(16, 8)
    perm, _ = xte.moe_permute(x, np.asarray(m).astype(np.uint8), align=4)
    save(tmp_path / "perm.npz", {"inp": x, "routing_map": np.asarray(m), "out": perm})
    assert cli_main(["permute", str(tmp_path / "perm.npz"), "--align", "4"]) == 0


def _xte_bin():
    b = os.environ.get("XTE_BIN")
    if not b and os.environ.get("XTE_LIBRARY"):
        b = os.path.join(os.path.dirname(os.environ["XTE_LIBRARY"]), "xte")
    if not b or not os.access(b, os.X_OK):
        return None
    if os.environ.get("XTE_BIN"):  # ctest's own build: it must have the command
        return b
    helped = subprocess.run([b, "help"], capture_output=True, text=True, timeout=60).stdout
    return b if " check " in helped else None  # a program built before `xte check`: skip


def test_cli_xte_program(tmp_path):
    pytest.importorskip("safetensors")
    b = _xte_bin()
    if b is None:
        pytest.skip("no built xte program (XTE_BIN, or xte next to XTE_LIBRARY)")
    _write_cases(tmp_path)
    env = dict(os.environ, XTE_PYTHON=sys.executable)
    r = subprocess.run([b, "check", "quantize", str(tmp_path / "good.safetensors"),
                        "--recipe", "te_block", "--block", "1x128", "--layout", "te_gemm",
                        "--json", "-"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ok"] is True
    r = subprocess.run([b, "check", "quantize", str(tmp_path / "bad.npz"), "--layout",
                        "te_gemm", "--quiet"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "FAIL quantize scale_inv" in r.stdout, r.stdout + r.stderr
    # without PYTHONPATH / XTE_LIBRARY: the package from the source tree the program was built
    # from, the library it runs on (dladdr)
    bare = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "XTE_LIBRARY")}
    r = subprocess.run([b, "check", "quantize", str(tmp_path / "good.safetensors"), "--layout",
                        "te_gemm", "--quiet"], env=bare, capture_output=True, text=True,
                       timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0 and "PASS quantize data" in r.stdout, r.stdout + r.stderr
    # no interpreter: a clear message, status 2
    r = subprocess.run([b, "check", "quantize"], env=dict(env, XTE_PYTHON="/nonexistent/py"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cannot run the Python interpreter" in r.stderr


def test_unpermute_ulps():
    rng = np.random.default_rng(14)
    T, E, H = 12, 4, 8
    m = np.zeros((T, E), np.uint8)
    for t in range(T):
        m[t, rng.choice(E, 2, replace=False)] = 1
    probs = (rng.uniform(0, 1, (T, E)) * m).astype(np.float32)
    x = rng.standard_normal((T, H)).astype(np.float32)
    perm, rid = xte.moe_permute(x, m)
    eo = (np.asarray(perm) * 3).astype(np.float32)
    out = np.asarray(xte.moe_unpermute(eo, rid, probs))
    assert check_unpermute(eo, m, out, probs).ok
    bad = out.copy()
    bad[4, 2] = np.nextafter(bad[4, 2], np.float32(np.inf), dtype=np.float32)
    bad[4, 2] = np.nextafter(bad[4, 2], np.float32(np.inf), dtype=np.float32)
    rep = check_unpermute(eo, m, bad, probs)
    assert rep["unpermuted"].classes == {"beyond 0 ulps of xte": 1}, rep.table()
    assert check_unpermute(eo, m, bad, probs, ulps=2).ok


def test_aux_loss_and_report_json():
    rng = np.random.default_rng(20)
    T, E, k = 64, 8, 2
    probs = rng.uniform(0, 1, (T, E)).astype(np.float32)
    tpe = rng.integers(0, 20, E).astype(np.int64)
    aux = np.asarray(xte.fused_moe_aux_loss(probs, tpe, T, E, k, 0.01))
    rep = check_aux_loss(probs, tpe, T, E, k, 0.01, aux)
    assert rep.ok, rep.table()
    # TE's PyTorch formula in fp32 (another summation order): a few ulps off xte's bytes
    other = np.float32(np.float32(E * 0.01 / (k * T * T)) *
                       np.sum(probs.sum(axis=0, dtype=np.float32) * tpe.astype(np.float32)))
    rep = check_aux_loss(probs, tpe, T, E, k, 0.01, other, ulps=8)
    assert rep.ok, rep.table()
    bad = np.float32(aux * np.float32(1.001))
    rep = check_aux_loss(probs, tpe, T, E, k, 0.01, bad, ulps=8)
    assert rep["aux_loss"].classes == {"beyond 8 ulps": 1}
    # the JSON report is strict JSON (no NaN / inf literals) and carries every verdict
    q, kk, v, _ = _attn_case(s=8, seed=21)
    o, lse = xte.attention_fwd(q, kk, v)
    rep.extend(check_attention(q, kk, v, o, lse))
    js = json.loads(rep.to_json())
    assert [x["name"] for x in js["verdicts"]] == ["aux_loss", "out", "lse"]
    assert js["ok"] is False and js["verdicts"][1]["status"] == "PASS"


@pytest.mark.parametrize("score,pre", [("softmax", True), ("softmax", False), ("sigmoid", False),
                                       ("sqrtsoftplus", False)])
def test_router_backward(score, pre):
    pytest.importorskip("torch")
    rng = np.random.default_rng(22)
    lg = rng.standard_normal((16, 8)).astype(np.float32)
    gp = rng.standard_normal((16, 8)).astype(np.float32)
    kw = dict(topk=3, score_function=score, use_pre_softmax=pre, scaling_factor=1.5)
    _, m, saved = xte.fused_topk_with_score_function(lg, 3, use_pre_softmax=pre,
                                                     scaling_factor=1.5, score_function=score,
                                                     return_intermediate=True)
    g = np.asarray(xte.fused_topk_with_score_function_backward(
        np.asarray(m).astype(np.uint8), saved, gp, 3, use_pre_softmax=pre, scaling_factor=1.5,
        score_function=score, logits=lg))
    rep = check_router_backward(lg, gp, g, **kw)
    v = rep["grad_logits"]
    assert v.passed, rep.table()
    assert v.stats["xte_error_fp64"] < 1e-5 * max(1.0, np.abs(g).max())
    bad = g.copy()
    bad[2, 3] += np.float32(1e-3)
    rep = check_router_backward(lg, gp, bad, **kw)
    assert rep["grad_logits"].classes == {"beyond 0 ulps of xte": 1}, rep.table()
