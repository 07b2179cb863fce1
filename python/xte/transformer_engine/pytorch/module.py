"""transformer_engine.pytorch.module over xte: Linear, LayerNormLinear and GroupedLinear with
TransformerEngine's constructor signatures, parameter names (weight, bias; layer_norm_weight,
layer_norm_bias; weight0 .. weight{E-1}, bias0 ..) and forward signatures.

Inside an enabled `autocast(recipe=...)` (or `fp8_autocast(fp8_recipe=...)`) the GEMMs run in
FP8 through xte.nn.functional.linear / grouped_linear with the recipe's blocks, formats and
scale rules (Float8BlockScaling, Float8CurrentScaling, MXFP8BlockScaling); outside, in the
parameters' precision (torch). Every tensor is quantized on its own as in TE: each expert's
weight in GroupedLinear, whatever out_features % 128. The FP8 GEMMs run in the recipe's
gemm_mode (xte's field of every recipe, "exact" by default: xte's exact GEMM; set
`recipe.gemm_mode = "fast"` for XTE_GEMM_FAST); TE's MMParams do not change it.

Differences from TE: device defaults to torch's default device (TE: "cuda"); the options xte
cannot honour raise NotImplementedError naming them when set away from their defaults (tensor
parallelism tp_size > 1 / tp_group, sequence_parallel with TP, userbuffers ub_*,
fuse_wgrad_accumulation, delay_wgrad_compute, fp8_output / fp8_grad, parameters_split,
single_grouped_weight / single_grouped_bias); is_first_microbatch is accepted (xte quantizes
the weight on every forward, which gives the bytes TE's weight cache would hold).
"""
from typing import Any, List, Optional

import torch
from torch import nn

from ...nn import functional as _F
from .quantization import FP8GlobalStateManager, get_align_size_for_quantization

__all__ = ["Linear", "LayerNormLinear", "GroupedLinear", "Fp8Padding", "Fp8Unpadding"]


def _refuse(**opts):
    for name, (value, default) in opts.items():
        if value != default:
            raise NotImplementedError(f"xte: {name}={value!r} is not supported by xte's "
                                      "TransformerEngine modules")


def _common_refusals(tp_group, tp_size, sequence_parallel, fuse_wgrad_accumulation, ub,
                     delay_wgrad_compute, parameters_split=None, parallel_mode=None):
    if tp_group is not None:
        raise NotImplementedError("xte: tp_group (tensor parallelism) is not supported by xte's "
                                  "TransformerEngine modules")
    _refuse(tp_size=(tp_size, 1), fuse_wgrad_accumulation=(fuse_wgrad_accumulation, False),
            delay_wgrad_compute=(delay_wgrad_compute, False),
            parameters_split=(parameters_split, None))
    for k, v in ub.items():
        if v not in (False, None):
            raise NotImplementedError(f"xte: {k}={v!r} (userbuffers overlap) is not supported")
    if parallel_mode not in ("row", "column", None):
        raise ValueError(f"parallel_mode {parallel_mode!r} not supported. Supported modes: "
                         "('row', 'column', None)")


def _default_init(w):
    """TE's default weight initialisation: normal, mean 0, std 0.023."""
    nn.init.normal_(w, mean=0.0, std=0.023)


def _fp8_recipe():
    if FP8GlobalStateManager.is_fp8_enabled():
        return FP8GlobalStateManager.get_fp8_recipe()
    return None


def _linear(x, weight, bias, recipe):
    if recipe is None:
        return torch.nn.functional.linear(x, weight, None if bias is None else bias.to(x.dtype))
    return _F.linear(x, weight, bias, recipe)


class Linear(nn.Module):
    """TE's Linear: y = x W^T + b, weight [out_features, in_features] in params_dtype."""

    def __init__(self, in_features: int, out_features: int, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group: Any = None, tp_size: int = 1,
                 get_rng_state_tracker: Any = None, rng_tracker_name: Optional[str] = None,
                 init_method: Any = None, bias: bool = True, return_bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, parallel_mode: Optional[str] = None,
                 parameters_split: Any = None, device: Any = None, ub_overlap_ag: bool = False,
                 ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False,
                 ub_bulk_dgrad: bool = False, ub_bulk_wgrad: bool = False,
                 ub_name: Optional[str] = None, delay_wgrad_compute: bool = False,
                 symmetric_ar_type=None, save_original_input: bool = False,
                 name: Optional[str] = None) -> None:
        super().__init__()
        _common_refusals(tp_group, tp_size, sequence_parallel, fuse_wgrad_accumulation,
                         dict(ub_overlap_ag=ub_overlap_ag, ub_overlap_rs=ub_overlap_rs,
                              ub_overlap_rs_dgrad=ub_overlap_rs_dgrad,
                              ub_bulk_dgrad=ub_bulk_dgrad, ub_bulk_wgrad=ub_bulk_wgrad),
                         delay_wgrad_compute, parameters_split, parallel_mode)
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        self.in_features, self.out_features = in_features, out_features
        self.use_bias, self.return_bias = bias, return_bias
        self.apply_bias = bias and not return_bias
        self.parallel_mode, self.sequence_parallel = parallel_mode, False
        self.fuse_wgrad_accumulation = False
        self.tp_size, self.name = 1, name
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=params_dtype,
                                               device=device))
        (init_method or _default_init)(self.weight)
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=params_dtype,
                                                 device=device))
        else:
            self.register_parameter("bias", None)

    def forward(self, inp: torch.Tensor, is_first_microbatch: Optional[bool] = None,
                fp8_output: bool = False, fp8_grad: bool = False):
        _refuse(fp8_output=(fp8_output, False), fp8_grad=(fp8_grad, False))
        out = _linear(inp, self.weight, self.bias if self.apply_bias else None, _fp8_recipe())
        if self.return_bias:
            return out, (self.bias.to(inp.dtype) if self.bias is not None else None)
        return out

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.use_bias}")


class LayerNormLinear(nn.Module):
    """TE's LayerNormLinear: LayerNorm or RMSNorm (torch, in the input's dtype) then Linear.
    return_layernorm_output: forward also returns the normalised input."""

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5,
                 sequence_parallel: bool = False, fuse_wgrad_accumulation: bool = False,
                 tp_group: Any = None, tp_size: int = 1, get_rng_state_tracker: Any = None,
                 init_method: Any = None, bias: bool = True, normalization: str = "LayerNorm",
                 return_bias: bool = False, params_dtype: Optional[torch.dtype] = None,
                 parallel_mode: Optional[str] = None, return_layernorm_output: bool = False,
                 return_layernorm_output_gathered: bool = False, parameters_split: Any = None,
                 zero_centered_gamma: bool = False, device: Any = None, ub_overlap_ag: bool = False,
                 ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False,
                 ub_bulk_wgrad: bool = False, ub_bulk_dgrad: bool = False,
                 ub_name: Optional[str] = None, delay_wgrad_compute: bool = False,
                 symmetric_ar_type=None, name: Optional[str] = None) -> None:
        super().__init__()
        _common_refusals(tp_group, tp_size, sequence_parallel, fuse_wgrad_accumulation,
                         dict(ub_overlap_ag=ub_overlap_ag, ub_overlap_rs=ub_overlap_rs,
                              ub_overlap_rs_dgrad=ub_overlap_rs_dgrad,
                              ub_bulk_dgrad=ub_bulk_dgrad, ub_bulk_wgrad=ub_bulk_wgrad),
                         delay_wgrad_compute, parameters_split, parallel_mode)
        if normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError("Unsupported normalization type!")
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        self.in_features, self.out_features = in_features, out_features
        self.eps, self.normalization = eps, normalization
        self.zero_centered_gamma = zero_centered_gamma
        self.use_bias, self.return_bias = bias, return_bias
        self.apply_bias = bias and not return_bias
        self.return_layernorm_output = return_layernorm_output
        self.parallel_mode, self.sequence_parallel, self.tp_size = parallel_mode, False, 1
        self.name = name
        g0 = 0.0 if zero_centered_gamma else 1.0
        self.layer_norm_weight = nn.Parameter(torch.full((in_features,), g0, dtype=params_dtype,
                                                         device=device))
        if normalization == "LayerNorm":
            self.layer_norm_bias = nn.Parameter(torch.zeros(in_features, dtype=params_dtype,
                                                            device=device))
        else:
            self.register_parameter("layer_norm_bias", None)
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=params_dtype,
                                               device=device))
        (init_method or _default_init)(self.weight)
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=params_dtype,
                                                 device=device))
        else:
            self.register_parameter("bias", None)

    def _norm(self, x):
        g = self.layer_norm_weight + 1 if self.zero_centered_gamma else self.layer_norm_weight
        if self.normalization == "LayerNorm":
            return torch.nn.functional.layer_norm(x, (self.in_features,), g.to(x.dtype),
                                                  self.layer_norm_bias.to(x.dtype), self.eps)
        return torch.nn.functional.rms_norm(x, (self.in_features,), g.to(x.dtype), self.eps)

    def forward(self, inp: torch.Tensor, is_first_microbatch: Optional[bool] = None,
                fp8_output: bool = False, fp8_grad: bool = False):
        _refuse(fp8_output=(fp8_output, False), fp8_grad=(fp8_grad, False))
        ln_out = self._norm(inp)
        out = _linear(ln_out, self.weight, self.bias if self.apply_bias else None,
                      _fp8_recipe())
        if self.return_bias:
            b = self.bias.to(inp.dtype) if self.bias is not None else None
            return (out, b, ln_out) if self.return_layernorm_output else (out, b)
        return (out, ln_out) if self.return_layernorm_output else out


class GroupedLinear(nn.Module):
    """TE's GroupedLinear: num_gemms experts, parameters weight0 .. weight{num_gemms-1}
    [out_features, in_features] (and bias0 ..); forward(inp [R, in_features], m_splits) with
    m_splits a list or an int tensor of rows per expert (summing to R) -> [R, out_features].
    Under FP8 each expert's weight is quantized on its own (xte.nn.functional.grouped_linear)."""

    def __init__(self, num_gemms: int, in_features: int, out_features: int,
                 sequence_parallel: bool = False, fuse_wgrad_accumulation: bool = False,
                 tp_group: Any = None, tp_size: int = 1, get_rng_state_tracker: Any = None,
                 rng_tracker_name: Optional[str] = None, init_method: Any = None, bias: bool = True,
                 return_bias: bool = False, params_dtype: Optional[torch.dtype] = None,
                 parallel_mode: Optional[str] = None, device: Any = None,
                 ub_overlap_rs: bool = False, ub_overlap_ag: bool = False,
                 ub_name: Optional[str] = None, delay_wgrad_compute: bool = False,
                 save_original_input: bool = False, single_grouped_weight: bool = False,
                 single_grouped_bias: bool = False, name: Optional[str] = None,
                 use_grouped_tensor=None) -> None:
        super().__init__()
        _common_refusals(tp_group, tp_size, sequence_parallel, fuse_wgrad_accumulation,
                         dict(ub_overlap_rs=ub_overlap_rs, ub_overlap_ag=ub_overlap_ag),
                         delay_wgrad_compute, None, parallel_mode)
        _refuse(single_grouped_weight=(single_grouped_weight, False),
                single_grouped_bias=(single_grouped_bias, False))
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.use_bias, self.return_bias = bias, return_bias
        self.apply_bias = bias and not return_bias
        self.parallel_mode, self.sequence_parallel, self.tp_size = parallel_mode, False, 1
        self.name = name
        for i in range(num_gemms):
            w = nn.Parameter(torch.empty(out_features, in_features, dtype=params_dtype,
                                         device=device))
            (init_method or _default_init)(w)
            self.register_parameter(f"weight{i}", w)
            if bias:
                self.register_parameter(f"bias{i}", nn.Parameter(
                    torch.zeros(out_features, dtype=params_dtype, device=device)))
            else:
                setattr(self, f"bias{i}", torch.Tensor().to(dtype=params_dtype, device=device))

    def forward(self, inp: torch.Tensor, m_splits: List[int],
                is_first_microbatch: Optional[bool] = None, out: Any = None, dgrad_out: Any = None):
        _refuse(out=(out, None), dgrad_out=(dgrad_out, None))
        weights = [getattr(self, f"weight{i}") for i in range(self.num_gemms)]
        biases = ([getattr(self, f"bias{i}") for i in range(self.num_gemms)]
                  if self.use_bias else None)
        shape = inp.shape
        x = inp.reshape(-1, self.in_features)
        recipe = _fp8_recipe()
        if recipe is None:
            splits = (m_splits.tolist() if isinstance(m_splits, torch.Tensor)
                      else list(m_splits))
            y = torch.cat([torch.nn.functional.linear(xg, w) for xg, w in
                           zip(torch.split(x, splits), weights)])
            if self.apply_bias:
                assert biases is not None  # apply_bias implies use_bias
                y = y + torch.repeat_interleave(torch.stack(biases).to(y.dtype),
                                                torch.tensor(splits), dim=0)
        else:
            y = _F.grouped_linear(x, weights, m_splits, recipe,
                                  bias=biases if self.apply_bias else None)
        y = y.reshape(tuple(shape[:-1]) + (self.out_features,))
        if self.return_bias:
            return y, [b.to(inp.dtype) for b in biases] if biases else biases
        return y

    def extra_repr(self) -> str:
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, "
                f"out_features={self.out_features}, bias={self.use_bias}")


def _aligned_splits(module, m_splits):
    if len(m_splits) != module.num_gemms:
        raise ValueError("Number of splits should match number of GEMMs.")
    if module.align_size is None:
        module.align_size = get_align_size_for_quantization(
            FP8GlobalStateManager.get_fp8_recipe())
    a = module.align_size
    return [int(m) for m in m_splits], [(int(m) + a - 1) // a * a for m in m_splits]


class Fp8Padding(nn.Module):
    """TE's Fp8Padding: pads each of num_gemms row groups of inp with zero rows to a multiple of
    align_size (None: the autocast recipe's alignment, 16; 32 for MXFP8). forward(inp,
    m_splits) -> (padded, padded_m_splits); the gradient drops the padding rows."""

    def __init__(self, num_gemms: int, align_size: Optional[int] = None) -> None:
        super().__init__()
        self.num_gemms, self.align_size = num_gemms, align_size

    def forward(self, inp: torch.Tensor, m_splits: List[int]):
        splits, padded = _aligned_splits(self, m_splits)
        if splits == padded:
            return inp, splits
        parts = torch.split(inp, splits)
        out = torch.cat([torch.nn.functional.pad(p, (0,) * (2 * p.dim() - 1) + (q - m,))
                         for p, m, q in zip(parts, splits, padded)])
        return out, padded


class Fp8Unpadding(nn.Module):
    """TE's Fp8Unpadding: the inverse of Fp8Padding. forward(inp, m_splits) keeps the first
    m_splits[g] rows of each padded group."""

    def __init__(self, num_gemms: int, align_size: Optional[int] = None) -> None:
        super().__init__()
        self.num_gemms, self.align_size = num_gemms, align_size

    def forward(self, inp: torch.Tensor, m_splits: List[int]):
        splits, padded = _aligned_splits(self, m_splits)
        if splits == padded:
            return inp
        return torch.cat([p[:m] for p, m in zip(torch.split(inp, padded), splits)])

