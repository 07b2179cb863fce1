/* xte shared numerics: every per-element rule of the library, as static inline functions.
 *
 * Compiled by the CPU build (C11), by nvcc (CUDA C++) and by the MUSA compiler alike. Backends
 * differ in how they map work to threads, never in the arithmetic: a kernel of any backend calls
 * these functions (or, for CPU SIMD, reproduces them lane by lane and is tested to give the same
 * bytes). Build with -ffp-contract=off; where a fused multiply-add is meant it is written.
 *
 * The contract these functions implement is docs/numerics.md.
 */
#ifndef XTE_NUMERICS_H
#define XTE_NUMERICS_H

#include <stdint.h>

#if defined(__CUDACC__) || defined(__MUSACC__)
#define XTE_HD __host__ __device__ __forceinline__
#else
#define XTE_HD static inline
#endif

#ifdef __cplusplus
#define XTE_NUM_CONST constexpr
#else
#define XTE_NUM_CONST static const
#endif

/* ---------------------------------------------------------------- bit casts */

XTE_HD uint32_t xte_f32_bits(float f) {
  union {
    float f;
    uint32_t u;
  } v;
  v.f = f;
  return v.u;
}

XTE_HD float xte_bits_f32(uint32_t u) {
  union {
    float f;
    uint32_t u;
  } v;
  v.u = u;
  return v.f;
}

XTE_HD uint64_t xte_f64_bits(double d) {
  union {
    double d;
    uint64_t u;
  } v;
  v.d = d;
  return v.u;
}

XTE_HD double xte_bits_f64(uint64_t u) {
  union {
    double d;
    uint64_t u;
  } v;
  v.u = u;
  return v.d;
}

XTE_HD int xte_f32_isnan(float f) {
  return (xte_f32_bits(f) & 0x7FFFFFFFu) > 0x7F800000u;
}
XTE_HD int xte_f32_isinf(float f) {
  return (xte_f32_bits(f) & 0x7FFFFFFFu) == 0x7F800000u;
}
XTE_HD float xte_f32_abs(float f) {
  return xte_bits_f32(xte_f32_bits(f) & 0x7FFFFFFFu);
}

/* fmaxf semantics without libm: a NaN operand never wins; +0 and -0 compare equal. */
XTE_HD float xte_fmaxf(float a, float b) {
  if (xte_f32_isnan(a)) return b;
  if (xte_f32_isnan(b)) return a;
  return a > b ? a : b;
}

/* ---------------------------------------------------------------- the NaN rule
 * No NaN made by hardware reaches an output byte (docs/numerics.md, section 2, "NaN bits"):
 * x86 and NVIDIA GPUs give different NaNs (x86: the first NaN operand, quieted, or its default
 * NaN 0xFFC00000 for an invalid operation on non-NaN operands such as inf * 0, inf - inf, 0 / 0;
 * NVIDIA: 0x7FFFFFFF for both). Every operation of this directory that can give a NaN either
 * goes through xte_nan2 below (the result's NaN bits set explicitly, the x86 rule, so the CPU
 * bytes are what the hardware gives there) or has its output canonicalized by the caller (GEMM,
 * attention: 0x7FC00000).
 *
 * xte_hwnan(r) is applied to the raw hardware result of such an operation. It is the identity,
 * except in the XTE_NAN_SIM build (cmake/XteNanSim.cmake, scripts/nansim.sh), where it models
 * a GPU: every NaN comes out as 0x7FFFFFFF, so a NaN whose bits the code leaves to the hardware
 * changes the scalar ISA's bytes and fails the byte-equality tests. */
#define XTE_NAN_INVALID 0xFFC00000u /* invalid operation: x86's default NaN */

XTE_HD float xte_hwnan(float r) {
#ifdef XTE_NAN_SIM
  if (xte_f32_isnan(r)) return xte_bits_f32(0x7FFFFFFFu);
#endif
  return r;
}

/* A NaN x made quiet, sign and payload kept. */
XTE_HD float xte_f32_quiet(float x) {
  return xte_bits_f32(xte_f32_bits(x) | 0x00400000u);
}

/* The NaN rule of a binary operation a op b whose hardware result is r: r when it is not NaN;
 * else the first NaN operand, quieted; else (a NaN the operation created) XTE_NAN_INVALID. */
XTE_HD float xte_nan2(float a, float b, float r) {
  if (!xte_f32_isnan(r)) return r;
  if (xte_f32_isnan(a)) return xte_f32_quiet(a);
  if (xte_f32_isnan(b)) return xte_f32_quiet(b);
  return xte_bits_f32(XTE_NAN_INVALID);
}

/* x * s with the NaN rule (what the CPU backend's plain multiplication gives on x86): a NaN
 * operand comes back quieted with its sign and payload (the first one when both are NaN), a
 * NaN the multiplication creates (inf * 0) is 0xFFC00000. GPUs return 0x7FFFFFFF from a
 * multiply, so their kernels call this to match the CPU bytes: a -NaN element quantizes to 0xFF
 * everywhere, and so does an inf element of a block whose scale is 0 (DEEPGEMM, MTFP8). */
XTE_HD float xte_mul_nanprop(float x, float s) {
  return xte_nan2(x, s, xte_hwnan(x * s));
}

/* a + b, a - b, a / b with the same rule (inf - inf, 0 / 0, inf / inf create a NaN). */
XTE_HD float xte_add_nanprop(float a, float b) {
  return xte_nan2(a, b, xte_hwnan(a + b));
}
XTE_HD float xte_sub_nanprop(float a, float b) {
  return xte_nan2(a, b, xte_hwnan(a - b));
}
XTE_HD float xte_div_nanprop(float a, float b) {
  return xte_nan2(a, b, xte_hwnan(a / b));
}

/* 2^e as fp32 for e in [-149, 127] (subnormal results included), exact. */
XTE_HD float xte_exp2i(int e) {
  if (e >= -126) return xte_bits_f32((uint32_t)(e + 127) << 23);
  return xte_bits_f32(1u << (e + 149));
}

/* ---------------------------------------------------------------- fp8 formats */

enum { XTE_FP8_E4M3 = 0, XTE_FP8_E5M2 = 1 };

XTE_NUM_CONST float XTE_E4M3_MAX = 448.0f;
XTE_NUM_CONST float XTE_E5M2_MAX = 57344.0f;

XTE_HD float xte_fp8_max(int fmt) {
  return fmt == XTE_FP8_E4M3 ? 448.0f : 57344.0f;
}

/* fp32 -> E4M3 ("fn"), round to nearest even.
 * Normal results: round the fp32 significand to 3 bits in the integer domain (the carry moves
 * into the exponent). Subnormal results (|x| < 2^-6): the magnitude in units of 2^-9 is obtained
 * by adding 2^14 in fp32, whose ulp is 2^-9, so the hardware's RNE addition rounds exactly.
 * Overflow (|x| > 464 after RNE, i.e. |x| > 464.0 since 464 ties to 448): saturate -> +-448
 * (0x7E), else NaN (0x7F). +-inf: saturate -> +-448, else NaN. NaN -> 0x7F with the sign kept. */
XTE_HD uint8_t xte_f32_to_e4m3(float x, int saturate) {
  uint32_t u = xte_f32_bits(x);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint8_t)(sign | 0x7Fu);
  if (a > 0x43E80000u) /* > 464.0, includes inf */
    return (uint8_t)(sign | (saturate ? 0x7Eu : 0x7Fu));
  if (a >= 0x3C800000u) { /* >= 2^-6: normal */
    uint32_t r = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
    return (uint8_t)(sign | (r - (120u << 3)));
  }
  float y = xte_bits_f32(a) + 16384.0f;
  return (uint8_t)(sign | (xte_f32_bits(y) - 0x46800000u));
}

/* fp32 -> E5M2, round to nearest even. |x| >= 61440 rounds past the max (57344, odd significand)
 * to 2^16: saturate -> +-57344 (0x7B), else +-inf (0x7C). inf: saturate -> max, else inf.
 * NaN -> 0x7E with the sign kept. Subnormals (|x| < 2^-14) by adding 2^7 (ulp 2^-16). */
XTE_HD uint8_t xte_f32_to_e5m2(float x, int saturate) {
  uint32_t u = xte_f32_bits(x);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint8_t)(sign | 0x7Eu);
  if (a >= 0x47700000u) /* >= 61440.0, includes inf */
    return (uint8_t)(sign | (saturate ? 0x7Bu : 0x7Cu));
  if (a >= 0x38800000u) { /* >= 2^-14: normal */
    uint32_t r = (a + 0xFFFFFu + ((a >> 21) & 1u)) >> 21;
    return (uint8_t)(sign | (r - (112u << 2)));
  }
  float y = xte_bits_f32(a) + 128.0f;
  return (uint8_t)(sign | (xte_f32_bits(y) - 0x43000000u));
}

XTE_HD uint8_t xte_f32_to_fp8(float x, int fmt, int saturate) {
  return fmt == XTE_FP8_E4M3 ? xte_f32_to_e4m3(x, saturate) : xte_f32_to_e5m2(x, saturate);
}

/* E4M3 -> fp32, exact. 0x7F / 0xFF are NaN. */
XTE_HD float xte_e4m3_to_f32(uint8_t b) {
  uint32_t sign = (uint32_t)(b & 0x80u) << 24;
  uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
  if (e == 0xFu && m == 7u) return xte_bits_f32(sign | 0x7FC00000u);
  if (e == 0) { /* subnormal: m * 2^-9 */
    float v = (float)m * 0.001953125f;
    return xte_bits_f32(sign | xte_f32_bits(v));
  }
  return xte_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

/* E5M2 -> fp32, exact. Exponent 31: inf (m == 0) or NaN. */
XTE_HD float xte_e5m2_to_f32(uint8_t b) {
  uint32_t sign = (uint32_t)(b & 0x80u) << 24;
  uint32_t e = (b >> 2) & 0x1Fu, m = b & 3u;
  if (e == 0x1Fu) return xte_bits_f32(sign | 0x7F800000u | (m << 21));
  if (e == 0) {
    float v = (float)m * 0.0000152587890625f; /* 2^-16 */
    return xte_bits_f32(sign | xte_f32_bits(v));
  }
  return xte_bits_f32(sign | ((e + 112u) << 23) | (m << 21));
}

XTE_HD float xte_fp8_to_f32(uint8_t b, int fmt) {
  return fmt == XTE_FP8_E4M3 ? xte_e4m3_to_f32(b) : xte_e5m2_to_f32(b);
}

/* ---------------------------------------------------------------- bf16 / fp16 */

/* fp32 -> bf16, RNE; overflow goes to inf; NaN -> quiet NaN with sign and top payload kept. */
XTE_HD uint16_t xte_f32_to_bf16(float x) {
  uint32_t u = xte_f32_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

XTE_HD float xte_bf16_to_f32(uint16_t h) {
  return xte_bits_f32((uint32_t)h << 16);
}

/* fp16 -> fp32, exact. */
XTE_HD float xte_fp16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) /* inf, or NaN made quiet (as F16C's vcvtph2ps does) */
    return xte_bits_f32(sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u));
  if (e == 0) {
    float v = (float)m * 5.9604644775390625e-8f; /* 2^-24, exact */
    return xte_bits_f32(sign | xte_f32_bits(v));
  }
  return xte_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* fp32 -> fp16, RNE; overflow to inf; NaN -> quiet NaN (sign kept). Subnormals by adding 0.5
 * (ulp 2^-24). */
XTE_HD uint16_t xte_f32_to_fp16(float x) {
  uint32_t u = xte_f32_bits(x);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520: rounds to inf */
  if (a >= 0x38800000u) {                                  /* >= 2^-14: normal */
    uint32_t r = (a + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    return (uint16_t)(sign | (r - (112u << 10)));
  }
  float y = xte_bits_f32(a) + 0.5f;
  return (uint16_t)(sign | (xte_f32_bits(y) - 0x3F000000u));
}

/* ---------------------------------------------------------------- E8M0 (MX scales) */

/* E8M0 -> fp32: 2^(e-127); 0xFF is NaN; e = 0 gives 2^-127 (an fp32 subnormal). */
XTE_HD float xte_e8m0_to_f32(uint8_t e) {
  if (e == 0xFFu) return xte_bits_f32(0x7FC00000u);
  if (e == 0) return xte_bits_f32(0x00400000u);
  return xte_bits_f32((uint32_t)e << 23);
}

/* Round a non-negative fp32 UP to an E8M0 exponent (TE / cuBLAS MXFP8 rule): the biased exponent,
 * plus one when the significand is non-zero. NaN -> 0xFF, inf -> 0xFE (clamped), 0 -> 0.
 * Subnormal inputs: 2^-127 (e = 0) when <= 2^-127, else 2^-126 (e = 1). */
XTE_HD uint8_t xte_f32_to_e8m0_ceil(float v) {
  uint32_t a = xte_f32_bits(v) & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0xFFu;
  if (a == 0x7F800000u) return 0xFEu;
  uint32_t e = a >> 23, m = a & 0x7FFFFFu;
  if (e == 0) return (uint8_t)(m > 0x400000u ? 1u : 0u);
  e += (m != 0);
  return (uint8_t)(e > 0xFEu ? 0xFEu : e);
}

/* fp32 -> E8M0 (xte_cast), the rule of ml_dtypes' float8_e8m0fnu: the nearest power of two in
 * [2^-127, 2^127], a tie (x = 1.5 * 2^k) going to the larger one; the significand's top bit
 * decides, so the code is the biased exponent plus that bit (fp32 subnormals: 2^-126 from
 * 1.5 * 2^-127 up, else 2^-127). E8M0 has no zero, sign or inf: zero, negatives (-0 too) and NaN
 * give 0xFF (NaN); a result past 2^127 (x >= 1.5 * 2^127) and +inf give 0xFE (2^127) when
 * saturating, else 0xFF. */
XTE_HD uint8_t xte_f32_to_e8m0(float x, int saturate) {
  uint32_t u = xte_f32_bits(x);
  uint32_t e = u >> 23, m = u & 0x7FFFFFu; /* u < 2^31 past the first test: e is the exponent */
  if (u == 0 || u >= 0x7F800001u) return 0xFFu; /* zero, NaN, anything negative */
  if (u == 0x7F800000u) return (uint8_t)(saturate ? 0xFEu : 0xFFu);
  if (e == 0) return (uint8_t)(m >= 0x600000u ? 1u : 0u);
  e += m >> 22;
  if (e > 0xFEu) return (uint8_t)(saturate ? 0xFEu : 0xFFu);
  return (uint8_t)e;
}

/* ---------------------------------------------------------------- block amax */

/* Running amax update: max |x| with fmaxf semantics (NaN never wins). */
XTE_HD float xte_amax_update(float acc, float x) {
  return xte_fmaxf(acc, xte_f32_abs(x));
}

/* ---------------------------------------------------------------- scale recipes
 * Every recipe maps a block amax (fp32, >= 0, never NaN since NaN never wins the max) to:
 *   scale      the fp32 factor the elements are multiplied by before the RNE conversion,
 *   scale_inv  what is stored for the GEMM / dequantize (fp32, or an E8M0 byte for MX).
 * The element value is q = fp8_RNE(x * scale) (saturating as the recipe says).
 */
typedef struct xte_block_scale {
  float scale;
  float scale_inv;
  uint8_t e8m0; /* MX recipes only */
} xte_block_scale;

/* Largest finite value of the input dtype (TE's fallback when 448 / amax overflows). */
enum { XTE_NUM_IN_F32 = 0, XTE_NUM_IN_BF16 = 1, XTE_NUM_IN_F16 = 2 };
XTE_HD float xte_input_dtype_max(int in_kind) {
  if (in_kind == XTE_NUM_IN_BF16) return xte_bits_f32(0x7F7F0000u); /* 0x1.FEp127 */
  if (in_kind == XTE_NUM_IN_F16) return 65504.0f;
  return xte_bits_f32(0x7F7FFFFFu); /* FLT_MAX */
}

/* 1. TransformerEngine's compute_scale_from_amax: Float8BlockScaling and per-tensor current
 * scaling (Float8CurrentScaling): eps clamp, degenerate amax -> 1, 448/amax (RNE division),
 * inf -> inf_scale, optional power-of-two rounding down, scale_inv = 1/scale. inf_scale is
 * FLT_MAX for current scaling whatever the input dtype, and the input dtype's max for the block
 * recipe (TE's block kernels), xte_recipe_te_inf_scale in xte_scale_numerics.h. */
XTE_HD xte_block_scale xte_scale_te(float amax, int fmt, float eps, int force_pow_2,
                                    float inf_scale) {
  xte_block_scale r;
  float scale;
  if (amax < eps) amax = eps;
  if (xte_f32_isinf(amax) || amax == 0.0f || xte_f32_isnan(amax)) {
    scale = 1.0f;
  } else {
    scale = xte_fp8_max(fmt) / amax;
    if (xte_f32_isinf(scale)) scale = inf_scale;
    if (force_pow_2) scale = xte_bits_f32(xte_f32_bits(scale) & 0xFF800000u);
  }
  r.scale = scale;
  r.scale_inv = 1.0f / scale;
  r.e8m0 = 0;
  return r;
}

/* 2. DeepGEMM per_token_cast_to_fp8 / per_block_cast_to_fp8: sf = max(amax, 1e-4) / fp8_max,
 * optionally ceil_to_ue8m0 (round sf up to a power of two); elements x * (1 / sf). */
XTE_HD xte_block_scale xte_scale_deepgemm(float amax, int fmt, int ue8m0) {
  xte_block_scale r;
  float sf = xte_fmaxf(amax, 1e-4f) / xte_fp8_max(fmt);
  if (ue8m0) {
    uint32_t u = xte_f32_bits(sf);
    uint32_t e = (u >> 23) & 0xFFu;
    e += ((u & 0x7FFFFFu) != 0);
    sf = xte_bits_f32(e << 23);
  }
  r.scale_inv = sf;
  r.scale = 1.0f / sf;
  r.e8m0 = 0;
  return r;
}

/* 3. MT-TransformerEngine MTFP8: scale_inv = max(amax, 1e-30) * (1 / fp8_max) (the reciprocal
 * rounded to fp32 first), elements x * (1 / scale_inv). */
XTE_HD xte_block_scale xte_scale_mtfp8(float amax, int fmt) {
  xte_block_scale r;
  float inv_max = 1.0f / xte_fp8_max(fmt);
  r.scale_inv = xte_fmaxf(amax, 1e-30f) * inv_max;
  r.scale = 1.0f / r.scale_inv;
  r.e8m0 = 0;
  return r;
}

/* 4. MXFP8 as TransformerEngine / cuBLAS: e = ceil_E8M0(amax * fp32(1 / fp8_max));
 * elements x * 2^(127 - e). e = 0xFF (NaN) makes every element NaN. */
XTE_HD xte_block_scale xte_scale_mx_te(float amax, int fmt) {
  xte_block_scale r;
  float inv_max = 1.0f / xte_fp8_max(fmt);
  uint8_t e = xte_f32_to_e8m0_ceil(amax * inv_max);
  r.e8m0 = e;
  r.scale_inv = xte_e8m0_to_f32(e);
  r.scale = (e == 0xFFu) ? xte_bits_f32(0x7FC00000u) : xte_exp2i(127 - (int)e);
  return r;
}

/* 5. MXFP8 as the OCP MX reference: shared exponent = floor(log2(amax)) - emax_elem (8 for E4M3,
 * 15 for E5M2), clamped to [-127, 127]; amax == 0 gives -127. Elements x * 2^-shared, saturated.
 * floor(log2(amax)) is read off the fp32 exponent (subnormals by their leading bit). */
XTE_HD xte_block_scale xte_scale_mx_ocp(float amax, int fmt) {
  xte_block_scale r;
  uint32_t a = xte_f32_bits(amax) & 0x7FFFFFFFu;
  int se;
  if (a >= 0x7F800000u) {
    se = 127; /* inf amax: largest scale; NaN never wins the amax */
  } else if (a == 0) {
    se = -127;
  } else {
    int fl;
    if (a >= 0x00800000u) {
      fl = (int)(a >> 23) - 127;
    } else {
      int lz = 0;
      while (!(a & (0x400000u >> lz))) lz++;
      fl = -127 - lz;
    }
    se = fl - (fmt == XTE_FP8_E4M3 ? 8 : 15);
    if (se < -127) se = -127;
    if (se > 127) se = 127;
  }
  r.e8m0 = (uint8_t)(se + 127);
  r.scale_inv = xte_e8m0_to_f32(r.e8m0);
  r.scale = xte_exp2i(-se);
  return r;
}

#endif /* XTE_NUMERICS_H */
