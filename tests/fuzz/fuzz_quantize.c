/* Fuzz target: xte_quantize_scale_shape, xte_quantize, xte_dequantize, xte_cast. */
#include "fuzz_common.h"

static const xte_dtype k_hp[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
static const xte_dtype k_cast[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16,
                                   XTE_DTYPE_E4M3, XTE_DTYPE_E5M2, XTE_DTYPE_E8M0};

static void do_scale_shape(fz *f) {
  int64_t M = fz_dim(f, 600), K = fz_dim(f, 600);
  xte_scaling_mode mode;
  xte_recipe recipe;
  xte_scale_layout layout;
  int cw = fz_flag(f);
  int64_t *out;
  xte_status st;
  fz_recipe(f, &mode, &recipe, &layout, 0);
  out = (int64_t *)fz_alloc(f, 16, 0, 1, "rows/cols");
  if (M < 0 || K < 0) fz_mark_impossible("negative M or K");
  if (cw != 0 && cw != 1) fz_mark_impossible("columnwise not 0 or 1");
  if ((unsigned)mode >= XTE_SCALING_COUNT || (unsigned)recipe >= XTE_RECIPE_COUNT ||
      (unsigned)layout >= XTE_SCALE_LAYOUT_COUNT)
    fz_mark_impossible("enum out of range");
  st = xte_quantize_scale_shape(M, K, mode, recipe, layout, cw, fz_rare(f, 4) ? NULL : &out[0],
                                fz_rare(f, 4) ? NULL : &out[1]);
  fz_check(st, "quantize_scale_shape");
  if (st == XTE_SUCCESS) {
    int64_t n;
    if (out[0] < 0 || out[1] < 0) fz_fail("negative scale shape", "quantize_scale_shape", st);
    if (__builtin_mul_overflow(out[0], out[1], &n) || __builtin_mul_overflow(n, 4, &n))
      fz_fail("scale shape whose byte size overflows", "quantize_scale_shape", st);
  }
}

static void do_quantize(fz *f) {
  int64_t M = fz_dim(f, 300), K = fz_dim(f, 300);
  xte_scaling_mode mode;
  xte_recipe recipe;
  xte_scale_layout layout;
  xte_tensor in;
  xte_qtensor q;
  xte_quant_config cfg = xte_quant_config_default();
  unsigned want = fz_u8(f) % 4;
  xte_status st;
  fz_recipe(f, &mode, &recipe, &layout, 0);
  fz_tensor2(f, &in, fz_dtype(f, k_hp, 3), M, K, 0, 1, "input");
  if (fz_rare(f, 16)) want |= 4; /* a mismatched output shape */
  fz_qtensor(f, &q, (want & 4) ? fz_wadd(M, 1) : M, K, mode, recipe, layout, want & 3, want & 3, 1,
             "out");
  if (fz_u8(f) & 1) q.amax = (float *)fz_alloc(f, 4, fz_misalign(f), 1, "amax");
  if (recipe == XTE_RECIPE_TE_DELAYED && !fz_rare(f, 8)) {
    q.scale = (float *)fz_alloc(f, 4, fz_misalign(f), 0, "scale (input)");
  } else if (recipe == XTE_RECIPE_TE_CURRENT && (fz_u8(f) & 1)) {
    q.scale = (float *)fz_alloc(f, 4, fz_misalign(f), 1, "scale (output)");
  }
  if (fz_u8(f) & 1) {
    cfg.amax_epsilon = (fz_u8(f) & 1) ? fz_f32(f) : 0.0f;
    cfg.force_pow_2 = fz_flag(f);
    cfg.saturate = fz_flag(f);
  }
  if (fz_g.skip) return;
  st = xte_quantize(fz_rare(f, 2) ? NULL : &in, &q, fz_rare(f, 2) ? NULL : &cfg, fz_pick_stream(f));
  fz_check(st, "quantize");
}

static void do_dequantize(fz *f) {
  int64_t M = fz_dim(f, 300), K = fz_dim(f, 300);
  xte_scaling_mode mode;
  xte_recipe recipe;
  xte_scale_layout layout;
  xte_qtensor q;
  xte_tensor out;
  int cw = fz_flag(f);
  int tr;
  unsigned want = 1u + fz_u8(f) % 3;
  xte_status st;
  fz_recipe(f, &mode, &recipe, &layout, 0);
  fz_qtensor(f, &q, M, K, mode, recipe, layout, want, cw == 0 ? 1u : cw == 1 ? 2u : 0u, 0, "input");
  if (recipe == XTE_RECIPE_TE_DELAYED || recipe == XTE_RECIPE_TE_CURRENT)
    if (fz_u8(f) & 1) q.scale = (float *)fz_alloc(f, 4, 0, 0, "input.scale");
  tr = cw == 1 && fz_col_transposed(recipe);
  fz_tensor2(f, &out, fz_dtype(f, k_hp, 3), tr ? K : M, tr ? M : K, 1, 1, "out");
  if (fz_g.skip) return;
  st = xte_dequantize(&q, cw, &out, fz_pick_stream(f));
  fz_check(st, "dequantize");
}

static void do_cast(fz *f) {
  int64_t M = fz_dim(f, 400), K = fz_dim(f, 400);
  xte_tensor in, out;
  int sat = fz_flag(f);
  xte_status st;
  fz_tensor2(f, &in, fz_dtype(f, k_cast, 6), M, K, 0, 1, "input");
  if (fz_rare(f, 32)) K = fz_wadd(K, 1);
  if (fz_u8(f) & 1 && M % 2 == 0)
    fz_tensor2(f, &out, fz_dtype(f, k_cast, 6), M / 2, fz_wmul(K, 2), 1, 1, "out");
  else
    fz_tensor2(f, &out, fz_dtype(f, k_cast, 6), M, K, 1, 1, "out");
  if (fz_g.skip) return;
  st = xte_cast(&in, &out, sat, fz_pick_stream(f));
  fz_check(st, "cast");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  fz_begin(&f, data, size);
  fz_pick_isa(&f);
  switch (fz_u8(&f) % 4) {
    case 0:
      do_scale_shape(&f);
      break;
    case 1:
      do_quantize(&f);
      break;
    case 2:
      do_dequantize(&f);
      break;
    default:
      do_cast(&f);
      break;
  }
  fz_end();
  return 0;
}
