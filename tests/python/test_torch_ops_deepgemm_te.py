"""xte.torch in the peers' forms: the custom ops of DeepGEMM's destination-passing GEMMs
(fp8_gemm_nt / nn / tn / tt, m_grouped_fp8_gemm_nt_contiguous / _masked,
k_grouped_fp8_gemm_tn_contiguous: mutating ops on d), the mask-form permute / unpermute, the FP8
permute (data and scale rows moved together), TE's router form (probs + byte map or bitmap), and
moe_permute's exact-rows argument.

For each op: torch.library.opcheck (schema incl. the declared mutation of d, fake kernel,
autograd registration, aot_dispatch_dynamic); the xte.torch wrapper byte-equal to the plain
xte.* function (a second marshalling path over the same C call); per family a
torch.compile(fullgraph=True) function giving eager's bytes. Needs torch (CI installs it)."""

# ctest: no-isa-variants  (torch plumbing; the C results are tested per ISA elsewhere)

import os
import re

import pytest

torch = pytest.importorskip("torch")

import xte  # noqa: E402
import xte.torch as xt  # noqa: E402
from xte.ops import gemm as P_gemm  # noqa: E402
from xte.ops import moe as P_moe  # noqa: E402
from xte.ops import quantize as P_q  # noqa: E402

ops = torch.ops.xte
E4M3, E5M2 = int(xte.DType.E4M3), int(xte.DType.E5M2)
FP8 = {E4M3: torch.float8_e4m3fn, E5M2: torch.float8_e5m2}


def _bytes(t):
    return t.contiguous().view(torch.uint8) if t.dtype != torch.uint8 else t


def same_bytes(a, b):
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape), (a.dtype, b.dtype, a.shape,
                                                                   b.shape)
    assert torch.equal(_bytes(a), _bytes(b))


def _opcheck(op, args, kwargs=None):
    torch.library.opcheck(op, args, kwargs or {},
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration", "test_aot_dispatch_dynamic"))


def _codes(g, shape, fmt=E4M3):
    """Random fp8 codes (subnormals included) as a float8 tensor, NaN / inf codes replaced by
    zero except one NaN planted at the first element (one NaN row / column of the result)."""
    c = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    bad = (c & 0x7F) >= (0x7F if fmt == E4M3 else 0x7C)
    c[bad] = 0
    if c.numel():
        c.view(-1)[0] = 0x7F
    return c.view(FP8[fmt])


def _grid(g, shape):
    """Power-of-two fp32 scales, one tiny (subnormal products) and one huge (overflow)."""
    s = torch.pow(2.0, torch.randint(-4, 5, shape, generator=g).float())
    f = s.view(-1)
    if f.numel() >= 2:
        f[0], f[-1] = 2.0 ** -70, 2.0 ** 60
    return s


def _cdiv(a, b):
    return -(-a // b)


# ----------------------------------------------------------------------------- DeepGEMM GEMMs

M, N, K = 6, 130, 300
# stored shapes of a and b for each name (recipe (1, 128, 128): a 1x128, b 128x128); a used
# transposed carries its 1x128 scales per 128 rows of the stored [K, M] data
DG = {"nt": ((M, K), (M, _cdiv(K, 128)), (N, K), (_cdiv(N, 128), _cdiv(K, 128))),
      "nn": ((M, K), (M, _cdiv(K, 128)), (K, N), (_cdiv(K, 128), _cdiv(N, 128))),
      "tn": ((K, M), (_cdiv(K, 128), M), (K, N), (_cdiv(K, 128), _cdiv(N, 128))),
      "tt": ((K, M), (_cdiv(K, 128), M), (N, K), (_cdiv(N, 128), _cdiv(K, 128)))}


def _dg_case(name, seed, fb=E4M3):
    g = torch.Generator().manual_seed(seed)
    sa, ssa, sb, ssb = DG[name]
    return (_codes(g, sa), _grid(g, ssa)), (_codes(g, sb, fb), _grid(g, ssb)), g


@pytest.mark.parametrize("name", list(DG))
def test_fp8_gemm_bytes_equal_plain_and_opcheck(name):
    a, b, g = _dg_case(name, 10 + list(DG).index(name), E5M2 if name == "nn" else E4M3)
    fx, fp = getattr(xt, f"fp8_gemm_{name}"), getattr(P_gemm, f"fp8_gemm_{name}")
    bias = torch.randn(N, generator=g)
    c = torch.randn(M, N, generator=g)
    for od in (torch.float32, torch.bfloat16):
        for kw in ({}, {"recipe": (1, 128, 128)}, {"bias": bias}, {"recipe_a": "1x128",
                                                                   "recipe_b": (128, 128)}):
            d1 = torch.full((M, N), float("nan"), dtype=od)
            d2 = d1.clone()
            p = d1.data_ptr()
            assert fx(a, b, d1, **kw) is d1 and d1.data_ptr() == p
            fp(a, b, d2, **kw)
            same_bytes(d1, d2)
            assert not torch.isnan(d1).all()
    # accumulate: c given, and c = d (in place)
    d1, d2 = torch.zeros(M, N), torch.zeros(M, N)
    fx(a, b, d1, c)
    fp(a, b, d2, c)
    same_bytes(d1, d2)
    fx(a, b, d1, d1)
    fp(a, b, d2, d2)
    same_bytes(d1, d2)
    ab = (a[0].view(torch.uint8), a[1], b[0].view(torch.uint8), b[1])
    fb = E5M2 if name == "nn" else E4M3
    _dg_opcheck(name, ab + (torch.zeros(M, N), None, False, bias, E4M3, fb, [], [-1] * 4, 0))
    if name == "nt":  # c, bf16 d, the recipe; accumulation into d itself
        _opcheck(ops.fp8_gemm_nt, ab + (torch.zeros(M, N, dtype=torch.bfloat16), c, False, None,
                                        E4M3, fb, [1, 128, 128], [-1] * 4, 1))
        _opcheck(ops.fp8_gemm_nt, ab + (torch.ones(M, N), None, True, None, E4M3, fb, [],
                                        [-1] * 4, 0))


def _dg_opcheck(name, args):
    """opcheck of xte::fp8_gemm_<name> (spelled out: test_every_op_is_opchecked reads them)."""
    if name == "nt":
        _opcheck(ops.fp8_gemm_nt, args)
    elif name == "nn":
        _opcheck(ops.fp8_gemm_nn, args)
    elif name == "tn":
        _opcheck(ops.fp8_gemm_tn, args)
    else:
        _opcheck(ops.fp8_gemm_tt, args)


def test_fp8_gemm_errors_name_argument_and_leave_d():
    a, b, _ = _dg_case("nt", 3)
    d = torch.full((M, N), 7.0)
    with pytest.raises(xte.XteError, match=r"^b\[1\]|b\[1\]:"):
        xt.fp8_gemm_nt(a, (b[0], torch.ones(3, 3)), d)
    with pytest.raises(TypeError, match="a:"):
        xt.fp8_gemm_nt(xte.quantize(torch.randn(M, K)), b, d)
    with pytest.raises(TypeError, match=r"a\[0\]"):
        xt.fp8_gemm_nt((a[0].view(torch.uint8), a[1]), b, d)
    with pytest.raises(NotImplementedError, match="alpha"):
        xt.fp8_gemm_nt(a, b, d, alpha=2.0)
    with pytest.raises(xte.XteError, match="d"):
        xt.fp8_gemm_nt(a, b, torch.zeros(M, N + 1))
    assert bool((d == 7.0).all())


def _grouped_contiguous(g, sizes, align):
    G, Nn, Kk = len(sizes), 128, 200
    rows = sum(_cdiv(m, align) * align for m in sizes)
    a = (_codes(g, (rows, Kk)), _grid(g, (rows, _cdiv(Kk, 128))))
    b = (_codes(g, (G, Nn, Kk)), _grid(g, (G, 1, _cdiv(Kk, 128))))
    return a, b, rows, Nn


def test_m_grouped_contiguous_bytes_opcheck():
    g = torch.Generator().manual_seed(20)
    sizes = [100, 0, 70]
    a, b, rows, Nn = _grouped_contiguous(g, sizes, 128)
    idx = []
    for e, m in enumerate(sizes):
        idx += [e] * m + [-1] * (_cdiv(m, 128) * 128 - m)
    m_indices = torch.tensor(idx, dtype=torch.int32)
    d1 = torch.full((rows, Nn), float("nan"))
    d2 = d1.clone()
    xt.m_grouped_fp8_gemm_nt_contiguous(a, b, d1, m_indices)
    P_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d2, m_indices)
    same_bytes(d1, d2)
    # an m_indices layout: padding rows written with zeros, as DeepGEMM
    assert bool((d1[100:128] == 0).all()) and not torch.isnan(d1[:100]).all()
    d4 = torch.full((rows, Nn), float("nan"))
    xt.m_grouped_fp8_gemm_nt_contiguous(a, b, d4, group_sizes=sizes, alignment=128,
                                        ensure_zero_padding=False)
    assert torch.isnan(d4[100:128]).all()  # padding kept
    same_bytes(d4[:100], d1[:100])
    # the group-size form (a list and a tensor), alignment 128
    for gs in (sizes, torch.tensor(sizes)):
        d3 = torch.full((rows, Nn), float("nan"))
        xt.m_grouped_fp8_gemm_nt_contiguous(a, b, d3, group_sizes=gs, alignment=128)
        same_bytes(d3, d1)
    bytes_ = (a[0].view(torch.uint8), a[1], b[0].view(torch.uint8), b[1])
    _opcheck(ops.m_grouped_fp8_gemm_nt_contiguous,
             bytes_ + (torch.zeros(rows, Nn), m_indices, None, 128, None, E4M3, E4M3, [],
                       [-1] * 4, 0))
    _opcheck(ops.m_grouped_fp8_gemm_nt_contiguous,
             bytes_ + (torch.zeros(rows, Nn, dtype=torch.bfloat16), None,
                       torch.tensor(sizes), 128, torch.randn(Nn, generator=g), E4M3, E4M3, [],
                       [-1] * 4, 0))


def _masked_case(g):
    G, mmax, Nn, Kk = 3, 9, 128, 200
    a = (_codes(g, (G, mmax, Kk)), _grid(g, (G, mmax, _cdiv(Kk, 128))))
    b = (_codes(g, (G, Nn, Kk)), _grid(g, (G, 1, _cdiv(Kk, 128))))
    masked = torch.tensor([9, 0, 4], dtype=torch.int32)
    return a, b, masked, (G, mmax, Nn)


def test_m_grouped_masked_bytes_opcheck():
    g = torch.Generator().manual_seed(21)
    a, b, masked, dshape = _masked_case(g)
    d1 = torch.full(dshape, float("nan"))
    d2 = d1.clone()
    xt.m_grouped_fp8_gemm_nt_masked(a, b, d1, masked, expected_m=4)
    P_gemm.m_grouped_fp8_gemm_nt_masked(a, b, d2, masked)
    same_bytes(d1, d2)
    assert torch.isnan(d1[1]).all() and torch.isnan(d1[2, 4:]).all()
    _opcheck(ops.m_grouped_fp8_gemm_nt_masked,
             (a[0].view(torch.uint8), a[1], b[0].view(torch.uint8), b[1], torch.zeros(dshape),
              masked, None, E4M3, E4M3, [], [-1] * 4, 0))


def _k_case(g):
    ks, Mm, Nn = [128, 256, 44], 5, 7
    Ks = sum(ks)
    a = (_codes(g, (Ks, Mm)), _grid(g, (_cdiv(Ks, 128), Mm)))
    b = (_codes(g, (Ks, Nn)), _grid(g, (_cdiv(Ks, 128), Nn)))
    return a, b, ks, (len(ks), Mm, Nn)


def test_k_grouped_bytes_opcheck():
    g = torch.Generator().manual_seed(22)
    a, b, ks, dshape = _k_case(g)
    c = torch.randn(dshape, generator=g)
    for cc in (None, c, "d"):
        d1 = torch.randn(dshape, generator=g)
        d2 = d1.clone()
        xt.k_grouped_fp8_gemm_tn_contiguous(a, b, d1, ks, None, d1 if cc == "d" else cc)
        P_gemm.k_grouped_fp8_gemm_tn_contiguous(a, b, d2, ks, None, d2 if cc == "d" else cc)
        same_bytes(d1, d2)
    d3 = torch.zeros(dshape)
    xt.k_grouped_fp8_gemm_tn_contiguous(a, b, d3, None, torch.tensor(ks, dtype=torch.int32))
    d4 = torch.zeros(dshape)
    P_gemm.k_grouped_fp8_gemm_tn_contiguous(a, b, d4, ks)
    same_bytes(d3, d4)
    bytes_ = (a[0].view(torch.uint8), a[1], b[0].view(torch.uint8), b[1])
    _opcheck(ops.k_grouped_fp8_gemm_tn_contiguous,
             bytes_ + (torch.zeros(dshape), torch.tensor(ks), None, c, False, None, E4M3, E4M3,
                       [1, 1, 128], [-1] * 4, 0))
    _opcheck(ops.k_grouped_fp8_gemm_tn_contiguous,
             bytes_ + (torch.ones(dshape), torch.tensor(ks), None, None, True, None, E4M3, E4M3,
                       [1, 1, 128], [-1] * 4, 0))


def test_compile_fullgraph_deepgemm_family():
    """The seven ops in one function under torch.compile(fullgraph=True): eager's bytes."""
    g = torch.Generator().manual_seed(23)
    a, b, _ = _dg_case("nt", 24)
    at, bt, _ = _dg_case("tn", 25)
    ga, gb, rows, Nn = _grouped_contiguous(g, [100, 0, 70], 1)
    ma, mb, masked, mshape = _masked_case(g)
    ka, kb, ks, kshape = _k_case(g)
    c = torch.randn(M, N, generator=g)

    def f(d_nt, d_nn, d_tn, d_tt, d_g, d_m, d_k):
        xt.fp8_gemm_nt(a, b, d_nt, c)
        xt.fp8_gemm_nn(a, bt, d_nn)
        xt.fp8_gemm_tn(at, bt, d_tn, recipe=(1, 128, 128))
        xt.fp8_gemm_tt(at, b, d_tt)
        xt.m_grouped_fp8_gemm_nt_contiguous(ga, gb, d_g, group_sizes=[100, 0, 70])
        xt.m_grouped_fp8_gemm_nt_masked(ma, mb, d_m, masked)
        xt.k_grouped_fp8_gemm_tn_contiguous(ka, kb, d_k, ks, None, d_k)
        return d_nt.sum() + d_k.sum()

    def outs():
        return (torch.zeros(M, N), torch.zeros(M, N, dtype=torch.bfloat16), torch.zeros(M, N),
                torch.zeros(M, N), torch.zeros(rows, Nn), torch.zeros(mshape),
                torch.ones(kshape))
    de, dc = outs(), outs()
    f(*de)
    torch._dynamo.reset()
    torch.compile(f, fullgraph=True, backend="aot_eager")(*dc)
    for x, y in zip(de, dc):
        same_bytes(x, y)
    # plain functions: the same bytes
    dp = torch.zeros(M, N)
    P_gemm.fp8_gemm_nt(a, b, dp, c)
    same_bytes(dp, de[0])


# ----------------------------------------------------------------------------- permute


def _routing(g, T, E, k, drop_every=5):
    """topk_idx int64 [T, k] (distinct experts per token, some -1) and its byte map."""
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    idx[::drop_every, -1] = -1
    rmap = torch.zeros(T, E, dtype=torch.bool)
    for t in range(T):
        for e in idx[t].tolist():
            if e >= 0:
                rmap[t, e] = True
    return idx, rmap


@pytest.mark.parametrize("cap,align", [(-1, 1), (-1, 16), (9, 1), (9, 8)])
def test_permute_mask_bytes_opcheck_grad(cap, align):
    g = torch.Generator().manual_seed(30)
    T, H, E, k = 11, 40, 5, 2
    idx, rmap = _routing(g, T, E, k)
    x = torch.randn(T, H, generator=g)
    probs = torch.rand(T, E, generator=g) * rmap
    for dt in (torch.float32, torch.bfloat16):
        xx = x.to(dt)
        out, rm, tpe, offs = xt.moe_permute_mask(xx, rmap, cap, align, topk=k)
        assert out.shape[0] == xt.permute_capacity(T, k, E, cap, align)
        po, prid = P_moe.moe_permute(xx, rmap, cap, map_type="mask", topk=k, align=align,
                                     out=torch.full_like(out, 5.0))
        same_bytes(out, po)  # unused rows are zeros in both
        same_bytes(rm, prid.row_map)
        # exact rows
        R = xt.permute_rows(routing_map=rmap, num_out_tokens=cap, align=align)
        assert R == int(offs[-1])
        out2, rm2, _, _ = xt.moe_permute_mask(xx, rmap, cap, align, topk=k, rows=R)
        assert out2.shape[0] == R
        same_bytes(out2, out[:R])
        same_bytes(rm2, rm)
        y = xt.moe_unpermute_mask(out, rmap, rm, probs)
        same_bytes(y, P_moe.moe_unpermute(po, prid, probs))
    # gradients: permute then unpermute with the plain backwards
    xg = x.detach().clone().requires_grad_()
    pg = probs.clone().requires_grad_()
    o, rm, _, _ = xt.moe_permute_mask(xg, rmap, cap, align, topk=k)
    y = xt.moe_unpermute_mask(o, rmap, rm, pg)
    gy = torch.randn(T, H, generator=g)
    y.backward(gy)
    rid = P_moe.RowIdMap(rm, routing_map=rmap, num_experts=E, num_rows=o.shape[0])
    go, gp = P_moe.moe_unpermute_backward(gy, o.detach(), rid, probs)
    same_bytes(pg.grad, gp)
    same_bytes(xg.grad, P_moe.moe_permute_backward(go, rid))
    rmb = rmap.view(torch.uint8)
    if (cap, align) not in ((-1, 1), (9, 8)):  # opcheck is slow: on two of the four cases
        return
    _opcheck(ops.moe_permute_mask, (x.requires_grad_(), rmb, k, cap, align))
    _opcheck(ops.moe_permute_mask, (x, rmb, k, cap, align, xt.permute_rows(
        routing_map=rmap, num_out_tokens=cap, align=align)))
    out, rm, _, _ = ops.moe_permute_mask(x.detach(), rmb, k, cap, align)
    _opcheck(ops.moe_permute_mask_backward, (torch.randn_like(out), rmb, rm))
    _opcheck(ops.moe_unpermute_mask, (out.requires_grad_(), rmb, rm,
                                      probs.clone().requires_grad_()))
    _opcheck(ops.moe_unpermute_mask, (out, rmb, rm, None))
    _opcheck(ops.moe_unpermute_mask_backward, (torch.randn(T, H), out.detach(), rmb, rm, probs))


def test_permute_exact_rows_index_form():
    """moe_permute(rows=permute_rows(...)): exactly the rows the routing uses, the same bytes
    as the capacity form's first rows; fewer rows is the C library's error."""
    g = torch.Generator().manual_seed(31)
    T, H, E, k = 13, 24, 6, 3
    idx, _ = _routing(g, T, E, k)
    x = torch.randn(T, H, generator=g)
    for cap, align in ((-1, 1), (-1, 32), (20, 8)):
        R = xt.permute_rows(topk_idx=idx, num_experts=E, num_out_tokens=cap, align=align)
        full = xt.moe_permute(x, idx, E, cap, align)
        ex = xt.moe_permute(x, idx, E, cap, align, rows=R)
        assert ex[0].shape[0] == R == int(full[3][-1]) <= full[0].shape[0]
        same_bytes(ex[0], full[0][:R])
        for u, v in zip(ex[1:], full[1:]):
            same_bytes(u, v)
        _opcheck(ops.moe_permute, (x.clone().requires_grad_(), idx, E, cap, align, R))
        if R > 0:
            with pytest.raises(xte.XteError):
                xt.moe_permute(x, idx, E, cap, align, rows=R - 1)


@pytest.mark.parametrize("block,recipe,routing", [("1x128", "te_block", "mask"),
                                                  ("1x32", "mx_ocp", "index"),
                                                  ("1x128", "deepgemm", "index")])
def test_permute_fp8_bytes_opcheck(block, recipe, routing):
    g = torch.Generator().manual_seed(32)
    T, H, E, k = 9, 160, 4, 2
    idx, rmap = _routing(g, T, E, k)
    x = torch.randn(T, H, generator=g) * 30
    x[0, 0], x[1, 5], x[2, 7] = float("nan"), float("inf"), 1e-41
    q = xte.quantize(x, recipe, block)
    if routing == "mask":
        kw, pk = dict(routing_map=rmap, topk=k), dict(map_type="mask", topk=k)
        rarg = rmap
    else:
        kw, pk = dict(topk_idx=idx, num_experts=E), dict(map_type="index", num_experts=E)
        rarg = idx
    for cap, align in ((-1, 1), (7, 4)):
        qo, rm, tpe, offs = xt.moe_permute_fp8(q, num_out_tokens=cap, align=align, **kw)
        R = qo.data.shape[0]
        po, prid = P_moe.moe_permute(q, rarg, cap, align=align, out=torch.full_like(
            qo.data.view(torch.uint8), 0x55).view(qo.data.dtype), **pk)
        same_bytes(qo.data, po.data)
        same_bytes(qo.scale_inv, po.scale_inv)
        same_bytes(rm, prid.row_map)
        assert qo.scaling_mode == q.scaling_mode and R == xt.permute_capacity(T, k, E, cap, align)
        # raw (data, scales) form, exact rows
        n = xt.permute_rows(num_out_tokens=cap, align=align, **{
            key: v for key, v in kw.items() if key in ("routing_map", "topk_idx",
                                                        "num_experts")})
        o2, s2, rm2, _, _ = xt.moe_permute_fp8(q.data, q.scale_inv, num_out_tokens=cap,
                                               align=align, rows=n, **kw)
        assert o2.shape[0] == n == int(xt.moe_permute_fp8(q, rows=n, num_out_tokens=cap,
                                                           align=align, **kw)[3][-1])
        same_bytes(o2, qo.data[:n])
        same_bytes(s2, qo.scale_inv[:n])
        same_bytes(rm2, rm)
    sc = q.scale_inv
    sb = sc.view(torch.uint8) if sc.element_size() == 1 else sc
    fmt = E4M3
    if routing == "mask":
        args = (q.data.view(torch.uint8), sb, rmap.view(torch.uint8), None, E, k, fmt, -1, 4)
    else:
        args = (q.data.view(torch.uint8), sb, None, idx, E, 0, fmt, 7, 1)
    _opcheck(ops.moe_permute_fp8, args)


def test_compile_fullgraph_permute_family():
    g = torch.Generator().manual_seed(33)
    T, H, E, k = 10, 128, 4, 2
    idx, rmap = _routing(g, T, E, k)
    probs = torch.rand(T, E, generator=g) * rmap
    x = torch.randn(T, H, generator=g)
    q = xte.quantize(x, "te_block", "1x128")

    def f(x, rmap, probs):
        o, rm, _, _ = xt.moe_permute_mask(x, rmap, -1, 8, topk=k)
        y = xt.moe_unpermute_mask(o * 2, rmap, rm, probs)
        qo, rm2, _, _ = xt.moe_permute_fp8(q, routing_map=rmap, topk=k, align=8)
        return y, qo.data.view(torch.uint8), qo.scale_inv, rm2

    xe, pe = x.clone().requires_grad_(), probs.clone().requires_grad_()
    xc, pc = x.clone().requires_grad_(), probs.clone().requires_grad_()
    re = f(xe, rmap, pe)
    torch._dynamo.reset()
    rc = torch.compile(f, fullgraph=True, backend="aot_eager")(xc, rmap, pc)
    for u, v in zip(re, rc):
        same_bytes(u.detach(), v.detach())
    gy = torch.randn(T, H, generator=g)
    re[0].backward(gy)
    rc[0].backward(gy)
    same_bytes(xe.grad, xc.grad)
    same_bytes(pe.grad, pc.grad)


# ----------------------------------------------------------------------------- router (TE form)

RCASES = [("softmax", False, 0, 0), ("softmax", True, 0, 0), ("sigmoid", False, 4, 2),
          ("sqrtsoftplus", False, 0, 0)]


@pytest.mark.parametrize("score,pre,ng,gt", RCASES)
def test_router_probs_bytes_opcheck_grad(score, pre, ng, gt):
    g = torch.Generator().manual_seed(40)
    T, E, k = 7, 12, 4
    logits = torch.randn(T, E, generator=g)
    bias = torch.randn(E, generator=g) if score != "softmax" else None
    kw = dict(use_pre_softmax=pre, num_groups=ng, group_topk=gt, scaling_factor=1.5,
              score_function=score, expert_bias=bias)
    for dt in (torch.float32, torch.bfloat16):
        lg = logits.to(dt)
        for fmt in ("bytemap", "bitmap_u8"):
            p1, m1 = xt.fused_topk_with_score_function(lg, k, routing_map_format=fmt, **kw)
            p2, m2 = P_moe.fused_topk_with_score_function(lg, k, routing_map_format=fmt, **kw)
            same_bytes(p1, p2)
            same_bytes(m1, m2)
            assert m1.dtype == (torch.bool if fmt == "bytemap" else torch.uint8)
            assert tuple(m1.shape) == ((T, E) if fmt == "bytemap" else (T, (E + 7) // 8))
    sf = int(xte.ops.moe.parse_score(score))
    _opcheck(ops.router_probs, (logits.clone().requires_grad_(), bias, k, sf, pre, ng, gt, 1.5))
    # gradient = the plain backward with the forward's byte map and intermediate
    lg = logits.clone().requires_grad_()
    p, _ = xt.fused_topk_with_score_function(lg, k, **kw)
    gp = torch.randn(T, E, generator=g)
    p.backward(gp)
    _, rmap, saved = P_moe.fused_topk_with_score_function(logits, k, return_intermediate=True,
                                                          routing_map_out=torch.empty(
                                                              T, E, dtype=torch.uint8), **kw)
    want = P_moe.fused_topk_with_score_function_backward(
        rmap, saved, gp, k, pre, 1.5, score, logits, num_groups=ng, group_topk=gt)
    same_bytes(lg.grad, want)


def test_compile_fullgraph_router_family():
    g = torch.Generator().manual_seed(41)
    T, E, k = 9, 16, 2
    logits = torch.randn(T, E, generator=g)

    def f(lg):
        p, bits = xt.fused_topk_with_score_function(lg, k, score_function="sigmoid",
                                                    scaling_factor=2.0,
                                                    routing_map_format="bitmap_u8")
        _, m = xt.fused_topk_with_score_function(lg, k)
        return p * 3, bits, m

    le, lc = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    re = f(le)
    torch._dynamo.reset()
    rc = torch.compile(f, fullgraph=True, backend="aot_eager")(lc)
    for u, v in zip(re, rc):
        same_bytes(u.detach(), v.detach())
    gp = torch.randn(T, E, generator=g)
    re[0].backward(gp)
    rc[0].backward(gp)
    same_bytes(le.grad, lc.grad)


def test_te_router_ops():
    """The ops of xte.transformer_engine.pytorch.router (tests/python/test_te_router.py checks
    their values)."""
    g = torch.Generator().manual_seed(32)
    x = torch.randn(6, 40, generator=g).requires_grad_(True)
    b = torch.linspace(-0.1, 0.1, 40)
    _opcheck(ops.te_router, (x, b, 4, 1, False, 4, 2, 1.5, True, True))
    _opcheck(ops.te_router, (x, None, 3, 0, True, 0, 0, 1.0, False, False))
    _opcheck(ops.te_aux_scores, (x, 3, 2, True))
    p = torch.rand(6, 40, generator=g).requires_grad_(True)
    tpe = torch.randint(1, 9, (40,), generator=g, dtype=torch.int32)
    _opcheck(ops.te_aux_loss, (p, tpe, 6, None, 20, 2, 0.1))
    # Quantile Balancing: sigmoid scores, the histogram of this call over [lower, upper]
    _opcheck(ops.te_router_qb, (x, b, 3, 1.0, torch.tensor([-0.5, 0.5]), 8, True, False))
    _opcheck(ops.te_router_qb, (x, b, 2, 1.5, torch.tensor([-0.1, 0.1]), 4, False, True))


def test_every_op_is_opchecked():
    """Every registered op (xte.torch.OPS) is opchecked in test_torch_ops.py or here."""
    here = os.path.dirname(os.path.abspath(__file__))
    src = "".join(open(os.path.join(here, f)).read()
                  for f in ("test_torch_ops.py", "test_torch_ops_deepgemm_te.py"))
    checked = set(re.findall(r"_opcheck\(ops\.(\w+)", src))
    assert set(xt.OPS) <= checked, set(xt.OPS) - checked
    mine = {"fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt",
            "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked",
            "k_grouped_fp8_gemm_tn_contiguous", "moe_permute_mask", "moe_permute_mask_backward",
            "moe_unpermute_mask", "moe_unpermute_mask_backward", "moe_permute_fp8",
            "router_probs"}
    assert mine <= set(xt.OPS)
    assert mine <= set(re.findall(r"_opcheck\(ops\.(\w+)", open(__file__).read()))
