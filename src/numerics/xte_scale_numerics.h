/* Where a block's scale is stored and which scale a recipe gives a block: the per-element scale
 * rules every backend's quantize, dequantize and GEMM call (CPU C11, CUDA and MUSA C++ alike).
 * Recipes are the xte_recipe values as plain ints (this layer includes nothing of the public
 * API): 0 TE_CURRENT, 1 TE_DELAYED, 2 TE_BLOCK, 3 DEEPGEMM, 4 DEEPGEMM_UE8M0, 5 MTFP8, 6 MX_TE,
 * 7 MX_OCP. */
#ifndef XTE_SCALE_NUMERICS_H
#define XTE_SCALE_NUMERICS_H

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

/* The recipes scaled by xte_scale_te: TE_CURRENT (0) and TE_BLOCK (2). */
XTE_HD int xte_recipe_scales_te(int recipe) {
  return recipe == 0 || recipe == 2;
}

/* The scale when fp8_max / amax overflows: FLT_MAX for per-tensor current scaling (TE's
 * nvte_compute_scale_from_amax, any input dtype), the input dtype's max (in_kind, XTE_NUM_IN_*)
 * for TE_BLOCK (TE's block kernels). */
XTE_HD float xte_recipe_te_inf_scale(int recipe, int in_kind) {
  return xte_input_dtype_max(recipe == 0 ? XTE_NUM_IN_F32 : in_kind);
}

/* TE_DELAYED (1): the scale the caller gave. */
XTE_HD xte_block_scale xte_scale_given(float given_scale) {
  xte_block_scale r;
  r.scale = given_scale;
  r.scale_inv = 1.0f / given_scale;
  r.e8m0 = 0;
  return r;
}

/* Scale of one block of max |x| = amax under one of the recipes that take nothing but the
 * format (XTE_FP8_*): 3 DEEPGEMM, 4 DEEPGEMM_UE8M0, 5 MTFP8, 6 MX_TE, 7 MX_OCP. */
XTE_HD xte_block_scale xte_recipe_fixed_scale(int recipe, int fmt, float amax) {
  switch (recipe) {
    case 3:
      return xte_scale_deepgemm(amax, fmt, 0);
    case 4:
      return xte_scale_deepgemm(amax, fmt, 1);
    case 5:
      return xte_scale_mtfp8(amax, fmt);
    case 6:
      return xte_scale_mx_te(amax, fmt);
    default: /* 7 */
      return xte_scale_mx_ocp(amax, fmt);
  }
}

/* Scale of one block of max |x| = amax under recipe (the rule every backend applies): fmt
 * (XTE_FP8_*); eps, force_pow_2 (0 or 1) and the input kind in_kind (XTE_NUM_IN_*) for the TE
 * recipes; given_scale for TE_DELAYED. A macro: each argument is evaluated only in its recipes'
 * branch (a function taking every field kept them all live in the GPU kernels' registers). */
#define XTE_RECIPE_BLOCK_SCALE(recipe, fmt, in_kind, eps, force_pow_2, given_scale, amax)    \
  (xte_recipe_scales_te(recipe) ? xte_scale_te((amax), (fmt), (eps), (force_pow_2),          \
                                               xte_recipe_te_inf_scale((recipe), (in_kind))) \
   : (recipe) == 1              ? xte_scale_given(given_scale)                               \
                                : xte_recipe_fixed_scale((recipe), (fmt), (amax)))

#endif /* XTE_SCALE_NUMERICS_H */
