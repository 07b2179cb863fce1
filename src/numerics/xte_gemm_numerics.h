/* xte GEMM numerics: the per-element rules of the exact GEMM contract (include/xte/gemm.h),
 * shared by every backend. Build with -ffp-contract=off; fused multiply-adds are written.
 *
 * Exactness of the block partial sum_k a_k * b_k (fp64 FMA chain, any order):
 *  - e4m3 x e4m3: every product is an integer times 2^-18 below 2^17.7 in magnitude; 128 of
 *    them sum below 2^24.7, i.e. fewer than 2^43 units: exact in fp64.
 *  - e4m3 x e5m2 (either side): the e5m2 operand is split into the class |v| >= 1 (and NaN, inf)
 *    and the class |v| < 1. Class |v| >= 1: products are multiples of 2^-11 below 2^24.62, 128
 *    of them below 2^31.62: 42.7 bits. Class |v| < 1: multiples of 2^-25 below 448, 128 of them
 *    below 2^15.81: 40.9 bits. Each class sum is exact in fp64; the two are added and rounded
 *    ONCE to fp32 by xte_gemm_round2_f32 (round to odd in fp64, then RNE to fp32, which equals
 *    RNE of the exact sum since 53 >= 24 + 2).
 *  - MXFP8 blocks (32) are shorter, so the same bounds hold.
 */
#ifndef XTE_GEMM_NUMERICS_H
#define XTE_GEMM_NUMERICS_H

#include <stdint.h>

#include "numerics/xte_math.h"
#include "numerics/xte_numerics.h"

/* Exact fp8 value as fp64 (NaN codes give NaN, e5m2 inf gives inf). */
XTE_HD double xte_fp8_to_f64(uint8_t b, int fmt) {
  return (double)xte_fp8_to_f32(b, fmt);
}

/* One step of a block partial: acc + a * b, exact (a * b is an exact product of two FP8 values and
 * every partial sum of a block's class is exact, see the header comment), so the fused and the
 * unfused forms give the same value: GPU kernels take the fused one (one DFMA), host code (the
 * SIMT runner, no FMA unit assumed) the plain one. */
XTE_HD double xte_gemm_dot_step(double acc, double a, double b) {
#if (defined(__CUDACC__) || defined(__MUSACC__)) && \
    (defined(__CUDA_ARCH__) || defined(__MUSA_ARCH__))
  return __fma_rn(a, b, acc);
#else
  return acc + a * b;
#endif
}

/* The two magnitude classes of an e5m2 operand (see the header comment). */
XTE_HD double xte_gemm_class_hi(double v) {
  return (v < 1.0 && v > -1.0) ? 0.0 : v;
}
XTE_HD double xte_gemm_class_lo(double v) {
  return (v < 1.0 && v > -1.0) ? v : 0.0;
}

/* RNE_fp32(h + l) of two exact fp64 values, computed exactly: TwoSum gives s + e = h + l, s is
 * moved to round-to-odd (truncate toward zero, then set the last bit when inexact), then rounded
 * to fp32. Non-finite h or l: IEEE h + l (e is NaN then and no fix-up happens). */
XTE_HD float xte_gemm_round2_f32(double h, double l) {
  double s = h + l;
  double t = s - h;
  double e = (h - (s - t)) + (l - t);
  if (e != 0.0 && e == e) {
    uint64_t u = xte_f64_bits(s);
    if ((u >> 63) != (xte_f64_bits(e) >> 63)) u -= 1u;
    u |= 1u;
    s = xte_bits_f64(u);
  }
  return (float)s;
}

/* One K block: acc = xte_fmaf(p, RNE_fp32(sa * sb), acc). */
XTE_HD float xte_gemm_block_update(float acc, float p, float sa, float sb) {
  float s = sa * sb;
  return xte_fmaf(p, s, acc);
}

/* The epilogue in fp32: t = acc (+ C) (+ bias), one RNE addition each. */
XTE_HD float xte_gemm_epilogue(float acc, int has_c, float c, int has_bias, float bias) {
  float t = acc;
  if (has_c) t = t + c;
  if (has_bias) t = t + bias;
  return t;
}

/* Output conversions: RNE, NaN canonical. */
XTE_HD float xte_gemm_out_f32(float t) {
  return xte_f32_isnan(t) ? xte_bits_f32(0x7FC00000u) : t;
}
XTE_HD uint16_t xte_gemm_out_bf16(float t) {
  return xte_f32_isnan(t) ? (uint16_t)0x7FC0u : xte_f32_to_bf16(t);
}

#endif /* XTE_GEMM_NUMERICS_H */
