"""The MoE permute custom ops (xte.ops.moe): xte::moe_permute / moe_unpermute (topk index
routing), moe_permute_mask / moe_unpermute_mask (byte routing map, TE's map_type 'mask'),
moe_permute_fp8 (FP8 rows with their scale rows), moe_sort_chunks_by_index, and their backwards.
Output rows are static: permute_capacity(...) or the caller's rows= (see _common)."""

import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._lib import DType, PermuteConfig, PermuteOutputs, Status, XteValueError, call
from .._tensor import empty, stream_of, view, zeros
from ._common import (DEV, FLOAT_IN, as_dtype, index_routing, map_routing,
                      rows_or_capacity)



@torch.library.custom_op("xte::moe_permute", mutates_args=(), device_types=DEV)
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
    rows = rows_or_capacity(rows, T, k, num_experts, num_out_tokens, align)
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
    r = index_routing(vi, num_experts)
    cfg = PermuteConfig(num_out_tokens=num_out_tokens, align=align)
    call("xte_moe_permute", vx.ptr, None, ctypes.byref(r), ctypes.byref(cfg), vo.ptr, None,
         vr.ptr, ctypes.byref(extra), stream_of(vx, vi, vo))
    return out, row_map, tpe, offs


@moe_permute.register_fake
def _(x, topk_idx, num_experts, num_out_tokens, align, rows=-1):
    T, H = x.shape
    k = topk_idx.shape[-1]
    rows = rows_or_capacity(rows, T, k, num_experts, num_out_tokens, align)
    return (x.new_empty((rows, H)), x.new_empty((T, k), dtype=torch.int32),
            x.new_empty((num_experts,), dtype=torch.int64),
            x.new_empty((num_experts + 1,), dtype=torch.int64))


@torch.library.custom_op("xte::moe_permute_backward", mutates_args=(), device_types=DEV)
def moe_permute_backward(grad_output: Tensor, topk_idx: Tensor, row_map: Tensor,
                         num_experts: int) -> Tensor:
    """grad_input [T, H] = the sum over each token's slots of grad_output[row] (ascending)."""
    vg = view(grad_output, "grad_output", FLOAT_IN)
    vi = view(topk_idx, "topk_idx", (DType.INT32, DType.INT64))
    vr = view(row_map, "row_map", (DType.INT32,))
    gi = empty(vg, (vi.shape[0], vg.shape[-1]), vg.dtype)
    vo = view(gi, "grad_input", writable=True)
    r = index_routing(vi, num_experts)
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


@torch.library.custom_op("xte::moe_unpermute", mutates_args=(), device_types=DEV)
def moe_unpermute(x: Tensor, topk_idx: Tensor, row_map: Tensor, probs: Optional[Tensor],
                  num_experts: int) -> Tensor:
    """out [T, H] = sum over the slots of probs[t, j] * x[row_map[t, j]] (fp32 fmaf, ascending j;
    probs None: weight 1), in x's dtype."""
    vx = view(x, "x", FLOAT_IN)
    vi = view(topk_idx, "topk_idx", (DType.INT32, DType.INT64))
    vr = view(row_map, "row_map", (DType.INT32,))
    vp = view(probs, "probs", (DType.FP32,)) if probs is not None else None
    out = empty(vx, (vi.shape[0], vx.shape[-1]), vx.dtype)
    vo = view(out, "out", writable=True)
    r = index_routing(vi, num_experts)
    call("xte_moe_unpermute", vx.ptr, ctypes.byref(r), vr.ptr,
         vp.ptr if vp is not None else None, vo.ptr, stream_of(vx, vi, vr, vp, vo))
    return out


@moe_unpermute.register_fake
def _(x, topk_idx, row_map, probs, num_experts):
    return x.new_empty((topk_idx.shape[0], x.shape[-1]))


@torch.library.custom_op("xte::moe_unpermute_backward", mutates_args=(), device_types=DEV)
def moe_unpermute_backward(grad_out: Tensor, x: Tensor, topk_idx: Tensor, row_map: Tensor,
                           probs: Optional[Tensor], num_experts: int) -> Tuple[Tensor, Tensor]:
    """(grad_x [rows, H] in grad_out's dtype, grad_probs fp32 [T, k]; zeros when probs is None)."""
    vg = view(grad_out, "grad_out", FLOAT_IN)
    vx = view(x, "x", FLOAT_IN)
    vi = view(topk_idx, "topk_idx", (DType.INT32, DType.INT64))
    vr = view(row_map, "row_map", (DType.INT32,))
    vp = view(probs, "probs", (DType.FP32,)) if probs is not None else None
    gx = empty(vg, (vx.shape[0], vg.shape[-1]), vg.dtype)
    gp = zeros(vg, vi.shape, DType.FP32)
    vgx = view(gx, "grad_input", writable=True)
    vgp = view(gp, "grad_probs", writable=True) if probs is not None else None
    r = index_routing(vi, num_experts)
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




@torch.library.custom_op("xte::moe_sort_chunks_by_index", mutates_args=(), device_types=DEV)
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


@torch.library.custom_op("xte::moe_sort_chunks_backward", mutates_args=(), device_types=DEV)
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


# ============================================================================= mask / FP8 permute



def _permute_call(vx, vsc, r, rows, k, num_experts, num_out_tokens, align, out_dtype):
    """xte_moe_permute into new buffers: (output [rows, H], output_scales [rows, S] or None,
    row_map int32 [T, k], tokens_per_expert int64 [E], expert_offsets int64 [E + 1])."""
    T, H = vx.shape
    out = empty(vx, (rows, H), out_dtype)
    osc = empty(vsc, (rows, vsc.shape[-1]), vsc.dtype) if vsc is not None else None
    row_map = empty(vx, (T, k), DType.INT32)
    tpe = empty(vx, (num_experts,), DType.INT64)
    offs = empty(vx, (num_experts + 1,), DType.INT64)
    vo, vr = view(as_dtype(out, vx.dtype), "output", writable=True), view(row_map, "row_map",
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


@torch.library.custom_op("xte::moe_permute_mask", mutates_args=(), device_types=DEV)
def moe_permute_mask(x: Tensor, routing_map: Tensor, topk: int, num_out_tokens: int, align: int,
                     rows: int = -1) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """xte_moe_permute with a byte routing map [T, E] (TE's map_type 'mask'): as xte::moe_permute
    (output [C, H], C = permute_capacity(T, topk, E, num_out_tokens, align) or rows >= 0;
    row_map int32 [T, topk]: topk = the most experts a token may have; tokens_per_expert;
    expert_offsets)."""
    vx = view(x, "x", (DType.FP32, DType.BF16, DType.FP16))
    vm = view(routing_map, "routing_map", (DType.UINT8,))
    T, E = vm.shape
    n = rows_or_capacity(rows, vx.shape[0], topk, E, num_out_tokens, align)
    out, _, rm, tpe, offs = _permute_call(vx, None, map_routing(vm), n, topk, E, num_out_tokens,
                                          align, vx.dtype)
    return out, rm, tpe, offs


@moe_permute_mask.register_fake
def _(x, routing_map, topk, num_out_tokens, align, rows=-1):
    T, H = x.shape
    E = routing_map.shape[-1]
    n = rows_or_capacity(rows, T, topk, E, num_out_tokens, align)
    return (x.new_empty((n, H)), x.new_empty((T, topk), dtype=torch.int32),
            x.new_empty((E,), dtype=torch.int64), x.new_empty((E + 1,), dtype=torch.int64))


@torch.library.custom_op("xte::moe_permute_mask_backward", mutates_args=(), device_types=DEV)
def moe_permute_mask_backward(grad_output: Tensor, routing_map: Tensor,
                              row_map: Tensor) -> Tensor:
    """grad_input [T, H] of moe_permute_mask (xte_moe_permute_backward with the byte map)."""
    vg = view(grad_output, "grad_output", FLOAT_IN)
    vm = view(routing_map, "routing_map", (DType.UINT8,))
    vr = view(row_map, "row_map", (DType.INT32,))
    gi = empty(vg, (vm.shape[0], vg.shape[-1]), vg.dtype)
    vo = view(gi, "grad_input", writable=True)
    call("xte_moe_permute_backward", vg.ptr, ctypes.byref(map_routing(vm)), vr.ptr, vo.ptr,
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


@torch.library.custom_op("xte::moe_unpermute_mask", mutates_args=(), device_types=DEV)
def moe_unpermute_mask(x: Tensor, routing_map: Tensor, row_map: Tensor,
                       probs: Optional[Tensor]) -> Tensor:
    """out [T, H] = sum over t's slots (ascending expert) of probs[t, e] * x[row_map[t, j]]
    (xte_moe_unpermute with the byte map; probs fp32 [T, E], the router's probs; None: 1)."""
    vx = view(x, "x", FLOAT_IN)
    vm = view(routing_map, "routing_map", (DType.UINT8,))
    vr = view(row_map, "row_map", (DType.INT32,))
    vp = view(probs, "probs", (DType.FP32,)) if probs is not None else None
    out = empty(vx, (vm.shape[0], vx.shape[-1]), vx.dtype)
    vo = view(out, "out", writable=True)
    call("xte_moe_unpermute", vx.ptr, ctypes.byref(map_routing(vm)), vr.ptr,
         vp.ptr if vp is not None else None, vo.ptr, stream_of(vx, vm, vr, vp, vo))
    return out


@moe_unpermute_mask.register_fake
def _(x, routing_map, row_map, probs):
    return x.new_empty((routing_map.shape[0], x.shape[-1]))


@torch.library.custom_op("xte::moe_unpermute_mask_backward", mutates_args=(), device_types=DEV)
def moe_unpermute_mask_backward(grad_out: Tensor, x: Tensor, routing_map: Tensor,
                                row_map: Tensor, probs: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """(grad_x [rows, H], grad_probs fp32 [T, E]; zeros when probs is None)."""
    vg = view(grad_out, "grad_out", FLOAT_IN)
    vx = view(x, "x", FLOAT_IN)
    vm = view(routing_map, "routing_map", (DType.UINT8,))
    vr = view(row_map, "row_map", (DType.INT32,))
    vp = view(probs, "probs", (DType.FP32,)) if probs is not None else None
    gx = empty(vg, (vx.shape[0], vg.shape[-1]), vg.dtype)
    gp = zeros(vg, vm.shape, DType.FP32)
    vgx = view(gx, "grad_input", writable=True)
    vgp = view(gp, "grad_probs", writable=True) if probs is not None else None
    call("xte_moe_unpermute_backward", vg.ptr, vx.ptr, ctypes.byref(map_routing(vm)), vr.ptr,
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


@torch.library.custom_op("xte::moe_permute_fp8", mutates_args=(), device_types=DEV)
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
    vx = view(as_dtype(x, fmt), "x", (DType.E4M3, DType.E5M2))
    vsc = view(as_dtype(scales, DType.E8M0) if scales.dtype == torch.uint8 else scales, "scales",
               (DType.FP32, DType.E8M0))
    if (routing_map is None) == (topk_idx is None):
        raise XteValueError(Status.INVALID_ARGUMENT, "routing_map / topk_idx: give exactly one")
    if routing_map is not None:
        vm = view(routing_map, "routing_map", (DType.UINT8,))
        r, E, k = map_routing(vm), vm.shape[-1], int(topk)
    else:
        vm = view(topk_idx, "topk_idx", (DType.INT32, DType.INT64))
        r, E, k = index_routing(vm, num_experts), int(num_experts), vm.shape[-1]
    n = rows_or_capacity(rows, vx.shape[0], k, E, num_out_tokens, align)
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
    n = rows_or_capacity(rows, T, k, E, num_out_tokens, align)
    return (x.new_empty((n, H)), scales.new_empty((n, scales.shape[-1])),
            x.new_empty((T, k), dtype=torch.int32), x.new_empty((E,), dtype=torch.int64),
            x.new_empty((E + 1,), dtype=torch.int64))


OPS = {
    "moe_permute": moe_permute, "moe_permute_backward": moe_permute_backward,
    "moe_unpermute": moe_unpermute, "moe_unpermute_backward": moe_unpermute_backward,
    "moe_sort_chunks_by_index": moe_sort_chunks_by_index,
    "moe_sort_chunks_backward": moe_sort_chunks_backward,
    "moe_permute_mask": moe_permute_mask, "moe_permute_mask_backward": moe_permute_mask_backward,
    "moe_unpermute_mask": moe_unpermute_mask,
    "moe_unpermute_mask_backward": moe_unpermute_mask_backward,
    "moe_permute_fp8": moe_permute_fp8,
}
