"""MoE operators over include/xte/moe.h, with TransformerEngine's names and argument order.

Router (TE transformer_engine/pytorch/router.py): fused_topk_with_score_function,
fused_compute_score_for_moe_aux_loss, fused_moe_aux_loss, each with a *_backward.
Token movement (TE transformer_engine/pytorch/permutation.py): moe_permute, moe_unpermute,
moe_sort_chunks_by_index (+ _with_probs), moe_permute_backward, moe_unpermute_backward,
moe_sort_chunks_backward; the FP8 permute moves quantized rows with their scales.
DeepEP's get_dispatch_layout: dispatch_layout. SwiGLU: swiglu, dswiglu, swiglu_quantize,
dswiglu_quantize.

Nothing is computed here: every result comes from one C call (docs/numerics.md section 8 is the
numerics contract). Outputs are allocated in the framework and on the device of the first
input (torch in, torch out; NumPy in, NumPy out) unless given (the *_out / out= arguments, written
in place, zero-copy). Differences from TE, forced by the C API: probs and scores are fp32 (TE:
the logits' dtype); the index-form permute needs num_experts; a row_id_map is the C library's
int32 [T, k] map (the output row of each slot), carried in a RowIdMap with the routing it came
from, since the unpermute and the backwards take both.
"""

import copy
import ctypes
import re
import sys
from typing import Any, Optional, Tuple, Union

from .. import _lib
from .._lib import (DType, MoeRouting, PermuteConfig, PermuteOutputs, Recipe,
                    RouterOutputs, RouterScore, ScaleLayout, ScalingMode, Status, XteError,
                    XteShapeError, lib)
from .._qtensor import QuantizedTensor, parse_layout, parse_recipe
from .._lib import parse_enum
from .._tensor import empty, ptr, stream_of, view, view_opt
from .._typing import Array, DTypeLike, EnumLike
from ._common import bad, parse_dtype

__all__ = [
    "RowIdMap",
    "fused_topk_with_score_function", "fused_topk_with_score_function_backward",
    "fused_compute_score_for_moe_aux_loss", "fused_compute_score_for_moe_aux_loss_backward",
    "fused_moe_aux_loss", "fused_moe_aux_loss_backward",
    "moe_permute", "moe_unpermute", "moe_permute_backward", "moe_unpermute_backward",
    "moe_sort_chunks_by_index", "moe_sort_chunks_by_index_with_probs", "moe_sort_chunks_backward",
    "dispatch_layout", "swiglu", "dswiglu", "swiglu_quantize", "dswiglu_quantize",
]

_FLOAT_IN = (DType.FP32, DType.BF16)
_TPE = (DType.INT32, DType.INT64, DType.FP32, DType.BF16)  # aux-loss token counts
_INDEX = (DType.INT32, DType.INT64)
_MAP = (DType.UINT8,)  # bool reads as uint8


# ------------------------------------------------------------------------------- helpers



def _mentions(message, cname):
    """Whether the C message names argument cname (a whole word; 'x->' prefixes as given)."""
    tail = "" if not cname[-1].isalnum() else r"(?![A-Za-z0-9_])"
    return re.search(r"(?<![A-Za-z0-9_])" + re.escape(cname) + tail, message or "") is not None


def _call(fn, aliases, *args):
    """call(), adding the Python names of the C arguments the error message mentions."""
    try:
        _lib.call(fn, *args)
    except XteError as e:
        hints = [f"{c} is {p}" for c, p in aliases.items() if _mentions(e.message, c)]
        if not hints:
            raise
        raise type(e)(e.status, f"{e.message} (Python arguments: {'; '.join(hints)})",
                      fn) from None


_SCORES = {"softmax": RouterScore.SOFTMAX, "sigmoid": RouterScore.SIGMOID,
           "sqrtsoftplus": RouterScore.SQRTSOFTPLUS}


def parse_score(score_function: EnumLike) -> RouterScore:
    """The RouterScore of a score-function name ("softmax", "sigmoid", "sqrtsoftplus") or int."""
    return parse_enum(score_function, _SCORES, RouterScore, "score_function")


def _as_bool(x):
    """A uint8 0/1 array reinterpreted as bool (zero-copy), as TE returns routing maps."""
    if x is None:
        return None
    torch = sys.modules.get("torch")  # never imported here: a torch tensor means it is loaded
    if torch is not None and isinstance(x, torch.Tensor):
        return x.view(torch.bool)
    import numpy as np
    if isinstance(x, np.ndarray):
        return x.view(np.bool_)
    return x


def _out(given, like, shape, dtype, name, dtypes=None):
    """(array, View): the given output (checked writable) or a new one."""
    arr = given if given is not None else empty(like, shape, dtype)
    return arr, view(arr, name, dtypes, writable=True)


def _qconfig(amax_epsilon, force_pow_2, saturate):
    c = lib.xte_quant_config_default()
    c.amax_epsilon = float(amax_epsilon)
    c.force_pow_2 = -1 if force_pow_2 is None else int(bool(force_pow_2))
    c.saturate = int(bool(saturate))
    return c


# ------------------------------------------------------------------------------- router


def _router_config(topk, use_pre_softmax, num_groups, group_topk, scaling_factor,
                   score_function):
    c = lib.xte_router_config_default()
    c.topk = int(topk)
    c.score_function = int(parse_score(score_function))
    c.use_pre_softmax = int(bool(use_pre_softmax))
    c.num_groups = 0 if num_groups is None else int(num_groups)
    c.group_topk = 0 if group_topk is None else int(group_topk)
    c.scaling_factor = 1.0 if scaling_factor is None else float(scaling_factor)
    return c


def fused_topk_with_score_function(logits: Array, topk: int, use_pre_softmax: bool = False,
                                   num_groups: Optional[int] = None,
                                   group_topk: Optional[int] = None,
                                   scaling_factor: Optional[float] = None,
                                   score_function: EnumLike = "softmax",
                                   expert_bias: Optional[Array] = None,
                                   routing_map_format: str = "bytemap",
                                   topk_indices: Optional[Array] = None, *,
                                   return_intermediate: bool = False,
                                   return_topk_weights: bool = False,
                                   probs_out: Optional[Array] = None,
                                   routing_map_out: Optional[Array] = None,
                                   intermediate_out: Optional[Array] = None,
                                   topk_weights_out: Optional[Array] = None):
    """TE's fused router: (probs, routing_map) from logits [T, E] (fp32 / bf16).

    probs: fp32 [T, E], scaling_factor * weight at the selected experts, 0 elsewhere.
    routing_map: bool [T, E] ('bytemap'), uint8 [T, ceil(E/8)] LSB-first ('bitmap_u8'), or, when
    topk_indices (an int32 / int64 [T, topk] buffer) is given, topk_indices filled with the
    selected experts in rank order (the map is then not produced unless routing_map_out is given).
    return_intermediate appends the fp32 [T, E] intermediate the backward takes;
    return_topk_weights appends fp32 [T, topk] (the probs of the selected experts in rank order).
    *_out: caller buffers written in place (routing_map_out: uint8 or bool [T, E])."""
    vl = view(logits, "logits", _FLOAT_IN)
    if len(vl.shape) != 2:
        raise bad("logits", f"shape {vl.shape}: want [T, E]", XteShapeError, Status.SHAPE)
    T, E = vl.shape
    cfg = _router_config(topk, use_pre_softmax, num_groups, group_topk, scaling_factor,
                         score_function)
    vb = view_opt(expert_bias, "expert_bias", (DType.FP32,))
    fmt = routing_map_format
    if hasattr(fmt, "lower"):
        fmt = fmt.lower()
    if fmt not in ("bytemap", "bitmap_u8", 0, 1, None):
        raise bad("routing_map_format", f"{routing_map_format!r}: want 'bytemap' or 'bitmap_u8'")
    bits = fmt in ("bitmap_u8", 1)
    o = RouterOutputs()
    probs, vp = _out(probs_out, vl, (T, E), DType.FP32, "probs_out", (DType.FP32,))
    o.probs = vp.t
    vidx = view_opt(topk_indices, "topk_indices", _INDEX, writable=True)
    rmap = rbits = None
    vm = vbits = None
    if routing_map_out is not None or (vidx is None and not bits):
        rmap, vm = _out(routing_map_out, vl, (T, E), DType.UINT8, "routing_map_out", _MAP)
        o.routing_map = vm.t
    if vidx is None and bits:
        rbits, vbits = _out(None, vl, (T, (E + 7) // 8), DType.UINT8, "routing_map")
        o.routing_bits = vbits.t
    if vidx is not None:
        o.topk_idx = vidx.t
    vw = None
    weights = None
    if return_topk_weights or topk_weights_out is not None:
        weights, vw = _out(topk_weights_out, vl, (T, int(topk)), DType.FP32, "topk_weights_out",
                           (DType.FP32,))
        o.topk_weights = vw.t
    vs = None
    saved = None
    if return_intermediate or intermediate_out is not None:
        saved, vs = _out(intermediate_out, vl, (T, E), DType.FP32, "intermediate_out",
                         (DType.FP32,))
        o.saved = vs.t
    stream = stream_of(vl, vb, vp, vidx, vm, vbits, vw, vs)
    _call("xte_router_forward", {"logits": "logits", "expert_bias": "expert_bias",
                                 "config->": "the router arguments", "out.probs": "probs_out",
                                 "out.topk_idx": "topk_indices"},
          vl.ptr, ptr(vb), ctypes.byref(cfg), ctypes.byref(o), stream)
    if vidx is not None:
        routing = topk_indices
    elif bits:
        routing = rbits
    else:
        routing = rmap if routing_map_out is not None else _as_bool(rmap)
    res: Tuple[Any, ...] = (probs, routing)
    if return_intermediate:
        res += (saved,)
    if return_topk_weights:
        res += (weights,)
    return res


def fused_topk_with_score_function_backward(routing_map: Array, intermediate_output: Array,
                                            grad_probs: Array, topk: int,
                                            use_pre_softmax: bool = False,
                                            scaling_factor: Optional[float] = None,
                                            score_function: EnumLike = "softmax",
                                            logits: Optional[Array] = None, *,
                                            num_groups: Optional[int] = None,
                                            group_topk: Optional[int] = None,
                                            grad_logits: Optional[Array] = None,
                                            dtype: Optional[DTypeLike] = None) -> Array:
    """grad_logits [T, E] from grad_probs (fp32 [T, E]), the forward's byte routing_map and
    intermediate_output (return_intermediate=True). logits is needed for 'sqrtsoftplus' only.
    grad_logits: a buffer (fp32 / bf16), else new in `dtype` (default: logits' dtype, or fp32)."""
    vg = view(grad_probs, "grad_probs", (DType.FP32,))
    vm = view(routing_map, "routing_map", _MAP)
    vs = view(intermediate_output, "intermediate_output", (DType.FP32,))
    vl = view_opt(logits, "logits", _FLOAT_IN)
    cfg = _router_config(topk, use_pre_softmax, num_groups, group_topk, scaling_factor,
                         score_function)
    d = parse_dtype(dtype, "dtype", _FLOAT_IN, vl.dtype if vl is not None else DType.FP32)
    gl, vo = _out(grad_logits, vg, vg.shape, d, "grad_logits", _FLOAT_IN)
    _call("xte_router_backward", {"saved": "intermediate_output"},
          vg.ptr, vm.ptr, vs.ptr, ptr(vl), ctypes.byref(cfg), vo.ptr, stream_of(vg, vm, vs, vl, vo))
    return gl


def fused_compute_score_for_moe_aux_loss(logits: Array, topk: int,
                                         score_function: EnumLike = "softmax",
                                         routing_map_format: str = "bytemap", *,
                                         return_intermediate: bool = False,
                                         scores_out: Optional[Array] = None,
                                         routing_map_out: Optional[Array] = None,
                                         intermediate_out: Optional[Array] = None):
    """TE's scores for the aux loss: (routing_map, scores). scores fp32 [T, E] (softmax over all
    E, or sigmoid / sqrtsoftplus normalised over all E); routing_map bool [T, E] (the top-k of the
    scores; None with routing_map_format=None). return_intermediate appends the fp32 [T, E]
    intermediate the backward takes."""
    vl = view(logits, "logits", _FLOAT_IN)
    if len(vl.shape) != 2:
        raise bad("logits", f"shape {vl.shape}: want [T, E]", XteShapeError, Status.SHAPE)
    T, E = vl.shape
    sf = parse_score(score_function)
    fmt = routing_map_format.lower() if hasattr(routing_map_format, "lower") else routing_map_format
    if fmt not in ("bytemap", "bitmap_u8", 0, 1, None):
        raise bad("routing_map_format", f"{routing_map_format!r}: want 'bytemap', 'bitmap_u8' or "
                  "None")
    bits = fmt in ("bitmap_u8", 1)
    scores, vsc = _out(scores_out, vl, (T, E), DType.FP32, "scores_out", (DType.FP32,))
    saved, vs = _out(intermediate_out, vl, (T, E), DType.FP32, "intermediate_out", (DType.FP32,))
    rmap = vm = None
    if fmt is not None or routing_map_out is not None:
        rmap, vm = _out(routing_map_out, vl, (T, (E + 7) // 8 if bits else E), DType.UINT8,
                        "routing_map_out", (DType.UINT8,) if bits else _MAP)
    _call("xte_router_aux_scores_ex", {"scores": "scores_out", "saved": "intermediate_out",
                                       "routing_map": "routing_map_out",
                                       "routing_bits": "routing_map_out"},
          vl.ptr, int(topk), int(sf), vsc.ptr, None if bits else ptr(vm), ptr(vm) if bits else None,
          vs.ptr, stream_of(vl, vsc, vs, vm))
    if rmap is not None and routing_map_out is None and not bits:
        rmap = _as_bool(rmap)
    res: Tuple[Any, ...] = (rmap, scores)
    if return_intermediate:
        res += (saved,)
    return res


def fused_compute_score_for_moe_aux_loss_backward(intermediate_output: Array, grad_scores: Array,
                                                  topk: int, score_function: EnumLike = "softmax",
                                                  logits: Optional[Array] = None, *,
                                                  grad_logits: Optional[Array] = None,
                                                  dtype: Optional[DTypeLike] = None) -> Array:
    """grad_logits [T, E] from grad_scores (fp32 [T, E]) and the forward's intermediate_output
    (logits for 'sqrtsoftplus' only). dtype as fused_topk_with_score_function_backward."""
    vg = view(grad_scores, "grad_scores", (DType.FP32,))
    vs = view(intermediate_output, "intermediate_output", (DType.FP32,))
    vl = view_opt(logits, "logits", _FLOAT_IN)
    sf = parse_score(score_function)
    d = parse_dtype(dtype, "dtype", _FLOAT_IN, vl.dtype if vl is not None else DType.FP32)
    gl, vo = _out(grad_logits, vg, vg.shape, d, "grad_logits", _FLOAT_IN)
    _call("xte_router_aux_scores_backward", {"saved": "intermediate_output"},
          vg.ptr, vs.ptr, ptr(vl), int(topk), int(sf), vo.ptr, stream_of(vg, vs, vl, vo))
    return gl


def _num_experts_check(num_experts, E, what):
    """num_experts must divide the columns E (E / num_experts sequences: the sequence-level
    aux loss); None means E."""
    if num_experts is not None and (int(num_experts) < 1 or E % int(num_experts)):
        raise bad("num_experts", f"{num_experts} does not divide the {E} columns of {what}",
                  XteShapeError, Status.SHAPE)


def fused_moe_aux_loss(probs: Array, tokens_per_expert: Array, total_num_tokens: int,
                       num_experts: int, topk: int, coeff: float, *,
                       out: Optional[Array] = None) -> Array:
    """TE's aux loss: C * sum_e (sum_t probs[t, e]) * tokens_per_expert[e] with
    C = num_experts * coeff / (topk * total_num_tokens^2). probs fp32 [T, columns], columns a
    multiple of num_experts (the sequence-level loss; None: the columns); tokens_per_expert
    int32 / int64 / fp32 / bf16 [columns]. Returns a 0-d fp32 array (or `out`, a 1-element fp32
    array, written in place)."""
    vp = view(probs, "probs", (DType.FP32,))
    vt = view(tokens_per_expert, "tokens_per_expert", _TPE)
    if len(vp.shape) == 2:
        _num_experts_check(num_experts, vp.shape[1], "probs")
    res = out if out is not None else empty(vp, (1,), DType.FP32)
    vo = view(res, "out", (DType.FP32,), writable=True)
    if vo.shape != (1,):
        raise bad("out", f"shape {vo.shape}: want (1,)", XteShapeError, Status.SHAPE)
    ne = -1 if num_experts is None else int(num_experts)
    _call("xte_moe_aux_loss_forward_ex", {}, vp.ptr, vt.ptr, int(total_num_tokens), ne, int(topk),
          float(coeff), ctypes.cast(vo.t.data, ctypes.POINTER(ctypes.c_float)),
          stream_of(vp, vt, vo))
    return res if out is not None else res.reshape(())


def fused_moe_aux_loss_backward(grad_aux_loss: Any, tokens_per_expert: Array, total_num_tokens: int,
                                num_experts: int, topk: int, coeff: float, num_rows: int, *,
                                out: Optional[Array] = None) -> Array:
    """grad_probs fp32 [num_rows, columns] = fp32(C * tokens_per_expert[e]) * grad_aux_loss
    (a Python float or a one-element array, read on the host); columns: tokens_per_expert's
    length, a multiple of num_experts (None: the columns)."""
    vt = view(tokens_per_expert, "tokens_per_expert", _TPE)
    g = float(grad_aux_loss.reshape(-1)[0]) if hasattr(grad_aux_loss, "reshape") \
        else float(grad_aux_loss)
    cols = vt.shape[-1]
    gp, vo = _out(out, vt, (int(num_rows), cols), DType.FP32, "out", (DType.FP32,))
    if len(vo.shape) == 2:
        _num_experts_check(num_experts, vo.shape[1], "out")
    ne = -1 if num_experts is None else int(num_experts)
    _call("xte_moe_aux_loss_backward_ex", {"grad_probs": "out"}, vt.ptr, int(total_num_tokens), ne,
          int(topk), float(coeff), g, vo.ptr, stream_of(vt, vo))
    return gp


# ------------------------------------------------------------------------------- token movement

_ACT16 = (DType.FP32, DType.BF16, DType.FP16)  # activations of the token movement


class RowIdMap:
    """The row map of a permute with the routing it came from.

    row_map: int32 [T, k], the output row of each slot (-1: none or dropped). routing_map (byte
    [T, E]) or topk_idx (int32 / int64 [T, k]) and num_experts: the routing; num_rows: the
    permuted tensor's rows. Iterating gives nothing special: use .row_map for the array."""

    __slots__ = ("row_map", "routing_map", "topk_idx", "num_experts", "num_rows")

    def __init__(self, row_map, routing_map=None, topk_idx=None, num_experts=None, num_rows=None):
        self.row_map = row_map
        self.routing_map = routing_map
        self.topk_idx = topk_idx
        self.num_experts = num_experts
        self.num_rows = num_rows

    @property
    def shape(self):
        return tuple(self.row_map.shape)

    @property
    def map_type(self):
        return "index" if self.topk_idx is not None else "mask"

    def __repr__(self):
        return (f"RowIdMap(shape={self.shape}, map_type={self.map_type!r}, "
                f"num_experts={self.num_experts}, num_rows={self.num_rows})")


def _routing(routing_map, topk_idx, num_experts, map_name="routing_map", idx_name="routing_map"):
    """(MoeRouting struct, [Views]) for exactly one of a byte map and topk indices."""
    r = MoeRouting()
    if (routing_map is None) == (topk_idx is None):
        raise bad(map_name, "give the routing: a byte routing map (map_type 'mask') or topk "
                  "indices (map_type 'index')")
    if routing_map is not None:
        v = view(routing_map, map_name, _MAP)
        if len(v.shape) != 2:
            raise bad(map_name, f"shape {v.shape}: want [T, E]", XteShapeError, Status.SHAPE)
        _num_experts_check(num_experts, v.shape[1], map_name)
        r.routing_map = v.ptr
        r.num_experts = v.shape[1]
    else:
        v = view(topk_idx, idx_name, _INDEX)
        if num_experts is None:
            raise bad("num_experts", "required with topk indices (map_type 'index')")
        r.topk_idx = v.ptr
        r.num_experts = int(num_experts)
    return r, v


def _from_row_id_map(row_id_map, routing_map, topk_idx, num_experts, map_type):
    """(row_map array, routing_map, topk_idx, num_experts, num_rows) from a RowIdMap or a plain
    int32 row map plus the routing given by keyword."""
    if isinstance(row_id_map, RowIdMap):
        if routing_map is None and topk_idx is None:
            routing_map, topk_idx = row_id_map.routing_map, row_id_map.topk_idx
        if num_experts is None:
            num_experts = row_id_map.num_experts
        if map_type is not None and map_type != row_id_map.map_type:
            raise bad("map_type", f"{map_type!r}, but row_id_map comes from a "
                      f"{row_id_map.map_type!r} permute")
        return row_id_map.row_map, routing_map, topk_idx, num_experts, row_id_map.num_rows
    return row_id_map, routing_map, topk_idx, num_experts, None


def moe_permute(inp: Union[Array, QuantizedTensor], routing_map: Array, num_out_tokens: int = -1,
                max_token_num: int = -1, map_type: str = "mask", *, num_experts: Optional[int] = None, align: int = 1,
                topk: Optional[int] = None, input_scales: Optional[Array] = None,
                out: Optional[Array] = None, output_scales: Optional[Array] = None,
                row_id_map: Any = None, return_extras: bool = False,
                expert_offsets: Optional[Array] = None, tokens_per_expert: Optional[Array] = None,
                row_to_expert: Optional[Array] = None):
    """TE's moe_permute: (output, row_id_map).

    inp [T, H] fp32 / bf16 / fp16 / e4m3 / e5m2, or an xte.QuantizedTensor with rowwise data and
    COMPACT row-major scales (1x128 / 1x32: the scales move with their rows; per-tensor scaling is
    XteUnsupportedError) -> the output is then a QuantizedTensor. A raw fp8 inp with input_scales
    ([T, S] fp32 / e8m0) returns (output, output_scales, row_id_map).
    routing_map: byte / bool [T, E] (map_type 'mask') or topk indices int32 / int64 [T, k]
    (map_type 'index', -1 = none; needs num_experts). Order: expert-major, tokens ascending.
    num_out_tokens >= 0 caps the rows (the output has num_out_tokens rows: static shapes);
    align > 1 pads each expert to a multiple of align with zero rows. Without a cap, or with
    align > 1, the output rows are computed from the routing first (xte_moe_permute_rows).
    max_token_num: TE's workspace hint, unused. topk: the row map's columns for a byte map
    (default E; at least the most experts of a token). return_extras appends a dict with
    expert_offsets int64 [E + 1], tokens_per_expert (int64 [E], unpadded) and row_to_expert
    int32 [rows]; the three keyword buffers are written when given.
    row_id_map (returned): a RowIdMap (.row_map int32 [T, k]); a buffer may be given."""
    del max_token_num
    if map_type not in ("mask", "index"):
        raise bad("map_type", f"{map_type!r}: want 'mask' or 'index'")
    q = inp if isinstance(inp, QuantizedTensor) else None
    if q is not None:
        if q.data is None:
            raise bad("inp.data", "the QuantizedTensor has no rowwise data to permute")
        if q.layout != ScaleLayout.COMPACT or q.scaling_mode not in (
                ScalingMode.BLOCK_1x128, ScalingMode.MXFP8_1x32):
            raise bad("inp.scale_inv", f"{q.scaling_mode.name} scales in layout "
                      f"{q.layout.name}: the permute moves row scales (1x128 or 1x32 "
                      "blocks in the COMPACT layout; a per-tensor scale is not a row scale: "
                      "permute inp.data as raw fp8 rows and keep the scale)",
                      _lib.XteUnsupportedError, Status.UNSUPPORTED)
        if input_scales is not None:
            raise bad("input_scales", "given twice (inp is a QuantizedTensor)")
        input_scales = q.scale_inv
        data = q.data
        dname, sname = "inp.data", "inp.scale_inv"
    else:
        data = inp
        dname, sname = "inp", "input_scales"
    vx = view(data, dname, (DType.FP32, DType.BF16, DType.FP16, DType.E4M3, DType.E5M2))
    if len(vx.shape) != 2:
        raise bad(dname, f"shape {vx.shape}: want [T, H]", XteShapeError, Status.SHAPE)
    T, H = vx.shape
    vsc = view_opt(input_scales, sname, (DType.FP32, DType.E8M0))
    if map_type == "mask":
        rt, vr = _routing(routing_map, None, num_experts)
    else:
        rt, vr = _routing(None, routing_map, num_experts)
    E = rt.num_experts
    cfg = PermuteConfig()
    cfg.num_out_tokens = int(num_out_tokens) if num_out_tokens is not None else -1
    cfg.align = int(align) if align is not None else 1
    stream = stream_of(vx, vr, vsc)
    if out is not None:
        rows = None
    elif cfg.num_out_tokens >= 0 and cfg.align <= 1:
        rows = cfg.num_out_tokens
    else:
        n = ctypes.c_int64(0)
        _call("xte_moe_permute_rows", {"routing->": "routing_map", "config->": "num_out_tokens / "
                                       "align"},
              ctypes.byref(rt), ctypes.byref(cfg), ctypes.byref(n), stream)
        rows = n.value
    if out is None:
        out = empty(vx, (rows, H), vx.dtype)
    vo = view(out, "out", writable=True)
    rows = vo.shape[0]
    vos = None
    if vsc is not None:
        S = vsc.shape[-1] if len(vsc.shape) == 2 else None
        if output_scales is None:
            if S is None:
                raise bad(sname, f"shape {vsc.shape}: want [T, S]", XteShapeError, Status.SHAPE)
            output_scales = empty(vsc, (rows, S), vsc.dtype)
        vos = view(output_scales, "output_scales", writable=True)
    k = vr.shape[1] if map_type == "index" else (int(topk) if topk is not None else E)
    rm, vrm = _out(row_id_map.row_map if isinstance(row_id_map, RowIdMap) else row_id_map,
                   vx, (T, k), DType.INT32, "row_id_map", (DType.INT32,))
    ex = PermuteOutputs()
    extras = {}
    vex = []
    want = return_extras
    for key, given, shape, d in (("expert_offsets", expert_offsets, (E + 1,), DType.INT64),
                                 ("tokens_per_expert", tokens_per_expert, (E,), DType.INT64),
                                 ("row_to_expert", row_to_expert, (rows,), DType.INT32)):
        if given is None and not want:
            continue
        arr, v = _out(given, vx, shape, d, key)
        setattr(ex, key, v.t)
        extras[key] = arr
        vex.append(v)
    _call("xte_moe_permute", {"input_scales": sname, "output_scales": "output_scales",
                              "input": dname, "output": "out", "row_map": "row_id_map",
                              "routing->": "routing_map", "config->": "num_out_tokens / align",
                              "extra.": "the extras"},
          vx.ptr, ptr(vsc), ctypes.byref(rt), ctypes.byref(cfg), vo.ptr, ptr(vos), vrm.ptr,
          ctypes.byref(ex), stream_of(vx, vr, vsc, vo, vos, vrm, *vex))
    rid = RowIdMap(rm, routing_map if map_type == "mask" else None,
                   routing_map if map_type == "index" else None, E, rows)
    res: Tuple[Any, ...]
    if q is not None:
        res_out = QuantizedTensor(out, output_scales if vsc is not None else q.scale_inv,
                                  scaling_mode=q.scaling_mode, recipe=q.recipe, layout=q.layout,
                                  amax=q.amax, scale=q.scale)
        res = (res_out, rid)
    elif vsc is not None:
        res = (out, output_scales, rid)
    else:
        res = (out, rid)
    if return_extras:
        res += (extras,)
    return res


def moe_unpermute(inp: Array, row_id_map: Any, merging_probs: Optional[Array] = None,
                  restore_shape: Any = None, map_type: Optional[str] = None,
                  probs: Optional[Array] = None, *, routing_map: Optional[Array] = None,
                  topk_idx: Optional[Array] = None, num_experts: Optional[int] = None,
                  out: Optional[Array] = None, out_dtype: Optional[DTypeLike] = None) -> Array:
    """TE's moe_unpermute: out[t] = sum over t's slots (ascending) of w * inp[row], fp32 fmaf
    from +0, rounded once. inp [rows, H] fp32 / bf16 / fp16. row_id_map: the RowIdMap of
    moe_permute, or an int32 [T, k] row map with routing_map= (byte [T, E]) or topk_idx= (+
    num_experts=). merging_probs: fp32 [T, E] (byte map) or [T, k] (topk indices); None: weight
    1. restore_shape: (T, H) of the output (default: the row map's T, inp's H). probs: TE's old
    name of merging_probs. out: [T, H] fp32 / bf16 / fp16 buffer; out_dtype: its dtype (default
    inp's)."""
    if probs is not None:
        if merging_probs is not None:
            raise bad("probs", "both merging_probs and probs are given (probs is TE's old name)")
        merging_probs = probs
    rmap, rt_map, rt_idx, E, _ = _from_row_id_map(row_id_map, routing_map, topk_idx, num_experts,
                                                  map_type)
    vx = view(inp, "inp", _ACT16)
    vrm = view(rmap, "row_id_map", (DType.INT32,))
    rt, vr = _routing(rt_map, rt_idx, E, "routing_map", "topk_idx")
    vp = view_opt(merging_probs, "merging_probs", (DType.FP32,))
    if out is None:
        T = vrm.shape[0]
        H = vx.shape[-1]
        shape = tuple(restore_shape) if restore_shape is not None else (T, H)
        d = parse_dtype(out_dtype, "out_dtype", _ACT16, vx.dtype)
        out = empty(vx, shape, d)
    vo = view(out, "out", _ACT16, writable=True)
    _call("xte_moe_unpermute", {"input": "inp", "row_map": "row_id_map", "probs": "merging_probs",
                                "routing->": "routing_map / topk_idx"},
          vx.ptr, ctypes.byref(rt), vrm.ptr, ptr(vp), vo.ptr, stream_of(vx, vrm, vr, vp, vo))
    return out


def moe_permute_backward(grad_output: Array, row_id_map: Any, *,
                         routing_map: Optional[Array] = None, topk_idx: Optional[Array] = None,
                         num_experts: Optional[int] = None, num_tokens: Optional[int] = None,
                         out: Optional[Array] = None) -> Array:
    """Backward of moe_permute: grad_input [T, H] (fp32 / bf16 / fp16), grad_input[t] = the sum of
    grad_output's rows of t's slots (ascending). T: the row map's rows (or num_tokens)."""
    rmap, rt_map, rt_idx, E, _ = _from_row_id_map(row_id_map, routing_map, topk_idx, num_experts,
                                                  None)
    vg = view(grad_output, "grad_output", _ACT16)
    vrm = view(rmap, "row_id_map", (DType.INT32,))
    rt, vr = _routing(rt_map, rt_idx, E, "routing_map", "topk_idx")
    T = int(num_tokens) if num_tokens is not None else vrm.shape[0]
    gi, vo = _out(out, vg, (T, vg.shape[-1]), vg.dtype, "out", _ACT16)
    _call("xte_moe_permute_backward", {"grad_input": "out", "row_map": "row_id_map",
                                       "routing->": "routing_map / topk_idx"},
          vg.ptr, ctypes.byref(rt), vrm.ptr, vo.ptr, stream_of(vg, vrm, vr, vo))
    return gi


def moe_unpermute_backward(grad_output: Array, inp: Array, row_id_map: Any,
                           merging_probs: Optional[Array] = None, *,
                           routing_map: Optional[Array] = None, topk_idx: Optional[Array] = None,
                           num_experts: Optional[int] = None, num_rows: Optional[int] = None,
                           grad_input: Optional[Array] = None, grad_probs: Optional[Array] = None):
    """Backward of moe_unpermute: (grad_input [rows, H], grad_probs or None).
    grad_input[row_map[t, j]] = fp32(w * grad_output[t]) (other rows 0); grad_probs (shape of
    merging_probs, fp32): the dot of grad_output[t] and inp[row] per slot. inp is the forward's
    input (needed for grad_probs; may be None without merging_probs, then the rows come from
    num_rows or the RowIdMap)."""
    rmap, rt_map, rt_idx, E, nrows = _from_row_id_map(row_id_map, routing_map, topk_idx,
                                                      num_experts, None)
    vg = view(grad_output, "grad_output", _ACT16)
    vx = view_opt(inp, "inp", _ACT16)
    vrm = view(rmap, "row_id_map", (DType.INT32,))
    rt, vr = _routing(rt_map, rt_idx, E, "routing_map", "topk_idx")
    vp = view_opt(merging_probs, "merging_probs", (DType.FP32,))
    rows = (int(num_rows) if num_rows is not None else vx.shape[0] if vx is not None else nrows)
    if grad_input is None and rows is None:
        raise bad("num_rows", "the permuted rows are unknown: give inp, num_rows or grad_input")
    gi, vgi = _out(grad_input, vg, (rows, vg.shape[-1]), vg.dtype, "grad_input", _ACT16)
    gp = vgp = None
    if vp is not None:
        gp, vgp = _out(grad_probs, vg, vp.shape, DType.FP32, "grad_probs", (DType.FP32,))
    _call("xte_moe_unpermute_backward", {"grad_out": "grad_output", "input": "inp",
                                         "row_map": "row_id_map", "probs": "merging_probs",
                                         "routing->": "routing_map / topk_idx"},
          vg.ptr, ptr(vx), ctypes.byref(rt), vrm.ptr, ptr(vp), vgi.ptr, ptr(vgp),
          stream_of(vg, vx, vrm, vr, vp, vgi, vgp))
    return gi, gp


def moe_sort_chunks_by_index(inp: Array, split_sizes: Array, sorted_index: Array, *,
                             out: Optional[Array] = None, row_id_map: Any = None,
                             return_row_id_map: bool = False):
    """TE's moe_sort_chunks_by_index: inp [R, H] (any dtype, rows moved as bytes) split into
    chunks of split_sizes (int32 / int64 [n]) rows, concatenated in the order sorted_index.
    return_row_id_map: (output, row_id_map int32 [R], the output row of each input row), which
    moe_sort_chunks_backward takes."""
    vx = view(inp, "inp")
    vs = view(split_sizes, "split_sizes", _INDEX)
    vi = view(sorted_index, "sorted_index", _INDEX)
    res, vo = _out(out, vx, vx.shape, vx.dtype, "out")
    rm = vrm = None
    if return_row_id_map or row_id_map is not None:
        rm, vrm = _out(row_id_map, vx, (vx.shape[0],), DType.INT32, "row_id_map", (DType.INT32,))
    _call("xte_moe_sort_chunks_by_index", {"input": "inp", "output": "out",
                                           "row_map": "row_id_map"},
          vx.ptr, vs.ptr, vi.ptr, vo.ptr, ptr(vrm), stream_of(vx, vs, vi, vo, vrm))
    return (res, rm) if return_row_id_map else res


def moe_sort_chunks_by_index_with_probs(inp: Array, probs: Array, split_sizes: Array,
                                        sorted_index: Array, *, out: Optional[Array] = None,
                                        probs_out: Optional[Array] = None, row_id_map: Any = None,
                                        return_row_id_map: bool = False):
    """TE's moe_sort_chunks_by_index_with_probs: (output, permuted_probs[, row_id_map]); probs
    [R] (or [R, 1]) is moved with its rows. Two C calls (the tokens, then the probs as [R, 1])."""
    res, rm = moe_sort_chunks_by_index(inp, split_sizes, sorted_index, out=out,
                                       row_id_map=row_id_map, return_row_id_map=True)
    vpr = view(probs, "probs")
    p2 = probs.reshape(-1, 1) if len(vpr.shape) == 1 else probs
    if probs_out is None:
        probs_out = empty(vpr, vpr.shape, vpr.dtype)
    vpo = view(probs_out, "probs_out", writable=True)
    po2 = probs_out.reshape(-1, 1) if len(vpo.shape) == 1 else probs_out
    moe_sort_chunks_by_index(p2, split_sizes, sorted_index, out=po2)
    return (res, probs_out, rm) if return_row_id_map else (res, probs_out)


def moe_sort_chunks_backward(grad_output: Array, row_id_map: Any, *,
                             out: Optional[Array] = None) -> Array:
    """Backward of moe_sort_chunks_by_index: grad_input[r] = grad_output[row_id_map[r]]."""
    vg = view(grad_output, "grad_output")
    vrm = view(row_id_map, "row_id_map", (DType.INT32,))
    res, vo = _out(out, vg, vg.shape, vg.dtype, "out")
    _call("xte_moe_sort_chunks_backward", {"row_map": "row_id_map", "grad_input": "out"},
          vg.ptr, vrm.ptr, vo.ptr, stream_of(vg, vrm, vo))
    return res


def dispatch_layout(topk_idx: Array, num_experts: int, num_ranks: int, *,
                    num_tokens_per_rank: Optional[Array] = None,
                    num_tokens_per_expert: Optional[Array] = None,
                    is_token_in_rank: Optional[Array] = None) -> Tuple[Array, Array, Array]:
    """DeepEP's get_dispatch_layout: (num_tokens_per_rank int32 [num_ranks],
    num_tokens_per_expert int32 [E], is_token_in_rank bool [T, num_ranks]) from topk_idx
    (int32 / int64 [T, k], -1: none), experts split contiguously, E / num_ranks per rank.
    The keyword buffers are written in place when given (is_token_in_rank: uint8 or bool)."""
    vi = view(topk_idx, "topk_idx", _INDEX)
    if len(vi.shape) != 2:
        raise bad("topk_idx", f"shape {vi.shape}: want [T, k]", XteShapeError, Status.SHAPE)
    T = vi.shape[0]
    a, va = _out(num_tokens_per_rank, vi, (int(num_ranks),), DType.INT32, "num_tokens_per_rank",
                 (DType.INT32,))
    b, vb = _out(num_tokens_per_expert, vi, (int(num_experts),), DType.INT32,
                 "num_tokens_per_expert", (DType.INT32,))
    c, vc = _out(is_token_in_rank, vi, (T, int(num_ranks)), DType.UINT8, "is_token_in_rank",
                 _MAP)
    _call("xte_moe_dispatch_layout", {"tokens_per_rank": "num_tokens_per_rank",
                                      "tokens_per_expert": "num_tokens_per_expert"},
          vi.ptr, int(num_experts), int(num_ranks), va.ptr, vb.ptr, vc.ptr,
          stream_of(vi, va, vb, vc))
    return a, b, (c if is_token_in_rank is not None else _as_bool(c))


# ------------------------------------------------------------------------------- SwiGLU


def swiglu(inp: Array, *, out: Optional[Array] = None,
           out_dtype: Optional[DTypeLike] = None) -> Array:
    """y [T, F] = silu(inp[:, :F]) * inp[:, F:] for inp [T, 2F] (fp32 / bf16); y in out_dtype
    (fp32 / bf16, default inp's) or out."""
    vx = view(inp, "inp", _FLOAT_IN)
    if len(vx.shape) != 2:
        raise bad("inp", f"shape {vx.shape}: want [T, 2F]", XteShapeError, Status.SHAPE)
    d = parse_dtype(out_dtype, "out_dtype", _FLOAT_IN, vx.dtype)
    y, vo = _out(out, vx, (vx.shape[0], vx.shape[1] // 2), d, "out", _FLOAT_IN)
    _call("xte_swiglu", {"input": "inp"}, vx.ptr, vo.ptr, stream_of(vx, vo))
    return y


def dswiglu(grad_output: Array, inp: Array, *, out: Optional[Array] = None,
            out_dtype: Optional[DTypeLike] = None) -> Array:
    """grad_input [T, 2F] of swiglu from grad_output [T, F] and the forward's inp [T, 2F]."""
    vg = view(grad_output, "grad_output", _FLOAT_IN)
    vx = view(inp, "inp", _FLOAT_IN)
    d = parse_dtype(out_dtype, "out_dtype", _FLOAT_IN, vx.dtype)
    gi, vo = _out(out, vx, vx.shape, d, "out", _FLOAT_IN)
    _call("xte_dswiglu", {"grad_out": "grad_output", "input": "inp", "grad_input": "out"},
          vg.ptr, vx.ptr, vo.ptr, stream_of(vg, vx, vo))
    return gi


_FMT = {"e4m3": DType.E4M3, "float8_e4m3fn": DType.E4M3, "e5m2": DType.E5M2,
        "float8_e5m2": DType.E5M2}


def _alloc_quantized(like, M, K, recipe, layout, fmt, rowwise, columnwise, amax):
    """A QuantizedTensor for 1x128 blocks of an [M, K] result, allocated like View `like`."""
    if not (rowwise or columnwise):
        raise bad("rowwise", "neither rowwise nor columnwise is asked for")
    d = fmt if isinstance(fmt, DType) else _FMT.get(str(fmt).lower())
    if d not in (DType.E4M3, DType.E5M2):
        raise bad("fmt", f"{fmt!r}: want 'e4m3' or 'e5m2'", _lib.XteDTypeError, Status.DTYPE)
    mode = ScalingMode.BLOCK_1x128

    def scale_shape(col):
        r, c = ctypes.c_int64(), ctypes.c_int64()
        _call("xte_quantize_scale_shape", {"layout": "layout", "recipe": "recipe"}, M, K,
              int(mode), int(recipe), int(layout), int(col), ctypes.byref(r), ctypes.byref(c))
        return r.value, c.value

    data = sinv = cdata = csinv = None
    if rowwise:
        data = empty(like, (M, K), d)
        sinv = empty(like, scale_shape(0), DType.FP32)
    if columnwise:
        cshape = (M, K) if recipe == Recipe.MTFP8 else (K, M)
        cdata = empty(like, cshape, d)
        csinv = empty(like, scale_shape(1), DType.FP32)
    return QuantizedTensor(data, sinv, scaling_mode=mode, recipe=recipe, layout=layout,
                           columnwise_data=cdata, columnwise_scale_inv=csinv, amax=amax)


def _swiglu_q(fn, args, aliases, like, M, K, recipe, layout, fmt, rowwise, columnwise, act_dtype,
              amax_epsilon, force_pow_2, saturate, amax, out):
    from .._qtensor import qview
    rec = parse_recipe(recipe)
    lay = parse_layout(layout if layout is not None else "compact")
    ad = parse_dtype(act_dtype, "act_dtype", _FLOAT_IN, DType.FP32)
    given = out
    if out is None:
        out = _alloc_quantized(like, M, K, rec, lay, fmt, rowwise, columnwise, amax)
    elif amax is not None:  # a copy for the call: the caller's out changes only on success
        out = copy.copy(out)
        out.amax = amax
    qs, qv = qview(out, "out", writable=True)
    cfg = _qconfig(amax_epsilon, force_pow_2, saturate)
    _call(fn, aliases, *args, int(ad), ctypes.byref(qs), ctypes.byref(cfg),
          stream_of(like, *qv))
    if given is not None and out is not given:
        given.amax = amax
        return given
    return out


def swiglu_quantize(inp: Array, recipe: Any = "te_block", layout: Any = None,
                    fmt: DTypeLike = "e4m3", rowwise: bool = True, columnwise: bool = False, *,
                    act_dtype: DTypeLike = "float32", amax_epsilon: float = 0.0,
                    force_pow_2: Optional[bool] = None, saturate: bool = True,
                    amax: Optional[Array] = None,
                    out: Optional[QuantizedTensor] = None) -> QuantizedTensor:
    """swiglu(inp) rounded to act_dtype (fp32 / bf16) and quantized in 1x128 blocks, in one
    pass, byte for byte what xte.quantize(swiglu(inp)) gives: an xte.QuantizedTensor [T, F].
    recipe: 'te_block', 'deepgemm', 'deepgemm_ue8m0', 'mtfp8'; layout: 'compact' (default),
    'te_gemm', 'deepgemm'; fmt 'e4m3' / 'e5m2'; rowwise and / or columnwise copies; amax: an
    fp32 [1] buffer receiving max |y|; out: a QuantizedTensor to write in place."""
    vx = view(inp, "inp", _FLOAT_IN)
    if len(vx.shape) != 2:
        raise bad("inp", f"shape {vx.shape}: want [T, 2F]", XteShapeError, Status.SHAPE)
    return _swiglu_q("xte_swiglu_quantize", (vx.ptr,), {"input": "inp"}, vx, vx.shape[0],
                     vx.shape[1] // 2, recipe, layout, fmt, rowwise, columnwise, act_dtype,
                     amax_epsilon, force_pow_2, saturate, amax, out)


def dswiglu_quantize(grad_output: Array, inp: Array, recipe: Any = "te_block", layout: Any = None,
                     fmt: DTypeLike = "e4m3", rowwise: bool = True, columnwise: bool = False, *,
                     act_dtype: DTypeLike = "float32", amax_epsilon: float = 0.0,
                     force_pow_2: Optional[bool] = None, saturate: bool = True,
                     amax: Optional[Array] = None,
                     out: Optional[QuantizedTensor] = None) -> QuantizedTensor:
    """dswiglu(grad_output, inp) [T, 2F] rounded to act_dtype and quantized as swiglu_quantize."""
    vg = view(grad_output, "grad_output", _FLOAT_IN)
    vx = view(inp, "inp", _FLOAT_IN)
    if len(vx.shape) != 2:
        raise bad("inp", f"shape {vx.shape}: want [T, 2F]", XteShapeError, Status.SHAPE)
    return _swiglu_q("xte_dswiglu_quantize", (vg.ptr, vx.ptr),
                     {"grad_out": "grad_output", "input": "inp"}, vx, vx.shape[0], vx.shape[1],
                     recipe, layout, fmt, rowwise, columnwise, act_dtype, amax_epsilon,
                     force_pow_2, saturate, amax, out)
