/* Bad input on every entry point: each call must return the documented status, xte_last_error()
 * must name the argument at fault, and no output buffer (pre-filled with a canary pattern) may
 * change. A successful call clears the message. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xte/xte.h>

#define CANARY 0xA5

static void expect_fail_at(xte_status got, xte_status want, const char *needle, const char *expr,
                           int line) {
  const char *msg = xte_last_error();
  cr_expect_eq(got, want, "line %d: %s returned %s, want %s (message: %s)", line, expr,
               xte_status_string(got), xte_status_string(want), msg ? msg : "(null)");
  cr_expect(msg != NULL && strstr(msg, needle) != NULL,
            "line %d: %s: message \"%s\" does not name \"%s\"", line, expr, msg ? msg : "(null)",
            needle);
}
#define EXPECT_FAIL(call, status, needle) \
  expect_fail_at((call), (status), (needle), #call, __LINE__)

static int all_canary(const void *p, size_t n) {
  size_t i;
  for (i = 0; i < n; i++)
    if (((const uint8_t *)p)[i] != CANARY) return 0;
  return 1;
}

/* ------------------------------------------------------------------ a valid quantize setup */

#define M_ 4
#define K_ 256

typedef struct fixture {
  float in[M_ * K_ + 1];
  uint8_t rq[M_ * K_ + 64], cq[M_ * K_ + 64];
  float rs[64 + 1], cs[1024 + 1];
  float amax, scale;
  xte_tensor x;
  xte_qtensor q;
  xte_quant_config cfg;
} fixture;

static fixture F;

/* TE_BLOCK 1x128, fp32 [4, 256] -> e4m3 both copies, COMPACT scales. */
static void setup_valid(void) {
  int i;
  int64_t r, c;
  for (i = 0; i < M_ * K_; i++) F.in[i] = (float)(i % 17) - 8.0f;
  F.x = xte_tensor_2d(F.in, XTE_DTYPE_FP32, M_, K_);
  memset(&F.q, 0, sizeof F.q);
  F.q.rowwise = xte_tensor_2d(F.rq, XTE_DTYPE_E4M3, M_, K_);
  F.q.columnwise = xte_tensor_2d(F.cq, XTE_DTYPE_E4M3, K_, M_);
  cr_assert_eq(xte_quantize_scale_shape(M_, K_, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                        XTE_SCALE_LAYOUT_COMPACT, 0, &r, &c),
               XTE_SUCCESS);
  cr_assert(r == M_ && c == 2);
  F.q.rowwise_scale_inv.data = F.rs;
  F.q.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  F.q.rowwise_scale_inv.rows = r;
  F.q.rowwise_scale_inv.cols = c;
  F.q.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  cr_assert_eq(xte_quantize_scale_shape(M_, K_, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                        XTE_SCALE_LAYOUT_COMPACT, 1, &r, &c),
               XTE_SUCCESS);
  cr_assert(r == K_ && c == 1);
  F.q.columnwise_scale_inv = F.q.rowwise_scale_inv;
  F.q.columnwise_scale_inv.data = F.cs;
  F.q.columnwise_scale_inv.rows = r;
  F.q.columnwise_scale_inv.cols = c;
  F.q.scaling_mode = XTE_SCALING_BLOCK_1x128;
  F.q.recipe = XTE_RECIPE_TE_BLOCK;
  F.q.amax = &F.amax;
  F.q.scale = &F.scale;
  F.cfg = xte_quant_config_default();
  memset(F.rq, CANARY, sizeof F.rq);
  memset(F.cq, CANARY, sizeof F.cq);
  memset(F.rs, CANARY, sizeof F.rs);
  memset(F.cs, CANARY, sizeof F.cs);
  memset(&F.amax, CANARY, sizeof F.amax);
  memset(&F.scale, CANARY, sizeof F.scale);
}

static void expect_untouched(int line) {
  cr_expect(all_canary(F.rq, sizeof F.rq), "line %d: rowwise data written", line);
  cr_expect(all_canary(F.cq, sizeof F.cq), "line %d: columnwise data written", line);
  cr_expect(all_canary(F.rs, sizeof F.rs), "line %d: rowwise scales written", line);
  cr_expect(all_canary(F.cs, sizeof F.cs), "line %d: columnwise scales written", line);
  cr_expect(all_canary(&F.amax, sizeof F.amax), "line %d: amax written", line);
  if (F.q.recipe != XTE_RECIPE_TE_DELAYED)
    cr_expect(all_canary(&F.scale, sizeof F.scale), "line %d: scale written", line);
}

/* Runs xte_quantize on the (mutated) fixture, checks the failure and untouched outputs. */
#define QFAIL(status, needle)                                                                  \
  do {                                                                                         \
    expect_fail_at(xte_quantize(&F.x, &F.q, &F.cfg, NULL), (status), (needle), "xte_quantize", \
                   __LINE__);                                                                  \
    expect_untouched(__LINE__);                                                                \
    setup_valid();                                                                             \
  } while (0)

Test(bad_input, quantize_valid_baseline) {
  setup_valid();
  cr_assert_eq(xte_quantize(&F.x, &F.q, &F.cfg, NULL), XTE_SUCCESS, "%s", xte_last_error());
  cr_expect_str_empty(xte_last_error());
  cr_expect(!all_canary(F.rq, M_ * K_));
  cr_expect(!all_canary(F.cq, M_ * K_));
  /* a failure then a success: the message is cleared */
  cr_assert_neq(xte_quantize(NULL, &F.q, &F.cfg, NULL), XTE_SUCCESS);
  cr_expect_str_not_empty(xte_last_error());
  cr_assert_eq(xte_quantize(&F.x, &F.q, NULL, NULL), XTE_SUCCESS);
  cr_expect_str_empty(xte_last_error());
}

Test(bad_input, quantize_pointers) {
  setup_valid();
  EXPECT_FAIL(xte_quantize(NULL, &F.q, &F.cfg, NULL), XTE_ERROR_NULL_POINTER, "input");
  expect_untouched(__LINE__);
  EXPECT_FAIL(xte_quantize(&F.x, NULL, &F.cfg, NULL), XTE_ERROR_NULL_POINTER, "out");
  expect_untouched(__LINE__);
  F.x.data = NULL;
  QFAIL(XTE_ERROR_NULL_POINTER, "input->data");
  F.q.rowwise.data = NULL;
  F.q.columnwise.data = NULL;
  QFAIL(XTE_ERROR_NULL_POINTER, "out->rowwise.data");
  F.q.rowwise_scale_inv.data = NULL;
  QFAIL(XTE_ERROR_NULL_POINTER, "out->rowwise_scale_inv");
  F.q.columnwise_scale_inv.data = NULL;
  QFAIL(XTE_ERROR_NULL_POINTER, "out->columnwise_scale_inv");
  F.q.recipe = XTE_RECIPE_TE_DELAYED;
  F.q.scaling_mode = XTE_SCALING_PER_TENSOR;
  F.q.rowwise_scale_inv.rows = F.q.rowwise_scale_inv.cols = 1;
  F.q.columnwise_scale_inv.rows = F.q.columnwise_scale_inv.cols = 1;
  F.q.scale = NULL;
  QFAIL(XTE_ERROR_NULL_POINTER, "out->scale");
}

Test(bad_input, quantize_dtypes) {
  setup_valid();
  F.x.dtype = XTE_DTYPE_E4M3;
  QFAIL(XTE_ERROR_DTYPE, "input");
  F.x.dtype = XTE_DTYPE_INT32;
  QFAIL(XTE_ERROR_DTYPE, "input");
  F.x.dtype = (xte_dtype)99;
  QFAIL(XTE_ERROR_DTYPE, "input");
  F.q.rowwise.dtype = XTE_DTYPE_FP32;
  QFAIL(XTE_ERROR_DTYPE, "out->rowwise");
  F.q.rowwise.dtype = XTE_DTYPE_E8M0;
  QFAIL(XTE_ERROR_DTYPE, "out->rowwise");
  F.q.columnwise.dtype = XTE_DTYPE_BF16;
  QFAIL(XTE_ERROR_DTYPE, "out->columnwise");
  F.q.columnwise.dtype = XTE_DTYPE_E5M2; /* differs from the rowwise copy */
  QFAIL(XTE_ERROR_DTYPE, "out->columnwise");
  F.q.rowwise_scale_inv.dtype = XTE_DTYPE_E8M0;
  QFAIL(XTE_ERROR_DTYPE, "out->rowwise_scale_inv");
  F.q.columnwise_scale_inv.dtype = XTE_DTYPE_BF16;
  QFAIL(XTE_ERROR_DTYPE, "out->columnwise_scale_inv");
}

Test(bad_input, quantize_shapes) {
  setup_valid();
  F.x.rank = 0;
  QFAIL(XTE_ERROR_SHAPE, "input");
  F.x.rank = XTE_MAX_RANK + 1;
  QFAIL(XTE_ERROR_SHAPE, "input");
  F.x.shape[0] = -4;
  QFAIL(XTE_ERROR_SHAPE, "input");
  F.x.ld = K_ - 1;
  QFAIL(XTE_ERROR_SHAPE, "input");
  F.q.rowwise.shape[1] = K_ - 1;
  QFAIL(XTE_ERROR_SHAPE, "out->rowwise");
  F.q.rowwise.shape[0] = M_ + 1;
  QFAIL(XTE_ERROR_SHAPE, "out->rowwise");
  F.q.rowwise.ld = 3;
  QFAIL(XTE_ERROR_SHAPE, "out->rowwise");
  F.q.columnwise.shape[0] = M_; /* not the transpose */
  F.q.columnwise.shape[1] = K_;
  QFAIL(XTE_ERROR_SHAPE, "out->columnwise");
  /* scale buffers: too small, or large enough but not the layout's shape */
  F.q.rowwise_scale_inv.rows = M_ - 1;
  QFAIL(XTE_ERROR_BUFFER_TOO_SMALL, "out->rowwise_scale_inv");
  F.q.columnwise_scale_inv.rows = 0;
  QFAIL(XTE_ERROR_BUFFER_TOO_SMALL, "out->columnwise_scale_inv");
  F.q.rowwise_scale_inv.rows = -1;
  QFAIL(XTE_ERROR_BUFFER_TOO_SMALL, "out->rowwise_scale_inv");
  F.q.rowwise_scale_inv.rows = 2;
  F.q.rowwise_scale_inv.cols = M_;
  QFAIL(XTE_ERROR_SHAPE, "out->rowwise_scale_inv");
  F.q.columnwise_scale_inv.rows = 1;
  F.q.columnwise_scale_inv.cols = K_;
  QFAIL(XTE_ERROR_SHAPE, "out->columnwise_scale_inv");
  /* rows x cols past int64: more than any layout needs, not the layout's shape (the product
   * wrapped to 0 before, "too small") */
  F.q.rowwise_scale_inv.rows = (int64_t)1 << 32;
  F.q.rowwise_scale_inv.cols = (int64_t)1 << 32;
  QFAIL(XTE_ERROR_SHAPE, "out->rowwise_scale_inv");
  F.q.columnwise_scale_inv.rows = INT64_MAX;
  F.q.columnwise_scale_inv.cols = 3;
  QFAIL(XTE_ERROR_SHAPE, "out->columnwise_scale_inv");
}

Test(bad_input, quantize_alignment) {
  setup_valid();
  F.q.rowwise_scale_inv.data = (char *)F.rs + 1;
  QFAIL(XTE_ERROR_ALIGNMENT, "out->rowwise_scale_inv");
  F.q.columnwise_scale_inv.data = (char *)F.cs + 2;
  QFAIL(XTE_ERROR_ALIGNMENT, "out->columnwise_scale_inv");
  F.x.data = (char *)F.in + 1;
  QFAIL(XTE_ERROR_ALIGNMENT, "input");
  /* the optional fp32 outputs (inside F.amax / F.scale, whose canaries must survive) */
  F.q.amax = (float *)(void *)((char *)&F.amax + 1);
  QFAIL(XTE_ERROR_ALIGNMENT, "out->amax");
  F.q.amax = (float *)(void *)((char *)&F.amax + 2);
  QFAIL(XTE_ERROR_ALIGNMENT, "out->amax");
  F.q.recipe = XTE_RECIPE_TE_CURRENT;
  F.q.scaling_mode = XTE_SCALING_PER_TENSOR;
  F.q.rowwise_scale_inv.rows = F.q.rowwise_scale_inv.cols = 1;
  F.q.columnwise_scale_inv.rows = F.q.columnwise_scale_inv.cols = 1;
  F.q.scale = (float *)(void *)((char *)&F.scale + 3);
  QFAIL(XTE_ERROR_ALIGNMENT, "out->scale");
}

Test(bad_input, quantize_modes_recipes_layouts) {
  setup_valid();
  F.q.scaling_mode = XTE_SCALING_MXFP8_1x32; /* TE_BLOCK does not define MXFP8 */
  QFAIL(XTE_ERROR_UNSUPPORTED, "scaling_mode");
  F.q.scaling_mode = XTE_SCALING_PER_TENSOR;
  QFAIL(XTE_ERROR_UNSUPPORTED, "scaling_mode");
  F.q.recipe = XTE_RECIPE_MX_TE; /* MX recipes only take MXFP8_1x32 */
  QFAIL(XTE_ERROR_UNSUPPORTED, "scaling_mode");
  F.q.recipe = XTE_RECIPE_TE_CURRENT; /* per-tensor recipes only take PER_TENSOR */
  QFAIL(XTE_ERROR_UNSUPPORTED, "scaling_mode");
  F.q.scaling_mode = (xte_scaling_mode)17;
  QFAIL(XTE_ERROR_INVALID_ARGUMENT, "scaling_mode");
  F.q.scaling_mode = (xte_scaling_mode)-1;
  QFAIL(XTE_ERROR_INVALID_ARGUMENT, "scaling_mode");
  F.q.recipe = (xte_recipe)XTE_RECIPE_COUNT;
  QFAIL(XTE_ERROR_INVALID_ARGUMENT, "recipe");
  F.q.recipe = (xte_recipe)-3;
  QFAIL(XTE_ERROR_INVALID_ARGUMENT, "recipe");
  F.q.rowwise_scale_inv.layout = (xte_scale_layout)9;
  QFAIL(XTE_ERROR_INVALID_ARGUMENT, "layout");
  F.q.columnwise_scale_inv.layout = XTE_SCALE_LAYOUT_MX_SWIZZLED; /* MX recipes only */
  QFAIL(XTE_ERROR_UNSUPPORTED, "layout");
}

Test(bad_input, quantize_mx_layouts) {
  uint8_t e8[1024];
  setup_valid();
  memset(e8, CANARY, sizeof e8);
  /* a valid MX setup, then the layouts MX does not take */
  F.q.recipe = XTE_RECIPE_MX_TE;
  F.q.scaling_mode = XTE_SCALING_MXFP8_1x32;
  F.q.columnwise.data = NULL;
  F.q.rowwise_scale_inv.data = e8;
  F.q.rowwise_scale_inv.dtype = XTE_DTYPE_E8M0;
  F.q.rowwise_scale_inv.rows = M_;
  F.q.rowwise_scale_inv.cols = K_ / 32;
  F.q.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_TE_GEMM;
  EXPECT_FAIL(xte_quantize(&F.x, &F.q, &F.cfg, NULL), XTE_ERROR_UNSUPPORTED, "layout");
  F.q.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_DEEPGEMM;
  EXPECT_FAIL(xte_quantize(&F.x, &F.q, &F.cfg, NULL), XTE_ERROR_UNSUPPORTED, "layout");
  F.q.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  F.q.rowwise_scale_inv.dtype = XTE_DTYPE_FP32; /* MX stores E8M0 */
  EXPECT_FAIL(xte_quantize(&F.x, &F.q, &F.cfg, NULL), XTE_ERROR_DTYPE, "out->rowwise_scale_inv");
  F.q.rowwise_scale_inv.dtype = XTE_DTYPE_E8M0;
  F.q.rowwise_scale_inv.cols = K_ / 32 - 1;
  EXPECT_FAIL(xte_quantize(&F.x, &F.q, &F.cfg, NULL), XTE_ERROR_BUFFER_TOO_SMALL,
              "out->rowwise_scale_inv");
  F.q.columnwise = xte_tensor_2d(F.cq, XTE_DTYPE_E4M3, K_, M_); /* MX keeps [M, K] */
  F.q.rowwise_scale_inv.cols = K_ / 32;
  F.q.columnwise_scale_inv.data = e8 + 512;
  F.q.columnwise_scale_inv.dtype = XTE_DTYPE_E8M0;
  F.q.columnwise_scale_inv.rows = 1;
  F.q.columnwise_scale_inv.cols = K_;
  EXPECT_FAIL(xte_quantize(&F.x, &F.q, &F.cfg, NULL), XTE_ERROR_SHAPE, "out->columnwise");
  cr_expect(all_canary(e8, sizeof e8));
  cr_expect(all_canary(F.rq, sizeof F.rq));
  cr_expect(all_canary(F.cq, sizeof F.cq));
  cr_expect(all_canary(&F.amax, sizeof F.amax));
  /* the fixed setup runs */
  F.q.columnwise = xte_tensor_2d(F.cq, XTE_DTYPE_E4M3, M_, K_);
  cr_expect_eq(xte_quantize(&F.x, &F.q, &F.cfg, NULL), XTE_SUCCESS, "%s", xte_last_error());
}

Test(bad_input, quantize_config) {
  setup_valid();
  F.cfg.saturate = 2;
  QFAIL(XTE_ERROR_INVALID_ARGUMENT, "saturate");
  F.cfg.saturate = -1;
  QFAIL(XTE_ERROR_INVALID_ARGUMENT, "saturate");
  F.cfg.force_pow_2 = 7;
  QFAIL(XTE_ERROR_INVALID_ARGUMENT, "force_pow_2");
  F.cfg.force_pow_2 = -2; /* -1 is the recipe's default */
  QFAIL(XTE_ERROR_INVALID_ARGUMENT, "force_pow_2");
  F.cfg.amax_epsilon = -1.0f;
  QFAIL(XTE_ERROR_INVALID_ARGUMENT, "amax_epsilon");
  F.cfg.amax_epsilon = NAN;
  QFAIL(XTE_ERROR_INVALID_ARGUMENT, "amax_epsilon");
  F.cfg.amax_epsilon = INFINITY;
  QFAIL(XTE_ERROR_INVALID_ARGUMENT, "amax_epsilon");
}

Test(bad_input, quantize_delayed_scale) {
  const float bad[] = {0.0f, -0.0f, -1.0f, NAN, INFINITY, -INFINITY};
  size_t i;
  for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setup_valid();
    F.q.recipe = XTE_RECIPE_TE_DELAYED;
    F.q.scaling_mode = XTE_SCALING_PER_TENSOR;
    F.q.rowwise_scale_inv.rows = F.q.rowwise_scale_inv.cols = 1;
    F.q.columnwise_scale_inv.rows = F.q.columnwise_scale_inv.cols = 1;
    F.scale = bad[i];
    QFAIL(XTE_ERROR_INVALID_ARGUMENT, "out->scale");
  }
}

/* A backend that is not there: the default backend from XTE_BACKEND. */
Test(bad_input, backend_unavailable) {
  xte_backend_info info;
  xte_stream s = (xte_stream)(uintptr_t)0xA5A5A5A5u;
  const char *names[] = {"cuda", "musa"};
  const xte_backend be[] = {XTE_BACKEND_CUDA, XTE_BACKEND_MUSA};
  int i;
  cr_assert_eq(xte_get_backend_info(&info), XTE_SUCCESS);
  for (i = 0; i < 2; i++) {
    int present = i == 0 ? info.num_cuda_gpus > 0 : info.num_musa_gpus > 0;
    void *p = (void *)(uintptr_t)0x5A5A;
    if (present) {
      printf("backend %s has a device here: its unavailability is not tested\n", names[i]);
      continue;
    }
    EXPECT_FAIL(xte_stream_create(be[i], 0, NULL, &s), XTE_ERROR_BACKEND_UNAVAILABLE, names[i]);
    cr_expect_eq(s, (xte_stream)(uintptr_t)0xA5A5A5A5u, "stream written");
    setup_valid();
    cr_assert_eq(setenv("XTE_BACKEND", names[i], 1), 0);
    QFAIL(XTE_ERROR_BACKEND_UNAVAILABLE, names[i]);
    {
      uint8_t o[16];
      xte_tensor y = xte_tensor_1d(o, XTE_DTYPE_E4M3, 16);
      memset(o, CANARY, sizeof o);
      EXPECT_FAIL(xte_cast(&F.x, &y, 1, NULL), XTE_ERROR_SHAPE, "out");
      F.x = xte_tensor_1d(F.in, XTE_DTYPE_FP32, 16);
      EXPECT_FAIL(xte_cast(&F.x, &y, 1, NULL), XTE_ERROR_BACKEND_UNAVAILABLE, names[i]);
      cr_expect(all_canary(o, sizeof o));
    }
    EXPECT_FAIL(xte_malloc(NULL, 64, &p), XTE_ERROR_BACKEND_UNAVAILABLE, names[i]);
    cr_expect_eq(p, (void *)(uintptr_t)0x5A5A);
    EXPECT_FAIL(xte_stream_synchronize(NULL), XTE_ERROR_BACKEND_UNAVAILABLE, names[i]);
    cr_assert_eq(unsetenv("XTE_BACKEND"), 0);
  }
  /* an XTE_BACKEND value that is no backend */
  setup_valid();
  cr_assert_eq(setenv("XTE_BACKEND", "tpu", 1), 0);
  QFAIL(XTE_ERROR_INVALID_ARGUMENT, "XTE_BACKEND");
  cr_assert_eq(unsetenv("XTE_BACKEND"), 0);
  setup_valid();
  cr_expect_eq(xte_quantize(&F.x, &F.q, &F.cfg, NULL), XTE_SUCCESS, "%s", xte_last_error());
}

/* ------------------------------------------------------------------ dequantize */

Test(bad_input, dequantize) {
  float out[M_ * K_ + 1];
  xte_tensor y;
  setup_valid();
  cr_assert_eq(xte_quantize(&F.x, &F.q, &F.cfg, NULL), XTE_SUCCESS);
#define DQFAIL(col, status, needle)                                                             \
  do {                                                                                          \
    memset(out, CANARY, sizeof out);                                                            \
    expect_fail_at(xte_dequantize(&F.q, (col), &y, NULL), (status), (needle), "xte_dequantize", \
                   __LINE__);                                                                   \
    cr_expect(all_canary(out, sizeof out), "line %d: out written", __LINE__);                   \
    y = xte_tensor_2d(out, XTE_DTYPE_FP32, M_, K_);                                             \
  } while (0)
  y = xte_tensor_2d(out, XTE_DTYPE_FP32, M_, K_);
  cr_expect_eq(xte_dequantize(&F.q, 0, &y, NULL), XTE_SUCCESS, "%s", xte_last_error());
  memset(out, CANARY, sizeof out);
  EXPECT_FAIL(xte_dequantize(NULL, 0, &y, NULL), XTE_ERROR_NULL_POINTER, "input");
  EXPECT_FAIL(xte_dequantize(&F.q, 0, NULL, NULL), XTE_ERROR_NULL_POINTER, "out");
  DQFAIL(2, XTE_ERROR_INVALID_ARGUMENT, "columnwise");
  DQFAIL(-1, XTE_ERROR_INVALID_ARGUMENT, "columnwise");
  y.dtype = XTE_DTYPE_E4M3;
  DQFAIL(0, XTE_ERROR_DTYPE, "out");
  y.dtype = XTE_DTYPE_INT32;
  DQFAIL(0, XTE_ERROR_DTYPE, "out");
  y.shape[1] = K_ - 1;
  DQFAIL(0, XTE_ERROR_SHAPE, "out");
  DQFAIL(1, XTE_ERROR_SHAPE, "out"); /* the columnwise copy is [K, M] */
  y.data = NULL;
  DQFAIL(0, XTE_ERROR_NULL_POINTER, "out");
  y.data = (char *)out + 2;
  DQFAIL(0, XTE_ERROR_ALIGNMENT, "out");
  y.dtype = XTE_DTYPE_BF16;
  y.data = (char *)out + 1;
  DQFAIL(0, XTE_ERROR_ALIGNMENT, "out");

  F.q.rowwise.dtype = XTE_DTYPE_FP32;
  DQFAIL(0, XTE_ERROR_DTYPE, "input->rowwise");
  F.q.rowwise.dtype = XTE_DTYPE_E4M3;
  F.q.rowwise.data = NULL;
  DQFAIL(0, XTE_ERROR_NULL_POINTER, "input->rowwise");
  F.q.rowwise.data = F.rq;
  F.q.columnwise.data = NULL;
  y = xte_tensor_2d(out, XTE_DTYPE_FP32, K_, M_);
  DQFAIL(1, XTE_ERROR_NULL_POINTER, "input->columnwise");
  F.q.columnwise.data = F.cq;
  F.q.rowwise_scale_inv.data = NULL;
  DQFAIL(0, XTE_ERROR_NULL_POINTER, "input->rowwise_scale_inv");
  F.q.rowwise_scale_inv.data = (char *)F.rs + 1;
  DQFAIL(0, XTE_ERROR_ALIGNMENT, "input->rowwise_scale_inv");
  F.q.rowwise_scale_inv.data = F.rs;
  F.q.rowwise_scale_inv.dtype = XTE_DTYPE_E8M0;
  DQFAIL(0, XTE_ERROR_DTYPE, "input->rowwise_scale_inv");
  F.q.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  F.q.rowwise_scale_inv.rows = 1;
  DQFAIL(0, XTE_ERROR_SHAPE, "input->rowwise_scale_inv");
  F.q.rowwise_scale_inv.rows = M_;
  F.q.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_MX_SWIZZLED;
  DQFAIL(0, XTE_ERROR_UNSUPPORTED, "layout");
  F.q.rowwise_scale_inv.layout = (xte_scale_layout)5;
  DQFAIL(0, XTE_ERROR_INVALID_ARGUMENT, "layout");
  F.q.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  F.q.recipe = XTE_RECIPE_MX_OCP;
  DQFAIL(0, XTE_ERROR_UNSUPPORTED, "scaling_mode");
  F.q.recipe = (xte_recipe)42;
  DQFAIL(0, XTE_ERROR_INVALID_ARGUMENT, "recipe");
  F.q.recipe = XTE_RECIPE_TE_BLOCK;
  F.q.scaling_mode = (xte_scaling_mode)4;
  DQFAIL(0, XTE_ERROR_INVALID_ARGUMENT, "scaling_mode");
  F.q.scaling_mode = XTE_SCALING_BLOCK_1x128;
  cr_expect_eq(xte_dequantize(&F.q, 0, &y, NULL), XTE_SUCCESS, "%s", xte_last_error());
#undef DQFAIL
}

/* ------------------------------------------------------------------ cast */

Test(bad_input, cast) {
  float in[64];
  uint8_t o[64 + 4];
  xte_tensor x = xte_tensor_1d(in, XTE_DTYPE_FP32, 64), y;
  int i;
  for (i = 0; i < 64; i++) in[i] = (float)i;
#define CFAIL(call, status, needle)                                       \
  do {                                                                    \
    memset(o, CANARY, sizeof o);                                          \
    expect_fail_at((call), (status), (needle), #call, __LINE__);          \
    cr_expect(all_canary(o, sizeof o), "line %d: out written", __LINE__); \
    x = xte_tensor_1d(in, XTE_DTYPE_FP32, 64);                            \
    y = xte_tensor_1d(o, XTE_DTYPE_E4M3, 64);                             \
  } while (0)
  y = xte_tensor_1d(o, XTE_DTYPE_E4M3, 64);
  cr_expect_eq(xte_cast(&x, &y, 1, NULL), XTE_SUCCESS);
  CFAIL(xte_cast(NULL, &y, 1, NULL), XTE_ERROR_NULL_POINTER, "input");
  CFAIL(xte_cast(&x, NULL, 1, NULL), XTE_ERROR_NULL_POINTER, "out");
  x.data = NULL;
  CFAIL(xte_cast(&x, &y, 1, NULL), XTE_ERROR_NULL_POINTER, "input");
  y.data = NULL;
  CFAIL(xte_cast(&x, &y, 1, NULL), XTE_ERROR_NULL_POINTER, "out");
  x.dtype = XTE_DTYPE_INT32;
  CFAIL(xte_cast(&x, &y, 1, NULL), XTE_ERROR_DTYPE, "input");
  y.dtype = XTE_DTYPE_INT64;
  CFAIL(xte_cast(&x, &y, 1, NULL), XTE_ERROR_DTYPE, "out");
  x.dtype = XTE_DTYPE_UINT8;
  CFAIL(xte_cast(&x, &y, 1, NULL), XTE_ERROR_DTYPE, "input");
  y.dtype = (xte_dtype)123;
  CFAIL(xte_cast(&x, &y, 1, NULL), XTE_ERROR_DTYPE, "out");
  y.shape[0] = 63;
  CFAIL(xte_cast(&x, &y, 1, NULL), XTE_ERROR_SHAPE, "out");
  x = xte_tensor_2d(in, XTE_DTYPE_FP32, 2, 30);
  x.ld = 32;
  y = xte_tensor_2d(o, XTE_DTYPE_E4M3, 2, 30);
  CFAIL(xte_cast(&x, &y, 1, NULL), XTE_ERROR_SHAPE, "input");
  x = xte_tensor_2d(in, XTE_DTYPE_FP32, 2, 30);
  y = xte_tensor_2d(o, XTE_DTYPE_E4M3, 2, 30);
  y.ld = 31;
  CFAIL(xte_cast(&x, &y, 1, NULL), XTE_ERROR_SHAPE, "out");
  CFAIL(xte_cast(&x, &y, 2, NULL), XTE_ERROR_INVALID_ARGUMENT, "saturate");
  x = xte_tensor_1d((char *)in + 2, XTE_DTYPE_FP32, 16);
  y = xte_tensor_1d(o, XTE_DTYPE_E4M3, 16);
  CFAIL(xte_cast(&x, &y, 1, NULL), XTE_ERROR_ALIGNMENT, "input");
  x = xte_tensor_1d(in, XTE_DTYPE_FP32, 16);
  y = xte_tensor_1d(o + 1, XTE_DTYPE_BF16, 16);
  CFAIL(xte_cast(&x, &y, 1, NULL), XTE_ERROR_ALIGNMENT, "out");
#undef CFAIL
}

/* ------------------------------------------------------------------ scale shape */

Test(bad_input, quantize_scale_shape) {
  int64_t r, c;
#define SFAIL(call, status, needle)                                            \
  do {                                                                         \
    r = c = -77;                                                               \
    expect_fail_at((call), (status), (needle), #call, __LINE__);               \
    cr_expect(r == -77 && c == -77, "line %d: rows / cols written", __LINE__); \
  } while (0)
  SFAIL(xte_quantize_scale_shape(4, 4, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                 XTE_SCALE_LAYOUT_COMPACT, 0, NULL, &c),
        XTE_ERROR_NULL_POINTER, "rows");
  SFAIL(xte_quantize_scale_shape(4, 4, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                 XTE_SCALE_LAYOUT_COMPACT, 0, &r, NULL),
        XTE_ERROR_NULL_POINTER, "cols");
  SFAIL(xte_quantize_scale_shape(-1, 4, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                 XTE_SCALE_LAYOUT_COMPACT, 0, &r, &c),
        XTE_ERROR_SHAPE, "M");
  SFAIL(xte_quantize_scale_shape(4, -9, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                 XTE_SCALE_LAYOUT_COMPACT, 0, &r, &c),
        XTE_ERROR_SHAPE, "K");
  SFAIL(xte_quantize_scale_shape(4, 4, (xte_scaling_mode)9, XTE_RECIPE_TE_BLOCK,
                                 XTE_SCALE_LAYOUT_COMPACT, 0, &r, &c),
        XTE_ERROR_INVALID_ARGUMENT, "scaling_mode");
  SFAIL(xte_quantize_scale_shape(4, 4, XTE_SCALING_BLOCK_1x128, (xte_recipe)9,
                                 XTE_SCALE_LAYOUT_COMPACT, 0, &r, &c),
        XTE_ERROR_INVALID_ARGUMENT, "recipe");
  SFAIL(xte_quantize_scale_shape(4, 4, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                 (xte_scale_layout)9, 0, &r, &c),
        XTE_ERROR_INVALID_ARGUMENT, "layout");
  SFAIL(xte_quantize_scale_shape(4, 4, XTE_SCALING_MXFP8_1x32, XTE_RECIPE_DEEPGEMM,
                                 XTE_SCALE_LAYOUT_COMPACT, 0, &r, &c),
        XTE_ERROR_UNSUPPORTED, "scaling_mode");
  SFAIL(xte_quantize_scale_shape(4, 4, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_MX_OCP,
                                 XTE_SCALE_LAYOUT_COMPACT, 0, &r, &c),
        XTE_ERROR_UNSUPPORTED, "scaling_mode");
  SFAIL(xte_quantize_scale_shape(4, 4, XTE_SCALING_PER_TENSOR, XTE_RECIPE_MTFP8,
                                 XTE_SCALE_LAYOUT_COMPACT, 0, &r, &c),
        XTE_ERROR_UNSUPPORTED, "scaling_mode");
  SFAIL(xte_quantize_scale_shape(4, 4, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_MTFP8,
                                 XTE_SCALE_LAYOUT_MX_SWIZZLED, 0, &r, &c),
        XTE_ERROR_UNSUPPORTED, "layout");
  SFAIL(xte_quantize_scale_shape(4, 4, XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_TE,
                                 XTE_SCALE_LAYOUT_TE_GEMM, 1, &r, &c),
        XTE_ERROR_UNSUPPORTED, "layout");
  SFAIL(xte_quantize_scale_shape(4, 4, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                 XTE_SCALE_LAYOUT_COMPACT, 5, &r, &c),
        XTE_ERROR_INVALID_ARGUMENT, "columnwise");
  SFAIL(xte_quantize_scale_shape(4, 4, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                 XTE_SCALE_LAYOUT_COMPACT, -1, &r, &c),
        XTE_ERROR_INVALID_ARGUMENT, "columnwise");
#undef SFAIL
}

/* Shapes past int64 arithmetic (ceil(M / 128) as (M + 127) / 128 wrapped to negative rows and
 * cols with XTE_SUCCESS) or past the tensor limits (2^40 per dimension, 2^50 elements): SHAPE,
 * naming M and K, rows / cols untouched; the largest shapes a tensor can have still work. */
Test(bad_input, quantize_scale_shape_overflow) {
  const xte_scaling_mode modes[] = {XTE_SCALING_PER_TENSOR, XTE_SCALING_BLOCK_1x128,
                                    XTE_SCALING_BLOCK_128x128, XTE_SCALING_MXFP8_1x32};
  const xte_recipe recipes[] = {XTE_RECIPE_TE_CURRENT, XTE_RECIPE_TE_BLOCK, XTE_RECIPE_MTFP8,
                                XTE_RECIPE_MX_TE};
  const int64_t big[][2] = {{INT64_MAX, 4},
                            {4, INT64_MAX},
                            {INT64_MAX, INT64_MAX},
                            {INT64_MAX - 100, 1},
                            {((int64_t)1 << 40) + 1, 1},
                            {1, ((int64_t)1 << 40) + 1},
                            {(int64_t)1 << 30, ((int64_t)1 << 20) + 1},
                            {(int64_t)1 << 62, (int64_t)1 << 62}};
  size_t i, j;
  int lay, col;
  int64_t r, c;
  for (i = 0; i < sizeof modes / sizeof modes[0]; i++)
    for (lay = 0; lay < XTE_SCALE_LAYOUT_COUNT; lay++)
      for (col = 0; col < 2; col++) {
        int mx = recipes[i] == XTE_RECIPE_MX_TE;
        if (mx ? (lay == XTE_SCALE_LAYOUT_TE_GEMM || lay == XTE_SCALE_LAYOUT_DEEPGEMM)
               : lay == XTE_SCALE_LAYOUT_MX_SWIZZLED)
          continue;
        for (j = 0; j < sizeof big / sizeof big[0]; j++) {
          r = c = -77;
          expect_fail_at(xte_quantize_scale_shape(big[j][0], big[j][1], modes[i], recipes[i],
                                                  (xte_scale_layout)lay, col, &r, &c),
                         XTE_ERROR_SHAPE, "M =", "xte_quantize_scale_shape", (int)j);
          cr_expect(r == -77 && c == -77, "mode %d layout %d col %d case %zu: rows / cols written",
                    (int)modes[i], lay, col, j);
        }
        /* the limits themselves: [2^40, 2^10] and [2^10, 2^40] */
        for (j = 0; j < 2; j++) {
          int64_t M = j ? (int64_t)1 << 10 : (int64_t)1 << 40, K = j ? (int64_t)1 << 40 : 1024;
          r = c = -77;
          cr_expect_eq(xte_quantize_scale_shape(M, K, modes[i], recipes[i], (xte_scale_layout)lay,
                                                col, &r, &c),
                       XTE_SUCCESS, "mode %d layout %d col %d: %s", (int)modes[i], lay, col,
                       xte_last_error());
          cr_expect(r > 0 && c > 0 && r <= INT64_MAX / c, "mode %d layout %d col %d: [%lld, %lld]",
                    (int)modes[i], lay, col, (long long)r, (long long)c);
        }
      }
}

/* ------------------------------------------------------------------ core entry points */

Test(bad_input, streams_memory_and_settings) {
  xte_stream s = (xte_stream)(uintptr_t)0xA5A5A5A5u;
  void *p = (void *)(uintptr_t)0x5A5A;
  char buf[8], src[8];
  xte_backend_info info;
  memset(buf, CANARY, sizeof buf);
  memset(src, 1, sizeof src);
  EXPECT_FAIL(xte_stream_create(XTE_BACKEND_CPU, 0, NULL, NULL), XTE_ERROR_NULL_POINTER, "stream");
  EXPECT_FAIL(xte_stream_create((xte_backend)7, 0, NULL, &s), XTE_ERROR_INVALID_ARGUMENT,
              "backend");
  EXPECT_FAIL(xte_stream_create(XTE_BACKEND_CPU, 1, NULL, &s), XTE_ERROR_INVALID_ARGUMENT,
              "device");
  EXPECT_FAIL(xte_stream_create(XTE_BACKEND_CPU, -1, NULL, &s), XTE_ERROR_INVALID_ARGUMENT,
              "device");
  cr_expect_eq(s, (xte_stream)(uintptr_t)0xA5A5A5A5u, "stream written on failure");
  EXPECT_FAIL(xte_malloc(NULL, 16, NULL), XTE_ERROR_NULL_POINTER, "ptr");
  EXPECT_FAIL(xte_memcpy(NULL, NULL, src, 8, XTE_MEMCPY_HOST_TO_DEVICE), XTE_ERROR_NULL_POINTER,
              "dst");
  EXPECT_FAIL(xte_memcpy(NULL, buf, NULL, 8, XTE_MEMCPY_HOST_TO_DEVICE), XTE_ERROR_NULL_POINTER,
              "src");
  EXPECT_FAIL(xte_memcpy(NULL, buf, src, 8, (xte_memcpy_kind)3), XTE_ERROR_INVALID_ARGUMENT,
              "kind");
  EXPECT_FAIL(xte_memset(NULL, NULL, 0, 8), XTE_ERROR_NULL_POINTER, "dst");
  cr_expect(all_canary(buf, sizeof buf));
  EXPECT_FAIL(xte_cpu_set_isa((xte_cpu_isa)99), XTE_ERROR_INVALID_ARGUMENT, "isa");
  EXPECT_FAIL(xte_cpu_set_num_threads(-1), XTE_ERROR_INVALID_ARGUMENT, "n");
  EXPECT_FAIL(xte_cpu_set_num_threads(100000), XTE_ERROR_INVALID_ARGUMENT, "n");
  EXPECT_FAIL(xte_get_backend_info(NULL), XTE_ERROR_NULL_POINTER, "info");
  EXPECT_FAIL(xte_backend_info_string(NULL, 16), XTE_ERROR_NULL_POINTER, "buf");
  EXPECT_FAIL(xte_backend_info_string(buf, 0), XTE_ERROR_BUFFER_TOO_SMALL, "size");
  cr_expect(all_canary(buf, sizeof buf));
  /* the valid forms work and clear the message */
  cr_expect_eq(xte_free(NULL, NULL), XTE_SUCCESS);
  cr_expect_eq(xte_stream_destroy(NULL), XTE_SUCCESS);
  cr_expect_eq(xte_stream_create(XTE_BACKEND_CPU, 0, NULL, &s), XTE_SUCCESS, "%s",
               xte_last_error());
  cr_expect_str_empty(xte_last_error());
  cr_expect_eq(xte_stream_backend(s), XTE_BACKEND_CPU);
  cr_expect_eq(xte_malloc(s, 100, &p), XTE_SUCCESS);
  cr_expect_eq((uintptr_t)p % 64, 0, "CPU memory is 64-byte aligned");
  cr_expect_eq(xte_memcpy(s, p, src, 8, XTE_MEMCPY_HOST_TO_DEVICE), XTE_SUCCESS);
  cr_expect_eq(memcmp(p, src, 8), 0);
  cr_expect_eq(xte_memset(s, p, 7, 8), XTE_SUCCESS);
  cr_expect_eq(((uint8_t *)p)[7], 7);
  cr_expect_eq(xte_free(s, p), XTE_SUCCESS);
  cr_expect_eq(xte_stream_synchronize(s), XTE_SUCCESS);
  cr_expect_eq(xte_stream_destroy(s), XTE_SUCCESS);
  cr_expect_eq(xte_get_backend_info(&info), XTE_SUCCESS);
  cr_expect_eq(xte_backend_info_string(buf, sizeof buf), XTE_SUCCESS);
  cr_expect_eq(buf[sizeof buf - 1], '\0', "always NUL-terminated");
  /* names of unknown enums are never NULL */
  cr_expect_not_null(xte_status_string((xte_status)999));
  cr_expect_not_null(xte_dtype_name((xte_dtype)999));
  cr_expect_not_null(xte_backend_name((xte_backend)999));
  cr_expect_not_null(xte_cpu_isa_name((xte_cpu_isa)999));
  cr_expect_eq(xte_dtype_size((xte_dtype)999), 0);
}

/* fuzz_quantize found it: an empty [2^40, 0] tensor walked its 2^40 rows (minutes) in the
 * per-tensor amax and in dequantize; nothing is to be read or written, so both return at once
 * (per-tensor current scaling of an empty tensor: amax 0, scale 1). */
Test(bad_input, empty_tensor_with_huge_row_count, .timeout = 20) {
  static float x[4], y[4], scale_inv[1], amax = -1.0f, scale = -1.0f;
  static uint8_t q[4];
  int64_t M = (int64_t)1 << 40;
  xte_tensor in = xte_tensor_2d(x, XTE_DTYPE_FP32, M, 0),
             out = xte_tensor_2d(y, XTE_DTYPE_FP32, M, 0);
  xte_qtensor qt;
  xte_quant_config cfg = xte_quant_config_default();
  memset(&qt, 0, sizeof qt);
  qt.rowwise = xte_tensor_2d(q, XTE_DTYPE_E4M3, M, 0);
  qt.rowwise_scale_inv =
      (xte_scale_tensor){scale_inv, XTE_DTYPE_FP32, 1, 1, XTE_SCALE_LAYOUT_COMPACT};
  qt.scaling_mode = XTE_SCALING_PER_TENSOR;
  qt.recipe = XTE_RECIPE_TE_CURRENT;
  qt.amax = &amax;
  qt.scale = &scale;
  cr_assert_eq(xte_quantize(&in, &qt, &cfg, NULL), XTE_SUCCESS, "%s", xte_last_error());
  cr_expect_eq(amax, 0.0f);
  cr_expect_eq(scale, 1.0f);
  cr_assert_eq(xte_dequantize(&qt, 0, &out, NULL), XTE_SUCCESS, "%s", xte_last_error());
}

/* the two int64 outputs of xte_quantize_scale_shape are checked for alignment like every other
 * output pointer, and left untouched on error */
Test(bad_input, quantize_scale_shape_alignment) {
  static int64_t buf[4];
  int64_t *mis = (int64_t *)((char *)buf + 4), r = -5;
  memset(buf, CANARY, sizeof buf);
  EXPECT_FAIL(xte_quantize_scale_shape(256, 256, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                       XTE_SCALE_LAYOUT_COMPACT, 0, mis, &r),
              XTE_ERROR_ALIGNMENT, "rows");
  EXPECT_FAIL(xte_quantize_scale_shape(256, 256, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                       XTE_SCALE_LAYOUT_COMPACT, 0, &r, mis),
              XTE_ERROR_ALIGNMENT, "cols");
  cr_expect(all_canary(buf, sizeof buf), "an output byte changed");
  cr_expect_eq(r, -5);
}
