/* XTE_GEMM_FAST for a few rows of A on AVX-512 (src/cpu/gemm_kernels.h, xte_gemm_fs_fn; both
 * builds of this folder): the kernel of src/cpu/gemm_fast_small_template.h on 16 fp32 lanes. */
#include "cpu/avx512/isa_avx512.h"

#include "cpu/fp8_f16_image.h"
#include "cpu/gemm_kernels.h"
#include "cpu/xte_cpu.h"

#define FS_W 16
typedef __m512 fsv;
typedef __m512i fsi;
#define fs_zero() _mm512_setzero_ps()
#define fs_ld(p) _mm512_loadu_ps(p)
#define fs_lda(p) _mm512_load_ps(p)
#define fs_sta(p, v) _mm512_store_ps((p), (v))
#define fs_stu(p, v) _mm512_storeu_ps((p), (v))
#define fs_fma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define fs_mul(a, b) _mm512_mul_ps((a), (b))
#define fs_ildu(p) _mm512_loadu_si512(p)
#define fs_perm(v, i) _mm512_permutexvar_ps((i), (v))
#define fs_prefetch(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#define FS_FN XTE_AVX512_NAME(xte_gemm_fast_small)

/* 16 codes to fp32: their values (times 2^-8 for e4m3) */
static inline __attribute__((always_inline)) __m512 fs_dec1(const uint8_t *p, int e4) {
  return _mm512_cvtph_ps(xte_fp8_f16_image16(p, e4));
}

/* 32 codes to fp32 (as fs_dec1 on p and p + 16): the integer steps on 32 words at once */
static inline __attribute__((always_inline)) void fs_dec2(const uint8_t *p, int e4, __m512 *lo,
                                                          __m512 *hi) {
  const __m256i x = _mm256_loadu_si256((const __m256i *)p);
  __m512i h;
  if (e4) {
    h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(x), 7),
                         _mm512_set1_epi16((short)0xBF80));
    h = _mm512_mask_mov_epi16(
        h,
        _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, _mm512_set1_epi16(0x7FFF)),
                                _mm512_set1_epi16(0x3F80)),
        _mm512_set1_epi16(0x7E00));
  } else {
    h = _mm512_slli_epi16(_mm512_cvtepi8_epi16(x), 8); /* the sign extension shifts out */
  }
  *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

/* vshuff32x4 as vshuff64x2 (the same 128-bit lanes; SIMDe 0.7.4 has the latter's alias) */
#define lanes4(a, b, imm) \
  _mm512_castpd_ps(_mm512_shuffle_f64x2(_mm512_castps_pd(a), _mm512_castps_pd(b), (imm)))

/* lane i = the sum of v[i]'s 16 lanes */
static inline __attribute__((always_inline)) __m512 fs_reduce(const __m512 *v) {
  __m512 t[8], u[4], y0, y1;
  int i;
#pragma GCC unroll 8
  for (i = 0; i < 8; i++)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
  for (i = 0; i < 4; i++) {
    __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  y0 = _mm512_add_ps(lanes4(u[0], u[1], 0x44), lanes4(u[0], u[1], 0xEE));
  y1 = _mm512_add_ps(lanes4(u[2], u[3], 0x44), lanes4(u[2], u[3], 0xEE));
  return _mm512_add_ps(lanes4(y0, y1, 0x88), lanes4(y0, y1, 0xDD));
}

#include "cpu/gemm_fast_small_template.h"
