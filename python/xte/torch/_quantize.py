"""The quantize family's custom ops (xte.ops.quantize): xte::quantize, xte::dequantize,
xte::cast. FP8 data and E8M0 scales cross the op boundary as uint8 bytes."""

import ctypes
from typing import List, Optional

import torch
from torch import Tensor

from .._lib import DType, Recipe, Status, XteValueError, call
from .._tensor import empty, stream_of, torch_dtype, view
from ._common import (DEV, FLOAT_IN, as_dtype, fptr, qtensor, quant_config, quant_shapes,
                      split_copies)


@torch.library.custom_op("xte::quantize", mutates_args=(), device_types=DEV)
def quantize(x: Tensor, mode: int, recipe: int, layout: int, fmt: int, rowwise: bool,
             columnwise: bool, amax_epsilon: float, force_pow_2: int, saturate: bool,
             scale: Optional[Tensor]) -> List[Tensor]:
    """[data, scale_inv] (rowwise) then [columnwise_data, columnwise_scale_inv] as asked; fp8
    data (and E8M0 scales) as uint8 bytes."""
    vx = view(x, "x", FLOAT_IN)
    outs = [empty(vx, s, DType.UINT8 if d in (None, DType.E8M0) else d)
            for s, d in quant_shapes(vx.shape, mode, recipe, layout, rowwise, columnwise)]
    d, s, cd, cs = split_copies(outs, rowwise, columnwise)
    meta = (mode, recipe, layout, layout, fmt)
    q, keep = qtensor(d, s, cd, cs, meta, "out")
    if scale is not None:
        # the op is functional: the scale is TE_DELAYED's input only (one fp32 on the host,
        # read by the C library before the launch), never TE_CURRENT's written-back scale
        if recipe != Recipe.TE_DELAYED:
            raise XteValueError(Status.INVALID_ARGUMENT, "scale: only TE_DELAYED takes a scale "
                                "here (TE_CURRENT's scale is an output: use xte.quantize)")
        if scale.device.type != "cpu" or scale.numel() != 1:
            raise XteValueError(Status.INVALID_ARGUMENT, f"scale: a 1-element fp32 CPU tensor "
                                f"(got {tuple(scale.shape)} on {scale.device})")
    fs, vs = fptr(scale, "scale")
    q.scale = fs
    cfg = quant_config(amax_epsilon, force_pow_2, saturate)
    call("xte_quantize", vx.ptr, ctypes.byref(q), ctypes.byref(cfg), stream_of(vx, *keep))
    return outs


@quantize.register_fake
def _(x, mode, recipe, layout, fmt, rowwise, columnwise, amax_epsilon, force_pow_2, saturate,
      scale):
    shapes = quant_shapes(tuple(int(s) for s in x.shape), mode, recipe, layout, rowwise,
                           columnwise)
    return [x.new_empty(s, dtype=torch.uint8 if d in (None, DType.E8M0) else torch_dtype(d))
            for s, d in shapes]


@torch.library.custom_op("xte::dequantize", mutates_args=(), device_types=DEV)
def dequantize(data: Tensor, scale_inv: Tensor, mode: int, recipe: int, layout: int, fmt: int,
               columnwise: bool, out_dtype: int) -> Tensor:
    """Dequantizes one copy (given as data + scale_inv; columnwise says which copy it is)."""
    meta = (mode, recipe, layout, layout, fmt)
    if columnwise:
        q, keep = qtensor(None, None, data, scale_inv, meta, "q")
    else:
        q, keep = qtensor(data, scale_inv, None, None, meta, "q")
    out = empty(keep[0], keep[0].shape, out_dtype)
    vo = view(out, "out", writable=True)
    call("xte_dequantize", ctypes.byref(q), int(columnwise), vo.ptr, stream_of(vo, *keep))
    return out


@dequantize.register_fake
def _(data, scale_inv, mode, recipe, layout, fmt, columnwise, out_dtype):
    return data.new_empty(data.shape, dtype=torch_dtype(out_dtype))


_BYTE_DTYPES = (int(DType.E4M3), int(DType.E5M2), int(DType.E8M0))


@torch.library.custom_op("xte::cast", mutates_args=(), device_types=DEV)
def cast(x: Tensor, in_dtype: int, out_dtype: int, saturate: bool) -> Tensor:
    """xte_cast: x (fp32 / bf16 / fp16, or fp8 / e8m0 codes as uint8 with in_dtype saying which)
    to out_dtype (fp8 / e8m0 results as uint8 bytes)."""
    vx = view(as_dtype(x, in_dtype) if x.dtype == torch.uint8 else x, "x")
    out = empty(vx, vx.shape, DType.UINT8 if out_dtype in _BYTE_DTYPES else out_dtype)
    vo = view(as_dtype(out, out_dtype), "out", writable=True)
    call("xte_cast", vx.ptr, vo.ptr, int(saturate), stream_of(vx, vo))
    return out


@cast.register_fake
def _(x, in_dtype, out_dtype, saturate):
    return x.new_empty(x.shape, dtype=torch.uint8 if out_dtype in _BYTE_DTYPES
                       else torch_dtype(out_dtype))


OPS = {"quantize": quantize, "dequantize": dequantize, "cast": cast}
