"""Testing helpers: DeepGEMM's calc_diff, assert_bitwise_equal, and NumPy reference quantizers.

The reference quantizers are oracles: they are written from the recipe texts of
docs/numerics.md (sections 3-5) and the TransformerEngine / DeepGEMM / MT-TE / OCP MX facts,
independently of the C code, with NumPy fp32 arithmetic and ml_dtypes conversions. They are slow
and meant for small test shapes.

    reference_quantize(x, recipe, block=None, fmt="e4m3", ...)  -> (fp8 data, compact scales)
    reference_scale_layout(compact, grid, layout)                -> scales in a scale layout
    reference_dequantize(data, compact_scales, grid, block)      -> fp32
"""

from typing import Any, Dict, Optional, Tuple

import numpy as np

__all__ = ["calc_diff", "assert_bitwise_equal", "to_numpy", "reference_quantize",
           "reference_scale_layout", "reference_dequantize", "reference_fp8",
           "reference_columnwise_transposed", "reference_grid_kind"]


# ----------------------------------------------------------------------------- comparisons

def _is_torch(x):
    import sys
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy array with x's bytes and dtype (torch bf16 / fp8 / e8m0 as ml_dtypes types),
    copied to host memory when x is a torch tensor."""
    if _is_torch(x):
        import ml_dtypes
        import torch
        t = x.detach().cpu().contiguous()
        name = str(t.dtype).rsplit(".", 1)[-1]
        if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
            raw = t.view(torch.int16 if t.element_size() == 2 else torch.uint8).numpy()
            return raw.view(np.dtype(getattr(ml_dtypes, name)))
        if t.dtype == torch.bool:
            return t.numpy()
        return t.numpy()
    return np.asarray(x)


def calc_diff(x: Any, y: Any) -> float:
    """DeepGEMM's similarity measure: 1 - 2 sum(x y) / sum(x^2 + y^2), in fp64 (0 for equal
    tensors; 0.0 when both are all zero, as DeepGEMM). Works on torch tensors and NumPy
    arrays."""
    if _is_torch(x) or _is_torch(y):
        import torch
        x = (x if _is_torch(x) else torch.from_numpy(np.asarray(x, np.float64))).double()
        y = (y if _is_torch(y) else torch.from_numpy(np.asarray(y, np.float64))).double()
        y = y.to(x.device)
        denominator = (x * x + y * y).sum()
        if float(denominator) == 0.0:  # both all zero (or empty): equal, as DeepGEMM
            return 0.0
        sim = 2 * (x * y).sum() / denominator
        return float(1 - sim)
    x = np.asarray(x).astype(np.float64)
    y = np.asarray(y).astype(np.float64)
    denominator = (x * x + y * y).sum()
    if denominator == 0.0:
        return 0.0
    sim = 2 * (x * y).sum() / denominator
    return float(1 - sim)


def _dtype_name(x):
    return str(x.dtype).rsplit(".", 1)[-1]


def assert_bitwise_equal(a: Any, b: Any, msg: Optional[str] = None,
                         check_dtype: bool = True) -> None:
    """Assert that a and b (torch tensors or NumPy arrays, any mix) have the same shape, the
    same dtype (by name: torch.bfloat16 equals ml_dtypes.bfloat16) and the same bytes. The
    message names the first differing element (multi-index) and both values' bytes."""
    where = f"{msg}: " if msg else ""
    na, nb = to_numpy(a), to_numpy(b)
    if tuple(na.shape) != tuple(nb.shape):
        raise AssertionError(f"{where}shapes differ: {tuple(na.shape)} vs {tuple(nb.shape)}")
    if check_dtype and _dtype_name(na) != _dtype_name(nb):
        raise AssertionError(f"{where}dtypes differ: {_dtype_name(na)} vs {_dtype_name(nb)}")
    if na.dtype.itemsize != nb.dtype.itemsize:
        raise AssertionError(f"{where}element sizes differ: {na.dtype.itemsize} vs "
                             f"{nb.dtype.itemsize}")
    isz = na.dtype.itemsize
    ba = np.ascontiguousarray(na).reshape(-1).view(np.uint8).reshape(-1, isz)
    bb = np.ascontiguousarray(nb).reshape(-1).view(np.uint8).reshape(-1, isz)
    diff = np.any(ba != bb, axis=1)
    if diff.any():
        flat = int(np.argmax(diff))
        idx = tuple(int(i) for i in (np.unravel_index(flat, na.shape) if na.ndim else ()))
        n = int(diff.sum())
        raise AssertionError(
            f"{where}{n} of {diff.size} elements differ; first at index {idx}: "
            f"{na.reshape(-1)[flat]!r} (0x{ba[flat][::-1].tobytes().hex()}) vs "
            f"{nb.reshape(-1)[flat]!r} (0x{bb[flat][::-1].tobytes().hex()})")


# ----------------------------------------------------------------------------- fp8 rounding

_F32 = np.float32
_FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
_EMAX_ELEM = {"e4m3": 8, "e5m2": 15}
_INPUT_MAX = {"float32": float(np.finfo(np.float32).max), "bfloat16": float.fromhex("0x1.FEp127"),
              "float16": 65504.0}


def _fmt_name(fmt):
    f = str(fmt).lower()
    if f in ("e4m3", "float8_e4m3fn", "e4m3fn"):
        return "e4m3"
    if f in ("e5m2", "float8_e5m2"):
        return "e5m2"
    raise ValueError(f"fmt: {fmt!r}")


def reference_fp8(y: Any, fmt: str = "e4m3", saturate: bool = True) -> np.ndarray:
    """fp32 -> fp8 (RNE) as docs/numerics.md section 3 states, via ml_dtypes: saturating clamps
    to +-max first (ml_dtypes itself does not saturate); NaN keeps its sign (0x7F | s for e4m3,
    0x7E | s for e5m2); e4m3's non-saturating overflow is NaN with the sign of the value."""
    import ml_dtypes
    f = _fmt_name(fmt)
    y = np.asarray(y, dtype=_F32)
    mx = _F32(_FP8_MAX[f])
    src = np.clip(y, -mx, mx) if saturate else y
    dt = ml_dtypes.float8_e4m3fn if f == "e4m3" else ml_dtypes.float8_e5m2
    with np.errstate(all="ignore"):
        codes = src.astype(dt).view(np.uint8).copy()
    sign = (np.signbit(y).astype(np.uint8) << 7)
    nan_code = np.uint8(0x7F if f == "e4m3" else 0x7E)
    codes = np.where(np.isnan(y), nan_code | sign, codes).astype(np.uint8)
    if f == "e4m3" and not saturate:
        codes = np.where(np.isnan(codes.view(dt).astype(_F32)), np.uint8(0x7F) | sign, codes)
    return codes.astype(np.uint8).view(dt)


# ----------------------------------------------------------------------------- recipes

def _amax(blocks, axis):
    """fmaxf amax: NaN never wins, starts from +0 (so never NaN)."""
    a = np.abs(blocks.astype(_F32))
    return np.fmax.reduce(a, axis=axis, initial=_F32(0.0)).astype(_F32)


def _bits(x):
    return np.asarray(x, dtype=_F32).view(np.uint32)


def _from_bits(u):
    return np.asarray(u, dtype=np.uint32).view(_F32)


def _te_scale(amax, fmt, eps, pow2, inf_scale):
    """Recipe 1 / 6 steps (TE Float8BlockScaling / current scaling) on fp32 amax values."""
    amax = np.asarray(amax, dtype=_F32)
    eps = _F32(eps)
    amax = np.where(amax < eps, eps, amax).astype(_F32)
    bad = np.isinf(amax) | (amax == 0) | np.isnan(amax)
    with np.errstate(all="ignore"):
        scale = (_F32(_FP8_MAX[fmt]) / np.where(bad, _F32(1), amax)).astype(_F32)
    scale = np.where(bad, _F32(1), scale).astype(_F32)
    scale = np.where(np.isinf(scale), _F32(inf_scale), scale).astype(_F32)
    if pow2:
        scale = _from_bits(_bits(scale) & np.uint32(0xFF800000))
    with np.errstate(all="ignore"):
        scale_inv = (_F32(1) / scale).astype(_F32)
    return scale, scale_inv


def _deepgemm_scale(amax, fmt, ue8m0):
    with np.errstate(all="ignore"):
        sf = (np.maximum(amax, _F32(1e-4)) / _F32(_FP8_MAX[fmt])).astype(_F32)
    if ue8m0:
        u = _bits(sf)
        e = (u >> np.uint32(23)) & np.uint32(0xFF)
        e = e + ((u & np.uint32(0x7FFFFF)) != 0).astype(np.uint32)
        sf = _from_bits(e << np.uint32(23))
    with np.errstate(all="ignore"):
        scale = (_F32(1) / sf).astype(_F32)
    return scale, sf


def _mtfp8_scale(amax, fmt):
    with np.errstate(all="ignore"):
        inv_max = _F32(_F32(1) / _F32(_FP8_MAX[fmt]))
        scale_inv = (np.maximum(amax, _F32(1e-30)) * inv_max).astype(_F32)
        scale = (_F32(1) / scale_inv).astype(_F32)
    return scale, scale_inv


def _pow2_f32(k):
    """2^k as fp32 for integer k in [-149, 127] (exact, via float64)."""
    return np.ldexp(np.ones_like(k, dtype=np.float64), k.astype(np.int64)).astype(_F32)


def _mx_te_scale(amax, fmt):
    """E8M0_ceil(amax * fp32(1/fp8_max)): the smallest power of two 2^k >= v, k in [-127, 127]
    (so fp32 subnormals give 0 up to 2^-127 and 1 above), inf -> 0xFE, NaN -> 0xFF, 0 -> 0.
    ceil(log2 v) is read off frexp in fp64 (exact), not off the fp32 bits."""
    with np.errstate(all="ignore"):
        v = (amax * _F32(_F32(1) / _F32(_FP8_MAX[fmt]))).astype(_F32)
    v64 = v.astype(np.float64)
    fin = np.isfinite(v64) & (v64 > 0)
    m, ex = np.frexp(np.where(fin, v64, 1.0))       # v = m 2^ex, m in [0.5, 1)
    ceil_log2 = np.where(m == 0.5, ex - 1, ex).astype(np.int64)
    e = np.clip(ceil_log2 + 127, 0, 254)
    e = np.where(v64 == 0, 0, e)
    e = np.where(np.isinf(v64), 0xFE, e)
    e = np.where(np.isnan(v64), 0xFF, e)
    scale = _pow2_f32(127 - np.minimum(e, 254))
    return scale, e.astype(np.uint8)


def _mx_ocp_scale(amax, fmt):
    a = np.asarray(amax, dtype=np.float64)
    _, ex = np.frexp(a)           # a = m 2^ex, m in [0.5, 1): floor(log2 a) = ex - 1
    fl = ex.astype(np.int64) - 1
    se = fl - _EMAX_ELEM[fmt]
    se = np.where(a == 0, -127, se)
    se = np.where(np.isinf(a), 127, se)
    se = np.clip(se, -127, 127)
    return _pow2_f32(-se), (se + 127).astype(np.uint8)


_RECIPE_NAMES = {"te_block", "deepgemm", "deepgemm_ue8m0", "mtfp8", "mx_te", "mx_ocp",
                 "te_current", "te_delayed"}
_BLOCKS: Dict[Any, Optional[Tuple[int, int]]] = {
    "1x128": (1, 128), "128x128": (128, 128), "1x32": (1, 32), "per_tensor": None,
    (1, 128): (1, 128), (128, 128): (128, 128), (1, 32): (1, 32)}


def _recipe_name(recipe):
    r = getattr(recipe, "xte_recipe", recipe)
    name = getattr(r, "name", r)
    name = str(name).lower()
    if name not in _RECIPE_NAMES:
        raise ValueError(f"recipe: {recipe!r}")
    return name


def _default_block(r):
    if r in ("te_current", "te_delayed"):
        return "per_tensor"
    if r in ("mx_te", "mx_ocp"):
        return "1x32"
    return "1x128"


def _block_name(block, r):
    if block is None:
        block = _default_block(r)
    b = getattr(block, "name", block)
    if isinstance(b, str):
        b = b.lower().replace("block_", "").replace("mxfp8_", "")
    if isinstance(b, list):
        b = tuple(b)
    if b not in _BLOCKS:
        raise ValueError(f"block: {block!r}")
    return next(k for k, v in _BLOCKS.items() if isinstance(k, str) and v == _BLOCKS[b])


def _as_f32_input(x):
    x = to_numpy(x)
    name = _dtype_name(x)
    if name not in _INPUT_MAX:
        raise TypeError(f"x: dtype {name}, expected float32 / bfloat16 / float16")
    return x.astype(_F32), name


def _rowwise_blocks(x32, bm, bk):
    """Per-block amax grid [GR, GC] and a function mapping the grid back to elements."""
    M, K = x32.shape
    GR, GC = -(-M // bm), -(-K // bk)
    pad = np.zeros((GR * bm, GC * bk), dtype=_F32)
    pad[:M, :K] = np.abs(x32)
    # NaN never wins: fmax ignores it, and padding zeros cannot raise the amax
    amax = _amax(pad.reshape(GR, bm, GC, bk), axis=(1, 3))

    def expand(grid):
        return np.repeat(np.repeat(grid, bm, axis=0), bk, axis=1)[:M, :K]
    return amax, expand


def reference_quantize(x: Any, recipe: Any = "te_block", block: Any = None, fmt: str = "e4m3", *,
                       amax_epsilon: float = 0.0, force_pow_2=None, saturate: bool = True,
                       scale=None, columnwise: bool = False):
    """NumPy oracle of one quantized copy, as docs/numerics.md section 4 states the recipes.

    x: 2-D fp32 / bf16 / fp16 (NumPy or torch). Returns (data, scales): data as ml_dtypes
    float8_e4m3fn / float8_e5m2; scales in the COMPACT layout, the copy's block grid [GR, GC]
    row-major, fp32 (scale_inv) or uint8 E8M0 codes viewed as ml_dtypes.float8_e8m0fnu for the
    MX recipes. columnwise=True gives the columnwise copy: the transpose [K, M] quantized along M
    (per-tensor, TE_BLOCK, DeepGEMM) or the untransposed [M, K] in Bx1 blocks (MTFP8, MX), with
    its grid [ceil(M/B), K]; 128x128 tiles keep the tile scales (the transposed grid)."""
    import ml_dtypes
    r = _recipe_name(recipe)
    b = _block_name(block, r)
    f = _fmt_name(fmt)
    x32, in_name = _as_f32_input(x)
    if x32.ndim != 2:
        raise ValueError("x: 2-D only")
    if columnwise:
        if r in ("mtfp8", "mx_te", "mx_ocp") and b != "128x128":
            d, s = reference_quantize(x32.T.copy(), r, b, f, amax_epsilon=amax_epsilon,
                                      force_pow_2=force_pow_2, saturate=saturate, scale=scale)
            return np.ascontiguousarray(d.T), np.ascontiguousarray(s.T)
        if r == "mtfp8":  # 128x128 untransposed: the same tiles, so the rowwise copy's bytes
            return reference_quantize(x32, r, b, f, amax_epsilon=amax_epsilon,
                                      force_pow_2=force_pow_2, saturate=saturate)
        x32 = np.ascontiguousarray(x32.T)
    M, K = x32.shape

    if b == "per_tensor":
        amax = _amax(x32.reshape(1, -1), axis=1).reshape(1, 1) if x32.size else \
            np.zeros((1, 1), _F32)
        expand = lambda g: np.broadcast_to(g, x32.shape)  # noqa: E731
    else:
        blk = _BLOCKS[b]
        assert blk is not None  # per_tensor is the branch above
        bm, bk = blk
        amax, expand = _rowwise_blocks(x32, bm, bk)

    pow2 = force_pow_2
    if r == "te_block":
        pow2 = True if pow2 is None or pow2 == -1 else bool(pow2)
        sc, sinv = _te_scale(amax, f, amax_epsilon, pow2, _INPUT_MAX[in_name])
    elif r == "te_current":
        pow2 = False if pow2 is None or pow2 == -1 else bool(pow2)
        sc, sinv = _te_scale(amax, f, amax_epsilon, pow2, _INPUT_MAX["float32"])
    elif r == "te_delayed":
        if scale is None:
            raise ValueError("scale: te_delayed needs it")
        sc = np.full(amax.shape, _F32(scale), _F32)
        sinv = (_F32(1) / sc).astype(_F32)
    elif r in ("deepgemm", "deepgemm_ue8m0"):
        sc, sinv = _deepgemm_scale(amax, f, r == "deepgemm_ue8m0")
    elif r == "mtfp8":
        sc, sinv = _mtfp8_scale(amax, f)
    elif r == "mx_te":
        sc, sinv = _mx_te_scale(amax, f)
    else:
        sc, sinv = _mx_ocp_scale(amax, f)

    with np.errstate(all="ignore"):
        y = (x32 * expand(sc)).astype(_F32)
    data = reference_fp8(y, f, saturate)
    if r in ("mx_te", "mx_ocp"):
        sinv = np.asarray(sinv, np.uint8).view(ml_dtypes.float8_e8m0fnu)
    return data, np.ascontiguousarray(sinv)


def reference_grid_kind(recipe: Any, block: Any, columnwise: bool = False):
    """The kind of a copy's block grid for the layout rules: '1xB' (rowwise blocks, also the
    transposed columnwise copies of 1x128 recipes), '128x128', 'Bx1' (untransposed columnwise
    copies: MTFP8, MX) or 'per_tensor'."""
    r = _recipe_name(recipe)
    b = _block_name(block, r)
    if b == "per_tensor":
        return "per_tensor"
    if b == "128x128":
        return "128x128"
    if columnwise and r in ("mtfp8", "mx_te", "mx_ocp"):
        return "Bx1"
    return "1xB"


def reference_columnwise_transposed(recipe: Any) -> bool:
    """Whether a recipe's columnwise copy is the transpose [K, M]."""
    return _recipe_name(recipe) not in ("mtfp8", "mx_te", "mx_ocp")


def _roundup(n, m):
    return -(-n // m) * m


def _swizzle_128x4(g):
    """cuBLAS 128x4 tiles: pad to [roundup(R,128), roundup(C,4)] with zeros, tiles row-major,
    in-tile (r, c) at (r % 32) * 16 + (r // 32) * 4 + c."""
    R, C = g.shape
    Rp, Cp = _roundup(R, 128), _roundup(C, 4)
    p = np.zeros((Rp, Cp), dtype=g.dtype)
    p[:R, :C] = g
    # axes: tile row, r // 32, r % 32, tile col, c
    t = p.reshape(Rp // 128, 4, 32, Cp // 4, 4)
    # stored order: tile row, tile col, r % 32, r // 32, c
    return np.ascontiguousarray(t.transpose(0, 3, 2, 1, 4)).reshape(Rp, Cp)


def reference_scale_layout(compact: Any, kind: str, layout: Any):
    """A compact grid [GR, GC] (reference_quantize's scales) in a scale layout, as
    docs/numerics.md section 5's table states it; padding entries are zero."""
    g = np.asarray(compact)
    lay = str(getattr(layout, "name", layout)).lower()
    if lay == "compact" or kind == "per_tensor":
        return np.ascontiguousarray(g)
    GR, GC = g.shape
    if lay == "te_gemm" or (lay == "deepgemm" and kind == "1xB"):
        if kind == "1xB":
            out = np.zeros((GC, _roundup(GR, 4)), dtype=g.dtype)
            out[:, :GR] = g.T
            return out
        if lay == "deepgemm":
            return np.ascontiguousarray(g)
        out = np.zeros((GR, _roundup(GC, 4)), dtype=g.dtype)
        out[:, :GC] = g
        return out
    if lay == "deepgemm":
        return np.ascontiguousarray(g)
    if lay in ("mx_swizzled", "swizzled"):
        return _swizzle_128x4(g.T if kind == "Bx1" else g)
    raise ValueError(f"layout: {layout!r}")


def reference_dequantize(data: Any, compact_scales: Any, kind: str, block: Any,
                         out_dtype: str = "float32") -> np.ndarray:
    """fp32(q * scale_inv) per element (one fp32 multiply, RNE), then RNE to out_dtype
    ('float32', 'bfloat16', 'float16' through ml_dtypes / NumPy). data: the copy's fp8 array;
    compact_scales: its compact grid (E8M0 codes decoded as 2^(e - 127)); kind as
    reference_grid_kind; block: '1x128', '128x128', '1x32' or 'per_tensor'."""
    import ml_dtypes
    d = to_numpy(data).astype(_F32)
    s = to_numpy(compact_scales)
    if _dtype_name(s) == "float8_e8m0fnu":
        codes = s.view(np.uint8).astype(np.int64)
        s = np.where(codes == 255, np.nan, _pow2_f32(np.minimum(codes, 254) - 127))
    s = np.asarray(s, dtype=_F32)
    R, C = d.shape
    if kind == "per_tensor":
        full = np.broadcast_to(s.reshape(1, 1), d.shape)
    else:
        bsz = {"1x128": 128, "128x128": 128, "1x32": 32}[_block_name(block, "te_block")]
        if kind == "128x128":
            bm, bk = bsz, bsz
        elif kind == "Bx1":
            bm, bk = bsz, 1
        else:
            bm, bk = 1, bsz
        full = np.repeat(np.repeat(s, bm, axis=0), bk, axis=1)[:R, :C]
    with np.errstate(all="ignore"):
        y = (d * full).astype(_F32)
    name = str(out_dtype).rsplit(".", 1)[-1]
    if name == "float32":
        return y
    if name == "bfloat16":
        return y.astype(ml_dtypes.bfloat16)
    if name == "float16":
        return y.astype(np.float16)
    raise ValueError(f"out_dtype: {out_dtype!r}")
