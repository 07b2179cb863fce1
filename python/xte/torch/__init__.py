"""xte for PyTorch: every operator as a torch.library custom op (namespace "xte").

Importing this package imports torch and registers the ops (torch.ops.xte.*); `import xte` alone
never imports torch. The ops carry fake kernels (shapes from xte's shape queries, so
torch.compile(fullgraph=True) traces through them) and autograd formulas where the C API has a
backward (swiglu, moe_permute, moe_unpermute, router, attention_fwd).

The functions below take the same arguments as the plain xte.* functions where those exist and
return the same bytes; they go through the custom ops (a few microseconds more per call than the
plain functions: use the plain ones outside torch.compile / autograd when the call overhead
matters).

    quantize(x, recipe, block, layout, fmt, rowwise, columnwise, ...) -> xte.QuantizedTensor
    dequantize(q, columnwise=False, dtype=torch.float32)
    gemm(a, b, *, trans_a, trans_b, c, accumulate, bias, mode, out_dtype)
    gemm_grouped(a, b, group_sizes | masked_m, kind, ...)
    router(logits, topk, ...), moe_permute, moe_unpermute, swiglu, dswiglu, swiglu_quantize,
    router_aux_scores, moe_aux_loss, moe_sort_chunks_by_index (autograd),
    attention(q, k, v, ...) (autograd), attention_fwd / attention_bwd
    fp8_gemm_nt / nn / tn / tt, m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked,
    k_grouped_fp8_gemm_tn_contiguous: DeepGEMM's destination-passing GEMMs on (data, scales)
    pairs (mutating ops on d)
    moe_permute_mask / moe_unpermute_mask (TE's byte-map form, autograd), moe_permute_fp8 (FP8
    rows with their scale rows), fused_topk_with_score_function (TE's probs + byte map / bitmap,
    autograd), permute_capacity / permute_rows (static worst case / exact rows of a permute)
The raw ops (torch.ops.xte.<name>, listed in OPS) take the C API's flags and enums as ints and
pass FP8 data / E8M0 scales as uint8 bytes (opcheck and autograd cannot compare float8 tensors);
these wrappers restore the float8 dtypes as zero-copy views.
"""

from typing import Any, List, Optional, Tuple, Union

import torch
from torch import Tensor

from .._lib import (AttnLayout, AttnMask, DType, GemmMode, Recipe, RouterScore, ScaleLayout,
                    ScalingMode, Status, XteDTypeError, XteUnsupportedError, XteValueError)
from .._qtensor import QuantizedTensor, parse_layout, parse_mode, parse_recipe
from .._tensor import dtype_of
from ..ops import gemm as _G
from ..ops.gemm import parse_gemm_mode
from ..ops.moe import parse_score
from . import _attention
from . import _ops  # noqa: F401  (registers the ops)
from ._common import split_copies
from ._ops import OPS, permute_capacity, permute_rows, scale_shape  # noqa: F401
from .._typing import DTypeLike, EnumLike, GemmModeLike, Pair

__all__ = ["quantize", "dequantize", "gemm", "gemm_grouped", "router", "moe_permute",
           "moe_unpermute", "swiglu", "dswiglu", "swiglu_quantize", "attention", "attention_fwd",
           "attention_bwd", "permute_capacity", "qmeta", "from_lists", "OPS", "cast",
           "router_aux_scores", "moe_aux_loss", "moe_sort_chunks_by_index", "dispatch_layout",
           "permute_rows", "moe_permute_mask", "moe_unpermute_mask", "moe_permute_fp8",
           "fused_topk_with_score_function", "fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn",
           "fp8_gemm_tt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked",
           "k_grouped_fp8_gemm_tn_contiguous"]

ops = torch.ops.xte

_FMT = {"e4m3": DType.E4M3, "float8_e4m3fn": DType.E4M3, "e5m2": DType.E5M2,
        "float8_e5m2": DType.E5M2, DType.E4M3: DType.E4M3, DType.E5M2: DType.E5M2}
def _dt(d):
    """xte DType of a torch dtype / name / DType."""
    if isinstance(d, DType):
        return d
    if isinstance(d, str):
        d = getattr(torch, {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}.get(d, d))
    r = dtype_of(d)
    if r is None:
        raise TypeError(f"dtype {d!r} has no xte dtype")
    return r


def _default_mode(r):
    if r in (Recipe.TE_CURRENT, Recipe.TE_DELAYED):
        return ScalingMode.PER_TENSOR
    if r in (Recipe.MX_TE, Recipe.MX_OCP):
        return ScalingMode.MXFP8_1x32
    return ScalingMode.BLOCK_1x128


_TFP8 = {DType.E4M3: torch.float8_e4m3fn, DType.E5M2: torch.float8_e5m2}


def qmeta(q: QuantizedTensor) -> List[int]:
    """[scaling_mode, recipe, layout, columnwise_layout, fmt] of a QuantizedTensor (the ops'
    meta argument)."""
    d = q.data if q.data is not None else q.columnwise_data
    return [int(q.scaling_mode), int(q.recipe), int(q.layout), int(q.columnwise_layout),
            int(dtype_of(d.dtype))]


def _bytes_or(t):
    """fp8 / e8m0 tensors as uint8 views for the ops; others unchanged."""
    if t is None or t.element_size() != 1:
        return t
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def from_lists(outs: List[Tensor], mode: EnumLike, recipe: EnumLike, layout: EnumLike,
               rowwise: bool = True, columnwise: bool = False,
               fmt: DTypeLike = DType.E4M3) -> QuantizedTensor:
    """A QuantizedTensor (fp8 dtypes restored as zero-copy views) from xte::quantize's list."""
    d, s, cd, cs = split_copies(outs, rowwise, columnwise)
    f = _TFP8[DType(int(fmt))]
    mx = int(recipe) in (int(Recipe.MX_TE), int(Recipe.MX_OCP))

    def sc(t):
        return t.view(torch.float8_e8m0fnu) if (t is not None and mx) else t
    return QuantizedTensor(None if d is None else d.view(f), sc(s), scaling_mode=mode,
                           recipe=recipe, layout=layout,
                           columnwise_data=None if cd is None else cd.view(f),
                           columnwise_scale_inv=sc(cs))


def quantize(x: Tensor, recipe: Any = "te_block", block: Optional[EnumLike] = None,
             layout: Any = None, fmt: DTypeLike = "e4m3", rowwise: bool = True,
             columnwise: bool = False, *, amax_epsilon: float = 0.0,
             force_pow_2: Optional[bool] = None, saturate: bool = True,
             scale: Any = None) -> QuantizedTensor:
    """xte.quantize through the custom op xte::quantize; returns a QuantizedTensor."""
    r = parse_recipe(recipe)
    mode = _default_mode(r) if block is None else parse_mode(block)
    lay = ScaleLayout.COMPACT if layout is None else parse_layout(layout)
    fp2 = -1 if force_pow_2 is None else int(force_pow_2)
    if scale is not None and not isinstance(scale, torch.Tensor):
        scale = torch.tensor([float(scale)], dtype=torch.float32)
    f = _FMT[fmt]
    outs = ops.quantize(x, int(mode), int(r), int(lay), int(f), bool(rowwise),
                        bool(columnwise), float(amax_epsilon), fp2, bool(saturate), scale)
    return from_lists(outs, mode, r, lay, rowwise, columnwise, f)


def dequantize(q: QuantizedTensor, columnwise: bool = False,
               dtype: DTypeLike = torch.float32) -> Tensor:
    """xte.dequantize of one copy through xte::dequantize."""
    d, s = (q.columnwise_data, q.columnwise_scale_inv) if columnwise else (q.data, q.scale_inv)
    lay = q.columnwise_layout if columnwise else q.layout
    return ops.dequantize(_bytes_or(d), _bytes_or(s), int(q.scaling_mode), int(q.recipe),
                          int(lay), int(dtype_of(d.dtype)), bool(columnwise), int(_dt(dtype)))


def _qargs(q):
    return (_bytes_or(q.data), _bytes_or(q.scale_inv), _bytes_or(q.columnwise_data),
            _bytes_or(q.columnwise_scale_inv), qmeta(q))


def gemm(a: QuantizedTensor, b: QuantizedTensor, *, trans_a: bool = False, trans_b: bool = True,
         c: Optional[Tensor] = None, accumulate: bool = False, bias: Any = None,
         mode: GemmModeLike = "exact", out_dtype: DTypeLike = torch.bfloat16) -> Tensor:
    """D = op(a) @ op(b) (+ C) (+ bias) through xte::gemm, with xte.gemm's conventions: op(b) =
    b^T when trans_b (the default: b is the weight [N, K], the Linear forward "TN"); a, b
    QuantizedTensors. (The raw op torch.ops.xte.gemm takes the C flags: its trans_b is
    `not trans_b` here.)"""
    m = parse_gemm_mode(mode)
    if c is not None:
        accumulate = True
    return ops.gemm(*_qargs(a), *_qargs(b), c, bias, bool(trans_a), not bool(trans_b),
                    bool(accumulate), int(m), int(_dt(out_dtype)))


_KINDS = {"contiguous": 0, "masked": 1, "k": 2}


def gemm_grouped(a: QuantizedTensor, b: QuantizedTensor, *, group_sizes: Any = None,
                 masked_m: Optional[Tensor] = None, num_groups: Optional[int] = None,
                 kind: EnumLike = "contiguous", alignment: int = 0, trans_a: bool = False,
                 trans_b: bool = True, c: Optional[Tensor] = None, accumulate: bool = False,
                 bias: Any = None, mode: GemmModeLike = "exact",
                 out_dtype: DTypeLike = torch.bfloat16) -> Tensor:
    """xte_gemm_grouped through xte::gemm_grouped, with xte.gemm_grouped's conventions (trans_b
    True: b holds [G, N, K]). group_sizes: int64 tensor / list [G] (rows per group for
    'contiguous', K per group for 'k'); masked_m: int32 [G] for 'masked'."""
    if c is not None:
        accumulate = True
    k = _KINDS[kind] if isinstance(kind, str) else int(kind)
    if isinstance(group_sizes, (list, tuple)):
        group_sizes = torch.tensor(group_sizes, dtype=torch.int64)
    if num_groups is None:
        sizes = group_sizes if group_sizes is not None else masked_m
        if sizes is None:
            raise XteValueError(Status.NULL_POINTER, "group_sizes / masked_m: give one")
        num_groups = sizes.numel()
    m = parse_gemm_mode(mode)
    return ops.gemm_grouped(*_qargs(a), *_qargs(b), c, bias, group_sizes, masked_m,
                            int(num_groups), k, int(alignment), bool(trans_a), not bool(trans_b),
                            bool(accumulate), int(m), int(_dt(out_dtype)))


def router(logits: Tensor, topk: int, score_function: EnumLike = "softmax", *,
           expert_bias: Optional[Tensor] = None, use_pre_softmax: bool = False, num_groups: int = 0,
           group_topk: int = 0, scaling_factor: float = 1.0) -> Tuple[Tensor, Tensor]:
    """The router of TE's fused_topk_with_score_function (same options) through xte::router,
    with autograd to the logits. Unlike TE's function (and xte.fused_topk_with_score_function),
    it returns the index form (topk_weights fp32 [T, k], topk_idx int64 [T, k]), which the
    xte.torch permute ops take: static shapes for torch.compile."""
    sf = parse_score(score_function)
    w, idx, _, _ = ops.router(logits, expert_bias, int(topk), int(sf), bool(use_pre_softmax),
                              int(num_groups or 0), int(group_topk or 0),
                              float(1.0 if scaling_factor is None else scaling_factor))
    return w, idx


def moe_permute(x: Tensor, topk_idx: Tensor, num_experts: int, num_out_tokens: int = -1,
                align: int = 1,
                rows: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(output [permute_capacity(...), H], row_map int32 [T, k], tokens_per_expert int64 [E],
    expert_offsets int64 [E + 1]) through xte::moe_permute (autograd to x). rows: the output's
    row count instead of the static worst case (eager code passes permute_rows(topk_idx=...,
    ...), the rows the routing uses; a static int under torch.compile)."""
    return ops.moe_permute(x, topk_idx, int(num_experts),
                           -1 if num_out_tokens is None else int(num_out_tokens), int(align),
                           -1 if rows is None else int(rows))


def moe_permute_mask(x: Tensor, routing_map: Tensor, num_out_tokens: int = -1, align: int = 1,
                     topk: Optional[int] = None,
                     rows: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """TE's moe_permute with map_type 'mask' through xte::moe_permute_mask (autograd to x):
    routing_map bool / uint8 [T, E]; topk: the row map's columns (the most experts a token may
    have; default E). Returns (output [permute_capacity(T, topk, E, ...) or rows, H], row_map int32
    [T, topk], tokens_per_expert int64 [E], expert_offsets int64 [E + 1])."""
    rm = _bytes_or(routing_map)
    k = int(rm.shape[-1]) if topk is None else int(topk)
    return ops.moe_permute_mask(x, rm, k, -1 if num_out_tokens is None else int(num_out_tokens),
                                int(align), -1 if rows is None else int(rows))


def moe_unpermute_mask(x: Tensor, routing_map: Tensor, row_map: Tensor,
                       probs: Optional[Tensor] = None) -> Tensor:
    """[T, H] = sum over t's routed experts (ascending) of probs[t, e] * x[row] through
    xte::moe_unpermute_mask (autograd to x and probs); probs fp32 [T, E] (the router's probs)."""
    return ops.moe_unpermute_mask(x, _bytes_or(routing_map), row_map, probs)


def moe_permute_fp8(x: Union[QuantizedTensor, Tensor], scales: Optional[Tensor] = None, *,
                    routing_map: Optional[Tensor] = None, topk_idx: Optional[Tensor] = None,
                    num_experts: Optional[int] = None, num_out_tokens: int = -1, align: int = 1,
                    topk: Optional[int] = None, rows: Optional[int] = None):
    """FP8 rows permuted with their scales through xte::moe_permute_fp8 (no autograd).

    x: an xte.QuantizedTensor with rowwise data and COMPACT 1x128 / 1x32 scales, or float8 data
    [T, H] with scales ([T, S] fp32 / e8m0, row-major). (A per-tensor scale is not supported:
    the C permute takes row scales.) Routing: routing_map (bool / uint8 [T, E]; topk: the row
    map's columns, default E) or topk_idx ([T, k], with num_experts). Returns (QuantizedTensor,
    row_map, tokens_per_expert, expert_offsets) for a QuantizedTensor, else (output,
    output_scales, row_map, tokens_per_expert, expert_offsets); rows as moe_permute's."""
    q = x if isinstance(x, QuantizedTensor) else None
    if q is not None:
        if q.data is None:
            raise XteValueError(Status.INVALID_ARGUMENT, "x.data: the QuantizedTensor has no "
                                "rowwise data to permute")
        if scales is not None:
            raise XteValueError(Status.INVALID_ARGUMENT, "scales: given twice (x is a "
                                "QuantizedTensor)")
        if q.layout != ScaleLayout.COMPACT or q.scaling_mode not in (
                ScalingMode.BLOCK_1x128, ScalingMode.MXFP8_1x32):
            raise XteUnsupportedError(
                Status.UNSUPPORTED, f"x.scale_inv: {q.scaling_mode.name} scales in layout "
                f"{q.layout.name}: the permute moves row scales (1x128 or 1x32 blocks in the "
                "COMPACT layout)")
        data, scales = q.data, q.scale_inv
    else:
        data = x
        if scales is None:
            raise XteValueError(Status.NULL_POINTER, "scales: required (the permute moves the "
                                "row scales of fp8 data)")
    fmt = dtype_of(data.dtype)
    if fmt not in (DType.E4M3, DType.E5M2):
        raise XteDTypeError(Status.DTYPE, f"{'x.data' if q is not None else 'x'}: dtype "
                            f"{data.dtype}: want float8_e4m3fn or float8_e5m2")
    rm = _bytes_or(routing_map)
    if rm is not None:
        k = int(rm.shape[-1]) if topk is None else int(topk)
        E = int(rm.shape[-1])
    else:
        if num_experts is None:
            raise XteValueError(Status.INVALID_ARGUMENT, "num_experts: required with topk_idx")
        k, E = 0, int(num_experts)
    out, osc, row_map, tpe, offs = ops.moe_permute_fp8(
        _bytes_or(data), _bytes_or(scales), rm, topk_idx, E, k, int(fmt),
        -1 if num_out_tokens is None else int(num_out_tokens), int(align),
        -1 if rows is None else int(rows))
    out = out.view(data.dtype)
    if osc.dtype != scales.dtype:
        osc = osc.view(scales.dtype)
    if q is not None:
        qo = QuantizedTensor(out, osc, scaling_mode=q.scaling_mode, recipe=q.recipe,
                             layout=q.layout)
        return qo, row_map, tpe, offs
    return out, osc, row_map, tpe, offs


def fused_topk_with_score_function(logits: Tensor, topk: int, use_pre_softmax: bool = False,
                                   num_groups: Optional[int] = None,
                                   group_topk: Optional[int] = None,
                                   scaling_factor: Optional[float] = None,
                                   score_function: EnumLike = "softmax",
                                   expert_bias: Optional[Tensor] = None,
                                   routing_map_format: str = "bytemap") -> Tuple[Tensor, Tensor]:
    """TE's fused router in TE's form through xte::router_probs (autograd from probs to the
    logits): (probs fp32 [T, E], routing_map bool [T, E] ('bytemap') or uint8 [T, ceil(E/8)]
    LSB-first ('bitmap_u8')), the bytes of xte.fused_topk_with_score_function."""
    fmt = routing_map_format.lower() if hasattr(routing_map_format, "lower") else \
        routing_map_format
    if fmt not in ("bytemap", "bitmap_u8", 0, 1):
        raise XteValueError(Status.INVALID_ARGUMENT, f"routing_map_format: "
                            f"{routing_map_format!r}: want 'bytemap' or 'bitmap_u8'")
    sf = parse_score(score_function)
    probs, rmap, bits, _ = ops.router_probs(
        logits, expert_bias, int(topk), int(sf), bool(use_pre_softmax), int(num_groups or 0),
        int(group_topk or 0), float(1.0 if scaling_factor is None else scaling_factor))
    return probs, (bits if fmt in ("bitmap_u8", 1) else rmap.view(torch.bool))


# ----------------------------------------------------------------------------- DeepGEMM names


def _dg_pair(x, name):
    """(uint8 data, scales as bytes or fp32, fmt) of a DeepGEMM (data, scales) pair."""
    if isinstance(x, QuantizedTensor) or not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise XteDTypeError(Status.DTYPE, f"{name}: {type(x).__name__}: xte.torch's DeepGEMM ops "
                            "take (data, scales) pairs (for a QuantizedTensor use xte.torch.gemm "
                            "/ gemm_grouped or the plain xte function)")
    data, sc = x
    fmt = dtype_of(data.dtype)
    if fmt not in (DType.E4M3, DType.E5M2):
        raise XteDTypeError(Status.DTYPE, f"{name}[0]: dtype {data.dtype}: want float8_e4m3fn "
                            "or float8_e5m2")
    return _bytes_or(data), _bytes_or(sc), int(fmt)


def _dg_args(a, b, recipe, recipe_a, recipe_b, layout):
    """The pair tensors, formats and the folded hints [mode_a, layout_a, mode_b, layout_b]."""
    ad, asc, af = _dg_pair(a, "a")
    bd, bsc, bf = _dg_pair(b, "b")
    (ma, la), (mb, lb) = _G.deepgemm_hints(recipe, recipe_a, recipe_b, layout)
    hints = [-1 if v is None else int(v) for v in (ma, la, mb, lb)]
    return ad, asc, bd, bsc, af, bf, hints


def _no_alpha(alpha):
    if alpha is not None:
        raise XteUnsupportedError(Status.UNSUPPORTED, "alpha: xte's GEMM has no alpha scaling")


def _sizes_tensor(x):
    if x is None or isinstance(x, torch.Tensor):
        return x
    return torch.tensor([int(v) for v in x], dtype=torch.int64)


def _make_dg(nm):
    op = getattr(ops, f"fp8_gemm_{nm}")

    def f(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, *, layout=None,
          mode="exact", bias=None, compiled_dims=None, disable_ue8m0_cast=False, alpha=None):
        _no_alpha(alpha)
        ad, asc, bd, bsc, af, bf, hints = _dg_args(a, b, recipe, recipe_a, recipe_b, layout)
        op(ad, asc, bd, bsc, d, None if c is d else c, c is d, bias, af, bf, [], hints,
           int(parse_gemm_mode(mode)))
        return d
    f.__name__ = f.__qualname__ = f"fp8_gemm_{nm}"
    f.__doc__ = (f"xte.fp8_gemm_{nm} (DeepGEMM's name and arguments) through the mutating custom "
                 f"op xte::fp8_gemm_{nm}: writes d and returns it; traceable by torch.compile. "
                 "a / b: (data float8, scales fp32 / e8m0) pairs.")
    return f


fp8_gemm_nt = _make_dg("nt")
fp8_gemm_nn = _make_dg("nn")
fp8_gemm_tn = _make_dg("tn")
fp8_gemm_tt = _make_dg("tt")


def m_grouped_fp8_gemm_nt_contiguous(a: Pair, b: Pair, d: Tensor, grouped_layout: Any = None,
                                     recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None,
                                     *, group_sizes: Any = None, alignment: Optional[int] = None,
                                     layout: Any = None, mode: GemmModeLike = "exact",
                                     bias: Any = None, compiled_dims: Any = None,
                                     disable_ue8m0_cast: bool = False,
                                     use_psum_layout: bool = False,
                                     ensure_zero_padding: bool = True,
                                     expected_m_for_psum_layout: Optional[int] = None,
                                     trans_b: bool = False) -> Tensor:
    """xte.m_grouped_fp8_gemm_nt_contiguous through xte::m_grouped_fp8_gemm_nt_contiguous
    (writes d, returns it). group_sizes: a list or int64 tensor; grouped_layout: DeepGEMM's int32
    [M] m_indices, or with use_psum_layout its int32 [G] end rows (a list without
    use_psum_layout is taken as group sizes); trans_b: b is [G, K, N] (DeepGEMM's _nn)."""
    if group_sizes is None and isinstance(grouped_layout, (list, tuple)):
        if use_psum_layout:
            grouped_layout = torch.tensor([int(v) for v in grouped_layout], dtype=torch.int32)
        else:
            group_sizes, grouped_layout = grouped_layout, None
    ad, asc, bd, bsc, af, bf, hints = _dg_args(a, b, recipe, recipe_a, recipe_b, layout)
    ops.m_grouped_fp8_gemm_nt_contiguous(ad, asc, bd, bsc, d, grouped_layout,
                                         _sizes_tensor(group_sizes),
                                         -1 if alignment is None else int(alignment), bias, af,
                                         bf, [], hints, int(parse_gemm_mode(mode)),
                                         bool(use_psum_layout), bool(ensure_zero_padding),
                                         bool(trans_b))
    return d


def m_grouped_fp8_gemm_nt_masked(a: Pair, b: Pair, d: Tensor, masked_m: Tensor,
                                 expected_m: Optional[int] = None, recipe: Any = None,
                                 recipe_a: Any = None, recipe_b: Any = None, *, layout: Any = None,
                                 mode: GemmModeLike = "exact", bias: Any = None,
                                 compiled_dims: Any = None,
                                 disable_ue8m0_cast: bool = False) -> Tensor:
    """xte.m_grouped_fp8_gemm_nt_masked through xte::m_grouped_fp8_gemm_nt_masked (writes d,
    returns it; rows past masked_m[g] keep their bytes)."""
    ad, asc, bd, bsc, af, bf, hints = _dg_args(a, b, recipe, recipe_a, recipe_b, layout)
    ops.m_grouped_fp8_gemm_nt_masked(ad, asc, bd, bsc, d, masked_m, bias, af, bf, [], hints,
                                     int(parse_gemm_mode(mode)))
    return d


def k_grouped_fp8_gemm_tn_contiguous(a: Pair, b: Pair, d: Tensor, ks: Any = None,
                                     grouped_layout: Any = None, c: Optional[Tensor] = None,
                                     recipe: Any = (1, 1, 128), *, layout: Any = None,
                                     mode: GemmModeLike = "exact", bias: Any = None,
                                     compiled_dims: Any = None, use_psum_layout: bool = False,
                                     alignment: Optional[int] = None, nt: bool = False) -> Tensor:
    """xte.k_grouped_fp8_gemm_tn_contiguous (nt=True: _nt_contiguous) through
    xte::k_grouped_fp8_gemm_tn_contiguous (writes d, returns it). ks: a list or int64 tensor of
    the K of each group; use_psum_layout: grouped_layout holds the groups' end rows."""
    ad, asc, af = _dg_pair(a, "a")
    bd, bsc, bf = _dg_pair(b, "b")
    _G.check_k_recipe(recipe)
    if isinstance(layout, (tuple, list)):
        la, lb = (None if v is None else parse_layout(v) for v in layout)
    else:
        la = lb = None if layout is None else parse_layout(layout)
    hints = [-1, -1 if la is None else int(la), -1, -1 if lb is None else int(lb)]
    rec = [1, 1, 128] if recipe is None else [int(v) for v in recipe]
    if isinstance(ks, (list, tuple)) and not ks:
        ks = None
    ops.k_grouped_fp8_gemm_tn_contiguous(ad, asc, bd, bsc, d, _sizes_tensor(ks), grouped_layout,
                                         None if c is d else c, c is d, bias, af, bf, rec, hints,
                                         int(parse_gemm_mode(mode)), bool(use_psum_layout),
                                         -1 if alignment is None else int(alignment), bool(nt))
    return d


def moe_unpermute(x: Tensor, topk_idx: Tensor, row_map: Tensor, probs: Optional[Tensor] = None,
                  num_experts: Optional[int] = None) -> Tensor:
    """[T, H] = sum over slots of probs * x[row_map] through xte::moe_unpermute (autograd to x
    and probs)."""
    if num_experts is None:
        raise TypeError("moe_unpermute: num_experts is required")
    return ops.moe_unpermute(x, topk_idx, row_map, probs, int(num_experts))


def swiglu(x: Tensor) -> Tensor:
    """silu(x[..., :F]) * x[..., F:] through xte::swiglu (autograd)."""
    return ops.swiglu(x)


def dswiglu(grad_out: Tensor, x: Tensor) -> Tensor:
    return ops.dswiglu(grad_out, x)


def swiglu_quantize(x: Tensor, act_dtype: DTypeLike = torch.bfloat16, recipe: Any = "te_block",
                    layout: Any = None, fmt: DTypeLike = "e4m3", rowwise: bool = True,
                    columnwise: bool = False, *, amax_epsilon: float = 0.0,
                    force_pow_2: Optional[bool] = None, saturate: bool = True) -> QuantizedTensor:
    """quantize(swiglu(x)) in one pass (xte_swiglu_quantize); returns a QuantizedTensor."""
    r = parse_recipe(recipe)
    lay = ScaleLayout.COMPACT if layout is None else parse_layout(layout)
    fp2 = -1 if force_pow_2 is None else int(force_pow_2)
    f = _FMT[fmt]
    outs = ops.swiglu_quantize(x, int(_dt(act_dtype)), int(ScalingMode.BLOCK_1x128), int(r),
                               int(lay), int(f), bool(rowwise), bool(columnwise),
                               float(amax_epsilon), fp2, bool(saturate))
    return from_lists(outs, ScalingMode.BLOCK_1x128, r, lay, rowwise, columnwise, f)


def attention_fwd(q, k, v, *, layout="bshd", mask=None, window=None, softmax_scale=None,
                  softcap=None, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                  max_seqlen_q=None, max_seqlen_kv=None, mode="exact"):
    """(O, LSE) through xte::attention_fwd; mode "exact" (default) or "fast"
    (XTE_ATTENTION_FAST, also in the autograd backward)."""
    return ops.attention_fwd(q, k, v, *_attention.op_args(
        layout, mask, window, softmax_scale, softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_kv,
        max_seqlen_q, max_seqlen_kv, mode))


def attention_bwd(q, k, v, o, do, lse, *, layout="bshd", mask=None, window=None,
                  softmax_scale=None, softcap=None, alibi_slopes=None, cu_seqlens_q=None,
                  cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None, mode="exact"):
    """(dQ, dK, dV) through xte::attention_bwd; mode "exact" (default) or "fast"."""
    return ops.attention_bwd(q, k, v, o, do, lse,
                             *_attention.op_args(layout, mask, window, softmax_scale, softcap,
                                                 alibi_slopes, cu_seqlens_q, cu_seqlens_kv,
                                                 max_seqlen_q, max_seqlen_kv, mode))


def attention(q, k, v, **kw):
    """Scaled dot-product attention with autograd (O only); see attention_fwd for the options
    (layout 'bshd' / 'sbhd' / 'thd', mask None / 'causal' / 'causal_bottom_right', window
    (left, right), softmax_scale, softcap, alibi_slopes, cu_seqlens_q / _kv, max_seqlen_*,
    mode 'exact' (default) / 'fast')."""
    return attention_fwd(q, k, v, **kw)[0]


def cast(x: Tensor, dtype: DTypeLike, saturate: bool = True) -> Tensor:
    """xte.cast through xte::cast (fp8 / e8m0 results as float8 tensors)."""
    d = _dt(dtype) if not isinstance(dtype, str) or dtype not in _FMT else _FMT[dtype]
    if isinstance(dtype, str) and dtype.lower() in ("e8m0", "float8_e8m0fnu"):
        d = DType.E8M0
    src = dtype_of(x.dtype)
    out = ops.cast(_bytes_or(x), int(src), int(d), bool(saturate))
    if d in (DType.E4M3, DType.E5M2):
        return out.view(_TFP8[d])
    return out.view(torch.float8_e8m0fnu) if d == DType.E8M0 else out


def router_aux_scores(logits: Tensor, topk: int, score_function: EnumLike = "softmax") -> Tensor:
    """The scores fp32 [T, E] of TE's fused_compute_score_for_moe_aux_loss (autograd to the
    logits; TE returns (routing_map, scores): xte.fused_compute_score_for_moe_aux_loss)."""
    sf = parse_score(score_function)
    return ops.router_aux_scores(logits, int(topk), int(sf))[0]


def moe_aux_loss(probs: Tensor, tokens_per_expert: Tensor, total_num_tokens: int, topk: int,
                 coeff: float) -> Tensor:
    """TE's fused_moe_aux_loss as a 0-d fp32 tensor (autograd to probs); TE's num_experts
    argument is probs' column count here (xte.fused_moe_aux_loss takes TE's argument list)."""
    return ops.moe_aux_loss(probs, tokens_per_expert, int(total_num_tokens), int(topk),
                            float(coeff))


def moe_sort_chunks_by_index(x: Tensor, split_sizes: Tensor,
                             sorted_index: Tensor) -> Tuple[Tensor, Tensor]:
    """(output, row_map) of TE's moe_sort_chunks_by_index (autograd to x)."""
    return ops.moe_sort_chunks_by_index(x, split_sizes, sorted_index)


def dispatch_layout(topk_idx: Tensor, num_experts: int,
                    num_ranks: int) -> Tuple[Tensor, Tensor, Tensor]:
    """DeepEP's get_dispatch_layout: (tokens_per_rank int32, tokens_per_expert int32,
    is_token_in_rank bool [T, R])."""
    a, b, c = ops.moe_dispatch_layout(topk_idx, int(num_experts), int(num_ranks))
    return a, b, c.view(torch.bool)
