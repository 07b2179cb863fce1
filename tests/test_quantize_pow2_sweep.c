/* Power-of-two scales x every bf16 input, every ISA against the scalar path.
 *
 * The SIMD kernels take shortcuts when a block's scale is an exact power of two (TE
 * Float8BlockScaling with force_pow_2, DeepGEMM UE8M0, MXFP8): bf16 inputs are converted on
 * their 16-bit words, and fp32 inputs on bf16 words rounded to odd (the high half, its low bit
 * set when the low half is not zero). This sweep makes every scale exponent k reachable with bf16
 * input (amax = fp8_max * 2^-k, so scale = 2^k exactly) and puts, next to that amax, every finite
 * bf16 value whose magnitude does not exceed it (so it cannot change the amax), plus rows holding
 * a NaN. The fp32 sweep takes the same words as the high halves of fp32 values whose low halves
 * cycle through 0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF and pseudo-random ones (ties at the fp8
 * precision, just above and just below them, for every word). Each ISA's rowwise and columnwise
 * bytes and scales, both copies made together and the rowwise one alone (the row kernels), must
 * equal the scalar path's (which tests/test_quantize_recipes.c checks
 * against an independent oracle). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xte/xte.h>

#define K 128

static float bf16_value(uint16_t w) {
  uint32_t u = (uint32_t)w << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t bf16_of(float f) { /* exact for the values used here */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

/* Rows of K bf16: for each k, [+-amax_k, w...] with |w| <= amax_k, every finite w once. */
static uint16_t *build_input(float fp8_max, int64_t *rows_out) {
  int64_t cap = 0, M = 0, i;
  int k;
  uint16_t *x;
  for (k = -119; k <= 127; k++) cap += 65536 / (K - 1) + 2;
  cap += 64;
  x = (uint16_t *)calloc((size_t)(cap * K), sizeof(uint16_t));
  cr_assert_not_null(x);
  for (k = -119; k <= 127; k++) {
    float amax = ldexpf(fp8_max, -k);
    int64_t col = K;
    if (!(amax > 0.0f) || isinf(amax) || amax < ldexpf(1.0f, -133)) continue;
    for (i = 0; i < 65536; i++) {
      float v = bf16_value((uint16_t)i);
      if (!isfinite(v) || fabsf(v) > amax) continue;
      if (col == K) { /* new row led by the amax element, sign alternating */
        cr_assert_lt(M, cap);
        x[M * K] = bf16_of((M & 1) ? -amax : amax);
        M++;
        col = 1;
      }
      x[(M - 1) * K + col++] = (uint16_t)i;
    }
  }
  /* rows with NaNs (quiet and signalling, both signs) among ordinary values */
  for (i = 0; i < 32; i++) {
    int64_t j;
    cr_assert_lt(M, cap);
    for (j = 0; j < K; j++) x[M * K + j] = bf16_of(ldexpf((float)(j % 7) - 3.0f, (int)i - 16));
    x[M * K + (i * 37) % K] = (uint16_t)((i & 1 ? 0xFF80u : 0x7F80u) | (i & 2 ? 0x40u : 0x01u));
    M++;
  }
  *rows_out = M;
  return x;
}

typedef struct out {
  uint8_t *row, *col;
  void *srow, *scol;
  size_t srow_bytes, scol_bytes;
} out;

/* The fp32 input of the sweep: word w of x as the high half, a low half from the cycle above */
static uint32_t *widen(const uint16_t *x, int64_t n) {
  static const uint32_t lows[6] = {0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
  uint32_t *y = (uint32_t *)malloc((size_t)n * sizeof(uint32_t));
  uint64_t s = 0x9E3779B97F4A7C15ull;
  int64_t i;
  cr_assert_not_null(y);
  for (i = 0; i < n; i++) {
    uint32_t lo;
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    lo = i % 7 < 6 ? lows[i % 7] : (uint32_t)(s >> 48);
    y[i] = ((uint32_t)x[i] << 16) | (i % K == 0 ? 0u : lo); /* the amax elements stay exact */
  }
  return y;
}

/* both 0: the rowwise copy alone (the row kernels), 1: both copies (one read for both) */
static void run(const void *x, xte_dtype in_dtype, int64_t M, xte_recipe recipe,
                xte_scaling_mode mode, xte_scale_layout layout, xte_dtype fp8, int sat, int both,
                out *o) {
  xte_tensor in = xte_tensor_2d((void *)x, in_dtype, M, K);
  xte_qtensor q;
  xte_quant_config cfg = xte_quant_config_default();
  int64_t rr, rc, cr, cc;
  int mx = recipe == XTE_RECIPE_MX_TE || recipe == XTE_RECIPE_MX_OCP;
  size_t es = mx ? 1 : 4;
  int transposed = !mx;
  memset(&q, 0, sizeof q);
  cfg.saturate = sat;
  cr_assert_eq(xte_quantize_scale_shape(M, K, mode, recipe, layout, 0, &rr, &rc), XTE_SUCCESS);
  cr_assert_eq(xte_quantize_scale_shape(M, K, mode, recipe, layout, 1, &cr, &cc), XTE_SUCCESS);
  o->row = (uint8_t *)malloc((size_t)(M * K));
  o->col = (uint8_t *)malloc((size_t)(M * K));
  o->srow_bytes = (size_t)(rr * rc) * es;
  o->scol_bytes = (size_t)(cr * cc) * es;
  o->srow = malloc(o->srow_bytes);
  o->scol = malloc(o->scol_bytes);
  cr_assert(o->row && o->col && o->srow && o->scol);
  q.rowwise = xte_tensor_2d(o->row, fp8, M, K);
  q.columnwise = transposed ? xte_tensor_2d(o->col, fp8, K, M) : xte_tensor_2d(o->col, fp8, M, K);
  q.rowwise_scale_inv =
      (xte_scale_tensor){o->srow, mx ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32, rr, rc, layout};
  q.columnwise_scale_inv =
      (xte_scale_tensor){o->scol, mx ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32, cr, cc, layout};
  if (!both) {
    memset(&q.columnwise, 0, sizeof q.columnwise);
    memset(&q.columnwise_scale_inv, 0, sizeof q.columnwise_scale_inv);
    memset(o->col, 0, (size_t)(M * K));
    memset(o->scol, 0, o->scol_bytes);
  }
  q.scaling_mode = mode;
  q.recipe = recipe;
  cr_assert_eq(xte_quantize(&in, &q, &cfg, NULL), XTE_SUCCESS, "%s", xte_last_error());
}

static void release(out *o) {
  free(o->row);
  free(o->col);
  free(o->srow);
  free(o->scol);
}

static void sweep(xte_recipe recipe, xte_scaling_mode mode, xte_scale_layout layout,
                  xte_dtype in_dtype) {
  static const xte_cpu_isa isas[] = {XTE_CPU_ISA_AVX2, XTE_CPU_ISA_AVX512,
                                     XTE_CPU_ISA_AVX512_SIMDE};
  static const xte_dtype fmts[] = {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2};
  int f, sat, i, both, tested = 0;
  for (f = 0; f < 2; f++) {
    int64_t M;
    uint16_t *x = build_input(fmts[f] == XTE_DTYPE_E4M3 ? 448.0f : 57344.0f, &M);
    void *xin = in_dtype == XTE_DTYPE_FP32 ? (void *)widen(x, M * K) : (void *)x;
    cr_assert_gt(M, 10000, "the sweep built only %lld rows", (long long)M);
    cr_log_info("%s input, %s: %lld rows of %d", xte_dtype_name(in_dtype), xte_dtype_name(fmts[f]),
                (long long)M, K);
    for (sat = 0; sat < 4; sat++) {
      out ref, got;
      both = sat >> 1;
      cr_assert_eq(xte_cpu_set_isa(XTE_CPU_ISA_SCALAR), XTE_SUCCESS);
      run(xin, in_dtype, M, recipe, mode, layout, fmts[f], sat & 1, both, &ref);
      for (i = 0; i < 3; i++) {
        xte_status st = xte_cpu_set_isa(isas[i]);
        if (st == XTE_ERROR_UNSUPPORTED) {
          cr_log_info("%s: not runnable here, skipped", xte_cpu_isa_name(isas[i]));
          continue;
        }
        cr_assert_eq(st, XTE_SUCCESS);
        run(xin, in_dtype, M, recipe, mode, layout, fmts[f], sat & 1, both, &got);
        cr_expect_eq(memcmp(ref.row, got.row, (size_t)(M * K)), 0,
                     "rowwise bytes differ: %s, %s, saturate %d, both copies %d",
                     xte_cpu_isa_name(isas[i]), xte_dtype_name(fmts[f]), sat & 1, both);
        cr_expect_eq(memcmp(ref.col, got.col, (size_t)(M * K)), 0,
                     "columnwise bytes differ: %s, %s, saturate %d", xte_cpu_isa_name(isas[i]),
                     xte_dtype_name(fmts[f]), sat & 1);
        cr_expect_eq(memcmp(ref.srow, got.srow, ref.srow_bytes), 0, "rowwise scales differ: %s",
                     xte_cpu_isa_name(isas[i]));
        cr_expect_eq(memcmp(ref.scol, got.scol, ref.scol_bytes), 0, "columnwise scales differ: %s",
                     xte_cpu_isa_name(isas[i]));
        release(&got);
        tested++;
      }
      release(&ref);
    }
    if (xin != (void *)x) free(xin);
    free(x);
  }
  cr_assert_gt(tested, 0, "no SIMD ISA could run: nothing was compared");
  xte_cpu_set_isa(XTE_CPU_ISA_SCALAR);
}

Test(quantize_pow2_sweep, te_block_1x128) {
  sweep(XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128, XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_BF16);
}

Test(quantize_pow2_sweep, deepgemm_ue8m0_1x128) {
  sweep(XTE_RECIPE_DEEPGEMM_UE8M0, XTE_SCALING_BLOCK_1x128, XTE_SCALE_LAYOUT_COMPACT,
        XTE_DTYPE_BF16);
}

Test(quantize_pow2_sweep, te_block_128x128) {
  sweep(XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_128x128, XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_BF16);
}

Test(quantize_pow2_sweep, mx_te_1x32) {
  sweep(XTE_RECIPE_MX_TE, XTE_SCALING_MXFP8_1x32, XTE_SCALE_LAYOUT_MX_SWIZZLED, XTE_DTYPE_BF16);
}

Test(quantize_pow2_sweep, te_block_1x128_fp32) {
  sweep(XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128, XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_FP32);
}

Test(quantize_pow2_sweep, deepgemm_ue8m0_1x128_fp32) {
  sweep(XTE_RECIPE_DEEPGEMM_UE8M0, XTE_SCALING_BLOCK_1x128, XTE_SCALE_LAYOUT_COMPACT,
        XTE_DTYPE_FP32);
}

Test(quantize_pow2_sweep, te_block_128x128_fp32) {
  sweep(XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_128x128, XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_FP32);
}
