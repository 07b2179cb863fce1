"""transformer_engine.pytorch.custom_recipes.gemm over xte: MMParams (GEMM options of the
custom-recipe GEMM: output dtype and split accumulation, the latter without effect in xte)."""
import dataclasses
from typing import Optional

import torch

__all__ = ["MMParams"]


@dataclasses.dataclass
class MMParams:
    """Matrix multiplication parameters."""
    out_dtype: Optional[torch.dtype] = None
    use_split_accumulator: bool = True
