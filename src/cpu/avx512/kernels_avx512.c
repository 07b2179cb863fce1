/* AVX-512 (F, BW, VL, DQ) CPU kernels. Built natively (-mavx512f ...) for machines that have it,
 * and a second time with XTE_AVX512_SIMDE defined against SIMDe, which emulates the intrinsics,
 * so that these kernels are tested on machines without AVX-512. Lanes reproduce the shared
 * numerics header bit for bit; tails use the header. */
#ifdef XTE_AVX512_SIMDE
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#define XTE_AVX512_TABLE xte_cpu_kernels_avx512_simde
#define XTE_AVX512_ISA XTE_CPU_ISA_AVX512_SIMDE
#else
#include <immintrin.h>
#define XTE_AVX512_TABLE xte_cpu_kernels_avx512
#define XTE_AVX512_ISA XTE_CPU_ISA_AVX512
#endif

#include "cpu/xte_cpu.h"
#include "numerics/xte_numerics.h"

#define V16 __m512i
#define S1(v) _mm512_set1_epi32(v)

static inline __m512 abs16(__m512 x) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), S1(0x7FFFFFFF)));
}

static inline V16 cvt_e4m3(__m512 x, int sat) {
  V16 u = _mm512_castps_si512(x);
  V16 sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), S1(0x80));
  V16 a = _mm512_and_si512(u, S1(0x7FFFFFFF));
  __mmask16 isnan = _mm512_cmpgt_epi32_mask(a, S1(0x7F800000));
  __mmask16 ovf = _mm512_cmpgt_epi32_mask(a, S1(0x43E80000));
  __mmask16 normal = _mm512_cmpgt_epi32_mask(a, S1(0x3C7FFFFF));
  V16 odd = _mm512_and_si512(_mm512_srli_epi32(a, 20), S1(1));
  V16 rn = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(a, S1(0x7FFFF)), odd), 20);
  V16 nv = _mm512_sub_epi32(rn, S1(120 << 3));
  __m512 y = _mm512_add_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(16384.0f));
  V16 r = _mm512_sub_epi32(_mm512_castps_si512(y), S1(0x46800000));
  r = _mm512_mask_mov_epi32(r, normal, nv);
  r = _mm512_mask_mov_epi32(r, ovf, S1(sat ? 0x7E : 0x7F));
  r = _mm512_mask_mov_epi32(r, isnan, S1(0x7F));
  return _mm512_or_si512(r, sign);
}

static inline V16 cvt_e5m2(__m512 x, int sat) {
  V16 u = _mm512_castps_si512(x);
  V16 sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), S1(0x80));
  V16 a = _mm512_and_si512(u, S1(0x7FFFFFFF));
  __mmask16 isnan = _mm512_cmpgt_epi32_mask(a, S1(0x7F800000));
  __mmask16 ovf = _mm512_cmpgt_epi32_mask(a, S1(0x476FFFFF));
  __mmask16 normal = _mm512_cmpgt_epi32_mask(a, S1(0x387FFFFF));
  V16 odd = _mm512_and_si512(_mm512_srli_epi32(a, 21), S1(1));
  V16 rn = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(a, S1(0xFFFFF)), odd), 21);
  V16 nv = _mm512_sub_epi32(rn, S1(112 << 2));
  __m512 y = _mm512_add_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(128.0f));
  V16 r = _mm512_sub_epi32(_mm512_castps_si512(y), S1(0x43000000));
  r = _mm512_mask_mov_epi32(r, normal, nv);
  r = _mm512_mask_mov_epi32(r, ovf, S1(sat ? 0x7B : 0x7C));
  r = _mm512_mask_mov_epi32(r, isnan, S1(0x7E));
  return _mm512_or_si512(r, sign);
}

static inline void store_fp8(uint8_t *q, __m512 x, int fmt, int sat) {
  V16 r = fmt == XTE_FP8_E4M3 ? cvt_e4m3(x, sat) : cvt_e5m2(x, sat);
  _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(r));
}

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

static void amax_cols(const float *x, int64_t rows, int64_t cols, int64_t ld, float *acc) {
  int64_t r, c = 0;
  for (; c + 16 <= cols; c += 16) {
    __m512 m = _mm512_loadu_ps(acc + c);
    for (r = 0; r < rows; r++) m = _mm512_max_ps(abs16(_mm512_loadu_ps(x + r * ld + c)), m);
    _mm512_storeu_ps(acc + c, m);
  }
  for (; c < cols; c++)
    for (r = 0; r < rows; r++) acc[c] = xte_amax_update(acc[c], x[r * ld + c]);
}

static void quant(const float *x, int64_t n, float scale, int fmt, int sat, uint8_t *q) {
  __m512 s = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store_fp8(q + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), s), fmt, sat);
  for (; i < n; i++) q[i] = xte_f32_to_fp8(x[i] * scale, fmt, sat);
}

static void quant_vs(const float *x, int64_t n, const float *sc, int fmt, int sat, uint8_t *q) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store_fp8(q + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(sc + i)), fmt, sat);
  for (; i < n; i++) q[i] = xte_f32_to_fp8(x[i] * sc[i], fmt, sat);
}

static void cast_fp8(const float *x, int64_t n, int fmt, int sat, uint8_t *q) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store_fp8(q + i, _mm512_loadu_ps(x + i), fmt, sat);
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

static void transpose_u8(const uint8_t *src, int64_t rows, int64_t cols, int64_t lds, uint8_t *dst,
                         int64_t ldd) {
  int64_t r, c, rb, cb;
  for (rb = 0; rb < rows; rb += 32)
    for (cb = 0; cb < cols; cb += 32)
      for (c = cb; c < cols && c < cb + 32; c++)
        for (r = rb; r < rows && r < rb + 32; r++) dst[c * ldd + r] = src[r * lds + c];
}

const xte_cpu_kernels XTE_AVX512_TABLE = {XTE_AVX512_ISA, load_f32,    amax,     amax_cols,
                                          quant,          quant_vs,    cast_fp8, cast_bf16,
                                          cast_fp16,      transpose_u8};
