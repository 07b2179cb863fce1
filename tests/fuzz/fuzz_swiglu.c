/* Fuzz target: xte_swiglu, xte_dswiglu, xte_swiglu_quantize, xte_dswiglu_quantize. */
#include "fuzz_common.h"

static const xte_dtype k_act[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16};

/* The output qtensor of a fused call: 1x128 recipes mostly, rowwise and / or columnwise. */
static void make_out(fz *f, xte_qtensor *q, int64_t T, int64_t F) {
  xte_scaling_mode mode;
  xte_recipe recipe;
  xte_scale_layout layout;
  unsigned want = fz_u8(f) % 4;
  fz_recipe(f, &mode, &recipe, &layout, fz_rare(f, 32) ? 0 : 1);
  if (layout == XTE_SCALE_LAYOUT_MX_SWIZZLED) layout = XTE_SCALE_LAYOUT_COMPACT;
  fz_qtensor(f, q, T, F, mode, recipe, layout, want, want, 1, "out");
  if (fz_rare(f, 32)) q->amax = (float *)fz_alloc(f, 4, fz_misalign(f), 1, "amax");
}

static void make_cfg(fz *f, xte_quant_config *c) {
  *c = xte_quant_config_default();
  if (fz_u8(f) & 1) {
    c->amax_epsilon = (fz_u8(f) & 1) ? fz_f32(f) : 0.0f;
    c->force_pow_2 = fz_flag(f);
    c->saturate = fz_flag(f);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  int64_t T, F, F2;
  xte_tensor in, out, go, gi;
  xte_qtensor q;
  xte_quant_config cfg;
  xte_dtype act;
  xte_status st;
  uint8_t op;
  fz_begin(&f, data, size);
  fz_pick_isa(&f);
  op = fz_u8(&f) % 4;
  T = fz_dim(&f, 40);
  F = fz_dim(&f, 300);
  F2 = F >= 0 && F < ((int64_t)1 << 61) ? 2 * F : F;
  if (fz_rare(&f, 16)) F2 = fz_wadd(F2, 1); /* odd input width */
  if (T < 0 || F < 0) fz_mark_impossible("negative T or F");
  switch (op) {
    case 0:
      fz_tensor2(&f, &in, fz_dtype(&f, k_act, 2), T, F2, 0, 1, "input");
      fz_tensor2(&f, &out, fz_dtype(&f, k_act, 2), T, F, 1, 1, "out");
      if (fz_g.skip) break;
      st = xte_swiglu(&in, &out, fz_pick_stream(&f));
      fz_check(st, "swiglu");
      break;
    case 1:
      fz_tensor2(&f, &go, fz_dtype(&f, k_act, 2), T, F, 0, 1, "grad_out");
      fz_tensor2(&f, &in, fz_dtype(&f, k_act, 2), T, F2, 0, 1, "input");
      fz_tensor2(&f, &gi, fz_dtype(&f, k_act, 2), T, F2, 1, 1, "grad_input");
      if (fz_g.skip) break;
      st = xte_dswiglu(&go, &in, &gi, fz_pick_stream(&f));
      fz_check(st, "dswiglu");
      break;
    case 2:
      act = fz_dtype(&f, k_act, 2);
      fz_tensor2(&f, &in, fz_dtype(&f, k_act, 2), T, F2, 0, 1, "input");
      make_out(&f, &q, T, F);
      make_cfg(&f, &cfg);
      if (fz_g.skip) break;
      st = xte_swiglu_quantize(&in, act, &q, (fz_u8(&f) & 7) ? &cfg : NULL, fz_pick_stream(&f));
      fz_check(st, "swiglu_quantize");
      break;
    default:
      act = fz_dtype(&f, k_act, 2);
      fz_tensor2(&f, &go, fz_dtype(&f, k_act, 2), T, F, 0, 1, "grad_out");
      fz_tensor2(&f, &in, fz_dtype(&f, k_act, 2), T, F2, 0, 1, "input");
      make_out(&f, &q, T, F2);
      make_cfg(&f, &cfg);
      if (fz_g.skip) break;
      st = xte_dswiglu_quantize(&go, &in, act, &q, (fz_u8(&f) & 7) ? &cfg : NULL,
                                fz_pick_stream(&f));
      fz_check(st, "dswiglu_quantize");
      break;
  }
  fz_end();
  return 0;
}
