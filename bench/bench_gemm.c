/* GEMM suite: xte_gemm in EXACT mode (e4m3, 1x128 activations x 128x128 weights, TE recipe,
 * TE_GEMM scale layout, bf16 out) next to OpenBLAS dgemm and sgemm on fp64 / fp32 copies of the
 * same data, all on both cores, for M in {128, 512, 2048} and N x K in {4096 x 7168,
 * 7168 x 2048, 2112 x 7168} (the Kimi-K2 / DeepSeek-V3 expert and projection shapes); and the
 * grouped contiguous GEMM, 8 groups x 256 rows at 4096 x 7168, against the single GEMM of the
 * same FLOPs (M = 2048).
 *
 * Anchors: "gemm/dgemm/<M>/<N>x<K>" (OpenBLAS cblas_dgemm, row-major A [M, K] x B [N, K]^T);
 * sgemm and xte cases name it, the grouped case names the single xte GEMM. Rate: GFLOP/s of
 * 2 * M * N * K. Large shapes take seconds per iteration: filter (xte bench gemm/.../128/).
 * Small M (the MoE decode / few-tokens-per-expert case):
 * "gemm/fp8_exact_small_m/<m>/<G>x4096x7168", a grouped contiguous GEMM of G groups of m rows (m in
 * 1, 4, 8, 16, 32) against B [G, 4096, 7168], G such that B is about xte_bench_dram_bytes() (past
 * the last-level cache); rate: B's bytes per second, anchor "copy/gemm/small_m_weights": a copy of
 * as many bytes (read + write counted), so the ratio is the share of the memory bandwidth the GEMM
 * streams its weights at. The OpenBLAS cases are marked (xte_bench_uses): with OpenBLAS on a
 * generic core, their ratios are refused (bench_common.h, the machine record). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#ifndef XTE_BENCH_NO_OPENBLAS
#include <cblas.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "bench_gpu.h"
#include "xte/xte.h"
#include "xte_bench.h"

#ifndef XTE_BENCH_NO_OPENBLAS /* the CPU cases (the GPU-only xte has no OpenBLAS: none) */
/* KIND_FAST: xte_gemm in XTE_GEMM_FAST ("gemm/fp8_fast_1x128_128x128_bf16/<M>/<N>x<K>"), beside
 * its anchor, the OpenBLAS sgemm of the same shape (the same fp32 multiply-adds plus packing). */
enum { KIND_DGEMM = 0, KIND_SGEMM = 1, KIND_XTE = 2, KIND_GROUPED = 3, KIND_FAST = 4 };

typedef struct gcase {
  char name[96];
  int kind;
  int64_t M, N, K, groups;
} gcase;

#define NM 3
#define NNK 3
static gcase cases[NM * NNK * 4 + 1];

typedef struct qbuf {
  xte_qtensor q;
} qbuf;

/* Quantizes x [R, C] (rowwise copy only) with the TE block recipe, TE_GEMM layout. */
static int quantize(const float *x, int64_t R, int64_t C, xte_scaling_mode mode, qbuf *b) {
  xte_tensor in = xte_tensor_2d((void *)x, XTE_DTYPE_FP32, R, C);
  int64_t sr, sc;
  memset(b, 0, sizeof *b);
  if (xte_quantize_scale_shape(R, C, mode, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_TE_GEMM, 0, &sr,
                               &sc) != XTE_SUCCESS)
    return -1;
  b->q.scaling_mode = mode;
  b->q.recipe = XTE_RECIPE_TE_BLOCK;
  b->q.rowwise = xte_tensor_2d(xte_bench_alloc((size_t)(R * C)), XTE_DTYPE_E4M3, R, C);
  b->q.rowwise_scale_inv.data = xte_bench_alloc((size_t)(sr * sc) * 4);
  b->q.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  b->q.rowwise_scale_inv.rows = sr;
  b->q.rowwise_scale_inv.cols = sc;
  b->q.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_TE_GEMM;
  return xte_quantize(&in, &b->q, NULL, NULL) == XTE_SUCCESS ? 0 : -1;
}

static void qfree(qbuf *b) {
  xte_bench_free(b->q.rowwise.data);
  xte_bench_free(b->q.rowwise_scale_inv.data);
}

static void fail(xte_bench_state *st, const char *what) {
  char why[512];
  snprintf(why, sizeof why, "%s: %s", what, xte_last_error());
  xte_bench_fail(st, why);
  while (xte_bench_keep_running(st)) {
  }
}

static void run_gemm(xte_bench_state *st, void *arg) {
  const gcase *c = (const gcase *)arg;
  const int64_t M = c->M, N = c->N, K = c->K;
  float *xa = (float *)xte_bench_alloc(sizeof(float) * (size_t)(M * K));
  float *xb = (float *)xte_bench_alloc(sizeof(float) * (size_t)(N * K));
  xte_bench_fill_f32(xa, (size_t)(M * K), 1);
  xte_bench_fill_f32(xb, (size_t)(N * K), 2);
  if (c->kind == KIND_DGEMM || c->kind == KIND_SGEMM) {
    void *cc = xte_bench_alloc((size_t)(M * N) * 8);
    if (c->kind == KIND_DGEMM) {
      double *a = (double *)xte_bench_alloc(sizeof(double) * (size_t)(M * K));
      double *b = (double *)xte_bench_alloc(sizeof(double) * (size_t)(N * K));
      int64_t i;
      for (i = 0; i < M * K; i++) a[i] = xa[i];
      for (i = 0; i < N * K; i++) b[i] = xb[i];
      while (xte_bench_keep_running(st))
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0, a, (int)K,
                    b, (int)K, 0.0, (double *)cc, (int)N);
      xte_bench_free(a);
      xte_bench_free(b);
    } else {
      while (xte_bench_keep_running(st))
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, xa,
                    (int)K, xb, (int)K, 0.0f, (float *)cc, (int)N);
    }
    xte_bench_free(cc);
  } else {
    qbuf qa, qb;
    uint16_t *d = (uint16_t *)xte_bench_alloc(sizeof(uint16_t) * (size_t)(M * N));
    xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_BF16, M, N);
    int64_t nb = c->kind == KIND_GROUPED ? N * c->groups : N;
    float *xbb = xb;
    if (c->kind == KIND_GROUPED) { /* B [G, N, K]: the groups share the values (same FLOPs) */
      int64_t g;
      xbb = (float *)xte_bench_alloc(sizeof(float) * (size_t)(nb * K));
      for (g = 0; g < c->groups; g++) memcpy(xbb + g * N * K, xb, sizeof(float) * (size_t)(N * K));
    }
    if (quantize(xa, M, K, XTE_SCALING_BLOCK_1x128, &qa) ||
        quantize(xbb, nb, K, XTE_SCALING_BLOCK_128x128, &qb)) {
      fail(st, "xte_quantize");
    } else if (c->kind == KIND_XTE || c->kind == KIND_FAST) {
      xte_gemm_config cfg = xte_gemm_config_default();
      if (c->kind == KIND_FAST) cfg.mode = XTE_GEMM_FAST;
      if (xte_gemm(&qa.q, &qb.q, NULL, &D, &cfg, NULL) != XTE_SUCCESS) {
        fail(st, "xte_gemm");
      } else {
        while (xte_bench_keep_running(st)) (void)xte_gemm(&qa.q, &qb.q, NULL, &D, &cfg, NULL);
      }
    } else {
      int64_t *sizes = (int64_t *)malloc(sizeof(int64_t) * (size_t)c->groups);
      xte_gemm_groups gr;
      int64_t g;
      for (g = 0; g < c->groups; g++) sizes[g] = M / c->groups;
      memset(&gr, 0, sizeof gr);
      gr.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
      gr.num_groups = (int)c->groups;
      gr.group_sizes = sizes;
      if (xte_gemm_grouped(&qa.q, &qb.q, NULL, &D, &gr, NULL, NULL) != XTE_SUCCESS) {
        fail(st, "xte_gemm_grouped");
      } else {
        while (xte_bench_keep_running(st))
          (void)xte_gemm_grouped(&qa.q, &qb.q, NULL, &D, &gr, NULL, NULL);
      }
      free(sizes);
    }
    if (c->kind == KIND_GROUPED) xte_bench_free(xbb);
    qfree(&qa);
    qfree(&qb);
    xte_bench_free(d);
  }
  xte_bench_set_flops(st, 2.0 * (double)M * (double)N * (double)K);
  xte_bench_free(xa);
  xte_bench_free(xb);
}

/* ---------------------------------------------------------------- small M
 * B's e4m3 codes are made directly (none of them NaN) with scales of 1, once for all the small-M
 * cases: the rate does not depend on the values. */
#define SM_N 4096
#define SM_K 7168
#define SM_NCASES 5
static const int64_t sm_rows[SM_NCASES] = {1, 4, 8, 16, 32};
static char sm_names[SM_NCASES][96];
static int64_t sm_groups = 1;
static xte_qtensor sm_b;

static int small_m_b(void) {
  int64_t sr, sc, i;
  const size_t n = (size_t)(sm_groups * SM_N) * SM_K;
  uint8_t *codes;
  float *sinv;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  if (sm_b.rowwise.data) return 0;
  if (xte_quantize_scale_shape(sm_groups * SM_N, SM_K, XTE_SCALING_BLOCK_128x128,
                               XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_TE_GEMM, 0, &sr,
                               &sc) != XTE_SUCCESS)
    return -1;
  codes = (uint8_t *)xte_bench_alloc(n);
  sinv = (float *)xte_bench_alloc((size_t)(sr * sc) * sizeof(float));
  if (!codes || !sinv) return -1;
  for (i = 0; i < (int64_t)n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    codes[i] = (uint8_t)((x >> 24) % 0x7F) | (uint8_t)(x & 0x80); /* magnitude 0 .. 0x7E */
  }
  for (i = 0; i < sr * sc; i++) sinv[i] = 1.0f;
  sm_b.scaling_mode = XTE_SCALING_BLOCK_128x128;
  sm_b.recipe = XTE_RECIPE_TE_BLOCK;
  sm_b.rowwise = xte_tensor_2d(codes, XTE_DTYPE_E4M3, sm_groups * SM_N, SM_K);
  sm_b.rowwise_scale_inv.data = sinv;
  sm_b.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  sm_b.rowwise_scale_inv.rows = sr;
  sm_b.rowwise_scale_inv.cols = sc;
  sm_b.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_TE_GEMM;
  return 0;
}

static void run_small_m(xte_bench_state *st, void *arg) {
  const int64_t m = *(const int64_t *)arg, G = sm_groups, rows = G * m;
  float *xa = (float *)xte_bench_alloc(sizeof(float) * (size_t)(rows * SM_K));
  uint16_t *d = (uint16_t *)xte_bench_alloc(sizeof(uint16_t) * (size_t)(rows * SM_N));
  int64_t *sizes = (int64_t *)malloc(sizeof(int64_t) * (size_t)G);
  xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_BF16, rows, SM_N);
  xte_gemm_groups gr;
  qbuf qa;
  int64_t g;
  memset(&qa, 0, sizeof qa);
  if (!xa || !d || !sizes || small_m_b()) {
    fail(st, "small-M buffers");
  } else {
    xte_bench_fill_f32(xa, (size_t)(rows * SM_K), 3);
    for (g = 0; g < G; g++) sizes[g] = m;
    memset(&gr, 0, sizeof gr);
    gr.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
    gr.num_groups = (int)G;
    gr.group_sizes = sizes;
    if (quantize(xa, rows, SM_K, XTE_SCALING_BLOCK_1x128, &qa)) {
      fail(st, "xte_quantize");
    } else if (xte_gemm_grouped(&qa.q, &sm_b, NULL, &D, &gr, NULL, NULL) != XTE_SUCCESS) {
      fail(st, "xte_gemm_grouped");
    } else {
      while (xte_bench_keep_running(st))
        (void)xte_gemm_grouped(&qa.q, &sm_b, NULL, &D, &gr, NULL, NULL);
    }
    qfree(&qa);
  }
  xte_bench_set_bytes(st, (double)(G * SM_N) * SM_K);
  free(sizes);
  xte_bench_free(d);
  xte_bench_free(xa);
}

static void register_small_m(void) {
  const char *copy;
  int i;
  sm_groups = (int64_t)(xte_bench_dram_bytes() / ((size_t)SM_N * SM_K));
  if (sm_groups < 1) sm_groups = 1;
  copy = xte_bench_register_copy("gemm/small_m_weights", (size_t)(sm_groups * SM_N) * SM_K);
  for (i = 0; i < SM_NCASES; i++) {
    snprintf(sm_names[i], sizeof sm_names[i], "gemm/fp8_exact_small_m/%lld/%lldx%dx%d",
             (long long)sm_rows[i], (long long)sm_groups, SM_N, SM_K);
    xte_bench_register(sm_names[i], copy, "GB/s", run_small_m, (void *)&sm_rows[i]);
  }
}

/* ---------------------------------------------------------------- small M, FAST and EXACT
 * "gemm/fp8_{fast,exact}_small_m4/<m>/4x4096x7168": a grouped contiguous GEMM of 4 groups (experts)
 * of m rows (m in 1, 2, 4, 8, 16, 32) against B [4, 4096, 7168] e4m3 (128x128 blocks, TE_GEMM
 * layout), bf16 out, in XTE_GEMM_FAST and in XTE_GEMM_EXACT side by side; rate: B's bytes per
 * second; anchor "copy/gemm/fast_small_m_weights": a copy of B's bytes (read + write counted). */
#define FSM_G 4
#define FSM_NCASES 6
typedef struct fsm_case {
  int64_t m;
  int mode;
  char name[96];
} fsm_case;
static fsm_case fsm_cases[2 * FSM_NCASES];
static xte_qtensor fsm_b;

static int fsm_make_b(void) {
  int64_t sr, sc, i;
  const size_t n = (size_t)(FSM_G * SM_N) * SM_K;
  uint8_t *codes;
  float *sinv;
  uint64_t x = 0x2545F4914F6CDD1Dull;
  if (fsm_b.rowwise.data) return 0;
  if (xte_quantize_scale_shape(FSM_G * SM_N, SM_K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
                               XTE_SCALE_LAYOUT_TE_GEMM, 0, &sr, &sc) != XTE_SUCCESS)
    return -1;
  codes = (uint8_t *)xte_bench_alloc(n);
  sinv = (float *)xte_bench_alloc((size_t)(sr * sc) * sizeof(float));
  if (!codes || !sinv) return -1;
  for (i = 0; i < (int64_t)n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    codes[i] = (uint8_t)((x >> 24) % 0x7F) | (uint8_t)(x & 0x80); /* magnitude 0 .. 0x7E */
  }
  for (i = 0; i < sr * sc; i++) sinv[i] = 1.0f;
  fsm_b.scaling_mode = XTE_SCALING_BLOCK_128x128;
  fsm_b.recipe = XTE_RECIPE_TE_BLOCK;
  fsm_b.rowwise = xte_tensor_2d(codes, XTE_DTYPE_E4M3, FSM_G * SM_N, SM_K);
  fsm_b.rowwise_scale_inv.data = sinv;
  fsm_b.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  fsm_b.rowwise_scale_inv.rows = sr;
  fsm_b.rowwise_scale_inv.cols = sc;
  fsm_b.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_TE_GEMM;
  return 0;
}

static void run_fsm(xte_bench_state *st, void *arg) {
  const fsm_case *cs = (const fsm_case *)arg;
  const int64_t m = cs->m, rows = FSM_G * m;
  float *xa = (float *)xte_bench_alloc(sizeof(float) * (size_t)(rows * SM_K));
  uint16_t *d = (uint16_t *)xte_bench_alloc(sizeof(uint16_t) * (size_t)(rows * SM_N));
  int64_t sizes[FSM_G];
  xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_BF16, rows, SM_N);
  xte_gemm_config cfg = xte_gemm_config_default();
  xte_gemm_groups gr;
  qbuf qa;
  int64_t g;
  memset(&qa, 0, sizeof qa);
  cfg.mode = (xte_gemm_mode)cs->mode;
  if (!xa || !d || fsm_make_b()) {
    fail(st, "small-M buffers");
  } else {
    xte_bench_fill_f32(xa, (size_t)(rows * SM_K), 5);
    for (g = 0; g < FSM_G; g++) sizes[g] = m;
    memset(&gr, 0, sizeof gr);
    gr.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
    gr.num_groups = FSM_G;
    gr.group_sizes = sizes;
    if (quantize(xa, rows, SM_K, XTE_SCALING_BLOCK_1x128, &qa)) {
      fail(st, "xte_quantize");
    } else if (xte_gemm_grouped(&qa.q, &fsm_b, NULL, &D, &gr, &cfg, NULL) != XTE_SUCCESS) {
      fail(st, "xte_gemm_grouped");
    } else {
      while (xte_bench_keep_running(st))
        (void)xte_gemm_grouped(&qa.q, &fsm_b, NULL, &D, &gr, &cfg, NULL);
    }
    qfree(&qa);
  }
  xte_bench_set_bytes(st, (double)(FSM_G * SM_N) * SM_K);
  xte_bench_free(d);
  xte_bench_free(xa);
}

static void register_fast_small_m(void) {
  static const int64_t rows[FSM_NCASES] = {1, 2, 4, 8, 16, 32};
  const char *copy =
      xte_bench_register_copy("gemm/fast_small_m_weights", (size_t)(FSM_G * SM_N) * SM_K);
  int i, f;
  for (i = 0; i < FSM_NCASES; i++)
    for (f = 0; f < 2; f++) {
      fsm_case *cs = &fsm_cases[2 * i + f];
      cs->m = rows[i];
      cs->mode = f ? XTE_GEMM_EXACT : XTE_GEMM_FAST;
      snprintf(cs->name, sizeof cs->name, "gemm/fp8_%s_small_m4/%lld/%dx%dx%d",
               f ? "exact" : "fast", (long long)cs->m, FSM_G, SM_N, SM_K);
      xte_bench_register(cs->name, copy, "GB/s", run_fsm, cs);
    }
}

void xte_bench_suite_gemm(void) {
  static const int64_t Ms[NM] = {128, 512, 2048};
  static const int64_t NK[NNK][2] = {{4096, 7168}, {7168, 2048}, {2112, 7168}};
  static int registered;
  static char single_2048[96];
  int n = 0, mi, si;
  if (registered) return;
  registered = 1;
  for (mi = 0; mi < NM; mi++)
    for (si = 0; si < NNK; si++) {
      gcase *d = &cases[n++], *s = &cases[n++], *x = &cases[n++], *f = &cases[n++];
      d->kind = KIND_DGEMM;
      s->kind = KIND_SGEMM;
      x->kind = KIND_XTE;
      f->kind = KIND_FAST;
      d->M = s->M = x->M = f->M = Ms[mi];
      d->N = s->N = x->N = f->N = NK[si][0];
      d->K = s->K = x->K = f->K = NK[si][1];
      snprintf(d->name, sizeof d->name, "gemm/dgemm/%lld/%lldx%lld", (long long)d->M,
               (long long)d->N, (long long)d->K);
      snprintf(s->name, sizeof s->name, "gemm/sgemm/%lld/%lldx%lld", (long long)d->M,
               (long long)d->N, (long long)d->K);
      snprintf(x->name, sizeof x->name, "gemm/fp8_exact_1x128_128x128_bf16/%lld/%lldx%lld",
               (long long)d->M, (long long)d->N, (long long)d->K);
      xte_bench_register(d->name, NULL, "GFLOP/s", run_gemm, d);
      xte_bench_register(s->name, d->name, "GFLOP/s", run_gemm, s);
      xte_bench_register(x->name, d->name, "GFLOP/s", run_gemm, x);
      /* FAST (fp32 block partials) beside its anchor, OpenBLAS sgemm of the same shape */
      snprintf(f->name, sizeof f->name, "gemm/fp8_fast_1x128_128x128_bf16/%lld/%lldx%lld",
               (long long)d->M, (long long)d->N, (long long)d->K);
      xte_bench_register(f->name, s->name, "GFLOP/s", run_gemm, f);
      xte_bench_uses(d->name, "openblas");
      xte_bench_uses(s->name, "openblas");
      if (mi == NM - 1 && si == 0) snprintf(single_2048, sizeof single_2048, "%s", x->name);
    }
  {
    gcase *g = &cases[n++];
    g->kind = KIND_GROUPED;
    g->groups = 8;
    g->M = 8 * 256;
    g->N = 4096;
    g->K = 7168;
    snprintf(g->name, sizeof g->name, "gemm/grouped_contiguous_fp8_exact/8x256/4096x7168");
    xte_bench_register(g->name, single_2048, "GFLOP/s", run_gemm, g);
  }
  register_small_m();
  register_fast_small_m();
}
#else
void xte_bench_suite_gemm(void) {}
#endif

/* ---------------------------------------------------------------- CUDA (--backend cuda)
 * xte_gemm on the CUDA backend (bench/bench_gpu.h): A [M, K] e4m3 1x128, B [N, K] e4m3 128x128
 * (TE recipe, TE_GEMM scales, quantized on the device from bf16), bf16 D [M, N], at M = 4096
 * and (N, K) = (4096, 7168) and (7168, 2048), the expert GEMMs of Kimi-K2 and DeepSeek-V3
 * (hidden 7168, expert width 2048: gate + up, down), and (7168, 16384) (the shape of
 * bench/gpu_device.c). Per shape, the stages of the exact GEMM: "exact-simt" and
 * "exact-dmma4", "exact-imma" (int8 digit products; XTE_CUDA_GEMM_KERNEL forced per call; a DMMA
 * kernel the device cannot run gives the automatic choice), "exact" (the automatic choice: m16n8k16
 * DMMA on sm_90, m8n8k4 on sm_80 / 89), and "fast" (XTE_GEMM_FAST); each beside the anchor
 * "gemm/cublas-bf16/<shape>": cuBLAS's bf16 GEMM of the same shape and the same values
 * (cublasGemmEx, fp32 compute) in the same run. TFLOP/s of 2 M N K; CUDA events, the L2 flushed
 * before every iteration. Without cuBLAS the cases run without an anchor (the note says why).
 * --smoke: M, N, K = 96, 160, 384. */
typedef struct ggshape {
  int64_t M, N, K;
  uint16_t *x, *w, *d; /* device: bf16 X [M, K], W [N, K], D [M, N] */
  xte_qtensor qa, qb;
  int ready, failed;
} ggshape;

typedef struct ggcase {
  ggshape *sh;
  const char *kernel; /* XTE_CUDA_GEMM_KERNEL for the call, or NULL */
  int fast, cublas;
} ggcase;

#define GG_NSHAPES 3
static ggshape gg_shapes[GG_NSHAPES], gg_smoke; /* shapes set at registration */
static ggcase gg_cases[GG_NSHAPES * 6];

/* q: the device quantization of bf16 x [R, C] (mode), buffers allocated here; 0 ok */
static int gg_quantize(const void *x, int64_t R, int64_t C, xte_scaling_mode mode, xte_qtensor *q,
                       char *why, size_t wn) {
  xte_tensor in = xte_tensor_2d((void *)x, XTE_DTYPE_BF16, R, C);
  int64_t sr, sc;
  xte_status st;
  memset(q, 0, sizeof *q);
  if (xte_quantize_scale_shape(R, C, mode, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_TE_GEMM, 0, &sr,
                               &sc) != XTE_SUCCESS) {
    snprintf(why, wn, "scale shape: %s", xte_last_error());
    return -1;
  }
  q->scaling_mode = mode;
  q->recipe = XTE_RECIPE_TE_BLOCK;
  q->rowwise = xte_tensor_2d(xte_gpu_alloc((size_t)(R * C)), XTE_DTYPE_E4M3, R, C);
  q->rowwise_scale_inv.data = xte_gpu_alloc((size_t)(sr * sc) * 4);
  q->rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  q->rowwise_scale_inv.rows = sr;
  q->rowwise_scale_inv.cols = sc;
  q->rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_TE_GEMM;
  if (!q->rowwise.data || !q->rowwise_scale_inv.data) {
    snprintf(why, wn, "device buffers: %s", xte_last_error());
    return -1;
  }
  st = xte_quantize(&in, q, NULL, xte_gpu_stream());
  if (st != XTE_SUCCESS) {
    snprintf(why, wn, "xte_quantize: %s: %s", xte_status_string(st), xte_last_error());
    return -1;
  }
  return 0;
}

static int gg_put_bf16(void *dev, size_t n, uint64_t seed, char *why, size_t wn) {
  void *h = xte_bench_alloc(2 * n);
  int rc;
  xte_bench_fill(h, XTE_DTYPE_BF16, n, seed);
  rc = xte_gpu_upload(dev, h, 2 * n);
  if (rc != 0) snprintf(why, wn, "upload: %s", xte_last_error());
  xte_bench_free(h);
  return rc;
}

static xte_status gg_run(void *arg) {
  ggcase *c = (ggcase *)arg;
  ggshape *s = c->sh;
  xte_gemm_config cfg = xte_gemm_config_default();
  xte_tensor D = xte_tensor_2d(s->d, XTE_DTYPE_BF16, s->M, s->N);
  xte_status st;
  if (c->cublas) return xte_gpu_cublas_bf16_gemm(s->M, s->N, s->K, s->x, s->w, s->d);
  if (c->fast) cfg.mode = XTE_GEMM_FAST;
  if (c->kernel && setenv("XTE_CUDA_GEMM_KERNEL", c->kernel, 1) != 0) return XTE_ERROR_INTERNAL;
  st = xte_gemm(&s->qa, &s->qb, NULL, &D, &cfg, xte_gpu_stream());
  if (c->kernel) (void)unsetenv("XTE_CUDA_GEMM_KERNEL");
  return st;
}

static int gg_setup(void *arg, char *why, size_t wn) {
  ggcase *c = (ggcase *)arg;
  ggshape *s = c->sh;
  xte_status st;
  if (s->failed) {
    snprintf(why, wn, "the shape's operands failed before");
    return -1;
  }
  if (!s->ready) {
    s->failed = 1;
    s->x = (uint16_t *)xte_gpu_alloc((size_t)(s->M * s->K) * 2);
    s->w = (uint16_t *)xte_gpu_alloc((size_t)(s->N * s->K) * 2);
    s->d = (uint16_t *)xte_gpu_alloc((size_t)(s->M * s->N) * 2);
    if (!s->x || !s->w || !s->d) {
      snprintf(why, wn, "device buffers: %s", xte_last_error());
      return -1;
    }
    if (gg_put_bf16(s->x, (size_t)(s->M * s->K), 1, why, wn) != 0 ||
        gg_put_bf16(s->w, (size_t)(s->N * s->K), 2, why, wn) != 0 ||
        gg_quantize(s->x, s->M, s->K, XTE_SCALING_BLOCK_1x128, &s->qa, why, wn) != 0 ||
        gg_quantize(s->w, s->N, s->K, XTE_SCALING_BLOCK_128x128, &s->qb, why, wn) != 0)
      return -1;
    s->ready = 1;
    s->failed = 0;
  }
  st = gg_run(c);
  if (st == XTE_SUCCESS && xte_gpu_sync() != 0) st = XTE_ERROR_DEVICE;
  if (st != XTE_SUCCESS) {
    snprintf(why, wn, "%s: %s: %s", c->cublas ? "cublasGemmEx" : "xte_gemm", xte_status_string(st),
             c->cublas ? "see stderr" : xte_last_error());
    return -1;
  }
  return 0;
}

void xte_bench_gpu_suite_gemm(void) {
  static const char *const stage[5] = {"exact-simt", "exact-dmma4", "exact-imma", "exact", "fast"};
  static const char *const kernel[5] = {"simt", "dmma4", "imma", NULL, NULL};
  static int registered;
  char why[512], name[128], anchor[128];
  int n = 0, si, k, nshapes = xte_gpu_smoke() ? 1 : GG_NSHAPES;
  const int have_cublas = xte_gpu_cublas_open(why, sizeof why) == 0;
  static const int64_t shapes[GG_NSHAPES][3] = {
      {4096, 4096, 7168}, {4096, 7168, 2048}, {4096, 7168, 16384}};
  if (registered) return;
  registered = 1;
  for (si = 0; si < GG_NSHAPES; si++) {
    gg_shapes[si].M = shapes[si][0];
    gg_shapes[si].N = shapes[si][1];
    gg_shapes[si].K = shapes[si][2];
  }
  gg_smoke.M = 96;
  gg_smoke.N = 160;
  gg_smoke.K = 384;
  if (!have_cublas) printf("xte bench gemm: no cuBLAS anchor: %s\n", why);
  for (si = 0; si < nshapes; si++) {
    ggshape *s = xte_gpu_smoke() ? &gg_smoke : &gg_shapes[si];
    const double flops = 2.0 * (double)s->M * (double)s->N * (double)s->K;
    ggcase *a = &gg_cases[n++];
    snprintf(anchor, sizeof anchor, "gemm/cublas-bf16/%lldx%lldx%lld", (long long)s->M,
             (long long)s->N, (long long)s->K);
    a->sh = s;
    a->cublas = 1;
    if (have_cublas) xte_gpu_register(anchor, NULL, "TFLOP/s", flops, gg_setup, gg_run, a);
    for (k = 0; k < 5; k++) {
      ggcase *c = &gg_cases[n++];
      c->sh = s;
      c->kernel = kernel[k];
      c->fast = k == 4;
      snprintf(name, sizeof name, "gemm/%s/%lldx%lldx%lld", stage[k], (long long)s->M,
               (long long)s->N, (long long)s->K);
      xte_gpu_register(name, have_cublas ? anchor : NULL, "TFLOP/s", flops, gg_setup, gg_run, c);
    }
  }
}
