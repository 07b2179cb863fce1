/* The scale unit of the core: the scaling modes' and recipes' facts and the geometry of a
 * quantized tensor's scale buffers, for every entry point that reads or writes quantized tensors
 * (quantize, GEMM, MoE). Not installed. */
#ifndef XTE_CORE_SCALE_H
#define XTE_CORE_SCALE_H

#include <stdint.h>

#include "numerics/xte_numerics.h"
#include "numerics/xte_scale_numerics.h"
#include "xte/quantize.h"

const char *xte_scaling_mode_name(xte_scaling_mode m);
int xte_recipe_is_mx(xte_recipe r);
/* 1: the columnwise copy is the transpose [K, M]; 0 (MTFP8, MX): it keeps [M, K]. */
int xte_recipe_col_transposed(xte_recipe r);
/* mode and recipe are enum values and the recipe defines the mode (XTE_ERROR_INVALID_ARGUMENT /
 * XTE_ERROR_UNSUPPORTED otherwise). */
xte_status xte_check_mode_recipe(xte_scaling_mode mode, xte_recipe recipe);
/* The scale map of one copy of a quantized [M, K] tensor (data pointer left NULL) and the
 * shape [rows, cols] its buffer must have. Checks mode, recipe and layout. */
xte_status xte_scale_geom(int64_t M, int64_t K, xte_scaling_mode mode, xte_recipe recipe,
                          xte_scale_layout layout, int columnwise, xte_scale_map *m, int64_t *rows,
                          int64_t *cols);

/* The kernels' format (XTE_FP8_*) of an fp8 dtype (e4m3 or e5m2). */
static inline int xte_fp8_fmt(xte_dtype d) {
  return d == XTE_DTYPE_E4M3 ? XTE_FP8_E4M3 : XTE_FP8_E5M2;
}

#endif /* XTE_CORE_SCALE_H */
