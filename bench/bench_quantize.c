/* Quantize suite: xte_quantize with the TransformerEngine block recipe (e4m3, GEMM-ready TE_GEMM
 * scale layout) in 1x128 and 128x128 blocks, bf16 and fp32 input, rowwise only and rowwise plus
 * the transposed columnwise copy, on all of xte's CPU threads; at "dram" (4 x the last-level
 * cache read at run time, at least 64 MiB, at most 1/8 of the available memory:
 * xte_bench_dram_bytes(); the buffers take 4x that), at 64 MiB (past the L2; inside a large L3)
 * and at 1 MiB (cache resident, for tuners; the same data every call, which branch predictors
 * learn: read data-dependent branches off the larger cases). The 1 MiB cases also run on ONE
 * thread ("1MiB/1t", beside a one-thread copy of the same size): the per-core conversion rate in
 * cache, which sets the pace on machines with much bandwidth per core.
 *
 * Anchor: "quantize/copy/<size>", a streaming copy of the same input buffer into an output
 * buffer of the same size, split over the same number of threads (one for "1t").
 * Rate: GB/s of bytes read + bytes written: quantize = input + fp8 rowwise (+ fp8 columnwise)
 * + scale buffers; copy = 2 x the bytes copied. */
#include <stdio.h>
#include <string.h>

#include "bench_common.h"
#include "bench_gpu.h"
#include "xte/xte.h"
#include "xte_bench.h"

typedef struct qsize {
  const char *label;
  size_t in_bytes; /* input bytes, whatever the dtype */
  int64_t K;       /* columns; M = in_bytes / (K * element size) */
  /* buffers, allocated on first use, sized for the largest case */
  void *in[2]; /* [0] bf16, [1] fp32: the same values */
  void *copy_dst;
  uint8_t *row_q, *col_q;
  float *row_s, *col_s;
  size_t row_s_bytes, col_s_bytes;
} qsize;

typedef struct qcase {
  char name[96];
  qsize *sz;
  xte_dtype in_dtype;
  xte_scaling_mode mode;
  int columnwise;
  int64_t M, K;
  int64_t srr, src, scr, scc; /* scale shapes: rowwise [srr, src], columnwise [scr, scc] */
  int checked, one_thread;
} qcase;

/* sizes[0].in_bytes is set at registration (xte_bench_dram_bytes()) */
#define NSIZES 3
static qsize sizes[NSIZES] = {
    {"dram", 0, 4096, {NULL, NULL}, NULL, NULL, NULL, NULL, NULL, 0, 0},
    {"64MiB", 64 * XTE_BENCH_MiB, 4096, {NULL, NULL}, NULL, NULL, NULL, NULL, NULL, 0, 0},
    {"1MiB", 1 * XTE_BENCH_MiB, 1024, {NULL, NULL}, NULL, NULL, NULL, NULL, NULL, 0, 0}};
#define ONE_THREAD_SIZE 2 /* the 1 MiB cases run again on one thread */

#define NCASES ((NSIZES + 1) * 2 * 2 * 2)
static qcase cases[NCASES];

/* A copy anchor: the size's input into a buffer of the same size, on all threads or one. */
typedef struct qcopy {
  char name[64];
  qsize *sz;
  int one_thread;
} qcopy;
static qcopy copies[NSIZES + 1];

static const xte_recipe RECIPE = XTE_RECIPE_TE_BLOCK;
static const xte_scale_layout LAYOUT = XTE_SCALE_LAYOUT_TE_GEMM;

/* The scale shapes of an [M, K] quantize in `mode` (rowwise [*srr, *src], columnwise [*scr,
 * *scc]; 1 x 1 with a message if the library refuses), and the largest fp32 scale buffers so far
 * raised to fit them. */
static void scale_shapes(int64_t M, int64_t K, xte_scaling_mode mode, int64_t *srr, int64_t *src,
                         int64_t *scr, int64_t *scc, size_t *row_max, size_t *col_max) {
  size_t rb, cb;
  if (xte_quantize_scale_shape(M, K, mode, RECIPE, LAYOUT, 0, srr, src) != XTE_SUCCESS ||
      xte_quantize_scale_shape(M, K, mode, RECIPE, LAYOUT, 1, scr, scc) != XTE_SUCCESS) {
    fprintf(stderr, "xte bench quantize: scale shape: %s\n", xte_last_error());
    *srr = *src = *scr = *scc = 1;
  }
  rb = (size_t)(*srr * *src) * 4;
  cb = (size_t)(*scr * *scc) * 4;
  if (rb > *row_max) *row_max = rb;
  if (cb > *col_max) *col_max = cb;
}

/* Runs the rest of a case on one thread (xte's pool and the copy's team); returns the pool size
 * to restore. */
static int threads_begin(int one_thread) {
  int n = xte_cpu_get_num_threads();
  if (one_thread) (void)xte_cpu_set_num_threads(1);
  return n;
}

static void threads_end(int one_thread, int n) {
  if (one_thread) (void)xte_cpu_set_num_threads(n);
}

static void qsize_alloc(qsize *s) {
  size_t elems = s->in_bytes / 2; /* the most elements: bf16 */
  const size_t period = 64 * XTE_BENCH_MiB;
  size_t off;
  if (s->in[0]) return;
  s->in[0] = xte_bench_alloc(s->in_bytes);
  s->in[1] = xte_bench_alloc(s->in_bytes);
  s->copy_dst = xte_bench_alloc(s->in_bytes);
  s->row_q = (uint8_t *)xte_bench_alloc(elems);
  s->col_q = (uint8_t *)xte_bench_alloc(elems);
  s->row_s = (float *)xte_bench_alloc(s->row_s_bytes);
  s->col_s = (float *)xte_bench_alloc(s->col_s_bytes);
  /* random data for the first 64 MiB, repeated beyond (quick to make at DRAM sizes) */
  off = s->in_bytes < period ? s->in_bytes : period;
  xte_bench_fill(s->in[0], XTE_DTYPE_BF16, off / 2, 42);
  xte_bench_fill(s->in[1], XTE_DTYPE_FP32, off / 4, 42);
  for (; off < s->in_bytes; off += period) {
    size_t m = s->in_bytes - off < period ? s->in_bytes - off : period;
    memcpy((char *)s->in[0] + off, s->in[0], m);
    memcpy((char *)s->in[1] + off, s->in[1], m);
  }
}

static void run_copy(xte_bench_state *st, void *arg) {
  qcopy *c = (qcopy *)arg;
  qsize *s = c->sz;
  int n;
  qsize_alloc(s);
  n = threads_begin(c->one_thread);
  while (xte_bench_keep_running(st)) xte_bench_parallel_copy(s->copy_dst, s->in[0], s->in_bytes);
  threads_end(c->one_thread, n);
  xte_bench_set_bytes(st, 2.0 * (double)s->in_bytes);
}

static void run_quantize(xte_bench_state *st, void *arg) {
  qcase *c = (qcase *)arg;
  qsize *s = c->sz;
  xte_tensor in;
  xte_qtensor q;
  xte_quant_config cfg = xte_quant_config_default();
  xte_status rc;
  double bytes;
  int nthreads;
  qsize_alloc(s);
  in = xte_tensor_2d(s->in[c->in_dtype == XTE_DTYPE_BF16 ? 0 : 1], c->in_dtype, c->M, c->K);
  memset(&q, 0, sizeof q);
  q.rowwise = xte_tensor_2d(s->row_q, XTE_DTYPE_E4M3, c->M, c->K);
  q.rowwise_scale_inv.data = s->row_s;
  q.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  q.rowwise_scale_inv.rows = c->srr;
  q.rowwise_scale_inv.cols = c->src;
  q.rowwise_scale_inv.layout = LAYOUT;
  if (c->columnwise) {
    q.columnwise = xte_tensor_2d(s->col_q, XTE_DTYPE_E4M3, c->K, c->M);
    q.columnwise_scale_inv.data = s->col_s;
    q.columnwise_scale_inv.dtype = XTE_DTYPE_FP32;
    q.columnwise_scale_inv.rows = c->scr;
    q.columnwise_scale_inv.cols = c->scc;
    q.columnwise_scale_inv.layout = LAYOUT;
  }
  q.scaling_mode = c->mode;
  q.recipe = RECIPE;
  if (!c->checked) {
    rc = xte_quantize(&in, &q, &cfg, NULL);
    if (rc != XTE_SUCCESS) {
      char why[512];
      snprintf(why, sizeof why, "xte_quantize: %s: %s", xte_status_string(rc), xte_last_error());
      xte_bench_fail(st, why);
      while (xte_bench_keep_running(st)) {
      }
      return;
    }
    c->checked = 1;
  }
  nthreads = threads_begin(c->one_thread);
  while (xte_bench_keep_running(st)) (void)xte_quantize(&in, &q, &cfg, NULL);
  threads_end(c->one_thread, nthreads);
  bytes = (double)c->M * (double)c->K * (double)xte_dtype_size(c->in_dtype) /* read */
          + (double)c->M * (double)c->K * (c->columnwise ? 2.0 : 1.0)       /* fp8 written */
          + 4.0 * (double)(c->srr * c->src + (c->columnwise ? c->scr * c->scc : 0));
  xte_bench_set_bytes(st, bytes);
}

void xte_bench_suite_quantize(void) {
  static const xte_scaling_mode modes[2] = {XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_128x128};
  static const char *const mode_names[2] = {"1x128", "128x128"};
  static const xte_dtype dtypes[2] = {XTE_DTYPE_BF16, XTE_DTYPE_FP32};
  static int registered;
  int n = 0, mi, di, col, pass;
  if (registered) return;
  registered = 1;
  sizes[0].in_bytes = xte_bench_dram_bytes();
  for (pass = 0; pass <= NSIZES; pass++) {
    int one = pass == NSIZES; /* the last pass: the 1 MiB cases on one thread */
    qsize *s = &sizes[one ? ONE_THREAD_SIZE : pass];
    qcopy *cp = &copies[pass];
    const char *tag = one ? "/1t" : "";
    cp->sz = s;
    cp->one_thread = one;
    snprintf(cp->name, sizeof cp->name, "quantize/copy/%s%s", s->label, tag);
    xte_bench_register(cp->name, NULL, "GB/s", run_copy, cp);
    for (mi = 0; mi < 2; mi++)
      for (di = 0; di < 2; di++)
        for (col = 0; col <= 1; col++) {
          qcase *c = &cases[n++];
          c->sz = s;
          c->one_thread = one;
          c->in_dtype = dtypes[di];
          c->mode = modes[mi];
          c->columnwise = col;
          c->K = s->K;
          c->M = (int64_t)(s->in_bytes / xte_dtype_size(c->in_dtype)) / s->K;
          scale_shapes(c->M, c->K, c->mode, &c->srr, &c->src, &c->scr, &c->scc, &s->row_s_bytes,
                       &s->col_s_bytes);
          snprintf(c->name, sizeof c->name, "quantize/%s/%s/%s/%s%s", mode_names[mi],
                   xte_dtype_name(c->in_dtype), col ? "row+col" : "row", s->label, tag);
          xte_bench_register(c->name, cp->name, "GB/s", run_quantize, c);
        }
  }
}

/* ---------------------------------------------------------------- CUDA (--backend cuda)
 * The same cases on the CUDA backend (bench/bench_gpu.h), at the shapes of a model's activations:
 * [4096, 7168] and [16384, 7168] (Kimi-K2 / DeepSeek-V3 hidden size; 56 and 224 MiB of bf16), in
 * 1x128 and 128x128 blocks, bf16 and fp32 input, rowwise and rowwise + columnwise, TE_GEMM scale
 * layout. Each case beside a device-to-device copy of the same bytes (read + written), timed the
 * same way in the same run (CUDA events, the L2 flushed before every iteration). --smoke: one
 * [130, 256] shape (partial tiles). */
typedef struct gqsize {
  const char *label;
  int64_t M, K;
  void *in[2]; /* device: [0] bf16, [1] fp32, the same values */
  void *row_q, *col_q, *row_s, *col_s;
  size_t row_s_bytes, col_s_bytes;
  int failed;
} gqsize;

typedef struct gqcase {
  gqsize *sz;
  xte_dtype in_dtype;
  xte_scaling_mode mode;
  int columnwise;
  int64_t srr, src, scr, scc;
  xte_tensor in;
  xte_qtensor q;
} gqcase;

#define GQ_NSIZES 2
static gqsize gq_sizes[GQ_NSIZES] = {{"4096x7168", 4096, 7168, {0, 0}, 0, 0, 0, 0, 0, 0, 0},
                                     {"16384x7168", 16384, 7168, {0, 0}, 0, 0, 0, 0, 0, 0, 0}};
static gqsize gq_smoke = {"130x256", 130, 256, {0, 0}, 0, 0, 0, 0, 0, 0, 0};
static gqcase gq_cases[GQ_NSIZES * 8];

/* Random input made on the host 64 MiB at a time (repeated beyond) and copied once. */
static int gq_upload_input(void *dev, xte_dtype dt, size_t n, char *why, size_t wn) {
  const size_t es = xte_dtype_size(dt), chunk = 64 * XTE_BENCH_MiB / es;
  size_t m = n < chunk ? n : chunk, off;
  void *h = xte_bench_alloc(m * es);
  xte_bench_fill(h, dt, m, 42);
  for (off = 0; off < n; off += m) {
    size_t k = n - off < m ? n - off : m;
    if (xte_gpu_upload((char *)dev + off * es, h, k * es) != 0) {
      snprintf(why, wn, "input upload: %s", xte_last_error());
      xte_bench_free(h);
      return -1;
    }
  }
  xte_bench_free(h);
  return 0;
}

static int gq_size_alloc(gqsize *s, char *why, size_t wn) {
  const size_t n = (size_t)(s->M * s->K);
  if (s->failed) {
    snprintf(why, wn, "buffers of %s: failed before", s->label);
    return -1;
  }
  if (s->in[0]) return 0;
  s->in[0] = xte_gpu_alloc(2 * n);
  s->in[1] = xte_gpu_alloc(4 * n);
  s->row_q = xte_gpu_alloc(n);
  s->col_q = xte_gpu_alloc(n);
  s->row_s = xte_gpu_alloc(s->row_s_bytes);
  s->col_s = xte_gpu_alloc(s->col_s_bytes);
  if (!s->in[0] || !s->in[1] || !s->row_q || !s->col_q || !s->row_s || !s->col_s) {
    snprintf(why, wn, "device buffers of %s: %s", s->label, xte_last_error());
    s->failed = 1;
    return -1;
  }
  if (gq_upload_input(s->in[0], XTE_DTYPE_BF16, n, why, wn) != 0 ||
      gq_upload_input(s->in[1], XTE_DTYPE_FP32, n, why, wn) != 0) {
    s->failed = 1;
    return -1;
  }
  return 0;
}

static xte_status gq_run(void *arg) {
  gqcase *c = (gqcase *)arg;
  xte_quant_config cfg = xte_quant_config_default();
  return xte_quantize(&c->in, &c->q, &cfg, xte_gpu_stream());
}

static int gq_setup(void *arg, char *why, size_t wn) {
  gqcase *c = (gqcase *)arg;
  gqsize *s = c->sz;
  xte_status rc;
  if (gq_size_alloc(s, why, wn) != 0) return -1;
  c->in = xte_tensor_2d(s->in[c->in_dtype == XTE_DTYPE_BF16 ? 0 : 1], c->in_dtype, s->M, s->K);
  memset(&c->q, 0, sizeof c->q);
  c->q.rowwise = xte_tensor_2d(s->row_q, XTE_DTYPE_E4M3, s->M, s->K);
  c->q.rowwise_scale_inv.data = s->row_s;
  c->q.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  c->q.rowwise_scale_inv.rows = c->srr;
  c->q.rowwise_scale_inv.cols = c->src;
  c->q.rowwise_scale_inv.layout = LAYOUT;
  if (c->columnwise) {
    c->q.columnwise = xte_tensor_2d(s->col_q, XTE_DTYPE_E4M3, s->K, s->M);
    c->q.columnwise_scale_inv.data = s->col_s;
    c->q.columnwise_scale_inv.dtype = XTE_DTYPE_FP32;
    c->q.columnwise_scale_inv.rows = c->scr;
    c->q.columnwise_scale_inv.cols = c->scc;
    c->q.columnwise_scale_inv.layout = LAYOUT;
  }
  c->q.scaling_mode = c->mode;
  c->q.recipe = RECIPE;
  rc = gq_run(c);
  if (rc == XTE_SUCCESS && xte_gpu_sync() != 0) rc = XTE_ERROR_DEVICE;
  if (rc != XTE_SUCCESS) {
    snprintf(why, wn, "xte_quantize: %s: %s", xte_status_string(rc), xte_last_error());
    return -1;
  }
  return 0;
}

void xte_bench_gpu_suite_quantize(void) {
  static const xte_scaling_mode modes[2] = {XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_128x128};
  static const char *const mode_names[2] = {"1x128", "128x128"};
  static const xte_dtype dtypes[2] = {XTE_DTYPE_BF16, XTE_DTYPE_FP32};
  static int registered;
  int n = 0, si, mi, di, col, nsizes = xte_gpu_smoke() ? 1 : GQ_NSIZES;
  if (registered) return;
  registered = 1;
  for (si = 0; si < nsizes; si++) {
    gqsize *s = xte_gpu_smoke() ? &gq_smoke : &gq_sizes[si];
    for (mi = 0; mi < 2; mi++)
      for (di = 0; di < 2; di++)
        for (col = 0; col <= 1; col++) {
          gqcase *c = &gq_cases[n++];
          char name[128];
          double bytes;
          c->sz = s;
          c->in_dtype = dtypes[di];
          c->mode = modes[mi];
          c->columnwise = col;
          scale_shapes(s->M, s->K, c->mode, &c->srr, &c->src, &c->scr, &c->scc, &s->row_s_bytes,
                       &s->col_s_bytes);
          bytes = (double)s->M * (double)s->K * (double)xte_dtype_size(c->in_dtype) +
                  (double)s->M * (double)s->K * (col ? 2.0 : 1.0) +
                  4.0 * (double)(c->srr * c->src + (col ? c->scr * c->scc : 0));
          snprintf(name, sizeof name, "quantize/%s/%s/%s/%s", mode_names[mi],
                   xte_dtype_name(c->in_dtype), col ? "row+col" : "row", s->label);
          xte_gpu_register(name, xte_gpu_register_copy(bytes), "GB/s", bytes, gq_setup, gq_run, c);
        }
  }
}
