/* AVX-512 GEMM micro-kernel: a 24 x 8 tile (three zmm of fp64 rows x 8 broadcast columns, 24
 * accumulators). Built natively and a second time against SIMDe (XTE_AVX512_SIMDE), like
 * quantize_avx512.c. Gives the scalar kernel's bytes: fp64 partials are exact, vcvtpd2ps rounds
 * to nearest even, and the fp32 scale product and fused multiply-add are those of the shared
 * numerics header (src/numerics/xte_gemm_numerics.h), lane by lane. */
#include "cpu/avx512/isa_avx512.h"

#include "numerics/xte_gemm_numerics.h"
#include "cpu/gemm_kernels.h"

#define MR 24
#define NR 8

/* the vector layer of src/cpu/gemm_template.h: 8 fp64 lanes, their fp32 images in a ymm */
#define XD_W 8
typedef __m512d xd;
typedef __m256 xf;
#define xd_zero() _mm512_setzero_pd()
#define xd_ld(p) _mm512_loadu_pd(p)
#define xd_lda(p) _mm512_load_pd(p)
#define xd_st(p, v) _mm512_storeu_pd((p), (v))
#define xd_1(x) _mm512_set1_pd(x)
#define xd_fma(a, b, c) _mm512_fmadd_pd((a), (b), (c))
#define xd_cvt(a) _mm512_cvtpd_ps(a)
#define xf_ld(p) _mm256_loadu_ps(p)
#define xf_st(p, v) _mm256_storeu_ps((p), (v))
#define xf_1(x) _mm256_set1_ps(x)
#define xf_mul(a, b) _mm256_mul_ps((a), (b))
#define xf_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#ifdef XTE_AVX512_SIMDE
#define XG_PREFETCH(p) ((void)(p))
#else
#define XG_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#endif

/* RNE_fp32(h + l) exactly (xte_gemm_round2_f32, lane by lane). */
static inline __m256 round2(__m512d h, __m512d l) {
  const __m512i one = _mm512_set1_epi64(1);
  __m512d s = _mm512_add_pd(h, l);
  __m512d t = _mm512_sub_pd(s, h);
  __m512d e = _mm512_add_pd(_mm512_sub_pd(h, _mm512_sub_pd(s, t)), _mm512_sub_pd(l, t));
  __mmask8 nz = _mm512_cmp_pd_mask(e, _mm512_setzero_pd(), _CMP_NEQ_OQ);
  __m512i u = _mm512_castpd_si512(s);
  __m512i x = _mm512_xor_si512(u, _mm512_castpd_si512(e));
  __mmask8 diff = _mm512_cmplt_epi64_mask(x, _mm512_setzero_si512());
  u = _mm512_mask_sub_epi64(u, (__mmask8)(nz & diff), u, one);
  u = _mm512_mask_or_epi64(u, nz, u, one);
  return _mm512_cvtpd_ps(_mm512_castsi512_pd(u));
}

/* 16 fp32 values to fp64 at d[0..15] */
static inline void f32x16_store_pd(double *d, __m512 f) {
  _mm512_storeu_pd(d, _mm512_cvtps_pd(_mm512_castps512_ps256(f)));
  _mm512_storeu_pd(
      d + 8, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1))));
}

static inline void sk_store16(double *d, __m256i h) {
  f32x16_store_pd(d, _mm512_cvtph_ps(h));
}

/* out = the 8 lane sums of v[0..7], in order (exact here: every partial is exact) */
static inline __m512d sk_hsum(const __m512d *v) {
  __m512d a01 = _mm512_add_pd(_mm512_unpacklo_pd(v[0], v[1]), _mm512_unpackhi_pd(v[0], v[1]));
  __m512d a23 = _mm512_add_pd(_mm512_unpacklo_pd(v[2], v[3]), _mm512_unpackhi_pd(v[2], v[3]));
  __m512d a45 = _mm512_add_pd(_mm512_unpacklo_pd(v[4], v[5]), _mm512_unpackhi_pd(v[4], v[5]));
  __m512d a67 = _mm512_add_pd(_mm512_unpacklo_pd(v[6], v[7]), _mm512_unpackhi_pd(v[6], v[7]));
  __m512d b03 =
      _mm512_add_pd(_mm512_shuffle_f64x2(a01, a23, 0x88), _mm512_shuffle_f64x2(a01, a23, 0xDD));
  __m512d b47 =
      _mm512_add_pd(_mm512_shuffle_f64x2(a45, a67, 0x88), _mm512_shuffle_f64x2(a45, a67, 0xDD));
  return _mm512_add_pd(_mm512_shuffle_f64x2(b03, b47, 0x88), _mm512_shuffle_f64x2(b03, b47, 0xDD));
}

#include "cpu/gemm_template.h"

/* ---------------------------------------------------------------- partial tiles
 * The tile kernel for a tile whose valid rows are the first 8 R (R = 1, 2): the same packed
 * operands (A micro-panel [k][MR]) and accumulator layout ([NR][MR]), only the first 8 R rows are
 * computed (the others are zero padding the driver never reads). No split operand. */
static inline __attribute__((always_inline)) void tile_rows(const int R, int64_t nblk,
                                                            const int *kl, const double *a,
                                                            const double *b, const float *sa,
                                                            const float *sb, float *acc) {
  int64_t bl;
  for (bl = 0; bl < nblk; bl++) {
    const int n = kl[bl];
    __m512d c[8][2];
    int k, i, j;
#pragma GCC unroll 8
    for (j = 0; j < 8; j++)
#pragma GCC unroll 2
      for (i = 0; i < R; i++) c[j][i] = _mm512_setzero_pd();
    for (k = 0; k < n; k++) {
      __m512d av[2];
#pragma GCC unroll 2
      for (i = 0; i < R; i++) av[i] = _mm512_loadu_pd(a + k * MR + 8 * i);
#pragma GCC unroll 8
      for (j = 0; j < 8; j++) {
        __m512d bb = _mm512_set1_pd(b[k * NR + j]);
#pragma GCC unroll 2
        for (i = 0; i < R; i++) c[j][i] = _mm512_fmadd_pd(av[i], bb, c[j][i]);
      }
    }
#pragma GCC unroll 8
    for (j = 0; j < 8; j++) {
      __m256 sbj = _mm256_set1_ps(sb[bl * NR + j]);
#pragma GCC unroll 2
      for (i = 0; i < R; i++) {
        float *aj = acc + j * MR + 8 * i;
        __m256 si = _mm256_loadu_ps(sa + bl * MR + 8 * i);
        _mm256_storeu_ps(aj, _mm256_fmadd_ps(_mm512_cvtpd_ps(c[j][i]), _mm256_mul_ps(si, sbj),
                                             _mm256_loadu_ps(aj)));
      }
    }
    a += n * MR;
    b += n * NR;
  }
}

static void tile_r8(int64_t nblk, const int *kl, const double *a, const double *a_lo,
                    const double *b, const double *b_lo, const float *sa, const float *sb,
                    float *acc) {
  (void)a_lo;
  (void)b_lo;
  tile_rows(1, nblk, kl, a, b, sa, sb, acc);
}

static void tile_r16(int64_t nblk, const int *kl, const double *a, const double *a_lo,
                     const double *b, const double *b_lo, const float *sa, const float *sb,
                     float *acc) {
  (void)a_lo;
  (void)b_lo;
  tile_rows(2, nblk, kl, a, b, sa, sb, acc);
}

/* ---------------------------------------------------------------- B packing (e4m3, 8 rows)
 * d[k * 8 + j] = the value of code rows[j][k] for k < kc (codes contiguous along K), 16 k at a
 * time: two rows' 32 codes to their fp16 images (sk_fp16 on 32 lanes: value * 2^-8, subnormals
 * and NaN included), the 8 x 16 fp16 block transposed to k-major order by two levels of
 * VPERMT2W (AVX512BW), then vcvtph2ps, * 2^8 and vcvtps2pd, all exact, stored in order. Gives
 * the driver's table values (NaN codes give a NaN); the tail goes through the table tab. The
 * transpose on 16-bit images takes 8 permutes per 128 values where one on the fp64 values takes
 * 48 shuffles. */

/* sk_fp16 on 32 codes (two rows' 16) */
static inline __m512i sk_fp16_32(__m256i c) {
  const __m512i h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(c), 7),
                                     _mm512_set1_epi16((short)0xBF80));
  const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, _mm512_set1_epi16(0x7FFF)),
                                                _mm512_set1_epi16(0x3F80));
  return _mm512_mask_mov_epi16(h, nan, _mm512_set1_epi16(0x7E00));
}

/* the transpose's permutes: level 1 takes rows 0-3 (or 4-7) of two row pairs to [k][4 rows]
 * for k 0..7 (p1[0]) or 8..15 (p1[1]); level 2 joins two of those to [k][8 rows] for the first
 * (p2[0]) or last (p2[1]) 4 of their 8 k */
static const int16_t pk_p1[2][32] = {
    {0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51,
     4, 20, 36, 52, 5, 21, 37, 53, 6, 22, 38, 54, 7, 23, 39, 55},
    {8,  24, 40, 56, 9,  25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59,
     12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63}};
static const int16_t pk_p2[2][32] = {
    {0, 1, 2,  3,  32, 33, 34, 35, 4,  5,  6,  7,  36, 37, 38, 39,
     8, 9, 10, 11, 40, 41, 42, 43, 12, 13, 14, 15, 44, 45, 46, 47},
    {16, 17, 18, 19, 48, 49, 50, 51, 20, 21, 22, 23, 52, 53, 54, 55,
     24, 25, 26, 27, 56, 57, 58, 59, 28, 29, 30, 31, 60, 61, 62, 63}};

/* 16 fp16 images to fp64 values at d[0..15] (* 2^8: the images are value * 2^-8) */
static inline void pk_store16(double *d, __m256i h) {
  f32x16_store_pd(d, _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f)));
}

static void pack_b8_e4m3(const uint8_t *const *rows, int64_t kc, const double *tab, double *d) {
  const __m512i p1a = _mm512_loadu_si512((const void *)pk_p1[0]),
                p1b = _mm512_loadu_si512((const void *)pk_p1[1]),
                p2a = _mm512_loadu_si512((const void *)pk_p2[0]),
                p2b = _mm512_loadu_si512((const void *)pk_p2[1]);
  int64_t k = 0;
  int j;
  for (; k + 16 <= kc; k += 16, d += 128) {
    __m512i h[4], l[4], o[4];
    int q;
    for (j = 0; j < 4; j++) /* rows 2 j, 2 j + 1: 16 images each */
      h[j] = sk_fp16_32(_mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(rows[2 * j] + k))),
          _mm_loadu_si128((const __m128i *)(const void *)(rows[2 * j + 1] + k)), 1));
    l[0] = _mm512_permutex2var_epi16(h[0], p1a, h[1]); /* rows 0-3, k 0-7 */
    l[1] = _mm512_permutex2var_epi16(h[0], p1b, h[1]); /* rows 0-3, k 8-15 */
    l[2] = _mm512_permutex2var_epi16(h[2], p1a, h[3]); /* rows 4-7, k 0-7 */
    l[3] = _mm512_permutex2var_epi16(h[2], p1b, h[3]); /* rows 4-7, k 8-15 */
    o[0] = _mm512_permutex2var_epi16(l[0], p2a, l[2]); /* k 0-3, rows 0-7 */
    o[1] = _mm512_permutex2var_epi16(l[0], p2b, l[2]); /* k 4-7 */
    o[2] = _mm512_permutex2var_epi16(l[1], p2a, l[3]); /* k 8-11 */
    o[3] = _mm512_permutex2var_epi16(l[1], p2b, l[3]); /* k 12-15 */
    for (q = 0; q < 4; q++) {
      pk_store16(d + 32 * q, _mm512_castsi512_si256(o[q]));
      pk_store16(d + 32 * q + 16, _mm512_extracti64x4_epi64(o[q], 1));
    }
  }
  for (; k < kc; k++, d += 8)
    for (j = 0; j < 8; j++) d[j] = tab[rows[j][k]];
}

/* gemm_fast_small_avx512.c */
void XTE_AVX512_NAME(xte_gemm_fast_small)(int m, int mp, int64_t nblk, int kb, int kl,
                                          const float *a, int64_t lda, const float *sa,
                                          const uint8_t *const *cols, int fmt, const float *sb,
                                          float *w);

const xte_gemm_ukernel XTE_AVX512_NAME(xte_gemm_ukernel) = {
    .isa = XTE_AVX512_ISA,
    .mr = MR,
    .nr = NR,
    .tile = tile,
    .sk_decode = sk_decode,
    .sk_block = sk_block,
    .fast_small = XTE_AVX512_NAME(xte_gemm_fast_small),
    .tile_r8 = tile_r8,
    .tile_r16 = tile_r16,
    .pack_b8 = pack_b8_e4m3,
};
