"""Helpers the xte.ops modules share: argument errors and dtype parsing.

Package-internal: the names here carry no underscore so that the ops modules import them from
this one module instead of each other's private helpers (scripts/check_layers.py refuses a
python/xte module that imports another module's underscore name).
"""

from .._lib import DType, Status, XteDTypeError, XteValueError


def bad(name, msg, cls=XteValueError, status=Status.INVALID_ARGUMENT):
    """The exception (not raised) for argument `name`, with status and message."""
    return cls(status, f"{name}: {msg}")


_DTYPE_NAMES = {"float32": DType.FP32, "fp32": DType.FP32, "bfloat16": DType.BF16,
                "bf16": DType.BF16, "float16": DType.FP16, "fp16": DType.FP16,
                "e4m3": DType.E4M3, "float8_e4m3fn": DType.E4M3, "e5m2": DType.E5M2,
                "float8_e5m2": DType.E5M2, "int32": DType.INT32, "int64": DType.INT64}


def parse_dtype(d, name, allowed, default=None):
    """The xte dtype named by d (a name, a torch / NumPy dtype or DType), or default for None.

    Raises XteDTypeError naming argument `name` when the dtype is not one of `allowed`."""
    if d is None:
        return default
    if isinstance(d, DType):
        out = d
    else:
        out = _DTYPE_NAMES.get(str(d).rsplit(".", 1)[-1].lower())
    if out not in allowed:
        raise bad(name, f"{d!r}: want one of {', '.join(DType(a).name for a in allowed)}",
                  XteDTypeError, Status.DTYPE)
    return out
