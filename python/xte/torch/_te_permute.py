"""TransformerEngine's permutation ops (xte::te_permute_mask, te_unpermute_mask,
te_permute_index, te_unpermute_index, te_sort_chunks and their backwards), called by
xte.transformer_engine.pytorch.permutation: TE's row_id_map tensors over the C permutes."""

import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._lib import DType, MoeRouting, PermuteConfig, PermuteOutputs, Status, XteValueError, call
from .._tensor import empty, ptr, stream_of, view
from ._common import DEV, FLOAT_IN, index_routing


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
    return index_routing(vi, E), vi


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


@torch.library.custom_op("xte::te_permute_mask", mutates_args=(), device_types=DEV)
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
        assert offs is not None and tpe is not None  # written by the C permute when align > 1
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


@torch.library.custom_op("xte::te_permute_mask_backward", mutates_args=(), device_types=DEV)
def te_permute_mask_backward(grad_output: Tensor, grad_probs: Optional[Tensor], row_id_map: Tensor,
                             pad_offsets: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """(grad_input [T, H]: the sum over each token's slots of grad_output[row], fp32, ascending
    expert; grad_probs [T, E] (grad_probs' dtype, 0 where not routed; empty without))."""
    T = row_id_map.shape[0]
    E = (row_id_map.shape[1] - 1) // 2
    vg = view(grad_output, "grad_output", FLOAT_IN)
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


@torch.library.custom_op("xte::te_unpermute_mask", mutates_args=(), device_types=DEV)
def te_unpermute_mask(x: Tensor, row_id_map: Tensor, merging_probs: Optional[Tensor],
                      num_tokens: int, pad_offsets: Optional[Tensor]) -> Tensor:
    """TE's unpermute with a mask row_id_map: out [T, H] (x's dtype) = the sum over each token's
    slots (ascending expert) of merging_probs[t, e] * x[row], fp32 fmaf from +0, rounded once;
    merging_probs [T, E] (any float dtype, read as fp32) or None (weight 1)."""
    E = (row_id_map.shape[1] - 1) // 2
    vx = view(x, "inp", FLOAT_IN)
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


@torch.library.custom_op("xte::te_unpermute_mask_backward", mutates_args=(), device_types=DEV)
def te_unpermute_mask_backward(grad_out: Tensor, x: Tensor, row_id_map: Tensor,
                               merging_probs: Optional[Tensor],
                               pad_offsets: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """(grad_x [rows of x, H]: fp32(w g) at each slot's row, zero elsewhere (padding rows too);
    grad_probs [T, E] in merging_probs' dtype: the fp32 dot of g[t] and x[row] per slot, 0 where
    not routed; empty without merging_probs)."""
    E = (row_id_map.shape[1] - 1) // 2
    vg = view(grad_out, "grad_out", FLOAT_IN)
    vx = view(x, "inp", FLOAT_IN)
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
    assert merging_probs is not None  # gp is computed only with merging_probs
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
    return index_routing(vi, max(k, 1)), vi, idx


@torch.library.custom_op("xte::te_permute_index", mutates_args=(), device_types=DEV)
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
    r = index_routing(vi, max(E, 1))
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


@torch.library.custom_op("xte::te_unpermute_index", mutates_args=(), device_types=DEV)
def te_unpermute_index(x: Tensor, row_id_map: Tensor, probs: Optional[Tensor],
                       num_tokens: int) -> Tensor:
    """TE's unpermute with an index row_id_map [k T]: out [T, H] (x's dtype) = the sum over the
    slots (ascending j) of probs[t, j] * x[row] (fp32 fmaf, one rounding); probs fp32 [T, k] or
    None (weight 1, k = row_id_map's size / num_tokens)."""
    vx = view(x, "inp", FLOAT_IN)
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
                         device_types=DEV)
def te_unpermute_index_backward(grad_out: Tensor, x: Tensor, row_id_map: Tensor,
                                probs: Optional[Tensor], num_tokens: int) -> Tuple[Tensor, Tensor]:
    """(grad_x [rows of x, H] = fp32(w g) at each slot's row, zero elsewhere; grad_probs fp32
    [T, k] = the fp32 dots (empty without probs)). Also the permute's backward (x None: the sum
    of each token's rows) through te_permute_index_backward."""
    vg = view(grad_out, "grad_out", FLOAT_IN)
    vx = view(x, "inp", FLOAT_IN)
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


@torch.library.custom_op("xte::te_permute_index_backward", mutates_args=(), device_types=DEV)
def te_permute_index_backward(grad_output: Tensor, row_id_map: Tensor, num_tokens: int) -> Tensor:
    """grad_input [T, H] = the sum over each token's slots (ascending j) of grad_output[row]
    (fp32, one rounding)."""
    vg = view(grad_output, "grad_output", FLOAT_IN)
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


@torch.library.custom_op("xte::te_sort_chunks", mutates_args=(), device_types=DEV)
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
