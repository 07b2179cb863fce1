/* xte quantization: block-scaled FP8 casts with named recipes. Semantics: docs/numerics.md. */
#ifndef XTE_QUANTIZE_H
#define XTE_QUANTIZE_H

#include "xte/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum xte_scaling_mode {
  XTE_SCALING_PER_TENSOR = 0,    /* one scale for the whole tensor */
  XTE_SCALING_BLOCK_1x128 = 1,   /* rowwise 1x128 (columnwise copy 128x1), activations/grads */
  XTE_SCALING_BLOCK_128x128 = 2, /* 128x128 tiles, weights */
  XTE_SCALING_MXFP8_1x32 = 3,    /* rowwise 1x32 (columnwise 32x1) with E8M0 scales */
  XTE_SCALING_COUNT
} xte_scaling_mode;

/* The recipe names the exact arithmetic; it is never implied by the mode. */
typedef enum xte_recipe {
  XTE_RECIPE_TE_CURRENT = 0,     /* per-tensor current scaling: scale = fp8_max / amax(tensor) */
  XTE_RECIPE_TE_DELAYED = 1,     /* per-tensor delayed scaling: scale given in xte_qtensor.scale */
  XTE_RECIPE_TE_BLOCK = 2,       /* TransformerEngine Float8BlockScaling (1x128, 128x128) */
  XTE_RECIPE_DEEPGEMM = 3,       /* DeepGEMM per_token / per_block cast (1x128, 128x128) */
  XTE_RECIPE_DEEPGEMM_UE8M0 = 4, /* same, scale rounded up to a power of two */
  XTE_RECIPE_MTFP8 = 5,          /* MT-TransformerEngine MTFP8 block scaling (1x128, 128x128) */
  XTE_RECIPE_MX_TE = 6,          /* MXFP8 as TE / cuBLAS (E8M0 rounded up) */
  XTE_RECIPE_MX_OCP = 7,         /* MXFP8 as the OCP MX reference (floor(log2 amax) - emax) */
  XTE_RECIPE_COUNT
} xte_recipe;

/* Where each block's scale_inv sits in the scale buffer. A copy's blocks form a logical grid
 * [GR, GC]: rowwise 1xB blocks of an [R, C] copy give [R, ceil(C/B)]; 128x128 blocks give
 * [ceil(R/128), ceil(C/128)]; the columnwise copies of MTFP8 / MXFP8 (not transposed, blocks Bx1
 * over [M, K]) give [ceil(M/B), K]; per-tensor [1, 1].
 *  COMPACT     row-major [GR, GC].
 *  TE_GEMM     TE's GEMM-ready layout: 1xB blocks -> [GC, roundup(GR,4)] (transposed);
 *              128x128 -> [GR, roundup(GC,4)]; Bx1 columnwise -> [GR, roundup(GC,4)].
 *  DEEPGEMM    1x128 LHS: [GC, roundup(GR,4)] (MN-major); 128x128 RHS: [GR, GC] row-major;
 *              the non-transposed Bx1 columnwise copies (MTFP8): compact [GR, GC].
 *  MX_SWIZZLED cuBLAS 128x4 tiles (E8M0, MX recipes only) over the rowwise grid, or over the
 *              transposed grid [K, ceil(M/32)] for the columnwise copy; padded with zeros to
 *              [roundup(rows,128), roundup(cols,4)].
 * Padding entries of a layout are written as zero. */
typedef enum xte_scale_layout {
  XTE_SCALE_LAYOUT_COMPACT = 0,
  XTE_SCALE_LAYOUT_TE_GEMM = 1,
  XTE_SCALE_LAYOUT_DEEPGEMM = 2,
  XTE_SCALE_LAYOUT_MX_SWIZZLED = 3,
  XTE_SCALE_LAYOUT_COUNT
} xte_scale_layout;

/* A scale buffer: fp32 (E8M0 for MX) of shape [rows, cols] as xte_quantize_scale_shape gives. */
typedef struct xte_scale_tensor {
  void *data;
  xte_dtype dtype;
  int64_t rows, cols;
  xte_scale_layout layout;
} xte_scale_tensor;

/* A quantized tensor, as TransformerEngine carries one: rowwise data [M, K] with its scales and
 * optionally the columnwise copy with its own scales. For per-tensor, 1x128, 128x128 and the
 * DeepGEMM recipes the columnwise copy is the transpose [K, M] quantized along M; for MTFP8 and
 * MXFP8 it keeps the shape [M, K] and is quantized in 128x1 / 32x1 blocks.
 * A copy whose data pointer is NULL is not produced. */
typedef struct xte_qtensor {
  xte_tensor rowwise;
  xte_scale_tensor rowwise_scale_inv;
  xte_tensor columnwise;
  xte_scale_tensor columnwise_scale_inv;
  xte_scaling_mode scaling_mode;
  xte_recipe recipe;
  /* optional output: max |x| of the whole input (fmaxf: NaN never wins). Lives on the
   * stream's backend (a device pointer on a GPU stream); 4-byte aligned, as scale. */
  float *amax;
  /* per-tensor only. TE_DELAYED: the input scale, read on the HOST before the launch.
   * TE_CURRENT: optional output of the scale used, on the stream's backend. */
  float *scale;
} xte_qtensor;

typedef struct xte_quant_config {
  size_t struct_size; /* sizeof(xte_quant_config) (xte_quant_config_default sets it) */
  float amax_epsilon; /* TE recipes: amax is raised to at least this (default 0) */
  /* TE_BLOCK and TE_CURRENT: round scales down to powers of two (1) or not (0); -1 (default):
   * the recipe's TransformerEngine default, 1 for TE_BLOCK (Float8BlockScaling), 0 for
   * TE_CURRENT (Float8CurrentScaling). Other recipes ignore it. */
  int force_pow_2;
  int saturate; /* 1 (default, as TE): overflow -> +-max; 0: NaN (e4m3) / inf (e5m2) */
} xte_quant_config;

XTE_API xte_quant_config xte_quant_config_default(void);

/* Shape of the scale buffer for an [M, K] input: the rowwise one (columnwise = 0) or the
 * columnwise copy's (columnwise = 1). fp32 for all recipes but the MX ones (E8M0, one byte).
 * M and K within the tensor limits (each <= 2^40, M * K <= 2^50), else XTE_ERROR_SHAPE. */
XTE_API xte_status xte_quantize_scale_shape(int64_t M, int64_t K, xte_scaling_mode mode,
                                            xte_recipe recipe, xte_scale_layout layout,
                                            int columnwise, int64_t *rows, int64_t *cols);

/* Quantizes input (fp32 / bf16 / fp16, 2-D view [M, K]) into out's rowwise and/or columnwise
 * copies (e4m3 or e5m2) in one pass. On error nothing is written. */
XTE_API xte_status xte_quantize(const xte_tensor *input, xte_qtensor *out,
                                const xte_quant_config *config, xte_stream stream);

/* Dequantizes the rowwise copy (columnwise = 0) or the columnwise copy into out (fp32 / bf16 /
 * fp16) of the copy's shape: the fp32 product fp8_value * scale_inv of its block (RNE), then
 * converted RNE to out's dtype (two roundings for bf16 / fp16 output). */
XTE_API xte_status xte_dequantize(const xte_qtensor *input, int columnwise, xte_tensor *out,
                                  xte_stream stream);

/* Elementwise cast between fp32 / bf16 / fp16 / e4m3 / e5m2 / e8m0 (no scaling): RNE; to fp8 with
 * the given saturation rule. E8M0 decodes to 2^(e-127) (0xFF: NaN) and encodes as ml_dtypes'
 * float8_e8m0fnu: the nearest power of two, ties up; zero, negatives and NaN -> 0xFF; past 2^127
 * and +inf -> 0xFE when saturating, else 0xFF (docs/numerics.md, section 3). Shapes must hold the
 * same number of elements (dense). */
XTE_API xte_status xte_cast(const xte_tensor *input, xte_tensor *out, int saturate,
                            xte_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* XTE_QUANTIZE_H */
