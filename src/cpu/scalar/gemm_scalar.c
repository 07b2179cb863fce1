/* Scalar GEMM micro-kernel: the reference the SIMD kernels reproduce byte for byte. A 4 x 4 tile;
 * fp64 block partials (exact: see src/numerics/xte_gemm_numerics.h; products of FP8 values are
 * exact in fp64 and so is every partial sum, so a plain multiply and add is exact too), then the
 * shared per-element rules. */
#include "numerics/xte_gemm_numerics.h"
#include "cpu/gemm_kernels.h"

#define MR 4
#define NR 4

void xte_gemm_fast_small_scalar(int m, int mp, int64_t nblk, int kb, int kl, const float *a,
                                int64_t lda, const float *sa, const uint8_t *const *cols, int fmt,
                                const float *sb, float *w); /* gemm_fast_small_scalar.c */

static void block_sum(int n, const double *a, const double *b, double P[NR][MR]) {
  int k, i, j;
  for (j = 0; j < NR; j++)
    for (i = 0; i < MR; i++) P[j][i] = 0.0;
  for (k = 0; k < n; k++)
    for (j = 0; j < NR; j++)
      for (i = 0; i < MR; i++) P[j][i] = P[j][i] + a[k * MR + i] * b[k * NR + j];
}

static void tile(int64_t nblk, const int *kl, const double *a, const double *a_lo, const double *b,
                 const double *b_lo, const float *sa, const float *sb, float *acc) {
  int64_t bl;
  int split = a_lo != NULL || b_lo != NULL;
  for (bl = 0; bl < nblk; bl++) {
    const int n = kl[bl];
    double P[NR][MR], Q[NR][MR];
    int i, j;
    block_sum(n, a, b, P);
    if (split) block_sum(n, a_lo ? a_lo : a, b_lo ? b_lo : b, Q);
    for (j = 0; j < NR; j++)
      for (i = 0; i < MR; i++) {
        float p = split ? xte_gemm_round2_f32(P[j][i], Q[j][i]) : (float)P[j][i];
        acc[j * MR + i] =
            xte_gemm_block_update(acc[j * MR + i], p, sa[bl * MR + i], sb[bl * NR + j]);
      }
    a += n * MR;
    b += n * NR;
    if (a_lo) a_lo += n * MR;
    if (b_lo) b_lo += n * NR;
  }
}

/* Small-M path (see xte_gemm_ops.h): B decoded through the driver's tables. */
static void sk_decode(const uint8_t *const *rows, int nrows, int kl, int fmt, int split,
                      const double *t_hi, const double *t_lo, double *bd, double *bd_lo) {
  int j, k, kl8 = (kl + 7) & ~7;
  (void)fmt;
  for (j = 0; j < 8; j++) {
    double *d = bd + j * XTE_GEMM_SK_LDB, *dl = split ? bd_lo + j * XTE_GEMM_SK_LDB : NULL;
    for (k = 0; k < kl8; k++) {
      int in = j < nrows && k < kl;
      d[k] = in ? t_hi[rows[j][k]] : 0.0;
      if (dl) dl[k] = in ? t_lo[rows[j][k]] : 0.0;
    }
  }
}

static double sk_dot(int n, const double *a, const double *b) {
  double s = 0.0;
  int k;
  for (k = 0; k < n; k++) s = s + a[k] * b[k];
  return s;
}

static void sk_block(int rows, int kl8, const double *a, const double *a_lo, int64_t lda,
                     const double *bd, const double *bd_lo, const float *sa, const float *sb,
                     float *w, int64_t ldw) {
  int r, j;
  for (r = 0; r < rows; r++)
    for (j = 0; j < 8; j++) {
      const double *ar = a + r * lda, *bj = bd + j * XTE_GEMM_SK_LDB;
      double P = sk_dot(kl8, ar, bj);
      float p;
      if (a_lo)
        p = xte_gemm_round2_f32(P, sk_dot(kl8, a_lo + r * lda, bj));
      else if (bd_lo)
        p = xte_gemm_round2_f32(P, sk_dot(kl8, ar, bd_lo + j * XTE_GEMM_SK_LDB));
      else
        p = (float)P;
      w[r * ldw + j] = xte_gemm_block_update(w[r * ldw + j], p, sa[r], sb[j]);
    }
}

const xte_gemm_ukernel xte_gemm_ukernel_scalar = {
    .isa = XTE_CPU_ISA_SCALAR,
    .mr = MR,
    .nr = NR,
    .tile = tile,
    .sk_decode = sk_decode,
    .sk_block = sk_block,
    .fast_small = xte_gemm_fast_small_scalar,
};
