/* AVX2 + FMA GEMM micro-kernel: an 8 x 6 tile (two ymm of fp64 rows x 6 broadcast columns, 12
 * accumulators). Gives the scalar kernel's bytes: fp64 partials are exact, vcvtpd2ps rounds to
 * nearest even, and the fp32 scale product and fused multiply-add are those of the shared
 * numerics header (src/numerics/xte_gemm_numerics.h), lane by lane. */
#include <immintrin.h>

#include "numerics/xte_gemm_numerics.h"
#include "cpu/gemm_kernels.h"

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

/* ---------------------------------------------------------------- small-M path
 * B codes go straight from memory to fp64 in registers: sign-extended to 16 bits, moved into
 * fp16 bit positions (e5m2 is the top byte of fp16; e4m3's 4-bit exponent and 3-bit mantissa
 * shifted by 7 give its value times 2^-8, subnormals included, and its NaN code becomes the fp16
 * NaN), then vcvtph2ps and vcvtps2pd, all exact. */
#define SK_LDB XTE_GEMM_SK_LDB

static inline __m256i sk_fp16(__m128i c, int e4m3) {
  __m256i w = _mm256_cvtepi8_epi16(c);
  if (e4m3) {
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xBF80));
    __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)),
                                     _mm256_set1_epi16(0x3F80));
    return _mm256_blendv_epi8(h, _mm256_set1_epi16(0x7E00), nan);
  }
  return _mm256_slli_epi16(w, 8);
}

static inline void sk_store16(double *d, __m256i h) {
  __m256 f0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  __m256 f1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  _mm256_storeu_pd(d, _mm256_cvtps_pd(_mm256_castps256_ps128(f0)));
  _mm256_storeu_pd(d + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(f0, 1)));
  _mm256_storeu_pd(d + 8, _mm256_cvtps_pd(_mm256_castps256_ps128(f1)));
  _mm256_storeu_pd(d + 12, _mm256_cvtps_pd(_mm256_extractf128_ps(f1, 1)));
}

static void sk_decode(const uint8_t *const *rows, int nrows, int kl, int fmt, int split,
                      const double *t_hi, const double *t_lo, double *bd, double *bd_lo) {
  const int e4 = fmt == XTE_FP8_E4M3, kl8 = (kl + 7) & ~7, kv = kl & ~15;
  int j, k;
  for (j = 0; j < 8; j++) {
    double *d = bd + j * SK_LDB, *dl = split ? bd_lo + j * SK_LDB : NULL;
    const uint8_t *r = j < nrows ? rows[j] : NULL;
    k = 0;
    if (r) {
      _mm_prefetch((const char *)(r + 1024), _MM_HINT_T0);
      _mm_prefetch((const char *)(r + 1024 + 64), _MM_HINT_T0);
      for (; k < kv; k += 16) {
        __m256i h = sk_fp16(_mm_loadu_si128((const __m128i *)(const void *)(r + k)), e4);
        if (split) {
          __m256i hm = _mm256_cmpgt_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)),
                                          _mm256_set1_epi16(0x3BFF));
          sk_store16(d + k, _mm256_and_si256(h, hm));
          sk_store16(dl + k, _mm256_andnot_si256(hm, h));
        } else {
          sk_store16(d + k, h);
        }
      }
      for (; k < kl; k++) {
        d[k] = t_hi[r[k]];
        if (dl) dl[k] = t_lo[r[k]];
      }
    }
    for (; k < kl8; k++) {
      d[k] = 0.0;
      if (dl) dl[k] = 0.0;
    }
  }
}

/* the 4 lane sums of v[0..3], in order (exact here) */
static inline __m256d sk_hsum4(const __m256d *v) {
  __m256d a01 = _mm256_hadd_pd(v[0], v[1]), a23 = _mm256_hadd_pd(v[2], v[3]);
  return _mm256_add_pd(_mm256_permute2f128_pd(a01, a23, 0x20),
                       _mm256_permute2f128_pd(a01, a23, 0x31));
}

/* out[r] lane j = sum_k ar[r][k] * bd[j][k], R rows (1..3) x 4 columns */
static inline __attribute__((always_inline)) void sk_dot(const int R, int kl8,
                                                         const double *const *ar, const double *bd,
                                                         __m256d *out) {
  __m256d c[3][4];
  int r, j, k;
#pragma GCC unroll 3
  for (r = 0; r < R; r++)
#pragma GCC unroll 4
    for (j = 0; j < 4; j++) c[r][j] = _mm256_setzero_pd();
  for (k = 0; k < kl8; k += 4) {
    __m256d av[3];
#pragma GCC unroll 3
    for (r = 0; r < R; r++) av[r] = _mm256_loadu_pd(ar[r] + k);
#pragma GCC unroll 4
    for (j = 0; j < 4; j++) {
      __m256d bv = _mm256_loadu_pd(bd + j * SK_LDB + k);
#pragma GCC unroll 3
      for (r = 0; r < R; r++) c[r][j] = _mm256_fmadd_pd(av[r], bv, c[r][j]);
    }
  }
#pragma GCC unroll 3
  for (r = 0; r < R; r++) out[r] = sk_hsum4(c[r]);
}

static inline void sk_dotn(int R, int kl8, const double *const *ar, const double *bd,
                           __m256d *out) {
  if (R == 3)
    sk_dot(3, kl8, ar, bd, out);
  else if (R == 2)
    sk_dot(2, kl8, ar, bd, out);
  else
    sk_dot(1, kl8, ar, bd, out);
}

static inline void sk_fold(__m128 p, float sa, __m128 sb4, float *w) {
  _mm_storeu_ps(w, _mm_fmadd_ps(p, _mm_mul_ps(_mm_set1_ps(sa), sb4), _mm_loadu_ps(w)));
}

static void sk_block(int rows, int kl8, const double *a, const double *a_lo, int64_t lda,
                     const double *bd, const double *bd_lo, const float *sa, const float *sb,
                     float *w, int64_t ldw) {
  __m256d P[3], Q[3];
  int r, i, h;
  for (h = 0; h < 2; h++) {
    const __m128 sb4 = _mm_loadu_ps(sb + 4 * h);
    const double *bh = bd + 4 * h * SK_LDB, *bh_lo = bd_lo ? bd_lo + 4 * h * SK_LDB : NULL;
    if (a_lo) {
      for (r = 0; r < rows; r++) {
        const double *ar[2] = {a + r * lda, a_lo + r * lda};
        sk_dot(2, kl8, ar, bh, P);
        sk_fold(round2(P[0], P[1]), sa[r], sb4, w + r * ldw + 4 * h);
      }
      continue;
    }
    for (r = 0; r < rows; r += 3) {
      const int R = rows - r < 3 ? rows - r : 3;
      const double *ar[3] = {a + r * lda, R > 1 ? a + (r + 1) * lda : a,
                             R > 2 ? a + (r + 2) * lda : a};
      sk_dotn(R, kl8, ar, bh, P);
      if (bh_lo) sk_dotn(R, kl8, ar, bh_lo, Q);
      for (i = 0; i < R; i++)
        sk_fold(bh_lo ? round2(P[i], Q[i]) : _mm256_cvtpd_ps(P[i]), sa[r + i], sb4,
                w + (r + i) * ldw + 4 * h);
    }
  }
}

const xte_gemm_ukernel xte_gemm_ukernel_avx2 = {
    .isa = XTE_CPU_ISA_AVX2,
    .mr = MR,
    .nr = NR,
    .tile = tile,
    .sk_decode = sk_decode,
    .sk_block = sk_block,
};
