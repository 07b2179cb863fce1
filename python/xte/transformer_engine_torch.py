"""transformer_engine_torch (TE's compiled extension module, `tex`) over xte: the DType tags
(xte.transformer_engine.pytorch.constants.DType), the router's enums under their C names
(NVTERoutingMapFormat, NVTEQBHistogramMode) and the raw Quantile Balancing forward binding
(fused_topk_with_score_function_qb_fwd) over the op xte::te_router_qb. TE's other raw kernel
entry points (generic_gemm, quantize, ...) are not provided: xte's are xte.torch / xte.ops."""
import torch

from .transformer_engine.pytorch.constants import DType  # noqa: F401
from .transformer_engine.pytorch.router import QBHistogramMode as NVTEQBHistogramMode
from .transformer_engine.pytorch.router import RoutingMapFormat as NVTERoutingMapFormat

__all__ = ["DType", "NVTERoutingMapFormat", "NVTEQBHistogramMode",
           "fused_topk_with_score_function_qb_fwd"]


def fused_topk_with_score_function_qb_fwd(logits, topk, scaling_factor, expert_bias,
                                          routing_map_format, topk_indices, histogram,
                                          bin_bounds, histogram_mode, bin_bounds_validated=False):
    """TE's raw QB forward binding: the sigmoid top-k of the logits with expert_bias added for the
    selection, the counts of this call added into histogram (int32 [E, num_bins]) in place.
    Returns (probs in the logits' dtype, the routing map (bool bytemap, uint8 bitmap, or
    topk_indices filled in place), raw sigmoid scores, cutoff [T], histogram). histogram_mode and
    bin_bounds_validated change nothing on the CPU (one histogram order, bounds always checked).
    Errors are RuntimeError, as the binding's."""
    del histogram_mode, bin_bounds_validated
    E = logits.shape[-1]
    fmt = int(routing_map_format)
    try:
        probs, rmap, bits, idx, raw, cutoff, counts = torch.ops.xte.te_router_qb(
            logits.reshape(-1, E), expert_bias, int(topk),
            1.0 if scaling_factor is None else float(scaling_factor), bin_bounds,
            int(histogram.shape[1]), fmt == 1 and topk_indices is None, topk_indices is not None)
    except Exception as e:  # noqa: BLE001 -- TE's binding raises RuntimeError for every error
        raise RuntimeError(str(e)) from e
    histogram.add_(counts)
    if topk_indices is not None:
        topk_indices.copy_(idx.reshape(topk_indices.shape))
        out = topk_indices
    elif fmt == 1:
        out = bits
    else:
        out = rmap.view(torch.bool)
    return probs.to(logits.dtype), out, raw, cutoff, histogram
