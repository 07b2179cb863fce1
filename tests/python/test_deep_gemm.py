"""xte.deep_gemm: DeepGEMM's Python API over xte (`import xte.deep_gemm as deep_gemm`).

Every GEMM result is compared byte for byte with the exact-contract oracle of
test_gemm_oracle.py (NumPy, written from docs/numerics.md): MN-major operands given as strided
views, scales in any strides, the grouped layouts (m_indices with -1 rows and a longer than the
groups, PSUM, any alignment, zeroed padding rows), masked, k-grouped with gran_k 128 / 32 and K
groups that do not start on a 128 block. Also: no copy of A / B data, the FP4 error, the
settings and utils (casts against a NumPy / ml_dtypes oracle), calc_diff, torch.compile and
opcheck of the ops."""
# ctest: no-isa-variants

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

import xte  # noqa: E402
import xte.deep_gemm as deep_gemm  # noqa: E402
from xte.deep_gemm import testing as dgt, utils as dgu  # noqa: E402
from xte.ops import gemm as _G  # noqa: E402

from test_gemm_oracle import E4M3, gemm_oracle, rand_codes, rand_grid  # noqa: E402

SENT = -12345.0


def t8(codes):
    """uint8 codes (NumPy) as a torch float8_e4m3fn tensor (same bytes)."""
    return torch.from_numpy(np.ascontiguousarray(codes)).view(torch.float8_e4m3fn)


def mn_major(x):
    """The same logical tensor stored transposed (DeepGEMM's MN-major operand)."""
    return x.mT.contiguous().mT


def any_strides(sf):
    """The same scales in transposed storage (a non-contiguous view)."""
    return sf.mT.contiguous().mT


def tbytes(x):
    return x.contiguous().view(torch.uint8).numpy().tobytes()


def oracle(qa, sa_rows, qb, sb_rows, kb=128, c=None, out="bfloat16"):
    d = gemm_oracle(qa, E4M3, sa_rows, qb, E4M3, sb_rows, kb, c=c, out=out)
    return d.tobytes()


@pytest.fixture(autouse=True)
def _alignment():
    old = dgu.get_mk_alignment_for_contiguous_layout()
    yield
    dgu.set_mk_alignment_for_contiguous_layout(old)


@pytest.fixture
def seen_ptrs(monkeypatch):
    """The data pointers of the (data, scales) pairs that reach xte's GEMM entry points."""
    seen = []
    orig = _G._operands

    def spy(a, b, *args, **kw):
        for x in (a, b):
            if isinstance(x, (tuple, list)):
                seen.append(x[0].data_ptr())
        return orig(a, b, *args, **kw)
    monkeypatch.setattr(_G, "_operands", spy)
    return seen


# ------------------------------------------------------------------------------ dense


@pytest.mark.parametrize("out", ["bfloat16", "float32"])
def test_dense_every_major_bytes_and_no_data_copy(out, seen_ptrs):
    rng = np.random.default_rng(1)
    M, N, K = 33, 200, 300  # partial M / N / K blocks
    qa, qb = rand_codes(rng, (M, K), E4M3), rand_codes(rng, (N, K), E4M3)
    sa, gb = rand_grid(rng, "1x128", M, K), rand_grid(rng, "128x128", N, K)
    sb_rows = np.asarray(gb, np.float64)[np.arange(N) // 128]
    c = rng.standard_normal((M, N)).astype(np.float32)
    dt = getattr(torch, out)
    want = oracle(qa, sa, qb, sb_rows, out=out)
    want_c = oracle(qa, sa, qb, sb_rows, c=torch.from_numpy(c).to(dt).float().numpy(), out=out)
    for amn in (False, True):
        for bmn in (False, True):
            a = (mn_major(t8(qa)) if amn else t8(qa), torch.from_numpy(sa))
            b = (mn_major(t8(qb)) if bmn else t8(qb), any_strides(torch.from_numpy(gb)))
            assert (a[0].stride(-1) != 1) == amn and (b[0].stride(-1) != 1) == bmn
            d = torch.full((M, N), SENT, dtype=dt)
            seen_ptrs.clear()
            assert deep_gemm.fp8_gemm_nt(a, b, d) is None
            assert tbytes(d) == want, (amn, bmn)
            assert seen_ptrs == [a[0].data_ptr(), b[0].data_ptr()], "operand data was copied"
            # the alias of the storage form: same bytes
            form = ("t" if amn else "n") + ("n" if bmn else "t")
            a2 = (a[0].T, a[1].T) if amn else a
            b2 = (b[0].T, b[1].T) if bmn else b
            assert a2[0].is_contiguous() and b2[0].is_contiguous()
            d2 = torch.full((M, N), SENT, dtype=dt)
            getattr(deep_gemm, f"fp8_gemm_{form}")(a2, b2, d2)
            assert tbytes(d2) == want, form
            # c = d: in-place accumulation
            d3 = torch.from_numpy(c).to(dt).clone()
            getattr(deep_gemm, f"fp8_fp4_gemm_{form}")(a2, b2, d3, c=d3)
            assert tbytes(d3) == want_c, form


def test_wgrad_recipe_1x128_both_and_packed_ue8m0_scales():
    rng = np.random.default_rng(2)
    M, N, K = 40, 72, 256
    qa, qb = rand_codes(rng, (M, K), E4M3), rand_codes(rng, (N, K), E4M3)
    ea = rng.integers(120, 134, size=(M, 2)).astype(np.uint8)  # UE8M0 exponents
    eb = rng.integers(120, 134, size=(N, 2)).astype(np.uint8)
    sa = (ea.astype(np.int32) << 23).view(np.float32)
    sb = (eb.astype(np.int32) << 23).view(np.float32)
    want = oracle(qa, sa, qb, sb, out="float32")

    def packed(e):  # 2 blocks, padded to 4 bytes per row (UE8M0 1.0 = 127), one int32
        p = np.full((e.shape[0], 4), 127, np.uint8)
        p[:, :2] = e
        return torch.from_numpy(p.copy()).view(torch.int32)
    for sfa, sfb in ((torch.from_numpy(sa), torch.from_numpy(sb)), (packed(ea), packed(eb))):
        d = torch.full((M, N), SENT)
        deep_gemm.fp8_gemm_nt((mn_major(t8(qa)), sfa), (mn_major(t8(qb)), sfb), d,
                              recipe=(1, 1, 128))
        assert tbytes(d) == want


def test_fp4_operands_raise_not_implemented_naming_fp4():
    a = (torch.zeros((8, 64), dtype=torch.int8), torch.ones((8, 1)))
    b = (t8(np.zeros((16, 128), np.uint8)), torch.ones((1, 1)))
    d = torch.full((8, 16), SENT, dtype=torch.bfloat16)
    assert deep_gemm.fp8_fp4_gemm_nt is deep_gemm.fp8_gemm_nt
    with pytest.raises(NotImplementedError, match="FP4"):
        deep_gemm.fp8_fp4_gemm_nt(b, a, d)
    assert bool((d == SENT).all())


def test_cublaslt_gemm_is_unit_scaled():
    rng = np.random.default_rng(3)
    M, N, K = 9, 20, 150
    qa, qb = rand_codes(rng, (M, K), E4M3), rand_codes(rng, (N, K), E4M3)
    want = oracle(qa, np.ones((M, 2)), qb, np.ones((N, 2)), out="float32")
    d = torch.full((M, N), SENT)
    deep_gemm.cublaslt_gemm_nt(t8(qa), mn_major(t8(qb)), d)
    assert tbytes(d) == want
    d = torch.full((M, N), SENT)
    deep_gemm.cublaslt_gemm_tn(t8(qa.T.copy()), t8(qb.T.copy()), d)
    assert tbytes(d) == want


# ------------------------------------------------------------------------------ m-grouped


def _m_case(rng, sizes, align, extra, N=136, K=256):
    """a [sum roundup(m_g, align) + extra, K] with NaN codes on every row of no group (never
    read), b [G, N, K] 128x128; m_indices, PSUM ends and the starts."""
    G = len(sizes)
    padded = [-(-m // align) * align for m in sizes]
    R = sum(padded) + extra
    qa = np.full((R, K), 0x7F, np.uint8)
    sa = rand_grid(rng, "1x128", R, K)
    mi = np.full(R, -1, np.int32)
    starts, ends, s = [], [], 0
    for g, (m, p) in enumerate(zip(sizes, padded)):
        qa[s:s + m] = rand_codes(rng, (m, K), E4M3)
        mi[s:s + m] = g
        starts.append(s)
        ends.append(s + m)
        s += p
    qb = rand_codes(rng, (G, N, K), E4M3)
    gb = np.stack([rand_grid(rng, "128x128", N, K) for _ in range(G)])
    return qa, sa, qb, gb, mi, starts, ends


def _m_want(qa, sa, qb, gb, sizes, starts, R, N, K, zero):
    want = np.full((R, N), SENT if not zero else 0.0, np.float32).astype(ml_dtypes.bfloat16)
    for g, (s, m) in enumerate(zip(starts, sizes)):
        if m:
            sb_rows = np.asarray(gb[g], np.float64)[np.arange(N) // 128]
            want[s:s + m] = gemm_oracle(qa[s:s + m], E4M3, sa[s:s + m], qb[g], E4M3, sb_rows,
                                        128, out="bfloat16")
    return want.tobytes()


@pytest.mark.parametrize("align", [128, 224, 8])
def test_m_grouped_contiguous_m_indices_psum_alignment_and_padding(align, seen_ptrs):
    rng = np.random.default_rng(4)
    sizes = [5, 0, 230, 17]
    qa, sa, qb, gb, mi, starts, ends = _m_case(rng, sizes, align, extra=align + 3)
    R, K = qa.shape
    G, N, _ = qb.shape
    dgu.set_mk_alignment_for_contiguous_layout(align)
    a = (t8(qa), any_strides(torch.from_numpy(sa)))
    bk = (t8(qb), torch.from_numpy(gb))
    bmn = (mn_major(t8(qb)), torch.from_numpy(gb))
    want_zero = _m_want(qa, sa, qb, gb, sizes, starts, R, N, K, True)
    want_keep = _m_want(qa, sa, qb, gb, sizes, starts, R, N, K, False)
    for b in (bk, bmn):
        for layout, psum in ((torch.from_numpy(mi), False),
                             (torch.tensor(ends, dtype=torch.int32), True)):
            d = torch.full((R, N), SENT, dtype=torch.bfloat16)
            seen_ptrs.clear()
            assert deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, layout,
                                                              use_psum_layout=psum) is None
            assert tbytes(d) == want_zero, (psum, b is bmn)
            assert a[0].data_ptr() in seen_ptrs and b[0].data_ptr() in seen_ptrs
            # ensure_zero_padding=False keeps the padding rows of a PSUM layout; an m_indices
            # layout writes them all the same (as DeepGEMM)
            d = torch.full((R, N), SENT, dtype=torch.bfloat16)
            deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, layout, use_psum_layout=psum,
                                                           ensure_zero_padding=False)
            assert tbytes(d) == (want_keep if psum else want_zero)
    # the _nn form: b stored [G, K, N]
    d = torch.full((R, N), SENT, dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_gemm_nn_contiguous(a, (bmn[0].mT, bmn[1].mT), d, torch.from_numpy(mi))
    assert tbytes(d) == want_zero


def test_m_grouped_psum_last_group_padding_past_a():
    rng = np.random.default_rng(5)
    sizes, align = [3, 20], 16
    qa, sa, qb, gb, mi, starts, ends = _m_case(rng, sizes, align, extra=0)
    R = ends[-1]  # a ends with the last group's rows
    qa, sa = qa[:R].copy(), sa[:R].copy()
    G, N, K = qb.shape
    dgu.set_mk_alignment_for_contiguous_layout(align)
    d = torch.full((R, N), SENT, dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((t8(qa), torch.from_numpy(sa)),
                                               (t8(qb), torch.from_numpy(gb)), d,
                                               torch.tensor(ends, dtype=torch.int32),
                                               use_psum_layout=True)
    assert tbytes(d) == _m_want(qa, sa, qb, gb, sizes, starts, R, N, K, True)


def test_m_grouped_bad_layouts_raise_and_leave_d():
    rng = np.random.default_rng(6)
    sizes, align = [5, 9], 8
    qa, sa, qb, gb, mi, starts, ends = _m_case(rng, sizes, align, extra=0)
    dgu.set_mk_alignment_for_contiguous_layout(align)
    a, b = (t8(qa), torch.from_numpy(sa)), (t8(qb), torch.from_numpy(gb))
    d = torch.full((qa.shape[0], qb.shape[1]), SENT, dtype=torch.bfloat16)
    bad = mi.copy()
    bad[0:5], bad[8:17] = 1, 0  # out of order
    with pytest.raises(xte.XteValueError, match="grouped_layout: row 8 holds 0"):
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, torch.from_numpy(bad))
    bad = mi.copy()
    bad[0] = -1
    bad[-1] = 1  # a group after -1 rows where a group starts
    with pytest.raises(xte.XteValueError, match="grouped_layout: row 0 holds -1"):
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, torch.from_numpy(bad))
    with pytest.raises(xte.XteValueError, match="grouped_layout: group 1 ends"):
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d,
                                                   torch.tensor([5, 6], dtype=torch.int32),
                                                   use_psum_layout=True)
    with pytest.raises(xte.XteShapeError, match="past a's"):
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d,
                                                   torch.tensor([5, 99], dtype=torch.int32),
                                                   use_psum_layout=True)
    assert bool((d == SENT).all())


def test_masked_and_v2_alias():
    rng = np.random.default_rng(7)
    G, MM, N, K = 3, 20, 136, 200
    qa = rand_codes(rng, (G, MM, K), E4M3)
    sa = rand_grid(rng, "1x128", G * MM, K).reshape(G, MM, -1)
    qb = rand_codes(rng, (G, N, K), E4M3)
    gb = np.stack([rand_grid(rng, "128x128", N, K) for _ in range(G)])
    mm = [7, 0, 20]
    assert deep_gemm.fp8_m_grouped_gemm_nt_masked is deep_gemm.m_grouped_fp8_gemm_nt_masked
    d = torch.full((G, MM, N), SENT, dtype=torch.bfloat16)
    deep_gemm.fp8_m_grouped_gemm_nt_masked((t8(qa), any_strides(torch.from_numpy(sa))),
                                           (t8(qb), torch.from_numpy(gb)), d,
                                           torch.tensor(mm, dtype=torch.int32), 16)
    want = np.full((G, MM, N), SENT, np.float32).astype(ml_dtypes.bfloat16)
    for g, m in enumerate(mm):
        if m:
            sb_rows = np.asarray(gb[g], np.float64)[np.arange(N) // 128]
            want[g, :m] = gemm_oracle(qa[g, :m], E4M3, sa[g, :m], qb[g], E4M3, sb_rows, 128,
                                      out="bfloat16")
    assert tbytes(d) == want.tobytes()


# ------------------------------------------------------------------------------ k-grouped


def _k_case(rng, ks, starts, rows, gk, M=24, N=40, ue8m0=False):
    """a [rows, M], b [rows, N] (K-outer) with NaN codes on rows of no group; scales per group
    (ceil(k_g / gk) rows each, as DeepGEMM's casts), fp32 (powers of two with ue8m0)."""
    qa = np.full((rows, M), 0x7F, np.uint8)
    qb = np.full((rows, N), 0x7F, np.uint8)
    sfa, sfb = [], []
    for s, k in zip(starts, ks):
        if not k:
            continue
        qa[s:s + k] = rand_codes(rng, (k, M), E4M3)
        qb[s:s + k] = rand_codes(rng, (k, N), E4M3)
        nb = -(-k // gk)
        for lst, X in ((sfa, M), (sfb, N)):
            if ue8m0:
                lst.append(np.ldexp(1.0, rng.integers(-8, 8, size=(nb, X))).astype(np.float32))
            else:
                lst.append(rand_grid(rng, "1x128", X, nb * 128).T.copy())
    return qa, qb, np.concatenate(sfa), np.concatenate(sfb)


def _k_want(qa, qb, sfa, sfb, ks, starts, c, gk):
    G = len(ks)
    want = c.copy()
    r = 0
    for g, (s, k) in enumerate(zip(starts, ks)):
        if not k:
            continue
        nb = -(-k // gk)
        want[g] = gemm_oracle(qa[s:s + k].T.copy(), E4M3, sfa[r:r + nb].T, qb[s:s + k].T.copy(),
                              E4M3, sfb[r:r + nb].T, gk, c=c[g], out="float32")
        r += nb
    assert want.shape[0] == G
    return want.tobytes()


@pytest.mark.parametrize("gk,k_align,psum", [(128, 128, False), (128, 160, False),
                                             (32, 224, False), (128, 224, True),
                                             (32, 32, True)])
def test_k_grouped_tn(gk, k_align, psum):
    rng = np.random.default_rng(8)
    real = [300, 0, 77, 130]
    if psum:
        starts, ends, prev = [], [], 0
        for k in real:
            s = -(-prev // k_align) * k_align
            starts.append(s)
            ends.append(s + k)
            prev = s + k
        rows = -(-ends[-1] // k_align) * k_align
        ks = real
    else:
        ks = [-(-k // k_align) * k_align for k in real]
        starts = list(np.cumsum([0] + ks[:-1]))
        rows = sum(ks)
    qa, qb, sfa, sfb = _k_case(rng, ks, starts, rows, gk, ue8m0=(gk == 32))
    G, M, N = len(ks), qa.shape[1], qb.shape[1]
    c = rng.standard_normal((G, M, N)).astype(np.float32) * 32
    want = _k_want(qa, qb, sfa, sfb, ks, starts, c, gk)
    dgu.set_mk_alignment_for_contiguous_layout(k_align)
    for how in ("ks", "none", "c_is_d"):
        d = torch.from_numpy(c.copy()) if how == "c_is_d" else torch.full((G, M, N), SENT)
        cc = d if how == "c_is_d" else torch.from_numpy(c)
        layout = torch.tensor(ends if psum else ks, dtype=torch.int32)
        ks_cpu = None if (how == "none" and psum) else ks
        deep_gemm.k_grouped_fp8_gemm_tn_contiguous(
            (t8(qa), torch.from_numpy(sfa)), (t8(qb), torch.from_numpy(sfb)), d, ks_cpu, layout,
            cc, recipe=(1, 1, gk), use_psum_layout=psum)
        assert tbytes(d) == want, how


def test_k_grouped_gran_k_32_needs_power_of_two_scales():
    rng = np.random.default_rng(9)
    ks = [64, 32]
    qa, qb, sfa, sfb = _k_case(rng, ks, [0, 64], 96, 32, ue8m0=True)
    sfa[0, 0] *= 1.5
    d = torch.full((2, qa.shape[1], qb.shape[1]), SENT)
    with pytest.raises(xte.XteUnsupportedError, match="powers of two"):
        deep_gemm.k_grouped_fp8_gemm_tn_contiguous(
            (t8(qa), torch.from_numpy(sfa)), (t8(qb), torch.from_numpy(sfb)), d, ks,
            torch.tensor(ks, dtype=torch.int32), torch.zeros_like(d), recipe=(1, 1, 32))
    assert bool((d == SENT).all())


def test_k_grouped_bad_group_raises_before_any_write():
    rng = np.random.default_rng(13)
    ks = [160, 160, 160]  # K alignment 160: one xte_gemm per group
    qa, qb, sfa, sfb = _k_case(rng, ks, [0, 160, 320], 480, 128)
    d = torch.full((3, qa.shape[1], qb.shape[1]), SENT)
    with pytest.raises(xte.XteShapeError, match="group 2: "):
        deep_gemm.k_grouped_fp8_gemm_tn_contiguous(
            (t8(qa), torch.from_numpy(sfa[:-1])), (t8(qb), torch.from_numpy(sfb)), d, ks,
            torch.tensor(ks, dtype=torch.int32), torch.zeros_like(d))
    assert bool((d == SENT).all())


def test_k_grouped_nt():
    rng = np.random.default_rng(10)
    ks, M, N = [256, 128], 16, 24
    qa, qb, sfa, sfb = _k_case(rng, ks, [0, 256], 384, 128, M, N)
    c = rng.standard_normal((2, M, N)).astype(np.float32)
    want = _k_want(qa, qb, sfa, sfb, ks, [0, 256], c, 128)
    # K-major per group: [M, k_g] blocks one after the other; scales [M, sum_k / 128]
    fa = np.concatenate([qa[0:256].T.reshape(-1), qa[256:].T.reshape(-1)])
    fb = np.concatenate([qb[0:256].T.reshape(-1), qb[256:].T.reshape(-1)])
    d = torch.full((2, M, N), SENT)
    deep_gemm.k_grouped_fp8_gemm_nt_contiguous(
        (t8(fa), torch.from_numpy(sfa).T), (t8(fb), torch.from_numpy(sfb).T), d, ks,
        torch.tensor(ks, dtype=torch.int32), torch.from_numpy(c))
    assert tbytes(d) == want


# ------------------------------------------------------------------------------ utils, testing


def test_alignment_settings_and_aliases():
    assert dgu.get_m_alignment_for_contiguous_layout is dgu.get_mk_alignment_for_contiguous_layout
    assert dgu.get_k_alignment_for_contiguous_layout is dgu.get_mk_alignment_for_contiguous_layout
    deep_gemm.set_mk_alignment_for_contiguous_layout(160)
    assert deep_gemm.get_k_alignment_for_contiguous_layout() == 160
    assert deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout() == 224
    assert [deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout(m)
            for m in (1, 32, 33, 100, 192, 193, 500)] == [32, 32, 64, 128, 192, 224, 224]
    assert dgt.get_arch_major() == 10
    assert (deep_gemm.ceil_div(7, 4), deep_gemm.align(7, 4)) == (2, 8)
    assert deep_gemm.get_tma_aligned_size(4097, 4) == 4100
    n = deep_gemm.get_num_sms()
    deep_gemm.set_num_sms(1)
    assert deep_gemm.get_num_sms() == 1
    deep_gemm.set_num_sms(n)


def _np_cast(x, gk_rows, gk_cols, ue8m0):
    """NumPy oracle of DeepGEMM's casts: sf = max(amax over the block, 1e-4) / 448 (fp32), up
    to a power of two with ue8m0; data = e4m3(x * fp32(1 / sf))."""
    R, C = x.shape
    pr, pc = -(-R // gk_rows) * gk_rows, -(-C // gk_cols) * gk_cols
    xp = np.zeros((pr, pc), np.float32)
    xp[:R, :C] = x
    blk = np.abs(xp).reshape(pr // gk_rows, gk_rows, pc // gk_cols, gk_cols).max(axis=(1, 3))
    sf = (np.maximum(blk, np.float32(1e-4)) / np.float32(448)).astype(np.float32)
    if ue8m0:
        sf = np.exp2(np.ceil(np.log2(sf.astype(np.float64)))).astype(np.float32)
    inv = (np.float32(1) / sf).astype(np.float32)
    full = np.repeat(np.repeat(inv, gk_rows, 0), gk_cols, 1)[:R, :C]
    q = (x * full).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    return q.view(np.uint8), sf


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("gk", [128, 32])
def test_casts_against_numpy(gk, ue8m0):
    g = torch.Generator().manual_seed(11)
    x = (torch.randn((37, 300), generator=g) * 3).to(torch.bfloat16)
    xf = x.float().numpy()
    q, s = deep_gemm.per_token_cast_to_fp8(x, use_ue8m0=ue8m0, gran_k=gk)
    wq, ws = _np_cast(xf, 1, gk, ue8m0)
    assert q.view(torch.uint8).numpy().tobytes() == wq.tobytes()
    assert s.numpy().tobytes() == ws.tobytes()
    q, s = deep_gemm.per_block_cast_to_fp8(x, use_ue8m0=ue8m0, gran_k=gk)
    wq, ws = _np_cast(xf, gk, gk, ue8m0)
    assert q.view(torch.uint8).numpy().tobytes() == wq.tobytes()
    assert s.numpy().tobytes() == ws.tobytes()
    xc = (torch.randn((256 if gk == 128 else 224, 40), generator=g) * 3).to(torch.bfloat16)
    q, s = deep_gemm.per_channel_cast_to_fp8(xc, use_ue8m0=ue8m0, gran_k=gk)
    wq, ws = _np_cast(xc.float().numpy(), gk, 1, ue8m0)
    assert q.view(torch.uint8).numpy().tobytes() == wq.tobytes()
    assert s.numpy().tobytes() == ws.tobytes()
    if ue8m0:
        q2, p = deep_gemm.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=gk,
                                                use_packed_ue8m0=True)
        _, ws = _np_cast(xf, 1, gk, True)
        assert p.dtype == torch.int32 and p.shape == (37, -(-ws.shape[1] // 4))
        assert np.array_equal(dgu.unpack_ue8m0_from_int(p).numpy()[:, :ws.shape[1]], ws)


def test_fp4_helpers_round_trip_codes():
    x = torch.tensor([[0.0, 0.3, -0.6, 1.2, 1.9, 2.6, -3.6, 5.5] * 16,
                      [6.0, -6.0, 0.24, -0.26, 0.76, 1.26, 1.76, 4.9] * 16])
    p, s = dgu.per_token_cast_to_fp4(x, use_ue8m0=False, gran_k=128)
    assert p.shape == (2, 64) and p.dtype == torch.int8
    u = p.view(torch.uint8).int()
    codes = torch.stack([u & 0xF, u >> 4], -1).reshape(2, 128)
    lut = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    vals = lut[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    y = x / s.repeat_interleave(128, 1)
    # nearest E2M1 value (ties away from the grid's midpoints do not occur in x)
    grid = torch.cat([-lut.flip(0), lut])
    want = grid[(y.unsqueeze(-1) - grid).abs().argmin(-1)]
    assert torch.equal(vals.abs(), want.abs())
    t = dgu.transpose_packed_fp4(p)
    ut = t.view(torch.uint8).int()
    assert torch.equal(torch.stack([ut & 0xF, ut >> 4], -1).reshape(128, 2), codes.T)


def test_calc_diff_and_bench():
    z = torch.zeros((3, 4))
    assert dgt.calc_diff(z, z) == 0.0
    assert xte.testing.calc_diff(np.zeros(5), np.zeros(5)) == 0.0
    x = torch.randn(10)
    assert abs(dgt.calc_diff(x, x)) < 1e-15
    assert dgt.calc_diff(x, -x) == pytest.approx(2.0)
    calls = []
    t = dgt.bench_kineto(lambda: calls.append(1), ("a", "b"), num_tests=3)
    assert isinstance(t, tuple) and len(t) == 2 and len(calls) == 4
    assert isinstance(dgt.bench_kineto(lambda: None, "a", num_tests=1), float)
    assert dgt.count_bytes((torch.zeros(4), None), torch.zeros(2, dtype=torch.int8)) == 18


# ------------------------------------------------------------------------------ torch.compile


def test_compile_fullgraph_and_opcheck():
    rng = np.random.default_rng(12)
    sizes, align = [5, 19], 16
    qa, sa, qb, gb, mi, starts, ends = _m_case(rng, sizes, align, extra=4, N=64, K=128)
    dgu.set_mk_alignment_for_contiguous_layout(align)
    a = (t8(qa), torch.from_numpy(sa))
    b = (mn_major(t8(qb)), torch.from_numpy(gb))
    ends_t = torch.tensor(ends, dtype=torch.int32)
    M, N = qa.shape[0], qb.shape[1]

    def f(ad, asf, bd, bsf, layout, x):
        d = torch.empty((M, N), dtype=torch.bfloat16)
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous((ad, asf), (bd, bsf), d, layout,
                                                   use_psum_layout=True)
        d2 = torch.empty((M, N), dtype=torch.bfloat16)
        deep_gemm.fp8_gemm_nt((ad, asf), (x[0], x[1]), d2)
        return d, d2
    x = (mn_major(t8(qb[0])), torch.from_numpy(gb[0]))
    want = f(a[0], a[1], b[0], b[1], ends_t, x)
    got = torch.compile(f, fullgraph=True, backend="eager")(a[0], a[1], b[0], b[1], ends_t, x)
    assert tbytes(got[0]) == tbytes(want[0]) and tbytes(got[1]) == tbytes(want[1])
    # the ops with the new arguments pass opcheck
    d = torch.zeros((M, N), dtype=torch.bfloat16)
    u8 = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731
    torch.library.opcheck(
        torch.ops.xte.m_grouped_fp8_gemm_nt_contiguous.default,
        (u8(a[0]), a[1], u8(b[0].mT), b[1].mT.contiguous(), d, ends_t, None, align, None,
         int(xte.DType.E4M3), int(xte.DType.E4M3), [], [-1, 0, -1, 0], 0, True, True, True))
    ks = [128, 0, 64]
    qk, qk2, sfa, sfb = _k_case(rng, ks, [0, 128, 128], 192, 128, 8, 16)
    dk = torch.zeros((3, 8, 16))
    torch.library.opcheck(
        torch.ops.xte.k_grouped_fp8_gemm_tn_contiguous.default,
        (torch.from_numpy(qk), torch.from_numpy(sfa), torch.from_numpy(qk2),
         torch.from_numpy(sfb), dk, torch.tensor(ks), None, torch.ones_like(dk), False, None,
         int(xte.DType.E4M3), int(xte.DType.E4M3), [1, 1, 128], [-1, 0, -1, 0], 0, False, -1,
         False))
