"""Recipe objects under TransformerEngine's names (transformer_engine.common.recipe), plus the
DeepGEMM, MT-TransformerEngine MTFP8 and OCP MX recipes xte also implements.

Each object carries `.xte_recipe` (the xte.Recipe that parse_recipe reads, so it can be passed
as `recipe=` anywhere) and maps its options to xte.quantize's keyword arguments through
`quantize_kwargs(role)`; xte.quantize applies them where the call leaves an argument at its
default. Roles: "input" (activations, forward), "weight", "grad" (backward). TE's Format.HYBRID
means e4m3 forward and e5m2 for gradients.

Only what changes the arithmetic is kept: xte keeps no amax history, so DelayedScaling's
history options are stored for reference only and its scale is passed to quantize(scale=).
"""

import enum

from ._lib import Recipe

__all__ = ["Format", "QParams", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling",
           "MXFP8BlockScaling", "DeepGEMMScaling", "MTFP8BlockScaling", "OCPMXScaling"]


class Format(enum.Enum):
    """FP8 formats as TransformerEngine names them: E4M3, E5M2, or HYBRID (E4M3 forward, E5M2
    for gradients)."""
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    HYBRID = "hybrid"


def _fmt(fmt, role):
    f = Format(fmt.value if isinstance(fmt, Format) else str(fmt).lower())
    if f is Format.HYBRID:
        return "e5m2" if role == "grad" else "e4m3"
    return f.value


_ROLES = ("input", "weight", "grad")


def _role(role):
    if role not in _ROLES:
        raise ValueError(f"role: {role!r} is not one of {', '.join(_ROLES)}")
    return role


class QParams:
    """TE's per-tensor-role quantization parameters: power_2_scale (round scales down to powers
    of two: xte's force_pow_2) and amax_epsilon."""

    __slots__ = ("power_2_scale", "amax_epsilon")

    def __init__(self, power_2_scale=False, amax_epsilon=0.0):
        self.power_2_scale = bool(power_2_scale)
        self.amax_epsilon = float(amax_epsilon)

    def __repr__(self):
        return f"QParams(power_2_scale={self.power_2_scale}, amax_epsilon={self.amax_epsilon})"


class _Base:
    xte_recipe = None

    def quantize_kwargs(self, role="input"):
        """xte.quantize keyword arguments of this recipe for a tensor role."""
        return {"fmt": _fmt(self.fp8_format, _role(role))}

    def __repr__(self):
        kw = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({kw})"


class DelayedScaling(_Base):
    """TE's per-tensor delayed scaling (XTE_RECIPE_TE_DELAYED): the scale is the caller's
    (quantize(..., scale=)); scale_inv = 1 / scale. fp8_format default HYBRID as TE."""

    xte_recipe = Recipe.TE_DELAYED

    def __init__(self, margin=0, fp8_format=Format.HYBRID, amax_history_len=1024,
                 amax_compute_algo="max"):
        self.margin = margin
        self.fp8_format = fp8_format
        self.amax_history_len = amax_history_len
        self.amax_compute_algo = amax_compute_algo

    def quantize_kwargs(self, role="input"):
        return {"fmt": _fmt(self.fp8_format, _role(role)), "block": "per_tensor"}


class Float8CurrentScaling(_Base):
    """TE's per-tensor current scaling (XTE_RECIPE_TE_CURRENT): scale = fp8_max / amax of the
    tensor. Defaults as TE: fp8_format HYBRID, power_2_scale False, amax_epsilon 0."""

    xte_recipe = Recipe.TE_CURRENT

    def __init__(self, fp8_format=Format.HYBRID, fp8_quant_fwd_inp=None,
                 fp8_quant_fwd_weight=None, fp8_quant_bwd_grad=None):
        self.fp8_format = fp8_format
        self.fp8_quant_fwd_inp = fp8_quant_fwd_inp or QParams(False, 0.0)
        self.fp8_quant_fwd_weight = fp8_quant_fwd_weight or QParams(False, 0.0)
        self.fp8_quant_bwd_grad = fp8_quant_bwd_grad or QParams(False, 0.0)

    def _qparams(self, role):
        return {"input": self.fp8_quant_fwd_inp, "weight": self.fp8_quant_fwd_weight,
                "grad": self.fp8_quant_bwd_grad}[_role(role)]

    def quantize_kwargs(self, role="input"):
        q = self._qparams(role)
        return {"fmt": _fmt(self.fp8_format, role), "block": "per_tensor",
                "force_pow_2": q.power_2_scale, "amax_epsilon": q.amax_epsilon}


class Float8BlockScaling(Float8CurrentScaling):
    """TE's Float8BlockScaling (XTE_RECIPE_TE_BLOCK), DeepSeek-V3 style: 1x128 blocks for
    activations and gradients, 128x128 for weights (x_block_scaling_dim / grad_block_scaling_dim
    1 = 1x128, w_block_scaling_dim 2 = 128x128). Defaults as TE: fp8_format E4M3,
    power_2_scale True, amax_epsilon 0."""

    xte_recipe = Recipe.TE_BLOCK

    def __init__(self, fp8_format=Format.E4M3, fp8_quant_fwd_inp=None,
                 fp8_quant_fwd_weight=None, fp8_quant_bwd_grad=None, x_block_scaling_dim=1,
                 w_block_scaling_dim=2, grad_block_scaling_dim=1):
        super().__init__(fp8_format, fp8_quant_fwd_inp or QParams(True, 0.0),
                         fp8_quant_fwd_weight or QParams(True, 0.0),
                         fp8_quant_bwd_grad or QParams(True, 0.0))
        for name, d in (("x_block_scaling_dim", x_block_scaling_dim),
                        ("w_block_scaling_dim", w_block_scaling_dim),
                        ("grad_block_scaling_dim", grad_block_scaling_dim)):
            if d not in (1, 2):
                raise ValueError(f"{name}: {d!r}, expected 1 (1x128) or 2 (128x128)")
        self.x_block_scaling_dim = x_block_scaling_dim
        self.w_block_scaling_dim = w_block_scaling_dim
        self.grad_block_scaling_dim = grad_block_scaling_dim

    def quantize_kwargs(self, role="input"):
        kw = super().quantize_kwargs(role)
        dim = {"input": self.x_block_scaling_dim, "weight": self.w_block_scaling_dim,
               "grad": self.grad_block_scaling_dim}[role]
        kw["block"] = "1x128" if dim == 1 else "128x128"
        return kw


class MXFP8BlockScaling(_Base):
    """TE's MXFP8BlockScaling (XTE_RECIPE_MX_TE): 1x32 blocks, E8M0 scales rounded up as TE /
    cuBLAS. fp8_format default E4M3 as TE."""

    xte_recipe = Recipe.MX_TE

    def __init__(self, margin=0, fp8_format=Format.E4M3):
        self.margin = margin
        self.fp8_format = fp8_format

    def quantize_kwargs(self, role="input"):
        return {"fmt": _fmt(self.fp8_format, _role(role)), "block": "1x32"}


class OCPMXScaling(MXFP8BlockScaling):
    """MXFP8 as the OCP MX reference computes it (XTE_RECIPE_MX_OCP): shared exponent
    floor(log2(amax)) - emax_elem."""

    xte_recipe = Recipe.MX_OCP


class DeepGEMMScaling(_Base):
    """DeepGEMM's per_token (1x128, activations) / per_block (128x128, weights) casts
    (XTE_RECIPE_DEEPGEMM, or DEEPGEMM_UE8M0 with use_ue8m0: scales rounded up to powers of
    two). E4M3."""

    def __init__(self, use_ue8m0=False):
        self.use_ue8m0 = bool(use_ue8m0)
        self.fp8_format = Format.E4M3

    @property
    def xte_recipe(self):
        return Recipe.DEEPGEMM_UE8M0 if self.use_ue8m0 else Recipe.DEEPGEMM

    def quantize_kwargs(self, role="input"):
        return {"fmt": "e4m3", "block": "128x128" if _role(role) == "weight" else "1x128"}


class MTFP8BlockScaling(_Base):
    """MT-TransformerEngine's MTFP8 block scaling (XTE_RECIPE_MTFP8): 1x128 activations /
    gradients, 128x128 weights by default; its columnwise copy is not transposed."""

    xte_recipe = Recipe.MTFP8

    def __init__(self, fp8_format=Format.E4M3, x_block_scaling_dim=1, w_block_scaling_dim=2,
                 grad_block_scaling_dim=1):
        self.fp8_format = fp8_format
        self.x_block_scaling_dim = x_block_scaling_dim
        self.w_block_scaling_dim = w_block_scaling_dim
        self.grad_block_scaling_dim = grad_block_scaling_dim

    def quantize_kwargs(self, role="input"):
        dim = {"input": self.x_block_scaling_dim, "weight": self.w_block_scaling_dim,
               "grad": self.grad_block_scaling_dim}[_role(role)]
        return {"fmt": _fmt(self.fp8_format, role), "block": "1x128" if dim == 1 else "128x128"}
