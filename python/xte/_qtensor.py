"""QuantizedTensor: an FP8 tensor with its scales, as xte_qtensor carries one.

It unpacks as (data, scales) like DeepGEMM's casts, and also carries the columnwise copy, the
scaling mode, the recipe and the scale layout, so that a GEMM or dequantize call needs nothing
else. Every array stays in the caller's framework; nothing is copied.
"""

import ctypes
from typing import Any

from . import _lib
from ._lib import QTensor, Recipe, ScaleLayout, ScalingMode, Status, XteValueError
from ._tensor import XteLayoutError, view, view_opt

__all__ = ["QuantizedTensor", "qview", "parse_recipe", "parse_layout", "parse_mode"]

_RECIPES = {
    "te_current": Recipe.TE_CURRENT, "current": Recipe.TE_CURRENT,
    "te_delayed": Recipe.TE_DELAYED, "delayed": Recipe.TE_DELAYED,
    "te_block": Recipe.TE_BLOCK, "float8blockscaling": Recipe.TE_BLOCK,
    "deepgemm": Recipe.DEEPGEMM, "deepgemm_ue8m0": Recipe.DEEPGEMM_UE8M0,
    "mtfp8": Recipe.MTFP8, "mx_te": Recipe.MX_TE, "mxfp8": Recipe.MX_TE,
    "mx_ocp": Recipe.MX_OCP,
}
_LAYOUTS = {"compact": ScaleLayout.COMPACT, "te_gemm": ScaleLayout.TE_GEMM,
            "te": ScaleLayout.TE_GEMM, "deepgemm": ScaleLayout.DEEPGEMM,
            "mx_swizzled": ScaleLayout.MX_SWIZZLED, "swizzled": ScaleLayout.MX_SWIZZLED}
_MODES = {"per_tensor": ScalingMode.PER_TENSOR, "1x128": ScalingMode.BLOCK_1x128,
          "128x128": ScalingMode.BLOCK_128x128, "1x32": ScalingMode.MXFP8_1x32,
          "mxfp8": ScalingMode.MXFP8_1x32, (1, 128): ScalingMode.BLOCK_1x128,
          (128, 128): ScalingMode.BLOCK_128x128, (1, 32): ScalingMode.MXFP8_1x32,
          None: ScalingMode.PER_TENSOR}


def _parse(table, enum_cls, value, what):
    return _lib.parse_enum(value, table, enum_cls, what)


def parse_recipe(r: Any) -> Recipe:
    """A recipe from an xte.Recipe, its name ('te_block', 'deepgemm', 'mx_te', ...) or a recipe
    object with an .xte_recipe attribute (xte.recipe.Float8BlockScaling(), ...)."""
    r = getattr(r, "xte_recipe", r)
    return _parse(_RECIPES, Recipe, r, "recipe")


def parse_layout(x: Any) -> ScaleLayout:
    return _parse(_LAYOUTS, ScaleLayout, x, "layout")


def parse_mode(x: Any) -> ScalingMode:
    return _parse(_MODES, ScalingMode, x, "block")


class QuantizedTensor:
    """FP8 data with scale_inv (rowwise) and optionally the columnwise copy with its scales.

    Unpacks as (data, scale_inv) like DeepGEMM's per_token_cast_to_fp8. For per-tensor, 1x128,
    128x128 and the DeepGEMM recipes the columnwise copy is the transpose [K, M]; for MTFP8 and
    MXFP8 it keeps the shape [M, K]. scale_inv arrays are in `layout` (fp32, E8M0 for MX)."""

    __slots__ = ("data", "scale_inv", "columnwise_data", "columnwise_scale_inv", "scaling_mode",
                 "recipe", "layout", "columnwise_layout", "amax", "scale")

    def __init__(self, data: Any, scale_inv: Any, *, scaling_mode: Any, recipe: Any,
                 layout: Any = ScaleLayout.COMPACT, columnwise_data: Any = None,
                 columnwise_scale_inv: Any = None, columnwise_layout: Any = None, amax=None,
                 scale=None) -> None:
        self.data = data
        self.scale_inv = scale_inv
        self.columnwise_data = columnwise_data
        self.columnwise_scale_inv = columnwise_scale_inv
        self.scaling_mode = parse_mode(scaling_mode)
        self.recipe = parse_recipe(recipe)
        self.layout = parse_layout(layout)
        self.columnwise_layout = (self.layout if columnwise_layout is None
                                  else parse_layout(columnwise_layout))
        self.amax = amax
        self.scale = scale

    @classmethod
    def _rowwise(cls, data, scale_inv, scaling_mode, recipe, layout):
        """A rowwise-only QuantizedTensor from parsed enums (the hot path: no parsing)."""
        q = object.__new__(cls)
        q.data = data
        q.scale_inv = scale_inv
        q.columnwise_data = q.columnwise_scale_inv = q.amax = q.scale = None
        q.scaling_mode = scaling_mode
        q.recipe = recipe
        q.layout = q.columnwise_layout = layout
        return q

    def __iter__(self):
        yield self.data
        yield self.scale_inv

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return (self.data, self.scale_inv)[i]

    @property
    def shape(self):
        """The logical [M, K] shape of the quantized input."""
        if self.data is not None:
            return tuple(self.data.shape)
        s = tuple(self.columnwise_data.shape)
        if self.scaling_mode in (ScalingMode.PER_TENSOR, ScalingMode.BLOCK_1x128,
                                 ScalingMode.BLOCK_128x128) and self.recipe != Recipe.MTFP8:
            return s[::-1]
        return s

    def __repr__(self):
        return (f"QuantizedTensor(shape={self.shape}, mode={self.scaling_mode.name}, "
                f"recipe={self.recipe.name}, layout={self.layout.name}, "
                f"columnwise={self.columnwise_data is not None})")


def scale_fields(arr, layout, name, writable):
    """(View, (data, dtype, rows, cols, layout)) of a scale array: [rows, cols]; 1-D [n] as
    [1, n]; more dimensions (grouped [G, rows, cols]) with the leading ones as rows. A scale
    buffer is dense (xte_scale_tensor has no row stride): a padded view is an XteLayoutError."""
    v = view(arr, name, writable=writable)
    shp = v.shape
    if v.f[-1] not in (0, shp[-1]):
        raise XteLayoutError(f"{name}: scale rows padded to a stride of {v.f[-1]} (shape "
                             f"{shp}): scale buffers are dense, pass a contiguous array")
    if len(shp) == 2:
        rows, cols = shp
    elif len(shp) == 1:
        rows, cols = 1, shp[0]
    else:
        rows = 1
        for s in shp[:-1]:
            rows *= s
        cols = shp[-1]
    return v, (v.f[0], v.f[1], rows, cols, int(layout))


def _float_ptr(arr, name, writable):
    """The pointer of a one-element fp32 array (amax / scale: C reads or writes one float)."""
    if arr is None:
        return 0, None
    v = view(arr, name, (_lib.DType.FP32,), writable=writable)
    n = 1
    for s in v.shape:
        n *= s
    if n != 1:
        raise _lib.XteShapeError(Status.SHAPE, f"{name}: shape {v.shape}, expected one element")
    return v.f[0], v


# xte_qtensor as packed bytes: rowwise (data, dtype, rank, shape[8], ld), its scale (data,
# dtype, rows, cols, layout), the columnwise copy and its scale, mode, recipe, amax, scale
_QFMT = "@Pii%dqqPiqqi4xPii%dqqPiqqi4xiiPP" % (_lib.MAX_RANK, _lib.MAX_RANK)
_QPACK = __import__("struct").Struct(_QFMT).pack
_QZERO = (0,) * 17
_T0 = (0,) * 12  # an absent copy
_S0 = (0,) * 5  # an absent scale buffer


def qpack_rowwise(data_ptr, dtype, M, K, scale_ptr, scale_dtype, rows, cols, layout, mode,
                  recipe):
    """An xte_qtensor with only a dense rowwise copy [M, K] and its scales (no amax / scale)."""
    return QTensor.from_buffer_copy(_QPACK(data_ptr, dtype, 2, M, K, 0, 0, 0, 0, 0, 0, 0,
                                           scale_ptr, scale_dtype, rows, cols, layout, *_QZERO,
                                           mode, recipe, 0, 0))


def qview(q, name, writable=False):
    """(xte_qtensor, [Views]) for a QuantizedTensor, zero-copy. The Views keep the arrays alive
    and carry their devices (for stream_of)."""
    if not isinstance(q, QuantizedTensor):
        raise _lib.XteDTypeError(Status.DTYPE, f"{name}: expected an xte.QuantizedTensor, got "
                                 f"{type(q).__name__} (xte.quantize makes one; a DeepGEMM "
                                 "(data, scales) pair needs its recipe: see xte.as_quantized)")
    views = []
    rt, rs, ct, cs = _T0, _S0, _T0, _S0
    if q.data is not None:
        v = view(q.data, f"{name}.data", writable=writable)
        rt = v.f
        views.append(v)
        if q.scale_inv is not None:
            v, rs = scale_fields(q.scale_inv, q.layout, f"{name}.scale_inv", writable)
            views.append(v)
    if q.columnwise_data is not None:
        v = view(q.columnwise_data, f"{name}.columnwise_data", writable=writable)
        ct = v.f
        views.append(v)
        if q.columnwise_scale_inv is not None:
            v, cs = scale_fields(q.columnwise_scale_inv, q.columnwise_layout,
                                  f"{name}.columnwise_scale_inv", writable)
            views.append(v)
    # amax is an output of a quantizing call; scale too for TE_CURRENT (TE_DELAYED reads it)
    pa, va = _float_ptr(q.amax, f"{name}.amax", writable)
    ps, vs = _float_ptr(q.scale, f"{name}.scale",
                        writable and q.recipe == Recipe.TE_CURRENT)
    if va is not None:
        views.append(va)
    if vs is not None:
        views.append(vs)
    s = QTensor.from_buffer_copy(_QPACK(*rt, *rs, *ct, *cs, int(q.scaling_mode), int(q.recipe),
                                        pa, ps))
    return s, views


def view_or_none(x, name, dtypes=None, writable=False):
    return view_opt(x, name, dtypes, writable)
