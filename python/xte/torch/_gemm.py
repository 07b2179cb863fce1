"""The GEMM family's custom ops (xte.ops.gemm): xte::gemm and xte::gemm_grouped over
QuantizedTensor operands, and DeepGEMM's destination-passing GEMMs (fp8_gemm_nt / nn / tn / tt,
m_grouped_fp8_gemm_nt_contiguous / _masked, k_grouped_fp8_gemm_tn_contiguous) over (data, scales)
pairs. Every op takes the GEMM mode as an int (GemmMode.EXACT / FAST), set in one place
(gemm_config) for xte::gemm / xte::gemm_grouped and passed to the plain function's mode= by the
DeepGEMM ops."""

import ctypes
from typing import List, Optional

import torch
from torch import Tensor

from .._lib import DType, GemmGroups, Status, XteValueError, call, lib
from .._tensor import empty, stream_of, torch_dtype, view, zeros
from ..ops import gemm as _G
from ._common import ACT, DEV, I64P, as_dtype, logical_shape, prod, qtensor


def _gemm_cfg(trans_a, trans_b, accumulate, mode, vbias):
    cfg = lib.xte_gemm_config_default()
    cfg.trans_a = int(trans_a)
    cfg.trans_b = int(trans_b)
    cfg.accumulate = int(accumulate)
    cfg.mode = int(mode)
    if vbias is not None:
        cfg.bias = ctypes.pointer(vbias.t)
    return cfg


@torch.library.custom_op("xte::gemm", mutates_args=(), device_types=DEV)
def gemm(a_data: Optional[Tensor], a_scale: Optional[Tensor], a_cdata: Optional[Tensor],
         a_cscale: Optional[Tensor], a_meta: List[int], b_data: Optional[Tensor],
         b_scale: Optional[Tensor], b_cdata: Optional[Tensor], b_cscale: Optional[Tensor],
         b_meta: List[int], c: Optional[Tensor], bias: Optional[Tensor], trans_a: bool,
         trans_b: bool, accumulate: bool, mode: int, out_dtype: int) -> Tensor:
    """D = op(A) op(B)^T (+ C) (+ bias) (xte_gemm); A / B as (data, scale_inv, columnwise data,
    columnwise scale_inv) with meta [scaling_mode, recipe, layout, columnwise_layout, fmt]; the C
    flags (trans_b False: B is [N, K])."""
    qa, ka = qtensor(a_data, a_scale, a_cdata, a_cscale, a_meta, "a")
    qb, kb = qtensor(b_data, b_scale, b_cdata, b_cscale, b_meta, "b")
    M = _gemm_out_dim(a_data, a_cdata, a_meta, trans_a)
    N = _gemm_out_dim(b_data, b_cdata, b_meta, trans_b)
    vc = view(c, "c", ACT) if c is not None else None
    vbias = view(bias, "bias", (DType.FP32,)) if bias is not None else None
    d = empty(ka[0], (M, N), out_dtype)
    vd = view(d, "out", writable=True)
    cfg = _gemm_cfg(trans_a, trans_b, accumulate, mode, vbias)
    call("xte_gemm", ctypes.byref(qa), ctypes.byref(qb), vc.ptr if vc is not None else None,
         vd.ptr, ctypes.byref(cfg), stream_of(vd, vc, vbias, *ka, *kb))
    return d


def _gemm_out_dim(data, cdata, meta, trans):
    r, c = logical_shape(data, cdata, meta)
    return c if trans else r


@gemm.register_fake
def _(a_data, a_scale, a_cdata, a_cscale, a_meta, b_data, b_scale, b_cdata, b_cscale, b_meta, c,
      bias, trans_a, trans_b, accumulate, mode, out_dtype):
    M = _gemm_out_dim(a_data, a_cdata, a_meta, trans_a)
    N = _gemm_out_dim(b_data, b_cdata, b_meta, trans_b)
    ref = a_data if a_data is not None else a_cdata
    return ref.new_empty((M, N), dtype=torch_dtype(out_dtype))


def _grouped_out_shape(a_data, a_cdata, a_meta, b_data, b_cdata, b_meta, trans_a, trans_b, kind,
                       G):
    ar, ac = logical_shape(a_data, a_cdata, a_meta)
    br, bc = logical_shape(b_data, b_cdata, b_meta)
    if kind == 2:  # K-grouped: D [G, M, N]
        return (G, ac if trans_a else ar, bc if trans_b else br)
    N = bc if trans_b else br // G
    if kind == 1:  # masked: A [G, m_max, K] -> D [G, m_max, N]
        return (G, ar // G, N)
    return (ar, N)


@torch.library.custom_op("xte::gemm_grouped", mutates_args=(), device_types=DEV)
def gemm_grouped(a_data: Optional[Tensor], a_scale: Optional[Tensor], a_cdata: Optional[Tensor],
                 a_cscale: Optional[Tensor], a_meta: List[int], b_data: Optional[Tensor],
                 b_scale: Optional[Tensor], b_cdata: Optional[Tensor],
                 b_cscale: Optional[Tensor], b_meta: List[int], c: Optional[Tensor],
                 bias: Optional[Tensor], group_sizes: Optional[Tensor],
                 masked_m: Optional[Tensor], num_groups: int, kind: int, alignment: int,
                 trans_a: bool, trans_b: bool, accumulate: bool, mode: int,
                 out_dtype: int) -> Tensor:
    """xte_gemm_grouped: kind 0 contiguous (D [rows of A, N]), 1 masked (D [G, m_max, N]),
    2 K-grouped (D [G, M, N]). group_sizes: int64 [G] (read on the host); masked_m int32 [G]."""
    qa, ka = qtensor(a_data, a_scale, a_cdata, a_cscale, a_meta, "a")
    qb, kb = qtensor(b_data, b_scale, b_cdata, b_cscale, b_meta, "b")
    shape = _grouped_out_shape(a_data, a_cdata, a_meta, b_data, b_cdata, b_meta, trans_a,
                               trans_b, kind, num_groups)
    vc = view(c, "c", ACT) if c is not None else None
    vbias = view(bias, "bias", (DType.FP32,)) if bias is not None else None
    # rows the C call never writes (masked rows past masked_m, padding rows) read as zeros: a
    # functional op must not return uninitialised memory
    d = (zeros if kind == 1 or alignment > 1 else empty)(ka[0], shape, out_dtype)
    vd = view(d, "out", writable=True)
    g = GemmGroups()
    g.kind = int(kind)
    g.num_groups = int(num_groups)
    g.alignment = int(alignment)
    gs = None
    if group_sizes is not None:
        gs = group_sizes if group_sizes.device.type == "cpu" else group_sizes.cpu()
        vgs = view(gs, "group_sizes", (DType.INT64,))
        if prod(vgs.shape) != num_groups:
            raise XteValueError(Status.SHAPE, f"group_sizes: {prod(vgs.shape)} values for "
                                f"{num_groups} groups")
        g.group_sizes = ctypes.cast(vgs.t.data, I64P)
    vm = None
    if masked_m is not None:
        vm = view(masked_m, "masked_m", (DType.INT32,))
        g.masked_m = ctypes.pointer(vm.t)
    cfg = _gemm_cfg(trans_a, trans_b, accumulate, mode, vbias)
    call("xte_gemm_grouped", ctypes.byref(qa), ctypes.byref(qb),
         vc.ptr if vc is not None else None, vd.ptr, ctypes.byref(g), ctypes.byref(cfg),
         stream_of(vd, vc, vbias, vm, *ka, *kb))
    return d


@gemm_grouped.register_fake
def _(a_data, a_scale, a_cdata, a_cscale, a_meta, b_data, b_scale, b_cdata, b_cscale, b_meta, c,
      bias, group_sizes, masked_m, num_groups, kind, alignment, trans_a, trans_b, accumulate,
      mode, out_dtype):
    shape = _grouped_out_shape(a_data, a_cdata, a_meta, b_data, b_cdata, b_meta, trans_a,
                               trans_b, kind, num_groups)
    ref = a_data if a_data is not None else a_cdata
    return ref.new_empty(shape, dtype=torch_dtype(out_dtype))


# ============================================================================= DeepGEMM names
#
# Destination-passing ops: each mutates d (mutates_args=("d",)) and returns nothing, as
# DeepGEMM's functions; torch.compile functionalises them. Operands are (data, scales) pairs:
# data as uint8 bytes with its fp8 format (a_fmt / b_fmt: DType.E4M3 / E5M2), scales fp32 or
# E8M0 bytes (uint8). The bodies run the plain xte.fp8_gemm_* / *_grouped_* functions (scale
# shapes resolved there with xte_quantize_scale_shape; errors name the argument); the fake
# kernels have no output to shape. recipe: [] or DeepGEMM's (gran_m, gran_n, gran_k); hints:
# [mode_a, layout_a, mode_b, layout_b] (ScalingMode / ScaleLayout ints, -1 = infer).

def _pair(data, scale, fmt):
    return (as_dtype(data, fmt) if data.dtype == torch.uint8 else data), scale


def _hint_kw(recipe, hints, modes=True):
    ma, la, mb, lb = (None if int(h) < 0 else int(h) for h in hints)
    kw = {"recipe": tuple(int(v) for v in recipe) if len(recipe) else None,
          "layout": None if la is None and lb is None else (la, lb)}
    if modes:
        kw["recipe_a"], kw["recipe_b"] = ma, mb
    return kw


def _make_fp8_gemm(nm):
    plain = getattr(_G, f"fp8_gemm_{nm}")

    def fp8_gemm(a_data: Tensor, a_scale: Tensor, b_data: Tensor, b_scale: Tensor, d: Tensor,
                 c: Optional[Tensor], c_is_d: bool, bias: Optional[Tensor], a_fmt: int,
                 b_fmt: int, recipe: List[int], hints: List[int], gemm_mode: int) -> None:
        plain(_pair(a_data, a_scale, a_fmt), _pair(b_data, b_scale, b_fmt), d,
              d if c_is_d else c, mode=int(gemm_mode), bias=bias, **_hint_kw(recipe, hints))

    fp8_gemm.__name__ = fp8_gemm.__qualname__ = f"fp8_gemm_{nm}"
    fp8_gemm.__doc__ = (f"DeepGEMM's fp8_gemm_{nm} (xte.fp8_gemm_{nm}): d = op(a) op(b) (+ c, "
                        "or + d itself when c_is_d) (+ bias), written into d.")
    op = torch.library.custom_op(f"xte::fp8_gemm_{nm}", fp8_gemm, mutates_args=("d",),
                                 device_types=DEV)

    @op.register_fake
    def _(a_data, a_scale, b_data, b_scale, d, c, c_is_d, bias, a_fmt, b_fmt, recipe, hints,
          gemm_mode):
        return None
    return op


fp8_gemm_nt = _make_fp8_gemm("nt")
fp8_gemm_nn = _make_fp8_gemm("nn")
fp8_gemm_tn = _make_fp8_gemm("tn")
fp8_gemm_tt = _make_fp8_gemm("tt")


@torch.library.custom_op("xte::m_grouped_fp8_gemm_nt_contiguous", mutates_args=("d",),
                         device_types=DEV)
def m_grouped_fp8_gemm_nt_contiguous(a_data: Tensor, a_scale: Tensor, b_data: Tensor,
                                     b_scale: Tensor, d: Tensor, grouped_layout: Optional[Tensor],
                                     group_sizes: Optional[Tensor], alignment: int,
                                     bias: Optional[Tensor], a_fmt: int, b_fmt: int,
                                     recipe: List[int], hints: List[int], gemm_mode: int,
                                     use_psum_layout: bool = False,
                                     ensure_zero_padding: bool = True,
                                     trans_b: bool = False) -> None:
    """xte.m_grouped_fp8_gemm_nt_contiguous: groups from group_sizes (int64 [G], read on the
    host) or DeepGEMM's grouped_layout (int32 [M] m_indices, or with use_psum_layout int32 [G]
    end rows); alignment -1: the plain function's default; trans_b: b is [G, K, N] (_nn);
    ensure_zero_padding: d's rows in no group are written with zeros."""
    _G.m_grouped_fp8_gemm_nt_contiguous(
        _pair(a_data, a_scale, a_fmt), _pair(b_data, b_scale, b_fmt), d, grouped_layout,
        group_sizes=group_sizes, alignment=None if alignment < 0 else int(alignment),
        mode=int(gemm_mode), bias=bias, use_psum_layout=bool(use_psum_layout),
        ensure_zero_padding=bool(ensure_zero_padding), trans_b=bool(trans_b),
        **_hint_kw(recipe, hints))


@m_grouped_fp8_gemm_nt_contiguous.register_fake
def _(a_data, a_scale, b_data, b_scale, d, grouped_layout, group_sizes, alignment, bias, a_fmt,
      b_fmt, recipe, hints, gemm_mode, use_psum_layout=False, ensure_zero_padding=True,
      trans_b=False):
    return None


@torch.library.custom_op("xte::m_grouped_fp8_gemm_nt_masked", mutates_args=("d",),
                         device_types=DEV)
def m_grouped_fp8_gemm_nt_masked(a_data: Tensor, a_scale: Tensor, b_data: Tensor,
                                 b_scale: Tensor, d: Tensor, masked_m: Tensor,
                                 bias: Optional[Tensor], a_fmt: int, b_fmt: int,
                                 recipe: List[int], hints: List[int], gemm_mode: int) -> None:
    """xte.m_grouped_fp8_gemm_nt_masked: d[g, :masked_m[g]] = a[g, :masked_m[g]] b[g]^T."""
    _G.m_grouped_fp8_gemm_nt_masked(
        _pair(a_data, a_scale, a_fmt), _pair(b_data, b_scale, b_fmt), d, masked_m,
        mode=int(gemm_mode), bias=bias, **_hint_kw(recipe, hints))


@m_grouped_fp8_gemm_nt_masked.register_fake
def _(a_data, a_scale, b_data, b_scale, d, masked_m, bias, a_fmt, b_fmt, recipe, hints,
      gemm_mode):
    return None


@torch.library.custom_op("xte::k_grouped_fp8_gemm_tn_contiguous", mutates_args=("d",),
                         device_types=DEV)
def k_grouped_fp8_gemm_tn_contiguous(a_data: Tensor, a_scale: Tensor, b_data: Tensor,
                                     b_scale: Tensor, d: Tensor, ks: Optional[Tensor],
                                     grouped_layout: Optional[Tensor], c: Optional[Tensor],
                                     c_is_d: bool, bias: Optional[Tensor], a_fmt: int,
                                     b_fmt: int, recipe: List[int], hints: List[int],
                                     gemm_mode: int, use_psum_layout: bool = False,
                                     alignment: int = -1, nt: bool = False) -> None:
    """xte.k_grouped_fp8_gemm_tn_contiguous (nt: _nt_contiguous): d[g] = (c[g] +) a_g^T b_g;
    ks int64 [G] (or grouped_layout; with use_psum_layout the end rows), read on the host.
    hints: only the layouts are used (the modes come from recipe, as the plain function)."""
    f = _G.k_grouped_fp8_gemm_nt_contiguous if nt else _G.k_grouped_fp8_gemm_tn_contiguous
    f(_pair(a_data, a_scale, a_fmt), _pair(b_data, b_scale, b_fmt), d, ks, grouped_layout,
      d if c_is_d else c, tuple(int(v) for v in recipe) if len(recipe) else (1, 1, 128),
      mode=int(gemm_mode), bias=bias, use_psum_layout=bool(use_psum_layout),
      alignment=None if alignment < 0 else int(alignment),
      layout=_hint_kw(recipe, hints, modes=False)["layout"])


@k_grouped_fp8_gemm_tn_contiguous.register_fake
def _(a_data, a_scale, b_data, b_scale, d, ks, grouped_layout, c, c_is_d, bias, a_fmt, b_fmt,
      recipe, hints, gemm_mode, use_psum_layout=False, alignment=-1, nt=False):
    return None


OPS = {
    "gemm": gemm, "gemm_grouped": gemm_grouped,
    "fp8_gemm_nt": fp8_gemm_nt, "fp8_gemm_nn": fp8_gemm_nn, "fp8_gemm_tn": fp8_gemm_tn,
    "fp8_gemm_tt": fp8_gemm_tt,
    "m_grouped_fp8_gemm_nt_contiguous": m_grouped_fp8_gemm_nt_contiguous,
    "m_grouped_fp8_gemm_nt_masked": m_grouped_fp8_gemm_nt_masked,
    "k_grouped_fp8_gemm_tn_contiguous": k_grouped_fp8_gemm_tn_contiguous,
}
