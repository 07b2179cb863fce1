"""xte.transformer_engine.pytorch's MoE permutation (TransformerEngine's moe_permute,
moe_permute_with_probs, moe_permute_and_pad_with_probs, moe_unpermute, moe_sort_chunks_by_index
(_with_probs), Fp8Padding / Fp8Unpadding) against oracles written here from TE's documented
behaviour, not from xte's code:
 - token movement compared byte for byte with Python loops over the routing;
 - TE's row_id_map layouts checked entry by entry (mask: [T, 2E + 1]; index: [k T]);
 - sums on dyadic data (multiples of powers of two whose fp32 sums are exact), so the result
   is the exactly rounded fp64 sum in any order: a wrong row, weight or rounding shows;
 - gradients against torch autograd of the oracle in fp64;
 - torch.compile(fullgraph=True) and torch.library.opcheck on the custom ops;
 - fp32 / bf16 / fp16 activations, fp32 / bf16 / fp16 probs, int16 indices, topk 36 and 1100
   experts, padding, empty inputs, bad arguments."""

# ctest: no-isa-variants (the C kernels' ISA paths are compared byte for byte, fp16 included, in
# tests/test_moe_permute.c)
import pytest

torch = pytest.importorskip("torch")

import xte.transformer_engine.pytorch as te  # noqa: E402
from xte.torch import _ops  # noqa: E402,F401

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _bits(t):
    """The bytes of t (NaN payloads and -0 included) as an integer tensor."""
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    assert torch.equal(_bits(a), _bits(b))


def _eq(a, b):
    """Equal values (-0 == +0: autograd's oracle sums a row's gradient pieces from +0)."""
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    assert torch.equal(a, b)


def _dyadic(shape, gen, lo=-8, hi=8, scale=1 / 8):
    """Small multiples of 1/8: exact in bf16 / fp16, their products with probs in 1/8 exact
    too, and every fp32 sum of a few of them exact."""
    return torch.randint(lo, hi + 1, shape, generator=gen).double() * scale


def _routing_mask(T, E, k, gen):
    m = torch.zeros(T, E, dtype=torch.bool)
    for t in range(T):
        m[t, torch.randperm(E, generator=gen)[:k]] = True
    return m


def _index(T, E, k, gen):
    return torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)]).to(torch.int32)


# ----------------------------------------------------------------------------- oracles


def oracle_mask_slots(m):
    """[(t, e, row)] of a mask routing: rows expert-major, tokens ascending."""
    T, E = m.shape
    out, row = [], 0
    for e in range(E):
        for t in range(T):
            if m[t, e]:
                out.append((t, e, row))
                row += 1
    return out


def oracle_index_slots(idx, num_out):
    """[(t, j, row or -1)] of an index routing: flattened slots t k + j sorted stably by
    expert; rows past num_out dropped."""
    T, k = idx.shape
    flat = [(int(idx[t, j]), t * k + j) for t in range(T) for j in range(k)]
    order = sorted(range(len(flat)), key=lambda i: (flat[i][0], i))
    res = []
    for row, i in enumerate(order):
        t, j = divmod(flat[i][1], k)
        res.append((t, j, row if row < num_out else -1))
    return res


# ----------------------------------------------------------------------------- mask map


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,E,k", [(13, 5, 2), (40, 16, 5), (9, 7, 7)])
def test_mask_permute_bytes_and_row_id_map(dtype, T, E, k):
    g = torch.Generator().manual_seed(T * 100 + E)
    x = torch.randn(T, 24, generator=g).to(dtype)
    x[0, 0], x[1, 1] = float("nan"), -0.0
    m = _routing_mask(T, E, k, g)
    out, rid = te.moe_permute(x, m, num_out_tokens=T * k)
    slots = oracle_mask_slots(m)
    ref = torch.stack([x[t] for t, _, _ in slots])
    _same(out, ref)
    assert rid.dtype == torch.int32 and rid.shape == (T, 2 * E + 1)
    for t in range(T):
        mine = [(e, r) for tt, e, r in slots if tt == t]
        n = len(mine)
        assert int(rid[t, 2 * E]) == n
        assert [int(v) for v in rid[t, E:E + n]] == [e for e, _ in mine]
        assert [int(v) for v in rid[t, :n]] == [r for _, r in mine]
        assert (rid[t, n:E] == -1).all() and (rid[t, E + n:2 * E] == -1).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pdtype", DTYPES)
def test_mask_unpermute_exact_and_grads(dtype, pdtype):
    g = torch.Generator().manual_seed(7)
    T, E, k, H = 21, 9, 3, 40
    m = _routing_mask(T, E, k, g)
    n = int(m.sum())
    x = _dyadic((n, H), g).to(dtype).requires_grad_(True)
    probs = (_dyadic((T, E), g, 0, 8) * m).to(pdtype).requires_grad_(True)
    _, rid = te.moe_permute(torch.zeros(T, H, dtype=dtype), m, n)
    out = te.moe_unpermute(x, rid, merging_probs=probs, restore_shape=(T, H))
    # oracle in fp64: each token's rows times its probs, summed
    slots = oracle_mask_slots(m)
    x64 = x.detach().double().requires_grad_(True)
    p64 = probs.detach().double().requires_grad_(True)
    ref = torch.zeros(T, H, dtype=torch.float64)
    for t, e, r in slots:
        ref = ref.index_add(0, torch.tensor([t]), (p64[t, e] * x64[r]).unsqueeze(0))
    _same(out, ref.to(dtype))  # dyadic: the fp64 sum is exact, one rounding to dtype
    gy = _dyadic((T, H), g).to(dtype)
    out.backward(gy)
    ref.backward(gy.double())
    _eq(x.grad, x64.grad.to(dtype))
    # the probs' grads are fp32 dots rounded to pdtype (exact data: no rounding before)
    _eq(probs.grad, p64.grad.to(pdtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_mask_permute_grad_and_no_probs_unpermute(dtype):
    g = torch.Generator().manual_seed(3)
    T, E, k, H = 17, 6, 2, 8
    m = _routing_mask(T, E, k, g)
    # full-precision values: the unpermute of k = 2 copies is 2x, exact, so every mantissa bit
    # of the fp16 / bf16 loads and stores shows
    x = torch.randn(T, H, generator=g).to(dtype).requires_grad_(True)
    out, rid = te.moe_permute(x, m, T * k)
    gy = _dyadic(out.shape, g).to(dtype)
    out.backward(gy)
    ref = torch.zeros(T, H, dtype=torch.float64)
    for t, _, r in oracle_mask_slots(m):
        ref[t] += gy[r].double()
    _same(x.grad, ref.to(dtype))
    y = out.detach().requires_grad_(True)
    back = te.moe_unpermute(y, rid)  # no restore_shape: the row_id_map's tokens
    assert back.shape == (T, H)
    back = te.moe_unpermute(y, rid, restore_shape=x.shape)
    _same(back, (x.detach().double() * k).to(dtype))  # every token has k rows
    back.backward(torch.ones_like(back))
    _same(y.grad, torch.ones_like(y))


@pytest.mark.parametrize("pdtype", DTYPES)
def test_permute_with_probs(pdtype):
    g = torch.Generator().manual_seed(11)
    T, E, k, H = 15, 8, 3, 16
    m = _routing_mask(T, E, k, g)
    x = torch.randn(T, H, generator=g).requires_grad_(True)
    probs = (torch.rand(T, E, generator=g) * m).to(pdtype)
    t0, e0 = [(t, e) for t, e, _ in oracle_mask_slots(m)][4]
    probs[t0, e0] = 0  # TE: a routed slot of prob 0 gets a zero row
    probs.requires_grad_(True)
    out, pp, rid = te.moe_permute_with_probs(x, probs, m, T * k)
    assert pp.dtype == pdtype and pp.shape == (T * k,)
    for t, e, r in oracle_mask_slots(m):
        _same(pp[r], probs[t, e].detach())
        if (t, e) == (t0, e0):
            assert (out[r] == 0).all()
        else:
            _same(out[r], x[t].detach())
    gpp = torch.randn(T * k, generator=g).to(pdtype)
    (out.sum() + (pp * gpp).sum()).backward()
    ref = torch.zeros(T, E, dtype=pdtype)
    for t, e, r in oracle_mask_slots(m):
        ref[t, e] = gpp[r]
    _same(probs.grad, ref)


def test_permute_capacity_errors():
    g = torch.Generator().manual_seed(1)
    m = _routing_mask(6, 4, 2, g)
    x = torch.randn(6, 8)
    with pytest.raises(Exception, match="rows"):
        te.moe_permute(x, m, 11)  # 12 routed slots: no room, never a write out of bounds
    with pytest.raises(ValueError):
        te.moe_permute(x, m, 0)
    with pytest.raises(ValueError):
        te.moe_permute(x, m, 12, map_type="bytes")
    with pytest.raises(ValueError):
        te.moe_permute(x[:5], m, 12)
    out, _ = te.moe_permute(x, m, 14)  # more rows than routed: the rest are zeros
    assert (out[12:] == 0).all()


# ----------------------------------------------------------------------------- padding


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_probs", [True, False])
def test_permute_and_pad(dtype, with_probs):
    g = torch.Generator().manual_seed(5)
    T, E, k, H, align = 30, 6, 2, 12, 8
    m = _routing_mask(T, E, k, g)
    m[:, 5] = False  # an expert with no token: no rows at all
    m[0, 5] = True
    tpe = m.sum(0)
    x = _dyadic((T, H), g).to(dtype).requires_grad_(True)
    probs = (_dyadic((T, E), g, 1, 8) * m).to(dtype).requires_grad_(True)
    out, pp, rid, pad, target = te.moe_permute_and_pad_with_probs(x, probs, m, tpe, align)
    assert target.tolist() == [-(-int(c) // align) * align for c in tpe]
    starts = [0]
    for c in target.tolist():
        starts.append(starts[-1] + c)
    unpadded = torch.cumsum(tpe, 0) - tpe
    assert pad.dtype == torch.int64 and pad.tolist() == [s - int(u) for s, u in
                                                         zip(starts, unpadded)]
    ref = torch.zeros(starts[-1], H, dtype=dtype)
    refp = torch.zeros(starts[-1], dtype=dtype)
    seen = [0] * E
    for t, e, r in oracle_mask_slots(m):
        ref[starts[e] + seen[e]] = x[t].detach()
        refp[starts[e] + seen[e]] = probs[t, e].detach()
        assert int(rid[t, list(rid[t, E:2 * E]).index(e)]) == r  # unpadded rows, as TE's
        seen[e] += 1
    _same(out, ref)
    _same(pp, refp)
    # unpad + unpermute with pad_offsets == the oracle on the unpadded rows
    y = ref.clone().requires_grad_(True)
    got = te.moe_unpermute(y, rid, probs if with_probs else None, x.shape, pad_offsets=pad)
    slots = oracle_mask_slots(m)
    y64 = y.detach().double().requires_grad_(True)
    p64 = probs.detach().double().requires_grad_(True)
    exp = torch.zeros(T, H, dtype=torch.float64)
    seen = [0] * E
    for t, e, _ in slots:
        w = p64[t, e] if with_probs else 1.0
        exp = exp.index_add(0, torch.tensor([t]), (w * y64[starts[e] + seen[e]]).unsqueeze(0))
        seen[e] += 1
    _same(got, exp.to(dtype))
    gy = _dyadic((T, H), g).to(dtype)
    got.backward(gy)
    exp.backward(gy.double())
    _eq(y.grad, y64.grad.to(dtype))  # padding rows get zero gradient
    if with_probs:
        _eq(probs.grad, p64.grad.to(dtype))
    # the permute's backward: the padded rows' gradients summed per token
    x.grad = None
    probs.grad = None
    gout = _dyadic(out.shape, g).to(dtype)
    gpp = _dyadic(pp.shape, g).to(dtype)
    (out * gout).sum().backward(retain_graph=True)
    ex = torch.zeros(T, H, dtype=torch.float64)
    seen = [0] * E
    for t, e, _ in slots:
        ex[t] += gout[starts[e] + seen[e]].double()
        seen[e] += 1
    _same(x.grad, ex.to(dtype))
    (pp * gpp).sum().backward()
    exg = torch.zeros(T, E, dtype=dtype)
    seen = [0] * E
    for t, e, _ in slots:
        exg[t, e] = gpp[starts[e] + seen[e]]
        seen[e] += 1
    _same(probs.grad, exg)


def test_permute_and_pad_aligned_and_bad_counts():
    g = torch.Generator().manual_seed(2)
    m = torch.zeros(16, 2, dtype=torch.bool)
    m[:8, 0] = True
    m[8:, 1] = True
    x = torch.randn(16, 4)
    p = m.float() * 0.5
    out, pp, rid, pad, target = te.moe_permute_and_pad_with_probs(x, p, m, m.sum(0), 4)
    assert pad is None and target.tolist() == [8, 8]
    _same(out, x)
    with pytest.raises(Exception, match="tokens_per_expert"):
        te.moe_permute_and_pad_with_probs(x, p, m, torch.tensor([9, 7]), 4)
    with pytest.raises(ValueError):
        te.moe_permute_and_pad_with_probs(x, p, m, m.sum(0), 0)
    del g


def test_fp8_padding_modules():
    g = torch.Generator().manual_seed(4)
    splits = [3, 0, 16, 5]
    x = torch.randn(sum(splits), 6, generator=g).requires_grad_(True)
    pad = te.Fp8Padding(4, 8)
    y, ps = pad(x, splits)
    assert ps == [8, 0, 16, 8]
    rows = [0, 1, 2] + list(range(8, 24)) + list(range(24, 29))
    ref = torch.zeros(32, 6)
    ref[rows] = x.detach()
    _same(y, ref)
    gy = torch.randn(32, 6, generator=g)
    y.backward(gy)
    _same(x.grad, gy[rows])
    z = te.Fp8Unpadding(4, 8)(y.detach().requires_grad_(True), splits)
    _same(z, x.detach())
    same, s2 = te.Fp8Padding(2, 4)(x, [8, 16])
    assert same is x and s2 == [8, 16]  # aligned already: the input itself, as TE
    assert te.Fp8Unpadding(2, 4)(x, [8, 16]) is x


# ----------------------------------------------------------------------------- index map


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64, torch.int16])
@pytest.mark.parametrize("drop", [False, True])
def test_index_permute_unpermute(dtype, idx_dtype, drop):
    g = torch.Generator().manual_seed(9)
    T, E, k, H = 19, 7, 3, 10
    idx = _index(T, E, k, g).to(idx_dtype)
    num_out = 37 if drop else 0
    x = _dyadic((T, H), g).to(dtype).requires_grad_(True)
    out, rid = te.moe_permute(x, idx, num_out, map_type="index")
    rows = num_out if drop else T * k
    slots = oracle_index_slots(idx, rows)
    assert rid.dtype == torch.int32 and rid.shape == (T * k,)
    ref = torch.zeros(rows, H, dtype=dtype)
    for t, j, r in slots:
        assert int(rid[j * T + t]) == r
        if r >= 0:
            ref[r] = x[t].detach()
    _same(out, ref)
    gy = _dyadic(out.shape, g).to(dtype)
    out.backward(gy)
    exg = torch.zeros(T, H, dtype=torch.float64)
    for t, _, r in slots:
        if r >= 0:
            exg[t] += gy[r].double()
    _same(x.grad, exg.to(dtype))
    # unpermute with fp32 probs [T, k]
    y = out.detach().requires_grad_(True)
    probs = _dyadic((T, k), g, 0, 8).float().requires_grad_(True)
    back = te.moe_unpermute(y, rid, probs, map_type="index")
    y64 = y.detach().double().requires_grad_(True)
    p64 = probs.detach().double().requires_grad_(True)
    ex = torch.zeros(T, H, dtype=torch.float64)
    for t, j, r in slots:
        if r >= 0:
            ex = ex.index_add(0, torch.tensor([t]), (p64[t, j] * y64[r]).unsqueeze(0))
    _same(back, ex.to(dtype))
    gb = _dyadic(back.shape, g).to(dtype)
    back.backward(gb)
    ex.backward(gb.double())
    _eq(y.grad, y64.grad.to(dtype))
    _eq(probs.grad, p64.grad.float())


def test_index_topk1_no_probs_and_warning():
    g = torch.Generator().manual_seed(6)
    idx = _index(11, 4, 1, g)
    x = torch.randn(11, 5, generator=g)
    out, rid = te.moe_permute(x, idx, 0, map_type="index")
    back = te.moe_unpermute(out, rid, map_type="index")
    _same(back, x)
    with pytest.warns(UserWarning):
        te.moe_unpermute(out, rid, torch.ones(11, 1, dtype=torch.bfloat16), map_type="index")


# ----------------------------------------------------------------------------- limits


@pytest.mark.parametrize("map_type", ["mask", "index"])
def test_big_topk_and_experts(map_type):
    g = torch.Generator().manual_seed(12)
    T, E, k, H = 24, 1100, 36, 16
    x = _dyadic((T, H), g).to(torch.bfloat16)
    if map_type == "mask":
        m = _routing_mask(T, E, k, g)
        out, rid = te.moe_permute(x, m, T * k)
        slots = [(t, r) for t, _, r in oracle_mask_slots(m)]
        probs = (_dyadic((T, E), g, 0, 8) * m).float()
        w = {(t, e): float(probs[t, e]) for t, e, _ in oracle_mask_slots(m)}
        wr = {r: w[(t, e)] for t, e, r in oracle_mask_slots(m)}
    else:
        idx = _index(T, E, k, g)
        out, rid = te.moe_permute(x, idx, 0, map_type="index")
        sl = oracle_index_slots(idx, T * k)
        slots = [(t, r) for t, _, r in sl]
        probs = _dyadic((T, k), g, 0, 8).float()
        wr = {r: float(probs[t, j]) for t, j, r in sl}
    ref = torch.stack([x[t] for t, r in sorted(slots, key=lambda s: s[1])])
    _same(out, ref)
    back = te.moe_unpermute(out, rid, probs, (T, H), map_type=map_type)
    ex = torch.zeros(T, H, dtype=torch.float64)
    for t, r in slots:
        ex[t] += wr[r] * out[r].double()
    _same(back, ex.to(torch.bfloat16))


# ----------------------------------------------------------------------------- chunk sort


@pytest.mark.parametrize("dtype", DTYPES)
def test_sort_chunks(dtype):
    g = torch.Generator().manual_seed(8)
    splits = torch.tensor([3, 0, 5, 2, 4], dtype=torch.int32)
    order = torch.tensor([2, 4, 0, 1, 3], dtype=torch.int32)
    R = int(splits.sum()) + 3  # three rows past the chunks: they stay where they are
    x = torch.randn(R, 6, generator=g).to(dtype).requires_grad_(True)
    probs = torch.rand(R, generator=g).to(dtype).requires_grad_(True)
    starts = [0]
    for s in splits.tolist():
        starts.append(starts[-1] + s)
    src = [r for i in order.tolist() for r in range(starts[i], starts[i + 1])]
    src += list(range(starts[-1], R))
    out = te.moe_sort_chunks_by_index(x, splits, order)
    _same(out, x.detach()[src])
    out2, pp = te.moe_sort_chunks_by_index_with_probs(x, probs, splits, order)
    _same(out2, x.detach()[src])
    _same(pp, probs.detach()[src])
    gy = torch.randn(R, 6, generator=g).to(dtype)
    gp = torch.randn(R, generator=g).to(dtype)
    ((out2 * gy).sum() + (pp * gp).sum()).backward()
    inv = [0] * R
    for o, s in enumerate(src):
        inv[s] = o
    _same(probs.grad, gp[inv])
    assert torch.allclose(x.grad.float(), gy[inv].float())


# ----------------------------------------------------------------------------- empty


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_inputs(dtype):
    x = torch.empty(0, 32, dtype=dtype, requires_grad=True)
    m = torch.zeros(0, 8, dtype=torch.bool)
    probs = torch.empty(0, 8, dtype=dtype, requires_grad=True)
    out, pp, rid = te.moe_permute_with_probs(x, probs, m, 0)
    assert out.shape == (0, 32) and rid.shape == (0, 17)
    back = te.moe_unpermute(out, rid, probs, restore_shape=x.shape)
    assert back.shape == (0, 32)
    back.sum().backward()
    assert x.grad.shape == x.shape and probs.grad.shape == probs.shape
    s = te.moe_sort_chunks_by_index(x, torch.zeros(16, dtype=torch.int32),
                                    torch.arange(16, dtype=torch.int32))
    assert s.shape == (0, 32)


# ----------------------------------------------------------------------------- compile / opcheck


def test_compile_fullgraph():
    g = torch.Generator().manual_seed(10)
    T, E, k, H = 12, 5, 2, 8
    m = _routing_mask(T, E, k, g)
    idx = _index(T, E, k, g)
    x = _dyadic((T, H), g).to(torch.bfloat16)
    probs = (_dyadic((T, E), g, 1, 8) * m).float()
    splits = torch.tensor([5, 7, 12], dtype=torch.int32)
    order = torch.tensor([2, 0, 1], dtype=torch.int32)

    def mask_fn(x, p):
        out, pp, rid = te.moe_permute_with_probs(x, p, m, T * k)
        out, pp = te.moe_sort_chunks_by_index_with_probs(out, pp, splits, order)
        out = te.moe_sort_chunks_by_index(out * pp.unsqueeze(-1).to(out.dtype), splits,
                                          torch.tensor([1, 2, 0], dtype=torch.int32))
        return te.moe_unpermute(out, rid, p, restore_shape=x.shape)

    def index_fn(x, p):
        out, rid = te.moe_permute(x, idx, T * k, -1, map_type="index")
        return te.moe_unpermute(out, rid, p, map_type="index")

    torch._dynamo.reset()
    for fn, p in ((mask_fn, probs), (index_fn, _dyadic((T, k), g, 1, 8).float())):
        xa = x.clone().requires_grad_(True)
        pa = p.clone().requires_grad_(True)
        xb = x.clone().requires_grad_(True)
        pb = p.clone().requires_grad_(True)
        eager = fn(xa, pa)
        comp = torch.compile(fn, fullgraph=True)(xb, pb)
        _same(comp, eager)
        gy = _dyadic(eager.shape, g).to(eager.dtype)
        eager.backward(gy)
        comp.backward(gy)
        _same(xb.grad, xa.grad)
        _same(pb.grad, pa.grad)


def _opcheck(op, args):
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                "test_autograd_registration",
                                                "test_aot_dispatch_dynamic"))


def test_opcheck():
    g = torch.Generator().manual_seed(13)
    T, E, k, H = 10, 6, 2, 8
    m = _routing_mask(T, E, k, g)
    idx = _index(T, E, k, g)
    x = torch.randn(T, H, generator=g, requires_grad=True)
    probs = (torch.rand(T, E, generator=g) * m).requires_grad_(True)
    ops = torch.ops.xte
    _opcheck(ops.te_permute_mask, (x, m, probs, T * k, 1, None))
    _opcheck(ops.te_permute_mask, (x, m, None, T * k + 3, 1, None))
    tpe = m.sum(0)
    tgt = (tpe + 3) // 4 * 4
    pad = torch.cumsum(tgt - tpe, 0) - (tgt - tpe)
    _opcheck(ops.te_permute_mask, (x, m, probs, int(tgt.sum()), 4, pad))
    out, rid, pp = ops.te_permute_mask(x, m, probs, T * k, 1, None)
    y = out.detach().requires_grad_(True)
    _opcheck(ops.te_unpermute_mask, (y, rid, probs, T, None))
    _opcheck(ops.te_unpermute_mask, (y, rid, None, T, None))
    _opcheck(ops.te_permute_index, (x, idx, 0))
    _opcheck(ops.te_permute_index, (x, idx, 15))
    outi, ridi = ops.te_permute_index(x, idx, 0)
    pi = torch.rand(T, k, generator=g, requires_grad=True)
    _opcheck(ops.te_unpermute_index, (outi.detach().requires_grad_(True), ridi, pi, T))
    splits = torch.tensor([4, 6], dtype=torch.int32)
    order = torch.tensor([1, 0], dtype=torch.int32)
    _opcheck(ops.te_sort_chunks, (x, splits, order, torch.rand(T, requires_grad=True)))
    _opcheck(ops.te_sort_chunks, (x, splits, order, None))


@pytest.mark.parametrize("map_type", ["mask", "index"])
def test_probs_grad_accuracy_long_hidden(map_type):
    """The probs' gradient is a dot over the hidden size: TE holds it to 1e-6 relative in fp32 at
    H = 4096. xte sums the exact products in fp64 and rounds once: within half an fp32 ulp (and a
    hair) of the exact fp64 dot, for full-precision random data."""
    g = torch.Generator().manual_seed(14)
    T, E, k, H = 16, 6, 2, 4096
    x = torch.rand(T, H, generator=g)
    if map_type == "mask":
        m = _routing_mask(T, E, k, g)
        out, rid = te.moe_permute(x, m, T * k)
        probs = (torch.rand(T, E, generator=g) * m).requires_grad_(True)
    else:
        idx = _index(T, E, k, g)
        out, rid = te.moe_permute(x, idx, 0, map_type="index")
        probs = torch.rand(T, k, generator=g, requires_grad=True)
    y = out.detach().requires_grad_(True)
    back = te.moe_unpermute(y, rid, probs, (T, H), map_type=map_type)
    gy = torch.rand(T, H, generator=g)
    back.backward(gy)
    # the exact dots: each slot's row is its token's x (the permute moved it there)
    dots = (gy.double() * x.double()).sum(1)
    got = probs.grad
    routed = (m if map_type == "mask" else torch.ones(T, k, dtype=torch.bool))
    for t in range(T):
        for c in range(got.shape[1]):
            if not routed[t, c]:
                assert got[t, c] == 0
                continue
            ref = float(dots[t])
            assert abs(float(got[t, c]) - ref) <= 2.0 ** -24 * abs(ref) * 1.001, (t, c)


class _PerTensor:  # TE's per-tensor FP8 fields (Float8Tensor)
    def __init__(self, data, scale_inv):
        self._data, self._scale_inv, self._transpose = data, scale_inv, None
        self._shape = data.shape


class _Rowwise:  # TE's blockwise (scales [S, T]) / MXFP8 (scales [T, S]) FP8 fields
    def __init__(self, data, scale, blockwise):
        self._rowwise_data, self._rowwise_scale_inv = data, scale
        self._columnwise_data = self._columnwise_scale_inv = None
        self._shape = data.shape
        if blockwise:
            self._is_2D_scaled = False


@pytest.mark.parametrize("kind", ["per_tensor", "blockwise", "mxfp8"])
def test_fp8_tensors_permute(kind):
    """TE's FP8 tensors through moe_permute (mask map): the fp8 bytes and their scale rows move
    together, byte for byte; the per-tensor scale stays; inp is not changed."""
    g = torch.Generator().manual_seed(15)
    T, E, k, H = 14, 5, 2, 256
    m = _routing_mask(T, E, k, g)
    data = torch.randint(0, 256, (T, H), generator=g, dtype=torch.uint8)
    if kind == "per_tensor":
        inp = _PerTensor(data, torch.tensor([0.5]))
    elif kind == "blockwise":
        inp = _Rowwise(data, torch.rand(H // 128, T, generator=g), True)
    else:
        inp = _Rowwise(data, torch.randint(0, 256, (T, H // 32), generator=g,
                                           dtype=torch.uint8), False)
    out, rid = te.moe_permute(inp, m, T * k + 2)
    slots = oracle_mask_slots(m)
    want = torch.zeros(T * k + 2, H, dtype=torch.uint8)
    want[[r for _, _, r in slots]] = data[[t for t, _, _ in slots]]
    if kind == "per_tensor":
        _same(out._data, want)
        assert out._scale_inv is inp._scale_inv and inp._data is data
    else:
        _same(out._rowwise_data, want)
        sc = inp._rowwise_scale_inv.T if kind == "blockwise" else inp._rowwise_scale_inv
        ws = torch.zeros((T * k + 2, sc.shape[1]), dtype=sc.dtype)
        ws[[r for _, _, r in slots]] = sc[[t for t, _, _ in slots]]
        got = out._rowwise_scale_inv.T if kind == "blockwise" else out._rowwise_scale_inv
        _same(got.contiguous(), ws)
        assert inp._rowwise_data is data
    assert tuple(out._shape) == (T * k + 2, H)
    _same(rid, te.moe_permute(torch.zeros(T, 1), m, T * k + 2)[1])


def test_fp8_tensor_permute_and_pad():
    """An FP8 (blockwise) tensor through moe_permute_and_pad_with_probs: rows and scale rows at
    the padded positions of the plain-tensor permute, zero elsewhere."""
    g = torch.Generator().manual_seed(16)
    T, E, k, H = 20, 4, 2, 128
    m = _routing_mask(T, E, k, g)
    data = torch.randint(0, 256, (T, H), generator=g, dtype=torch.uint8)
    scale = torch.rand(1, T, generator=g) + 1
    probs = torch.rand(T, E, generator=g) * m + m  # no zero prob: no zeroed row
    out, pp, rid, pad, tgt = te.moe_permute_and_pad_with_probs(_Rowwise(data, scale, True), probs,
                                                               m, m.sum(0), 8)
    ref, rpp, rrid, rpad, _ = te.moe_permute_and_pad_with_probs(data.float(), probs, m, m.sum(0),
                                                                8)
    _same(rid, rrid)
    _same(pp, rpp)
    _same(out._rowwise_data.float(), ref)
    _same(out._rowwise_scale_inv.T.contiguous(),
          te.moe_permute_and_pad_with_probs(scale.T.contiguous(), probs, m, m.sum(0), 8)[0])
