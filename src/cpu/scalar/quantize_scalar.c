/* Scalar CPU kernels: the reference path, straight calls into the shared numerics header. */
#include "cpu/xte_cpu.h"
#include "numerics/xte_numerics.h"

static void load_f32(const void *src, int in_kind, int64_t n, float *dst) {
  int64_t i;
  if (in_kind == XTE_NUM_IN_F32) {
    const float *s = (const float *)src;
    for (i = 0; i < n; i++) dst[i] = s[i];
  } else if (in_kind == XTE_NUM_IN_BF16) {
    const uint16_t *s = (const uint16_t *)src;
    for (i = 0; i < n; i++) dst[i] = xte_bf16_to_f32(s[i]);
  } else {
    const uint16_t *s = (const uint16_t *)src;
    for (i = 0; i < n; i++) dst[i] = xte_fp16_to_f32(s[i]);
  }
}

static float amax(const float *x, int64_t n) {
  float m = 0.0f;
  int64_t i;
  for (i = 0; i < n; i++) m = xte_amax_update(m, x[i]);
  return m;
}

static void amax_cols(const float *x, int64_t rows, int64_t cols, int64_t ld, float *acc) {
  int64_t r, c;
  for (r = 0; r < rows; r++)
    for (c = 0; c < cols; c++) acc[c] = xte_amax_update(acc[c], x[r * ld + c]);
}

static void quant(const float *x, int64_t n, float scale, int fmt, int sat, uint8_t *q) {
  int64_t i;
  for (i = 0; i < n; i++) q[i] = xte_f32_to_fp8(xte_mul_nanprop(x[i], scale), fmt, sat);
}

static void quant_vs(const float *x, int64_t n, const float *scale, int fmt, int sat, uint8_t *q) {
  int64_t i;
  for (i = 0; i < n; i++) q[i] = xte_f32_to_fp8(xte_mul_nanprop(x[i], scale[i]), fmt, sat);
}

static void cast_fp8(const float *x, int64_t n, int fmt, int sat, uint8_t *q) {
  int64_t i;
  for (i = 0; i < n; i++) q[i] = xte_f32_to_fp8(x[i], fmt, sat);
}

static void cast_bf16(const float *x, int64_t n, uint16_t *y) {
  int64_t i;
  for (i = 0; i < n; i++) y[i] = xte_f32_to_bf16(x[i]);
}

static void cast_fp16(const float *x, int64_t n, uint16_t *y) {
  int64_t i;
  for (i = 0; i < n; i++) y[i] = xte_f32_to_fp16(x[i]);
}

static void transpose_u8(const uint8_t *src, int64_t rows, int64_t cols, int64_t lds, uint8_t *dst,
                         int64_t ldd) {
  int64_t r, c;
  for (r = 0; r < rows; r++)
    for (c = 0; c < cols; c++) dst[c * ldd + r] = src[r * lds + c];
}

static float ld1(const void *src, int in_kind, int64_t i) {
  if (in_kind == XTE_NUM_IN_F32) return ((const float *)src)[i];
  if (in_kind == XTE_NUM_IN_BF16) return xte_bf16_to_f32(((const uint16_t *)src)[i]);
  return xte_fp16_to_f32(((const uint16_t *)src)[i]);
}

#define ROW(p, r, ld, es) ((const char *)(p) + (size_t)(r) * (size_t)(ld) * (es))

static float load_amax(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                       float *acc) {
  const size_t es = in_kind == XTE_NUM_IN_F32 ? 4 : 2;
  float m = 0.0f;
  int64_t r, i;
  for (r = 0; r < rows; r++)
    for (i = 0; i < n; i++) {
      float x = ld1(ROW(src, r, lds, es), in_kind, i);
      m = xte_amax_update(m, x);
      if (acc) acc[i] = xte_amax_update(acc[i], x);
    }
  return m;
}

static float load_quant(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                        float scale, int fmt, int sat, uint8_t *q, int64_t ldq, int nt) {
  const size_t es = in_kind == XTE_NUM_IN_F32 ? 4 : 2;
  float m = 0.0f;
  int64_t r, i;
  (void)nt;
  for (r = 0; r < rows; r++)
    for (i = 0; i < n; i++) {
      float x = ld1(ROW(src, r, lds, es), in_kind, i);
      m = xte_amax_update(m, x);
      q[r * ldq + i] = xte_f32_to_fp8(xte_mul_nanprop(x, scale), fmt, sat);
    }
  return m;
}

static void load_quant_vs(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                          const float *scale, int fmt, int sat, uint8_t *q, int64_t ldq, int nt) {
  const size_t es = in_kind == XTE_NUM_IN_F32 ? 4 : 2;
  int64_t r, i;
  (void)nt;
  for (r = 0; r < rows; r++)
    for (i = 0; i < n; i++)
      q[r * ldq + i] = xte_f32_to_fp8(
          xte_mul_nanprop(ld1(ROW(src, r, lds, es), in_kind, i), scale[i]), fmt, sat);
}

#include "cpu/quantize_blocks_each.h"

static void block_scales(const xte_quant_args *a, const float *amax, int64_t n,
                         xte_block_scale *s) {
  int64_t i;
  for (i = 0; i < n; i++) s[i] = xte_quant_block_scale(a, amax[i]);
}

static void copy_u8(uint8_t *dst, const uint8_t *src, int64_t n, int nt) {
  int64_t i;
  (void)nt;
  for (i = 0; i < n; i++) dst[i] = src[i];
}

static void store_fence(void) {}

const xte_quant_kernels xte_quant_kernels_scalar = {XTE_CPU_ISA_SCALAR,
                                                    load_f32,
                                                    amax,
                                                    amax_cols,
                                                    quant,
                                                    quant_vs,
                                                    cast_fp8,
                                                    cast_bf16,
                                                    cast_fp16,
                                                    transpose_u8,
                                                    load_amax,
                                                    load_quant,
                                                    load_quant_vs,
                                                    quant_blocks_each,
                                                    block_scales,
                                                    copy_u8,
                                                    store_fence,
                                                    NULL,
                                                    NULL,
                                                    NULL,
                                                    NULL};
