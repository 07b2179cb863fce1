"""TransformerEngine's router ops (xte::te_router, te_router_qb, te_aux_scores, te_aux_loss
and te_aux_loss_backward), called by xte.transformer_engine.pytorch.router. Their backwards are
the MoE family's xte::router_backward / router_aux_scores_backward."""

import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._lib import DType, RouterOutputs, call
from .._tensor import empty, stream_of, view, zeros
from ._common import ACT, DEV, F32P, router_config


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


@torch.library.custom_op("xte::te_router", mutates_args=(), device_types=DEV)
def te_router(logits: Tensor, expert_bias: Optional[Tensor], topk: int, score_function: int,
              use_pre_softmax: bool, num_groups: int, group_topk: int, scaling_factor: float,
              want_bits: bool, want_idx: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """xte_router_forward in TE's form: (probs fp32 [T, E], routing_map uint8 [T, E], routing_bits
    uint8 [T, ceil(E/8)] (want_bits, else [T, 0]), topk_idx int32 [T, k] in rank order
    (want_idx, else [T, 0]), saved fp32 [T, E]); autograd from probs to the logits."""
    vl = view(logits, "logits", ACT)
    vb = view(expert_bias, "expert_bias", (DType.FP32,)) if expert_bias is not None else None
    T, E = vl.shape[0], vl.shape[-1]
    (probs, rmap, bits, idx, saved), out, views = _te_router_outputs(vl, T, E, topk, want_bits,
                                                                   want_idx)
    cfg = router_config(topk, score_function, use_pre_softmax, num_groups, group_topk,
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


@torch.library.custom_op("xte::te_router_qb", mutates_args=(), device_types=DEV)
def te_router_qb(logits: Tensor, expert_bias: Tensor, topk: int, scaling_factor: float,
                 bin_bounds: Tensor, num_bins: int, want_bits: bool,
                 want_idx: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """xte_router_qb_forward (Quantile Balancing): te_router's five outputs (saved: the sigmoid
    scores), cutoff fp32 [T] and the histogram counts of this call, int32 [E, num_bins] (the
    caller adds them to its histogram). bin_bounds: fp32 [lower, upper], read on the host."""
    vl = view(logits, "logits", ACT)
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


@torch.library.custom_op("xte::te_aux_scores", mutates_args=(), device_types=DEV)
def te_aux_scores(logits: Tensor, topk: int, score_function: int,
                  want_bits: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """xte_router_aux_scores_ex: (scores fp32 [T, E], routing map: uint8 [T, E] or, want_bits,
    uint8 [T, ceil(E/8)] bits, saved fp32 [T, E]); autograd from scores to the logits."""
    vl = view(logits, "logits", ACT)
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


@torch.library.custom_op("xte::te_aux_loss", mutates_args=(), device_types=DEV)
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
         int(num_experts), int(topk), float(coeff), ctypes.cast(vo.t.data, F32P),
         stream_of(vp, vt, vo))
    return out.view(())


@te_aux_loss.register_fake
def _(probs, tokens_per_expert, total_num_tokens, total_tensor, num_experts, topk, coeff):
    return probs.new_empty((), dtype=torch.float32)


@torch.library.custom_op("xte::te_aux_loss_backward", mutates_args=(), device_types=DEV)
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


OPS = {"te_router": te_router, "te_router_qb": te_router_qb, "te_aux_scores": te_aux_scores,
       "te_aux_loss": te_aux_loss}
