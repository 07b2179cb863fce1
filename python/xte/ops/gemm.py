"""Block-scaled FP8 GEMMs over include/xte/gemm.h: xte.gemm, xte.gemm_grouped and DeepGEMM's names.

Every function is a thin wrapper over xte_gemm / xte_gemm_grouped: no arithmetic, no copies.
The numerics (docs/numerics.md, section 6) are the C library's: with mode="exact" (the default)
each output element is defined bit for bit (exact block partials rounded once to fp32, one fp32
multiply of the two block scales, one fmaf per K block, then + C, + bias, one rounding to the
output dtype); mode="fast" allows an implementation-defined block partial within the bound of
docs/numerics.md (on the CPU: fp32 sums of the block's products; a few rows of A with B read
along K stream B, the others run fp32 tiles or, where faster, the exact AMX kernel).

Operands. An operand is an xte.QuantizedTensor (from xte.quantize) or a DeepGEMM-style
(data, scales) pair:

* QuantizedTensor: the C library picks the copy whose scale blocks run along K (the rowwise copy
  when it fits, else the columnwise copy: 1x128 and MXFP8 operands used transposed need the
  columnwise copy, i.e. quantize with columnwise=True).
* (data, scales) pair: data is e4m3 / e5m2 as stored ([rows, cols], or [G, rows, cols] for the
  grouped operands), scales fp32 (or E8M0 / uint8 bytes for MXFP8). The scaling mode and scale
  layout are inferred from the scale shape (xte_quantize_scale_shape gives every candidate's
  shape); where a shape fits more than one storage the call raises and asks for recipe= /
  layout=. recipe= takes DeepGEMM's (gran_m, gran_n, gran_k) tuple, recipe_a= / recipe_b= its
  (gran_mn, gran_k) tuples or xte mode names ('1x128', '128x128', '1x32', 'per_tensor').
  A pair whose data is used transposed (DeepGEMM's "MN-major" operands: b of *_nn, a and b of
  *_tn and of k_grouped_fp8_gemm_tn_contiguous, a of *_tt) with 1x128 / 1x32 scales carries its
  scales per 128 (32) rows of the stored data, [ceil(rows/128), cols] as DeepGEMM's k-grouped
  operands: it is passed to the C library as a non-transposed columnwise copy (the MTFP8 / MX
  storage), without a copy. Where the scales of a 3-D operand are 3-D ([G, ., .]) they are read
  as the 2-D grid of the whole [G * rows, cols] tensor, which is the same storage when the
  per-group grids tile it (rows a multiple of 128 for 128x128 scales).

Errors name the Python argument (a, b, out / d, c, bias, masked_m, group_sizes, ...), carry
xte_last_error()'s message and leave every output untouched.
"""

import ctypes
import re
from typing import Any, Optional, Union, cast

from .. import _lib
from .._lib import (DType, GemmGroups, GemmGrouping, GemmMode, QTensor, Recipe,
                    ScaleLayout, ScaleTensor, ScalingMode, Status, XteDTypeError, XteError,
                    XteShapeError, XteUnsupportedError, XteValueError, lib)
from .._qtensor import QuantizedTensor, parse_layout, parse_mode, qview
from .._lib import parse_enum as _lib_parse_enum
from .._tensor import XteLayoutError, dtype_of, empty, ptr, stream_of, view, view_opt
from .._typing import Array, DTypeLike, EnumLike, GemmModeLike, Pair

__all__ = ["gemm", "gemm_grouped", "fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt",
           "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nn_contiguous",
           "m_grouped_fp8_gemm_nt_masked", "k_grouped_fp8_gemm_tn_contiguous",
           "k_grouped_fp8_gemm_nt_contiguous"]

_FP8 = (DType.E4M3, DType.E5M2)
_OUT = (DType.FP32, DType.BF16)
_PT, _B1, _B2, _MX = (ScalingMode.PER_TENSOR, ScalingMode.BLOCK_1x128,
                      ScalingMode.BLOCK_128x128, ScalingMode.MXFP8_1x32)
# Supported scaling pairs (A, B) in the order a pair whose scales fit several modes is resolved
# (DeepGEMM's default recipe (1, 128, 128) first).
_PAIRS = ((_B1, _B2), (_B1, _B1), (_B2, _B1), (_PT, _PT), (_MX, _MX))
_LAYOUT_ORDER = (ScaleLayout.COMPACT, ScaleLayout.DEEPGEMM, ScaleLayout.TE_GEMM,
                 ScaleLayout.MX_SWIZZLED)

# ------------------------------------------------------------------------------- helpers


_parse_enum = _lib_parse_enum


def parse_gemm_mode(mode: GemmModeLike) -> GemmMode:
    """The GemmMode of "exact" / "fast", a GemmMode or its int (errors name `mode`)."""
    return _parse_enum(mode, {"exact": GemmMode.EXACT, "fast": GemmMode.FAST}, GemmMode, "mode")


def _out_dtype(d):
    if isinstance(d, DType):
        x = d
    elif isinstance(d, str):
        x = {"bfloat16": DType.BF16, "bf16": DType.BF16, "float32": DType.FP32,
             "fp32": DType.FP32}.get(d.lower())
    else:
        x = dtype_of(d)
    if x not in _OUT:
        raise XteDTypeError(Status.DTYPE, f"out_dtype: {d!r}, expected float32 or bfloat16")
    return x


_C_NAME = re.compile(r"config->bias|groups->masked_m|groups->group_sizes|groups->alignment|"
                     r"groups->num_groups|config->trans_a|config->trans_b|\b[ABCD]\b")


def _call(fn, names, *args):
    """Call xte function fn; on failure re-raise the same XteError subclass with the Python name
    of the argument the C message is about in front of xte_last_error()'s message."""
    try:
        _lib.call(fn, *args)
    except XteError as e:
        m = _C_NAME.search(e.message or "")
        who = names.get(m.group(0)) if m else None
        if who is None:
            raise
        raise type(e)(e.status, f"{who}: {e.message}", e.function) from None


def _rows_cols(shape):
    """A shape as the 2-D [rows, cols] the C library reads (leading dimensions collapsed)."""
    if len(shape) == 1:
        return 1, shape[0]
    r = 1
    for s in shape[:-1]:
        r *= s
    return r, shape[-1]


def _scale_shape(R, C, mode, recipe, layout, columnwise):
    r, c = ctypes.c_int64(), ctypes.c_int64()
    st = lib.xte_quantize_scale_shape(R, C, int(mode), int(recipe), int(layout), int(columnwise),
                                      ctypes.byref(r), ctypes.byref(c))
    return (r.value, c.value) if st == 0 else None


class _Operand:
    """A resolved operand: the xte_qtensor, the Views that keep its arrays alive, and the
    logical X [rows, cols] the qtensor quantized (2-D; leading dimensions collapsed)."""

    __slots__ = ("q", "views", "x", "shape", "name", "lead")


def _from_qtensor(q, name):
    s, views = qview(q, name)  # 3-D scale arrays: [G * rows, cols], as the C library reads
    o = _Operand()
    o.q, o.views, o.name = s, views, name
    o.shape = tuple(q.shape)
    o.x = _rows_cols(o.shape)
    o.lead = views[0]
    return o


def _mode_hint(v, what):
    """recipe_a / recipe_b: a DeepGEMM (gran_mn, gran_k) tuple or an xte mode name."""
    if v is None:
        return None
    if isinstance(v, (tuple, list)) and len(v) == 2:
        t = (int(v[0]), int(v[1]))
        modes = {(1, 128): _B1, (128, 128): _B2, (1, 32): _MX}
        if t not in modes:
            raise XteUnsupportedError(Status.UNSUPPORTED,
                                      f"{what}: granularity {t} is not one of (1, 128), "
                                      "(128, 128), (1, 32)")
        return modes[t]
    try:
        return parse_mode(v)
    except XteValueError as e:
        raise XteValueError(Status.INVALID_ARGUMENT, f"{what}: {e.message}") from None


def deepgemm_hints(recipe, recipe_a, recipe_b, layout):
    """((mode hint, layout hint) of a, (mode hint, layout hint) of b) from DeepGEMM's recipe
    tuple or recipe_a / recipe_b names and layout (None: inferred from the scales)."""
    ha, hb = _mode_hint(recipe_a, "recipe_a"), _mode_hint(recipe_b, "recipe_b")
    if recipe is not None:
        if not (isinstance(recipe, (tuple, list)) and len(recipe) == 3):
            raise XteValueError(Status.INVALID_ARGUMENT, f"recipe: {recipe!r} is not DeepGEMM's "
                                "(gran_m, gran_n, gran_k) tuple (use recipe_a= / recipe_b= for "
                                "mode names)")
        ha = _mode_hint((recipe[0], recipe[2]), "recipe")
        hb = _mode_hint((recipe[1], recipe[2]), "recipe")
    if isinstance(layout, (tuple, list)):
        la, lb = (None if x is None else parse_layout(x) for x in layout)
    else:
        la = lb = None if layout is None else parse_layout(layout)
    return (ha, la), (hb, lb)


def _pair_candidates(data_v, sf_v, trans, hint):
    """{mode: {storage class: (layout, recipe, columnwise)}} whose scale shape is sf's."""
    mode_hint, layout_hint = hint
    R, C = _rows_cols(data_v.shape)
    sf_rc = _rows_cols(sf_v.shape)
    mx = sf_v.dtype in (DType.E8M0, DType.UINT8)
    modes = (_MX,) if mx else (_B1, _B2, _PT)
    if mode_hint is not None:
        modes = tuple(m for m in modes if m == mode_hint)
    out = {}
    for mode in modes:
        col = bool(trans) and mode in (_B1, _MX)
        if mode == _MX:
            recipe = Recipe.MX_TE
        elif mode == _PT:
            recipe = Recipe.TE_CURRENT
        else:
            recipe = Recipe.MTFP8 if col else Recipe.DEEPGEMM
        for layout in _LAYOUT_ORDER:
            if layout_hint is not None and layout != layout_hint:
                continue
            if layout == ScaleLayout.MX_SWIZZLED and mode != _MX:
                continue
            if _scale_shape(R, C, mode, recipe, layout, col) != sf_rc:
                continue
            # which layouts store the grid identically (for a shape they share)
            if layout == ScaleLayout.MX_SWIZZLED:
                cls = "swizzled"
            elif (layout in (ScaleLayout.DEEPGEMM, ScaleLayout.TE_GEMM) and not col
                  and mode in (_B1, _MX)):
                cls = "mn-major"
            else:
                cls = "row-major"
            out.setdefault(mode, {}).setdefault(cls, (layout, recipe, col))
    return out


def _from_pair(x, name, trans, hint):
    data, sf = x
    dv = view(data, f"{name}[0]", _FP8)
    sv = view(sf, f"{name}[1]", (DType.FP32, DType.E8M0, DType.UINT8))
    if len(dv.shape) not in (2, 3):
        raise XteShapeError(Status.SHAPE, f"{name}[0]: shape {dv.shape}: want [rows, cols] or "
                            "[G, rows, cols]")
    return dv, sv, _pair_candidates(dv, sv, trans, hint)


def _build_pair(dv, sv, name, mode, cands):
    classes = cands[mode]
    if len(classes) > 1:
        raise XteValueError(Status.INVALID_ARGUMENT,
                            f"{name}[1]: scales of shape {sv.shape} fit {mode.name} data "
                            f"{dv.shape} in several storages ({', '.join(sorted(classes))}): "
                            "pass layout= ('compact', 'deepgemm', 'te_gemm', 'mx_swizzled')")
    layout, recipe, col = next(iter(classes.values()))
    if sv.t.ld not in (0, sv.shape[-1]):
        raise XteLayoutError(f"{name}[1]: scale rows padded to a stride of {sv.t.ld} (shape "
                             f"{sv.shape}): scale buffers are dense, pass a contiguous array")
    s = QTensor()
    st = ScaleTensor()
    st.data = sv.t.data
    st.dtype = int(DType.E8M0 if mode == _MX else DType.FP32)
    st.rows, st.cols = _rows_cols(sv.shape)
    st.layout = int(layout)
    if col:
        s.columnwise = dv.t
        s.columnwise_scale_inv = st
    else:
        s.rowwise = dv.t
        s.rowwise_scale_inv = st
    s.scaling_mode = int(mode)
    s.recipe = int(recipe)
    o = _Operand()
    o.q, o.views, o.name, o.lead = s, [dv, sv], name, dv
    o.shape = tuple(dv.shape)
    o.x = _rows_cols(o.shape)
    return o


def _is_pair(x):
    return isinstance(x, (tuple, list)) and len(x) == 2


def _operands(a, b, trans_a, trans_b, recipe=None, recipe_a=None, recipe_b=None, layout=None,
              names=("a", "b")):
    """Resolve a and b (C-level trans flags) into _Operands, choosing the scaling modes of
    (data, scales) pairs jointly so that the pair is a supported one."""
    hint_a, hint_b = deepgemm_hints(recipe, recipe_a, recipe_b, layout)
    res = []
    for x, name, trans, hint in ((a, names[0], trans_a, hint_a), (b, names[1], trans_b, hint_b)):
        if isinstance(x, QuantizedTensor):
            res.append(("q", _from_qtensor(x, name), {x.scaling_mode: None}))
        elif _is_pair(x):
            dv, sv, cands = _from_pair(x, name, trans, hint)
            if not cands:
                R, C = _rows_cols(dv.shape)
                want = ("1x32 (E8M0)" if sv.dtype != DType.FP32 else
                        "per_tensor, 1x128, 128x128")
                raise XteShapeError(
                    Status.SHAPE,
                    f"{name}[1]: scales of shape {sv.shape} ({_lib.lib.xte_dtype_name(sv.dtype).decode()})"
                    f" fit no scaling ({want}) of {'transposed ' if trans else ''}data "
                    f"[{R}, {C}] in any scale layout"
                    + (" with the given recipe / layout" if hint != (None, None) else ""))
            res.append(("p", (dv, sv), cands))
        else:
            raise XteDTypeError(Status.DTYPE, f"{name}: {type(x).__name__} is neither an "
                                "xte.QuantizedTensor nor a (data, scales) pair")
    (ka, oa, ca), (kb, ob, cb) = res
    pick = next(((ma, mb) for ma, mb in _PAIRS if ma in ca and mb in cb), None)
    if pick is None:
        ma = "/".join(sorted(m.name for m in ca))
        mb = "/".join(sorted(m.name for m in cb))
        raise XteUnsupportedError(
            Status.UNSUPPORTED,
            f"{names[0]}, {names[1]}: scaling pair {ma} x {mb} is not supported (1x128 x 128x128, "
            "128x128 x 1x128, 1x128 x 1x128, per_tensor x per_tensor, 1x32 x 1x32)")
    if ka == "p":
        oa = _build_pair(oa[0], oa[1], names[0], pick[0], ca)
    if kb == "p":
        ob = _build_pair(ob[0], ob[1], names[1], pick[1], cb)
    return oa, ob


def _config(trans_a, trans_b, accumulate, vbias, mode):
    cfg = lib.xte_gemm_config_default()
    cfg.trans_a = int(bool(trans_a))
    cfg.trans_b = int(bool(trans_b))
    cfg.accumulate = int(bool(accumulate))
    cfg.bias = None if vbias is None else ctypes.pointer(vbias.t)  # a struct field: a real pointer
    cfg.mode = int(parse_gemm_mode(mode))
    return cfg


def _mk(oa, ob, ta, tb):
    """(M, K) of op(A) and (N, K) of op(B) for C-level trans flags (2-D operands)."""
    M, Ka = (oa.x[1], oa.x[0]) if ta else oa.x
    N, Kb = (ob.x[1], ob.x[0]) if tb else ob.x
    return M, Ka, N, Kb


def _check_k(Ka, Kb, names=("a", "b")):
    if Ka != Kb:
        raise XteShapeError(Status.SHAPE, f"{names[1]}: K = {Kb} does not match {names[0]}'s "
                            f"K = {Ka}")


def _run_gemm(oa, ob, c, out, ta, tb, accumulate, bias, mode, names):
    """Views for c / out / bias, then xte_gemm. names: Python names of A, B, C, D."""
    vbias = view_opt(bias, "bias", (DType.FP32,))
    vd = view(out, names["D"], writable=True)
    vc = view(c, names["C"]) if accumulate else None
    cfg = _config(ta, tb, accumulate, vbias, mode)
    stream = stream_of(*oa.views, *ob.views, vc, vd, vbias)
    _call("xte_gemm", dict(names, **{"config->bias": "bias"}), ctypes.byref(oa.q),
          ctypes.byref(ob.q), ptr(vc), vd.ptr, ctypes.byref(cfg), stream)
    return out


# ------------------------------------------------------------------------------- xte.gemm


def gemm(a: Union[QuantizedTensor, Pair], b: Union[QuantizedTensor, Pair],
         out: Optional[Array] = None, *, trans_a: bool = False, trans_b: bool = True,
         c: Optional[Array] = None, accumulate: bool = False, bias: Any = None,
         mode: GemmModeLike = "exact", out_dtype: DTypeLike = "bfloat16") -> Array:
    """D = op(a) @ op(b) (+ C) (+ bias), block-scaled FP8 (xte_gemm).

    op(a) = a^T if trans_a else a, [M, K]; op(b) = b^T if trans_b else b, [K, N]: the default
    trans_b=True is the Linear forward x @ W^T with the weight W [N, K] ("TN" of cuBLAS /
    TransformerEngine). a and b are xte.QuantizedTensor or DeepGEMM (data, scales) pairs, their
    "shape" being that of the quantized tensor (a QuantizedTensor's rowwise shape).

    out: fp32 or bf16 [M, N]; None allocates one of out_dtype ('bfloat16' or 'float32') in a's
    framework and device (out_dtype is ignored when out is given). accumulate=True adds C after
    the product (cuBLAS' beta = 1): C is c, or out itself when c is None (in-place
    accumulation). Passing c implies accumulate=True. bias: fp32 [N]. mode: 'exact' (bit-exact
    contract, docs/numerics.md section 6) or 'fast'. Returns out.

    A (data, scales) pair whose scale shape fits several scalings / layouts is an error here:
    use fp8_gemm_* (recipe= / layout=) or wrap it with xte.as_quantized.
    """
    ta, tb = bool(trans_a), not bool(trans_b)  # C: trans_b = 0 means B is [N, K]
    oa, ob = _operands(a, b, ta, tb)
    M, Ka, N, Kb = _mk(oa, ob, ta, tb)
    _check_k(Ka, Kb)
    if c is not None:
        accumulate = True
    if accumulate and c is None:
        if out is None:
            raise XteValueError(Status.INVALID_ARGUMENT,
                                "accumulate: True with neither c nor out (nothing to add to)")
        c = out
    if out is None:
        out = empty(oa.lead, (M, N), _out_dtype(out_dtype))
    cname = "out" if c is out else "c"
    return _run_gemm(oa, ob, c, out, ta, tb, accumulate, bias, mode,
                     {"A": "a", "B": "b", "C": cname, "D": "out"})


# ------------------------------------------------------------------------------- DeepGEMM names


def _dg_gemm(a, b, d, c, ta, tb, recipe, recipe_a, recipe_b, layout, mode, bias, alpha):
    if alpha is not None:
        raise XteUnsupportedError(Status.UNSUPPORTED, "alpha: xte's GEMM has no alpha scaling")
    oa, ob = _operands(a, b, ta, tb, recipe, recipe_a, recipe_b, layout)
    M, Ka, N, Kb = _mk(oa, ob, ta, tb)
    _check_k(Ka, Kb)
    return _run_gemm(oa, ob, c, d, ta, tb, c is not None, bias, mode,
                     {"A": "a", "B": "b", "C": "c", "D": "d"})


_DG_DOC = """DeepGEMM's fp8_gemm_{nm}(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None)
    over xte_gemm: d = a{opa} @ b{opb} (+ c), written into d (fp32 or bf16 [M, N]).

    a: {sa}; b: {sb} (DeepGEMM's storage for "{nm}"). a / b are (data, scales) pairs or
    xte.QuantizedTensor; recipe / recipe_a / recipe_b as DeepGEMM (see the module docstring);
    layout= names the scale layout of a pair where its shape is ambiguous. c: accumulate (fp32 or
    bf16 [M, N], may be d itself). Differences from DeepGEMM: the result is the exact contract
    (docs/numerics.md) unless mode='fast'; scales are read as given, never cast to UE8M0 (as
    DeepGEMM's disable_ue8m0_cast=True); bias= (fp32 [N]) is xte's; compiled_dims and
    disable_ue8m0_cast are accepted and ignored; alpha is not supported. Returns d.
    """


def _make_dg(nm, ta, tb, sa, sb, opa, opb):
    def f(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, *, layout=None,
          mode="exact", bias=None, compiled_dims=None, disable_ue8m0_cast=False, alpha=None):
        return _dg_gemm(a, b, d, c, ta, tb, recipe, recipe_a, recipe_b, layout, mode, bias, alpha)
    f.__name__ = f.__qualname__ = f"fp8_gemm_{nm}"
    f.__doc__ = _DG_DOC.format(nm=nm, sa=sa, sb=sb, opa=opa, opb=opb)
    return f


fp8_gemm_nt = _make_dg("nt", 0, 0, "[M, K]", "[N, K]", "", "^T")
fp8_gemm_nn = _make_dg("nn", 0, 1, "[M, K]", "[K, N]", "", "")
fp8_gemm_tn = _make_dg("tn", 1, 1, "[K, M]", "[K, N]", "^T", "")
fp8_gemm_tt = _make_dg("tt", 1, 0, "[K, M]", "[N, K]", "^T", "^T")

# ------------------------------------------------------------------------------- grouped

_KINDS = {"contiguous": GemmGrouping.CONTIGUOUS, "masked": GemmGrouping.MASKED,
          "k": GemmGrouping.K, "k_grouped": GemmGrouping.K}


def _sizes(x, name):
    """A host int64 array (ctypes) of group sizes from a sequence or a 1-D integer array."""
    if hasattr(x, "tolist") and not isinstance(x, (list, tuple)):
        if hasattr(x, "detach"):  # torch: read on the host (a device sync for CUDA tensors)
            x = x.detach().cpu()
        v = x.tolist()
    else:
        v = list(x)
    if any(isinstance(s, (list, tuple)) for s in v):
        raise XteShapeError(Status.SHAPE, f"{name}: want a 1-D sequence of sizes")
    try:
        v = [int(s) for s in v]
    except (TypeError, ValueError):
        raise XteDTypeError(Status.DTYPE, f"{name}: sizes must be integers") from None
    return (ctypes.c_int64 * max(len(v), 1))(*v), len(v)


def _run_grouped(oa, ob, c, d, groups, ta, tb, accumulate, bias, mode, names, keep):
    vbias = view_opt(bias, "bias", (DType.FP32,))
    vd = view(d, names["D"], writable=True)
    vc = view(c, names["C"]) if accumulate else None
    cfg = _config(ta, tb, accumulate, vbias, mode)
    stream = stream_of(*oa.views, *ob.views, vc, vd, vbias, *keep)
    n = dict(names, **{"config->bias": "bias"})
    _call("xte_gemm_grouped", n, ctypes.byref(oa.q), ctypes.byref(ob.q), ptr(vc), vd.ptr,
          ctypes.byref(groups), ctypes.byref(cfg), stream)
    return d


def _grouped(a, b, d, kind, group_sizes, masked_m, alignment, num_groups, ta, tb, c, accumulate,
             bias, mode, out_dtype, opnds, names):
    kind = _parse_enum(kind, _KINDS, GemmGrouping, "kind")
    oa, ob = opnds
    g = GemmGroups()
    g.kind = int(kind)
    keep = []
    sizes = None
    if kind in (GemmGrouping.CONTIGUOUS, GemmGrouping.K):
        if group_sizes is None:
            raise XteValueError(Status.NULL_POINTER, f"{names['groups->group_sizes']}: required "
                                f"for {kind.name.lower()} grouping")
        sizes, G = _sizes(group_sizes, names["groups->group_sizes"])
        g.group_sizes = ctypes.cast(sizes, ctypes.POINTER(ctypes.c_int64))
        g.alignment = int(alignment or 0)
    else:
        if masked_m is None:
            raise XteValueError(Status.NULL_POINTER, f"{names['groups->masked_m']}: required for "
                                "masked grouping")
        vm = view(masked_m, names["groups->masked_m"], (DType.INT32,))
        keep.append(vm)
        G = _rows_cols(vm.shape)[0] * _rows_cols(vm.shape)[1]
        g.masked_m = ctypes.pointer(vm.t)
    if num_groups is not None and int(num_groups) != G:
        raise XteShapeError(Status.SHAPE, f"num_groups: {num_groups}, but "
                            f"{names['groups->group_sizes' if sizes is not None else 'groups->masked_m']} "
                            f"holds {G} groups")
    g.num_groups = G
    gname = names["groups->group_sizes" if sizes is not None else "groups->masked_m"]
    for o, what in ((ob, "[G, N, K]" if not tb else "[G, K, N]"),
                    (oa, "[G, m_max, K]" if kind == GemmGrouping.MASKED else None)):
        if what and kind != GemmGrouping.K and len(o.shape) == 3 and o.shape[0] != G:
            raise XteShapeError(Status.SHAPE, f"{gname}: {G} groups, but {o.name} holds "
                                f"{o.shape[0]} ({what})")
    if d is None:
        if kind == GemmGrouping.K:
            M, N = (oa.x[1] if ta else oa.x[0]), (ob.x[0] if not tb else ob.x[1])
            shape = (G, M, N)
        else:
            N = ob.x[0] // max(G, 1) if not tb else ob.x[1]
            shape = ((oa.shape[0], oa.shape[1], N) if kind == GemmGrouping.MASKED
                     and len(oa.shape) == 3 else (oa.x[0], N))
        d = empty(oa.lead, shape, _out_dtype(out_dtype))
    if c is not None:
        accumulate = True
    if accumulate and c is None:
        c = d
    names = dict(names)
    if c is d:
        names["C"] = names["D"]
    _run_grouped(oa, ob, c, d, g, ta, tb, accumulate, bias, mode, names, keep)
    return d


def gemm_grouped(a: Union[QuantizedTensor, Pair], b: Union[QuantizedTensor, Pair],
                 out: Optional[Array] = None, *, kind: EnumLike = "contiguous",
                 group_sizes: Any = None, masked_m: Optional[Array] = None, alignment: int = 0,
                 num_groups: Optional[int] = None, trans_a: bool = False, trans_b: bool = True,
                 c: Optional[Array] = None, accumulate: bool = False, bias: Any = None,
                 mode: GemmModeLike = "exact", out_dtype: DTypeLike = "bfloat16") -> Array:
    """All groups of a grouped GEMM in one call (xte_gemm_grouped, MoE experts); each group's
    result is bit-identical to xte.gemm on its slices. Transposes as xte.gemm (op(b) = b^T when
    trans_b, the default: b holds [G, N, K]).

    kind='contiguous': a [sum_g roundup(m_g, alignment), K] (trans_a must be False), the rows of
    group g after those of group g - 1, each padded to a multiple of `alignment` rows (0 / 1:
    none; padding rows are never read and their out rows never written); group_sizes = m_g (a
    host sequence or 1-D integer array); b [G, N, K] (or [G, K, N] with trans_b=False);
    out [rows of a, N].
    kind='masked': a [G, m_max, K]; masked_m int32 [G] on the operands' device holds each
    group's valid rows (rows past it are never read, out rows never written); out [G, m_max, N].
    kind='k': weight-gradient GEMM with K split into G segments, group_sizes = K_g (each but the
    last a multiple of the K block, 128 / 32 for MXFP8): out[g] = (c[g] +) op(a)[:, seg g] @
    op(b)[seg g, :], out [G, M, N].
    num_groups: optional check of the count implied by group_sizes / masked_m. c, accumulate,
    bias (fp32 [N], every group), mode and out_dtype as xte.gemm. Returns out.
    """
    ta, tb = bool(trans_a), not bool(trans_b)
    opnds = _operands(a, b, ta, tb)
    names = {"A": "a", "B": "b", "C": "c", "D": "out", "groups->masked_m": "masked_m",
             "groups->group_sizes": "group_sizes", "groups->alignment": "alignment",
             "groups->num_groups": "num_groups", "config->trans_a": "trans_a"}
    return _grouped(a, b, out, kind, group_sizes, masked_m, alignment, num_groups, ta, tb, c,
                    accumulate, bias, mode, out_dtype, opnds, names)


def _host_ints(x, name):
    """A host list of ints from a sequence or a 1-D integer array (torch: read on the host, a
    device sync for CUDA tensors)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
    v = x.tolist() if hasattr(x, "tolist") else list(x)
    if any(isinstance(s, (list, tuple)) for s in v):
        raise XteShapeError(Status.SHAPE, f"{name}: want a 1-D sequence")
    try:
        return [int(s) for s in v]
    except (TypeError, ValueError):
        raise XteDTypeError(Status.DTYPE, f"{name}: values must be integers") from None


def _rup(x, a):
    return -(-x // a) * a


def _m_indices_to_sizes(m_indices, num_groups, alignment, name):
    """DeepGEMM's grouped_layout (int32 [M]: each row's group, -1 for padding rows) as xte's
    group sizes: groups in order (empty groups allowed), each padded with -1 rows to a multiple
    of `alignment` rows; rows past the last group's padding all -1 (a longer than the groups).
    Returns (sizes, rows used by the groups)."""
    idx = _host_ints(m_indices, name)
    M = len(idx)
    sizes = [0] * num_groups
    align = max(int(alignment or 1), 1)
    i, g_prev = 0, -1
    while i < M:
        g = idx[i]
        if g == -1:
            bad = next((j for j in range(i, M) if idx[j] != -1), None)
            if bad is not None:
                raise XteValueError(Status.INVALID_ARGUMENT,
                                    f"{name}: row {i} holds -1 where a group starts, but row "
                                    f"{bad} holds {idx[bad]} (a's rows are the groups in order, "
                                    f"each padded to a multiple of alignment = {align} rows; -1 "
                                    "rows after the last group only)")
            return sizes, i
        if g < 0 or g >= num_groups or g <= g_prev:
            raise XteValueError(Status.INVALID_ARGUMENT,
                                f"{name}: row {i} holds {g}: groups must follow each other in "
                                f"order 0..{num_groups - 1} (each padded with -1 rows to a "
                                f"multiple of alignment = {align})")
        j = i
        while j < M and idx[j] == g:
            j += 1
        m = j - i
        padded = _rup(m, align)
        if i + padded > M or any(v != -1 for v in idx[j:i + padded]):
            raise XteValueError(Status.INVALID_ARGUMENT,
                                f"{name}: group {g} has {m} rows from row {i}: want -1 in rows "
                                f"{j}..{i + padded - 1} (padding to alignment = {align})")
        sizes[g] = m
        g_prev = g
        i += padded
    return sizes, M


def _psum_to_sizes(grouped_layout, num_groups, alignment, name, what="M"):
    """DeepGEMM's PSUM layout (int [G]: the end of each group's rows, cumulative; group g starts
    at the end of group g - 1 rounded up to `alignment`) as (starts, sizes)."""
    ends = _host_ints(grouped_layout, name)
    if len(ends) != num_groups:
        raise XteShapeError(Status.SHAPE, f"{name}: {len(ends)} values, want one per group "
                            f"({num_groups})")
    align = max(int(alignment or 1), 1)
    starts, sizes, prev = [], [], 0
    for g, e in enumerate(ends):
        s = _rup(prev, align)
        if e < s:
            raise XteValueError(Status.INVALID_ARGUMENT,
                                f"{name}: group {g} ends at {what} = {e}, before its start {s} "
                                f"(the previous end {prev} rounded up to alignment = {align})")
        starts.append(s)
        sizes.append(e - s)
        prev = e
    return starts, sizes


def _zero_rows(d, r0, r1):
    if r1 > r0:
        d[r0:r1] = 0


def m_grouped_fp8_gemm_nt_contiguous(a: Union[QuantizedTensor, Pair],
                                     b: Union[QuantizedTensor, Pair], d: Array,
                                     grouped_layout: Any = None, recipe: Any = None,
                                     recipe_a: Any = None, recipe_b: Any = None, *,
                                     group_sizes: Any = None, alignment: Optional[int] = None,
                                     layout: Any = None, mode: GemmModeLike = "exact",
                                     bias: Any = None, compiled_dims: Any = None,
                                     disable_ue8m0_cast: bool = False,
                                     use_psum_layout: bool = False,
                                     ensure_zero_padding: bool = True,
                                     expected_m_for_psum_layout: Optional[int] = None,
                                     trans_b: bool = False) -> Array:
    """DeepGEMM's m_grouped_fp8_gemm_nt_contiguous(a, b, d, grouped_layout) over
    xte_gemm_grouped: a [M, K], b [G, N, K] (or, trans_b=True, [G, K, N]: DeepGEMM's _nn form),
    d [M, N] (bf16 or fp32); the rows of group g of a times b[g]^T.

    The groups, each padded to `alignment` rows (default 128, DeepGEMM's legacy M alignment;
    xte.deep_gemm passes its get_mk_alignment_for_contiguous_layout()):
    * grouped_layout, DeepGEMM's m_indices (int32 [M]: each row's group, -1 on padding rows; the
      groups in order, empty groups allowed, -1 rows after the last group allowed: a may be
      longer than the groups); read on the host (a device sync for CUDA tensors);
    * use_psum_layout=True: grouped_layout int32 [G] holds the cumulative end row of each group,
      group g starting at the end of group g - 1 rounded up to the alignment;
    * group_sizes= (xte's form: m_g per group, host sequence; default alignment 1 = none), or a
      Python sequence as grouped_layout.
    Rows of a and d past the groups are never read (a) nor computed. Every row of d in no
    group is written with zeros with an m_indices layout (as DeepGEMM) and, with group sizes or
    the PSUM layout, when ensure_zero_padding (the default, as DeepGEMM); else it keeps its
    bytes. A's rows past the groups are passed on as views (no copy). compiled_dims,
    disable_ue8m0_cast and expected_m_for_psum_layout are accepted and ignored. Returns d.
    """
    tb = 1 if trans_b else 0
    G = None
    bdata = b[0] if _is_pair(b) else None
    if bdata is not None and len(getattr(bdata, "shape", ())) == 3:
        G = int(bdata.shape[0])
    elif isinstance(b, QuantizedTensor) and len(b.shape) == 3:
        G = int(b.shape[0])
    names = {"A": "a", "B": "b", "C": "c", "D": "d", "groups->masked_m": "masked_m",
             "groups->group_sizes": "group_sizes", "groups->alignment": "alignment"}
    if group_sizes is None and isinstance(grouped_layout, (list, tuple)) and not use_psum_layout:
        group_sizes, grouped_layout = grouped_layout, None
    M = int(a[0].shape[0]) if _is_pair(a) else int(cast(QuantizedTensor, a).shape[0])
    m_indices = group_sizes is None and not use_psum_layout
    if group_sizes is not None:
        align = max(int(alignment or 1), 1)
        sizes = _host_ints(group_sizes, "group_sizes")
    else:
        if grouped_layout is None:
            raise XteValueError(Status.NULL_POINTER, "grouped_layout: required (or group_sizes=)")
        if G is None:
            raise XteShapeError(Status.SHAPE, "b: want [G, N, K] data to read grouped_layout "
                                "(or pass group_sizes=)")
        align = 128 if alignment is None else max(int(alignment), 1)
        vl = view(grouped_layout, "grouped_layout", (DType.INT32,))
        names["groups->group_sizes"] = "grouped_layout"
        names["groups->alignment"] = "grouped_layout"
        if use_psum_layout:
            if len(vl.shape) != 1:
                raise XteShapeError(Status.SHAPE, f"grouped_layout: shape {vl.shape}: want [{G}] "
                                    "(the PSUM layout: each group's end row)")
            _, sizes = _psum_to_sizes(grouped_layout, G, align, "grouped_layout")
            end = sum(_rup(m, align) for m in sizes[:-1]) + (sizes[-1] if sizes else 0)
            if end > M:
                raise XteShapeError(Status.SHAPE, f"grouped_layout: the groups end at row {end}, "
                                    f"past a's {M} rows")
        else:
            if len(vl.shape) != 1 or vl.shape[0] != M:
                raise XteShapeError(Status.SHAPE, f"grouped_layout: shape {vl.shape}: want "
                                    f"[{M}] (one group index per row of a)")
            sizes, _ = _m_indices_to_sizes(grouped_layout, G, align, "grouped_layout")
    ok = all(m >= 0 for m in sizes)
    padded = [_rup(m, align) for m in sizes] if ok else list(sizes)
    used = sum(padded)
    if ok and sizes and used > M and used - padded[-1] + sizes[-1] <= M:
        # the last group's padding runs past a (a ends with the last group's rows): the groups
        # before it in one grouped call, the last one as a dense GEMM on its rows
        _m_grouped_split_last(a, b, d, sizes, padded, align, tb, recipe, recipe_a, recipe_b,
                              layout, bias, mode, names)
    else:
        dd = d
        if ok and used < M and _is_pair(a) and d is not None:
            # a longer than the groups: the groups' rows as views (data and per-row scales)
            ad, asf = a
            a = (ad[:used], asf[:used] if len(asf.shape) == 2 and asf.shape[0] == M else asf)
            dd = d[:used]
        opnds = _operands(a, b, 0, tb, recipe, recipe_a, recipe_b, layout)
        _grouped(a, b, dd, "contiguous", sizes, None, align, None, 0, tb, None, False, bias,
                 mode, None, opnds, names)
    # DeepGEMM writes every row of d in an m_indices layout (its padding rows as zeros: the
    # flag only matters for the PSUM layout); with group sizes or PSUM, ensure_zero_padding
    if (ensure_zero_padding or m_indices) and d is not None:
        off = 0
        for m, p in zip(sizes, padded):
            _zero_rows(d, off + m, min(off + p, M))
            off += p
        _zero_rows(d, min(off, M), M)
    return d


def _m_grouped_split_last(a, b, d, sizes, padded, align, tb, recipe, recipe_a, recipe_b, layout,
                          bias, mode, names):
    """Contiguous grouping whose last group's padding runs past a: groups 0..G-2 through
    xte_gemm_grouped on the leading rows, the last group through xte_gemm (views, no copies)."""
    G = len(sizes)
    off = sum(padded[:-1])
    bd, bsf = b
    m = sizes[-1]
    al = (a[0][off:off + m], a[1][off:off + m])
    bl = (bd[G - 1], bsf[G - 1] if len(bsf.shape) == 3 else bsf)
    _operands(al, bl, 0, tb, recipe, recipe_a, recipe_b, layout)  # both resolved before a write
    if G > 1:
        a0 = (a[0][:off], a[1][:off] if len(a[1].shape) == 2 else a[1])
        b0 = (bd[:G - 1], bsf[:G - 1] if len(bsf.shape) == 3 else bsf)
        opnds = _operands(a0, b0, 0, tb, recipe, recipe_a, recipe_b, layout)
        _grouped(a0, b0, d[:off], "contiguous", sizes[:-1], None, align, None, 0, tb, None,
                 False, bias, mode, None, opnds, names)
    if m:
        _dg_gemm(al, bl, d[off:off + m], None, 0, tb, recipe, recipe_a, recipe_b, layout, mode,
                 bias, None)


def m_grouped_fp8_gemm_nn_contiguous(a: Union[QuantizedTensor, Pair],
                                     b: Union[QuantizedTensor, Pair], d: Array,
                                     grouped_layout: Any = None, recipe: Any = None,
                                     recipe_a: Any = None, recipe_b: Any = None, **kw) -> Array:
    """DeepGEMM's m_grouped_fp8_gemm_nn_contiguous: m_grouped_fp8_gemm_nt_contiguous with b
    [G, K, N] (scales [G, ceil(K/128), ceil(N/128)] of that storage); same keywords."""
    return m_grouped_fp8_gemm_nt_contiguous(a, b, d, grouped_layout, recipe, recipe_a, recipe_b,
                                            trans_b=True, **kw)


def m_grouped_fp8_gemm_nt_masked(a: Union[QuantizedTensor, Pair], b: Union[QuantizedTensor, Pair],
                                 d: Array, masked_m: Array, expected_m: Optional[int] = None,
                                 recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None, *,
                                 layout: Any = None, mode: GemmModeLike = "exact",
                                 bias: Any = None, compiled_dims: Any = None,
                                 disable_ue8m0_cast: bool = False) -> Array:
    """DeepGEMM's m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m) over
    xte_gemm_grouped: a [G, m_max, K], b [G, N, K], d [G, m_max, N]; masked_m int32 [G] (on the
    operands' device) holds the valid rows of each group: d[g, :masked_m[g]] = a[g, :masked_m[g]]
    @ b[g]^T; other rows of a are never read and of d never written. expected_m (a scheduling
    hint in DeepGEMM) is accepted and ignored. Returns d.
    """
    opnds = _operands(a, b, 0, 0, recipe, recipe_a, recipe_b, layout)
    names = {"A": "a", "B": "b", "C": "c", "D": "d", "groups->masked_m": "masked_m"}
    return _grouped(a, b, d, "masked", None, masked_m, 0, None, 0, 0, None, False, bias, mode,
                    None, opnds, names)


def _pow2_fp32_to_e8m0(sf, name):
    """fp32 scales that are powers of two (2^-127 < s < 2^128, as DeepGEMM's UE8M0 casts make
    them) as E8M0 bytes (uint8, the exponent field): exact. Other values raise (xte's 1x32
    scaling is MXFP8, E8M0 scales only)."""
    torch = _torch_of(sf)
    if torch is not None:
        bits = sf.detach().contiguous().view(torch.int32)
        good = bool(((bits & 0x807FFFFF) == 0).all()) and bool(
            (((bits >> 23) & 0xFF) != 0).all()) and bool((((bits >> 23) & 0xFF) != 255).all())
        e = ((bits >> 23) & 0xFF).to(torch.uint8)
    else:
        import numpy as np
        bits = np.ascontiguousarray(sf, np.float32).view(np.int32)
        ex = (bits >> 23) & 0xFF
        good = bool(((bits & 0x807FFFFF) == 0).all() and (ex != 0).all() and (ex != 255).all())
        e = ex.astype(np.uint8)
    if not good:
        raise XteUnsupportedError(Status.UNSUPPORTED,
                                  f"{name}: gran_k 32 with fp32 scales that are not positive "
                                  "powers of two: xte's 1x32 scaling is MXFP8 (E8M0 scales); "
                                  "quantize with use_ue8m0=True")
    return e


def _torch_of(x):
    import sys
    torch = sys.modules.get("torch")
    return torch if torch is not None and isinstance(x, torch.Tensor) else None


def check_k_recipe(recipe: Any) -> int:
    """gran_k of a k-grouped GEMM recipe ((1, 1, 128) or (1, 1, 32); None: 128), or the error."""
    if recipe is None:
        return 128
    r = tuple(int(v) for v in recipe)
    if len(r) != 3 or r[0] != 1 or r[1] != 1 or r[2] not in (32, 128):
        raise XteUnsupportedError(Status.UNSUPPORTED, f"recipe: {r}: k-grouped GEMMs take "
                                  "(1, 1, 128) or (1, 1, 32)")
    return r[2]


def _k_groups(ks, grouped_layout, G, use_psum_layout, alignment, rows):
    """(starts, sizes, name) of the K groups: ks (host sizes, each group right after the one
    before), or the PSUM layout (grouped_layout: cumulative ends, group g starting at the end of
    g - 1 rounded up to the alignment)."""
    if use_psum_layout:
        if grouped_layout is None:
            raise XteValueError(Status.NULL_POINTER, "grouped_layout: required with "
                                "use_psum_layout")
        starts, sizes = _psum_to_sizes(grouped_layout, G, alignment or 128, "grouped_layout",
                                       "K")
        name = "grouped_layout"
    else:
        name = "ks"
        if ks is None or (isinstance(ks, (list, tuple)) and not ks):
            if grouped_layout is None:
                raise XteValueError(Status.NULL_POINTER, "ks: required (or grouped_layout)")
            view(grouped_layout, "grouped_layout", (DType.INT32, DType.INT64))
            ks, name = grouped_layout, "grouped_layout"
        sizes = _host_ints(ks, name)
        if len(sizes) != G:
            raise XteShapeError(Status.SHAPE, f"{name}: {len(sizes)} groups, but d holds {G}")
        starts, off = [], 0
        for k in sizes:
            starts.append(off)
            off += max(k, 0)
        if off != rows and all(k >= 0 for k in sizes):
            raise XteShapeError(Status.SHAPE, f"{name}: the groups' K sum to {off}: a has "
                                f"{rows} rows of K")
    for g, (s, k) in enumerate(zip(starts, sizes)):
        if k < 0:
            raise XteShapeError(Status.SHAPE, f"{name}: group {g} has K = {k} < 0")
        if s + k > rows:
            raise XteShapeError(Status.SHAPE, f"{name}: group {g} (K rows {s}..{s + k - 1}) "
                                f"runs past a's {rows} rows")
    return starts, sizes, name


def _k_grouped(a, b, d, ks, grouped_layout, c, recipe, layout, mode, bias, use_psum_layout,
               alignment, nt):
    gk = check_k_recipe(recipe)
    if not (_is_pair(a) and _is_pair(b)):
        raise XteDTypeError(Status.DTYPE, "a, b: k-grouped GEMMs take (data, scales) pairs")
    G = int(d.shape[0])
    (ad, asf), (bd, bsf) = a, b
    if nt:  # a, b: the groups' [M, k_g] / [N, k_g] K-major blocks one after the other
        M, N = int(d.shape[1]), int(d.shape[2])
        rows = _prod(ad.shape) // max(M, 1)
    else:
        rows = int(ad.shape[0])
    starts, sizes, name = _k_groups(ks, grouped_layout, G, use_psum_layout, alignment, rows)
    if gk == 32:
        if dtype_of(asf) == DType.FP32:
            asf = _pow2_fp32_to_e8m0(asf, "a[1]")
        if dtype_of(bsf) == DType.FP32:
            bsf = _pow2_fp32_to_e8m0(bsf, "b[1]")
    rec = (1, 1, gk)
    total = sum(sizes)
    simple = (not nt and all(s == sum(sizes[:g]) for g, s in enumerate(starts))
              and all(k % gk == 0 for k in sizes[:-1]))
    if simple:
        # one xte_gemm_grouped call: every group starts on a K block, so the per-group scale
        # rows (ceil(k_g / gran_k) each) are the rows of the whole [sum_k, .] grid
        nsf = -(-total // gk)
        a2 = (ad[:total], asf[:nsf])
        b2 = (bd[:total], bsf[:nsf])
        opnds = _operands(a2, b2, 1, 1, rec, None, None, layout)
        names = {"A": "a", "B": "b", "C": "c", "D": "d", "groups->group_sizes": name}
        return _grouped(a2, b2, d, "k", sizes, None, 0, None, 1, 1, c, c is not None, bias, mode,
                        None, opnds, names)
    # per group: its K rows (views) and its own scale rows, ceil(k_g / gran_k) after those of
    # the groups before (DeepGEMM casts each group on its own)
    r, work = 0, []
    for g, (s, k) in enumerate(zip(starts, sizes)):
        if k == 0:
            work.append((g, None, None, 0, 0))
            continue
        nsf = -(-k // gk)
        if nt:
            ag = (ad.reshape(-1)[s * M:(s + k) * M].reshape(M, k), _cont(asf[:, r:r + nsf]))
            bg = (bd.reshape(-1)[s * N:(s + k) * N].reshape(N, k), _cont(bsf[:, r:r + nsf]))
            ta, tb = 0, 0
        else:
            ag = (ad[s:s + k], asf[r:r + nsf])
            bg = (bd[s:s + k], bsf[r:r + nsf])
            ta, tb = 1, 1
        try:  # every group's operands resolved before d is written
            oa, ob = _operands(ag, bg, ta, tb, rec, None, None, layout)
            _check_k(*_mk(oa, ob, ta, tb)[1::2])
        except XteError as e:
            raise type(e)(e.status, f"group {g}: {e.message}", e.function) from None
        work.append((g, ag, bg, ta, tb))
        r += nsf
    for g, ag, bg, ta, tb in work:
        dg = d[g]
        cg = None if c is None else c[g]
        if ag is None:  # K = 0: d[g] = c[g] (zeros without c)
            if cg is None:
                _zero_rows(d, g, g + 1)
            else:
                dg[...] = cg
            continue
        try:
            _dg_gemm(ag, bg, dg, cg, ta, tb, rec, None, None, layout, mode, bias, None)
        except XteError as e:
            raise type(e)(e.status, f"group {g}: {e.message}", e.function) from None
    return d


def _prod(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _cont(x):
    torch = _torch_of(x)
    if torch is not None:
        return x.contiguous()
    import numpy as np
    return np.ascontiguousarray(x)


def k_grouped_fp8_gemm_tn_contiguous(a: Union[QuantizedTensor, Pair],
                                     b: Union[QuantizedTensor, Pair], d: Array, ks: Any = None,
                                     grouped_layout: Any = None, c: Optional[Array] = None,
                                     recipe: Any = (1, 1, 128), *, layout: Any = None,
                                     mode: GemmModeLike = "exact", bias: Any = None,
                                     compiled_dims: Any = None, use_psum_layout: bool = False,
                                     alignment: Optional[int] = None) -> Array:
    """DeepGEMM's k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c) over
    xte_gemm_grouped / xte_gemm: a [sum_k, M], b [sum_k, N] (K-outer, "MN-major"), d [G, M, N]:
    d[g] = (c[g] +) a[seg g]^T @ b[seg g]; an empty group gives d[g] = c[g] (zeros without c).

    The groups: ks (host sequence; when None or empty, grouped_layout, DeepGEMM's device copy
    of ks, read on the host), each right after the one before; or use_psum_layout=True:
    grouped_layout int [G] holds each group's cumulative end row, group g starting at the end
    of g - 1 rounded up to `alignment` (xte.deep_gemm passes its K alignment; default 128).
    recipe (1, 1, gran_k), gran_k 128 (fp32 scales) or 32 (E8M0 bytes, or fp32 powers of two,
    converted exactly). Scales as DeepGEMM casts them, each group on its own: group g has
    ceil(k_g / gran_k) rows of scales, [sum_g ceil(k_g / gran_k), M]. One xte_gemm_grouped call
    when every group starts on a K block; else one xte_gemm per group on views (no copies).
    Returns d.
    """
    return _k_grouped(a, b, d, ks, grouped_layout, c, recipe, layout, mode, bias,
                      use_psum_layout, alignment, False)


def k_grouped_fp8_gemm_nt_contiguous(a: Union[QuantizedTensor, Pair],
                                     b: Union[QuantizedTensor, Pair], d: Array, ks: Any = None,
                                     grouped_layout: Any = None, c: Optional[Array] = None,
                                     recipe: Any = (1, 1, 128), *, layout: Any = None,
                                     mode: GemmModeLike = "exact", bias: Any = None,
                                     compiled_dims: Any = None, use_psum_layout: bool = False,
                                     alignment: Optional[int] = None) -> Array:
    """DeepGEMM's k_grouped_fp8_gemm_nt_contiguous: a holds each group's K-major [M, k_g] block
    one after the other (a 1-D or any-shaped contiguous array of sum_k * M codes), b likewise
    [N, k_g]; scales [M, sum_g ceil(k_g / 128)] and [N, ...] (any strides: each group's columns
    are copied, a scale copy). d[g] = (c[g] +) a_g @ b_g^T. One xte_gemm per group. Returns d."""
    if use_psum_layout:
        raise XteUnsupportedError(Status.UNSUPPORTED, "use_psum_layout: not with the NT k-grouped "
                                  "form (as DeepGEMM)")
    return _k_grouped(a, b, d, ks, grouped_layout, c, recipe, layout, mode, bias, False,
                      alignment, True)
