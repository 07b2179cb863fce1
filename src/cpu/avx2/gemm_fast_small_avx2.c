/* XTE_GEMM_FAST for a few rows of A on AVX2 + FMA + F16C (src/cpu/gemm_kernels.h,
 * xte_gemm_fs_fn): the kernel of src/cpu/gemm_fast_small_template.h on 8 fp32 lanes. */
#include <immintrin.h>

#include "cpu/fp8_f16_image.h"
#include "cpu/gemm_kernels.h"
#include "cpu/xte_cpu.h"

#define FS_W 8
typedef __m256 fsv;
typedef __m256i fsi;
#define fs_zero() _mm256_setzero_ps()
#define fs_ld(p) _mm256_loadu_ps(p)
#define fs_lda(p) _mm256_load_ps(p)
#define fs_sta(p, v) _mm256_store_ps((p), (v))
#define fs_stu(p, v) _mm256_storeu_ps((p), (v))
#define fs_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define fs_mul(a, b) _mm256_mul_ps((a), (b))
#define fs_ildu(p) _mm256_loadu_si256((const __m256i *)(p))
#define fs_perm(v, i) _mm256_permutevar8x32_ps((v), (i))
#define fs_prefetch(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#define FS_FN xte_gemm_fast_small_avx2

/* 8 codes to fp32: their values (times 2^-8 for e4m3) */
static inline __attribute__((always_inline)) __m256 fs_dec1(const uint8_t *p, int e4) {
  __m128i x = _mm_loadl_epi64((const __m128i *)p), h;
  if (e4) {
    const __m128i s = _mm_cvtepi8_epi16(x);
    h = _mm_and_si128(_mm_slli_epi16(s, 7), _mm_set1_epi16((short)0xBF80));
    h = _mm_blendv_epi8(
        h, _mm_set1_epi16(0x7E00),
        _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7FFF)), _mm_set1_epi16(0x3F80)));
  } else {
    h = _mm_slli_epi16(_mm_cvtepu8_epi16(x), 8);
  }
  return _mm256_cvtph_ps(h);
}

/* 16 codes to fp32 (as fs_dec1 on p and p + 8): the integer steps on 16 words at once */
static inline __attribute__((always_inline)) void fs_dec2(const uint8_t *p, int e4, __m256 *lo,
                                                          __m256 *hi) {
  const __m256i h = xte_fp8_f16_image16(p, e4);
  *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/* lane i = the sum of v[i]'s 8 lanes */
static inline __attribute__((always_inline)) __m256 fs_reduce(const __m256 *v) {
  __m256 t[4], u[2];
  int i;
#pragma GCC unroll 4
  for (i = 0; i < 4; i++)
    t[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 2
  for (i = 0; i < 2; i++) {
    __m256d a = _mm256_castps_pd(t[2 * i]), b = _mm256_castps_pd(t[2 * i + 1]);
    u[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)),
                         _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20),
                       _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

#include "cpu/gemm_fast_small_template.h"
