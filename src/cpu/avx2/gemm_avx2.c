/* AVX2 + FMA GEMM micro-kernel: an 8 x 6 tile (two ymm of fp64 rows x 6 broadcast columns, 12
 * accumulators). Gives the scalar kernel's bytes: fp64 partials are exact, vcvtpd2ps rounds to
 * nearest even, and the fp32 scale product and fused multiply-add are those of the shared
 * numerics header (src/numerics/xte_gemm_numerics.h), lane by lane. */
#include <immintrin.h>

#include "numerics/xte_gemm_numerics.h"
#include "cpu/gemm_kernels.h"

#define MR 8
#define NR 6

/* the vector layer of src/cpu/gemm_template.h: 4 fp64 lanes, their fp32 images in an xmm */
#define XD_W 4
typedef __m256d xd;
typedef __m128 xf;
#define xd_zero() _mm256_setzero_pd()
#define xd_ld(p) _mm256_loadu_pd(p)
#define xd_lda(p) _mm256_load_pd(p)
#define xd_st(p, v) _mm256_storeu_pd((p), (v))
#define xd_1(x) _mm256_set1_pd(x)
#define xd_fma(a, b, c) _mm256_fmadd_pd((a), (b), (c))
#define xd_cvt(a) _mm256_cvtpd_ps(a)
#define xf_ld(p) _mm_loadu_ps(p)
#define xf_st(p, v) _mm_storeu_ps((p), (v))
#define xf_1(x) _mm_set1_ps(x)
#define xf_mul(a, b) _mm_mul_ps((a), (b))
#define xf_fma(a, b, c) _mm_fmadd_ps((a), (b), (c))
#define XG_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)

/* RNE_fp32(h + l) exactly (xte_gemm_round2_f32, lane by lane). */
static inline __m128 round2(__m256d h, __m256d l) {
  const __m256i one = _mm256_set1_epi64x(1);
  __m256d s = _mm256_add_pd(h, l);
  __m256d t = _mm256_sub_pd(s, h);
  __m256d e = _mm256_add_pd(_mm256_sub_pd(h, _mm256_sub_pd(s, t)), _mm256_sub_pd(l, t));
  __m256i nz = _mm256_castpd_si256(_mm256_cmp_pd(e, _mm256_setzero_pd(), _CMP_NEQ_OQ));
  __m256i u = _mm256_castpd_si256(s);
  __m256i x = _mm256_xor_si256(u, _mm256_castpd_si256(e));
  __m256i diff = _mm256_cmpgt_epi64(_mm256_setzero_si256(), x);
  u = _mm256_add_epi64(u, _mm256_and_si256(nz, diff)); /* adds -1 where both */
  u = _mm256_or_si256(u, _mm256_and_si256(nz, one));
  return _mm256_cvtpd_ps(_mm256_castsi256_pd(u));
}

/* 16 fp16 images to fp64 values at d[0..15] (vcvtph2ps, vcvtps2pd: exact) */
static inline void sk_store16(double *d, __m256i h) {
  __m256 f0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  __m256 f1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  _mm256_storeu_pd(d, _mm256_cvtps_pd(_mm256_castps256_ps128(f0)));
  _mm256_storeu_pd(d + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(f0, 1)));
  _mm256_storeu_pd(d + 8, _mm256_cvtps_pd(_mm256_castps256_ps128(f1)));
  _mm256_storeu_pd(d + 12, _mm256_cvtps_pd(_mm256_extractf128_ps(f1, 1)));
}

/* the 4 lane sums of v[0..3], in order (exact here) */
static inline __m256d sk_hsum(const __m256d *v) {
  __m256d a01 = _mm256_hadd_pd(v[0], v[1]), a23 = _mm256_hadd_pd(v[2], v[3]);
  return _mm256_add_pd(_mm256_permute2f128_pd(a01, a23, 0x20),
                       _mm256_permute2f128_pd(a01, a23, 0x31));
}

#include "cpu/gemm_template.h"

void xte_gemm_fast_small_avx2(int m, int mp, int64_t nblk, int kb, int kl, const float *a,
                              int64_t lda, const float *sa, const uint8_t *const *cols, int fmt,
                              const float *sb, float *w); /* gemm_fast_small_avx2.c */

const xte_gemm_ukernel xte_gemm_ukernel_avx2 = {
    .isa = XTE_CPU_ISA_AVX2,
    .mr = MR,
    .nr = NR,
    .tile = tile,
    .sk_decode = sk_decode,
    .sk_block = sk_block,
    .fast_small = xte_gemm_fast_small_avx2,
};
