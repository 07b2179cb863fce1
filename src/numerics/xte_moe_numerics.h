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

/* Quantile Balancing bins (TE's reference, in its fp32 operation order):
 * scale = fp32(fp32(1 / (upper - lower)) * num_bins) (torch's num_bins / tensor is a reciprocal
 * times the scalar); v = ((cutoff - score) - lower) * scale, each step rounded to fp32;
 * bin = clamp(floor(v), 0, num_bins - 1), with NaN, +-inf and v >= 2^63 in bin 0 (x86's float to
 * int64 conversion gives INT64_MIN for them, which the clamp takes to 0). */
XTE_HD float xte_moe_qb_scale(float lower, float upper, int64_t num_bins) {
  return (1.0f / (upper - lower)) * (float)num_bins;
}
XTE_HD int64_t xte_moe_qb_bin(float cutoff, float score, float lower, float scale,
                              int64_t num_bins) {
  const float v = ((cutoff - score) - lower) * scale;
  if (!(v >= 0.0f) || v >= 9223372036854775808.0f) return 0;
  if (v >= (float)num_bins) return num_bins - 1;
  return (int64_t)v;
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

/* ---------------------------------------------------------------- aux loss (fp64)
 * The aux loss sums in fp64 (docs/numerics.md section 8). The CPU's bytes are x86's: a NaN
 * operand comes back quieted with its sign and payload (the first one when both are NaN), a NaN
 * an operation creates (inf - inf, inf * 0) is 0xFFF8000000000000, and the fp32 <-> fp64
 * conversions keep a NaN's sign and the top of its payload. GPUs give 0x7FFFFFFFFFFFFFFF /
 * 0x7FFFFFFF instead, so their kernels take these steps, whose bits are x86's on every backend
 * (the XTE_NAN_SIM build models the GPU's NaNs here too). */
XTE_HD int xte_f64_isnan(double d) {
  return (xte_f64_bits(d) & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull;
}

XTE_HD double xte_hwnan64(double r) {
#ifdef XTE_NAN_SIM
  if (xte_f64_isnan(r)) return xte_bits_f64(0x7FFFFFFFFFFFFFFFull);
#endif
  return r;
}

/* xte_nan2 for fp64: r, or the first NaN operand quieted, or x86's default NaN. */
XTE_HD double xte_nan2_f64(double a, double b, double r) {
  if (!xte_f64_isnan(r)) return r;
  if (xte_f64_isnan(a)) return xte_bits_f64(xte_f64_bits(a) | 0x0008000000000000ull);
  if (xte_f64_isnan(b)) return xte_bits_f64(xte_f64_bits(b) | 0x0008000000000000ull);
  return xte_bits_f64(0xFFF8000000000000ull);
}

XTE_HD double xte_add_f64_nanprop(double a, double b) {
  return xte_nan2_f64(a, b, xte_hwnan64(a + b));
}
XTE_HD double xte_mul_f64_nanprop(double a, double b) {
  return xte_nan2_f64(a, b, xte_hwnan64(a * b));
}

/* (double)x; a NaN keeps its sign and payload (moved up 29 bits), quieted. */
XTE_HD double xte_f32_to_f64(float x) {
  const uint32_t u = xte_f32_bits(x);
  if (!xte_f32_isnan(x)) return (double)x;
  return xte_bits_f64(((uint64_t)(u >> 31) << 63) | 0x7FF0000000000000ull |
                      ((uint64_t)((u & 0x007FFFFFu) | 0x00400000u) << 29));
}

/* (float)x, rounded to nearest even; a NaN keeps its sign and the top 23 bits of its payload,
 * quieted. */
XTE_HD float xte_f64_to_f32(double x) {
  const uint64_t u = xte_f64_bits(x);
  if (!xte_f64_isnan(x)) return (float)x;
  return xte_bits_f32((uint32_t)(u >> 63) << 31 | 0x7FC00000u |
                      (uint32_t)((u >> 29) & 0x007FFFFFu));
}

/* One step of the unpermute backward's grad_probs dot product (token movement): acc + a b in
 * fp64. The product of two fp32 values is exact in fp64, so only the running sum rounds, to fp64:
 * a dot over thousands of hidden elements stays within an fp32 ulp or so of the exact one once
 * rounded (xte_f64_to_f32), where an fp32 chain drifts by ~sqrt(H) ulps. NaN: the first NaN of
 * acc, a, b, quieted; inf * 0 and inf - inf give x86's default NaN (xte_nan2_f64). */
XTE_HD double xte_dot_step_f64(double acc, float a, float b) {
  return xte_add_f64_nanprop(acc, xte_mul_f64_nanprop(xte_f32_to_f64(a), xte_f32_to_f64(b)));
}

#endif /* XTE_MOE_NUMERICS_H */
