"""Functional forms of xte.nn (autograd over the torch.library custom ops of xte.torch).

    linear(x, weight, bias=None, recipe="te_block", ...)   block-scaled FP8 Linear
    grouped_linear(x, weight, m_splits, recipe="te_block", ...)   experts (m-grouped GEMMs)
    attention(q, k, v, ...)                                 scaled dot-product attention
    router / moe_permute / moe_unpermute / swiglu           MoE building blocks with autograd

FP8 recipe of linear / grouped_linear (TransformerEngine's Float8BlockScaling): the activation x
and the output gradient dy in 1x128 blocks (rowwise for fprop / dgrad, the columnwise copy for
wgrad), the weight in 128x128 tiles; e4m3 (fmt="hybrid": e5m2 gradients); power-of-two scales
(recipe "te_block"; "deepgemm", "deepgemm_ue8m0" and "mtfp8" take the same shapes).
  fprop  y  = Q(x) Q(W)^T (+ bias)      xte_gemm, 1x128 x 128x128
  dgrad  dx = Q(dy) Q(W)                 xte_gemm trans_b, 1x128 x 128x128
  wgrad  dW = Qc(dy)^T Qc(x)             xte_gemm trans_a trans_b, 1x128 columnwise x 1x128
Every product is xte's exact GEMM (docs/numerics.md section 6), so the only error against an
fp64 product of the same FP8 operands is the fp32 rounding of the 128-element block partials,
the fp32 accumulation over the K blocks and the final rounding to the output dtype.
"""

import torch

from .._lib import DType, GemmMode, ScaleLayout, ScalingMode
from .._qtensor import parse_recipe
from ..torch import (attention, attention_fwd, moe_permute, moe_unpermute, permute_capacity,
                     permute_rows, router, swiglu)
from .._tensor import dtype_of

__all__ = ["linear", "grouped_linear", "attention", "attention_fwd", "router", "moe_permute",
           "moe_unpermute", "swiglu", "permute_capacity", "permute_rows",
           "group_sizes_from_offsets"]

_ops = torch.ops.xte
_B1 = int(ScalingMode.BLOCK_1x128)
_B128 = int(ScalingMode.BLOCK_128x128)
_LAY = int(ScaleLayout.COMPACT)
_EXACT = int(GemmMode.EXACT)


def _fmts(fmt):
    f = str(fmt).lower()
    if f == "hybrid":
        return int(DType.E4M3), int(DType.E5M2)
    if f == "e5m2":
        return int(DType.E5M2), int(DType.E5M2)
    return int(DType.E4M3), int(DType.E4M3)


def _out_dt(t):
    d = dtype_of(t.dtype)
    if d not in (DType.FP32, DType.BF16):
        raise TypeError(f"xte.nn: dtype {t.dtype} (fp32 or bf16 outputs only)")
    return int(d)


def _q(x, mode, recipe, fmt, rowwise, columnwise):
    return _ops.quantize(x, mode, recipe, _LAY, fmt, rowwise, columnwise, 0.0, -1, True, None)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, recipe, ffmt, bfmt):
        need_wgrad = weight.requires_grad
        xq = _q(x, _B1, recipe, ffmt, True, need_wgrad)
        wq = _q(weight, _B128, recipe, ffmt, True, False)
        ma = [_B1, recipe, _LAY, _LAY, ffmt]
        mw = [_B128, recipe, _LAY, _LAY, ffmt]
        y = _ops.gemm(xq[0], xq[1], None, None, ma, wq[0], wq[1], None, None, mw, None, bias,
                      False, False, False, _EXACT, _out_dt(x))
        ctx.save_for_backward(xq[2] if need_wgrad else None, xq[3] if need_wgrad else None,
                              wq[0], wq[1])
        ctx.cfg = (recipe, ffmt, bfmt, _out_dt(x), _out_dt(weight), bias is not None)
        return y

    @staticmethod
    def backward(ctx, dy):
        xc, xcs, w, ws = ctx.saved_tensors
        recipe, ffmt, bfmt, xdt, wdt, has_bias = ctx.cfg
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dy = dy.contiguous()
        dyq = _q(dy, _B1, recipe, bfmt, need_dx, need_dw)
        mg = [_B1, recipe, _LAY, _LAY, bfmt]
        dx = dw = db = None
        if need_dx:
            dx = _ops.gemm(dyq[0], dyq[1], None, None, mg, w, ws, None, None,
                           [_B128, recipe, _LAY, _LAY, ffmt], None, None, False, True, False,
                           _EXACT, xdt)
        if need_dw:
            dc, dcs = dyq[-2], dyq[-1]
            dw = _ops.gemm(None, None, dc, dcs, mg, None, None, xc, xcs,
                           [_B1, recipe, _LAY, _LAY, ffmt], None, None, True, True, False,
                           _EXACT, wdt)
        if has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(0, dtype=torch.float32)
        return dx, dw, db, None, None, None


def linear(x, weight, bias=None, recipe="te_block", fmt="e4m3"):
    """y = x W^T (+ bias) with block-scaled FP8 forward and backward (see the module doc).
    x [..., K] fp32 / bf16 (y in x's dtype); weight [N, K] fp32 / bf16; bias fp32 [N]."""
    r = int(parse_recipe(recipe))
    ffmt, bfmt = _fmts(fmt)
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    y = _Linear.apply(x2, weight, bias, r, ffmt, bfmt)
    return y.reshape(tuple(x.shape[:-1]) + (weight.shape[0],))


class _GroupedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, m_splits, recipe, ffmt, bfmt):
        E, N, K = weight.shape
        need_wgrad = weight.requires_grad
        xq = _q(x, _B1, recipe, ffmt, True, need_wgrad)
        wq = _q(weight.reshape(E * N, K), _B128, recipe, ffmt, True, False)
        m1 = [_B1, recipe, _LAY, _LAY, ffmt]
        mw = [_B128, recipe, _LAY, _LAY, ffmt]
        y = _ops.gemm_grouped(xq[0], xq[1], None, None, m1, wq[0], wq[1], None, None, mw, None,
                              None, m_splits, None, E, 0, 0, False, False, False, _EXACT,
                              _out_dt(x))
        ctx.save_for_backward(xq[2] if need_wgrad else None, xq[3] if need_wgrad else None,
                              wq[0], wq[1], m_splits)
        ctx.cfg = (recipe, ffmt, bfmt, _out_dt(x), _out_dt(weight), E, N, K)
        return y

    @staticmethod
    def backward(ctx, dy):
        xc, xcs, w, ws, m_splits = ctx.saved_tensors
        recipe, ffmt, bfmt, xdt, wdt, E, N, K = ctx.cfg
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dy = dy.contiguous()
        dyq = _q(dy, _B1, recipe, bfmt, need_dx, need_dw)
        mg = [_B1, recipe, _LAY, _LAY, bfmt]
        dx = dw = None
        if need_dx:
            dx = _ops.gemm_grouped(dyq[0], dyq[1], None, None, mg, w, ws, None, None,
                                   [_B128, recipe, _LAY, _LAY, ffmt], None, None, m_splits, None,
                                   E, 0, 0, False, True, False, _EXACT, xdt)
        if need_dw:
            dw = _ops.gemm_grouped(None, None, dyq[-2], dyq[-1], mg, None, None, xc, xcs,
                                   [_B1, recipe, _LAY, _LAY, ffmt], None, None, m_splits, None,
                                   E, 2, 0, True, True, False, _EXACT, wdt)
        return dx, dw, None, None, None, None


def grouped_linear(x, weight, m_splits, recipe="te_block", fmt="e4m3"):
    """Expert GEMMs: rows [off_g, off_g + m_splits[g]) of x [R, K] times expert g's weight
    weight[g] [N, K]^T -> [R, N] (m-grouped contiguous GEMM; wgrad as a K-grouped GEMM).
    m_splits: int64 tensor (or list) [E] summing to R. Constraints of the grouped GEMMs (xte
    gemm.h): every group but the last starts at a multiple of 128 rows for the weight gradient
    (pad with moe_permute's align=128), and N % 128 == 0 for the input gradient when E > 1."""
    if not isinstance(m_splits, torch.Tensor):
        m_splits = torch.tensor(list(m_splits), dtype=torch.int64)
    r = int(parse_recipe(recipe))
    ffmt, bfmt = _fmts(fmt)
    return _GroupedLinear.apply(x, weight, m_splits, r, ffmt, bfmt)


def group_sizes_from_offsets(expert_offsets, rows):
    """Rows per expert for the grouped GEMMs from moe_permute's (padded) expert_offsets [E + 1],
    the unused rows of the static capacity `rows` added to the last expert (they are zeros;
    none when the buffer has exactly permute_rows(...) rows, as xte.nn.MoE's in eager mode)."""
    sizes = expert_offsets[1:] - expert_offsets[:-1]
    tail = rows - expert_offsets[-1:]
    return torch.cat([sizes[:-1], sizes[-1:] + tail])
