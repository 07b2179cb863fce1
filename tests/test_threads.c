/* Thread-count invariance: xte_cpu_set_num_threads(1), (2) and (7) give the same bytes for
 * quantize (every recipe x mode, both copies, data, scales, amax, output scale), dequantize and
 * cast, on a large odd shape. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xte/xte.h>

#define M_ 777
#define K_ 1283

typedef struct combo {
  xte_recipe recipe;
  xte_scaling_mode mode;
} combo;

static const combo COMBOS[] = {
    {XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128},
    {XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_128x128},
    {XTE_RECIPE_DEEPGEMM, XTE_SCALING_BLOCK_1x128},
    {XTE_RECIPE_DEEPGEMM, XTE_SCALING_BLOCK_128x128},
    {XTE_RECIPE_DEEPGEMM_UE8M0, XTE_SCALING_BLOCK_1x128},
    {XTE_RECIPE_DEEPGEMM_UE8M0, XTE_SCALING_BLOCK_128x128},
    {XTE_RECIPE_MTFP8, XTE_SCALING_BLOCK_1x128},
    {XTE_RECIPE_MTFP8, XTE_SCALING_BLOCK_128x128},
    {XTE_RECIPE_MX_TE, XTE_SCALING_MXFP8_1x32},
    {XTE_RECIPE_MX_OCP, XTE_SCALING_MXFP8_1x32},
    {XTE_RECIPE_TE_CURRENT, XTE_SCALING_PER_TENSOR},
    {XTE_RECIPE_TE_DELAYED, XTE_SCALING_PER_TENSOR},
};

static const int THREADS[] = {1, 2, 7};

static int is_mx(xte_recipe r) {
  return r == XTE_RECIPE_MX_TE || r == XTE_RECIPE_MX_OCP;
}

typedef struct result {
  uint8_t *q[2], *s[2];
  size_t sbytes[2];
  float amax, scale;
  float *deq[2];
} result;

static void result_free(result *r) {
  int i;
  for (i = 0; i < 2; i++) {
    free(r->q[i]);
    free(r->s[i]);
    free(r->deq[i]);
  }
}

static void run(const combo *cb, const void *in, xte_dtype dt, xte_scale_layout L, result *out) {
  const int mx = is_mx(cb->recipe);
  const int tr = !(cb->recipe == XTE_RECIPE_MTFP8 || mx);
  xte_qtensor q;
  xte_tensor x = xte_tensor_2d((void *)in, dt, M_, K_);
  int c;
  memset(out, 0, sizeof *out);
  memset(&q, 0, sizeof q);
  out->scale = 0.75f; /* the delayed recipe's input scale */
  for (c = 0; c < 2; c++) {
    int64_t r, k;
    xte_scale_tensor *s = c ? &q.columnwise_scale_inv : &q.rowwise_scale_inv;
    cr_assert_eq(xte_quantize_scale_shape(M_, K_, cb->mode, cb->recipe, L, c, &r, &k), XTE_SUCCESS);
    out->sbytes[c] = (size_t)(r * k) * (mx ? 1 : 4);
    out->q[c] = malloc((size_t)M_ * K_);
    out->s[c] = malloc(out->sbytes[c]);
    out->deq[c] = malloc((size_t)M_ * K_ * 4);
    cr_assert(out->q[c] && out->s[c] && out->deq[c]);
    memset(out->q[c], 0xA5, (size_t)M_ * K_);
    memset(out->s[c], 0xA5, out->sbytes[c]);
    s->data = out->s[c];
    s->dtype = mx ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
    s->rows = r;
    s->cols = k;
    s->layout = L;
  }
  q.rowwise = xte_tensor_2d(out->q[0], XTE_DTYPE_E4M3, M_, K_);
  q.columnwise = xte_tensor_2d(out->q[1], XTE_DTYPE_E4M3, tr ? K_ : M_, tr ? M_ : K_);
  q.scaling_mode = cb->mode;
  q.recipe = cb->recipe;
  q.amax = &out->amax;
  q.scale = &out->scale;
  cr_assert_eq(xte_quantize(&x, &q, NULL, NULL), XTE_SUCCESS, "%s", xte_last_error());
  for (c = 0; c < 2; c++) {
    xte_tensor y = xte_tensor_2d(out->deq[c], XTE_DTYPE_FP32, c && tr ? K_ : M_, c && tr ? M_ : K_);
    cr_assert_eq(xte_dequantize(&q, c, &y, NULL), XTE_SUCCESS, "%s", xte_last_error());
  }
}

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return (uint32_t)(rs >> 32);
}

/* fp32 bits with exponents over +-30 binades around 1, occasional zeros, infs and NaNs. */
static uint32_t gen(void) {
  uint32_t r = rnd(), b = (r & 0x80000000u) | ((97u + rnd() % 61u) << 23) | (rnd() & 0x7FFFFFu);
  if (r % 211 == 0) b = 0;
  if (r % 1009 == 1) b = 0x7F800000u | (r & 0x80000000u);
  if (r % 1013 == 2) b = 0x7FC00001u;
  return b;
}

Test(threads, quantize_invariance, .timeout = 600) {
  uint32_t *in32 = malloc((size_t)M_ * K_ * 4);
  uint16_t *in16 = malloc((size_t)M_ * K_ * 2);
  size_t i, ci;
  long bad = 0;
  cr_assert(in32 && in16);
  for (i = 0; i < (size_t)M_ * K_; i++) {
    in32[i] = gen();
    in16[i] = (uint16_t)(gen() >> 16);
  }
  for (ci = 0; ci < sizeof COMBOS / sizeof COMBOS[0]; ci++) {
    const combo *cb = &COMBOS[ci];
    const int mx = is_mx(cb->recipe);
    int v;
    for (v = 0; v < 2; v++) { /* fp32 input, COMPACT; bf16 input, the GEMM-ready layout */
      const xte_dtype dt = v ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32;
      const xte_scale_layout L = v ? (mx ? XTE_SCALE_LAYOUT_MX_SWIZZLED : XTE_SCALE_LAYOUT_TE_GEMM)
                                   : XTE_SCALE_LAYOUT_COMPACT;
      result ref;
      size_t t;
      cr_assert_eq(xte_cpu_set_num_threads(THREADS[0]), XTE_SUCCESS);
      run(cb, v ? (void *)in16 : (void *)in32, dt, L, &ref);
      for (t = 1; t < sizeof THREADS / sizeof THREADS[0]; t++) {
        result got;
        int c;
        cr_assert_eq(xte_cpu_set_num_threads(THREADS[t]), XTE_SUCCESS);
        cr_assert_eq(xte_cpu_get_num_threads(), THREADS[t]);
        run(cb, v ? (void *)in16 : (void *)in32, dt, L, &got);
        for (c = 0; c < 2; c++) {
          int ok = memcmp(got.q[c], ref.q[c], (size_t)M_ * K_) == 0 &&
                   memcmp(got.s[c], ref.s[c], ref.sbytes[c]) == 0 &&
                   memcmp(got.deq[c], ref.deq[c], (size_t)M_ * K_ * 4) == 0;
          if (!ok) {
            cr_log_error("recipe %d mode %d %s: %s copy differs with %d threads vs 1",
                         (int)cb->recipe, (int)cb->mode, xte_dtype_name(dt),
                         c ? "columnwise" : "rowwise", THREADS[t]);
            bad++;
          }
        }
        if (memcmp(&got.amax, &ref.amax, 4) != 0 || memcmp(&got.scale, &ref.scale, 4) != 0) {
          cr_log_error("recipe %d mode %d: amax / scale differ with %d threads", (int)cb->recipe,
                       (int)cb->mode, THREADS[t]);
          bad++;
        }
        result_free(&got);
      }
      result_free(&ref);
    }
  }
  cr_expect_eq(bad, 0, "%ld differences", bad);
  cr_expect_eq(xte_cpu_set_num_threads(0), XTE_SUCCESS);
  free(in32);
  free(in16);
}

Test(threads, cast_invariance) {
  const size_t n = (size_t)M_ * K_;
  uint32_t *in = malloc(n * 4);
  uint8_t *ref = malloc(n * 2), *got = malloc(n * 2);
  static const xte_dtype outs[] = {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  size_t i, o, t;
  cr_assert(in && ref && got);
  for (i = 0; i < n; i++) in[i] = gen();
  for (o = 0; o < 4; o++) {
    xte_tensor x = xte_tensor_1d(in, XTE_DTYPE_FP32, (int64_t)n);
    size_t bytes = n * xte_dtype_size(outs[o]);
    xte_tensor y = xte_tensor_1d(ref, outs[o], (int64_t)n);
    cr_assert_eq(xte_cpu_set_num_threads(1), XTE_SUCCESS);
    cr_assert_eq(xte_cast(&x, &y, 1, NULL), XTE_SUCCESS);
    for (t = 1; t < 3; t++) {
      y.data = got;
      cr_assert_eq(xte_cpu_set_num_threads(THREADS[t]), XTE_SUCCESS);
      cr_assert_eq(xte_cast(&x, &y, 1, NULL), XTE_SUCCESS);
      cr_expect_eq(memcmp(got, ref, bytes), 0, "cast to %s differs with %d threads",
                   xte_dtype_name(outs[o]), THREADS[t]);
    }
  }
  cr_expect_eq(xte_cpu_set_num_threads(0), XTE_SUCCESS);
  free(in);
  free(ref);
  free(got);
}
