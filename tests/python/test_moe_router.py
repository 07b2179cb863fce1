"""xte.ops.moe router, aux scores and aux loss against NumPy restatements of TransformerEngine's
PyTorch reference (Megatron's topk_softmax_with_capacity / compute_routing_scores_for_aux_loss /
switch_load_balancing_loss_func), written from the formulas of docs/numerics.md section 8, not
from the C code.

What is exact and what is a tolerance (docs/numerics.md section 8): the selection (routing map,
top-k indices in rank order, bit map), the zeros outside the selection, topk_weights == probs at
topk_idx, and the aux loss / its backward are bits. The probs go through xte_expf / sigmoid /
sqrtsoftplus (1 / 2.5 / 2 ulp against libm) then a few fp32 operations, so they are compared with
an fp64 oracle within (E + 8) fp32 ulps relative. NumPy in gives NumPy out; torch in (when
installed) gives torch out with the same bytes."""

import ml_dtypes
import numpy as np
import pytest

import xte
from xte.ops import moe

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
BF16 = ml_dtypes.bfloat16
ULP = 2.0 ** -24


# ------------------------------------------------------------------------------- oracle


def ref_router(logits, topk, pre=False, num_groups=None, group_topk=None, scaling=None,
               score="softmax", bias=None):
    x = np.asarray(logits, dtype=np.float64)
    T, E = x.shape
    if score == "softmax":
        if pre:
            ex = np.exp(x - x.max(axis=1, keepdims=True))
            scores = ex / ex.sum(axis=1, keepdims=True)
        else:
            scores = x.copy()
    elif score == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-x))
    else:
        scores = np.sqrt(np.log1p(np.exp(x)))
    sel = scores + (0 if bias is None else np.asarray(bias, np.float64))
    idx = np.zeros((T, topk), np.int64)
    probs = np.zeros((T, E))
    for t in range(T):
        s = sel[t].copy()
        if num_groups and num_groups > 1:
            g = E // num_groups
            per = topk // group_topk
            gs = [np.sort(s[i * g:(i + 1) * g])[::-1][:per].sum() for i in range(num_groups)]
            keep = sorted(range(num_groups), key=lambda i: (-gs[i], i))[:group_topk]
            for i in range(num_groups):
                if i not in keep:
                    s[i * g:(i + 1) * g] = -np.inf
        order = sorted(range(E), key=lambda e: (-s[e], e))[:topk]
        idx[t] = order
        if score == "softmax":
            if pre:
                w = scores[t, order]
            else:
                z = x[t, order]
                w = np.exp(z - z.max())
                w = w / w.sum()
        else:
            w = scores[t, order]
            if topk > 1:
                w = w / (w.sum() + 1e-20)
        probs[t, order] = (1.0 if scaling is None else scaling) * w
    return idx, probs


def close(got, want, E):
    got = np.asarray(got, np.float64)
    tol = (E + 8) * ULP * np.abs(want) + 1e-30
    bad = np.abs(got - want) > tol
    assert not bad.any(), f"max rel err {np.max(np.abs(got - want) / (np.abs(want) + 1e-30))}"


def rand_logits(rng, T, E, dtype=np.float32):
    return rng.standard_normal((T, E)).astype(np.float32).astype(dtype)


# ------------------------------------------------------------------------------- forward

CASES = [
    dict(score="softmax", pre=True, topk=2),
    dict(score="softmax", pre=False, topk=3),
    dict(score="sigmoid", topk=4, bias=True, scaling=2.5),
    dict(score="sigmoid", topk=1),
    dict(score="sqrtsoftplus", topk=2, bias=True),
    dict(score="sigmoid", topk=4, num_groups=4, group_topk=2, bias=True),
    dict(score="softmax", pre=True, topk=4, num_groups=8, group_topk=4),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
def test_router_forward_matches_reference(case, dtype):
    rng = np.random.default_rng(len(str(case)))
    T, E = 13, 32
    logits = rand_logits(rng, T, E, dtype)
    bias = rng.standard_normal(E).astype(np.float32) * 0.1 if case.get("bias") else None
    kw = dict(use_pre_softmax=case.get("pre", False), num_groups=case.get("num_groups"),
              group_topk=case.get("group_topk"), scaling_factor=case.get("scaling"),
              score_function=case["score"], expert_bias=bias)
    k = case["topk"]
    probs, rmap, saved, weights = xte.ops.moe.fused_topk_with_score_function(
        logits, k, return_intermediate=True, return_topk_weights=True, **kw)
    assert isinstance(probs, np.ndarray) and probs.dtype == np.float32 and probs.shape == (T, E)
    assert rmap.dtype == np.bool_ and rmap.shape == (T, E)
    want_idx, want_probs = ref_router(logits, k, case.get("pre", False), case.get("num_groups"),
                                      case.get("group_topk"), case.get("scaling"),
                                      case["score"], bias)
    want_map = np.zeros((T, E), bool)
    np.put_along_axis(want_map, want_idx, True, axis=1)
    assert np.array_equal(rmap, want_map)
    assert np.all(probs[~want_map].view(np.uint32) == 0)  # +0 exactly
    close(probs, want_probs, E)
    # topk indices in rank order, topk_weights = probs at them (bits), bit map = packbits
    idx = np.empty((T, k), np.int32)
    p2, idx_out, w2 = moe.fused_topk_with_score_function(logits, k, topk_indices=idx,
                                                         return_topk_weights=True, **kw)
    assert idx_out is idx and np.array_equal(idx, want_idx)
    assert np.array_equal(p2.view(np.uint32), probs.view(np.uint32))
    assert np.array_equal(w2.view(np.uint32),
                          np.take_along_axis(probs, want_idx, 1).view(np.uint32))
    assert np.array_equal(weights.view(np.uint32), w2.view(np.uint32))
    _, bits = moe.fused_topk_with_score_function(logits, k, routing_map_format="bitmap_u8", **kw)
    assert bits.dtype == np.uint8 and bits.shape == (T, (E + 7) // 8)
    assert np.array_equal(bits, np.packbits(want_map, axis=1, bitorder="little"))


def test_router_ties_and_exact_values():
    # all-equal logits: the lowest expert indices win; softmax over all E is 1/E exactly
    T, E = 3, 16
    logits = np.zeros((T, E), np.float32)
    probs, rmap = moe.fused_topk_with_score_function(logits, 4, True, None, None, None, "softmax",
                                                     None)
    assert np.array_equal(np.nonzero(rmap[0])[0], [0, 1, 2, 3])
    assert np.all(probs[:, :4] == np.float32(1 / 16)) and np.all(probs[:, 4:] == 0)
    # without pre-softmax: softmax over the k selected, 1/4 exactly
    probs, rmap = moe.fused_topk_with_score_function(logits, 4, False, None, None, None,
                                                     "softmax", None)
    assert np.all(probs[:, :4] == np.float32(0.25))


def test_router_nan_and_inf():
    E = 8
    x = np.linspace(-1, 1, E, dtype=np.float32)[None].repeat(2, 0)
    x[0, 7] = np.nan  # sigmoid: NaN ranks after every number, so it is not selected
    probs, rmap = moe.fused_topk_with_score_function(x, 2, False, None, None, None, "sigmoid",
                                                     None)
    assert np.array_equal(np.nonzero(rmap[0])[0], [5, 6])
    assert np.all(np.isfinite(probs[0]))
    # softmax with use_pre_softmax: a NaN or +inf logit makes the row NaN (IEEE)
    y = np.zeros((2, E), np.float32)
    y[0, 3] = np.nan
    y[1, 2] = np.inf
    probs, rmap = moe.fused_topk_with_score_function(y, 2, True, None, None, None, "softmax",
                                                     None)
    assert np.all(np.isnan(probs[rmap]))
    assert rmap.sum() == 4


def test_router_backward_softmax_and_sigmoid():
    rng = np.random.default_rng(3)
    T, E, k = 6, 16, 3
    x = rand_logits(rng, T, E)
    g = rng.standard_normal((T, E)).astype(np.float32)
    for score, pre in (("softmax", True), ("sigmoid", False), ("sqrtsoftplus", False)):
        _, rmap, saved = moe.fused_topk_with_score_function(
            x, k, pre, None, None, 1.5, score, None, return_intermediate=True)
        m = np.asarray(rmap, np.uint8)
        gl = moe.fused_topk_with_score_function_backward(
            m, saved, g, k, pre, 1.5, score, x if score == "sqrtsoftplus" else None)
        assert gl.dtype == np.float32 and gl.shape == (T, E)
        # fp64 oracle of the same formulas (docs/numerics.md section 8)
        dp = 1.5 * g.astype(np.float64) * m
        s = saved.astype(np.float64)
        if score == "softmax":
            dot = (s * dp).sum(1, keepdims=True)
            want = s * (dp - dot)
        else:
            D = (s * m).sum(1, keepdims=True) + 1e-20
            dot = (dp * s * m).sum(1, keepdims=True)
            gs = (dp - dot / D) / D * m
            if score == "sigmoid":
                want = gs * s * (1 - s)
            else:
                sig = 1 / (1 + np.exp(-x.astype(np.float64)))
                want = gs * sig / (2 * s)
        assert np.allclose(gl, want, rtol=1e-5, atol=1e-6), score
    # bf16 grad_logits by dtype=
    gl16 = moe.fused_topk_with_score_function_backward(m, saved, g, k, False, 1.5, "sqrtsoftplus",
                                                       x, dtype="bfloat16")
    assert gl16.dtype == BF16


# ------------------------------------------------------------------------------- aux


@pytest.mark.parametrize("score", ["softmax", "sigmoid", "sqrtsoftplus"])
def test_aux_scores(score):
    rng = np.random.default_rng(5)
    T, E, k = 9, 12, 2
    x = rand_logits(rng, T, E)
    rmap, scores, saved = moe.fused_compute_score_for_moe_aux_loss(x, k, score,
                                                                   return_intermediate=True)
    xd = x.astype(np.float64)
    if score == "softmax":
        ex = np.exp(xd - xd.max(1, keepdims=True))
        want = ex / ex.sum(1, keepdims=True)
    else:
        s = 1 / (1 + np.exp(-xd)) if score == "sigmoid" else np.sqrt(np.log1p(np.exp(xd)))
        want = s / (s.sum(1, keepdims=True) + 1e-20)  # normalised for every topk
    close(scores, want, E)
    order = np.argsort(-want, axis=1, kind="stable")[:, :k]
    want_map = np.zeros((T, E), bool)
    np.put_along_axis(want_map, order, True, 1)
    assert rmap.dtype == np.bool_ and np.array_equal(rmap, want_map)
    g = rng.standard_normal((T, E)).astype(np.float32)
    gl = moe.fused_compute_score_for_moe_aux_loss_backward(
        saved, g, k, score, x if score == "sqrtsoftplus" else None)
    assert gl.shape == (T, E) and np.all(np.isfinite(gl))
    none_map, scores2 = moe.fused_compute_score_for_moe_aux_loss(x, k, score, None)
    assert none_map is None and np.array_equal(scores2.view(np.uint32), scores.view(np.uint32))


def test_aux_loss_bits():
    rng = np.random.default_rng(7)
    T, E, k, N, coeff = 20, 8, 2, 40, np.float32(0.01)
    # dyadic probs: every fp64 sum is exact, so the only rounding is the final fp32 one
    probs = (rng.integers(0, 1024, (T, E)) / 1024).astype(np.float32)
    tpe = rng.integers(0, 50, E).astype(np.int64)
    aux = moe.fused_moe_aux_loss(probs, tpe, N, E, k, coeff)
    assert isinstance(aux, np.ndarray) and aux.shape == () and aux.dtype == np.float32
    C = E * np.float64(coeff) / (k * N * N)
    S = sum(float(probs[:, e].astype(np.float64).sum()) * float(tpe[e]) for e in range(E))
    assert aux.view(np.uint32) == np.float32(C * S).view(np.uint32)
    out = np.full(1, -7, np.float32)
    assert moe.fused_moe_aux_loss(probs, tpe.astype(np.int32), N, E, k, coeff, out=out) is out
    assert out[0] == aux
    gp = moe.fused_moe_aux_loss_backward(np.float32(0.75), tpe, N, E, k, coeff, T)
    want = (np.float32(C * tpe) * np.float32(0.75)).astype(np.float32)
    assert gp.shape == (T, E)
    assert np.array_equal(gp.view(np.uint32), np.broadcast_to(want, (T, E)).view(np.uint32))
    with pytest.raises(xte.XteShapeError, match="num_experts"):
        moe.fused_moe_aux_loss(probs, tpe, N, E + 1, k, coeff)
    with pytest.raises(xte.XteValueError, match="total_num_tokens"):
        moe.fused_moe_aux_loss(probs, tpe, 0, E, k, coeff)


# ------------------------------------------------------------------------------- errors


def test_router_bad_input_names_argument_and_writes_nothing():
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(xte.XteDTypeError, match="logits"):
        moe.fused_topk_with_score_function(x.astype(np.int32), 2)
    with pytest.raises(xte.XteLayoutError, match="logits"):
        moe.fused_topk_with_score_function(np.zeros((4, 16), np.float32)[:, ::2], 2)
    with pytest.raises(xte.XteValueError, match="score_function"):
        moe.fused_topk_with_score_function(x, 2, score_function="relu")
    out = np.full((4, 8), 3.0, np.float32)
    with pytest.raises(xte.XteValueError, match="topk"):
        moe.fused_topk_with_score_function(x, 9, probs_out=out)
    assert np.all(out == 3.0)
    with pytest.raises(xte.XteShapeError):
        moe.fused_topk_with_score_function(x, 2, probs_out=np.zeros((4, 7), np.float32))
    with pytest.raises(xte.XteDTypeError, match="expert_bias"):
        moe.fused_topk_with_score_function(x, 2, expert_bias=np.zeros(8, np.float64))


def test_router_out_zero_copy():
    rng = np.random.default_rng(11)
    x = rand_logits(rng, 5, 8)
    pbuf = np.empty((5, 8), np.float32)
    mbuf = np.empty((5, 8), np.uint8)
    p, m = moe.fused_topk_with_score_function(x, 2, probs_out=pbuf, routing_map_out=mbuf)
    assert p is pbuf and m is mbuf
    p2, m2 = moe.fused_topk_with_score_function(x, 2)
    assert np.array_equal(pbuf.view(np.uint32), p2.view(np.uint32))
    assert np.array_equal(mbuf.astype(bool), m2)


def test_router_torch_same_bytes():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    x = rand_logits(rng, 7, 16)
    bias = rng.standard_normal(16).astype(np.float32)
    pn, mn, sn = moe.fused_topk_with_score_function(x, 3, False, 4, 2, 1.0, "sigmoid", bias,
                                                    return_intermediate=True)
    pt, mt, st = moe.fused_topk_with_score_function(torch.from_numpy(x), 3, False, 4, 2, 1.0,
                                                    "sigmoid", torch.from_numpy(bias),
                                                    return_intermediate=True)
    assert isinstance(pt, torch.Tensor) and mt.dtype == torch.bool
    assert pt.numpy().tobytes() == pn.tobytes() and st.numpy().tobytes() == sn.tobytes()
    assert np.array_equal(mt.numpy(), mn)
    aux_t = moe.fused_moe_aux_loss(pt, torch.tensor([3] * 16), 7, 16, 3, 0.1)
    aux_n = moe.fused_moe_aux_loss(pn, np.array([3] * 16), 7, 16, 3, 0.1)
    assert isinstance(aux_t, torch.Tensor) and aux_t.numpy().tobytes() == aux_n.tobytes()


def test_aux_scores_bitmap_and_sequence_level_aux_loss():
    rng = np.random.default_rng(31)
    T, E, k = 9, 130, 8
    x = rand_logits(rng, T, E)
    m, s = moe.fused_compute_score_for_moe_aux_loss(x, k, "sigmoid")
    b, s2 = moe.fused_compute_score_for_moe_aux_loss(x, k, "sigmoid", routing_map_format="bitmap_u8")
    assert b.dtype == np.uint8 and b.shape == (T, (E + 7) // 8)
    assert np.array_equal(b, np.packbits(np.asarray(m, np.uint8), axis=-1, bitorder="little"))
    assert np.array_equal(s.view(np.uint32), s2.view(np.uint32))
    # the sequence-level loss: 3 sequences of 40 experts, C = 40 * coeff / (k N^2)
    cols, ne, N, coeff = 120, 40, 50, np.float32(0.02)
    probs = rng.random((T, cols), dtype=np.float32)
    tpe = rng.integers(1, 100, cols).astype(np.float32)
    aux = moe.fused_moe_aux_loss(probs, tpe, N, ne, 4, coeff)
    C = ne * np.float64(coeff) / (4 * N * N)
    S = sum(float(probs[:, e].astype(np.float64).sum()) * float(tpe[e]) for e in range(cols))
    assert aux.view(np.uint32) == np.float32(C * S).view(np.uint32)
    gp = moe.fused_moe_aux_loss_backward(np.float32(2.0), tpe, N, ne, 4, coeff, T)
    assert gp.shape == (T, cols)
    want = (np.float32(C * tpe.astype(np.float64)) * np.float32(2.0)).astype(np.float32)
    assert np.array_equal(gp.view(np.uint32), np.broadcast_to(want, (T, cols)).view(np.uint32))
    with pytest.raises(xte.XteShapeError, match="num_experts"):
        moe.fused_moe_aux_loss(probs, tpe, N, 7, 4, coeff)
