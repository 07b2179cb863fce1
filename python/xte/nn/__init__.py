"""xte.nn: autograd modules over xte's custom ops (imports torch).

    Linear          block-scaled FP8 Linear (TransformerEngine Float8BlockScaling numerics)
    GroupedLinear   experts: m-grouped FP8 GEMMs (weight gradient as a K-grouped GEMM)
    MoE             router -> permute -> grouped SwiGLU MLP -> unpermute (DeepSeek / Kimi shaped)
    functional      linear, grouped_linear, attention, router, moe_permute, moe_unpermute, swiglu
"""

from . import functional
from .functional import attention
from .modules import GroupedLinear, Linear, MoE

__all__ = ["Linear", "GroupedLinear", "MoE", "functional", "attention"]
