"""MoE checks: router selection and probabilities, aux loss, permutation bytes.

check_router recomputes TransformerEngine's fused router with xte (docs/numerics.md section 8:
rank order value descending then expert index ascending; group-limited top-k) and classifies each
token whose selected experts differ:

- 'tie order': the experts swapped have equal fp32 selection keys; the producer broke the tie
  another way ('tie broken toward the higher expert index' when it chose the higher indices);
- 'key rounding (fp64 keys side with the producer)' / '(... with xte)': the fp32 keys differ by a
  few ulps and the exact (fp64) keys decide; these pass with allow_key_rounding=True;
- 'group tie order' / 'group key rounding': the same for the groups of group-limited routing;
- 'wrong selection': anything else.
Probabilities of tokens selected alike are compared in ulps (prob_ulps: the tolerance, default 0,
the contract's bytes). check_aux_loss compares the aux loss in ulps and against fp64;
check_router_backward compares grad_logits in ulps of xte's and against the fp64 gradient;
check_permute compares the permuted rows byte for byte ('row order' when the rows are there but
elsewhere, 'padding rows not zero', 'row bytes differ'); check_unpermute compares the combined
output in ulps of xte's and reports its error against the fp64 sum.
"""

import numpy as np

from . import _common as C
from ._io import to_host
from ._report import Report, Verdict

__all__ = ["check_router", "check_router_backward", "check_aux_loss", "check_permute",
           "check_unpermute"]

_MAX_EXAMPLES = 5


def _scores64(logits, score_function, use_pre_softmax):
    x = np.asarray(logits).astype(np.float64)
    if score_function == "softmax":
        if not use_pre_softmax:
            return x
        m = np.max(x, axis=1, keepdims=True)
        e = np.exp(x - m)
        return e / e.sum(axis=1, keepdims=True)
    if score_function == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if score_function == "sqrtsoftplus":
        return np.sqrt(np.logaddexp(0.0, x))
    raise ValueError(f"score_function: {score_function!r}")


def _sets(routing_map, topk_idx, probs, T, E):
    if routing_map is not None:
        m = np.asarray(routing_map)
        if m.shape == (T, (E + 7) // 8) and m.dtype == np.uint8 and E != m.shape[1]:
            m = np.unpackbits(m, axis=1, bitorder="little")[:, :E]
        return [set(np.nonzero(m[t])[0].tolist()) for t in range(T)]
    if topk_idx is not None:
        ti = np.asarray(topk_idx)
        return [set(int(e) for e in ti[t] if e >= 0) for t in range(T)]
    p = np.asarray(probs)
    return [set(np.nonzero(p[t])[0].tolist()) for t in range(T)]


def _group_scores(key, E, num_groups, group_topk, topk, f32):
    """Group scores as xte forms them: the sum of each group's top (topk / group_topk) keys in
    rank order from +0 (fp32 adds for the fp32 keys; fp64 for the fp64 keys)."""
    per = E // num_groups
    n = topk // group_topk
    dt = np.float32 if f32 else np.float64
    sc = np.zeros(num_groups, dt)
    for g in range(num_groups):
        ks = np.asarray(key[g * per:(g + 1) * per], dt)
        order = sorted(range(per), key=lambda i: (-ks[i], i))[:n]
        acc = dt(0)
        for i in order:
            acc = dt(acc + ks[i])
        sc[g] = acc
    return sc


def _classify_token(sx, sp, k32, k64, groups, E):
    only_x, only_p = sorted(sx - sp), sorted(sp - sx)
    if groups is not None:
        num_groups, group_topk, topk = groups
        per = E // num_groups
        gx = {e // per for e in sx}
        gp = {e // per for e in sp}
        if gx != gp:
            s32 = _group_scores(k32, E, num_groups, group_topk, topk, True)
            s64 = _group_scores(k64, E, num_groups, group_topk, topk, False)
            ox, op = sorted(gx - gp), sorted(gp - gx)
            if len(ox) != len(op):
                return "wrong group selection"
            if np.array_equal(np.sort(s32[ox]), np.sort(s32[op])):
                return "group tie order"
            if min(s64[op]) > max(s64[ox]):
                return "group key rounding (fp64 keys side with the producer)"
            rel = np.max(np.abs(np.sort(s32[ox]) - np.sort(s32[op]))) / max(
                float(np.max(np.abs(s32[ox]))), 1e-30)
            if rel <= 2.0 ** -18:
                return "group key rounding (fp64 keys side with xte)"
            return "wrong group selection"
    if len(only_x) != len(only_p):
        return "wrong selection (a different number of experts)"
    kx, kp = k32[only_x], k32[only_p]
    if np.array_equal(np.sort(kx), np.sort(kp)):
        if min(only_p) > max(only_x):
            return "tie broken toward the higher expert index"
        return "tie order"
    if np.min(k64[only_p]) > np.max(k64[only_x]):
        return "key rounding (fp64 keys side with the producer)"
    rel = np.max(np.abs(np.sort(kx) - np.sort(kp))) / max(np.max(np.abs(kx)), 1e-30)
    if rel <= 2.0 ** -18:
        return "key rounding (fp64 keys side with xte)"
    return "wrong selection"


def check_router(logits, probs=None, routing_map=None, topk_idx=None, *, topk,
                 score_function="softmax", use_pre_softmax=False, num_groups=None,
                 group_topk=None, scaling_factor=None, expert_bias=None, prob_ulps=0,
                 allow_key_rounding=False, report=None):
    """Judge a router's output (TransformerEngine's fused_topk_with_score_function semantics):
    probs [T, E] and the selection (routing_map bool / bytes [T, E] or bits, or topk_idx
    [T, k]; without either, the non-zero probs) computed by another library from logits [T, E].
    Returns a Report with verdicts 'selection' and (with probs) 'probs'."""
    import xte
    rep = report if report is not None else Report()
    n = rep.notes
    logits = to_host(logits, "logits", n)
    probs = to_host(probs, "probs", n)
    routing_map = to_host(routing_map, "routing_map", n)
    topk_idx = to_host(topk_idx, "topk_idx", n)
    bias = to_host(expert_bias, "expert_bias", n)
    T, E = logits.shape
    px, mx, saved = xte.fused_topk_with_score_function(
        logits, topk, use_pre_softmax=use_pre_softmax, num_groups=num_groups,
        group_topk=group_topk, scaling_factor=scaling_factor, score_function=score_function,
        expert_bias=bias, return_intermediate=True)
    px, mx, saved = np.asarray(px), np.asarray(mx).astype(bool), np.asarray(saved)
    rep.claim.setdefault("router", []).append(
        {"topk": topk, "score_function": score_function, "use_pre_softmax": use_pre_softmax,
         "num_groups": num_groups, "group_topk": group_topk, "scaling_factor": scaling_factor,
         "expert_bias": bias is not None})
    if score_function == "softmax" and not use_pre_softmax:
        k32 = np.asarray(logits).astype(np.float32)
    else:
        k32 = saved.astype(np.float32)
    k64 = _scores64(logits, score_function, use_pre_softmax)
    if bias is not None:
        k32 = (k32 + np.asarray(bias, np.float32)[None, :]).astype(np.float32)
        k64 = k64 + np.asarray(bias, np.float64)[None, :]
    sx = [set(np.nonzero(mx[t])[0].tolist()) for t in range(T)]
    sp = _sets(routing_map, topk_idx, probs, T, E)
    groups = (num_groups, group_topk, topk) if num_groups and num_groups > 1 else None
    classes, examples = {}, []
    same = np.ones(T, bool)
    for t in range(T):
        if sx[t] == sp[t]:
            continue
        same[t] = False
        cls = _classify_token(sx[t], sp[t], k32[t], k64[t], groups, E)
        C.count(classes, cls)
        if len(examples) < _MAX_EXAMPLES:
            ox, op = sorted(sx[t] - sp[t]), sorted(sp[t] - sx[t])
            examples.append({"token": t, "class": cls, "expected_only": ox, "got_only": op,
                             "keys_fp32": [float(k32[t, e]) for e in ox + op],
                             "keys_fp64": [float(k64[t, e]) for e in ox + op]})
    tolerated = {k for k in classes if k.startswith(("key rounding", "group key rounding"))} \
        if allow_key_rounding else set()
    nbad = sum(c for k, c in classes.items() if k not in tolerated)
    ok = nbad == 0
    ndiff = int((~same).sum())
    why = (f"{T} tokens select the same experts" if ndiff == 0 else
           f"{ndiff} of {T} tokens select other experts: " +
           ", ".join(f"{k} ({c})" for k, c in classes.items()))
    if ok and ndiff:
        why += " (tolerated: allow_key_rounding)"
    rep.verdicts.append(Verdict("selection", "router", ok, why, classes,
                                {"tokens": T, "differing_tokens": ndiff}, examples))
    if probs is not None:
        p = np.asarray(probs).astype(np.float32)
        pc, pex = {}, []
        sel = mx & same[:, None]
        ul = C.ulps_between(p[sel], px[sel], "float32")
        mxu = float(np.max(ul)) if ul.size else 0.0
        outside = (~mx & same[:, None]) & (p != 0)
        C.count(pc, f"probs beyond {prob_ulps} ulps", int(np.sum(ul > prob_ulps)))
        C.count(pc, "non-zero probs outside the selection", int(outside.sum()))
        if np.sum(ul > prob_ulps):
            w = np.argwhere(sel)[np.argsort(-ul)[:_MAX_EXAMPLES]]
            for t, e in w:
                if C.ulps_between(p[t, e], px[t, e])[()] <= prob_ulps:
                    break
                pex.append({"token": int(t), "expert": int(e), "expected": float(px[t, e]),
                            "got": float(p[t, e]),
                            "ulps": float(C.ulps_between(p[t, e], px[t, e]))})
        pok = not pc
        pwhy = (f"max {mxu:.3g} ulps on the {int(sel.sum())} selected probs of tokens selected "
                f"alike (tolerance {prob_ulps})")
        if not pok:
            pwhy = ", ".join(f"{k} ({c})" for k, c in pc.items()) + "; " + pwhy
        rep.verdicts.append(Verdict("probs", "router", pok, pwhy, pc,
                                    {"max_ulps": mxu, "prob_ulps": prob_ulps}, pex))
    return rep


def check_aux_loss(probs, tokens_per_expert, total_num_tokens, num_experts, topk, coeff, aux,
                   *, ulps=0, report=None):
    """Judge an aux loss value (TE's fused_moe_aux_loss) against xte's (ulps, tolerance
    `ulps`, default 0) and report its distance to the fp64 value."""
    import xte
    rep = report if report is not None else Report()
    probs = to_host(probs, "probs", rep.notes)
    tpe = to_host(tokens_per_expert, "tokens_per_expert", rep.notes)
    aux = float(np.asarray(to_host(aux, "aux", rep.notes)).reshape(-1)[0])
    exp = float(np.asarray(xte.fused_moe_aux_loss(probs, tpe, total_num_tokens, num_experts,
                                                  topk, coeff)).reshape(-1)[0])
    v64 = float(np.sum(np.asarray(probs, np.float64).sum(axis=0) * np.asarray(tpe, np.float64))
                * num_experts * coeff / (topk * float(total_num_tokens) ** 2))
    u = float(C.ulps_between(np.float32(aux), np.float32(exp))[()])
    u64 = float(C.ulps_between(np.float32(aux), v64)[()])
    ok = u <= ulps
    why = f"{u:.3g} ulps from xte ({exp:.9g}), {u64:.3g} ulps from fp64 (tolerance {ulps})"
    rep.verdicts.append(Verdict("aux_loss", "aux_loss", ok, why,
                                {} if ok else {f"beyond {ulps} ulps": 1},
                                {"expected": exp, "got": aux, "fp64": v64, "ulps": u}))
    return rep


def check_permute(inp, routing_map, out, *, num_out_tokens=-1, align=1, map_type="mask",
                  num_experts=None, report=None):
    """Judge a permuted tensor (TE's moe_permute: expert-major, tokens ascending within an
    expert; each expert padded to `align` rows with zero rows) byte for byte."""
    import xte
    rep = report if report is not None else Report()
    inp = to_host(inp, "inp", rep.notes)
    rm = to_host(routing_map, "routing_map", rep.notes)
    got = to_host(out, "out", rep.notes)
    if map_type == "mask":
        rm = np.asarray(rm).astype(np.uint8)
    res = xte.moe_permute(inp, rm, num_out_tokens, map_type=map_type, num_experts=num_experts,
                          align=align, return_extras=True)
    exp, extras = np.asarray(res[0]), res[-1]
    r2e = np.asarray(extras["row_to_expert"])
    classes, examples = {}, []
    if got.shape != exp.shape:
        rep.verdicts.append(Verdict("permuted", "permute", False,
                                    f"shape {list(got.shape)}, expected {list(exp.shape)}",
                                    {"shape": 1}))
        return rep
    gb = np.ascontiguousarray(got).view(np.uint8).reshape(got.shape[0], -1)
    eb = np.ascontiguousarray(exp).view(np.uint8).reshape(exp.shape[0], -1)
    rows = {eb[i].tobytes(): i for i in range(eb.shape[0])}
    for i in np.nonzero(np.any(gb != eb, axis=1))[0]:
        if r2e[i] < 0:
            cls = "padding rows not zero"
        elif gb[i].tobytes() in rows:
            cls = "row order (the row belongs elsewhere)"
        else:
            cls = "row bytes differ"
        C.count(classes, cls)
        if len(examples) < _MAX_EXAMPLES:
            ex = {"row": int(i), "class": cls, "expert": int(r2e[i])}
            if cls.startswith("row order"):
                ex["expected_at"] = int(rows[gb[i].tobytes()])
            examples.append(ex)
    nd = sum(classes.values())
    ok = nd == 0
    why = (f"{exp.shape[0]} rows equal" if ok else f"{nd} of {exp.shape[0]} rows differ: " +
           ", ".join(f"{k} ({c})" for k, c in classes.items()))
    rep.verdicts.append(Verdict("permuted", "permute", ok, why, classes,
                                {"rows": int(exp.shape[0]), "differing": nd}, examples))
    return rep


def check_unpermute(expert_out, routing_map, out, merging_probs=None, *, num_out_tokens=-1,
                    align=1, ulps=0, report=None):
    """Judge an unpermuted (combined) output (TE's moe_unpermute): out[t] = sum over t's experts
    (ascending) of probs[t, e] * expert_out[row of (t, e)]. expert_out: the permuted rows
    [rows, H] (expert-major, as moe_permute laid them out with this routing_map [T, E], cap and
    align); merging_probs fp32 [T, E] (None: weight 1). The contract's bytes are an fmaf chain
    over the slots from +0 rounded once; the verdict allows `ulps` (default 0) in the output
    dtype and reports the error against the fp64 sum."""
    import xte
    rep = report if report is not None else Report()
    eo = to_host(expert_out, "expert_out", rep.notes)
    rm = np.asarray(to_host(routing_map, "routing_map", rep.notes)).astype(np.uint8)
    got = to_host(out, "out", rep.notes)
    probs = to_host(merging_probs, "merging_probs", rep.notes)
    T = rm.shape[0]
    dummy = np.zeros((T, 1), np.float32)
    _, rid = xte.moe_permute(dummy, rm, num_out_tokens, align=align)
    exp = np.asarray(xte.moe_unpermute(eo, rid, probs, out_dtype=got.dtype.name))
    rows = np.asarray(rid.row_map)
    e64 = np.asarray(eo).astype(np.float64)
    ref = np.zeros(exp.shape, np.float64)
    for t in range(T):
        experts = np.nonzero(rm[t])[0]
        for j, e in enumerate(experts):
            r = rows[t, j]
            if r >= 0:
                w = 1.0 if probs is None else float(np.asarray(probs)[t, e])
                ref[t] += w * e64[r]
    od = got.dtype.name if got.dtype.name in ("float32", "bfloat16") else "float32"
    if got.shape != exp.shape:
        rep.verdicts.append(Verdict("unpermuted", "unpermute", False,
                                    f"shape {list(got.shape)}, expected {list(exp.shape)}",
                                    {"shape": 1}))
        return rep
    g = got.astype(np.float64)
    ul = C.ulps_between(g, exp.astype(np.float64), od)
    with np.errstate(invalid="ignore"):
        e_fp64 = float(np.nanmax(np.abs(g - ref))) if g.size else 0.0
        e_xte = float(np.nanmax(np.abs(exp.astype(np.float64) - ref))) if g.size else 0.0
    nan_bad = int(np.sum(np.isnan(g) != np.isnan(exp.astype(np.float64))))
    nbad = int(np.sum(ul > ulps)) + nan_bad
    classes, examples = {}, []
    C.count(classes, f"beyond {ulps} ulps of xte", int(np.sum(ul > ulps)))
    C.count(classes, "NaN disagreement", nan_bad)
    for i in np.argsort(-np.nan_to_num(ul, nan=np.inf), axis=None)[:_MAX_EXAMPLES]:
        ij = np.unravel_index(i, ul.shape)
        if not ul[ij] > ulps:
            break
        examples.append({"index": C.idx(ij), "expected": float(exp[ij]), "got": float(g[ij]),
                         "fp64": float(ref[ij]), "ulps": float(ul[ij])})
    ok = nbad == 0
    mx = float(np.nanmax(ul)) if ul.size else 0.0
    why = (f"max {mx:.3g} ulps of xte (tolerance {ulps}); max error vs fp64 {e_fp64:.3g} "
           f"(xte's {e_xte:.3g})")
    if not ok:
        why = f"{nbad} of {g.size} values differ: " + why
    rep.verdicts.append(Verdict("unpermuted", "unpermute", ok, why, classes,
                                {"max_ulps": mx, "error_fp64": e_fp64, "xte_error_fp64": e_xte},
                                examples))
    return rep


def _router_grad64(logits, mask, grad_probs, topk, score_function, use_pre_softmax,
                   scaling_factor):
    """d(sum grad_probs * probs) / d logits in fp64 with the selection held fixed (torch
    autograd), or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    x = torch.tensor(np.asarray(logits, np.float64), requires_grad=True)
    sel = torch.tensor(np.asarray(mask, bool))
    sf = 1.0 if scaling_factor is None else float(scaling_factor)
    if score_function == "softmax":
        if use_pre_softmax:
            w = torch.softmax(x, dim=1)
        else:
            w = torch.softmax(x.masked_fill(~sel, float("-inf")), dim=1)
    else:
        s = torch.sigmoid(x) if score_function == "sigmoid" else torch.sqrt(
            torch.nn.functional.softplus(x))
        if topk > 1:
            w = s / ((s * sel).sum(dim=1, keepdim=True) + 1e-20)
        else:
            w = s
    probs = torch.where(sel, sf * w, torch.zeros_like(w))
    (probs * torch.tensor(np.asarray(grad_probs, np.float64))).sum().backward()
    return x.grad.numpy()


def check_router_backward(logits, grad_probs, grad_logits, *, topk, score_function="softmax",
                          use_pre_softmax=False, num_groups=None, group_topk=None,
                          scaling_factor=None, expert_bias=None, ulps=0, report=None):
    """Judge a router backward (TE's fused_topk_with_score_function backward): grad_logits
    [T, E] from grad_probs [T, E] and the forward's selection on logits. Compared in ulps of
    xte's (docs/numerics.md section 8; tolerance `ulps`, default 0: the contract's bytes) at the
    output dtype; the error against the fp64 gradient (selection held fixed) is reported."""
    import xte
    rep = report if report is not None else Report()
    n = rep.notes
    logits = to_host(logits, "logits", n)
    gp = np.asarray(to_host(grad_probs, "grad_probs", n), np.float32)
    got = to_host(grad_logits, "grad_logits", n)
    bias = to_host(expert_bias, "expert_bias", n)
    kw = dict(use_pre_softmax=use_pre_softmax, scaling_factor=scaling_factor,
              score_function=score_function)
    _, m, saved = xte.fused_topk_with_score_function(
        logits, topk, num_groups=num_groups, group_topk=group_topk, expert_bias=bias,
        return_intermediate=True, **kw)
    od = got.dtype.name if got.dtype.name in ("float32", "bfloat16") else "float32"
    exp = np.asarray(xte.fused_topk_with_score_function_backward(
        np.asarray(m).astype(np.uint8), saved, gp, topk, logits=logits, num_groups=num_groups,
        group_topk=group_topk, dtype=od, **kw))
    if got.shape != exp.shape:
        rep.verdicts.append(Verdict("grad_logits", "router", False, f"shape {list(got.shape)}, "
                                    f"expected {list(exp.shape)}", {"shape": 1}))
        return rep
    g = got.astype(np.float64)
    e = exp.astype(np.float64)
    ul = C.ulps_between(g, e, od)
    ref = _router_grad64(logits, np.asarray(m).astype(bool), gp, topk, score_function,
                         use_pre_softmax, scaling_factor)
    classes, examples = {}, []
    nbad = int(np.sum(ul > ulps))
    C.count(classes, f"beyond {ulps} ulps of xte", nbad)
    for i in np.argsort(-np.nan_to_num(ul, nan=np.inf), axis=None)[:_MAX_EXAMPLES]:
        ij = np.unravel_index(i, ul.shape)
        if not ul[ij] > ulps:
            break
        ex = {"index": C.idx(ij), "expected": float(e[ij]), "got": float(g[ij]),
              "ulps": float(ul[ij])}
        if ref is not None:
            ex["fp64"] = float(ref[ij])
        examples.append(ex)
    mx = float(np.nanmax(ul)) if ul.size else 0.0
    stats = {"max_ulps": mx}
    why = f"max {mx:.3g} ulps of xte (tolerance {ulps})"
    if ref is not None:
        with np.errstate(invalid="ignore"):
            stats["error_fp64"] = float(np.nanmax(np.abs(g - ref)))
            stats["xte_error_fp64"] = float(np.nanmax(np.abs(e - ref)))
        why += (f"; max error vs fp64 {stats['error_fp64']:.3g} "
                f"(xte's {stats['xte_error_fp64']:.3g})")
    if nbad:
        why = f"{nbad} of {g.size} gradients differ: " + why
    rep.verdicts.append(Verdict("grad_logits", "router", nbad == 0, why, classes, stats,
                                examples))
    return rep
