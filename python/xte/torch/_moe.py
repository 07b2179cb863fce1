"""The MoE family's router and activation custom ops (xte.ops.moe): xte::router (index form)
and xte::router_probs (TE's probs + map form) with xte::router_backward, xte::router_aux_scores,
xte::moe_aux_loss, xte::swiglu / dswiglu and the fused swiglu_quantize / dswiglu_quantize. The
permutes are in _permute, TransformerEngine's own forms in _te_router / _te_permute."""

import ctypes
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .._lib import DType, RouterOutputs, call
from .._tensor import empty, stream_of, torch_dtype, view
from ._common import (ACT, DEV, F32P, prod, qtensor, quant_config, quant_shapes, router_config,
                      split_copies)


# ============================================================================= router



@torch.library.custom_op("xte::router", mutates_args=(), device_types=DEV)
def router(logits: Tensor, expert_bias: Optional[Tensor], topk: int, score_function: int,
           use_pre_softmax: bool, num_groups: int, group_topk: int,
           scaling_factor: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """xte_router_forward (TE's fused_topk_with_score_function): returns topk_weights fp32
    [T, k], topk_idx int64 [T, k], routing_map uint8 [T, E] and saved fp32 [T, E]."""
    vl = view(logits, "logits", ACT)
    vb = view(expert_bias, "expert_bias", (DType.FP32,)) if expert_bias is not None else None
    T, E = prod(vl.shape[:-1]), vl.shape[-1]
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
    cfg = router_config(topk, score_function, use_pre_softmax, num_groups, group_topk,
                      scaling_factor)
    call("xte_router_forward", vl.ptr, vb.ptr if vb is not None else None, ctypes.byref(cfg),
         ctypes.byref(out), stream_of(vl, vb, vw))
    return w, idx, rmap, saved


@router.register_fake
def _(logits, expert_bias, topk, score_function, use_pre_softmax, num_groups, group_topk,
      scaling_factor):
    T, E = prod(logits.shape[:-1]), logits.shape[-1]
    return (logits.new_empty((T, topk), dtype=torch.float32),
            logits.new_empty((T, topk), dtype=torch.int64),
            logits.new_empty((T, E), dtype=torch.uint8),
            logits.new_empty((T, E), dtype=torch.float32))


@torch.library.custom_op("xte::router_backward", mutates_args=(), device_types=DEV)
def router_backward(grad_probs: Tensor, routing_map: Tensor, saved: Tensor, logits: Tensor,
                    topk: int, score_function: int, use_pre_softmax: bool, num_groups: int,
                    group_topk: int, scaling_factor: float) -> Tensor:
    """xte_router_backward: grad_logits [T, E] in the logits' dtype from grad_probs fp32 [T, E]."""
    vg = view(grad_probs, "grad_probs", (DType.FP32,))
    vr = view(routing_map, "routing_map", (DType.UINT8,))
    vs = view(saved, "saved", (DType.FP32,))
    vl = view(logits, "logits", ACT)
    gl = empty(vl, vl.shape, vl.dtype)
    vo = view(gl, "grad_logits", writable=True)
    cfg = router_config(topk, score_function, use_pre_softmax, num_groups, group_topk,
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



# ============================================================================= SwiGLU


@torch.library.custom_op("xte::swiglu", mutates_args=(), device_types=DEV)
def swiglu(x: Tensor) -> Tensor:
    """y [.., F] = silu(x[.., :F]) * x[.., F:] (xte_swiglu), in x's dtype."""
    vx = view(x, "x", ACT)
    out = empty(vx, vx.shape[:-1] + (vx.shape[-1] // 2,), vx.dtype)
    vo = view(out, "out", writable=True)
    call("xte_swiglu", vx.ptr, vo.ptr, stream_of(vx, vo))
    return out


@swiglu.register_fake
def _(x):
    return x.new_empty(tuple(x.shape[:-1]) + (x.shape[-1] // 2,))


@torch.library.custom_op("xte::dswiglu", mutates_args=(), device_types=DEV)
def dswiglu(grad_out: Tensor, x: Tensor) -> Tensor:
    """grad_input [.., 2F] of swiglu (xte_dswiglu), in x's dtype."""
    vg = view(grad_out, "grad_out", ACT)
    vx = view(x, "x", ACT)
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


@torch.library.custom_op("xte::swiglu_quantize", mutates_args=(), device_types=DEV)
def swiglu_quantize(x: Tensor, act_dtype: int, mode: int, recipe: int, layout: int, fmt: int,
                    rowwise: bool, columnwise: bool, amax_epsilon: float, force_pow_2: int,
                    saturate: bool) -> List[Tensor]:
    """xte_swiglu_quantize: quantize(swiglu(x) rounded to act_dtype) in one pass; outputs as
    xte::quantize's for an input of swiglu's output shape."""
    vx = view(x, "x", ACT)
    yshape = vx.shape[:-1] + (vx.shape[-1] // 2,)
    outs = [empty(vx, s, DType.UINT8 if d in (None, DType.E8M0) else d)
            for s, d in quant_shapes(yshape, mode, recipe, layout, rowwise, columnwise)]
    d, s, cd, cs = split_copies(outs, rowwise, columnwise)
    q, keep = qtensor(d, s, cd, cs, (mode, recipe, layout, layout, fmt), "out")
    cfg = quant_config(amax_epsilon, force_pow_2, saturate)
    call("xte_swiglu_quantize", vx.ptr, int(act_dtype), ctypes.byref(q), ctypes.byref(cfg),
         stream_of(vx, *keep))
    return outs


@swiglu_quantize.register_fake
def _(x, act_dtype, mode, recipe, layout, fmt, rowwise, columnwise, amax_epsilon, force_pow_2,
      saturate):
    yshape = tuple(int(s) for s in x.shape[:-1]) + (int(x.shape[-1]) // 2,)
    return [x.new_empty(s, dtype=torch.uint8 if d in (None, DType.E8M0) else torch_dtype(d))
            for s, d in quant_shapes(yshape, mode, recipe, layout, rowwise, columnwise)]



@torch.library.custom_op("xte::dswiglu_quantize", mutates_args=(), device_types=DEV)
def dswiglu_quantize(grad_out: Tensor, x: Tensor, act_dtype: int, mode: int, recipe: int,
                     layout: int, fmt: int, rowwise: bool, columnwise: bool, amax_epsilon: float,
                     force_pow_2: int, saturate: bool) -> List[Tensor]:
    """xte_dswiglu_quantize: quantize(dswiglu(grad_out, x) rounded to act_dtype), outputs as
    xte::quantize's for an input of x's shape."""
    vg = view(grad_out, "grad_out", ACT)
    vx = view(x, "x", ACT)
    outs = [empty(vx, s, DType.UINT8 if d in (None, DType.E8M0) else d)
            for s, d in quant_shapes(vx.shape, mode, recipe, layout, rowwise, columnwise)]
    d, s, cd, cs = split_copies(outs, rowwise, columnwise)
    q, keep = qtensor(d, s, cd, cs, (mode, recipe, layout, layout, fmt), "out")
    cfg = quant_config(amax_epsilon, force_pow_2, saturate)
    call("xte_dswiglu_quantize", vg.ptr, vx.ptr, int(act_dtype), ctypes.byref(q),
         ctypes.byref(cfg), stream_of(vg, vx, *keep))
    return outs


@dswiglu_quantize.register_fake
def _(grad_out, x, act_dtype, mode, recipe, layout, fmt, rowwise, columnwise, amax_epsilon,
      force_pow_2, saturate):
    return [x.new_empty(s, dtype=torch.uint8 if d in (None, DType.E8M0) else torch_dtype(d))
            for s, d in quant_shapes(tuple(int(v) for v in x.shape), mode, recipe, layout,
                                      rowwise, columnwise)]


@torch.library.custom_op("xte::router_aux_scores", mutates_args=(), device_types=DEV)
def router_aux_scores(logits: Tensor, topk: int,
                      score_function: int) -> Tuple[Tensor, Tensor, Tensor]:
    """xte_router_aux_scores (TE's fused_compute_score_for_moe_aux_loss): (scores fp32 [T, E],
    routing_map uint8 [T, E], saved fp32 [T, E])."""
    vl = view(logits, "logits", ACT)
    T, E = prod(vl.shape[:-1]), vl.shape[-1]
    sc, rm, sv = (empty(vl, (T, E), DType.FP32), empty(vl, (T, E), DType.UINT8),
                  empty(vl, (T, E), DType.FP32))
    vs, vr, vv = (view(sc, "scores", writable=True), view(rm, "routing_map", writable=True),
                  view(sv, "saved", writable=True))
    call("xte_router_aux_scores", vl.ptr, int(topk), int(score_function), vs.ptr, vr.ptr, vv.ptr,
         stream_of(vl, vs, vr, vv))
    return sc, rm, sv


@router_aux_scores.register_fake
def _(logits, topk, score_function):
    T, E = prod(logits.shape[:-1]), logits.shape[-1]
    return (logits.new_empty((T, E), dtype=torch.float32),
            logits.new_empty((T, E), dtype=torch.uint8),
            logits.new_empty((T, E), dtype=torch.float32))


@torch.library.custom_op("xte::router_aux_scores_backward", mutates_args=(), device_types=DEV)
def router_aux_scores_backward(grad_scores: Tensor, saved: Tensor, logits: Tensor, topk: int,
                               score_function: int) -> Tensor:
    """grad_logits (logits' dtype) of router_aux_scores."""
    vg = view(grad_scores, "grad_scores", (DType.FP32,))
    vs = view(saved, "saved", (DType.FP32,))
    vl = view(logits, "logits", ACT)
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


@torch.library.custom_op("xte::moe_aux_loss", mutates_args=(), device_types=DEV)
def moe_aux_loss(probs: Tensor, tokens_per_expert: Tensor, total_num_tokens: int, topk: int,
                 coeff: float) -> Tensor:
    """xte_moe_aux_loss_forward (TE's fused_moe_aux_loss): a 0-d fp32 tensor."""
    vp = view(probs, "probs", (DType.FP32,))
    vt = view(tokens_per_expert, "tokens_per_expert", (DType.INT32, DType.INT64))
    out = empty(vp, (1,), DType.FP32)
    vo = view(out, "aux_loss", writable=True)
    call("xte_moe_aux_loss_forward", vp.ptr, vt.ptr, int(total_num_tokens), int(topk),
         float(coeff), ctypes.cast(vo.t.data, F32P), stream_of(vp, vt, vo))
    return out.view(())


@moe_aux_loss.register_fake
def _(probs, tokens_per_expert, total_num_tokens, topk, coeff):
    return probs.new_empty((), dtype=torch.float32)


@torch.library.custom_op("xte::moe_aux_loss_backward", mutates_args=(), device_types=DEV)
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


# ============================================================================= router, TE's form


@torch.library.custom_op("xte::router_probs", mutates_args=(), device_types=DEV)
def router_probs(logits: Tensor, expert_bias: Optional[Tensor], topk: int, score_function: int,
                 use_pre_softmax: bool, num_groups: int, group_topk: int,
                 scaling_factor: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """xte_router_forward in TE's form: (probs fp32 [T, E], routing_map uint8 [T, E],
    routing_bits uint8 [T, ceil(E/8)] (bit e % 8 of byte e / 8, LSB first), saved fp32 [T, E]);
    autograd from probs to the logits."""
    vl = view(logits, "logits", ACT)
    vb = view(expert_bias, "expert_bias", (DType.FP32,)) if expert_bias is not None else None
    T, E = prod(vl.shape[:-1]), vl.shape[-1]
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
    cfg = router_config(topk, score_function, use_pre_softmax, num_groups, group_topk,
                      scaling_factor)
    call("xte_router_forward", vl.ptr, vb.ptr if vb is not None else None, ctypes.byref(cfg),
         ctypes.byref(out), stream_of(vl, vb, vp, vr, vbits, vs))
    return probs, rmap, bits, saved


@router_probs.register_fake
def _(logits, expert_bias, topk, score_function, use_pre_softmax, num_groups, group_topk,
      scaling_factor):
    T, E = prod(logits.shape[:-1]), logits.shape[-1]
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


OPS = {
    "router": router, "router_backward": router_backward, "swiglu": swiglu, "dswiglu": dswiglu,
    "swiglu_quantize": swiglu_quantize, "dswiglu_quantize": dswiglu_quantize,
    "router_aux_scores": router_aux_scores,
    "router_aux_scores_backward": router_aux_scores_backward, "moe_aux_loss": moe_aux_loss,
    "moe_aux_loss_backward": moe_aux_loss_backward, "router_probs": router_probs,
}
