"""Type aliases of xte's public signatures (for type checkers and readers; nothing at run time).

Array: a NumPy array or a torch tensor (xte takes either, zero-copy, and returns results in the
framework of its inputs). Pair: DeepGEMM's (data, scales) operand. DTypeLike: an xte.DType, a
NumPy / torch dtype or a name ("e4m3", "bfloat16", ...). EnumLike: an xte enum member, its int
or its name ("exact", "1x128", "te_block", ...). GemmModeLike: "exact", "fast" or xte.GemmMode.
"""

from typing import TYPE_CHECKING, Any, Tuple, Union

if TYPE_CHECKING:
    import numpy
    import torch

    Array = Union[numpy.ndarray, torch.Tensor]
else:
    Array = Any

Pair = Tuple[Array, Array]
DTypeLike = Any
EnumLike = Union[str, int]
GemmModeLike = Union[str, int]  # "exact" / "fast" or an xte.GemmMode (an IntEnum)

__all__ = ["Array", "Pair", "DTypeLike", "EnumLike", "GemmModeLike"]
