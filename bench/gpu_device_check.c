/* `xte bench device` (bench/gpu_device.h): the modes gemm, fast and attention, which compare the
 * CUDA backend's bytes with the CPU's (or FAST's error with its bound). */
#define _POSIX_C_SOURCE 200809L
#include "gpu_device.h"

/* ---------------------------------------------------------------- GEMM
 *   xte bench device gemm [M N K [iterations]]
 * 1. byte equality of the CUDA exact GEMM with the CPU backend: dense 1x128 x 128x128 on odd
 *    shapes, e4m3 x e4m3 and e4m3 x e5m2, fp32 out, and bf16 out with a bf16 C and a bias; a
 *    contiguous grouped call (an empty group, alignment 64) and a masked one; every GPU call twice
 *    (same bytes). Operands are quantized on the CPU and copied to the device, so both backends
 *    read the same codes.
 * 2. the time of the exact GEMM at M x N x K (default 4096 x 7168 x 16384), A 1x128, B 128x128,
 *    e4m3, bf16 out, operands quantized on the device; TFLOPS = 2 M N K / time.
 * Exit 0 when everything matched and the table was printed, 77 without a CUDA device, 1 on a
 * mismatch or a failed call. */
typedef struct gop {
  xte_qtensor h, d; /* host copy (CPU backend) and device copy */
  size_t code_bytes, scale_bytes;
} gop;

/* xorshift64: the next uniform double in [0, 1) of the stream with state *s */
static double unif(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return (double)(*s >> 11) * (1.0 / 9007199254740992.0);
}

static uint64_t g_rng = 88172645463325252ull;

/* X [R, C] random (rows of varying magnitude), quantized rowwise on the CPU, copied to gpu */
static xte_scale_layout g_dev_layout = XTE_SCALE_LAYOUT_COMPACT; /* of the device copy */
static void gop_make(gop *o, xte_stream gpu, int64_t R, int64_t C, xte_scaling_mode mode,
                     xte_dtype dt) {
  float *x = (float *)malloc(sizeof(float) * (size_t)(R * C > 0 ? R * C : 1)), *x2;
  int64_t sr, sc, i;
  xte_tensor in;
  if (!x) exit(1);
  for (i = 0; i < R * C; i++) {
    double v = 2.0 * unif(&g_rng) - 1.0;
    x[i] = (float)(v * (double)(1 << (i / (C > 0 ? C : 1)) % 7));
  }
  memset(o, 0, sizeof *o);
  CHECK(xte_quantize_scale_shape(R, C, mode, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT, 0, &sr,
                                 &sc));
  o->code_bytes = (size_t)(R * C);
  o->scale_bytes = (size_t)(sr * sc) * 4;
  o->h.scaling_mode = mode;
  o->h.recipe = XTE_RECIPE_TE_BLOCK;
  o->h.rowwise = xte_tensor_2d(malloc(o->code_bytes + 1), dt, R, C);
  o->h.rowwise_scale_inv.data = malloc(o->scale_bytes + 4);
  o->h.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  o->h.rowwise_scale_inv.rows = sr;
  o->h.rowwise_scale_inv.cols = sc;
  o->h.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  in = xte_tensor_2d(x, XTE_DTYPE_FP32, R, C);
  CHECK(xte_quantize(&in, &o->h, NULL, NULL));
  x2 = x; /* kept for a second layout of the device copy's scales (freed below) */
  o->d = o->h;
  CHECK(xte_malloc(gpu, o->code_bytes + 1, &o->d.rowwise.data));
  CHECK(xte_memcpy(gpu, o->d.rowwise.data, o->h.rowwise.data, o->code_bytes,
                   XTE_MEMCPY_HOST_TO_DEVICE));
  if (g_dev_layout != XTE_SCALE_LAYOUT_COMPACT) { /* the same codes, scales in another layout */
    xte_qtensor t = o->h;
    int64_t tr, tc;
    in = xte_tensor_2d(x2, XTE_DTYPE_FP32, R, C);
    CHECK(xte_quantize_scale_shape(R, C, mode, XTE_RECIPE_TE_BLOCK, g_dev_layout, 0, &tr, &tc));
    t.rowwise = xte_tensor_2d(malloc(o->code_bytes + 1), dt, R, C);
    t.rowwise_scale_inv.data = calloc((size_t)(tr * tc) + 1, 4);
    t.rowwise_scale_inv.rows = tr;
    t.rowwise_scale_inv.cols = tc;
    t.rowwise_scale_inv.layout = g_dev_layout;
    CHECK(xte_quantize(&in, &t, NULL, NULL));
    o->d.rowwise_scale_inv = t.rowwise_scale_inv;
    CHECK(xte_malloc(gpu, (size_t)(tr * tc) * 4 + 4, &o->d.rowwise_scale_inv.data));
    CHECK(xte_memcpy(gpu, o->d.rowwise_scale_inv.data, t.rowwise_scale_inv.data,
                     (size_t)(tr * tc) * 4, XTE_MEMCPY_HOST_TO_DEVICE));
    free(t.rowwise.data);
    free(t.rowwise_scale_inv.data);
  } else {
    CHECK(xte_malloc(gpu, o->scale_bytes + 4, &o->d.rowwise_scale_inv.data));
    CHECK(xte_memcpy(gpu, o->d.rowwise_scale_inv.data, o->h.rowwise_scale_inv.data, o->scale_bytes,
                     XTE_MEMCPY_HOST_TO_DEVICE));
  }
  free(x2);
}

static void gop_free(gop *o, xte_stream gpu) {
  free(o->h.rowwise.data);
  free(o->h.rowwise_scale_inv.data);
  CHECK(xte_free(gpu, o->d.rowwise.data));
  CHECK(xte_free(gpu, o->d.rowwise_scale_inv.data));
}

/* One call on both backends (groups NULL: dense), D [rows, N] of d_dt, optional bf16 C and bias:
 * returns the number of differing bytes (CPU vs GPU, and GPU run 1 vs run 2). */
static size_t gemm_check_one(xte_stream gpu, xte_stream cpu, gop *a, gop *b, int64_t rows,
                             int64_t N, xte_dtype d_dt, int with_c, const xte_gemm_groups *grp,
                             const int32_t *masked_host) {
  const size_t es = d_dt == XTE_DTYPE_BF16 ? 2 : 4, nd = (size_t)(rows * N) * es;
  uint8_t *hd = (uint8_t *)malloc(nd + 1), *gd = (uint8_t *)malloc(nd + 1),
          *gd2 = (uint8_t *)malloc(nd + 1), *hc = (uint8_t *)malloc((size_t)(rows * N) * 2 + 1);
  float *hb = (float *)malloc(sizeof(float) * (size_t)N + 4);
  void *dd, *dc = NULL, *db = NULL, *dm = NULL;
  xte_gemm_config cfg = xte_gemm_config_default();
  xte_tensor D, C, B, mt;
  xte_gemm_groups g;
  size_t i, diff = 0;
  int run;
  if (!hd || !gd || !gd2 || !hc || !hb) exit(1);
  for (i = 0; i < (size_t)(rows * N); i++) ((uint16_t *)hc)[i] = (uint16_t)(0x3F80u | (i % 97u));
  for (i = 0; i < (size_t)N; i++) hb[i] = (float)((int)(i % 13) - 6) * 0.125f;
  CHECK(xte_malloc(gpu, nd + 1, &dd));
  if (with_c) {
    CHECK(xte_malloc(gpu, (size_t)(rows * N) * 2 + 1, &dc));
    CHECK(xte_malloc(gpu, sizeof(float) * (size_t)N + 4, &db));
    CHECK(xte_memcpy(gpu, dc, hc, (size_t)(rows * N) * 2, XTE_MEMCPY_HOST_TO_DEVICE));
    CHECK(xte_memcpy(gpu, db, hb, sizeof(float) * (size_t)N, XTE_MEMCPY_HOST_TO_DEVICE));
  }
  if (grp && masked_host) {
    CHECK(xte_malloc(gpu, sizeof(int32_t) * (size_t)grp->num_groups, &dm));
    CHECK(xte_memcpy(gpu, dm, masked_host, sizeof(int32_t) * (size_t)grp->num_groups,
                     XTE_MEMCPY_HOST_TO_DEVICE));
  }
  for (run = 0; run < 3; run++) { /* CPU, GPU, GPU again */
    uint8_t *out = run == 0 ? hd : (run == 1 ? gd : gd2);
    xte_stream s = run == 0 ? cpu : gpu;
    void *dptr = run == 0 ? (void *)hd : dd;
    memset(out, 0xCD, nd + 1);
    if (run > 0) CHECK(xte_memcpy(gpu, dd, out, nd, XTE_MEMCPY_HOST_TO_DEVICE));
    D = xte_tensor_2d(dptr, d_dt, rows, N);
    C = xte_tensor_2d(run == 0 ? (void *)hc : dc, XTE_DTYPE_BF16, rows, N);
    B = xte_tensor_1d(run == 0 ? (void *)hb : db, XTE_DTYPE_FP32, N);
    cfg.accumulate = with_c;
    cfg.bias = with_c ? &B : NULL;
    if (grp) {
      g = *grp;
      if (masked_host) {
        mt = xte_tensor_1d(run == 0 ? (void *)masked_host : dm, XTE_DTYPE_INT32, g.num_groups);
        g.masked_m = &mt;
      }
      CHECK(xte_gemm_grouped(run == 0 ? &a->h : &a->d, run == 0 ? &b->h : &b->d, with_c ? &C : NULL,
                             &D, &g, &cfg, s));
    } else {
      CHECK(xte_gemm(run == 0 ? &a->h : &a->d, run == 0 ? &b->h : &b->d, with_c ? &C : NULL, &D,
                     &cfg, s));
    }
    if (run > 0) {
      CHECK(xte_stream_synchronize(gpu));
      CHECK(xte_memcpy(gpu, out, dd, nd, XTE_MEMCPY_DEVICE_TO_HOST));
    }
  }
  for (i = 0; i < nd; i++) diff += (hd[i] != gd[i]) + (gd[i] != gd2[i]);
  {
    void *const dev[] = {dd, dc, db, dm}, *const host[] = {hd, gd, gd2, hc, hb};
    gdev_release(gpu, dev, GDEV_N(dev), host, GDEV_N(host));
  }
  return diff;
}

/* The kernels the GPU calls since the last look ran, as the plugin reported them (a static
 * string for the row). With a forced kernel (req): a row where it did not run sets *failed,
 * unless the plugin said the kernel does not take these operands (imma with an e5m2 operand: the
 * automatic choice runs, reported as not_honoured); *rows counts the rows where it ran. */
static const char *gemm_ran(const char *req, int forced, int *failed, int *rows) {
  static char out[400];
  char ran[120], why[240];
  const char *rep = gdev_rep_take();
  gdev_rep_values(rep, "ran", ran, sizeof ran);
  gdev_rep_values(rep, "not_honoured", why, sizeof why);
  if (!strchr(rep, '\n')) {
    snprintf(out, sizeof out, "FAILED: the plugin reported no GEMM call");
    *failed = 1;
  } else if (!forced) {
    snprintf(out, sizeof out, "%s (auto)", ran);
  } else if (strcmp(ran, req) == 0) {
    snprintf(out, sizeof out, "%s (forced)", ran);
    (*rows)++;
  } else if (strcmp(req, "imma") == 0 && strstr(why, "e5m2") && !strstr(ran, ",")) {
    snprintf(out, sizeof out, "%s (imma does not take e5m2: %s)", ran, why);
  } else {
    snprintf(out, sizeof out, "FAILED: forced %s did not run: ran %s%s%s", req, ran,
             *why && strcmp(why, "-") ? ": " : "", strcmp(why, "-") ? why : "");
    *failed = 1;
  }
  return out;
}

/* The timed GEMM's operands (bench/gpu_device.h), quantized on the device from one bf16 source of
 * max(M, N) rows (A reads M of them, B N) of finite values in (-2, 2), staged through a host
 * buffer of at most host_max elements (repeated) */
static void timed_ops(xte_stream gpu, int64_t M, int64_t N, int64_t K, xte_scale_layout layout,
                      int64_t host_max, gdev_gemm_ops *o) {
  const int64_t big = (M > N ? M : N) * K, hn = big < host_max ? big : host_max;
  uint16_t *h = (uint16_t *)malloc((size_t)hn * 2);
  void *d_x;
  xte_tensor x;
  int64_t i;
  if (!h) exit(1);
  gdev_gemm_ops_make(gpu, M, N, K, layout, o);
  CHECK(xte_malloc(gpu, (size_t)big * 2, &d_x));
  for (i = 0; i < hn; i++) h[i] = (uint16_t)(((uint32_t)i * 2654435761u) >> 16) & 0xBFFFu;
  for (i = 0; i < big; i += hn) {
    const int64_t len = big - i < hn ? big - i : hn;
    CHECK(xte_memcpy(gpu, (char *)d_x + i * 2, h, (size_t)len * 2, XTE_MEMCPY_HOST_TO_DEVICE));
  }
  free(h);
  x = xte_tensor_2d(d_x, XTE_DTYPE_BF16, M, K);
  CHECK(xte_quantize(&x, &o->qa, NULL, gpu));
  x = xte_tensor_2d(d_x, XTE_DTYPE_BF16, N, K);
  CHECK(xte_quantize(&x, &o->qb, NULL, gpu));
  CHECK(xte_free(gpu, d_x));
}

int gdev_gemm_main(int argc, char **argv) {
  const int64_t M = argc > 3 ? atoll(argv[1]) : 4096, N = argc > 3 ? atoll(argv[2]) : 7168,
                K = argc > 3 ? atoll(argv[3]) : 16384;
  const int iters = argc > 4 ? atoi(argv[4]) : 5;
  xte_stream gpu, cpu;
  const int open = gdev_open(&gpu);
  int failed = 0, c, i, forced_rows = 0;
  const char *req = getenv("XTE_CUDA_GEMM_KERNEL");
  const int forced = req && *req && strcmp(req, "auto") != 0;
  if (open) return open;
  CHECK(xte_stream_create(XTE_BACKEND_CPU, 0, NULL, &cpu));
  printf("kernel requested: %s (XTE_CUDA_GEMM_KERNEL)\n", forced ? req : "auto");
  if (M <= 0 || N <= 0 || K <= 0 || K % 128 != 0 || iters < 1) {
    fprintf(stderr, "usage: %s gemm [M N K [iterations]] (K a multiple of 128)\n", argv[0]);
    return 2;
  }
  /* 1. byte equality */
  {
    static const int64_t big[][3] = {{257, 300, 1000}, {1000, 1536, 2048}, {1, 4096, 7168}};
    static const int64_t small[][3] = {{65, 72, 300}, {33, 64, 256}, {1, 136, 384}};
    const int64_t(*shapes)[3] = gdev_small ? small : big;
    printf(
        "| exact GEMM, CUDA vs CPU | bytes differing | kernel that ran (plugin's report) |\n"
        "|---|---:|---|\n");
    (void)gdev_rep_take();
    for (c = 0; c < 3; c++)
      for (i = 0; i < 2; i++) {
        gop a, b;
        const int64_t m = shapes[c][0], n = shapes[c][1], k = shapes[c][2];
        size_t d;
        gop_make(&a, gpu, m, k, XTE_SCALING_BLOCK_1x128, XTE_DTYPE_E4M3);
        gop_make(&b, gpu, n, k, XTE_SCALING_BLOCK_128x128, i ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3);
        d = gemm_check_one(gpu, cpu, &a, &b, m, n, i ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, i, NULL,
                           NULL);
        printf("| dense %lld x %lld x %lld e4m3 x %s, %s | %zu | %s |\n", (long long)m,
               (long long)n, (long long)k, i ? "e5m2" : "e4m3",
               i ? "C bf16 + bias -> bf16" : "-> fp32", d,
               gemm_ran(req, forced, &failed, &forced_rows));
        failed |= d != 0;
        gop_free(&a, gpu);
        gop_free(&b, gpu);
      }
    {
      /* grouped: 4 groups of N = 384 over K = 1536 */
      static const int64_t sizes_big[4] = {300, 0, 129, 511}, sizes_small[4] = {33, 0, 17, 70};
      static const int32_t masked_big[4] = {0, 200, 256, 17}, masked_small[4] = {0, 50, 64, 17};
      const int64_t *sizes = gdev_small ? sizes_small : sizes_big;
      const int32_t *masked = gdev_small ? masked_small : masked_big;
      const int64_t mmax = gdev_small ? 64 : 256;
      const int64_t G = 4, n = gdev_small ? 64 : 384, k = gdev_small ? 256 : 1536,
                    rows = gdev_small ? 64 + 0 + 64 + 128 : 320 + 0 + 192 + 512;
      xte_gemm_groups grp;
      gop a, b, am;
      size_t d;
      memset(&grp, 0, sizeof grp);
      grp.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
      grp.num_groups = (int)G;
      grp.group_sizes = sizes;
      grp.alignment = 64;
      gop_make(&a, gpu, rows, k, XTE_SCALING_BLOCK_1x128, XTE_DTYPE_E4M3);
      gop_make(&b, gpu, G * n, k, XTE_SCALING_BLOCK_128x128, XTE_DTYPE_E4M3);
      d = gemm_check_one(gpu, cpu, &a, &b, rows, n, XTE_DTYPE_BF16, 0, &grp, NULL);
      printf("| grouped contiguous G 4, N %lld, K %lld, align 64 -> bf16 | %zu | %s |\n",
             (long long)n, (long long)k, d, gemm_ran(req, forced, &failed, &forced_rows));
      failed |= d != 0;
      memset(&grp, 0, sizeof grp);
      grp.kind = XTE_GEMM_GROUPED_MASKED;
      grp.num_groups = (int)G;
      gop_make(&am, gpu, G * mmax, k, XTE_SCALING_BLOCK_1x128, XTE_DTYPE_E4M3);
      d = gemm_check_one(gpu, cpu, &am, &b, G * mmax, n, XTE_DTYPE_FP32, 1, &grp, masked);
      printf("| grouped masked G 4, m_max %lld, N %lld, K %lld, C + bias -> fp32 | %zu | %s |\n",
             (long long)mmax, (long long)n, (long long)k, d,
             gemm_ran(req, forced, &failed, &forced_rows));
      failed |= d != 0;
      gop_free(&a, gpu);
      gop_free(&b, gpu);
      gop_free(&am, gpu);
    }
  }
  /* 2. timing at M x N x K, operands quantized on the device */
  {
    gdev_gemm_ops g;
    double t0, ms;
    timed_ops(gpu, M, N, K, XTE_SCALE_LAYOUT_COMPACT, (int64_t)1 << 24, &g);
    (void)gdev_rep_take();
    CHECK(xte_gemm(&g.qa, &g.qb, NULL, &g.D, NULL, gpu)); /* warm-up */
    CHECK(xte_stream_synchronize(gpu));
    t0 = gdev_now();
    for (i = 0; i < iters; i++) CHECK(xte_gemm(&g.qa, &g.qb, NULL, &g.D, NULL, gpu));
    CHECK(xte_stream_synchronize(gpu));
    ms = (gdev_now() - t0) / iters * 1e3;
    {
      const char *ran = gemm_ran(req, forced, &failed, &forced_rows);
      printf(
          "| exact GEMM (kernel %s) 1x128 x 128x128 e4m3, %lld x %lld x %lld -> bf16 "
          "| %.2f ms | %.2f TFLOPS |\n",
          ran, (long long)M, (long long)N, (long long)K, ms,
          2.0 * (double)M * (double)N * (double)K / (ms * 1e-3) / 1e12);
    }
    printf("(host timing around %d calls and one synchronize, after one warm-up call)\n", iters);
    gdev_gemm_ops_free(gpu, &g);
  }
  xte_stream_destroy(cpu);
  xte_stream_destroy(gpu);
  if (forced && forced_rows == 0) {
    printf("FAILED: forced kernel %s ran in no row\n", req);
    failed = 1;
  }
  if (failed)
    printf("FAILED: the CUDA exact GEMM differs from the CPU backend, or a kernel did not run\n");
  return failed ? 1 : 0;
}

/* ---------------------------------------------------------------- FAST GEMM
 *   xte bench device fast [iterations]
 * 1. XTE_GEMM_FAST (cuBLASLt on sm_90 with libcublasLt >= 12.9, else the exact kernel) against the
 *    exact kernel on the same device: 1x128 x 128x128, 128x128 x 1x128, 1x128 x 1x128, e4m3 (and
 *    e4m3 x e5m2), fp32 out, scales COMPACT (repacked) and TE_GEMM (read in place), K blocks a
 *    multiple of 4 and not. Every output must satisfy the FAST bound of include/xte/gemm.h,
 *      |D_fast - D_exact| <= (KB 2^-13 + (nb + 2) 2^-23) S   (S = sum_k |a_k sa b_k sb|; the
 *    scales here are normal, so the subnormal terms vanish; fp32 out adds nothing),
 *    S from the operands dequantized exactly on the CPU. Also printed: the worst ratio to S and
 *    the share of outputs bit-identical to the exact kernel (a measurement, not a requirement).
 * 2. TFLOPS of FAST and of the exact kernel at 4096 x 7168 x 16384, 1x128 x 128x128, bf16 out.
 * Exit 0 when every output met the bound, 77 without a CUDA device, 1 otherwise. */
static int g_expect_lt; /* --expect-cublaslt: every FAST call must report path=cublaslt */
static int g_fast_calls, g_fast_lt;

/* One FAST case: the FAST call against the exact kernel on the same device. bias: a bias [n]
 * (values bf16 does not hold: the plugin adds the caller's fp32 bias after cuBLASLt, as the
 * contract says, so the bound of gemm.h holds unchanged). With k = 128 the output is one scaled
 * block partial: its error is the error of that partial. */
static int fast_check(xte_stream gpu, xte_scaling_mode ma, xte_scaling_mode mb, xte_dtype db,
                      int64_t m, int64_t n, int64_t k, xte_scale_layout lay, int bias) {
  gop a, b;
  const size_t nd = (size_t)(m * n);
  float *fe = (float *)malloc(nd * 4 + 4), *ff = (float *)malloc(nd * 4 + 4);
  float *xa = (float *)malloc((size_t)(m * k) * 4 + 4),
        *xb = (float *)malloc((size_t)(n * k) * 4 + 4), *hb = (float *)malloc((size_t)n * 4 + 4);
  void *dd, *dbias = NULL;
  xte_tensor D, XA, XB, B;
  xte_gemm_config cfg = xte_gemm_config_default();
  const int64_t nb = (k + 127) / 128;
  const double tol = ldexp(128.0, -13) + (double)(nb + 2) * ldexp(1.0, -23);
  double worst = 0.0;
  size_t i, bad = 0, same = 0;
  int mode, lt = 0;
  char path[200], why[240];
  if (!fe || !ff || !xa || !xb || !hb) exit(1);
  g_dev_layout = lay;
  gop_make(&a, gpu, m, k, ma, XTE_DTYPE_E4M3);
  gop_make(&b, gpu, n, k, mb, db);
  g_dev_layout = XTE_SCALE_LAYOUT_COMPACT;
  CHECK(xte_malloc(gpu, nd * 4 + 4, &dd));
  for (i = 0; i < (size_t)n; i++) /* 12 significant bits: not bf16 values */
    hb[i] = (float)((int)(i % 13) - 6) * 0.125f + (float)(i % 5) * 0x1p-12f;
  if (bias) {
    CHECK(xte_malloc(gpu, (size_t)n * 4 + 4, &dbias));
    CHECK(xte_memcpy(gpu, dbias, hb, (size_t)n * 4, XTE_MEMCPY_HOST_TO_DEVICE));
    B = xte_tensor_1d(dbias, XTE_DTYPE_FP32, n);
    cfg.bias = &B;
  }
  D = xte_tensor_2d(dd, XTE_DTYPE_FP32, m, n);
  for (mode = 0; mode < 2; mode++) {
    cfg.mode = mode ? XTE_GEMM_FAST : XTE_GEMM_EXACT;
    (void)gdev_rep_take();
    CHECK(xte_gemm(&a.d, &b.d, NULL, &D, &cfg, gpu));
    CHECK(xte_stream_synchronize(gpu));
    CHECK(xte_memcpy(gpu, mode ? ff : fe, dd, nd * 4, XTE_MEMCPY_DEVICE_TO_HOST));
  }
  {
    const char *rep = gdev_rep_take();
    gdev_rep_values(rep, "path", path, sizeof path);
    gdev_rep_values(rep, "why", why, sizeof why);
    lt = strcmp(path, "cublaslt") == 0;
    g_fast_calls++;
    g_fast_lt += lt;
  }
  XA = xte_tensor_2d(xa, XTE_DTYPE_FP32, m, k);
  XB = xte_tensor_2d(xb, XTE_DTYPE_FP32, n, k);
  CHECK(xte_dequantize(&a.h, 0, &XA, NULL)); /* code * scale_inv: exact in fp32 here */
  CHECK(xte_dequantize(&b.h, 0, &XB, NULL));
  for (i = 0; i < nd; i++) {
    const int64_t r = (int64_t)i / n, c = (int64_t)i % n;
    double S = 0.0, err;
    int64_t kk;
    for (kk = 0; kk < k; kk++) S += fabs((double)xa[r * k + kk] * (double)xb[c * k + kk]);
    err = fabs((double)ff[i] - (double)fe[i]);
    if (!(err <= tol * S)) bad++; /* NaN counts as bad */
    if (S > 0 && err / S > worst) worst = err / S;
    same += memcmp(&ff[i], &fe[i], 4) == 0;
  }
  printf(
      "| %s x %s, e4m3 x %s, %lld x %lld x %lld, %s scales%s%s | %.3g | %.3g | %.1f%% | %zu | "
      "%s%s%s%s |\n",
      ma == XTE_SCALING_BLOCK_1x128 ? "1x128" : "128x128",
      mb == XTE_SCALING_BLOCK_1x128 ? "1x128" : "128x128", db == XTE_DTYPE_E5M2 ? "e5m2" : "e4m3",
      (long long)m, (long long)n, (long long)k,
      lay == XTE_SCALE_LAYOUT_TE_GEMM ? "TE_GEMM" : "COMPACT", bias ? ", + bias" : "",
      k == 128 ? " (one block partial)" : "", worst, tol,
      100.0 * (double)same / (double)(nd ? nd : 1), bad, path, lt ? "" : " (", lt ? "" : why,
      lt ? "" : ")");
  if (g_expect_lt && !lt)
    printf("FAILED: FAST fell back to the exact kernel where cuBLASLt was expected: %s\n", why);
  gop_free(&a, gpu);
  gop_free(&b, gpu);
  {
    void *const dev[] = {dd, dbias}, *const host[] = {fe, ff, xa, xb, hb};
    gdev_release(gpu, dev, GDEV_N(dev), host, GDEV_N(host));
  }
  return bad != 0 || (g_expect_lt && !lt);
}

int gdev_fast_main(int argc, char **argv) {
  const int64_t M = 4096, N = 7168, K = 16384;
  int iters = 10, a, timing = 1;
  xte_stream gpu;
  const int open = gdev_open(&gpu);
  int failed = 0, c, mode;
  static char info[8192];
  for (a = 1; a < argc; a++) {
    if (strcmp(argv[a], "--expect-cublaslt") == 0)
      g_expect_lt = 1;
    else if (strcmp(argv[a], "--no-timing") == 0)
      timing = 0;
    else
      iters = atoi(argv[a]);
  }
  if (open) return open;
  CHECK(xte_backend_info_string(info, sizeof info));
  {
    const char *f = strstr(info, "FAST: ");
    printf("fast path: %.*s\n", f ? (int)strcspn(f, "\n") : 4, f ? f : "none");
  }
  printf("expect cuBLASLt on every FAST call: %s\n", g_expect_lt ? "yes" : "no");
  printf(
      "| FAST vs exact (same device) | worst \\|D_fast - D_exact\\| / S | bound / S | "
      "bit-identical "
      "| outside the bound | path (plugin's report) |\n|---|---:|---:|---:|---:|---|\n");
  {
    static const int64_t big[][3] = {
        {256, 512, 128}, {256, 512, 1024}, {512, 384, 1152}, {128, 256, 4096}};
    static const int64_t small[][3] = {{64, 64, 128}, {32, 64, 256}, {128, 48, 384}, {16, 32, 512}};
    const int64_t(*shapes)[3] = gdev_small ? small : big;
    for (c = 0; c < 4; c++) {
      const int64_t m = shapes[c][0], n = shapes[c][1], k = shapes[c][2];
      failed |=
          fast_check(gpu, XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_128x128, XTE_DTYPE_E4M3, m, n,
                     k, c == 2 ? XTE_SCALE_LAYOUT_COMPACT : XTE_SCALE_LAYOUT_TE_GEMM, 0);
      failed |= fast_check(gpu, XTE_SCALING_BLOCK_128x128, XTE_SCALING_BLOCK_1x128, XTE_DTYPE_E4M3,
                           m, n, k, XTE_SCALE_LAYOUT_TE_GEMM, 0);
      failed |= fast_check(gpu, XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_1x128,
                           c == 3 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3, m, n, k,
                           c == 1 ? XTE_SCALE_LAYOUT_COMPACT : XTE_SCALE_LAYOUT_TE_GEMM, 0);
    }
    /* with a bias (no C: cuBLASLt's epilogue order with C is not established, see
     * src/cuda/xte_cublaslt.h) */
    failed |= fast_check(gpu, XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_128x128, XTE_DTYPE_E4M3,
                         gdev_small ? 32 : 256, gdev_small ? 64 : 512, gdev_small ? 256 : 1024,
                         XTE_SCALE_LAYOUT_TE_GEMM, 1);
    failed |=
        fast_check(gpu, XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_1x128, XTE_DTYPE_E4M3,
                   gdev_small ? 16 : 128, gdev_small ? 32 : 256, 128, XTE_SCALE_LAYOUT_TE_GEMM, 1);
  }
  printf("FAST calls: %d, through cuBLASLt: %d (plugin's report)\n", g_fast_calls, g_fast_lt);
  if (!timing) {
    xte_stream_destroy(gpu);
    if (failed) printf("FAILED: a FAST output is outside the bound, or FAST fell back\n");
    return failed ? 1 : 0;
  }
  /* 2. rates at M x N x K: A 1x128, B 128x128, TE_GEMM scales, quantized on the device */
  {
    gdev_gemm_ops g;
    int64_t i;
    xte_gemm_config cfg = xte_gemm_config_default();
    timed_ops(gpu, M, N, K, XTE_SCALE_LAYOUT_TE_GEMM, INT64_MAX, &g);
    for (mode = 1; mode >= 0; mode--) { /* FAST first: the exact kernel takes seconds a call */
      const int n_it = mode ? iters : 1;
      double t0, ms;
      char what[160];
      cfg.mode = mode ? XTE_GEMM_FAST : XTE_GEMM_EXACT;
      (void)gdev_rep_take();
      if (mode) CHECK(xte_gemm(&g.qa, &g.qb, NULL, &g.D, &cfg, gpu)); /* warm-up */
      CHECK(xte_stream_synchronize(gpu));
      t0 = gdev_now();
      for (i = 0; i < n_it; i++) CHECK(xte_gemm(&g.qa, &g.qb, NULL, &g.D, &cfg, gpu));
      CHECK(xte_stream_synchronize(gpu));
      ms = (gdev_now() - t0) / n_it * 1e3;
      {
        const char *rep = gdev_rep_take();
        char path[64], ran[64];
        gdev_rep_values(rep, "path", path, sizeof path);
        gdev_rep_values(rep, "ran", ran, sizeof ran);
        snprintf(what, sizeof what, "%s (path %s, kernel %s)", mode ? "FAST" : "exact", path, ran);
        if (mode && g_expect_lt && strcmp(path, "cublaslt") != 0) {
          printf("FAILED: the timed FAST calls did not run cuBLASLt: %s\n", rep);
          failed = 1;
        }
      }
      printf(
          "| %s GEMM 1x128 x 128x128 e4m3, %lld x %lld x %lld -> bf16 | %.3f ms | %.1f TFLOPS |\n",
          what, (long long)M, (long long)N, (long long)K, ms,
          2.0 * (double)M * (double)N * (double)K / (ms * 1e-3) / 1e12);
    }
    printf("(host timing: FAST %d calls after a warm-up, exact 1 call; one synchronize each)\n",
           iters);
    gdev_gemm_ops_free(gpu, &g);
  }
  xte_stream_destroy(gpu);
  if (failed) printf("FAILED: a FAST output is outside the bound of include/xte/gemm.h\n");
  return failed ? 1 : 0;
}

/* ---------------------------------------------------------------- attention
 *   xte bench device attention [s [iterations]]
 * 1. byte equality of the CUDA exact attention with the CPU backend on small cases (bf16 and
 *    fp32, BSHD causal with GQA and odd lengths, THD varlen with a window, softcap + ALiBi): O,
 *    LSE, then dQ, dK, dV from the CPU's O and LSE; every GPU call twice (same bytes).
 * 2. the time of the forward and the backward at b 1, h 16, head dim 128, seqlen s (default
 *    4096), bf16, causal and not; TFLOPS = 4 s^2 d h (fwd; halved when causal) and 2.5x that for
 *    the backward (FlashAttention's convention), with the ratio to the fp32 CUDA-core peak
 *    (66.9 TFLOPS, H100 / H200 SXM).
 * Exit 0 when everything matched, 77 without a CUDA device, 1 on a mismatch or a failed call. */
typedef struct attn_case {
  int dt, layout, mask;
  int64_t b, sq, skv, hq, hkv, d, wl;
  float softcap;
  int alibi;
} attn_case;

static size_t attn_es(int dt) {
  return dt == XTE_DTYPE_FP32 ? 4 : 2;
}

static xte_tensor attn_t(void *p, int dt, int layout, int64_t b, int64_t s, int64_t h, int64_t d) {
  xte_tensor t = xte_tensor_2d(p, (xte_dtype)dt, 1, 1);
  if (layout == XTE_ATTN_LAYOUT_THD) {
    t.rank = 3;
    t.shape[0] = s;
    t.shape[1] = h;
    t.shape[2] = d;
  } else {
    t.rank = 4;
    t.shape[0] = b;
    t.shape[1] = s;
    t.shape[2] = h;
    t.shape[3] = d;
  }
  return t;
}

static uint64_t attn_rng = 0x2545F4914F6CDD1Dull;

/* host buffer of n random elements of dt, and its device copy */
static void *attn_rand(xte_stream gpu, int dt, size_t n, void **dev) {
  uint8_t *h = (uint8_t *)malloc(n * attn_es(dt) + 4);
  size_t i;
  if (!h) exit(1);
  for (i = 0; i < n; i++) {
    float f = (float)(2.0 * unif(&attn_rng) - 1.0) * 2.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (dt == XTE_DTYPE_FP32)
      memcpy(h + 4 * i, &u, 4);
    else {
      uint16_t v = (uint16_t)(u >> 16);
      memcpy(h + 2 * i, &v, 2);
    }
  }
  if (dev) {
    CHECK(xte_malloc(gpu, n * attn_es(dt) + 4, dev));
    CHECK(xte_memcpy(gpu, *dev, h, n * attn_es(dt), XTE_MEMCPY_HOST_TO_DEVICE));
  }
  return h;
}

/* out: device buffer of bytes, filled with 0xCD; returns it */
static void *attn_dev(xte_stream gpu, size_t bytes) {
  void *d;
  uint8_t *h = (uint8_t *)malloc(bytes + 4);
  if (!h) exit(1);
  memset(h, 0xCD, bytes + 4);
  CHECK(xte_malloc(gpu, bytes + 4, &d));
  CHECK(xte_memcpy(gpu, d, h, bytes + 4, XTE_MEMCPY_HOST_TO_DEVICE));
  free(h);
  return d;
}

/* bytes of the device buffer d that differ from host h */
static size_t attn_diff(xte_stream gpu, const void *d, const uint8_t *h, size_t bytes) {
  uint8_t *g = (uint8_t *)malloc(bytes + 4);
  size_t i, n = 0;
  if (!g) exit(1);
  CHECK(xte_stream_synchronize(gpu));
  CHECK(xte_memcpy(gpu, g, d, bytes, XTE_MEMCPY_DEVICE_TO_HOST));
  for (i = 0; i < bytes; i++) n += g[i] != h[i];
  free(g);
  return n;
}

static size_t attn_check(xte_stream gpu, xte_stream cpu, const attn_case *c) {
  const int thd = c->layout == XTE_ATTN_LAYOUT_THD;
  int32_t cuq[3] = {0, 0, 0}, cukv[3] = {0, 0, 0};
  void *dcuq = NULL, *dcukv = NULL, *dq, *dk, *dv, *ddo, *dal = NULL;
  float alibi[64];
  int64_t B = c->b, Sq = c->sq, Skv = c->skv, i;
  size_t diff = 0;
  int run;
  if (thd) { /* two sequences */
    cuq[1] = (int32_t)(c->sq / 3);
    cuq[2] = (int32_t)c->sq;
    cukv[1] = (int32_t)(c->skv / 2 + 1);
    cukv[2] = (int32_t)c->skv;
    B = 1;
  }
  for (i = 0; i < 64; i++) alibi[i] = 0.05f + 0.01f * (float)i;
  const size_t nq = (size_t)(B * Sq * c->hq * c->d), nkv = (size_t)(B * Skv * c->hkv * c->d),
               nl = (size_t)(B * Sq * c->hq), es = attn_es(c->dt);
  uint8_t *q = (uint8_t *)attn_rand(gpu, c->dt, nq, &dq),
          *k = (uint8_t *)attn_rand(gpu, c->dt, nkv, &dk),
          *v = (uint8_t *)attn_rand(gpu, c->dt, nkv, &dv),
          *dout = (uint8_t *)attn_rand(gpu, c->dt, nq, &ddo);
  uint8_t *o = (uint8_t *)malloc(nq * es + 4), *lse = (uint8_t *)malloc(nl * 4 + 4),
          *gq = (uint8_t *)malloc(nq * es + 4), *gk = (uint8_t *)malloc(nkv * es + 4),
          *gv = (uint8_t *)malloc(nkv * es + 4);
  void *dgq, *dgk, *dgv;
  xte_attention_config cfg = xte_attention_config_default(), gcfg;
  if (!o || !lse || !gq || !gk || !gv) exit(1);
  memset(o, 0xCD, nq * es + 4);
  memset(lse, 0xCD, nl * 4 + 4);
  memset(gq, 0xCD, nq * es + 4);
  memset(gk, 0xCD, nkv * es + 4);
  memset(gv, 0xCD, nkv * es + 4);
  cfg.layout = (xte_attn_layout)c->layout;
  cfg.mask = (xte_attn_mask)c->mask;
  cfg.window_left = c->wl;
  cfg.softcap = c->softcap;
  cfg.alibi_slopes = c->alibi ? alibi : NULL;
  if (thd) {
    cfg.cu_seqlens_q = cuq;
    cfg.cu_seqlens_kv = cukv;
    cfg.batch = 2;
    cfg.max_seqlen_q = c->sq;
    cfg.max_seqlen_kv = c->skv;
    CHECK(xte_malloc(gpu, sizeof cuq, &dcuq));
    CHECK(xte_malloc(gpu, sizeof cukv, &dcukv));
    CHECK(xte_memcpy(gpu, dcuq, cuq, sizeof cuq, XTE_MEMCPY_HOST_TO_DEVICE));
    CHECK(xte_memcpy(gpu, dcukv, cukv, sizeof cukv, XTE_MEMCPY_HOST_TO_DEVICE));
  }
  if (c->alibi) {
    CHECK(xte_malloc(gpu, sizeof alibi, &dal));
    CHECK(xte_memcpy(gpu, dal, alibi, sizeof alibi, XTE_MEMCPY_HOST_TO_DEVICE));
  }
  gcfg = cfg;
  gcfg.cu_seqlens_q = (const int32_t *)dcuq;
  gcfg.cu_seqlens_kv = (const int32_t *)dcukv;
  gcfg.alibi_slopes = (const float *)dal;
  {
    xte_tensor tq = attn_t(q, c->dt, c->layout, B, Sq, c->hq, c->d),
               tk = attn_t(k, c->dt, c->layout, B, Skv, c->hkv, c->d),
               tv = attn_t(v, c->dt, c->layout, B, Skv, c->hkv, c->d),
               to = attn_t(o, c->dt, c->layout, B, Sq, c->hq, c->d),
               tdo = attn_t(dout, c->dt, c->layout, B, Sq, c->hq, c->d),
               tgq = attn_t(gq, c->dt, c->layout, B, Sq, c->hq, c->d),
               tgk = attn_t(gk, c->dt, c->layout, B, Skv, c->hkv, c->d),
               tgv = attn_t(gv, c->dt, c->layout, B, Skv, c->hkv, c->d);
    xte_tensor tl = thd ? xte_tensor_2d(lse, XTE_DTYPE_FP32, Sq, c->hq)
                        : attn_t(lse, XTE_DTYPE_FP32, XTE_ATTN_LAYOUT_THD, 0, B, c->hq, Sq);
    xte_tensor gtq = tq, gtk = tk, gtv = tv, gto = to, gtdo = tdo, gtl = tl, ggq = tgq, ggk = tgk,
               ggv = tgv;
    CHECK(xte_attention_fwd(&tq, &tk, &tv, &to, &tl, &cfg, cpu));
    CHECK(xte_attention_bwd(&tq, &tk, &tv, &to, &tdo, &tl, &tgq, &tgk, &tgv, &cfg, cpu));
    gtq.data = dq;
    gtk.data = dk;
    gtv.data = dv;
    gtdo.data = ddo;
    for (run = 0; run < 2; run++) {
      gto.data = attn_dev(gpu, nq * es);
      gtl.data = attn_dev(gpu, nl * 4);
      CHECK(xte_attention_fwd(&gtq, &gtk, &gtv, &gto, &gtl, &gcfg, gpu));
      diff += attn_diff(gpu, gto.data, o, nq * es) + attn_diff(gpu, gtl.data, lse, nl * 4);
      /* the backward from the CPU's O and LSE */
      CHECK(xte_memcpy(gpu, gto.data, o, nq * es, XTE_MEMCPY_HOST_TO_DEVICE));
      CHECK(xte_memcpy(gpu, gtl.data, lse, nl * 4, XTE_MEMCPY_HOST_TO_DEVICE));
      dgq = ggq.data = attn_dev(gpu, nq * es);
      dgk = ggk.data = attn_dev(gpu, nkv * es);
      dgv = ggv.data = attn_dev(gpu, nkv * es);
      CHECK(xte_attention_bwd(&gtq, &gtk, &gtv, &gto, &gtdo, &gtl, &ggq, &ggk, &ggv, &gcfg, gpu));
      diff += attn_diff(gpu, dgq, gq, nq * es) + attn_diff(gpu, dgk, gk, nkv * es) +
              attn_diff(gpu, dgv, gv, nkv * es);
      {
        void *const dev[] = {gto.data, gtl.data, dgq, dgk, dgv};
        gdev_release(gpu, dev, GDEV_N(dev), NULL, 0);
      }
    }
  }
  {
    void *const dev[] = {dq, dk, dv, ddo, dcuq, dcukv, dal}, *const host[] = {q,   k,  v,  dout, o,
                                                                              lse, gq, gk, gv};
    gdev_release(gpu, dev, GDEV_N(dev), host, GDEV_N(host));
  }
  return diff;
}

int gdev_attn_main(int argc, char **argv) {
  const int64_t S = argc > 1 ? atoll(argv[1]) : 4096, H = 16, D = 128;
  const int iters = argc > 2 ? atoi(argv[2]) : 2;
  const attn_case cases[] = {
      {XTE_DTYPE_BF16, XTE_ATTN_LAYOUT_BSHD, XTE_ATTN_MASK_CAUSAL, 2, 77, 130, 4, 2, 64, -1, 0, 0},
      {XTE_DTYPE_FP32, XTE_ATTN_LAYOUT_BSHD, XTE_ATTN_MASK_NONE, 1, 65, 65, 2, 1, 128, -1, 0, 0},
      {XTE_DTYPE_BF16, XTE_ATTN_LAYOUT_THD, XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 1, 90, 150, 4, 4, 32,
       40, 0, 0},
      {XTE_DTYPE_FP32, XTE_ATTN_LAYOUT_BSHD, XTE_ATTN_MASK_CAUSAL, 1, 70, 70, 2, 2, 48, -1, 8.0f,
       1},
  };
  xte_stream gpu, cpu;
  const int open = gdev_open(&gpu);
  size_t c, diff = 0;
  int causal, bwd, it;
  if (open) return open;
  CHECK(xte_stream_create(XTE_BACKEND_CPU, 0, NULL, &cpu));
  for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const size_t d = attn_check(gpu, cpu, &cases[c]);
    printf("attention check %zu (%s, layout %d, mask %d, d %lld): %zu differing bytes\n", c,
           cases[c].dt == XTE_DTYPE_FP32 ? "fp32" : "bf16", cases[c].layout, cases[c].mask,
           (long long)cases[c].d, d);
    diff += d;
  }
  if (diff) {
    printf("attention: FAILED: %zu bytes differ from the CPU backend (or between two runs)\n",
           diff);
    return 1;
  }
  {
    const size_t n = (size_t)(S * H * D), nl = (size_t)(S * H);
    void *q, *k, *v, *dout, *o, *lse, *gq, *gk, *gv;
    xte_attention_config cfg = xte_attention_config_default();
    free(attn_rand(gpu, XTE_DTYPE_BF16, n, &q));
    free(attn_rand(gpu, XTE_DTYPE_BF16, n, &k));
    free(attn_rand(gpu, XTE_DTYPE_BF16, n, &v));
    free(attn_rand(gpu, XTE_DTYPE_BF16, n, &dout));
    o = attn_dev(gpu, n * 2);
    lse = attn_dev(gpu, nl * 4);
    gq = attn_dev(gpu, n * 2);
    gk = attn_dev(gpu, n * 2);
    gv = attn_dev(gpu, n * 2);
    xte_tensor tq = attn_t(q, XTE_DTYPE_BF16, 0, 1, S, H, D),
               tk = attn_t(k, XTE_DTYPE_BF16, 0, 1, S, H, D),
               tv = attn_t(v, XTE_DTYPE_BF16, 0, 1, S, H, D),
               to = attn_t(o, XTE_DTYPE_BF16, 0, 1, S, H, D),
               tdo = attn_t(dout, XTE_DTYPE_BF16, 0, 1, S, H, D),
               tgq = attn_t(gq, XTE_DTYPE_BF16, 0, 1, S, H, D),
               tgk = attn_t(gk, XTE_DTYPE_BF16, 0, 1, S, H, D),
               tgv = attn_t(gv, XTE_DTYPE_BF16, 0, 1, S, H, D),
               tl = attn_t(lse, XTE_DTYPE_FP32, XTE_ATTN_LAYOUT_THD, 0, 1, H, S);
    printf("| attention bf16, b 1, h %lld, d %lld, s %lld | ms | TFLOPS | / fp32 peak 66.9 |\n",
           (long long)H, (long long)D, (long long)S);
    printf("|---|---|---|---|\n");
    for (causal = 0; causal < 2; causal++)
      for (bwd = 0; bwd < 2; bwd++) {
        double t0, t, fl = 4.0 * (double)S * (double)S * (double)D * (double)H;
        cfg.mask = causal ? XTE_ATTN_MASK_CAUSAL : XTE_ATTN_MASK_NONE;
        if (causal) fl *= 0.5;
        if (bwd) fl *= 2.5;
        /* warm-up (and the forward's O / LSE for the backward) */
        CHECK(xte_attention_fwd(&tq, &tk, &tv, &to, &tl, &cfg, gpu));
        if (bwd)
          CHECK(xte_attention_bwd(&tq, &tk, &tv, &to, &tdo, &tl, &tgq, &tgk, &tgv, &cfg, gpu));
        CHECK(xte_stream_synchronize(gpu));
        t0 = gdev_now();
        for (it = 0; it < iters; it++) {
          if (bwd)
            CHECK(xte_attention_bwd(&tq, &tk, &tv, &to, &tdo, &tl, &tgq, &tgk, &tgv, &cfg, gpu));
          else
            CHECK(xte_attention_fwd(&tq, &tk, &tv, &to, &tl, &cfg, gpu));
        }
        CHECK(xte_stream_synchronize(gpu));
        t = (gdev_now() - t0) / iters;
        printf("| %s %s | %.2f | %.2f | %.3f |\n", causal ? "causal" : "full", bwd ? "bwd" : "fwd",
               t * 1e3, fl / t * 1e-12, fl / t * 1e-12 / 66.9);
      }
    {
      void *const dev[] = {q, k, v, dout, o, lse, gq, gk, gv};
      gdev_release(gpu, dev, GDEV_N(dev), NULL, 0);
    }
  }
  xte_stream_destroy(cpu);
  xte_stream_destroy(gpu);
  return 0;
}
