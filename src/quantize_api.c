/* Entry points of quantization: argument checks, scale-layout resolution, dispatch. Nothing is
 * written to any output before every check has passed. */
#include <math.h>
#include <string.h>

#include "xte_internal.h"

/* ceil(a / b) for a >= 0, b > 0: cannot overflow */
static int64_t cdiv(int64_t a, int64_t b) {
  return a / b + (a % b != 0);
}
/* a rounded up to a multiple of b (a >= 0, b > 0) into *r; 1 when that overflows int64 */
static int rup_overflows(int64_t a, int64_t b, int64_t *r) {
  return __builtin_mul_overflow(cdiv(a, b), b, r);
}

/* The largest tensor dimension and element count (as xte_tensor_view2d) */
#define MAX_DIM ((int64_t)1 << 40)
#define MAX_ELEMS ((int64_t)1 << 50)

xte_quant_config xte_quant_config_default(void) {
  xte_quant_config c;
  c.amax_epsilon = 0.0f;
  c.force_pow_2 = -1;
  c.saturate = 1;
  return c;
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

static xte_status check_mode_recipe(xte_scaling_mode mode, xte_recipe recipe) {
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
  if (M > MAX_DIM || K > MAX_DIM || __builtin_mul_overflow(M, K, &mk) || mk > MAX_ELEMS)
    return xte_set_error(XTE_ERROR_SHAPE,
                         "M = %lld, K = %lld: past the tensor limits (2^40 per dimension, 2^50 "
                         "elements)",
                         (long long)M, (long long)K);
  XTE_TRY(check_mode_recipe(mode, recipe));
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

xte_status xte_quantize_scale_shape(int64_t M, int64_t K, xte_scaling_mode mode, xte_recipe recipe,
                                    xte_scale_layout layout, int columnwise, int64_t *rows,
                                    int64_t *cols) {
  xte_scale_map m;
  int64_t r = 0, c = 0;
  XTE_CHECK_PTR(rows, "rows");
  XTE_CHECK_PTR(cols, "cols");
  if ((uintptr_t)rows % 8 || (uintptr_t)cols % 8)
    return xte_set_error(XTE_ERROR_ALIGNMENT, "%s is not 8-byte aligned",
                         (uintptr_t)rows % 8 ? "rows" : "cols");
  XTE_TRY(xte_scale_geom(M, K, mode, recipe, layout, columnwise, &m, &r, &c));
  *rows = r;
  *cols = c;
  xte_clear_error();
  return XTE_SUCCESS;
}

static int fp8_fmt(xte_dtype d) {
  return d == XTE_DTYPE_E4M3 ? XTE_FP8_E4M3 : XTE_FP8_E5M2;
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

static xte_status input_kind(const xte_tensor *in, const char *name, int *kind) {
  switch (in->dtype) {
    case XTE_DTYPE_FP32:
      *kind = XTE_NUM_IN_F32;
      break;
    case XTE_DTYPE_BF16:
      *kind = XTE_NUM_IN_BF16;
      break;
    case XTE_DTYPE_FP16:
      *kind = XTE_NUM_IN_F16;
      break;
    default:
      return xte_set_error(XTE_ERROR_DTYPE, "%s->dtype is %s: want fp32, bf16 or fp16", name,
                           xte_dtype_name(in->dtype));
  }
  if ((uintptr_t)in->data % xte_dtype_size(in->dtype))
    return xte_set_error(XTE_ERROR_ALIGNMENT, "%s->data is not aligned to its element size", name);
  return XTE_SUCCESS;
}

xte_status xte_quant_prepare(int64_t M, int64_t K, int in_kind, xte_qtensor *out,
                             const xte_quant_config *config, xte_quant_args *a) {
  xte_quant_config cfg = config ? *config : xte_quant_config_default();
  xte_dtype qdt = XTE_DTYPE_COUNT;
  memset(a, 0, sizeof *a);
  XTE_CHECK_PTR(out, "out");
  XTE_TRY(check_mode_recipe(out->scaling_mode, out->recipe));
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
  a->fmt = fp8_fmt(qdt);
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

xte_status xte_quantize(const xte_tensor *input, xte_qtensor *out, const xte_quant_config *config,
                        xte_stream stream) {
  xte_quant_args a;
  xte_exec ex;
  int64_t M, K, ld;
  int in_kind = 0;
  XTE_CHECK_PTR(input, "input");
  XTE_CHECK_PTR(out, "out");
  XTE_TRY(xte_tensor_view2d(input, "input", &M, &K, &ld));
  XTE_TRY(input_kind(input, "input", &in_kind));
  XTE_TRY(xte_quant_prepare(M, K, in_kind, out, config, &a));
  XTE_TRY(xte_resolve_stream(stream, &ex));
  if (!ex.ops->quantize)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "backend %s has no quantize",
                         xte_backend_name(ex.backend));
  a.in = input->data;
  a.ld_in = ld;
  xte_clear_error();
  return ex.ops->quantize(&a, ex.handle);
}

xte_status xte_dequantize(const xte_qtensor *input, int columnwise, xte_tensor *out,
                          xte_stream stream) {
  xte_dequant_args a;
  xte_exec ex;
  const xte_tensor *q;
  const xte_scale_tensor *s;
  const char *qname, *sname;
  int64_t R, C, ldq, oR, oC, ldo, M, K, need_r, need_c;
  int tr;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(input, "input");
  XTE_CHECK_PTR(out, "out");
  if (columnwise != 0 && columnwise != 1)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "columnwise must be 0 or 1");
  XTE_TRY(check_mode_recipe(input->scaling_mode, input->recipe));
  q = columnwise ? &input->columnwise : &input->rowwise;
  s = columnwise ? &input->columnwise_scale_inv : &input->rowwise_scale_inv;
  qname = columnwise ? "input->columnwise" : "input->rowwise";
  sname = columnwise ? "input->columnwise_scale_inv" : "input->rowwise_scale_inv";
  XTE_TRY(xte_tensor_view2d(q, qname, &R, &C, &ldq));
  if (q->dtype != XTE_DTYPE_E4M3 && q->dtype != XTE_DTYPE_E5M2)
    return xte_set_error(XTE_ERROR_DTYPE, "%s->dtype is %s: want e4m3 or e5m2", qname,
                         xte_dtype_name(q->dtype));
  XTE_TRY(xte_tensor_view2d(out, "out", &oR, &oC, &ldo));
  if (out->dtype != XTE_DTYPE_FP32 && out->dtype != XTE_DTYPE_BF16 && out->dtype != XTE_DTYPE_FP16)
    return xte_set_error(XTE_ERROR_DTYPE, "out->dtype is %s: want fp32, bf16 or fp16",
                         xte_dtype_name(out->dtype));
  if ((uintptr_t)out->data % xte_dtype_size(out->dtype))
    return xte_set_error(XTE_ERROR_ALIGNMENT, "out->data is not aligned to its element size");
  if (oR != R || oC != C)
    return xte_set_error(XTE_ERROR_SHAPE, "out is [%lld, %lld]: want [%lld, %lld]", (long long)oR,
                         (long long)oC, (long long)R, (long long)C);
  tr = columnwise && xte_recipe_col_transposed(input->recipe);
  M = tr ? C : R;
  K = tr ? R : C;
  XTE_TRY(xte_scale_geom(M, K, input->scaling_mode, input->recipe, s->layout, columnwise, &a.s,
                         &need_r, &need_c));
  if (!s->data) return xte_set_error(XTE_ERROR_NULL_POINTER, "%s.data is NULL", sname);
  if (s->dtype != (xte_recipe_is_mx(input->recipe) ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32))
    return xte_set_error(XTE_ERROR_DTYPE, "%s.dtype %s does not fit recipe %d", sname,
                         xte_dtype_name(s->dtype), (int)input->recipe);
  if (!xte_recipe_is_mx(input->recipe) && ((uintptr_t)s->data % 4) != 0)
    return xte_set_error(XTE_ERROR_ALIGNMENT, "%s.data is not 4-byte aligned", sname);
  if (s->rows != need_r || s->cols != need_c)
    return xte_set_error(XTE_ERROR_SHAPE, "%s is [%lld, %lld]: want [%lld, %lld]", sname,
                         (long long)s->rows, (long long)s->cols, (long long)need_r,
                         (long long)need_c);
  a.s.data = s->data;
  XTE_TRY(xte_resolve_stream(stream, &ex));
  if (!ex.ops->dequantize)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "backend %s has no dequantize",
                         xte_backend_name(ex.backend));
  a.q = (const uint8_t *)q->data;
  a.fmt = fp8_fmt(q->dtype);
  a.R = R;
  a.C = C;
  a.ld_q = ldq;
  if (input->scaling_mode == XTE_SCALING_PER_TENSOR) {
    a.bh = a.bw = 1 << 30;
  } else if (input->scaling_mode == XTE_SCALING_BLOCK_128x128) {
    a.bh = a.bw = 128;
  } else if (columnwise && !tr) {
    a.bh = input->scaling_mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
    a.bw = 1;
  } else {
    a.bh = 1;
    a.bw = input->scaling_mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  }
  a.out = out->data;
  a.out_dtype = (int)out->dtype;
  a.ld_out = ldo;
  xte_clear_error();
  return ex.ops->dequantize(&a, ex.handle);
}

static int castable(xte_dtype d) {
  return d == XTE_DTYPE_FP32 || d == XTE_DTYPE_BF16 || d == XTE_DTYPE_FP16 || d == XTE_DTYPE_E4M3 ||
         d == XTE_DTYPE_E5M2 || d == XTE_DTYPE_E8M0;
}

xte_status xte_cast(const xte_tensor *input, xte_tensor *out, int saturate, xte_stream stream) {
  xte_cast_args a;
  xte_exec ex;
  int64_t r, c, ld, orr, oc, old, n, on;
  XTE_CHECK_PTR(input, "input");
  XTE_CHECK_PTR(out, "out");
  XTE_TRY(xte_tensor_view2d(input, "input", &r, &c, &ld));
  XTE_TRY(xte_tensor_view2d(out, "out", &orr, &oc, &old));
  if (!castable(input->dtype))
    return xte_set_error(XTE_ERROR_DTYPE,
                         "input->dtype %s: want fp32, bf16, fp16, e4m3, e5m2, e8m0",
                         xte_dtype_name(input->dtype));
  if (!castable(out->dtype))
    return xte_set_error(XTE_ERROR_DTYPE, "out->dtype %s: want fp32, bf16, fp16, e4m3, e5m2, e8m0",
                         xte_dtype_name(out->dtype));
  if (ld != c || old != oc)
    return xte_set_error(XTE_ERROR_SHAPE, "%s must be dense (ld = 0)", ld != c ? "input" : "out");
  if (__builtin_mul_overflow(r, c, &n) || __builtin_mul_overflow(orr, oc, &on))
    return xte_set_error(XTE_ERROR_SHAPE, "%s: the element count overflows",
                         __builtin_mul_overflow(r, c, &n) ? "input" : "out");
  if (n != on)
    return xte_set_error(XTE_ERROR_SHAPE, "out holds %lld elements: input has %lld", (long long)on,
                         (long long)n);
  if (saturate != 0 && saturate != 1)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "saturate must be 0 or 1");
  if ((uintptr_t)input->data % xte_dtype_size(input->dtype) ||
      (uintptr_t)out->data % xte_dtype_size(out->dtype))
    return xte_set_error(XTE_ERROR_ALIGNMENT, "%s->data is not aligned to its element size",
                         (uintptr_t)input->data % xte_dtype_size(input->dtype) ? "input" : "out");
  XTE_TRY(xte_resolve_stream(stream, &ex));
  if (!ex.ops->cast)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "backend %s has no cast",
                         xte_backend_name(ex.backend));
  a.in = input->data;
  a.in_dtype = (int)input->dtype;
  a.out = out->data;
  a.out_dtype = (int)out->dtype;
  a.n = n;
  a.saturate = saturate;
  xte_clear_error();
  return ex.ops->cast(&a, ex.handle);
}
