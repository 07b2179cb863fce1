/* Validated, resolved arguments that the core hands to a backend's kernels. Plain C structs
 * (no pointers to core state) so the CPU driver, CUDA and MUSA kernels all take them as they are.
 * The core has checked every field; a backend trusts them. */
#ifndef XTE_KERNEL_ARGS_H
#define XTE_KERNEL_ARGS_H

#include <stdint.h>

#include "numerics/xte_numerics.h"

/* Where the scale of logical block (gi, gj) lives. */
enum { XTE_SMAP_LINEAR = 0, XTE_SMAP_SWIZZLE = 1 };

typedef struct xte_scale_map {
  void *data;      /* NULL: this copy is not produced */
  int kind;        /* XTE_SMAP_* */
  int e8m0;        /* 1: one E8M0 byte per block; 0: fp32 */
  int swap;        /* swizzle only: tile coordinates are (gj, gi) */
  int64_t sr, sc;  /* linear: offset = gi * sr + gj * sc */
  int64_t tiles_c; /* swizzle: 128x4 tiles per tile row */
  int64_t total;   /* elements in the buffer (padding is zero-filled) */
  int64_t grid_r, grid_c;
} xte_scale_map;

XTE_HD int64_t xte_scale_offset(const xte_scale_map *m, int64_t gi, int64_t gj) {
  if (m->kind == XTE_SMAP_LINEAR) return gi * m->sr + gj * m->sc;
  {
    int64_t r = m->swap ? gj : gi, c = m->swap ? gi : gj;
    int64_t tile = (r / 128) * m->tiles_c + c / 4;
    return tile * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
  }
}

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

/* The recipes scaled by xte_scale_te: TE_CURRENT (0) and TE_BLOCK (2), both with force_pow_2
 * (resolved to 0 / 1 by the core); the SIMD kernels' vectorized TE scales ask these too */
XTE_HD int xte_quant_is_te(const xte_quant_args *a) {
  return a->recipe == 0 || a->recipe == 2;
}

XTE_HD int xte_quant_te_pow2(const xte_quant_args *a) {
  return xte_quant_is_te(a) && a->force_pow_2;
}

/* The scale when fp8_max / amax overflows: FLT_MAX for per-tensor current scaling (TE's
 * nvte_compute_scale_from_amax, any input dtype), the input dtype's max for TE_BLOCK (TE's
 * block kernels) */
XTE_HD float xte_quant_te_inf_scale(const xte_quant_args *a) {
  return xte_input_dtype_max(a->recipe == 0 ? XTE_NUM_IN_F32 : a->in_kind);
}

/* Scale of one block under the quantize recipe (all backends call this). */
XTE_HD xte_block_scale xte_quant_block_scale(const xte_quant_args *a, float amax) {
  if (xte_quant_is_te(a))
    return xte_scale_te(amax, a->fmt, a->eps, xte_quant_te_pow2(a), xte_quant_te_inf_scale(a));
  switch (a->recipe) {
    case 3:
      return xte_scale_deepgemm(amax, a->fmt, 0);
    case 4:
      return xte_scale_deepgemm(amax, a->fmt, 1);
    case 5:
      return xte_scale_mtfp8(amax, a->fmt);
    case 6:
      return xte_scale_mx_te(amax, a->fmt);
    case 7:
      return xte_scale_mx_ocp(amax, a->fmt);
    default: { /* 1: TE_DELAYED */
      xte_block_scale r;
      r.scale = a->given_scale;
      r.scale_inv = 1.0f / a->given_scale;
      r.e8m0 = 0;
      return r;
    }
  }
}

XTE_HD void xte_store_scale(const xte_scale_map *m, int64_t gi, int64_t gj, xte_block_scale s) {
  int64_t off = xte_scale_offset(m, gi, gj);
  if (m->e8m0)
    ((uint8_t *)m->data)[off] = s.e8m0;
  else
    ((float *)m->data)[off] = s.scale_inv;
}

XTE_HD float xte_load_scale_inv(const xte_scale_map *m, int64_t gi, int64_t gj) {
  int64_t off = xte_scale_offset(m, gi, gj);
  if (m->e8m0) return xte_e8m0_to_f32(((const uint8_t *)m->data)[off]);
  return ((const float *)m->data)[off];
}

#endif /* XTE_KERNEL_ARGS_H */
