"""Shared helpers of xte.check: names of claims, fp8 code facts, ulps, scale layout inverses."""

import numpy as np

from ..testing import reference_scale_layout

_F32 = np.float32
FP8_MAX_CODE = {"e4m3": 0x7E, "e5m2": 0x7B}
FP8_NAMES = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
_RECIPE_ALIASES = {"float8blockscaling": "te_block", "current": "te_current",
                   "delayed": "te_delayed", "mxfp8": "mx_te"}
RECIPES = ("te_block", "deepgemm", "deepgemm_ue8m0", "mtfp8", "mx_te", "mx_ocp", "te_current",
           "te_delayed")


def recipe_name(r):
    """A recipe's name ('te_block', ...) from a name, an xte.Recipe or a recipe object."""
    r = getattr(r, "xte_recipe", r)
    n = str(getattr(r, "name", r)).lower()
    n = _RECIPE_ALIASES.get(n, n)
    if n not in RECIPES:
        raise ValueError(f"recipe: {r!r} is not one of {', '.join(RECIPES)}")
    return n


def default_block(r):
    if r in ("te_current", "te_delayed"):
        return "per_tensor"
    if r in ("mx_te", "mx_ocp"):
        return "1x32"
    return "1x128"


def block_name(b, r):
    """'1x128', '128x128', '1x32' or 'per_tensor' from the forms the CLI and xte take."""
    if b is None:
        return default_block(r)
    b = getattr(b, "name", b)
    if isinstance(b, (tuple, list)):
        b = f"{b[0]}x{b[1]}"
    b = str(b).lower().replace("block_", "").replace("mxfp8_", "")
    b = {"mxfp8": "1x32", "per-tensor": "per_tensor", "tensor": "per_tensor"}.get(b, b)
    if b not in ("1x128", "128x128", "1x32", "per_tensor"):
        raise ValueError(f"block: {b!r} (want 1x128, 128x128, 1x32 or per_tensor)")
    return b


def layout_name(lay):
    if lay is None:
        return "compact"
    n = str(getattr(lay, "name", lay)).lower()
    n = {"te": "te_gemm", "swizzled": "mx_swizzled"}.get(n, n)
    if n not in ("compact", "te_gemm", "deepgemm", "mx_swizzled"):
        raise ValueError(f"layout: {lay!r} (want compact, te_gemm, deepgemm, mx_swizzled)")
    return n


def fmt_of(data, fmt=None):
    if fmt is not None:
        f = str(fmt).lower()
        return {"float8_e4m3fn": "e4m3", "e4m3fn": "e4m3", "float8_e5m2": "e5m2"}.get(f, f)
    return FP8_NAMES.get(np.asarray(data).dtype.name, "e4m3")


def codes(a):
    """The bytes of a one-byte array (fp8 / e8m0 / uint8 / int8) as uint8."""
    a = np.ascontiguousarray(a)
    if a.dtype.itemsize != 1:
        raise TypeError(f"dtype {a.dtype}: expected one-byte fp8 codes")
    return a.view(np.uint8)


def fp8_value(c, fmt):
    import ml_dtypes
    dt = ml_dtypes.float8_e4m3fn if fmt == "e4m3" else ml_dtypes.float8_e5m2
    return np.asarray(c, np.uint8).view(dt).astype(np.float64)


def fp8_is_nan(c, fmt):
    c = np.asarray(c, np.uint8) & 0x7F
    return (c == 0x7F) if fmt == "e4m3" else (c > 0x7C)


def fp8_is_inf(c, fmt):
    c = np.asarray(c, np.uint8) & 0x7F
    return np.zeros(c.shape, bool) if fmt == "e4m3" else (c == 0x7C)


def fp8_is_subnormal(c, fmt):
    c = np.asarray(c, np.uint8) & 0x7F
    mbits = 3 if fmt == "e4m3" else 2
    return ((c >> mbits) == 0) & (c != 0)


def ulp(x, dtype="float32"):
    """The ulp of |x| in a float format (never below the format's smallest subnormal)."""
    x = np.abs(np.asarray(x, np.float64))
    p, emin = {"float32": (24, -126), "bfloat16": (8, -126), "float16": (11, -14),
               "float64": (53, -1022)}[dtype]
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.floor(np.log2(np.where(x > 0, x, 1.0)))
    e = np.where(np.isfinite(e), np.maximum(e, emin), emin)
    return np.ldexp(1.0, (e - (p - 1)).astype(np.int64))


def ulps_between(a, b, dtype="float32"):
    """|a - b| in ulps of b (NaN where one is NaN and the other is not; 0 where both are)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b) / ulp(b, dtype)
    both_nan = np.isnan(a) & np.isnan(b)
    same_inf = np.isinf(a) & np.isinf(b) & (a == b)
    d = np.where(both_nan | same_inf, 0.0, d)
    return d


def element_block(kind, R, C, block):
    """Two index arrays [R, C] giving each element's (gi, gj) in the block grid."""
    i = np.arange(R)[:, None]
    j = np.arange(C)[None, :]
    B = 32 if block == "1x32" else 128
    if kind == "per_tensor":
        gi, gj = 0 * i, 0 * j
    elif kind == "128x128":
        gi, gj = i // 128, j // 128
    elif kind == "Bx1":
        gi, gj = i // B, j + 0 * i
    else:
        gi, gj = i + 0 * j, j // B
    return np.broadcast_to(gi, (R, C)), np.broadcast_to(gj, (R, C))


def layout_positions(GR, GC, kind, layout):
    """The shape of a layout's buffer and, for each of its entries, the flat index of the grid
    entry it holds (-1 for padding)."""
    idx = (np.arange(GR * GC, dtype=np.int64) + 1).reshape(GR, GC)
    pos = reference_scale_layout(idx, kind, layout)
    return pos.shape, pos.reshape(-1) - 1


def from_layout(buf, GR, GC, kind, layout):
    """(grid [GR, GC], padding entries) of a scale buffer read in a layout; None when the
    buffer's shape is not the layout's."""
    shape, where = layout_positions(GR, GC, kind, layout)
    b = np.asarray(buf)
    if b.size != int(np.prod(shape)) or (b.ndim == 2 and tuple(b.shape) != tuple(shape)):
        return None
    flat = np.ascontiguousarray(b).reshape(-1)
    grid = np.empty(GR * GC, dtype=b.dtype)
    grid[where[where >= 0]] = flat[where >= 0]
    return grid.reshape(GR, GC), flat[where < 0]


def popcount8(x):
    x = np.asarray(x, np.uint64)
    n = np.zeros(x.shape, np.int64)
    while np.any(x):
        n += (x & np.uint64(1)).astype(np.int64)
        x = x >> np.uint64(1)
    return n


def count(classes, name, n=1):
    if n:
        classes[name] = classes.get(name, 0) + int(n)


def idx(t):
    return tuple(int(v) for v in t)
