/* The MoE capability table of a backend (src/xte_backend.h: xte_backend_ops.moe) and the
 * validated arguments its kernels take. Plain C structs: the core (src/moe_api.c) has checked
 * every shape, dtype and enum; data-dependent checks (expert indices in range, a token routed
 * to more experts than its row-map slots, duplicate experts) are the driver's, made before it
 * writes anything. */
#ifndef XTE_MOE_OPS_H
#define XTE_MOE_OPS_H

#include <stdint.h>

#include "xte/core.h"
#include "xte_kernel_args.h"

/* A 2-D strided view the kernels read or write: data, element size (bytes), leading dim. */
typedef struct xte_moe_view {
  void *data; /* NULL: absent */
  int dtype;  /* xte_dtype */
  int64_t rows, cols, ld;
} xte_moe_view;

typedef struct xte_router_args {
  xte_moe_view logits; /* fp32 / bf16 [T, E] */
  const float *bias;   /* [E] or NULL */
  int64_t T, E;
  int topk, score, pre_softmax, num_groups, group_topk;
  float scaling;
  int aux; /* 1: aux-loss scores (all E normalised, no bias / groups; probs = scores) */
  xte_moe_view probs, map, bits, idx, weights, saved;
  /* Quantile Balancing (qb = 1): the top topk + 1 are selected, the last dropped; its biased
   * score is cutoff[t] (fp32 [T]); then hist (int32 [E, qb_bins]) gains one count per (token,
   * expert) at xte_moe_qb_bin(cutoff[t], saved[t, e], qb_lower, xte_moe_qb_scale(qb_lower,
   * qb_upper, qb_bins), qb_bins). */
  int qb;
  xte_moe_view cutoff, hist;
  float qb_lower, qb_upper;
  int64_t qb_bins;
} xte_router_args;

typedef struct xte_router_bwd_args {
  xte_moe_view grad_probs, map, saved, logits, grad_logits;
  int64_t T, E;
  int topk, score, pre_softmax;
  float scaling;
  int aux; /* 1: every expert is "selected" (aux scores) */
} xte_router_bwd_args;

typedef struct xte_aux_loss_args {
  xte_moe_view probs, tpe; /* tpe int32 / int64 / fp32 / bf16 [E] */
  int64_t T, E, N;
  int64_t num_experts; /* the E of the coefficient (divides E: sequence-level loss) */
  int topk;
  float coeff, grad_aux;
  float *aux_out;          /* forward */
  xte_moe_view grad_probs; /* backward */
} xte_aux_loss_args;

/* The routing of token movement. */
typedef struct xte_moe_route {
  xte_moe_view map; /* uint8 [T, E] or data NULL */
  xte_moe_view idx; /* int32 / int64 [T, k] or data NULL */
  int64_t T, E, K;  /* K: row_map slots per token */
} xte_moe_route;

typedef struct xte_permute_args {
  xte_moe_route r;
  int64_t cap, align;
  xte_moe_view in, in_s, out, out_s, row_map; /* row_map int32 [T, K] */
  xte_moe_view offsets, tpe, row_to_expert;   /* optional */
  int64_t *rows_out;                          /* permute_rows: only count */
} xte_permute_args;

typedef struct xte_unpermute_args {
  xte_moe_route r;
  xte_moe_view in, row_map, probs, out; /* forward / permute backward (probs NULL) */
  int probs_dense;                      /* probs [T, E] (map routing) or [T, K] */
  /* unpermute backward */
  xte_moe_view grad_out, fwd_in, grad_in, grad_probs;
} xte_unpermute_args;

typedef struct xte_sort_chunks_args {
  xte_moe_view in, out, split, index, row_map;
  int64_t n;
  int backward; /* 1: out[r] = in[row_map[r]] */
} xte_sort_chunks_args;

typedef struct xte_dispatch_args {
  xte_moe_view idx, tpr, tpe, in_rank;
  int64_t T, E;
  int ranks;
} xte_dispatch_args;

typedef struct xte_swiglu_args {
  xte_moe_view x;  /* [T, 2F] */
  xte_moe_view dy; /* backward: [T, F] */
  xte_moe_view out;
  int64_t T, F;
  int backward;
  int act_dtype;    /* fused: the dtype y is rounded to before quantization */
  xte_quant_args q; /* fused: the quantization (q.in unused); M, K = the output's shape */
  int fused;
} xte_swiglu_args;

typedef struct xte_moe_ops {
  xte_status (*router_forward)(const xte_router_args *a, void *handle);
  xte_status (*router_backward)(const xte_router_bwd_args *a, void *handle);
  xte_status (*aux_loss)(const xte_aux_loss_args *a, int backward, void *handle);
  xte_status (*permute)(const xte_permute_args *a, void *handle);
  xte_status (*unpermute)(const xte_unpermute_args *a, int which, void *handle);
  xte_status (*sort_chunks)(const xte_sort_chunks_args *a, void *handle);
  xte_status (*dispatch_layout)(const xte_dispatch_args *a, void *handle);
  xte_status (*swiglu)(const xte_swiglu_args *a, void *handle);
} xte_moe_ops;

/* which of unpermute */
enum { XTE_UNPERMUTE_FWD = 0, XTE_UNPERMUTE_BWD = 1 };

#endif /* XTE_MOE_OPS_H */
