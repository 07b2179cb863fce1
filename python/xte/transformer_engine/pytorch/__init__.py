"""transformer_engine.pytorch over xte: the fused MoE router (router.py), the MoE permutation
functions (permutation.py), the FP8 modules (module.py: Linear, LayerNormLinear, GroupedLinear),
the autocast context and recipe helpers (quantization.py; fp8.py is its older name), the
quantizers (tensor/) and TE's dtype tags (constants.py), under TransformerEngine's names and
signatures: `import transformer_engine.pytorch as te` -> `import xte.transformer_engine.pytorch
as te` (docs/python.md, "Coming from DeepGEMM / TransformerEngine")."""
from .router import *  # noqa: F401,F403
from .permutation import *  # noqa: F401,F403
from .module import *  # noqa: F401,F403
from .fp8 import *  # noqa: F401,F403
from . import constants  # noqa: F401
from .constants import DType  # noqa: F401
from .quantization import *  # noqa: F401,F403
from .tensor import (Float8BlockQuantizer, Float8BlockwiseQTensor,  # noqa: F401
                     Float8BlockwiseQTensorStorage, Float8CurrentScalingQuantizer,
                     Float8Quantizer, Float8Tensor, Float8TensorStorage, MXFP8Quantizer,
                     MXFP8Tensor, MXFP8TensorStorage, Quantizer)
from .utils import get_device_compute_capability, is_bf16_available  # noqa: F401
