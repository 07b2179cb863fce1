"""transformer_engine.pytorch.router over xte.

``from transformer_engine.pytorch.router import ...`` becomes
``from xte.transformer_engine.pytorch.router import ...``; the functions keep TransformerEngine's
signatures, defaults and return types. They are autograd functions (to the logits / probs) built
on the torch.library custom ops xte::te_router, xte::te_aux_scores and xte::te_aux_loss, so
torch.compile(fullgraph=True) traces them.

Differences from TransformerEngine: fp16 logits are widened to fp32 (exactly) before the C call
(its kernels take fp32 and bf16), and the gradient is rounded back to fp16; dense top-k indices
are computed as int32 and copied into the caller's ``topk_indices`` buffer (int16 / int32 /
int64); Quantile Balancing (``qb_*``) counts into a fresh histogram that is then added to the
caller's (both histogram modes give the same counts: no atomics).
"""

import enum
import math
from typing import Optional, Union

import torch

from ...torch import _ops  # noqa: F401  (registers the xte:: custom ops)

__all__ = [
    "RoutingMapFormat",
    "QBHistogramMode",
    "fused_topk_with_score_function",
    "fused_compute_score_for_moe_aux_loss",
    "fused_moe_aux_loss",
]


class RoutingMapFormat(enum.IntEnum):
    """TE's NVTERoutingMapFormat: BYTEMAP bool [..., E]; BITMAP_U8 uint8 [..., ceil(E/8)] with
    bit (e % 8) of byte e / 8 set for a routed expert (LSB first)."""

    BYTEMAP = 0
    BITMAP_U8 = 1


class QBHistogramMode(enum.IntEnum):
    """TE's NVTEQBHistogramMode (Quantile Balancing histogram kernels)."""

    TWO_KERNEL = 0
    FUSED_ATOMIC = 1


_SCORES = {"softmax": 0, "sigmoid": 1, "sqrtsoftplus": 2}
_FORMATS = {"bytemap": 0, "bitmap_u8": 1}
_QB_MODES = {"two_kernel": 0, "fused_atomic": 1}


def _format(routing_map_format: Union[str, RoutingMapFormat, int]) -> int:
    """routing_map_format as 0 (bytemap) or 1 (bitmap_u8): the enum, its int, or its name."""
    if isinstance(routing_map_format, str):
        if routing_map_format in _FORMATS:
            return _FORMATS[routing_map_format]
        raise ValueError("routing_map_format string must be 'bytemap' or 'bitmap_u8' "
                         f"(lowercase); got {routing_map_format!r}")
    if isinstance(routing_map_format, (int, enum.IntEnum)) and \
            not isinstance(routing_map_format, bool):
        if int(routing_map_format) in (0, 1):
            return int(routing_map_format)
        raise ValueError(f"routing_map_format int must be one of [0, 1]; got "
                         f"{routing_map_format!r}")
    raise TypeError("routing_map_format must be an int, a RoutingMapFormat enum, or 'bytemap' / "
                    f"'bitmap_u8'; got {routing_map_format!r}")


def _score(score_function: str) -> int:
    if score_function not in _SCORES:
        raise ValueError(f"score_function {score_function!r}: want 'softmax', 'sigmoid' or "
                         "'sqrtsoftplus'")
    return _SCORES[score_function]


def _logits2d(logits: torch.Tensor):
    """logits [..., E] as [T, E] in a dtype the C kernels take (fp16 widened to fp32)."""
    if logits.dtype == torch.float64:
        raise ValueError("Current TE does not support float64 router type.")
    if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"logits dtype {logits.dtype}: want float32, bfloat16 or float16")
    x = logits.reshape(-1, logits.shape[-1])
    if x.dtype == torch.float16:
        x = x.to(torch.float32)
    if x.shape[0] > 1 and x.shape[1] > 1 and (x.stride(1) != 1 or x.stride(0) < x.shape[1]):
        x = x.contiguous()  # the C API takes rows with unit column stride
    return x


def _check_qb(qb_histogram, qb_bin_bounds, qb_histogram_mode, score_function, expert_bias,
              num_groups, group_topk):
    """TE's argument checks of Quantile Balancing; True when it is asked for."""
    args = (qb_histogram, qb_bin_bounds, qb_histogram_mode)
    if all(a is None for a in args):
        return False
    if any(a is None for a in args):
        raise ValueError(
            "qb_histogram, qb_bin_bounds, and qb_histogram_mode must be provided together")
    if score_function != "sigmoid":
        raise ValueError("Quantile Balancing only supports score_function='sigmoid'")
    if expert_bias is None:
        raise ValueError("Quantile Balancing requires expert_bias")
    if num_groups is not None or group_topk is not None:
        raise ValueError("Quantile Balancing does not support grouped Top-k")
    if isinstance(qb_histogram_mode, str):
        if qb_histogram_mode not in _QB_MODES:
            raise ValueError("qb_histogram_mode must be 'two_kernel' or 'fused_atomic', "
                             f"got {qb_histogram_mode!r}")
    elif int(qb_histogram_mode) not in (0, 1):
        raise ValueError(f"qb_histogram_mode must be 'two_kernel' or 'fused_atomic', got "
                         f"{qb_histogram_mode!r}")
    if not (isinstance(qb_bin_bounds, torch.Tensor) and qb_bin_bounds.dtype == torch.float32
            and tuple(qb_bin_bounds.shape) == (2,)):
        raise ValueError("qb_bin_bounds must be a float32 tensor [lower, upper]")
    lower, upper = (float(v) for v in qb_bin_bounds.detach().cpu().tolist())
    if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
        raise ValueError("QB bin_bounds values must be finite with lower < upper, got "
                         f"[{lower}, {upper}]")
    if not (isinstance(qb_histogram, torch.Tensor) and qb_histogram.dtype == torch.int32
            and qb_histogram.dim() == 2):
        raise ValueError("qb_histogram must be an int32 tensor [num_experts, num_bins]")
    return True


def fused_topk_with_score_function(
    logits: torch.Tensor,
    topk: int,
    use_pre_softmax: bool,
    num_groups: Optional[int],
    group_topk: Optional[int],
    scaling_factor: Optional[float],
    score_function: str,
    expert_bias: Optional[torch.Tensor],
    routing_map_format: Union[str, RoutingMapFormat, int] = RoutingMapFormat.BYTEMAP,
    topk_indices: Optional[torch.Tensor] = None,
    qb_histogram: Optional[torch.Tensor] = None,
    qb_bin_bounds: Optional[torch.Tensor] = None,
    qb_histogram_mode: Optional[str] = None,
):
    """TE's fused top-k router: (probs, routing_map).

    probs: the logits' dtype and shape, scaling_factor * weight at the selected experts, 0
    elsewhere. routing_map: bool [..., E] (BYTEMAP), uint8 [..., ceil(E/8)] (BITMAP_U8), or,
    when topk_indices ([..., topk], int16 / int32 / int64) is given, that tensor filled with the
    selected experts. Differentiable in the logits through probs."""
    fmt = _format(routing_map_format)
    sf = _score(score_function)
    qb = _check_qb(qb_histogram, qb_bin_bounds, qb_histogram_mode, score_function, expert_bias,
                   num_groups, group_topk)
    x = _logits2d(logits)
    lead, E = tuple(logits.shape[:-1]), logits.shape[-1]
    grouped = group_topk is not None and group_topk > 0
    if grouped and num_groups is None:
        raise ValueError("group_topk needs num_groups")
    ng, gt = (int(num_groups or 0), int(group_topk or 0)) if grouped else (0, 0)
    scale = 1.0 if scaling_factor is None else float(scaling_factor)
    bias = None if expert_bias is None else expert_bias.detach().to(torch.float32).reshape(-1)
    if topk_indices is not None:
        if topk_indices.dtype not in (torch.int16, torch.int32, torch.int64):
            raise TypeError(f"topk_indices dtype {topk_indices.dtype}: want int16, int32 or int64")
        if tuple(topk_indices.shape) != lead + (topk,):
            raise ValueError(f"topk_indices has shape {tuple(topk_indices.shape)}: want "
                             f"{lead + (topk,)}")
    want_bits, want_idx = topk_indices is None and fmt == 1, topk_indices is not None
    if qb:
        assert qb_histogram is not None and qb_bin_bounds is not None  # _check_qb: all or none
        if tuple(qb_histogram.shape[:1]) != (E,):
            raise ValueError(f"qb_histogram has shape {tuple(qb_histogram.shape)}: want "
                             f"[{E}, num_bins]")
        probs, rmap, bits, idx, _, _, counts = torch.ops.xte.te_router_qb(
            x, bias, int(topk), scale, qb_bin_bounds, int(qb_histogram.shape[1]), want_bits,
            want_idx)
        with torch.no_grad():
            qb_histogram.add_(counts)
    else:
        probs, rmap, bits, idx, _ = torch.ops.xte.te_router(
            x, bias, int(topk), sf, bool(use_pre_softmax), ng, gt, scale, want_bits, want_idx)
    probs = probs.to(logits.dtype).reshape(logits.shape)
    if topk_indices is not None:
        with torch.no_grad():
            topk_indices.copy_(idx.reshape(topk_indices.shape))
        return probs, topk_indices
    if fmt == 1:
        return probs, bits.reshape(lead + ((E + 7) // 8,))
    return probs, rmap.view(torch.bool).reshape(logits.shape)


def fused_compute_score_for_moe_aux_loss(
    logits: torch.Tensor,
    topk: int,
    score_function: str,
    routing_map_format: Union[str, RoutingMapFormat, int] = RoutingMapFormat.BYTEMAP,
):
    """TE's scores for the aux loss: (routing_map, scores). scores fp32 [..., E] (softmax over
    all E, or sigmoid / sqrtsoftplus normalised over all E), differentiable in the logits;
    routing_map the top-k of the scores, bool [..., E] or uint8 bits [..., ceil(E/8)]."""
    fmt = _format(routing_map_format)
    sf = _score(score_function)
    x = _logits2d(logits)
    lead, E = tuple(logits.shape[:-1]), logits.shape[-1]
    scores, rm, _ = torch.ops.xte.te_aux_scores(x, int(topk), sf, fmt == 1)
    scores = scores.reshape(logits.shape)
    if fmt == 1:
        return rm.reshape(lead + ((E + 7) // 8,)), scores
    return rm.view(torch.bool).reshape(logits.shape), scores


def fused_moe_aux_loss(
    probs: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    total_num_tokens: Union[int, torch.Tensor],
    num_experts: int,
    topk: int,
    coeff: float,
) -> torch.Tensor:
    """TE's aux loss: a 0-d tensor in probs' dtype,
    C * sum_e (sum_t probs[t, e]) * tokens_per_expert[e], C = num_experts * coeff / (topk * N^2),
    N = total_num_tokens (an int, or a 1-element integer tensor). probs [T, columns], columns a
    multiple of num_experts (the sequence-level loss); tokens_per_expert [columns] int32 /
    int64 / fp32 / bf16. Differentiable in probs."""
    if probs.dim() != 2:
        raise ValueError(f"probs must be 2-D [num_tokens, num_cols]; got shape "
                         f"{tuple(probs.shape)}")
    if probs.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"probs dtype {probs.dtype}: want float32, bfloat16 or float16")
    p = probs if probs.dtype == torch.float32 else probs.to(torch.float32)
    if p.stride(-1) != 1 and p.shape[-1] > 1:
        p = p.contiguous()  # the C API takes rows with unit column stride
    tpe = tokens_per_expert.reshape(-1)
    if isinstance(total_num_tokens, torch.Tensor):
        total, total_t = 0, total_num_tokens.reshape(1)
    else:
        total, total_t = int(total_num_tokens), None
    loss = torch.ops.xte.te_aux_loss(p, tpe, total, total_t, int(num_experts), int(topk),
                                     float(coeff))
    return loss.to(probs.dtype)
