/* CPU router: fused top-k with a score function (forward, backward), aux-loss scores and the aux
 * loss. One token (row) per work item, parallel over rows; every per-row reduction follows the
 * fixed order of src/numerics/xte_moe_numerics.h, so the bytes never depend on threads or ISA. */
#include <string.h>

#include "cpu/moe_cpu.h"
#include "numerics/xte_moe_numerics.h"

#ifndef XTE_MOE_NAME
/* The generic build of this file: the ISA-independent drivers, and the scalar ISA's kernels
 * (XTE_MOE_NAME(x) = x##_scalar, in src/cpu/scalar/table_scalar.c). src/cpu/avx2/moe_avx2.c
 * compiles the kernels again with -mfma (the explicit fmaf of the shared numerics become one
 * instruction instead of a libm call) under XTE_MOE_NAME(x) = x##_avx2; the results are the same
 * bits (fmaf is exactly rounded). */
#define XTE_MOE_NAME(x) x##_scalar
#define XTE_MOE_GENERIC 1
#endif

/* Per-thread row buffers are sized from E (topk <= E): every array holds E + XTE_RT_PAD
 * elements (the lane-wise candidate list writes up to 16 past its count). */
#define XTE_RT_PAD 16

#include "cpu/moe_lanes.h"

/* sc[e] = score(x[e]) (sigmoid / sqrtsoftplus). */
static void score_row(const float *x, int E, int fn, float *sc) {
  int e = 0;
#ifdef XTE_MOE_VW
  if (fn == XTE_MOE_SIGMOID)
    for (; e + XTE_MOE_VW <= E; e += XTE_MOE_VW) xv_st(sc + e, xv_sigmoidf(xv_ld(x + e)));
#endif
  for (; e < E; e++) sc[e] = xte_moe_score(x[e], fn);
}

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
    p[set[j]] = xte_expf(xte_sub_nanprop(x[set[j]], m));
    sum = xte_add_nanprop(sum, p[set[j]]);
  }
  for (j = 0; j < n; j++) p[set[j]] = xte_div_nanprop(p[set[j]], sum);
}

/* softmax_set over all E experts (the same steps; the exponentials and divisions lane-wise). */
static void softmax_all(const float *x, int E, float *p) {
  float m = xte_bits_f32(0xFF800000u), sum = 0.0f;
  int e = 0;
#ifdef XTE_MOE_VW
  /* the maximum lane-wise (NaN ignored as by fmaxf); the order only decides the sign of a zero
   * maximum, which x - m does not see (x - +-0 = x for x != 0, and exp(+-0) = 1) */
  {
    float ml[XTE_MOE_VW];
    xv acc = xv_1(m);
    int i;
    for (; e + XTE_MOE_VW <= E; e += XTE_MOE_VW) acc = xv_max(xv_ld(x + e), acc);
    xv_st(ml, acc);
    for (i = 0; i < XTE_MOE_VW; i++) m = xte_fmaxf(m, ml[i]);
  }
#endif
  for (; e < E; e++) m = xte_fmaxf(m, x[e]);
  e = 0;
#ifdef XTE_MOE_VW
  for (; e + XTE_MOE_VW <= E; e += XTE_MOE_VW) xv_st(p + e, xv_expf(xv_sub(xv_ld(x + e), xv_1(m))));
#endif
  for (; e < E; e++) p[e] = xte_expf(xte_sub_nanprop(x[e], m));
  for (e = 0; e < E; e++) sum = xte_add_nanprop(sum, p[e]);
  e = 0;
#ifdef XTE_MOE_VW
  for (; e + XTE_MOE_VW <= E; e += XTE_MOE_VW) xv_st(p + e, xv_div(xv_ld(p + e), xv_1(sum)));
#endif
  for (; e < E; e++) p[e] = xte_div_nanprop(p[e], sum);
}

static void sort_asc(int *v, int n) {
  int i, j;
  for (i = 1; i < n; i++) {
    int x = v[i];
    for (j = i; j > 0 && v[j - 1] > x; j--) v[j] = v[j - 1];
    v[j] = x;
  }
}

/* Bottom-up merge sort of v[0, n) (tmp: n ints of scratch), by the rank order of sel
 * (by_rank) or ascending. The rank order is total, so the result is the unique sorted list. */
static void merge_sort(int *v, int *tmp, int n, const float *sel, int by_rank) {
  int w, i, *src = v, *dst = tmp;
  for (w = 1; w < n; w *= 2) {
    for (i = 0; i < n; i += 2 * w) {
      int a = i, am = i + w < n ? i + w : n, b = am, bm = i + 2 * w < n ? i + 2 * w : n, o = i;
      while (a < am && b < bm) {
        int tb =
            by_rank ? xte_moe_before(sel[src[b]], src[b], sel[src[a]], src[a]) : src[b] < src[a];
        dst[o++] = tb ? src[b++] : src[a++];
      }
      while (a < am) dst[o++] = src[a++];
      while (b < bm) dst[o++] = src[b++];
    }
    {
      int *t = src;
      src = dst;
      dst = t;
    }
  }
  if (src != v) memcpy(v, src, (size_t)n * sizeof *v);
}

/* Above this topk the top-k is a sort of the allowed experts (O(E log E)) rather than the
 * insertion into a k-list (O(E k)); both give the same list (the rank order is total). */
#define XTE_RT_SORT_K 64

/* Scratch of topk_row: vals [k], cand / ms0 / ms1 [E + 16], ri [k + 1]. */
typedef struct topk_scratch {
  float *vals;
  int *cand, *ri, *ms0, *ms1;
} topk_scratch;

/* Top-k of sel among the allowed experts (allowed NULL: all) in rank order into idx, and the
 * same experts ascending into asc. mx: NULL, or the 16 lane maxima of sel (below) when the
 * caller has them. */
static int topk_row(const float *sel, int E, const uint8_t *allowed, int k, const float *mx,
                    int *idx, int *asc, const topk_scratch *ts) {
  float *vals = ts->vals;
  int n = 0, e = 0;
  (void)mx;
  if (k > XTE_RT_SORT_K) {
    int m = 0;
    for (e = 0; e < E; e++)
      if (!allowed || allowed[e]) ts->ms0[m++] = e;
    merge_sort(ts->ms0, ts->ms1, m, sel, 1);
    n = m < k ? m : k;
    for (e = 0; e < n; e++) asc[e] = idx[e] = ts->ms0[e];
    merge_sort(asc, ts->ms1, n, sel, 0);
    return n;
  }
  if (allowed) {
    for (e = 0; e < E; e++)
      if (allowed[e]) xte_moe_topk_insert(vals, idx, &n, k, sel[e], e);
    goto sort;
  }
#ifdef XTE_MOE_VW
  /* The top-k of a set is that of any subset holding it (the rank order is total). The maxima of
   * 16 disjoint subsets (lane i: the experts e = i mod 16 of the whole 16-groups) are elements (NaN
   * never wins, and a subset of NaNs only keeps -inf), so when at least k experts are >= thr = the
   * k-th largest maximum, those hold the top-k: every other expert is smaller or NaN, and at least
   * k rank before it. Otherwise (NaN-heavy rows) all are scanned. */
  if (E >= 4 * 16) {
    enum { NACC = 16 / XTE_MOE_VW };
    float mxl[16], cv[16], thr = xte_bits_f32(0xFF800000u);
    int *cand = ts->cand, nc = 0, i, q;
    xv acc[NACC];
    if (mx) {
      for (q = 0; q < NACC; q++) acc[q] = xv_ld(mx + q * XTE_MOE_VW);
    } else {
      for (q = 0; q < NACC; q++) acc[q] = xv_1(xte_bits_f32(0xFF800000u));
      for (e = 0; e + 16 <= E; e += 16)
        for (q = 0; q < NACC; q++) acc[q] = xv_max(xv_ld(sel + e + q * XTE_MOE_VW), acc[q]);
      for (q = 0; q < NACC; q++) xv_st(mxl + q * XTE_MOE_VW, acc[q]);
      mx = mxl;
    }
    /* the k-th largest maximum: the largest m with at least k maxima >= m */
    for (i = 0; i < 16; i++) {
      int c = 0;
      for (q = 0; q < NACC; q++) c += __builtin_popcount(xm_bits(xv_ge(acc[q], xv_1(mx[i]))));
      thr = c >= k && mx[i] > thr ? mx[i] : thr;
    }
    for (e = 0; e + XTE_MOE_VW <= E; e += XTE_MOE_VW)
      nc += xv_cand(cand + nc, xm_bits(xv_ge(xv_ld(sel + e), xv_1(thr))), e);
    for (; e < E; e++)
      if (sel[e] >= thr) cand[nc++] = e;
    if (nc >= k && nc <= 16) {
      /* no NaN among them: the rank of candidate i is the number of candidates greater, plus
       * the equal ones of smaller index; the k best land in their places, the others in slot k */
      const unsigned valid = (unsigned)((1ull << nc) - 1);
      int *ri = ts->ri, na = 0;
      for (i = 0; i < nc; i++) cv[i] = sel[cand[i]];
      for (; i < 16; i++) cv[i] = 0.0f;
      for (q = 0; q < NACC; q++) acc[q] = xv_ld(cv + q * XTE_MOE_VW);
      for (i = 0; i < nc; i++) {
        const xv b = xv_1(cv[i]);
        unsigned gt = 0, eq = 0;
        int r;
        for (q = 0; q < NACC; q++) {
          gt |= xm_bits(xv_gt(acc[q], b)) << (q * XTE_MOE_VW);
          eq |= xm_bits(xv_eq(acc[q], b)) << (q * XTE_MOE_VW);
        }
        r = __builtin_popcount((gt | (eq & ((1u << i) - 1))) & valid);
        asc[na] = cand[i]; /* candidates ascend: the selected ones in order */
        na += r < k;
        r = r < k ? r : k;
        ri[r] = cand[i];
      }
      for (i = 0; i < k; i++) idx[i] = ri[i];
      return k;
    }
    if (nc >= k) {
      for (i = 0; i < nc; i++) xte_moe_topk_insert(vals, idx, &n, k, sel[cand[i]], cand[i]);
      goto sort;
    }
    e = 0;
  }
#endif
  for (; e < E; e++) xte_moe_topk_insert(vals, idx, &n, k, sel[e], e);
sort:
  for (e = 0; e < n; e++) asc[e] = idx[e];
  sort_asc(asc, n);
  return n;
}

/* Per-thread row buffers. pr / mr (the dense probs and map rows staged for the non-temporal
 * stores) are all zero between rows: a row sets its k entries and clears them after. */
typedef struct router_ws {
  float *x, *sc, *sel, *w, *pr, *gv, *tv, *zb; /* zb: E zeros (no bias) */
  int *gidx, *ti, *idx, *asc;
  uint8_t *mr, *allowed;
  topk_scratch ts;
  int stream;
} router_ws;

/* The per-thread workspace of the forward: NF_FWD float / int arrays and 2 byte arrays of
 * E + XTE_RT_PAD elements each, every array 64-byte aligned. */
#define NF_FWD 17
static int64_t ws_elems(int64_t E) {
  return (E + XTE_RT_PAD + 15) / 16 * 16;
}
static int router_ws_bytes(int64_t E, int nf, size_t *bytes) {
  size_t b;
  if (!xte_moe_ws_bytes(ws_elems(E), 4 * (int64_t)nf + 2, 0, &b)) return 0;
  *bytes = (b + 63) / 64 * 64;
  return 1;
}
static void router_ws_init(router_ws *ws, char *base, int64_t E) {
  const size_t n = (size_t)ws_elems(E);
  float *f = (float *)base;
  ws->x = f;
  ws->sc = f + n;
  ws->sel = f + 2 * n;
  ws->w = f + 3 * n;
  ws->pr = f + 4 * n;
  ws->gv = f + 5 * n;
  ws->tv = f + 6 * n;
  ws->zb = f + 7 * n;
  ws->ts.vals = f + 8 * n;
  ws->gidx = (int *)(f + 9 * n);
  ws->ti = (int *)(f + 10 * n);
  ws->idx = (int *)(f + 11 * n);
  ws->asc = (int *)(f + 12 * n);
  ws->ts.cand = (int *)(f + 13 * n);
  ws->ts.ri = (int *)(f + 14 * n);
  ws->ts.ms0 = (int *)(f + 15 * n);
  ws->ts.ms1 = (int *)(f + 16 * n);
  ws->mr = (uint8_t *)(f + NF_FWD * n);
  ws->allowed = ws->mr + n;
  memset(ws->zb, 0, n * 4);
  memset(ws->pr, 0, n * 4);
  memset(ws->mr, 0, n);
}

#ifdef XTE_MOE_VW
/* Large outputs (the dense probs and map) are written with non-temporal stores from a row built
 * in L1: no read for ownership of lines that are wholly overwritten. */
#define XTE_MOE_STREAM_BYTES ((int64_t)8 << 20)

static void stream_row(void *dst, const void *src, size_t n) {
  char *d = (char *)dst;
  const char *s = (const char *)src;
  const size_t V = XTE_MOE_VW * 4;
  size_t h = (V - (size_t)((uintptr_t)d % V)) % V;
  if (h > n) h = n;
  if (h) memcpy(d, s, h);
  for (d += h, s += h, n -= h; n >= V; n -= V, d += V, s += V)
    xv_stream((float *)d, xv_ld((const float *)s));
  if (n) memcpy(d, s, n);
}

/* The scores (into sc, or the logits themselves for the post-top-k softmax: returned), the
 * selection scores sel = score + bias (bias 0 when none: + 0 changes only the sign of a zero,
 * which the rank order ignores) and the 16 lane maxima of sel (topk_row), in one pass over the
 * row where the score is lane-wise (sigmoid), else in a second pass over the scores. */
static const float *scores_lanes(const xte_router_args *a, const float *x, float *sc, float *sel,
                                 float *mx, const float *zb) {
  const int E = (int)a->E, V = XTE_MOE_VW;
  const float *b = a->bias ? a->bias : zb, *scp = sc;
  xv acc0 = xv_1(xte_bits_f32(0xFF800000u)), acc1 = acc0;
  int e = 0;
  if (a->score == XTE_MOE_SIGMOID) {
    for (; e + 2 * V <= E; e += 2 * V) {
      xv s0 = xv_sigmoidf(xv_ld(x + e)), s1 = xv_sigmoidf(xv_ld(x + e + V));
      xv_st(sc + e, s0);
      xv_st(sc + e + V, s1);
      s0 = xv_add(s0, xv_ld(b + e));
      s1 = xv_add(s1, xv_ld(b + e + V));
      xv_st(sel + e, s0);
      xv_st(sel + e + V, s1);
      acc0 = xv_max(s0, acc0);
      acc1 = xv_max(s1, acc1);
    }
    for (; e + V <= E; e += V) {
      xv s0 = xv_sigmoidf(xv_ld(x + e));
      xv_st(sc + e, s0);
      s0 = xv_add(s0, xv_ld(b + e));
      xv_st(sel + e, s0);
      acc0 = xv_max(s0, acc0); /* at most one: e = 0 mod 16, lanes e + i */
    }
    for (; e < E; e++) {
      sc[e] = xte_moe_score(x[e], XTE_MOE_SIGMOID);
      sel[e] = sc[e] + b[e];
    }
  } else {
    if (a->score != XTE_MOE_SOFTMAX)
      score_row(x, E, a->score, sc);
    else if (a->pre_softmax)
      softmax_all(x, E, sc);
    else
      scp = x;
    for (; e + 2 * V <= E; e += 2 * V) {
      xv s0 = xv_add(xv_ld(scp + e), xv_ld(b + e)),
         s1 = xv_add(xv_ld(scp + e + V), xv_ld(b + e + V));
      xv_st(sel + e, s0);
      xv_st(sel + e + V, s1);
      acc0 = xv_max(s0, acc0);
      acc1 = xv_max(s1, acc1);
    }
    for (; e < E; e++) sel[e] = scp[e] + b[e];
  }
  /* lane i of the maxima: the experts e = i mod 16 (AVX-512: both accumulators; AVX2: acc0 the
   * first 8 of each 16-group, acc1 the second 8) */
  if (V == 16) {
    xv_st(mx, xv_max(acc0, acc1));
  } else {
    xv_st(mx, acc0);
    xv_st(mx + V, acc1);
  }
  return scp;
}
#endif

static void router_row(const xte_router_args *a, int64_t t, router_ws *ws) {
  const int E = (int)a->E, k = a->topk;
  int *idx = ws->idx, *asc = ws->asc, e, j, n;
  float *sc = ws->sc, *sel = ws->sel, *w = ws->w;
  const float *x, *scp = sc, *mx = NULL;
  uint8_t *allowed = ws->allowed;
  int softmax = a->score == XTE_MOE_SOFTMAX;
  if (a->logits.dtype == XTE_DTYPE_FP32) {
    x = (const float *)a->logits.data + t * a->logits.ld;
  } else {
    load_row(&a->logits, t, E, ws->x);
    x = ws->x;
  }
#ifdef XTE_MOE_VW
  float mxv[16];
  if (!a->aux && a->num_groups <= 1 && E >= 4 * 16) {
    scp = scores_lanes(a, x, sc, sel, mxv, ws->zb);
    mx = mxv;
    if (a->saved.data && (!softmax || a->pre_softmax))
      memcpy((float *)a->saved.data + t * a->saved.ld, sc, (size_t)E * 4);
  } else
#endif
  {
    /* scores */
    if (softmax) {
      if (a->pre_softmax)
        softmax_all(x, E, sc);
      else
        for (e = 0; e < E; e++) sc[e] = x[e];
    } else {
      score_row(x, E, a->score, sc);
    }
    if (a->aux && !softmax) { /* aux scores: normalised over all E, for every topk (as TE) */
      float s = 0.0f;
      for (e = 0; e < E; e++) s = xte_add_nanprop(s, sc[e]);
      s = xte_add_nanprop(s, XTE_MOE_NORM_EPS);
      if (a->saved.data) memcpy((float *)a->saved.data + t * a->saved.ld, sc, (size_t)E * 4);
      for (e = 0; e < E; e++) sc[e] = xte_div_nanprop(sc[e], s);
    } else if (a->saved.data && (!softmax || a->pre_softmax)) {
      memcpy((float *)a->saved.data + t * a->saved.ld, sc, (size_t)E * 4);
    }
    /* selection scores */
    for (e = 0; e < E; e++) sel[e] = a->bias ? sc[e] + a->bias[e] : sc[e];
  }
  if (a->num_groups > 1) {
    const int G = a->num_groups, gs = E / G, per = k / a->group_topk;
    float *gv = ws->gv, *tv = ws->tv;
    int *gidx = ws->gidx, *ti = ws->ti, g;
    int ng = 0;
    for (g = 0; g < G; g++) {
      float s = 0.0f;
      int m = 0;
      for (e = g * gs; e < (g + 1) * gs; e++) xte_moe_topk_insert(tv, ti, &m, per, sel[e], e);
      for (j = 0; j < m; j++) s = xte_add_nanprop(s, tv[j]);
      xte_moe_topk_insert(gv, gidx, &ng, a->group_topk, s, g);
    }
    memset(allowed, 0, (size_t)E);
    for (j = 0; j < ng; j++) memset(allowed + gidx[j] * gs, 1, (size_t)gs);
    n = topk_row(sel, E, allowed, k, NULL, idx, asc, &ws->ts);
  } else if (a->qb) {
    /* Quantile Balancing: the top k + 1, then the last in rank order is dropped (out of asc
     * too); its biased score is the token's cutoff */
    int d = 0;
    n = topk_row(sel, E, NULL, k + 1, mx, idx, asc, &ws->ts);
    ((float *)a->cutoff.data)[t * a->cutoff.ld] = sel[idx[k]];
    for (j = 0; j < n; j++)
      if (asc[j] != idx[k]) asc[d++] = asc[j];
    n = k;
  } else {
    n = topk_row(sel, E, NULL, k, mx, idx, asc, &ws->ts);
  }
  /* weights (unbiased scores); w is read at the selected experts only, but for aux (all set)
   * and the saved post-top-k softmax (0 elsewhere) */
  if (a->aux) {
    for (e = 0; e < E; e++) w[e] = scp[e];
  } else if (softmax && !a->pre_softmax) {
    for (e = 0; e < E; e++) w[e] = 0.0f;
    softmax_set(scp, asc, n, w);
    if (a->saved.data) memcpy((float *)a->saved.data + t * a->saved.ld, w, (size_t)E * 4);
  } else if (!softmax && k > 1) {
    float s = 0.0f;
    for (j = 0; j < n; j++) s = xte_add_nanprop(s, scp[asc[j]]);
    s = xte_add_nanprop(s, XTE_MOE_NORM_EPS);
    for (j = 0; j < n; j++) w[asc[j]] = xte_div_nanprop(scp[asc[j]], s);
  } else {
    for (j = 0; j < n; j++) w[asc[j]] = scp[asc[j]];
  }
  /* outputs */
  if (a->probs.data) {
    float *p = (float *)a->probs.data + t * a->probs.ld;
#ifdef XTE_MOE_VW
    if (ws->stream) {
      if (a->aux) {
        stream_row(p, w, (size_t)E * 4);
      } else {
        for (j = 0; j < n; j++) ws->pr[idx[j]] = xte_mul_nanprop(a->scaling, w[idx[j]]);
        stream_row(p, ws->pr, (size_t)E * 4);
        for (j = 0; j < n; j++) ws->pr[idx[j]] = 0.0f;
      }
    } else
#endif
        if (a->aux) {
      for (e = 0; e < E; e++) p[e] = w[e];
    } else {
      for (e = 0; e < E; e++) p[e] = 0.0f;
      for (j = 0; j < n; j++) p[idx[j]] = xte_mul_nanprop(a->scaling, w[idx[j]]);
    }
  }
  if (a->map.data) {
    uint8_t *m = (uint8_t *)a->map.data + t * a->map.ld;
#ifdef XTE_MOE_VW
    if (ws->stream) {
      for (j = 0; j < n; j++) ws->mr[idx[j]] = 1;
      stream_row(m, ws->mr, (size_t)E);
      for (j = 0; j < n; j++) ws->mr[idx[j]] = 0;
    } else
#endif
    {
      memset(m, 0, (size_t)E);
      for (j = 0; j < n; j++) m[idx[j]] = 1;
    }
  }
  if (a->bits.data) {
    uint8_t *b = (uint8_t *)a->bits.data + t * a->bits.ld;
    memset(b, 0, (size_t)((E + 7) / 8));
    for (j = 0; j < n; j++) b[idx[j] / 8] |= (uint8_t)(1u << (idx[j] % 8));
  }
  if (a->idx.data) {
    if (a->idx.dtype == XTE_DTYPE_INT32) {
      int32_t *io = (int32_t *)a->idx.data + t * a->idx.ld;
      for (j = 0; j < k; j++) io[j] = j < n ? idx[j] : -1;
    } else {
      int64_t *io = (int64_t *)a->idx.data + t * a->idx.ld;
      for (j = 0; j < k; j++) io[j] = j < n ? idx[j] : -1;
    }
  }
  if (a->weights.data) {
    float *wo = (float *)a->weights.data + t * a->weights.ld;
    for (j = 0; j < k; j++) wo[j] = j < n ? xte_mul_nanprop(a->scaling, w[idx[j]]) : 0.0f;
  }
}

/* A driver's context: the arguments and the per-thread workspaces (stride bytes apart). */
typedef struct router_ctx {
  const void *a;
  char *ws;
  size_t stride;
} router_ctx;

/* Runs fn over the T rows with one workspace of nf arrays per thread, sized by checked
 * arithmetic; nothing is written when it cannot be allocated. */
static xte_status run_rows(const void *a, int64_t T, int64_t E, int nf, xte_range_fn fn) {
  router_ctx c;
  size_t total;
  int nt = xte_cpu_threads();
  if (nt < 1) nt = 1;
  if (T <= 0) return XTE_SUCCESS;
  if (T < nt) nt = (int)T;
  if (!router_ws_bytes(E, nf, &c.stride) || !xte_moe_ws_bytes(nt, (int64_t)c.stride, 0, &total) ||
      !(c.ws = (char *)xte_aligned_alloc(total)))
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "router workspace (%lld experts, %d threads)",
                         (long long)E, nt);
  c.a = a;
  xte_parallel_for_max(T, nt, fn, &c);
  xte_aligned_free(c.ws);
  return XTE_SUCCESS;
}

static void router_range(void *ctx, int64_t b, int64_t e, int tid) {
  const router_ctx *c = (const router_ctx *)ctx;
  const xte_router_args *a = (const xte_router_args *)c->a;
  router_ws ws;
  int64_t t;
  router_ws_init(&ws, c->ws + (size_t)tid * c->stride, a->E);
  ws.stream = 0;
#ifdef XTE_MOE_VW
  ws.stream = a->T * a->E * 4 >= XTE_MOE_STREAM_BYTES;
#endif
  for (t = b; t < e; t++) router_row(a, t, &ws);
#ifdef XTE_MOE_VW
  if (ws.stream) xv_sfence();
#endif
}

/* The Quantile Balancing histogram: one expert per work item, tokens ascending (no shared
 * counters; int32 counts wrap as TE's atomics do). */
static void qb_hist_range(void *ctx, int64_t b, int64_t e, int tid) {
  const xte_router_args *a = (const xte_router_args *)ctx;
  const float scale = xte_moe_qb_scale(a->qb_lower, a->qb_upper, a->qb_bins);
  int64_t x, t;
  (void)tid;
  for (x = b; x < e; x++) {
    uint32_t *h = (uint32_t *)a->hist.data + x * a->hist.ld;
    for (t = 0; t < a->T; t++) {
      const float c = ((const float *)a->cutoff.data)[t * a->cutoff.ld];
      const float sc = ((const float *)a->saved.data)[t * a->saved.ld + x];
      h[xte_moe_qb_bin(c, sc, a->qb_lower, scale, a->qb_bins)] += 1u;
    }
  }
}

xte_status XTE_MOE_NAME(xte_cpu_moe_router_forward)(const xte_router_args *a, void *handle) {
  (void)handle;
  XTE_TRY(run_rows(a, a->T, a->E, NF_FWD, router_range));
  if (a->qb && a->T > 0) xte_parallel_for(a->E, qb_hist_range, (void *)a);
  return XTE_SUCCESS;
}

/* ---------------------------------------------------------------- backward */

static void router_bwd_row(const xte_router_bwd_args *a, int64_t t, float *dp, float *gx, float *x,
                           float *gs) {
  const int E = (int)a->E;
  const float *g = (const float *)a->grad_probs.data + t * a->grad_probs.ld;
  /* the aux-score backward has no routing map (a->aux): no row pointer into NULL */
  const uint8_t *m = a->map.data ? (const uint8_t *)a->map.data + t * a->map.ld : NULL;
  const float *s = (const float *)a->saved.data + t * a->saved.ld;
  int e;
  for (e = 0; e < E; e++) dp[e] = (a->aux || m[e]) ? xte_mul_nanprop(a->scaling, g[e]) : 0.0f;
  if (a->score == XTE_MOE_SOFTMAX) {
    /* p = saved (0 off the set for the post-top-k softmax): gx_i = p_i (dp_i - sum_j p_j dp_j) */
    float dot = 0.0f;
    for (e = 0; e < E; e++) dot = xte_fma_nanprop(s[e], dp[e], dot);
    for (e = 0; e < E; e++) gx[e] = xte_mul_nanprop(s[e], xte_sub_nanprop(dp[e], dot));
  } else {
    if (a->logits.data)
      load_row(&a->logits, t, E, x);
    else
      for (e = 0; e < E; e++) x[e] = 0.0f;
    if (a->topk > 1 || a->aux) {
      /* w_i = s_i / D over the set S (aux: all E, for every topk), D = sum_S s + eps:
       * gs_j = (dp_j - (sum_S dp_e s_e) / D) / D on S, 0 off S */
      float D = 0.0f, dot = 0.0f;
      for (e = 0; e < E; e++)
        if (a->aux || m[e]) D = xte_add_nanprop(D, s[e]);
      D = xte_add_nanprop(D, XTE_MOE_NORM_EPS);
      for (e = 0; e < E; e++)
        if (a->aux || m[e]) dot = xte_fma_nanprop(dp[e], s[e], dot);
      for (e = 0; e < E; e++)
        gs[e] = (a->aux || m[e])
                    ? xte_div_nanprop(xte_sub_nanprop(dp[e], xte_div_nanprop(dot, D)), D)
                    : 0.0f;
    } else {
      for (e = 0; e < E; e++) gs[e] = dp[e];
    }
    for (e = 0; e < E; e++) gx[e] = xte_mul_nanprop(gs[e], xte_moe_dscore(s[e], x[e], a->score));
  }
  store_row(&a->grad_logits, t, E, gx);
}

static void router_bwd_range(void *ctx, int64_t b, int64_t e, int tid) {
  const router_ctx *c = (const router_ctx *)ctx;
  const xte_router_bwd_args *a = (const xte_router_bwd_args *)c->a;
  const size_t n = (size_t)ws_elems(a->E);
  float *f = (float *)(c->ws + (size_t)tid * c->stride);
  int64_t t;
  for (t = b; t < e; t++) router_bwd_row(a, t, f, f + n, f + 2 * n, f + 3 * n);
}

xte_status XTE_MOE_NAME(xte_cpu_moe_router_backward)(const xte_router_bwd_args *a, void *handle) {
  (void)handle;
  return run_rows(a, a->T, a->E, 4, router_bwd_range);
}

#ifdef XTE_MOE_GENERIC
/* ---------------------------------------------------------------- aux loss
 * Column sums of probs in fp64: tokens in fixed blocks of AUX_BLOCK rows, each block summed in
 * ascending token order, the block partials added in block order; then
 * aux = fp32( C64 * sum_e (colsum_e * tpe_e) ) with C64 = E * coeff / (topk * N^2) in fp64,
 * experts ascending. The plain loops leave the NaN bits to the compiler's operand order, so a NaN
 * total is recomputed in the same order through the NaN-rule helpers (first NaN operand as
 * written, the accumulator before the addend, as the CUDA kernels do); a NaN anywhere reaches
 * the total, and without one both give the same bits. */
#define AUX_BLOCK 1024

typedef struct aux_ctx {
  const xte_aux_loss_args *a;
  double *partial; /* [nblocks, E] */
  int nanrule;     /* through the NaN-rule helpers */
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
      if (c->nanrule)
        for (j = 0; j < a->E; j++) p[j] = xte_add_f64_nanprop(p[j], xte_f32_to_f64(row[j]));
      else
        for (j = 0; j < a->E; j++) p[j] += (double)row[j];
    }
  }
}

static double tpe_at(const xte_moe_view *v, int64_t e) {
  switch (v->dtype) {
    case XTE_DTYPE_INT32:
      return (double)((const int32_t *)v->data)[e];
    case XTE_DTYPE_INT64:
      return (double)((const int64_t *)v->data)[e];
    case XTE_DTYPE_FP32:
      return xte_f32_to_f64(((const float *)v->data)[e]);
    default:
      return xte_f32_to_f64(xte_bf16_to_f32(((const uint16_t *)v->data)[e]));
  }
}

static void aux_bwd_range(void *vctx, int64_t b, int64_t e, int tid) {
  const xte_aux_loss_args *a = (const xte_aux_loss_args *)vctx;
  const double C =
      (double)a->num_experts * (double)a->coeff / ((double)a->topk * (double)a->N * (double)a->N);
  int64_t t, j;
  (void)tid;
  for (t = b; t < e; t++) {
    float *row = (float *)a->grad_probs.data + t * a->grad_probs.ld;
    for (j = 0; j < a->E; j++)
      row[j] = xte_mul_nanprop(xte_f64_to_f32(C * tpe_at(&a->tpe, j)), a->grad_aux);
  }
}

xte_status xte_cpu_moe_aux_loss(const xte_aux_loss_args *a, int backward, void *handle) {
  (void)handle;
  if (backward) {
    xte_parallel_for(a->T, aux_bwd_range, (void *)a);
  } else {
    const double C =
        (double)a->num_experts * (double)a->coeff / ((double)a->topk * (double)a->N * (double)a->N);
    int64_t nb = (a->T + AUX_BLOCK - 1) / AUX_BLOCK, blk, j;
    aux_ctx c;
    double total = 0.0;
    c.a = a;
    c.nanrule = 0;
    size_t bytes = 0;
    c.partial = NULL;
    if (xte_moe_ws_bytes(nb > 0 ? nb : 1, a->E, 0, &bytes) &&
        xte_moe_ws_bytes((int64_t)bytes, 8, 0, &bytes))
      c.partial = (double *)xte_aligned_alloc(bytes);
    if (!c.partial) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "aux loss workspace");
    xte_parallel_for(nb, aux_range, &c);
    for (j = 0; j < a->E; j++) {
      double cs = 0.0;
      for (blk = 0; blk < nb; blk++) cs += c.partial[blk * a->E + j];
      total += cs * tpe_at(&a->tpe, j);
    }
    if (xte_f64_isnan(total)) {
      c.nanrule = 1;
      xte_parallel_for(nb, aux_range, &c);
      total = 0.0;
      for (j = 0; j < a->E; j++) {
        double cs = 0.0;
        for (blk = 0; blk < nb; blk++) cs = xte_add_f64_nanprop(cs, c.partial[blk * a->E + j]);
        total = xte_add_f64_nanprop(total, xte_mul_f64_nanprop(cs, tpe_at(&a->tpe, j)));
      }
    }
    xte_aligned_free(c.partial);
    *a->aux_out = xte_f64_to_f32(xte_mul_f64_nanprop(C, total));
  }
  return XTE_SUCCESS;
}
#endif /* XTE_MOE_GENERIC */
