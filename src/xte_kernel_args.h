/* Validated, resolved arguments that the core hands to a backend's kernels. Plain C structs
 * (no pointers to core state) so the CPU driver, CUDA and MUSA kernels all take them as they are.
 * The core has checked every field; a backend trusts them. */
#ifndef XTE_KERNEL_ARGS_H
#define XTE_KERNEL_ARGS_H

#include <stdint.h>

#include "numerics/xte_numerics.h"
#include "numerics/xte_scale_numerics.h"

/* Input kinds (XTE_NUM_IN_* in the numerics header). */

typedef struct xte_quant_args {
  const void *in;
  int in_kind; /* XTE_NUM_IN_F32 / BF16 / F16 */
  int64_t M, K, ld_in;
  int fmt; /* XTE_FP8_E4M3 / E5M2 */
  int saturate;
  int mode;   /* xte_scaling_mode */
  int recipe; /* xte_recipe */
  float eps;
  int force_pow_2;
  /* rowwise copy [M, K] */
  uint8_t *row_q;
  int64_t ld_row_q;
  xte_scale_map row_s;
  /* columnwise copy: [K, M] when col_transposed, else [M, K] */
  uint8_t *col_q;
  int64_t ld_col_q;
  int col_transposed;
  xte_scale_map col_s;
  /* block geometry: rowwise blocks 1 x row_bw (or 128x128), columnwise col_bh x 1 */
  int row_bw, col_bh, square; /* square: 128x128 */
  float *amax_out;            /* optional */
  float *scale_out;           /* optional (per-tensor) */
  float given_scale;          /* per-tensor delayed */
} xte_quant_args;

typedef struct xte_dequant_args {
  const uint8_t *q;
  int fmt;
  int64_t R, C, ld_q; /* the copy's shape */
  xte_scale_map s;
  /* block of element (r, c): gi = r / bh, gj = c / bw (for columnwise Bx1: bh = B, bw = 1) */
  int bh, bw;
  void *out;
  int out_dtype; /* xte_dtype */
  int64_t ld_out;
} xte_dequant_args;

typedef struct xte_cast_args {
  const void *in;
  int in_dtype; /* xte_dtype */
  void *out;
  int out_dtype;
  int64_t n;
  int saturate;
} xte_cast_args;

/* The quantize arguments' view of the scale rules of src/numerics/xte_scale_numerics.h: whether
 * the recipe is scaled by xte_scale_te, with force_pow_2 (resolved to 0 / 1 by the core), its
 * overflow scale, and the scale of one block (all backends call these; the SIMD kernels'
 * vectorized TE scales ask the first three). */
XTE_HD int xte_quant_is_te(const xte_quant_args *a) {
  return xte_recipe_scales_te(a->recipe);
}

XTE_HD int xte_quant_te_pow2(const xte_quant_args *a) {
  return xte_quant_is_te(a) && a->force_pow_2;
}

XTE_HD float xte_quant_te_inf_scale(const xte_quant_args *a) {
  return xte_recipe_te_inf_scale(a->recipe, a->in_kind);
}

XTE_HD xte_block_scale xte_quant_block_scale(const xte_quant_args *a, float amax) {
  return XTE_RECIPE_BLOCK_SCALE(a->recipe, a->fmt, a->in_kind, a->eps, xte_quant_te_pow2(a),
                                a->given_scale, amax);
}

#endif /* XTE_KERNEL_ARGS_H */
