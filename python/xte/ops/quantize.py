"""Quantization (include/xte/quantize.h): block-scaled FP8 casts with named recipes.

quantize / dequantize / cast / quantize_scale_shape mirror xte_quantize, xte_dequantize, xte_cast
and xte_quantize_scale_shape; per_token_cast_to_fp8 / per_block_cast_to_fp8 are DeepGEMM's
helpers under DeepGEMM's names and return conventions. The arithmetic is the C library's
(docs/numerics.md, sections 3-5); this module only allocates outputs in the input's framework
(torch in, torch out; NumPy in, NumPy out) or fills the caller's out=, and never copies.
"""

import ctypes
from typing import Any, Dict, Optional, Tuple

from .._lib import (DType, Recipe, ScaleLayout, ScalingMode, Status, XteDTypeError, XteShapeError,
                    XteValueError, call, lib)
from .._qtensor import (QuantizedTensor, parse_layout, parse_mode, parse_recipe, qpack_rowwise,
                        qview)
from .._tensor import data_ptr, dtype_of, empty, stream_of, view
from .._typing import Array, DTypeLike, EnumLike, Pair

__all__ = ["quantize", "dequantize", "cast", "quantize_scale_shape", "per_token_cast_to_fp8",
           "per_block_cast_to_fp8", "as_quantized", "default_block"]

_FLOATS = (DType.FP32, DType.BF16, DType.FP16)
_CAST_DTYPES = (DType.FP32, DType.BF16, DType.FP16, DType.E4M3, DType.E5M2, DType.E8M0)
_PER_TENSOR_RECIPES = (Recipe.TE_CURRENT, Recipe.TE_DELAYED)
_MX_RECIPES = (Recipe.MX_TE, Recipe.MX_OCP)
# recipes whose columnwise copy keeps the [M, K] shape (Bx1 blocks); the others transpose it
_UNTRANSPOSED = (Recipe.MTFP8, Recipe.MX_TE, Recipe.MX_OCP)

_DTYPE_NAMES = {
    "float32": DType.FP32, "fp32": DType.FP32, "float": DType.FP32,
    "bfloat16": DType.BF16, "bf16": DType.BF16,
    "float16": DType.FP16, "fp16": DType.FP16, "half": DType.FP16,
    "e4m3": DType.E4M3, "float8_e4m3fn": DType.E4M3, "e4m3fn": DType.E4M3,
    "e5m2": DType.E5M2, "float8_e5m2": DType.E5M2,
    "e8m0": DType.E8M0, "float8_e8m0fnu": DType.E8M0, "ue8m0": DType.E8M0,
}
_CANON = {DType.FP32: "float32", DType.BF16: "bfloat16", DType.FP16: "float16",
          DType.E4M3: "e4m3", DType.E5M2: "e5m2", DType.E8M0: "e8m0"}


def _parse_dtype(d, what, allowed):
    """An xte DType from a name ('e4m3', 'bfloat16', ...), a DType, or a torch / NumPy dtype."""
    if isinstance(d, DType):
        r = d
    elif isinstance(d, str):
        r = _DTYPE_NAMES.get(d.lower())
    else:
        r = dtype_of(d)
    if r is None or r not in allowed:
        names = "/".join(_CANON[a] for a in allowed)
        raise XteDTypeError(Status.DTYPE, f"{what}: {d!r} is not one of {names}")
    return r


def default_block(recipe: Any) -> ScalingMode:
    """The scaling mode a recipe uses when block=None: 1x128 for TE_BLOCK, DEEPGEMM(_UE8M0) and
    MTFP8 (activations / gradients, as TransformerEngine's Float8BlockScaling and DeepGEMM's
    per_token_cast_to_fp8); 1x32 for the MX recipes; per-tensor for TE_CURRENT / TE_DELAYED."""
    r = parse_recipe(recipe)
    if r in _PER_TENSOR_RECIPES:
        return ScalingMode.PER_TENSOR
    if r in _MX_RECIPES:
        return ScalingMode.MXFP8_1x32
    return ScalingMode.BLOCK_1x128


def _mode(block, recipe):
    return default_block(recipe) if block is None else parse_mode(block)


_SHAPES: Dict[tuple, Tuple[int, int]] = {}  # (M, K, mode, recipe, layout, columnwise) -> (rows, cols): a pure function


def _scale_shape(M, K, mode, recipe, layout, columnwise):
    key = (M, K, mode, recipe, layout, columnwise)
    r = _SHAPES.get(key)
    if r is not None:
        return r
    rows, cols = ctypes.c_int64(), ctypes.c_int64()
    call("xte_quantize_scale_shape", int(M), int(K), int(mode), int(recipe), int(layout),
         1 if columnwise else 0, ctypes.byref(rows), ctypes.byref(cols))
    r = (rows.value, cols.value)
    if len(_SHAPES) > 4096:
        _SHAPES.clear()
    _SHAPES[key] = r
    return r


_CONFIGS: Dict[tuple, Any] = {}  # (amax_epsilon, force_pow_2, saturate) -> xte_quant_config (read-only for C)


def _config(amax_epsilon, force_pow_2, saturate):
    key = (amax_epsilon, force_pow_2, saturate)
    c = _CONFIGS.get(key)
    if c is None:
        c = lib.xte_quant_config_default()
        c.amax_epsilon = float(amax_epsilon)
        c.force_pow_2 = _force_pow_2(force_pow_2)
        c.saturate = 1 if saturate else 0
        if len(_CONFIGS) > 256:
            _CONFIGS.clear()
        _CONFIGS[key] = c
    return c


def quantize_scale_shape(M: int, K: int, block: EnumLike, recipe: Any, layout: Any,
                         columnwise: bool = False) -> Tuple[int, int]:
    """(rows, cols) of the scale buffer xte_quantize writes for an [M, K] input: the rowwise
    copy's (columnwise=False) or the columnwise copy's. block=None / layout=None take quantize's
    defaults (the recipe's block; COMPACT). The buffer is fp32, E8M0 (one byte) for MX recipes."""
    r = parse_recipe(recipe)
    mode = _mode(block, r)
    lay = ScaleLayout.COMPACT if layout is None else parse_layout(layout)
    return _scale_shape(M, K, mode, r, lay, columnwise)


def _force_pow_2(v):
    if v is None:
        return -1
    if v in (-1, 0, 1) and not isinstance(v, float):
        return int(v)
    raise XteValueError(Status.INVALID_ARGUMENT,
                        f"force_pow_2: {v!r} (None = the recipe's TransformerEngine default, "
                        "True / False)")


def _host_scale(scale, like):
    """TE_DELAYED's input scale: read by the C library on the host before the launch."""
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        import numpy as np
        return np.full((1,), scale, dtype=np.float32)
    v = view(scale, "scale", (DType.FP32,))
    if v.device[0] != "cpu":
        raise XteValueError(Status.INVALID_ARGUMENT,
                            "scale: TE_DELAYED reads its scale on the host before the launch; "
                            f"pass a CPU array or a Python float, not a {v.device[0]} tensor")
    return scale


def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _check_scalar_out(arr, name):
    v = view(arr, name, (DType.FP32,), writable=True)
    if _numel(v.shape) != 1:
        raise XteShapeError(Status.SHAPE, f"{name}: shape {v.shape}, expected 1 element")
    return v


def quantize(x: Array, recipe: Any = "te_block", block: Optional[EnumLike] = None,
             layout: Any = None, fmt: DTypeLike = "e4m3", rowwise: bool = True,
             columnwise: bool = False, *, amax_epsilon: float = 0.0,
             force_pow_2: Optional[bool] = None, saturate: bool = True, scale: Any = None,
             amax: Optional[Array] = None,
             out: Optional[QuantizedTensor] = None) -> QuantizedTensor:
    """Quantize a 2-D [M, K] fp32 / bf16 / fp16 tensor to FP8 with block scales (xte_quantize).

    recipe: 'te_block' (TransformerEngine Float8BlockScaling, the default), 'deepgemm',
        'deepgemm_ue8m0', 'mtfp8', 'mx_te', 'mx_ocp', 'te_current', 'te_delayed', an xte.Recipe,
        or a recipe object (xte.recipe.Float8BlockScaling(), ...) whose options (fmt, block,
        amax_epsilon, force_pow_2) apply where this call leaves the argument at its default.
    block: '1x128', '128x128', '1x32', 'per_tensor' (or (1, 128), ...). None: the recipe's
        default (default_block): 1x128 for TE_BLOCK / DEEPGEMM* / MTFP8, 1x32 for MX, per-tensor
        for TE_CURRENT / TE_DELAYED.
    layout: scale layout 'compact' (row-major block grid; the default for layout=None, as
        DeepGEMM's per_token_cast_to_fp8 and MT-TE return them), 'te_gemm', 'deepgemm',
        'mx_swizzled' (MX recipes only); see include/xte/quantize.h.
    fmt: 'e4m3' or 'e5m2'.
    rowwise / columnwise: which copies to produce. The columnwise copy is the transpose [K, M]
        quantized along M for per-tensor, TE_BLOCK and DeepGEMM recipes, and keeps the [M, K]
        shape in Bx1 blocks for MTFP8 and MX.
    amax_epsilon, force_pow_2 (None = the C default -1: the recipe's TE default, on for
        TE_BLOCK, off for TE_CURRENT; True / False), saturate: xte_quant_config's fields.
    scale: TE_DELAYED's input scale (a Python float or a 1-element fp32 CPU array). For
        TE_CURRENT an optional 1-element fp32 output receiving the scale used (allocated when
        None). Other recipes take none.
    amax: optional 1-element fp32 output receiving max |x| of the whole input (allocated for
        the per-tensor recipes when None).
    out: a QuantizedTensor to fill in place (its arrays are written, nothing is allocated);
        block=None / layout=None then mean out's scaling mode and layout, and the recipe must
        be out's.

    Returns a QuantizedTensor (unpacks as (data, scale_inv)); scale_inv is fp32 (E8M0 bytes for
    the MX recipes) in the chosen layout, in x's framework and device. On error nothing is
    written to out.
    """
    if (out is None and scale is None and amax is None and rowwise is True and
            columnwise is False and amax_epsilon == 0.0 and force_pow_2 is None and
            saturate is True):
        try:
            spec = _FAST.get((recipe, block, layout, fmt))
        except TypeError:  # an unhashable argument (a list block): the general path
            spec = None
        if spec is not None:
            q = _quantize_fast(x, *spec)
            if q is not None:
                return q
    elif (type(out) is QuantizedTensor and out.columnwise_data is None and out.amax is None and
          out.scale is None and scale is None and amax is None and block is None and
          layout is None and rowwise is True and columnwise is False and fmt == "e4m3" and
          amax_epsilon == 0.0 and force_pow_2 is None and saturate is True and
          out.recipe not in _PER_TENSOR_RECIPES and out.data is not None and
          (recipe is out.recipe or _RECIPE_OF.get(recipe) == out.recipe)):
        # refilling a rowwise QuantizedTensor (an activation buffer reused every step)
        vx = view(x, "x", _FLOATS)
        qs, views = qview(out, "out", writable=True)
        if views[0].dtype == DType.E4M3 and len(vx.shape) == 2:
            call("xte_quantize", vx.ref, ctypes.byref(qs), ctypes.byref(_DEFAULT_CFG),
                 stream_of(vx, *views))
            return out
    opts = getattr(recipe, "quantize_kwargs", None)
    if callable(opts):
        o = opts()
        if block is None:
            block = o.get("block")
        if fmt == "e4m3":
            fmt = o.get("fmt", fmt)
        if amax_epsilon == 0.0:
            amax_epsilon = o.get("amax_epsilon", amax_epsilon)
        if force_pow_2 is None:
            force_pow_2 = o.get("force_pow_2")
    r = parse_recipe(recipe)
    vx = view(x, "x", _FLOATS)
    if len(vx.shape) != 2:
        raise XteShapeError(Status.SHAPE, f"x: shape {vx.shape}, quantize takes a 2-D [M, K] "
                            "tensor (reshape it: a contiguous reshape copies nothing)")
    if not (rowwise or columnwise):
        raise XteValueError(Status.INVALID_ARGUMENT,
                            "rowwise, columnwise: both False, nothing to produce")
    M, K = vx.shape
    if out is not None:
        if not isinstance(out, QuantizedTensor):
            raise XteDTypeError(Status.DTYPE, f"out: expected an xte.QuantizedTensor, got "
                                f"{type(out).__name__}")
        if out.recipe != r:
            raise XteValueError(Status.INVALID_ARGUMENT, f"out: recipe {out.recipe.name}, but "
                                f"recipe= is {r.name}")
        mode = out.scaling_mode if block is None else parse_mode(block)
        lay = out.layout if layout is None else parse_layout(layout)
        if mode != out.scaling_mode:
            raise XteValueError(Status.INVALID_ARGUMENT, f"out: scaling mode "
                                f"{out.scaling_mode.name}, but block= is {mode.name}")
        if lay != out.layout:
            raise XteValueError(Status.INVALID_ARGUMENT, f"out: layout {out.layout.name}, but "
                                f"layout= is {lay.name}")
    else:
        mode = _mode(block, r)
        lay = ScaleLayout.COMPACT if layout is None else parse_layout(layout)
    qd = _parse_dtype(fmt, "fmt", (DType.E4M3, DType.E5M2))
    cfg = _config(amax_epsilon, force_pow_2, bool(saturate))
    sd = DType.E8M0 if r in _MX_RECIPES else DType.FP32
    per_tensor = r in _PER_TENSOR_RECIPES

    # per-tensor scale / amax
    if r == Recipe.TE_DELAYED:
        if scale is None and out is not None:
            scale = out.scale
        if scale is None:
            raise XteValueError(Status.INVALID_ARGUMENT,
                                "scale: TE_DELAYED needs the input scale (float or 1-element "
                                "fp32 CPU array)")
        scale = _host_scale(scale, vx)
    elif scale is not None and r != Recipe.TE_CURRENT:
        raise XteValueError(Status.INVALID_ARGUMENT, f"scale: recipe {r.name} takes no scale "
                            "(only TE_DELAYED's input and TE_CURRENT's output)")
    if out is not None:
        if amax is None:
            amax = out.amax
        if scale is None and r == Recipe.TE_CURRENT:
            scale = out.scale
    va = None if amax is None else _check_scalar_out(amax, "amax")
    if scale is not None:
        vs = view(scale, "scale", (DType.FP32,), writable=r == Recipe.TE_CURRENT)
        if _numel(vs.shape) != 1:
            raise XteShapeError(Status.SHAPE, f"scale: shape {vs.shape}, expected 1 element")

    if out is None:
        cshape = (K, M) if r not in _UNTRANSPOSED else (M, K)
        data = sc = cdata = csc = None
        if rowwise:
            data = empty(vx, (M, K), qd)
            sc = empty(vx, _scale_shape(M, K, mode, r, lay, False), sd)
        if columnwise:
            cdata = empty(vx, cshape, qd)
            csc = empty(vx, _scale_shape(M, K, mode, r, lay, True), sd)
        if per_tensor and amax is None:
            amax = empty(vx, (1,), DType.FP32)
        if r == Recipe.TE_CURRENT and scale is None:
            scale = empty(vx, (1,), DType.FP32)
        res = QuantizedTensor(data, sc, scaling_mode=mode, recipe=r, layout=lay,
                              columnwise_data=cdata, columnwise_scale_inv=csc, amax=amax,
                              scale=scale)
    else:
        for want, arr, name in ((rowwise, out.data, "out.data"),
                                (columnwise, out.columnwise_data, "out.columnwise_data")):
            if want and arr is None:
                raise XteValueError(Status.INVALID_ARGUMENT, f"{name}: None, but the call asks "
                                    "for that copy")
        for arr, name in ((out.data, "out.data"), (out.columnwise_data, "out.columnwise_data")):
            if arr is not None and dtype_of(arr) not in (None, qd):
                raise XteDTypeError(Status.DTYPE, f"{name}: dtype {arr.dtype}, but fmt= is "
                                    f"{qd.name.lower()}")
        res = QuantizedTensor(out.data if rowwise else None, out.scale_inv if rowwise else None,
                              scaling_mode=mode, recipe=r, layout=lay,
                              columnwise_data=out.columnwise_data if columnwise else None,
                              columnwise_scale_inv=(out.columnwise_scale_inv if columnwise
                                                    else None),
                              columnwise_layout=out.columnwise_layout, amax=amax, scale=scale)
    qs, views = qview(res, "out", writable=True)
    for v in views:  # scale buffers are outputs too
        if v.read_only:
            raise XteValueError(Status.INVALID_ARGUMENT, f"{v.name}: a read-only array "
                                "cannot be written")
    # TE_DELAYED's scale is read on the host whatever the stream: not a device argument
    dev_views = [v for v in views if not (r == Recipe.TE_DELAYED and v.name == "out.scale")]
    call("xte_quantize", vx.ptr, ctypes.byref(qs), ctypes.byref(cfg), stream_of(vx, *dev_views))
    if (out is None and not per_tensor and rowwise is True and columnwise is False and
            amax_epsilon == 0.0 and force_pow_2 is None and saturate is True and
            not callable(opts)):
        try:  # this combination of arguments takes the fast path from now on
            if len(_FAST) < 256:
                _FAST[(recipe, block, layout, fmt)] = (r, mode, lay, qd, sd, cfg)
        except TypeError:
            pass
    if out is not None:
        if amax is not None:
            out.amax = amax
        if r == Recipe.TE_CURRENT and scale is not None:
            out.scale = scale
        return out
    return res


_RECIPE_OF = {"te_block": Recipe.TE_BLOCK, "deepgemm": Recipe.DEEPGEMM,
              "deepgemm_ue8m0": Recipe.DEEPGEMM_UE8M0, "mtfp8": Recipe.MTFP8,
              "mx_te": Recipe.MX_TE, "mx_ocp": Recipe.MX_OCP}
_DEFAULT_CFG = lib.xte_quant_config_default()

# (recipe, block, layout, fmt) as the caller spelled them -> (recipe, mode, layout, fp8 dtype,
# scale dtype, config): filled by a successful general call with the default options, rowwise
# only, no out=; then the same call skips the parsing and builds the xte_qtensor in one go.
_FAST: Dict[Any, Any] = {}


def _quantize_fast(x, r, mode, lay, qd, sd, cfg):
    vx = view(x, "x", _FLOATS)
    if len(vx.shape) != 2 or 0 in vx.shape:
        return None  # the general path says why, or handles the empty tensor
    M, K = vx.shape
    rows, cols = _scale_shape(M, K, mode, r, lay, False)
    data = empty(vx, (M, K), qd)
    sc = empty(vx, (rows, cols), sd)
    qs = qpack_rowwise(data_ptr(data), qd, M, K, data_ptr(sc), sd, rows, cols, lay, mode, r)
    call("xte_quantize", vx.ref, ctypes.byref(qs), ctypes.byref(cfg), stream_of(vx))
    return QuantizedTensor._rowwise(data, sc, mode, r, lay)


def dequantize(q: QuantizedTensor, columnwise: bool = False, dtype: DTypeLike = "float32",
               out: Optional[Array] = None) -> Array:
    """Dequantize a QuantizedTensor's rowwise copy (or its columnwise copy) to fp32 / bf16 /
    fp16 (xte_dequantize): fp32(q * scale_inv) RNE, then RNE to dtype. The result has the
    copy's shape ([K, M] for a transposed columnwise copy), in the data's framework; out= (of
    that shape) is written in place and returned; dtype is then out's."""
    if not isinstance(q, QuantizedTensor):
        qview(q, "q")  # raises the documented XteDTypeError
    src = q.columnwise_data if columnwise else q.data
    if src is None:
        raise XteValueError(Status.INVALID_ARGUMENT, "q: has no {} copy".format(
            "columnwise" if columnwise else "rowwise"))
    vsrc = view(src, "q.columnwise_data" if columnwise else "q.data")
    if out is None:
        od = _parse_dtype(dtype, "dtype", _FLOATS)
        out = empty(vsrc, vsrc.shape, od)
    vo = view(out, "out", _FLOATS, writable=True)
    qs, views = qview(q, "q")
    call("xte_dequantize", ctypes.byref(qs), 1 if columnwise else 0, vo.ptr,
         stream_of(vo, *views))
    return out


def cast(x: Array, dtype: DTypeLike, saturate: bool = True, out: Optional[Array] = None) -> Array:
    """Elementwise cast (no scaling) between fp32 / bf16 / fp16 / e4m3 / e5m2 / e8m0 (xte_cast):
    RNE, fp8 under the saturation rule (saturate=True: overflow -> +-max; False: NaN for e4m3,
    inf for e5m2), E8M0 as ml_dtypes' float8_e8m0fnu (docs/numerics.md, section 3). The result
    has x's shape, in x's framework; out= (same number of elements) is written in place and
    returned. dtype may be None when out is given."""
    vx = view(x, "x", _CAST_DTYPES)
    if out is None:
        if dtype is None:
            raise XteValueError(Status.INVALID_ARGUMENT, "dtype: None needs out=")
        out = empty(vx, vx.shape, _parse_dtype(dtype, "dtype", _CAST_DTYPES))
        vo = view(out, "out", _CAST_DTYPES, writable=True)
    else:
        vo = view(out, "out", _CAST_DTYPES, writable=True)
        if dtype is not None and _parse_dtype(dtype, "dtype", _CAST_DTYPES) != vo.dtype:
            raise XteDTypeError(Status.DTYPE, f"out: dtype {DType(vo.dtype).name.lower()}, but "
                                f"dtype= is {dtype!r}")
    call("xte_cast", vx.ptr, vo.ptr, 1 if saturate else 0, stream_of(vx, vo))
    return out


def as_quantized(data: Array, scale_inv: Array, recipe: Any = "deepgemm",
                 block: Optional[EnumLike] = None, layout: Any = None, *,
                 columnwise_data: Optional[Array] = None,
                 columnwise_scale_inv: Optional[Array] = None,
                 columnwise_layout: Optional[EnumLike] = None) -> QuantizedTensor:
    """Wrap existing FP8 data and scales (e.g. DeepGEMM's (data, scales) pair) as a
    QuantizedTensor, without copies: recipe / block (None: the recipe's default) / layout
    (None: COMPACT, as DeepGEMM's casts return them) say how the scales were made and laid out."""
    r = parse_recipe(recipe)
    return QuantizedTensor(data, scale_inv, scaling_mode=_mode(block, r), recipe=r,
                           layout=ScaleLayout.COMPACT if layout is None else layout,
                           columnwise_data=columnwise_data,
                           columnwise_scale_inv=columnwise_scale_inv,
                           columnwise_layout=columnwise_layout)


def per_token_cast_to_fp8(x: Array, use_ue8m0: bool = False) -> Pair:
    """DeepGEMM's per_token_cast_to_fp8: [M, K] -> (e4m3 data [M, K], fp32 scales
    [M, ceil(K/128)] row-major), scales sf = max(amax, 1e-4) / 448 per 1x128 block (rounded up
    to a power of two with use_ue8m0), data = fp8(x / sf). Recipe DEEPGEMM(_UE8M0), COMPACT."""
    q = quantize(x, "deepgemm_ue8m0" if use_ue8m0 else "deepgemm", "1x128", "compact")
    return q.data, q.scale_inv


def per_block_cast_to_fp8(x: Array, use_ue8m0: bool = False) -> Pair:
    """DeepGEMM's per_block_cast_to_fp8: [M, K] -> (e4m3 data [M, K], fp32 scales
    [ceil(M/128), ceil(K/128)] row-major), one scale per 128x128 tile."""
    q = quantize(x, "deepgemm_ue8m0" if use_ue8m0 else "deepgemm", "128x128", "compact")
    return q.data, q.scale_inv
