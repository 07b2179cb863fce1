"""GEMM checks: another library's FP8 GEMM output against xte's EXACT contract and FAST bound.

The reference is xte.gemm / xte.gemm_grouped in EXACT mode (include/xte/gemm.h) on the same
operands, in the producer's output dtype. Each output's error |D - D_exact| is measured

- in units of the FAST bound of include/xte/gemm.h / docs/numerics.md section 6:
      bound = (KB 2^-13 + (nb + 2) 2^-23) (S + 2^-150 Z) + nb 2^-149 + u_out |D_exact|
              (+ 2^-133 for bf16 outputs below 2^-126) (+ 2^-23 |D_exact| per epilogue add of
              C or bias, whose rounding differs when the products differ)
  with S = sum_k |a_k sa b_k sb| (the operands dequantized), KB = 128 (32 for MXFP8),
  nb = ceil(K / KB), u_out = 2^-8 for bf16 outputs (0 for fp32), Z = 0 unless a block scale
  product is below 2^-126 (then bounded by S / (min sa * min sb));
- in ulps of the output dtype at D_exact;
- and as DeepGEMM's calc_diff against the fp64 product of the dequantized operands.

mode='fast' (default) passes outputs within the bound; mode='exact' wants xte's bytes. NaN /
inf disagreements always fail. Grouped GEMMs also report the padding rows (contiguous: rows past
each group's size up to the alignment; masked: rows past masked_m): their content, and whether
they were written when `out_before` (the buffer before the call) is given.
"""

import numpy as np

from . import _common as C
from ._io import to_host
from ._report import Report, Verdict

__all__ = ["check_gemm", "check_gemm_grouped", "fast_bound"]

_MAX_EXAMPLES = 5


def _host_q(x, name, notes, block, recipe, layout):
    """A host QuantizedTensor from a QuantizedTensor or a (data, scales) pair."""
    import xte
    if isinstance(x, xte.QuantizedTensor):
        q = xte.QuantizedTensor(
            to_host(x.data, name + ".data", notes), to_host(x.scale_inv, name + ".scale_inv",
                                                             notes),
            scaling_mode=x.scaling_mode, recipe=x.recipe, layout=x.layout,
            columnwise_data=to_host(x.columnwise_data, name + ".columnwise_data", notes),
            columnwise_scale_inv=to_host(x.columnwise_scale_inv, name + ".columnwise_scale_inv",
                                         notes),
            columnwise_layout=x.columnwise_layout)
        return q
    data, sf = x
    data = to_host(data, name + "[0]", notes)
    sf = to_host(sf, name + "[1]", notes)
    if data.dtype == np.uint8:
        import ml_dtypes
        data = data.view(ml_dtypes.float8_e4m3fn)
    if recipe is None:
        recipe = "mx_te" if np.asarray(sf).dtype.itemsize == 1 else "deepgemm"
    return xte.as_quantized(data, sf, recipe=recipe, block=block, layout=layout)


def _mode(q):
    return str(getattr(q.scaling_mode, "name", q.scaling_mode)).lower()


def _kb(q):
    return 32 if "mx" in _mode(q) or "1x32" in _mode(q) else 128


def _untransposed(q):
    return str(getattr(q.recipe, "name", q.recipe)).lower() in ("mtfp8", "mx_te", "mx_ocp")


def _rows_along_k(q, want_t):
    """op rows [rows, K] in fp64 (the copy the C library reads, dequantized): want_t means
    op = X^T for the tensor X the QuantizedTensor quantized."""
    import xte
    m = _mode(q)
    along = ("128x128" in m) or ("per_tensor" in m) or not want_t
    if along and q.data is not None:
        v = np.asarray(xte.dequantize(q), np.float64)
        return v.T if want_t else v
    v = np.asarray(xte.dequantize(q, columnwise=True), np.float64)
    return v.T if _untransposed(q) else v


def _scale_min(q):
    s = []
    for arr in (q.scale_inv, q.columnwise_scale_inv):
        if arr is None:
            continue
        a = np.asarray(arr)
        if a.dtype.itemsize == 1:
            c = a.view(np.uint8).astype(np.int64)
            v = np.ldexp(1.0, np.minimum(c, 254) - 127)
        else:
            v = a.astype(np.float64)
        v = v[(v > 0) & np.isfinite(v)]
        if v.size:
            s.append(v.min())
    return min(s) if s else 1.0


def fast_bound(S, K, kb, out_dtype, d_exact, smin_a=1.0, smin_b=1.0, epilogue_adds=0):
    """The FAST bound of include/xte/gemm.h for every output (see the module text)."""
    nb = np.maximum(1, -(-np.asarray(K, np.int64) // kb))  # K: a scalar or per group
    coef = kb * 2.0 ** -13 + (nb + 2) * 2.0 ** -23
    Z = 0.0
    if smin_a * smin_b < 2.0 ** -126:
        Z = S / (smin_a * smin_b)
    d = np.abs(np.where(np.isfinite(d_exact), d_exact, 0.0))
    u_out = 2.0 ** -8 if out_dtype == "bfloat16" else 0.0
    b = coef * (S + 2.0 ** -150 * Z) + nb * 2.0 ** -149 + u_out * d
    b = b + epilogue_adds * 2.0 ** -23 * d
    if out_dtype == "bfloat16":
        b = b + np.where(d < 2.0 ** -126, 2.0 ** -133, 0.0)
    return b


def _out_name(d):
    n = np.asarray(d).dtype.name
    if n not in ("float32", "bfloat16"):
        raise TypeError(f"out: dtype {n}, expected float32 or bfloat16 (xte's GEMM outputs)")
    return n


def _judge(name, got, exp, S, K, kb, V, mode, smin, epi, rows_mask, classes, examples, stats,
           calc_diff_max, family="gemm"):
    """Compare got with exp on the rows that count; fill classes / examples / stats."""
    from ..testing import calc_diff
    od = got.dtype.name
    g = got.astype(np.float64)
    e = exp.astype(np.float64)
    if np.ndim(K):  # per group (K-grouped): one K per output
        K = np.broadcast_to(K, got.shape)
    if rows_mask is not None:
        g, e, S_, V_ = g[rows_mask], e[rows_mask], S[rows_mask], V[rows_mask]
        if np.ndim(K):
            K = K[rows_mask]
    else:
        S_, V_ = S, V
    bnd = fast_bound(S_, K, kb, od, e, smin[0], smin[1], epi)
    gn, en = np.isnan(g), np.isnan(e)
    fin = np.isfinite(g) & np.isfinite(e)
    with np.errstate(invalid="ignore"):
        err = np.where(fin, np.abs(g - e), 0.0)
        ratio = np.where(fin, err / np.where(bnd > 0, bnd, np.inf), 0.0)
    ratio = np.where(fin & (err > 0) & (bnd == 0), np.inf, ratio)
    ul = np.where(fin, C.ulps_between(g, e, od), 0.0)
    nan_extra = gn & ~en
    nan_missing = en & ~gn
    inf_bad = ~fin & ~gn & ~en & (g != e)
    ub = np.uint16 if od == "bfloat16" else np.uint32
    gb = np.ascontiguousarray(got).view(ub)
    eb = np.ascontiguousarray(exp).view(ub)
    if rows_mask is not None:
        gb, eb = gb[rows_mask], eb[rows_mask]
    same = gb == eb
    beyond = fin & (ratio > 1.0)
    C.count(classes, "NaN where the exact result is finite", int(nan_extra.sum()))
    C.count(classes, "finite where the exact result is NaN", int(nan_missing.sum()))
    C.count(classes, "inf mismatch", int(inf_bad.sum()))
    C.count(classes, "beyond the FAST bound", int(beyond.sum()))
    C.count(classes, "within the FAST bound, not bit-identical",
            int((fin & ~beyond & ~same).sum()))
    C.count(classes, "NaN bits differ", int((gn & en & ~same).sum()))
    bad = nan_extra | nan_missing | inf_bad | (beyond if mode == "fast" else ~same)
    order = np.argsort(-np.where(bad, ratio + 1.0, -1.0), axis=None)[:_MAX_EXAMPLES]
    for f in order:
        i = np.unravel_index(f, g.shape)
        if not bad[i]:
            break
        examples.append({"index": C.idx(i), "exact": float(e[i]), "got": float(g[i]),
                         "error_in_bounds": float(ratio[i]), "ulps": float(ul[i])})
    fv = np.isfinite(V_) & np.isfinite(g)
    cd = calc_diff(g[fv], V_[fv]) if fv.any() and np.any(V_[fv] != 0) else 0.0
    stats.update({"outputs": int(g.size), "bit_identical": int(same.sum()),
                  "max_error_in_bounds": float(ratio.max()) if ratio.size else 0.0,
                  "max_ulps": float(ul.max()) if ul.size else 0.0,
                  "beyond_bound": int(beyond.sum()), "calc_diff": float(cd), "mode": mode})
    if calc_diff_max is not None and cd > calc_diff_max:
        C.count(classes, "calc_diff above the limit")
        bad_cd = True
    else:
        bad_cd = False
    ok = not bad.any() and not bad_cd
    if ok:
        why = (f"{same.sum()} of {g.size} bit-identical to EXACT" if mode == "exact" else
               f"within the FAST bound (max {stats['max_error_in_bounds']:.3g} of it, "
               f"{stats['max_ulps']:.3g} ulps, {same.sum()} of {g.size} bit-identical), "
               f"calc_diff {cd:.3g}")
    else:
        parts = [f"{c} {k}" for k, c in classes.items() if k != "within the FAST bound, not "
                 "bit-identical" or mode == "exact"]
        why = (f"{int(bad.sum())} of {g.size} outputs fail: " + ", ".join(parts) +
               f" (max {stats['max_error_in_bounds']:.3g} bounds, "
               f"{stats['max_ulps']:.3g} ulps, calc_diff {cd:.3g})")
    return Verdict(name, family, ok, why, classes, stats, examples)


def _epilogue(c, bias):
    return (c is not None) + (bias is not None)


def _exact_product(Ar, Br, c, bias):
    V = Ar @ Br.T
    if c is not None:
        V = V + np.asarray(c).astype(np.float64)
    if bias is not None:
        V = V + np.asarray(bias).astype(np.float64)[None, :]
    return V


def check_gemm(a, b, out, *, trans_a=False, trans_b=True, c=None, bias=None, mode="fast",
               block_a=None, block_b=None, recipe_a=None, recipe_b=None, layout_a=None,
               layout_b=None, calc_diff_max=None, name="out", report=None):
    """Judge D = op(a) @ op(b) (+ c) (+ bias) that another library computed (DeepGEMM,
    torch._scaled_mm, cuBLASLt, ...). a, b: xte.QuantizedTensor or (fp8 data, scales) pairs as
    xte.gemm takes them (op(b) = b^T with trans_b, the default: b is the weight [N, K]); a
    pair's scales are described by block_* ('1x128', '128x128', '1x32', 'per_tensor'),
    recipe_* (default 'deepgemm', 'mx_te' for E8M0 scales) and layout_* ('compact' default).
    out: the producer's output, fp32 or bf16 [M, N]. mode: 'fast' (within the FAST bound) or
    'exact' (xte's bytes). calc_diff_max: an optional limit on DeepGEMM's calc_diff against the
    fp64 product. Returns a Report with one verdict."""
    import xte
    rep = report if report is not None else Report()
    qa = _host_q(a, "a", rep.notes, block_a, recipe_a, layout_a)
    qb = _host_q(b, "b", rep.notes, block_b, recipe_b, layout_b)
    got = to_host(out, name, rep.notes)
    c = to_host(c, "c", rep.notes)
    bias = to_host(bias, "bias", rep.notes)
    od = _out_name(got)
    exp = xte.gemm(qa, qb, trans_a=trans_a, trans_b=trans_b, c=c, bias=bias, mode="exact",
                   out_dtype=od)
    exp = np.asarray(exp)
    Ar = _rows_along_k(qa, bool(trans_a))
    Br = _rows_along_k(qb, not bool(trans_b))
    K = Ar.shape[1]
    S = np.abs(Ar) @ np.abs(Br).T
    V = _exact_product(Ar, Br, c, bias)
    rep.claim.setdefault("gemm", []).append(
        {"tensor": name, "a": _mode(qa), "b": _mode(qb), "mode": mode, "out_dtype": od,
         "shape": [int(Ar.shape[0]), int(Br.shape[0]), int(K)]})
    if tuple(got.shape) != tuple(exp.shape):
        rep.verdicts.append(Verdict(name, "gemm", False, f"shape {list(got.shape)}, expected "
                                    f"{list(exp.shape)}", {"shape": 1}))
        return rep
    classes, examples, stats = {}, [], {}
    rep.verdicts.append(_judge(name, got, exp, S, K, _kb(qa), V, mode,
                               (_scale_min(qa), _scale_min(qb)), _epilogue(c, bias), None,
                               classes, examples, stats, calc_diff_max))
    return rep


def _grouped_b(qb, G, trans_b):
    """Each group's op(B) rows [N, K] in fp64 from B [G, N, K] (trans_b) or [G, K, N]."""
    import xte
    bd, bs = np.asarray(qb.data), np.asarray(qb.scale_inv)
    if "128x128" in _mode(qb) or "per_tensor" in _mode(qb) or C.layout_name(
            getattr(qb.layout, "name", qb.layout)) == "compact":
        # the scales describe the [G * rows, cols] tensor (128x128 tiles may span groups)
        sf = xte.as_quantized(bd.reshape(-1, bd.shape[-1]), bs.reshape(-1, bs.shape[-1]),
                              recipe=qb.recipe, block=qb.scaling_mode, layout=qb.layout)
        flat = np.asarray(xte.dequantize(sf), np.float64).reshape(bd.shape)
        return [flat[g] if trans_b else flat[g].T for g in range(G)]
    out = []
    for g in range(G):
        sg = xte.as_quantized(bd[g], bs[g], recipe=qb.recipe, block=qb.scaling_mode,
                              layout=qb.layout)
        v = np.asarray(xte.dequantize(sg), np.float64)
        out.append(v if trans_b else v.T)
    return out


def check_gemm_grouped(a, b, out, *, kind="contiguous", group_sizes=None, masked_m=None,
                       alignment=0, trans_a=False, trans_b=True, c=None, bias=None,
                       mode="fast", block_a=None, block_b=None, recipe_a=None, recipe_b=None,
                       layout_a=None, layout_b=None, out_before=None, padding=None,
                       calc_diff_max=None, name="out", report=None):
    """Judge a grouped GEMM (MoE experts) as xte.gemm_grouped defines it: kind 'contiguous'
    (a [rows, K], groups of group_sizes rows each padded to `alignment`; DeepGEMM's
    m_grouped_fp8_gemm_nt_contiguous), 'masked' (a [G, m_max, K], masked_m valid rows) or 'k'
    (K split in group_sizes segments, out [G, M, N]; op(a) [M, sum K], op(b) [N, sum K] with
    trans_a / trans_b as xte.gemm_grouped: the bound takes each group's own K). b: [G, N, K]
    (trans_b, the default) for contiguous / masked.
    Padding rows (past a group's rows): with out_before (the buffer before the call) a changed
    padding row fails ('padding rows written': the contract never writes them); padding='zero'
    claims they are zero. Otherwise their content is reported only. Other arguments as
    check_gemm. Returns a Report with the verdict of the valid rows and of the padding rows."""
    import xte
    rep = report if report is not None else Report()
    qa = _host_q(a, "a", rep.notes, block_a, recipe_a, layout_a)
    qb = _host_q(b, "b", rep.notes, block_b, recipe_b, layout_b)
    got = to_host(out, name, rep.notes)
    before = to_host(out_before, "out_before", rep.notes)
    c = to_host(c, "c", rep.notes)
    bias = to_host(bias, "bias", rep.notes)
    masked_m = to_host(masked_m, "masked_m", rep.notes)
    od = _out_name(got)
    sizes = None if group_sizes is None else [int(s) for s in np.asarray(
        to_host(group_sizes, "group_sizes", rep.notes)).reshape(-1)]
    exp = np.zeros(got.shape, got.dtype) if before is None else before.copy()
    exp = xte.gemm_grouped(qa, qb, exp, kind=kind, group_sizes=sizes,
                           masked_m=None if masked_m is None else
                           np.asarray(masked_m, np.int32), alignment=alignment,
                           trans_a=trans_a, trans_b=trans_b, c=c, bias=bias, mode="exact")
    exp = np.asarray(exp)
    S = np.zeros(got.shape, np.float64)
    V = np.zeros(got.shape, np.float64)
    valid = np.zeros(got.shape[:-1], bool)
    if kind == "k":
        # op(a) [M, sum K], op(b) [N, sum K]; each group's bound takes its own K
        Ar = _rows_along_k(qa, bool(trans_a))
        Br = _rows_along_k(qb, not bool(trans_b))
        G = len(sizes)
        Kmax = np.zeros((G, 1, 1), np.int64)
        k0 = 0
        for g, kk in enumerate(sizes):
            seg = slice(k0, k0 + kk)
            S[g] = np.abs(Ar[:, seg]) @ np.abs(Br[:, seg]).T
            V[g] = _exact_product(Ar[:, seg], Br[:, seg], None if c is None else c[g], bias)
            valid[g] = True
            Kmax[g] = kk
            k0 += kk
    else:
        A = np.asarray(xte.dequantize(qa), np.float64)
        Kmax = A.shape[-1]
        G = np.asarray(qb.data).shape[0]
        Bg = _grouped_b(qb, G, trans_b)
    if kind == "contiguous":
        off = 0
        al = max(1, int(alignment))
        for g, m in enumerate(sizes):
            r = slice(off, off + m)
            S[r] = np.abs(A[r]) @ np.abs(Bg[g]).T
            V[r] = _exact_product(A[r], Bg[g], None if c is None else c[r], bias)
            valid[r] = True
            off += -(-m // al) * al
    elif kind == "masked":
        for g in range(G):
            m = int(masked_m[g])
            S[g, :m] = np.abs(A[g, :m]) @ np.abs(Bg[g]).T
            V[g, :m] = _exact_product(A[g, :m], Bg[g], None if c is None else c[g, :m], bias)
            valid[g, :m] = True
    elif kind != "k":
        raise ValueError(f"kind: {kind!r}")
    rep.claim.setdefault("gemm_grouped", []).append(
        {"tensor": name, "kind": kind, "groups": G, "mode": mode, "out_dtype": od})
    if tuple(got.shape) != tuple(exp.shape):
        rep.verdicts.append(Verdict(name, "gemm", False, f"shape {list(got.shape)}, expected "
                                    f"{list(exp.shape)}", {"shape": 1}))
        return rep
    classes, examples, stats = {}, [], {}
    rep.verdicts.append(_judge(name, got, exp, S, Kmax, _kb(qa), V, mode,
                               (_scale_min(qa), _scale_min(qb)), _epilogue(c, bias), valid,
                               classes, examples, stats, calc_diff_max))
    # padding rows
    pad = ~valid
    npad = int(pad.sum())
    pcls, pst = {}, {"padding_rows": npad}
    gv = np.ascontiguousarray(got).view(np.uint16 if od == "bfloat16" else np.uint32)
    nonzero = np.any(gv[pad] != 0, axis=-1) if npad else np.zeros(0, bool)
    pst["nonzero_rows"] = int(nonzero.sum())
    ok = True
    if before is not None and npad:
        bv = np.ascontiguousarray(before).view(gv.dtype)
        written = np.any(gv[pad] != bv[pad], axis=-1)
        pst["written_rows"] = int(written.sum())
        C.count(pcls, "padding rows written", int(written.sum()))
        ok = not written.any()
        why = (f"{npad} padding rows untouched" if ok else
               f"{int(written.sum())} of {npad} padding rows written (the contract never "
               "writes them)")
    elif padding == "zero" and npad:
        C.count(pcls, "padding rows not zero", int(nonzero.sum()))
        ok = not nonzero.any()
        why = (f"{npad} padding rows zero" if ok else
               f"{int(nonzero.sum())} of {npad} padding rows not zero")
    else:
        why = (f"{npad} padding rows, {int(nonzero.sum())} not zero (pass out_before to tell "
               "whether they were written)" if npad else "no padding rows")
    rep.verdicts.append(Verdict(name + ".padding_rows", "gemm", ok, why, pcls, pst))
    return rep
