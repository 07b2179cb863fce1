"""transformer_engine.pytorch.tensor over xte: TE's quantizers and the quantized tensors they
produce, with TE's attribute names and layouts.

    Float8BlockQuantizer(fp8_dtype, rowwise, columnwise, amax_epsilon, force_pow_2_scales,
        block_scaling_dim)  1x128 (dim 1) or 128x128 (dim 2) blocks, TE's GEMM-ready scales:
        1x128 [ceil(K/128), roundup(M, 4)] (transposed), 128x128 [ceil(M/128),
        roundup(ceil(K/128), 4)]; the columnwise copy is the transpose [K, M] quantized along M,
        its scales laid out the same way over [K, M]; padding entries are zero.
    Float8CurrentScalingQuantizer(fp8_dtype, device, rowwise, columnwise, ...)  per-tensor
        current scaling: _data [M, K], _scale_inv [1], _transpose [K, M].
    Float8Quantizer(scale, amax, fp8_dtype, rowwise, columnwise)  per-tensor with the caller's
        scale (TE's delayed-scaling quantizer; amax receives max |x|).
    MXFP8Quantizer(fp8_dtype, rowwise, columnwise)  1x32 blocks, E8M0 scales as TE / cuBLAS
        (XTE_RECIPE_MX_TE), TE's unswizzled padded scale layout: rowwise [roundup(M, 128),
        roundup(K / 32, 4)], columnwise (data not transposed, 32x1 blocks) [roundup(M / 32, 4),
        roundup(K, 128)], zero padding.

The arithmetic is xte.quantize's (recipes TE_BLOCK, TE_CURRENT, TE_DELAYED; docs/numerics.md).
Data are uint8 bytes (view them as torch.float8_e4m3fn / float8_e5m2), scales fp32. The
quantized tensors are plain Python objects holding those tensors (TE's *Storage classes), not
torch.Tensor subclasses: use .dequantize() to get a tensor back.
"""
import math
from typing import Optional

import torch

from ....ops.quantize import dequantize as _xdq, quantize as _xq
from ...._qtensor import QuantizedTensor as _QT
from ..constants import DType, TE_DType_To_Torch

__all__ = ["Quantizer", "Float8BlockQuantizer", "Float8BlockwiseQTensor",
           "Float8BlockwiseQTensorStorage", "Float8CurrentScalingQuantizer", "Float8Quantizer",
           "Float8Tensor", "Float8TensorStorage", "MXFP8Quantizer", "MXFP8Tensor",
           "MXFP8TensorStorage"]

_FMT = {DType.kFloat8E4M3: "e4m3", DType.kFloat8E5M2: "e5m2"}


def _fmt(dtype):
    d = DType.cast(dtype)
    if d == DType.kFloat4E2M1:
        raise NotImplementedError("xte: FP4 (E2M1) quantization is out of xte's scope")
    if d not in _FMT:
        raise ValueError(f"fp8_dtype: {d!r} is not kFloat8E4M3 or kFloat8E5M2")
    return _FMT[d]


def _round_up(v, m):
    return (v + m - 1) // m * m


def _2d(shape):
    shape = tuple(int(s) for s in shape)
    return (math.prod(shape[:-1]), shape[-1] if shape else 1)


class Quantizer:
    """Base of the quantizers: usage flags and the call form quantizer(tensor)."""

    def __init__(self, *, rowwise=True, columnwise=True):
        self.rowwise_usage = bool(rowwise)
        self.columnwise_usage = bool(columnwise)
        self.internal = False
        self.optimize_for_gemm = False

    def set_usage(self, *, rowwise=None, columnwise=None):
        if rowwise is not None:
            self.rowwise_usage = bool(rowwise)
        if columnwise is not None:
            self.columnwise_usage = bool(columnwise)

    def __call__(self, tensor):
        return self.quantize(tensor)

    def quantize(self, tensor, *, out=None, dtype=None):
        if out is not None:
            return self.update_quantized(tensor, out)
        dst = self.make_empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
        return self.update_quantized(tensor, dst)

    def is_quantizable(self, inp):
        return True

    def _check_usage(self):
        if not (self.rowwise_usage or self.columnwise_usage):
            raise ValueError("quantizer: neither rowwise nor columnwise usage is set")


class _QTensorStorage:
    """What every storage below answers: shape / dtype of the high-precision tensor it stands
    for, size(), and device (that of its first data copy present, _DATA_FIELDS in order)."""

    _DATA_FIELDS = ("_rowwise_data", "_columnwise_data")

    shape = property(lambda self: self._shape)
    dtype = property(lambda self: self._dtype)

    @property
    def device(self):
        for name in self._DATA_FIELDS:
            d = getattr(self, name)
            if d is not None:
                return d.device
        raise ValueError(f"{type(self).__name__}: no data copy is present")

    def size(self, dim=None):
        return self._shape if dim is None else self._shape[dim]


class Float8BlockwiseQTensorStorage(_QTensorStorage):
    """TE's blockwise FP8 tensor fields: _rowwise_data (uint8 [..., K]), _rowwise_scale_inv,
    _columnwise_data (uint8 [K, ...]), _columnwise_scale_inv, _fp8_dtype, _quantizer,
    _is_2D_scaled; shape / dtype / device of the high-precision tensor it stands for."""

    def __init__(self, shape, dtype, rowwise_data, rowwise_scale_inv, columnwise_data,
                 columnwise_scale_inv, fp8_dtype, quantizer, is_2D_scaled):
        self._shape = torch.Size(shape)
        self._dtype = dtype
        self._rowwise_data = rowwise_data
        self._rowwise_scale_inv = rowwise_scale_inv
        self._columnwise_data = columnwise_data
        self._columnwise_scale_inv = columnwise_scale_inv
        self._fp8_dtype = fp8_dtype
        self._quantizer = quantizer
        self._is_2D_scaled = is_2D_scaled

    def dim(self):
        return len(self._shape)

    def _xte(self):
        tfp8 = TE_DType_To_Torch[self._fp8_dtype]
        v = (lambda t: None if t is None else t.view(tfp8))
        return _QT(v(self._rowwise_data), self._rowwise_scale_inv,
                   scaling_mode="128x128" if self._is_2D_scaled else "1x128",
                   recipe="te_block", layout="te_gemm",
                   columnwise_data=v(self._columnwise_data),
                   columnwise_scale_inv=self._columnwise_scale_inv)

    def dequantize(self, *, dtype=None):
        """The high-precision tensor (from the rowwise copy, else the columnwise one)."""
        dtype = self._dtype if dtype is None else dtype
        q = self._xte()
        if self._rowwise_data is not None:
            return _xdq(q, dtype=dtype).reshape(self._shape)
        return _xdq(q, columnwise=True, dtype=dtype).t().contiguous().reshape(self._shape)

    def __repr__(self):
        return (f"Float8BlockwiseQTensor(shape={tuple(self._shape)}, fp8_dtype="
                f"{self._fp8_dtype.name}, is_2D_scaled={self._is_2D_scaled})")


Float8BlockwiseQTensor = Float8BlockwiseQTensorStorage


class Float8BlockQuantizer(Quantizer):
    """TE's Float8BlockQuantizer: FP8 block scaling (XTE_RECIPE_TE_BLOCK) with TE's GEMM-ready
    scale layout (xte's TE_GEMM). block_scaling_dim 1: 1x128 blocks, 2: 128x128 tiles."""

    def __init__(self, fp8_dtype, *, rowwise, columnwise, amax_epsilon=0.0,
                 force_pow_2_scales=True, block_scaling_dim=2):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = DType.cast(fp8_dtype)
        _fmt(self.dtype)
        if block_scaling_dim not in (1, 2):
            raise RuntimeError("Only 1D or 2D blocks are supported, but got "
                               f"block_scaling_dim={block_scaling_dim}")
        self.block_len = 128
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.amax_epsilon = float(amax_epsilon)
        self.block_scaling_dim = block_scaling_dim

    def copy(self):
        q = Float8BlockQuantizer(self.dtype, rowwise=self.rowwise_usage,
                                 columnwise=self.columnwise_usage,
                                 amax_epsilon=self.amax_epsilon,
                                 force_pow_2_scales=self.force_pow_2_scales,
                                 block_scaling_dim=self.block_scaling_dim)
        q.internal, q.optimize_for_gemm = self.internal, self.optimize_for_gemm
        return q

    def get_scale_shape(self, shape, columnwise):
        """Shape of the (padded, GEMM-ready) scale tensor of a tensor of this logical shape."""
        dim0, dim1 = _2d(shape)
        b = self.block_len
        if self.block_scaling_dim == 2:
            s0, s1 = -(-dim0 // b), -(-dim1 // b)
            return (s1, _round_up(s0, 4)) if columnwise else (s0, _round_up(s1, 4))
        if columnwise:
            return (-(-dim0 // b), _round_up(dim1, 4))
        return (-(-dim1 // b), _round_up(dim0, 4))

    def get_columnwise_shape(self, shape):
        shape = tuple(shape)
        return (shape[-1],) + shape[:-1] if shape else ()

    def make_empty(self, shape, *, dtype=torch.float32, device=None, requires_grad=False,
                   pin_memory=False):
        """An unfilled quantized tensor of this logical shape (zero scale padding)."""
        self._check_usage()
        device = torch.device("cpu") if device is None else torch.device(device)
        rd = rs = cd = cs = None
        if self.rowwise_usage:
            rd = torch.empty(tuple(shape), dtype=torch.uint8, device=device)
            rs = torch.zeros(self.get_scale_shape(shape, False), dtype=torch.float32,
                             device=device)
        if self.columnwise_usage:
            cd = torch.empty(self.get_columnwise_shape(shape), dtype=torch.uint8, device=device)
            cs = torch.zeros(self.get_scale_shape(shape, True), dtype=torch.float32,
                             device=device)
        return Float8BlockwiseQTensorStorage(shape, dtype, rd, rs, cd, cs, self.dtype, self,
                                             self.block_scaling_dim == 2)

    def update_quantized(self, src, dst, *, noop_flag=None):
        """Quantize src into dst's buffers (in place) and return dst."""
        if not isinstance(dst, Float8BlockwiseQTensorStorage):
            raise TypeError(f"Cannot store quantized blockwise tensor in {type(dst)} type.")
        if noop_flag is not None and bool(noop_flag.reshape(-1)[0] != 0):
            return dst
        if src.device != dst.device:
            src = src.to(device=dst.device)
        M, K = _2d(src.shape)
        x = src.contiguous().reshape(M, K)
        rowwise = dst._rowwise_data is not None
        columnwise = dst._columnwise_data is not None
        dst._fp8_dtype = self.dtype
        tfp8 = TE_DType_To_Torch[self.dtype]
        out = _QT(dst._rowwise_data.view(M, K).view(tfp8) if rowwise else None,
                  dst._rowwise_scale_inv if rowwise else None,
                  scaling_mode="128x128" if self.block_scaling_dim == 2 else "1x128",
                  recipe="te_block", layout="te_gemm",
                  columnwise_data=(dst._columnwise_data.view(K, M).view(tfp8) if columnwise
                                   else None),
                  columnwise_scale_inv=dst._columnwise_scale_inv if columnwise else None)
        _xq(x, "te_block", fmt=_fmt(self.dtype), rowwise=rowwise, columnwise=columnwise,
            amax_epsilon=self.amax_epsilon, force_pow_2=self.force_pow_2_scales, out=out)
        return dst

    def calibrate(self, tensor):
        pass


class Float8TensorStorage(_QTensorStorage):
    """TE's per-tensor FP8 tensor fields: _data (uint8, the logical shape), _scale_inv (fp32
    [1]), _transpose (uint8 [K, ...] or None), _fp8_dtype, _quantizer."""

    _DATA_FIELDS = ("_data", "_transpose")

    def __init__(self, shape, dtype, data, scale_inv, transpose, fp8_dtype, quantizer):
        self._shape = torch.Size(shape)
        self._dtype = dtype
        self._data = data
        self._scale_inv = scale_inv
        self._transpose = transpose
        self._transpose_invalid = transpose is None
        self._fp8_dtype = fp8_dtype
        self._quantizer = quantizer

    def dequantize(self, *, dtype=None):
        dtype = self._dtype if dtype is None else dtype
        tfp8 = TE_DType_To_Torch[self._fp8_dtype]
        if self._data is not None:
            v = self._data.view(tfp8).float()
        else:
            v = self._transpose.view(tfp8).float().t()
        # per-tensor: x = fp32(q * scale_inv), one product per element as xte_dequantize
        return (v * self._scale_inv.float()).to(dtype).reshape(self._shape)


Float8Tensor = Float8TensorStorage


class _PerTensorQuantizer(Quantizer):
    _recipe: Optional[str] = None

    def make_empty(self, shape, *, dtype=torch.float32, device=None, requires_grad=False,
                   pin_memory=False):
        self._check_usage()
        device = torch.device("cpu") if device is None else torch.device(device)
        d = t = None
        if self.rowwise_usage:
            d = torch.empty(tuple(shape), dtype=torch.uint8, device=device)
        if self.columnwise_usage:
            t = torch.empty(tuple(shape)[-1:] + tuple(shape)[:-1], dtype=torch.uint8,
                            device=device)
        return Float8TensorStorage(shape, dtype, d, torch.ones(1, dtype=torch.float32,
                                                                device=device),
                                   t, self.dtype, self)

    def _kw(self):
        return {}

    def update_quantized(self, src, dst, *, noop_flag=None):
        if not isinstance(dst, Float8TensorStorage):
            raise TypeError(f"Cannot store quantized per-tensor FP8 data in {type(dst)} type.")
        if noop_flag is not None and bool(noop_flag.reshape(-1)[0] != 0):
            return dst
        M, K = _2d(src.shape)
        x = src.to(dst.device).contiguous().reshape(M, K)
        rowwise, columnwise = dst._data is not None, dst._transpose is not None
        q = _xq(x, self._recipe, fmt=_fmt(self.dtype), rowwise=rowwise, columnwise=columnwise,
                **self._kw())
        if rowwise:
            dst._data.view(M, K).copy_(q.data.view(torch.uint8))
            dst._scale_inv.copy_(q.scale_inv.reshape(1))
        if columnwise:
            dst._transpose.view(K, M).copy_(q.columnwise_data.view(torch.uint8))
            dst._scale_inv.copy_(q.columnwise_scale_inv.reshape(1))
            dst._transpose_invalid = False
        dst._fp8_dtype = self.dtype
        return dst


class Float8CurrentScalingQuantizer(_PerTensorQuantizer):
    """TE's per-tensor current scaling quantizer (XTE_RECIPE_TE_CURRENT): scale = fp8_max /
    max(amax, amax_epsilon), a power of two when force_pow_2_scales."""

    _recipe = "te_current"

    def __init__(self, fp8_dtype, device=None, *, rowwise=True, columnwise=True,
                 use_existing_amax=False, with_amax_reduction=False, amax_reduction_group=None,
                 force_pow_2_scales=False, amax_epsilon=0.0, scale=None, amax=None):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = DType.cast(fp8_dtype)
        _fmt(self.dtype)
        if with_amax_reduction:
            raise NotImplementedError("xte: amax reduction across a process group "
                                      "(with_amax_reduction) is not supported")
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.amax_epsilon = float(amax_epsilon)

    def _kw(self):
        return {"force_pow_2": self.force_pow_2_scales, "amax_epsilon": self.amax_epsilon}


class Float8Quantizer(_PerTensorQuantizer):
    """TE's per-tensor quantizer with the caller's scale (delayed scaling, XTE_RECIPE_TE_DELAYED):
    scale: fp32 [1] (read on the host), amax: fp32 [1] receiving max |x| of the last input."""

    _recipe = "te_delayed"

    def __init__(self, scale, amax, fp8_dtype, *, rowwise=True, columnwise=True):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.scale = scale
        self.amax = amax
        self.dtype = DType.cast(fp8_dtype)
        _fmt(self.dtype)

    def _kw(self):
        s = self.scale
        return {"scale": float(s.reshape(-1)[0]) if isinstance(s, torch.Tensor) else float(s),
                "amax": self.amax}


class MXFP8TensorStorage(_QTensorStorage):
    """TE's MXFP8 tensor fields: _rowwise_data / _columnwise_data (uint8, both the logical
    shape), _rowwise_scale_inv / _columnwise_scale_inv (E8M0 bytes, uint8, TE's padded layout),
    _fp8_dtype, _quantizer, _with_gemm_swizzled_scales (False)."""

    def __init__(self, shape, dtype, rowwise_data, rowwise_scale_inv, columnwise_data,
                 columnwise_scale_inv, fp8_dtype, quantizer):
        self._shape = torch.Size(shape)
        self._dtype = dtype
        self._rowwise_data = rowwise_data
        self._rowwise_scale_inv = rowwise_scale_inv
        self._columnwise_data = columnwise_data
        self._columnwise_scale_inv = columnwise_scale_inv
        self._fp8_dtype = fp8_dtype
        self._quantizer = quantizer
        self._with_gemm_swizzled_scales = False

    def dequantize(self, *, dtype=None):
        """x = fp32(q * 2^(e - 127)) from the rowwise copy, else the columnwise one."""
        dtype = self._dtype if dtype is None else dtype
        M, K = _2d(self._shape)
        tfp8 = TE_DType_To_Torch[self._fp8_dtype]
        if self._rowwise_data is not None:
            q = self._rowwise_data.reshape(M, K).view(tfp8).float()
            e = self._rowwise_scale_inv[:M, :-(-K // 32)].to(torch.int32)
            s = torch.exp2((e - 127).float()).repeat_interleave(32, 1)[:, :K]
        else:
            q = self._columnwise_data.reshape(M, K).view(tfp8).float()
            e = self._columnwise_scale_inv[:-(-M // 32), :K].to(torch.int32)
            s = torch.exp2((e - 127).float()).repeat_interleave(32, 0)[:M]
        return (q * s).to(dtype).reshape(self._shape)


MXFP8Tensor = MXFP8TensorStorage


class MXFP8Quantizer(Quantizer):
    """TE's MXFP8Quantizer (XTE_RECIPE_MX_TE): 1x32 rowwise / 32x1 columnwise blocks, E8M0
    scales in TE's unswizzled padded layout (the compact scales are copied into it: a copy of
    the scales only)."""

    def __init__(self, fp8_dtype, *, rowwise=True, columnwise=True, with_2d_quantization=False):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = DType.cast(fp8_dtype)
        _fmt(self.dtype)
        if with_2d_quantization:
            raise NotImplementedError("xte: MXFP8 2-D quantization (with_2d_quantization) is "
                                      "not supported")
        self.with_2d_quantization = False

    def get_scale_shape(self, shape, columnwise):
        M, K = _2d(shape)
        if columnwise:
            return (_round_up(M // 32, 4), _round_up(K, 128))
        return (_round_up(M, 128), _round_up(K // 32, 4))

    def get_columnwise_shape(self, shape):
        return tuple(shape)

    def make_empty(self, shape, *, dtype=torch.float32, device=None, requires_grad=False,
                   pin_memory=False):
        self._check_usage()
        M, K = _2d(shape)
        if M % 32 or K % 32:
            raise ValueError(f"MXFP8: shape {tuple(shape)}: the flattened dimensions must be "
                             "multiples of 32 (as TE)")
        device = torch.device("cpu") if device is None else torch.device(device)
        rd = rs = cd = cs = None
        if self.rowwise_usage:
            rd = torch.empty(tuple(shape), dtype=torch.uint8, device=device)
            rs = torch.zeros(self.get_scale_shape(shape, False), dtype=torch.uint8,
                             device=device)
        if self.columnwise_usage:
            cd = torch.empty(tuple(shape), dtype=torch.uint8, device=device)
            cs = torch.zeros(self.get_scale_shape(shape, True), dtype=torch.uint8,
                             device=device)
        return MXFP8TensorStorage(shape, dtype, rd, rs, cd, cs, self.dtype, self)

    def update_quantized(self, src, dst, *, noop_flag=None):
        if not isinstance(dst, MXFP8TensorStorage):
            raise TypeError(f"Cannot store MXFP8 data in {type(dst)} type.")
        if noop_flag is not None and bool(noop_flag.reshape(-1)[0] != 0):
            return dst
        M, K = _2d(src.shape)
        x = src.to(dst.device).contiguous().reshape(M, K)
        rowwise, columnwise = dst._rowwise_data is not None, dst._columnwise_data is not None
        tfp8 = TE_DType_To_Torch[self.dtype]
        rs = torch.empty((M, K // 32), dtype=torch.uint8) if rowwise else None
        cs = torch.empty((M // 32, K), dtype=torch.uint8) if columnwise else None
        out = _QT(dst._rowwise_data.view(M, K).view(tfp8) if rowwise else None,
                  rs.view(torch.float8_e8m0fnu) if rowwise else None, scaling_mode="1x32",
                  recipe="mx_te", layout="compact",
                  columnwise_data=dst._columnwise_data.view(M, K).view(tfp8) if columnwise
                  else None,
                  columnwise_scale_inv=cs.view(torch.float8_e8m0fnu) if columnwise else None)
        _xq(x, "mx_te", fmt=_fmt(self.dtype), rowwise=rowwise, columnwise=columnwise, out=out)
        if rowwise:
            dst._rowwise_scale_inv.zero_()[:M, :K // 32].copy_(rs)
        if columnwise:
            dst._columnwise_scale_inv.zero_()[:M // 32, :K].copy_(cs)
        dst._fp8_dtype = self.dtype
        return dst
