"""The expert-parallel family's custom op (xte.ops.ep): xte::moe_dispatch_layout (DeepEP's
get_dispatch_layout)."""

from typing import Tuple

import torch
from torch import Tensor

from .._lib import DType, call
from .._tensor import empty, stream_of, view
from ._common import DEV


@torch.library.custom_op("xte::moe_dispatch_layout", mutates_args=(), device_types=DEV)
def moe_dispatch_layout(topk_idx: Tensor, num_experts: int,
                        num_ranks: int) -> Tuple[Tensor, Tensor, Tensor]:
    """xte_moe_dispatch_layout (DeepEP get_dispatch_layout): (tokens_per_rank int32 [R],
    tokens_per_expert int32 [E], is_token_in_rank uint8 [T, R])."""
    vi = view(topk_idx, "topk_idx", (DType.INT32, DType.INT64))
    T = vi.shape[0]
    a = empty(vi, (num_ranks,), DType.INT32)
    b = empty(vi, (num_experts,), DType.INT32)
    c = empty(vi, (T, num_ranks), DType.UINT8)
    va, vb, vc = (view(a, "tokens_per_rank", writable=True),
                  view(b, "tokens_per_expert", writable=True),
                  view(c, "is_token_in_rank", writable=True))
    call("xte_moe_dispatch_layout", vi.ptr, int(num_experts), int(num_ranks), va.ptr, vb.ptr,
         vc.ptr, stream_of(vi, va))
    return a, b, c


@moe_dispatch_layout.register_fake
def _(topk_idx, num_experts, num_ranks):
    return (topk_idx.new_empty((num_ranks,), dtype=torch.int32),
            topk_idx.new_empty((num_experts,), dtype=torch.int32),
            topk_idx.new_empty((topk_idx.shape[0], num_ranks), dtype=torch.uint8))


OPS = {"moe_dispatch_layout": moe_dispatch_layout}
