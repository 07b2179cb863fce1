/* SwiGLU tests: xte_swiglu / xte_dswiglu against the per-element contract, the fused
 * SwiGLU + 1x128 quantization (forward and backward) against xte_quantize of the separate
 * kernel's output, byte for byte, for every 1x128 recipe, both act dtypes, rowwise and
 * columnwise copies, every scale layout and every CPU ISA; dSwiGLU against central finite
 * differences of an fp64 SwiGLU. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "numerics/xte_math.h"
#include "numerics/xte_moe_numerics.h"
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
    /* F a multiple of 128: each d_gate tile made with its d_up tile */
    fused_case(130, 256, XTE_DTYPE_BF16, XTE_DTYPE_BF16, recs[r], XTE_SCALE_LAYOUT_COMPACT, 1, 1);
  }
}

/* ---------------------------------------------------------------- special values, oracle
 * SwiGLU, dSwiGLU and both fused with 1x128 quantization on inputs with NaN (either sign), +-inf,
 * subnormals, signed zeros, huge values, whole blocks of NaN, odd shapes (tails of the 128-wide
 * blocks and of the SIMD widths), compared bit for bit on every ISA with an oracle written here:
 * the per-element formulas of docs/numerics.md section 8 with the shared silu / sigmoid of
 * xte_math.h (tested exhaustively elsewhere), bf16 by round to nearest even (NaN: quieted, sign
 * and high payload kept), and the quantization of sections 3-4 restated: block amax = max |y|
 * skipping NaN, the recipe's scale in fp32, each element the nearest e4m3 code (ties to even,
 * saturating) found by a search over the code values. At most one of gate / up / dy is NaN at
 * an element, so no result depends on which NaN operand the hardware passes on. */

static double e4_val[0x7F]; /* magnitudes of e4m3 codes 0..0x7E */

static void e4_init(void) {
  int c;
  for (c = 0; c < 0x7F; c++) {
    int e = c >> 3, f = c & 7;
    e4_val[c] = e == 0 ? ldexp((double)f, -9) : ldexp((double)(8 + f), e - 10);
  }
}

static uint8_t e4_enc(float y) { /* saturating */
  const uint8_t s = signbit(y) ? 0x80 : 0x00;
  const double a = fabs((double)y);
  int lo = 0, hi = 0x7E;
  if (isnan(y)) return (uint8_t)(s | 0x7F);
  if (a >= e4_val[0x7E]) return (uint8_t)(s | 0x7E);
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (e4_val[mid] <= a)
      lo = mid;
    else
      hi = mid;
  }
  if (2.0 * a < e4_val[lo] + e4_val[hi]) return (uint8_t)(s | lo);
  if (2.0 * a > e4_val[lo] + e4_val[hi]) return (uint8_t)(s | hi);
  return (uint8_t)(s | ((lo & 1) ? hi : lo));
}

static uint16_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static float f32_of_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The scale (multiplier) and scale_inv (stored) of a 1x128 block with amax a (default config:
 * no epsilon, TE_BLOCK in powers of two, e4m3). */
static float o_scale(xte_recipe r, float a, xte_dtype act, float *scale_inv) {
  float s, si;
  if (r == XTE_RECIPE_TE_BLOCK) {
    if (isinf(a) || a == 0.0f) {
      s = 1.0f;
    } else {
      s = 448.0f / a;
      if (isinf(s)) s = act == XTE_DTYPE_BF16 ? (float)ldexp(255.0, 120) : FLT_MAX;
      s = ldexpf(1.0f, ilogbf(s)); /* down to a power of two */
    }
    si = 1.0f / s;
  } else if (r == XTE_RECIPE_MTFP8) {
    si = (a > 1e-30f ? a : 1e-30f) * (1.0f / 448.0f);
    s = 1.0f / si;
  } else {
    si = (a > 1e-4f ? a : 1e-4f) / 448.0f;
    if (r == XTE_RECIPE_DEEPGEMM_UE8M0 && isfinite(si)) {
      float p = ldexpf(1.0f, ilogbf(si));
      si = p == si ? p : 2.0f * p; /* up to a power of two */
    }
    s = 1.0f / si;
  }
  *scale_inv = si;
  return s;
}

/* Quantizes Y [M, K] (row stride K) in blocks along rows (bh = 1, bw = 128) or along columns
 * (bh = 128, bw = 1); q[i * qs_r + j * qs_c], scales grid[(i / bh) * gs_r + (j / bw) * gs_c].
 * Returns max |y| skipping NaN. */
static float o_quant(const float *Y, int64_t M, int64_t K, int64_t bh, int64_t bw, xte_recipe r,
                     xte_dtype act, uint8_t *q, int64_t qs_r, int64_t qs_c, float *grid,
                     int64_t gs_r, int64_t gs_c) {
  int64_t i0, j0, i, j;
  float total = 0.0f;
  for (i0 = 0; i0 < M; i0 += bh)
    for (j0 = 0; j0 < K; j0 += bw) {
      float a = 0.0f, s, si;
      for (i = i0; i < M && i < i0 + bh; i++)
        for (j = j0; j < K && j < j0 + bw; j++) {
          float v = fabsf(Y[i * K + j]);
          if (!isnan(v) && v > a) a = v;
        }
      if (a > total) total = a;
      s = o_scale(r, a, act, &si);
      grid[(i0 / bh) * gs_r + (j0 / bw) * gs_c] = si;
      for (i = i0; i < M && i < i0 + bh; i++)
        for (j = j0; j < K && j < j0 + bw; j++) q[i * qs_r + j * qs_c] = e4_enc(Y[i * K + j] * s);
    }
  return total;
}

/* A special value or a plain one (kind chosen by the caller's rng). */
static float special(uint32_t r) {
  switch (r % 16) {
    case 0:
      return NAN;
    case 1:
      return -NAN;
    case 2:
      return INFINITY;
    case 3:
      return -INFINITY;
    case 4:
      return 1e-40f; /* subnormal */
    case 5:
      return -3e-39f; /* subnormal */
    case 6:
      return 0.0f;
    case 7:
      return -0.0f;
    case 8:
      return 3e38f;
    case 9:
      return -1e30f;
    case 10:
      return 90.0f;
    case 11:
      return -105.0f;
    case 12:
      return 1e-30f;
    default:
      return rng_f() * 8.0f;
  }
}

/* x [T, 2F] and dy [T, F] with specials; NaN never in two operands of one element; rows 3 and
 * (if any) a whole 128-block of row 5 NaN in the gate. */
static void special_inputs(int T, int F, float *x, float *dy) {
  int t, f;
  for (t = 0; t < T; t++)
    for (f = 0; f < F; f++) {
      uint32_t r = rng_u32(), which = r % 3;
      float *g = &x[(size_t)t * 2 * F + f], *u = &x[(size_t)t * 2 * F + F + f],
            *d = &dy[(size_t)t * F + f];
      *g = rng_f() * 6.0f;
      *u = rng_f() * 6.0f;
      *d = rng_f();
      if (r % 5 < 2) { /* a special in one of the three */
        float v = special(rng_u32());
        if (which == 0)
          *g = v;
        else if (which == 1)
          *u = v;
        else
          *d = v;
      }
      if (t == 3 && T > 4) *g = NAN, *u = 1.0f, *d = 1.0f;
      if (t == 5 && f < 128) *g = -NAN, *u = 2.0f, *d = 0.5f;
    }
}

/* The activation [T, K] of the contract: forward y = silu(g) * u; backward [d_gate | d_up]. */
static void o_act(int T, int F, int backward, const float *x, const float *dy, float *y) {
  int t, f;
  for (t = 0; t < T; t++)
    for (f = 0; f < F; f++) {
      const float g = x[(size_t)t * 2 * F + f], u = x[(size_t)t * 2 * F + F + f];
      if (!backward) {
        y[(size_t)t * F + f] = xte_siluf(g) * u;
      } else {
        const float d = dy[(size_t)t * F + f], s = xte_sigmoidf(g);
        y[(size_t)t * 2 * F + f] = (d * u) * (s * fmaf(g, 1.0f - s, 1.0f));
        y[(size_t)t * 2 * F + F + f] = d * xte_siluf(g);
      }
    }
}

/* sweep: every gate value a bf16 of magnitude in [8, 192), both signs, in turn: the range where
 * e^-|g| passes 2^-24 (1 + e is 1 from |g| > 16.7), the kernels' exp clamp (-86) and the
 * subnormal e (|g| > 87.3) to its underflow (|g| > 104) */
static void special_plain_case(int T, int F, xte_dtype in_dt, xte_dtype out_dt, int sweep) {
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, bwd;
  const size_t nx = (size_t)T * 2 * F, ny = (size_t)T * F;
  float *x = (float *)zalloc(4 * nx), *dy = (float *)zalloc(4 * ny),
        *want = (float *)zalloc(4 * nx);
  uint16_t *xb = (uint16_t *)zalloc(2 * nx), *dyb = (uint16_t *)zalloc(2 * ny);
  void *out = zalloc(4 * nx);
  size_t i;
  special_inputs(T, F, x, dy);
  if (sweep) {
    int t, f;
    for (t = 0; t < T; t++)
      for (f = 0; f < F; f++) {
        const uint32_t m = (uint32_t)(t * F + f) % 1152u;
        x[(size_t)t * 2 * F + f] =
            f32_of_bf16((uint16_t)((m >= 576 ? 0xC100u : 0x4100u) + m % 576));
      }
  }
  if (in_dt == XTE_DTYPE_BF16) { /* the kernel sees the bf16 values */
    for (i = 0; i < nx; i++) x[i] = f32_of_bf16(xb[i] = bf16_of(x[i]));
    for (i = 0; i < ny; i++) dy[i] = f32_of_bf16(dyb[i] = bf16_of(dy[i]));
  }
  for (bwd = 0; bwd < 2; bwd++) {
    const size_t n = bwd ? nx : ny;
    o_act(T, F, bwd, x, dy, want);
    for (ii = 0; ii < nisa; ii++) {
      xte_tensor xt =
          xte_tensor_2d(in_dt == XTE_DTYPE_FP32 ? (void *)x : (void *)xb, in_dt, T, 2 * F);
      xte_tensor dyt =
          xte_tensor_2d(in_dt == XTE_DTYPE_FP32 ? (void *)dy : (void *)dyb, in_dt, T, F);
      xte_tensor ot = xte_tensor_2d(out, out_dt, T, bwd ? 2 * F : F);
      cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
      memset(out, 0x5A, 4 * nx);
      if (bwd)
        cr_assert_eq(xte_dswiglu(&dyt, &xt, &ot, NULL), XTE_SUCCESS, "%s", xte_last_error());
      else
        cr_assert_eq(xte_swiglu(&xt, &ot, NULL), XTE_SUCCESS, "%s", xte_last_error());
      for (i = 0; i < n; i++) {
        if (out_dt == XTE_DTYPE_FP32) {
          uint32_t a, b;
          memcpy(&a, (float *)out + i, 4);
          memcpy(&b, want + i, 4);
          cr_assert_eq(a, b, "isa %d bwd %d T %d F %d in %s: [%zu] 0x%08x, want 0x%08x",
                       (int)isas[ii], bwd, T, F, xte_dtype_name(in_dt), i, a, b);
        } else {
          uint16_t a = ((uint16_t *)out)[i], b = bf16_of(want[i]);
          cr_assert_eq(a, b, "isa %d bwd %d T %d F %d in %s (bf16 out): [%zu] 0x%04x, want 0x%04x",
                       (int)isas[ii], bwd, T, F, xte_dtype_name(in_dt), i, a, b);
        }
      }
    }
  }
  free(x), free(dy), free(want), free(xb), free(dyb), free(out);
}

Test(moe_swiglu, special_values_plain_bits) {
  rng_seed(41);
  special_plain_case(37, 65, XTE_DTYPE_FP32, XTE_DTYPE_FP32, 0);
  special_plain_case(9, 130, XTE_DTYPE_BF16, XTE_DTYPE_BF16, 0);
  special_plain_case(1, 1, XTE_DTYPE_FP32, XTE_DTYPE_BF16, 0);
  special_plain_case(6, 257, XTE_DTYPE_BF16, XTE_DTYPE_FP32, 0);
}

Test(moe_swiglu, large_gate_plain_bits) {
  rng_seed(43);
  special_plain_case(9, 260, XTE_DTYPE_FP32, XTE_DTYPE_FP32, 1);
  special_plain_case(5, 259, XTE_DTYPE_BF16, XTE_DTYPE_BF16, 1);
}

static void special_fused_case(int T, int F, xte_dtype in_dt, xte_dtype act, xte_recipe rec,
                               int backward) {
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii;
  const int tr = rec != XTE_RECIPE_MTFP8;
  const int64_t M = T, K = backward ? 2 * F : F, KB = (K + 127) / 128, MB = (M + 127) / 128;
  const size_t nx = (size_t)T * 2 * F, ny = (size_t)T * F, nq = (size_t)(M * K);
  float *x = (float *)zalloc(4 * nx), *dy = (float *)zalloc(4 * ny), *y = (float *)zalloc(4 * nq);
  uint16_t *xb = (uint16_t *)zalloc(2 * nx), *dyb = (uint16_t *)zalloc(2 * ny);
  uint8_t *wq = (uint8_t *)zalloc(nq), *wcq = (uint8_t *)zalloc(nq);
  float *ws = (float *)zalloc(4 * (size_t)(M * KB)), *wcs = (float *)zalloc(4 * (size_t)(K * MB));
  float wamax;
  size_t i;
  special_inputs(T, F, x, dy);
  if (in_dt == XTE_DTYPE_BF16) {
    for (i = 0; i < nx; i++) x[i] = f32_of_bf16(xb[i] = bf16_of(x[i]));
    for (i = 0; i < ny; i++) dy[i] = f32_of_bf16(dyb[i] = bf16_of(dy[i]));
  }
  o_act(T, F, backward, x, dy, y);
  if (act == XTE_DTYPE_BF16)
    for (i = 0; i < nq; i++) y[i] = f32_of_bf16(bf16_of(y[i]));
  /* rowwise: blocks 1 x 128, scales [M, KB]; columnwise: transposed data [K, M] with scales
   * [K, MB] (TE / DeepGEMM), or [M, K] data with scales [MB, K] (MTFP8) */
  wamax = o_quant(y, M, K, 1, 128, rec, act, wq, K, 1, ws, KB, 1);
  if (tr)
    o_quant(y, M, K, 128, 1, rec, act, wcq, 1, M, wcs, 1, MB);
  else
    o_quant(y, M, K, 128, 1, rec, act, wcq, K, 1, wcs, K, 1);
  for (ii = 0; ii < nisa; ii++) {
    xte_tensor xt =
        xte_tensor_2d(in_dt == XTE_DTYPE_FP32 ? (void *)x : (void *)xb, in_dt, T, 2 * F);
    xte_tensor dyt = xte_tensor_2d(in_dt == XTE_DTYPE_FP32 ? (void *)dy : (void *)dyb, in_dt, T, F);
    xte_quant_config cfg = xte_quant_config_default();
    xte_qtensor q;
    qbuf b;
    char what[160];
    cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
    qbuf_make(&b, &q, M, K, rec, XTE_SCALE_LAYOUT_COMPACT, 1);
    cr_assert_eq(b.rr, M);
    cr_assert_eq(b.rc, KB);
    cr_assert_eq(b.cr, tr ? K : MB);
    cr_assert_eq(b.cc, tr ? MB : K);
    b.amax = -1.0f;
    if (backward)
      cr_assert_eq(xte_dswiglu_quantize(&dyt, &xt, act, &q, &cfg, NULL), XTE_SUCCESS, "%s",
                   xte_last_error());
    else
      cr_assert_eq(xte_swiglu_quantize(&xt, act, &q, &cfg, NULL), XTE_SUCCESS, "%s",
                   xte_last_error());
    snprintf(what, sizeof what, "isa %d T %d F %d in %s act %s recipe %d bwd %d", (int)isas[ii], T,
             F, xte_dtype_name(in_dt), xte_dtype_name(act), (int)rec, backward);
    for (i = 0; i < nq; i++) {
      cr_assert_eq(b.rq[i], wq[i], "%s: rowwise data [%zu] 0x%02x, want 0x%02x", what, i, b.rq[i],
                   wq[i]);
      cr_assert_eq(b.cq[i], wcq[i], "%s: columnwise data [%zu] 0x%02x, want 0x%02x", what, i,
                   b.cq[i], wcq[i]);
    }
    for (i = 0; i < (size_t)(M * KB); i++)
      cr_assert_eq(xte_f32_bits(b.rs[i]), xte_f32_bits(ws[i]),
                   "%s: rowwise scale [%zu] %a, want %a", what, i, (double)b.rs[i], (double)ws[i]);
    for (i = 0; i < (size_t)(K * MB); i++)
      cr_assert_eq(xte_f32_bits(b.cs[i]), xte_f32_bits(wcs[i]),
                   "%s: columnwise scale [%zu] %a, want %a", what, i, (double)b.cs[i],
                   (double)wcs[i]);
    cr_assert_eq(xte_f32_bits(b.amax), xte_f32_bits(wamax), "%s: amax %a, want %a", what,
                 (double)b.amax, (double)wamax);
    qbuf_free(&b);
  }
  free(x), free(dy), free(y), free(xb), free(dyb), free(wq), free(wcq), free(ws), free(wcs);
}

Test(moe_swiglu, special_values_fused_bits) {
  const xte_recipe recs[4] = {XTE_RECIPE_TE_BLOCK, XTE_RECIPE_DEEPGEMM, XTE_RECIPE_DEEPGEMM_UE8M0,
                              XTE_RECIPE_MTFP8};
  int r;
  e4_init();
  rng_seed(42);
  for (r = 0; r < 4; r++) {
    special_fused_case(37, 65, XTE_DTYPE_FP32, XTE_DTYPE_FP32, recs[r], 0);
    special_fused_case(130, 200, XTE_DTYPE_BF16, XTE_DTYPE_BF16, recs[r], 0);
    special_fused_case(129, 100, XTE_DTYPE_FP32, XTE_DTYPE_BF16, recs[r], 1);
    special_fused_case(7, 3, XTE_DTYPE_BF16, XTE_DTYPE_FP32, recs[r], 1);
    special_fused_case(130, 128, XTE_DTYPE_BF16, XTE_DTYPE_BF16, recs[r], 1); /* tile pairs */
    special_fused_case(40, 1024, XTE_DTYPE_BF16, XTE_DTYPE_BF16, recs[r], 1); /* in chunks */
  }
}

/* ---------------------------------------------------------------- lanes against the scalar
 * The ISA builds compute SwiGLU XTE_MOE_VW elements at a time (src/cpu/moe_swiglu.c); every lane
 * must give the scalar contract functions' bits (xte_swiglu_fwd, xte_dswiglu_gate,
 * xte_dswiglu_up of src/numerics/xte_moe_numerics.h, which set NaN bits explicitly, so here any
 * operand of an element may be NaN, of either sign, quiet or signalling, with any payload).
 * Inputs: random bit patterns (every class: NaN, inf, subnormal, huge), values spread over the
 * exp's whole range [-110, 95], and the edges of its branches (-103.98, -87, -86, 88, 88.72,
 * +-0) and their neighbours; rows of 1003 columns (full vectors of 8 and 16 lanes and a tail),
 * both dtypes in and out, forward and backward, on every ISA; then the fused kernel against
 * xte_quantize of the same reference activations. */

/* wild: a quarter random bit patterns; else only the value classes (the fused check: blocks of
 * finite values, whose quantization shows a wrong activation bit far more often) */
static float lane_input(int wild) {
  static const float edges[] = {-103.97909545898438f,
                                -103.9791f,
                                -87.0f,
                                -86.0f,
                                88.0f,
                                88.72283935546875f,
                                88.7229f,
                                0.0f,
                                -0.0f,
                                -17.0f,
                                20.0f,
                                1e-45f,
                                -1e-45f};
  const uint32_t r = rng_u32();
  float v;
  switch (wild ? r % 4 : 1 + r % 3) {
    case 0: {
      uint32_t u = rng_u32() ^ (rng_u32() << 9);
      memcpy(&v, &u, 4);
      return v;
    }
    case 1:
      return rng_f() * 102.5f - 7.5f; /* [-110, 95) */
    case 2: {
      float e = edges[(r >> 2) % (sizeof edges / sizeof edges[0])];
      uint32_t u;
      memcpy(&u, &e, 4);
      u += (uint32_t)((int)(rng_u32() % 5) - 2); /* the edge and its neighbours */
      memcpy(&v, &u, 4);
      return v;
    }
    default:
      return rng_f() * 4.0f;
  }
}

static float lane_ref(int kind, float g, float u, float dy) {
  if (kind == 0) return xte_swiglu_fwd(g, u);
  if (kind == 1) return xte_dswiglu_gate(dy, g, u);
  return xte_dswiglu_up(dy, g);
}

/* sweep: instead of lane_input, the gates step evenly through [-24, 24] (every reduced argument
 * of the exp, the whole sigmoid), up and dy 1 */
static void lanes_case(int T, int F, xte_dtype in_dt, xte_dtype out_dt, int sweep) {
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, bwd;
  const size_t nx = (size_t)T * 2 * F, ny = (size_t)T * F;
  float *x = (float *)zalloc(4 * nx), *dy = (float *)zalloc(4 * ny),
        *want = (float *)zalloc(4 * nx);
  uint16_t *xb = (uint16_t *)zalloc(2 * nx), *dyb = (uint16_t *)zalloc(2 * ny);
  void *out = zalloc(4 * nx);
  size_t i;
  int t, f;
  for (i = 0; i < nx; i++) x[i] = sweep ? 1.0f : lane_input(1);
  for (i = 0; i < ny; i++) dy[i] = sweep ? 1.0f : lane_input(1);
  if (sweep)
    for (t = 0; t < T; t++)
      for (f = 0; f < F; f++)
        x[(size_t)t * 2 * F + f] = -24.0f + 48.0f * (float)((double)(t * F + f) / (double)ny);
  if (in_dt == XTE_DTYPE_BF16) { /* the kernel sees the bf16 values (bf16 keeps NaN payloads) */
    for (i = 0; i < nx; i++) x[i] = f32_of_bf16(xb[i] = (uint16_t)(xte_f32_bits(x[i]) >> 16));
    for (i = 0; i < ny; i++) dy[i] = f32_of_bf16(dyb[i] = (uint16_t)(xte_f32_bits(dy[i]) >> 16));
  }
  for (bwd = 0; bwd < 2; bwd++) {
    const int K = bwd ? 2 * F : F;
    for (t = 0; t < T; t++)
      for (f = 0; f < F; f++) {
        const float g = x[(size_t)t * 2 * F + f], u = x[(size_t)t * 2 * F + F + f],
                    d = dy[(size_t)t * F + f];
        if (!bwd) {
          want[(size_t)t * K + f] = lane_ref(0, g, u, d);
        } else {
          want[(size_t)t * K + f] = lane_ref(1, g, u, d);
          want[(size_t)t * K + F + f] = lane_ref(2, g, u, d);
        }
      }
    for (ii = 0; ii < nisa; ii++) {
      xte_tensor xt =
          xte_tensor_2d(in_dt == XTE_DTYPE_FP32 ? (void *)x : (void *)xb, in_dt, T, 2 * F);
      xte_tensor dyt =
          xte_tensor_2d(in_dt == XTE_DTYPE_FP32 ? (void *)dy : (void *)dyb, in_dt, T, F);
      xte_tensor ot = xte_tensor_2d(out, out_dt, T, K);
      cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
      memset(out, 0x5A, 4 * nx);
      if (bwd)
        cr_assert_eq(xte_dswiglu(&dyt, &xt, &ot, NULL), XTE_SUCCESS, "%s", xte_last_error());
      else
        cr_assert_eq(xte_swiglu(&xt, &ot, NULL), XTE_SUCCESS, "%s", xte_last_error());
      for (i = 0; i < (size_t)T * (size_t)K; i++) {
        uint32_t a, b;
        if (out_dt == XTE_DTYPE_FP32) {
          memcpy(&a, (float *)out + i, 4);
          b = xte_f32_bits(want[i]);
        } else {
          a = ((uint16_t *)out)[i];
          b = bf16_of(want[i]);
        }
        cr_assert_eq(a, b,
                     "isa %d bwd %d in %s out %s: [%zu] (column %zu) 0x%08x, want 0x%08x "
                     "(gate %a up %a dy %a)",
                     (int)isas[ii], bwd, xte_dtype_name(in_dt), xte_dtype_name(out_dt), i,
                     i % (size_t)K, a, b, (double)x[i / K * 2 * F + i % K % F],
                     (double)x[i / K * 2 * F + F + i % K % F], (double)dy[i / K * F + i % K % F]);
      }
    }
  }
  free(x), free(dy), free(want), free(xb), free(dyb), free(out);
}

Test(moe_swiglu, lanes_equal_scalar_plain) {
  rng_seed(51);
  lanes_case(24, 1003, XTE_DTYPE_FP32, XTE_DTYPE_FP32, 0);
  lanes_case(16, 1003, XTE_DTYPE_BF16, XTE_DTYPE_BF16, 0);
  lanes_case(8, 517, XTE_DTYPE_FP32, XTE_DTYPE_BF16, 0);
  lanes_case(8, 200, XTE_DTYPE_BF16, XTE_DTYPE_FP32, 0);
  lanes_case(256, 1024, XTE_DTYPE_FP32, XTE_DTYPE_FP32, 1);
}

/* The fused kernels against xte_quantize (scalar ISA) of the reference activation rounded to
 * act: the lanes' activation feeds the quantizer unchanged (the bf16 rounding of the tile
 * included). Backward at F = 200: a 128-wide tile straddles the d_gate | d_up boundary. */
static void lanes_fused_case(int T, int F, xte_dtype in_dt, xte_dtype act, int backward) {
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, t, f;
  const int64_t M = T, K = backward ? 2 * F : F;
  const size_t nx = (size_t)T * 2 * F, ny = (size_t)T * F, nq = (size_t)(M * K);
  float *x = (float *)zalloc(4 * nx), *dy = (float *)zalloc(4 * ny), *y = (float *)zalloc(4 * nq);
  uint16_t *xb = (uint16_t *)zalloc(2 * nx), *dyb = (uint16_t *)zalloc(2 * ny),
           *yb = (uint16_t *)zalloc(2 * nq);
  xte_quant_config cfg = xte_quant_config_default();
  xte_qtensor q1;
  qbuf b1;
  size_t i;
  for (i = 0; i < nx; i++) x[i] = lane_input(0);
  for (i = 0; i < ny; i++) dy[i] = rng_f();
  if (in_dt == XTE_DTYPE_BF16) {
    for (i = 0; i < nx; i++) x[i] = f32_of_bf16(xb[i] = (uint16_t)(xte_f32_bits(x[i]) >> 16));
    for (i = 0; i < ny; i++) dy[i] = f32_of_bf16(dyb[i] = (uint16_t)(xte_f32_bits(dy[i]) >> 16));
  }
  for (t = 0; t < T; t++)
    for (f = 0; f < F; f++) {
      const float g = x[(size_t)t * 2 * F + f], u = x[(size_t)t * 2 * F + F + f],
                  d = dy[(size_t)t * F + f];
      if (!backward) {
        y[(size_t)t * K + f] = lane_ref(0, g, u, d);
      } else {
        y[(size_t)t * K + f] = lane_ref(1, g, u, d);
        y[(size_t)t * K + F + f] = lane_ref(2, g, u, d);
      }
    }
  for (i = 0; i < nq; i++) yb[i] = bf16_of(y[i]);
  {
    xte_tensor at =
        act == XTE_DTYPE_BF16 ? xte_tensor_2d(yb, act, M, K) : xte_tensor_2d(y, act, M, K);
    cr_assert_eq(xte_cpu_set_isa(isas[0]), XTE_SUCCESS);
    qbuf_make(&b1, &q1, M, K, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT, 1);
    cr_assert_eq(xte_quantize(&at, &q1, &cfg, NULL), XTE_SUCCESS, "%s", xte_last_error());
  }
  for (ii = 0; ii < nisa; ii++) {
    xte_tensor xt =
        xte_tensor_2d(in_dt == XTE_DTYPE_FP32 ? (void *)x : (void *)xb, in_dt, T, 2 * F);
    xte_tensor dyt = xte_tensor_2d(in_dt == XTE_DTYPE_FP32 ? (void *)dy : (void *)dyb, in_dt, T, F);
    xte_qtensor q2;
    qbuf b2;
    char what[128];
    cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
    qbuf_make(&b2, &q2, M, K, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT, 1);
    if (backward)
      cr_assert_eq(xte_dswiglu_quantize(&dyt, &xt, act, &q2, &cfg, NULL), XTE_SUCCESS, "%s",
                   xte_last_error());
    else
      cr_assert_eq(xte_swiglu_quantize(&xt, act, &q2, &cfg, NULL), XTE_SUCCESS, "%s",
                   xte_last_error());
    snprintf(what, sizeof what, "lanes: isa %d in %s act %s bwd %d", (int)isas[ii],
             xte_dtype_name(in_dt), xte_dtype_name(act), backward);
    qbuf_same(&b1, &b2, M, K, what);
    qbuf_free(&b2);
  }
  qbuf_free(&b1);
  free(x), free(dy), free(y), free(xb), free(dyb), free(yb);
}

Test(moe_swiglu, lanes_equal_scalar_fused) {
  rng_seed(52);
  lanes_fused_case(130, 200, XTE_DTYPE_FP32, XTE_DTYPE_FP32, 0);
  lanes_fused_case(130, 200, XTE_DTYPE_BF16, XTE_DTYPE_BF16, 0);
  lanes_fused_case(70, 200, XTE_DTYPE_FP32, XTE_DTYPE_BF16, 1);
  lanes_fused_case(70, 200, XTE_DTYPE_BF16, XTE_DTYPE_FP32, 1);
  /* F a multiple of 128 (tile pairs), full 128 x 128 tiles and a short last row of tiles */
  lanes_fused_case(130, 256, XTE_DTYPE_BF16, XTE_DTYPE_BF16, 1);
  lanes_fused_case(129, 128, XTE_DTYPE_FP32, XTE_DTYPE_FP32, 1);
  lanes_fused_case(130, 256, XTE_DTYPE_BF16, XTE_DTYPE_BF16, 0);
  /* one band of rows in chunks of several tiles (the last one short) */
  lanes_fused_case(64, 1000, XTE_DTYPE_BF16, XTE_DTYPE_BF16, 0);
  lanes_fused_case(64, 1024, XTE_DTYPE_FP32, XTE_DTYPE_BF16, 1);
  lanes_fused_case(33, 1000, XTE_DTYPE_BF16, XTE_DTYPE_FP32, 1);
  lanes_fused_case(200, 1024, XTE_DTYPE_BF16, XTE_DTYPE_BF16, 1); /* and a short last band */
}
