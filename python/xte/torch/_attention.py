"""The attention family's custom ops (xte.ops.attention): xte::attention_fwd (autograd to q, k, v)
and xte::attention_bwd.

The ops take the options of xte_attention_config as flat arguments (the schema of a custom op has
no dicts). Two functions, side by side, are the only places that map them: op_args (the keyword
arguments of xte.torch.attention_fwd / attention_bwd -> the flat op arguments, names parsed to
ints) and _plain_kw (the flat op arguments -> the keywords of the plain xte.attention_fwd /
attention_bwd, which fill the C config). A new config field is one more flat argument at the end
of both op schemas (with a default), one entry in each of these two functions and one in the
fake kernels' argument lists; the backward's Nones follow the argument count.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from ..ops import attention as _A
from ._common import DEV


def op_args(layout="bshd", mask=None, window=None, softmax_scale=None, softcap=None,
            alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
            max_seqlen_kv=None, mode="exact"):
    """The flat arguments after (q, k, v) / (q, k, v, o, do, lse) of the attention ops, from the
    keywords of xte.torch.attention_fwd (None: the C default; mode "exact" or "fast")."""
    wl, wr = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    return (int(_A.parse_layout(layout)), int(_A.parse_mask(mask)), wl, wr,
            float(softmax_scale or 0.0), float(softcap or 0.0), alibi_slopes, cu_seqlens_q,
            cu_seqlens_kv, int(max_seqlen_q or 0), int(max_seqlen_kv or 0),
            int(_A.parse_attention_mode(mode)))


def _plain_kw(layout, mask, window_left, window_right, softmax_scale, softcap, alibi, cuq, cukv,
              max_q, max_kv, mode=0):
    """The plain attention functions' keywords from the op's flat arguments (op_args' order;
    mode 0 exact, 1 fast)."""
    return dict(layout=int(layout), mask=int(mask), window=(window_left, window_right),
                softmax_scale=softmax_scale if softmax_scale else None, softcap=softcap,
                alibi_slopes=alibi, cu_seqlens_q=cuq, cu_seqlens_kv=cukv,
                max_seqlen_q=max_q or None, max_seqlen_kv=max_kv or None,
                mode="fast" if mode else "exact")


def _shapes(q, v, layout):
    """(O's shape, LSE's shape) for the layout (BSHD / SBHD: [b, h, s_q]; THD: [t, h])."""
    o = tuple(q.shape[:-1]) + (v.shape[-1],)
    if layout == 2:  # THD
        lse = (q.shape[0], q.shape[1])
    elif layout == 1:  # SBHD
        lse = (q.shape[1], q.shape[2], q.shape[0])
    else:
        lse = (q.shape[0], q.shape[2], q.shape[1])
    return o, lse


@torch.library.custom_op("xte::attention_fwd", mutates_args=(), device_types=DEV)
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, layout: int, mask: int, window_left: int,
                  window_right: int, softmax_scale: float, softcap: float,
                  alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
                  cu_seqlens_kv: Optional[Tensor], max_seqlen_q: int,
                  max_seqlen_kv: int, mode: int = 0) -> Tuple[Tensor, Tensor]:
    """xte_attention_fwd: (O in q's dtype, LSE fp32: BSHD / SBHD [b, h, s_q], THD [t, h]).
    The plain xte.attention_fwd runs it: every config array is checked there (dtype, element
    count, device) before C reads it; max_seqlen 0 means "the tokens of the tensor" (THD)."""
    return _A.attention_fwd(q, k, v, **_plain_kw(layout, mask, window_left, window_right,
                                                 softmax_scale, softcap, alibi_slopes,
                                                 cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                                 max_seqlen_kv, mode))


@attention_fwd.register_fake
def _(q, k, v, layout, mask, window_left, window_right, softmax_scale, softcap, alibi_slopes,
      cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, mode=0):
    oshape, lshape = _shapes(q, v, layout)
    return q.new_empty(oshape), q.new_empty(lshape, dtype=torch.float32)


@torch.library.custom_op("xte::attention_bwd", mutates_args=(), device_types=DEV)
def attention_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor,
                  layout: int, mask: int, window_left: int, window_right: int,
                  softmax_scale: float, softcap: float, alibi_slopes: Optional[Tensor],
                  cu_seqlens_q: Optional[Tensor], cu_seqlens_kv: Optional[Tensor],
                  max_seqlen_q: int, max_seqlen_kv: int,
                  mode: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """xte_attention_bwd: (dQ, dK, dV) in the inputs' dtype (through xte.attention_bwd)."""
    return _A.attention_bwd(q, k, v, o, do, lse, **_plain_kw(layout, mask, window_left,
                                                             window_right, softmax_scale, softcap,
                                                             alibi_slopes, cu_seqlens_q,
                                                             cu_seqlens_kv, max_seqlen_q,
                                                             max_seqlen_kv, mode))


@attention_bwd.register_fake
def _(q, k, v, o, do, lse, layout, mask, window_left, window_right, softmax_scale, softcap,
      alibi_slopes, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, mode=0):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    q, k, v = inputs[:3]
    o, lse = output
    ctx.cfg = inputs[3:]  # every flat config argument, passed on to attention_bwd as they are
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.set_materialize_grads(True)


def _bwd(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.xte.attention_bwd(q, k, v, o, do.to(q.dtype).contiguous(), lse,
                                             *ctx.cfg)
    return (dq, dk, dv) + (None,) * len(ctx.cfg)


attention_fwd.register_autograd(_bwd, setup_context=_setup)


OPS = {"attention_fwd": attention_fwd, "attention_bwd": attention_bwd}
