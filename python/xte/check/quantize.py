"""Quantize / cast checks: another library's FP8 data and scales against a named recipe.

check_quantize recomputes the copy with xte.quantize (the recipes of docs/numerics.md, sections
3-5) and compares bytes: the data codes and the scale_inv buffer in the claimed layout. Every
difference is classified:

scales: 'scale layout mix-up' (the buffer holds the right scales in another layout, or
    transposed), 'scale layout padding not zero', 'scale bit flip' (one bit of the expected
    value), 'power-of-two rounding missing' (the recipe rounds the scale to a power of two, the
    producer did not: it equals the same recipe without force_pow_2), 'power-of-two rounding
    added', 'power-of-two rounding direction' (both powers of two, another exponent: floor vs
    ceil, OCP MX vs TE MXFP8), 'scale rounding' (within 4 ulps), 'scale of recipe R' (the
    value another xte recipe gives), 'scale value' (anything else), 'block size or layout
    mix-up (scale shape)' (the buffer's shape is that of other blocks or another layout),
    'scale shape'.
data: 'follows its block's (differing) scale' (the codes its given scale gives), 'in a block
    whose scale differs' (codes its given scale does not give either), 'non-saturating cast
    where the recipe saturates', 'saturating cast where the recipe does not saturate', 'NaN
    encoding', 'subnormal flushed to zero', 'sign of zero', 'rounded toward zero' / 'rounding
    (one code)', 'element value', 'data transposed'; 'in the last (partial) block' counts
    differences at a block boundary.

check_cast does the same for xte.cast (fp32 / bf16 / fp16 to e4m3 / e5m2 / bf16 / fp16 / e8m0,
saturating or not), without scales.
"""

import numpy as np

from . import _common as C
from ._io import to_host
from ._report import Report, Verdict

__all__ = ["check_quantize", "check_cast"]

_MAX_EXAMPLES = 5
_F32 = np.float32


def _expected(x, r, b, lay, fmt, columnwise, saturate, amax_epsilon, force_pow_2, scale):
    import xte
    kw = dict(recipe=r, block=b, layout=lay, fmt=fmt, rowwise=not columnwise,
              columnwise=columnwise, amax_epsilon=amax_epsilon, force_pow_2=force_pow_2,
              saturate=saturate)
    if r == "te_delayed":
        kw["scale"] = float(scale)
    q = xte.quantize(x, **kw)
    if columnwise:
        return C.codes(q.columnwise_data), np.asarray(q.columnwise_scale_inv)
    return C.codes(q.data), np.asarray(q.scale_inv)


def _scale_bytes(s, mx):
    """Scale buffer as comparable units: uint8 E8M0 codes (MX) or fp32."""
    s = np.asarray(s)
    if mx:
        return np.ascontiguousarray(s).view(np.uint8) if s.dtype.itemsize == 1 else None
    if s.dtype == np.float32:
        return s
    if s.dtype.kind == "f" and s.dtype.itemsize != 4:
        return None
    return None


def _scale_value(v, mx):
    v = np.asarray(v)
    if mx:
        c = v.astype(np.int64)
        return np.where(c == 255, np.nan, np.ldexp(1.0, np.minimum(c, 254) - 127))
    return v.astype(np.float64)


def _is_pow2(v):
    v = np.asarray(v, np.float64)
    m, _ = np.frexp(v)
    return np.isfinite(v) & (v > 0) & (m == 0.5)


def _alt_scales(x, r, b, fmt, columnwise, saturate, amax_epsilon, force_pow_2, scale):
    """Compact scale grids of the recipes a producer may have followed instead."""
    alts = {}
    cands = [(r, "pow2" if force_pow_2 is False else "no_pow2")]
    if b in ("1x128", "128x128"):
        cands += [(n, None) for n in ("te_block", "deepgemm", "deepgemm_ue8m0", "mtfp8")]
    elif b == "1x32":
        cands += [(n, None) for n in ("mx_te", "mx_ocp")]
    else:
        cands += [("te_current", None)]
    for name, variant in cands:
        fp2 = force_pow_2
        if variant == "pow2":
            fp2 = True
        elif variant == "no_pow2":
            if r not in ("te_block", "te_current"):
                continue
            fp2 = False
        elif name == r:
            continue
        elif name not in ("te_block", "te_current"):
            fp2 = None
        try:
            _, s = _expected(x, name, b, "compact", fmt, columnwise, saturate, amax_epsilon,
                             fp2, scale)
        except Exception:  # a combination the recipe does not have: not a candidate
            continue
        label = name if variant is None else (
            f"{name} with force_pow_2={'True' if fp2 else 'False'}")
        alts[label] = np.asarray(s)
    return alts


def _classify_scale(g, e, mx, pow2_claimed, alts, gi):
    """The class of one differing scale (given g, expected e, grid index gi)."""
    gv, ev = float(_scale_value(g, mx)), float(_scale_value(e, mx))
    for label, s in alts.items():
        a = s[gi]
        if np.asarray(a).tobytes() == np.asarray(g).tobytes() and a.tobytes() != \
                np.asarray(e).tobytes():
            if label.endswith("force_pow_2=False"):
                return "power-of-two rounding missing (equals the recipe without force_pow_2)"
            if label.endswith("force_pow_2=True"):
                return "power-of-two rounding added (equals the recipe with force_pow_2)"
            if _is_pow2(gv) and _is_pow2(ev) and gv != ev:
                return f"power-of-two rounding direction (equals {label}'s scale)"
            return f"scale of recipe {label}"
    if mx:
        if C.popcount8(np.uint64(int(g) ^ int(e))) == 1:
            return "scale bit flip"
        if abs(int(g) - int(e)) == 1:
            return "power-of-two rounding direction (one exponent)"
        return "scale value"
    gb = int(np.asarray(g, _F32).view(np.uint32))
    eb = int(np.asarray(e, _F32).view(np.uint32))
    if C.popcount8(np.uint64(gb ^ eb)) == 1:
        return "scale bit flip"
    if pow2_claimed and _is_pow2(ev) and not _is_pow2(gv):
        return "power-of-two rounding missing (scale not a power of two)"
    if _is_pow2(ev) and _is_pow2(gv):
        return "power-of-two rounding direction"
    if not _is_pow2(ev) and _is_pow2(gv):
        return "power-of-two rounding added"
    if np.isfinite(gv) and np.isfinite(ev) and abs(gb - eb) <= 4 and (gb ^ eb) >> 31 == 0:
        return f"scale rounding ({abs(gb - eb)} ulp)"
    return "scale value"


def classify_code(e, g, fmt, xin, saturate):
    """The class of one differing fp8 code (expected e, given g, input value xin)."""
    e_nan, g_nan = bool(C.fp8_is_nan(e, fmt)), bool(C.fp8_is_nan(g, fmt))
    e_inf, g_inf = bool(C.fp8_is_inf(e, fmt)), bool(C.fp8_is_inf(g, fmt))
    mx = C.FP8_MAX_CODE[fmt]
    e_max, g_max = (e & 0x7F) == mx, (g & 0x7F) == mx
    x_nan = xin is not None and np.isnan(xin)
    if e_nan and g_nan:
        return "NaN encoding"
    if x_nan and (g_nan or g_inf or e_nan):
        return "NaN encoding"
    if e_max and (g_nan or g_inf):
        return "non-saturating cast where the recipe saturates"
    if (e_nan or e_inf) and g_max and not saturate:
        return "saturating cast where the recipe does not saturate"
    if C.fp8_is_subnormal(e, fmt) and (g & 0x7F) == 0:
        return "subnormal flushed to zero"
    if (e & 0x7F) == 0 and (g & 0x7F) == 0:
        return "sign of zero"
    if (e ^ g) & 0x80 == 0 and abs(int(e & 0x7F) - int(g & 0x7F)) == 1:
        return "rounded toward zero" if (g & 0x7F) < (e & 0x7F) else "rounding (one code)"
    return "element value"


def _fmt_code(c, fmt):
    return f"0x{int(c):02X} ({C.fp8_value(np.uint8(c), fmt):.9g})"


def _own_scale_codes(xcopy, sinv, fmt, saturate):
    """The codes a block's own (producer's) scale_inv gives: fp8(x * fp32(1 / scale_inv))."""
    from ..testing import reference_fp8
    with np.errstate(all="ignore"):
        sc = (np.float32(1) / np.asarray(sinv, np.float32)).astype(np.float32)
        y = (np.asarray(xcopy, np.float32) * sc).astype(np.float32)
    return np.asarray(reference_fp8(y, fmt, saturate)).view(np.uint8)


def _compare_data(exp, got, fmt, xcopy, scale_diff_at, own, saturate, classes, examples,
                  partial_last):
    """own: the codes each element gets from its block's given scale (None: not known)."""
    diff = exp != got
    n = int(diff.sum())
    where = np.argwhere(diff)
    for t in where:
        i, j = int(t[0]), int(t[1])
        if scale_diff_at is not None and scale_diff_at[i, j]:
            cls = ("follows its block's (differing) scale" if own is not None and
                   own[i, j] == got[i, j] else "in a block whose scale differs")
        else:
            cls = classify_code(int(exp[i, j]), int(got[i, j]), fmt,
                                None if xcopy is None else xcopy[i, j], saturate)
        C.count(classes, cls)
        if partial_last is not None and partial_last[i, j]:
            C.count(classes, "in the last (partial) block")
        if len(examples) < _MAX_EXAMPLES:
            ex = {"index": [i, j], "class": cls}
            if xcopy is not None:
                ex["input"] = float(xcopy[i, j])
            ex["expected"] = _fmt_code(exp[i, j], fmt)
            ex["got"] = _fmt_code(got[i, j], fmt)
            examples.append(ex)
    return n


def _partial_last(kind, R, Cn, block):
    """Elements of the last block along the blocked axis when that block is partial."""
    if kind == "per_tensor":
        return None
    B = 32 if block == "1x32" else 128
    m = np.zeros((R, Cn), bool)
    if kind in ("1xB", "128x128") and Cn % B:
        m[:, Cn - Cn % B:] = True
    if kind in ("Bx1", "128x128") and R % B:
        m[R - R % B:, :] = True
    return m


def check_quantize(x, data, scale_inv, recipe="te_block", block=None, layout=None, fmt=None, *,
                   columnwise=False, saturate=True, amax_epsilon=0.0, force_pow_2=None,
                   scale=None, name="", report=None):
    """Judge another library's quantized copy of x against `recipe` (xte's recipes, bit for bit).

    x: the input [M, K] (fp32 / bf16 / fp16; NumPy or torch, CUDA tensors are copied to the
    host once). data: the fp8 codes (torch / ml_dtypes float8 or uint8); scale_inv: its scales
    in `layout` ('compact' default, 'te_gemm', 'deepgemm', 'mx_swizzled'), fp32 (E8M0 bytes for
    the MX recipes). recipe / block / fmt / saturate / amax_epsilon / force_pow_2 / scale: the
    producer's claim, as xte.quantize takes them. columnwise: data is the columnwise copy (the
    transpose [K, M] for per-tensor / TE_BLOCK / DeepGEMM, [M, K] in Bx1 blocks for MTFP8 / MX).
    Returns a Report with verdicts for 'data' and 'scale_inv' (prefixed by name)."""
    rep = report if report is not None else Report()
    r = C.recipe_name(recipe)
    b = C.block_name(block, r)
    lay = C.layout_name(layout)
    notes = rep.notes
    x = to_host(x, "x", notes)
    data = to_host(data, "data", notes)
    scale_inv = to_host(scale_inv, "scale_inv", notes)
    f = C.fmt_of(data, fmt)
    mx = r in ("mx_te", "mx_ocp")
    pre = f"{name}." if name else ""
    rep.claim.setdefault("quantize", []).append(
        {"tensor": name or "x", "recipe": r, "block": b, "layout": lay, "fmt": f,
         "columnwise": bool(columnwise), "saturate": bool(saturate)})
    pow2 = force_pow_2
    if pow2 is None:
        pow2 = r == "te_block"
    exp_d, exp_s = _expected(x, r, b, lay, f, columnwise, saturate, amax_epsilon, force_pow_2,
                             scale)
    _, exp_grid = _expected(x, r, b, "compact", f, columnwise, saturate, amax_epsilon,
                            force_pow_2, scale)
    from ..testing import reference_grid_kind
    kind = reference_grid_kind(r, b, columnwise)
    x32 = np.asarray(x).astype(np.float32)
    xcopy = x32.T if (columnwise and exp_d.shape == x32.T.shape and
                      exp_d.shape != x32.shape) else x32
    if columnwise and exp_d.shape == x32.shape and r not in ("mtfp8", "mx_te", "mx_ocp"):
        xcopy = x32.T  # square input: the transposed copy
    R, Cn = exp_d.shape
    GR, GC = exp_grid.shape if exp_grid.ndim == 2 else (1, 1)
    exp_grid = exp_grid.reshape(GR, GC)

    # ---- scales
    s_classes, s_examples = {}, []
    got_s = _scale_bytes(scale_inv, mx)
    got_grid = None
    s_ok = False
    s_why = ""
    if got_s is None:
        s_why = (f"dtype {np.asarray(scale_inv).dtype}, expected "
                 f"{'E8M0 bytes' if mx else 'float32'}")
        C.count(s_classes, "scale dtype")
    else:
        exp_sc = _scale_bytes(exp_s, mx)
        if got_s.shape == exp_sc.shape and got_s.tobytes() == exp_sc.tobytes():
            s_ok, s_why = True, f"{exp_grid.size} scales equal, layout {lay}"
            got_grid = exp_grid
        else:
            got_grid, s_why = _scales_diff(got_s, exp_sc, exp_grid, GR, GC, kind, lay, mx, pow2,
                                           s_classes, s_examples, x, r, b, f, columnwise,
                                           saturate, amax_epsilon, force_pow_2, scale)
    rep.verdicts.append(Verdict(pre + "scale_inv", "quantize", s_ok, s_why, s_classes,
                                {"scales": int(exp_grid.size), "layout": lay,
                                 "shape": list(np.asarray(scale_inv).shape),
                                 "expected_shape": list(exp_s.shape)}, s_examples))

    # ---- data
    d_classes, d_examples = {}, []
    try:
        got_d = C.codes(data)
    except TypeError as err:
        rep.verdicts.append(Verdict(pre + "data", "quantize", False, str(err), {"data dtype": 1}))
        return rep
    transposed = False
    if got_d.shape != exp_d.shape:
        if got_d.shape == exp_d.shape[::-1]:
            transposed = True
            got_d = got_d.T
        else:
            rep.verdicts.append(Verdict(pre + "data", "quantize", False,
                                        f"shape {list(got_d.shape)}, expected "
                                        f"{list(exp_d.shape)}", {"data shape": 1}))
            return rep
    elif (R == Cn and R > 1 and not np.array_equal(got_d, exp_d)
          and np.array_equal(got_d.T, exp_d)):
        transposed = True
        got_d = got_d.T
    scale_diff_at = own = None
    xc = xcopy if xcopy.shape == exp_d.shape else None
    if got_grid is not None and not s_ok:
        gi, gj = C.element_block(kind, R, Cn, b)
        gd = np.asarray(got_grid).view(np.uint8 if mx else np.uint32)
        ed = np.asarray(exp_grid).view(np.uint8 if mx else np.uint32)
        scale_diff_at = (gd != ed)[gi, gj]
        if xc is not None:
            gval = _scale_value(gd, True) if mx else np.asarray(got_grid, np.float32)
            own = _own_scale_codes(xc, np.asarray(gval, np.float32)[gi, gj], f, saturate)
    n = _compare_data(exp_d, got_d, f, xc, scale_diff_at, own, saturate, d_classes,
                      d_examples, _partial_last(kind, R, Cn, b))
    if transposed:
        C.count(d_classes, "data transposed (layout mix-up)", exp_d.size)
    ok = n == 0 and not transposed
    if ok:
        why = f"{exp_d.size} codes equal ({r} {b} {f})"
    else:
        why = f"{n} of {exp_d.size} codes differ" + (
            "; the data is the transpose of the expected copy" if transposed else "")
        top = sorted(((c, k) for k, c in d_classes.items()
                      if not k.startswith("data transposed")), reverse=True)
        if top:
            why += ": " + ", ".join(f"{k} ({c})" for c, k in top[:3])
    rep.verdicts.append(Verdict(pre + "data", "quantize", ok, why, d_classes,
                                {"codes": int(exp_d.size), "differing": n,
                                 "transposed": transposed}, d_examples))
    return rep


def _shape_fits(x, r, columnwise, shape, mx):
    """The (block, layout) pairs whose scale buffer has this shape, for the recipe's family."""
    import xte
    M, K = np.asarray(x).shape
    fams = (("1x32", "mx_te"),) if mx else (("1x128", r), ("128x128", r),
                                             ("per_tensor", "te_current"))
    lays = ("compact", "te_gemm", "deepgemm") + (("mx_swizzled",) if mx else ())
    fits = []
    for blk, rec in fams:
        if rec in ("mx_te", "mx_ocp", "te_current", "te_delayed") and blk == "1x128":
            rec = "te_block"
        for L in lays:
            try:
                sh = xte.quantize_scale_shape(M, K, blk, rec, L, columnwise)
            except Exception:  # a combination without a layout
                continue
            if tuple(sh) == shape or (len(shape) == 1 and sh[0] * sh[1] == shape[0]):
                fits.append(f"{blk} blocks in the {L} layout")
    return fits


def _scales_diff(got_s, exp_sc, exp_grid, GR, GC, kind, lay, mx, pow2, classes, examples, x, r,
                 b, f, columnwise, saturate, amax_epsilon, force_pow_2, scale):
    """Classify a scale buffer that differs from the expected bytes; returns (grid, why)."""
    exp_grid = (np.ascontiguousarray(exp_grid).view(np.uint8) if mx else
                np.asarray(exp_grid, np.float32))
    # the right scales in another layout (or transposed)?
    lays = ["compact", "te_gemm", "deepgemm"] + (["mx_swizzled"] if mx else [])
    cands = [(lay, True)] + [(L, tr) for L in lays for tr in (False, True) if L != lay]
    for L, tr in cands:
        if True:
            if kind == "per_tensor":
                continue
            from ..testing import reference_scale_layout
            cand = reference_scale_layout(exp_grid, kind, L)
            cand = cand.T if tr else cand
            if cand.shape == got_s.shape and cand.tobytes() == got_s.tobytes():
                what = (f"transposed {L} layout" if tr else f"{L} layout")
                C.count(classes, "scale layout mix-up", exp_grid.size)
                examples.append({"class": "scale layout mix-up",
                                 "got": f"the expected scales in the {what}",
                                 "expected": f"{lay} layout, shape {list(exp_sc.shape)}"})
                return exp_grid, (f"scale layout mix-up: the scales are right but stored in the "
                                  f"{what} (claimed {lay})")
    got = C.from_layout(got_s, GR, GC, kind, lay if kind != "per_tensor" else "compact")
    if got is None:
        fits = _shape_fits(x, r, columnwise, tuple(got_s.shape), mx)
        if fits:
            C.count(classes, "block size or layout mix-up (scale shape)")
            return None, (f"scale shape {list(got_s.shape)}, expected {list(exp_sc.shape)} for "
                          f"{b} blocks in the {lay} layout; it fits " + ", ".join(fits))
        C.count(classes, "scale shape")
        return None, (f"scale shape {list(got_s.shape)}, expected {list(exp_sc.shape)} for "
                      f"{b} blocks in the {lay} layout")
    grid, pad = got
    why = []
    if np.any(np.asarray(pad).view(np.uint8) != 0):
        npad = int(np.count_nonzero(np.asarray(pad).view(np.uint8 if mx else np.uint32)))
        C.count(classes, "scale layout padding not zero", npad)
        why.append(f"{npad} padding entries not zero")
    gd = grid.view(np.uint8 if mx else np.uint32)
    ed = exp_grid.view(np.uint8 if mx else np.uint32)
    where = np.argwhere(gd != ed)
    alts = _alt_scales(x, r, b, f, columnwise, saturate, amax_epsilon, force_pow_2, scale) \
        if len(where) else {}
    alts = {k: (np.ascontiguousarray(v).view(np.uint8) if mx else v).reshape(GR, GC)
            for k, v in alts.items() if v.size == GR * GC}
    for t in where:
        gi = C.idx(t)
        cls = _classify_scale(grid[gi], exp_grid[gi], mx, pow2, alts, gi)
        C.count(classes, cls)
        if len(examples) < _MAX_EXAMPLES:
            examples.append({"block": list(gi), "class": cls,
                             "expected": float(_scale_value(exp_grid[gi], mx)),
                             "got": float(_scale_value(grid[gi], mx))})
    if len(where):
        top = sorted(((c, k) for k, c in classes.items() if k != "scale layout padding not zero"),
                     reverse=True)
        why.insert(0, f"{len(where)} of {exp_grid.size} scales differ: " +
                   ", ".join(f"{k} ({c})" for c, k in top[:3]))
    return grid, "; ".join(why) if why else "scale bytes differ"


# ----------------------------------------------------------------------------- cast

_WIDE = {"bfloat16": ("bfloat16", 7), "float16": ("float16", 10), "float32": ("float32", 23)}


def check_cast(x, y, dtype=None, *, saturate=True, name="y", report=None):
    """Judge a plain cast y = cast(x) (no scale) against xte.cast's rule (docs/numerics.md
    section 3): RNE, saturating (TransformerEngine, torch >= 2.12 e4m3) or not (ml_dtypes,
    torch e5m2). dtype: y's format ('e4m3', 'e5m2', 'bfloat16', 'float16', 'e8m0'), default
    y's own dtype. Returns a Report with one verdict."""
    import xte
    rep = report if report is not None else Report()
    x = to_host(x, "x", rep.notes)
    y = to_host(y, name, rep.notes)
    dname = C.fmt_of(y, dtype) if dtype is not None or y.dtype.itemsize == 1 else y.dtype.name
    dname = {"float8_e8m0fnu": "e8m0", "ue8m0": "e8m0", "bf16": "bfloat16",
             "fp16": "float16"}.get(dname, dname)
    if y.dtype.name == "float8_e8m0fnu":
        dname = "e8m0"
    rep.claim.setdefault("cast", []).append({"tensor": name, "dtype": dname,
                                             "saturate": bool(saturate)})
    exp = np.asarray(xte.cast(np.ascontiguousarray(x), dname, saturate=saturate))
    classes, examples = {}, []
    if tuple(np.shape(y)) != tuple(exp.shape):
        rep.verdicts.append(Verdict(name, "cast", False, f"shape {list(np.shape(y))}, expected "
                                    f"{list(exp.shape)}", {"shape": 1}))
        return rep
    isz = exp.dtype.itemsize
    ub = np.uint8 if isz == 1 else (np.uint16 if isz == 2 else np.uint32)
    eb = np.ascontiguousarray(exp).view(ub)
    gb = np.ascontiguousarray(y).view(ub) if y.dtype.itemsize == isz else None
    if gb is None:
        rep.verdicts.append(Verdict(name, "cast", False, f"dtype {y.dtype}, expected {dname}",
                                    {"dtype": 1}))
        return rep
    xf = np.asarray(x, np.float32)
    where = np.argwhere(eb != gb)
    for t in where:
        i = C.idx(t)
        e, g = int(eb[i]), int(gb[i])
        if dname in ("e4m3", "e5m2"):
            cls = classify_code(e, g, dname, float(xf[i]), saturate)
        elif dname == "e8m0":
            cls = "NaN encoding" if 255 in (e, g) else "rounding (E8M0 exponent)"
        else:
            ev, gv = exp[i].astype(np.float64), y[i].astype(np.float64)
            if np.isnan(ev) and np.isnan(gv):
                cls = "NaN encoding"
            elif np.isinf(gv) and not np.isinf(ev):
                cls = "non-saturating cast where the recipe saturates"
            elif np.isinf(ev) and not np.isinf(gv) and np.isfinite(gv):
                cls = "saturating cast where the recipe does not saturate"
            elif ev != 0 and gv == 0 and abs(ev) < np.finfo(_WIDE[dname][0] if dname !=
                                                            "bfloat16" else np.float32).tiny:
                cls = "subnormal flushed to zero"
            elif abs(e - g) == 1:
                cls = "rounding (one ulp)"
            else:
                cls = "element value"
        C.count(classes, cls)
        if len(examples) < _MAX_EXAMPLES:
            examples.append({"index": list(i), "class": cls, "input": float(xf[i]),
                             "expected": f"0x{e:0{2 * isz}X}", "got": f"0x{g:0{2 * isz}X}"})
    n = len(where)
    ok = n == 0
    why = (f"{exp.size} values equal ({dname}, {'saturating' if saturate else 'non-saturating'})"
           if ok else f"{n} of {exp.size} values differ: " +
           ", ".join(f"{k} ({c})" for c, k in sorted(((c, k) for k, c in classes.items()),
                                                      reverse=True)[:3]))
    rep.verdicts.append(Verdict(name, "cast", ok, why, classes,
                                {"values": int(exp.size), "differing": n}, examples))
    return rep
