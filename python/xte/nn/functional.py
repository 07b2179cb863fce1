"""Functional forms of xte.nn (autograd over the torch.library custom ops of xte.torch).

    linear(x, weight, bias=None, recipe="te_block", ...)   block-scaled FP8 Linear
    grouped_linear(x, weight, m_splits, recipe="te_block", ...)   experts (m-grouped GEMMs)
    attention(q, k, v, ...)                                 scaled dot-product attention
    router / moe_permute / moe_unpermute / swiglu           MoE building blocks with autograd

FP8 recipe of linear / grouped_linear (default: TransformerEngine's Float8BlockScaling): the
activation x and the output gradient dy in 1x128 blocks (rowwise for fprop / dgrad, the
columnwise copy for wgrad), the weight in 128x128 tiles; e4m3 (fmt="hybrid": e5m2 gradients);
power-of-two scales (recipe "te_block"; "deepgemm", "deepgemm_ue8m0" and "mtfp8" take the same
shapes). A recipe object (xte.recipe.Float8BlockScaling(...), Float8CurrentScaling(),
MXFP8BlockScaling(), ...) sets every role's block, format, power-of-two rule and amax epsilon
as TE does (its fmt wins over fmt=); DelayedScaling raises NotImplementedError (xte keeps no amax
history). As TE, every tensor is quantized on its own: in grouped_linear each expert's weight
(so a 128x128 tile never spans two experts, whatever out_features % 128) and, when a group
boundary is not a multiple of 128 rows, each expert's rows for the weight gradient.
  fprop  y  = Q(x) Q(W)^T (+ bias)      xte_gemm, 1x128 x 128x128
  dgrad  dx = Q(dy) Q(W)                 xte_gemm trans_b, 1x128 x 128x128
  wgrad  dW = Qc(dy)^T Qc(x)             xte_gemm trans_a trans_b, 1x128 columnwise x 1x128
GEMM mode (gemm_mode=, default: the recipe object's gemm_mode field, else "exact"): every
product is xte's EXACT GEMM by default (docs/numerics.md section 6), so the only error against
an fp64 product of the same FP8 operands is the fp32 rounding of the 128-element block partials,
the fp32 accumulation over the K blocks and the final rounding to the output dtype. "fast" runs
all three GEMMs (fprop, dgrad, wgrad) in XTE_GEMM_FAST, within the bound gemm.h states for it
(each block partial in a backend-defined order and precision; see include/xte/gemm.h).
"""

from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor

from .._typing import GemmModeLike
from .._lib import DType, GemmMode, Recipe, ScaleLayout, ScalingMode
from .._qtensor import parse_mode, parse_recipe
from ..ops.gemm import parse_gemm_mode
from ..torch import (attention, attention_fwd, moe_permute, moe_unpermute, permute_capacity,
                     permute_rows, router, swiglu)
from .._tensor import dtype_of

__all__ = ["linear", "grouped_linear", "attention", "attention_fwd", "router", "moe_permute",
           "moe_unpermute", "swiglu", "permute_capacity", "permute_rows",
           "group_sizes_from_offsets", "linear_plan", "gemm_mode_of"]

_ops = torch.ops.xte
_B1 = int(ScalingMode.BLOCK_1x128)
_B128 = int(ScalingMode.BLOCK_128x128)
_LAY = int(ScaleLayout.COMPACT)
_FMT_DT = {"e4m3": int(DType.E4M3), "e5m2": int(DType.E5M2)}


def _fmts(fmt):
    f = str(fmt).lower()
    if f == "hybrid":
        return int(DType.E4M3), int(DType.E5M2)
    if f == "e5m2":
        return int(DType.E5M2), int(DType.E5M2)
    return int(DType.E4M3), int(DType.E4M3)


def _out_dt(t):
    """The GEMM's output dtype for a tensor of t's dtype: fp32 / bf16 as they are, fp16 through
    fp32 (the GEMM writes fp32 or bf16; _fin rounds the fp32 result to fp16)."""
    d = dtype_of(t.dtype)
    if d == DType.FP16:
        return int(DType.FP32)
    if d not in (DType.FP32, DType.BF16):
        raise TypeError(f"xte.nn: dtype {t.dtype} (fp32, bf16 or fp16 only)")
    return int(d)


def _fin(t, dtype):
    return t if t.dtype == dtype else t.to(dtype)


def _pow2(v):
    return -1 if v is None else int(bool(v))


def linear_plan(recipe: Any = "te_block", fmt: str = "e4m3") -> tuple:
    """The quantization plan of linear / grouped_linear: (xte recipe, then for the roles input,
    weight, grad: (scaling mode, fp8 dtype, amax_epsilon, force_pow_2)), as ints / floats.
    recipe: an xte recipe name / xte.Recipe (the roles' blocks 1x128, 128x128, 1x128 for the
    block recipes, per-tensor for te_current, 1x32 for the MX recipes; fmt as given) or a recipe
    object (xte.recipe.*: its blocks, formats, power-of-two rule and epsilons)."""
    if getattr(recipe, "delayed", None) is not None and recipe.delayed():
        raise NotImplementedError(
            "xte: DelayedScaling (per-tensor scales from an amax history) is not supported by "
            "xte's Linear modules; use Float8CurrentScaling or Float8BlockScaling")
    r = int(parse_recipe(recipe))
    kws = getattr(recipe, "quantize_kwargs", None)
    roles = []
    if callable(kws):
        for role in ("input", "weight", "grad"):
            kw = kws(role)
            roles.append((int(parse_mode(kw["block"])), _FMT_DT[kw["fmt"]],
                          float(kw.get("amax_epsilon", 0.0)), _pow2(kw.get("force_pow_2"))))
    else:
        ffmt, bfmt = _fmts(fmt)
        if r in (int(Recipe.TE_CURRENT), int(Recipe.TE_DELAYED)):
            if r == int(Recipe.TE_DELAYED):
                raise NotImplementedError("xte: the TE_DELAYED recipe (caller scales from an "
                                          "amax history) is not supported by xte.nn")
            mx = mw = mg = int(ScalingMode.PER_TENSOR)
        elif r in (int(Recipe.MX_TE), int(Recipe.MX_OCP)):
            mx = mw = mg = int(ScalingMode.MXFP8_1x32)
        else:
            mx, mw, mg = _B1, _B128, _B1
        roles = [(mx, ffmt, 0.0, -1), (mw, ffmt, 0.0, -1), (mg, bfmt, 0.0, -1)]
    return (r,) + tuple(roles)


def gemm_mode_of(recipe=None, gemm_mode=None) -> GemmMode:
    """The GemmMode linear / grouped_linear run their GEMMs in: gemm_mode when given ("exact",
    "fast", a GemmMode), else the recipe object's gemm_mode field (xte.recipe.Recipe.gemm_mode,
    "exact" unless set), else EXACT (recipe names carry no mode)."""
    if gemm_mode is None:
        gemm_mode = getattr(recipe, "gemm_mode", None)
    return parse_gemm_mode("exact" if gemm_mode is None else gemm_mode)


def _q(x, plan, role, rowwise, columnwise):
    """[data, scale, cdata, cscale] of x for a role (1 input, 2 weight, 3 grad); the copies not
    asked for are None."""
    mode, fmt, eps, pow2 = plan[role]
    outs = _ops.quantize(x, mode, plan[0], _LAY, fmt, rowwise, columnwise, eps, pow2, True, None)
    d = s = cd = cs = None
    i = 0
    if rowwise:
        d, s = outs[0], outs[1]
        i = 2
    if columnwise:
        cd, cs = outs[i], outs[i + 1]
    return [d, s, cd, cs]


def _meta(plan, role):
    mode, fmt = plan[role][0], plan[role][1]
    return [mode, plan[0], _LAY, _LAY, fmt]


def _w_cols(plan):
    """Whether the weight's columnwise copy is needed for dgrad (blocks along out_features):
    every weight mode but 128x128 tiles, which serve both directions."""
    return plan[2][0] != _B128


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, plan, mode):
        need_wgrad = weight.requires_grad
        need_dgrad = x.requires_grad
        xq = _q(x, plan, 1, True, need_wgrad)
        wq = _q(weight, plan, 2, True, need_dgrad and _w_cols(plan))
        b32 = None if bias is None else bias.to(torch.float32)
        y = _ops.gemm(xq[0], xq[1], None, None, _meta(plan, 1), wq[0], wq[1], None, None,
                      _meta(plan, 2), None, b32, False, False, False, mode, _out_dt(x))
        ctx.save_for_backward(xq[2], xq[3], wq[0], wq[1], wq[2], wq[3])
        ctx.cfg = (plan, mode, x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return _fin(y, x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xc, xcs, w, ws, wc, wcs = ctx.saved_tensors
        plan, mode, xt, wt, bdt = ctx.cfg
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dy = dy.contiguous()
        dx = dw = db = None
        if need_dx or need_dw:
            dyq = _q(dy, plan, 3, need_dx, need_dw)
            mg = _meta(plan, 3)
        if need_dx:
            dx = _fin(_ops.gemm(dyq[0], dyq[1], None, None, mg, w, ws, wc, wcs, _meta(plan, 2),
                                None, None, False, True, False, mode,
                                _out_dt(torch.empty(0, dtype=xt))), xt)
        if need_dw:
            dw = _fin(_ops.gemm(None, None, dyq[2], dyq[3], mg, None, None, xc, xcs,
                                _meta(plan, 1), None, None, True, True, False, mode,
                                _out_dt(torch.empty(0, dtype=wt))), wt)
        if bdt is not None and ctx.needs_input_grad[2]:
            db = dy.sum(0, dtype=torch.float32).to(bdt)
        return dx, dw, db, None, None


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, recipe="te_block",
           fmt: str = "e4m3", *, gemm_mode: Optional[GemmModeLike] = None) -> Tensor:
    """y = x W^T (+ bias) with FP8 forward and backward (see the module doc).
    x [..., K] fp32 / bf16 (y in x's dtype); weight [N, K] fp32 / bf16; bias [N] (added in
    fp32 in the GEMM epilogue; its gradient in bias's dtype). recipe: see linear_plan;
    gemm_mode: see gemm_mode_of (default exact)."""
    plan = linear_plan(recipe, fmt)
    mode = int(gemm_mode_of(recipe, gemm_mode))
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    y = _Linear.apply(x2, weight, bias, plan, mode)
    return y.reshape(tuple(x.shape[:-1]) + (weight.shape[0],))


def _grouped_plan_ok(plan):
    """Whether one grouped GEMM call serves all experts: 1x128 activations / gradients with
    128x128 weight tiles (the weight scales then stack per expert)."""
    return plan[1][0] == _B1 and plan[2][0] == _B128 and plan[3][0] == _B1


def _quantize_experts(weights, plan, N_pad):
    """Each expert's weight [N, K] quantized in 128x128 tiles on its own (as TE quantizes each
    expert weight), stacked into the grouped GEMM's B: data [E * N_pad, K] (zero rows after each
    expert's N rows when N_pad > N) and scales [E * N_pad / 128, ceil(K / 128)] (COMPACT). The
    padding rows are zeros, so each expert's tiles and products are those of its own weight."""
    N, K = weights[0].shape
    datas, scales = [], []
    for w in weights:
        d, s, _, _ = _q(w.contiguous(), plan, 2, True, False)
        if N_pad != N:
            d = torch.cat([d, d.new_zeros((N_pad - N, K))])
        datas.append(d)
        scales.append(s)
    return torch.cat(datas), torch.cat(scales)


class _GroupedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, m_splits, plan, mode, *weights):
        E = len(weights)
        N, K = weights[0].shape
        N_pad = -(-N // 128) * 128 if E > 1 else N
        need_wgrad = any(w.requires_grad for w in weights)
        xq = _q(x, plan, 1, True, need_wgrad)
        wd, ws = _quantize_experts(weights, plan, N_pad)
        y = _ops.gemm_grouped(xq[0], xq[1], None, None, _meta(plan, 1), wd, ws, None, None,
                              _meta(plan, 2), None, None, m_splits, None, E, 0, 0, False, False,
                              False, mode, _out_dt(x))
        if N_pad != N:
            y = y[:, :N].contiguous()
        y = _fin(y, x.dtype)
        ctx.save_for_backward(xq[2], xq[3], wd, ws, m_splits)
        if len({w.dtype for w in weights}) != 1:
            raise TypeError("grouped_linear: the expert weights have different dtypes")
        ctx.cfg = (plan, mode, x.dtype, weights[0].dtype, E, N, N_pad, K)
        return y

    @staticmethod
    def backward(ctx, dy):
        xc, xcs, wd, ws, m_splits = ctx.saved_tensors
        plan, mode, xt, wt, E, N, N_pad, K = ctx.cfg
        need_dx = ctx.needs_input_grad[0]
        need_dw = any(ctx.needs_input_grad[4:])
        dy = dy.contiguous()
        mg = _meta(plan, 3)
        dx = None
        dws = [None] * E
        if need_dx:
            # zero columns up to N_pad: each 1x128 block keeps its amax, the products their sums
            dyp = torch.nn.functional.pad(dy, (0, N_pad - N)) if N_pad != N else dy
            dq = _q(dyp, plan, 3, True, False)
            dx = _ops.gemm_grouped(dq[0], dq[1], None, None, mg, wd, ws, None, None,
                                   _meta(plan, 2), None, None, m_splits, None, E, 0, 0, False,
                                   True, False, mode, _out_dt(torch.empty(0, dtype=xt)))
            dx = _fin(dx, xt)
        if need_dw:
            dq = _q(dy, plan, 3, False, True)
            dw = _ops.gemm_grouped(None, None, dq[2], dq[3], mg, None, None, xc, xcs,
                                   _meta(plan, 1), None, None, m_splits, None, E, 2, 0, True,
                                   True, False, mode, _out_dt(torch.empty(0, dtype=wt)))
            dw = _fin(dw, wt)
            dws = [dw[g] if ctx.needs_input_grad[4 + g] else None for g in range(E)]
        return (dx, None, None, None) + tuple(dws)


def _splits_list(m_splits):
    if isinstance(m_splits, torch.Tensor):
        return [int(v) for v in m_splits.tolist()]
    return [int(v) for v in m_splits]


def grouped_linear(x: Tensor, weight: Union[Tensor, Sequence[Tensor]], m_splits,
                   recipe="te_block", fmt: str = "e4m3", bias=None, *,
                   gemm_mode: Optional[GemmModeLike] = None) -> Tensor:
    """Expert GEMMs: rows [off_g, off_g + m_splits[g]) of x [R, K] times expert g's weight
    [N, K]^T (+ bias[g]) -> [R, N]. weight: [E, N, K] or a sequence of E [N, K] tensors (TE's
    weight0 .. weight{E-1}); bias: None, [E, N] or a sequence of E [N]. m_splits: int64 tensor
    (or list) [E] summing to R. Each expert's weight is quantized on its own (any N). With the
    block recipes (1x128 activations, 128x128 weights) one grouped GEMM serves all experts: N
    padded to a multiple of 128 with zero rows when E > 1, and the weight gradient as a
    K-grouped GEMM when every group but the last has a multiple of 128 rows (always assumed
    under torch.compile); otherwise (another recipe, or unaligned groups in eager mode) each
    expert runs linear() on its rows, its rows quantized on their own as TE does. gemm_mode: see
    gemm_mode_of (default exact), for every GEMM of the call."""
    weights = list(weight.unbind(0)) if isinstance(weight, torch.Tensor) else list(weight)
    if not weights:
        raise ValueError("grouped_linear: no expert weights")
    plan = linear_plan(recipe, fmt)
    mode = int(gemm_mode_of(recipe, gemm_mode))
    E = len(weights)
    use_grouped = _grouped_plan_ok(plan)
    splits = None
    if not torch.compiler.is_compiling():
        splits = _splits_list(m_splits)
        if len(splits) != E:
            raise ValueError(f"m_splits: {len(splits)} values for {E} experts")
        if sum(splits) != x.shape[0]:
            raise ValueError(f"m_splits: sum {sum(splits)} != rows of x {x.shape[0]}")
        if use_grouped and any(m % 128 for m in splits[:-1]):
            use_grouped = False
    ms = m_splits
    if not isinstance(ms, torch.Tensor):
        ms = torch.tensor([int(v) for v in m_splits], dtype=torch.int64)
    if use_grouped:
        y = _GroupedLinear.apply(x, ms, plan, mode, *weights)
    else:
        if splits is None:
            raise NotImplementedError("xte: grouped_linear under torch.compile needs the block "
                                      "recipes (1x128 activations, 128x128 weights)")
        outs = []
        for xg, w in zip(torch.split(x, splits), weights):
            if xg.shape[0] == 0:  # an expert with no rows: an empty product, zero gradients
                outs.append(torch.matmul(xg, w.t()).to(x.dtype))
            else:
                outs.append(_Linear.apply(xg, w, None, plan, mode))
        y = torch.cat(outs)
    if bias is not None:
        b = torch.stack(list(bias)) if not isinstance(bias, torch.Tensor) else bias
        y = y + torch.repeat_interleave(b.to(y.dtype), ms.to(torch.int64), dim=0,
                                        output_size=y.shape[0])
    return y


def group_sizes_from_offsets(expert_offsets: Tensor, rows: int) -> Tensor:
    """Rows per expert for the grouped GEMMs from moe_permute's (padded) expert_offsets [E + 1],
    the unused rows of the static capacity `rows` added to the last expert (they are zeros;
    none when the buffer has exactly permute_rows(...) rows, as xte.nn.MoE's in eager mode)."""
    sizes = expert_offsets[1:] - expert_offsets[:-1]
    tail = rows - expert_offsets[-1:]
    return torch.cat([sizes[:-1], sizes[-1:] + tail])
