/* The exact GEMM micro-kernels written once over a small fp64 vector layer, compiled per ISA:
 * src/cpu/avx2/gemm_avx2.c (4 fp64 lanes) and src/cpu/avx512/gemm_avx512.c (8 lanes, natively
 * and against SIMDe) define the layer below and include this file, as the MoE router is shared
 * (src/cpu/moe_router.c). Every output element takes the same IEEE operations in the same order
 * on every ISA (fp64 partials in k order, exact; one rounding to fp32; the fp32 scale product and
 * fused multiply-add of src/numerics/xte_gemm_numerics.h), so the bytes are the scalar kernel's.
 *
 * The including file defines, before including this file:
 *   MR, NR        the tile: MR rows (a multiple of XD_W) x NR broadcast columns
 *   XD_W          the fp64 lanes of xd (8, the small-M path's columns, is a multiple of it)
 *   xd, xf        the fp64 vector and the fp32 vector of XD_W lanes
 *   xd_zero() xd_ld(p) xd_lda(p) xd_st(p, v) xd_1(x) xd_fma(a, b, c) xd_cvt(a)
 *                 +0; unaligned and aligned loads; store; broadcast; a b + c; each lane's fp32 RNE
 *   xf_ld(p) xf_st(p, v) xf_1(x) xf_mul(a, b) xf_fma(a, b, c)
 *   xf round2(xd h, xd l)               RNE_fp32(h + l) exactly, lane by lane
 *   xd sk_hsum(const xd *v)             lane j: the sum of the lanes of v[j], j < XD_W (exact)
 *   void sk_store16(double *d, __m256i h)   16 fp16 images to fp64 values at d[0..15]
 *   XG_PREFETCH(p)                      a prefetch of p, or nothing
 * It defines the static functions tile, sk_decode and sk_block of xte_gemm_ukernel
 * (src/cpu/gemm_kernels.h). The loops over vectors and columns are fully unrolled (#pragma GCC
 * unroll), so that the accumulators stay in registers. */
#ifndef XTE_CPU_GEMM_TEMPLATE_H
#define XTE_CPU_GEMM_TEMPLATE_H

#define XG_STR_(x) #x
#define XG_STR(x) XG_STR_(x)
/* #pragma GCC unroll n, n a macro (expanded first) */
#define XG_UNROLL(n) _Pragma(XG_STR(GCC unroll n))

/* the vectors of one column of a tile */
#define XG_MV (MR / XD_W)

/* c[j][v] = sum_k a[k][v XD_W + lane] * b[k][j] over n rows, in k order */
static inline __attribute__((always_inline)) void block_acc(int n, const double *a, const double *b,
                                                            xd c[NR][XG_MV]) {
  int j, v, k;
  XG_UNROLL(NR)
  for (j = 0; j < NR; j++) {
    XG_UNROLL(XG_MV)
    for (v = 0; v < XG_MV; v++) c[j][v] = xd_zero();
  }
  for (k = 0; k < n; k++) {
    xd av[XG_MV];
    XG_UNROLL(XG_MV)
    for (v = 0; v < XG_MV; v++) av[v] = xd_ld(a + k * MR + v * XD_W);
    XG_UNROLL(NR)
    for (j = 0; j < NR; j++) {
      const xd bb = xd_1(b[k * NR + j]);
      XG_UNROLL(XG_MV)
      for (v = 0; v < XG_MV; v++) c[j][v] = xd_fma(av[v], bb, c[j][v]);
    }
  }
}

/* P[j][i] = sum_k a[k][i] * b[k][j] over n rows (fp64, exact for the driver's classes). */
static inline void block_sum(int n, const double *a, const double *b, double *P) {
  xd c[NR][XG_MV];
  int j, v;
  block_acc(n, a, b, c);
  XG_UNROLL(NR)
  for (j = 0; j < NR; j++) {
    XG_UNROLL(XG_MV)
    for (v = 0; v < XG_MV; v++) xd_st(P + j * MR + v * XD_W, c[j][v]);
  }
}

/* One block without a split operand: the partials stay in registers, are rounded to fp32 and
 * folded into acc with the scales sa[0..MR), sb[0..NR) of the block. */
static inline void block_fused(int n, const double *a, const double *b, const float *sa,
                               const float *sb, float *acc) {
  xd c[NR][XG_MV];
  xf s[XG_MV];
  int j, v;
  block_acc(n, a, b, c);
  XG_UNROLL(XG_MV)
  for (v = 0; v < XG_MV; v++) s[v] = xf_ld(sa + v * XD_W);
  XG_UNROLL(NR)
  for (j = 0; j < NR; j++) {
    const xf sbj = xf_1(sb[j]);
    XG_UNROLL(XG_MV)
    for (v = 0; v < XG_MV; v++) {
      float *aj = acc + j * MR + v * XD_W;
      xf_st(aj, xf_fma(xd_cvt(c[j][v]), xf_mul(s[v], sbj), xf_ld(aj)));
    }
  }
}

static void tile(int64_t nblk, const int *kl, const double *a, const double *a_lo, const double *b,
                 const double *b_lo, const float *sa, const float *sb, float *acc) {
  int64_t bl;
  int split = a_lo != NULL || b_lo != NULL;
  _Alignas(xd) double P[NR * MR];
  _Alignas(xd) double Q[NR * MR];
  for (bl = 0; bl < nblk; bl++) {
    const int n = kl[bl];
    xf s[XG_MV];
    int j, v;
    XG_UNROLL(XG_MV)
    for (v = 0; v < XG_MV; v++) s[v] = xf_ld(sa + bl * MR + v * XD_W);
    if (!split) {
      block_fused(n, a, b, sa + bl * MR, sb + bl * NR, acc);
      a += n * MR;
      b += n * NR;
      continue;
    }
    block_sum(n, a, b, P);
    if (split) block_sum(n, a_lo ? a_lo : a, b_lo ? b_lo : b, Q);
    for (j = 0; j < NR; j++) {
      const xf sbj = xf_1(sb[bl * NR + j]);
      XG_UNROLL(XG_MV)
      for (v = 0; v < XG_MV; v++) {
        const double *pj = P + j * MR + v * XD_W, *qj = Q + j * MR + v * XD_W;
        float *aj = acc + j * MR + v * XD_W;
        const xf p = split ? round2(xd_lda(pj), xd_lda(qj)) : xd_cvt(xd_lda(pj));
        xf_st(aj, xf_fma(p, xf_mul(s[v], sbj), xf_ld(aj)));
      }
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

static void sk_decode(const uint8_t *const *rows, int nrows, int kl, int fmt, int split,
                      const double *t_hi, const double *t_lo, double *bd, double *bd_lo) {
  const int e4 = fmt == XTE_FP8_E4M3, kl8 = (kl + 7) & ~7, kv = kl & ~15;
  int j, k;
  for (j = 0; j < 8; j++) {
    double *d = bd + j * SK_LDB, *dl = split ? bd_lo + j * SK_LDB : NULL;
    const uint8_t *r = j < nrows ? rows[j] : NULL;
    k = 0;
    if (r) {
      XG_PREFETCH(r + 1024);
      XG_PREFETCH(r + 1024 + 64);
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

/* out[r] lane j = sum_k ar[r][k] * bd[j][k], R rows (1..3) x XD_W columns */
static inline __attribute__((always_inline)) void sk_dot(const int R, int kl8,
                                                         const double *const *ar, const double *bd,
                                                         xd *out) {
  xd c[3][XD_W];
  int r, j, k;
#pragma GCC unroll 3
  for (r = 0; r < R; r++) {
    XG_UNROLL(XD_W)
    for (j = 0; j < XD_W; j++) c[r][j] = xd_zero();
  }
  for (k = 0; k < kl8; k += XD_W) {
    xd av[3];
#pragma GCC unroll 3
    for (r = 0; r < R; r++) av[r] = xd_ld(ar[r] + k);
    XG_UNROLL(XD_W)
    for (j = 0; j < XD_W; j++) {
      xd bv = xd_ld(bd + j * SK_LDB + k);
#pragma GCC unroll 3
      for (r = 0; r < R; r++) c[r][j] = xd_fma(av[r], bv, c[r][j]);
    }
  }
#pragma GCC unroll 3
  for (r = 0; r < R; r++) out[r] = sk_hsum(c[r]);
}

static inline void sk_dotn(int R, int kl8, const double *const *ar, const double *bd, xd *out) {
  if (R == 3)
    sk_dot(3, kl8, ar, bd, out);
  else if (R == 2)
    sk_dot(2, kl8, ar, bd, out);
  else
    sk_dot(1, kl8, ar, bd, out);
}

static inline void sk_fold(xf p, float sa, xf sbv, float *w) {
  xf_st(w, xf_fma(p, xf_mul(xf_1(sa), sbv), xf_ld(w)));
}

/* the 8 columns of the small-M path in groups of XD_W */
static void sk_block(int rows, int kl8, const double *a, const double *a_lo, int64_t lda,
                     const double *bd, const double *bd_lo, const float *sa, const float *sb,
                     float *w, int64_t ldw) {
  xd P[3], Q[3];
  int r, i, h;
  for (h = 0; h < 8 / XD_W; h++) {
    const xf sbv = xf_ld(sb + XD_W * h);
    const double *bh = bd + XD_W * h * SK_LDB, *bh_lo = bd_lo ? bd_lo + XD_W * h * SK_LDB : NULL;
    if (a_lo) {
      for (r = 0; r < rows; r++) {
        const double *ar[2] = {a + r * lda, a_lo + r * lda};
        sk_dot(2, kl8, ar, bh, P);
        sk_fold(round2(P[0], P[1]), sa[r], sbv, w + r * ldw + XD_W * h);
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
        sk_fold(bh_lo ? round2(P[i], Q[i]) : xd_cvt(P[i]), sa[r + i], sbv,
                w + (r + i) * ldw + XD_W * h);
    }
  }
}

#endif /* XTE_CPU_GEMM_TEMPLATE_H */
