/* Entry points of quantization: argument checks, scale-layout resolution, dispatch. Nothing is
 * written to any output before every check has passed. */
#include <math.h>
#include <string.h>

#include "core/quant.h"
#include "core/scale.h"
#include "core/tensor.h"
#include "xte_internal.h"

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
  XTE_TRY(xte_check_mode_recipe(input->scaling_mode, input->recipe));
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
  a.fmt = xte_fp8_fmt(q->dtype);
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
