"""xte.ops.moe token movement (permute / unpermute / their backwards / sort chunks / dispatch
layout) against NumPy gathers written from include/xte/moe.h's definitions (docs/numerics.md
section 8, "Token movement"), not from the C code. Data movement is compared byte for byte. The
unpermute sums use dyadic data (small multiples of powers of two), so every fp32 product and sum
is exact and the result is the same bits in any order: a wrong weight, slot or row shows."""

import ml_dtypes
import numpy as np
import pytest

import xte
from xte.ops import moe

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu


# ------------------------------------------------------------------------------- oracle


def slots_of(routing, index):
    """slot lists per token: [(j, expert)]"""
    out = []
    for t in range(routing.shape[0]):
        if index:
            out.append([(j, int(e)) for j, e in enumerate(routing[t]) if e >= 0])
        else:
            out.append(list(enumerate(int(e) for e in np.nonzero(routing[t])[0])))
    return out


def ref_permute(x, routing, E, index=False, cap=-1, align=1, k=None, rows=None):
    T = x.shape[0]
    sl = slots_of(routing, index)
    k = routing.shape[1] if k is None else k
    pos = 0
    kept = [[] for _ in range(E)]  # (t, j) per expert, tokens ascending
    for e in range(E):
        for t in range(T):
            for j, ee in sl[t]:
                if ee == e:
                    if cap < 0 or pos < cap:
                        kept[e].append((t, j))
                    pos += 1
    a = max(align, 1)
    offs = [0]
    for e in range(E):
        offs.append(offs[-1] + -(-len(kept[e]) // a) * a)
    R = offs[-1]
    rows = R if rows is None else rows
    out = np.zeros((rows,) + x.shape[1:], x.dtype)
    row_map = np.full((T, k), -1, np.int32)
    r2e = np.full(rows, -1, np.int32)
    for e in range(E):
        for i, (t, j) in enumerate(kept[e]):
            out[offs[e] + i] = x[t]
            row_map[t, j] = offs[e] + i
            r2e[offs[e] + i] = e
    tpe = np.array([len(v) for v in kept], np.int64)
    return out, row_map, np.array(offs, np.int64), tpe, r2e


def routing_case(rng, T, E, k):
    idx = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    idx[1, 0] = -1  # a slot with no expert
    rmap = np.zeros((T, E), np.uint8)
    for t in range(T):
        for e in idx[t]:
            if e >= 0:
                rmap[t, e] = 1
    return idx, rmap


def dyadic(rng, shape, dtype=np.float32):
    return (rng.integers(-64, 64, shape) / 8).astype(np.float32).astype(dtype)


def bytes_eq(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    assert a.tobytes() == b.tobytes()


# ------------------------------------------------------------------------------- permute


@pytest.mark.parametrize("index", [False, True], ids=["mask", "index"])
@pytest.mark.parametrize("cap,align", [(-1, 1), (9, 1), (-1, 4), (11, 8)])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
def test_permute_matches_gather(index, cap, align, dtype):
    rng = np.random.default_rng(cap + 10 * align + index)
    T, E, k, H = 10, 6, 2, 24
    idx, rmap = routing_case(rng, T, E, k)
    x = dyadic(rng, (T, H), dtype)
    routing = idx if index else rmap
    out, rid, extras = moe.moe_permute(x, routing, cap, map_type="index" if index else "mask",
                                       num_experts=E, align=align, topk=k, return_extras=True)
    w_out, w_map, w_off, w_tpe, w_r2e = ref_permute(x, routing, E, index, cap, align, k,
                                                    rows=out.shape[0])
    if cap >= 0 and align <= 1:
        assert out.shape[0] == cap  # static shape
    else:
        assert out.shape[0] == w_off[-1]  # sized by xte_moe_permute_rows
    bytes_eq(out, w_out)
    assert isinstance(rid, moe.RowIdMap) and rid.map_type == ("index" if index else "mask")
    bytes_eq(rid.row_map, w_map)
    bytes_eq(extras["expert_offsets"], w_off)
    bytes_eq(extras["tokens_per_expert"], w_tpe)
    bytes_eq(extras["row_to_expert"], w_r2e)

    # unpermute: out[t] = sum_j w[t, j] * in[row_map[t, j]] (dyadic: exact in any order)
    y = dyadic(rng, out.shape, dtype)
    if index:
        probs = (rng.integers(1, 16, (T, k)) / 16).astype(np.float32)
        w = lambda t, j, e: probs[t, j]  # noqa: E731
    else:
        probs = (rng.integers(1, 16, (T, E)) / 16).astype(np.float32)
        w = lambda t, j, e: probs[t, e]  # noqa: E731
    got = moe.moe_unpermute(y, rid, probs)
    want = np.zeros((T, H), np.float64)
    gp_want = np.zeros(probs.shape, np.float32)
    g = dyadic(rng, (T, H), dtype)
    gi_want = np.zeros(y.shape, np.float32)
    for t, s in enumerate(slots_of(routing, index)):
        for j, e in s:
            r = w_map[t, j]
            if r >= 0:
                want[t] += w(t, j, e) * y[r].astype(np.float64)
                gi_want[r] = np.float32(w(t, j, e)) * g[t].astype(np.float32)
                gp_want[t, j if index else e] = np.dot(g[t].astype(np.float64),
                                                       y[r].astype(np.float64))
    bytes_eq(got, want.astype(np.float32).astype(dtype))
    # no probs: weight 1 (= the permute backward)
    plain = moe.moe_unpermute(y, rid)
    pb = moe.moe_permute_backward(y, rid)
    bytes_eq(plain, pb)
    # unpermute backward
    gi, gp = moe.moe_unpermute_backward(g, y, rid, probs)
    bytes_eq(gi, gi_want.astype(dtype))
    bytes_eq(gp, gp_want)
    gi2, gp2 = moe.moe_unpermute_backward(g, None, rid)
    assert gp2 is None and gi2.shape == y.shape


def test_permute_plain_row_map_and_restore_shape():
    rng = np.random.default_rng(1)
    T, E, k, H = 6, 4, 2, 8
    idx, rmap = routing_case(rng, T, E, k)
    x = dyadic(rng, (T, H))
    out, rid = moe.moe_permute(x, rmap)
    assert rid.row_map.shape == (T, E)  # default k = E for a byte map
    back = moe.moe_unpermute(out, rid.row_map, None, (T, H), routing_map=rmap)
    one = moe.moe_unpermute(out, rid, restore_shape=(T, H))
    bytes_eq(back, one)
    # one-hot-like: each token's rows sum back to (number of slots) * x exactly
    cnt = rmap.sum(1, keepdims=True).astype(np.float32)
    bytes_eq(back, (x * cnt).astype(np.float32))
    with pytest.raises(xte.XteValueError, match="num_experts"):
        moe.moe_permute(x, idx, map_type="index")


def test_permute_fp8_with_scales():
    rng = np.random.default_rng(2)
    T, E, k, H = 7, 4, 2, 256
    idx, rmap = routing_case(rng, T, E, k)
    data = rng.standard_normal((T, H)).astype(np.float32).astype(E4M3)
    scales = rng.uniform(0.5, 2, (T, H // 128)).astype(np.float32)
    q = xte.QuantizedTensor(data, scales, scaling_mode="1x128", recipe="te_block",
                            layout="compact")
    qo, rid = moe.moe_permute(q, idx, map_type="index", num_experts=E)
    assert isinstance(qo, xte.QuantizedTensor)
    w_out, w_map, _, _, _ = ref_permute(data, idx, E, True)
    w_sc, _, _, _, _ = ref_permute(scales, idx, E, True)
    bytes_eq(qo.data, w_out)
    bytes_eq(qo.scale_inv, w_sc)
    bytes_eq(rid.row_map, w_map)
    # raw fp8 with E8M0 scales (MX-style [T, H/32]) -> (output, output_scales, row_id_map)
    sc8 = rng.integers(100, 140, (T, H // 32)).astype(np.uint8).view(E8M0)
    o, os_, rid2 = moe.moe_permute(data, rmap, input_scales=sc8)
    bytes_eq(o, ref_permute(data, rmap, E)[0])
    bytes_eq(os_, ref_permute(sc8, rmap, E)[0])
    # TE_GEMM (transposed) scales cannot move with their rows
    q2 = xte.QuantizedTensor(data, scales, scaling_mode="1x128", recipe="te_block",
                             layout="te_gemm")
    with pytest.raises(xte.XteUnsupportedError, match="inp.scale_inv"):
        moe.moe_permute(q2, rmap)


# ------------------------------------------------------------------------------- bad input


def test_row_map_out_of_range_and_duplicates_leave_out_untouched():
    rng = np.random.default_rng(4)
    T, E, k, H = 5, 4, 2, 8
    idx, rmap = routing_case(rng, T, E, k)
    x = dyadic(rng, (T, H))
    out, rid = moe.moe_permute(x, idx, map_type="index", num_experts=E)
    bad = rid.row_map.copy()
    bad[0, 1] = out.shape[0] + 3  # a row past the permuted tensor
    dst = np.full((T, H), 42.0, np.float32)
    with pytest.raises(xte.XteValueError, match="row_id_map"):
        moe.moe_unpermute(out, bad, topk_idx=idx, num_experts=E, out=dst)
    assert np.all(dst == 42.0)
    dup = rid.row_map.copy()
    dup[2, 0] = dup[0, 0]  # the same row twice
    with pytest.raises(xte.XteValueError):
        moe.moe_permute_backward(out, dup, topk_idx=idx, num_experts=E, out=dst)
    assert np.all(dst == 42.0)
    gi = np.full(out.shape, 5.0, np.float32)
    with pytest.raises(xte.XteValueError):
        moe.moe_unpermute_backward(x, out, bad, topk_idx=idx, num_experts=E, grad_input=gi)
    assert np.all(gi == 5.0)


def test_permute_bad_dtypes_shapes_layouts():
    rng = np.random.default_rng(5)
    T, E, k, H = 5, 4, 2, 8
    idx, rmap = routing_case(rng, T, E, k)
    x = dyadic(rng, (T, H))
    with pytest.raises(xte.XteDTypeError, match="inp"):
        moe.moe_permute(x.astype(np.int64), rmap)
    with pytest.raises(xte.XteDTypeError, match="routing_map"):
        moe.moe_permute(x, rmap.astype(np.float32))
    with pytest.raises(xte.XteShapeError):
        moe.moe_permute(x[:4], rmap)  # 4 tokens, 5 map rows
    with pytest.raises(xte.XteLayoutError, match="inp"):
        moe.moe_permute(np.zeros((T, 2 * H), np.float32)[:, ::2], rmap)
    dst = np.full((3, H), 9.0, np.float32)  # fewer rows than the routing needs
    with pytest.raises(xte.XteError):
        moe.moe_permute(x, rmap, out=dst)
    assert np.all(dst == 9.0)
    bad_idx = idx.copy()
    bad_idx[0, 0] = E  # expert out of range
    with pytest.raises(xte.XteValueError):
        moe.moe_permute(x, bad_idx, map_type="index", num_experts=E)
    with pytest.raises(xte.XteValueError, match="map_type"):
        moe.moe_permute(x, rmap, map_type="dense")


def test_permute_out_zero_copy():
    rng = np.random.default_rng(6)
    T, E, k, H = 6, 3, 2, 4
    idx, rmap = routing_case(rng, T, E, k)
    x = dyadic(rng, (T, H))
    n = int(rmap.sum())
    buf = np.full((n + 2, H), 7.0, np.float32)
    out, rid = moe.moe_permute(x, rmap, out=buf)
    assert out is buf
    bytes_eq(buf, ref_permute(x, rmap, E, rows=n + 2)[0])  # extra rows zeroed


# ------------------------------------------------------------------------------- sort chunks


@pytest.mark.parametrize("dtype", [np.float32, BF16, E4M3, np.int64])
def test_sort_chunks(dtype):
    rng = np.random.default_rng(8)
    sizes = np.array([3, 0, 5, 2, 4], np.int64)
    order = np.array([2, 0, 4, 1, 3], np.int32)
    R, H = int(sizes.sum()), 6
    x = rng.integers(-50, 50, (R, H)).astype(np.float32).astype(dtype)
    out, rm = moe.moe_sort_chunks_by_index(x, sizes, order, return_row_id_map=True)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    want = np.concatenate([x[starts[i]:starts[i + 1]] for i in order])
    bytes_eq(out, want)
    src = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in order])
    want_map = np.empty(R, np.int32)
    want_map[src] = np.arange(R)
    bytes_eq(rm, want_map)
    bytes_eq(moe.moe_sort_chunks_backward(out, rm), x)
    probs = rng.standard_normal(R).astype(np.float32)
    o2, p2 = moe.moe_sort_chunks_by_index_with_probs(x, probs, sizes, order)
    bytes_eq(o2, want)
    bytes_eq(p2, probs[src])
    with pytest.raises(xte.XteError, match="split_sizes"):
        moe.moe_sort_chunks_by_index(x, np.array([3, 0, 5, 2, 5]), order)


# ------------------------------------------------------------------------------- dispatch


def test_dispatch_layout():
    rng = np.random.default_rng(9)
    T, E, k, ranks = 11, 16, 3, 4
    idx = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int64)
    idx[0, 2] = -1
    per_rank, per_expert, in_rank = moe.dispatch_layout(idx, E, ranks)
    want_in = np.zeros((T, ranks), bool)
    want_e = np.zeros(E, np.int32)
    for t in range(T):
        for e in idx[t]:
            if e >= 0:
                want_e[e] += 1
                want_in[t, e // (E // ranks)] = True
    bytes_eq(per_expert, want_e)
    bytes_eq(in_rank, want_in)
    bytes_eq(per_rank, want_in.sum(0).astype(np.int32))
    with pytest.raises(xte.XteValueError):
        moe.dispatch_layout(idx, E, 5)  # 16 experts do not split over 5 ranks


# ------------------------------------------------------------------------------- torch


def test_permute_torch_same_bytes():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(10)
    T, E, k, H = 9, 5, 2, 16
    idx, rmap = routing_case(rng, T, E, k)
    x = dyadic(rng, (T, H), BF16)
    probs = (rng.integers(1, 16, (T, E)) / 16).astype(np.float32)
    o_n, r_n = moe.moe_permute(x, rmap, 12)
    xt = torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16)
    o_t, r_t = moe.moe_permute(xt, torch.from_numpy(rmap).bool(), 12)
    assert isinstance(o_t, torch.Tensor) and o_t.dtype == torch.bfloat16
    assert o_t.view(torch.int16).numpy().tobytes() == o_n.tobytes()
    assert r_t.row_map.numpy().tobytes() == r_n.row_map.tobytes()
    u_n = moe.moe_unpermute(o_n, r_n, probs)
    u_t = moe.moe_unpermute(o_t, r_t, torch.from_numpy(probs))
    assert u_t.view(torch.int16).numpy().tobytes() == u_n.tobytes()
    a = moe.dispatch_layout(torch.from_numpy(idx), E, 5)
    b = moe.dispatch_layout(idx, E, 5)
    assert a[2].dtype == torch.bool
    for u, v in zip(a, b):
        assert u.numpy().tobytes() == v.tobytes()


def test_empty_shapes():
    x = np.zeros((0, 8), np.float32)
    m = np.zeros((0, 4), np.uint8)
    out, rid = moe.moe_permute(x, m)
    assert out.shape == (0, 8) and rid.row_map.shape == (0, 4)
    assert moe.moe_unpermute(out, rid).shape == (0, 8)
    out, rid = moe.moe_permute(x, m, 3)  # a static cap larger than the routing: zero rows
    assert out.shape == (3, 8) and np.all(out == 0)
    a, b, c = moe.dispatch_layout(np.zeros((0, 2), np.int32), 4, 2)
    assert np.all(a == 0) and np.all(b == 0) and c.shape == (0, 2)
    assert moe.swiglu(x).shape == (0, 4)
    assert moe.moe_sort_chunks_by_index(x, np.array([0, 0]), np.array([1, 0])).shape == (0, 8)


def test_per_tensor_quantized_input_is_unsupported():
    """A per-tensor QuantizedTensor has no row scales to move: a clear error, not a C NULL."""
    x = np.random.default_rng(3).standard_normal((6, 32)).astype(np.float32)
    q = xte.quantize(x, recipe="te_current")
    idx = np.array([[0, 1]] * 6, np.int32)
    with pytest.raises(xte.XteUnsupportedError, match="per-tensor"):
        xte.moe_permute(q, idx, map_type="index", num_experts=2)
