/* AVX2 + FMA + F16C CPU kernels. Each lane reproduces the shared numerics header bit for bit:
 * the fp8 / bf16 / fp16 conversions are the same integer sequences, tails use the header. */
#include <immintrin.h>

#include "cpu/xte_cpu.h"
#include "numerics/xte_numerics.h"

#define V8 __m256i

static inline __m256 abs8(__m256 x) {
  return _mm256_castsi256_ps(
      _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7FFFFFFF)));
}

/* 8 x fp32 -> 8 fp8 codes in the low byte of each int32 lane (same rule as xte_f32_to_e4m3). */
static inline V8 cvt_e4m3(__m256 x, int sat) {
  V8 u = _mm256_castps_si256(x);
  V8 sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
  V8 a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  V8 isnan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
  V8 ovf = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x43E80000));
  V8 normal = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x3C7FFFFF));
  V8 odd = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
  V8 rn =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0x7FFFF)), odd), 20);
  V8 nv = _mm256_sub_epi32(rn, _mm256_set1_epi32(120 << 3));
  __m256 y = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(16384.0f));
  V8 sv = _mm256_sub_epi32(_mm256_castps_si256(y), _mm256_set1_epi32(0x46800000));
  V8 r = _mm256_blendv_epi8(sv, nv, normal);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(sat ? 0x7E : 0x7F), ovf);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7F), isnan);
  return _mm256_or_si256(r, sign);
}

static inline V8 cvt_e5m2(__m256 x, int sat) {
  V8 u = _mm256_castps_si256(x);
  V8 sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
  V8 a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  V8 isnan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
  V8 ovf = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x476FFFFF));
  V8 normal = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x387FFFFF));
  V8 odd = _mm256_and_si256(_mm256_srli_epi32(a, 21), _mm256_set1_epi32(1));
  V8 rn =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0xFFFFF)), odd), 21);
  V8 nv = _mm256_sub_epi32(rn, _mm256_set1_epi32(112 << 2));
  __m256 y = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(128.0f));
  V8 sv = _mm256_sub_epi32(_mm256_castps_si256(y), _mm256_set1_epi32(0x43000000));
  V8 r = _mm256_blendv_epi8(sv, nv, normal);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(sat ? 0x7B : 0x7C), ovf);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7E), isnan);
  return _mm256_or_si256(r, sign);
}

static inline V8 cvt_fp8(__m256 x, int fmt, int sat) {
  return fmt == XTE_FP8_E4M3 ? cvt_e4m3(x, sat) : cvt_e5m2(x, sat);
}

/* four vectors of int32 codes (0..255) -> 32 bytes in order */
static inline void store32(uint8_t *q, V8 r0, V8 r1, V8 r2, V8 r3) {
  V8 p01 = _mm256_packus_epi32(r0, r1);
  V8 p23 = _mm256_packus_epi32(r2, r3);
  V8 b = _mm256_packus_epi16(p01, p23);
  b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256((__m256i *)q, b);
}

static void load_f32(const void *src, int in_kind, int64_t n, float *dst) {
  int64_t i = 0;
  if (in_kind == XTE_NUM_IN_F32) {
    const float *s = (const float *)src;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(s + i));
    for (; i < n; i++) dst[i] = s[i];
  } else if (in_kind == XTE_NUM_IN_BF16) {
    const uint16_t *s = (const uint16_t *)src;
    for (; i + 8 <= n; i += 8) {
      V8 v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++) dst[i] = xte_bf16_to_f32(s[i]);
  } else {
    const uint16_t *s = (const uint16_t *)src;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) dst[i] = xte_fp16_to_f32(s[i]);
  }
}

static inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

static float amax(const float *x, int64_t n) {
  /* max_ps(a, acc) returns acc when a is NaN: NaN never wins, as fmaxf */
  __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
  int64_t i = 0;
  float m;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(abs8(_mm256_loadu_ps(x + i)), m0);
    m1 = _mm256_max_ps(abs8(_mm256_loadu_ps(x + i + 8)), m1);
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(abs8(_mm256_loadu_ps(x + i)), m0);
  m = hmax8(_mm256_max_ps(m0, m1));
  for (; i < n; i++) m = xte_amax_update(m, x[i]);
  return m;
}

static void amax_cols(const float *x, int64_t rows, int64_t cols, int64_t ld, float *acc) {
  int64_t r, c = 0;
  for (; c + 8 <= cols; c += 8) {
    __m256 m = _mm256_loadu_ps(acc + c);
    for (r = 0; r < rows; r++) m = _mm256_max_ps(abs8(_mm256_loadu_ps(x + r * ld + c)), m);
    _mm256_storeu_ps(acc + c, m);
  }
  for (; c < cols; c++)
    for (r = 0; r < rows; r++) acc[c] = xte_amax_update(acc[c], x[r * ld + c]);
}

static void quant(const float *x, int64_t n, float scale, int fmt, int sat, uint8_t *q) {
  __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    store32(q + i, cvt_fp8(_mm256_mul_ps(_mm256_loadu_ps(x + i), s), fmt, sat),
            cvt_fp8(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), s), fmt, sat),
            cvt_fp8(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), s), fmt, sat),
            cvt_fp8(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), s), fmt, sat));
  for (; i < n; i++) q[i] = xte_f32_to_fp8(x[i] * scale, fmt, sat);
}

static void quant_vs(const float *x, int64_t n, const float *sc, int fmt, int sat, uint8_t *q) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    store32(
        q + i, cvt_fp8(_mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(sc + i)), fmt, sat),
        cvt_fp8(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(sc + i + 8)), fmt, sat),
        cvt_fp8(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(sc + i + 16)), fmt, sat),
        cvt_fp8(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(sc + i + 24)), fmt,
                sat));
  for (; i < n; i++) q[i] = xte_f32_to_fp8(x[i] * sc[i], fmt, sat);
}

static void cast_fp8(const float *x, int64_t n, int fmt, int sat, uint8_t *q) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    store32(q + i, cvt_fp8(_mm256_loadu_ps(x + i), fmt, sat),
            cvt_fp8(_mm256_loadu_ps(x + i + 8), fmt, sat),
            cvt_fp8(_mm256_loadu_ps(x + i + 16), fmt, sat),
            cvt_fp8(_mm256_loadu_ps(x + i + 24), fmt, sat));
  for (; i < n; i++) q[i] = xte_f32_to_fp8(x[i], fmt, sat);
}

/* 8 x fp32 -> bf16 in the low half of each lane (xte_f32_to_bf16) */
static inline V8 cvt_bf16(__m256 x) {
  V8 u = _mm256_castps_si256(x);
  V8 a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  V8 isnan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
  V8 odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  V8 r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
  V8 nanv = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(r, nanv, isnan);
}

static inline V8 cvt_fp16(__m256 x) {
  V8 u = _mm256_castps_si256(x);
  V8 sign = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000));
  V8 a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  V8 isnan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
  V8 ovf = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x477FEFFF));
  V8 normal = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x387FFFFF));
  V8 odd = _mm256_and_si256(_mm256_srli_epi32(a, 13), _mm256_set1_epi32(1));
  V8 rn =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0xFFF)), odd), 13);
  V8 nv = _mm256_sub_epi32(rn, _mm256_set1_epi32(112 << 10));
  __m256 y = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(0.5f));
  V8 sv = _mm256_sub_epi32(_mm256_castps_si256(y), _mm256_set1_epi32(0x3F000000));
  V8 nanv = _mm256_or_si256(_mm256_set1_epi32(0x7E00),
                            _mm256_and_si256(_mm256_srli_epi32(a, 13), _mm256_set1_epi32(0x3FF)));
  V8 r = _mm256_blendv_epi8(sv, nv, normal);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7C00), ovf);
  r = _mm256_blendv_epi8(r, nanv, isnan);
  return _mm256_or_si256(r, sign);
}

static inline void store16x16(uint16_t *y, V8 lo, V8 hi) {
  V8 p = _mm256_packus_epi32(lo, hi);
  p = _mm256_permute4x64_epi64(p, 0xD8);
  _mm256_storeu_si256((__m256i *)y, p);
}

static void cast_bf16(const float *x, int64_t n, uint16_t *y) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store16x16(y + i, cvt_bf16(_mm256_loadu_ps(x + i)), cvt_bf16(_mm256_loadu_ps(x + i + 8)));
  for (; i < n; i++) y[i] = xte_f32_to_bf16(x[i]);
}

static void cast_fp16(const float *x, int64_t n, uint16_t *y) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store16x16(y + i, cvt_fp16(_mm256_loadu_ps(x + i)), cvt_fp16(_mm256_loadu_ps(x + i + 8)));
  for (; i < n; i++) y[i] = xte_f32_to_fp16(x[i]);
}

/* 16x16 byte transpose blocks with SSE unpacks; edges scalar. */
static inline void tr16(const uint8_t *s, int64_t lds, uint8_t *d, int64_t ldd) {
  __m128i r[16], t[16];
  int i;
  for (i = 0; i < 16; i++) r[i] = _mm_loadu_si128((const __m128i *)(s + i * lds));
  for (i = 0; i < 8; i++) {
    t[i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
    t[i + 8] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
  }
  for (i = 0; i < 4; i++) {
    r[i] = _mm_unpacklo_epi16(t[2 * i], t[2 * i + 1]);
    r[i + 4] = _mm_unpackhi_epi16(t[2 * i], t[2 * i + 1]);
    r[i + 8] = _mm_unpacklo_epi16(t[8 + 2 * i], t[8 + 2 * i + 1]);
    r[i + 12] = _mm_unpackhi_epi16(t[8 + 2 * i], t[8 + 2 * i + 1]);
  }
  for (i = 0; i < 4; i++) {
    int b = 4 * i;
    t[b + 0] = _mm_unpacklo_epi32(r[b + 0], r[b + 1]);
    t[b + 1] = _mm_unpackhi_epi32(r[b + 0], r[b + 1]);
    t[b + 2] = _mm_unpacklo_epi32(r[b + 2], r[b + 3]);
    t[b + 3] = _mm_unpackhi_epi32(r[b + 2], r[b + 3]);
  }
  /* t[4i + j] holds, for source rows of quarter i... assemble 64-bit halves */
  for (i = 0; i < 4; i++) {
    int b = 4 * i;
    r[b + 0] = _mm_unpacklo_epi64(t[b + 0], t[b + 2]);
    r[b + 1] = _mm_unpackhi_epi64(t[b + 0], t[b + 2]);
    r[b + 2] = _mm_unpacklo_epi64(t[b + 1], t[b + 3]);
    r[b + 3] = _mm_unpackhi_epi64(t[b + 1], t[b + 3]);
  }
  (void)d;
  (void)ldd;
  for (i = 0; i < 16; i++) _mm_storeu_si128((__m128i *)(d + i * ldd), r[i]);
}

static void transpose_u8(const uint8_t *src, int64_t rows, int64_t cols, int64_t lds, uint8_t *dst,
                         int64_t ldd) {
  int64_t r, c, r16 = rows & ~(int64_t)15, c16 = cols & ~(int64_t)15;
  for (r = 0; r < r16; r += 16)
    for (c = 0; c < c16; c += 16) tr16(src + r * lds + c, lds, dst + c * ldd + r, ldd);
  for (r = 0; r < rows; r++)
    for (c = (r < r16 ? c16 : 0); c < cols; c++) dst[c * ldd + r] = src[r * lds + c];
}

const xte_cpu_kernels xte_cpu_kernels_avx2 = {
    XTE_CPU_ISA_AVX2, load_f32, amax,      amax_cols, quant,
    quant_vs,         cast_fp8, cast_bf16, cast_fp16, transpose_u8};
