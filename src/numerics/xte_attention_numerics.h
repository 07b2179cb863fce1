/* Attention per-element numerics, shared by every backend (C11 and CUDA / MUSA C++).
 *
 * The contract (docs/numerics.md, "Attention"; section 7):
 *  - logits x are in natural units (x = s * scale, softcap, ALiBi); a probability is
 *    p = xte_expf(x - m) with m the running max (forward); the backward renormalises its rows:
 *    u = xte_expf(x - LSE) for dQ (divided by lambda = the row's sum64 of u at the end), then
 *    p = xte_expf((x - LSE) - logf(lambda)) for dK / dV (docs/numerics.md, section 7);
 *  - KV is processed in blocks of XTE_ATTN_BN = 64 keys, block b holding keys [64 b, 64 b + 64)
 *    of the sequence; a block is processed for row i only when one of its keys is visible to i;
 *  - per processed block (online softmax, fp32):
 *        m_blk = max_j x_j, m_new = max(m, m_blk), alpha = expf(m - m_new),
 *        p_j = expf(x_j - m_new) (0 for hidden keys), l = fmaf(l, alpha, sum64(p)),
 *        o_c = fmaf(o_c, alpha, pv_c), pv_c = the fmaf chain over the block's keys from +0;
 *  - finally o_c = o_c / l, LSE = m + log(l) (0 and -inf when l = 0);
 *  - every dot product is one fmaf chain in increasing k from +0; every long gradient sum is
 *    blocked: a chain from +0 per KV block (dQ) or per 64-row query tile (dK, dV), the blocks'
 *    sums added in increasing order (xte_attn_add).
 */
#ifndef XTE_ATTENTION_NUMERICS_H
#define XTE_ATTENTION_NUMERICS_H

#include "numerics/xte_math.h"
#include "numerics/xte_numerics.h"

#define XTE_ATTN_BN 64 /* keys per KV block */
#define XTE_ATTN_BM 64 /* query rows per query tile (the dK / dV sum's blocks) */

XTE_HD float xte_attn_neg_inf(void) {
  return xte_bits_f32(0xFF800000u);
}

/* Score parameters of one (batch, head). */
typedef struct xte_attn_score {
  float scale;  /* the softmax scale (backward: dx/ds without softcap) */
  float cap_in; /* scale / cap */
  float cap;    /* the softcap */
  float slope;  /* ALiBi slope, 0 when no ALiBi */
  int softcap, alibi;
} xte_attn_score;

/* scale: the softmax scale (already including any FP8 descale factors, see the driver). */
XTE_HD xte_attn_score xte_attn_score_make(float scale, float cap, int alibi, float slope) {
  xte_attn_score p;
  p.scale = scale;
  p.softcap = cap > 0.0f;
  p.cap_in = p.softcap ? scale / cap : 0.0f;
  p.cap = p.softcap ? cap : 0.0f;
  p.alibi = alibi;
  p.slope = alibi ? slope : 0.0f;
  return p;
}

/* The default softmax scale 1 / sqrt(d). */
XTE_HD float xte_attn_default_scale(int64_t d) {
  return 1.0f / xte_sqrtf((float)d);
}

/* The logit x (natural units) of a raw dot product s; dist = i + off - j (ALiBi). */
XTE_HD float xte_attn_logit(float s, const xte_attn_score *p, int64_t dist) {
  float x;
  if (p->softcap)
    x = xte_tanhf(s * p->cap_in) * p->cap;
  else
    x = s * p->scale;
  if (p->alibi) {
    float a = (float)(dist < 0 ? -dist : dist);
    x = xte_fmaf(-a, p->slope, x);
  }
  return x;
}

/* e^(x - m): a probability (m the running max or the LSE), or the online softmax's rescale
 * factor (x the old max, m the new one). -inf - m gives +0. */
XTE_HD float xte_attn_exp(float x, float m) {
  return xte_expf(x - m);
}

/* d x / d s: the factor turning dL/dx into dL/ds. */
XTE_HD float xte_attn_dlogit(float s, const xte_attn_score *p) {
  if (p->softcap) {
    float th = xte_tanhf(s * p->cap_in);
    return xte_fmaf(-th, th, 1.0f) * p->scale;
  }
  return p->scale;
}

/* Visible keys of row i: [*lo, *hi) (empty when *lo >= *hi). mask: xte_attn_mask. */
XTE_HD void xte_attn_row_range(int64_t i, int64_t lq, int64_t lkv, int mask, int64_t wl, int64_t wr,
                               int64_t *lo, int64_t *hi) {
  int64_t off = lkv - lq, a = 0, b = lkv;
  if (mask == 1 && i + 1 < b) b = i + 1;
  if (mask == 2 && i + off + 1 < b) b = i + off + 1;
  if (wr >= 0 && i + off + wr + 1 < b) b = i + off + wr + 1;
  if (wl >= 0 && i + off - wl > a) a = i + off - wl;
  *lo = a;
  *hi = b;
}

/* The sum of 64 values in the fixed order: 16 lanes, lane L = ((p[L] + p[16+L]) + p[32+L]) +
 * p[48+L]; then halving: lane L += lane L+8 (L < 8), += L+4 (L < 4), += L+2 (L < 2), lane 0 +
 * lane 1. */
XTE_HD float xte_attn_sum64(const float *p) {
  float v[16];
  int L;
  for (L = 0; L < 16; L++) v[L] = ((p[L] + p[16 + L]) + p[32 + L]) + p[48 + L];
  for (L = 0; L < 8; L++) v[L] = v[L] + v[L + 8];
  for (L = 0; L < 4; L++) v[L] = v[L] + v[L + 4];
  for (L = 0; L < 2; L++) v[L] = v[L] + v[L + 2];
  return v[0] + v[1];
}

/* The online-softmax state update of one row for one block: returns alpha, updates m. */
XTE_HD float xte_attn_new_max(float *m, float m_blk) {
  float m_new = xte_fmaxf(*m, m_blk);
  float alpha = xte_attn_exp(*m, m_new);
  *m = m_new;
  return alpha;
}

/* The output accumulator of one row after a block: o * alpha + the block's sum pv, one rounding. */
XTE_HD float xte_attn_rescale(float o, float alpha, float pv) {
  return xte_fmaf(o, alpha, pv);
}

/* A blocked sum's step: the running sum plus the next block's sum (a chain from +0). */
XTE_HD float xte_attn_add(float acc, float block_sum) {
  return acc + block_sum;
}

/* The final output of one row: o / l (l > 0). */
XTE_HD float xte_attn_finish(float o, float l) {
  return o / l;
}

/* The value of every output of a row whose sum l is NaN (a NaN in q, in a visible key or in
 * its logit): the canonical quiet NaN, the same bits on every backend. */
XTE_HD float xte_attn_nan(void) {
  return xte_bits_f32(0x7FC00000u);
}

/* Final LSE (natural log) from the max m and the sum l: -inf when no key is visible (l == 0),
 * the canonical NaN when l is NaN. */
XTE_HD float xte_attn_lse(float m, float l) {
  if (xte_f32_isnan(l)) return xte_attn_nan();
  if (!(l > 0.0f)) return xte_attn_neg_inf();
  return m + xte_logf(l);
}

/* dL/ds of one element: (p * (dp - D)) * dlogit. */
XTE_HD float xte_attn_ds(float p, float dp, float D, float g) {
  return (p * (dp - D)) * g;
}

#endif /* XTE_ATTENTION_NUMERICS_H */
