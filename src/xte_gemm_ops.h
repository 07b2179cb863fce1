/* The GEMM capability of a backend: validated, resolved arguments and the ops table. Plain C
 * structs, usable by the CPU driver and by CUDA / MUSA kernels as they are. The core has checked
 * every field; a backend trusts them (except masked_m, which lives in backend memory: the
 * backend checks 0 <= masked_m[g] <= m before writing anything). */
#ifndef XTE_GEMM_OPS_H
#define XTE_GEMM_OPS_H

#include <stdint.h>

#include "xte/core.h"
#include "xte_kernel_args.h"

/* A logical FP8 operand [rows, K] (op(A) or op(B), all groups): element (i, k) is the code
 * data[i * rs + k * ks] of format fmt (XTE_FP8_*), its scale_inv is the block of grid cell
 * (i / bi, k / bk), or (k / bk, i / bi) when sswap, in the scale map s. */
typedef struct xte_gemm_operand {
  const uint8_t *data;
  int fmt;
  int64_t rs, ks;
  xte_scale_map s;
  int64_t bi, bk;
  int sswap;
} xte_gemm_operand;

/* One GEMM of a (grouped) call: D[d_r0 + m, n] for m < M (or masked_m[index]), n < N, over the
 * K range [a_k0, a_k0 + K) of A and [b_k0, b_k0 + K) of B; A rows from a_i0, B rows from b_i0.
 * a_k0 and b_k0 are multiples of the K block. */
typedef struct xte_gemm_problem {
  int64_t m, n, k;
  int64_t a_i0, a_k0, b_i0, b_k0;
  int64_t d_r0;
} xte_gemm_problem;

typedef struct xte_gemm_args {
  xte_gemm_operand a, b;
  int kblock; /* 128, or 32 for MXFP8 */
  int mode;   /* xte_gemm_mode */
  /* optional C (accumulate): fp32 or bf16, element (r, n) at c[r * ld_c + n] */
  const void *c;
  int c_dtype;
  int64_t ld_c;
  void *d;
  int d_dtype; /* XTE_DTYPE_FP32 / XTE_DTYPE_BF16 */
  int64_t ld_d;
  const float *bias; /* optional [N] */
  int64_t num_problems;
  const xte_gemm_problem *problems;
  const int32_t *masked_m; /* masked grouping: valid rows of problem g (<= problems[g].m) */
} xte_gemm_args;

struct xte_gemm_ops {
  xte_status (*gemm)(const xte_gemm_args *args, void *handle);
};

/* ---------------------------------------------------------------- CPU micro-kernels
 * A register tile of MR rows (of A) x NR columns (of B). Packed operands are fp64 (exact FP8
 * values): A micro-panel [k][MR], B micro-panel [k][NR], over the blocks of one K panel.
 * For each block bl (kl[bl] elements, in order):
 *   P[i][j] = sum_k A[k][i] * B[k][j] in fp64 (exact for the classes the driver forms);
 *   when a split operand is given (a_lo or b_lo non-NULL: that operand's magnitudes < 1, the
 *   first panel holding those >= 1 and NaN), P = P_hi + P_lo is rounded exactly once;
 *   p = RNE_fp32(P); s = RNE_fp32(sa[bl][i] * sb[bl][j]); acc[j][i] = fmaf(p, s, acc[j][i]).
 * acc is the fp32 tile, column-major [NR][MR]. */
typedef void (*xte_gemm_tile_fn)(int64_t nblk, const int *kl, const double *a, const double *a_lo,
                                 const double *b, const double *b_lo, const float *sa,
                                 const float *sb, float *acc);

/* ---------------------------------------------------------------- small-M ("skinny") path
 * For a few rows of A (<= XTE_GEMM_SK_MAXM) B is not packed: per K block the driver (or the
 * kernel's sk_decode) decodes 8 rows of B codes into an L1 buffer bd [8][XTE_GEMM_SK_LDB] fp64
 * (value * 2^-8 for e4m3, whose fp16 image is shifted by 2^8; e5m2 as is; zero past the block's
 * length, up to its length rounded up to 8); A is packed once per K panel as value * (2^8 for an
 * e4m3 B, else 1), so every product is the exact product of the two codes' values.
 * sk_decode(rows, nrows, kl, fmt, split, t_hi, t_lo, bd, bd_lo): rows[j] points at the block's
 *   first code of B row j (codes contiguous along K), j < nrows (rows >= nrows are zero); fmt is
 *   B's format; split: bd gets the class |v| >= 1 (and NaN, inf), bd_lo the class |v| < 1; t_hi /
 *   t_lo are the driver's 256-entry tables of the same values (for tails).
 * sk_block(rows, kl8, a, a_lo, lda, bd, bd_lo, sa, sb, w, ldw): for r < rows, j < 8:
 *   P = sum_{k < kl8} a[r * lda + k] * bd[j * LDB + k] (exact in any order), with a split operand
 *   (a_lo or bd_lo non-NULL) also Q from the low class and p = RNE_fp32(P + Q) exactly, else
 *   p = RNE_fp32(P); w[r * ldw + j] = fmaf(p, RNE_fp32(sa[r] * sb[j]), w[r * ldw + j]). */
#define XTE_GEMM_SK_MAXM 32
#define XTE_GEMM_SK_LDB 128
typedef void (*xte_gemm_sk_decode_fn)(const uint8_t *const *rows, int nrows, int kl, int fmt,
                                      int split, const double *t_hi, const double *t_lo, double *bd,
                                      double *bd_lo);
typedef void (*xte_gemm_sk_block_fn)(int rows, int kl8, const double *a, const double *a_lo,
                                     int64_t lda, const double *bd, const double *bd_lo,
                                     const float *sa, const float *sb, float *w, int64_t ldw);

typedef struct xte_gemm_ukernel {
  int isa; /* xte_cpu_isa */
  int mr, nr;
  xte_gemm_tile_fn tile;
  xte_gemm_sk_decode_fn sk_decode;
  xte_gemm_sk_block_fn sk_block;
} xte_gemm_ukernel;

extern const xte_gemm_ukernel xte_gemm_ukernel_scalar;
extern const xte_gemm_ukernel xte_gemm_ukernel_avx2;
#ifdef XTE_HAVE_ISA_AVX512
extern const xte_gemm_ukernel xte_gemm_ukernel_avx512;
#endif
#ifdef XTE_HAVE_ISA_AVX512_SIMDE
extern const xte_gemm_ukernel xte_gemm_ukernel_avx512_simde;
#endif

#endif /* XTE_GEMM_OPS_H */
