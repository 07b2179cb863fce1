"""xte.transformer_engine.pytorch.router (TransformerEngine's fused_topk_with_score_function,
fused_compute_score_for_moe_aux_loss, fused_moe_aux_loss) against torch fp64 oracles written
here from TE's documented semantics and xte's contract (docs/numerics.md section 8), not from the
C code.

Quantile Balancing (TE main): the selection, the cutoff and the histogram exact (the bins by TE's
reference fp32 order, from the op's own scores), the probs and gradients as above.

Exact: the selection (bool / bit routing maps, dense top-k indices in every integer dtype), the
zeros off the selection, the return types / dtypes / shapes (leading dimensions kept), probs in
the logits' dtype as the fp32 probs rounded once, bitmap == packed bytemap. Within (E + 8) fp32
ulps relative of the fp64 oracle: probs and scores. Gradients (torch autograd of the fp64
oracle): rtol 1e-5 over the row's largest gradient. Also: torch.compile(fullgraph=True),
torch.library.opcheck of the ops, topk 32 / 100 and 1024+ experts, the sequence-level aux loss."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from xte.torch import _ops  # noqa: E402,F401
from xte.transformer_engine.pytorch import router as R  # noqa: E402

ULP = 2.0 ** -24


# ------------------------------------------------------------------------------- oracle


def ref_router(x, topk, pre=False, num_groups=None, group_topk=None, scaling=None,
               score="softmax", bias=None):
    """fp64 TE router on logits x [T, E] (any float dtype): (probs, bool map); differentiable."""
    x = x.to(torch.float64)
    T, E = x.shape
    if score == "softmax":
        sc = torch.softmax(x, -1) if pre else x
    elif score == "sigmoid":
        sc = torch.sigmoid(x)
    else:
        sc = torch.sqrt(torch.nn.functional.softplus(x))
    sel = sc.detach() + (bias.to(torch.float64) if bias is not None else 0.0)
    if group_topk:
        gsz = E // num_groups
        gscore = sel.view(T, num_groups, gsz).topk(topk // group_topk, -1)[0].sum(-1)
        keep = torch.zeros(T, num_groups, dtype=torch.bool)
        keep.scatter_(1, gscore.topk(group_topk, -1)[1], True)
        sel = sel.masked_fill(~keep.repeat_interleave(gsz, 1), float("-inf"))
    idx = sel.topk(topk, -1)[1]
    g = sc.gather(1, idx)
    if score == "softmax" and not pre:
        w = torch.softmax(g, -1)
    elif score != "softmax" and topk > 1:
        w = g / (g.sum(-1, keepdim=True) + 1e-20)
    else:
        w = g
    w = w * (1.0 if scaling is None else scaling)
    probs = torch.zeros(T, E, dtype=torch.float64).scatter(1, idx, w)
    rmap = torch.zeros(T, E, dtype=torch.bool).scatter(1, idx, True)
    return probs, rmap


def ref_aux_scores(x, topk, score):
    x = x.to(torch.float64)
    if score == "softmax":
        s = torch.softmax(x, -1)
    else:
        s = torch.sigmoid(x) if score == "sigmoid" else torch.sqrt(torch.nn.functional.softplus(x))
        s = s / (s.sum(-1, keepdim=True) + 1e-20)
    rmap = torch.zeros(x.shape, dtype=torch.bool).scatter(1, s.detach().topk(topk, -1)[1], True)
    return rmap, s


def pack_bits(m):
    """bool [..., E] -> uint8 [..., ceil(E/8)], bit e % 8 of byte e / 8 (NumPy's packbits)."""
    return torch.from_numpy(np.packbits(m.numpy().astype(np.uint8), axis=-1, bitorder="little"))


def distinct_logits(T, E, seed, dtype=torch.float32, spread=0.01):
    """Logits whose values are distinct and far apart in every row (a permuted grid plus a small
    per-token offset), so the fp64 oracle's selection is the fp32 kernel's."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.stack([torch.randperm(E, generator=g) for _ in range(T)])
    x = (perm.to(torch.float64) - E / 2) * spread + torch.rand(T, 1, generator=g) * spread * 0.5
    return x.to(dtype)


def close(got, want, E):
    got = got.detach().to(torch.float64)
    want = want.detach().to(torch.float64)
    tol = (E + 8) * ULP * want.abs() + 1e-30
    bad = (got - want).abs() > tol
    assert not bad.any(), f"max rel err {((got - want).abs() / (want.abs() + 1e-30)).max()}"


def grad_close(got, want):
    """Gradients within 1e-5 of the row's largest |want| (fp32 steps of O(E) terms)."""
    got = got.detach().to(torch.float64)
    scale = want.abs().amax(-1, keepdim=True) + 1e-30
    err = ((got - want) / scale).abs().max()
    assert err <= 1e-5, f"grad max err {err} of the row scale"


CASES = [  # (T, E, topk, score, pre, num_groups, group_topk, scaling, bias)
    (37, 32, 4, "softmax", True, None, None, None, False),
    (37, 32, 4, "softmax", False, None, None, 1.2, False),
    (19, 128, 8, "sigmoid", False, 8, 4, 2.5, True),
    (19, 128, 8, "sqrtsoftplus", False, None, None, None, True),
    (11, 1024, 32, "sigmoid", False, None, None, 1.2, True),  # TE's topk 32 / 1024 experts
    (9, 1024, 32, "softmax", True, 8, 4, None, False),
    (7, 2051, 100, "softmax", False, None, None, None, False),  # past the merge-sort switch
    (5, 96, 96, "sqrtsoftplus", False, None, None, None, False),  # topk == E
    (13, 40, 1, "sigmoid", False, None, None, None, True),
]


# ------------------------------------------------------------------------------- router


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}k{c[2]}{c[3]}")
def test_router_forward_backward(case):
    T, E, k, score, pre, ng, gt, scale, with_bias = case
    x = distinct_logits(T, E, seed=E + k)
    bias = (torch.arange(E, dtype=torch.float32).flip(0) * 1e-3) if with_bias else None
    xr = x.clone().requires_grad_(True)
    want, wmap = ref_router(xr, k, pre, ng, gt, scale, score, bias)
    xf = x.clone().requires_grad_(True)
    probs, rmap = R.fused_topk_with_score_function(xf, k, pre, ng, gt, scale, score, bias)
    assert probs.dtype == torch.float32 and probs.shape == (T, E)
    assert rmap.dtype == torch.bool and rmap.shape == (T, E)
    assert torch.equal(rmap, wmap)
    assert torch.all(probs[~rmap] == 0)
    close(probs, want, E)
    gout = torch.randn(T, E, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    (want * gout).sum().backward()
    (probs * gout.float()).sum().backward()
    grad_close(xf.grad, xr.grad)


@pytest.mark.parametrize("idx_dtype", [torch.int16, torch.int32, torch.int64])
def test_dense_topk_indices(idx_dtype):
    T, E, k = 21, 1024, 32
    x = distinct_logits(T, E, seed=3)
    buf = torch.empty(T, k, dtype=idx_dtype)
    probs, out = R.fused_topk_with_score_function(x, k, False, None, None, None, "sigmoid", None,
                                                  topk_indices=buf)
    assert out is buf and out.dtype == idx_dtype
    _, wmap = ref_router(x, k, score="sigmoid")
    # rank order: the experts by descending score
    want = ref_router(x, k, score="sigmoid")[0].topk(k, -1)[1]
    assert torch.equal(out.to(torch.int64), want)
    assert torch.equal(torch.zeros(T, E, dtype=torch.bool).scatter(1, out.long(), True), wmap)
    # gradients flow through probs with the dense form too
    xf = x.clone().requires_grad_(True)
    p2, _ = R.fused_topk_with_score_function(xf, k, False, None, None, None, "sigmoid", None,
                                             topk_indices=torch.empty(T, k, dtype=idx_dtype))
    assert torch.equal(p2.detach(), probs)
    p2.sum().backward()
    assert xf.grad is not None and torch.isfinite(xf.grad).all()


@pytest.mark.parametrize("score", ["softmax", "sigmoid", "sqrtsoftplus"])
@pytest.mark.parametrize("E", [32, 130])
def test_bitmap_equals_packed_bytemap(score, E):
    T, k = 17, 8
    x = distinct_logits(T, E, seed=E)
    pb, mb = R.fused_topk_with_score_function(x, k, False, None, None, None, score, None,
                                              routing_map_format=R.RoutingMapFormat.BYTEMAP)
    for fmt in (R.RoutingMapFormat.BITMAP_U8, "bitmap_u8", 1):
        pbits, bits = R.fused_topk_with_score_function(x, k, False, None, None, None, score,
                                                       None, routing_map_format=fmt)
        assert bits.dtype == torch.uint8 and bits.shape == (T, (E + 7) // 8)
        assert torch.equal(bits, pack_bits(mb))
        assert torch.equal(pbits, pb)
    ms, _ = R.fused_compute_score_for_moe_aux_loss(x, k, score)
    bs, _ = R.fused_compute_score_for_moe_aux_loss(x, k, score, routing_map_format="bitmap_u8")
    assert bs.shape == (T, (E + 7) // 8) and torch.equal(bs, pack_bits(ms))
    with pytest.raises(ValueError):
        R.fused_topk_with_score_function(x, k, False, None, None, None, score, None,
                                         routing_map_format="BITMAP")
    with pytest.raises(ValueError):
        R.fused_topk_with_score_function(x, k, False, None, None, None, score, None,
                                         routing_map_format=2)


def test_leading_dims():
    x = distinct_logits(24, 32, seed=5).reshape(4, 6, 32)
    probs, rmap = R.fused_topk_with_score_function(x, 4, False, None, None, None, "softmax", None)
    assert probs.shape == x.shape and rmap.shape == x.shape
    p2, m2 = R.fused_topk_with_score_function(x.reshape(24, 32), 4, False, None, None, None,
                                              "softmax", None)
    assert torch.equal(probs.reshape(24, 32), p2) and torch.equal(rmap.reshape(24, 32), m2)
    idx = torch.empty(4, 6, 4, dtype=torch.int16)
    _, out = R.fused_topk_with_score_function(x, 4, False, None, None, None, "softmax", None,
                                              topk_indices=idx)
    assert out.shape == (4, 6, 4)
    _, bits = R.fused_topk_with_score_function(x, 4, False, None, None, None, "softmax", None,
                                               routing_map_format="bitmap_u8")
    assert bits.shape == (4, 6, 4)
    m, s = R.fused_compute_score_for_moe_aux_loss(x, 4, "sigmoid")
    assert m.shape == x.shape and s.shape == x.shape and s.dtype == torch.float32


def test_strided_inputs():
    x = distinct_logits(40, 24, seed=8)
    xt = x.t().contiguous().t()  # column-major storage
    p1, m1 = R.fused_topk_with_score_function(x, 3, True, None, None, None, "softmax", None)
    p2, m2 = R.fused_topk_with_score_function(xt, 3, True, None, None, None, "softmax", None)
    assert torch.equal(p1, p2) and torch.equal(m1, m2)
    tpe = torch.arange(1, 25, dtype=torch.int32)
    assert torch.equal(R.fused_moe_aux_loss(p1, tpe, 40, 24, 3, 0.1),
                       R.fused_moe_aux_loss(p1.t().contiguous().t(), tpe, 40, 24, 3, 0.1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_logits(dtype):
    T, E, k = 23, 64, 6
    x = distinct_logits(T, E, seed=11, dtype=dtype, spread=0.05)
    for score in ("softmax", "sigmoid"):
        xf = x.clone().requires_grad_(True)
        probs, rmap = R.fused_topk_with_score_function(xf, k, False, None, None, 1.5, score, None)
        assert probs.dtype == dtype and rmap.dtype == torch.bool
        # probs: the fp32 probs of the same (exactly widened) logits rounded once to dtype
        p32, m32 = R.fused_topk_with_score_function(x.float(), k, False, None, None, 1.5, score,
                                                    None)
        assert torch.equal(rmap, m32)
        assert torch.equal(probs, p32.to(dtype))
        want, wmap = ref_router(x, k, scaling=1.5, score=score)
        assert torch.equal(rmap, wmap)
        # weights exact in dtype: the gradient of probs arrives in dtype, as in TE
        w = torch.rand(T, E, generator=torch.Generator().manual_seed(1)).to(dtype).double()
        (probs.float() * w.float()).sum().backward()
        assert xf.grad.dtype == dtype
        xr = x.to(torch.float64).requires_grad_(True)
        (ref_router(xr, k, scaling=1.5, score=score)[0] * w).sum().backward()
        g = xf.grad.to(torch.float64)
        scale = xr.grad.abs().amax(-1, keepdim=True) + 1e-30
        # fp32 arithmetic, then one rounding to bf16 / fp16 (2^-9 / 2^-12 relative)
        assert ((g - xr.grad) / scale).abs().max() <= (2.0 ** -8 if dtype == torch.bfloat16
                                                       else 2.0 ** -11)
    s16 = R.fused_compute_score_for_moe_aux_loss(x, k, "sigmoid")[1]
    assert s16.dtype == torch.float32


def test_ties_break_by_lower_index():
    x = torch.tensor([[1.0, 3.0, 3.0, 3.0, -1.0, 3.0]])
    _, rmap = R.fused_topk_with_score_function(x, 2, False, None, None, None, "sigmoid", None)
    assert rmap[0].tolist() == [False, True, True, False, False, False]


def test_argument_errors():
    x = distinct_logits(4, 16, seed=1)
    with pytest.raises(ValueError, match="float64"):
        R.fused_topk_with_score_function(x.double(), 2, False, None, None, None, "softmax", None)
    with pytest.raises(ValueError, match="score_function"):
        R.fused_topk_with_score_function(x, 2, False, None, None, None, "relu", None)
    hist = torch.zeros(16, 8, dtype=torch.int32)
    bounds = torch.tensor([-1.0, 1.0])
    with pytest.raises(ValueError, match="provided together"):
        R.fused_topk_with_score_function(x, 2, False, None, None, None, "sigmoid",
                                         torch.zeros(16), qb_histogram=hist)
    with pytest.raises(ValueError, match="only supports"):
        R.fused_topk_with_score_function(x, 2, False, None, None, None, "softmax",
                                         torch.zeros(16), qb_histogram=hist, qb_bin_bounds=bounds,
                                         qb_histogram_mode="two_kernel")
    with pytest.raises(ValueError, match="lower < upper"):
        R.fused_topk_with_score_function(x, 2, False, None, None, None, "sigmoid",
                                         torch.zeros(16), qb_histogram=hist,
                                         qb_bin_bounds=torch.tensor([1.0, 1.0]),
                                         qb_histogram_mode="two_kernel")
    with pytest.raises(ValueError, match="qb_histogram_mode"):
        R.fused_topk_with_score_function(x, 2, False, None, None, None, "sigmoid",
                                         torch.zeros(16), qb_histogram=hist, qb_bin_bounds=bounds,
                                         qb_histogram_mode="atomic")
    with pytest.raises(ValueError, match="grouped"):
        R.fused_topk_with_score_function(x, 2, False, 4, 2, None, "sigmoid", torch.zeros(16),
                                         qb_histogram=hist, qb_bin_bounds=bounds,
                                         qb_histogram_mode="two_kernel")
    with pytest.raises(Exception, match="topk"):
        R.fused_topk_with_score_function(x, 17, False, None, None, None, "softmax", None)


# ------------------------------------------------------------------------------- aux


@pytest.mark.parametrize("score", ["softmax", "sigmoid", "sqrtsoftplus"])
@pytest.mark.parametrize("E,k", [(32, 1), (256, 8), (1024, 32)])
def test_aux_scores(score, E, k):
    T = 13
    x = distinct_logits(T, E, seed=E + 1)
    xr = x.clone().requires_grad_(True)
    wmap, want = ref_aux_scores(xr, k, score)
    xf = x.clone().requires_grad_(True)
    rmap, scores = R.fused_compute_score_for_moe_aux_loss(xf, k, score)
    assert rmap.dtype == torch.bool and scores.dtype == torch.float32
    assert torch.equal(rmap, wmap)
    close(scores, want, E)
    g = torch.randn(T, E, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (want * g).sum().backward()
    (scores * g.float()).sum().backward()
    grad_close(xf.grad, xr.grad)


def ref_aux_loss(p, tpe, N, ne, k, coeff):
    """fp64 aux loss; coeff is taken as the fp32 the functions (TE's and xte's) receive."""
    p = p.to(torch.float64)
    c = float(np.float32(coeff))
    return (p.sum(0) * tpe.to(torch.float64)).sum() * (ne * c / (k * N * N))


@pytest.mark.parametrize("mult", [1, 2, 4])
@pytest.mark.parametrize("tdt", [torch.int32, torch.int64, torch.float32])
def test_aux_loss_sequence_level(mult, tdt):
    T, ne, k, coeff = 1500, 64, 8, 0.01
    cols = ne * mult
    g = torch.Generator().manual_seed(mult)
    p = torch.rand(T, cols, generator=g)
    tpe = torch.randint(1, 1000, (cols,), generator=g).to(tdt)
    pr = p.to(torch.float64).requires_grad_(True)
    want = ref_aux_loss(pr, tpe, T, ne, k, coeff)
    pf = p.clone().requires_grad_(True)
    loss = R.fused_moe_aux_loss(pf, tpe, T, ne, k, coeff)
    assert loss.dtype == torch.float32 and loss.shape == ()
    # fp64 sums rounded once: within one fp32 rounding of the fp64 value
    assert abs(float(loss.detach()) - float(want.detach())) <= abs(float(want.detach())) * ULP
    want.backward()
    loss.backward()
    assert pf.grad.shape == (T, cols)
    assert torch.allclose(pf.grad.double(), pr.grad, rtol=ULP, atol=0)
    # the total as a tensor (TE's graph-safe form) gives the same bytes
    l2 = R.fused_moe_aux_loss(p, tpe, torch.tensor(T, dtype=torch.int64), ne, k, coeff)
    assert torch.equal(l2, loss.detach())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_aux_loss_low_precision(dtype):
    T, E, k = 100, 32, 4
    p = torch.rand(T, E, generator=torch.Generator().manual_seed(3)).to(dtype).requires_grad_(True)
    tpe = torch.randint(1, 100, (E,), dtype=torch.int32)
    loss = R.fused_moe_aux_loss(p, tpe, T, E, k, 0.1)
    assert loss.dtype == dtype
    want = ref_aux_loss(p.detach(), tpe, T, E, k, 0.1)
    assert torch.equal(loss, want.to(torch.float32).to(dtype))
    loss.backward()
    assert p.grad.dtype == dtype


def test_aux_loss_bad_num_experts():
    p = torch.rand(8, 12)
    tpe = torch.ones(12, dtype=torch.int32)
    with pytest.raises(Exception, match="num_experts"):
        R.fused_moe_aux_loss(p, tpe, 8, 5, 2, 0.1)


# ------------------------------------------------------------------------------- compile


def test_torch_compile_fullgraph():
    T, E, k = 16, 64, 4
    x = distinct_logits(T, E, seed=9)
    bias = torch.linspace(-0.1, 0.1, E)
    tpe = torch.randint(1, 50, (E,), dtype=torch.int32)

    def f(x):
        probs, rmap = R.fused_topk_with_score_function(x, k, False, 8, 2, 1.5, "sigmoid", bias)
        _, bits = R.fused_topk_with_score_function(x, k, True, None, None, None, "softmax", None,
                                                   routing_map_format="bitmap_u8")
        m, s = R.fused_compute_score_for_moe_aux_loss(x, k, "sqrtsoftplus")
        loss = R.fused_moe_aux_loss(s, tpe, T, E, k, 0.01)
        return probs.sum() + loss, rmap, bits, m

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    xe = x.clone().requires_grad_(True)
    xc = x.clone().requires_grad_(True)
    re, rc = f(xe), cf(xc)
    for a, b in zip(re, rc):
        assert torch.equal(a.detach(), b.detach())
    re[0].backward()
    rc[0].backward()
    assert torch.equal(xe.grad, xc.grad)

    def g(x, idx):
        return R.fused_topk_with_score_function(x, k, False, None, None, None, "softmax", None,
                                                topk_indices=idx)

    cg = torch.compile(g, fullgraph=True, backend="aot_eager")
    i1, i2 = torch.empty(T, k, dtype=torch.int16), torch.empty(T, k, dtype=torch.int16)
    p1, o1 = g(x, i1)
    p2, o2 = cg(x, i2)
    assert torch.equal(p1, p2) and torch.equal(i1, i2) and torch.equal(o2, i2)


def test_opcheck():
    opcheck = torch.library.opcheck
    x = distinct_logits(6, 40, seed=4)
    b = torch.linspace(-0.1, 0.1, 40)
    for args in ((x, b, 4, 1, False, 4, 2, 1.5, True, True),
                 (x, None, 3, 0, True, 0, 0, 1.0, False, False),
                 (x.to(torch.bfloat16), None, 2, 2, False, 0, 0, 1.0, True, False)):
        xa = args[0].clone().requires_grad_(True)
        opcheck(torch.ops.xte.te_router.default, (xa,) + args[1:])
    for wb in (False, True):
        opcheck(torch.ops.xte.te_aux_scores.default, (x.clone().requires_grad_(True), 3, 1, wb))
    p = torch.rand(6, 40, requires_grad=True)
    tpe = torch.randint(1, 9, (40,), dtype=torch.int32)
    opcheck(torch.ops.xte.te_aux_loss.default, (p, tpe, 6, None, 20, 2, 0.1))
    opcheck(torch.ops.xte.te_aux_loss.default,
            (p, tpe, 0, torch.tensor([6], dtype=torch.int64), 40, 2, 0.1))


# ------------------------------------------------------------------------------- QB


def ref_qb_bins(cutoff, raw, lower, upper, num_bins):
    """TE's reference binning in its fp32 operation order (torch fp32 tensors): scale =
    (1 / (upper - lower)) * num_bins, floor(((cutoff - raw) - lower) * scale), clamped."""
    lo, up = torch.tensor(lower, dtype=torch.float32), torch.tensor(upper, dtype=torch.float32)
    scale = torch.reciprocal(up - lo) * num_bins
    v = ((cutoff.unsqueeze(1) - raw) - lo) * scale
    b = torch.floor(v)
    b = torch.where(torch.isfinite(b) & (b.abs() < 2.0 ** 62), b, torch.zeros_like(b))
    return b.to(torch.int64).clamp(0, num_bins - 1)


@pytest.mark.parametrize("topk,fmt", [(8, "bytemap"), (16, "bitmap_u8"), (1, "dense")])
def test_quantile_balancing(topk, fmt):
    T, E, nb = 57, 96, 50
    g = torch.Generator().manual_seed(topk)
    x = torch.randn(T, E, generator=g)
    bias = torch.linspace(-0.2, 0.2, E)
    bounds = torch.tensor([-1.2, 1.2])
    hist = torch.full((E, nb), 7, dtype=torch.int32)  # accumulated in place
    idx = torch.empty(T, topk, dtype=torch.int16) if fmt == "dense" else None
    xf = x.clone().requires_grad_(True)
    probs, rout = R.fused_topk_with_score_function(
        xf, topk, False, None, None, 1.5, "sigmoid", bias,
        routing_map_format="bitmap_u8" if fmt == "bitmap_u8" else "bytemap", topk_indices=idx,
        qb_histogram=hist, qb_bin_bounds=bounds, qb_histogram_mode="two_kernel")
    # oracle: the top k + 1 of sigmoid + bias in rank order (value desc, index asc), the last
    # dropped; its biased score is the cutoff
    raw = torch.sigmoid(x.double())
    sel = (raw.float() + bias).double()
    order = torch.sort(sel, dim=1, descending=True, stable=True)[1]
    keep, drop = order[:, :topk], order[:, topk]
    wmap = torch.zeros(T, E, dtype=torch.bool).scatter(1, keep, True)
    if fmt == "dense":
        assert rout is idx and torch.equal(rout.long(), keep)
    elif fmt == "bitmap_u8":
        assert torch.equal(rout, pack_bits(wmap))
    else:
        assert torch.equal(rout, wmap)
    w = raw.gather(1, keep)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) if topk > 1 else w
    want = torch.zeros(T, E, dtype=torch.float64).scatter(1, keep, 1.5 * w)
    close(probs, want, E)
    # the histogram from the op's own scores and cutoff, binned by TE's reference order
    _, _, _, _, saved, cutoff, counts = torch.ops.xte.te_router_qb(
        x, bias, topk, 1.5, bounds, nb, False, False)
    close(saved, raw, 8)
    assert torch.equal(cutoff, (saved + bias).gather(1, drop.unsqueeze(1)).squeeze(1))
    bins = ref_qb_bins(cutoff, saved, -1.2, 1.2, nb)
    wh = torch.zeros(E, nb, dtype=torch.int64)
    wh.scatter_add_(1, bins.t(), torch.ones(E, T, dtype=torch.int64))
    assert torch.equal(counts.long(), wh)
    assert torch.equal(hist.long(), wh + 7)
    # backward: the sigmoid router's over the k kept
    gw = torch.randn(T, E, generator=g, dtype=torch.float64)
    xr = x.double().requires_grad_(True)
    s = torch.sigmoid(xr).gather(1, keep)
    s = s / (s.sum(-1, keepdim=True) + 1e-20) if topk > 1 else s
    (torch.zeros(T, E, dtype=torch.float64).scatter(1, keep, 1.5 * s) * gw).sum().backward()
    (probs * gw.float()).sum().backward()
    grad_close(xf.grad, xr.grad)


def test_quantile_balancing_bins_clamp_and_modes():
    T, E, nb = 40, 16, 8
    x = torch.randn(T, E, generator=torch.Generator().manual_seed(5)) * 3
    x[0] = -5.0
    x[0, :3] = 3.0  # top-(k+1) all tied: the largest expert id (2) is the one dropped
    bias = torch.zeros(E)
    bounds = torch.tensor([-0.05, 0.05])  # narrow: most counts clamp into the end bins
    hs = []
    for mode in ("two_kernel", "fused_atomic", R.QBHistogramMode.FUSED_ATOMIC):
        h = torch.zeros(E, nb, dtype=torch.int32)
        _, m = R.fused_topk_with_score_function(x, 2, False, None, None, None, "sigmoid", bias,
                                                qb_histogram=h, qb_bin_bounds=bounds,
                                                qb_histogram_mode=mode)
        assert m[0, :4].tolist() == [True, True, False, False]
        hs.append(h)
    assert torch.equal(hs[0], hs[1]) and torch.equal(hs[0], hs[2])
    assert int(hs[0].sum()) == T * E
    assert hs[0][:, 0].sum() > 0 and hs[0][:, -1].sum() > 0
    _, _, _, _, saved, cutoff, counts = torch.ops.xte.te_router_qb(x, bias, 2, 1.0, bounds, nb,
                                                                  False, False)
    bins = ref_qb_bins(cutoff, saved, -0.05, 0.05, nb)
    wh = torch.zeros(E, nb, dtype=torch.int64).scatter_add_(1, bins.t(),
                                                             torch.ones(E, T, dtype=torch.int64))
    assert torch.equal(hs[0].long(), wh)


def test_raw_qb_binding_matches_the_router():
    """xte.transformer_engine_torch.fused_topk_with_score_function_qb_fwd (TE's `tex` binding):
    the router's probs and map, the counts added into the histogram in place, topk_indices filled
    in place, RuntimeError for bad bin bounds with the histogram untouched."""
    import xte.transformer_engine_torch as tex
    T, E, k, nb = 24, 12, 3, 6
    g = torch.Generator().manual_seed(11)
    x = torch.randn(T, E, generator=g)
    bias = torch.linspace(-0.2, 0.2, E)
    bounds = torch.tensor([-1.0, 1.0])
    h0 = torch.full((E, nb), 5, dtype=torch.int32)
    p0, m0 = R.fused_topk_with_score_function(x, k, False, None, None, 2.0, "sigmoid", bias,
                                              qb_histogram=h0, qb_bin_bounds=bounds,
                                              qb_histogram_mode="two_kernel")
    h1 = torch.full((E, nb), 5, dtype=torch.int32)
    p1, m1, raw, cutoff, hr = tex.fused_topk_with_score_function_qb_fwd(
        x, k, 2.0, bias, tex.NVTERoutingMapFormat.BYTEMAP, None, h1, bounds,
        tex.NVTEQBHistogramMode.TWO_KERNEL)
    assert hr is h1 and torch.equal(h1, h0) and int(h1.sum()) == 5 * E * nb + T * E
    assert torch.equal(p1, p0) and torch.equal(m1, m0) and m1.dtype == torch.bool
    close(raw, torch.sigmoid(x.double()), 8)
    assert cutoff.shape == (T,)
    idx = torch.zeros(T, k, dtype=torch.int16)
    h2 = torch.zeros(E, nb, dtype=torch.int32)
    _, out, _, _, _ = tex.fused_topk_with_score_function_qb_fwd(
        x, k, 2.0, bias, tex.NVTERoutingMapFormat.BYTEMAP, idx, h2, bounds,
        tex.NVTEQBHistogramMode.FUSED_ATOMIC)
    assert out is idx
    assert torch.equal(torch.zeros(T, E, dtype=torch.bool).scatter(1, idx.long(), True), m0)
    h3 = torch.zeros(E, nb, dtype=torch.int32)
    with pytest.raises(RuntimeError):
        tex.fused_topk_with_score_function_qb_fwd(
            x, k, 2.0, bias, tex.NVTERoutingMapFormat.BYTEMAP, None, h3,
            torch.tensor([1.0, -1.0]), tex.NVTEQBHistogramMode.TWO_KERNEL)
    assert int(h3.abs().sum()) == 0
