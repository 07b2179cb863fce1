/* CPU router: fused top-k with a score function (forward, backward), aux-loss scores and the aux
 * loss. One token (row) per work item, parallel over rows; every per-row reduction follows the
 * fixed order of src/numerics/xte_moe_numerics.h, so the bytes never depend on threads or ISA. */
#include <string.h>

#include "cpu/moe_cpu.h"
#include "numerics/xte_moe_numerics.h"

#ifndef XTE_MOE_NAME
/* The generic build of this file; src/cpu/avx2/moe_avx2.c compiles it again with -mfma (the
 * explicit fmaf of the shared numerics become one instruction instead of a libm call) under
 * XTE_MOE_NAME(x) = x##_avx2; the results are the same bits (fmaf is exactly rounded). */
#define XTE_MOE_NAME(x) x
#define XTE_MOE_GENERIC 1
#endif

#define MAXE 512
#define MAXK 16

static void load_row(const xte_moe_view *v, int64_t t, int64_t n, float *x) {
  int64_t i;
  if (v->dtype == XTE_DTYPE_FP32) {
    const float *s = (const float *)v->data + t * v->ld;
    for (i = 0; i < n; i++) x[i] = s[i];
  } else {
    const uint16_t *s = (const uint16_t *)v->data + t * v->ld;
    for (i = 0; i < n; i++) x[i] = xte_bf16_to_f32(s[i]);
  }
}

static void store_row(const xte_moe_view *v, int64_t t, int64_t n, const float *x) {
  int64_t i;
  if (v->dtype == XTE_DTYPE_FP32) {
    float *d = (float *)v->data + t * v->ld;
    for (i = 0; i < n; i++) d[i] = x[i];
  } else {
    uint16_t *d = (uint16_t *)v->data + t * v->ld;
    for (i = 0; i < n; i++) d[i] = xte_f32_to_bf16(x[i]);
  }
}

/* Softmax of x over the indices list (ascending) into p (same indices); others untouched. */
static void softmax_set(const float *x, const int *set, int n, float *p) {
  float m = xte_bits_f32(0xFF800000u), sum = 0.0f;
  int j;
  for (j = 0; j < n; j++) m = xte_fmaxf(m, x[set[j]]);
  for (j = 0; j < n; j++) {
    p[set[j]] = xte_expf(x[set[j]] - m);
    sum += p[set[j]];
  }
  for (j = 0; j < n; j++) p[set[j]] = p[set[j]] / sum;
}

static void sort_asc(int *v, int n) {
  int i, j;
  for (i = 1; i < n; i++) {
    int x = v[i];
    for (j = i; j > 0 && v[j - 1] > x; j--) v[j] = v[j - 1];
    v[j] = x;
  }
}

/* Top-k of sel among the allowed experts (allowed NULL: all) in rank order. */
static int topk_row(const float *sel, int E, const uint8_t *allowed, int k, int *idx) {
  float vals[MAXE];
  int n = 0, e;
  for (e = 0; e < E; e++)
    if (!allowed || allowed[e]) xte_moe_topk_insert(vals, idx, &n, k, sel[e], e);
  return n;
}

static void router_row(const xte_router_args *a, int64_t t, float *x, float *sc, float *sel,
                       int *all) {
  const int E = (int)a->E, k = a->topk;
  int idx[MAXK], asc[MAXK], e, j, n;
  float w[MAXE];
  uint8_t allowed[MAXE];
  int softmax = a->score == XTE_MOE_SOFTMAX;
  load_row(&a->logits, t, E, x);
  /* scores */
  if (softmax) {
    if (a->pre_softmax)
      softmax_set(x, all, E, sc);
    else
      for (e = 0; e < E; e++) sc[e] = x[e];
  } else {
    for (e = 0; e < E; e++) sc[e] = xte_moe_score(x[e], a->score);
  }
  if (a->aux && !softmax && k > 1) { /* aux scores: normalised over all E */
    float s = 0.0f;
    for (e = 0; e < E; e++) s += sc[e];
    s = s + XTE_MOE_NORM_EPS;
    if (a->saved.data) memcpy((float *)a->saved.data + t * a->saved.ld, sc, (size_t)E * 4);
    for (e = 0; e < E; e++) sc[e] = sc[e] / s;
  } else if (a->saved.data && (!softmax || a->pre_softmax)) {
    memcpy((float *)a->saved.data + t * a->saved.ld, sc, (size_t)E * 4);
  }
  /* selection scores */
  for (e = 0; e < E; e++) sel[e] = a->bias ? sc[e] + a->bias[e] : sc[e];
  if (a->num_groups > 1) {
    const int G = a->num_groups, gs = E / G, per = k / a->group_topk;
    float gv[MAXE], tv[MAXK];
    int gidx[MAXE], ti[MAXK], g, keep[MAXE];
    int ng = 0;
    for (g = 0; g < G; g++) {
      float s = 0.0f;
      int m = 0;
      for (e = g * gs; e < (g + 1) * gs; e++) xte_moe_topk_insert(tv, ti, &m, per, sel[e], e);
      for (j = 0; j < m; j++) s += tv[j];
      xte_moe_topk_insert(gv, gidx, &ng, a->group_topk, s, g);
    }
    memset(allowed, 0, (size_t)E);
    for (j = 0; j < ng; j++) keep[j] = gidx[j];
    for (j = 0; j < ng; j++) memset(allowed + keep[j] * gs, 1, (size_t)gs);
    n = topk_row(sel, E, allowed, k, idx);
  } else {
    n = topk_row(sel, E, NULL, k, idx);
  }
  /* weights (unbiased scores) */
  for (j = 0; j < n; j++) asc[j] = idx[j];
  sort_asc(asc, n);
  for (e = 0; e < E; e++) w[e] = 0.0f;
  if (a->aux) {
    for (e = 0; e < E; e++) w[e] = sc[e];
  } else if (softmax && !a->pre_softmax) {
    softmax_set(sc, asc, n, w);
    if (a->saved.data) memcpy((float *)a->saved.data + t * a->saved.ld, w, (size_t)E * 4);
  } else if (!softmax && k > 1) {
    float s = 0.0f;
    for (j = 0; j < n; j++) s += sc[asc[j]];
    s = s + XTE_MOE_NORM_EPS;
    for (j = 0; j < n; j++) w[asc[j]] = sc[asc[j]] / s;
  } else {
    for (j = 0; j < n; j++) w[asc[j]] = sc[asc[j]];
  }
  /* outputs */
  if (a->probs.data) {
    float *p = (float *)a->probs.data + t * a->probs.ld;
    if (a->aux) {
      for (e = 0; e < E; e++) p[e] = w[e];
    } else {
      for (e = 0; e < E; e++) p[e] = 0.0f;
      for (j = 0; j < n; j++) p[idx[j]] = a->scaling * w[idx[j]];
    }
  }
  if (a->map.data) {
    uint8_t *m = (uint8_t *)a->map.data + t * a->map.ld;
    memset(m, 0, (size_t)E);
    for (j = 0; j < n; j++) m[idx[j]] = 1;
  }
  if (a->bits.data) {
    uint8_t *b = (uint8_t *)a->bits.data + t * a->bits.ld;
    memset(b, 0, (size_t)((E + 7) / 8));
    for (j = 0; j < n; j++) b[idx[j] / 8] |= (uint8_t)(1u << (idx[j] % 8));
  }
  if (a->idx.data) {
    for (j = 0; j < k; j++) {
      int v = j < n ? idx[j] : -1;
      if (a->idx.dtype == XTE_DTYPE_INT32)
        ((int32_t *)a->idx.data)[t * a->idx.ld + j] = v;
      else
        ((int64_t *)a->idx.data)[t * a->idx.ld + j] = v;
    }
  }
  if (a->weights.data) {
    float *wo = (float *)a->weights.data + t * a->weights.ld;
    for (j = 0; j < k; j++) wo[j] = j < n ? a->scaling * w[idx[j]] : 0.0f;
  }
}

static void router_range(void *ctx, int64_t b, int64_t e, int tid) {
  const xte_router_args *a = (const xte_router_args *)ctx;
  float x[MAXE], sc[MAXE], sel[MAXE];
  int all[MAXE], i;
  int64_t t;
  (void)tid;
  for (i = 0; i < (int)a->E; i++) all[i] = i;
  for (t = b; t < e; t++) router_row(a, t, x, sc, sel, all);
}

xte_status XTE_MOE_NAME(xte_cpu_moe_router_forward)(const xte_router_args *a, void *handle) {
#ifdef XTE_MOE_GENERIC
  if (xte_cpu_get_isa() != XTE_CPU_ISA_SCALAR) return xte_cpu_moe_router_forward_avx2(a, handle);
#endif
  (void)handle;
  xte_parallel_for(a->T, router_range, (void *)a);
  return XTE_SUCCESS;
}

/* ---------------------------------------------------------------- backward */

static void router_bwd_row(const xte_router_bwd_args *a, int64_t t) {
  const int E = (int)a->E;
  const float *g = (const float *)a->grad_probs.data + t * a->grad_probs.ld;
  const uint8_t *m = (const uint8_t *)a->map.data + t * a->map.ld;
  const float *s = (const float *)a->saved.data + t * a->saved.ld;
  float dp[MAXE], gx[MAXE], x[MAXE];
  int e;
  for (e = 0; e < E; e++) dp[e] = (a->aux || m[e]) ? a->scaling * g[e] : 0.0f;
  if (a->score == XTE_MOE_SOFTMAX) {
    /* p = saved (0 off the set for the post-top-k softmax): gx_i = p_i (dp_i - sum_j p_j dp_j) */
    float dot = 0.0f;
    for (e = 0; e < E; e++) dot = xte_fmaf(s[e], dp[e], dot);
    for (e = 0; e < E; e++) gx[e] = s[e] * (dp[e] - dot);
  } else {
    float gs[MAXE];
    if (a->logits.data)
      load_row(&a->logits, t, E, x);
    else
      for (e = 0; e < E; e++) x[e] = 0.0f;
    if (a->topk > 1) {
      /* w_i = s_i / D over the set S, D = sum_S s + eps: gs_j = (dp_j - (sum_S dp_e s_e) / D) / D
       * on S, 0 off S */
      float D = 0.0f, dot = 0.0f;
      for (e = 0; e < E; e++)
        if (a->aux || m[e]) D += s[e];
      D = D + XTE_MOE_NORM_EPS;
      for (e = 0; e < E; e++)
        if (a->aux || m[e]) dot = xte_fmaf(dp[e], s[e], dot);
      for (e = 0; e < E; e++) gs[e] = (a->aux || m[e]) ? (dp[e] - dot / D) / D : 0.0f;
    } else {
      for (e = 0; e < E; e++) gs[e] = dp[e];
    }
    for (e = 0; e < E; e++) gx[e] = gs[e] * xte_moe_dscore(s[e], x[e], a->score);
  }
  store_row(&a->grad_logits, t, E, gx);
}

static void router_bwd_range(void *ctx, int64_t b, int64_t e, int tid) {
  const xte_router_bwd_args *a = (const xte_router_bwd_args *)ctx;
  int64_t t;
  (void)tid;
  for (t = b; t < e; t++) router_bwd_row(a, t);
}

xte_status XTE_MOE_NAME(xte_cpu_moe_router_backward)(const xte_router_bwd_args *a, void *handle) {
#ifdef XTE_MOE_GENERIC
  if (xte_cpu_get_isa() != XTE_CPU_ISA_SCALAR) return xte_cpu_moe_router_backward_avx2(a, handle);
#endif
  (void)handle;
  xte_parallel_for(a->T, router_bwd_range, (void *)a);
  return XTE_SUCCESS;
}

#ifdef XTE_MOE_GENERIC
/* ---------------------------------------------------------------- aux loss
 * Column sums of probs in fp64: tokens in fixed blocks of AUX_BLOCK rows, each block summed in
 * ascending token order, the block partials added in block order; then
 * aux = fp32( C64 * sum_e (colsum_e * tpe_e) ) with C64 = E * coeff / (topk * N^2) in fp64,
 * experts ascending. */
#define AUX_BLOCK 1024

typedef struct aux_ctx {
  const xte_aux_loss_args *a;
  double *partial; /* [nblocks, E] */
} aux_ctx;

static void aux_range(void *vctx, int64_t b, int64_t e, int tid) {
  aux_ctx *c = (aux_ctx *)vctx;
  const xte_aux_loss_args *a = c->a;
  int64_t blk, t, j;
  (void)tid;
  for (blk = b; blk < e; blk++) {
    double *p = c->partial + blk * a->E;
    int64_t t1 = (blk + 1) * AUX_BLOCK < a->T ? (blk + 1) * AUX_BLOCK : a->T;
    for (j = 0; j < a->E; j++) p[j] = 0.0;
    for (t = blk * AUX_BLOCK; t < t1; t++) {
      const float *row = (const float *)a->probs.data + t * a->probs.ld;
      for (j = 0; j < a->E; j++) p[j] += (double)row[j];
    }
  }
}

static double tpe_at(const xte_moe_view *v, int64_t e) {
  return v->dtype == XTE_DTYPE_INT32 ? (double)((const int32_t *)v->data)[e]
                                     : (double)((const int64_t *)v->data)[e];
}

static void aux_bwd_range(void *vctx, int64_t b, int64_t e, int tid) {
  const xte_aux_loss_args *a = (const xte_aux_loss_args *)vctx;
  const double C =
      (double)a->E * (double)a->coeff / ((double)a->topk * (double)a->N * (double)a->N);
  int64_t t, j;
  (void)tid;
  for (t = b; t < e; t++) {
    float *row = (float *)a->grad_probs.data + t * a->grad_probs.ld;
    for (j = 0; j < a->E; j++) row[j] = (float)(C * tpe_at(&a->tpe, j)) * a->grad_aux;
  }
}

xte_status xte_cpu_moe_aux_loss(const xte_aux_loss_args *a, int backward, void *handle) {
  (void)handle;
  if (backward) {
    xte_parallel_for(a->T, aux_bwd_range, (void *)a);
  } else {
    const double C =
        (double)a->E * (double)a->coeff / ((double)a->topk * (double)a->N * (double)a->N);
    int64_t nb = (a->T + AUX_BLOCK - 1) / AUX_BLOCK, blk, j;
    aux_ctx c;
    double total = 0.0;
    c.a = a;
    c.partial = (double *)xte_aligned_alloc((size_t)(nb > 0 ? nb : 1) * (size_t)a->E * 8);
    if (!c.partial) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "aux loss workspace");
    xte_parallel_for(nb, aux_range, &c);
    for (j = 0; j < a->E; j++) {
      double cs = 0.0;
      for (blk = 0; blk < nb; blk++) cs += c.partial[blk * a->E + j];
      total += cs * tpe_at(&a->tpe, j);
    }
    xte_aligned_free(c.partial);
    *a->aux_out = (float)(C * total);
  }
  return XTE_SUCCESS;
}
#endif /* XTE_MOE_GENERIC */
