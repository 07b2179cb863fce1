/* The scale unit of the core: the facts of the scaling modes and recipes, and the geometry of a
 * quantized tensor's scale buffer in each layout (src/core/scale.h). */
#include "core/scale.h"

#include <string.h>

#include "core/tensor.h"
#include "xte_internal.h"

/* ceil(a / b) for a >= 0, b > 0: cannot overflow */
static int64_t cdiv(int64_t a, int64_t b) {
  return a / b + (a % b != 0);
}
/* a rounded up to a multiple of b (a >= 0, b > 0) into *r; 1 when that overflows int64 */
static int rup_overflows(int64_t a, int64_t b, int64_t *r) {
  return __builtin_mul_overflow(cdiv(a, b), b, r);
}

const char *xte_scaling_mode_name(xte_scaling_mode m) {
  switch (m) {
    case XTE_SCALING_PER_TENSOR:
      return "per-tensor";
    case XTE_SCALING_BLOCK_1x128:
      return "1x128";
    case XTE_SCALING_BLOCK_128x128:
      return "128x128";
    case XTE_SCALING_MXFP8_1x32:
      return "mxfp8 1x32";
    default:
      return "unknown";
  }
}

int xte_recipe_is_mx(xte_recipe r) {
  return r == XTE_RECIPE_MX_TE || r == XTE_RECIPE_MX_OCP;
}

/* The columnwise copy keeps the [M, K] shape (quantized in Bx1 blocks) for MTFP8 and MX. */
int xte_recipe_col_transposed(xte_recipe r) {
  return !(r == XTE_RECIPE_MTFP8 || xte_recipe_is_mx(r));
}

xte_status xte_check_mode_recipe(xte_scaling_mode mode, xte_recipe recipe) {
  if ((unsigned)mode >= XTE_SCALING_COUNT)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "scaling_mode %d is not an xte_scaling_mode",
                         (int)mode);
  if ((unsigned)recipe >= XTE_RECIPE_COUNT)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "recipe %d is not an xte_recipe", (int)recipe);
  switch (mode) {
    case XTE_SCALING_PER_TENSOR:
      if (recipe == XTE_RECIPE_TE_CURRENT || recipe == XTE_RECIPE_TE_DELAYED) return XTE_SUCCESS;
      break;
    case XTE_SCALING_BLOCK_1x128:
    case XTE_SCALING_BLOCK_128x128:
      if (recipe == XTE_RECIPE_TE_BLOCK || recipe == XTE_RECIPE_DEEPGEMM ||
          recipe == XTE_RECIPE_DEEPGEMM_UE8M0 || recipe == XTE_RECIPE_MTFP8)
        return XTE_SUCCESS;
      break;
    case XTE_SCALING_MXFP8_1x32:
      if (xte_recipe_is_mx(recipe)) return XTE_SUCCESS;
      break;
    default:
      break;
  }
  return xte_set_error(XTE_ERROR_UNSUPPORTED, "recipe %d does not define scaling_mode %s",
                       (int)recipe, xte_scaling_mode_name(mode));
}

/* Resolves the scale map of one copy; rows/cols are the buffer's required shape. */
xte_status xte_scale_geom(int64_t M, int64_t K, xte_scaling_mode mode, xte_recipe recipe,
                          xte_scale_layout layout, int columnwise, xte_scale_map *m, int64_t *rows,
                          int64_t *cols) {
  int64_t R, C, GR, GC, mk;
  int colblock = columnwise && !xte_recipe_col_transposed(recipe), over = 0;
  int B = mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  memset(m, 0, sizeof *m);
  if (columnwise != 0 && columnwise != 1)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "columnwise = %d: must be 0 or 1", columnwise);
  if (M < 0 || K < 0)
    return xte_set_error(XTE_ERROR_SHAPE, "M = %lld, K = %lld: negative", (long long)M,
                         (long long)K);
  if (M > XTE_MAX_DIM || K > XTE_MAX_DIM || __builtin_mul_overflow(M, K, &mk) || mk > XTE_MAX_ELEMS)
    return xte_set_error(XTE_ERROR_SHAPE,
                         "M = %lld, K = %lld: past the tensor limits (2^40 per dimension, 2^50 "
                         "elements)",
                         (long long)M, (long long)K);
  XTE_TRY(xte_check_mode_recipe(mode, recipe));
  if ((unsigned)layout >= XTE_SCALE_LAYOUT_COUNT)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "layout %d is not an xte_scale_layout",
                         (int)layout);
  if (xte_recipe_is_mx(recipe) != (layout == XTE_SCALE_LAYOUT_MX_SWIZZLED) &&
      layout != XTE_SCALE_LAYOUT_COMPACT)
    return xte_set_error(XTE_ERROR_UNSUPPORTED,
                         "layout %d is not defined for recipe %d (MX recipes take COMPACT or "
                         "MX_SWIZZLED, others COMPACT, TE_GEMM or DEEPGEMM)",
                         (int)layout, (int)recipe);
  m->e8m0 = xte_recipe_is_mx(recipe);
  if (columnwise && xte_recipe_col_transposed(recipe)) {
    R = K;
    C = M;
  } else {
    R = M;
    C = K;
  }
  if (mode == XTE_SCALING_PER_TENSOR) {
    GR = GC = 1;
  } else if (mode == XTE_SCALING_BLOCK_128x128) {
    GR = cdiv(R, 128);
    GC = cdiv(C, 128);
  } else if (colblock) {
    GR = cdiv(M, B);
    GC = K;
  } else {
    GR = R;
    GC = cdiv(C, B);
  }
  m->grid_r = GR;
  m->grid_c = GC;
  m->kind = XTE_SMAP_LINEAR;
  if (mode == XTE_SCALING_PER_TENSOR || layout == XTE_SCALE_LAYOUT_COMPACT ||
      (layout == XTE_SCALE_LAYOUT_DEEPGEMM && (mode == XTE_SCALING_BLOCK_128x128 || colblock))) {
    *rows = GR;
    *cols = GC;
    m->sr = GC;
    m->sc = 1;
  } else if (layout == XTE_SCALE_LAYOUT_MX_SWIZZLED) {
    int64_t r = colblock ? GC : GR, c = colblock ? GR : GC;
    m->kind = XTE_SMAP_SWIZZLE;
    m->swap = colblock;
    over |= rup_overflows(r, 128, rows) | rup_overflows(c, 4, cols);
    m->tiles_c = *cols / 4;
  } else if (mode == XTE_SCALING_BLOCK_128x128 || colblock) { /* TE_GEMM row-major padded */
    *rows = GR;
    over |= rup_overflows(GC, 4, cols);
    m->sr = *cols;
    m->sc = 1;
  } else { /* TE_GEMM / DEEPGEMM 1xB: transposed, M padded to 4 */
    *rows = GC;
    over |= rup_overflows(GR, 4, cols);
    m->sr = 1;
    m->sc = *cols;
  }
  if (over || __builtin_mul_overflow(*rows, *cols, &m->total))
    return xte_set_error(XTE_ERROR_SHAPE, "M = %lld, K = %lld: the scale buffer's size overflows",
                         (long long)M, (long long)K);
  return XTE_SUCCESS;
}
