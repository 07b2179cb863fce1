/* SwiGLU tests: xte_swiglu / xte_dswiglu against the per-element contract, the fused
 * SwiGLU + 1x128 quantization (forward and backward) against xte_quantize of the separate
 * kernel's output, byte for byte, for every 1x128 recipe, both act dtypes, rowwise and
 * columnwise copies, every scale layout and every CPU ISA; dSwiGLU against central finite
 * differences of an fp64 SwiGLU. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>

#include "numerics/xte_math.h"
#include "test_moe_util.h"

static double silu64(double g) {
  return g / (1.0 + exp(-g));
}

Test(moe_swiglu, forward_backward_contract) {
  const int T = 37, F = 150;
  float *x = (float *)zalloc(4 * T * 2 * F), *y = (float *)zalloc(4 * T * F);
  float *dy = (float *)zalloc(4 * T * F), *dx = (float *)zalloc(4 * T * 2 * F);
  xte_tensor xt = xte_tensor_2d(x, XTE_DTYPE_FP32, T, 2 * F),
             yt = xte_tensor_2d(y, XTE_DTYPE_FP32, T, F);
  xte_tensor dyt = xte_tensor_2d(dy, XTE_DTYPE_FP32, T, F),
             dxt = xte_tensor_2d(dx, XTE_DTYPE_FP32, T, 2 * F);
  int i, t, f;
  rng_seed(21);
  for (i = 0; i < T * 2 * F; i++) x[i] = rng_f() * 8.0f;
  for (i = 0; i < T * F; i++) dy[i] = rng_f();
  cr_assert_eq(xte_swiglu(&xt, &yt, NULL), XTE_SUCCESS, "%s", xte_last_error());
  cr_assert_eq(xte_dswiglu(&dyt, &xt, &dxt, NULL), XTE_SUCCESS, "%s", xte_last_error());
  for (t = 0; t < T; t++)
    for (f = 0; f < F; f++) {
      float g = x[t * 2 * F + f], u = x[t * 2 * F + F + f], s = xte_sigmoidf(g);
      float want = xte_siluf(g) * u;
      float dg = (dy[t * F + f] * u) * (s * fmaf(g, 1.0f - s, 1.0f));
      float du = dy[t * F + f] * xte_siluf(g);
      double h = 1e-6, fdg, fdu;
      cr_assert_eq(xte_f32_bits(y[t * F + f]), xte_f32_bits(want));
      cr_assert_eq(xte_f32_bits(dx[t * 2 * F + f]), xte_f32_bits(dg));
      cr_assert_eq(xte_f32_bits(dx[t * 2 * F + F + f]), xte_f32_bits(du));
      /* finite differences of dy * silu(g) * u in fp64 */
      fdg = (double)dy[t * F + f] * (silu64((double)g + h) - silu64((double)g - h)) / (2 * h) * u;
      fdu = (double)dy[t * F + f] * silu64((double)g);
      cr_assert(fabs(fdg - (double)dg) <= 1e-6 * fmax(1.0, fabs(fdg)) * 8, "dgate %g vs fd %g",
                (double)dg, fdg);
      cr_assert(fabs(fdu - (double)du) <= 1e-6 * fmax(1.0, fabs(fdu)), "dup %g vs fd %g",
                (double)du, fdu);
    }
  free(x), free(y), free(dy), free(dx);
}

typedef struct qbuf {
  uint8_t *rq, *cq;
  float *rs, *cs;
  int64_t rr, rc, cr, cc;
  float amax;
} qbuf;

static void qbuf_make(qbuf *b, xte_qtensor *q, int64_t M, int64_t K, xte_recipe rec,
                      xte_scale_layout lay, int col) {
  int tr = rec != XTE_RECIPE_MTFP8;
  memset(q, 0, sizeof *q);
  q->scaling_mode = XTE_SCALING_BLOCK_1x128;
  q->recipe = rec;
  xte_quantize_scale_shape(M, K, XTE_SCALING_BLOCK_1x128, rec, lay, 0, &b->rr, &b->rc);
  xte_quantize_scale_shape(M, K, XTE_SCALING_BLOCK_1x128, rec, lay, 1, &b->cr, &b->cc);
  b->rq = (uint8_t *)zalloc((size_t)(M * K));
  b->cq = (uint8_t *)zalloc((size_t)(M * K));
  b->rs = (float *)zalloc(4 * (size_t)(b->rr * b->rc));
  b->cs = (float *)zalloc(4 * (size_t)(b->cr * b->cc));
  memset(b->rs, 0x5A, 4 * (size_t)(b->rr * b->rc));
  memset(b->cs, 0x5A, 4 * (size_t)(b->cr * b->cc));
  q->rowwise = xte_tensor_2d(b->rq, XTE_DTYPE_E4M3, M, K);
  q->rowwise_scale_inv.data = b->rs;
  q->rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  q->rowwise_scale_inv.rows = b->rr;
  q->rowwise_scale_inv.cols = b->rc;
  q->rowwise_scale_inv.layout = lay;
  if (col) {
    q->columnwise = tr ? xte_tensor_2d(b->cq, XTE_DTYPE_E4M3, K, M)
                       : xte_tensor_2d(b->cq, XTE_DTYPE_E4M3, M, K);
    q->columnwise_scale_inv.data = b->cs;
    q->columnwise_scale_inv.dtype = XTE_DTYPE_FP32;
    q->columnwise_scale_inv.rows = b->cr;
    q->columnwise_scale_inv.cols = b->cc;
    q->columnwise_scale_inv.layout = lay;
  }
  q->amax = &b->amax;
}

static void qbuf_same(const qbuf *a, const qbuf *b, int64_t M, int64_t K, const char *what) {
  cr_assert(memcmp(a->rq, b->rq, (size_t)(M * K)) == 0, "%s: rowwise data", what);
  cr_assert(memcmp(a->cq, b->cq, (size_t)(M * K)) == 0, "%s: columnwise data", what);
  cr_assert(memcmp(a->rs, b->rs, 4 * (size_t)(a->rr * a->rc)) == 0, "%s: rowwise scales", what);
  cr_assert(memcmp(a->cs, b->cs, 4 * (size_t)(a->cr * a->cc)) == 0, "%s: columnwise scales", what);
  cr_assert_eq(xte_f32_bits(a->amax), xte_f32_bits(b->amax), "%s: amax", what);
}

static void qbuf_free(qbuf *b) {
  free(b->rq), free(b->cq), free(b->rs), free(b->cs);
}

static void fused_case(int T, int F, xte_dtype in_dt, xte_dtype act, xte_recipe rec,
                       xte_scale_layout lay, int col, int backward) {
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, i;
  const int64_t M = T, K = backward ? 2 * F : F;
  float *x = (float *)zalloc(4 * (size_t)(T * 2 * F)), *dy = (float *)zalloc(4 * (size_t)(T * F));
  uint16_t *xb = (uint16_t *)zalloc(2 * (size_t)(T * 2 * F)),
           *dyb = (uint16_t *)zalloc(2 * (size_t)(T * F));
  void *act_buf = zalloc(4 * (size_t)(M * K));
  for (i = 0; i < T * 2 * F; i++) {
    x[i] = rng_f() * (i % 97 == 0 ? 300.0f : 6.0f);
    xb[i] = xte_f32_to_bf16(x[i]);
  }
  for (i = 0; i < T * F; i++) {
    dy[i] = rng_f() * 0.01f;
    dyb[i] = xte_f32_to_bf16(dy[i]);
  }
  for (ii = 0; ii < nisa; ii++) {
    xte_tensor xt = in_dt == XTE_DTYPE_FP32 ? xte_tensor_2d(x, in_dt, T, 2 * F)
                                            : xte_tensor_2d(xb, in_dt, T, 2 * F);
    xte_tensor dyt =
        in_dt == XTE_DTYPE_FP32 ? xte_tensor_2d(dy, in_dt, T, F) : xte_tensor_2d(dyb, in_dt, T, F);
    xte_tensor at = xte_tensor_2d(act_buf, act, M, K);
    xte_qtensor q1, q2;
    qbuf b1, b2;
    xte_quant_config cfg = xte_quant_config_default();
    char what[128];
    cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
    qbuf_make(&b1, &q1, M, K, rec, lay, col);
    qbuf_make(&b2, &q2, M, K, rec, lay, col);
    /* composed */
    if (backward)
      cr_assert_eq(xte_dswiglu(&dyt, &xt, &at, NULL), XTE_SUCCESS, "%s", xte_last_error());
    else
      cr_assert_eq(xte_swiglu(&xt, &at, NULL), XTE_SUCCESS, "%s", xte_last_error());
    cr_assert_eq(xte_quantize(&at, &q1, &cfg, NULL), XTE_SUCCESS, "%s", xte_last_error());
    /* fused */
    if (backward)
      cr_assert_eq(xte_dswiglu_quantize(&dyt, &xt, act, &q2, &cfg, NULL), XTE_SUCCESS, "%s",
                   xte_last_error());
    else
      cr_assert_eq(xte_swiglu_quantize(&xt, act, &q2, &cfg, NULL), XTE_SUCCESS, "%s",
                   xte_last_error());
    snprintf(what, sizeof what, "isa %d in %s act %s recipe %d layout %d col %d bwd %d",
             (int)isas[ii], xte_dtype_name(in_dt), xte_dtype_name(act), (int)rec, (int)lay, col,
             backward);
    qbuf_same(&b1, &b2, M, K, what);
    qbuf_free(&b1);
    qbuf_free(&b2);
  }
  free(x), free(dy), free(xb), free(dyb), free(act_buf);
}

Test(moe_swiglu, fused_forward_equals_composed) {
  const xte_recipe recs[4] = {XTE_RECIPE_TE_BLOCK, XTE_RECIPE_DEEPGEMM, XTE_RECIPE_DEEPGEMM_UE8M0,
                              XTE_RECIPE_MTFP8};
  int r;
  rng_seed(22);
  for (r = 0; r < 4; r++) {
    fused_case(200, 320, XTE_DTYPE_BF16, XTE_DTYPE_BF16, recs[r], XTE_SCALE_LAYOUT_COMPACT, 1, 0);
    fused_case(130, 128, XTE_DTYPE_FP32, XTE_DTYPE_FP32, recs[r], XTE_SCALE_LAYOUT_TE_GEMM, 1, 0);
    fused_case(64, 200, XTE_DTYPE_BF16, XTE_DTYPE_FP32, recs[r], XTE_SCALE_LAYOUT_DEEPGEMM, 0, 0);
  }
}

Test(moe_swiglu, fused_backward_equals_composed) {
  const xte_recipe recs[4] = {XTE_RECIPE_TE_BLOCK, XTE_RECIPE_DEEPGEMM, XTE_RECIPE_DEEPGEMM_UE8M0,
                              XTE_RECIPE_MTFP8};
  int r;
  rng_seed(23);
  for (r = 0; r < 4; r++) {
    fused_case(200, 100, XTE_DTYPE_BF16, XTE_DTYPE_BF16, recs[r], XTE_SCALE_LAYOUT_COMPACT, 1, 1);
    fused_case(129, 192, XTE_DTYPE_FP32, XTE_DTYPE_FP32, recs[r], XTE_SCALE_LAYOUT_TE_GEMM, 1, 1);
  }
}
