/* The attention capability of a backend: validated, resolved arguments and the ops table. Plain
 * C structs usable by the CPU driver and by CUDA / MUSA kernels as they are. The core has checked
 * every field it can see; cu_seqlens live in backend memory, so the backend checks them (non-
 * decreasing, within the tensors, each length <= the max) before writing anything. */
#ifndef XTE_ATTENTION_OPS_H
#define XTE_ATTENTION_OPS_H

#include <stdint.h>

#include "xte/core.h"

/* Where element (sequence b, position i, head h, column c) of a tensor lives:
 *   data[base(b) + i * ts + h * hs + c]
 * base(b) = b * bs, or cu[b] * ts for packed (THD) tensors. */
typedef struct xte_attn_tensor {
  void *data;
  int64_t bs, ts, hs;
} xte_attn_tensor;

typedef struct xte_attn_args {
  int dtype;     /* of Q, K, V (XTE_DTYPE_FP32 / BF16 / FP16 / E4M3) */
  int out_dtype; /* of O (fwd), and of dO, dQ, dK, dV (bwd: = dtype) */
  int64_t batch, hq, hkv, dqk, dv;
  int64_t sq, skv;             /* BSHD / SBHD: the padded lengths; THD: max_seqlen */
  int packed;                  /* THD */
  int64_t total_q, total_kv;   /* THD: tokens in the tensors */
  const int32_t *cu_q, *cu_kv; /* NULL (BSHD / SBHD without padding) or [batch + 1] */
  xte_attn_tensor q, k, v, o;
  xte_attn_tensor dout, dq, dk, dv_; /* backward */
  float *lse;                        /* fwd: written; bwd: read */
  int64_t lse_bs, lse_hs, lse_ts;    /* lse[base + h * hs + i * ts], base = b * bs or cu[b] * ts */
  int mask;                          /* xte_attn_mask */
  int64_t window_left, window_right;
  float scale, softcap;
  const float *alibi;                             /* [hq] or NULL */
  const float *descale_q, *descale_k, *descale_v; /* [batch, hkv] or NULL (e4m3 only) */
  int fast;      /* XTE_ATTENTION_FAST (a backend without a FAST path runs its exact one) */
  int no_output; /* every output has zero elements: a backend checks what only it can read
                    (cu_seqlens in its memory), then returns without work (the drivers' passes
                    walk the batch: 2^31 - 1 empty sequences took minutes) */
} xte_attn_args;

struct xte_attention_ops {
  xte_status (*fwd)(const xte_attn_args *args, void *handle);
  xte_status (*bwd)(const xte_attn_args *args, void *handle);
};

#endif /* XTE_ATTENTION_OPS_H */
