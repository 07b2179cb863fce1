"""transformer_engine_torch (TE's compiled extension module, `tex`) over xte: the DType tags
(xte.transformer_engine.pytorch.constants.DType). TE's raw kernel entry points (generic_gemm,
quantize, ...) are not provided: xte's are xte.torch / xte.ops."""
from .transformer_engine.pytorch.constants import DType  # noqa: F401

__all__ = ["DType"]
