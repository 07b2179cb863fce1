/* AVX-512 (F, BW, VL, DQ) CPU kernels. Built natively (-mavx512f ...) for machines that have it,
 * and a second time with XTE_AVX512_SIMDE defined against SIMDe, which emulates the intrinsics,
 * so that these kernels are tested on machines without AVX-512. Lanes reproduce the shared
 * numerics header bit for bit; tails use the header. */
#include "cpu/avx512/isa_avx512.h"

#include <string.h>

#include "cpu/p2w.h"
#include "cpu/transpose_u8_net.h"
#include "cpu/xte_cpu.h"
#include "numerics/xte_numerics.h"

#define V16 __m512i
#define S1(v) _mm512_set1_epi32(v)

static inline __m512 abs16(__m512 x) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), S1(0x7FFFFFFF)));
}

#define XTE_AI static inline __attribute__((always_inline))

/* fp32 -> fp8 codes, one sequence for normal and subnormal results (the same values as
 * xte_f32_to_e4m3 / xte_f32_to_e5m2, which the exhaustive conversion test proves). For a = |x|:
 *   eb = max(biased exponent of a, emin)        (emin: the format's smallest normal exponent)
 *   y  = a + M(eb), M(eb) = 2^(eb - 127 + 23 - mbits), an fp32 RNE addition
 * For a < 2^(emax+1) the ulp of y is 2^(eb - 127 - mbits), the format's quantum at a (at emin also
 * below it: the header's subnormal rule), so y = M + k ulp with k = RNE(a / quantum) <= 2^(mbits+1)
 * and the magnitude code is k + (eb - emin) << mbits = bits(y) - C(eb), C = bits(M) - (eb - emin)
 * << mbits. M and C come from 32-entry tables indexed by eb mod 32, whose entries past emax + 1 are
 * those of emax + 1. Every larger a (inf too) gives a code past the largest finite one (at an
 * index past emax + 1 the sum's k is at least 2^(mbits+1); a wrapped index has M far below a), so
 * a min with the largest code the rule allows does the overflow; NaN is set apart; then the sign.
 */
typedef struct fp8k {
  V16 mlo, mhi, clo, chi, ebmin, cmax, nanc;
  int fixnan;
} fp8k;

/* M and C by eb mod 32 (from the rule above; entries past emax + 1 repeat emax + 1's) */
static const uint32_t fp8_tables[2][2][32] = {
    {{0x4A000000, 0x4A800000, 0x4B000000, 0x4B800000, 0x4C000000, 0x4C800000, 0x4D000000,
      0x4D800000, 0x4E000000, 0x4E000000, 0x4E000000, 0x4E000000, 0x4E000000, 0x4E000000,
      0x4E000000, 0x4E000000, 0x4E000000, 0x4E000000, 0x4E000000, 0x4E000000, 0x4E000000,
      0x4E000000, 0x4E000000, 0x4E000000, 0x4E000000, 0x46800000, 0x47000000, 0x47800000,
      0x48000000, 0x48800000, 0x49000000, 0x49800000},
     {0x49FFFFC8, 0x4A7FFFC0, 0x4AFFFFB8, 0x4B7FFFB0, 0x4BFFFFA8, 0x4C7FFFA0, 0x4CFFFF98,
      0x4D7FFF90, 0x4DFFFF88, 0x4DFFFF88, 0x4DFFFF88, 0x4DFFFF88, 0x4DFFFF88, 0x4DFFFF88,
      0x4DFFFF88, 0x4DFFFF88, 0x4DFFFF88, 0x4DFFFF88, 0x4DFFFF88, 0x4DFFFF88, 0x4DFFFF88,
      0x4DFFFF88, 0x4DFFFF88, 0x4DFFFF88, 0x4DFFFF88, 0x46800000, 0x46FFFFF8, 0x477FFFF0,
      0x47FFFFE8, 0x487FFFE0, 0x48FFFFD8, 0x497FFFD0}},
    {{0x4A800000, 0x4B000000, 0x4B800000, 0x4C000000, 0x4C800000, 0x4D000000, 0x4D800000,
      0x4E000000, 0x4E800000, 0x4F000000, 0x4F800000, 0x50000000, 0x50800000, 0x51000000,
      0x51800000, 0x52000000, 0x52000000, 0x43000000, 0x43800000, 0x44000000, 0x44800000,
      0x45000000, 0x45800000, 0x46000000, 0x46800000, 0x47000000, 0x47800000, 0x48000000,
      0x48800000, 0x49000000, 0x49800000, 0x4A000000},
     {0x4A7FFFC4, 0x4AFFFFC0, 0x4B7FFFBC, 0x4BFFFFB8, 0x4C7FFFB4, 0x4CFFFFB0, 0x4D7FFFAC,
      0x4DFFFFA8, 0x4E7FFFA4, 0x4EFFFFA0, 0x4F7FFF9C, 0x4FFFFF98, 0x507FFF94, 0x50FFFF90,
      0x517FFF8C, 0x51FFFF88, 0x51FFFF88, 0x43000000, 0x437FFFFC, 0x43FFFFF8, 0x447FFFF4,
      0x44FFFFF0, 0x457FFFEC, 0x45FFFFE8, 0x467FFFE4, 0x46FFFFE0, 0x477FFFDC, 0x47FFFFD8,
      0x487FFFD4, 0x48FFFFD0, 0x497FFFCC, 0x49FFFFC8}}};

static inline fp8k fp8k_make(int fmt, int sat) {
  fp8k k;
  int e4 = fmt == XTE_FP8_E4M3;
  const uint32_t(*t)[32] = fp8_tables[e4 ? 0 : 1];
  k.mlo = _mm512_loadu_si512((const void *)t[0]);
  k.mhi = _mm512_loadu_si512((const void *)(t[0] + 16));
  k.clo = _mm512_loadu_si512((const void *)t[1]);
  k.chi = _mm512_loadu_si512((const void *)(t[1] + 16));
  k.ebmin = S1(e4 ? 121 : 113);
  k.cmax = S1(e4 ? (sat ? 0x7E : 0x7F) : (sat ? 0x7B : 0x7C));
  k.nanc = S1(e4 ? 0x7F : 0x7E);
  k.fixnan = !e4 || sat; /* e4m3 without saturation: NaN already lands on 0x7F */
  return k;
}

/* magnitude code of a = |x| (bits), NaN not handled */
XTE_AI V16 cvt_mag(const fp8k *k, V16 a) {
  V16 eb = _mm512_max_epu32(_mm512_srli_epi32(a, 23), k->ebmin);
  V16 m = _mm512_permutex2var_epi32(k->mlo, eb, k->mhi);
  V16 c = _mm512_permutex2var_epi32(k->clo, eb, k->chi);
  V16 y = _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(m)));
  return _mm512_min_epu32(_mm512_sub_epi32(y, c), k->cmax);
}

/* r | the sign bit of u at bit 7 */
XTE_AI V16 with_sign(V16 r, V16 u) {
  return _mm512_ternarylogic_epi32(r, _mm512_srli_epi32(u, 24), S1(0x80), 0xF8);
}

XTE_AI V16 cvt(const fp8k *k, __m512 x) {
  V16 u = _mm512_castps_si512(x);
  V16 a = _mm512_and_si512(u, S1(0x7FFFFFFF));
  V16 r = cvt_mag(k, a);
  if (k->fixnan) r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epi32_mask(a, S1(0x7F800000)), k->nanc);
  return with_sign(r, u);
}

/* fp8(x * s) for a NaN-free x and a finite s > 0, from ax = |x|: x * s = sign(x) (ax * s) */
XTE_AI V16 cvt_scaled(const fp8k *k, __m512 x, __m512 ax, __m512 s) {
  return with_sign(cvt_mag(k, _mm512_castps_si512(_mm512_mul_ps(ax, s))), _mm512_castps_si512(x));
}

static inline int pos_finite(float s) {
  return s > 0.0f && s <= 3.40282346638528859812e+38f;
}

/* max of 16 uint32 (for |x| bits: the float max when no NaN; above 0x7F800000 when one is NaN) */
XTE_AI uint32_t hmax_u32(V16 v) {
  v = _mm512_max_epu32(v, _mm512_shuffle_i64x2(v, v, 0x4E));
  v = _mm512_max_epu32(v, _mm512_shuffle_i64x2(v, v, 0xB1));
  v = _mm512_max_epu32(v, _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)0x4E));
  v = _mm512_max_epu32(v, _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)0xB1));
  return (uint32_t)_mm_cvtsi128_si32(_mm512_castsi512_si128(v));
}

/* four vectors of codes (0..255 in each int32) -> 64 bytes in order */
XTE_AI V16 pack4(V16 r0, V16 r1, V16 r2, V16 r3) {
  V16 b = _mm512_packus_epi16(_mm512_packus_epi32(r0, r1), _mm512_packus_epi32(r2, r3));
  return _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), b);
}

XTE_AI void store64(uint8_t *q, V16 v, int nt) {
  if (nt)
    _mm512_stream_si512((void *)q, v);
  else
    _mm512_storeu_si512((void *)q, v);
}

XTE_AI void store16(uint8_t *q, V16 r) {
  _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(r));
}

XTE_AI __m512 ld16(const void *src, int kind, int64_t i) {
  if (kind == XTE_NUM_IN_F32) return _mm512_loadu_ps((const float *)src + i);
  if (kind == XTE_NUM_IN_BF16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)src + i))),
        16));
#ifndef XTE_AVX512_SIMDE
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)src + i)));
#else
  {
    float t[16];
    int j;
    for (j = 0; j < 16; j++) t[j] = xte_fp16_to_f32(((const uint16_t *)src)[i + j]);
    return _mm512_loadu_ps(t);
  }
#endif
}

static inline float hmax16(__m512 v) {
  __m256 h = _mm256_max_ps(_mm512_castps512_ps256(v),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

/* the vector layer of cpu/quantize_template.h: 16 fp32 lanes */
#define XQ_W 16
#define xq_f __m512
#define xq_zero() _mm512_setzero_ps()
#define xq_max(a, b) _mm512_max_ps((a), (b))
#define xq_abs(x) abs16(x)
#define xq_ld(p) _mm512_loadu_ps(p)
#define xq_st(p, v) _mm512_storeu_ps((p), (v))
#define xq_ldk(src, kind, i) ld16((src), (kind), (i))
#define xq_hmax(v) hmax16(v)
#define xq_stream_u8(d, s) _mm512_stream_si512((void *)(d), _mm512_loadu_si512((const void *)(s)))
#define xq_w V16
#define xq_wlo(v) \
  _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16))
#define xq_whi(v)      \
  _mm512_castsi512_ps( \
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64((v), 1)), 16))

#include "cpu/quantize_template.h"

static void load_f32(const void *src, int in_kind, int64_t n, float *dst) {
  int64_t i = 0;
  if (in_kind == XTE_NUM_IN_F32) {
    const float *s = (const float *)src;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_loadu_ps(s + i));
    for (; i < n; i++) dst[i] = s[i];
  } else if (in_kind == XTE_NUM_IN_BF16) {
    const uint16_t *s = (const uint16_t *)src;
    for (; i + 16 <= n; i += 16) {
      V16 v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + i)));
      _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
    for (; i < n; i++) dst[i] = xte_bf16_to_f32(s[i]);
  } else {
    const uint16_t *s = (const uint16_t *)src;
    for (; i < n; i++) dst[i] = xte_fp16_to_f32(s[i]);
  }
}

static float amax(const float *x, int64_t n) {
  __m512 m = _mm512_setzero_ps();
  int64_t i = 0;
  float r, lanes[16];
  int j;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(abs16(_mm512_loadu_ps(x + i)), m);
  _mm512_storeu_ps(lanes, m);
  r = 0.0f;
  for (j = 0; j < 16; j++) r = xte_fmaxf(r, lanes[j]);
  for (; i < n; i++) r = xte_amax_update(r, x[i]);
  return r;
}

static void quant(const float *x, int64_t n, float scale, int fmt, int sat, uint8_t *q) {
  fp8k k = fp8k_make(fmt, sat);
  __m512 s = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    _mm512_storeu_si512((void *)(q + i),
                        pack4(cvt(&k, _mm512_mul_ps(_mm512_loadu_ps(x + i), s)),
                              cvt(&k, _mm512_mul_ps(_mm512_loadu_ps(x + i + 16), s)),
                              cvt(&k, _mm512_mul_ps(_mm512_loadu_ps(x + i + 32), s)),
                              cvt(&k, _mm512_mul_ps(_mm512_loadu_ps(x + i + 48), s))));
  for (; i + 16 <= n; i += 16) store16(q + i, cvt(&k, _mm512_mul_ps(_mm512_loadu_ps(x + i), s)));
  for (; i < n; i++) q[i] = xte_f32_to_fp8(x[i] * scale, fmt, sat);
}

static void quant_vs(const float *x, int64_t n, const float *sc, int fmt, int sat, uint8_t *q) {
  fp8k k = fp8k_make(fmt, sat);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store16(q + i, cvt(&k, _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(sc + i))));
  for (; i < n; i++) q[i] = xte_f32_to_fp8(x[i] * sc[i], fmt, sat);
}

static void cast_fp8(const float *x, int64_t n, int fmt, int sat, uint8_t *q) {
  fp8k k = fp8k_make(fmt, sat);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    _mm512_storeu_si512(
        (void *)(q + i),
        pack4(cvt(&k, _mm512_loadu_ps(x + i)), cvt(&k, _mm512_loadu_ps(x + i + 16)),
              cvt(&k, _mm512_loadu_ps(x + i + 32)), cvt(&k, _mm512_loadu_ps(x + i + 48))));
  for (; i + 16 <= n; i += 16) store16(q + i, cvt(&k, _mm512_loadu_ps(x + i)));
  for (; i < n; i++) q[i] = xte_f32_to_fp8(x[i], fmt, sat);
}

static void cast_bf16(const float *x, int64_t n, uint16_t *y) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    V16 u = _mm512_castps_si512(_mm512_loadu_ps(x + i));
    V16 a = _mm512_and_si512(u, S1(0x7FFFFFFF));
    __mmask16 isnan = _mm512_cmpgt_epi32_mask(a, S1(0x7F800000));
    V16 odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), S1(1));
    V16 r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, S1(0x7FFF)), odd), 16);
    r = _mm512_mask_mov_epi32(r, isnan, _mm512_or_si512(_mm512_srli_epi32(u, 16), S1(0x40)));
    _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtepi32_epi16(r));
  }
  for (; i < n; i++) y[i] = xte_f32_to_bf16(x[i]);
}

static void cast_fp16(const float *x, int64_t n, uint16_t *y) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    V16 u = _mm512_castps_si512(_mm512_loadu_ps(x + i));
    V16 sign = _mm512_and_si512(_mm512_srli_epi32(u, 16), S1(0x8000));
    V16 a = _mm512_and_si512(u, S1(0x7FFFFFFF));
    __mmask16 isnan = _mm512_cmpgt_epi32_mask(a, S1(0x7F800000));
    __mmask16 ovf = _mm512_cmpgt_epi32_mask(a, S1(0x477FEFFF));
    __mmask16 normal = _mm512_cmpgt_epi32_mask(a, S1(0x387FFFFF));
    V16 odd = _mm512_and_si512(_mm512_srli_epi32(a, 13), S1(1));
    V16 rn = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(a, S1(0xFFF)), odd), 13);
    __m512 yy = _mm512_add_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(0.5f));
    V16 r = _mm512_sub_epi32(_mm512_castps_si512(yy), S1(0x3F000000));
    r = _mm512_mask_mov_epi32(r, normal, _mm512_sub_epi32(rn, S1(112 << 10)));
    r = _mm512_mask_mov_epi32(r, ovf, S1(0x7C00));
    r = _mm512_mask_mov_epi32(
        r, isnan,
        _mm512_or_si512(S1(0x7E00), _mm512_and_si512(_mm512_srli_epi32(a, 13), S1(0x3FF))));
    r = _mm512_or_si512(r, sign);
    _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtepi32_epi16(r));
  }
  for (; i < n; i++) y[i] = xte_f32_to_fp16(x[i]);
}

/* 16 rows x 64 bytes: the 16x16 unpack transpose in each 128-bit lane; lane L of r[i] is source
 * column 16 L + i. */
static inline void tr16x64(const uint8_t *s, int64_t lds, uint8_t *d, int64_t ldd) {
  V16 r[16], t[16];
  int i;
  for (i = 0; i < 16; i++) r[i] = _mm512_loadu_si512((const void *)(s + i * lds));
  XTE_TR16_NETWORK(_mm512, r, t);
  for (i = 0; i < 16; i++) {
    _mm_storeu_si128((__m128i *)(d + i * ldd), _mm512_castsi512_si128(r[i]));
    _mm_storeu_si128((__m128i *)(d + (16 + i) * ldd), _mm512_extracti32x4_epi32(r[i], 1));
    _mm_storeu_si128((__m128i *)(d + (32 + i) * ldd), _mm512_extracti32x4_epi32(r[i], 2));
    _mm_storeu_si128((__m128i *)(d + (48 + i) * ldd), _mm512_extracti32x4_epi32(r[i], 3));
  }
}

/* 16x16 with SSE unpacks (as the AVX2 kernels) */
static inline void tr16(const uint8_t *s, int64_t lds, uint8_t *d, int64_t ldd) {
  __m128i r[16], t[16];
  int i;
  for (i = 0; i < 16; i++) r[i] = _mm_loadu_si128((const __m128i *)(s + i * lds));
  XTE_TR16_NETWORK(_mm, r, t);
  for (i = 0; i < 16; i++) _mm_storeu_si128((__m128i *)(d + i * ldd), r[i]);
}

static void transpose_u8(const uint8_t *src, int64_t rows, int64_t cols, int64_t lds, uint8_t *dst,
                         int64_t ldd) {
  int64_t r, c, r16 = rows & ~(int64_t)15, c64 = cols & ~(int64_t)63, c16 = cols & ~(int64_t)15;
  for (r = 0; r < r16; r += 16) {
    for (c = 0; c < c64; c += 64) tr16x64(src + r * lds + c, lds, dst + c * ldd + r, ldd);
    for (; c < c16; c += 16) tr16(src + r * lds + c, lds, dst + c * ldd + r, ldd);
  }
  for (r = 0; r < rows; r++)
    for (c = (r < r16 ? c16 : 0); c < cols; c++) dst[c * ldd + r] = src[r * lds + c];
}

/* 64 rows x 16 bytes -> 16 rows of 64 bytes: lane q of r[i] is source row 16 q + i, so after the
 * network r[c] is the whole destination row c */
static inline void tr64x16(const uint8_t *s, int64_t lds, uint8_t *d, int64_t ldd, int nt) {
  V16 r[16], t[16];
  int i;
  for (i = 0; i < 16; i++) { /* the lane numbers immediates at any optimization level */
    r[i] = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(s + i * lds)));
    r[i] = _mm512_inserti32x4(r[i], _mm_loadu_si128((const __m128i *)(s + (16 + i) * lds)), 1);
    r[i] = _mm512_inserti32x4(r[i], _mm_loadu_si128((const __m128i *)(s + (32 + i) * lds)), 2);
    r[i] = _mm512_inserti32x4(r[i], _mm_loadu_si128((const __m128i *)(s + (48 + i) * lds)), 3);
  }
  XTE_TR16_NETWORK(_mm512, r, t);
  for (i = 0; i < 16; i++) store64(d + i * ldd, r[i], nt);
}

/* As transpose_u8, straight into the destination in 64-byte rows (streaming stores when nt and
 * they are 64-byte aligned); column groups outer, so that the lines of a destination row leave one
 * right after the other (the memory takes them faster than all first lines, then all second) */
static void transpose_nt(const uint8_t *src, int64_t rows, int64_t cols, int64_t lds, uint8_t *dst,
                         int64_t ldd, int nt) {
  const int64_t r64 = rows & ~(int64_t)63, c16 = cols & ~(int64_t)15;
  int64_t r, c;
  nt = nt && !((uintptr_t)dst & 63) && !(ldd & 63);
  for (c = 0; c < c16; c += 16)
    for (r = 0; r < r64; r += 64) tr64x16(src + r * lds + c, lds, dst + c * ldd + r, ldd, nt);
  if (c16 < cols) transpose_u8(src + c16, r64, cols - c16, lds, dst + c16 * ldd, ldd);
  if (r64 < rows) transpose_u8(src + r64 * lds, rows - r64, cols, lds, dst + r64, ldd);
}

/* The TE recipes (xte_scale_te: TE_CURRENT, TE_BLOCK) 16 blocks at a time, lane by lane the
 * header's steps */
typedef struct tesk {
  __m512 eps, fmax, dmax, one, inf;
  int pow2;
} tesk;

static inline tesk tesk_make(const xte_quant_args *a) {
  tesk c;
  c.eps = _mm512_set1_ps(a->eps);
  c.fmax = _mm512_set1_ps(xte_fp8_max(a->fmt));
  c.dmax = _mm512_set1_ps(xte_quant_te_inf_scale(a));
  c.one = _mm512_set1_ps(1.0f);
  c.inf = _mm512_castsi512_ps(S1(0x7F800000));
  c.pow2 = xte_quant_te_pow2(a);
  return c;
}

/* the scales of the 16 amaxes v */
XTE_AI __m512 te_scale16(const tesk *c, __m512 v) {
  __m512 q;
  __mmask16 deg;
  v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, c->eps, _CMP_LT_OQ), c->eps);
  deg = _mm512_cmp_ps_mask(abs16(v), c->inf, _CMP_EQ_OQ) |
        _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_EQ_OQ) |
        _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  q = _mm512_div_ps(c->fmax, v);
  q = _mm512_mask_mov_ps(q, _mm512_cmp_ps_mask(abs16(q), c->inf, _CMP_EQ_OQ), c->dmax);
  if (c->pow2)
    q = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(q), S1((int)0xFF800000)));
  return _mm512_mask_mov_ps(q, deg, c->one);
}

/* s[0..n) from the scale vector q (lanes of mask m) */
XTE_AI void store_scales16(xte_block_scale *s, __m512 q, __m512 one, int n) {
  _Alignas(64) float sc[16], si[16];
  int j;
  _mm512_store_ps(sc, q);
  _mm512_store_ps(si, _mm512_div_ps(one, q));
  for (j = 0; j < n; j++) {
    s[j].scale = sc[j];
    s[j].scale_inv = si[j];
    s[j].e8m0 = 0;
  }
}

/* p2w_ok of the 16 scales q (lanes) */
XTE_AI __mmask16 p2w_ok16(__m512 q) {
  const V16 u = _mm512_castps_si512(q), e = _mm512_srli_epi32(u, 23);
  return _mm512_testn_epi32_mask(u, S1(0x7FFFFF)) &
         _mm512_cmpge_epu32_mask(e, S1((int)P2W_EXP_MIN)) &
         _mm512_cmple_epu32_mask(e, S1((int)P2W_EXP_MAX));
}

/* p2w_d and p2w_t of the 16 scales q, stored as uint16 (lanes of mask m) */
XTE_AI void p2w_dt16(__m512 q, int fmt, __mmask16 m, uint16_t *d, uint16_t *t) {
  const V16 kk = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(q), 23), S1(127));
  _mm512_mask_cvtepi32_storeu_epi16(d, m,
                                    _mm512_sub_epi32(S1(p2w_d0(fmt)), _mm512_slli_epi32(kk, 7)));
  _mm512_mask_cvtepi32_storeu_epi16(t, m,
                                    _mm512_slli_epi32(_mm512_sub_epi32(S1(p2w_t0(fmt)), kk), 7));
}

/* The TE scales of the n <= 16 amaxes am (mask of the first n lanes) into s (and their values
 * into f, their word-path parameters into d / t); their p2w_ok lanes and whether some amax times
 * its scale passes fmax (exact for 2^k scales) folded into *ok / *over; returns the amaxes (0 in
 * lanes past n) */
XTE_AI __m512 te_params16(const tesk *c, const float *am, int n, int fmt, xte_block_scale *s,
                          float *f, uint16_t *d, uint16_t *t, int *ok, int *over) {
  const __mmask16 m = (__mmask16)((1u << n) - 1u);
  const __m512 v = _mm512_maskz_loadu_ps(m, am), q = te_scale16(c, v);
  *ok &= (p2w_ok16(q) & m) == m;
  *over |= _mm512_mask_cmp_ps_mask(m, _mm512_mul_ps(v, q), c->fmax, _CMP_NLE_UQ) != 0;
  _mm512_mask_storeu_ps(f, m, q);
  p2w_dt16(q, fmt, m, d, t);
  store_scales16(s, q, c->one, n);
  return v;
}

/* The TE recipes through te_scale16; the others through the header. */
static void block_scales(const xte_quant_args *a, const float *amax, int64_t n,
                         xte_block_scale *s) {
  int64_t i = 0;
  if (xte_quant_is_te(a)) {
    const tesk c = tesk_make(a);
    for (; i + 16 <= n; i += 16)
      store_scales16(s + i, te_scale16(&c, _mm512_loadu_ps(amax + i)), c.one, 16);
  }
  for (; i < n; i++) s[i] = xte_quant_block_scale(a, amax[i]);
}

/* ---- bf16 input in 16-bit lanes: |x| is the word without its sign bit, and for these the
 * uint16 order is the float order (NaN above 0x7F80), so amaxes are word maxima. Converting, the
 * words unpack to fp32 (bits << 16) in an order within each 128-bit lane that the packing undoes;
 * the sign bytes come from the words' high bytes. */
XTE_AI uint32_t hmax_u16(V16 v) {
  v = _mm512_max_epu16(v, _mm512_shuffle_i64x2(v, v, 0x4E));
  v = _mm512_max_epu16(v, _mm512_shuffle_i64x2(v, v, 0xB1));
  v = _mm512_max_epu16(v, _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)0x4E));
  v = _mm512_max_epu16(v, _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)0xB1));
  v = _mm512_max_epu16(v, _mm512_srli_epi32(v, 16));
  return (uint32_t)_mm_cvtsi128_si32(_mm512_castsi512_si128(v)) & 0xFFFFu;
}

XTE_AI V16 ldw(const uint16_t *p) {
  return _mm512_loadu_si512((const void *)p);
}

XTE_AI V16 absw(V16 z) {
  return _mm512_and_si512(z, _mm512_set1_epi16(0x7FFF));
}

/* of 32 words: elements 8L..8L+3 (lo) and 8L+4..8L+7 (hi) of each 128-bit lane L, as fp32 */
XTE_AI __m512 wlo(V16 z) {
  return _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), z));
}
XTE_AI __m512 whi(V16 z) {
  return _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), z));
}

/* magnitude codes of lo/hi(z0), lo/hi(z1) and the signs of the words z0, z1 -> 64 bytes in order */
XTE_AI V16 pack_bf16(V16 r0, V16 r1, V16 r2, V16 r3, V16 z0, V16 z1) {
  V16 b = _mm512_packus_epi16(_mm512_packus_epi32(r0, r1), _mm512_packus_epi32(r2, r3));
  V16 sb = _mm512_packus_epi16(_mm512_srli_epi16(z0, 8), _mm512_srli_epi16(z1, 8));
  b = _mm512_ternarylogic_epi32(b, sb, _mm512_set1_epi8((char)0x80), 0xD8); /* bit 7 from sb */
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), b);
}

XTE_AI V16 mag_code(const fp8k *k, __m512 ax, __m512 s) {
  return cvt_mag(k, _mm512_castps_si512(_mm512_mul_ps(ax, s)));
}

/* ---- bf16 words and a power-of-two scale 2^k: see cpu/p2w.h */
typedef struct p2wk {
  __m128i sh;
  V16 one, cmax, sgn, mbits;
  __m512 magic;
} p2wk;

static inline p2wk p2wk_make(int fmt, int sat) {
  p2wk w;
  w.sh = _mm_cvtsi32_si128(fmt == XTE_FP8_E4M3 ? 4 : 5);
  w.one = _mm512_set1_epi16(1);
  w.cmax = _mm512_set1_epi16((short)p2w_cmax(fmt, sat));
  w.sgn = _mm512_set1_epi16(0x80);
  w.mbits = S1((int)p2w_magic(fmt));
  w.magic = _mm512_castsi512_ps(w.mbits);
  return w;
}

/* magnitude codes of the words z; clamp 0: the caller knows that no |x| s passes the largest
 * finite value (then no code passes cmax); sub: P2W_SUB_RARE or P2W_SUB_ALWAYS (cpu/p2w.h) */
XTE_AI V16 p2w_mag(const p2wk *w, V16 z, V16 d, V16 t, __m512 s_lo, __m512 s_hi, int clamp,
                   int sub) {
  V16 a = absw(z);
  V16 odd = _mm512_and_si512(_mm512_srl_epi16(a, w->sh), w->one);
  V16 r = _mm512_srl_epi16(_mm512_subs_epu16(_mm512_add_epi16(a, odd), d), w->sh);
  __mmask32 lo = _mm512_cmplt_epu16_mask(a, t);
  if (clamp) r = _mm512_min_epu16(r, w->cmax);
  if (sub == P2W_SUB_ALWAYS || lo) {
    V16 ylo = _mm512_castps_si512(_mm512_fmadd_ps(wlo(a), s_lo, w->magic));
    V16 yhi = _mm512_castps_si512(_mm512_fmadd_ps(whi(a), s_hi, w->magic));
    r = _mm512_mask_mov_epi16(
        r, lo,
        _mm512_packus_epi32(_mm512_sub_epi32(ylo, w->mbits), _mm512_sub_epi32(yhi, w->mbits)));
  }
  return r;
}

/* codes of the words z (sign included, in the low byte of each word); s_lo / s_hi: the lanes'
 * scales 2^k as fp32 in wlo / whi order; lanes |w| < t by the fma of cpu/p2w.h. */
XTE_AI V16 p2w_code(const p2wk *w, V16 z, V16 d, V16 t, __m512 s_lo, __m512 s_hi, int sub) {
  return _mm512_ternarylogic_epi32(p2w_mag(w, z, d, t, s_lo, s_hi, 1, sub), _mm512_srli_epi16(z, 8),
                                   w->sgn, 0xF8);
}

/* 2 x 32 word codes -> 64 bytes in order */
XTE_AI V16 p2w_pack(V16 c0, V16 c1) {
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                  _mm512_packus_epi16(c0, c1));
}

/* ---------------------------------------------------------------- fused kernels
 * Over rows x n elements of the input (row stride lds elements). The bodies take the input kind
 * (and the block width) as constants: always inlined into one copy per kind. */

#define ROW(p, r, ld, es) ((const char *)(p) + (size_t)(r) * (size_t)(ld) * (es))

XTE_AI float load_amax_body(const void *src, int64_t lds, int kind, int64_t rows, int64_t n,
                            float *acc) {
  const size_t es = kind == XTE_NUM_IN_F32 ? 4 : 2;
  float m = 0.0f;
  int64_t r;
  for (r = 0; r < rows; r++) m = xte_fmaxf(m, load_amax_row(ROW(src, r, lds, es), kind, n, acc));
  return m;
}

/* No acc, bf16 or fp32 (f32): integer maxima of the |x| bits, 64 bytes of a row at a time (a
 * NaN: the float way) */
XTE_AI float load_amax_bits(const void *src, int64_t lds, int64_t rows, int64_t n, int f32) {
  const int64_t es = f32 ? 4 : 2, step = 64 / es; /* elements per vector */
  V16 m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
  uint32_t mb;
  int64_t r, i;
  for (r = 0; r < rows; r++) {
    const char *p = (const char *)src + r * lds * es;
    for (i = 0; i + 2 * step <= n; i += 2 * step) {
      const V16 x0 = _mm512_loadu_si512((const void *)(p + i * es));
      const V16 x1 = _mm512_loadu_si512((const void *)(p + (i + step) * es));
      m0 = f32 ? _mm512_max_epu32(m0, _mm512_and_si512(x0, S1(0x7FFFFFFF)))
               : _mm512_max_epu16(m0, absw(x0));
      m1 = f32 ? _mm512_max_epu32(m1, _mm512_and_si512(x1, S1(0x7FFFFFFF)))
               : _mm512_max_epu16(m1, absw(x1));
    }
  }
  mb = f32 ? hmax_u32(_mm512_max_epu32(m0, m1)) : hmax_u16(_mm512_max_epu16(m0, m1)) << 16;
  if (mb > 0x7F800000u)
    return load_amax_body(src, lds, f32 ? XTE_NUM_IN_F32 : XTE_NUM_IN_BF16, rows, n, NULL);
  return xte_bits_f32(mb);
}

static float load_amax(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                       float *acc) {
  if (in_kind == XTE_NUM_IN_BF16 && !acc && n % 64 == 0)
    return load_amax_bits(src, lds, rows, n, 0);
  if (in_kind == XTE_NUM_IN_F32 && !acc && n % 32 == 0) return load_amax_bits(src, lds, rows, n, 1);
  switch (in_kind) {
    case XTE_NUM_IN_F32:
      return load_amax_body(src, lds, XTE_NUM_IN_F32, rows, n, acc);
    case XTE_NUM_IN_BF16:
      return load_amax_body(src, lds, XTE_NUM_IN_BF16, rows, n, acc);
    default:
      return load_amax_body(src, lds, XTE_NUM_IN_F16, rows, n, acc);
  }
}

/* One row, the general sequence (NaN, or a scale that is not finite and > 0). */
XTE_AI float load_quant_slow(const fp8k *k, const void *src, int kind, int64_t n, float scale,
                             int fmt, int sat, uint8_t *q, int nt) {
  __m512 s = _mm512_set1_ps(scale), m = _mm512_setzero_ps();
  int64_t i = 0;
  float r;
  for (; i + 64 <= n; i += 64) {
    __m512 x0 = ld16(src, kind, i), x1 = ld16(src, kind, i + 16);
    __m512 x2 = ld16(src, kind, i + 32), x3 = ld16(src, kind, i + 48);
    m = _mm512_max_ps(abs16(x0), m);
    m = _mm512_max_ps(abs16(x1), m);
    m = _mm512_max_ps(abs16(x2), m);
    m = _mm512_max_ps(abs16(x3), m);
    store64(q + i,
            pack4(cvt(k, _mm512_mul_ps(x0, s)), cvt(k, _mm512_mul_ps(x1, s)),
                  cvt(k, _mm512_mul_ps(x2, s)), cvt(k, _mm512_mul_ps(x3, s))),
            nt);
  }
  for (; i + 16 <= n; i += 16) {
    __m512 x = ld16(src, kind, i);
    m = _mm512_max_ps(abs16(x), m);
    store16(q + i, cvt(k, _mm512_mul_ps(x, s)));
  }
  r = hmax16(m);
  for (; i < n; i++) {
    float x = ld1(src, kind, i);
    r = xte_amax_update(r, x);
    q[i] = xte_f32_to_fp8(x * scale, fmt, sat);
  }
  return r;
}

/* One row, a finite scale > 0: the fast sequence, watching for NaN (then the row is redone by the
 * general one). */
XTE_AI float load_quant_row(const fp8k *k, const void *src, int kind, int64_t n, float scale,
                            int fmt, int sat, uint8_t *q, int nt) {
  __m512 s = _mm512_set1_ps(scale);
  V16 mi = _mm512_setzero_si512();
  int64_t i = 0;
  uint32_t mb;
  float r;
  for (; i + 64 <= n; i += 64) {
    __m512 x0 = ld16(src, kind, i), x1 = ld16(src, kind, i + 16);
    __m512 x2 = ld16(src, kind, i + 32), x3 = ld16(src, kind, i + 48);
    __m512 a0 = abs16(x0), a1 = abs16(x1), a2 = abs16(x2), a3 = abs16(x3);
    mi = _mm512_max_epu32(
        mi, _mm512_max_epu32(_mm512_max_epu32(_mm512_castps_si512(a0), _mm512_castps_si512(a1)),
                             _mm512_max_epu32(_mm512_castps_si512(a2), _mm512_castps_si512(a3))));
    store64(q + i,
            pack4(cvt_scaled(k, x0, a0, s), cvt_scaled(k, x1, a1, s), cvt_scaled(k, x2, a2, s),
                  cvt_scaled(k, x3, a3, s)),
            nt);
  }
  for (; i + 16 <= n; i += 16) {
    __m512 x = ld16(src, kind, i), ax = abs16(x);
    mi = _mm512_max_epu32(mi, _mm512_castps_si512(ax));
    store16(q + i, cvt_scaled(k, x, ax, s));
  }
  mb = hmax_u32(mi);
  if (mb > 0x7F800000u) {
    if (nt) _mm_sfence();
    return load_quant_slow(k, src, kind, n, scale, fmt, sat, q, nt);
  }
  r = xte_bits_f32(mb);
  for (; i < n; i++) {
    float x = ld1(src, kind, i);
    r = xte_amax_update(r, x);
    q[i] = xte_f32_to_fp8(x * scale, fmt, sat);
  }
  return r;
}

/* bf16 row, n % 64 == 0, a finite scale > 0; NaN: redone the general way */
XTE_AI float load_quant_row_bf16(const fp8k *k, const uint16_t *p, int64_t n, float scale, int fmt,
                                 int sat, uint8_t *q, int nt) {
  __m512 s = _mm512_set1_ps(scale);
  V16 mi = _mm512_setzero_si512();
  uint32_t mb;
  int64_t i;
  for (i = 0; i + 64 <= n; i += 64) {
    V16 z0 = ldw(p + i), z1 = ldw(p + i + 32), a0 = absw(z0), a1 = absw(z1);
    mi = _mm512_max_epu16(mi, _mm512_max_epu16(a0, a1));
    store64(q + i,
            pack_bf16(mag_code(k, wlo(a0), s), mag_code(k, whi(a0), s), mag_code(k, wlo(a1), s),
                      mag_code(k, whi(a1), s), z0, z1),
            nt);
  }
  mb = hmax_u16(mi);
  if (mb > 0x7F80u) {
    if (nt) _mm_sfence();
    return load_quant_slow(k, p, XTE_NUM_IN_BF16, n, scale, fmt, sat, q, nt);
  }
  return xte_bits_f32(mb << 16);
}

/* bf16 rows, n % 64 == 0, a power-of-two scale (p2w_ok): the word sequence, the codes to q and,
 * when q2 is not NULL, also to q2 (row stride ldq2, cached stores); a NaN anywhere: all rows
 * redone the general way (q2: -1 returned instead, the caller redoes them) */
XTE_AI float load_quant_p2w(const fp8k *k, const uint16_t *p, int64_t lds, int64_t rows, int64_t n,
                            float scale, int fmt, int sat, uint8_t *q, int64_t ldq, int nt,
                            uint8_t *q2, int64_t ldq2) {
  const p2wk w = p2wk_make(fmt, sat);
  const V16 d = _mm512_set1_epi16((short)p2w_d(scale, fmt));
  const V16 t = _mm512_set1_epi16((short)p2w_t(scale, fmt));
  const __m512 s = _mm512_set1_ps(scale);
  V16 mi = _mm512_setzero_si512();
  uint32_t mb;
  float m = 0.0f;
  int64_t r, i;
  for (r = 0; r < rows; r++)
    for (i = 0; i + 64 <= n; i += 64) {
      V16 z0 = ldw(p + r * lds + i), z1 = ldw(p + r * lds + i + 32);
      mi = _mm512_max_epu16(mi, _mm512_max_epu16(absw(z0), absw(z1)));
      const V16 b = p2w_pack(p2w_code(&w, z0, d, t, s, s, P2W_SUB_ALWAYS),
                             p2w_code(&w, z1, d, t, s, s, P2W_SUB_ALWAYS));
      store64(q + r * ldq + i, b, nt);
      if (q2) _mm512_storeu_si512((void *)(q2 + r * ldq2 + i), b);
    }
  mb = hmax_u16(mi);
  if (mb <= 0x7F80u) return xte_bits_f32(mb << 16);
  if (nt) _mm_sfence();
  if (q2) return -1.0f;
  for (r = 0; r < rows; r++)
    m = xte_fmaxf(
        m, load_quant_slow(k, p + r * lds, XTE_NUM_IN_BF16, n, scale, fmt, sat, q + r * ldq, nt));
  return m;
}

XTE_AI float load_quant_body(const void *src, int64_t lds, int kind, int64_t rows, int64_t n,
                             float scale, int fmt, int sat, uint8_t *q, int64_t ldq, int nt) {
  const size_t es = kind == XTE_NUM_IN_F32 ? 4 : 2;
  fp8k k = fp8k_make(fmt, sat);
  float m = 0.0f;
  int64_t r;
  nt = nt && !((uintptr_t)q & 63) && !(ldq & 63);
  if (kind == XTE_NUM_IN_BF16 && n % 64 == 0 && p2w_ok(scale))
    m = load_quant_p2w(&k, (const uint16_t *)src, lds, rows, n, scale, fmt, sat, q, ldq, nt, NULL,
                       0);
  else if (kind == XTE_NUM_IN_BF16 && n % 64 == 0 && pos_finite(scale))
    for (r = 0; r < rows; r++)
      m = xte_fmaxf(m, load_quant_row_bf16(&k, (const uint16_t *)src + r * lds, n, scale, fmt, sat,
                                           q + r * ldq, nt));
  else if (pos_finite(scale))
    for (r = 0; r < rows; r++)
      m = xte_fmaxf(
          m, load_quant_row(&k, ROW(src, r, lds, es), kind, n, scale, fmt, sat, q + r * ldq, nt));
  else
    for (r = 0; r < rows; r++)
      m = xte_fmaxf(
          m, load_quant_slow(&k, ROW(src, r, lds, es), kind, n, scale, fmt, sat, q + r * ldq, nt));
  return m;
}

static float load_quant(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                        float scale, int fmt, int sat, uint8_t *q, int64_t ldq, int nt) {
  switch (in_kind) {
    case XTE_NUM_IN_F32:
      return load_quant_body(src, lds, XTE_NUM_IN_F32, rows, n, scale, fmt, sat, q, ldq, nt);
    case XTE_NUM_IN_BF16:
      return load_quant_body(src, lds, XTE_NUM_IN_BF16, rows, n, scale, fmt, sat, q, ldq, nt);
    default:
      return load_quant_body(src, lds, XTE_NUM_IN_F16, rows, n, scale, fmt, sat, q, ldq, nt);
  }
}

/* fp32 rows, n % 64 == 0, a finite scale > 0: load_quant_row's sequence, the codes to q and q2
 * (cached stores); -1 when a NaN was seen (the caller redoes the rows) */
static float load_quant_dup_f32(const fp8k *k, const float *p, int64_t lds, int64_t rows, int64_t n,
                                float scale, uint8_t *q, int64_t ldq, int nt, uint8_t *q2,
                                int64_t ldq2) {
  const __m512 s = _mm512_set1_ps(scale);
  V16 mi = _mm512_setzero_si512();
  uint32_t mb;
  int64_t r, i;
  for (r = 0; r < rows; r++)
    for (i = 0; i + 64 <= n; i += 64) {
      const float *x = p + r * lds + i;
      __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
      __m512 x2 = _mm512_loadu_ps(x + 32), x3 = _mm512_loadu_ps(x + 48);
      __m512 a0 = abs16(x0), a1 = abs16(x1), a2 = abs16(x2), a3 = abs16(x3);
      V16 b;
      mi = _mm512_max_epu32(
          mi, _mm512_max_epu32(_mm512_max_epu32(_mm512_castps_si512(a0), _mm512_castps_si512(a1)),
                               _mm512_max_epu32(_mm512_castps_si512(a2), _mm512_castps_si512(a3))));
      b = pack4(cvt_scaled(k, x0, a0, s), cvt_scaled(k, x1, a1, s), cvt_scaled(k, x2, a2, s),
                cvt_scaled(k, x3, a3, s));
      store64(q + r * ldq + i, b, nt);
      _mm512_storeu_si512((void *)(q2 + r * ldq2 + i), b);
    }
  mb = hmax_u32(mi);
  if (mb > 0x7F800000u) {
    if (nt) _mm_sfence();
    return -1.0f;
  }
  return xte_bits_f32(mb);
}

static int load_quant_dup(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                          float scale, int fmt, int sat, uint8_t *q, int64_t ldq, int nt,
                          uint8_t *q2, int64_t ldq2, float *amax) {
  fp8k k = fp8k_make(fmt, sat);
  float m;
  if (n % 64 != 0) return 0;
  nt = nt && !((uintptr_t)q & 63) && !(ldq & 63);
  if (in_kind == XTE_NUM_IN_BF16 && p2w_ok(scale))
    m = load_quant_p2w(&k, (const uint16_t *)src, lds, rows, n, scale, fmt, sat, q, ldq, nt, q2,
                       ldq2);
  else if (in_kind == XTE_NUM_IN_F32 && pos_finite(scale))
    m = load_quant_dup_f32(&k, (const float *)src, lds, rows, n, scale, q, ldq, nt, q2, ldq2);
  else
    return 0;
  if (m < 0.0f) return 0;
  *amax = m;
  return 1;
}

XTE_AI void load_quant_vs_slow(const fp8k *k, const void *src, int kind, int64_t n, const float *sc,
                               int fmt, int sat, uint8_t *q, int nt) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    store64(q + i,
            pack4(cvt(k, _mm512_mul_ps(ld16(src, kind, i), _mm512_loadu_ps(sc + i))),
                  cvt(k, _mm512_mul_ps(ld16(src, kind, i + 16), _mm512_loadu_ps(sc + i + 16))),
                  cvt(k, _mm512_mul_ps(ld16(src, kind, i + 32), _mm512_loadu_ps(sc + i + 32))),
                  cvt(k, _mm512_mul_ps(ld16(src, kind, i + 48), _mm512_loadu_ps(sc + i + 48)))),
            nt);
  for (; i + 16 <= n; i += 16)
    store16(q + i, cvt(k, _mm512_mul_ps(ld16(src, kind, i), _mm512_loadu_ps(sc + i))));
  for (; i < n; i++) q[i] = xte_f32_to_fp8(ld1(src, kind, i) * sc[i], fmt, sat);
}

XTE_AI void load_quant_vs_row(const fp8k *k, const void *src, int kind, int64_t n, const float *sc,
                              int fmt, int sat, uint8_t *q, int nt) {
  V16 mi = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512 x0 = ld16(src, kind, i), x1 = ld16(src, kind, i + 16);
    __m512 x2 = ld16(src, kind, i + 32), x3 = ld16(src, kind, i + 48);
    __m512 a0 = abs16(x0), a1 = abs16(x1), a2 = abs16(x2), a3 = abs16(x3);
    mi = _mm512_max_epu32(
        mi, _mm512_max_epu32(_mm512_max_epu32(_mm512_castps_si512(a0), _mm512_castps_si512(a1)),
                             _mm512_max_epu32(_mm512_castps_si512(a2), _mm512_castps_si512(a3))));
    store64(q + i,
            pack4(cvt_scaled(k, x0, a0, _mm512_loadu_ps(sc + i)),
                  cvt_scaled(k, x1, a1, _mm512_loadu_ps(sc + i + 16)),
                  cvt_scaled(k, x2, a2, _mm512_loadu_ps(sc + i + 32)),
                  cvt_scaled(k, x3, a3, _mm512_loadu_ps(sc + i + 48))),
            nt);
  }
  for (; i + 16 <= n; i += 16) {
    __m512 x = ld16(src, kind, i), ax = abs16(x);
    mi = _mm512_max_epu32(mi, _mm512_castps_si512(ax));
    store16(q + i, cvt_scaled(k, x, ax, _mm512_loadu_ps(sc + i)));
  }
  if (hmax_u32(mi) > 0x7F800000u) {
    if (nt) _mm_sfence();
    load_quant_vs_slow(k, src, kind, n, sc, fmt, sat, q, nt);
    return;
  }
  for (; i < n; i++) q[i] = xte_f32_to_fp8(ld1(src, kind, i) * sc[i], fmt, sat);
}

/* bf16 rows, n % 64 == 0, n <= 256, finite scales > 0; the scales permuted as wlo / whi order */
static void load_quant_vs_bf16(const fp8k *k, const void *src, int64_t lds, int64_t rows, int64_t n,
                               const float *sc, int fmt, int sat, uint8_t *q, int64_t ldq, int nt) {
  const V16 ilo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const V16 ihi = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  __m512 sp[16];
  _Alignas(64) uint16_t pd[256], pt[256];
  V16 dv[8], tv[8];
  const p2wk w = p2wk_make(fmt, sat);
  int64_t r, i;
  int p2 = 1;
  for (i = 0; i < n; i += 32) {
    __m512 s0 = _mm512_loadu_ps(sc + i), s1 = _mm512_loadu_ps(sc + i + 16);
    sp[i / 16] = _mm512_permutex2var_ps(s0, ilo, s1);
    sp[i / 16 + 1] = _mm512_permutex2var_ps(s0, ihi, s1);
  }
  for (i = 0; i < n; i++) {
    p2 &= p2w_ok(sc[i]);
    pd[i] = p2w_d(sc[i], fmt);
    pt[i] = p2w_t(sc[i], fmt);
  }
  for (i = 0; i < n; i += 32) {
    dv[i / 32] = _mm512_load_si512((const void *)(pd + i));
    tv[i / 32] = _mm512_load_si512((const void *)(pt + i));
  }
  for (r = 0; r < rows; r++) {
    const uint16_t *p = (const uint16_t *)src + r * lds;
    uint8_t *d = q + r * ldq;
    V16 mi = _mm512_setzero_si512();
    for (i = 0; i < n; i += 64) {
      V16 z0 = ldw(p + i), z1 = ldw(p + i + 32), a0 = absw(z0), a1 = absw(z1);
      mi = _mm512_max_epu16(mi, _mm512_max_epu16(a0, a1));
      if (p2) {
        store64(d + i,
                p2w_pack(p2w_code(&w, z0, dv[i / 32], tv[i / 32], sp[i / 16], sp[i / 16 + 1],
                                  P2W_SUB_ALWAYS),
                         p2w_code(&w, z1, dv[i / 32 + 1], tv[i / 32 + 1], sp[i / 16 + 2],
                                  sp[i / 16 + 3], P2W_SUB_ALWAYS)),
                nt);
        continue;
      }
      store64(d + i,
              pack_bf16(mag_code(k, wlo(a0), sp[i / 16]), mag_code(k, whi(a0), sp[i / 16 + 1]),
                        mag_code(k, wlo(a1), sp[i / 16 + 2]), mag_code(k, whi(a1), sp[i / 16 + 3]),
                        z0, z1),
              nt);
    }
    if (hmax_u16(mi) > 0x7F80u) {
      if (nt) _mm_sfence();
      load_quant_vs_slow(k, p, XTE_NUM_IN_BF16, n, sc, fmt, sat, d, nt);
    }
  }
}

XTE_AI void load_quant_vs_body(const void *src, int64_t lds, int kind, int64_t rows, int64_t n,
                               const float *sc, int fmt, int sat, uint8_t *q, int64_t ldq, int nt) {
  const size_t es = kind == XTE_NUM_IN_F32 ? 4 : 2;
  fp8k k = fp8k_make(fmt, sat);
  int64_t i, r;
  __mmask16 ok = 0xFFFF;
  nt = nt && !((uintptr_t)q & 63) && !(ldq & 63);
  for (i = 0; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(sc + i);
    ok &= _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ) &
          _mm512_cmp_ps_mask(v, _mm512_set1_ps(3.40282346638528859812e+38f), _CMP_LE_OQ);
  }
  if (ok == 0xFFFF && kind == XTE_NUM_IN_BF16 && n % 64 == 0 && n <= 256)
    load_quant_vs_bf16(&k, src, lds, rows, n, sc, fmt, sat, q, ldq, nt);
  else if (ok == 0xFFFF)
    for (r = 0; r < rows; r++)
      load_quant_vs_row(&k, ROW(src, r, lds, es), kind, n, sc, fmt, sat, q + r * ldq, nt);
  else
    for (r = 0; r < rows; r++)
      load_quant_vs_slow(&k, ROW(src, r, lds, es), kind, n, sc, fmt, sat, q + r * ldq, nt);
}

static void load_quant_vs(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                          const float *scale, int fmt, int sat, uint8_t *q, int64_t ldq, int nt) {
  switch (in_kind) {
    case XTE_NUM_IN_F32:
      load_quant_vs_body(src, lds, XTE_NUM_IN_F32, rows, n, scale, fmt, sat, q, ldq, nt);
      break;
    case XTE_NUM_IN_BF16:
      load_quant_vs_body(src, lds, XTE_NUM_IN_BF16, rows, n, scale, fmt, sat, q, ldq, nt);
      break;
    default:
      load_quant_vs_body(src, lds, XTE_NUM_IN_F16, rows, n, scale, fmt, sat, q, ldq, nt);
      break;
  }
}

/* the block-group quantizers, both copies in one read and the 128x128 runs:
 * cpu/avx512/quantize_avx512_blocks.h */
#include "cpu/avx512/quantize_avx512_blocks.h"

static void store_fence(void) {
  _mm_sfence();
}

const xte_quant_kernels XTE_AVX512_NAME(xte_quant_kernels) = {
    XTE_AVX512_ISA, load_f32,  amax,         amax_cols, quant,        quant_vs,       cast_fp8,
    cast_bf16,      cast_fp16, transpose_u8, load_amax, load_quant,   load_quant_vs,  quant_blocks,
    block_scales,   copy_u8,   store_fence,  quant_rc,  transpose_nt, load_quant_dup, quant_sq_run};
