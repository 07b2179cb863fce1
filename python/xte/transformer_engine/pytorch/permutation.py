"""transformer_engine.pytorch.permutation over xte: TransformerEngine's MoE token movement under
its names, signatures, defaults and return values.

moe_permute / moe_permute_with_probs / moe_permute_and_pad_with_probs / moe_unpermute /
moe_sort_chunks_by_index / moe_sort_chunks_by_index_with_probs are autograd functions built on
torch.library custom ops (xte::te_*, python/xte/torch/_ops.py: fake kernels, registered
autograd), so torch.compile(fullgraph=True) traces them. row_id_map is TE's plain int32 tensor,
self-contained (moe_unpermute needs nothing else):
  map_type "mask":  [T, 2E + 1] (per token the output rows of its routed experts, those experts,
                    their count; the order within a token is ascending expert);
  map_type "index": [k T] (entry j T + t: the output row of slot j of token t, -1 if dropped).
Activations fp32 / bf16 / fp16 (the permute also moves fp8 bytes); probs fp32 / bf16 / fp16;
topk indices int32 / int64 (int16 widened). Fp8Padding / Fp8Unpadding pad each group of rows
with zero rows to a multiple of align_size, as TE's modules of those names.
"""
import copy
import warnings
from typing import List, Optional, Tuple

import torch

from ...torch import _ops  # noqa: F401  (registers the xte::te_* custom ops)

__all__ = [
    "moe_permute",
    "moe_permute_with_probs",
    "moe_permute_and_pad_with_probs",
    "moe_unpermute",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
]
# Fp8Padding / Fp8Unpadding are defined here and in module.py (whose classes
# transformer_engine.pytorch exports); they are left out of __all__ so the package's star
# imports name one class each.


def _mask(routing_map):
    """The routing map as bytes (bool / uint8 as is; TE also documents int32 0 / 1)."""
    if routing_map.dtype in (torch.bool, torch.uint8):
        return routing_map
    return routing_map != 0


def _check_tokens(inp, routing_map):
    if inp.dim() != 2:
        raise ValueError(f"inp must be [num_tokens, hidden_size], got shape {tuple(inp.shape)}")
    if inp.size(0) != routing_map.size(0):
        raise ValueError(f"Permute not possible: inp.size(0) ({inp.size(0)}) must match "
                         f"routing_map.size(0) ({routing_map.size(0)}).")


def _is_fp8(inp):
    """A TE FP8 tensor (Float8Tensor, Float8BlockwiseQTensor, MXFP8Tensor and their storage
    classes), recognised by TE's own field names rather than by class."""
    return not isinstance(inp, torch.Tensor) and (getattr(inp, "_rowwise_data", None) is not None
                                                  or getattr(inp, "_data", None) is not None)


def _fp8_data(inp):
    """The rowwise fp8 bytes of a TE FP8 tensor."""
    rowwise = getattr(inp, "_rowwise_data", None)
    return rowwise if rowwise is not None else inp._data


def _permute_fp8(inp, routing_map, rows, probs, align, pad_offsets):
    """TE's FP8 permute (eager, mask map): the row map from xte's permute (of no data bytes),
    then the fp8 rows and their scale rows moved together (one copy each); per-tensor scaling
    keeps its one scale. The output is a copy of inp's object with TE's fields replaced."""
    if torch.compiler.is_compiling():
        raise RuntimeError("moe_permute with quantized (FP8) input is not supported under "
                           "torch.compile. Please move quantization outside the compiled region.")
    rowwise = getattr(inp, "_rowwise_data", None)
    data = rowwise if rowwise is not None else inp._data
    scale = None
    if rowwise is not None:
        scale = inp._rowwise_scale_inv
        blockwise = hasattr(inp, "_is_2D_scaled")  # TE's blockwise scales: [S, T], transposed
        scale = scale.T.contiguous() if blockwise else scale.contiguous()
        if scale.shape[0] != data.shape[0]:
            raise ValueError(f"Scale and input shape mismatch: num_tokens ({data.shape[0]}) != "
                             f"fp8_scale.shape[0] ({scale.shape[0]}).")
    T, E = routing_map.shape
    none = data.new_empty((T, 0), dtype=torch.float32)
    _, rid, pprobs = torch.ops.xte.te_permute_mask(none, _mask(routing_map), probs, rows, align,
                                                   pad_offsets)
    dst = rid[:, :E]
    if pad_offsets is not None and align > 1:
        off = pad_offsets.to(torch.int64)[rid[:, E:2 * E].clamp(min=0).to(torch.int64)]
        dst = torch.where(dst >= 0, dst.to(torch.int64) + off, -1)
    keep = dst >= 0
    src = torch.arange(T, device=data.device).unsqueeze(1).expand(T, E)[keep]
    dst = dst[keep].to(torch.int64)
    out_data = data.new_zeros((rows, data.shape[-1]))
    out_data[dst] = data[src]
    if probs is not None:  # TE: a slot of prob 0 gets a zero row
        out_data[torch.nonzero(pprobs == 0).flatten()] = 0
    out = copy.copy(inp)
    out._shape = torch.Size((rows, data.shape[-1]))
    if rowwise is not None:
        out_scale = scale.new_zeros((rows, scale.shape[-1]))
        out_scale[dst] = scale[src]
        out._rowwise_data = out_data
        out._rowwise_scale_inv = out_scale.T.contiguous() if blockwise else out_scale
        out._columnwise_data = None
        out._columnwise_scale_inv = None
    else:
        out._data = out_data
        out._transpose = None
        out._transpose_invalid = True
    return out, rid, pprobs


def _permute_mask(inp, routing_map, num_out_tokens, probs, align, pad_offsets):
    if _is_fp8(inp):
        if num_out_tokens is None or num_out_tokens <= 0:
            raise ValueError(f"moe_permute (mask map) requires num_out_tokens > 0, got "
                             f"{num_out_tokens}.")
        return _permute_fp8(inp, routing_map, int(num_out_tokens), probs, align, pad_offsets)
    _check_tokens(inp, routing_map)
    if inp.size(0) > 0 and (num_out_tokens is None or num_out_tokens <= 0):
        raise ValueError(f"moe_permute (mask map) requires num_out_tokens > 0, got "
                         f"{num_out_tokens}. Use int(routing_map.sum()) or num_tokens * top_k.")
    rows = int(num_out_tokens) if inp.size(0) > 0 else 0
    return torch.ops.xte.te_permute_mask(inp, _mask(routing_map), probs, rows, align,
                                         pad_offsets)


def moe_permute(
    inp: torch.Tensor,
    routing_map: torch.Tensor,
    num_out_tokens: int,
    max_token_num: int = -1,
    map_type: str = "mask",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Group the tokens by expert: (output, row_id_map).

    map_type "mask": routing_map bool / uint8 / int32 [T, E] (non-zero: routed); the output has
    num_out_tokens (> 0) rows, at least the routed slots (fewer is an error, never a write out
    of bounds). map_type "index": routing_map [T, k] expert indices (the expert count is not
    needed); num_out_tokens >= 0, 0 meaning T k; fewer rows drop the last slots in
    expert-major order. max_token_num: TE's workspace hint, unused."""
    del max_token_num
    if map_type == "index":
        _check_tokens(inp, routing_map)
        if num_out_tokens is None or num_out_tokens < 0:
            raise ValueError(f"moe_permute (index map) requires num_out_tokens >= 0, got "
                             f"{num_out_tokens}.")
        if routing_map.dim() == 1:
            routing_map = routing_map.unsqueeze(1)
        if routing_map.dtype not in (torch.int32, torch.int64):
            routing_map = routing_map.to(torch.int32)
        return torch.ops.xte.te_permute_index(inp, routing_map, int(num_out_tokens))
    if map_type == "mask":
        output, row_id_map, _ = _permute_mask(inp, routing_map, num_out_tokens, None, 1, None)
        return output, row_id_map
    raise ValueError("map_type should be one of 'mask' or 'index'")


def moe_permute_with_probs(
    inp: torch.Tensor,
    probs: torch.Tensor,
    routing_map: torch.Tensor,
    num_out_tokens: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_permute (mask map) moving probs [T, E] along: (output, permuted_probs [rows] in
    probs' dtype, row_id_map). A slot whose prob is exactly 0 gets a zero row, as in TE."""
    output, row_id_map, permuted_probs = _permute_mask(inp, routing_map, num_out_tokens, probs,
                                                       1, None)
    return output, permuted_probs, row_id_map


def moe_permute_and_pad_with_probs(
    inp: torch.Tensor,
    probs: torch.Tensor,
    routing_map: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    align_size: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """moe_permute_with_probs with every expert's rows padded (zero rows, zero probs) to a
    multiple of align_size: (output, permuted_probs, row_id_map, pad_offsets, target
    tokens_per_expert). tokens_per_expert [E] must be routing_map.sum(0) (checked); pad_offsets
    int64 [E] (the padding rows before each expert; None when no expert needs padding) is what
    moe_unpermute(pad_offsets=) takes; row_id_map holds the unpadded rows, as TE's."""
    if tokens_per_expert is None:
        raise ValueError("tokens_per_expert must be provided to the fused permute padding "
                         "function.")
    if align_size <= 0:
        raise ValueError(f"align_size must be positive, got {align_size}.")
    dev = inp.device if isinstance(inp, torch.Tensor) else _fp8_data(inp).device
    if tokens_per_expert.device != dev:
        tokens_per_expert = tokens_per_expert.to(dev)
    target = (torch.ceil(tokens_per_expert / align_size) * align_size).long()
    if torch.equal(tokens_per_expert.long(), target):
        pad_offsets = None
    else:
        cum = torch.cumsum(target - tokens_per_expert.long(), dim=0)
        pad_offsets = torch.cat([torch.zeros(1, dtype=cum.dtype, device=dev), cum[:-1]])
    rows = int(target.sum().item())
    if _is_fp8(inp):
        output, row_id_map, permuted_probs = _permute_fp8(
            inp, routing_map, rows, probs, int(align_size) if pad_offsets is not None else 1,
            pad_offsets)
        return output, permuted_probs, row_id_map, pad_offsets, target
    _check_tokens(inp, routing_map)
    output, row_id_map, permuted_probs = torch.ops.xte.te_permute_mask(
        inp, _mask(routing_map), probs, rows if inp.size(0) > 0 else 0,
        int(align_size) if pad_offsets is not None else 1, pad_offsets)
    return output, permuted_probs, row_id_map, pad_offsets, target


def moe_unpermute(
    inp: torch.Tensor,
    row_id_map: torch.Tensor,
    merging_probs: Optional[torch.Tensor] = None,
    restore_shape: Optional[torch.Size] = None,
    map_type: str = "mask",
    probs: Optional[torch.Tensor] = None,
    pad_offsets: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Restore the token order, summing each token's rows weighted by merging_probs (mask map:
    [T, E]; index map: [T, k]) or by 1; fp32 sums, one rounding to inp's dtype.
    restore_shape: (T, H) of the output (mask map; default: the row_id_map's T and inp's H,
    TE's default inp.shape wherever that one is defined). probs: TE's old name of
    merging_probs. pad_offsets: from moe_permute_and_pad_with_probs (mask map)."""
    if probs is not None:
        if merging_probs is not None:
            raise ValueError("Both merging_probs and probs kwarg are provided. probs is "
                             "deprecated.")
        warnings.warn("probs kwarg is deprecated. Use merging_probs kwarg instead.")
        merging_probs = probs
    if map_type == "index":
        if merging_probs is not None:
            if merging_probs.dtype != torch.float32:
                warnings.warn(f"The data type of the input `probs` of Unpermute is "
                              f"{merging_probs.dtype}! The recommended type is torch.float32.")
                merging_probs = merging_probs.to(torch.float32)
            num_tokens = merging_probs.size(0)
        else:
            num_tokens = row_id_map.size(0)
        return torch.ops.xte.te_unpermute_index(inp, row_id_map, merging_probs, num_tokens)
    if map_type == "mask":
        # restore_shape None: TE's default, inp's shape, which is right only when rows == tokens
        shape = (tuple(restore_shape) if restore_shape is not None else
                 (row_id_map.size(0) if row_id_map.dim() == 2 else inp.size(0), inp.size(-1)))
        num_tokens, hidden_size = shape
        if inp.dim() != 2 or inp.size(1) != hidden_size:
            raise ValueError(f"inp has shape {tuple(inp.shape)}: want [rows, {hidden_size}] "
                             f"(restore_shape {shape})")
        if row_id_map.dim() != 2:
            return inp.new_zeros((num_tokens, hidden_size))  # an empty permute's map
        return torch.ops.xte.te_unpermute_mask(inp, row_id_map, merging_probs, int(num_tokens),
                                               pad_offsets)
    raise ValueError("map_type should be one of 'mask' or 'index'")


def moe_sort_chunks_by_index(
    inp: torch.Tensor,
    split_sizes: torch.Tensor,
    sorted_index: torch.Tensor,
) -> torch.Tensor:
    """Split inp's rows into chunks of split_sizes and concatenate them in the order
    sorted_index (rows past the chunks' sum stay in place)."""
    output, _, _ = torch.ops.xte.te_sort_chunks(inp, split_sizes, sorted_index, None)
    return output


def moe_sort_chunks_by_index_with_probs(
    inp: torch.Tensor,
    probs: torch.Tensor,
    split_sizes: torch.Tensor,
    sorted_index: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """moe_sort_chunks_by_index moving probs [rows] along: (output, permuted_probs)."""
    output, permuted_probs, _ = torch.ops.xte.te_sort_chunks(inp, split_sizes, sorted_index,
                                                             probs)
    return output, permuted_probs


# ----------------------------------------------------------------------------- FP8 padding


def _move_groups(src, dst, src_splits, dst_splits):
    """Copy each group's first min(src, dst) rows from src to dst (dst zero-initialised)."""
    s = d = 0
    for a, b in zip(src_splits, dst_splits):
        n = min(a, b)
        if n:
            dst[d:d + n] = src[s:s + n]
        s += a
        d += b
    return dst


class _Pad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, m_splits, padded):
        ctx.splits = (m_splits, padded)
        x = inp.view(-1, inp.shape[-1])
        return _move_groups(x, x.new_zeros((sum(padded), x.shape[-1])), m_splits, padded)

    @staticmethod
    def backward(ctx, g):
        m_splits, padded = ctx.splits
        g = g.contiguous()
        out = _move_groups(g, g.new_empty((sum(m_splits), g.shape[-1])), padded, m_splits)
        return out, None, None


class _Unpad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, m_splits, padded):
        ctx.splits = (m_splits, padded)
        x = inp.view(-1, inp.shape[-1])
        return _move_groups(x, x.new_empty((sum(m_splits), x.shape[-1])), padded, m_splits)

    @staticmethod
    def backward(ctx, g):
        m_splits, padded = ctx.splits
        g = g.contiguous()
        out = _move_groups(g, g.new_zeros((sum(padded), g.shape[-1])), m_splits, padded)
        return out, None, None


def _padded(m_splits, align_size):
    return [(m + align_size - 1) // align_size * align_size for m in m_splits]


class Fp8Padding(torch.nn.Module):
    """Pad each of num_gemms row groups (m_splits rows each) with zero rows to a multiple of
    align_size: forward(inp, m_splits) -> (output, padded_m_splits); inp itself when no group
    needs padding. align_size None: 16 (TE's choice for its non-MX recipes, which xte's FP8
    recipes are)."""

    def __init__(self, num_gemms: int, align_size: Optional[int] = None) -> None:
        super().__init__()
        self.num_gemms = num_gemms
        self.align_size = align_size

    def forward(self, inp: torch.Tensor, m_splits: List[int]) -> Tuple[torch.Tensor, List[int]]:
        assert len(m_splits) == self.num_gemms, "Number of splits should match number of GEMMs."
        if self.align_size is None:
            self.align_size = 16
        padded = _padded(m_splits, self.align_size)
        if list(m_splits) == padded:
            return inp, m_splits
        return _Pad.apply(inp, list(m_splits), padded), padded


class Fp8Unpadding(torch.nn.Module):
    """Fp8Padding's inverse: forward(inp, m_splits) drops each group's padding rows (m_splits:
    the unpadded sizes)."""

    def __init__(self, num_gemms: int, align_size: Optional[int] = None) -> None:
        super().__init__()
        self.num_gemms = num_gemms
        self.align_size = align_size

    def forward(self, inp: torch.Tensor, m_splits: List[int]) -> torch.Tensor:
        assert len(m_splits) == self.num_gemms, "Number of splits should match number of GEMMs."
        if self.align_size is None:
            self.align_size = 16
        padded = _padded(m_splits, self.align_size)
        if list(m_splits) == padded:
            return inp
        return _Unpad.apply(inp, list(m_splits), padded)
