"""xte.nn modules: Linear, GroupedLinear, MoE (block-scaled FP8 expert MLPs).

GEMM mode: each module takes gemm_mode= ("exact", "fast" or None) and keeps it as
self.gemm_mode. None (the default) means the recipe object's gemm_mode field when recipe is an
xte.recipe object, else "exact": by default every GEMM is xte's EXACT GEMM (bit-reproducible on
every backend, ISA and thread count); "fast" picks XTE_GEMM_FAST (bounded error, see
include/xte/gemm.h) for the forward and both backward GEMMs.
"""

import math
from typing import Optional

import torch
from torch import nn

from .._typing import GemmModeLike
from . import functional as F

_Mode = Optional[GemmModeLike]

__all__ = ["Linear", "GroupedLinear", "MoE"]


class Linear(nn.Module):
    """y = x W^T + b with TransformerEngine Float8BlockScaling numerics (xte.nn.functional.linear):
    fp32 master weight [out, in], 1x128 activations / gradients, 128x128 weight tiles."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe="te_block", fmt: str = "e4m3", params_dtype: torch.dtype = torch.float32,
                 device=None, gemm_mode: _Mode = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.recipe, self.fmt = recipe, fmt
        F.gemm_mode_of(recipe, gemm_mode)  # a bad mode fails here, not at the first forward
        self.gemm_mode = gemm_mode
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=params_dtype,
                                               device=device))
        self.bias = (nn.Parameter(torch.zeros(out_features, dtype=torch.float32, device=device))
                     if bias else None)
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias, self.recipe, self.fmt,
                        gemm_mode=self.gemm_mode)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, recipe={self.recipe!r}, "
                f"gemm_mode={F.gemm_mode_of(self.recipe, self.gemm_mode).name.lower()}")


class GroupedLinear(nn.Module):
    """num_gemms experts, weight [num_gemms, out, in] (TE's GroupedLinear with one stacked
    weight); forward(x [R, in], m_splits) -> [R, out] (xte.nn.functional.grouped_linear).
    Each expert's weight is quantized on its own (any out % 128), as TE does."""

    def __init__(self, num_gemms: int, in_features: int, out_features: int, *,
                 recipe="te_block", fmt: str = "e4m3", params_dtype: torch.dtype = torch.float32,
                 device=None, gemm_mode: _Mode = None):
        super().__init__()
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.recipe, self.fmt = recipe, fmt
        F.gemm_mode_of(recipe, gemm_mode)
        self.gemm_mode = gemm_mode
        self.weight = nn.Parameter(torch.empty(num_gemms, out_features, in_features,
                                               dtype=params_dtype, device=device))
        bound = 1.0 / math.sqrt(in_features)
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor, m_splits) -> torch.Tensor:
        return F.grouped_linear(x, self.weight, m_splits, self.recipe, self.fmt,
                                gemm_mode=self.gemm_mode)

    def extra_repr(self):
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, "
                f"out_features={self.out_features}, recipe={self.recipe!r}, "
                f"gemm_mode={F.gemm_mode_of(self.recipe, self.gemm_mode).name.lower()}")


class MoE(nn.Module):
    """A mixture-of-experts SwiGLU MLP (DeepSeek-V3 / Kimi-K2 shaped):

        logits = x Wg^T (fp32)      router: score_function over num_experts, expert_bias added
                                    for the selection only, grouped top-k (num_groups /
                                    group_topk), weights normalised over the top-k and scaled
        permute (align 128 rows per expert, static capacity) -> fc1 (grouped FP8, [E, 2F, H])
        -> swiglu -> fc2 (grouped FP8, [E, H, F]) -> unpermute weighted by the top-k weights
        (+ num_shared_experts shared SwiGLU experts through xte.nn.Linear)

    Kimi-K2: MoE(7168, 2048, 384, topk=8, score_function="sigmoid", num_groups=1,
    scaling_factor=2.827, num_shared_experts=1). DeepSeek-V3: MoE(7168, 2048, 256, topk=8,
    score_function="sigmoid", num_groups=8, group_topk=4, scaling_factor=2.5,
    num_shared_experts=1).

    Constraints (xte's grouped GEMMs): 2 * ffn_hidden_size and hidden_size multiples of 128
    when num_experts > 1. num_out_tokens (>= 0) caps the permuted rows (tokens past the cap,
    in expert-major order, are dropped); None keeps every token. After forward,
    self.tokens_per_expert holds the routed rows per expert (for update_expert_bias).

    Permuted buffer size. In eager mode (torch.compiler.is_compiling() false) the permuted
    buffer has exactly the rows the routing uses, R = sum over experts of the kept rows rounded
    up to `align` (xte_moe_permute_rows, read on the host: a device sync on CUDA), and after
    forward self.permuted_rows holds R. Under torch.compile shapes must be static: the buffer
    has the worst case permute_capacity(T, topk, E, num_out_tokens, align) rows (with align
    128 and no cap, T * topk + min(E, T * topk) * 127), the unused rows zeros fed through the
    last expert's GEMMs and never read back. Both give the same bytes
    (each output row of the grouped GEMMs depends on its own row only). static_capacity=True
    uses the worst case in eager mode too.

    gemm_mode: the GEMM mode of every expert and shared-expert GEMM (see the module doc; None:
    the recipe object's, else exact). The router's logits are an fp32 torch matmul either way.
    """

    def __init__(self, hidden_size: int, ffn_hidden_size: int, num_experts: int, topk: int, *,
                 score_function: str = "sigmoid", use_expert_bias: bool = True,
                 num_groups: int = 0, group_topk: int = 0, scaling_factor: float = 1.0,
                 use_pre_softmax: bool = False, num_shared_experts: int = 0,
                 num_out_tokens: Optional[int] = None, align: int = 128, recipe="te_block",
                 fmt: str = "e4m3", params_dtype: torch.dtype = torch.float32, device=None,
                 static_capacity: bool = False, gemm_mode: _Mode = None):
        super().__init__()
        self.static_capacity = static_capacity
        self.permuted_rows: Optional[int] = None  # rows of the last eager forward's permuted buffer
        self.hidden_size, self.ffn_hidden_size = hidden_size, ffn_hidden_size
        self.num_experts, self.topk = num_experts, topk
        self.score_function = score_function
        self.num_groups, self.group_topk = num_groups, group_topk
        self.scaling_factor, self.use_pre_softmax = scaling_factor, use_pre_softmax
        self.num_out_tokens, self.align = num_out_tokens, align
        self.gate_weight = nn.Parameter(torch.empty(num_experts, hidden_size,
                                                    dtype=torch.float32, device=device))
        nn.init.kaiming_uniform_(self.gate_weight, a=math.sqrt(5))
        if use_expert_bias:
            self.register_buffer("expert_bias", torch.zeros(num_experts, dtype=torch.float32,
                                                            device=device))
        else:
            self.expert_bias = None
        self.tokens_per_expert: torch.Tensor  # a buffer (not saved in the state dict)
        self.register_buffer("tokens_per_expert", torch.zeros(num_experts, dtype=torch.int64,
                                                              device=device), persistent=False)
        kw = dict(recipe=recipe, fmt=fmt, params_dtype=params_dtype, device=device,
                  gemm_mode=gemm_mode)
        self.fc1 = GroupedLinear(num_experts, hidden_size, 2 * ffn_hidden_size, **kw)
        self.fc2 = GroupedLinear(num_experts, ffn_hidden_size, hidden_size, **kw)
        self.shared_fc1: Optional[Linear]
        self.shared_fc2: Optional[Linear]
        if num_shared_experts:
            fs = ffn_hidden_size * num_shared_experts
            self.shared_fc1 = Linear(hidden_size, 2 * fs, bias=False, **kw)
            self.shared_fc2 = Linear(fs, hidden_size, bias=False, **kw)
        else:
            self.shared_fc1 = self.shared_fc2 = None

    def route(self, x2):
        logits = torch.nn.functional.linear(x2.float(), self.gate_weight)
        return F.router(logits, self.topk, self.score_function, expert_bias=self.expert_bias,
                        use_pre_softmax=self.use_pre_softmax, num_groups=self.num_groups,
                        group_topk=self.group_topk, scaling_factor=self.scaling_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.hidden_size)
        w, idx = self.route(x2)
        cap = -1 if self.num_out_tokens is None else self.num_out_tokens
        eager = not torch.compiler.is_compiling()
        rows = None
        if eager and not self.static_capacity:  # exact rows; static worst case under compile
            rows = F.permute_rows(topk_idx=idx, num_experts=self.num_experts,
                                  num_out_tokens=cap, align=self.align)
        xp, row_map, tpe, offs = F.moe_permute(x2, idx, self.num_experts, cap, self.align, rows)
        if eager:
            self.tokens_per_expert.copy_(tpe)
            self.permuted_rows = int(xp.shape[0])
        m_splits = F.group_sizes_from_offsets(offs, xp.shape[0])
        h = self.fc1(xp, m_splits)
        a = F.swiglu(h)
        o = self.fc2(a, m_splits)
        y = F.moe_unpermute(o, idx, row_map, w, self.num_experts)
        if self.shared_fc1 is not None and self.shared_fc2 is not None:
            y = y + self.shared_fc2(F.swiglu(self.shared_fc1(x2)))
        return y.reshape(shape)

    @torch.no_grad()
    def update_expert_bias(self, rate: float = 1e-3) -> None:
        """DeepSeek-V3's auxiliary-loss-free balancing: raise the bias of under-loaded experts
        and lower it for over-loaded ones, by rate * sign(mean load - load)."""
        if self.expert_bias is None:
            return
        load = self.tokens_per_expert.float()
        self.expert_bias.add_(rate * torch.sign(load.mean() - load))
