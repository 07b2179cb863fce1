# ctest: no-isa-variants (NumPy oracles and comparison helpers: no xte kernel runs)
"""xte.testing itself: calc_diff as DeepGEMM defines it, assert_bitwise_equal's failures and
messages, and the NumPy reference quantizers on hand-worked values from docs/numerics.md (so an
oracle bug cannot hide behind agreement with the library)."""

import ml_dtypes
import numpy as np
import pytest

from xte import testing as T

E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu


def test_calc_diff_numpy():
    x = np.array([1.0, 2.0, 3.0], np.float32)
    assert T.calc_diff(x, x) == 0.0
    assert T.calc_diff(x, -x) == 2.0
    y = np.array([1.0, 2.0, 4.0])
    want = 1 - 2 * (1 + 4 + 12) / ((1 + 4 + 9) + (1 + 4 + 16))
    assert T.calc_diff(x, y) == pytest.approx(want, abs=1e-15)


def test_calc_diff_torch():
    torch = pytest.importorskip("torch")
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    y = np.array([1.0, 2.0, 4.0])
    assert T.calc_diff(x, y) == pytest.approx(T.calc_diff(np.array([1.0, 2.0, 3.0]), y))
    assert isinstance(T.calc_diff(x, x), float)


def test_assert_bitwise_equal():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    T.assert_bitwise_equal(a, a.copy())
    b = a.copy()
    b[2, 1] = -0.0 if b[2, 1] == 0 else b[2, 1] + 1
    with pytest.raises(AssertionError, match=r"first at index \(2, 1\)"):
        T.assert_bitwise_equal(a, b, "case")
    z = np.zeros(4, np.float32)
    nz = z.copy()
    nz[3] = -0.0                       # equal as numbers, not as bytes
    with pytest.raises(AssertionError, match=r"index \(3,\)"):
        T.assert_bitwise_equal(z, nz)
    with pytest.raises(AssertionError, match="shapes"):
        T.assert_bitwise_equal(a, a.reshape(4, 3))
    with pytest.raises(AssertionError, match="dtypes"):
        T.assert_bitwise_equal(a, a.view(np.int32))
    n1 = np.array([np.nan], np.float32)
    T.assert_bitwise_equal(n1, n1.copy())            # same NaN bytes are equal
    T.assert_bitwise_equal(np.zeros((0, 3), E4M3), np.zeros((0, 3), E4M3))


def test_assert_bitwise_equal_torch_numpy():
    torch = pytest.importorskip("torch")
    t = torch.tensor([[1.0, 2.5], [3.0, -4.0]], dtype=torch.bfloat16)
    n = np.array([[1.0, 2.5], [3.0, -4.0]], np.float32).astype(ml_dtypes.bfloat16)
    T.assert_bitwise_equal(t, n)
    n[1, 0] = 3.5
    with pytest.raises(AssertionError, match=r"\(1, 0\)"):
        T.assert_bitwise_equal(t, n)
    f8 = torch.tensor([1.0, -448.0]).to(torch.float8_e4m3fn)
    T.assert_bitwise_equal(f8, np.array([1.0, -448.0], np.float32).astype(E4M3))


def test_reference_fp8_rules():
    x = np.array([464, 465, 480, np.inf, -np.inf, 2.0 ** -10, 3 * 2.0 ** -10, -0.0,
                  2.0 ** -9 * 0.5000001], np.float32)
    sat = T.reference_fp8(x, "e4m3", True).view(np.uint8)
    assert list(sat) == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x00, 0x02, 0x80, 0x01]
    nsat = T.reference_fp8(x, "e4m3", False).view(np.uint8)
    assert list(nsat[:5]) == [0x7E, 0x7F, 0x7F, 0x7F, 0xFF]
    nan = np.array([np.nan, -np.float32(np.nan)], np.float32)
    assert list(T.reference_fp8(nan, "e4m3").view(np.uint8)) == [0x7F, 0xFF]
    assert list(T.reference_fp8(nan, "e5m2").view(np.uint8)) == [0x7E, 0xFE]
    y = np.array([61439, 61440, np.inf], np.float32)
    assert list(T.reference_fp8(y, "e5m2", True).view(np.uint8)) == [0x7B, 0x7B, 0x7B]
    assert list(T.reference_fp8(y, "e5m2", False).view(np.uint8)) == [0x7B, 0x7C, 0x7C]


def test_reference_te_block_by_hand():
    # amax 3: scale 448/3 = 149.33 -> pow2 128 -> scale_inv 1/128; 3 * 128 = 384 (code 0x7C)
    x = np.zeros((1, 130), np.float32)
    x[0, 5] = -3.0
    x[0, 7] = np.nan                   # never wins the amax
    x[0, 129] = 1e-45                  # second block: 448 / 1e-45 = inf -> FLT_MAX -> 2^127
    d, s = T.reference_quantize(x, "te_block", "1x128")
    assert s.shape == (1, 2) and s[0, 0] == np.float32(1 / 128) and s[0, 1] == 2.0 ** -127
    assert d.view(np.uint8)[0, 5] == 0xFC and d.view(np.uint8)[0, 7] == 0x7F
    d, s = T.reference_quantize(x, "te_block", "1x128", force_pow_2=False)
    assert s[0, 0] == np.float32(1) / (np.float32(448) / np.float32(3))
    assert s[0, 1] == np.float32(1) / np.finfo(np.float32).max
    xb = x.astype(ml_dtypes.bfloat16)  # 1e-45 is 0 in bf16: the block's amax 0 -> scale 1
    _, s = T.reference_quantize(xb, "te_block", "1x128", force_pow_2=False)
    assert s[0, 1] == 1.0
    xh = np.zeros((1, 1), np.float16)
    xh[0, 0] = 2.0 ** -24              # fp16 subnormal: 448 * 2^24 finite, no clamp
    _, s = T.reference_quantize(xh, "te_block", "1x128", force_pow_2=False)
    assert s[0, 0] == np.float32(1) / (np.float32(448) / np.float32(2.0 ** -24))
    _, s = T.reference_quantize(np.full((1, 4), 3.0, np.float32), "te_block", "1x128",
                                amax_epsilon=10.0)
    assert s[0, 0] == np.float32(1 / 32)          # 448/10 = 44.8 -> 32


def test_reference_te_block_128x128_tiles():
    x = np.ones((130, 129), np.float32)
    x[129, 128] = 7.0                  # the last tile's amax
    x[0, 0] = 2.0
    d, s = T.reference_quantize(x, "te_block", "128x128")
    assert s.shape == (2, 2)
    assert s[0, 0] == np.float32(1 / 128) and s[1, 1] == np.float32(1 / 64)
    assert s[0, 1] == np.float32(1 / 256) and s[1, 0] == np.float32(1 / 256)
    dc, sc = T.reference_quantize(x, "te_block", "128x128", columnwise=True)
    assert dc.shape == (129, 130) and np.array_equal(dc.view(np.uint8), d.view(np.uint8).T)
    assert np.array_equal(sc, s.T)


def test_reference_deepgemm_by_hand():
    x = np.zeros((2, 3), np.float32)
    x[0] = [1.0, -448.0 * 3, 2.0]
    _, s = T.reference_quantize(x, "deepgemm", "1x128")
    assert s[0, 0] == np.float32(1344) / np.float32(448) and s[1, 0] == np.float32(1e-4) / np.float32(448)
    _, s = T.reference_quantize(x, "deepgemm_ue8m0", "1x128")
    assert s[0, 0] == 4.0                              # 3 rounded up
    assert s[1, 0] == 2.0 ** -22                       # 2.2e-7 rounded up to 2^-22


def test_reference_mx_by_hand():
    x = np.zeros((1, 64), np.float32)
    x[0, 0] = 448.0        # TE: 448 * fp32(1/448) = 1.0000000x or 1 -> e; OCP: floor(log2 448)=8
    x[0, 32] = 1.0
    d, s = T.reference_quantize(x, "mx_te", "1x32")
    codes = s.view(np.uint8)
    one = np.float32(448) * (np.float32(1) / np.float32(448))
    assert codes[0, 0] == (127 if one == 1.0 else 128)
    # 1 * fp32(1/448): exponent of 2^-9 .. with a non-zero significand -> 127 - 9 + 1 = 119
    assert codes[0, 1] == 119
    d, s = T.reference_quantize(x, "mx_ocp", "1x32")
    assert list(s.view(np.uint8)[0]) == [127, 127 - 8]
    assert d.astype(np.float32)[0, 32] == 256.0        # 1 * 2^8
    z = np.zeros((2, 32), np.float32)
    z[1, 0] = np.inf
    _, s = T.reference_quantize(z, "mx_ocp", "1x32")
    assert list(s.view(np.uint8)[:, 0]) == [0, 254]
    _, s = T.reference_quantize(z, "mx_te", "1x32")
    assert list(s.view(np.uint8)[:, 0]) == [0, 0xFE]


def test_reference_swizzle_positions():
    """Every grid entry lands where the 128x4-tile formula puts it (a direct loop)."""
    R, C = 130, 6
    g = (np.arange(R * C) % 251 + 1).astype(np.uint8).reshape(R, C)
    sw = T.reference_scale_layout(g, "1xB", "mx_swizzled")
    assert sw.shape == (256, 8)
    flat = sw.reshape(-1)
    tiles_per_row = 8 // 4
    for r in range(R):
        for c in range(C):
            tile = (r // 128) * tiles_per_row + c // 4
            rr, cc = r % 128, c % 4
            assert flat[tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + cc] == g[r, c]
    assert int((flat != 0).sum()) == R * C             # padding is zero
    te = T.reference_scale_layout(g.astype(np.float32), "1xB", "te_gemm")
    assert te.shape == (6, 132) and te[4, 129] == g[129, 4] and te[0, 130] == 0
    blk = T.reference_scale_layout(g.astype(np.float32)[:3, :5], "128x128", "te_gemm")
    assert blk.shape == (3, 8) and blk[2, 4] == g[2, 4]
    assert T.reference_scale_layout(g, "128x128", "deepgemm").shape == (130, 6)


def test_reference_dequantize_by_hand():
    d = np.array([[1.0, -2.0, 448.0]], np.float32).astype(E4M3)
    s = np.array([[0.5]], np.float32)
    out = T.reference_dequantize(d, s, "1xB", "1x128")
    assert list(out[0]) == [0.5, -1.0, 224.0]
    e = np.array([[130]], np.uint8).view(E8M0)
    out = T.reference_dequantize(d, e, "1xB", "1x32")
    assert list(out[0]) == [8.0, -16.0, 3584.0]
