"""Attention over include/xte/attention.h: attention_fwd -> (out, lse), attention_bwd ->
(dq, dk, dv).

Every field of xte_attention_config is a keyword: layout ('bshd', 'sbhd', 'thd'), mask ('none',
'causal' (top-left), 'causal_bottom_right'; TE's 'no_mask' / 'padding*' names are accepted:
padding itself comes from cu_seqlens), window (left, right; -1 unbounded), softmax_scale (None:
1/sqrt(d_qk)), softcap (0: off), alibi_slopes (fp32 [h_q]), cu_seqlens_q / cu_seqlens_kv (int32
[batch + 1]), batch, max_seqlen_q / max_seqlen_kv, descale_q / descale_k / descale_v (fp32
[batch, h_kv], e4m3 inputs only). The arrays are passed to the C library as pointers (zero-copy,
they must live on the tensors' device); their sizes are checked here since the C API cannot.
Numerics: docs/numerics.md section 7. Nothing is computed here.
"""

import ctypes
import re

from .. import _lib
from .._lib import AttnLayout, AttnMask, AttnMode, DType, Status, XteError, XteShapeError, \
    lib
from .._lib import parse_enum
from .._tensor import empty, stream_of, view, view_opt
from ._common import bad

__all__ = ["attention_fwd", "attention_bwd"]

_QKV = (DType.FP32, DType.BF16, DType.FP16)
_OUT = (DType.FP32, DType.BF16, DType.FP16)
_MASKS = {"none": AttnMask.NONE, "no_mask": AttnMask.NONE, "padding": AttnMask.NONE,
          "causal": AttnMask.CAUSAL, "padding_causal": AttnMask.CAUSAL,
          "causal_bottom_right": AttnMask.CAUSAL_BOTTOM_RIGHT,
          "padding_causal_bottom_right": AttnMask.CAUSAL_BOTTOM_RIGHT}
_LAYOUTS = {"bshd": AttnLayout.BSHD, "sbhd": AttnLayout.SBHD, "thd": AttnLayout.THD}


def _enum(value, table, cls, name):
    return parse_enum(value, table, cls, name)



def _mentions(message, cname):
    """Whether the C message names argument cname (a whole word; 'x->' prefixes as given)."""
    tail = "" if not cname[-1].isalnum() else r"(?![A-Za-z0-9_])"
    return re.search(r"(?<![A-Za-z0-9_])" + re.escape(cname) + tail, message or "") is not None


def _call(fn, *args):
    try:
        _lib.call(fn, *args)
    except XteError as e:
        hints = [f"{c} is {p}" for c, p in (("O", "out"), ("dO", "d_out"), ("Q", "q"), ("K", "k"),
                                             ("V", "v"), ("config->", "the keyword arguments"))
                 if _mentions(e.message, c)]
        if not hints:
            raise
        raise type(e)(e.status, f"{e.message} (Python arguments: {'; '.join(hints)})",
                      fn) from None


def _float_ptr(v):
    return None if v is None else ctypes.cast(v.t.data, ctypes.POINTER(ctypes.c_float))


def _int_ptr(v):
    return None if v is None else ctypes.cast(v.t.data, ctypes.POINTER(ctypes.c_int32))


def _vector(x, name, dtype, n):
    """A dense array of exactly n elements of `dtype` for a config pointer (or None)."""
    v = view_opt(x, name, (dtype,))
    if v is None:
        return None
    count = 1
    for s in v.shape:
        count *= s
    if v.t.ld not in (0, v.shape[-1]):
        raise bad(name, f"rows are not dense (shape {v.shape}, row stride {v.t.ld})",
                  _lib.XteAlignmentError, Status.ALIGNMENT)
    if n is not None and count != n:
        raise bad(name, f"shape {v.shape} holds {count} elements: want {n}", XteShapeError,
                  Status.SHAPE)
    return v


_MODES = {"exact": AttnMode.EXACT, "fast": AttnMode.FAST, AttnMode.EXACT: AttnMode.EXACT,
          AttnMode.FAST: AttnMode.FAST}


def _mode(mode):
    """xte_attention_mode of the keyword: "exact" (XTE_ATTENTION_EXACT, the default) or "fast"
    (XTE_ATTENTION_FAST: bounded, deterministic, not bitwise; docs/numerics.md section 7)."""
    key = mode.lower() if isinstance(mode, str) else mode
    try:
        return int(_MODES[key])
    except (KeyError, TypeError):
        raise bad("mode", f"{mode!r}: want 'exact' or 'fast'") from None


def _config(vq, vk, layout, mask, window, softmax_scale, softcap, alibi_slopes, cu_seqlens_q,
            cu_seqlens_kv, batch, max_seqlen_q, max_seqlen_kv, descale_q, descale_k, descale_v,
            mode="exact"):
    """(xte_attention_config, [Views kept alive], batch, h_q)."""
    lay = _enum(layout, _LAYOUTS, AttnLayout, "layout")
    msk = _enum(mask if mask is not None else "none", _MASKS, AttnMask, "mask")
    rank = 3 if lay == AttnLayout.THD else 4
    if len(vq.shape) != rank:
        raise bad("q", f"shape {vq.shape}: the {lay.name} layout wants rank {rank}",
                  XteShapeError, Status.SHAPE)
    if len(vk.shape) != rank:
        raise bad("k", f"shape {vk.shape}: the {lay.name} layout wants rank {rank}",
                  XteShapeError, Status.SHAPE)
    h_q, h_kv = vq.shape[-2], vk.shape[-2]
    try:
        wl, wr = window if window is not None else (-1, -1)
    except (TypeError, ValueError):
        raise bad("window", f"{window!r}: want (left, right)") from None
    c = lib.xte_attention_config_default()
    c.layout = int(lay)
    c.mask = int(msk)
    c.window_left = -1 if wl is None else int(wl)
    c.window_right = -1 if wr is None else int(wr)
    c.softmax_scale = 0.0 if softmax_scale is None else float(softmax_scale)
    c.softcap = 0.0 if softcap is None else float(softcap)
    c.mode = _mode(mode)
    if lay == AttnLayout.THD:
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise bad("cu_seqlens_q" if cu_seqlens_q is None else "cu_seqlens_kv",
                      "required with the THD layout")
        vcq = _vector(cu_seqlens_q, "cu_seqlens_q", DType.INT32, None)
        nb = 1
        for s in vcq.shape:
            nb *= s
        b = int(batch) if batch is not None else nb - 1
    else:
        b = vq.shape[0] if lay == AttnLayout.BSHD else vq.shape[1]
        if batch is not None and int(batch) != b:
            raise bad("batch", f"{batch}, but q holds {b} sequences", XteShapeError, Status.SHAPE)
    vcq = _vector(cu_seqlens_q, "cu_seqlens_q", DType.INT32, b + 1)
    vck = _vector(cu_seqlens_kv, "cu_seqlens_kv", DType.INT32, b + 1)
    val = _vector(alibi_slopes, "alibi_slopes", DType.FP32, h_q)
    vdq = _vector(descale_q, "descale_q", DType.FP32, b * h_kv)
    vdk = _vector(descale_k, "descale_k", DType.FP32, b * h_kv)
    vdv = _vector(descale_v, "descale_v", DType.FP32, b * h_kv)
    c.alibi_slopes = _float_ptr(val)
    c.cu_seqlens_q = _int_ptr(vcq)
    c.cu_seqlens_kv = _int_ptr(vck)
    c.batch = b if (lay == AttnLayout.THD or batch is not None) else c.batch
    if lay == AttnLayout.THD:
        # "no sequence is longer": the packed token count is always an upper bound.
        c.max_seqlen_q = int(max_seqlen_q) if max_seqlen_q is not None else vq.shape[0]
        c.max_seqlen_kv = int(max_seqlen_kv) if max_seqlen_kv is not None else vk.shape[0]
    else:
        if max_seqlen_q is not None:
            c.max_seqlen_q = int(max_seqlen_q)
        if max_seqlen_kv is not None:
            c.max_seqlen_kv = int(max_seqlen_kv)
    c.descale_q = _float_ptr(vdq)
    c.descale_k = _float_ptr(vdk)
    c.descale_v = _float_ptr(vdv)
    keep = [x for x in (vcq, vck, val, vdq, vdk, vdv) if x is not None]
    return c, keep, b, h_q, lay


def _lse_shape(lay, vq, b, h_q):
    if lay == AttnLayout.THD:
        return (vq.shape[0], h_q)
    s_q = vq.shape[1] if lay == AttnLayout.BSHD else vq.shape[0]
    return (b, h_q, s_q)


def _out_dtype(d):
    if d is None:
        return None
    key = str(d).rsplit(".", 1)[-1].lower()
    table = {"float32": DType.FP32, "fp32": DType.FP32, "bfloat16": DType.BF16,
             "bf16": DType.BF16, "float16": DType.FP16, "fp16": DType.FP16}
    if isinstance(d, DType) and d in _OUT:
        return d
    if key not in table:
        raise bad("out_dtype", f"{d!r}: want float32, bfloat16 or float16", _lib.XteDTypeError,
                  Status.DTYPE)
    return table[key]


def attention_fwd(q, k, v, *, layout="bshd", mask="none", window=(-1, -1), softmax_scale=None,
                  softcap=0.0, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                  max_seqlen_q=None, max_seqlen_kv=None, batch=None, descale_q=None,
                  descale_k=None, descale_v=None, out=None, lse=None, out_dtype=None,
                  mode="exact"):
    """(out, lse) = softmax(mask(q k^T * scale)) v and the fp32 natural-log sum of exp per row.
    q [b, s_q, h_q, d_qk] (BSHD; SBHD [s_q, b, ...]; THD [total_q, h_q, d_qk]); k, v with h_kv
    heads (GQA: h_q a multiple of h_kv). fp32 / bf16 / fp16 (all the same), or e4m3 with
    descale_* (out then in out_dtype, default bfloat16). out: [.., h_q, d_v]; lse: BSHD / SBHD
    [b, h_q, s_q], THD [total_q, h_q], fp32. Rows that see no key: out 0, lse -inf.
    mode: "exact" (default: the documented bytes on every ISA) or "fast" (XTE_ATTENTION_FAST:
    within FlashAttention's bound, deterministic for an ISA and thread count)."""
    vq = view(q, "q", _QKV + (DType.E4M3,))
    vk = view(k, "k", _QKV + (DType.E4M3,))
    vv = view(v, "v", _QKV + (DType.E4M3,))
    cfg, keep, b, h_q, lay = _config(vq, vk, layout, mask, window, softmax_scale, softcap,
                                     alibi_slopes, cu_seqlens_q, cu_seqlens_kv, batch,
                                     max_seqlen_q, max_seqlen_kv, descale_q, descale_k,
                                     descale_v, mode)
    if vq.dtype == DType.E4M3:
        od = _out_dtype(out_dtype)
        od = DType.BF16 if od is None else od
    else:
        od = _out_dtype(out_dtype)
        od = vq.dtype if od is None else od
    if out is None:
        out = empty(vq, vq.shape[:-1] + (vv.shape[-1],), od)
    vo = view(out, "out", _OUT, writable=True)
    if lse is None:
        lse = empty(vq, _lse_shape(lay, vq, b, h_q), DType.FP32)
    vl = view(lse, "lse", (DType.FP32,), writable=True)
    _call("xte_attention_fwd", vq.ptr, vk.ptr, vv.ptr, vo.ptr, vl.ptr, ctypes.byref(cfg),
          stream_of(vq, vk, vv, vo, vl, *keep))
    return out, lse


def attention_bwd(q, k, v, out, d_out, lse, *, layout="bshd", mask="none", window=(-1, -1),
                  softmax_scale=None, softcap=0.0, alibi_slopes=None, cu_seqlens_q=None,
                  cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None, batch=None,
                  dq=None, dk=None, dv=None, mode="exact"):
    """(dq, dk, dv) from the forward's q, k, v, out, lse and d_out (fp32 / bf16 / fp16, all one
    dtype), with the forward's keywords (mode "exact" or "fast" as attention_fwd's). dq / dk /
    dv: buffers written in place."""
    vq = view(q, "q", _QKV)
    vk = view(k, "k", _QKV)
    vv = view(v, "v", _QKV)
    vo = view(out, "out", _QKV)
    vdo = view(d_out, "d_out", _QKV)
    vl = view(lse, "lse", (DType.FP32,))
    cfg, keep, _, _, _ = _config(vq, vk, layout, mask, window, softmax_scale, softcap,
                                 alibi_slopes, cu_seqlens_q, cu_seqlens_kv, batch, max_seqlen_q,
                                 max_seqlen_kv, None, None, None, mode)
    if dq is None:
        dq = empty(vq, vq.shape, vq.dtype)
    if dk is None:
        dk = empty(vk, vk.shape, vk.dtype)
    if dv is None:
        dv = empty(vv, vv.shape, vv.dtype)
    vdq = view(dq, "dq", _QKV, writable=True)
    vdk = view(dk, "dk", _QKV, writable=True)
    vdv = view(dv, "dv", _QKV, writable=True)
    _call("xte_attention_bwd", vq.ptr, vk.ptr, vv.ptr, vo.ptr, vdo.ptr, vl.ptr, vdq.ptr, vdk.ptr,
          vdv.ptr, ctypes.byref(cfg), stream_of(vq, vk, vv, vo, vdo, vl, vdq, vdk, vdv, *keep))
    return dq, dk, dv


def parse_layout(layout):
    """The AttnLayout of a layout name ('bshd', 'sbhd', 'thd'), enum or int (xte.torch's ops take
    it as an int)."""
    return _enum(layout, _LAYOUTS, AttnLayout, "layout")


def parse_mask(mask):
    """The AttnMask of a mask name (TE's 'no_mask' / 'padding*' accepted), enum, int or None."""
    return _enum(mask if mask is not None else "none", _MASKS, AttnMask, "mask")


def parse_attention_mode(mode):
    """The AttnMode of a mode name ('exact', 'fast'), enum or int (xte.torch's ops take it as an
    int)."""
    return _mode(mode)
