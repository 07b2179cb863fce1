"""Attention checks: another library's attention forward / backward against fp64 and against
FlashAttention's accuracy criterion (docs/numerics.md section 7).

For each tensor given (out, lse, dq, dk, dv) the check computes

- an fp64 oracle from the inputs (full softmax, S x S, no blocking), and the error
  err = max |producer - oracle|;
- the same computation done naively in the input precision (fp32 arithmetic, P and dS rounded to
  the input dtype, outputs rounded to it: FlashAttention's reference with upcast off), and its
  error naive = max |naive - oracle|;
- the criterion err <= 2 naive + atol max(1, max |oracle|), atol = 2^-22 (fp32; 2^-21 with
  softcap), 2^-9 (bf16), 2^-12 (fp16); for the LSE err <= 2 naive + 1e-5. The ratio
  err / naive is reported as FlashAttention states its criterion.

Rows that see no key (masks, windows, empty sequences) are judged apart: the contract gives out 0,
lse -inf and zero gradients there; a NaN, +inf LSE (FlashAttention's convention) or non-zero
output is named. Layouts BSHD, SBHD and THD (cu_seqlens), masks none / causal (top-left) /
causal_bottom_right, sliding windows, GQA, softcap and ALiBi are supported, and the e4m3
forward with descale_q / _k / _v ([batch, h_kv]): its references run on the descaled inputs in
fp32, the naive output rounded to the output dtype, atol 1e-5 (fp32 out) or 2^-8 (bf16 out).
"""

import numpy as np

from ._io import to_host
from ._report import Report, Verdict

__all__ = ["check_attention", "attention_reference"]

_ATOL = {"float32": 2.0 ** -22, "bfloat16": 2.0 ** -9, "float16": 2.0 ** -12}


def _round(x, dtype):
    import ml_dtypes
    if dtype == "float32":
        return np.asarray(x, np.float32)
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    return np.asarray(x, np.float32).astype(dt).astype(np.float32)


def _visible(Lq, Lkv, mask, window):
    off = Lkv - Lq
    i = np.arange(Lq)[:, None]
    j = np.arange(Lkv)[None, :]
    vis = np.ones((Lq, Lkv), bool)
    if mask in ("causal", "padding_causal"):
        vis &= j <= i
    elif mask in ("causal_bottom_right", "padding_causal_bottom_right"):
        vis &= j <= i + off
    wl, wr = window if window is not None else (-1, -1)
    if wl is not None and wl >= 0:
        vis &= j >= i + off - wl
    if wr is not None and wr >= 0:
        vis &= j <= i + off + wr
    return vis


def _one(q, k, v, do, vis, scale, softcap, prec, dtype, alibi=None):
    """Forward (o, lse) and, with do, backward (dq, dk, dv) of one (sequence, query head) in
    fp64 (prec 'fp64') or naively in the input precision (prec 'naive')."""
    f = np.float64 if prec == "fp64" else np.float32
    q, k, v = q.astype(f), k.astype(f), v.astype(f)
    s = (q @ k.T) * f(scale)
    th = None
    if softcap:
        th = np.tanh(s / f(softcap))
        s = th * f(softcap)
    if alibi is not None:  # -|i + off - j| * slope, off = Lkv - Lq
        Lq, Lkv = vis.shape
        dist = np.abs(np.arange(Lq)[:, None] + (Lkv - Lq) - np.arange(Lkv)[None, :])
        s = (s - dist.astype(f) * f(alibi)).astype(f)
    s = np.where(vis, s, -np.inf).astype(f)
    m = np.max(s, axis=1, keepdims=True, initial=-np.inf)  # no keys at all: -inf
    seen = np.isfinite(m[:, 0])
    m = np.where(np.isfinite(m), m, 0).astype(f)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(s - m).astype(f)
    p = np.where(vis, p, 0).astype(f)
    ll = p.sum(axis=1, keepdims=True).astype(f)
    with np.errstate(invalid="ignore", divide="ignore"):
        P = np.where(seen[:, None], p / np.where(ll > 0, ll, 1), 0).astype(f)
        lse = np.where(seen, m[:, 0] + np.log(np.where(ll[:, 0] > 0, ll[:, 0], 1)), -np.inf)
    Pd = P if prec == "fp64" else _round(P, dtype)
    o = (Pd @ v).astype(f)
    o_r = o if prec == "fp64" else _round(o, dtype)
    res = {"out": o_r, "lse": lse.astype(f)}
    if do is None:
        return res
    do = do.astype(f)
    dv = Pd.T @ do
    dp = do @ v.T
    D = np.sum(do * o_r, axis=1, keepdims=True)
    ds = P * (dp - D)
    if softcap:
        ds = ds * (1 - th * th)
    ds = np.where(vis, ds, 0).astype(f)
    dsd = ds if prec == "fp64" else _round(ds, dtype)
    res["dq"] = (dsd @ k) * f(scale)
    res["dk"] = (dsd.T @ q) * f(scale)
    res["dv"] = dv
    res["seen"] = seen
    return res


def _seqs(layout, x, cu):
    """[(start, length)] of the sequences and a function giving [L, h, d] of sequence n."""
    if layout == "thd":
        cu = np.asarray(cu, np.int64)
        return [(int(cu[n]), int(cu[n + 1] - cu[n])) for n in range(len(cu) - 1)]
    b = x.shape[0] if layout == "bshd" else x.shape[1]
    L = x.shape[1] if layout == "bshd" else x.shape[0]
    return [(n, L) for n in range(b)]


def _get(layout, x, seq):
    s, L = seq
    if layout == "thd":
        return x[s:s + L]
    return x[s] if layout == "bshd" else x[:, s]


def _put(layout, out, seq, val):
    s, L = seq
    if layout == "thd":
        out[s:s + L] = val
    elif layout == "bshd":
        out[s] = val
    else:
        out[:, s] = val


def attention_reference(q, k, v, d_out=None, *, layout="bshd", mask="none", window=(-1, -1),
                        softmax_scale=None, softcap=0.0, alibi_slopes=None, cu_seqlens_q=None,
                        cu_seqlens_kv=None, prec="fp64"):
    """{'out', 'lse', ('dq', 'dk', 'dv'), 'seen'} of the full attention in fp64 (prec='fp64')
    or naively in the inputs' precision (prec='naive'). lse as xte lays it out ([b, h, s] for
    BSHD / SBHD, [total, h] for THD); 'seen': [rows..., h] True where a query row sees a key."""
    dtype = np.asarray(q).dtype.name
    dtype = dtype if dtype in _ATOL else "float32"
    f = np.float64 if prec == "fp64" else np.float32
    qf, kf, vf = (np.asarray(t).astype(np.float64) for t in (q, k, v))
    dof = None if d_out is None else np.asarray(d_out).astype(np.float64)
    hq, hk, d = qf.shape[-2], kf.shape[-2], qf.shape[-1]
    G = hq // hk
    scale = softmax_scale if softmax_scale else 1.0 / np.sqrt(np.float32(d))
    scale = float(np.float32(scale))
    sq = _seqs(layout, qf, cu_seqlens_q)
    sk = _seqs(layout, kf, cu_seqlens_kv)
    out = np.zeros(qf.shape[:-1] + (vf.shape[-1],), f)
    seen = np.zeros(qf.shape[:-1], bool)
    lse_rows = np.full(qf.shape[:-1], -np.inf, f)
    grads = None
    if dof is not None:
        grads = {"dq": np.zeros(qf.shape, f), "dk": np.zeros(kf.shape, f),
                 "dv": np.zeros(vf.shape, f)}
    for nq, nk in zip(sq, sk):
        if nq[1] == 0:  # an empty sequence: no rows
            continue
        Q, K, V = _get(layout, qf, nq), _get(layout, kf, nk), _get(layout, vf, nk)
        DO = None if dof is None else _get(layout, dof, nq)
        vis = _visible(nq[1], nk[1], mask, window)
        o_s = np.zeros(Q.shape[:-1] + (V.shape[-1],), f)
        l_s = np.zeros(Q.shape[:-1], f)
        sn = np.zeros(Q.shape[:-1], bool)
        dq_s, dk_s, dv_s = np.zeros(Q.shape, f), np.zeros(K.shape, f), np.zeros(V.shape, f)
        for h in range(hq):
            r = _one(Q[:, h], K[:, h // G], V[:, h // G], None if DO is None else DO[:, h], vis,
                     scale, softcap, prec, dtype,
                     None if alibi_slopes is None else float(np.asarray(alibi_slopes)[h]))
            o_s[:, h], l_s[:, h] = r["out"], r["lse"]
            sn[:, h] = np.isfinite(r["lse"])
            if DO is not None:
                dq_s[:, h] = r["dq"]
                dk_s[:, h // G] += r["dk"]
                dv_s[:, h // G] += r["dv"]
        _put(layout, out, nq, o_s)
        _put(layout, lse_rows, nq, l_s)
        _put(layout, seen, nq, sn)
        if grads is not None:
            _put(layout, grads["dq"], nq, dq_s)
            _put(layout, grads["dk"], nk, dk_s)
            _put(layout, grads["dv"], nk, dv_s)
    if layout == "bshd":
        lse = np.transpose(lse_rows, (0, 2, 1))
    elif layout == "sbhd":
        lse = np.transpose(lse_rows, (1, 2, 0))
    else:
        lse = lse_rows
    res = {"out": out, "lse": lse, "seen": seen}
    if grads is not None:
        if prec != "fp64":
            grads = {k2: _round(v2, dtype) for k2, v2 in grads.items()}
        res.update(grads)
    return res


def _seen_lse_layout(layout, seen):
    if layout == "bshd":
        return np.transpose(seen, (0, 2, 1))
    if layout == "sbhd":
        return np.transpose(seen, (1, 2, 0))
    return seen


def _descaled(x, desc, layout, cu, G):
    """e4m3 codes times their descale factor [batch, h_kv] (head h uses h // G), in fp32."""
    v = np.asarray(x).astype(np.float32)
    d = np.asarray(desc, np.float32)
    if d.ndim == 1:
        d = d.reshape(-1, v.shape[-2] // G)
    h = np.arange(v.shape[-2]) // G
    if layout == "bshd":
        return (v * d[:, h][:, None, :, None]).astype(np.float32)
    if layout == "sbhd":
        return (v * d[:, h][None, :, :, None]).astype(np.float32)
    out = v.copy()
    cu = np.asarray(cu, np.int64)
    for n in range(len(cu) - 1):
        out[cu[n]:cu[n + 1]] = v[cu[n]:cu[n + 1]] * d[n, h][None, :, None]
    return out.astype(np.float32)


def check_attention(q, k, v, out=None, lse=None, *, d_out=None, dq=None, dk=None, dv=None,
                    layout="bshd", mask="none", window=(-1, -1), softmax_scale=None, softcap=0.0,
                    alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_kv=None, descale_q=None,
                    descale_k=None, descale_v=None, name="", report=None):
    """Judge attention outputs (forward: out [.., h_q, d_v], lse as xte lays it out; backward:
    dq, dk, dv with d_out) that another library produced from q, k, v (fp32 / bf16 / fp16) with
    the given options (those of xte.attention_fwd). Each tensor given gets a verdict by
    FlashAttention's criterion against fp64 (see the module text); out / lse / dq also get
    the rows that see no key checked. Returns a Report."""
    rep = report if report is not None else Report()
    n = rep.notes
    q, k, v = to_host(q, "q", n), to_host(k, "k", n), to_host(v, "v", n)
    d_out = to_host(d_out, "d_out", n)
    given = {"out": to_host(out, "out", n), "lse": to_host(lse, "lse", n),
             "dq": to_host(dq, "dq", n), "dk": to_host(dk, "dk", n), "dv": to_host(dv, "dv", n)}
    cu_q = to_host(cu_seqlens_q, "cu_seqlens_q", n)
    cu_k = to_host(cu_seqlens_kv, "cu_seqlens_kv", n)
    layout = str(layout).lower()
    dtype = q.dtype.name
    fp8_out = None
    if dtype == "float8_e4m3fn":
        # FP8 forward (docs/numerics.md section 7): the references run on the descaled inputs
        # in fp32; the naive output is rounded to the output's dtype
        if any(given[t] is not None for t in ("dq", "dk", "dv")):
            raise ValueError("dq / dk / dv: the e4m3 attention has no backward")
        G = q.shape[-2] // k.shape[-2]
        ones = np.ones((1, 1), np.float32)
        q, k, v = (_descaled(t, ones if dsc is None else to_host(dsc, nm, n), layout, cu_q, g)
                   for t, dsc, nm, g in ((q, descale_q, "descale_q", G),
                                         (k, descale_k, "descale_k", 1),
                                         (v, descale_v, "descale_v", 1)))
        fp8_out = given["out"].dtype.name if given["out"] is not None else "bfloat16"
        dtype = "float32"
    if dtype not in _ATOL:
        raise TypeError(f"q: dtype {dtype}, expected float32 / bfloat16 / float16 / e4m3")
    need_bwd = any(given[t] is not None for t in ("dq", "dk", "dv"))
    if need_bwd and d_out is None:
        raise ValueError("d_out: needed to judge dq / dk / dv")
    kw = dict(layout=layout, mask=mask, window=window, softmax_scale=softmax_scale,
              softcap=softcap, alibi_slopes=to_host(alibi_slopes, "alibi_slopes", n),
              cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k)
    ref = attention_reference(q, k, v, d_out if need_bwd else None, prec="fp64", **kw)
    nai = attention_reference(q, k, v, d_out if need_bwd else None, prec="naive", **kw)
    rep.claim.setdefault("attention", []).append(
        {"layout": layout, "mask": mask, "window": list(window) if window else None,
         "softcap": softcap, "dtype": dtype, "backward": need_bwd})
    atol = _ATOL[dtype] * (2.0 if softcap and dtype == "float32" else 1.0)
    if fp8_out is not None:
        atol = 1e-5 if fp8_out == "float32" else 2.0 ** -8
        nai["out"] = _round(nai["out"], fp8_out if fp8_out in _ATOL else "float32")
    seen_rows = ref["seen"]
    pre = f"{name}." if name else ""
    for t in ("out", "lse", "dq", "dk", "dv"):
        g = given[t]
        if g is None:
            continue
        o = ref[t]
        nv = np.asarray(nai[t], np.float64)
        gv = np.asarray(g).astype(np.float64)
        if gv.shape != o.shape:
            rep.verdicts.append(Verdict(pre + t, "attention", False, f"shape {list(gv.shape)}, "
                                        f"expected {list(o.shape)}", {"shape": 1}))
            continue
        classes, examples = {}, []
        if t in ("out", "dq"):
            keymask = np.broadcast_to(seen_rows[..., None], o.shape)
        elif t == "lse":
            keymask = _seen_lse_layout(layout, seen_rows)
        else:
            keymask = np.ones(o.shape, bool)
        judged = keymask
        nokey_bad = 0
        if (~keymask).any():
            gn = gv[~keymask]
            if t == "lse":
                bad_pos = gn == np.inf
                bad_nan = np.isnan(gn)
                bad_other = ~(gn == -np.inf) & ~bad_pos & ~bad_nan
                if bad_pos.any():
                    classes["no-key rows: lse +inf (FlashAttention's convention; contract -inf)"] \
                        = int(bad_pos.sum())
                if bad_nan.any():
                    classes["no-key rows: lse NaN"] = int(bad_nan.sum())
                if bad_other.any():
                    classes["no-key rows: lse finite"] = int(bad_other.sum())
                nokey_bad = int(bad_pos.sum() + bad_nan.sum() + bad_other.sum())
            else:
                bad_nan = np.isnan(gn)
                bad_nz = ~bad_nan & (gn != 0)
                if bad_nan.any():
                    classes[f"no-key rows: {t} NaN (contract 0)"] = int(bad_nan.sum())
                if bad_nz.any():
                    classes[f"no-key rows: {t} not zero"] = int(bad_nz.sum())
                nokey_bad = int(bad_nan.sum() + bad_nz.sum())
        oj, gj, nj = o[judged], gv[judged], nv[judged]
        nan_bad = int(np.sum(np.isnan(gj) != np.isnan(oj)))
        if nan_bad:
            classes["NaN where fp64 is finite (or the reverse)"] = nan_bad
        fin = np.isfinite(oj) & np.isfinite(gj)
        err = float(np.max(np.abs(gj[fin] - oj[fin]))) if fin.any() else 0.0
        nfin = np.isfinite(oj) & np.isfinite(nj)
        naive = float(np.max(np.abs(nj[nfin] - oj[nfin]))) if nfin.any() else 0.0
        scale_o = max(1.0, float(np.max(np.abs(oj[fin])))) if fin.any() else 1.0
        limit = 2 * naive + (1e-5 if t == "lse" else atol * scale_o)
        ratio = err / naive if naive > 0 else (0.0 if err == 0 else np.inf)
        within = err <= limit
        if not within:
            classes["beyond 2x the naive error (FlashAttention's criterion)"] = 1
            d = np.where(fin, np.abs(gj - oj), -1)
            i = int(np.argmax(d))
            where = np.argwhere(judged)[i]
            examples.append({"index": [int(x) for x in where], "fp64": float(oj[i]),
                             "got": float(gj[i]), "naive": float(nj[i]),
                             "error": float(d[i])})
        ok = within and nan_bad == 0 and nokey_bad == 0
        stats = {"max_error": err, "naive_error": naive, "ratio_to_naive": ratio,
                 "limit": limit, "atol": 1e-5 if t == "lse" else atol * scale_o,
                 "no_key_rows": int((~keymask).sum()), "elements": int(o.size)}
        if ok:
            why = (f"max error {err:.3g} vs fp64, {ratio:.3g}x the naive {dtype} computation's "
                   f"(limit 2x + atol: {limit:.3g})")
        else:
            parts = [f"{k2} ({c})" for k2, c in classes.items()]
            why = (f"max error {err:.3g} vs fp64 is {ratio:.3g}x the naive {dtype} "
                   f"computation's {naive:.3g} (limit {limit:.3g}); " + ", ".join(parts))
        rep.verdicts.append(Verdict(pre + t, "attention", ok, why, classes, stats, examples))
    return rep
