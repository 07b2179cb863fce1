/* The MoE vector lanes: lane-wise xte_expf / xte_sigmoidf over the XTE_MOE_VW-lane layer that
 * src/cpu/avx2/moe_avx2.c and src/cpu/avx512/moe_avx512.c define, shared by the router
 * (src/cpu/moe_router.c) and SwiGLU (src/cpu/moe_swiglu.c) of one ISA build. Nothing without
 * XTE_MOE_VW (the generic build calls the scalar functions). */
#ifndef XTE_CPU_MOE_LANES_H
#define XTE_CPU_MOE_LANES_H

#ifdef XTE_MOE_VW
/* ---------------------------------------------------------------- lanes
 * Lane-wise transcriptions of xte_expf and xte_sigmoidf (src/numerics/xte_math.h): the same
 * constants, the same IEEE operations in the same order, the branches as selects, so every lane
 * gives the scalar function's bits. The including file (src/cpu/avx2/moe_avx2.c,
 * src/cpu/avx512/moe_avx512.c) defines XTE_MOE_VW lanes, the vector / mask types xv / xm and the
 * operations xv_*: ld, st, 1 (broadcast), add, sub, mul, div, fma, fnma(a, b, c) = c - a b fused
 * (the same bits as fma(-a, b, c)), neg (sign flip), negif(m, a) = m ? -a : a, round (nearest,
 * ties to even), gt / ge / lt / le / eq (ordered compares), nan, max(a, b) = a > b ? a : b (b
 * when either is NaN: x86 maxps), sel(m, a, b) = m ? a : b, pow2 (2^k for an integral k in the
 * normal exponent range), ldexp(y, k) = RN(y 2^k) for an integral k in [-125, 127] (with
 * XTE_MOE_SCALEF: in [-150, 128], one rounding), and for masks xm_and, xm_bits (one bit per
 * lane) and XTE_MOE_VMASK (every lane's bit); xv_cand(dst, m, base) writes base + the lanes set
 * in m, ascending, to dst (VW ints written) and counts them; xv_stream(p, v) is a non-temporal
 * store to p (VW * 4-byte aligned), xv_sfence() orders them. */
static inline xv xv_expm1_poly(xv r) {
  xv p = xv_1(2.48015873015873e-05f);
  p = xv_fma(p, r, xv_1(1.98412698412698e-04f));
  p = xv_fma(p, r, xv_1(1.38888888888889e-03f));
  p = xv_fma(p, r, xv_1(8.33333333333333e-03f));
  p = xv_fma(p, r, xv_1(4.16666666666667e-02f));
  p = xv_fma(p, r, xv_1(1.66666666666667e-01f));
  p = xv_fma(p, r, xv_1(0.5f));
  return xv_fma(p, xv_mul(r, r), r);
}

/* xte_expf. k = rint(x log2e): xte_rint_small's (t + magic) - magic, or the rounding
 * instruction, which differs only in the sign of a zero k; -k ln2 + x is then x whichever the
 * sign (x != 0), or +-0 for x = +-0, where expm1_poly(+-0) = +0 alike. xte_ldexp_small(y, k) =
 * RN(y 2^k) is (y 2^k1) 2^k2 with an exact first product: k1 = 1, k2 = k - 1 above 127;
 * k1 = k + 64, k2 = -64 below -125; else k1 = k, k2 = 0, the one rounding of y 2^k. */
static inline xv xv_expf(xv x) {
  xv k = xv_round(xv_mul(x, xv_1(1.44269502162933349609375f)));
  xv r = xv_fnma(k, xv_1(0.693147182464599609375f), x), y, res;
  r = xv_fnma(k, xv_1(-1.904654323148236e-09f), r);
  y = xv_add(xv_1(1.0f), xv_expm1_poly(r));
#ifdef XTE_MOE_SCALEF
  /* y 2^k rounded once for every k of x in [-104, 89]; outside, the limits and NaN */
  res = xv_ldexp(y, k);
  res = xv_sel(xv_lt(x, xv_1(-103.97909545898438f)), xv_1(0.0f), res);
  res = xv_sel(xv_gt(x, xv_1(88.72283935546875f)), xv_1(xte_bits_f32(0x7F800000u)), res);
  return xv_sel(xv_nan(x), xv_add(x, x), res);
#else
  if (xm_bits(xm_and(xv_ge(x, xv_1(-86.0f)), xv_le(x, xv_1(88.0f)))) == XTE_MOE_VMASK)
    return xv_ldexp(y, k); /* every k in [-125, 127] */
  {
    xm hi = xv_gt(k, xv_1(127.0f)), lo = xv_lt(k, xv_1(-125.0f));
    xv k1 = xv_sel(hi, xv_1(1.0f), xv_sel(lo, xv_add(k, xv_1(64.0f)), k));
    xv k2 = xv_sel(hi, xv_sub(k, xv_1(1.0f)), xv_sel(lo, xv_1(-64.0f), xv_1(0.0f)));
    res = xv_mul(xv_mul(y, xv_pow2(k1)), xv_pow2(k2));
    res = xv_sel(xv_lt(x, xv_1(-103.97909545898438f)), xv_1(0.0f), res);
    res = xv_sel(xv_gt(x, xv_1(88.72283935546875f)), xv_1(xte_bits_f32(0x7F800000u)), res);
    return xv_sel(xv_nan(x), xv_add(x, x), res);
  }
#endif
}

/* xv_expf for a <= 0 or NaN. With XTE_MOE_SCALEF only the underflow below -103.97 needs a
 * select: y 2^k cannot overflow, and a NaN a is carried through every step unchanged (x86 passes
 * a NaN operand on, quieted, and every NaN here is a's), as x + x does in the scalar code. */
static inline xv xv_expf_neg(xv a) {
#ifdef XTE_MOE_SCALEF
  xv k = xv_round(xv_mul(a, xv_1(1.44269502162933349609375f)));
  xv r = xv_fnma(k, xv_1(0.693147182464599609375f), a);
  r = xv_fnma(k, xv_1(-1.904654323148236e-09f), r);
  return xv_ldexp_nlt(xv_add(xv_1(1.0f), xv_expm1_poly(r)), k, a, -103.97909545898438f);
#else
  return xv_expf(a);
#endif
}

/* xte_sigmoidf: 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) otherwise (NaN: the second). */
static inline xv xv_sigmoidf(xv x) {
  xm pos = xv_ge(x, xv_1(0.0f));
  xv e = xv_expf_neg(xv_negif(pos, x));
  return xv_div(xv_sel(pos, xv_1(1.0f), e), xv_add(xv_1(1.0f), e));
}
#endif /* XTE_MOE_VW */

#endif /* XTE_CPU_MOE_LANES_H */
