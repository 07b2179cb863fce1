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
The raw ops (torch.ops.xte.<name>, listed in OPS) take the C API's flags and enums as ints and
pass FP8 data / E8M0 scales as uint8 bytes (opcheck and autograd cannot compare float8 tensors);
these wrappers restore the float8 dtypes as zero-copy views.
"""

import torch

from .._lib import AttnLayout, AttnMask, DType, GemmMode, Recipe, RouterScore, ScaleLayout, ScalingMode
from .._qtensor import QuantizedTensor, parse_layout, parse_mode, parse_recipe
from .._tensor import dtype_of
from ..ops import attention as _A
from ..ops.moe import _score
from ..ops.gemm import _gemm_mode
from . import _ops  # noqa: F401  (registers the ops)
from ._ops import OPS, permute_capacity, scale_shape  # noqa: F401

__all__ = ["quantize", "dequantize", "gemm", "gemm_grouped", "router", "moe_permute",
           "moe_unpermute", "swiglu", "dswiglu", "swiglu_quantize", "attention", "attention_fwd",
           "attention_bwd", "permute_capacity", "qmeta", "from_lists", "OPS", "cast",
           "router_aux_scores", "moe_aux_loss", "moe_sort_chunks_by_index", "dispatch_layout"]

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


def qmeta(q):
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


def from_lists(outs, mode, recipe, layout, rowwise=True, columnwise=False, fmt=DType.E4M3):
    """A QuantizedTensor (fp8 dtypes restored as zero-copy views) from xte::quantize's list."""
    d, s, cd, cs = _ops.split_copies(outs, rowwise, columnwise)
    f = _TFP8[DType(int(fmt))]
    mx = int(recipe) in (int(Recipe.MX_TE), int(Recipe.MX_OCP))

    def sc(t):
        return t.view(torch.float8_e8m0fnu) if (t is not None and mx) else t
    return QuantizedTensor(None if d is None else d.view(f), sc(s), scaling_mode=mode,
                           recipe=recipe, layout=layout,
                           columnwise_data=None if cd is None else cd.view(f),
                           columnwise_scale_inv=sc(cs))


def quantize(x, recipe="te_block", block=None, layout=None, fmt="e4m3", rowwise=True,
             columnwise=False, *, amax_epsilon=0.0, force_pow_2=None, saturate=True, scale=None):
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


def dequantize(q, columnwise=False, dtype=torch.float32):
    """xte.dequantize of one copy through xte::dequantize."""
    d, s = (q.columnwise_data, q.columnwise_scale_inv) if columnwise else (q.data, q.scale_inv)
    lay = q.columnwise_layout if columnwise else q.layout
    return ops.dequantize(_bytes_or(d), _bytes_or(s), int(q.scaling_mode), int(q.recipe),
                          int(lay), int(dtype_of(d.dtype)), bool(columnwise), int(_dt(dtype)))


def _qargs(q):
    return (_bytes_or(q.data), _bytes_or(q.scale_inv), _bytes_or(q.columnwise_data),
            _bytes_or(q.columnwise_scale_inv), qmeta(q))


def gemm(a, b, *, trans_a=False, trans_b=True, c=None, accumulate=False, bias=None,
         mode="exact", out_dtype=torch.bfloat16):
    """D = op(a) @ op(b) (+ C) (+ bias) through xte::gemm, with xte.gemm's conventions: op(b) =
    b^T when trans_b (the default: b is the weight [N, K], the Linear forward "TN"); a, b
    QuantizedTensors. (The raw op torch.ops.xte.gemm takes the C flags: its trans_b is
    `not trans_b` here.)"""
    m = _gemm_mode(mode)
    if c is not None:
        accumulate = True
    return ops.gemm(*_qargs(a), *_qargs(b), c, bias, bool(trans_a), not bool(trans_b),
                    bool(accumulate), int(m), int(_dt(out_dtype)))


_KINDS = {"contiguous": 0, "masked": 1, "k": 2}


def gemm_grouped(a, b, *, group_sizes=None, masked_m=None, num_groups=None, kind="contiguous",
                 alignment=0, trans_a=False, trans_b=True, c=None, accumulate=False, bias=None,
                 mode="exact", out_dtype=torch.bfloat16):
    """xte_gemm_grouped through xte::gemm_grouped, with xte.gemm_grouped's conventions (trans_b
    True: b holds [G, N, K]). group_sizes: int64 tensor / list [G] (rows per group for
    'contiguous', K per group for 'k'); masked_m: int32 [G] for 'masked'."""
    if c is not None:
        accumulate = True
    k = _KINDS[kind] if isinstance(kind, str) else int(kind)
    if isinstance(group_sizes, (list, tuple)):
        group_sizes = torch.tensor(group_sizes, dtype=torch.int64)
    if num_groups is None:
        num_groups = (group_sizes if group_sizes is not None else masked_m).numel()
    m = _gemm_mode(mode)
    return ops.gemm_grouped(*_qargs(a), *_qargs(b), c, bias, group_sizes, masked_m,
                            int(num_groups), k, int(alignment), bool(trans_a), not bool(trans_b),
                            bool(accumulate), int(m), int(_dt(out_dtype)))


def router(logits, topk, score_function="softmax", *, expert_bias=None, use_pre_softmax=False,
           num_groups=0, group_topk=0, scaling_factor=1.0):
    """The router of TE's fused_topk_with_score_function (same options) through xte::router,
    with autograd to the logits. Unlike TE's function (and xte.fused_topk_with_score_function),
    it returns the index form (topk_weights fp32 [T, k], topk_idx int64 [T, k]), which the
    xte.torch permute ops take: static shapes for torch.compile."""
    sf = _score(score_function)
    w, idx, _, _ = ops.router(logits, expert_bias, int(topk), int(sf), bool(use_pre_softmax),
                              int(num_groups or 0), int(group_topk or 0),
                              float(1.0 if scaling_factor is None else scaling_factor))
    return w, idx


def moe_permute(x, topk_idx, num_experts, num_out_tokens=-1, align=1):
    """(output [permute_capacity(...), H], row_map int32 [T, k], tokens_per_expert int64 [E],
    expert_offsets int64 [E + 1]) through xte::moe_permute (autograd to x)."""
    return ops.moe_permute(x, topk_idx, int(num_experts),
                           -1 if num_out_tokens is None else int(num_out_tokens), int(align))


def moe_unpermute(x, topk_idx, row_map, probs=None, num_experts=None):
    """[T, H] = sum over slots of probs * x[row_map] through xte::moe_unpermute (autograd to x
    and probs)."""
    if num_experts is None:
        raise TypeError("moe_unpermute: num_experts is required")
    return ops.moe_unpermute(x, topk_idx, row_map, probs, int(num_experts))


def swiglu(x):
    """silu(x[..., :F]) * x[..., F:] through xte::swiglu (autograd)."""
    return ops.swiglu(x)


def dswiglu(grad_out, x):
    return ops.dswiglu(grad_out, x)


def swiglu_quantize(x, act_dtype=torch.bfloat16, recipe="te_block", layout=None, fmt="e4m3",
                    rowwise=True, columnwise=False, *, amax_epsilon=0.0, force_pow_2=None,
                    saturate=True):
    """quantize(swiglu(x)) in one pass (xte_swiglu_quantize); returns a QuantizedTensor."""
    r = parse_recipe(recipe)
    lay = ScaleLayout.COMPACT if layout is None else parse_layout(layout)
    fp2 = -1 if force_pow_2 is None else int(force_pow_2)
    f = _FMT[fmt]
    outs = ops.swiglu_quantize(x, int(_dt(act_dtype)), int(ScalingMode.BLOCK_1x128), int(r),
                               int(lay), int(f), bool(rowwise), bool(columnwise),
                               float(amax_epsilon), fp2, bool(saturate))
    return from_lists(outs, ScalingMode.BLOCK_1x128, r, lay, rowwise, columnwise, f)


def _attn_args(layout, mask, window, softmax_scale, softcap, alibi_slopes, cu_seqlens_q,
               cu_seqlens_kv, max_seqlen_q, max_seqlen_kv):
    lay = int(_A._enum(layout, _A._LAYOUTS, AttnLayout, "layout"))
    msk = int(_A._enum(mask if mask is not None else "none", _A._MASKS, AttnMask, "mask"))
    wl, wr = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    return (lay, msk, wl, wr, float(softmax_scale or 0.0), float(softcap or 0.0), alibi_slopes,
            cu_seqlens_q, cu_seqlens_kv, int(max_seqlen_q or 0), int(max_seqlen_kv or 0))


def attention_fwd(q, k, v, *, layout="bshd", mask=None, window=None, softmax_scale=None,
                  softcap=None, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                  max_seqlen_q=None, max_seqlen_kv=None):
    """(O, LSE) through xte::attention_fwd."""
    return ops.attention_fwd(q, k, v, *_attn_args(layout, mask, window, softmax_scale, softcap,
                                                  alibi_slopes, cu_seqlens_q, cu_seqlens_kv,
                                                  max_seqlen_q, max_seqlen_kv))


def attention_bwd(q, k, v, o, do, lse, *, layout="bshd", mask=None, window=None,
                  softmax_scale=None, softcap=None, alibi_slopes=None, cu_seqlens_q=None,
                  cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None):
    """(dQ, dK, dV) through xte::attention_bwd."""
    return ops.attention_bwd(q, k, v, o, do, lse,
                             *_attn_args(layout, mask, window, softmax_scale, softcap,
                                         alibi_slopes, cu_seqlens_q, cu_seqlens_kv,
                                         max_seqlen_q, max_seqlen_kv))


def attention(q, k, v, **kw):
    """Scaled dot-product attention with autograd (O only); see attention_fwd for the options
    (layout 'bshd' / 'sbhd' / 'thd', mask None / 'causal' / 'causal_bottom_right', window
    (left, right), softmax_scale, softcap, alibi_slopes, cu_seqlens_q / _kv, max_seqlen_*)."""
    return attention_fwd(q, k, v, **kw)[0]


def cast(x, dtype, saturate=True):
    """xte.cast through xte::cast (fp8 / e8m0 results as float8 tensors)."""
    d = _dt(dtype) if not isinstance(dtype, str) or dtype not in _FMT else _FMT[dtype]
    if isinstance(dtype, str) and dtype.lower() in ("e8m0", "float8_e8m0fnu"):
        d = DType.E8M0
    src = dtype_of(x.dtype)
    out = ops.cast(_bytes_or(x), int(src), int(d), bool(saturate))
    if d in (DType.E4M3, DType.E5M2):
        return out.view(_TFP8[d])
    return out.view(torch.float8_e8m0fnu) if d == DType.E8M0 else out


def router_aux_scores(logits, topk, score_function="softmax"):
    """The scores fp32 [T, E] of TE's fused_compute_score_for_moe_aux_loss (autograd to the
    logits; TE returns (routing_map, scores): xte.fused_compute_score_for_moe_aux_loss)."""
    sf = _score(score_function)
    return ops.router_aux_scores(logits, int(topk), int(sf))[0]


def moe_aux_loss(probs, tokens_per_expert, total_num_tokens, topk, coeff):
    """TE's fused_moe_aux_loss as a 0-d fp32 tensor (autograd to probs); TE's num_experts
    argument is probs' column count here (xte.fused_moe_aux_loss takes TE's argument list)."""
    return ops.moe_aux_loss(probs, tokens_per_expert, int(total_num_tokens), int(topk),
                            float(coeff))


def moe_sort_chunks_by_index(x, split_sizes, sorted_index):
    """(output, row_map) of TE's moe_sort_chunks_by_index (autograd to x)."""
    return ops.moe_sort_chunks_by_index(x, split_sizes, sorted_index)


def dispatch_layout(topk_idx, num_experts, num_ranks):
    """DeepEP's get_dispatch_layout: (tokens_per_rank int32, tokens_per_expert int32,
    is_token_in_rank bool [T, R])."""
    a, b, c = ops.moe_dispatch_layout(topk_idx, int(num_experts), int(num_ranks))
    return a, b, c.view(torch.bool)
