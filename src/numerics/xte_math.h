/* xte deterministic math: exp, exp2, expm1, log, log1p, tanh, sigmoid, softplus,
 * sqrt-softplus and SiLU as explicit sequences of IEEE basic operations (+, -, *, /, sqrt) and
 * fused multiply-adds. No libm and no vendor intrinsics, so every backend and ISA that follows
 * these steps (CPU scalar, CPU SIMD lanes, CUDA, MUSA) gets the same bits.
 *
 * Accuracy (fp32 results, measured by tests/test_math_exhaustive.c over every fp32 input in
 * the functions' ranges against fp64 libm) is stated in docs/numerics.md.
 *
 * Building blocks:
 *  - round to nearest integer without libm: (t + 1.5*2^23) - 1.5*2^23 for |t| < 2^22;
 *  - exact scaling by 2^k through exponent bits (xte_exp2i), split in two steps when the
 *    result is subnormal so that only the last multiplication rounds.
 */
#ifndef XTE_MATH_H
#define XTE_MATH_H

#include "numerics/xte_numerics.h"

#if (defined(__CUDACC__) || defined(__MUSACC__)) && \
    (defined(__CUDA_ARCH__) || defined(__MUSA_ARCH__))
/* device code: the IEEE-rounded intrinsics (never the contracted or approximate forms) */
#define xte_fmaf_(a, b, c) __fmaf_rn((a), (b), (c))
#define xte_sqrtf_(a) __fsqrt_rn(a)
#else
#define xte_fmaf_(a, b, c) __builtin_fmaf((a), (b), (c))
#define xte_sqrtf_(a) __builtin_sqrtf(a)
#endif

/* The NaN rule (xte_numerics.h): a NaN these give is the hardware's, which the XTE_NAN_SIM build
 * turns into the GPU's 0x7FFFFFFF; a caller whose NaN can reach an output byte sets its bits
 * (xte_fma_nanprop) or canonicalizes the output. */
XTE_HD float xte_fmaf(float a, float b, float c) {
  return xte_hwnan(xte_fmaf_(a, b, c));
}
XTE_HD float xte_sqrtf(float a) {
  return xte_hwnan(xte_sqrtf_(a));
}

/* fmaf(a, b, c) with explicit NaN bits: the first NaN of a, b, c, quieted; a NaN the operation
 * creates (inf * 0, or inf * x + -inf) is XTE_NAN_INVALID. */
XTE_HD float xte_fma_nanprop(float a, float b, float c) {
  float r = xte_fmaf(a, b, c);
  if (!xte_f32_isnan(r)) return r;
  if (xte_f32_isnan(a)) return xte_f32_quiet(a);
  if (xte_f32_isnan(b)) return xte_f32_quiet(b);
  if (xte_f32_isnan(c)) return xte_f32_quiet(c);
  return xte_bits_f32(XTE_NAN_INVALID);
}

/* Constants shared with the SIMD lane copies of these functions (src/cpu/avx2/attention_avx2.c,
 * src/cpu/avx512/attention_avx512.c), so that the copies cannot drift from the scalar code. */
#define XTE_RINT_MAGIC 12582912.0f /* 1.5 * 2^23: (t + magic) - magic rounds t to an integer */
#define XTE_LDEXP_KMAX 127         /* xte_ldexp_small: k above: (y * 2) * 2^(k - 1) */
#define XTE_LDEXP_KMIN (-125)      /* k below: (y * 2^(k + SPLIT)) * 2^-SPLIT */
#define XTE_LDEXP_SPLIT 64
#define XTE_EXP2_MAX 128.0f    /* xte_exp2f: x >= MAX -> +inf */
#define XTE_EXP2_MIN (-150.0f) /* x < MIN -> +0 */
/* xte_exp2f's polynomial: 2^r = sum of C_n r^n, C_n = (ln2)^n / n! rounded to fp32, C_0 = 1 */
#define XTE_EXP2_C1 6.9314718055994531e-01f
#define XTE_EXP2_C2 2.4022650695910071e-01f
#define XTE_EXP2_C3 5.5504108664821580e-02f
#define XTE_EXP2_C4 9.6181291076284772e-03f
#define XTE_EXP2_C5 1.3333558146428443e-03f
#define XTE_EXP2_C6 1.5403530393381608e-04f
#define XTE_EXP2_C7 1.5252733804059840e-05f
#define XTE_EXP2_C8 1.3215486790144307e-06f
/* That polynomial in r by Horner's rule from C_8 down, for any type: FMA(a, b, c) a fused
 * a * b + c, K(c) the constant c as an operand (XTE_F32_CONST for floats, a broadcast for
 * vectors); r is evaluated eight times. */
#define XTE_F32_CONST(c) (c)
#define XTE_EXP2_POLY(FMA, K, r)                                                             \
  FMA(FMA(FMA(FMA(FMA(FMA(FMA(FMA(K(XTE_EXP2_C8), r, K(XTE_EXP2_C7)), r, K(XTE_EXP2_C6)), r, \
                          K(XTE_EXP2_C5)),                                                   \
                      r, K(XTE_EXP2_C4)),                                                    \
                  r, K(XTE_EXP2_C3)),                                                        \
              r, K(XTE_EXP2_C2)),                                                            \
          r, K(XTE_EXP2_C1)),                                                                \
      r, K(1.0f))

/* Nearest integer (ties to even) of t, |t| < 2^22, as a float. */
XTE_HD float xte_rint_small(float t) {
  const float magic = XTE_RINT_MAGIC;
  float y = t + magic;
  return y - magic;
}

/* y * 2^k for k in [-252, 254], with a single rounding (only when the result is subnormal). */
XTE_HD float xte_ldexp_small(float y, int k) {
  if (k > XTE_LDEXP_KMAX) return (y * 2.0f) * xte_exp2i(k - 1);
  if (k < XTE_LDEXP_KMIN) return (y * xte_exp2i(k + XTE_LDEXP_SPLIT)) * xte_exp2i(-XTE_LDEXP_SPLIT);
  return y * xte_exp2i(k);
}

/* e^r - 1 for |r| <= ln2/2 + a little: Taylor polynomial to degree 8, Horner with FMAs. */
XTE_HD float xte_expm1_poly(float r) {
  float p = 2.48015873015873e-05f;           /* 1/8! */
  p = xte_fmaf(p, r, 1.98412698412698e-04f); /* 1/7! */
  p = xte_fmaf(p, r, 1.38888888888889e-03f); /* 1/6! */
  p = xte_fmaf(p, r, 8.33333333333333e-03f); /* 1/5! */
  p = xte_fmaf(p, r, 4.16666666666667e-02f); /* 1/4! */
  p = xte_fmaf(p, r, 1.66666666666667e-01f); /* 1/3! */
  p = xte_fmaf(p, r, 0.5f);
  return xte_fmaf(p, r * r, r);
}

/* e^x. Range reduction x = k ln2 + r with ln2 split in two (Cody-Waite, FMAs), then
 * e^r = 1 + expm1_poly(r), scaled by 2^k. Overflow -> +inf, underflow -> 0, NaN -> NaN. */
XTE_HD float xte_expf(float x) {
  const float ln2_hi = 0.693147182464599609375f; /* 0x3F317218 */
  const float ln2_lo = -1.904654323148236e-09f;  /* ln2 - ln2_hi */
  float k, r;
  if (xte_f32_isnan(x)) return xte_f32_quiet(x);
  if (x > 88.72283935546875f) return xte_bits_f32(0x7F800000u);
  if (x < -103.97909545898438f) return 0.0f;
  k = xte_rint_small(x * 1.44269502162933349609375f);
  r = xte_fmaf(-k, ln2_hi, x);
  r = xte_fmaf(-k, ln2_lo, r);
  return xte_ldexp_small(1.0f + xte_expm1_poly(r), (int)k);
}

/* 2^x: x = k + r, |r| <= 1/2 (exact subtraction), 2^r by its Taylor series in r ln2 to
 * degree 8 with the coefficients (ln2)^n / n! rounded to fp32. */
XTE_HD float xte_exp2f(float x) {
  float k, r, p;
  if (xte_f32_isnan(x)) return xte_f32_quiet(x);
  if (x >= XTE_EXP2_MAX) return xte_bits_f32(0x7F800000u);
  if (x < XTE_EXP2_MIN) return 0.0f;
  k = xte_rint_small(x);
  r = x - k;
  p = XTE_EXP2_POLY(xte_fmaf, XTE_F32_CONST, r);
  return xte_ldexp_small(p, (int)k);
}

/* e^x - 1: the polynomial near 0; for moderate x the reduction of xte_expf,
 * x = k ln2 + r, e^x - 1 = 2^k p + (2^k - 1) with p = expm1_poly(r) and 2^k - 1 exact
 * (|k| <= 20), one fused multiply-add; e^x - 1 for larger |x|; -1 below -17.5. */
XTE_HD float xte_expm1f(float x) {
  const float ln2_hi = 0.693147182464599609375f;
  const float ln2_lo = -1.904654323148236e-09f;
  float k, r, t;
  if (xte_f32_isnan(x)) return xte_f32_quiet(x);
  if (x > -0.35f && x < 0.35f) return xte_expm1_poly(x);
  if (x < -17.5f) return -1.0f;
  if (x > 13.0f || x < -13.0f) return xte_expf(x) - 1.0f;
  k = xte_rint_small(x * 1.44269502162933349609375f);
  r = xte_fmaf(-k, ln2_hi, x);
  r = xte_fmaf(-k, ln2_lo, r);
  t = xte_exp2i((int)k);
  return xte_fmaf(t, xte_expm1_poly(r), t - 1.0f);
}

/* log(1 + f) - f + f^2/2 style kernel: for m = 1 + f in [sqrt(1/2), sqrt(2)),
 * s = f / (2 + f), log(m) = f - hfsq + s (hfsq + R(s^2)), R the series
 * 2/3 z + 2/5 z^2 + ... + 2/11 z^5. */
XTE_HD float xte_log_kernel(float f) {
  float s = f / (2.0f + f);
  float z = s * s;
  float R = 0.18181818181818182f; /* 2/11 */
  float hfsq = 0.5f * f * f;
  R = xte_fmaf(R, z, 0.22222222222222222f); /* 2/9 */
  R = xte_fmaf(R, z, 0.28571428571428571f); /* 2/7 */
  R = xte_fmaf(R, z, 0.4f);                 /* 2/5 */
  R = xte_fmaf(R, z, 0.66666666666666667f); /* 2/3 */
  R = R * z;
  return s * (hfsq + R) - hfsq; /* log(1+f) - f */
}

/* natural log. x < 0 or NaN -> NaN, 0 -> -inf, inf -> inf; subnormals scaled by 2^23 first. */
XTE_HD float xte_logf(float x) {
  const float ln2_hi = 0.693145751953125f;     /* 0x3F317200: 16 bits, e * ln2_hi exact */
  const float ln2_lo = 1.428606765330187e-06f; /* ln2 - ln2_hi */
  uint32_t u = xte_f32_bits(x);
  int e;
  float f, ef;
  if (xte_f32_isnan(x)) return xte_f32_quiet(x);
  if ((u & 0x7FFFFFFFu) == 0) return xte_bits_f32(0xFF800000u);
  if (u >> 31) return xte_bits_f32(0x7FC00000u);
  if (u == 0x7F800000u) return x;
  e = 0;
  if (u < 0x00800000u) { /* subnormal */
    u = xte_f32_bits(x * 8388608.0f);
    e = -23;
  }
  e += (int)(u >> 23) - 127;
  u &= 0x7FFFFFu;
  if (u > 0x3504F3u) { /* m > sqrt(2): use m / 2 */
    u |= 0x3F000000u;
    e += 1;
  } else {
    u |= 0x3F800000u;
  }
  f = xte_bits_f32(u) - 1.0f;
  ef = (float)e;
  return ef * ln2_hi + (f + (xte_log_kernel(f) + ef * ln2_lo));
}

/* log(1 + x) with Kahan's correction: u = 1 + x, log(u) + (x - (u - 1)) / u; -1 -> -inf. */
XTE_HD float xte_log1pf(float x) {
  float u;
  if (xte_f32_isnan(x)) return xte_f32_quiet(x);
  if (x > -1e-4f && x < 1e-4f) { /* x - x^2/2 + x^3/3 */
    return xte_fmaf(xte_fmaf(x, 0.33333333333333333f, -0.5f), x * x, x);
  }
  u = 1.0f + x;
  if (u < 0.0f) return xte_bits_f32(0x7FC00000u); /* x < -1 (-inf too): logf's NaN */
  if (u == xte_bits_f32(0x7F800000u)) return u;
  if (u == 0.0f) return xte_bits_f32(0xFF800000u); /* x = -1: -inf (not -inf + 0/0) */
  return xte_logf(u) + (x - (u - 1.0f)) / u;
}

/* tanh: odd; |x| > 9.1 -> +-1; tiny x -> x; else t = expm1(2|x|), t / (t + 2). */
XTE_HD float xte_tanhf(float x) {
  float a = xte_f32_abs(x), t, r;
  if (xte_f32_isnan(x)) return xte_f32_quiet(x);
  if (a > 9.1f)
    r = 1.0f;
  else if (a < 2.44140625e-4f)
    return x; /* 2^-12: x^3/3 below half an ulp */
  else {
    t = xte_expm1f(2.0f * a);
    r = t / (t + 2.0f);
  }
  return (xte_f32_bits(x) >> 31) ? -r : r;
}

/* logistic sigmoid: 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) for x < 0 (no overflow of
 * e^-x, full relative accuracy down to the subnormal range). */
XTE_HD float xte_sigmoidf(float x) {
  float e;
  if (xte_f32_isnan(x)) return xte_f32_quiet(x);
  if (x >= 0.0f) return 1.0f / (1.0f + xte_expf(-x));
  e = xte_expf(x);
  return e / (1.0f + e);
}

/* softplus log(1 + e^x): x for x > 20 (e^-x below an ulp), else log1p(e^x). */
XTE_HD float xte_softplusf(float x) {
  if (xte_f32_isnan(x)) return xte_f32_quiet(x);
  if (x > 20.0f) return x;
  return xte_log1pf(xte_expf(x));
}

/* sqrt(softplus(x)) (DeepSeek-V3-style sqrtsoftplus router score). Below x = -17 softplus(x)
 * is e^x to within 2^-25 relative, and e^x itself underflows (to subnormals, then 0) long before
 * its square root does, so the result is e^(x/2) there (x/2 exact). */
XTE_HD float xte_sqrtsoftplusf(float x) {
  if (xte_f32_isnan(x)) return xte_f32_quiet(x);
  if (x < -17.0f) return xte_expf(0.5f * x);
  return xte_sqrtf(xte_softplusf(x));
}

/* SiLU x * sigmoid(x): x / (1 + e^-x) for x >= 0, x e^x / (1 + e^x) for x < 0; -inf -> -0.
 * (Below x = -87 the result is subnormal or tiny and e^x has lost bits: absolute error there
 * is below 2^-126.) */
XTE_HD float xte_siluf(float x) {
  float e;
  if (xte_f32_isnan(x)) return xte_f32_quiet(x);
  if (x >= 0.0f) return x / (1.0f + xte_expf(-x));
  if (x == xte_bits_f32(0xFF800000u)) return -0.0f;
  e = xte_expf(x);
  return (x * e) / (1.0f + e);
}

#endif /* XTE_MATH_H */
