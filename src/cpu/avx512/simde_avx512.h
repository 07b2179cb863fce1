/* The AVX-512 intrinsics through SIMDe, for the emulated build of this folder (XTE_AVX512_SIMDE:
 * compiled with the AVX2 flags only, cmake/XteCpuIsa.cmake). SIMDe 0.7.4 (Debian 12) lacks a few
 * of the intrinsics the kernels use, or their native alias, or gives one the wrong arity; they are
 * defined here on the two 256-bit halves, with the native instruction's semantics: the same
 * rounding (MXCSR, round to nearest even) and the same out-of-range results as the AVX2
 * instruction that each half runs. Without them the compiler would call the native AVX-512
 * intrinsic, which fails to build without -mavx512f. */
#ifndef XTE_SIMDE_AVX512_H
#define XTE_SIMDE_AVX512_H

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <stdint.h>
#include <string.h>

/* VCVTPD2PS zmm -> ymm */
static inline __m256 xte_simde_cvtpd_ps(simde__m512d a) {
  simde__m512d_private p = simde__m512d_to_private(a);
  return _mm256_set_m128(_mm256_cvtpd_ps(p.m256d[1]), _mm256_cvtpd_ps(p.m256d[0]));
}
#undef _mm512_cvtpd_ps
#define _mm512_cvtpd_ps(a) xte_simde_cvtpd_ps(a)

/* VCVTPS2DQ zmm (0x80000000 for NaN and out of range, as the native instruction) */
static inline simde__m512i xte_simde_cvtps_epi32(simde__m512 a) {
  simde__m512_private p = simde__m512_to_private(a);
  simde__m512i_private r;
  r.m256i[0] = _mm256_cvtps_epi32(p.m256[0]);
  r.m256i[1] = _mm256_cvtps_epi32(p.m256[1]);
  return simde__m512i_from_private(r);
}
#undef _mm512_cvtps_epi32
#define _mm512_cvtps_epi32(a) xte_simde_cvtps_epi32(a)

/* VPSHUFD zmm: the same dword shuffle in every 128-bit lane */
#define XTE_SIMDE_SHUFFLE_EPI32(a, imm)                        \
  __extension__({                                              \
    simde__m512i_private p_ = simde__m512i_to_private(a), r_;  \
    r_.m256i[0] = _mm256_shuffle_epi32(p_.m256i[0], (imm));    \
    r_.m256i[1] = _mm256_shuffle_epi32(p_.m256i[1], (imm));    \
    simde__m512i_from_private(r_);                             \
  })
#undef _mm512_shuffle_epi32
#define _mm512_shuffle_epi32(a, imm) XTE_SIMDE_SHUFFLE_EPI32((a), (imm))

#undef _mm512_shuffle_i64x2
#define _mm512_shuffle_i64x2(a, b, imm) simde_mm512_shuffle_i64x2((a), (b), (imm))

/* SIMDe's alias of the masked compare takes four arguments; the intrinsic takes three */
#undef _mm512_mask_cmpge_epi32_mask
#define _mm512_mask_cmpge_epi32_mask(k, a, b) simde_mm512_mask_cmpge_epi32_mask((k), (a), (b))

/* ------------------------------------------------------------------ absent from SIMDe 0.7.4
 * Lane loops over SIMDe's private representation where no AVX2 instruction does the whole half;
 * the AVX2 instruction on each 256-bit half where one does (same rounding, same NaN and
 * out-of-range results). */
#define XTE_SIMDE_CMP_MASK(name, mt, lanes, field, op)                   \
  static inline mt name(simde__m512i a, simde__m512i b) {               \
    simde__m512i_private pa = simde__m512i_to_private(a),               \
                         pb = simde__m512i_to_private(b);               \
    mt r = 0;                                                           \
    int i;                                                              \
    for (i = 0; i < (lanes); i++) r |= (mt)((mt)(pa.field[i] op pb.field[i]) << i); \
    return r;                                                           \
  }
XTE_SIMDE_CMP_MASK(xte_simde_cmpeq_epi16_mask, simde__mmask32, 32, i16, ==)
XTE_SIMDE_CMP_MASK(xte_simde_cmplt_epi32_mask, simde__mmask16, 16, i32, <)
XTE_SIMDE_CMP_MASK(xte_simde_cmplt_epi64_mask, simde__mmask8, 8, i64, <)
XTE_SIMDE_CMP_MASK(xte_simde_cmplt_epu16_mask, simde__mmask32, 32, u16, <)
#undef _mm512_cmpeq_epi16_mask
#define _mm512_cmpeq_epi16_mask(a, b) xte_simde_cmpeq_epi16_mask((a), (b))
#undef _mm512_cmplt_epi32_mask
#define _mm512_cmplt_epi32_mask(a, b) xte_simde_cmplt_epi32_mask((a), (b))
#undef _mm512_cmplt_epi64_mask
#define _mm512_cmplt_epi64_mask(a, b) xte_simde_cmplt_epi64_mask((a), (b))
#undef _mm512_cmplt_epu16_mask
#define _mm512_cmplt_epu16_mask(a, b) xte_simde_cmplt_epu16_mask((a), (b))

/* VPTESTNMD: bit i set where (a & b) of lane i is zero */
static inline simde__mmask16 xte_simde_testn_epi32_mask(simde__m512i a, simde__m512i b) {
  simde__m512i_private pa = simde__m512i_to_private(a), pb = simde__m512i_to_private(b);
  simde__mmask16 r = 0;
  int i;
  for (i = 0; i < 16; i++) r |= (simde__mmask16)((simde__mmask16)((pa.i32[i] & pb.i32[i]) == 0) << i);
  return r;
}
#undef _mm512_testn_epi32_mask
#define _mm512_testn_epi32_mask(a, b) xte_simde_testn_epi32_mask((a), (b))

/* VPMOVDW / VPMOVDB: truncation of each dword */
static inline __m256i xte_simde_cvtepi32_epi16(simde__m512i a) {
  simde__m512i_private p = simde__m512i_to_private(a);
  int16_t t[16];
  int i;
  for (i = 0; i < 16; i++) t[i] = (int16_t)(uint16_t)(uint32_t)p.i32[i];
  return _mm256_loadu_si256((const __m256i *)(const void *)t);
}
static inline __m128i xte_simde_cvtepi32_epi8(simde__m512i a) {
  simde__m512i_private p = simde__m512i_to_private(a);
  int8_t t[16];
  int i;
  for (i = 0; i < 16; i++) t[i] = (int8_t)(uint8_t)(uint32_t)p.i32[i];
  return _mm_loadu_si128((const __m128i *)(const void *)t);
}
#undef _mm512_cvtepi32_epi16
#define _mm512_cvtepi32_epi16(a) xte_simde_cvtepi32_epi16(a)
#undef _mm512_cvtepi32_epi8
#define _mm512_cvtepi32_epi8(a) xte_simde_cvtepi32_epi8(a)

/* VPMOVDW to memory, lanes of k only (the others' bytes are not touched) */
static inline void xte_simde_mask_cvtepi32_storeu_epi16(void *p, simde__mmask16 k, simde__m512i a) {
  simde__m512i_private v = simde__m512i_to_private(a);
  int i;
  for (i = 0; i < 16; i++)
    if ((k >> i) & 1) {
      int16_t t = (int16_t)(uint16_t)(uint32_t)v.i32[i];
      memcpy((char *)p + 2 * i, &t, 2);
    }
}
#undef _mm512_mask_cvtepi32_storeu_epi16
#define _mm512_mask_cvtepi32_storeu_epi16(p, k, a) xte_simde_mask_cvtepi32_storeu_epi16((p), (k), (a))

/* VPMOVZXWD */
static inline simde__m512i xte_simde_cvtepu16_epi32(__m256i a) {
  simde__m512i_private r;
  r.m256i[0] = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(a));
  r.m256i[1] = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(a, 1));
  return simde__m512i_from_private(r);
}
#undef _mm512_cvtepu16_epi32
#define _mm512_cvtepu16_epi32(a) xte_simde_cvtepu16_epi32(a)

/* VCVTPH2PS (F16C on each half; exact) */
static inline simde__m512 xte_simde_cvtph_ps(__m256i a) {
  simde__m512_private r;
  r.m256[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(a));
  r.m256[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(a, 1));
  return simde__m512_from_private(r);
}
#undef _mm512_cvtph_ps
#define _mm512_cvtph_ps(a) xte_simde_cvtph_ps(a)

/* VCVTPS2PD (exact) */
static inline simde__m512d xte_simde_cvtps_pd(__m256 a) {
  simde__m512d_private r;
  r.m256d[0] = _mm256_cvtps_pd(_mm256_castps256_ps128(a));
  r.m256d[1] = _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1));
  return simde__m512d_from_private(r);
}
#undef _mm512_cvtps_pd
#define _mm512_cvtps_pd(a) xte_simde_cvtps_pd(a)

/* VCVTTPS2DQ (0x80000000 for NaN and out of range) */
static inline simde__m512i xte_simde_cvttps_epi32(simde__m512 a) {
  simde__m512_private p = simde__m512_to_private(a);
  simde__m512i_private r;
  r.m256i[0] = _mm256_cvttps_epi32(p.m256[0]);
  r.m256i[1] = _mm256_cvttps_epi32(p.m256[1]);
  return simde__m512i_from_private(r);
}
#undef _mm512_cvttps_epi32
#define _mm512_cvttps_epi32(a) xte_simde_cvttps_epi32(a)

/* VGATHERDPS: lane i from base + idx[i] * scale */
static inline simde__m512 xte_simde_i32gather_ps(simde__m512i idx, const void *base, int scale) {
  simde__m512i_private pi = simde__m512i_to_private(idx);
  simde__m512_private r;
  int i;
  for (i = 0; i < 16; i++)
    memcpy(&r.f32[i], (const char *)base + (int64_t)pi.i32[i] * scale, sizeof(float));
  return simde__m512_from_private(r);
}
#undef _mm512_i32gather_ps
#define _mm512_i32gather_ps(idx, base, scale) xte_simde_i32gather_ps((idx), (base), (scale))

/* VCMPPS with a mask: lanes off k compare false */
#undef _mm512_mask_cmp_ps_mask
#define _mm512_mask_cmp_ps_mask(k, a, b, imm) \
  ((simde__mmask16)((k) & simde_mm512_cmp_ps_mask((a), (b), (imm))))

/* masked loads and stores: the lanes off k are neither read (no fault past an end) nor written */
static inline void xte_simde_mask_storeu_ps(void *p, simde__mmask16 k, simde__m512 a) {
  simde__m512_private v = simde__m512_to_private(a);
  int i;
  for (i = 0; i < 16; i++)
    if ((k >> i) & 1) memcpy((char *)p + 4 * i, &v.f32[i], 4);
}
static inline simde__m512 xte_simde_maskz_loadu_ps(simde__mmask16 k, const void *p) {
  simde__m512_private r;
  int i;
  for (i = 0; i < 16; i++) {
    r.f32[i] = 0.0f;
    if ((k >> i) & 1) memcpy(&r.f32[i], (const char *)p + 4 * i, 4);
  }
  return simde__m512_from_private(r);
}
static inline simde__m512i xte_simde_maskz_loadu_epi32(simde__mmask16 k, const void *p) {
  simde__m512i_private r;
  int i;
  for (i = 0; i < 16; i++) {
    r.i32[i] = 0;
    if ((k >> i) & 1) memcpy(&r.i32[i], (const char *)p + 4 * i, 4);
  }
  return simde__m512i_from_private(r);
}
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps(p, k, a) xte_simde_mask_storeu_ps((p), (k), (a))
#undef _mm512_maskz_loadu_ps
#define _mm512_maskz_loadu_ps(k, p) xte_simde_maskz_loadu_ps((k), (p))
#undef _mm512_maskz_loadu_epi32
#define _mm512_maskz_loadu_epi32(k, p) xte_simde_maskz_loadu_epi32((k), (p))

/* the compilers' _mm512_reduce_max_ps, in its order of VMAXPS operations (the order decides
 * which NaN or zero comes out): high half with low half, then 128-bit halves, then pairs */
static inline float xte_simde_reduce_max_ps(simde__m512 a) {
  simde__m512_private p = simde__m512_to_private(a);
  __m256 t3 = _mm256_max_ps(p.m256[1], p.m256[0]);
  __m128 t6 = _mm_max_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  __m128 t8 = _mm_max_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  __m128 t10 = _mm_max_ps(t8, _mm_shuffle_ps(t8, t8, _MM_SHUFFLE(0, 1, 0, 1)));
  return _mm_cvtss_f32(t10);
}
#undef _mm512_reduce_max_ps
#define _mm512_reduce_max_ps(a) xte_simde_reduce_max_ps(a)

/* non-temporal stores (64-byte aligned p, as the native instruction requires) */
static inline void xte_simde_stream_ps(void *p, simde__m512 a) {
  simde__m512_private v = simde__m512_to_private(a);
  _mm256_stream_ps((float *)p, v.m256[0]);
  _mm256_stream_ps((float *)p + 8, v.m256[1]);
}
static inline void xte_simde_stream_si512(void *p, simde__m512i a) {
  simde__m512i_private v = simde__m512i_to_private(a);
  _mm256_stream_si256((__m256i *)p, v.m256i[0]);
  _mm256_stream_si256((__m256i *)p + 1, v.m256i[1]);
}
#undef _mm512_stream_ps
#define _mm512_stream_ps(p, a) xte_simde_stream_ps((p), (a))
#undef _mm512_stream_si512
#define _mm512_stream_si512(p, a) xte_simde_stream_si512((p), (a))

#undef _mm512_shuffle_f64x2
#define _mm512_shuffle_f64x2(a, b, imm) simde_mm512_shuffle_f64x2((a), (b), (imm))

#endif /* XTE_SIMDE_AVX512_H */
