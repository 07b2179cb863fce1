"""xte.torch: the torch.library custom ops (namespace xte).

- torch.library.opcheck on every op (schema, fake kernel vs real shapes / dtypes / strides,
  autograd registration, aot_dispatch_dynamic);
- their outputs byte-equal to the plain xte.ops.* functions (two independent marshalling paths
  over the same C calls), on odd shapes, NaN / inf / subnormal inputs and empty tensors;
- the fake kernels' shapes equal the C shape query (xte_quantize_scale_shape) and the real ones;
- thread safety: the ops called from several Python threads give the bytes of serial calls;
- importing xte does not import torch.
Needs torch (CI installs it: the run_pytest.sh environment)."""

# ctest: no-isa-variants  (marshalling only; the C results are tested per ISA elsewhere)

import math
import subprocess
import sys
import threading

import pytest

torch = pytest.importorskip("torch")

import xte  # noqa: E402
import xte.torch as xt  # noqa: E402
from xte.torch import _attention  # noqa: E402
from xte.ops import attention as P_att  # noqa: E402
from xte.ops import gemm as P_gemm  # noqa: E402
from xte.ops import moe as P_moe  # noqa: E402
from xte.ops import quantize as P_q  # noqa: E402

ops = torch.ops.xte


def _bytes(t):
    return t.contiguous().view(torch.uint8) if t.dtype != torch.uint8 else t


def same_bytes(a, b):
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape), (a.dtype, b.dtype, a.shape,
                                                                   b.shape)
    assert torch.equal(_bytes(a), _bytes(b))


def _special(x):
    """NaN, +-inf, subnormals and zeros planted in x (fp32)."""
    f = x.flatten()
    n = f.numel()
    if n >= 8:
        f[0] = float("nan")
        f[n // 3] = float("inf")
        f[n // 2] = -float("inf")
        f[n - 1] = 1e-40
        f[n - 2] = -0.0
        f[n // 4] = 3e-45
    return x


def _opcheck(op, args, kwargs=None):
    torch.library.opcheck(op, args, kwargs or {},
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration", "test_aot_dispatch_dynamic"))


def _check_fake(op, args):
    """The fake kernel's outputs have the real outputs' shapes and dtypes (opcheck's faketensor
    test alone, cheaper than the full set)."""
    torch.library.opcheck(op, args, test_utils=("test_faketensor",))


def test_import_xte_does_not_import_torch():
    code = "import sys, xte; assert 'torch' not in sys.modules, 'xte imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- quantize

QCASES = [("te_block", "1x128", "compact"), ("te_block", "128x128", "compact"),
          ("deepgemm", "1x128", "deepgemm"), ("deepgemm_ue8m0", "128x128", "compact"),
          ("mtfp8", "1x128", "te_gemm"), ("mx_te", "1x32", "mx_swizzled"),
          ("mx_ocp", "1x32", "compact"), ("te_current", "per_tensor", "compact")]


@pytest.mark.parametrize("recipe,block,layout", QCASES)
@pytest.mark.parametrize("shape", [(3, 200), (130, 64), (0, 128)])
def test_quantize_bytes_equal_plain(recipe, block, layout, shape):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g) * 10
    x = _special(x)
    for dt in (torch.float32, torch.bfloat16):
        xx = x.to(dt)
        if x.numel() == 0:
            # torch gives an empty tensor a NULL data pointer; both paths take it (the binding
            # passes a valid pointer for an array with no element) and agree on the shapes
            a = xt.quantize(xx, recipe, block, layout, rowwise=True, columnwise=True)
            b = P_q.quantize(xx, recipe, block, layout, rowwise=True, columnwise=True)
            assert tuple(a.data.shape) == tuple(b.data.shape) == tuple(x.shape)
            assert tuple(a.scale_inv.shape) == tuple(b.scale_inv.shape)
            assert tuple(a.columnwise_data.shape) == tuple(b.columnwise_data.shape)
        a = xt.quantize(xx, recipe, block, layout, rowwise=True, columnwise=True)
        b = P_q.quantize(xx, recipe, block, layout, rowwise=True, columnwise=True)
        same_bytes(a.data, b.data)
        same_bytes(a.scale_inv, b.scale_inv)
        same_bytes(a.columnwise_data, b.columnwise_data)
        same_bytes(a.columnwise_scale_inv, b.columnwise_scale_inv)
        # the fake kernel's scale shapes are the C query's
        rr, rc = xte.ops.quantize.quantize_scale_shape(shape[0], shape[1], block, recipe, layout)
        assert tuple(a.scale_inv.shape) == (rr, rc)
        for cw in (False, True):
            same_bytes(xt.dequantize(a, cw), P_q.dequantize(b, cw))


@pytest.mark.parametrize("recipe,block,layout", [QCASES[0], QCASES[1], QCASES[5]])
def test_quantize_opcheck(recipe, block, layout):
    r = int(xte._qtensor.parse_recipe(recipe))
    m = int(xte._qtensor.parse_mode(block))
    lay = int(xte._qtensor.parse_layout(layout))
    x = torch.randn(130, 200)
    for rw, cw in ((True, False), (False, True), (True, True)):
        _opcheck(ops.quantize, (x, m, r, lay, int(xte.DType.E4M3), rw, cw, 0.0, -1, True, None))
    outs = ops.quantize(x, m, r, lay, int(xte.DType.E4M3), True, True, 0.0, -1, True, None)
    e4 = int(xte.DType.E4M3)
    _opcheck(ops.dequantize, (outs[0], outs[1], m, r, lay, e4, False, int(xte.DType.FP32)))
    _opcheck(ops.dequantize, (outs[2], outs[3], m, r, lay, e4, True, int(xte.DType.BF16)))


def test_quantize_delayed_scale_opcheck():
    x = torch.randn(5, 40)
    s = torch.tensor([3.0])
    _opcheck(ops.quantize, (x, 0, int(xte.Recipe.TE_DELAYED), 0, int(xte.DType.E5M2), True,
                            False, 0.0, -1, True, s))
    a = xt.quantize(x, "te_delayed", fmt="e5m2", scale=3.0)
    b = P_q.quantize(x, "te_delayed", fmt="e5m2", scale=3.0)
    same_bytes(a.data, b.data)
    same_bytes(a.scale_inv, b.scale_inv)


def test_quantize_errors_name_argument():
    with pytest.raises(xte.XteDTypeError, match="x"):
        xt.quantize(torch.zeros(4, 4, dtype=torch.int32))
    with pytest.raises(xte.XteLayoutError, match="x"):
        xt.quantize(torch.zeros(8, 8).t()[:, :3])


# --------------------------------------------------------------------------- GEMM


def _q(x, block, rowwise=True, columnwise=False, recipe="te_block"):
    return xt.quantize(x, recipe, block, "compact", rowwise=rowwise, columnwise=columnwise)


@pytest.mark.parametrize("M,N,K", [(3, 5, 200), (130, 129, 257)])
def test_gemm_bytes_equal_plain(M, N, K):
    g = torch.Generator().manual_seed(2)
    x = _special(torch.randn(M, K, generator=g))
    w = torch.randn(N, K, generator=g)
    bias = torch.randn(N, generator=g)
    xq = _q(x, "1x128", True, True)
    wq = _q(w, "128x128")
    for od in (torch.float32, torch.bfloat16):
        a = xt.gemm(xq, wq, bias=bias, out_dtype=od)
        b = P_gemm.gemm(xq, wq, bias=bias, out_dtype=str(od).split(".")[1])
        same_bytes(a, b)
    # dgrad (B transposed) and wgrad (both transposed, columnwise copies)
    dy = torch.randn(M, N, generator=g)
    dyq = _q(dy, "1x128", True, True)
    same_bytes(xt.gemm(dyq, wq, trans_b=False, out_dtype=torch.float32),
               P_gemm.gemm(dyq, wq, trans_b=False, out_dtype="float32"))
    same_bytes(xt.gemm(dyq, xq, trans_a=True, trans_b=False, out_dtype=torch.float32),
               P_gemm.gemm(dyq, xq, trans_a=True, trans_b=False, out_dtype="float32"))
    c = torch.randn(M, N, generator=g)
    same_bytes(xt.gemm(xq, wq, c=c, out_dtype=torch.float32),
               P_gemm.gemm(xq, wq, c=c, out_dtype="float32"))


def test_gemm_opcheck():
    x, w = torch.randn(130, 200), torch.randn(72, 200)
    xq, wq = _q(x, "1x128", True, True), _q(w, "128x128")
    args_a = xt._qargs(xq)
    args_b = xt._qargs(wq)
    bias = torch.randn(72)
    c = torch.randn(130, 72)
    _opcheck(ops.gemm, args_a + args_b + (None, bias, False, False, False, 0, int(xte.DType.BF16)))
    _opcheck(ops.gemm, args_a + args_b + (c, None, False, False, True, 1, int(xte.DType.FP32)))
    # wgrad: columnwise copies only
    dy = torch.randn(130, 72)
    dq = _q(dy, "1x128", False, True)
    _opcheck(ops.gemm, xt._qargs(dq) + (None, None, xq.columnwise_data.view(torch.uint8),
                                         xq.columnwise_scale_inv, xt.qmeta(xq), None, None,
                                         True, True, False, 0, int(xte.DType.FP32)))


def _grouped_setup(g):
    E, N, K = 3, 128, 200
    sizes = [128, 0, 70]
    R = sum(sizes)
    x = torch.randn(R, K, generator=g)
    w = torch.randn(E, N, K, generator=g)
    xq = _q(x, "1x128", True, True)
    wq = _q(w.reshape(E * N, K), "128x128")
    return E, N, K, sizes, R, x, w, xq, wq


def test_gemm_grouped_bytes_equal_plain_and_opcheck():
    g = torch.Generator().manual_seed(3)
    E, N, K, sizes, R, x, w, xq, wq = _grouped_setup(g)
    gs = torch.tensor(sizes, dtype=torch.int64)
    wq3 = xte.QuantizedTensor(wq.data.view(E, N, K), wq.scale_inv, scaling_mode="128x128",
                              recipe="te_block")
    a = xt.gemm_grouped(xq, wq, group_sizes=gs, out_dtype=torch.float32)
    b = P_gemm.gemm_grouped(xq, wq3, group_sizes=sizes, out_dtype="float32")
    same_bytes(a, b)
    # each group equals xte.gemm on its slices (the grouped contract), through the ops
    off = 0
    for e, m in enumerate(sizes):
        if m:
            xe = _q(x[off:off + m].contiguous(), "1x128")
            we = _q(w[e].contiguous(), "128x128")
            same_bytes(a[off:off + m], xt.gemm(xe, we, out_dtype=torch.float32))
        off += m
    # K-grouped (wgrad)
    dy = torch.randn(R, N, generator=g)
    dyq = _q(dy, "1x128", False, True)
    xcq = _q(x, "1x128", False, True)
    a = xt.gemm_grouped(dyq, xcq, group_sizes=gs, kind="k", trans_a=True, trans_b=False,
                        out_dtype=torch.float32)
    b = P_gemm.gemm_grouped(dyq, xcq, group_sizes=sizes, kind="k", trans_a=True, trans_b=False,
                            out_dtype="float32")
    same_bytes(a, b.view(a.shape))
    _opcheck(ops.gemm_grouped, xt._qargs(xq) + xt._qargs(wq) + (
        None, None, gs, None, E, 0, 0, False, False, False, 0, int(xte.DType.BF16)))
    _opcheck(ops.gemm_grouped, xt._qargs(dyq) + xt._qargs(xcq) + (
        None, None, gs, None, E, 2, 0, True, True, False, 0, int(xte.DType.FP32)))
    # masked
    xm = torch.randn(E, 64, K, generator=g)
    xmq = _q(xm.reshape(E * 64, K), "1x128")
    mm = torch.tensor([64, 0, 17], dtype=torch.int32)
    _opcheck(ops.gemm_grouped, xt._qargs(xmq) + xt._qargs(wq) + (
        None, None, None, mm, E, 1, 0, False, False, False, 0, int(xte.DType.FP32)))


# --------------------------------------------------------------------------- MoE ops


def _router_inputs(g, T=37, E=16):
    logits = torch.randn(T, E, generator=g)
    bias = torch.randn(E, generator=g) * 0.1
    return logits, bias


@pytest.mark.parametrize("score,pre,ng,gt", [("softmax", False, 0, 0), ("softmax", True, 0, 0),
                                             ("sigmoid", False, 4, 2),
                                             ("sqrtsoftplus", False, 0, 0)])
def test_router_bytes_equal_plain_opcheck_and_grad(score, pre, ng, gt):
    g = torch.Generator().manual_seed(4)
    logits, bias = _router_inputs(g)
    topk, scale = 4, 2.5
    sf = int(P_moe.parse_score(score))
    eb = bias if score != "softmax" else None
    w, idx, rmap, saved = ops.router(logits, eb, topk, sf, pre, ng, gt, scale)
    idx_p = torch.empty(idx.shape, dtype=torch.int64)
    probs, _, saved_p, w_p = P_moe.fused_topk_with_score_function(
        logits, topk, use_pre_softmax=pre, num_groups=ng, group_topk=gt, scaling_factor=scale,
        score_function=score, expert_bias=eb, topk_indices=idx_p, return_intermediate=True,
        return_topk_weights=True)
    same_bytes(w, w_p)
    same_bytes(idx, idx_p)
    same_bytes(saved, saved_p)
    _opcheck(ops.router, (logits, eb, topk, sf, pre, ng, gt, scale))
    gp = torch.randn(logits.shape, generator=g)
    _opcheck(ops.router_backward, (gp, rmap, saved, logits, topk, sf, pre, ng, gt, scale))
    # autograd: d/dlogits of sum(c * w) against an fp64 torch formula on the same selection
    lg = logits.clone().requires_grad_(True)
    c = torch.randn(w.shape, generator=g)
    wa, _ = xt.router(lg, topk, score, expert_bias=eb, use_pre_softmax=pre, num_groups=ng,
                      group_topk=gt, scaling_factor=scale)
    (wa * c).sum().backward()
    l64 = logits.double().requires_grad_(True)
    if score == "softmax":
        if pre:
            s = torch.softmax(l64, -1).gather(1, idx)
        else:
            s = torch.softmax(l64.gather(1, idx), -1)
    else:
        z = torch.sigmoid(l64) if score == "sigmoid" else torch.sqrt(
            torch.nn.functional.softplus(l64))
        s = z.gather(1, idx)
        s = s / s.sum(-1, keepdim=True)
    ((s * scale) * c.double()).sum().backward()
    torch.testing.assert_close(lg.grad.double(), l64.grad, rtol=1e-5, atol=1e-6)


def _routing(g, T=23, E=6, k=3):
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int64)
    idx[1, 2] = -1  # a slot without expert
    return idx


@pytest.mark.parametrize("cap,align", [(-1, 1), (-1, 8), (40, 1), (30, 4)])
def test_permute_unpermute_bytes_opcheck_grad(cap, align):
    g = torch.Generator().manual_seed(5)
    T, E, k, H = 23, 6, 3, 40
    idx = _routing(g, T, E, k)
    x = _special(torch.randn(T, H, generator=g))
    out, row_map, tpe, offs = xt.moe_permute(x, idx, E, cap, align)
    assert out.shape[0] == xt.permute_capacity(T, k, E, cap, align)
    po, rid, ex = P_moe.moe_permute(x, idx, num_out_tokens=cap, map_type="index", num_experts=E,
                                    align=align, return_extras=True)
    same_bytes(row_map, rid.row_map)
    same_bytes(out[:po.shape[0]], po)
    assert torch.equal(_bytes(out[po.shape[0]:]), torch.zeros_like(_bytes(out[po.shape[0]:])))
    same_bytes(offs, ex["expert_offsets"])
    same_bytes(tpe, ex["tokens_per_expert"].to(torch.int64))
    x2 = torch.randn(T, H, generator=g)  # opcheck compares outputs without equal_nan: finite
    full = (cap, align) in ((-1, 1), (30, 4))  # the full opcheck set on two cases (time)
    _opcheck(ops.moe_permute, (x2, idx, E, cap, align))
    if full:
        _opcheck(ops.moe_permute, (x2.clone().requires_grad_(True), idx, E, cap, align))
    go = torch.randn(out.shape, generator=g)
    if full:
        _opcheck(ops.moe_permute_backward, (go, idx, row_map, E))
    probs = torch.rand(T, k, generator=g)
    y = xt.moe_unpermute(go, idx, row_map, probs, E)
    same_bytes(y, P_moe.moe_unpermute(go, rid, probs))
    gy = torch.randn(T, H, generator=g)
    if full:
        _opcheck(ops.moe_unpermute, (go, idx, row_map, probs, E))
        _opcheck(ops.moe_unpermute, (go.clone().requires_grad_(True), idx, row_map,
                                     probs.clone().requires_grad_(True), E))
        _opcheck(ops.moe_unpermute, (go, idx, row_map, None, E))
        _opcheck(ops.moe_unpermute_backward, (gy, go, idx, row_map, probs, E))
    # autograd through permute -> unpermute against fp64 torch gathers
    xa = x2.detach().clone().requires_grad_(True)
    pa = probs.clone().requires_grad_(True)
    o, rm, _, _ = xt.moe_permute(xa, idx, E, cap, align)
    yy = xt.moe_unpermute(o * 1.0, idx, rm, pa, E)
    (yy * gy).sum().backward()
    x64 = x2.detach().double().requires_grad_(True)
    p64 = probs.double().requires_grad_(True)
    kept = (rm >= 0).double()
    y64 = (x64[:, None, :] * (p64 * kept)[:, :, None]).sum(1)
    (y64 * gy.double()).sum().backward()
    torch.testing.assert_close(xa.grad.double(), x64.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(pa.grad.double(), p64.grad, rtol=1e-5, atol=1e-5)


def test_swiglu_bytes_opcheck_grad():
    g = torch.Generator().manual_seed(6)
    x = _special(torch.randn(37, 2 * 72, generator=g))
    for dt in (torch.float32, torch.bfloat16):
        xx = x.to(dt)
        same_bytes(xt.swiglu(xx), P_moe.swiglu(xx))
        gy = torch.randn(37, 72, generator=g).to(dt)
        same_bytes(xt.dswiglu(gy, xx), P_moe.dswiglu(gy, xx))
        xf = torch.randn(37, 2 * 72, generator=g).to(dt)  # finite: opcheck has no equal_nan
        _opcheck(ops.swiglu, (xf,))
        _opcheck(ops.swiglu, (torch.randn(5, 8, generator=g).to(dt).requires_grad_(True),))
        _opcheck(ops.dswiglu, (gy, xf))
        for cw in (False, True):
            a = xt.swiglu_quantize(xx, act_dtype=dt, columnwise=cw)
            b = P_moe.swiglu_quantize(xx, columnwise=cw, act_dtype=str(dt).split(".")[1])
            same_bytes(a.data, b.data)
            same_bytes(a.scale_inv, b.scale_inv)
            _opcheck(ops.swiglu_quantize, (xf, int(xte.DType.BF16), 1, 2, 0, 3, True, cw, 0.0,
                                           -1, True))
    xr = torch.randn(9, 16, generator=g, dtype=torch.float64)
    xa = xr.float().requires_grad_(True)
    gy = torch.randn(9, 8, generator=g)
    (xt.swiglu(xa) * gy).sum().backward()
    x64 = xr.requires_grad_(True)
    (torch.nn.functional.silu(x64[:, :8]) * x64[:, 8:] * gy.double()).sum().backward()
    torch.testing.assert_close(xa.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- attention


@pytest.mark.parametrize("layout,mask", [("bshd", None), ("sbhd", "causal"),
                                         ("bshd", "causal_bottom_right")])
def test_attention_bytes_opcheck_grad(layout, mask):
    g = torch.Generator().manual_seed(7)
    b, sq, skv, hq, hkv, d = 2, 7, 9, 4, 2, 16
    if layout == "bshd":
        q, k, v = (torch.randn(b, sq, hq, d, generator=g), torch.randn(b, skv, hkv, d, generator=g),
                   torch.randn(b, skv, hkv, d, generator=g))
    else:
        q, k, v = (torch.randn(sq, b, hq, d, generator=g), torch.randn(skv, b, hkv, d, generator=g),
                   torch.randn(skv, b, hkv, d, generator=g))
    o, lse = xt.attention_fwd(q, k, v, layout=layout, mask=mask)
    po, plse = P_att.attention_fwd(q, k, v, layout=layout, mask=mask or "none")
    same_bytes(o, po)
    same_bytes(lse, plse)
    do = torch.randn(o.shape, generator=g)
    grads = xt.attention_bwd(q, k, v, o, do, lse, layout=layout, mask=mask)
    pg = P_att.attention_bwd(q, k, v, po, do, plse, layout=layout, mask=mask or "none")
    for a, bb in zip(grads, pg):
        same_bytes(a, bb)
    args = xt._attention.op_args(layout, mask, None, None, None, None, None, None, None, None)
    if layout == "sbhd":  # opcheck once (time); the fake shapes of BSHD / THD are checked below
        _opcheck(ops.attention_fwd, (q, k, v) + args)
        _opcheck(ops.attention_fwd, (q.clone().requires_grad_(True),
                                     k.clone().requires_grad_(True),
                                     v.clone().requires_grad_(True)) + args)
        _opcheck(ops.attention_bwd, (q, k, v, o, do, lse) + args)
    else:
        _check_fake(ops.attention_fwd, (q, k, v) + args)
    # autograd against fp64 torch attention
    qa, ka, va = (t.clone().requires_grad_(True) for t in (q, k, v))
    (xt.attention(qa, ka, va, layout=layout, mask=mask) * do).sum().backward()
    q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
    if layout == "bshd":
        def tr(t):
            return t.permute(0, 2, 1, 3)
    else:
        def tr(t):
            return t.permute(1, 2, 0, 3)
    rep = hq // hkv
    Q, K, V = tr(q64), tr(k64).repeat_interleave(rep, 1), tr(v64).repeat_interleave(rep, 1)
    s = Q @ K.transpose(-1, -2) / math.sqrt(d)
    i = torch.arange(sq)[:, None]
    j = torch.arange(skv)[None, :]
    if mask == "causal":
        s = s.masked_fill(j > i, -float("inf"))
    elif mask == "causal_bottom_right":
        s = s.masked_fill(j > i + (skv - sq), -float("inf"))
    O = torch.softmax(s, -1) @ V
    O = O.permute(0, 2, 1, 3) if layout == "bshd" else O.permute(2, 0, 1, 3)
    (O * do.double()).sum().backward()
    for a, r in ((qa, q64), (ka, k64), (va, v64)):
        torch.testing.assert_close(a.grad.double(), r.grad, rtol=1e-4, atol=1e-5)


def test_attention_thd_opcheck():
    g = torch.Generator().manual_seed(8)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k, v = (torch.randn(12, 2, 8, generator=g) for _ in range(3))
    args = xt._attention.op_args("thd", "causal", None, None, None, None, cu, cu, 7, 7)
    _opcheck(ops.attention_fwd, (q, k, v) + args)
    o, lse = ops.attention_fwd(q, k, v, *args)
    po, plse = P_att.attention_fwd(q, k, v, layout="thd", mask="causal", cu_seqlens_q=cu,
                                   cu_seqlens_kv=cu, max_seqlen_q=7, max_seqlen_kv=7)
    same_bytes(o, po)
    same_bytes(lse, plse)


# --------------------------------------------------------------------------- threads


def test_concurrent_calls_give_serial_bytes():
    g = torch.Generator().manual_seed(9)
    xs = [torch.randn(130, 384, generator=g) for _ in range(6)]
    w = torch.randn(256, 384, generator=g)
    wq = _q(w, "128x128")

    def work(x):
        q = _q(x, "1x128", True, True)
        y = xt.gemm(q, wq, out_dtype=torch.float32)
        s = xt.swiglu(y)
        return [q.data, q.scale_inv, q.columnwise_data, y, s]

    serial = [work(x) for x in xs]
    results = [None] * (len(xs) * 3)
    errors = []

    def run(i):
        try:
            for _ in range(3):
                results[i] = work(xs[i % len(xs)])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, r in enumerate(results):
        for a, b in zip(r, serial[i % len(xs)]):
            same_bytes(a, b)


# --------------------------------------------------------------------------- the other ops


def test_cast_bytes_and_opcheck():
    x = _special(torch.randn(7, 33) * 300)
    for od, name in ((xte.DType.E4M3, "e4m3"), (xte.DType.E5M2, "e5m2"), (xte.DType.E8M0, "e8m0"),
                     (xte.DType.BF16, "bfloat16")):
        for sat in (True, False):
            a = ops.cast(x, int(xte.DType.FP32), int(od), sat)
            b = P_q.cast(x, name, saturate=sat)
            same_bytes(a, b.view(torch.uint8) if a.dtype == torch.uint8 else b)
    y = torch.randn(7, 33)
    _opcheck(ops.cast, (y, int(xte.DType.FP32), int(xte.DType.E4M3), True))
    q = ops.cast(y, int(xte.DType.FP32), int(xte.DType.E4M3), True)
    _opcheck(ops.cast, (q, int(xte.DType.E4M3), int(xte.DType.FP32), True))
    same_bytes(ops.cast(q, int(xte.DType.E4M3), int(xte.DType.FP32), True),
               q.view(torch.float8_e4m3fn).float())


def test_dswiglu_quantize_bytes_and_opcheck():
    g = torch.Generator().manual_seed(20)
    x, dy = torch.randn(9, 256, generator=g), torch.randn(9, 128, generator=g)
    outs = ops.dswiglu_quantize(dy, x, int(xte.DType.FP32), 1, 2, 0, 3, True, True, 0.0, -1, True)
    b = P_moe.dswiglu_quantize(dy, x, rowwise=True, columnwise=True)
    same_bytes(outs[0], b.data.view(torch.uint8))
    same_bytes(outs[1], b.scale_inv)
    same_bytes(outs[2], b.columnwise_data.view(torch.uint8))
    _opcheck(ops.dswiglu_quantize, (dy, x, int(xte.DType.BF16), 1, 2, 0, 3, True, False, 0.0, -1,
                                    True))


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_aux_scores_and_aux_loss(score):
    g = torch.Generator().manual_seed(21)
    T, E, k = 19, 8, 2
    logits = torch.randn(T, E, generator=g)
    sf = int(P_moe.parse_score(score))
    sc, rm, sv = ops.router_aux_scores(logits, k, sf)
    prm, psc, psv = P_moe.fused_compute_score_for_moe_aux_loss(logits, k, score,
                                                               return_intermediate=True)
    same_bytes(sc, psc)
    same_bytes(sv, psv)
    assert torch.equal(rm.bool(), prm.bool())
    _opcheck(ops.router_aux_scores, (logits, k, sf))
    _opcheck(ops.router_aux_scores, (logits.clone().requires_grad_(True), k, sf))
    _opcheck(ops.router_aux_scores_backward, (torch.randn(T, E, generator=g), sv, logits, k, sf))
    tpe = rm.sum(0).to(torch.int64)
    loss = ops.moe_aux_loss(sc, tpe, T, k, 1e-2)
    same_bytes(loss.reshape(1), P_moe.fused_moe_aux_loss(sc, tpe, T, E, k, 1e-2).reshape(1))
    _opcheck(ops.moe_aux_loss, (sc, tpe, T, k, 1e-2))
    _opcheck(ops.moe_aux_loss, (sc.clone().requires_grad_(True), tpe, T, k, 1e-2))
    _opcheck(ops.moe_aux_loss_backward, (torch.ones(1), tpe, T, T, k, 1e-2))
    # autograd logits -> scores -> aux loss against fp64 torch
    la = logits.clone().requires_grad_(True)
    s2, _, _ = ops.router_aux_scores(la, k, sf)
    ops.moe_aux_loss(s2, tpe, T, k, 1e-2).backward()
    l64 = logits.double().requires_grad_(True)
    s64 = torch.softmax(l64, -1) if score == "softmax" else torch.sigmoid(l64)
    if score != "softmax":
        s64 = s64 / (s64.sum(-1, keepdim=True) + 1e-20)
    (E * 1e-2 / (k * T * T) * (s64.sum(0) * tpe.double()).sum()).backward()
    torch.testing.assert_close(la.grad.double(), l64.grad, rtol=1e-4, atol=1e-9)


def test_sort_chunks_and_dispatch_layout():
    g = torch.Generator().manual_seed(22)
    x = torch.randn(10, 6, generator=g)
    split = torch.tensor([3, 0, 4, 3], dtype=torch.int64)
    order = torch.tensor([2, 0, 3, 1], dtype=torch.int64)
    out, rm = ops.moe_sort_chunks_by_index(x, split, order)
    same_bytes(out, P_moe.moe_sort_chunks_by_index(x, split, order))
    same_bytes(out, torch.cat([x[3:7], x[0:3], x[7:10]]))
    _opcheck(ops.moe_sort_chunks_by_index, (x, split, order))
    _opcheck(ops.moe_sort_chunks_by_index, (x.clone().requires_grad_(True), split, order))
    _opcheck(ops.moe_sort_chunks_backward, (torch.randn(10, 6, generator=g), rm))
    xa = x.clone().requires_grad_(True)
    go = torch.randn(10, 6, generator=g)
    ops.moe_sort_chunks_by_index(xa, split, order)[0].backward(go)
    # chunk 0 (rows 0-2) went to output rows 4-6, chunk 2 (rows 3-6) to 0-3, chunk 3 stayed
    same_bytes(xa.grad, torch.cat([go[4:7], go[0:4], go[7:10]]))
    idx = _routing(g, 23, 8, 3)
    a, b, c = ops.moe_dispatch_layout(idx, 8, 4)
    pa, pb, pc = P_moe.dispatch_layout(idx, 8, 4)
    same_bytes(a, pa)
    same_bytes(b, pb)
    assert torch.equal(c.bool(), pc.bool())
    _opcheck(ops.moe_dispatch_layout, (idx, 8, 4))


def test_every_op_is_opchecked_here():
    """The list of registered ops is the one this file and test_torch_ops_deepgemm_te.py opcheck
    (a new op needs a test)."""
    import re
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    src = open(__file__).read() + open(os.path.join(here,
                                                    "test_torch_ops_deepgemm_te.py")).read()
    checked = set(re.findall(r"_opcheck\(ops\.(\w+)", src))
    assert set(xt.OPS) <= checked, set(xt.OPS) - checked


def test_wrappers_of_the_other_ops():
    x = torch.randn(5, 40) * 100
    same_bytes(xt.cast(x, "e4m3").view(torch.uint8), P_q.cast(x, "e4m3").view(torch.uint8))
    same_bytes(xt.cast(xt.cast(x, "e5m2"), "float32"), P_q.cast(P_q.cast(x, "e5m2"), "float32"))
    lg = torch.randn(6, 8)
    s = xt.router_aux_scores(lg, 2, "sigmoid")
    tpe = torch.tensor([1, 2, 3, 0, 1, 2, 1, 2])
    assert xt.moe_aux_loss(s, tpe, 6, 2, 0.1).shape == ()
    idx = torch.tensor([[0, 3], [1, -1]])
    a, b, c = xt.dispatch_layout(idx, 4, 2)
    assert a.tolist() == [2, 1] and b.tolist() == [1, 1, 0, 1] and c.dtype == torch.bool


def test_attention_mode_keyword():
    """mode="fast" through the torch ops: the plain function's bytes, in the forward, the
    backward and the autograd backward (mode kept by the op's saved arguments)."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 70, 2, 16, generator=g) for _ in range(3))
    o, lse = xt.attention_fwd(q, k, v, mask="causal", mode="fast")
    po, plse = P_att.attention_fwd(q, k, v, mask="causal", mode="fast")
    same_bytes(o, po)
    same_bytes(lse, plse)
    do = torch.randn(o.shape, generator=g)
    pg = P_att.attention_bwd(q, k, v, po, do, plse, mask="causal", mode="fast")
    for a, bb in zip(xt.attention_bwd(q, k, v, o, do, lse, mask="causal", mode="fast"), pg):
        same_bytes(a, bb)
    qa, ka, va = (t.clone().requires_grad_(True) for t in (q, k, v))
    (xt.attention(qa, ka, va, mask="causal", mode="fast") * do).sum().backward()
    for a, bb in zip((qa.grad, ka.grad, va.grad), pg):
        same_bytes(a, bb)
    pe = P_att.attention_bwd(q, k, v, po, do, plse, mask="causal")
    assert not torch.equal(pe[0], pg[0])  # the exact backward differs (it renormalises)
    _check_fake(ops.attention_fwd, (q, k, v) + _attention.op_args("bshd", "causal", None, None,
                                                                  None, None, None, None, None,
                                                                  None, "fast"))
