# ctest: no-isa-variants (self-tests of the oracle: no xte call depends on the CPU ISA)
"""The exact-GEMM oracle of the GEMM tests, written from docs/numerics.md section 6 (not from
the C code), plus the operand builders the other test_gemm*.py files share, and self-tests of
the oracle's rounding.

Contract, per output element (m, n):
    acc = +0.0f
    for each K block b (KB = 128, 32 for MXFP8; the last block may be shorter):
        p   = RNE_fp32(exact sum_{k in b} a[m, k] * b[n, k])
        s   = RNE_fp32(sa[m, b] * sb[n, b])
        acc = fmaf(p, s, acc)
    t = acc; accumulate: t = RNE_fp32(t + C[m, n]); bias: t = RNE_fp32(t + bias[n])
    D = RNE_out(t), NaN written as the canonical quiet NaN.
The oracle computes the exact block sums in integers (fp8 values times 2^9 (e4m3) / 2^16 (e5m2)
are integers), every rounding from exact rationals (fractions.Fraction), NaN / inf by IEEE fp64
arithmetic, and the bf16 rounding with ml_dtypes.
"""

import math
from fractions import Fraction

import ml_dtypes
import numpy as np

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
BF16 = np.dtype(ml_dtypes.bfloat16)
_SHIFT = {E4M3: 9, E5M2: 16}  # 2^shift * value is an integer for every finite code
INF = float("inf")

# ------------------------------------------------------------------------------- rounding


def rne_f32(x):
    """The fp32 value nearest to the rational x (ties to even), as a Python float; overflow to
    +-inf (RNE: from the midpoint 2^128 - 2^103 up), subnormals down to 2^-149."""
    x = Fraction(x)
    if x == 0:
        return 0.0
    neg = x < 0
    if neg:
        x = -x
    n, d = x.numerator, x.denominator
    e = n.bit_length() - d.bit_length()  # 2^(e-1) < x < 2^(e+1)
    if (n << max(-e, 0)) < (d << max(e, 0)):
        e -= 1  # now 2^e <= x < 2^(e+1)
    e = max(e, -126)
    qe = e - 23  # the fp32 quantum at x's binade (2^-149 below the normal range)
    num, den = (n, d << qe) if qe >= 0 else (n << -qe, d)
    q, r = divmod(num, den)
    if 2 * r > den or (2 * r == den and q & 1):
        q += 1
    v = math.ldexp(q, qe) if qe < 1000 else INF
    if v >= 2.0 ** 128:
        v = INF
    return -v if neg else v


def f32(x):
    """RNE of a Python float (fp64) to fp32."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def _add(x, y):
    """RNE_fp32(x + y) of two fp32 values (IEEE specials)."""
    if math.isfinite(x) and math.isfinite(y):
        return rne_f32(Fraction(x) + Fraction(y))
    return f32(x + y)


def fmaf(p, s, acc):
    """fp32 fused multiply-add: RNE_fp32(p * s + acc) of the exact value (IEEE specials)."""
    if math.isfinite(p) and math.isfinite(s) and math.isfinite(acc):
        return rne_f32(Fraction(p) * Fraction(s) + Fraction(acc))
    with np.errstate(invalid="ignore"):
        return f32(p * s + acc)


# ------------------------------------------------------------------------------- the oracle


def decode(codes, fmt):
    """fp64 values of uint8 fp8 codes (ml_dtypes decoding)."""
    return np.asarray(codes, np.uint8).view(fmt).astype(np.float64)


def block_partials(qa, fa, qb, fb, kb):
    """p[m, n, b] (fp32 values in fp64) of op(A) codes qa [M, K] (format fa) and op(B) codes
    qb [N, K]: the exact block sum rounded once; NaN / inf as IEEE."""
    va, vb = decode(qa, fa), decode(qb, fb)
    M, K = va.shape
    N = vb.shape[0]
    nb = -(-K // kb)
    fin_a, fin_b = np.isfinite(va), np.isfinite(vb)
    ia = np.where(fin_a, va * 2.0 ** _SHIFT[fa], 0).astype(np.int64)
    ib = np.where(fin_b, vb * 2.0 ** _SHIFT[fb], 0).astype(np.int64)
    sh = _SHIFT[fa] + _SHIFT[fb]
    p = np.zeros((M, N, nb))
    for b in range(nb):
        ks = slice(b * kb, min(K, (b + 1) * kb))
        exact = ia[:, ks] @ ib[:, ks].T  # int64: below 2^57 for 128 products
        sa_bad = ~fin_a[:, ks].all(axis=1)
        sb_bad = ~fin_b[:, ks].all(axis=1)
        for m in range(M):
            for n in range(N):
                if sa_bad[m] or sb_bad[n]:
                    with np.errstate(invalid="ignore"):
                        prod = va[m, ks] * vb[n, ks]
                    if np.isnan(prod).any() or (np.isposinf(prod).any() and np.isneginf(prod).any()):
                        p[m, n, b] = np.nan
                        continue
                    if np.isinf(prod).any():
                        p[m, n, b] = prod[np.isinf(prod)][0]
                        continue
                    # infinities only in the other operand's zero-free... (cannot reach here)
                p[m, n, b] = _partial(int(exact[m, n]), sh)
    return p


def _partial(n, sh):
    """RNE_fp32(n * 2^-sh) of an integer n: exact through fp64 below 2^53 (one rounding, to
    fp32), from the exact rational above."""
    if abs(n) < 2 ** 53:
        return f32(math.ldexp(float(n), -sh))
    return rne_f32(Fraction(n, 1 << sh))


def _round_sum(x, y):
    """RNE_fp32(x + y) elementwise for fp64 arrays x, y whose exact sum is wanted: the fp64 sum h
    rounded to fp32 is that whenever h is exact (TwoSum error 0) or h is not the midpoint of two
    fp32 neighbours (a double rounding can only go wrong from a midpoint); the remaining
    elements (and the overflow threshold) are rounded from exact rationals."""
    with np.errstate(invalid="ignore", over="ignore"):
        h = x + y
        bb = h - x
        lo = (x - (h - bb)) + (y - bb)
        r = h.astype(np.float32)
        r64 = r.astype(np.float64)
        r2 = np.nextafter(r, np.where(h > r64, np.float32(INF), np.float32(-INF))).astype(np.float64)
        mid = (r64 + r2) / 2
    fin = np.isfinite(x) & np.isfinite(y)
    fix = fin & (lo != 0) & ((h == mid) | (np.abs(h) == 2.0 ** 128 - 2.0 ** 103))
    out = r.astype(np.float64)
    for i in zip(*np.nonzero(fix)):
        out[i] = rne_f32(Fraction(float(x[i])) + Fraction(float(y[i])))
    return out


def gemm_oracle(qa, fa, sa, qb, fb, sb, kb, c=None, bias=None, out="float32"):
    """D bytes of the exact contract. qa [M, K] / qb [N, K]: op(A) / op(B) fp8 codes (uint8) in
    formats fa / fb; sa [M, nb] / sb [N, nb]: the scale_inv of every (row, K block) as fp32
    values; c: [M, N] values (fp32 or bf16 array) or None; bias: fp32 [N] or None."""
    M, N = qa.shape[0], qb.shape[0]
    p = block_partials(qa, fa, qb, fb, kb)
    nb = p.shape[2]
    sa = np.asarray(sa, np.float64).reshape(M, nb)
    sb = np.asarray(sb, np.float64).reshape(N, nb)
    cv = None if c is None else np.asarray(c).astype(np.float64)
    bv = None if bias is None else np.asarray(bias, np.float32).astype(np.float64)
    acc = np.zeros((M, N))
    for b in range(nb):
        with np.errstate(over="ignore", invalid="ignore"):
            # the fp64 product of two fp32 values is exact; then one rounding to fp32
            s = (sa[:, b, None] * sb[None, :, b]).astype(np.float32).astype(np.float64)
            # fmaf: p * s is exact in fp64 (24 + 24 bits), then one rounding of prod + acc
            prod = p[:, :, b] * s
        acc = _round_sum(prod, acc)
    if cv is not None:
        acc = _round_sum(acc, cv)
    if bv is not None:
        acc = _round_sum(acc, np.broadcast_to(bv[None, :], acc.shape))
    t = acc.astype(np.float32)
    if out in ("float32", np.float32):
        d = t.copy()
        d.view(np.uint32)[np.isnan(t)] = 0x7FC00000
    else:
        d = t.astype(BF16)
        d.view(np.uint16)[np.isnan(t)] = 0x7FC0
    return d


# ------------------------------------------------------------------------------- operands
# A test operand is described by its op() form: codes [R, K] (uint8), a format, a mode and the
# scale grid of op() ([R, nb] for 1x128 and 1x32 (E8M0 bytes), [ceil(R/128), nb] for 128x128,
# [1, 1] for per-tensor). The builders below store it as a QuantizedTensor or a DeepGEMM pair,
# op() = X (not transposed) or op() = X^T (transposed: X [K, R] is what was quantized).

KB = {"1x128": 128, "128x128": 128, "per_tensor": 128, "1x32": 32}


def rand_codes(rng, shape, fmt, specials=False):
    """Random finite fp8 codes (all exponents, subnormals, both signs); with specials, a few
    NaN (and inf for e5m2) codes."""
    if fmt == E4M3:
        c = rng.integers(0, 0x7F, size=shape)  # 0x00..0x7E: zero, subnormals, normals
    else:
        c = rng.integers(0, 0x7C, size=shape)  # e5m2 finite
    c = (c | (rng.integers(0, 2, size=shape) << 7)).astype(np.uint8)
    if specials:
        flat = c.reshape(-1)
        idx = rng.choice(flat.size, size=max(1, flat.size // 200), replace=False)
        sp = np.array([0x7F, 0xFF] if fmt == E4M3 else [0x7C, 0xFC, 0x7E], np.uint8)
        flat[idx] = rng.choice(sp, size=idx.size)
    return c


def rand_grid(rng, mode, R, K, lo=-12, hi=12):
    """A scale grid of op() [R, K]: fp32 scale_inv with random exponents and mantissas (E8M0
    bytes for 1x32)."""
    kb = KB[mode]
    nb = -(-K // kb)
    if mode == "1x32":
        return rng.integers(127 + lo, 127 + hi, size=(R, nb)).astype(np.uint8)
    shape = {"1x128": (R, nb), "128x128": (-(-R // 128), nb), "per_tensor": (1, 1)}[mode]
    m = rng.uniform(1.0, 2.0, size=shape)
    e = rng.integers(lo, hi, size=shape)
    return np.ldexp(m, e).astype(np.float32)


def row_scales(mode, grid, R, K):
    """sa[r, b] (fp64 values of fp32 / E8M0) of op() from its grid."""
    nb = -(-K // KB[mode])
    if mode == "1x32":
        return np.asarray(grid, np.uint8).view(E8M0).astype(np.float64)
    g = np.asarray(grid, np.float64)
    if mode == "1x128":
        return g
    if mode == "128x128":
        return g[np.arange(R) // 128]
    return np.full((R, nb), g.reshape(-1)[0])


def fp8_array(codes, fmt):
    return np.ascontiguousarray(np.asarray(codes, np.uint8)).view(fmt)


def make_q(codes, fmt, mode, grid, transposed, rng=None):
    """QuantizedTensor holding op() = codes [R, K] (transposed: it quantized X = codes^T). Where
    the copy read is the columnwise one, the rowwise copy is there too, with decoy scales, so a
    wrong choice of copy changes the result."""
    import xte
    rng = rng or np.random.default_rng(1)
    codes = np.asarray(codes, np.uint8)
    R, K = codes.shape
    if mode == "1x32":
        grid = np.asarray(grid, np.uint8).view(E8M0)
    recipe = {"1x128": "te_block", "128x128": "te_block", "per_tensor": "te_current",
              "1x32": "mx_te"}[mode]
    kw = dict(scaling_mode=mode, recipe=recipe, layout="compact")
    if not transposed:
        if mode in ("1x128", "1x32"):  # decoy columnwise copy as well
            if mode == "1x128":
                cw, cs = fp8_array(codes.T, fmt), rand_grid(rng, mode, K, R)  # [K, R]
            else:
                cw = fp8_array(codes, fmt)  # MX columnwise keeps [R, K], 32x1 blocks
                cs = np.ascontiguousarray(rng.integers(120, 134, size=(-(-R // 32), K))
                                          .astype(np.uint8)).view(E8M0)
            kw.update(columnwise_data=cw, columnwise_scale_inv=cs)
        return xte.QuantizedTensor(fp8_array(codes, fmt), np.ascontiguousarray(grid), **kw)
    X = fp8_array(codes.T, fmt)  # [K, R]
    if mode == "1x128":
        # columnwise copy = X^T = op() [R, K], 1x128 along K; rowwise X with decoy scales
        return xte.QuantizedTensor(X, rand_grid(rng, mode, K, R),
                                   columnwise_data=fp8_array(codes, fmt),
                                   columnwise_scale_inv=np.ascontiguousarray(grid), **kw)
    if mode == "1x32":
        # columnwise copy keeps X's shape [K, R], 32x1 blocks: grid^T [nb, R]
        decoy = np.ascontiguousarray(rng.integers(120, 134, size=(K, -(-R // 32)))
                                     .astype(np.uint8)).view(E8M0)
        return xte.QuantizedTensor(X, decoy, columnwise_data=X,
                                   columnwise_scale_inv=np.ascontiguousarray(grid.T), **kw)
    # 128x128 / per-tensor: the rowwise copy of X fits (tile grid transposed)
    return xte.QuantizedTensor(X, np.ascontiguousarray(np.asarray(grid).T), **kw)


def make_pair(codes, fmt, mode, grid, transposed):
    """DeepGEMM (data, scales) storage of op() = codes [R, K]: K-major (data [R, K], scales as
    the grid) or, transposed, MN-major (data [K, R], the grid transposed)."""
    codes = np.asarray(codes, np.uint8)
    g = np.asarray(grid)
    if mode == "1x32":
        g = g.astype(np.uint8).view(E8M0)
    if transposed:
        return fp8_array(codes.T, fmt), np.ascontiguousarray(g.T)
    return fp8_array(codes, fmt), np.ascontiguousarray(g)


# ------------------------------------------------------------------------------- self-tests


def test_rne_f32_against_numpy_on_doubles():
    """rne_f32 on fp64 inputs equals NumPy's fp64 -> fp32 cast (a single RNE rounding)."""
    rng = np.random.default_rng(7)
    xs = np.concatenate([
        np.ldexp(rng.uniform(-2, 2, 3000), rng.integers(-160, 130, 3000)),
        np.ldexp(np.array([1 + 2.0 ** -24, 1 + 3 * 2.0 ** -24, 1 - 2.0 ** -25, 1.5]), 0),
        np.array([2.0 ** -150, 3 * 2.0 ** -151, 2.0 ** -149 * 2.5, 2.0 ** 128 - 2.0 ** 103,
                  2.0 ** 128 - 2.0 ** 104, -(2.0 ** 128)]),
    ])
    with np.errstate(over="ignore"):
        want = xs.astype(np.float32)
    got = np.array([rne_f32(Fraction(float(x))) for x in xs], np.float32)
    assert np.array_equal(got.view(np.uint32) & 0x7FFFFFFF, want.view(np.uint32) & 0x7FFFFFFF)
    assert np.array_equal(np.signbit(got[got != 0]), np.signbit(want[got != 0]))


def test_fmaf_is_fused():
    """fmaf rounds once: (1 + 2^-12)^2 - (1 + 2^-11) = 2^-24 exactly (a separate multiply
    would round the square to 1 + 2^-11 and give 0)."""
    a = 1 + 2.0 ** -12
    assert fmaf(a, a, -(1 + 2.0 ** -11)) == 2.0 ** -24
    assert f32(a * a) - (1 + 2.0 ** -11) == 0.0
    assert math.isnan(fmaf(INF, 0.0, 1.0))
    assert fmaf(INF, 2.0, 1.0) == INF


def test_round_sum_is_one_rounding_of_the_exact_sum():
    """_round_sum (the vectorised fmaf / add) against rne_f32 of the exact rational, on random
    products of fp32 values plus fp32 values, and on double-rounding traps: 1 + 2^-24 (an fp32
    midpoint) plus 2^-80 must round up, minus 2^-80 down."""
    rng = np.random.default_rng(3)
    n = 4000
    p = np.ldexp(rng.uniform(-2, 2, n), rng.integers(-30, 30, n)).astype(np.float32)
    sc = np.ldexp(rng.uniform(1, 2, n), rng.integers(-140, 60, n)).astype(np.float32)
    acc = np.ldexp(rng.uniform(-2, 2, n), rng.integers(-150, 60, n)).astype(np.float32)
    x = p.astype(np.float64) * sc.astype(np.float64)
    y = acc.astype(np.float64)
    x = np.concatenate([x, [1 + 2.0 ** -24, 1 + 2.0 ** -24, 2.0 ** -149 * 1.5, 2.0 ** 127]])
    y = np.concatenate([y, [2.0 ** -80, -(2.0 ** -80), 2.0 ** -200, 2.0 ** 127]])
    got = _round_sum(x, y)
    want = np.array([rne_f32(Fraction(float(a)) + Fraction(float(b))) for a, b in zip(x, y)])
    assert np.array_equal(got, want)
    assert got[-4] == 1 + 2.0 ** -23 and got[-3] == 1.0 and got[-1] == INF
    assert f32(x[-4] + y[-4]) == 1.0  # the naive fp64 sum would have double-rounded


def test_block_partial_rounds_the_exact_sum_once():
    """2^17 + 2^-7 + 2^-18 (products of e4m3 codes): the exact sum is above the midpoint
    2^17 + 2^-7 and rounds up to 2^17 + 2^-6; adding in fp32 one term at a time would tie to
    2^17 first and stay there."""
    qa = np.array([[0x78, 0x78, 0x04, 0x01]], np.uint8)  # 256, 256, 2^-7, 2^-9
    qb = np.array([[0x78, 0x78, 0x38, 0x01]], np.uint8)  # 256, 256, 1, 2^-9
    assert list(decode(qa, E4M3)[0]) == [256, 256, 2.0 ** -7, 2.0 ** -9]
    p = block_partials(qa, E4M3, qb, E4M3, 128)
    assert p[0, 0, 0] == 2.0 ** 17 + 2.0 ** -6
    assert f32(f32(2.0 ** 17 + 2.0 ** -7) + 2.0 ** -18) == 2.0 ** 17


# ------------------------------------------------------------------------------- C quantize


def c_quantize(x, mode, recipe, layout, columnwise=True, fmt="e4m3"):
    """x (fp32 NumPy [M, K]) quantized by the C library's xte_quantize, called directly through
    the binding (independent of xte.quantize), into a QuantizedTensor with both copies."""
    import ctypes

    import xte
    from xte._lib import Recipe, lib
    from xte._qtensor import parse_layout, parse_mode, parse_recipe, qview
    from xte._tensor import view

    m, r, lay = parse_mode(mode), parse_recipe(recipe), parse_layout(layout)
    M, K = x.shape
    f8 = E4M3 if fmt == "e4m3" else E5M2
    untransposed = r in (Recipe.MTFP8, Recipe.MX_TE, Recipe.MX_OCP)
    sdt = E8M0 if r in (Recipe.MX_TE, Recipe.MX_OCP) else np.dtype(np.float32)

    def sshape(col):
        a, b = ctypes.c_int64(), ctypes.c_int64()
        assert lib.xte_quantize_scale_shape(M, K, int(m), int(r), int(lay), col,
                                            ctypes.byref(a), ctypes.byref(b)) == 0
        return a.value, b.value

    data = np.zeros((M, K), f8)
    s = np.zeros(sshape(0), sdt)
    cw = cs = None
    if columnwise:
        cw = np.zeros((M, K) if untransposed else (K, M), f8)
        cs = np.zeros(sshape(1), sdt)
    q = xte.QuantizedTensor(data, s, scaling_mode=m, recipe=r, layout=lay, columnwise_data=cw,
                            columnwise_scale_inv=cs)
    qs, keep = qview(q, "q", writable=True)
    vx = view(x, "x")
    st = ctypes.c_void_p()
    assert lib.xte_stream_create(0, 0, None, ctypes.byref(st)) == 0
    try:
        cfg = lib.xte_quant_config_default()
        rc = lib.xte_quantize(vx.ptr, ctypes.byref(qs), ctypes.byref(cfg), st)
        assert rc == 0, lib.xte_last_error()
    finally:
        lib.xte_stream_destroy(st)
    return q
