/* Operand pairs of the GEMM fuzz targets. */
#ifndef XTE_FUZZ_GEMM_COMMON_H
#define XTE_FUZZ_GEMM_COMMON_H

#include "fuzz_common.h"

static const xte_dtype fzg_out_dtypes[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16};

typedef struct fzg_pair {
  xte_scaling_mode ma, mb;
  xte_recipe ra, rb;
  xte_scale_layout la, lb;
} fzg_pair;

static FZ_UNUSED xte_recipe fzg_recipe_for(fz *f, xte_scaling_mode m) {
  static const xte_recipe blk[] = {XTE_RECIPE_TE_BLOCK, XTE_RECIPE_DEEPGEMM,
                                   XTE_RECIPE_DEEPGEMM_UE8M0, XTE_RECIPE_MTFP8};
  switch (m) {
    case XTE_SCALING_PER_TENSOR:
      return (fz_u8(f) & 1) ? XTE_RECIPE_TE_CURRENT : XTE_RECIPE_TE_DELAYED;
    case XTE_SCALING_MXFP8_1x32:
      return (fz_u8(f) & 1) ? XTE_RECIPE_MX_TE : XTE_RECIPE_MX_OCP;
    default:
      return blk[fz_u8(f) & 3];
  }
}

static FZ_UNUSED xte_scale_layout fzg_layout_for(fz *f, xte_recipe r) {
  if (r == XTE_RECIPE_MX_TE || r == XTE_RECIPE_MX_OCP)
    return (fz_u8(f) & 1) ? XTE_SCALE_LAYOUT_MX_SWIZZLED : XTE_SCALE_LAYOUT_COMPACT;
  return (xte_scale_layout)(fz_u8(f) % 3);
}

/* A supported pair mostly (1x128 x 128x128, 128x128 x 1x128, 1x128 x 1x128, per-tensor pair,
 * MXFP8 pair), sometimes anything. */
static FZ_UNUSED void fzg_pick_pair(fz *f, fzg_pair *p) {
  static const xte_scaling_mode pairs[][2] = {
      {XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_128x128},
      {XTE_SCALING_BLOCK_128x128, XTE_SCALING_BLOCK_1x128},
      {XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_1x128},
      {XTE_SCALING_PER_TENSOR, XTE_SCALING_PER_TENSOR},
      {XTE_SCALING_MXFP8_1x32, XTE_SCALING_MXFP8_1x32},
  };
  uint8_t b = fz_u8(f);
  if (b < 230) {
    int i = fz_u8(f) % 5;
    p->ma = pairs[i][0];
    p->mb = pairs[i][1];
  } else {
    p->ma = (xte_scaling_mode)fz_enum(f, XTE_SCALING_COUNT);
    p->mb = (xte_scaling_mode)fz_enum(f, XTE_SCALING_COUNT);
  }
  p->ra = fzg_recipe_for(f, p->ma);
  p->rb = fzg_recipe_for(f, p->mb);
  if (fz_rare(f, 8)) p->ra = (xte_recipe)fz_enum(f, XTE_RECIPE_COUNT);
  p->la = fzg_layout_for(f, p->ra);
  p->lb = fzg_layout_for(f, p->rb);
}

/* Per-tensor operands may carry the scale pointer too (ignored by the GEMM). */
static FZ_UNUSED void fzg_per_tensor_scale(fz *f, xte_qtensor *q) {
  if (q->scaling_mode == XTE_SCALING_PER_TENSOR && (fz_u8(f) & 1))
    q->scale = (float *)fz_alloc(f, 4, 0, 0, "scale");
}

#endif /* XTE_FUZZ_GEMM_COMMON_H */
