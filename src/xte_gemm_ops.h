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

#endif /* XTE_GEMM_OPS_H */
