/* The CUDA backend against the CPU backend, byte for byte: quantize (every recipe x scaling mode
 * x scale layout x rowwise / columnwise / both, fp32 / bf16 / fp16 inputs, e4m3 / e5m2, shapes
 * with tails, special values), dequantize (every fp8 byte) and cast (every bf16 / fp16 / fp8
 * pattern). Every GPU operation runs twice and must give the same bytes both times (determinism).
 * Where no CUDA device is usable the tests print SKIPPED with the reason.
 *
 * Built with Criterion, or without it on tests/cr_shim.h (XTE_TEST_CR_SHIM; the offline GPU
 * machine). Environment:
 *   XTE_TEST_GPU_AS_CPU=1   the "GPU" side on the CPU backend too (a check of this harness)
 *   XTE_TEST_GPU_REDUCED=1  small shapes and casts only (compute-sanitizer runs)
 *   XTE_TEST_GPU_HUGE=1     gpu_quantize/huge_* run quantize, dequantize and cast over more than
 *                           2^31 elements (about 20 GiB of host memory, 10 GiB on the device);
 *                           without it those tests pass without running (no SKIPPED line, which
 *                           would mark the whole program skipped in ctest). */
#ifdef XTE_TEST_CR_SHIM
#include "cr_shim.h"
#else
#include <criterion/criterion.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xte/xte.h>

static xte_stream gpu, cpu;
static int failures, nondeterministic;
#define MAX_REPORTED 25

static int env_on(const char *name) {
  const char *e = getenv(name);
  return e && *e == '1';
}

/* XTE_TEST_GPU_AS_CPU=1 runs the "GPU" side on the CPU backend too: a check of this harness
 * itself on machines without a GPU. */
static void streams(void) {
  const char *self = getenv("XTE_TEST_GPU_AS_CPU");
  xte_status st = self && *self == '1' ? xte_stream_create(XTE_BACKEND_CPU, 0, NULL, &gpu)
                                       : xte_stream_create(XTE_BACKEND_CUDA, 0, NULL, &gpu);
  if (st == XTE_ERROR_BACKEND_UNAVAILABLE) {
    fprintf(stderr, "SKIPPED: no usable CUDA device: %s\n", xte_last_error());
    cr_skip_test("SKIPPED: no usable CUDA device: %s", xte_last_error());
  }
  cr_assert_eq(st, XTE_SUCCESS, "xte_stream_create(CUDA): %s", xte_last_error());
  cr_assert_eq(xte_stream_create(XTE_BACKEND_CPU, 0, NULL, &cpu), XTE_SUCCESS);
}

/* Every mismatch is counted (the totals say how many cases differ); the first MAX_REPORTED are
 * reported in full. */
static void fail(const char *fmt, const char *desc, size_t at, unsigned g, unsigned c) {
  failures++;
  if (failures <= MAX_REPORTED)
    cr_expect_fail("%s: %s: first difference at byte %zu: gpu 0x%02x, cpu 0x%02x", desc, fmt, at, g,
                   c);
}

static int same(const char *what, const char *desc, const void *g, const void *c, size_t n) {
  const uint8_t *a = (const uint8_t *)g, *b = (const uint8_t *)c;
  size_t i;
  if (memcmp(a, b, n) == 0) return 1;
  for (i = 0; a[i] == b[i]; i++) continue;
  fail(what, desc, i, a[i], b[i]);
  return 0;
}

/* The second GPU run against the first: the same bytes. */
static int same_twice(const char *what, const char *desc, const void *second, const void *first,
                      size_t n) {
  const uint8_t *a = (const uint8_t *)second, *b = (const uint8_t *)first;
  size_t i;
  if (memcmp(a, b, n) == 0) return 1;
  for (i = 0; a[i] == b[i]; i++) continue;
  nondeterministic++;
  if (nondeterministic <= MAX_REPORTED)
    cr_expect_fail("%s: %s: second GPU run differs at byte %zu: 0x%02x, first 0x%02x", desc, what,
                   i, a[i], b[i]);
  return 0;
}

/* ---------------------------------------------------------------- device memory helpers */

static void *dalloc(size_t n) {
  void *p = NULL;
  cr_assert_eq(xte_malloc(gpu, n, &p), XTE_SUCCESS, "xte_malloc(%zu): %s", n, xte_last_error());
  return p;
}
static void *dup_to_gpu(const void *h, size_t n) {
  void *d = dalloc(n);
  cr_assert_eq(xte_memcpy(gpu, d, h, n, XTE_MEMCPY_HOST_TO_DEVICE), XTE_SUCCESS, "%s",
               xte_last_error());
  return d;
}
static void get(void *h, const void *d, size_t n) {
  cr_assert_eq(xte_memcpy(gpu, h, d, n, XTE_MEMCPY_DEVICE_TO_HOST), XTE_SUCCESS, "%s",
               xte_last_error());
}
static void dfree(void *d) {
  if (d) cr_assert_eq(xte_free(gpu, d), XTE_SUCCESS, "%s", xte_last_error());
}
static void *hcalloc(size_t n, int fill) {
  void *p = malloc(n ? n : 1);
  cr_assert_not_null(p);
  memset(p, fill, n);
  return p;
}

/* ---------------------------------------------------------------- inputs */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}
static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static const uint32_t special_bits[] = {
    0x00000000u, 0x80000000u,                           /* +-0 */
    0x00000001u, 0x807FFFFFu, 0x00400000u,              /* fp32 subnormals */
    0x7F800000u, 0xFF800000u,                           /* +-inf */
    0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFA12345u, /* NaNs, signalling ones too */
    0x43E00000u, 0x43E80000u, 0x43E80001u, 0x43E88000u, /* 448, 464, 464+ulp, 465 */
    0xC3E00000u, 0xC3E80000u, 0xC3E88000u,              /* -448, -464, -465 */
    0x47600000u, 0x47700000u, 0x476FFFFFu,              /* 57344, 61440, 61440-ulp */
    0x477FE000u, 0x477FF000u, 0x33800000u, 0x387FC000u, /* 65504, 65520, 2^-24, fp16 subn */
    0x3B000000u, 0x3A800000u, 0x7F7FFFFFu, 0x00800000u, /* 2^-9, 2^-10, FLT_MAX, min normal */
};
#define NSPECIAL (sizeof special_bits / sizeof special_bits[0])

static float normal_value(int lo, int span) {
  float m = 1.0f + (float)(rnd() >> 41) * (1.0f / 8388608.0f);
  float v = ldexpf(m, lo + (int)(rnd() % (uint64_t)span));
  return (rnd() & 1) ? -v : v;
}

static float gen_value(int64_t M, int64_t K, int64_t r, int64_t c) {
  int style = (int)((r * 5 + 3) % 9);
  if (M >= 256 && K >= 128 && r >= 128 && r < 256 && c < 128) style = 2; /* a zero tile */
  if (M >= 128 && K >= 256 && r < 128 && c >= 128 && c < 256) style = 5; /* a NaN tile */
  if (c % 37 == 5 || (r * 131 + c * 7) % 101 == 0) style = 3;            /* specials */
  switch (style) {
    case 0:
      return normal_value(-10, 21);
    case 1: { /* anything finite, subnormals included */
      uint32_t e = (uint32_t)(rnd() % 255);
      return bitsf((uint32_t)(rnd() & 0x807FFFFFu) | (e << 23));
    }
    case 2:
      return (rnd() & 1) ? 0.0f : -0.0f;
    case 3:
      return (rnd() & 1) ? bitsf(special_bits[rnd() % NSPECIAL]) : normal_value(-3, 12);
    case 4:
      return normal_value(-40, 28); /* bf16 normals, fp16 subnormals and underflow */
    case 5:
      return bitsf((rnd() & 1 ? 0xFFC00000u : 0x7FC00000u) | (uint32_t)(rnd() & 0x3FFFFFu));
    case 6:
      return normal_value(100, 27);
    case 7:
      return c == r % K ? bitsf(rnd() & 1 ? 0x7F800000u : 0xFF800000u) : normal_value(-6, 10);
    default:
      return normal_value(-2, 6);
  }
}

/* Input [M, K] with leading dimension ld in dtype dt; the gap past K is NaN (never read). */
static void *make_input(int64_t M, int64_t K, int64_t ld, xte_dtype dt) {
  size_t n = (size_t)(M * ld);
  float *f = (float *)hcalloc(n * 4, 0);
  void *out;
  xte_tensor a, b;
  int64_t r, c;
  for (r = 0; r < M; r++)
    for (c = 0; c < ld; c++) f[r * ld + c] = c < K ? gen_value(M, K, r, c) : bitsf(0x7FC0DEADu);
  if (dt == XTE_DTYPE_FP32) return f;
  out = hcalloc(n * 2, 0);
  a = xte_tensor_1d(f, XTE_DTYPE_FP32, (int64_t)n);
  b = xte_tensor_1d(out, dt, (int64_t)n);
  cr_assert_eq(xte_cast(&a, &b, 1, cpu), XTE_SUCCESS, "%s", xte_last_error());
  free(f);
  return out;
}

/* ---------------------------------------------------------------- quantize */

static int is_mx(xte_recipe r) {
  return r == XTE_RECIPE_MX_TE || r == XTE_RECIPE_MX_OCP;
}
static int col_transposed(xte_recipe r) {
  return !(r == XTE_RECIPE_MTFP8 || is_mx(r));
}

typedef struct qcase {
  int64_t M, K, ld_in;
  int pad_out; /* 1: outputs with a leading dimension past their width */
  xte_dtype in_dt, q_dt;
  xte_scaling_mode mode;
  xte_recipe recipe;
  xte_scale_layout layout;
  int row, col;
  xte_quant_config cfg;
} qcase;

static void describe(const qcase *q, char *s, size_t n) {
  snprintf(s, n,
           "M=%lld K=%lld ld=%lld pad=%d in=%s q=%s mode=%d recipe=%d layout=%d row=%d col=%d "
           "sat=%d pow2=%d eps=%g",
           (long long)q->M, (long long)q->K, (long long)q->ld_in, q->pad_out,
           xte_dtype_name(q->in_dt), xte_dtype_name(q->q_dt), (int)q->mode, (int)q->recipe,
           (int)q->layout, q->row, q->col, q->cfg.saturate, q->cfg.force_pow_2,
           (double)q->cfg.amax_epsilon);
}

/* One copy's buffers: data [rows, ld] and scales [sr, sc]. */
typedef struct copy_buf {
  int64_t rows, cols, ld, sr, sc;
  size_t qbytes, sbytes;
} copy_buf;

static void geometry(const qcase *q, int columnwise, copy_buf *b) {
  int tr = columnwise && col_transposed(q->recipe);
  b->rows = tr ? q->K : q->M;
  b->cols = tr ? q->M : q->K;
  b->ld = b->cols + (q->pad_out ? (columnwise ? 5 : 3) : 0);
  cr_assert_eq(xte_quantize_scale_shape(q->M, q->K, q->mode, q->recipe, q->layout, columnwise,
                                        &b->sr, &b->sc),
               XTE_SUCCESS, "%s", xte_last_error());
  b->qbytes = (size_t)(b->rows * b->ld);
  b->sbytes = (size_t)(b->sr * b->sc) * (is_mx(q->recipe) ? 1u : 4u);
}

static void fill_qtensor(xte_qtensor *t, const qcase *q, const copy_buf *rb, const copy_buf *cb,
                         void *rq, void *rs, void *cq, void *cs) {
  memset(t, 0, sizeof *t);
  t->scaling_mode = q->mode;
  t->recipe = q->recipe;
  if (rq) {
    t->rowwise = xte_tensor_2d(rq, q->q_dt, rb->rows, rb->cols);
    t->rowwise.ld = rb->ld;
    t->rowwise_scale_inv.data = rs;
    t->rowwise_scale_inv.dtype = is_mx(q->recipe) ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
    t->rowwise_scale_inv.rows = rb->sr;
    t->rowwise_scale_inv.cols = rb->sc;
    t->rowwise_scale_inv.layout = q->layout;
  }
  if (cq) {
    t->columnwise = xte_tensor_2d(cq, q->q_dt, cb->rows, cb->cols);
    t->columnwise.ld = cb->ld;
    t->columnwise_scale_inv.data = cs;
    t->columnwise_scale_inv.dtype = is_mx(q->recipe) ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
    t->columnwise_scale_inv.rows = cb->sr;
    t->columnwise_scale_inv.cols = cb->sc;
    t->columnwise_scale_inv.layout = q->layout;
  }
}

static void run_quant(const qcase *q, const void *h_in, const void *d_in) {
  char desc[320];
  copy_buf rb, cb;
  xte_tensor in_h, in_d;
  xte_qtensor tc, tg;
  uint8_t *c_rq = NULL, *c_rs = NULL, *c_cq = NULL, *c_cs = NULL;
  uint8_t *g_rq[2] = {NULL, NULL}, *g_rs[2] = {NULL, NULL}, *g_cq[2] = {NULL, NULL},
          *g_cs[2] = {NULL, NULL};
  void *d_rq = NULL, *d_rs = NULL, *d_cq = NULL, *d_cs = NULL, *d_amax, *d_scale;
  float c_amax = -1.0f, g_amax[2], c_scale = -1.0f, g_scale[2], given = 0.37f;
  const float amax0 = -2.0f, scale0 = -2.0f;
  const int current = q->recipe == XTE_RECIPE_TE_CURRENT;
  const int delayed = q->recipe == XTE_RECIPE_TE_DELAYED;
  int run;
  xte_status st;

  describe(q, desc, sizeof desc);
  geometry(q, 0, &rb);
  geometry(q, 1, &cb);
  in_h = xte_tensor_2d((void *)h_in, q->in_dt, q->M, q->K);
  in_h.ld = q->ld_in;
  in_d = in_h;
  in_d.data = (void *)d_in;
  if (q->row) {
    c_rq = hcalloc(rb.qbytes, 0xCD);
    c_rs = hcalloc(rb.sbytes, 0xCD);
    for (run = 0; run < 2; run++)
      g_rq[run] = hcalloc(rb.qbytes, 0), g_rs[run] = hcalloc(rb.sbytes, 0);
    d_rq = dalloc(rb.qbytes);
    d_rs = dalloc(rb.sbytes);
  }
  if (q->col) {
    c_cq = hcalloc(cb.qbytes, 0xCD);
    c_cs = hcalloc(cb.sbytes, 0xCD);
    for (run = 0; run < 2; run++)
      g_cq[run] = hcalloc(cb.qbytes, 0), g_cs[run] = hcalloc(cb.sbytes, 0);
    d_cq = dalloc(cb.qbytes);
    d_cs = dalloc(cb.sbytes);
  }
  d_amax = dalloc(4);
  d_scale = dalloc(4);

  fill_qtensor(&tc, q, &rb, &cb, c_rq, c_rs, c_cq, c_cs);
  tc.amax = &c_amax;
  tc.scale = delayed ? &given : (current ? &c_scale : NULL);
  st = xte_quantize(&in_h, &tc, &q->cfg, cpu);
  cr_assert_eq(st, XTE_SUCCESS, "cpu quantize %s: %s", desc, xte_last_error());

  /* twice, from the same starting bytes */
  for (run = 0; run < 2; run++) {
    if (q->row) {
      xte_memset(gpu, d_rq, 0xCD, rb.qbytes);
      xte_memset(gpu, d_rs, 0xCD, rb.sbytes);
    }
    if (q->col) {
      xte_memset(gpu, d_cq, 0xCD, cb.qbytes);
      xte_memset(gpu, d_cs, 0xCD, cb.sbytes);
    }
    cr_assert_eq(xte_memcpy(gpu, d_amax, &amax0, 4, XTE_MEMCPY_HOST_TO_DEVICE), XTE_SUCCESS);
    cr_assert_eq(xte_memcpy(gpu, d_scale, &scale0, 4, XTE_MEMCPY_HOST_TO_DEVICE), XTE_SUCCESS);
    fill_qtensor(&tg, q, &rb, &cb, d_rq, d_rs, d_cq, d_cs);
    tg.amax = (float *)d_amax;
    tg.scale = delayed ? &given : (current ? (float *)d_scale : NULL); /* delayed: read on host */
    st = xte_quantize(&in_d, &tg, &q->cfg, gpu);
    cr_assert_eq(st, XTE_SUCCESS, "gpu quantize %s (run %d): %s", desc, run + 1, xte_last_error());
    if (q->row) {
      get(g_rq[run], d_rq, rb.qbytes);
      get(g_rs[run], d_rs, rb.sbytes);
    }
    if (q->col) {
      get(g_cq[run], d_cq, cb.qbytes);
      get(g_cs[run], d_cs, cb.sbytes);
    }
    get(&g_amax[run], d_amax, 4);
    get(&g_scale[run], d_scale, 4);
  }

  if (q->row) {
    same("rowwise data", desc, g_rq[0], c_rq, rb.qbytes);
    same("rowwise scale_inv", desc, g_rs[0], c_rs, rb.sbytes);
    same_twice("rowwise data", desc, g_rq[1], g_rq[0], rb.qbytes);
    same_twice("rowwise scale_inv", desc, g_rs[1], g_rs[0], rb.sbytes);
  }
  if (q->col) {
    same("columnwise data", desc, g_cq[0], c_cq, cb.qbytes);
    same("columnwise scale_inv", desc, g_cs[0], c_cs, cb.sbytes);
    same_twice("columnwise data", desc, g_cq[1], g_cq[0], cb.qbytes);
    same_twice("columnwise scale_inv", desc, g_cs[1], g_cs[0], cb.sbytes);
  }
  same("amax", desc, &g_amax[0], &c_amax, 4);
  same_twice("amax", desc, &g_amax[1], &g_amax[0], 4);
  if (current) {
    same("scale", desc, &g_scale[0], &c_scale, 4);
    same_twice("scale", desc, &g_scale[1], &g_scale[0], 4);
  }
  free(c_rq), free(c_rs), free(c_cq), free(c_cs);
  for (run = 0; run < 2; run++) free(g_rq[run]), free(g_rs[run]), free(g_cq[run]), free(g_cs[run]);
  dfree(d_rq), dfree(d_rs), dfree(d_cq), dfree(d_cs), dfree(d_amax), dfree(d_scale);
}

typedef struct shape {
  int64_t M, K, ld_in;
  int pad_out;
} shape;

static int shapes(shape *s) {
  int n = 0;
  int64_t rm = 129 + (int64_t)(rnd() % 300), rk = 33 + (int64_t)(rnd() % 400);
  s[n++] = (shape){1, 16, 16, 0};
  s[n++] = (shape){65, 96, 96, 0};
  if (env_on("XTE_TEST_GPU_REDUCED")) { /* compute-sanitizer: a tail, a tile, a stride */
    s[n - 1] = (shape){129, 160, 163, 1};
    return n;
  }
  s[n++] = (shape){993, 512, 512, 0};
  s[n++] = (shape){1024, 1, 1, 0};
  s[n++] = (shape){rm, rk, rk, 0};
  s[n++] = (shape){65, 96, 101, 1}; /* strided input and outputs */
  return n;
}

static const xte_dtype in_dtypes[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
static const xte_dtype q_dtypes[] = {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2};

static int valid(int mode, int recipe, int layout) {
  int64_t r, c;
  return xte_quantize_scale_shape(4, 4, (xte_scaling_mode)mode, (xte_recipe)recipe,
                                  (xte_scale_layout)layout, 0, &r, &c) == XTE_SUCCESS;
}

Test(gpu_quantize, quantize_matches_cpu, .timeout = 1200) {
  shape sh[8];
  int ns, si, di, fi, mode, recipe, layout, which, runs = 0, variant = 0;
  int cases_failed[XTE_RECIPE_COUNT] = {0}, cases_run[XTE_RECIPE_COUNT] = {0};
  streams();
  ns = shapes(sh);
  for (si = 0; si < ns; si++) {
    for (di = 0; di < 3; di++) {
      if (env_on("XTE_TEST_GPU_REDUCED") && in_dtypes[di] != XTE_DTYPE_BF16) continue;
      void *h_in = make_input(sh[si].M, sh[si].K, sh[si].ld_in, in_dtypes[di]);
      size_t bytes = (size_t)(sh[si].M * sh[si].ld_in) * xte_dtype_size(in_dtypes[di]);
      void *d_in = dup_to_gpu(h_in, bytes);
      for (fi = 0; fi < 2; fi++)
        for (mode = 0; mode < XTE_SCALING_COUNT; mode++)
          for (recipe = 0; recipe < XTE_RECIPE_COUNT; recipe++)
            for (layout = 0; layout < XTE_SCALE_LAYOUT_COUNT; layout++) {
              if (!valid(mode, recipe, layout)) continue;
              for (which = 1; which <= 3; which++) {
                qcase q;
                q.M = sh[si].M;
                q.K = sh[si].K;
                q.ld_in = sh[si].ld_in;
                q.pad_out = sh[si].pad_out;
                q.in_dt = in_dtypes[di];
                q.q_dt = q_dtypes[fi];
                q.mode = (xte_scaling_mode)mode;
                q.recipe = (xte_recipe)recipe;
                q.layout = (xte_scale_layout)layout;
                q.row = which & 1;
                q.col = (which >> 1) & 1;
                q.cfg = xte_quant_config_default();
                /* rotate the configuration over the cases */
                q.cfg.saturate = (variant & 1) ? 0 : 1;
                q.cfg.force_pow_2 = (variant & 2) ? 0 : 1;
                q.cfg.amax_epsilon = variant % 5 == 4 ? 1e-3f : 0.0f;
                variant++;
                {
                  int before = failures + nondeterministic;
                  run_quant(&q, h_in, d_in);
                  cases_failed[recipe] += failures + nondeterministic > before;
                  cases_run[recipe]++;
                }
                runs++;
              }
            }
      free(h_in);
      dfree(d_in);
    }
  }
  for (recipe = 0; recipe < XTE_RECIPE_COUNT; recipe++)
    if (cases_failed[recipe])
      cr_log_info("recipe %d: %d of %d quantize cases differ", recipe, cases_failed[recipe],
                  cases_run[recipe]);
  cr_expect_eq(failures, 0, "%d mismatches over %d quantize cases", failures, runs);
  cr_expect_eq(nondeterministic, 0, "%d second-run differences over %d quantize cases",
               nondeterministic, runs);
  cr_log_info("%d quantize cases compared, each run twice on the GPU", runs);
}

/* ---------------------------------------------------------------- dequantize */

Test(gpu_quantize, dequantize_matches_cpu, .timeout = 1200) {
  shape sh[8];
  int ns, si, fi, mode, recipe, layout, colw, oi, runs = 0;
  const xte_dtype outs[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  streams();
  ns = shapes(sh);
  for (si = 0; si < ns; si++) {
    void *h_in = make_input(sh[si].M, sh[si].K, sh[si].ld_in, XTE_DTYPE_FP32);
    for (fi = 0; fi < 2; fi++)
      for (mode = 0; mode < XTE_SCALING_COUNT; mode++)
        for (recipe = 0; recipe < XTE_RECIPE_COUNT; recipe++)
          for (layout = 0; layout < XTE_SCALE_LAYOUT_COUNT; layout++) {
            qcase q;
            copy_buf rb, cb;
            xte_qtensor t, tg;
            xte_tensor in;
            uint8_t *rq, *rs, *cq, *cs;
            void *d_rq, *d_rs, *d_cq, *d_cs;
            float given = 3.0f;
            size_t i;
            if (!valid(mode, recipe, layout)) continue;
            memset(&q, 0, sizeof q);
            q.M = sh[si].M;
            q.K = sh[si].K;
            q.ld_in = sh[si].ld_in;
            q.pad_out = sh[si].pad_out;
            q.in_dt = XTE_DTYPE_FP32;
            q.q_dt = q_dtypes[fi];
            q.mode = (xte_scaling_mode)mode;
            q.recipe = (xte_recipe)recipe;
            q.layout = (xte_scale_layout)layout;
            q.cfg = xte_quant_config_default();
            geometry(&q, 0, &rb);
            geometry(&q, 1, &cb);
            rq = hcalloc(rb.qbytes, 0);
            rs = hcalloc(rb.sbytes, 0);
            cq = hcalloc(cb.qbytes, 0);
            cs = hcalloc(cb.sbytes, 0);
            fill_qtensor(&t, &q, &rb, &cb, rq, rs, cq, cs);
            t.scale = &given;
            in = xte_tensor_2d(h_in, XTE_DTYPE_FP32, q.M, q.K);
            in.ld = q.ld_in;
            cr_assert_eq(xte_quantize(&in, &t, &q.cfg, cpu), XTE_SUCCESS, "%s", xte_last_error());
            /* every fp8 byte, NaN codes included, under the scales just made */
            for (i = 0; i < rb.qbytes; i++) rq[i] = (uint8_t)rnd();
            for (i = 0; i < cb.qbytes; i++) cq[i] = (uint8_t)rnd();
            d_rq = dup_to_gpu(rq, rb.qbytes);
            d_rs = dup_to_gpu(rs, rb.sbytes);
            d_cq = dup_to_gpu(cq, cb.qbytes);
            d_cs = dup_to_gpu(cs, cb.sbytes);
            fill_qtensor(&tg, &q, &rb, &cb, d_rq, d_rs, d_cq, d_cs);
            for (colw = 0; colw < 2; colw++) {
              const copy_buf *b = colw ? &cb : &rb;
              for (oi = 0; oi < 3; oi++) {
                char desc[400];
                int64_t ldo = b->cols + (q.pad_out ? 7 : 0);
                size_t ob = (size_t)(b->rows * ldo) * xte_dtype_size(outs[oi]);
                void *oc = hcalloc(ob, 0xAB), *og = hcalloc(ob, 0), *od = dalloc(ob);
                xte_tensor to = xte_tensor_2d(oc, outs[oi], b->rows, b->cols), tgo;
                to.ld = ldo;
                tgo = to;
                tgo.data = od;
                xte_memset(gpu, od, 0xAB, ob);
                describe(&q, desc, sizeof desc);
                snprintf(desc + strlen(desc), sizeof desc - strlen(desc), " dequant col=%d out=%s",
                         colw, xte_dtype_name(outs[oi]));
                cr_assert_eq(xte_dequantize(&t, colw, &to, cpu), XTE_SUCCESS, "%s: %s", desc,
                             xte_last_error());
                cr_assert_eq(xte_dequantize(&tg, colw, &tgo, gpu), XTE_SUCCESS, "%s: %s", desc,
                             xte_last_error());
                get(og, od, ob);
                same("dequantized", desc, og, oc, ob);
                xte_memset(gpu, od, 0xAB, ob); /* the second run, from the same bytes */
                cr_assert_eq(xte_dequantize(&tg, colw, &tgo, gpu), XTE_SUCCESS, "%s: %s", desc,
                             xte_last_error());
                get(oc, od, ob);
                same_twice("dequantized", desc, oc, og, ob);
                free(oc), free(og), dfree(od);
                runs++;
              }
            }
            free(rq), free(rs), free(cq), free(cs);
            dfree(d_rq), dfree(d_rs), dfree(d_cq), dfree(d_cs);
          }
    free(h_in);
  }
  cr_expect_eq(failures, 0, "%d mismatches over %d dequantize cases", failures, runs);
  cr_expect_eq(nondeterministic, 0, "%d second-run differences over %d dequantize cases",
               nondeterministic, runs);
}

/* ---------------------------------------------------------------- cast */

static void cast_both(const void *h_in, xte_dtype in_dt, int64_t n, xte_dtype out_dt, int sat) {
  char desc[96];
  size_t ib = (size_t)n * xte_dtype_size(in_dt), ob = (size_t)n * xte_dtype_size(out_dt);
  void *oc = hcalloc(ob, 0), *og = hcalloc(ob, 0), *d_in = dup_to_gpu(h_in, ib),
       *d_out = dalloc(ob);
  xte_tensor a = xte_tensor_1d((void *)h_in, in_dt, n), b = xte_tensor_1d(oc, out_dt, n);
  snprintf(desc, sizeof desc, "cast %s -> %s sat=%d n=%lld", xte_dtype_name(in_dt),
           xte_dtype_name(out_dt), sat, (long long)n);
  cr_assert_eq(xte_cast(&a, &b, sat, cpu), XTE_SUCCESS, "%s: %s", desc, xte_last_error());
  a.data = d_in;
  b.data = d_out;
  cr_assert_eq(xte_cast(&a, &b, sat, gpu), XTE_SUCCESS, "%s: %s", desc, xte_last_error());
  get(og, d_out, ob);
  same("cast", desc, og, oc, ob);
  xte_memset(gpu, d_out, 0, ob); /* the second run */
  cr_assert_eq(xte_cast(&a, &b, sat, gpu), XTE_SUCCESS, "%s: %s", desc, xte_last_error());
  get(oc, d_out, ob);
  same_twice("cast", desc, oc, og, ob);
  free(oc), free(og), dfree(d_in), dfree(d_out);
}

Test(gpu_quantize, cast_matches_cpu, .timeout = 600) {
  const xte_dtype all[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16, XTE_DTYPE_E4M3,
                           XTE_DTYPE_E5M2};
  uint16_t *h16 = (uint16_t *)hcalloc(65536 * 2, 0);
  uint8_t *h8 = (uint8_t *)hcalloc(256, 0);
  const int64_t n32 = (env_on("XTE_TEST_GPU_REDUCED") ? 4096 : 1 << 20) + (int64_t)NSPECIAL;
  uint32_t *h32 = (uint32_t *)hcalloc((size_t)n32 * 4, 0);
  int i, o, sat;
  streams();
  for (i = 0; i < 65536; i++) h16[i] = (uint16_t)i;
  for (i = 0; i < 256; i++) h8[i] = (uint8_t)i;
  for (i = 0; i < (int)NSPECIAL; i++) h32[i] = special_bits[i];
  for (i = (int)NSPECIAL; i < n32; i++) h32[i] = (uint32_t)rnd();
  for (o = 0; o < 5; o++)
    for (sat = 0; sat < 2; sat++) {
      int64_t n16 = env_on("XTE_TEST_GPU_REDUCED") ? 4096 : 65536;
      cast_both(h16, XTE_DTYPE_BF16, n16, all[o], sat); /* every bf16 pattern */
      cast_both(h16, XTE_DTYPE_FP16, n16, all[o], sat); /* every fp16 pattern */
      cast_both(h8, XTE_DTYPE_E4M3, 256, all[o], sat);
      cast_both(h8, XTE_DTYPE_E5M2, 256, all[o], sat);
      cast_both(h32, XTE_DTYPE_FP32, n32, all[o], sat);
    }
  cr_expect_eq(failures, 0, "%d cast mismatches", failures);
  cr_expect_eq(nondeterministic, 0, "%d cast second-run differences", nondeterministic);
  free(h16), free(h8), free(h32);
}

/* ---------------------------------------------------------------- more than 2^31 elements */

/* [HUGE_M, HUGE_K] bf16: 2^31 + 4096 elements, so every element index past 2^31 - 1 is used. */
#define HUGE_K ((int64_t)4096)
#define HUGE_M ((int64_t)524289)
#define HUGE_N (HUGE_M * HUGE_K)

static int huge_wanted(void) {
  if (env_on("XTE_TEST_GPU_HUGE")) return 1;
  cr_log_info("more than 2^31 elements: not run (set XTE_TEST_GPU_HUGE=1)");
  return 0;
}

/* Random finite bf16 below 2 in magnitude (subnormals and zeros included), and special values
 * past element 2^31: +-inf, NaNs, the largest finite bf16, a subnormal. */
static uint16_t *huge_input(void) {
  uint16_t *h = (uint16_t *)malloc((size_t)HUGE_N * 2);
  uint64_t x = 0x243F6A8885A308D3ull;
  int64_t i;
  static const uint16_t late[] = {0x7F80, 0xFF80, 0x7FC1, 0xFFA0, 0x7F7F, 0x0001, 0x8000, 0x43E0};
  cr_assert_not_null(h);
  for (i = 0; i < HUGE_N; i += 4) {
    int j;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    for (j = 0; j < 4 && i + j < HUGE_N; j++) h[i + j] = (uint16_t)(x >> (16 * j)) & 0xBFFFu;
  }
  for (i = 0; i < (int64_t)(sizeof late / sizeof late[0]); i++) {
    h[((int64_t)1 << 31) + 3 + 131 * i] = late[i];
    h[HUGE_N - 1 - 7 * i] = late[i];
  }
  return h;
}

static qcase huge_case(int row, int col) {
  qcase q;
  memset(&q, 0, sizeof q);
  q.M = HUGE_M;
  q.K = HUGE_K;
  q.ld_in = HUGE_K;
  q.in_dt = XTE_DTYPE_BF16;
  q.q_dt = XTE_DTYPE_E4M3;
  q.mode = XTE_SCALING_BLOCK_1x128;
  q.recipe = XTE_RECIPE_TE_BLOCK;
  q.layout = XTE_SCALE_LAYOUT_COMPACT;
  q.row = row;
  q.col = col;
  q.cfg = xte_quant_config_default();
  return q;
}

Test(gpu_quantize, huge_quantize, .timeout = 900) {
  uint16_t *h;
  void *d;
  qcase q;
  if (!huge_wanted()) return;
  streams();
  h = huge_input();
  d = dup_to_gpu(h, (size_t)HUGE_N * 2);
  q = huge_case(1, 1);
  run_quant(&q, h, d);
  dfree(d);
  free(h);
  cr_expect_eq(failures, 0, "quantize of %lld elements: %d mismatches", (long long)HUGE_N,
               failures);
  cr_expect_eq(nondeterministic, 0, "quantize of %lld elements: second run differs",
               (long long)HUGE_N);
}

Test(gpu_quantize, huge_dequantize, .timeout = 900) {
  uint16_t *h;
  qcase q;
  copy_buf rb, cb;
  xte_qtensor t, tg;
  xte_tensor in, out, outg;
  uint8_t *rq, *rs;
  void *d_rq, *d_rs, *d_out, *oc, *og;
  size_t ob = (size_t)HUGE_N * 2;
  int run;
  if (!huge_wanted()) return;
  streams();
  h = huge_input();
  q = huge_case(1, 0);
  geometry(&q, 0, &rb);
  geometry(&q, 1, &cb);
  rq = hcalloc(rb.qbytes, 0);
  rs = hcalloc(rb.sbytes, 0);
  fill_qtensor(&t, &q, &rb, &cb, rq, rs, NULL, NULL);
  in = xte_tensor_2d(h, XTE_DTYPE_BF16, q.M, q.K);
  cr_assert_eq(xte_quantize(&in, &t, &q.cfg, cpu), XTE_SUCCESS, "%s", xte_last_error());
  free(h);
  d_rq = dup_to_gpu(rq, rb.qbytes);
  d_rs = dup_to_gpu(rs, rb.sbytes);
  fill_qtensor(&tg, &q, &rb, &cb, d_rq, d_rs, NULL, NULL);
  oc = hcalloc(ob, 0xAB);
  og = hcalloc(ob, 0);
  d_out = dalloc(ob);
  out = xte_tensor_2d(oc, XTE_DTYPE_BF16, q.M, q.K);
  outg = out;
  outg.data = d_out;
  cr_assert_eq(xte_dequantize(&t, 0, &out, cpu), XTE_SUCCESS, "%s", xte_last_error());
  for (run = 0; run < 2; run++) {
    xte_memset(gpu, d_out, 0xAB, ob);
    cr_assert_eq(xte_dequantize(&tg, 0, &outg, gpu), XTE_SUCCESS, "%s", xte_last_error());
    get(og, d_out, ob);
    same("dequantized", run ? "huge dequantize (run 2)" : "huge dequantize", og, oc, ob);
  }
  free(rq), free(rs), free(oc), free(og);
  dfree(d_rq), dfree(d_rs), dfree(d_out);
  cr_expect_eq(failures, 0, "dequantize of %lld elements: %d mismatches", (long long)HUGE_N,
               failures);
}

Test(gpu_quantize, huge_cast, .timeout = 900) {
  uint16_t *h;
  if (!huge_wanted()) return;
  streams();
  h = huge_input();
  cast_both(h, XTE_DTYPE_BF16, HUGE_N, XTE_DTYPE_E4M3, 1);
  free(h);
  cr_expect_eq(failures, 0, "cast of %lld elements: %d mismatches", (long long)HUGE_N, failures);
  cr_expect_eq(nondeterministic, 0, "cast of %lld elements: second run differs", (long long)HUGE_N);
}

/* ---------------------------------------------------------------- plugin plumbing */

Test(gpu_quantize, memory_and_streams) {
  uint8_t h[1000], back[1000];
  void *a, *b;
  int i;
  streams();
  for (i = 0; i < 1000; i++) h[i] = (uint8_t)(i * 7);
  a = dup_to_gpu(h, sizeof h);
  b = dalloc(sizeof h);
  cr_assert_eq(xte_memcpy(gpu, b, a, sizeof h, XTE_MEMCPY_DEVICE_TO_DEVICE), XTE_SUCCESS);
  get(back, b, sizeof back);
  cr_expect_arr_eq(back, h, sizeof h);
  cr_assert_eq(xte_memset(gpu, b, 0x5A, 100), XTE_SUCCESS);
  get(back, b, sizeof back);
  for (i = 0; i < 100; i++) cr_expect_eq(back[i], 0x5A);
  cr_expect_eq(back[100], h[100]);
  cr_expect_eq(xte_stream_synchronize(gpu), XTE_SUCCESS);
  if (!getenv("XTE_TEST_GPU_AS_CPU")) cr_expect_eq(xte_stream_backend(gpu), XTE_BACKEND_CUDA);
  dfree(a);
  dfree(b);
  cr_expect_eq(xte_stream_destroy(gpu), XTE_SUCCESS);
}

/* Runs everywhere: when the plugin is built it must be found, and say why it has no device. */
Test(gpu_quantize, plugin_reports_itself) {
  xte_backend_info info;
  cr_assert_eq(xte_get_backend_info(&info), XTE_SUCCESS);
  fprintf(stderr, "cuda plugin: found=%d devices=%d status: %s\n", info.cuda_plugin_found,
          info.num_cuda_gpus, info.cuda_plugin_status);
#ifdef XTE_TEST_HAVE_CUDA_PLUGIN
  cr_expect_eq(info.cuda_plugin_found, 1, "libxte_cuda.so was built but not loaded: %s",
               info.cuda_plugin_status);
#endif
  cr_expect_neq(info.cuda_plugin_status[0], '\0', "the cuda status is empty");
  if (info.num_cuda_gpus == 0)
    cr_expect(strstr(info.cuda_plugin_status, "no ") != NULL ||
                  strstr(info.cuda_plugin_status, "not loaded") != NULL,
              "no CUDA device, but the status does not say why: %s", info.cuda_plugin_status);
}
