/* The quantized-output checks shared by every entry point that quantizes (xte_quantize, the
 * fused SwiGLU quantize): the quantize config's default and the resolution of an output
 * xte_qtensor into the kernels' xte_quant_args (src/core/quant.h). */
#include "core/quant.h"

#include <math.h>
#include <string.h>

#include "core/config.h"
#include "core/scale.h"
#include "core/tensor.h"
#include "xte_internal.h"

xte_quant_config xte_quant_config_default(void) {
  xte_quant_config c;
  memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.amax_epsilon = 0.0f;
  c.force_pow_2 = -1;
  c.saturate = 1;
  return c;
}

/* Checks one output copy (data + scales) of a quantize, resolving its scale map. */
static xte_status check_copy(const xte_tensor *t, const xte_scale_tensor *s, const char *name,
                             const char *sname, int64_t want_r, int64_t want_c, int64_t M,
                             int64_t K, const xte_qtensor *out, int columnwise, int64_t *ld,
                             xte_scale_map *map) {
  int64_t r, c, need_r, need_c, have;
  xte_dtype want_s;
  XTE_TRY(xte_tensor_view2d(t, name, &r, &c, ld));
  if (t->dtype != XTE_DTYPE_E4M3 && t->dtype != XTE_DTYPE_E5M2)
    return xte_set_error(XTE_ERROR_DTYPE, "%s->dtype is %s: want e4m3 or e5m2", name,
                         xte_dtype_name(t->dtype));
  if (r != want_r || c != want_c)
    return xte_set_error(XTE_ERROR_SHAPE, "%s is [%lld, %lld]: want [%lld, %lld]", name,
                         (long long)r, (long long)c, (long long)want_r, (long long)want_c);
  XTE_TRY(xte_scale_geom(M, K, out->scaling_mode, out->recipe, s->layout, columnwise, map, &need_r,
                         &need_c));
  if (s->data == NULL) return xte_set_error(XTE_ERROR_NULL_POINTER, "%s.data is NULL", sname);
  want_s = xte_recipe_is_mx(out->recipe) ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
  if (s->dtype != want_s)
    return xte_set_error(XTE_ERROR_DTYPE, "%s.dtype is %s: recipe %d stores %s", sname,
                         xte_dtype_name(s->dtype), (int)out->recipe, xte_dtype_name(want_s));
  if (want_s == XTE_DTYPE_FP32 && ((uintptr_t)s->data % 4) != 0)
    return xte_set_error(XTE_ERROR_ALIGNMENT, "%s.data is not 4-byte aligned", sname);
  /* a product past int64 holds more than any layout needs (the shape check below fails) */
  if (s->rows < 0 || s->cols < 0 ||
      (!__builtin_mul_overflow(s->rows, s->cols, &have) && have < map->total))
    return xte_set_error(XTE_ERROR_BUFFER_TOO_SMALL, "%s is [%lld, %lld]: need [%lld, %lld]", sname,
                         (long long)s->rows, (long long)s->cols, (long long)need_r,
                         (long long)need_c);
  if (s->rows != need_r || s->cols != need_c)
    return xte_set_error(XTE_ERROR_SHAPE, "%s is [%lld, %lld]: want [%lld, %lld]", sname,
                         (long long)s->rows, (long long)s->cols, (long long)need_r,
                         (long long)need_c);
  map->data = s->data;
  return XTE_SUCCESS;
}

xte_status xte_quant_prepare(int64_t M, int64_t K, int in_kind, xte_qtensor *out,
                             const xte_quant_config *config, xte_quant_args *a) {
  const xte_quant_config def = xte_quant_config_default();
  xte_quant_config cfg;
  xte_dtype qdt = XTE_DTYPE_COUNT;
  memset(a, 0, sizeof *a);
  XTE_CHECK_PTR(out, "out");
  XTE_TRY(xte_config_read(config, "config", XTE_CONFIG_END(xte_quant_config, saturate), sizeof cfg,
                          &def, &cfg));
  XTE_TRY(xte_check_mode_recipe(out->scaling_mode, out->recipe));
  if (!out->rowwise.data && !out->columnwise.data)
    return xte_set_error(XTE_ERROR_NULL_POINTER,
                         "out->rowwise.data and out->columnwise.data are both NULL");
  if (!(cfg.amax_epsilon >= 0.0f) || isinf(cfg.amax_epsilon))
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->amax_epsilon must be finite, >= 0");
  if (cfg.saturate != 0 && cfg.saturate != 1)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->saturate must be 0 or 1");
  if (cfg.force_pow_2 < -1 || cfg.force_pow_2 > 1)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "config->force_pow_2 = %d: must be -1 (the recipe's default), 0 or 1",
                         cfg.force_pow_2);
  if (out->amax && ((uintptr_t)out->amax % 4) != 0)
    return xte_set_error(XTE_ERROR_ALIGNMENT, "out->amax is not 4-byte aligned");
  if ((out->recipe == XTE_RECIPE_TE_DELAYED || out->recipe == XTE_RECIPE_TE_CURRENT) &&
      out->scale && ((uintptr_t)out->scale % 4) != 0)
    return xte_set_error(XTE_ERROR_ALIGNMENT, "out->scale is not 4-byte aligned");
  if (out->recipe == XTE_RECIPE_TE_DELAYED) {
    if (!out->scale)
      return xte_set_error(XTE_ERROR_NULL_POINTER, "out->scale is NULL (delayed scaling needs it)");
    if (!(*out->scale > 0.0f) || isinf(*out->scale))
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "*out->scale = %g: want finite and > 0",
                           (double)*out->scale);
    a->given_scale = *out->scale;
  }
  if (out->rowwise.data) {
    XTE_TRY(check_copy(&out->rowwise, &out->rowwise_scale_inv, "out->rowwise",
                       "out->rowwise_scale_inv", M, K, M, K, out, 0, &a->ld_row_q, &a->row_s));
    a->row_q = (uint8_t *)out->rowwise.data;
    qdt = out->rowwise.dtype;
  }
  if (out->columnwise.data) {
    int tr = xte_recipe_col_transposed(out->recipe);
    XTE_TRY(check_copy(&out->columnwise, &out->columnwise_scale_inv, "out->columnwise",
                       "out->columnwise_scale_inv", tr ? K : M, tr ? M : K, M, K, out, 1,
                       &a->ld_col_q, &a->col_s));
    if (qdt != XTE_DTYPE_COUNT && qdt != out->columnwise.dtype)
      return xte_set_error(XTE_ERROR_DTYPE,
                           "out->columnwise->dtype (%s) differs from out->rowwise (%s)",
                           xte_dtype_name(out->columnwise.dtype), xte_dtype_name(qdt));
    a->col_q = (uint8_t *)out->columnwise.data;
    a->col_transposed = tr;
    qdt = out->columnwise.dtype;
  }
  a->in_kind = in_kind;
  a->M = M;
  a->K = K;
  a->fmt = xte_fp8_fmt(qdt);
  a->saturate = cfg.saturate;
  a->mode = (int)out->scaling_mode;
  a->recipe = (int)out->recipe;
  a->eps = cfg.amax_epsilon;
  /* -1: TE's default for the recipe: Float8BlockScaling rounds to powers of two,
   * Float8CurrentScaling does not */
  a->force_pow_2 = cfg.force_pow_2 >= 0 ? cfg.force_pow_2 : out->recipe == XTE_RECIPE_TE_BLOCK;
  a->square = out->scaling_mode == XTE_SCALING_BLOCK_128x128;
  a->row_bw = out->scaling_mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  a->col_bh = a->row_bw;
  a->amax_out = out->amax;
  a->scale_out = out->recipe == XTE_RECIPE_TE_CURRENT ? out->scale : NULL;
  return XTE_SUCCESS;
}
