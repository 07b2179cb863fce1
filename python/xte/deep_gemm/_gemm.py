"""DeepGEMM's GEMM entry points over xte's custom ops (xte.torch: torch.compile traces them).

Each function takes DeepGEMM's arguments and returns None, writing d, as DeepGEMM. Before the
op: the major of each operand is read from its strides (stride(-1) == 1: K-major, else
MN-major) and an MN-major operand is passed as its stored matrix (the transposed view, no
copy) with the transposed form of the GEMM; scales (any strides) are made dense in the
orientation of the stored data (a scale copy, as DeepGEMM's own TMA-layout copy); packed UE8M0
scales (int32) are unpacked (gran_k 32: E8M0 bytes, xte's MXFP8; gran_k 128: fp32 powers of
two); fp32 power-of-two scales with gran_k 32 become E8M0 bytes (exact).

GEMM mode: DeepGEMM's signatures have no mode, so every entry point here passes the module's
setting, set_gemm_mode("exact" | "fast") / get_gemm_mode(), to the op's mode=. The default is
"exact" (xte's exact GEMM: bit-reproducible, and within DeepGEMM's own test tolerances);
"fast" selects XTE_GEMM_FAST (block partials in a backend-defined order and precision, as
DeepGEMM's tensor-core kernels form them; bound in include/xte/gemm.h).
"""

from typing import Any, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import torch as _xt
from .._lib import GemmMode, Status, XteUnsupportedError, XteValueError
from .._typing import GemmModeLike
from ..ops.gemm import parse_gemm_mode
from . import utils as _U

Pair = Tuple[Tensor, Tensor]  # DeepGEMM's (data, scales) operand

_mode = {"gemm": GemmMode.EXACT}


def set_gemm_mode(mode: GemmModeLike) -> None:
    """The GEMM mode of every xte.deep_gemm GEMM from now on: "exact" (the default) or "fast"."""
    _mode["gemm"] = parse_gemm_mode(mode)


def get_gemm_mode() -> str:
    """The GEMM mode of xte.deep_gemm's GEMMs: "exact" or "fast"."""
    return _mode["gemm"].name.lower()

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_FP4 = tuple(getattr(torch, n) for n in ("float4_e2m1fn_x2",) if hasattr(torch, n))


def _check_data(x, name):
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise XteValueError(Status.INVALID_ARGUMENT,
                            f"{name}: want a (data, scales) pair (DeepGEMM's operand)")
    data = x[0]
    if data.dtype in (torch.int8,) + _FP4:
        raise NotImplementedError(
            f"{name}: FP4 (E2M1, packed in {data.dtype}) operands are not supported by xte "
            "(FP8 e4m3 / e5m2 only)")
    if data.dtype not in _FP8:
        raise XteValueError(Status.INVALID_ARGUMENT, f"{name}[0]: dtype {data.dtype}: want "
                            "float8_e4m3fn or float8_e5m2")


def _gran_k(recipe, recipe_ab, which):
    """gran_k of operand `which` (0: a, 1: b) from DeepGEMM's recipe arguments (None: xte infers
    the scaling from the scale shapes)."""
    if recipe_ab is not None:
        return int(recipe_ab[1])
    if recipe is not None:
        return int(recipe[2])
    return None


def _unpacked(sf, k, gran_k):
    """Scales in DeepGEMM's orientation ([..., MN, ceil(K / gran_k)]): int32 packed UE8M0 (four
    bytes per int32, the first in the low byte, rows padded to a multiple of 4) unpacked to
    E8M0 bytes (gran_k 32) or fp32 powers of two (gran_k 128), trimmed to the blocks K has."""
    if sf.dtype != torch.int32:
        return sf
    g = gran_k or 128
    b = sf.contiguous().view(torch.uint8)[..., :-(-k // g)]
    if g == 32:
        return b
    return (b.to(torch.int32) << 23).view(torch.float32)


def _dense(sf, gran_k, name):
    """Scales as xte reads them (same orientation, dense); gran_k 32 fp32 powers of two as E8M0
    bytes (exact)."""
    if sf.dtype == torch.float32 and gran_k == 32:
        bits = sf.contiguous().view(torch.int32)
        if not torch.compiler.is_compiling():
            ex = (bits >> 23) & 0xFF
            if bool(((bits & 0x807FFFFF) != 0).any()) or bool(((ex == 0) | (ex == 255)).any()):
                raise XteUnsupportedError(
                    Status.UNSUPPORTED, f"{name}: gran_k 32 with fp32 scales that are not "
                    "positive powers of two: xte's 1x32 scaling is MXFP8 (E8M0); cast with "
                    "use_ue8m0=True")
        return ((bits >> 23) & 0xFF).to(torch.uint8)
    return sf.contiguous()


def _operand2(x, name, gran_k):
    """(stored data, its scales, mn_major) of a 2-D DeepGEMM operand [MN, K]."""
    _check_data(x, name)
    data, sf = x
    if data.dim() != 2:
        raise XteValueError(Status.INVALID_ARGUMENT, f"{name}[0]: want a 2-D tensor")
    sf = _unpacked(sf, data.shape[1], gran_k)
    if data.stride(-1) == 1:
        return data, _dense(sf, gran_k, f"{name}[1]"), False
    return data.t(), _dense(sf.t(), gran_k, f"{name}[1]"), True


def _grouped_b_rows(bd, bsf, recipe, recipe_a, recipe_b):
    """Per-group 128x128 scales of a K-major b [G, N, K] with N % 128 != 0 do not tile the
    stacked [G * N, K] tensor that xte's grouped GEMM reads: broadcast them to one scale per row
    ([G, N, nk], a scale copy, as DeepGEMM broadcasts them for its SM100 kernels) and use the
    1x128 form for b. The products sa * sb are the same values, so the bytes are too."""
    G, N = bd.shape[0], bd.shape[-2]
    gran_b = recipe[1] if recipe is not None else (recipe_b[0] if recipe_b is not None else 128)
    if (bsf.dim() != 3 or N % 128 == 0 or bsf.dtype != torch.float32 or gran_b != 128
            or bsf.shape[-2] != -(-N // 128) or bsf.shape[-2] == N):
        return bsf, recipe, recipe_a, recipe_b
    rows = bsf.repeat_interleave(128, dim=-2)[:, :N, :]
    gk = recipe[2] if recipe is not None else (recipe_b[1] if recipe_b is not None else 128)
    ra = (recipe[0], recipe[2]) if recipe is not None else (recipe_a or (1, gk))
    return rows, None, ra, (1, gk)


def _recipes(recipe, recipe_a, recipe_b):
    if recipe is not None:
        recipe = tuple(int(v) for v in recipe)
    if recipe_a is not None:
        recipe_a = tuple(int(v) for v in recipe_a)
    if recipe_b is not None:
        recipe_b = tuple(int(v) for v in recipe_b)
    return recipe, recipe_a, recipe_b


_FORMS = {(False, False): "nt", (False, True): "nn", (True, False): "tt", (True, True): "tn"}


def fp8_gemm_nt(a: Pair, b: Pair, d: Tensor, c: Optional[Tensor] = None, recipe: Any = None,
                recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "nk",
                disable_ue8m0_cast: bool = False) -> None:
    """d = a @ b^T (+ c): a (data [M, K], scales), b (data [N, K], scales); data K-major or
    MN-major (a strided view); d bf16 / fp32 [M, N] (row-major); c may be d. Returns None."""
    recipe, recipe_a, recipe_b = _recipes(recipe, recipe_a, recipe_b)
    ad, asf, amn = _operand2(a, "a", _gran_k(recipe, recipe_a, 0))
    bd, bsf, bmn = _operand2(b, "b", _gran_k(recipe, recipe_b, 1))
    form = _FORMS[(amn, bmn)]
    layout = ("compact", "compact")
    getattr(_xt, f"fp8_gemm_{form}")((ad, asf), (bd, bsf), d, c, recipe, recipe_a, recipe_b,
                                     layout=layout, mode=_mode["gemm"])


def fp8_gemm_nn(a: Pair, b: Pair, d: Tensor, c: Optional[Tensor] = None, recipe: Any = None,
                recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "nk",
                disable_ue8m0_cast: bool = False) -> None:
    """d = a @ b (+ c): b (data [K, N], scales of that storage)."""
    fp8_gemm_nt(a, (b[0].t(), b[1].t()), d, c, recipe, recipe_a, recipe_b, compiled_dims,
                disable_ue8m0_cast)


def fp8_gemm_tn(a: Pair, b: Pair, d: Tensor, c: Optional[Tensor] = None, recipe: Any = None,
                recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "mn",
                disable_ue8m0_cast: bool = False) -> None:
    """d = a^T @ b (+ c): a (data [K, M], scales), b (data [K, N], scales)."""
    fp8_gemm_nt((a[0].t(), a[1].t()), (b[0].t(), b[1].t()), d, c, recipe, recipe_a, recipe_b,
                compiled_dims, disable_ue8m0_cast)


def fp8_gemm_tt(a: Pair, b: Pair, d: Tensor, c: Optional[Tensor] = None, recipe: Any = None,
                recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "mn",
                disable_ue8m0_cast: bool = False) -> None:
    """d = a^T @ b^T (+ c): a (data [K, M], scales), b (data [N, K], scales)."""
    fp8_gemm_nt((a[0].t(), a[1].t()), b, d, c, recipe, recipe_a, recipe_b, compiled_dims,
                disable_ue8m0_cast)


def m_grouped_fp8_gemm_nt_contiguous(a: Pair, b: Pair, d: Tensor, grouped_layout: Optional[Tensor],
                                     recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None,
                                     compiled_dims: str = "nk", disable_ue8m0_cast: bool = False,
                                     use_psum_layout: bool = False,
                                     ensure_zero_padding: bool = True,
                                     expected_m_for_psum_layout: Optional[int] = None) -> None:
    """Rows of a [M, K] (K-major) by group: d[rows of g] = a[rows of g] @ b[g]^T, b (data
    [G, N, K] K- or MN-major, scales [G, ceil(N/128), ceil(K/128)]). grouped_layout: int32 [M]
    (row -> group, -1 padding) or, with use_psum_layout, int32 [G] (each group's end row);
    groups padded to get_mk_alignment_for_contiguous_layout(). Rows of d in no group are
    written with zeros when ensure_zero_padding. Returns None."""
    recipe, recipe_a, recipe_b = _recipes(recipe, recipe_a, recipe_b)
    _check_data(a, "a")
    _check_data(b, "b")
    if a[0].stride(-1) != 1:
        raise XteUnsupportedError(Status.UNSUPPORTED, "a: MN-major A in an m-grouped GEMM (as "
                                  "DeepGEMM: A must be K-major)")
    gk_a, gk_b = _gran_k(recipe, recipe_a, 0), _gran_k(recipe, recipe_b, 1)
    asf = _dense(_unpacked(a[1], a[0].shape[-1], gk_a), gk_a, "a[1]")
    bd, bsf = b
    bsf = _unpacked(bsf, bd.shape[-1], gk_b)
    trans_b = bd.dim() == 3 and bd.stride(-1) != 1
    if trans_b:
        bd, bsf = bd.mT, bsf.mT
    else:
        bsf, recipe, recipe_a, recipe_b = _grouped_b_rows(bd, bsf, recipe, recipe_a, recipe_b)
    bsf = _dense(bsf, gk_b, "b[1]")
    _xt.m_grouped_fp8_gemm_nt_contiguous(
        (a[0], asf), (bd, bsf), d, grouped_layout, recipe, recipe_a, recipe_b,
        alignment=_U.get_mk_alignment_for_contiguous_layout(), layout=("compact", "compact"),
        use_psum_layout=bool(use_psum_layout), ensure_zero_padding=bool(ensure_zero_padding),
        trans_b=trans_b, mode=_mode["gemm"])


def m_grouped_fp8_gemm_nn_contiguous(a: Pair, b: Pair, d: Tensor, grouped_layout: Optional[Tensor],
                                     recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None,
                                     compiled_dims: str = "nk", disable_ue8m0_cast: bool = False,
                                     use_psum_layout: bool = False,
                                     ensure_zero_padding: bool = True) -> None:
    """m_grouped_fp8_gemm_nt_contiguous with b (data [G, K, N], scales of that storage)."""
    m_grouped_fp8_gemm_nt_contiguous(a, (b[0].mT, b[1].mT), d, grouped_layout, recipe, recipe_a,
                                     recipe_b, compiled_dims, disable_ue8m0_cast,
                                     use_psum_layout, ensure_zero_padding)


def m_grouped_fp8_gemm_nt_masked(a: Pair, b: Pair, d: Tensor, masked_m: Tensor,
                                 expected_m: Optional[int], recipe: Any = None,
                                 recipe_a: Any = None, recipe_b: Any = None,
                                 compiled_dims: str = "nk",
                                 disable_ue8m0_cast: bool = False) -> None:
    """d[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g]^T: a [G, max_m, K], b [G, N, K] (both
    K-major), d [G, max_m, N]; rows past masked_m[g] are neither read nor written; expected_m
    is DeepGEMM's scheduling hint (unused). Returns None."""
    recipe, recipe_a, recipe_b = _recipes(recipe, recipe_a, recipe_b)
    _check_data(a, "a")
    _check_data(b, "b")
    if a[0].stride(-1) != 1 or b[0].stride(-1) != 1:
        raise XteUnsupportedError(Status.UNSUPPORTED, "a, b: the masked grouped GEMM takes "
                                  "K-major operands (as DeepGEMM)")
    gk_a, gk_b = _gran_k(recipe, recipe_a, 0), _gran_k(recipe, recipe_b, 1)
    asf = _dense(_unpacked(a[1], a[0].shape[-1], gk_a), gk_a, "a[1]")
    bsf, recipe, recipe_a, recipe_b = _grouped_b_rows(
        b[0], _unpacked(b[1], b[0].shape[-1], gk_b), recipe, recipe_a, recipe_b)
    bsf = _dense(bsf, gk_b, "b[1]")
    _xt.m_grouped_fp8_gemm_nt_masked((a[0], asf), (b[0], bsf), d, masked_m, expected_m, recipe,
                                     recipe_a, recipe_b, layout=("compact", "compact"),
                                     mode=_mode["gemm"])


def _k_grouped(a, b, d, ks_cpu, grouped_layout, c, recipe, use_psum_layout, nt):
    _check_data(a, "a")
    _check_data(b, "b")
    recipe = tuple(int(v) for v in recipe)
    gk = recipe[2] if len(recipe) == 3 else 128
    asf, bsf = _k_scales(a[1], gk), _k_scales(b[1], gk)
    ks = None if ks_cpu is None or (isinstance(ks_cpu, (list, tuple)) and not ks_cpu) else ks_cpu
    _xt.k_grouped_fp8_gemm_tn_contiguous(
        (a[0], asf), (b[0], bsf), d, ks, grouped_layout, c, recipe,
        layout=("compact", "compact"), use_psum_layout=bool(use_psum_layout),
        alignment=_U.get_mk_alignment_for_contiguous_layout(), nt=nt, mode=_mode["gemm"])


def _k_scales(sf, gk):
    """k-grouped scales [rows of blocks, MN]: packed int32 (four rows' UE8M0 bytes of a column
    per int32, DeepGEMM's packing along K) are not read here; fp32 / E8M0 pass (fp32 with
    gran_k 32: E8M0 bytes, checked in the op)."""
    if sf.dtype == torch.int32:
        raise NotImplementedError("k-grouped GEMM with packed UE8M0 (int32) scales: pass fp32 "
                                  "or E8M0 scales")
    return sf.contiguous()


def k_grouped_fp8_gemm_tn_contiguous(a: Pair, b: Pair, d: Tensor, ks_cpu: Optional[Sequence[int]],
                                     grouped_layout: Optional[Tensor], c: Optional[Tensor] = None,
                                     recipe: Any = (1, 1, 128), compiled_dims: str = "mn",
                                     use_psum_layout: bool = False) -> None:
    """Weight-gradient GEMM with K grouped: a (data [sum_k, M], scales [sum_g ceil(k_g /
    gran_k), M]), b likewise [sum_k, N]; d [G, M, N] = c[g] + a[seg g]^T @ b[seg g]. ks_cpu:
    the K of each group (None / [] with use_psum_layout: grouped_layout's end rows, groups
    starting at the previous end rounded up to get_mk_alignment_for_contiguous_layout()).
    recipe (1, 1, 128) or (1, 1, 32). Returns None."""
    _k_grouped(a, b, d, ks_cpu, grouped_layout, c, recipe, use_psum_layout, False)


def k_grouped_fp8_gemm_nt_contiguous(a: Pair, b: Pair, d: Tensor, ks_cpu: Optional[Sequence[int]],
                                     grouped_layout: Optional[Tensor], c: Optional[Tensor] = None,
                                     recipe: Any = (1, 1, 128), compiled_dims: str = "mn",
                                     use_psum_layout: bool = False) -> None:
    """k-grouped with K-major operands: a holds each group's [M, k_g] block one after the other
    (flat), b [N, k_g] blocks; scales [M, sum_k / 128] / [N, ...]. Returns None."""
    _k_grouped(a, b, d, ks_cpu, grouped_layout, c, recipe, use_psum_layout, True)


def _unit_pair(x, name):
    if x.dtype not in _FP8:
        raise NotImplementedError(f"{name}: cublaslt_gemm_* over xte takes FP8 operands "
                                  f"(no {x.dtype} GEMM in xte)")
    return (x, torch.ones((1, 1), dtype=torch.float32, device=x.device))


def cublaslt_gemm_nt(a: Tensor, b: Tensor, d: Tensor, c: Optional[Tensor] = None) -> None:
    """d = a @ b^T (+ c) of unscaled FP8 a [M, K], b [N, K] (K- or MN-major): xte's per-tensor
    GEMM with unit scales. Returns None."""
    pa, pb = _unit_pair(a, "a"), _unit_pair(b, "b")
    amn, bmn = a.stride(-1) != 1, b.stride(-1) != 1
    pa = (a.t(), pa[1]) if amn else pa
    pb = (b.t(), pb[1]) if bmn else pb
    getattr(_xt, f"fp8_gemm_{_FORMS[(amn, bmn)]}")(pa, pb, d, c, recipe_a="per_tensor",
                                                   recipe_b="per_tensor", mode=_mode["gemm"])


def cublaslt_gemm_nn(a: Tensor, b: Tensor, d: Tensor, c: Optional[Tensor] = None) -> None:
    cublaslt_gemm_nt(a, b.t(), d, c)


def cublaslt_gemm_tn(a: Tensor, b: Tensor, d: Tensor, c: Optional[Tensor] = None) -> None:
    cublaslt_gemm_nt(a.t(), b.t(), d, c)


def cublaslt_gemm_tt(a: Tensor, b: Tensor, d: Tensor, c: Optional[Tensor] = None) -> None:
    cublaslt_gemm_nt(a.t(), b, d, c)
