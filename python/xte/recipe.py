"""Recipe objects under TransformerEngine's names and behaviour (transformer_engine.common.recipe;
also importable as xte.transformer_engine.common.recipe), plus the DeepGEMM, MT-TransformerEngine
MTFP8 and OCP MX recipes xte also implements.

As TE's: keyword construction with TE's fields and defaults, the class queries (`.delayed()`,
`.mxfp8()`, `.float8_current_scaling()`, `.float8_per_tensor_scaling()`,
`.float8_block_scaling()`, `.nvfp4()`, `.custom()`), Format members whose value carries
max_fwd / max_bwd. Each object also carries `.xte_recipe` (the xte.Recipe that parse_recipe
reads, so it can be passed as `recipe=` anywhere) and maps its options to xte.quantize's keyword
arguments through `quantize_kwargs(role)`; xte.quantize applies them where the call leaves an
argument at its default. Roles: "input" (activations, forward), "weight", "grad" (backward).
Format.HYBRID means e4m3 forward and e5m2 for gradients.
GEMM mode (xte's own field, not TE's): every recipe has `gemm_mode`, "exact" by default (a class
attribute; set it on an object, `r.gemm_mode = "fast"`, to run the modules' GEMMs in
XTE_GEMM_FAST). The modules that take a recipe (xte.nn, xte.transformer_engine.pytorch under
autocast) read it; an explicit gemm_mode= of an xte.nn module or function wins. TE's MMParams
(use_split_accumulator) do not select the mode: the exact GEMM's fp32 block partials are what a
split accumulator gives on the GPU, and the default stays bit-reproducible.

Only what changes the arithmetic is used: xte keeps no amax history, so DelayedScaling's
history options are stored for reference only and its scale is passed to quantize(scale=);
the TE-style modules (xte.transformer_engine.pytorch) refuse DelayedScaling with
NotImplementedError. NVFP4BlockScaling (FP4, E2M1) and CustomRecipe exist so that code naming
them imports; xte cannot run them (xte.transformer_engine.pytorch.autocast raises).
"""

import enum
import os
from typing import Any, Dict, NamedTuple, Optional

from ._lib import Recipe as _XRecipe

__all__ = ["Format", "MMParams", "QParams", "Recipe", "DelayedScaling", "Float8CurrentScaling",
           "Float8BlockScaling", "MXFP8BlockScaling", "NVFP4BlockScaling", "CustomRecipe",
           "DeepGEMMScaling", "MTFP8BlockScaling", "OCPMXScaling"]


class _FormatHelper(NamedTuple):
    max_fwd: float
    max_bwd: float


class Format(enum.Enum):
    """FP8 / FP4 formats as TransformerEngine names them: E4M3, E5M2, HYBRID (E4M3 forward,
    E5M2 for gradients), E2M1 (FP4: named only, xte does not run it). The value holds the
    largest finite magnitude of the forward / backward format (TE's max_fwd / max_bwd)."""
    E2M1 = _FormatHelper(max_fwd=6, max_bwd=6)
    E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
    E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
    HYBRID = _FormatHelper(max_fwd=448, max_bwd=57344)


_FMT_NAMES = {"e4m3": Format.E4M3, "e5m2": Format.E5M2, "hybrid": Format.HYBRID,
              "e2m1": Format.E2M1}


def _format(fmt):
    if isinstance(fmt, Format):
        return fmt
    f = _FMT_NAMES.get(str(fmt).lower())
    if f is None:
        raise ValueError(f"fp8_format: {fmt!r} is not one of E4M3, E5M2, HYBRID")
    return f


def _fmt(fmt, role):
    f = _format(fmt)
    if f is Format.E2M1:
        raise NotImplementedError("xte: FP4 (E2M1) tensors are out of xte's scope")
    if f is Format.HYBRID:
        return "e5m2" if role == "grad" else "e4m3"
    return f.name.lower()


_ROLES = ("input", "weight", "grad")


def _role(role):
    if role not in _ROLES:
        raise ValueError(f"role: {role!r} is not one of {', '.join(_ROLES)}")
    return role


class MMParams:
    """TE's GEMM options: use_split_accumulator (xte's exact GEMM always accumulates the
    128-element block partials in fp32, so the flag does not change xte's results)."""

    __slots__ = ("use_split_accumulator",)

    def __init__(self, use_split_accumulator: bool = True) -> None:
        object.__setattr__(self, "use_split_accumulator", bool(use_split_accumulator))

    def __setattr__(self, name, value):
        raise AttributeError("MMParams is frozen")

    def __eq__(self, other):
        return isinstance(other, MMParams) and other.use_split_accumulator == \
            self.use_split_accumulator

    def __hash__(self):
        return hash(self.use_split_accumulator)

    def __repr__(self):
        return f"MMParams(use_split_accumulator={self.use_split_accumulator})"


class QParams:
    """TE's per-tensor-role quantization parameters: power_2_scale (round scales down to powers
    of two: xte's force_pow_2) and amax_epsilon. The FP4 options (random_hadamard_transform,
    stochastic_rounding, fp4_2d_quantization) are kept for NVFP4BlockScaling, which xte does not
    run."""

    __slots__ = ("power_2_scale", "amax_epsilon", "random_hadamard_transform",
                 "stochastic_rounding", "fp4_2d_quantization")

    def __init__(self, power_2_scale: bool = False, amax_epsilon: float = 0.0,
                 random_hadamard_transform: bool = False, stochastic_rounding: bool = False,
                 fp4_2d_quantization: bool = False) -> None:
        self.power_2_scale = bool(power_2_scale)
        self.amax_epsilon = float(amax_epsilon)
        self.random_hadamard_transform = bool(random_hadamard_transform)
        self.stochastic_rounding = bool(stochastic_rounding)
        self.fp4_2d_quantization = bool(fp4_2d_quantization)

    def __eq__(self, other):
        return isinstance(other, QParams) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __hash__(self):
        return hash(tuple(getattr(self, k) for k in self.__slots__))

    def __repr__(self):
        return f"QParams(power_2_scale={self.power_2_scale}, amax_epsilon={self.amax_epsilon})"


_BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")


def _check_override(v):
    if v not in _BACKWARD_OVERRIDES:
        raise ValueError(f"backward_override: {v!r} is not one of None, 'high_precision', "
                         "'dequantized'")
    return v


class Recipe:
    """Base of the recipes (TE's transformer_engine.common.recipe.Recipe): the class queries,
    and xte's gemm_mode ("exact" or "fast": the GEMM mode of the modules that use the recipe)."""

    xte_recipe: Optional[_XRecipe] = None
    fp8_format: "Format"
    gemm_mode: str = "exact"

    @classmethod
    def nvfp4(cls) -> bool:
        """Whether the recipe is NVFP4 block scaling."""
        return issubclass(cls, NVFP4BlockScaling)

    @classmethod
    def mxfp8(cls) -> bool:
        """Whether the recipe is MXFP8 block scaling."""
        return issubclass(cls, MXFP8BlockScaling)

    @classmethod
    def delayed(cls) -> bool:
        """Whether the recipe is delayed scaling."""
        return issubclass(cls, DelayedScaling)

    @classmethod
    def float8_current_scaling(cls) -> bool:
        """Whether the recipe is per-tensor current scaling."""
        return issubclass(cls, Float8CurrentScaling)

    @classmethod
    def float8_per_tensor_scaling(cls) -> bool:
        """Whether the recipe is per-tensor scaling (delayed or current)."""
        return issubclass(cls, (DelayedScaling, Float8CurrentScaling))

    @classmethod
    def float8_block_scaling(cls) -> bool:
        """Whether the recipe is FP8 block scaling (1x128 / 128x128)."""
        return issubclass(cls, Float8BlockScaling)

    @classmethod
    def custom(cls) -> bool:
        """Whether the recipe is a custom (quantizer factory) recipe."""
        return issubclass(cls, CustomRecipe)

    def quantize_kwargs(self, role: str = "input") -> Dict[str, Any]:
        """xte.quantize keyword arguments of this recipe for a tensor role."""
        return {"fmt": _fmt(self.fp8_format, _role(role))}

    def __repr__(self):
        kw = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({kw})"




class DelayedScaling(Recipe):
    """TE's per-tensor delayed scaling (XTE_RECIPE_TE_DELAYED): the scale is the caller's
    (quantize(..., scale=)); scale_inv = 1 / scale. fp8_format default HYBRID as TE. The amax
    history is not kept by xte (the TE-style modules raise NotImplementedError)."""

    xte_recipe = _XRecipe.TE_DELAYED

    def __init__(self, margin: int = 0, fp8_format: Any = Format.HYBRID,
                 amax_history_len: int = 1024, amax_compute_algo: Any = "max",
                 scaling_factor_compute_algo: Any = None, reduce_amax: bool = True,
                 fp8_dpa: bool = False, fp8_mha: bool = False,
                 backward_override: Optional[str] = None) -> None:
        self.margin = margin
        self.fp8_format = _format(fp8_format)
        if self.fp8_format is Format.E5M2:
            raise ValueError("fp8_format: pure E5M2 training is not supported (as TE)")
        self.amax_history_len = amax_history_len
        self.amax_compute_algo = amax_compute_algo
        self.scaling_factor_compute_algo = scaling_factor_compute_algo
        self.reduce_amax = reduce_amax
        self.fp8_dpa = fp8_dpa
        self.fp8_mha = fp8_mha
        if backward_override is not None:
            raise ValueError("backward_override: delayed scaling only supports None (as TE)")
        self.backward_override = None

    def quantize_kwargs(self, role: str = "input") -> Dict[str, Any]:
        return {"fmt": _fmt(self.fp8_format, _role(role)), "block": "per_tensor"}


class _RoleParams:
    """Per-role QParams (fp8_quant_fwd_inp / _fwd_weight / _bwd_grad) shared by the current and
    block scaling recipes."""

    def _qparams(self, role):
        return {"input": self.fp8_quant_fwd_inp, "weight": self.fp8_quant_fwd_weight,
                "grad": self.fp8_quant_bwd_grad}[_role(role)]

    def _set_common(self, fp8_format, inp, weight, grad, pow2, fprop, dgrad, wgrad, fp8_dpa,
                    fp8_mha, backward_override):
        self.fp8_format = _format(fp8_format)
        self.fp8_quant_fwd_inp = inp if inp is not None else QParams(pow2, 0.0)
        self.fp8_quant_fwd_weight = weight if weight is not None else QParams(pow2, 0.0)
        self.fp8_quant_bwd_grad = grad if grad is not None else QParams(pow2, 0.0)
        self.fp8_gemm_fprop = fprop
        self.fp8_gemm_dgrad = dgrad
        self.fp8_gemm_wgrad = wgrad
        self.fp8_dpa = fp8_dpa
        self.fp8_mha = fp8_mha
        self.backward_override = _check_override(backward_override)

    def quantize_kwargs(self, role="input"):
        q = self._qparams(role)
        return {"fmt": _fmt(self.fp8_format, role), "block": "per_tensor",
                "force_pow_2": q.power_2_scale, "amax_epsilon": q.amax_epsilon}


class Float8CurrentScaling(_RoleParams, Recipe):
    """TE's per-tensor current scaling (XTE_RECIPE_TE_CURRENT): scale = fp8_max / amax of the
    tensor. Defaults as TE: fp8_format HYBRID, power-of-two scales off (use_power_2_scales, or
    NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES=1), amax_epsilon 0."""

    xte_recipe = _XRecipe.TE_CURRENT

    def __init__(self, fp8_format: Any = Format.HYBRID, fp8_quant_fwd_inp: Optional[QParams] = None,
                 fp8_quant_fwd_weight: Optional[QParams] = None,
                 fp8_quant_bwd_grad: Optional[QParams] = None,
                 use_power_2_scales: Optional[bool] = None,
                 fp8_gemm_fprop: MMParams = MMParams(False),
                 fp8_gemm_dgrad: MMParams = MMParams(True),
                 fp8_gemm_wgrad: MMParams = MMParams(True), fp8_dpa: bool = False,
                 fp8_mha: bool = False, backward_override: Optional[str] = None) -> None:
        if use_power_2_scales is None:
            use_power_2_scales = os.getenv("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "0") == "1"
        self.use_power_2_scales = bool(use_power_2_scales)
        self._set_common(fp8_format, fp8_quant_fwd_inp, fp8_quant_fwd_weight,
                         fp8_quant_bwd_grad, self.use_power_2_scales, fp8_gemm_fprop,
                         fp8_gemm_dgrad, fp8_gemm_wgrad, fp8_dpa, fp8_mha, backward_override)


class Float8BlockScaling(_RoleParams, Recipe):
    """TE's Float8BlockScaling (XTE_RECIPE_TE_BLOCK), DeepSeek-V3 style: 1x128 blocks for
    activations and gradients, 128x128 for weights (x_block_scaling_dim / grad_block_scaling_dim
    1 = 1x128, w_block_scaling_dim 2 = 128x128). Defaults as TE: fp8_format E4M3,
    power-of-two scales (use_f32_scales=False, or NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1),
    amax_epsilon 0."""

    xte_recipe = _XRecipe.TE_BLOCK

    def __init__(self, fp8_format: Any = Format.E4M3, fp8_quant_fwd_inp: Optional[QParams] = None,
                 fp8_quant_fwd_weight: Optional[QParams] = None,
                 fp8_quant_bwd_grad: Optional[QParams] = None, x_block_scaling_dim: int = 1,
                 w_block_scaling_dim: int = 2, grad_block_scaling_dim: int = 1,
                 use_f32_scales: Optional[bool] = None, fp8_gemm_fprop: MMParams = MMParams(True),
                 fp8_gemm_dgrad: MMParams = MMParams(True),
                 fp8_gemm_wgrad: MMParams = MMParams(True), fp8_dpa: bool = False,
                 fp8_mha: bool = False, backward_override: Optional[str] = None) -> None:
        if use_f32_scales is None:
            use_f32_scales = os.getenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "0") == "1"
        self.use_f32_scales = bool(use_f32_scales)
        self._set_common(fp8_format, fp8_quant_fwd_inp, fp8_quant_fwd_weight,
                         fp8_quant_bwd_grad, not self.use_f32_scales, fp8_gemm_fprop,
                         fp8_gemm_dgrad, fp8_gemm_wgrad, fp8_dpa, fp8_mha, backward_override)
        if self.fp8_format is Format.E5M2:
            raise ValueError("fp8_format: pure E5M2 training is not supported (as TE)")
        for name, d in (("x_block_scaling_dim", x_block_scaling_dim),
                        ("w_block_scaling_dim", w_block_scaling_dim),
                        ("grad_block_scaling_dim", grad_block_scaling_dim)):
            if d not in (1, 2):
                raise ValueError(f"{name}: {d!r}, expected 1 (1x128) or 2 (128x128)")
        self.x_block_scaling_dim = x_block_scaling_dim
        self.w_block_scaling_dim = w_block_scaling_dim
        self.grad_block_scaling_dim = grad_block_scaling_dim

    def quantize_kwargs(self, role: str = "input") -> Dict[str, Any]:
        kw = super().quantize_kwargs(role)
        dim = {"input": self.x_block_scaling_dim, "weight": self.w_block_scaling_dim,
               "grad": self.grad_block_scaling_dim}[role]
        kw["block"] = "1x128" if dim == 1 else "128x128"
        return kw


class MXFP8BlockScaling(Recipe):
    """TE's MXFP8BlockScaling (XTE_RECIPE_MX_TE): 1x32 blocks, E8M0 scales rounded up as TE /
    cuBLAS. fp8_format default E4M3 as TE."""

    xte_recipe = _XRecipe.MX_TE

    def __init__(self, margin: int = 0, fp8_format: Any = Format.E4M3, fp8_dpa: bool = False,
                 fp8_mha: bool = False, backward_override: Optional[str] = None,
                 enable_2d_quantization: bool = False) -> None:
        self.margin = margin
        self.fp8_format = _format(fp8_format)
        if self.fp8_format is Format.E5M2:
            raise ValueError("fp8_format: pure E5M2 training is not supported (as TE)")
        self.fp8_dpa = fp8_dpa
        self.fp8_mha = fp8_mha
        self.backward_override = _check_override(backward_override)
        self.enable_2d_quantization = bool(enable_2d_quantization)

    def quantize_kwargs(self, role: str = "input") -> Dict[str, Any]:
        return {"fmt": _fmt(self.fp8_format, _role(role)), "block": "1x32"}


class OCPMXScaling(MXFP8BlockScaling):
    """MXFP8 as the OCP MX reference computes it (XTE_RECIPE_MX_OCP): shared exponent
    floor(log2(amax)) - emax_elem."""

    xte_recipe = _XRecipe.MX_OCP


class NVFP4BlockScaling(Recipe):
    """TE's NVFP4 recipe (FP4 E2M1 data, E4M3 block scales): named so that code referring to it
    imports; xte has no FP4 kernels (quantize_kwargs and the TE-style autocast raise
    NotImplementedError)."""

    def __init__(self, fp4_format: Any = Format.E2M1, fp8_format: Any = Format.E4M3,
                 **options) -> None:
        self.fp4_format = _format(fp4_format)
        self.fp8_format = _format(fp8_format)
        for k, v in options.items():
            setattr(self, k, v)

    def quantize_kwargs(self, role: str = "input") -> Dict[str, Any]:
        raise NotImplementedError("xte: NVFP4BlockScaling (FP4, E2M1) is out of xte's scope")


class CustomRecipe(Recipe):
    """TE's CustomRecipe (a quantizer factory): named so that code referring to it imports;
    xte's TE-style modules do not run user quantizer factories (autocast raises
    NotImplementedError)."""

    def __init__(self, qfactory: Any = None, fp8_format: Any = Format.HYBRID, fp8_dpa: bool = False,
                 fp8_mha: bool = False, backward_override: Optional[str] = None,
                 quantization_alignment: int = 128) -> None:
        self.qfactory = qfactory
        self.fp8_format = _format(fp8_format)
        self.fp8_dpa = fp8_dpa
        self.fp8_mha = fp8_mha
        self.backward_override = _check_override(backward_override)
        self.quantization_alignment = quantization_alignment

    def quantize_kwargs(self, role: str = "input") -> Dict[str, Any]:
        raise NotImplementedError("xte: CustomRecipe (user quantizer factories) is not "
                                  "supported")


class DeepGEMMScaling(Recipe):
    """DeepGEMM's per_token (1x128, activations) / per_block (128x128, weights) casts
    (XTE_RECIPE_DEEPGEMM, or DEEPGEMM_UE8M0 with use_ue8m0: scales rounded up to powers of
    two). E4M3."""

    def __init__(self, use_ue8m0: bool = False) -> None:
        self.use_ue8m0 = bool(use_ue8m0)
        self.fp8_format = Format.E4M3

    @property
    def xte_recipe(self):
        return _XRecipe.DEEPGEMM_UE8M0 if self.use_ue8m0 else _XRecipe.DEEPGEMM

    def quantize_kwargs(self, role: str = "input") -> Dict[str, Any]:
        return {"fmt": "e4m3", "block": "128x128" if _role(role) == "weight" else "1x128"}


class MTFP8BlockScaling(Recipe):
    """MT-TransformerEngine's MTFP8 block scaling (XTE_RECIPE_MTFP8): 1x128 activations /
    gradients, 128x128 weights by default; its columnwise copy is not transposed."""

    xte_recipe = _XRecipe.MTFP8

    def __init__(self, fp8_format: Any = Format.E4M3, x_block_scaling_dim: int = 1,
                 w_block_scaling_dim: int = 2, grad_block_scaling_dim: int = 1) -> None:
        self.fp8_format = fp8_format
        self.x_block_scaling_dim = x_block_scaling_dim
        self.w_block_scaling_dim = w_block_scaling_dim
        self.grad_block_scaling_dim = grad_block_scaling_dim

    def quantize_kwargs(self, role: str = "input") -> Dict[str, Any]:
        dim = {"input": self.x_block_scaling_dim, "weight": self.w_block_scaling_dim,
               "grad": self.grad_block_scaling_dim}[_role(role)]
        return {"fmt": _fmt(self.fp8_format, role), "block": "1x128" if dim == 1 else "128x128"}
