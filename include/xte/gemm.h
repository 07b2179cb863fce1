/* xte GEMM: block-scaled FP8 matrix multiply (dense and grouped for MoE experts).
 *
 * ---------------------------------------------------------------- the exact contract
 * Operands. op(A) is [M, K], op(B) is [N, K]; both are FP8 (e4m3 or e5m2) with one fp32 (E8M0 for
 * MXFP8) scale_inv per block, read from the xte_qtensor exactly as xte_quantize wrote it (any
 * scale layout). D[m, n] = sum_k op(A)[m, k] * op(B)[n, k] ("TN": the Linear forward, B = the
 * weight [out, in]).
 *
 * K blocks. K is cut into blocks of KB = 128 elements (KB = 32 for MXFP8), starting at k = 0; the
 * last block may be shorter. Per-tensor scaling is treated as 128-blocks that share one scale.
 * Within a block every row of op(A) has one scale sa[m, b] and every row of op(B) one scale
 * sb[n, b] (1x128 and MXFP8 blocks run along K; a 128x128 block covers 128 rows and 128 of K).
 *
 * For every output element, with a[] and b[] the exact values of the FP8 codes:
 *   acc = +0.0f
 *   for b = 0, 1, ... (K order):
 *     p   = RNE_fp32( sum_{k in block b} a[m, k] * b[n, k] )   the EXACT sum, rounded once
 *     s   = RNE_fp32( sa[m, b] * sb[n, b] )                     fp32 multiply
 *     acc = fmaf(p, s, acc)                                      one fp32 fused multiply-add
 *   t = acc
 *   if accumulate: t = RNE_fp32(t + C[m, n])   (C decoded exactly from fp32 or bf16; as cuBLAS'
 *                                               beta = 1: C is added to the finished product)
 *   if bias:       t = RNE_fp32(t + bias[n])
 *   D[m, n] = RNE_out(t)                        out = fp32 or bf16 (round to nearest even)
 * IEEE semantics throughout: a NaN code (e4m3 0x7F/0xFF, e5m2 NaN), inf * 0 or +inf + -inf in a
 * block makes p NaN; e5m2 infinities give inf partials. Every NaN written to D is the canonical
 * quiet NaN (fp32 0x7FC00000, bf16 0x7FC0). Subnormals are kept (no flush to zero).
 * The result never depends on the backend, thread count, ISA, blocking or tile order. An empty
 * K (K = 0) gives acc = 0.
 *
 * XTE_GEMM_FAST may form each block partial p in an implementation-defined order and precision
 * (as tensor cores do); everything after p is as above. Its error bound is in docs/numerics.md:
 * |p_fast - p| <= KB * 2^-13 * sum_{k in b} |a[m, k] * b[n, k]| per block. On the CPU, FAST sums
 * each block's (exact) products in fp32 (|p_fast - p| <= KB * 2^-24 * that sum): problems of at
 * most 32 rows with B read along K stream B's codes into the multiply-adds, the others run
 * AMX-BF16 tiles where the CPU has them, else fp32 register tiles or the exact kernel (e4m3 x
 * e4m3 where AMX-INT8 runs it); it is deterministic for a given ISA.
 *
 * Supported pairs (A x B): 1x128 x 128x128 (fprop, dgrad), 128x128 x 1x128, 1x128 x 1x128
 * (wgrad), per-tensor x per-tensor, MXFP8 1x32 x 1x32. 128x128 x 128x128 and mixing per-tensor
 * or MXFP8 with another mode are XTE_ERROR_UNSUPPORTED (as cuBLASLt). Dtypes: e4m3 x e4m3,
 * e4m3 x e5m2, e5m2 x e4m3; e5m2 x e5m2 is XTE_ERROR_UNSUPPORTED (as cuBLAS).
 *
 * Which copy of a qtensor is read: op(A) = X (trans_a = 0) or X^T (trans_a = 1), where X is the
 * tensor the qtensor quantized ([rows, cols] of its rowwise copy). The copy used is one whose
 * scale blocks run along K: the rowwise copy when it fits, else the columnwise copy (for
 * 1x128 / MXFP8 with a transpose the columnwise copy is required). A copy whose data is NULL is
 * not there.
 */
#ifndef XTE_GEMM_H
#define XTE_GEMM_H

#include "xte/core.h"
#include "xte/quantize.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum xte_gemm_mode {
  XTE_GEMM_EXACT = 0, /* the contract above, bit-identical on every backend */
  XTE_GEMM_FAST = 1   /* block partials in implementation-defined order (bounded error) */
} xte_gemm_mode;

typedef struct xte_gemm_config {
  size_t struct_size; /* sizeof(xte_gemm_config) (xte_gemm_config_default sets it) */
  /* trans_a = 0: A is X [M, K]; 1: A is X^T, X [K, M]. trans_b = 0: B is X [N, K] ("TN", the
   * default); 1: B is X^T, X [K, N]. (TN, NN, NT, TT of TransformerEngine.) */
  int trans_a, trans_b;
  /* 1: D = C + A * B with C (fp32 or bf16, shape of D) given; C may be D itself (same data,
   * dtype and ld); other overlaps are undefined. 0: C is ignored (may be NULL). */
  int accumulate;
  /* Optional fp32 bias [N] added to every row (NULL: none), in fp32 as above in both modes
   * (XTE_GEMM_FAST on CUDA adds it after cuBLASLt: docs/numerics.md). */
  const xte_tensor *bias;
  xte_gemm_mode mode;
} xte_gemm_config;

/* trans 0/0, no accumulate, no bias, EXACT. */
XTE_API xte_gemm_config xte_gemm_config_default(void);

/* D [M, N] (fp32 or bf16) = op(A) * op(B)^T (+ C) (+ bias). config NULL: the default.
 * On error nothing is written. */
XTE_API xte_status xte_gemm(const xte_qtensor *A, const xte_qtensor *B, const xte_tensor *C,
                            xte_tensor *D, const xte_gemm_config *config, xte_stream stream);

/* ---------------------------------------------------------------- grouped GEMMs (MoE) */
typedef enum xte_gemm_grouping {
  /* A [sum_g roundup(m_g, alignment), K] (rows of group g follow those of group g - 1, each
   * group padded to a multiple of alignment rows; padding rows are never read nor written);
   * B [G, N, K] (trans_b = 0) or [G, K, N] (trans_b = 1); D [rows of A, N].
   * group_sizes[g] = m_g (host array). trans_a must be 0. */
  XTE_GEMM_GROUPED_CONTIGUOUS = 0,
  /* A [G, m_max, K]; masked_m (int32 [G], memory of the stream's backend) holds the valid rows
   * of each group; B as contiguous; D [G, m_max, N]. Rows m >= masked_m[g] of A are never read
   * and of D never written. trans_a must be 0. */
  XTE_GEMM_GROUPED_MASKED = 1,
  /* Weight-gradient GEMM with K split into G segments: op(A) [M, sum_g K_g], op(B)
   * [N, sum_g K_g]; group_sizes[g] = K_g (host array; each but the last a multiple of the K
   * block); D [G, M, N]: D[g] = (C[g] +) op(A)[:, K_g segment] * op(B)[:, K_g segment]^T. */
  XTE_GEMM_GROUPED_K = 2
} xte_gemm_grouping;

typedef struct xte_gemm_groups {
  xte_gemm_grouping kind;
  int num_groups;
  const int64_t *group_sizes; /* CONTIGUOUS: rows per group; K: K per group */
  int64_t alignment;          /* CONTIGUOUS: row padding of each group (0 or 1: none) */
  const xte_tensor *masked_m; /* MASKED: int32 [G] */
} xte_gemm_groups;

/* All groups in one call; each group's result is bit-identical to xte_gemm on its slices.
 * Bias [N] applies to every group. On error nothing is written. */
XTE_API xte_status xte_gemm_grouped(const xte_qtensor *A, const xte_qtensor *B, const xte_tensor *C,
                                    xte_tensor *D, const xte_gemm_groups *groups,
                                    const xte_gemm_config *config, xte_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* XTE_GEMM_H */
