"""`python -m xte.check` (and `xte check`, which runs it): judge tensors stored in files.

    python -m xte.check FAMILY FILE [FILE ...] [options]

FAMILY: quantize, cast, gemm, grouped-gemm, attention, router, router-backward, aux-loss,
permute, unpermute. The FILEs
(.safetensors, .npy, .npz, torch.save .pt / .pth / .bin) are read into one namespace (a later
file's tensor replaces an earlier one of the same name); each tensor option names a tensor there
(default: the option's own name, e.g. --data data) or FILE:NAME in a given file. Options name
what the producer claims (--recipe te_block --block 1x128 --layout te_gemm ...). The human table
goes to stdout (--quiet: the verdict lines only), the JSON report to --json PATH ('-': stdout).
Exit status: 0 every tensor passed, 1 a tensor failed, 2 a usage or input error.
"""

import argparse
import sys

import numpy as np

from ._io import load

FAMILIES = ("quantize", "cast", "gemm", "grouped-gemm", "attention", "router",
            "router-backward", "aux-loss", "permute", "unpermute")


class _Namespace:
    def __init__(self, files, dtypes):
        self.tensors = {}
        self.files = {}
        for f in files:
            t = load(f, dtypes)
            self.files[f] = t
            self.tensors.update(t)

    def get(self, ref, required=True):
        if ref is None:
            return None
        if ":" in ref:
            f, name = ref.rsplit(":", 1)
            if f not in self.files:
                self.files[f] = load(f)
            t = self.files[f]
        else:
            t, name = self.tensors, ref
        if name not in t:
            if required:
                raise KeyError(f"tensor '{ref}' not found (have: {', '.join(sorted(t)) or '-'})")
            return None
        return t[name]


def _parser():
    p = argparse.ArgumentParser(prog="xte check", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("family", choices=FAMILIES)
    p.add_argument("files", nargs="*", help="tensor files (.safetensors .npy .npz .pt)")
    p.add_argument("--json", help="write the JSON report here ('-': stdout)")
    p.add_argument("--quiet", action="store_true", help="print the verdict lines only")
    p.add_argument("--dtype", action="append", default=[], metavar="NAME=DTYPE",
                   help="read tensor NAME's raw bytes as DTYPE (bfloat16, e4m3, e5m2, e8m0)")
    q = p.add_argument_group("quantize / cast")
    q.add_argument("--recipe", default="te_block", help="te_block, deepgemm, deepgemm_ue8m0, "
                   "mtfp8, mx_te, mx_ocp, te_current, te_delayed")
    q.add_argument("--block", help="1x128, 128x128, 1x32, per_tensor (default: the recipe's)")
    q.add_argument("--layout", help="compact (default), te_gemm, deepgemm, mx_swizzled")
    q.add_argument("--fmt", help="e4m3 / e5m2 (quantize), or the cast's dtype")
    q.add_argument("--columnwise", action="store_true", help="the data is the columnwise copy")
    q.add_argument("--no-saturate", action="store_true", help="the recipe does not saturate")
    q.add_argument("--amax-epsilon", type=float, default=0.0)
    q.add_argument("--force-pow-2", type=int, choices=(0, 1))
    q.add_argument("--scale", type=float, help="te_delayed's scale")
    q.add_argument("--x", default="x")
    q.add_argument("--data", default="data")
    q.add_argument("--scales", default="scale_inv")
    q.add_argument("--y", default="y", help="cast: the producer's output")
    g = p.add_argument_group("gemm / grouped-gemm")
    g.add_argument("--a", default="a", help="A's fp8 data (its scales: --a-scales)")
    g.add_argument("--a-scales", default="a_scales")
    g.add_argument("--b", default="b")
    g.add_argument("--b-scales", default="b_scales")
    g.add_argument("--out", default="out")
    g.add_argument("--c")
    g.add_argument("--bias")
    g.add_argument("--block-a", help="A's scaling (default 1x128; MX scales: 1x32)")
    g.add_argument("--block-b", help="B's scaling (default 128x128; MX scales: 1x32)")
    g.add_argument("--recipe-a")
    g.add_argument("--recipe-b")
    g.add_argument("--layout-a")
    g.add_argument("--layout-b")
    g.add_argument("--trans-a", action="store_true")
    g.add_argument("--no-trans-b", action="store_true", help="B is [K, N] (default [N, K])")
    g.add_argument("--mode", choices=("fast", "exact"), default="fast")
    g.add_argument("--calc-diff-max", type=float)
    g.add_argument("--kind", choices=("contiguous", "masked", "k"), default="contiguous")
    g.add_argument("--group-sizes", help="a tensor name or a comma list")
    g.add_argument("--masked-m", default="masked_m")
    g.add_argument("--alignment", type=int, default=0)
    g.add_argument("--out-before", help="the output buffer before the call (padding rows)")
    g.add_argument("--padding", choices=("zero",))
    a = p.add_argument_group("attention")
    for n in ("q", "k", "v", "lse", "d-out", "dq", "dk", "dv", "cu-seqlens-q", "cu-seqlens-kv",
              "alibi-slopes", "descale-q", "descale-k", "descale-v"):
        a.add_argument("--" + n, default=n.replace("-", "_"))
    a.add_argument("--attn-layout", default="bshd", help="bshd, sbhd, thd")
    a.add_argument("--mask", default="none")
    a.add_argument("--window", default="-1,-1", help="left,right (-1 unbounded)")
    a.add_argument("--softmax-scale", type=float)
    a.add_argument("--softcap", type=float, default=0.0)
    r = p.add_argument_group("router / aux-loss / permute")
    r.add_argument("--logits", default="logits")
    r.add_argument("--probs", default="probs")
    r.add_argument("--routing-map", default="routing_map")
    r.add_argument("--topk-idx", default="topk_idx")
    r.add_argument("--expert-bias", default="expert_bias")
    r.add_argument("--grad-probs", default="grad_probs")
    r.add_argument("--grad-logits", default="grad_logits")
    r.add_argument("--topk", type=int)
    r.add_argument("--score-function", default="softmax")
    r.add_argument("--pre-softmax", action="store_true")
    r.add_argument("--num-groups", type=int)
    r.add_argument("--group-topk", type=int)
    r.add_argument("--scaling-factor", type=float)
    r.add_argument("--prob-ulps", type=float, default=0)
    r.add_argument("--allow-key-rounding", action="store_true")
    r.add_argument("--tokens-per-expert", default="tokens_per_expert")
    r.add_argument("--aux", default="aux_loss")
    r.add_argument("--total-num-tokens", type=int)
    r.add_argument("--num-experts", type=int)
    r.add_argument("--coeff", type=float)
    r.add_argument("--inp", default="inp")
    r.add_argument("--expert-out", default="expert_out", help="unpermute: the permuted rows")
    r.add_argument("--ulps", type=float, default=0, help="unpermute / aux-loss tolerance")
    r.add_argument("--align", type=int, default=1)
    r.add_argument("--num-out-tokens", type=int, default=-1)
    return p


def _run(o, ns):
    from . import (check_attention, check_aux_loss, check_cast, check_gemm, check_gemm_grouped,
                   check_permute, check_quantize, check_router, check_router_backward,
                   check_unpermute)
    opt = lambda ref: ns.get(ref, required=False)  # noqa: E731
    if o.family == "quantize":
        return check_quantize(ns.get(o.x), ns.get(o.data), ns.get(o.scales), o.recipe, o.block,
                              o.layout, o.fmt, columnwise=o.columnwise,
                              saturate=not o.no_saturate, amax_epsilon=o.amax_epsilon,
                              force_pow_2=None if o.force_pow_2 is None else bool(o.force_pow_2),
                              scale=o.scale)
    if o.family == "cast":
        return check_cast(ns.get(o.x), ns.get(o.y), o.fmt, saturate=not o.no_saturate)
    if o.family in ("gemm", "grouped-gemm"):
        sa = ns.get(o.a_scales)
        mx = np.asarray(sa).dtype.itemsize == 1
        kw = dict(block_a=o.block_a or ("1x32" if mx else "1x128"),
                  block_b=o.block_b or ("1x32" if mx else "128x128"),
                  recipe_a=o.recipe_a, recipe_b=o.recipe_b, layout_a=o.layout_a,
                  layout_b=o.layout_b, mode=o.mode, c=opt(o.c), bias=opt(o.bias),
                  calc_diff_max=o.calc_diff_max, trans_b=not o.no_trans_b)
        A, B = (ns.get(o.a), sa), (ns.get(o.b), ns.get(o.b_scales))
        if o.family == "gemm":
            return check_gemm(A, B, ns.get(o.out), trans_a=o.trans_a, **kw)
        gs = o.group_sizes
        if gs is not None and all(c.isdigit() or c == "," for c in gs):
            gs = [int(v) for v in gs.split(",") if v]
        elif gs is not None:
            gs = ns.get(gs)
        return check_gemm_grouped(A, B, ns.get(o.out), kind=o.kind, group_sizes=gs,
                                  masked_m=opt(o.masked_m) if o.kind == "masked" else None,
                                  alignment=o.alignment, out_before=opt(o.out_before),
                                  trans_a=o.trans_a,
                                  padding=o.padding, **kw)
    if o.family == "attention":
        wl, wr = (int(v) for v in o.window.split(","))
        return check_attention(ns.get(o.q), ns.get(o.k), ns.get(o.v), opt(o.out), opt(o.lse),
                               d_out=opt(o.d_out), dq=opt(o.dq), dk=opt(o.dk), dv=opt(o.dv),
                               layout=o.attn_layout, mask=o.mask, window=(wl, wr),
                               softmax_scale=o.softmax_scale, softcap=o.softcap,
                               alibi_slopes=opt(o.alibi_slopes),
                               descale_q=opt(o.descale_q), descale_k=opt(o.descale_k),
                               descale_v=opt(o.descale_v),
                               cu_seqlens_q=opt(o.cu_seqlens_q),
                               cu_seqlens_kv=opt(o.cu_seqlens_kv))
    if o.family == "router":
        if o.topk is None:
            raise ValueError("--topk is required")
        return check_router(ns.get(o.logits), opt(o.probs), opt(o.routing_map),
                            opt(o.topk_idx), topk=o.topk, score_function=o.score_function,
                            use_pre_softmax=o.pre_softmax, num_groups=o.num_groups,
                            group_topk=o.group_topk, scaling_factor=o.scaling_factor,
                            expert_bias=opt(o.expert_bias), prob_ulps=o.prob_ulps,
                            allow_key_rounding=o.allow_key_rounding)
    if o.family == "router-backward":
        if o.topk is None:
            raise ValueError("--topk is required")
        return check_router_backward(ns.get(o.logits), ns.get(o.grad_probs),
                                     ns.get(o.grad_logits), topk=o.topk,
                                     score_function=o.score_function,
                                     use_pre_softmax=o.pre_softmax, num_groups=o.num_groups,
                                     group_topk=o.group_topk, scaling_factor=o.scaling_factor,
                                     expert_bias=opt(o.expert_bias), ulps=o.ulps)
    if o.family == "aux-loss":
        for n in ("topk", "total_num_tokens", "num_experts", "coeff"):
            if getattr(o, n) is None:
                raise ValueError(f"--{n.replace('_', '-')} is required")
        return check_aux_loss(ns.get(o.probs), ns.get(o.tokens_per_expert), o.total_num_tokens,
                              o.num_experts, o.topk, o.coeff, ns.get(o.aux),
                              ulps=o.ulps)
    if o.family == "unpermute":
        return check_unpermute(ns.get(o.expert_out), ns.get(o.routing_map), ns.get(o.out),
                               opt(o.probs), num_out_tokens=o.num_out_tokens, align=o.align,
                               ulps=o.ulps)
    return check_permute(ns.get(o.inp), ns.get(o.routing_map), ns.get(o.out),
                         num_out_tokens=o.num_out_tokens, align=o.align)


def main(argv=None):
    o = _parser().parse_args(argv)
    try:
        dtypes = dict(d.split("=", 1) for d in o.dtype)
    except ValueError:
        print("xte check: --dtype wants NAME=DTYPE", file=sys.stderr)
        return 2
    try:
        ns = _Namespace(o.files, dtypes)
        rep = _run(o, ns)
    except (KeyError, ValueError, TypeError, OSError, ImportError, NotImplementedError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"xte check: {msg}", file=sys.stderr)
        return 2
    except Exception as e:  # an xte error (bad claim for the data): a usage error too
        if type(e).__name__.startswith("Xte"):
            print(f"xte check: {e}", file=sys.stderr)
            return 2
        raise
    rep.claim.setdefault("files", list(o.files))
    if o.json == "-":
        print(rep.to_json())
    else:
        if o.quiet:
            for v in rep.verdicts:
                print(v.line())
        else:
            print(rep.table())
        if o.json:
            with open(o.json, "w") as f:
                f.write(rep.to_json() + "\n")
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
