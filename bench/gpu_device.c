/* `xte bench device` (bench/gpu_device.h): the CUDA backend's checks and timings for
 * tests/device/run.sh, with no benchmark library; its byte checks in gpu_device_check.c.
 * The default mode: a short benchmark table:
 * each op on a bf16 [M, K] tensor (default 8192 x 8192, 128 MiB: larger than the H200's 50 MiB L2,
 * so that no L2 flush is needed between iterations), timed on the host around N iterations and
 * one xte_stream_synchronize, against the anchor of the same run: a device-to-device copy of the
 * input's bytes. GB/s counts the bytes each op must read and write once.
 *
 *   xte bench device [M K [iterations]]
 *   xte bench device gemm [M N K [iterations]]   (the exact GEMM: see gdev_gemm_main)
 *   xte bench device attention [s [iterations]]  (exact attention: see gdev_attn_main)
 *   xte bench device fast [--expect-cublaslt] [--no-timing] [iterations]  (FAST: see
 * gdev_fast_main) xte bench device anchors [M N K [iterations]] (xte's GEMMs beside cuBLASLt's:
 * anchors_main) Every GEMM row names what the plugin reported it ran ($XTE_GPU_REPORT,
 * src/cuda/xte_gpu_report.h; set here to a file of its own when unset). Exit 0 when the table was
 * printed, 77 with "SKIPPED: ..." when there is no CUDA device, 1 when an op failed. Part of the
 * xte_bench library (bench/CMakeLists.txt), also in the GPU-only xte program (XTE_BENCH_GPU_ONLY).
 */
#define _POSIX_C_SOURCE 200809L
#include "gpu_device.h"

#include "cuda/xte_cublaslt.h" /* the cuBLASLt loader and ABI values (plain C): the anchors */

double gdev_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int gdev_open(xte_stream *gpu) {
  const xte_status st = xte_stream_create(XTE_BACKEND_CUDA, 0, NULL, gpu);
  if (st == XTE_ERROR_BACKEND_UNAVAILABLE) {
    printf("SKIPPED: no usable CUDA device: %s\n", xte_last_error());
    return 77;
  }
  CHECK(st);
  return 0;
}

void gdev_release(xte_stream gpu, void *const *dev, int ndev, void *const *host, int nhost) {
  int i;
  for (i = 0; i < ndev; i++)
    if (dev[i]) CHECK(xte_free(gpu, dev[i]));
  for (i = 0; i < nhost; i++) free(host[i]);
}

void gdev_gemm_ops_make(xte_stream gpu, int64_t M, int64_t N, int64_t K, xte_scale_layout layout,
                        gdev_gemm_ops *o) {
  int64_t sar, sac, sbr, sbc;
  CHECK(xte_quantize_scale_shape(M, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK, layout, 0,
                                 &sar, &sac));
  CHECK(xte_quantize_scale_shape(N, K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK, layout, 0,
                                 &sbr, &sbc));
  memset(o, 0, sizeof *o);
  CHECK(xte_malloc(gpu, (size_t)(M * K), &o->a));
  CHECK(xte_malloc(gpu, (size_t)(N * K), &o->b));
  CHECK(xte_malloc(gpu, (size_t)(sar * sac) * 4, &o->sa));
  CHECK(xte_malloc(gpu, (size_t)(sbr * sbc) * 4, &o->sb));
  CHECK(xte_malloc(gpu, (size_t)(M * N) * 2, &o->d));
  o->qa.scaling_mode = XTE_SCALING_BLOCK_1x128;
  o->qa.recipe = XTE_RECIPE_TE_BLOCK;
  o->qa.rowwise = xte_tensor_2d(o->a, XTE_DTYPE_E4M3, M, K);
  o->qa.rowwise_scale_inv = (xte_scale_tensor){o->sa, XTE_DTYPE_FP32, sar, sac, layout};
  o->qb = o->qa;
  o->qb.scaling_mode = XTE_SCALING_BLOCK_128x128;
  o->qb.rowwise = xte_tensor_2d(o->b, XTE_DTYPE_E4M3, N, K);
  o->qb.rowwise_scale_inv = (xte_scale_tensor){o->sb, XTE_DTYPE_FP32, sbr, sbc, layout};
  o->D = xte_tensor_2d(o->d, XTE_DTYPE_BF16, M, N);
}

void gdev_gemm_ops_free(xte_stream gpu, gdev_gemm_ops *o) {
  void *const dev[] = {o->a, o->b, o->sa, o->sb, o->d};
  gdev_release(gpu, dev, GDEV_N(dev), NULL, 0);
}

/* ---------------------------------------------------------------- the plugin's report
 * What the plugin says it ran (src/cuda/xte_gpu_report.h): one line per GEMM call appended to
 * $XTE_GPU_REPORT, which main() points at a file of its own when it is not set. gdev_rep_take()
 * returns the lines written since the last call (static buffer), so every row names what its own
 * calls ran, as the plugin reported it: nothing here is inferred. */
static char g_rep_path[512];
/* XTE_DEVICE_BENCH_SMALL=1: small check shapes (the dry run on the host SIMT runner) */
int gdev_small;
static long g_rep_off;

static void rep_init(void) {
  const char *p = getenv("XTE_GPU_REPORT");
  if (p && *p) {
    snprintf(g_rep_path, sizeof g_rep_path, "%s", p);
  } else {
    snprintf(g_rep_path, sizeof g_rep_path, "/tmp/xte_device_bench_report.%ld", (long)clock());
    setenv("XTE_GPU_REPORT", g_rep_path, 1);
  }
  {
    FILE *f = fopen(g_rep_path, "rb");
    if (f) {
      fseek(f, 0, SEEK_END);
      g_rep_off = ftell(f);
      fclose(f);
    }
  }
}

const char *gdev_rep_take(void) {
  static char buf[1 << 16];
  size_t n = 0;
  FILE *f = fopen(g_rep_path, "rb");
  buf[0] = '\0';
  if (!f) return buf;
  if (fseek(f, g_rep_off, SEEK_SET) == 0) n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fseek(f, 0, SEEK_END);
  g_rep_off = ftell(f);
  fclose(f);
  return buf;
}

/* The value of key=... in a report line (up to a space, or the closing quote), into out. */
static void rep_field(const char *line, const char *key, char *out, size_t size) {
  const char *p = line;
  size_t kl = strlen(key), n = 0;
  out[0] = '\0';
  while ((p = strstr(p, key)) != NULL) {
    if ((p == line || p[-1] == ' ') && p[kl] == '=') break;
    p += kl;
  }
  if (!p) return;
  p += kl + 1;
  if (*p == '"') {
    p++;
    while (p[n] && p[n] != '"' && p[n] != '\n') n++;
  } else {
    while (p[n] && p[n] != ' ' && p[n] != '\n') n++;
  }
  if (n >= size) n = size - 1;
  memcpy(out, p, n);
  out[n] = '\0';
}

/* The distinct values of key over the lines of rep, joined by ',' ("-" when none). */
void gdev_rep_values(const char *rep, const char *key, char *out, size_t size) {
  const char *l = rep;
  out[0] = '\0';
  while (l && *l) {
    char v[160];
    rep_field(l, key, v, sizeof v);
    if (*v) {
      /* distinct: v not yet a whole item of out */
      const size_t vl = strlen(v);
      const char *q = out;
      int seen = 0;
      while ((q = strstr(q, v)) != NULL) {
        if ((q == out || q[-1] == ',') && (q[vl] == ',' || q[vl] == '\0')) seen = 1;
        q += vl;
      }
      if (!seen && strlen(out) + vl + 2 < size) {
        if (*out) strcat(out, ",");
        strcat(out, v);
      }
    }
    l = strchr(l, '\n');
    if (l) l++;
  }
  if (!*out) snprintf(out, size, "-");
}

enum { OP_COPY, OP_QUANT_ROW, OP_QUANT_BOTH, OP_DEQUANT, OP_CAST, OP_COUNT };
static const char *op_name[OP_COUNT] = {"d2d copy (anchor)", "quantize 1x128 rowwise",
                                        "quantize 1x128 row + col", "dequantize rowwise -> bf16",
                                        "cast bf16 -> e4m3"};

/* ---------------------------------------------------------------- anchors
 *   xte bench device anchors [M N K [iterations]]
 * The rates of xte's GEMMs beside cuBLASLt's of the same shape, on the same device, from one
 * run: xte exact (the automatic kernel) and FAST, 1x128 x 128x128 e4m3 -> bf16; cuBLASLt bf16 x
 * bf16 -> bf16 and e4m3 x e4m3 -> bf16 (per-tensor, scale 1), compute 32F, TN, its first
 * heuristic algorithm with a 32 MiB workspace. cuBLASLt runs on the legacy default stream
 * (cudaStreamLegacy), which an xte stream wraps for the synchronization. Exit 0 when the table
 * was printed, 77 without a device or without a usable libcublasLt (xte's rows printed first). */
static int anchors_main(int argc, char **argv) {
  const int64_t M = argc > 3 ? atoll(argv[1]) : 4096, N = argc > 3 ? atoll(argv[2]) : 7168,
                K = argc > 3 ? atoll(argv[3]) : 16384;
  const int iters = argc > 4 ? atoi(argv[4]) : 10;
  const double flop = 2.0 * (double)M * (double)N * (double)K;
  xte_stream gpu, leg;
  const int open = gdev_open(&gpu);
  gdev_gemm_ops g;
  void *d_ab, *d_bb, *ws;
  int64_t na, nb, i;
  xte_gemm_config cfg = xte_gemm_config_default();
  xte_lt_api api;
  uint8_t *h;
  int mode, it;
  if (open) return open;
  if (M <= 0 || N <= 0 || K <= 0 || K % 128 != 0 || iters < 1) {
    fprintf(stderr, "usage: %s anchors [M N K [iterations]] (K a multiple of 128)\n", argv[0]);
    return 2;
  }
  gdev_gemm_ops_make(gpu, M, N, K, XTE_SCALE_LAYOUT_TE_GEMM, &g);
  na = g.qa.rowwise_scale_inv.rows * g.qa.rowwise_scale_inv.cols;
  nb = g.qb.rowwise_scale_inv.rows * g.qb.rowwise_scale_inv.cols;
  CHECK(xte_malloc(gpu, (size_t)(M * K) * 2, &d_ab));
  CHECK(xte_malloc(gpu, (size_t)(N * K) * 2, &d_bb));
  CHECK(xte_malloc(gpu, (size_t)32 << 20, &ws));
  {
    const size_t big = (size_t)((M > N ? M : N) * K) * 2;
    float *ones = (float *)malloc(sizeof(float) * (size_t)(na + nb));
    h = (uint8_t *)malloc(big);
    if (!h || !ones) return 1;
    for (i = 0; i < (int64_t)big; i++) /* e4m3 codes of magnitude < 1, and bf16 in (-2, 2) */
      h[i] = (uint8_t)(i & 1 ? ((uint32_t)i * 2654435761u >> 24) & 0xBF : 0x31 + i % 5);
    for (i = 0; i < na + nb; i++) ones[i] = 1.0f;
    CHECK(xte_memcpy(gpu, g.a, h, (size_t)(M * K), XTE_MEMCPY_HOST_TO_DEVICE));
    CHECK(xte_memcpy(gpu, g.b, h, (size_t)(N * K), XTE_MEMCPY_HOST_TO_DEVICE));
    CHECK(xte_memcpy(gpu, d_ab, h, (size_t)(M * K) * 2, XTE_MEMCPY_HOST_TO_DEVICE));
    CHECK(xte_memcpy(gpu, d_bb, h, (size_t)(N * K) * 2, XTE_MEMCPY_HOST_TO_DEVICE));
    CHECK(xte_memcpy(gpu, g.sa, ones, (size_t)na * 4, XTE_MEMCPY_HOST_TO_DEVICE));
    CHECK(xte_memcpy(gpu, g.sb, ones + na, (size_t)nb * 4, XTE_MEMCPY_HOST_TO_DEVICE));
    free(h);
    free(ones);
  }
  printf(
      "| GEMM %lld x %lld x %lld -> bf16 (same device, one run) | ms | TFLOPS | x cuBLASLt FP8 |\n"
      "|---|---:|---:|---:|\n",
      (long long)M, (long long)N, (long long)K);
  {
    double ms_x[2] = {0, 0}, ms_lt[2] = {-1, -1};
    char what[2][200];
    for (mode = 0; mode < 2; mode++) {
      const int n_it = mode ? iters : (iters < 3 ? iters : 3);
      double t0;
      char path[64], ran[64];
      const char *rep;
      cfg.mode = mode ? XTE_GEMM_FAST : XTE_GEMM_EXACT;
      (void)gdev_rep_take();
      CHECK(xte_gemm(&g.qa, &g.qb, NULL, &g.D, &cfg, gpu)); /* warm-up */
      CHECK(xte_stream_synchronize(gpu));
      t0 = gdev_now();
      for (it = 0; it < n_it; it++) CHECK(xte_gemm(&g.qa, &g.qb, NULL, &g.D, &cfg, gpu));
      CHECK(xte_stream_synchronize(gpu));
      ms_x[mode] = (gdev_now() - t0) / n_it * 1e3;
      rep = gdev_rep_take();
      gdev_rep_values(rep, "path", path, sizeof path);
      gdev_rep_values(rep, "ran", ran, sizeof ran);
      snprintf(what[mode], sizeof what[mode], "xte %s (path %s, kernel %s), 1x128 x 128x128 e4m3",
               mode ? "FAST" : "exact", path, ran);
    }
    if (!xte_lt_load(&api)) {
      for (mode = 0; mode < 2; mode++)
        printf("| %s | %.3f | %.1f | - |\n", what[mode], ms_x[mode],
               flop / (ms_x[mode] * 1e-3) / 1e12);
      printf("SKIPPED: no cuBLASLt anchor: %s\n", api.why);
      return 77;
    }
    CHECK(
        xte_stream_create(XTE_BACKEND_CUDA, 0, (void *)(uintptr_t)1 /* cudaStreamLegacy */, &leg));
    for (mode = 0; mode < 2; mode++) { /* 0 bf16, 1 e4m3 */
      void *h_lt = NULL, *op = NULL, *la = NULL, *lb = NULL, *ld = NULL, *pref = NULL;
      const int ta = XTE_LT_OP_T, tb = XTE_LT_OP_N, ty = mode ? XTE_LT_R_8F_E4M3 : XTE_LT_R_16BF;
      const uint64_t wsb = (uint64_t)32 << 20;
      const float one = 1.0f, zero = 0.0f;
      xte_lt_heuristic r;
      int n = 0, ok;
      double t0 = gdev_now();
      memset(&r, 0, sizeof r);
      ok = api.create(&h_lt) == XTE_LT_OK &&
           api.desc_create(&op, XTE_LT_COMPUTE_32F, XTE_LT_R_32F) == XTE_LT_OK &&
           api.desc_set(op, XTE_LT_DESC_TRANSA, &ta, sizeof ta) == XTE_LT_OK &&
           api.desc_set(op, XTE_LT_DESC_TRANSB, &tb, sizeof tb) == XTE_LT_OK &&
           api.layout_create(&la, ty, (uint64_t)K, (uint64_t)N, K) == XTE_LT_OK &&
           api.layout_create(&lb, ty, (uint64_t)K, (uint64_t)M, K) == XTE_LT_OK &&
           api.layout_create(&ld, XTE_LT_R_16BF, (uint64_t)N, (uint64_t)M, N) == XTE_LT_OK &&
           api.pref_create(&pref) == XTE_LT_OK &&
           api.pref_set(pref, XTE_LT_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb) == XTE_LT_OK &&
           api.heuristic(h_lt, op, la, lb, ld, ld, pref, 1, &r, &n) == XTE_LT_OK && n > 0;
      for (it = -1; ok && it < iters; it++) {
        if (it == 0) {
          CHECK(xte_stream_synchronize(leg));
          t0 = gdev_now();
        }
        ok = api.matmul(h_lt, op, &one, mode ? g.b : d_bb, la, mode ? g.a : d_ab, lb, &zero, g.d,
                        ld, g.d, ld, &r.algo, ws, (size_t)wsb, (void *)(uintptr_t)1) == XTE_LT_OK;
      }
      CHECK(xte_stream_synchronize(leg));
      if (ok)
        ms_lt[mode] = (gdev_now() - t0) / iters * 1e3;
      else
        printf("cuBLASLt %s: no algorithm or a failed call (n %d)\n", mode ? "e4m3" : "bf16", n);
      if (pref) api.pref_destroy(pref);
      if (ld) api.layout_destroy(ld);
      if (lb) api.layout_destroy(lb);
      if (la) api.layout_destroy(la);
      if (op) api.desc_destroy(op);
    }
    for (mode = 0; mode < 2; mode++)
      printf("| %s | %.3f | %.1f | %.3f |\n", what[mode], ms_x[mode],
             flop / (ms_x[mode] * 1e-3) / 1e12, ms_lt[1] > 0 ? ms_lt[1] / ms_x[mode] : 0.0);
    for (mode = 0; mode < 2; mode++)
      if (ms_lt[mode] > 0)
        printf("| cuBLASLt %s (%s, per-tensor) | %.3f | %.1f | %.3f |\n",
               mode ? "e4m3 x e4m3" : "bf16 x bf16", api.lib, ms_lt[mode],
               flop / (ms_lt[mode] * 1e-3) / 1e12, ms_lt[1] > 0 ? ms_lt[1] / ms_lt[mode] : 0.0);
    printf("(host timing around the calls and one synchronize; exact: up to 3 calls, others %d)\n",
           iters);
    xte_stream_destroy(leg);
    if (ms_lt[0] < 0 || ms_lt[1] < 0) {
      printf("FAILED: a cuBLASLt anchor did not run\n");
      return 1;
    }
  }
  return 0;
}

int xte_bench_device(int argc, char **argv) {
  int64_t M = argc > 2 ? atoll(argv[1]) : 8192, K = argc > 2 ? atoll(argv[2]) : 8192;
  int iters = argc > 3 ? atoi(argv[3]) : 20, op, i;
  size_t n = (size_t)(M * K), in_bytes = n * 2;
  xte_stream gpu;
  int open;
  rep_init();
  gdev_small = getenv("XTE_DEVICE_BENCH_SMALL") && atoi(getenv("XTE_DEVICE_BENCH_SMALL")) > 0;
  if (argc > 1 && strcmp(argv[1], "gemm") == 0) return gdev_gemm_main(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "attention") == 0) return gdev_attn_main(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "fast") == 0) return gdev_fast_main(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "anchors") == 0) return anchors_main(argc - 1, argv + 1);
  open = gdev_open(&gpu);
  void *d_in, *d_copy, *d_rq, *d_rs, *d_cq, *d_cs, *d_out, *d_amax;
  int64_t rsr, rsc, csr, csc;
  xte_quant_config cfg = xte_quant_config_default();
  xte_tensor in, out8, out16;
  xte_qtensor qr, qb;
  double gbs[OP_COUNT], us[OP_COUNT];
  uint16_t *h;

  if (open) return open;
  if (M <= 0 || K <= 0 || K % 128 != 0 || iters < 1) {
    fprintf(stderr, "usage: %s [M K [iterations]] (K a multiple of 128)\n", argv[0]);
    return 2;
  }
  CHECK(xte_quantize_scale_shape(M, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                 XTE_SCALE_LAYOUT_COMPACT, 0, &rsr, &rsc));
  CHECK(xte_quantize_scale_shape(M, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                 XTE_SCALE_LAYOUT_COMPACT, 1, &csr, &csc));
  CHECK(xte_malloc(gpu, in_bytes, &d_in));
  CHECK(xte_malloc(gpu, in_bytes, &d_copy));
  CHECK(xte_malloc(gpu, n, &d_rq));
  CHECK(xte_malloc(gpu, n, &d_cq));
  CHECK(xte_malloc(gpu, (size_t)(rsr * rsc) * 4, &d_rs));
  CHECK(xte_malloc(gpu, (size_t)(csr * csc) * 4, &d_cs));
  CHECK(xte_malloc(gpu, in_bytes, &d_out));
  CHECK(xte_malloc(gpu, 4, &d_amax));
  h = (uint16_t *)malloc(in_bytes);
  if (!h) return 1;
  for (i = 0; i < (int)(n > 0x7FFFFFFF ? 0x7FFFFFFF : n); i++) /* finite bf16 in (-2, 2) */
    h[i] = (uint16_t)(((uint32_t)i * 2654435761u) >> 16) & 0xBFFFu;
  CHECK(xte_memcpy(gpu, d_in, h, in_bytes, XTE_MEMCPY_HOST_TO_DEVICE));
  free(h);

  in = xte_tensor_2d(d_in, XTE_DTYPE_BF16, M, K);
  memset(&qr, 0, sizeof qr);
  qr.scaling_mode = XTE_SCALING_BLOCK_1x128;
  qr.recipe = XTE_RECIPE_TE_BLOCK;
  qr.rowwise = xte_tensor_2d(d_rq, XTE_DTYPE_E4M3, M, K);
  qr.rowwise_scale_inv.data = d_rs;
  qr.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  qr.rowwise_scale_inv.rows = rsr;
  qr.rowwise_scale_inv.cols = rsc;
  qr.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  qr.amax = (float *)d_amax;
  qb = qr;
  qb.columnwise = xte_tensor_2d(d_cq, XTE_DTYPE_E4M3, K, M); /* TE_BLOCK: transposed copy */
  qb.columnwise_scale_inv = qr.rowwise_scale_inv;
  qb.columnwise_scale_inv.data = d_cs;
  qb.columnwise_scale_inv.rows = csr;
  qb.columnwise_scale_inv.cols = csc;
  out8 = xte_tensor_2d(d_rq, XTE_DTYPE_E4M3, M, K);
  out16 = xte_tensor_2d(d_out, XTE_DTYPE_BF16, M, K);

  for (op = 0; op < OP_COUNT; op++) {
    double t0 = 0, bytes;
    for (i = -3; i < iters; i++) { /* 3 warm-up runs */
      if (i == 0) {
        CHECK(xte_stream_synchronize(gpu));
        t0 = gdev_now();
      }
      switch (op) {
        case OP_COPY:
          CHECK(xte_memcpy(gpu, d_copy, d_in, in_bytes, XTE_MEMCPY_DEVICE_TO_DEVICE));
          break;
        case OP_QUANT_ROW:
          CHECK(xte_quantize(&in, &qr, &cfg, gpu));
          break;
        case OP_QUANT_BOTH:
          CHECK(xte_quantize(&in, &qb, &cfg, gpu));
          break;
        case OP_DEQUANT:
          CHECK(xte_dequantize(&qr, 0, &out16, gpu));
          break;
        default:
          CHECK(xte_cast(&in, &out8, 1, gpu));
      }
    }
    CHECK(xte_stream_synchronize(gpu));
    us[op] = (gdev_now() - t0) / iters * 1e6;
    bytes = op == OP_COPY        ? 2.0 * (double)in_bytes
            : op == OP_QUANT_ROW ? (double)in_bytes + (double)n + (double)(rsr * rsc) * 4
            : op == OP_QUANT_BOTH
                ? (double)in_bytes + 2.0 * (double)n + (double)(rsr * rsc + csr * csc) * 4
            : op == OP_DEQUANT ? (double)n + (double)(rsr * rsc) * 4 + (double)in_bytes
                               : (double)in_bytes + (double)n;
    gbs[op] = bytes / (us[op] * 1e-6) / 1e9;
  }
  printf("| op (bf16 %lld x %lld, %d iterations) | us | GB/s | x d2d copy |\n", (long long)M,
         (long long)K, iters);
  printf("|---|---:|---:|---:|\n");
  for (op = 0; op < OP_COUNT; op++)
    printf("| %s | %.1f | %.0f | %.2f |\n", op_name[op], us[op], gbs[op], gbs[op] / gbs[OP_COPY]);
  printf(
      "(host timing around %d launches and one synchronize; no L2 flush: the tensor is larger "
      "than L2)\n",
      iters);
  return 0;
}
