/* xte MoE numerics: the per-element and per-row rules of the router and of SwiGLU, shared by
 * every backend (XTE_HD static inline; CUDA / MUSA compile it as device code). Reduction orders
 * are fixed and written here; docs/numerics.md section 8 states them.
 *
 * Orders:
 *  - softmax over a set: m = fmaxf over the set (NaN ignored, from -inf); e_i = exp(x_i - m);
 *    sum = ((e_a + e_b) + e_c) + ... in ascending expert index, fp32 adds from +0; p_i = e_i / sum.
 *  - normalisation (sigmoid / sqrtsoftplus, topk > 1; the aux scores at every topk, over all E):
 *    D = (sum of the selected scores in ascending expert index, fp32 adds from +0) + 1e-20;
 *    w_i = s_i / D.
 *  - group score: the top (topk / group_topk) biased scores of the group, added in rank order
 *    (best first) from +0 in fp32.
 *  - backward dot products: fmaf(a_j, b_j, acc) over ascending expert index from +0.
 */
#ifndef XTE_MOE_NUMERICS_H
#define XTE_MOE_NUMERICS_H

#include "numerics/xte_math.h"

enum { XTE_MOE_SOFTMAX = 0, XTE_MOE_SIGMOID = 1, XTE_MOE_SQRTSOFTPLUS = 2 };

XTE_NUM_CONST float XTE_MOE_NORM_EPS = 1e-20f;

/* Rank order of the router: (va, ia) goes before (vb, ib) when va > vb, or va == vb and
 * ia < ib. NaN ranks after every number (two NaNs by index). +0 and -0 are equal. */
XTE_HD int xte_moe_before(float va, int ia, float vb, int ib) {
  int na = xte_f32_isnan(va), nb = xte_f32_isnan(vb);
  if (na || nb) return (na && nb) ? ia < ib : nb;
  if (va != vb) return va > vb;
  return ia < ib;
}

/* The score function of sigmoid / sqrtsoftplus (softmax is a row operation). */
XTE_HD float xte_moe_score(float x, int fn) {
  return fn == XTE_MOE_SIGMOID ? xte_sigmoidf(x) : xte_sqrtsoftplusf(x);
}

/* d score / d x from the saved score s (and x for sqrtsoftplus):
 * sigmoid s (1 - s); sqrtsoftplus sigmoid(x) / (2 s), 0 where s == 0. */
XTE_HD float xte_moe_dscore(float s, float x, int fn) {
  if (fn == XTE_MOE_SIGMOID) return xte_mul_nanprop(s, xte_sub_nanprop(1.0f, s));
  if (s == 0.0f) return 0.0f;
  return xte_div_nanprop(xte_sigmoidf(x), xte_mul_nanprop(2.0f, s));
}

/* Inserts (v, i) into the rank-ordered list (vals, idxs) of length *n, capacity k. */
XTE_HD void xte_moe_topk_insert(float *vals, int *idxs, int *n, int k, float v, int i) {
  int p = *n;
  if (p == k) {
    if (!xte_moe_before(v, i, vals[k - 1], idxs[k - 1])) return;
    p = k - 1;
  } else {
    (*n)++;
  }
  while (p > 0 && xte_moe_before(v, i, vals[p - 1], idxs[p - 1])) {
    vals[p] = vals[p - 1];
    idxs[p] = idxs[p - 1];
    p--;
  }
  vals[p] = v;
  idxs[p] = i;
}

/* ---------------------------------------------------------------- SwiGLU */

/* The products below follow the NaN rule (xte_mul_nanprop): silu(+-inf) * 0, 0 * inf and
 * dsilu(+-inf) create NaNs, whose bits are XTE_NAN_INVALID on every backend. */

/* y = silu(g) * u */
XTE_HD float xte_swiglu_fwd(float g, float u) {
  return xte_mul_nanprop(xte_siluf(g), u);
}

/* dsilu(g) = sig(g) * fmaf(g, 1 - sig(g), 1); NaN g gives g quieted, +-inf (inf * 0 inside)
 * XTE_NAN_INVALID. */
XTE_HD float xte_dsilu(float g) {
  float s;
  if (xte_f32_isnan(g)) return xte_f32_quiet(g);
  if (xte_f32_isinf(g)) return xte_bits_f32(XTE_NAN_INVALID);
  s = xte_sigmoidf(g);
  return s * xte_fmaf(g, 1.0f - s, 1.0f);
}

/* d_gate = (dy * u) * dsilu(g) */
XTE_HD float xte_dswiglu_gate(float dy, float g, float u) {
  return xte_mul_nanprop(xte_mul_nanprop(dy, u), xte_dsilu(g));
}

/* d_up = dy * silu(g) */
XTE_HD float xte_dswiglu_up(float dy, float g) {
  return xte_mul_nanprop(dy, xte_siluf(g));
}

#endif /* XTE_MOE_NUMERICS_H */
