"""xte.ops.attention against an fp64 NumPy softmax(Q K^T) V written from include/xte/attention.h's
definitions (masks, windows, softcap, ALiBi, GQA, padding), with docs/numerics.md section 7's
bound: max |xte - oracle| <= 2 max |naive - oracle| + atol max(1, max |oracle|), naive = the same
attention in fp32 NumPy (atol 2^-22 fp32, 2^-21 with softcap; LSE: 2 naive + 1e-5), for the
forward and the backward. Exact checks: the per-element rules do not depend on the layout, so
SBHD and THD give the BSHD bytes; rows that see no key give O = 0, LSE = -inf, zero gradients;
NumPy and torch give the same bytes."""

import ml_dtypes
import numpy as np
import pytest

import xte
from xte.ops import attention as A

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn


# ------------------------------------------------------------------------------- oracle


def visible(Lq, Lkv, mask, window):
    i = np.arange(Lq)[:, None]
    j = np.arange(Lkv)[None, :]
    off = Lkv - Lq
    vis = np.ones((Lq, Lkv), bool)
    if mask == "causal":
        vis &= j <= i
    if mask == "causal_bottom_right":
        vis &= j <= i + off
    wl, wr = window
    if wl >= 0:
        vis &= j >= i + off - wl
    if wr >= 0:
        vis &= j <= i + off + wr
    return vis


def ref_seq(q, k, v, dt, mask="none", window=(-1, -1), scale=None, softcap=0.0, alibi=None,
            dout=None):
    """One sequence: q [Lq, hq, d], k [Lkv, hkv, d], v [Lkv, hkv, dv] -> O, LSE [hq, Lq]
    (and dq, dk, dv when dout is given), all arithmetic in dt."""
    q, k, v = (np.asarray(a, np.float32).astype(dt) for a in (q, k, v))
    Lq, hq, d = q.shape
    Lkv, hkv, dv = v.shape
    G = hq // hkv
    sc = dt(1.0 / np.sqrt(d)) if scale is None else dt(scale)
    vis = visible(Lq, Lkv, mask, window)
    off = Lkv - Lq
    O = np.zeros((Lq, hq, dv), dt)
    LSE = np.full((hq, Lq), -np.inf, dt)
    dq, dk, dvv = np.zeros(q.shape, dt), np.zeros(k.shape, dt), np.zeros(v.shape, dt)
    for h in range(hq):
        hk = h // G
        s = (q[:, h] @ k[:, hk].T).astype(dt)
        if softcap:
            th = np.tanh(s * sc / dt(softcap)).astype(dt)
            x = (th * dt(softcap)).astype(dt)
            gfac = ((1 - th * th) * sc).astype(dt)
        else:
            x = (s * sc).astype(dt)
            gfac = sc
        if alibi is not None:
            i = np.arange(Lq)[:, None]
            j = np.arange(Lkv)[None, :]
            x = (x - dt(alibi[h]) * np.abs(i + off - j)).astype(dt)
        x = np.where(vis, x, -np.inf)
        m = np.max(x, axis=1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        p = np.exp(x - m).astype(dt)
        lsum = p.sum(1, keepdims=True)
        ok = lsum[:, 0] > 0
        P = np.where(ok[:, None], p / np.where(ok[:, None], lsum, 1), 0).astype(dt)
        O[:, h] = P @ v[:, hk]
        LSE[h] = np.where(ok, m[:, 0] + np.log(np.where(ok, lsum[:, 0], 1)), -np.inf)
        if dout is not None:
            do = np.asarray(dout, np.float32).astype(dt)[:, h]
            dvv[:, hk] += P.T @ do
            dP = do @ v[:, hk].T
            D = (do * O[:, h]).sum(1, keepdims=True)
            dS = (P * (dP - D) * gfac).astype(dt)
            dq[:, h] = dS @ k[:, hk]
            dk[:, hk] += dS.T @ q[:, h]
    return (O, LSE) if dout is None else (O, LSE, dq, dk, dvv)


def ref_bshd(q, k, v, dt, dout=None, **kw):
    """BSHD batch of ref_seq: O [b, s, hq, dv], LSE [b, hq, s] (+ grads)."""
    res = [ref_seq(q[b], k[b], v[b], dt, dout=None if dout is None else dout[b], **kw)
           for b in range(q.shape[0])]
    return tuple(np.stack([r[i] for r in res]) for i in range(len(res[0])))


def check_bound(got, oracle, naive, atol, name):
    got = np.asarray(got, np.float64)
    fin = np.isfinite(oracle)
    assert np.array_equal(np.isfinite(got), fin), name
    err = np.max(np.abs(got[fin] - oracle[fin]), initial=0)
    nerr = np.max(np.abs(naive[fin] - oracle[fin]), initial=0)
    bound = 2 * nerr + atol * max(1.0, np.max(np.abs(oracle[fin]), initial=0))
    assert err <= bound, f"{name}: err {err:.3g} > bound {bound:.3g} (naive {nerr:.3g})"


def rnd(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


# ------------------------------------------------------------------------------- forward

CASES = [
    dict(),
    dict(mask="causal"),
    dict(mask="causal_bottom_right", sq=5, skv=70),
    dict(window=(8, 2), skv=70, sq=70),
    dict(softcap=5.0, scale=0.4),
    dict(alibi=True, mask="causal_bottom_right"),
    dict(hq=4, hkv=1, dv=8),
    dict(mask="causal", window=(3, -1), hq=4, hkv=2),
]


def _case(c, rng):
    b, sq, skv = 2, c.get("sq", 9), c.get("skv", 67)
    hq, hkv, d, dv = c.get("hq", 2), c.get("hkv", 2), 16, c.get("dv", 16)
    q, k, v = rnd(rng, (b, sq, hq, d)), rnd(rng, (b, skv, hkv, d)), rnd(rng, (b, skv, hkv, dv))
    kw = dict(mask=c.get("mask", "none"), window=c.get("window", (-1, -1)),
              scale=c.get("scale"), softcap=c.get("softcap", 0.0),
              alibi=(rng.uniform(0.05, 0.5, hq).astype(np.float32) if c.get("alibi") else None))
    xkw = dict(mask=kw["mask"], window=kw["window"], softmax_scale=kw["scale"],
               softcap=kw["softcap"], alibi_slopes=kw["alibi"])
    return q, k, v, kw, xkw


@pytest.mark.parametrize("c", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items())
                         or "plain")
def test_forward_and_backward_within_contract(c):
    rng = np.random.default_rng(len(str(c)))
    q, k, v, kw, xkw = _case(c, rng)
    out, lse = A.attention_fwd(q, k, v, **xkw)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert out.shape == q.shape[:-1] + (v.shape[-1],) and lse.shape == (2, q.shape[2], q.shape[1])
    do = rnd(rng, out.shape)
    O64, L64, dq64, dk64, dv64 = ref_bshd(q, k, v, np.float64, dout=do, **kw)
    O32, L32, dq32, dk32, dv32 = ref_bshd(q, k, v, np.float32, dout=do, **kw)
    atol = 2.0 ** -21 if kw["softcap"] else 2.0 ** -22
    check_bound(out, O64, O32, atol, "O")
    check_bound(lse, L64, L32, 1e-5, "LSE")
    dq, dk, dv = A.attention_bwd(q, k, v, out, do, lse, **xkw)
    check_bound(dq, dq64, dq32, atol, "dQ")
    check_bound(dk, dk64, dk32, atol, "dK")
    check_bound(dv, dv64, dv32, atol, "dV")


def test_bf16_forward():
    rng = np.random.default_rng(21)
    q, k, v = (rnd(rng, s, BF16) for s in ((1, 7, 2, 32), (1, 20, 2, 32), (1, 20, 2, 32)))
    out, lse = A.attention_fwd(q, k, v, mask="causal")
    assert out.dtype == BF16 and lse.dtype == np.float32
    O64, L64 = ref_bshd(q, k, v, np.float64, mask="causal")
    O32, L32 = ref_bshd(q, k, v, np.float32, mask="causal")
    check_bound(out, O64, O32.astype(BF16).astype(np.float64), 2.0 ** -9, "O bf16")
    check_bound(lse, L64, L32, 1e-5, "LSE bf16")


def test_layouts_give_the_same_bytes():
    rng = np.random.default_rng(22)
    b, s, h, d = 2, 11, 2, 8
    q, k, v = rnd(rng, (b, s, h, d)), rnd(rng, (b, s, h, d)), rnd(rng, (b, s, h, d))
    ob, lb = A.attention_fwd(q, k, v, mask="causal")
    tr = lambda x: np.ascontiguousarray(x.transpose(1, 0, 2, 3))  # noqa: E731
    os_, ls = A.attention_fwd(tr(q), tr(k), tr(v), layout="sbhd", mask="causal")
    assert tr(os_).tobytes() == ob.tobytes() and ls.tobytes() == lb.tobytes()
    # THD: sequences of lengths 4 and 11 packed, each equal to its own BSHD call
    lens = [4, 11]
    cu = np.array([0, 4, 15], np.int32)
    qt = np.concatenate([q[0, :4], q[1]])
    kt = np.concatenate([k[0, :4], k[1]])
    vt = np.concatenate([v[0, :4], v[1]])
    ot, lt = A.attention_fwd(qt, kt, vt, layout="thd", mask="causal", cu_seqlens_q=cu,
                             cu_seqlens_kv=cu, max_seqlen_q=11, max_seqlen_kv=11)
    assert lt.shape == (15, h)
    o0, l0 = A.attention_fwd(q[:1, :4].copy(), k[:1, :4].copy(), v[:1, :4].copy(), mask="causal")
    assert ot[:4].tobytes() == o0[0].tobytes() and ot[4:].tobytes() == ob[1].tobytes()
    assert np.ascontiguousarray(lt[:4].T).tobytes() == l0[0].tobytes()
    assert np.ascontiguousarray(lt[4:].T).tobytes() == lb[1].tobytes()
    # max_seqlen defaults to the packed token count (an upper bound): same bytes
    ot2, _ = A.attention_fwd(qt, kt, vt, layout="thd", mask="causal", cu_seqlens_q=cu,
                             cu_seqlens_kv=cu)
    assert ot2.tobytes() == ot.tobytes()
    # BSHD padding: batch entry 0 uses its first 4 positions; the rest is O = 0, LSE = -inf
    cup = np.array([0, 4, 15], np.int32)
    op, lp = A.attention_fwd(q, k, v, mask="causal", cu_seqlens_q=cup, cu_seqlens_kv=cup)
    assert op[0, :4].tobytes() == o0[0].tobytes() and np.all(op[0, 4:] == 0)
    assert np.all(lp[0, :, 4:] == -np.inf) and op[1].tobytes() == ob[1].tobytes()
    del lens


def test_rows_without_keys_and_nan():
    rng = np.random.default_rng(23)
    q, k, v = rnd(rng, (1, 6, 1, 8)), rnd(rng, (1, 3, 1, 8)), rnd(rng, (1, 3, 1, 8))
    # bottom-right causal with s_q > s_kv: rows 0..2 see no key
    out, lse = A.attention_fwd(q, k, v, mask="causal_bottom_right")
    assert np.all(out[0, :3] == 0) and np.all(lse[0, 0, :3] == -np.inf)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse[0, 0, 3:]))
    dq, dk, dv = A.attention_bwd(q, k, v, out, rnd(rng, out.shape), lse,
                                 mask="causal_bottom_right")
    assert np.all(dq[0, :3] == 0) and np.all(np.isfinite(dq))
    # a NaN key: the rows that cannot see it keep their bytes, the rows that see it are NaN
    q, k, v = rnd(rng, (1, 8, 1, 8)), rnd(rng, (1, 8, 1, 8)), rnd(rng, (1, 8, 1, 8))
    clean, _ = A.attention_fwd(q, k, v, mask="causal")
    k[0, 3, 0, 2] = np.nan
    dirty, dl = A.attention_fwd(q, k, v, mask="causal")
    assert dirty[0, :3].tobytes() == clean[0, :3].tobytes()
    # The rows that see the NaN key: every output and the LSE are the canonical NaN 0x7FC00000
    # (docs/numerics.md section 7: a NaN row sum l), never the O = 0 / LSE = -inf of a row
    # without keys.
    seen = np.ascontiguousarray(dirty[0, 3:]).view(np.uint32)
    assert np.all(seen == 0x7FC00000)
    assert np.all(np.ascontiguousarray(dl[0, 0, 3:]).view(np.uint32) == 0x7FC00000)
    # A NaN value row poisons its whole 64-key block, visible or not (p = 0 times NaN is NaN:
    # the P V chain runs over every slot of an active block, docs/numerics.md section 7).
    k[0, 3, 0, 2] = 1.0
    v[0, 3, 0, 1] = np.nan
    vn, _ = A.attention_fwd(q, k, v, mask="causal")
    assert np.all(np.isnan(vn[0, :, 0, 1]))
    assert np.all(np.isfinite(np.delete(vn[0, :, 0], 1, axis=-1)))


def test_fp8_forward_with_descale():
    rng = np.random.default_rng(24)
    b, s, h, d = 2, 9, 2, 16
    q8, k8, v8 = (rnd(rng, (b, s, h, d)).astype(E4M3) for _ in range(3))
    dq_, dk_, dv_ = (rng.uniform(0.5, 2, (b, h)).astype(np.float32) for _ in range(3))
    out, lse = A.attention_fwd(q8, k8, v8, descale_q=dq_, descale_k=dk_, descale_v=dv_,
                               out_dtype="float32")
    assert out.dtype == np.float32
    deq = lambda x, f: x.astype(np.float32) * f[:, None, :, None]  # noqa: E731
    qf, kf, vf = deq(q8, dq_), deq(k8, dk_), deq(v8, dv_)
    O64, L64 = ref_bshd(qf, kf, vf, np.float64)
    O32, _ = ref_bshd(qf, kf, vf, np.float32)
    check_bound(out, O64, O32, 1e-5, "O fp8")
    assert A.attention_fwd(q8, k8, v8)[0].dtype == BF16  # default output
    with pytest.raises(xte.XteShapeError, match="descale_k"):
        A.attention_fwd(q8, k8, v8, descale_k=np.ones(3, np.float32))


# ------------------------------------------------------------------------------- errors, out=


def test_bad_input_names_argument_and_leaves_out_untouched():
    rng = np.random.default_rng(25)
    q, k, v = rnd(rng, (1, 4, 2, 8)), rnd(rng, (1, 4, 2, 8)), rnd(rng, (1, 4, 2, 8))
    out = np.full((1, 4, 2, 8), 3.0, np.float32)
    lse = np.full((1, 2, 4), 3.0, np.float32)
    with pytest.raises(xte.XteDTypeError, match="q"):
        A.attention_fwd(q.astype(np.float64), k, v, out=out, lse=lse)
    with pytest.raises(xte.XteLayoutError, match="k"):
        A.attention_fwd(q, rnd(rng, (1, 4, 2, 16))[..., ::2], v, out=out, lse=lse)
    with pytest.raises(xte.XteShapeError):
        A.attention_fwd(q, rnd(rng, (1, 4, 2, 4)), v, out=out, lse=lse)  # head dims differ
    with pytest.raises(xte.XteShapeError, match="alibi_slopes"):
        A.attention_fwd(q, k, v, alibi_slopes=np.ones(3, np.float32), out=out, lse=lse)
    with pytest.raises(xte.XteValueError, match="mask"):
        A.attention_fwd(q, k, v, mask="sideways", out=out, lse=lse)
    with pytest.raises(xte.XteShapeError):
        A.attention_fwd(q, k, v, out=out, lse=np.zeros((1, 2, 5), np.float32))
    with pytest.raises(xte.XteValueError, match="cu_seqlens_q"):
        A.attention_fwd(q[0], k[0], v[0], layout="thd")
    with pytest.raises(xte.XteDTypeError, match="lse"):
        A.attention_fwd(q, k, v, lse=np.zeros((1, 2, 4), np.float64))
    assert np.all(out == 3.0) and np.all(lse == 3.0)
    o, l_ = A.attention_fwd(q, k, v, out=out, lse=lse)
    assert o is out and l_ is lse and not np.all(out == 3.0)
    dq = np.empty_like(q)
    r = A.attention_bwd(q, k, v, out, rnd(rng, out.shape), lse, dq=dq)
    assert r[0] is dq


def test_torch_same_bytes():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(26)
    q, k, v = rnd(rng, (1, 5, 2, 8)), rnd(rng, (1, 7, 1, 8)), rnd(rng, (1, 7, 1, 8))
    on, ln = A.attention_fwd(q, k, v, mask="causal_bottom_right", softcap=3.0)
    ot, lt = A.attention_fwd(*(torch.from_numpy(x) for x in (q, k, v)),
                             mask="causal_bottom_right", softcap=3.0)
    assert isinstance(ot, torch.Tensor) and isinstance(lt, torch.Tensor)
    assert ot.numpy().tobytes() == on.tobytes() and lt.numpy().tobytes() == ln.tobytes()
    do = rnd(rng, on.shape)
    gn = A.attention_bwd(q, k, v, on, do, ln, mask="causal_bottom_right", softcap=3.0)
    gt = A.attention_bwd(*(torch.from_numpy(x) for x in (q, k, v)), ot, torch.from_numpy(do), lt,
                         mask="causal_bottom_right", softcap=3.0)
    for a, b in zip(gt, gn):
        assert a.numpy().tobytes() == b.tobytes()


def test_empty_query():
    k = np.ones((1, 3, 2, 8), np.float32)
    out, lse = A.attention_fwd(np.zeros((1, 0, 2, 8), np.float32), k, k)
    assert out.shape == (1, 0, 2, 8) and lse.shape == (1, 2, 0)


# ------------------------------------------------------------------------------- mode


@pytest.mark.parametrize("c", CASES[:5], ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items())
                         or "plain")
def test_fast_mode_within_bound_and_repeatable(c):
    """mode="fast" (XTE_ATTENTION_FAST): the same bound against the fp64 oracle, forward and
    backward, the same bytes run to run; the default is "exact" (its bytes unchanged by the
    keyword)."""
    rng = np.random.default_rng(len(str(c)) + 7)
    q, k, v, kw, xkw = _case(c, rng)
    out, lse = A.attention_fwd(q, k, v, mode="fast", **xkw)
    do = rnd(rng, out.shape)
    O64, L64, dq64, dk64, dv64 = ref_bshd(q, k, v, np.float64, dout=do, **kw)
    O32, L32, dq32, dk32, dv32 = ref_bshd(q, k, v, np.float32, dout=do, **kw)
    atol = 2.0 ** -21 if kw["softcap"] else 2.0 ** -22
    check_bound(out, O64, O32, atol, "O fast")
    check_bound(lse, L64, L32, 1e-5, "LSE fast")
    dq, dk, dv = A.attention_bwd(q, k, v, out, do, lse, mode="fast", **xkw)
    check_bound(dq, dq64, dq32, atol, "dQ fast")
    check_bound(dk, dk64, dk32, atol, "dK fast")
    check_bound(dv, dv64, dv32, atol, "dV fast")
    out2, lse2 = A.attention_fwd(q, k, v, mode="FAST", **xkw)
    grads2 = A.attention_bwd(q, k, v, out, do, lse, mode="fast", **xkw)
    assert out2.tobytes() == out.tobytes() and lse2.tobytes() == lse.tobytes()
    for a, b in zip((dq, dk, dv), grads2):
        assert a.tobytes() == b.tobytes()
    oe, le = A.attention_fwd(q, k, v, **xkw)
    oe2, le2 = A.attention_fwd(q, k, v, mode="exact", **xkw)
    assert oe.tobytes() == oe2.tobytes() and le.tobytes() == le2.tobytes()
    ge = A.attention_bwd(q, k, v, oe, do, le, **xkw)
    assert ge[0].tobytes() != dq.tobytes() or np.all(dq == 0)  # FAST is taken (no renormalisation)


def test_mode_keyword_refused():
    q = np.zeros((1, 4, 1, 8), np.float32)
    for bad in ("fastest", 2, None, [1]):
        with pytest.raises(xte.XteError) as e:
            A.attention_fwd(q, q, q, mode=bad)
        assert "mode" in str(e.value)
