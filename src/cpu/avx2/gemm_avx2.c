/* AVX2 + FMA GEMM micro-kernel: an 8 x 6 tile (two ymm of fp64 rows x 6 broadcast columns, 12
 * accumulators). Gives the scalar kernel's bytes: fp64 partials are exact, vcvtpd2ps rounds to
 * nearest even, and the fp32 scale product and fused multiply-add are those of the shared
 * numerics header (src/numerics/xte_gemm_numerics.h), lane by lane. */
#include <immintrin.h>

#include "numerics/xte_gemm_numerics.h"
#include "xte_gemm_ops.h"

#define MR 8
#define NR 6

#define ZERO2(j) c##j##0 = c##j##1 = _mm256_setzero_pd()
#define FMA2(j)                                       \
  do {                                                \
    __m256d bb = _mm256_broadcast_sd(b + k * NR + j); \
    c##j##0 = _mm256_fmadd_pd(a0, bb, c##j##0);       \
    c##j##1 = _mm256_fmadd_pd(a1, bb, c##j##1);       \
  } while (0)
#define STORE2(j)                              \
  do {                                         \
    _mm256_storeu_pd(P + j * MR, c##j##0);     \
    _mm256_storeu_pd(P + j * MR + 4, c##j##1); \
  } while (0)

static inline void block_sum(int n, const double *a, const double *b, double *P) {
  __m256d c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  int k;
  ZERO2(0);
  ZERO2(1);
  ZERO2(2);
  ZERO2(3);
  ZERO2(4);
  ZERO2(5);
  for (k = 0; k < n; k++) {
    __m256d a0 = _mm256_loadu_pd(a + k * MR);
    __m256d a1 = _mm256_loadu_pd(a + k * MR + 4);
    FMA2(0);
    FMA2(1);
    FMA2(2);
    FMA2(3);
    FMA2(4);
    FMA2(5);
  }
  STORE2(0);
  STORE2(1);
  STORE2(2);
  STORE2(3);
  STORE2(4);
  STORE2(5);
}

#define UPD2(j)                                                                                   \
  do {                                                                                            \
    __m128 sbj = _mm_set1_ps(sb[j]);                                                              \
    float *aj = acc + j * MR;                                                                     \
    _mm_storeu_ps(aj,                                                                             \
                  _mm_fmadd_ps(_mm256_cvtpd_ps(c##j##0), _mm_mul_ps(s0, sbj), _mm_loadu_ps(aj))); \
    _mm_storeu_ps(aj + 4, _mm_fmadd_ps(_mm256_cvtpd_ps(c##j##1), _mm_mul_ps(s1, sbj),             \
                                       _mm_loadu_ps(aj + 4)));                                    \
  } while (0)

/* One block without a split operand, the partials kept in registers. */
static inline void block_fused(int n, const double *a, const double *b, const float *sa,
                               const float *sb, float *acc) {
  __m256d c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  __m128 s0, s1;
  int k;
  ZERO2(0);
  ZERO2(1);
  ZERO2(2);
  ZERO2(3);
  ZERO2(4);
  ZERO2(5);
  for (k = 0; k < n; k++) {
    __m256d a0 = _mm256_loadu_pd(a + k * MR);
    __m256d a1 = _mm256_loadu_pd(a + k * MR + 4);
    FMA2(0);
    FMA2(1);
    FMA2(2);
    FMA2(3);
    FMA2(4);
    FMA2(5);
  }
  s0 = _mm_loadu_ps(sa);
  s1 = _mm_loadu_ps(sa + 4);
  UPD2(0);
  UPD2(1);
  UPD2(2);
  UPD2(3);
  UPD2(4);
  UPD2(5);
}

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

static void tile(int64_t nblk, const int *kl, const double *a, const double *a_lo, const double *b,
                 const double *b_lo, const float *sa, const float *sb, float *acc) {
  int64_t bl;
  int split = a_lo != NULL || b_lo != NULL;
  _Alignas(32) double P[NR * MR];
  _Alignas(32) double Q[NR * MR];
  for (bl = 0; bl < nblk; bl++) {
    const int n = kl[bl];
    __m128 s0 = _mm_loadu_ps(sa + bl * MR), s1 = _mm_loadu_ps(sa + bl * MR + 4);
    int j;
    if (!split) {
      block_fused(n, a, b, sa + bl * MR, sb + bl * NR, acc);
      a += n * MR;
      b += n * NR;
      continue;
    }
    block_sum(n, a, b, P);
    if (split) block_sum(n, a_lo ? a_lo : a, b_lo ? b_lo : b, Q);
    for (j = 0; j < NR; j++) {
      __m128 sbj = _mm_set1_ps(sb[bl * NR + j]);
      __m128 p0, p1;
      float *aj = acc + j * MR;
      if (split) {
        p0 = round2(_mm256_load_pd(P + j * MR), _mm256_load_pd(Q + j * MR));
        p1 = round2(_mm256_load_pd(P + j * MR + 4), _mm256_load_pd(Q + j * MR + 4));
      } else {
        p0 = _mm256_cvtpd_ps(_mm256_load_pd(P + j * MR));
        p1 = _mm256_cvtpd_ps(_mm256_load_pd(P + j * MR + 4));
      }
      _mm_storeu_ps(aj, _mm_fmadd_ps(p0, _mm_mul_ps(s0, sbj), _mm_loadu_ps(aj)));
      _mm_storeu_ps(aj + 4, _mm_fmadd_ps(p1, _mm_mul_ps(s1, sbj), _mm_loadu_ps(aj + 4)));
    }
    a += n * MR;
    b += n * NR;
    if (a_lo) a_lo += n * MR;
    if (b_lo) b_lo += n * NR;
  }
}

const xte_gemm_ukernel xte_gemm_ukernel_avx2 = {XTE_CPU_ISA_AVX2, MR, NR, tile};
