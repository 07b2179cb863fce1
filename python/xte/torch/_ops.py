"""torch.library custom ops over the xte C API (namespace "xte"), with fake kernels and autograd.

Every op is registered with torch.library.custom_op for the CPU and CUDA dispatch keys, a fake
kernel whose shapes come from xte's own shape queries (xte_quantize_scale_shape) or from the
static arguments (never by running the op), and, where the C API has a backward, an autograd
formula (swiglu, moe_permute, moe_unpermute, router, router_aux_scores, moe_aux_loss,
moe_sort_chunks_by_index, attention_fwd, moe_permute_mask, moe_unpermute_mask, router_probs,
te_router, te_router_qb, te_aux_scores, te_aux_loss, and TransformerEngine's permutation:
te_permute_mask, te_unpermute_mask, te_permute_index, te_unpermute_index, te_sort_chunks).
DeepGEMM's destination-passing GEMMs (fp8_gemm_*, *_grouped_*) are mutating ops on d.

Data-dependent sizes are static here: the permutes return permute_capacity(...) rows (the worst
case for the static shapes and the cap num_out_tokens; unused rows are zeros) unless given rows=
(a static int: eager callers pass permute_rows(...), the rows the routing uses), so fake
tensors have static shapes and torch.compile(fullgraph=True) never breaks the graph.

The op bodies only marshal arguments (zero-copy Views of the foundation) and call the C
functions; they add no arithmetic (the te_* ops also fill TE's row_id_map columns and move the
probs, [T, E] or [rows] values, with torch index operations).
"""

import ctypes
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import _lib
from .._lib import (DType, GemmGroups, MoeRouting, PermuteConfig, PermuteOutputs, QTensor,
                    Recipe, RouterOutputs, ScalingMode, Status, XteValueError, call, lib)
from .._tensor import empty, stream_of, torch_dtype, view, zeros
from .._qtensor import _scale_fields
from ..ops import attention as _A

_DEV = ("cpu", "cuda")
_FLOAT_IN = (DType.FP32, DType.BF16, DType.FP16)
_ACT = (DType.FP32, DType.BF16)
_I64P = ctypes.POINTER(ctypes.c_int64)
_F32P = ctypes.POINTER(ctypes.c_float)
_I32P = ctypes.POINTER(ctypes.c_int32)

# ----------------------------------------------------------------------------- shape helpers


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def scale_shape(M, K, mode, recipe, layout, columnwise):
    """(rows, cols) of a scale buffer, from the C query xte_quantize_scale_shape."""
    r, c = ctypes.c_int64(), ctypes.c_int64()
    _lib.check(lib.xte_quantize_scale_shape(int(M), int(K), int(mode), int(recipe), int(layout),
                                            int(bool(columnwise)), ctypes.byref(r),
                                            ctypes.byref(c)), "xte_quantize_scale_shape")
    return r.value, c.value


def _is_mx(recipe):
    return int(recipe) in (int(Recipe.MX_TE), int(Recipe.MX_OCP))


def _col_transposed(mode, recipe):
    """Whether the columnwise copy is the transpose [K, M] (per-tensor / 1x128 / 128x128 except
    MTFP8) or keeps [M, K] (MTFP8, MXFP8)."""
    return int(mode) != int(ScalingMode.MXFP8_1x32) and int(recipe) != int(Recipe.MTFP8)


def _quant_shapes(shape, mode, recipe, layout, rowwise, columnwise):
    """[(shape, xte dtype or None for the fp8 dtype)] of quantize's outputs, in order."""
    M, K = _prod(shape[:-1]), shape[-1]
    sdt = DType.E8M0 if _is_mx(recipe) else DType.FP32
    out = []
    if rowwise:
        out.append((tuple(shape), None))
        out.append((scale_shape(M, K, mode, recipe, layout, False), sdt))
    if columnwise:
        out.append(((K, M) if _col_transposed(mode, recipe) else (M, K), None))
        out.append((scale_shape(M, K, mode, recipe, layout, True), sdt))
    return out


def permute_capacity(num_tokens, topk, num_experts, num_out_tokens=-1, align=1):
    """The static row count of moe_permute's output: the worst case of xte_moe_permute_rows for
    these shapes (every slot routed; a cap num_out_tokens >= 0 keeps at most that many rows;
    align > 1 pads each non-empty expert to a multiple of align)."""
    base = num_tokens * topk
    if num_out_tokens is not None and num_out_tokens >= 0:
        base = min(base, num_out_tokens)
    if align > 1:
        base += min(num_experts, base) * (align - 1)
    return base


def _rows_or_capacity(rows, T, k, E, num_out_tokens, align):
    return int(rows) if rows >= 0 else permute_capacity(T, k, E, num_out_tokens, align)


def permute_rows(routing_map=None, topk_idx=None, num_experts=None, num_out_tokens=-1, align=1):
    """The rows a permute of this routing really uses (xte_moe_permute_rows: sum over experts of
    the kept rows rounded up to align), a host int. Reads the routing (a device sync for CUDA
    tensors): for eager callers that size the permuted buffer exactly (the moe_permute ops'
    rows=); under torch.compile use the static permute_capacity instead."""
    if (routing_map is None) == (topk_idx is None):
        raise XteValueError(Status.INVALID_ARGUMENT, "permute_rows: give routing_map or topk_idx")
    r = MoeRouting()
    if routing_map is not None:
        v = view(routing_map, "routing_map", (DType.UINT8,))
        r.routing_map = v.ptr
        r.num_experts = int(v.shape[-1])
    else:
        v = view(topk_idx, "topk_idx", (DType.INT32, DType.INT64))
        if num_experts is None:
            raise XteValueError(Status.INVALID_ARGUMENT, "num_experts: required with topk_idx")
        r.topk_idx = v.ptr
        r.num_experts = int(num_experts)
    cfg = PermuteConfig(num_out_tokens=-1 if num_out_tokens is None else int(num_out_tokens),
                        align=int(align))
    n = ctypes.c_int64(0)
    call("xte_moe_permute_rows", ctypes.byref(r), ctypes.byref(cfg), ctypes.byref(n),
         stream_of(v))
    return n.value


# ----------------------------------------------------------------------------- marshalling


def _as(t, d):
    """t (uint8 bytes at the op boundary) reinterpreted as xte dtype d (a zero-copy torch view)."""
    td = torch_dtype(d)
    return t if t.dtype == td else t.view(td)


def _qt(data, scale, cdata, cscale, meta, name):
    """An xte_qtensor over (data, scale_inv, columnwise data, columnwise scale_inv) and meta =
    [scaling_mode, recipe, layout, columnwise_layout, fmt]; fp8 data and E8M0 scales cross the op
    boundary as uint8 bytes (opcheck and autograd cannot compare float8 tensors) and are read as
    fmt / E8M0 here. Returns (struct, views to keep alive)."""
    q = QTensor()
    keep = []
    fmt = int(meta[4]) if len(meta) > 4 else int(DType.E4M3)
    sdt = DType.E8M0 if _is_mx(meta[1]) else DType.FP32
    for d, s, dst, sdst, lay, nm in ((data, scale, "rowwise", "rowwise_scale_inv", meta[2], ""),
                                      (cdata, cscale, "columnwise", "columnwise_scale_inv",
                                       meta[3], "columnwise_")):
        if d is None:
            continue
        vd = view(_as(d, fmt), f"{name}.{nm}data")
        setattr(q, dst, vd.t)
        keep.append(vd)
        if s is not None:
            vs, f = _scale_fields(_as(s, sdt) if s.dtype == torch.uint8 else s, lay,
                                  f"{name}.{nm}scale_inv", False)
            st = getattr(q, sdst)
            st.data, st.dtype, st.rows, st.cols, st.layout = f
            keep.append(vs)
    q.scaling_mode = int(meta[0])
    q.recipe = int(meta[1])
    return q, keep


def _logical(data, cdata, meta):
    """The [rows, cols] of the tensor a qtensor quantized (rank > 2: leading dims collapsed)."""
    if data is not None:
        return _prod(data.shape[:-1]), data.shape[-1]
    r, c = _prod(cdata.shape[:-1]), cdata.shape[-1]
    return (c, r) if _col_transposed(meta[0], meta[1]) else (r, c)


def _fptr(t, name, dtype=DType.FP32):
    if t is None:
        return None, None
    v = view(t, name, (dtype,))
    return ctypes.cast(v.t.data, _F32P if dtype == DType.FP32 else _I32P), v


# ============================================================================= quantize


def split_copies(outs, rowwise, columnwise):
    """(data, scale_inv, columnwise_data, columnwise_scale_inv) from xte::quantize's list."""
    d = sc = cd = cs = None
    i = 0
    if rowwise:
        d, sc = outs[0], outs[1]
        i = 2
    if columnwise:
        cd, cs = outs[i], outs[i + 1]
    return d, sc, cd, cs


@torch.library.custom_op("xte::quantize", mutates_args=(), device_types=_DEV)
def quantize(x: Tensor, mode: int, recipe: int, layout: int, fmt: int, rowwise: bool,
             columnwise: bool, amax_epsilon: float, force_pow_2: int, saturate: bool,
             scale: Optional[Tensor]) -> List[Tensor]:
    """[data, scale_inv] (rowwise) then [columnwise_data, columnwise_scale_inv] as asked; fp8
    data (and E8M0 scales) as uint8 bytes."""
    vx = view(x, "x", _FLOAT_IN)
    outs = [empty(vx, s, DType.UINT8 if d in (None, DType.E8M0) else d)
            for s, d in _quant_shapes(vx.shape, mode, recipe, layout, rowwise, columnwise)]
    d, s, cd, cs = split_copies(outs, rowwise, columnwise)
    meta = (mode, recipe, layout, layout, fmt)
    q, keep = _qt(d, s, cd, cs, meta, "out")
    if scale is not None:
        # the op is functional: the scale is TE_DELAYED's input only (one fp32 on the host,
        # read by the C library before the launch), never TE_CURRENT's written-back scale
        if recipe != Recipe.TE_DELAYED:
            raise XteValueError(Status.INVALID_ARGUMENT, "scale: only TE_DELAYED takes a scale "
                                "here (TE_CURRENT's scale is an output: use xte.quantize)")
        if scale.device.type != "cpu" or scale.numel() != 1:
            raise XteValueError(Status.INVALID_ARGUMENT, f"scale: a 1-element fp32 CPU tensor "
                                f"(got {tuple(scale.shape)} on {scale.device})")
    fs, vs = _fptr(scale, "scale")
    q.scale = fs
    cfg = lib.xte_quant_config_default()
    cfg.amax_epsilon = amax_epsilon
    cfg.force_pow_2 = force_pow_2
    cfg.saturate = int(saturate)
    call("xte_quantize", vx.ptr, ctypes.byref(q), ctypes.byref(cfg), stream_of(vx, *keep))
    return outs


@quantize.register_fake
def _(x, mode, recipe, layout, fmt, rowwise, columnwise, amax_epsilon, force_pow_2, saturate,
      scale):
    shapes = _quant_shapes(tuple(int(s) for s in x.shape), mode, recipe, layout, rowwise,
                           columnwise)
    return [x.new_empty(s, dtype=torch.uint8 if d in (None, DType.E8M0) else torch_dtype(d))
            for s, d in shapes]


@torch.library.custom_op("xte::dequantize", mutates_args=(), device_types=_DEV)
def dequantize(data: Tensor, scale_inv: Tensor, mode: int, recipe: int, layout: int, fmt: int,
               columnwise: bool, out_dtype: int) -> Tensor:
    """Dequantizes one copy (given as data + scale_inv; columnwise says which copy it is)."""
    meta = (mode, recipe, layout, layout, fmt)
    if columnwise:
        q, keep = _qt(None, None, data, scale_inv, meta, "q")
    else:
        q, keep = _qt(data, scale_inv, None, None, meta, "q")
    out = empty(keep[0], keep[0].shape, out_dtype)
    vo = view(out, "out", writable=True)
    call("xte_dequantize", ctypes.byref(q), int(columnwise), vo.ptr, stream_of(vo, *keep))
    return out


@dequantize.register_fake
def _(data, scale_inv, mode, recipe, layout, fmt, columnwise, out_dtype):
    return data.new_empty(data.shape, dtype=torch_dtype(out_dtype))


# ============================================================================= GEMM


def _gemm_cfg(trans_a, trans_b, accumulate, mode, vbias):
    cfg = lib.xte_gemm_config_default()
    cfg.trans_a = int(trans_a)
    cfg.trans_b = int(trans_b)
    cfg.accumulate = int(accumulate)
    cfg.mode = int(mode)
    if vbias is not None:
        cfg.bias = ctypes.pointer(vbias.t)
    return cfg


@torch.library.custom_op("xte::gemm", mutates_args=(), device_types=_DEV)
def gemm(a_data: Optional[Tensor], a_scale: Optional[Tensor], a_cdata: Optional[Tensor],
         a_cscale: Optional[Tensor], a_meta: List[int], b_data: Optional[Tensor],
         b_scale: Optional[Tensor], b_cdata: Optional[Tensor], b_cscale: Optional[Tensor],
         b_meta: List[int], c: Optional[Tensor], bias: Optional[Tensor], trans_a: bool,
         trans_b: bool, accumulate: bool, mode: int, out_dtype: int) -> Tensor:
    """D = op(A) op(B)^T (+ C) (+ bias) (xte_gemm); A / B as (data, scale_inv, columnwise data,
    columnwise scale_inv) with meta [scaling_mode, recipe, layout, columnwise_layout, fmt]; the C
    flags (trans_b False: B is [N, K])."""
    qa, ka = _qt(a_data, a_scale, a_cdata, a_cscale, a_meta, "a")
    qb, kb = _qt(b_data, b_scale, b_cdata, b_cscale, b_meta, "b")
    M = _gemm_out_dim(a_data, a_cdata, a_meta, trans_a)
    N = _gemm_out_dim(b_data, b_cdata, b_meta, trans_b)
    vc = view(c, "c", _ACT) if c is not None else None
    vbias = view(bias, "bias", (DType.FP32,)) if bias is not None else None
    d = empty(ka[0], (M, N), out_dtype)
    vd = view(d, "out", writable=True)
    cfg = _gemm_cfg(trans_a, trans_b, accumulate, mode, vbias)
    call("xte_gemm", ctypes.byref(qa), ctypes.byref(qb), vc.ptr if vc is not None else None,
         vd.ptr, ctypes.byref(cfg), stream_of(vd, vc, vbias, *ka, *kb))
    return d


def _gemm_out_dim(data, cdata, meta, trans):
    r, c = _logical(data, cdata, meta)
    return c if trans else r


@gemm.register_fake
def _(a_data, a_scale, a_cdata, a_cscale, a_meta, b_data, b_scale, b_cdata, b_cscale, b_meta, c,
      bias, trans_a, trans_b, accumulate, mode, out_dtype):
    M = _gemm_out_dim(a_data, a_cdata, a_meta, trans_a)
    N = _gemm_out_dim(b_data, b_cdata, b_meta, trans_b)
    ref = a_data if a_data is not None else a_cdata
    return ref.new_empty((M, N), dtype=torch_dtype(out_dtype))


def _grouped_out_shape(a_data, a_cdata, a_meta, b_data, b_cdata, b_meta, trans_a, trans_b, kind,
                       G):
    ar, ac = _logical(a_data, a_cdata, a_meta)
    br, bc = _logical(b_data, b_cdata, b_meta)
    if kind == 2:  # K-grouped: D [G, M, N]
        return (G, ac if trans_a else ar, bc if trans_b else br)
    N = bc if trans_b else br // G
    if kind == 1:  # masked: A [G, m_max, K] -> D [G, m_max, N]
        return (G, ar // G, N)
    return (ar, N)


@torch.library.custom_op("xte::gemm_grouped", mutates_args=(), device_types=_DEV)
def gemm_grouped(a_data: Optional[Tensor], a_scale: Optional[Tensor], a_cdata: Optional[Tensor],
                 a_cscale: Optional[Tensor], a_meta: List[int], b_data: Optional[Tensor],
                 b_scale: Optional[Tensor], b_cdata: Optional[Tensor],
                 b_cscale: Optional[Tensor], b_meta: List[int], c: Optional[Tensor],
                 bias: Optional[Tensor], group_sizes: Optional[Tensor],
                 masked_m: Optional[Tensor], num_groups: int, kind: int, alignment: int,
                 trans_a: bool, trans_b: bool, accumulate: bool, mode: int,
                 out_dtype: int) -> Tensor:
    """xte_gemm_grouped: kind 0 contiguous (D [rows of A, N]), 1 masked (D [G, m_max, N]),
    2 K-grouped (D [G, M, N]). group_sizes: int64 [G] (read on the host); masked_m int32 [G]."""
    qa, ka = _qt(a_data, a_scale, a_cdata, a_cscale, a_meta, "a")
    qb, kb = _qt(b_data, b_scale, b_cdata, b_cscale, b_meta, "b")
    shape = _grouped_out_shape(a_data, a_cdata, a_meta, b_data, b_cdata, b_meta, trans_a,
                               trans_b, kind, num_groups)
    vc = view(c, "c", _ACT) if c is not None else None
    vbias = view(bias, "bias", (DType.FP32,)) if bias is not None else None
    # rows the C call never writes (masked rows past masked_m, padding rows) read as zeros: a
    # functional op must not return uninitialised memory
    d = (zeros if kind == 1 or alignment > 1 else empty)(ka[0], shape, out_dtype)
    vd = view(d, "out", writable=True)
    g = GemmGroups()
    g.kind = int(kind)
    g.num_groups = int(num_groups)
    g.alignment = int(alignment)
    gs = None
    if group_sizes is not None:
        gs = group_sizes if group_sizes.device.type == "cpu" else group_sizes.cpu()
        vgs = view(gs, "group_sizes", (DType.INT64,))
        if _prod(vgs.shape) != num_groups:
            raise XteValueError(Status.SHAPE, f"group_sizes: {_prod(vgs.shape)} values for "
                                f"{num_groups} groups")
        g.group_sizes = ctypes.cast(vgs.t.data, _I64P)
    vm = None
    if masked_m is not None:
        vm = view(masked_m, "masked_m", (DType.INT32,))
        g.masked_m = ctypes.pointer(vm.t)
    cfg = _gemm_cfg(trans_a, trans_b, accumulate, mode, vbias)
    call("xte_gemm_grouped", ctypes.byref(qa), ctypes.byref(qb),
         vc.ptr if vc is not None else None, vd.ptr, ctypes.byref(g), ctypes.byref(cfg),
         stream_of(vd, vc, vbias, vm, *ka, *kb))
    return d


@gemm_grouped.register_fake
def _(a_data, a_scale, a_cdata, a_cscale, a_meta, b_data, b_scale, b_cdata, b_cscale, b_meta, c,
      bias, group_sizes, masked_m, num_groups, kind, alignment, trans_a, trans_b, accumulate,
      mode, out_dtype):
    shape = _grouped_out_shape(a_data, a_cdata, a_meta, b_data, b_cdata, b_meta, trans_a,
                               trans_b, kind, num_groups)
    ref = a_data if a_data is not None else a_cdata
    return ref.new_empty(shape, dtype=torch_dtype(out_dtype))


# ============================================================================= router


def _router_cfg(topk, score_function, use_pre_softmax, num_groups, group_topk, scaling_factor):
    cfg = lib.xte_router_config_default()
    cfg.topk = topk
    cfg.score_function = score_function
    cfg.use_pre_softmax = int(use_pre_softmax)
    cfg.num_groups = num_groups
    cfg.group_topk = group_topk
    cfg.scaling_factor = scaling_factor
    return cfg


@torch.library.custom_op("xte::router", mutates_args=(), device_types=_DEV)
def router(logits: Tensor, expert_bias: Optional[Tensor], topk: int, score_function: int,
           use_pre_softmax: bool, num_groups: int, group_topk: int,
           scaling_factor: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """xte_router_forward (TE's fused_topk_with_score_function): returns topk_weights fp32
    [T, k], topk_idx int64 [T, k], routing_map uint8 [T, E] and saved fp32 [T, E]."""
    vl = view(logits, "logits", _ACT)
    vb = view(expert_bias, "expert_bias", (DType.FP32,)) if expert_bias is not None else None
    T, E = _prod(vl.shape[:-1]), vl.shape[-1]
    w = empty(vl, (T, topk), DType.FP32)
    idx = empty(vl, (T, topk), DType.INT64)
    rmap = empty(vl, (T, E), DType.UINT8)
    saved = empty(vl, (T, E), DType.FP32)
    vw, vi, vr, vs = (view(w, "topk_weights", writable=True), view(idx, "topk_idx", writable=True),
                      view(rmap, "routing_map", writable=True), view(saved, "saved", writable=True))
    out = RouterOutputs()
    out.topk_weights = vw.t
    out.topk_idx = vi.t
    out.routing_map = vr.t
    out.saved = vs.t
    cfg = _router_cfg(topk, score_function, use_pre_softmax, num_groups, group_topk,
                      scaling_factor)
    call("xte_router_forward", vl.ptr, vb.ptr if vb is not None else None, ctypes.byref(cfg),
         ctypes.byref(out), stream_of(vl, vb, vw))
    return w, idx, rmap, saved


@router.register_fake
def _(logits, expert_bias, topk, score_function, use_pre_softmax, num_groups, group_topk,
      scaling_factor):
    T, E = _prod(logits.shape[:-1]), logits.shape[-1]
    return (logits.new_empty((T, topk), dtype=torch.float32),
            logits.new_empty((T, topk), dtype=torch.int64),
            logits.new_empty((T, E), dtype=torch.uint8),
            logits.new_empty((T, E), dtype=torch.float32))


@torch.library.custom_op("xte::router_backward", mutates_args=(), device_types=_DEV)
def router_backward(grad_probs: Tensor, routing_map: Tensor, saved: Tensor, logits: Tensor,
                    topk: int, score_function: int, use_pre_softmax: bool, num_groups: int,
                    group_topk: int, scaling_factor: float) -> Tensor:
    """xte_router_backward: grad_logits [T, E] in the logits' dtype from grad_probs fp32 [T, E]."""
    vg = view(grad_probs, "grad_probs", (DType.FP32,))
    vr = view(routing_map, "routing_map", (DType.UINT8,))
    vs = view(saved, "saved", (DType.FP32,))
    vl = view(logits, "logits", _ACT)
    gl = empty(vl, vl.shape, vl.dtype)
    vo = view(gl, "grad_logits", writable=True)
    cfg = _router_cfg(topk, score_function, use_pre_softmax, num_groups, group_topk,
                      scaling_factor)
    call("xte_router_backward", vg.ptr, vr.ptr, vs.ptr, vl.ptr, ctypes.byref(cfg), vo.ptr,
         stream_of(vg, vr, vs, vl, vo))
    return gl


@router_backward.register_fake
def _(grad_probs, routing_map, saved, logits, topk, score_function, use_pre_softmax, num_groups,
      group_topk, scaling_factor):
    return torch.empty_like(logits)


def _router_setup(ctx, inputs, output):
    logits, _, topk, sf, pre, ng, gt, scale = inputs
    w, idx, rmap, saved = output
    ctx.save_for_backward(idx, rmap, saved, logits)
    ctx.cfg = (topk, sf, pre, ng, gt, scale)
    ctx.set_materialize_grads(True)


def _router_bwd(ctx, gw, gidx, grmap, gsaved):
    idx, rmap, saved, logits = ctx.saved_tensors
    # topk_weights are the probs at topk_idx: their gradient scatters back to [T, E]
    gp = torch.zeros(saved.shape, dtype=torch.float32, device=saved.device)
    gp = gp.scatter(1, idx, gw.to(torch.float32))
    gl = torch.ops.xte.router_backward(gp, rmap, saved, logits, *ctx.cfg)
    return gl, None, None, None, None, None, None, None


router.register_autograd(_router_bwd, setup_context=_router_setup)


# ============================================================================= permute


def _routing(vidx, E):
    r = MoeRouting()
    r.topk_idx = ctypes.pointer(vidx.t)
    r.num_experts = int(E)
    return r


@torch.library.custom_op("xte::moe_permute", mutates_args=(), device_types=_DEV)
def moe_permute(x: Tensor, topk_idx: Tensor, num_experts: int, num_out_tokens: int,
                align: int, rows: int = -1) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """xte_moe_permute (TE moe_permute with topk_idx): returns output [C, H] with C =
    permute_capacity(T, k, E, num_out_tokens, align) rows (unused rows zero), or C = rows when
    rows >= 0 (eager callers pass permute_rows(...), the rows the routing really uses; fewer
    than that is the C library's error), row_map int32 [T, k], tokens_per_expert int64 [E]
    (kept rows) and expert_offsets int64 [E + 1] (padded)."""
    vx = view(x, "x", (DType.FP32, DType.BF16, DType.FP16))
    vi = view(topk_idx, "topk_idx", (DType.INT32, DType.INT64))
    T, H = vx.shape
    k = vi.shape[-1]
    rows = _rows_or_capacity(rows, T, k, num_experts, num_out_tokens, align)
    out = empty(vx, (rows, H), vx.dtype)
    row_map = empty(vx, (T, k), DType.INT32)
    tpe = empty(vx, (num_experts,), DType.INT64)
    offs = empty(vx, (num_experts + 1,), DType.INT64)
    vo, vr = view(out, "output", writable=True), view(row_map, "row_map", writable=True)
    vt, vf = view(tpe, "tokens_per_expert", writable=True), view(offs, "expert_offsets",
                                                                 writable=True)
    extra = PermuteOutputs()
    extra.tokens_per_expert = vt.t
    extra.expert_offsets = vf.t
    r = _routing(vi, num_experts)
    cfg = PermuteConfig(num_out_tokens=num_out_tokens, align=align)
    call("xte_moe_permute", vx.ptr, None, ctypes.byref(r), ctypes.byref(cfg), vo.ptr, None,
         vr.ptr, ctypes.byref(extra), stream_of(vx, vi, vo))
    return out, row_map, tpe, offs


@moe_permute.register_fake
def _(x, topk_idx, num_experts, num_out_tokens, align, rows=-1):
    T, H = x.shape
    k = topk_idx.shape[-1]
    rows = _rows_or_capacity(rows, T, k, num_experts, num_out_tokens, align)
    return (x.new_empty((rows, H)), x.new_empty((T, k), dtype=torch.int32),
            x.new_empty((num_experts,), dtype=torch.int64),
            x.new_empty((num_experts + 1,), dtype=torch.int64))


@torch.library.custom_op("xte::moe_permute_backward", mutates_args=(), device_types=_DEV)
def moe_permute_backward(grad_output: Tensor, topk_idx: Tensor, row_map: Tensor,
                         num_experts: int) -> Tensor:
    """grad_input [T, H] = the sum over each token's slots of grad_output[row] (ascending)."""
    vg = view(grad_output, "grad_output", _FLOAT_IN)
    vi = view(topk_idx, "topk_idx", (DType.INT32, DType.INT64))
    vr = view(row_map, "row_map", (DType.INT32,))
    gi = empty(vg, (vi.shape[0], vg.shape[-1]), vg.dtype)
    vo = view(gi, "grad_input", writable=True)
    r = _routing(vi, num_experts)
    call("xte_moe_permute_backward", vg.ptr, ctypes.byref(r), vr.ptr, vo.ptr,
         stream_of(vg, vi, vr, vo))
    return gi


@moe_permute_backward.register_fake
def _(grad_output, topk_idx, row_map, num_experts):
    return grad_output.new_empty((topk_idx.shape[0], grad_output.shape[-1]))


def _permute_setup(ctx, inputs, output):
    topk_idx, E = inputs[1], inputs[2]
    ctx.save_for_backward(topk_idx, output[1])
    ctx.E = E
    ctx.set_materialize_grads(True)


def _permute_bwd(ctx, gout, grow, gtpe, goffs):
    topk_idx, row_map = ctx.saved_tensors
    return (torch.ops.xte.moe_permute_backward(gout.contiguous(), topk_idx, row_map, ctx.E),
            None, None, None, None, None)


moe_permute.register_autograd(_permute_bwd, setup_context=_permute_setup)


@torch.library.custom_op("xte::moe_unpermute", mutates_args=(), device_types=_DEV)
def moe_unpermute(x: Tensor, topk_idx: Tensor, row_map: Tensor, probs: Optional[Tensor],
                  num_experts: int) -> Tensor:
    """out [T, H] = sum over the slots of probs[t, j] * x[row_map[t, j]] (fp32 fmaf, ascending j;
    probs None: weight 1), in x's dtype."""
    vx = view(x, "x", _FLOAT_IN)
    vi = view(topk_idx, "topk_idx", (DType.INT32, DType.INT64))
    vr = view(row_map, "row_map", (DType.INT32,))
    vp = view(probs, "probs", (DType.FP32,)) if probs is not None else None
    out = empty(vx, (vi.shape[0], vx.shape[-1]), vx.dtype)
    vo = view(out, "out", writable=True)
    r = _routing(vi, num_experts)
    call("xte_moe_unpermute", vx.ptr, ctypes.byref(r), vr.ptr,
         vp.ptr if vp is not None else None, vo.ptr, stream_of(vx, vi, vr, vp, vo))
    return out


@moe_unpermute.register_fake
def _(x, topk_idx, row_map, probs, num_experts):
    return x.new_empty((topk_idx.shape[0], x.shape[-1]))


@torch.library.custom_op("xte::moe_unpermute_backward", mutates_args=(), device_types=_DEV)
def moe_unpermute_backward(grad_out: Tensor, x: Tensor, topk_idx: Tensor, row_map: Tensor,
                           probs: Optional[Tensor], num_experts: int) -> Tuple[Tensor, Tensor]:
    """(grad_x [rows, H] in grad_out's dtype, grad_probs fp32 [T, k]; zeros when probs is None)."""
    vg = view(grad_out, "grad_out", _FLOAT_IN)
    vx = view(x, "x", _FLOAT_IN)
    vi = view(topk_idx, "topk_idx", (DType.INT32, DType.INT64))
    vr = view(row_map, "row_map", (DType.INT32,))
    vp = view(probs, "probs", (DType.FP32,)) if probs is not None else None
    gx = empty(vg, (vx.shape[0], vg.shape[-1]), vg.dtype)
    gp = zeros(vg, vi.shape, DType.FP32)
    vgx = view(gx, "grad_input", writable=True)
    vgp = view(gp, "grad_probs", writable=True) if probs is not None else None
    r = _routing(vi, num_experts)
    call("xte_moe_unpermute_backward", vg.ptr, vx.ptr, ctypes.byref(r), vr.ptr,
         vp.ptr if vp is not None else None, vgx.ptr, vgp.ptr if vgp is not None else None,
         stream_of(vg, vx, vi, vr, vp, vgx))
    return gx, gp


@moe_unpermute_backward.register_fake
def _(grad_out, x, topk_idx, row_map, probs, num_experts):
    return (grad_out.new_empty((x.shape[0], grad_out.shape[-1])),
            grad_out.new_empty(tuple(topk_idx.shape), dtype=torch.float32))


def _unpermute_setup(ctx, inputs, output):
    x, topk_idx, row_map, probs, E = inputs
    ctx.has_probs = probs is not None
    ctx.save_for_backward(x, topk_idx, row_map, probs if probs is not None else x)
    ctx.E = E


def _unpermute_bwd(ctx, gout):
    x, topk_idx, row_map, probs = ctx.saved_tensors
    gx, gp = torch.ops.xte.moe_unpermute_backward(
        gout.contiguous(), x, topk_idx, row_map, probs if ctx.has_probs else None, ctx.E)
    return gx, None, None, (gp if ctx.has_probs else None), None


moe_unpermute.register_autograd(_unpermute_bwd, setup_context=_unpermute_setup)


# ============================================================================= SwiGLU


@torch.library.custom_op("xte::swiglu", mutates_args=(), device_types=_DEV)
def swiglu(x: Tensor) -> Tensor:
    """y [.., F] = silu(x[.., :F]) * x[.., F:] (xte_swiglu), in x's dtype."""
    vx = view(x, "x", _ACT)
    out = empty(vx, vx.shape[:-1] + (vx.shape[-1] // 2,), vx.dtype)
    vo = view(out, "out", writable=True)
    call("xte_swiglu", vx.ptr, vo.ptr, stream_of(vx, vo))
    return out


@swiglu.register_fake
def _(x):
    return x.new_empty(tuple(x.shape[:-1]) + (x.shape[-1] // 2,))


@torch.library.custom_op("xte::dswiglu", mutates_args=(), device_types=_DEV)
def dswiglu(grad_out: Tensor, x: Tensor) -> Tensor:
    """grad_input [.., 2F] of swiglu (xte_dswiglu), in x's dtype."""
    vg = view(grad_out, "grad_out", _ACT)
    vx = view(x, "x", _ACT)
    gi = empty(vx, vx.shape, vx.dtype)
    vo = view(gi, "grad_input", writable=True)
    call("xte_dswiglu", vg.ptr, vx.ptr, vo.ptr, stream_of(vg, vx, vo))
    return gi


@dswiglu.register_fake
def _(grad_out, x):
    return torch.empty_like(x)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _swiglu_bwd(ctx, g):
    (x,) = ctx.saved_tensors
    return torch.ops.xte.dswiglu(g.to(x.dtype).contiguous(), x)


swiglu.register_autograd(_swiglu_bwd, setup_context=_swiglu_setup)


@torch.library.custom_op("xte::swiglu_quantize", mutates_args=(), device_types=_DEV)
def swiglu_quantize(x: Tensor, act_dtype: int, mode: int, recipe: int, layout: int, fmt: int,
                    rowwise: bool, columnwise: bool, amax_epsilon: float, force_pow_2: int,
                    saturate: bool) -> List[Tensor]:
    """xte_swiglu_quantize: quantize(swiglu(x) rounded to act_dtype) in one pass; outputs as
    xte::quantize's for an input of swiglu's output shape."""
    vx = view(x, "x", _ACT)
    yshape = vx.shape[:-1] + (vx.shape[-1] // 2,)
    outs = [empty(vx, s, DType.UINT8 if d in (None, DType.E8M0) else d)
            for s, d in _quant_shapes(yshape, mode, recipe, layout, rowwise, columnwise)]
    i = 0
    d = s = cd = cs = None
    if rowwise:
        d, s = outs[0], outs[1]
        i = 2
    if columnwise:
        cd, cs = outs[i], outs[i + 1]
    q, keep = _qt(d, s, cd, cs, (mode, recipe, layout, layout, fmt), "out")
    cfg = lib.xte_quant_config_default()
    cfg.amax_epsilon = amax_epsilon
    cfg.force_pow_2 = force_pow_2
    cfg.saturate = int(saturate)
    call("xte_swiglu_quantize", vx.ptr, int(act_dtype), ctypes.byref(q), ctypes.byref(cfg),
         stream_of(vx, *keep))
    return outs


@swiglu_quantize.register_fake
def _(x, act_dtype, mode, recipe, layout, fmt, rowwise, columnwise, amax_epsilon, force_pow_2,
      saturate):
    yshape = tuple(int(s) for s in x.shape[:-1]) + (int(x.shape[-1]) // 2,)
    return [x.new_empty(s, dtype=torch.uint8 if d in (None, DType.E8M0) else torch_dtype(d))
            for s, d in _quant_shapes(yshape, mode, recipe, layout, rowwise, columnwise)]


# ============================================================================= attention


def _attn_kw(layout, mask, window_left, window_right, softmax_scale, softcap, alibi, cuq, cukv,
             max_q, max_kv, mode=0):
    """The plain attention functions' keywords from the op's flat arguments (mode: 0 exact,
    1 fast)."""
    return dict(layout=int(layout), mask=int(mask), window=(window_left, window_right),
                softmax_scale=softmax_scale if softmax_scale else None, softcap=softcap,
                alibi_slopes=alibi, cu_seqlens_q=cuq, cu_seqlens_kv=cukv,
                max_seqlen_q=max_q or None, max_seqlen_kv=max_kv or None,
                mode="fast" if mode else "exact")


def _attn_shapes(q, v, layout):
    o = tuple(q.shape[:-1]) + (v.shape[-1],)
    if layout == 2:  # THD
        lse = (q.shape[0], q.shape[1])
    elif layout == 1:  # SBHD
        lse = (q.shape[1], q.shape[2], q.shape[0])
    else:
        lse = (q.shape[0], q.shape[2], q.shape[1])
    return o, lse


@torch.library.custom_op("xte::attention_fwd", mutates_args=(), device_types=_DEV)
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, layout: int, mask: int, window_left: int,
                  window_right: int, softmax_scale: float, softcap: float,
                  alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
                  cu_seqlens_kv: Optional[Tensor], max_seqlen_q: int,
                  max_seqlen_kv: int, mode: int = 0) -> Tuple[Tensor, Tensor]:
    """xte_attention_fwd: (O in q's dtype, LSE fp32: BSHD / SBHD [b, h, s_q], THD [t, h]).
    The plain xte.attention_fwd runs it: every config array is checked there (dtype, element
    count, device) before C reads it; max_seqlen 0 means "the tokens of the tensor" (THD)."""
    return _A.attention_fwd(q, k, v, **_attn_kw(layout, mask, window_left, window_right,
                                                  softmax_scale, softcap, alibi_slopes,
                                                  cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                                  max_seqlen_kv, mode))


@attention_fwd.register_fake
def _(q, k, v, layout, mask, window_left, window_right, softmax_scale, softcap, alibi_slopes,
      cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, mode=0):
    oshape, lshape = _attn_shapes(q, v, layout)
    return q.new_empty(oshape), q.new_empty(lshape, dtype=torch.float32)


@torch.library.custom_op("xte::attention_bwd", mutates_args=(), device_types=_DEV)
def attention_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor,
                  layout: int, mask: int, window_left: int, window_right: int,
                  softmax_scale: float, softcap: float, alibi_slopes: Optional[Tensor],
                  cu_seqlens_q: Optional[Tensor], cu_seqlens_kv: Optional[Tensor],
                  max_seqlen_q: int, max_seqlen_kv: int,
                  mode: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """xte_attention_bwd: (dQ, dK, dV) in the inputs' dtype (through xte.attention_bwd)."""
    return _A.attention_bwd(q, k, v, o, do, lse, **_attn_kw(layout, mask, window_left,
                                                              window_right, softmax_scale,
                                                              softcap, alibi_slopes, cu_seqlens_q,
                                                              cu_seqlens_kv, max_seqlen_q,
                                                              max_seqlen_kv, mode))


@attention_bwd.register_fake
def _(q, k, v, o, do, lse, layout, mask, window_left, window_right, softmax_scale, softcap,
      alibi_slopes, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, mode=0):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _attn_setup(ctx, inputs, output):
    q, k, v = inputs[:3]
    o, lse = output
    ctx.cfg = inputs[3:]
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.set_materialize_grads(True)


def _attn_bwd(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.xte.attention_bwd(q, k, v, o, do.to(q.dtype).contiguous(), lse,
                                             *ctx.cfg)
    return (dq, dk, dv) + (None,) * (len(ctx.cfg))


attention_fwd.register_autograd(_attn_bwd, setup_context=_attn_setup)


OPS = {
    "quantize": quantize, "dequantize": dequantize, "gemm": gemm, "gemm_grouped": gemm_grouped,
    "router": router, "router_backward": router_backward, "moe_permute": moe_permute,
    "moe_permute_backward": moe_permute_backward, "moe_unpermute": moe_unpermute,
    "moe_unpermute_backward": moe_unpermute_backward, "swiglu": swiglu, "dswiglu": dswiglu,
    "swiglu_quantize": swiglu_quantize, "attention_fwd": attention_fwd,
    "attention_bwd": attention_bwd,
}


# ============================================================================= more ops


_BYTE_DTYPES = (int(DType.E4M3), int(DType.E5M2), int(DType.E8M0))


@torch.library.custom_op("xte::cast", mutates_args=(), device_types=_DEV)
def cast(x: Tensor, in_dtype: int, out_dtype: int, saturate: bool) -> Tensor:
    """xte_cast: x (fp32 / bf16 / fp16, or fp8 / e8m0 codes as uint8 with in_dtype saying which)
    to out_dtype (fp8 / e8m0 results as uint8 bytes)."""
    vx = view(_as(x, in_dtype) if x.dtype == torch.uint8 else x, "x")
    out = empty(vx, vx.shape, DType.UINT8 if out_dtype in _BYTE_DTYPES else out_dtype)
    vo = view(_as(out, out_dtype), "out", writable=True)
    call("xte_cast", vx.ptr, vo.ptr, int(saturate), stream_of(vx, vo))
    return out


@cast.register_fake
def _(x, in_dtype, out_dtype, saturate):
    return x.new_empty(x.shape, dtype=torch.uint8 if out_dtype in _BYTE_DTYPES
                       else torch_dtype(out_dtype))


@torch.library.custom_op("xte::dswiglu_quantize", mutates_args=(), device_types=_DEV)
def dswiglu_quantize(grad_out: Tensor, x: Tensor, act_dtype: int, mode: int, recipe: int,
                     layout: int, fmt: int, rowwise: bool, columnwise: bool, amax_epsilon: float,
                     force_pow_2: int, saturate: bool) -> List[Tensor]:
    """xte_dswiglu_quantize: quantize(dswiglu(grad_out, x) rounded to act_dtype), outputs as
    xte::quantize's for an input of x's shape."""
    vg = view(grad_out, "grad_out", _ACT)
    vx = view(x, "x", _ACT)
    outs = [empty(vx, s, DType.UINT8 if d in (None, DType.E8M0) else d)
            for s, d in _quant_shapes(vx.shape, mode, recipe, layout, rowwise, columnwise)]
    i = 0
    d = s = cd = cs = None
    if rowwise:
        d, s = outs[0], outs[1]
        i = 2
    if columnwise:
        cd, cs = outs[i], outs[i + 1]
    q, keep = _qt(d, s, cd, cs, (mode, recipe, layout, layout, fmt), "out")
    cfg = lib.xte_quant_config_default()
    cfg.amax_epsilon = amax_epsilon
    cfg.force_pow_2 = force_pow_2
    cfg.saturate = int(saturate)
    call("xte_dswiglu_quantize", vg.ptr, vx.ptr, int(act_dtype), ctypes.byref(q),
         ctypes.byref(cfg), stream_of(vg, vx, *keep))
    return outs


@dswiglu_quantize.register_fake
def _(grad_out, x, act_dtype, mode, recipe, layout, fmt, rowwise, columnwise, amax_epsilon,
      force_pow_2, saturate):
    return [x.new_empty(s, dtype=torch.uint8 if d in (None, DType.E8M0) else torch_dtype(d))
            for s, d in _quant_shapes(tuple(int(v) for v in x.shape), mode, recipe, layout,
                                      rowwise, columnwise)]


@torch.library.custom_op("xte::router_aux_scores", mutates_args=(), device_types=_DEV)
def router_aux_scores(logits: Tensor, topk: int,
                      score_function: int) -> Tuple[Tensor, Tensor, Tensor]:
    """xte_router_aux_scores (TE's fused_compute_score_for_moe_aux_loss): (scores fp32 [T, E],
    routing_map uint8 [T, E], saved fp32 [T, E])."""
    vl = view(logits, "logits", _ACT)
    T, E = _prod(vl.shape[:-1]), vl.shape[-1]
    sc, rm, sv = (empty(vl, (T, E), DType.FP32), empty(vl, (T, E), DType.UINT8),
                  empty(vl, (T, E), DType.FP32))
    vs, vr, vv = (view(sc, "scores", writable=True), view(rm, "routing_map", writable=True),
                  view(sv, "saved", writable=True))
    call("xte_router_aux_scores", vl.ptr, int(topk), int(score_function), vs.ptr, vr.ptr, vv.ptr,
         stream_of(vl, vs, vr, vv))
    return sc, rm, sv


@router_aux_scores.register_fake
def _(logits, topk, score_function):
    T, E = _prod(logits.shape[:-1]), logits.shape[-1]
    return (logits.new_empty((T, E), dtype=torch.float32),
            logits.new_empty((T, E), dtype=torch.uint8),
            logits.new_empty((T, E), dtype=torch.float32))


@torch.library.custom_op("xte::router_aux_scores_backward", mutates_args=(), device_types=_DEV)
def router_aux_scores_backward(grad_scores: Tensor, saved: Tensor, logits: Tensor, topk: int,
                               score_function: int) -> Tensor:
    """grad_logits (logits' dtype) of router_aux_scores."""
    vg = view(grad_scores, "grad_scores", (DType.FP32,))
    vs = view(saved, "saved", (DType.FP32,))
    vl = view(logits, "logits", _ACT)
    gl = empty(vl, vl.shape, vl.dtype)
    vo = view(gl, "grad_logits", writable=True)
    call("xte_router_aux_scores_backward", vg.ptr, vs.ptr, vl.ptr, int(topk),
         int(score_function), vo.ptr, stream_of(vg, vs, vl, vo))
    return gl


@router_aux_scores_backward.register_fake
def _(grad_scores, saved, logits, topk, score_function):
    return torch.empty_like(logits)


def _aux_scores_setup(ctx, inputs, output):
    logits, topk, sf = inputs
    ctx.save_for_backward(output[2], logits)
    ctx.cfg = (topk, sf)
    ctx.set_materialize_grads(True)


def _aux_scores_bwd(ctx, gs, grm, gsaved):
    saved, logits = ctx.saved_tensors
    return (torch.ops.xte.router_aux_scores_backward(gs.contiguous(), saved, logits, *ctx.cfg),
            None, None)


router_aux_scores.register_autograd(_aux_scores_bwd, setup_context=_aux_scores_setup)


@torch.library.custom_op("xte::moe_aux_loss", mutates_args=(), device_types=_DEV)
def moe_aux_loss(probs: Tensor, tokens_per_expert: Tensor, total_num_tokens: int, topk: int,
                 coeff: float) -> Tensor:
    """xte_moe_aux_loss_forward (TE's fused_moe_aux_loss): a 0-d fp32 tensor."""
    vp = view(probs, "probs", (DType.FP32,))
    vt = view(tokens_per_expert, "tokens_per_expert", (DType.INT32, DType.INT64))
    out = empty(vp, (1,), DType.FP32)
    vo = view(out, "aux_loss", writable=True)
    call("xte_moe_aux_loss_forward", vp.ptr, vt.ptr, int(total_num_tokens), int(topk),
         float(coeff), ctypes.cast(vo.t.data, _F32P), stream_of(vp, vt, vo))
    return out.view(())


@moe_aux_loss.register_fake
def _(probs, tokens_per_expert, total_num_tokens, topk, coeff):
    return probs.new_empty((), dtype=torch.float32)


@torch.library.custom_op("xte::moe_aux_loss_backward", mutates_args=(), device_types=_DEV)
def moe_aux_loss_backward(grad_aux: Tensor, tokens_per_expert: Tensor, num_tokens: int,
                          total_num_tokens: int, topk: int, coeff: float) -> Tensor:
    """grad_probs fp32 [num_tokens, E] of moe_aux_loss (grad_aux: a 1-element tensor, read on
    the host as the C API takes it)."""
    vt = view(tokens_per_expert, "tokens_per_expert", (DType.INT32, DType.INT64))
    gp = empty(vt, (num_tokens, vt.shape[-1]), DType.FP32)
    vg = view(gp, "grad_probs", writable=True)
    call("xte_moe_aux_loss_backward", vt.ptr, int(total_num_tokens), int(topk), float(coeff),
         float(grad_aux.reshape(()).item()), vg.ptr, stream_of(vt, vg))
    return gp


@moe_aux_loss_backward.register_fake
def _(grad_aux, tokens_per_expert, num_tokens, total_num_tokens, topk, coeff):
    return tokens_per_expert.new_empty((num_tokens, tokens_per_expert.shape[-1]),
                                       dtype=torch.float32)


def _aux_loss_setup(ctx, inputs, output):
    probs, tpe, total, topk, coeff = inputs
    ctx.save_for_backward(tpe)
    ctx.cfg = (probs.shape[0], total, topk, coeff)


def _aux_loss_bwd(ctx, g):
    (tpe,) = ctx.saved_tensors
    return (torch.ops.xte.moe_aux_loss_backward(g.reshape(1).to(torch.float32), tpe, *ctx.cfg),
            None, None, None, None)


moe_aux_loss.register_autograd(_aux_loss_bwd, setup_context=_aux_loss_setup)


@torch.library.custom_op("xte::moe_sort_chunks_by_index", mutates_args=(), device_types=_DEV)
def moe_sort_chunks_by_index(x: Tensor, split_sizes: Tensor,
                             sorted_index: Tensor) -> Tuple[Tensor, Tensor]:
    """xte_moe_sort_chunks_by_index: (output [R, H], row_map int32 [R])."""
    vx = view(x, "x")
    vs = view(split_sizes, "split_sizes", (DType.INT32, DType.INT64))
    vi = view(sorted_index, "sorted_index", (DType.INT32, DType.INT64))
    out = empty(vx, vx.shape, vx.dtype)
    rm = empty(vx, (vx.shape[0],), DType.INT32)
    vo, vr = view(out, "output", writable=True), view(rm, "row_map", writable=True)
    call("xte_moe_sort_chunks_by_index", vx.ptr, vs.ptr, vi.ptr, vo.ptr, vr.ptr,
         stream_of(vx, vs, vi, vo))
    return out, rm


@moe_sort_chunks_by_index.register_fake
def _(x, split_sizes, sorted_index):
    return torch.empty_like(x), x.new_empty((x.shape[0],), dtype=torch.int32)


@torch.library.custom_op("xte::moe_sort_chunks_backward", mutates_args=(), device_types=_DEV)
def moe_sort_chunks_backward(grad_output: Tensor, row_map: Tensor) -> Tensor:
    """grad_input[r] = grad_output[row_map[r]]."""
    vg = view(grad_output, "grad_output")
    vr = view(row_map, "row_map", (DType.INT32,))
    gi = empty(vg, vg.shape, vg.dtype)
    vo = view(gi, "grad_input", writable=True)
    call("xte_moe_sort_chunks_backward", vg.ptr, vr.ptr, vo.ptr, stream_of(vg, vr, vo))
    return gi


@moe_sort_chunks_backward.register_fake
def _(grad_output, row_map):
    return torch.empty_like(grad_output)


def _sort_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])
    ctx.set_materialize_grads(True)


def _sort_bwd(ctx, gout, grm):
    (rm,) = ctx.saved_tensors
    return torch.ops.xte.moe_sort_chunks_backward(gout.contiguous(), rm), None, None


moe_sort_chunks_by_index.register_autograd(_sort_bwd, setup_context=_sort_setup)


# ============================================================================= TE permutation
# TransformerEngine's moe_permute / moe_unpermute / moe_sort_chunks_by_index with its plain
# row_id_map tensors (xte.transformer_engine.pytorch.permutation calls these):
#  - mask map: int32 [T, 2E + 1]; row t holds in columns [0, n) the output row of each of its
#    n routed experts (ascending expert; rows of the UNPADDED layout), in [E, E + n) those
#    experts, in column 2E the count n; the unused columns are -1. The C permute writes its row
#    map (slot j = the j-th routed expert) straight into columns [0, E); the unpermutes give the
#    C library columns [E, 2E) as topk_idx (-1 = no expert) with the probs read per slot.
#  - index map: int32 [k T], entry j T + t = the output row of slot j of token t (-1 dropped):
#    xte's [T, k] row map transposed.
# With padding (moe_permute_and_pad_with_probs) the C permute pads each expert to `align` rows;
# pad_offsets (int64 [E], TE's: the padding rows before each expert) turn the padded rows into
# the row_id_map's unpadded ones and back.

from .._tensor import ptr  # noqa: E402  (the optional tensors of the C calls)


def _te_probs32(p):
    """probs as fp32 (the C unpermute's weights: TE computes in fp32 too), zero-copy if fp32."""
    return p if p.dtype == torch.float32 else p.float()


def _te_k(rid, E):
    """The slots the C calls need of a mask row_id_map: the most experts of a token (its first
    columns hold them all), so that a wide map (E = 1024) costs its routed slots, not E."""
    if rid.shape[0] == 0:
        return 1
    return max(min(int(rid[:, 2 * E].max()), E), 1)


def _te_rows(rid, E, pad_offsets):
    """The padded output row of every slot of a mask row_id_map: int32 [T, k] (a view of rid
    without padding)."""
    k = _te_k(rid, E)
    rows = rid[:, :k]
    if pad_offsets is None:
        return rows
    ex = rid[:, E:E + k]
    off = pad_offsets.to(torch.int64)[ex.clamp(min=0).to(torch.int64)]
    return torch.where(rows >= 0, rows.to(torch.int64) + off, -1).to(torch.int32)


def _te_mask_routing(rid, E):
    """The routing of a mask row_id_map: its expert columns as topk_idx (-1 none)."""
    vi = view(rid[:, E:E + _te_k(rid, E)], "row_id_map", (DType.INT32,))
    return _routing(vi, E), vi


def _te_slot_probs(rid, E, probs):
    """probs [T, E] (by expert) as fp32 [T, E] per slot of a mask row_id_map (slot j: the
    j-th routed expert; slots without one read column 0, never used)."""
    ex = rid[:, E:E + _te_k(rid, E)]
    return _te_probs32(probs).gather(1, ex.clamp(min=0).to(torch.int64))


def _te_dense(rid, E, per_slot, dtype):
    """per-slot values [T, k] back to [T, E] by expert (0 where not routed), in dtype."""
    ex = rid[:, E:E + per_slot.shape[1]].to(torch.int64)
    T = rid.shape[0]
    buf = torch.zeros((T, E + 1), dtype=per_slot.dtype, device=rid.device)
    buf.scatter_(1, torch.where(ex >= 0, ex, E), per_slot)  # unrouted slots: column E, dropped
    return buf[:, :E].to(dtype).contiguous()


@torch.library.custom_op("xte::te_permute_mask", mutates_args=(), device_types=_DEV)
def te_permute_mask(x: Tensor, routing_map: Tensor, probs: Optional[Tensor], num_out_tokens: int,
                    align: int, pad_offsets: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """TE's permute with a mask map: (output [num_out_tokens, H], row_id_map int32 [T, 2E + 1],
    permuted_probs [num_out_tokens] in probs' dtype (empty without probs)). routing_map bool /
    uint8 [T, E]; no slot is dropped (fewer output rows than routed slots is the C library's
    error); align > 1 pads every expert with zero rows to a multiple of align, where pad_offsets
    must be the padding before each expert (checked against the routing). A slot whose prob is
    exactly 0 gets a zero row (TE's convention for routing-map padding)."""
    vx = view(x, "inp", (DType.FP32, DType.BF16, DType.FP16, DType.E4M3, DType.E5M2))
    vm = view(routing_map, "routing_map", (DType.UINT8,))
    T, H = vx.shape
    E = vm.shape[1]
    out = empty(vx, (num_out_tokens, H), vx.dtype)
    rid = torch.full((T, 2 * E + 1), -1, dtype=torch.int32, device=x.device)
    vo = view(out, "output", writable=True)
    vrm = view(rid[:, :E], "row_id_map", writable=True)
    extra = PermuteOutputs()
    offs = tpe = None
    if align > 1:
        offs = empty(vx, (E + 1,), DType.INT64)
        tpe = empty(vx, (E,), DType.INT64)
        vf, vt = view(offs, "expert_offsets", writable=True), view(tpe, "tokens_per_expert",
                                                                    writable=True)
        extra.expert_offsets = vf.t
        extra.tokens_per_expert = vt.t
    r = MoeRouting()
    r.routing_map = ctypes.pointer(vm.t)
    r.num_experts = E
    cfg = PermuteConfig(num_out_tokens=-1, align=max(int(align), 1))
    call("xte_moe_permute", vx.ptr, None, ctypes.byref(r), ctypes.byref(cfg), vo.ptr, None,
         vrm.ptr, ctypes.byref(extra), stream_of(vx, vm, vo))
    # the experts of the slots: routed expert e is slot (routed experts before it) of its token
    m = routing_map if routing_map.dtype == torch.bool else routing_map != 0
    slot = torch.cumsum(m, 1) - 1
    buf = torch.full((T, E + 1), -1, dtype=torch.int32, device=x.device)
    experts = torch.arange(E, dtype=torch.int32, device=x.device).expand(T, E)
    buf.scatter_(1, torch.where(m, slot, E), experts)  # unrouted: column E, dropped
    rid[:, E:2 * E] = buf[:, :E]
    rid[:, 2 * E] = m.sum(1)
    if align > 1:
        # the padding before each expert: its padded first row less its unpadded one
        unpadded = torch.cumsum(tpe, 0) - tpe
        pad = offs[:E] - unpadded
        if pad_offsets is None or not torch.equal(pad.to(pad_offsets.device),
                                                  pad_offsets.to(torch.int64)):
            raise XteValueError(Status.INVALID_ARGUMENT,
                                "tokens_per_expert: the padding it gives differs from the "
                                "routing map's (want routing_map.sum(0))")
        rows = rid[:, :E]
        ex = rid[:, E:2 * E].clamp(min=0).to(torch.int64)
        rows.copy_(torch.where(rows >= 0, rows.to(torch.int64) - pad[ex], -1).to(torch.int32))
    if probs is None:
        return out, rid, x.new_empty((0,), dtype=torch.float32)
    prows = _te_rows(rid, E, pad_offsets if align > 1 else None)
    keep = prows >= 0
    dst = prows[keep].to(torch.int64)
    ex = rid[:, E:E + prows.shape[1]]
    vals = probs.gather(1, ex.clamp(min=0).to(torch.int64))[keep]
    pprobs = torch.zeros((num_out_tokens,), dtype=probs.dtype, device=x.device)
    pprobs[dst] = vals
    zero = dst[vals == 0]
    if zero.numel():
        out[zero] = 0
    return out, rid, pprobs


@te_permute_mask.register_fake
def _(x, routing_map, probs, num_out_tokens, align, pad_offsets):
    T, H = x.shape
    E = routing_map.shape[1]
    pp = (x.new_empty((num_out_tokens,), dtype=probs.dtype) if probs is not None
          else x.new_empty((0,), dtype=torch.float32))
    return x.new_empty((num_out_tokens, H)), x.new_empty((T, 2 * E + 1), dtype=torch.int32), pp


@torch.library.custom_op("xte::te_permute_mask_backward", mutates_args=(), device_types=_DEV)
def te_permute_mask_backward(grad_output: Tensor, grad_probs: Optional[Tensor], row_id_map: Tensor,
                             pad_offsets: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """(grad_input [T, H]: the sum over each token's slots of grad_output[row], fp32, ascending
    expert; grad_probs [T, E] (grad_probs' dtype, 0 where not routed; empty without))."""
    T = row_id_map.shape[0]
    E = (row_id_map.shape[1] - 1) // 2
    vg = view(grad_output, "grad_output", _FLOAT_IN)
    rows = _te_rows(row_id_map, E, pad_offsets)
    r, vi = _te_mask_routing(row_id_map, E)
    vr = view(rows, "row_id_map", (DType.INT32,))
    gi = empty(vg, (T, vg.shape[-1]), vg.dtype)
    vo = view(gi, "grad_input", writable=True)
    call("xte_moe_permute_backward", vg.ptr, ctypes.byref(r), vr.ptr, vo.ptr,
         stream_of(vg, vi, vr, vo))
    if grad_probs is None:
        return gi, grad_output.new_empty((0,), dtype=torch.float32)
    keep = rows >= 0
    k = rows.shape[1]
    gp = torch.zeros((T, E), dtype=grad_probs.dtype, device=grad_output.device)
    tt = torch.arange(T, device=grad_output.device).unsqueeze(1).expand(T, k)[keep]
    gp[tt, row_id_map[:, E:E + k][keep].to(torch.int64)] = grad_probs[rows[keep].to(torch.int64)]
    return gi, gp


@te_permute_mask_backward.register_fake
def _(grad_output, grad_probs, row_id_map, pad_offsets):
    T = row_id_map.shape[0]
    E = (row_id_map.shape[1] - 1) // 2
    gp = (grad_output.new_empty((T, E), dtype=grad_probs.dtype) if grad_probs is not None
          else grad_output.new_empty((0,), dtype=torch.float32))
    return grad_output.new_empty((T, grad_output.shape[-1])), gp


def _te_permute_mask_setup(ctx, inputs, output):
    x, routing_map, probs, num_out_tokens, align, pad_offsets = inputs
    ctx.with_probs = probs is not None
    ctx.save_for_backward(output[1], pad_offsets)
    ctx.set_materialize_grads(True)


def _te_permute_mask_bwd(ctx, gout, grid, gprobs):
    rid, pad_offsets = ctx.saved_tensors
    gi, gp = torch.ops.xte.te_permute_mask_backward(
        gout.contiguous(), gprobs.contiguous() if ctx.with_probs else None, rid, pad_offsets)
    return gi, None, (gp if ctx.with_probs else None), None, None, None


te_permute_mask.register_autograd(_te_permute_mask_bwd, setup_context=_te_permute_mask_setup)


@torch.library.custom_op("xte::te_unpermute_mask", mutates_args=(), device_types=_DEV)
def te_unpermute_mask(x: Tensor, row_id_map: Tensor, merging_probs: Optional[Tensor],
                      num_tokens: int, pad_offsets: Optional[Tensor]) -> Tensor:
    """TE's unpermute with a mask row_id_map: out [T, H] (x's dtype) = the sum over each token's
    slots (ascending expert) of merging_probs[t, e] * x[row], fp32 fmaf from +0, rounded once;
    merging_probs [T, E] (any float dtype, read as fp32) or None (weight 1)."""
    E = (row_id_map.shape[1] - 1) // 2
    vx = view(x, "inp", _FLOAT_IN)
    rows = _te_rows(row_id_map, E, pad_offsets)
    r, vi = _te_mask_routing(row_id_map, E)
    vr = view(rows, "row_id_map", (DType.INT32,))
    vp = (view(_te_slot_probs(row_id_map, E, merging_probs), "merging_probs")
          if merging_probs is not None else None)
    out = empty(vx, (num_tokens, vx.shape[-1]), vx.dtype)
    vo = view(out, "out", writable=True)
    call("xte_moe_unpermute", vx.ptr, ctypes.byref(r), vr.ptr, ptr(vp), vo.ptr,
         stream_of(vx, vi, vr, vp, vo))
    return out


@te_unpermute_mask.register_fake
def _(x, row_id_map, merging_probs, num_tokens, pad_offsets):
    return x.new_empty((num_tokens, x.shape[-1]))


@torch.library.custom_op("xte::te_unpermute_mask_backward", mutates_args=(), device_types=_DEV)
def te_unpermute_mask_backward(grad_out: Tensor, x: Tensor, row_id_map: Tensor,
                               merging_probs: Optional[Tensor],
                               pad_offsets: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """(grad_x [rows of x, H]: fp32(w g) at each slot's row, zero elsewhere (padding rows too);
    grad_probs [T, E] in merging_probs' dtype: the fp32 dot of g[t] and x[row] per slot, 0 where
    not routed; empty without merging_probs)."""
    E = (row_id_map.shape[1] - 1) // 2
    vg = view(grad_out, "grad_out", _FLOAT_IN)
    vx = view(x, "inp", _FLOAT_IN)
    rows = _te_rows(row_id_map, E, pad_offsets)
    r, vi = _te_mask_routing(row_id_map, E)
    vr = view(rows, "row_id_map", (DType.INT32,))
    vp = (view(_te_slot_probs(row_id_map, E, merging_probs), "merging_probs")
          if merging_probs is not None else None)
    gx = empty(vg, (vx.shape[0], vg.shape[-1]), vg.dtype)
    vgx = view(gx, "grad_input", writable=True)
    gp = vgp = None
    if vp is not None:
        gp = empty(vg, vp.shape, DType.FP32)
        vgp = view(gp, "grad_probs", writable=True)
    call("xte_moe_unpermute_backward", vg.ptr, vx.ptr, ctypes.byref(r), vr.ptr, ptr(vp),
         vgx.ptr, ptr(vgp), stream_of(vg, vx, vi, vr, vp, vgx, vgp))
    if gp is None:
        return gx, grad_out.new_empty((0,), dtype=torch.float32)
    return gx, _te_dense(row_id_map, E, gp, merging_probs.dtype)


@te_unpermute_mask_backward.register_fake
def _(grad_out, x, row_id_map, merging_probs, pad_offsets):
    gp = (merging_probs.new_empty(merging_probs.shape) if merging_probs is not None
          else grad_out.new_empty((0,), dtype=torch.float32))
    return grad_out.new_empty((x.shape[0], grad_out.shape[-1])), gp


def _te_unpermute_mask_setup(ctx, inputs, output):
    x, row_id_map, merging_probs, num_tokens, pad_offsets = inputs
    ctx.with_probs = merging_probs is not None
    ctx.save_for_backward(x, row_id_map, merging_probs, pad_offsets)


def _te_unpermute_mask_bwd(ctx, gout):
    x, rid, probs, pad_offsets = ctx.saved_tensors
    gx, gp = torch.ops.xte.te_unpermute_mask_backward(gout.contiguous(), x, rid, probs,
                                                      pad_offsets)
    return gx, None, (gp if ctx.with_probs else None), None, None


te_unpermute_mask.register_autograd(_te_unpermute_mask_bwd, setup_context=_te_unpermute_mask_setup)


def _te_index(index):
    """topk indices as int32 / int64 (int16 and uint8 widened: the C routing takes 32 / 64-bit)."""
    return index if index.dtype in (torch.int32, torch.int64) else index.to(torch.int32)


def _te_index_routing(rm):
    """A routing for an index row map alone (the unpermute has no indices): slot j of a token
    has 'expert' j where its row is >= 0; probs are per slot [T, k], so the ids matter not."""
    k = rm.shape[1]
    slot = torch.arange(k, dtype=torch.int32, device=rm.device).expand_as(rm)
    idx = torch.where(rm >= 0, slot, -1).to(torch.int32)
    vi = view(idx, "row_id_map", (DType.INT32,))
    return _routing(vi, max(k, 1)), vi, idx


@torch.library.custom_op("xte::te_permute_index", mutates_args=(), device_types=_DEV)
def te_permute_index(x: Tensor, index: Tensor, num_out_tokens: int) -> Tuple[Tensor, Tensor]:
    """TE's permute with an index map: (output [num_out_tokens or T k, H], row_id_map int32
    [k T]). index [T, k] int32 / int64 (int16 widened). Expert-major, tokens ascending within an
    expert; 0 < num_out_tokens < T k drops the slots past it in that order."""
    vx = view(x, "inp", (DType.FP32, DType.BF16, DType.FP16, DType.E4M3, DType.E5M2))
    idx = _te_index(index)
    vi = view(idx, "index", (DType.INT32, DType.INT64))
    T, H = vx.shape
    k = vi.shape[1]
    rows = num_out_tokens if num_out_tokens > 0 else T * k
    out = empty(vx, (rows, H), vx.dtype)
    rm = empty(vx, (T, k), DType.INT32)
    vo, vr = view(out, "output", writable=True), view(rm, "row_id_map", writable=True)
    # the expert count is inferred as TE's kernel does: the largest index + 1
    E = int(idx.max()) + 1 if idx.numel() else 1
    r = _routing(vi, max(E, 1))
    cfg = PermuteConfig(num_out_tokens=num_out_tokens if num_out_tokens > 0 else -1, align=1)
    call("xte_moe_permute", vx.ptr, None, ctypes.byref(r), ctypes.byref(cfg), vo.ptr, None,
         vr.ptr, None, stream_of(vx, vi, vo))
    return out, rm.t().contiguous().view(-1)


@te_permute_index.register_fake
def _(x, index, num_out_tokens):
    T, H = x.shape
    k = index.shape[1]
    rows = num_out_tokens if num_out_tokens > 0 else T * k
    return x.new_empty((rows, H)), x.new_empty((T * k,), dtype=torch.int32)


@torch.library.custom_op("xte::te_unpermute_index", mutates_args=(), device_types=_DEV)
def te_unpermute_index(x: Tensor, row_id_map: Tensor, probs: Optional[Tensor],
                       num_tokens: int) -> Tensor:
    """TE's unpermute with an index row_id_map [k T]: out [T, H] (x's dtype) = the sum over the
    slots (ascending j) of probs[t, j] * x[row] (fp32 fmaf, one rounding); probs fp32 [T, k] or
    None (weight 1, k = row_id_map's size / num_tokens)."""
    vx = view(x, "inp", _FLOAT_IN)
    k = row_id_map.numel() // num_tokens if num_tokens else 1
    rm = row_id_map.view(k, num_tokens).t().contiguous()
    r, vi, _ = _te_index_routing(rm)
    vr = view(rm, "row_id_map", (DType.INT32,))
    vp = view(_te_probs32(probs), "probs") if probs is not None else None
    out = empty(vx, (num_tokens, vx.shape[-1]), vx.dtype)
    vo = view(out, "out", writable=True)
    call("xte_moe_unpermute", vx.ptr, ctypes.byref(r), vr.ptr, ptr(vp), vo.ptr,
         stream_of(vx, vi, vr, vp, vo))
    return out


@te_unpermute_index.register_fake
def _(x, row_id_map, probs, num_tokens):
    return x.new_empty((num_tokens, x.shape[-1]))


@torch.library.custom_op("xte::te_unpermute_index_backward", mutates_args=(),
                         device_types=_DEV)
def te_unpermute_index_backward(grad_out: Tensor, x: Tensor, row_id_map: Tensor,
                                probs: Optional[Tensor], num_tokens: int) -> Tuple[Tensor, Tensor]:
    """(grad_x [rows of x, H] = fp32(w g) at each slot's row, zero elsewhere; grad_probs fp32
    [T, k] = the fp32 dots (empty without probs)). Also the permute's backward (x None: the sum
    of each token's rows) through te_permute_index_backward."""
    vg = view(grad_out, "grad_out", _FLOAT_IN)
    vx = view(x, "inp", _FLOAT_IN)
    k = row_id_map.numel() // num_tokens if num_tokens else 1
    rm = row_id_map.view(k, num_tokens).t().contiguous()
    r, vi, _ = _te_index_routing(rm)
    vr = view(rm, "row_id_map", (DType.INT32,))
    vp = view(_te_probs32(probs), "probs") if probs is not None else None
    gx = empty(vg, (vx.shape[0], vg.shape[-1]), vg.dtype)
    vgx = view(gx, "grad_input", writable=True)
    gp = vgp = None
    if vp is not None:
        gp = empty(vg, vp.shape, DType.FP32)
        vgp = view(gp, "grad_probs", writable=True)
    call("xte_moe_unpermute_backward", vg.ptr, vx.ptr, ctypes.byref(r), vr.ptr, ptr(vp),
         vgx.ptr, ptr(vgp), stream_of(vg, vx, vi, vr, vp, vgx, vgp))
    return gx, (gp if gp is not None else grad_out.new_empty((0,), dtype=torch.float32))


@te_unpermute_index_backward.register_fake
def _(grad_out, x, row_id_map, probs, num_tokens):
    gp = (probs.new_empty(probs.shape, dtype=torch.float32) if probs is not None
          else grad_out.new_empty((0,), dtype=torch.float32))
    return grad_out.new_empty((x.shape[0], grad_out.shape[-1])), gp


@torch.library.custom_op("xte::te_permute_index_backward", mutates_args=(), device_types=_DEV)
def te_permute_index_backward(grad_output: Tensor, row_id_map: Tensor, num_tokens: int) -> Tensor:
    """grad_input [T, H] = the sum over each token's slots (ascending j) of grad_output[row]
    (fp32, one rounding)."""
    vg = view(grad_output, "grad_output", _FLOAT_IN)
    k = row_id_map.numel() // num_tokens if num_tokens else 1
    rm = row_id_map.view(k, num_tokens).t().contiguous()
    r, vi, _ = _te_index_routing(rm)
    vr = view(rm, "row_id_map", (DType.INT32,))
    gi = empty(vg, (num_tokens, vg.shape[-1]), vg.dtype)
    vo = view(gi, "grad_input", writable=True)
    call("xte_moe_permute_backward", vg.ptr, ctypes.byref(r), vr.ptr, vo.ptr,
         stream_of(vg, vi, vr, vo))
    return gi


@te_permute_index_backward.register_fake
def _(grad_output, row_id_map, num_tokens):
    return grad_output.new_empty((num_tokens, grad_output.shape[-1]))


def _te_permute_index_setup(ctx, inputs, output):
    x = inputs[0]
    ctx.T = x.shape[0]
    ctx.save_for_backward(output[1])
    ctx.set_materialize_grads(True)


def _te_permute_index_bwd(ctx, gout, grid):
    (rid,) = ctx.saved_tensors
    return torch.ops.xte.te_permute_index_backward(gout.contiguous(), rid, ctx.T), None, None


te_permute_index.register_autograd(_te_permute_index_bwd, setup_context=_te_permute_index_setup)


def _te_unpermute_index_setup(ctx, inputs, output):
    x, row_id_map, probs, num_tokens = inputs
    ctx.with_probs = probs is not None
    ctx.T = num_tokens
    ctx.save_for_backward(x, row_id_map, probs)


def _te_unpermute_index_bwd(ctx, gout):
    x, rid, probs = ctx.saved_tensors
    gx, gp = torch.ops.xte.te_unpermute_index_backward(gout.contiguous(), x, rid, probs, ctx.T)
    return gx, None, (gp.to(probs.dtype) if ctx.with_probs else None), None


te_unpermute_index.register_autograd(_te_unpermute_index_bwd,
                                     setup_context=_te_unpermute_index_setup)


def _te_sort(x, split_sizes, sorted_index, out, rm):
    """xte_moe_sort_chunks_by_index on the rows the splits cover; rows past their sum (TE
    allows an input longer than the chunks) stay where they are."""
    n = int(split_sizes.sum()) if split_sizes.numel() else 0
    if n < x.shape[0]:
        out[n:] = x[n:]
        rm[n:] = torch.arange(n, x.shape[0], dtype=torch.int32, device=x.device)
        x, out, rm = x[:n], out[:n], rm[:n]
    vx = view(x, "inp")
    vs = view(split_sizes, "split_sizes", (DType.INT32, DType.INT64))
    vi = view(sorted_index, "sorted_index", (DType.INT32, DType.INT64))
    vo, vr = view(out, "output", writable=True), view(rm, "row_map", writable=True)
    call("xte_moe_sort_chunks_by_index", vx.ptr, vs.ptr, vi.ptr, vo.ptr, vr.ptr,
         stream_of(vx, vs, vi, vo))


@torch.library.custom_op("xte::te_sort_chunks", mutates_args=(), device_types=_DEV)
def te_sort_chunks(x: Tensor, split_sizes: Tensor, sorted_index: Tensor,
                   probs: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """TE's chunk sort: (output [R, H], permuted_probs [R] (empty without probs), row_map int32
    [R]: the output row of each input row). Rows move as bytes (any dtype)."""
    out = torch.empty_like(x)
    rm = torch.empty((x.shape[0],), dtype=torch.int32, device=x.device)
    _te_sort(x, split_sizes.to(x.device) if split_sizes.device != x.device else split_sizes,
             sorted_index.to(x.device) if sorted_index.device != x.device else sorted_index,
             out, rm)
    if probs is None:
        return out, x.new_empty((0,), dtype=torch.float32), rm
    pp = torch.empty_like(probs)
    pp[rm.to(torch.int64)] = probs
    return out, pp, rm


@te_sort_chunks.register_fake
def _(x, split_sizes, sorted_index, probs):
    pp = torch.empty_like(probs) if probs is not None else x.new_empty((0,), dtype=torch.float32)
    return torch.empty_like(x), pp, x.new_empty((x.shape[0],), dtype=torch.int32)


def _te_sort_setup(ctx, inputs, output):
    ctx.with_probs = inputs[3] is not None
    ctx.save_for_backward(output[2])
    ctx.set_materialize_grads(True)


def _te_sort_bwd(ctx, gout, gprobs, grm):
    (rm,) = ctx.saved_tensors
    gx = torch.ops.xte.moe_sort_chunks_backward(gout.contiguous(), rm)
    gp = None
    if ctx.with_probs:
        gp = torch.ops.xte.moe_sort_chunks_backward(gprobs.contiguous().view(-1, 1),
                                                    rm).view(gprobs.shape)
    return gx, None, None, gp


te_sort_chunks.register_autograd(_te_sort_bwd, setup_context=_te_sort_setup)


@torch.library.custom_op("xte::moe_dispatch_layout", mutates_args=(), device_types=_DEV)
def moe_dispatch_layout(topk_idx: Tensor, num_experts: int,
                        num_ranks: int) -> Tuple[Tensor, Tensor, Tensor]:
    """xte_moe_dispatch_layout (DeepEP get_dispatch_layout): (tokens_per_rank int32 [R],
    tokens_per_expert int32 [E], is_token_in_rank uint8 [T, R])."""
    vi = view(topk_idx, "topk_idx", (DType.INT32, DType.INT64))
    T = vi.shape[0]
    a = empty(vi, (num_ranks,), DType.INT32)
    b = empty(vi, (num_experts,), DType.INT32)
    c = empty(vi, (T, num_ranks), DType.UINT8)
    va, vb, vc = (view(a, "tokens_per_rank", writable=True),
                  view(b, "tokens_per_expert", writable=True),
                  view(c, "is_token_in_rank", writable=True))
    call("xte_moe_dispatch_layout", vi.ptr, int(num_experts), int(num_ranks), va.ptr, vb.ptr,
         vc.ptr, stream_of(vi, va))
    return a, b, c


@moe_dispatch_layout.register_fake
def _(topk_idx, num_experts, num_ranks):
    return (topk_idx.new_empty((num_ranks,), dtype=torch.int32),
            topk_idx.new_empty((num_experts,), dtype=torch.int32),
            topk_idx.new_empty((topk_idx.shape[0], num_ranks), dtype=torch.uint8))


OPS.update({
    "cast": cast, "dswiglu_quantize": dswiglu_quantize, "router_aux_scores": router_aux_scores,
    "router_aux_scores_backward": router_aux_scores_backward, "moe_aux_loss": moe_aux_loss,
    "moe_aux_loss_backward": moe_aux_loss_backward,
    "moe_sort_chunks_by_index": moe_sort_chunks_by_index,
    "moe_sort_chunks_backward": moe_sort_chunks_backward,
    "moe_dispatch_layout": moe_dispatch_layout,
})


# ============================================================================= DeepGEMM names
#
# Destination-passing ops: each mutates d (mutates_args=("d",)) and returns nothing, as
# DeepGEMM's functions; torch.compile functionalises them. Operands are (data, scales) pairs:
# data as uint8 bytes with its fp8 format (a_fmt / b_fmt: DType.E4M3 / E5M2), scales fp32 or
# E8M0 bytes (uint8). The bodies run the plain xte.fp8_gemm_* / *_grouped_* functions (scale
# shapes resolved there with xte_quantize_scale_shape; errors name the argument); the fake
# kernels have no output to shape. recipe: [] or DeepGEMM's (gran_m, gran_n, gran_k); hints:
# [mode_a, layout_a, mode_b, layout_b] (ScalingMode / ScaleLayout ints, -1 = infer).

from ..ops import gemm as _G  # noqa: E402


def _pair(data, scale, fmt):
    return (_as(data, fmt) if data.dtype == torch.uint8 else data), scale


def _hint_kw(recipe, hints, modes=True):
    ma, la, mb, lb = (None if int(h) < 0 else int(h) for h in hints)
    kw = {"recipe": tuple(int(v) for v in recipe) if len(recipe) else None,
          "layout": None if la is None and lb is None else (la, lb)}
    if modes:
        kw["recipe_a"], kw["recipe_b"] = ma, mb
    return kw


def _make_fp8_gemm(nm):
    plain = getattr(_G, f"fp8_gemm_{nm}")

    def fp8_gemm(a_data: Tensor, a_scale: Tensor, b_data: Tensor, b_scale: Tensor, d: Tensor,
                 c: Optional[Tensor], c_is_d: bool, bias: Optional[Tensor], a_fmt: int,
                 b_fmt: int, recipe: List[int], hints: List[int], gemm_mode: int) -> None:
        plain(_pair(a_data, a_scale, a_fmt), _pair(b_data, b_scale, b_fmt), d,
              d if c_is_d else c, mode=int(gemm_mode), bias=bias, **_hint_kw(recipe, hints))

    fp8_gemm.__name__ = fp8_gemm.__qualname__ = f"fp8_gemm_{nm}"
    fp8_gemm.__doc__ = (f"DeepGEMM's fp8_gemm_{nm} (xte.fp8_gemm_{nm}): d = op(a) op(b) (+ c, "
                        "or + d itself when c_is_d) (+ bias), written into d.")
    op = torch.library.custom_op(f"xte::fp8_gemm_{nm}", fp8_gemm, mutates_args=("d",),
                                 device_types=_DEV)

    @op.register_fake
    def _(a_data, a_scale, b_data, b_scale, d, c, c_is_d, bias, a_fmt, b_fmt, recipe, hints,
          gemm_mode):
        return None
    return op


fp8_gemm_nt = _make_fp8_gemm("nt")
fp8_gemm_nn = _make_fp8_gemm("nn")
fp8_gemm_tn = _make_fp8_gemm("tn")
fp8_gemm_tt = _make_fp8_gemm("tt")


@torch.library.custom_op("xte::m_grouped_fp8_gemm_nt_contiguous", mutates_args=("d",),
                         device_types=_DEV)
def m_grouped_fp8_gemm_nt_contiguous(a_data: Tensor, a_scale: Tensor, b_data: Tensor,
                                     b_scale: Tensor, d: Tensor, grouped_layout: Optional[Tensor],
                                     group_sizes: Optional[Tensor], alignment: int,
                                     bias: Optional[Tensor], a_fmt: int, b_fmt: int,
                                     recipe: List[int], hints: List[int], gemm_mode: int,
                                     use_psum_layout: bool = False,
                                     ensure_zero_padding: bool = True,
                                     trans_b: bool = False) -> None:
    """xte.m_grouped_fp8_gemm_nt_contiguous: groups from group_sizes (int64 [G], read on the
    host) or DeepGEMM's grouped_layout (int32 [M] m_indices, or with use_psum_layout int32 [G]
    end rows); alignment -1: the plain function's default; trans_b: b is [G, K, N] (_nn);
    ensure_zero_padding: d's rows in no group are written with zeros."""
    _G.m_grouped_fp8_gemm_nt_contiguous(
        _pair(a_data, a_scale, a_fmt), _pair(b_data, b_scale, b_fmt), d, grouped_layout,
        group_sizes=group_sizes, alignment=None if alignment < 0 else int(alignment),
        mode=int(gemm_mode), bias=bias, use_psum_layout=bool(use_psum_layout),
        ensure_zero_padding=bool(ensure_zero_padding), trans_b=bool(trans_b),
        **_hint_kw(recipe, hints))


@m_grouped_fp8_gemm_nt_contiguous.register_fake
def _(a_data, a_scale, b_data, b_scale, d, grouped_layout, group_sizes, alignment, bias, a_fmt,
      b_fmt, recipe, hints, gemm_mode, use_psum_layout=False, ensure_zero_padding=True,
      trans_b=False):
    return None


@torch.library.custom_op("xte::m_grouped_fp8_gemm_nt_masked", mutates_args=("d",),
                         device_types=_DEV)
def m_grouped_fp8_gemm_nt_masked(a_data: Tensor, a_scale: Tensor, b_data: Tensor,
                                 b_scale: Tensor, d: Tensor, masked_m: Tensor,
                                 bias: Optional[Tensor], a_fmt: int, b_fmt: int,
                                 recipe: List[int], hints: List[int], gemm_mode: int) -> None:
    """xte.m_grouped_fp8_gemm_nt_masked: d[g, :masked_m[g]] = a[g, :masked_m[g]] b[g]^T."""
    _G.m_grouped_fp8_gemm_nt_masked(
        _pair(a_data, a_scale, a_fmt), _pair(b_data, b_scale, b_fmt), d, masked_m,
        mode=int(gemm_mode), bias=bias, **_hint_kw(recipe, hints))


@m_grouped_fp8_gemm_nt_masked.register_fake
def _(a_data, a_scale, b_data, b_scale, d, masked_m, bias, a_fmt, b_fmt, recipe, hints,
      gemm_mode):
    return None


@torch.library.custom_op("xte::k_grouped_fp8_gemm_tn_contiguous", mutates_args=("d",),
                         device_types=_DEV)
def k_grouped_fp8_gemm_tn_contiguous(a_data: Tensor, a_scale: Tensor, b_data: Tensor,
                                     b_scale: Tensor, d: Tensor, ks: Optional[Tensor],
                                     grouped_layout: Optional[Tensor], c: Optional[Tensor],
                                     c_is_d: bool, bias: Optional[Tensor], a_fmt: int,
                                     b_fmt: int, recipe: List[int], hints: List[int],
                                     gemm_mode: int, use_psum_layout: bool = False,
                                     alignment: int = -1, nt: bool = False) -> None:
    """xte.k_grouped_fp8_gemm_tn_contiguous (nt: _nt_contiguous): d[g] = (c[g] +) a_g^T b_g;
    ks int64 [G] (or grouped_layout; with use_psum_layout the end rows), read on the host.
    hints: only the layouts are used (the modes come from recipe, as the plain function)."""
    f = _G.k_grouped_fp8_gemm_nt_contiguous if nt else _G.k_grouped_fp8_gemm_tn_contiguous
    f(_pair(a_data, a_scale, a_fmt), _pair(b_data, b_scale, b_fmt), d, ks, grouped_layout,
      d if c_is_d else c, tuple(int(v) for v in recipe) if len(recipe) else (1, 1, 128),
      mode=int(gemm_mode), bias=bias, use_psum_layout=bool(use_psum_layout),
      alignment=None if alignment < 0 else int(alignment),
      layout=_hint_kw(recipe, hints, modes=False)["layout"])


@k_grouped_fp8_gemm_tn_contiguous.register_fake
def _(a_data, a_scale, b_data, b_scale, d, ks, grouped_layout, c, c_is_d, bias, a_fmt, b_fmt,
      recipe, hints, gemm_mode, use_psum_layout=False, alignment=-1, nt=False):
    return None


# ============================================================================= mask / FP8 permute


def _map_routing(vmap):
    r = MoeRouting()
    r.routing_map = vmap.ptr
    r.num_experts = int(vmap.shape[-1])
    return r


def _permute_call(vx, vsc, r, rows, k, num_experts, num_out_tokens, align, out_dtype):
    """xte_moe_permute into new buffers: (output [rows, H], output_scales [rows, S] or None,
    row_map int32 [T, k], tokens_per_expert int64 [E], expert_offsets int64 [E + 1])."""
    T, H = vx.shape
    out = empty(vx, (rows, H), out_dtype)
    osc = empty(vsc, (rows, vsc.shape[-1]), vsc.dtype) if vsc is not None else None
    row_map = empty(vx, (T, k), DType.INT32)
    tpe = empty(vx, (num_experts,), DType.INT64)
    offs = empty(vx, (num_experts + 1,), DType.INT64)
    vo, vr = view(_as(out, vx.dtype), "output", writable=True), view(row_map, "row_map",
                                                                       writable=True)
    vos = view(osc, "output_scales", writable=True) if osc is not None else None
    vt, vf = (view(tpe, "tokens_per_expert", writable=True),
              view(offs, "expert_offsets", writable=True))
    extra = PermuteOutputs()
    extra.tokens_per_expert = vt.t
    extra.expert_offsets = vf.t
    cfg = PermuteConfig(num_out_tokens=num_out_tokens, align=align)
    call("xte_moe_permute", vx.ptr, vsc.ptr if vsc is not None else None, ctypes.byref(r),
         ctypes.byref(cfg), vo.ptr, vos.ptr if vos is not None else None, vr.ptr,
         ctypes.byref(extra), stream_of(vx, vsc, vo, vos, vr))
    return out, osc, row_map, tpe, offs


@torch.library.custom_op("xte::moe_permute_mask", mutates_args=(), device_types=_DEV)
def moe_permute_mask(x: Tensor, routing_map: Tensor, topk: int, num_out_tokens: int, align: int,
                     rows: int = -1) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """xte_moe_permute with a byte routing map [T, E] (TE's map_type 'mask'): as xte::moe_permute
    (output [C, H], C = permute_capacity(T, topk, E, num_out_tokens, align) or rows >= 0;
    row_map int32 [T, topk]: topk = the most experts a token may have; tokens_per_expert;
    expert_offsets)."""
    vx = view(x, "x", (DType.FP32, DType.BF16, DType.FP16))
    vm = view(routing_map, "routing_map", (DType.UINT8,))
    T, E = vm.shape
    n = _rows_or_capacity(rows, vx.shape[0], topk, E, num_out_tokens, align)
    out, _, rm, tpe, offs = _permute_call(vx, None, _map_routing(vm), n, topk, E, num_out_tokens,
                                          align, vx.dtype)
    return out, rm, tpe, offs


@moe_permute_mask.register_fake
def _(x, routing_map, topk, num_out_tokens, align, rows=-1):
    T, H = x.shape
    E = routing_map.shape[-1]
    n = _rows_or_capacity(rows, T, topk, E, num_out_tokens, align)
    return (x.new_empty((n, H)), x.new_empty((T, topk), dtype=torch.int32),
            x.new_empty((E,), dtype=torch.int64), x.new_empty((E + 1,), dtype=torch.int64))


@torch.library.custom_op("xte::moe_permute_mask_backward", mutates_args=(), device_types=_DEV)
def moe_permute_mask_backward(grad_output: Tensor, routing_map: Tensor,
                              row_map: Tensor) -> Tensor:
    """grad_input [T, H] of moe_permute_mask (xte_moe_permute_backward with the byte map)."""
    vg = view(grad_output, "grad_output", _FLOAT_IN)
    vm = view(routing_map, "routing_map", (DType.UINT8,))
    vr = view(row_map, "row_map", (DType.INT32,))
    gi = empty(vg, (vm.shape[0], vg.shape[-1]), vg.dtype)
    vo = view(gi, "grad_input", writable=True)
    call("xte_moe_permute_backward", vg.ptr, ctypes.byref(_map_routing(vm)), vr.ptr, vo.ptr,
         stream_of(vg, vm, vr, vo))
    return gi


@moe_permute_mask_backward.register_fake
def _(grad_output, routing_map, row_map):
    return grad_output.new_empty((routing_map.shape[0], grad_output.shape[-1]))


def _permute_mask_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1], output[1])
    ctx.set_materialize_grads(True)


def _permute_mask_bwd(ctx, gout, grow, gtpe, goffs):
    routing_map, row_map = ctx.saved_tensors
    return (torch.ops.xte.moe_permute_mask_backward(gout.contiguous(), routing_map, row_map),
            None, None, None, None, None)


moe_permute_mask.register_autograd(_permute_mask_bwd, setup_context=_permute_mask_setup)


@torch.library.custom_op("xte::moe_unpermute_mask", mutates_args=(), device_types=_DEV)
def moe_unpermute_mask(x: Tensor, routing_map: Tensor, row_map: Tensor,
                       probs: Optional[Tensor]) -> Tensor:
    """out [T, H] = sum over t's slots (ascending expert) of probs[t, e] * x[row_map[t, j]]
    (xte_moe_unpermute with the byte map; probs fp32 [T, E], the router's probs; None: 1)."""
    vx = view(x, "x", _FLOAT_IN)
    vm = view(routing_map, "routing_map", (DType.UINT8,))
    vr = view(row_map, "row_map", (DType.INT32,))
    vp = view(probs, "probs", (DType.FP32,)) if probs is not None else None
    out = empty(vx, (vm.shape[0], vx.shape[-1]), vx.dtype)
    vo = view(out, "out", writable=True)
    call("xte_moe_unpermute", vx.ptr, ctypes.byref(_map_routing(vm)), vr.ptr,
         vp.ptr if vp is not None else None, vo.ptr, stream_of(vx, vm, vr, vp, vo))
    return out


@moe_unpermute_mask.register_fake
def _(x, routing_map, row_map, probs):
    return x.new_empty((routing_map.shape[0], x.shape[-1]))


@torch.library.custom_op("xte::moe_unpermute_mask_backward", mutates_args=(), device_types=_DEV)
def moe_unpermute_mask_backward(grad_out: Tensor, x: Tensor, routing_map: Tensor,
                                row_map: Tensor, probs: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """(grad_x [rows, H], grad_probs fp32 [T, E]; zeros when probs is None)."""
    vg = view(grad_out, "grad_out", _FLOAT_IN)
    vx = view(x, "x", _FLOAT_IN)
    vm = view(routing_map, "routing_map", (DType.UINT8,))
    vr = view(row_map, "row_map", (DType.INT32,))
    vp = view(probs, "probs", (DType.FP32,)) if probs is not None else None
    gx = empty(vg, (vx.shape[0], vg.shape[-1]), vg.dtype)
    gp = zeros(vg, vm.shape, DType.FP32)
    vgx = view(gx, "grad_input", writable=True)
    vgp = view(gp, "grad_probs", writable=True) if probs is not None else None
    call("xte_moe_unpermute_backward", vg.ptr, vx.ptr, ctypes.byref(_map_routing(vm)), vr.ptr,
         vp.ptr if vp is not None else None, vgx.ptr, vgp.ptr if vgp is not None else None,
         stream_of(vg, vx, vm, vr, vp, vgx))
    return gx, gp


@moe_unpermute_mask_backward.register_fake
def _(grad_out, x, routing_map, row_map, probs):
    return (grad_out.new_empty((x.shape[0], grad_out.shape[-1])),
            grad_out.new_empty(tuple(routing_map.shape), dtype=torch.float32))


def _unpermute_mask_setup(ctx, inputs, output):
    x, routing_map, row_map, probs = inputs
    ctx.has_probs = probs is not None
    ctx.save_for_backward(x, routing_map, row_map, probs if probs is not None else x)


def _unpermute_mask_bwd(ctx, gout):
    x, routing_map, row_map, probs = ctx.saved_tensors
    gx, gp = torch.ops.xte.moe_unpermute_mask_backward(
        gout.contiguous(), x, routing_map, row_map, probs if ctx.has_probs else None)
    return gx, None, None, (gp if ctx.has_probs else None)


moe_unpermute_mask.register_autograd(_unpermute_mask_bwd, setup_context=_unpermute_mask_setup)


@torch.library.custom_op("xte::moe_permute_fp8", mutates_args=(), device_types=_DEV)
def moe_permute_fp8(x: Tensor, scales: Tensor, routing_map: Optional[Tensor],
                    topk_idx: Optional[Tensor], num_experts: int, topk: int, fmt: int,
                    num_out_tokens: int, align: int,
                    rows: int = -1) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """xte_moe_permute of FP8 rows with their scales: x uint8 [T, H] (fmt's codes), scales fp32
    or E8M0 bytes (uint8) [T, S] (row-major, e.g. COMPACT 1x128 / 1x32) moved bit for bit with
    their rows. Routing: routing_map (byte [T, E], topk = the row map's columns) or topk_idx
    ([T, k], num_experts). Returns (output uint8 [C, H], output_scales [C, S] in the scales'
    dtype, row_map int32 [T, k], tokens_per_expert int64 [E], expert_offsets int64 [E + 1]);
    C as xte::moe_permute's. Not differentiable (FP8 codes)."""
    vx = view(_as(x, fmt), "x", (DType.E4M3, DType.E5M2))
    vsc = view(_as(scales, DType.E8M0) if scales.dtype == torch.uint8 else scales, "scales",
               (DType.FP32, DType.E8M0))
    if (routing_map is None) == (topk_idx is None):
        raise XteValueError(Status.INVALID_ARGUMENT, "routing_map / topk_idx: give exactly one")
    if routing_map is not None:
        vm = view(routing_map, "routing_map", (DType.UINT8,))
        r, E, k = _map_routing(vm), vm.shape[-1], int(topk)
    else:
        vm = view(topk_idx, "topk_idx", (DType.INT32, DType.INT64))
        r, E, k = _routing(vm, num_experts), int(num_experts), vm.shape[-1]
    n = _rows_or_capacity(rows, vx.shape[0], k, E, num_out_tokens, align)
    out, osc, rm, tpe, offs = _permute_call(vx, vsc, r, n, k, E, num_out_tokens, align,
                                            DType.UINT8)
    return out, (osc.view(torch.uint8) if scales.dtype == torch.uint8 else osc), rm, tpe, offs


@moe_permute_fp8.register_fake
def _(x, scales, routing_map, topk_idx, num_experts, topk, fmt, num_out_tokens, align, rows=-1):
    T, H = x.shape
    if routing_map is not None:
        E, k = routing_map.shape[-1], topk
    else:
        E, k = num_experts, topk_idx.shape[-1]
    n = _rows_or_capacity(rows, T, k, E, num_out_tokens, align)
    return (x.new_empty((n, H)), scales.new_empty((n, scales.shape[-1])),
            x.new_empty((T, k), dtype=torch.int32), x.new_empty((E,), dtype=torch.int64),
            x.new_empty((E + 1,), dtype=torch.int64))


# ============================================================================= router, TE's form


@torch.library.custom_op("xte::router_probs", mutates_args=(), device_types=_DEV)
def router_probs(logits: Tensor, expert_bias: Optional[Tensor], topk: int, score_function: int,
                 use_pre_softmax: bool, num_groups: int, group_topk: int,
                 scaling_factor: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """xte_router_forward in TE's form: (probs fp32 [T, E], routing_map uint8 [T, E],
    routing_bits uint8 [T, ceil(E/8)] (bit e % 8 of byte e / 8, LSB first), saved fp32 [T, E]);
    autograd from probs to the logits."""
    vl = view(logits, "logits", _ACT)
    vb = view(expert_bias, "expert_bias", (DType.FP32,)) if expert_bias is not None else None
    T, E = _prod(vl.shape[:-1]), vl.shape[-1]
    probs = empty(vl, (T, E), DType.FP32)
    rmap = empty(vl, (T, E), DType.UINT8)
    bits = empty(vl, (T, (E + 7) // 8), DType.UINT8)
    saved = empty(vl, (T, E), DType.FP32)
    vp, vr, vbits, vs = (view(probs, "probs", writable=True),
                         view(rmap, "routing_map", writable=True),
                         view(bits, "routing_bits", writable=True),
                         view(saved, "saved", writable=True))
    out = RouterOutputs()
    out.probs = vp.t
    out.routing_map = vr.t
    out.routing_bits = vbits.t
    out.saved = vs.t
    cfg = _router_cfg(topk, score_function, use_pre_softmax, num_groups, group_topk,
                      scaling_factor)
    call("xte_router_forward", vl.ptr, vb.ptr if vb is not None else None, ctypes.byref(cfg),
         ctypes.byref(out), stream_of(vl, vb, vp, vr, vbits, vs))
    return probs, rmap, bits, saved


@router_probs.register_fake
def _(logits, expert_bias, topk, score_function, use_pre_softmax, num_groups, group_topk,
      scaling_factor):
    T, E = _prod(logits.shape[:-1]), logits.shape[-1]
    return (logits.new_empty((T, E), dtype=torch.float32),
            logits.new_empty((T, E), dtype=torch.uint8),
            logits.new_empty((T, (E + 7) // 8), dtype=torch.uint8),
            logits.new_empty((T, E), dtype=torch.float32))


def _router_probs_setup(ctx, inputs, output):
    logits, _, topk, sf, pre, ng, gt, scale = inputs
    ctx.save_for_backward(output[1], output[3], logits)
    ctx.cfg = (topk, sf, pre, ng, gt, scale)
    ctx.set_materialize_grads(True)


def _router_probs_bwd(ctx, gp, grmap, gbits, gsaved):
    rmap, saved, logits = ctx.saved_tensors
    gl = torch.ops.xte.router_backward(gp.to(torch.float32).contiguous(), rmap, saved, logits,
                                       *ctx.cfg)
    return gl, None, None, None, None, None, None, None


router_probs.register_autograd(_router_probs_bwd, setup_context=_router_probs_setup)


OPS.update({
    "fp8_gemm_nt": fp8_gemm_nt, "fp8_gemm_nn": fp8_gemm_nn, "fp8_gemm_tn": fp8_gemm_tn,
    "fp8_gemm_tt": fp8_gemm_tt,
    "m_grouped_fp8_gemm_nt_contiguous": m_grouped_fp8_gemm_nt_contiguous,
    "m_grouped_fp8_gemm_nt_masked": m_grouped_fp8_gemm_nt_masked,
    "k_grouped_fp8_gemm_tn_contiguous": k_grouped_fp8_gemm_tn_contiguous,
    "moe_permute_mask": moe_permute_mask, "moe_permute_mask_backward": moe_permute_mask_backward,
    "moe_unpermute_mask": moe_unpermute_mask,
    "moe_unpermute_mask_backward": moe_unpermute_mask_backward,
    "moe_permute_fp8": moe_permute_fp8, "router_probs": router_probs,
})


# ============================================================================= TE router
# The ops of xte.transformer_engine.pytorch.router (TE's fused_topk_with_score_function,
# fused_compute_score_for_moe_aux_loss, fused_moe_aux_loss): logits [T, E] fp32 / bf16 (the
# wrappers flatten the leading dimensions and widen fp16 exactly to fp32), outputs at static
# shapes chosen by the flags.


def _te_router_outputs(vl, T, E, topk, want_bits, want_idx):
    """The te_router / te_router_qb outputs: (probs fp32 [T, E], routing_map uint8 [T, E],
    routing_bits uint8 [T, ceil(E/8)] or [T, 0], topk_idx int32 [T, k] or [T, 0], saved fp32
    [T, E]), the RouterOutputs pointing at them and their writable views."""
    probs = empty(vl, (T, E), DType.FP32)
    rmap = empty(vl, (T, E), DType.UINT8)
    bits = empty(vl, (T, (E + 7) // 8 if want_bits else 0), DType.UINT8)
    idx = empty(vl, (T, topk if want_idx else 0), DType.INT32)
    saved = empty(vl, (T, E), DType.FP32)
    out = RouterOutputs()
    views = [view(probs, "probs", writable=True), view(rmap, "routing_map", writable=True),
             view(saved, "saved", writable=True)]
    out.probs, out.routing_map, out.saved = views[0].t, views[1].t, views[2].t
    if want_bits:
        views.append(view(bits, "routing_bits", writable=True))
        out.routing_bits = views[-1].t
    if want_idx:
        views.append(view(idx, "topk_indices", writable=True))
        out.topk_idx = views[-1].t
    return (probs, rmap, bits, idx, saved), out, views


@torch.library.custom_op("xte::te_router", mutates_args=(), device_types=_DEV)
def te_router(logits: Tensor, expert_bias: Optional[Tensor], topk: int, score_function: int,
              use_pre_softmax: bool, num_groups: int, group_topk: int, scaling_factor: float,
              want_bits: bool, want_idx: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """xte_router_forward in TE's form: (probs fp32 [T, E], routing_map uint8 [T, E], routing_bits
    uint8 [T, ceil(E/8)] (want_bits, else [T, 0]), topk_idx int32 [T, k] in rank order
    (want_idx, else [T, 0]), saved fp32 [T, E]); autograd from probs to the logits."""
    vl = view(logits, "logits", _ACT)
    vb = view(expert_bias, "expert_bias", (DType.FP32,)) if expert_bias is not None else None
    T, E = vl.shape[0], vl.shape[-1]
    (probs, rmap, bits, idx, saved), out, views = _te_router_outputs(vl, T, E, topk, want_bits,
                                                                   want_idx)
    cfg = _router_cfg(topk, score_function, use_pre_softmax, num_groups, group_topk,
                      scaling_factor)
    call("xte_router_forward", vl.ptr, vb.ptr if vb is not None else None, ctypes.byref(cfg),
         ctypes.byref(out), stream_of(vl, vb, *views))
    return probs, rmap, bits, idx, saved


@te_router.register_fake
def _(logits, expert_bias, topk, score_function, use_pre_softmax, num_groups, group_topk,
      scaling_factor, want_bits, want_idx):
    T, E = logits.shape[0], logits.shape[-1]
    return (logits.new_empty((T, E), dtype=torch.float32),
            logits.new_empty((T, E), dtype=torch.uint8),
            logits.new_empty((T, (E + 7) // 8 if want_bits else 0), dtype=torch.uint8),
            logits.new_empty((T, topk if want_idx else 0), dtype=torch.int32),
            logits.new_empty((T, E), dtype=torch.float32))


def _te_router_setup(ctx, inputs, output):
    logits, _, topk, sf, pre, ng, gt, scale, _, _ = inputs
    ctx.save_for_backward(output[1], output[4], logits)
    ctx.cfg = (topk, sf, pre, ng, gt, scale)
    ctx.set_materialize_grads(True)


def _te_router_bwd(ctx, gp, grmap, gbits, gidx, gsaved):
    rmap, saved, logits = ctx.saved_tensors
    gl = torch.ops.xte.router_backward(gp.to(torch.float32).contiguous(), rmap, saved, logits,
                                       *ctx.cfg)
    return gl, None, None, None, None, None, None, None, None, None


te_router.register_autograd(_te_router_bwd, setup_context=_te_router_setup)


@torch.library.custom_op("xte::te_router_qb", mutates_args=(), device_types=_DEV)
def te_router_qb(logits: Tensor, expert_bias: Tensor, topk: int, scaling_factor: float,
                 bin_bounds: Tensor, num_bins: int, want_bits: bool,
                 want_idx: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """xte_router_qb_forward (Quantile Balancing): te_router's five outputs (saved: the sigmoid
    scores), cutoff fp32 [T] and the histogram counts of this call, int32 [E, num_bins] (the
    caller adds them to its histogram). bin_bounds: fp32 [lower, upper], read on the host."""
    vl = view(logits, "logits", _ACT)
    vb = view(expert_bias, "expert_bias", (DType.FP32,))
    T, E = vl.shape[0], vl.shape[-1]
    lower, upper = (float(v) for v in bin_bounds.detach().reshape(-1).cpu().tolist())
    (probs, rmap, bits, idx, saved), out, views = _te_router_outputs(vl, T, E, topk, want_bits,
                                                                   want_idx)
    cutoff = empty(vl, (T,), DType.FP32)
    counts = zeros(vl, (E, num_bins), DType.INT32)
    vc, vh = view(cutoff, "cutoff", writable=True), view(counts, "histogram", writable=True)
    call("xte_router_qb_forward", vl.ptr, vb.ptr, int(topk), float(scaling_factor), lower, upper,
         ctypes.byref(out), vc.ptr, vh.ptr, stream_of(vl, vb, vc, vh, *views))
    return probs, rmap, bits, idx, saved, cutoff, counts


@te_router_qb.register_fake
def _(logits, expert_bias, topk, scaling_factor, bin_bounds, num_bins, want_bits, want_idx):
    T, E = logits.shape[0], logits.shape[-1]
    return (logits.new_empty((T, E), dtype=torch.float32),
            logits.new_empty((T, E), dtype=torch.uint8),
            logits.new_empty((T, (E + 7) // 8 if want_bits else 0), dtype=torch.uint8),
            logits.new_empty((T, topk if want_idx else 0), dtype=torch.int32),
            logits.new_empty((T, E), dtype=torch.float32),
            logits.new_empty((T,), dtype=torch.float32),
            logits.new_empty((E, num_bins), dtype=torch.int32))


def _te_router_qb_setup(ctx, inputs, output):
    logits, _, topk, scale = inputs[:4]
    ctx.save_for_backward(output[1], output[4], logits)
    ctx.cfg = (topk, 1, False, 0, 0, scale)  # the sigmoid router's backward over the topk kept
    ctx.set_materialize_grads(True)


def _te_router_qb_bwd(ctx, gp, *_):
    rmap, saved, logits = ctx.saved_tensors
    gl = torch.ops.xte.router_backward(gp.to(torch.float32).contiguous(), rmap, saved, logits,
                                       *ctx.cfg)
    return gl, None, None, None, None, None, None, None


te_router_qb.register_autograd(_te_router_qb_bwd, setup_context=_te_router_qb_setup)


@torch.library.custom_op("xte::te_aux_scores", mutates_args=(), device_types=_DEV)
def te_aux_scores(logits: Tensor, topk: int, score_function: int,
                  want_bits: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """xte_router_aux_scores_ex: (scores fp32 [T, E], routing map: uint8 [T, E] or, want_bits,
    uint8 [T, ceil(E/8)] bits, saved fp32 [T, E]); autograd from scores to the logits."""
    vl = view(logits, "logits", _ACT)
    T, E = vl.shape[0], vl.shape[-1]
    sc = empty(vl, (T, E), DType.FP32)
    rm = empty(vl, (T, (E + 7) // 8 if want_bits else E), DType.UINT8)
    sv = empty(vl, (T, E), DType.FP32)
    vs, vr, vv = (view(sc, "scores", writable=True), view(rm, "routing_map", writable=True),
                  view(sv, "saved", writable=True))
    call("xte_router_aux_scores_ex", vl.ptr, int(topk), int(score_function), vs.ptr,
         None if want_bits else vr.ptr, vr.ptr if want_bits else None, vv.ptr,
         stream_of(vl, vs, vr, vv))
    return sc, rm, sv


@te_aux_scores.register_fake
def _(logits, topk, score_function, want_bits):
    T, E = logits.shape[0], logits.shape[-1]
    return (logits.new_empty((T, E), dtype=torch.float32),
            logits.new_empty((T, (E + 7) // 8 if want_bits else E), dtype=torch.uint8),
            logits.new_empty((T, E), dtype=torch.float32))


def _te_aux_scores_setup(ctx, inputs, output):
    logits, topk, sf, _ = inputs
    ctx.save_for_backward(output[2], logits)
    ctx.cfg = (topk, sf)
    ctx.set_materialize_grads(True)


def _te_aux_scores_bwd(ctx, gs, grm, gsaved):
    saved, logits = ctx.saved_tensors
    gl = torch.ops.xte.router_aux_scores_backward(gs.to(torch.float32).contiguous(), saved,
                                                  logits, *ctx.cfg)
    return gl, None, None, None


te_aux_scores.register_autograd(_te_aux_scores_bwd, setup_context=_te_aux_scores_setup)


def _te_total(total_num_tokens, total_tensor):
    return int(total_tensor.reshape(()).item()) if total_tensor is not None \
        else int(total_num_tokens)


@torch.library.custom_op("xte::te_aux_loss", mutates_args=(), device_types=_DEV)
def te_aux_loss(probs: Tensor, tokens_per_expert: Tensor, total_num_tokens: int,
                total_tensor: Optional[Tensor], num_experts: int, topk: int,
                coeff: float) -> Tensor:
    """xte_moe_aux_loss_forward_ex: a 0-d fp32 tensor. The token count is total_num_tokens, or
    the value of total_tensor (a 1-element integer tensor, read on the host) when given."""
    vp = view(probs, "probs", (DType.FP32,))
    vt = view(tokens_per_expert, "tokens_per_expert",
              (DType.INT32, DType.INT64, DType.FP32, DType.BF16))
    out = empty(vp, (1,), DType.FP32)
    vo = view(out, "aux_loss", writable=True)
    call("xte_moe_aux_loss_forward_ex", vp.ptr, vt.ptr, _te_total(total_num_tokens, total_tensor),
         int(num_experts), int(topk), float(coeff), ctypes.cast(vo.t.data, _F32P),
         stream_of(vp, vt, vo))
    return out.view(())


@te_aux_loss.register_fake
def _(probs, tokens_per_expert, total_num_tokens, total_tensor, num_experts, topk, coeff):
    return probs.new_empty((), dtype=torch.float32)


@torch.library.custom_op("xte::te_aux_loss_backward", mutates_args=(), device_types=_DEV)
def te_aux_loss_backward(grad_aux: Tensor, tokens_per_expert: Tensor, num_rows: int,
                         total_num_tokens: int, total_tensor: Optional[Tensor], num_experts: int,
                         topk: int, coeff: float) -> Tensor:
    """grad_probs fp32 [num_rows, columns] of te_aux_loss (grad_aux read on the host, as the C API
    takes it)."""
    vt = view(tokens_per_expert, "tokens_per_expert",
              (DType.INT32, DType.INT64, DType.FP32, DType.BF16))
    gp = empty(vt, (num_rows, vt.shape[-1]), DType.FP32)
    vg = view(gp, "grad_probs", writable=True)
    call("xte_moe_aux_loss_backward_ex", vt.ptr, _te_total(total_num_tokens, total_tensor),
         int(num_experts), int(topk), float(coeff), float(grad_aux.reshape(()).item()), vg.ptr,
         stream_of(vt, vg))
    return gp


@te_aux_loss_backward.register_fake
def _(grad_aux, tokens_per_expert, num_rows, total_num_tokens, total_tensor, num_experts, topk,
      coeff):
    return tokens_per_expert.new_empty((num_rows, tokens_per_expert.shape[-1]),
                                       dtype=torch.float32)


def _te_aux_loss_setup(ctx, inputs, output):
    probs, tpe, total, total_t, ne, topk, coeff = inputs
    ctx.save_for_backward(tpe, total_t)
    ctx.cfg = (probs.shape[0], total, ne, topk, coeff)


def _te_aux_loss_bwd(ctx, g):
    tpe, total_t = ctx.saved_tensors
    rows, total, ne, topk, coeff = ctx.cfg
    gp = torch.ops.xte.te_aux_loss_backward(g.reshape(()).to(torch.float32), tpe, rows, total,
                                            total_t, ne, topk, coeff)
    return gp, None, None, None, None, None, None


te_aux_loss.register_autograd(_te_aux_loss_bwd, setup_context=_te_aux_loss_setup)


OPS.update({"te_router": te_router, "te_router_qb": te_router_qb, "te_aux_scores": te_aux_scores,
            "te_aux_loss": te_aux_loss})
