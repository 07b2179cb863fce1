"""What the xte.torch op families share: the devices the ops register for, the dtype sets their
arguments take, the static shapes of quantize's outputs and of the permutes, the marshalling of
quantized operands into an xte_qtensor, and the C config structs several families fill.

Nothing here registers an op; the family modules (_quantize, _gemm, _moe, _permute, _attention,
_ep, _te_permute, _te_router) do.
"""

import ctypes

import torch

from .. import _lib
from .._lib import (DType, MoeRouting, PermuteConfig, QTensor, Recipe, ScalingMode, Status,
                    XteValueError, call, lib)
from .._qtensor import scale_fields
from .._tensor import stream_of, torch_dtype, view

DEV = ("cpu", "cuda")  # the dispatch keys every op registers
FLOAT_IN = (DType.FP32, DType.BF16, DType.FP16)
ACT = (DType.FP32, DType.BF16)
I64P = ctypes.POINTER(ctypes.c_int64)
F32P = ctypes.POINTER(ctypes.c_float)
I32P = ctypes.POINTER(ctypes.c_int32)

# ----------------------------------------------------------------------------- shape helpers


def prod(shape):
    """The product of the dimensions (1 for ())."""
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


def is_mx(recipe):
    """Whether the recipe's scales are E8M0 (MXFP8)."""
    return int(recipe) in (int(Recipe.MX_TE), int(Recipe.MX_OCP))


def col_transposed(mode, recipe):
    """Whether the columnwise copy is the transpose [K, M] (per-tensor / 1x128 / 128x128 except
    MTFP8) or keeps [M, K] (MTFP8, MXFP8)."""
    return int(mode) != int(ScalingMode.MXFP8_1x32) and int(recipe) != int(Recipe.MTFP8)


def quant_shapes(shape, mode, recipe, layout, rowwise, columnwise):
    """[(shape, xte dtype or None for the fp8 dtype)] of quantize's outputs, in order."""
    M, K = prod(shape[:-1]), shape[-1]
    sdt = DType.E8M0 if is_mx(recipe) else DType.FP32
    out = []
    if rowwise:
        out.append((tuple(shape), None))
        out.append((scale_shape(M, K, mode, recipe, layout, False), sdt))
    if columnwise:
        out.append(((K, M) if col_transposed(mode, recipe) else (M, K), None))
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


def rows_or_capacity(rows, T, k, E, num_out_tokens, align):
    """rows when given (>= 0), else the static worst case permute_capacity(...)."""
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


def as_dtype(t, d):
    """t (uint8 bytes at the op boundary) reinterpreted as xte dtype d (a zero-copy torch view)."""
    td = torch_dtype(d)
    return t if t.dtype == td else t.view(td)


def qtensor(data, scale, cdata, cscale, meta, name):
    """An xte_qtensor over (data, scale_inv, columnwise data, columnwise scale_inv) and meta =
    [scaling_mode, recipe, layout, columnwise_layout, fmt]; fp8 data and E8M0 scales cross the op
    boundary as uint8 bytes (opcheck and autograd cannot compare float8 tensors) and are read as
    fmt / E8M0 here. Returns (struct, views to keep alive)."""
    q = QTensor()
    keep = []
    fmt = int(meta[4]) if len(meta) > 4 else int(DType.E4M3)
    sdt = DType.E8M0 if is_mx(meta[1]) else DType.FP32
    for d, s, dst, sdst, lay, nm in ((data, scale, "rowwise", "rowwise_scale_inv", meta[2], ""),
                                      (cdata, cscale, "columnwise", "columnwise_scale_inv",
                                       meta[3], "columnwise_")):
        if d is None:
            continue
        vd = view(as_dtype(d, fmt), f"{name}.{nm}data")
        setattr(q, dst, vd.t)
        keep.append(vd)
        if s is not None:
            vs, f = scale_fields(as_dtype(s, sdt) if s.dtype == torch.uint8 else s, lay,
                                  f"{name}.{nm}scale_inv", False)
            st = getattr(q, sdst)
            st.data, st.dtype, st.rows, st.cols, st.layout = f
            keep.append(vs)
    q.scaling_mode = int(meta[0])
    q.recipe = int(meta[1])
    return q, keep


def logical_shape(data, cdata, meta):
    """The [rows, cols] of the tensor a qtensor quantized (rank > 2: leading dims collapsed)."""
    if data is not None:
        return prod(data.shape[:-1]), data.shape[-1]
    r, c = prod(cdata.shape[:-1]), cdata.shape[-1]
    return (c, r) if col_transposed(meta[0], meta[1]) else (r, c)


def fptr(t, name, dtype=DType.FP32):
    """(float* or int32_t* to an optional fp32 / int32 tensor, its View to keep alive), or
    (None, None)."""
    if t is None:
        return None, None
    v = view(t, name, (dtype,))
    return ctypes.cast(v.t.data, F32P if dtype == DType.FP32 else I32P), v


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


# ----------------------------------------------------------------------------- C configs


def quant_config(amax_epsilon, force_pow_2, saturate):
    """The xte_quant_config of the quantizing ops (quantize, swiglu_quantize, dswiglu_quantize)."""
    cfg = lib.xte_quant_config_default()
    cfg.amax_epsilon = amax_epsilon
    cfg.force_pow_2 = force_pow_2
    cfg.saturate = int(saturate)
    return cfg


def index_routing(vidx, E):
    """The xte_moe_routing of topk indices (a View of [T, k] int32 / int64; -1 = no expert)."""
    r = MoeRouting()
    r.topk_idx = ctypes.pointer(vidx.t)
    r.num_experts = int(E)
    return r


def map_routing(vmap):
    """The xte_moe_routing of a byte routing map (a View of uint8 [T, E])."""
    r = MoeRouting()
    r.routing_map = vmap.ptr
    r.num_experts = int(vmap.shape[-1])
    return r


def router_config(topk, score_function, use_pre_softmax, num_groups, group_topk, scaling_factor):
    """The xte_router_config of the router ops (their flat arguments)."""
    cfg = lib.xte_router_config_default()
    cfg.topk = topk
    cfg.score_function = score_function
    cfg.use_pre_softmax = int(use_pre_softmax)
    cfg.num_groups = num_groups
    cfg.group_topk = group_topk
    cfg.scaling_factor = scaling_factor
    return cfg
