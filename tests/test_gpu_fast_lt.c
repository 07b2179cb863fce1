/* XTE_GEMM_FAST through cuBLASLt (src/cuda/xte_cublaslt.h, src/cuda/cublaslt.cu), what runs
 * without a GPU:
 *   fast_lt/loader_missing     XTE_CUBLASLT_LIBRARY naming a missing file: not usable, says why
 *   fast_lt/loader_real        the installed libcublasLt: every symbol resolves, version read
 *                              (SKIPPED when no libcublasLt is installed)
 *   fast_lt/plan_table         the applicability decision on a table of cases (host only)
 *   fast_lt/abi                the ABI values written out in the header = cublasLt.h's
 *                              (SKIPPED when the header is not there at build time)
 *   fast_lt/plugin_refuses     through libxte: a FAST GEMM on a CUDA stream without a device is
 *                              refused cleanly; `xte info` says which FAST path runs
 * The device checks (FAST against the bound of include/xte/gemm.h) are in
 * bench/gpu_device_check.c (`xte bench device fast`). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifdef XTE_TEST_CR_SHIM
#include "cr_shim.h"
#else
#include <criterion/criterion.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xte/xte.h>

#include "cuda/xte_cublaslt.h"

#if defined(__has_include)
#if __has_include(<cublasLt.h>)
#include <cublasLt.h>
#define XTE_TEST_HAVE_LT_HEADER 1
#endif
#endif

Test(fast_lt, loader_missing) {
  xte_lt_api api;
  setenv("XTE_CUBLASLT_LIBRARY", "/nonexistent/libcublasLt.so.99", 1);
  cr_assert_eq(xte_lt_load(&api), 0);
  cr_expect_eq(api.usable, 0);
  cr_expect(strstr(api.why, "/nonexistent/libcublasLt.so.99") != NULL, "why: %s", api.why);
  unsetenv("XTE_CUBLASLT_LIBRARY");
}

Test(fast_lt, loader_real) {
  static const char *paths[] = {"/usr/local/cuda/lib64/libcublasLt.so.13",
                                "/usr/local/cuda/lib64/libcublasLt.so.12", "libcublasLt.so.13",
                                "libcublasLt.so.12"};
  xte_lt_api api;
  size_t i;
  const char *found = NULL;
  for (i = 0; i < sizeof paths / sizeof paths[0] && !found; i++) {
    void *h = dlopen(paths[i], RTLD_LAZY | RTLD_LOCAL);
    if (h) {
      found = paths[i];
      dlclose(h);
    }
  }
  if (!found) {
    fprintf(stderr, "SKIPPED: no libcublasLt installed\n");
    cr_skip_test("SKIPPED: no libcublasLt installed");
  }
  setenv("XTE_CUBLASLT_LIBRARY", found, 1);
  (void)xte_lt_load(&api);
  unsetenv("XTE_CUBLASLT_LIBRARY");
  cr_assert(api.version > 0, "%s: no version read (%s)", found, api.why);
  fprintf(stderr, "%s: version %zu, usable %d %s\n", found, api.version, api.usable, api.why);
  if (api.version >= XTE_LT_MIN_VERSION) {
    cr_expect_eq(api.usable, 1, "%s: %s", found, api.why);
    cr_expect(api.matmul && api.heuristic && api.algo_config_get && api.create);
  } else {
    cr_expect_eq(api.usable, 0);
    cr_expect(strstr(api.why, "version") != NULL, "why: %s", api.why);
  }
}

/* ---------------------------------------------------------------- the plan table */
static _Alignas(256) uint8_t g_codes[1 << 16];
static _Alignas(256) float g_scales[1 << 12];
static _Alignas(256) float g_out[1 << 12];

typedef struct plan_case {
  const char *name;
  int cc;
  const char *want; /* NULL: applicable; else a substring of the reason */
  int repack_a, repack_b;
} plan_case;

/* A x B = 1x128 [M, K] x 128x128 [N, K], TE_GEMM scale layouts, bf16 D [M, N]: applicable */
static void base(xte_gemm_args *g, xte_gemm_problem *p, int64_t M, int64_t N, int64_t K) {
  const int64_t nkb = (K + 127) / 128;
  memset(g, 0, sizeof *g);
  memset(p, 0, sizeof *p);
  g->a.data = g_codes;
  g->a.fmt = 0;
  g->a.rs = K;
  g->a.ks = 1;
  g->a.bi = 1;
  g->a.bk = 128;
  g->a.s.data = g_scales;
  g->a.s.kind = XTE_SMAP_LINEAR;
  g->a.s.sr = 1;
  g->a.s.sc = xte_lt_rup(M, 4);
  g->b = g->a;
  g->b.bi = 128;
  g->b.s.sr = xte_lt_rup(nkb, 4);
  g->b.s.sc = 1;
  g->kblock = 128;
  g->mode = 1;
  g->d = g_out;
  g->d_dtype = XTE_DTYPE_BF16;
  g->ld_d = N;
  g->num_problems = 1;
  g->problems = p;
  p->m = M;
  p->n = N;
  p->k = K;
}

static void run_case(const plan_case *c, const xte_gemm_args *g) {
  xte_lt_call call;
  const char *why = xte_lt_plan(g, c->cc, 0, &call);
  if (!c->want) {
    cr_expect(why == NULL, "%s: refused: %s", c->name, why ? why : "");
    if (!why) {
      cr_expect_eq(call.a.repack, c->repack_a, "%s: repack A", c->name);
      cr_expect_eq(call.b.repack, c->repack_b, "%s: repack B", c->name);
    }
  } else {
    cr_expect(why != NULL && strstr(why, c->want) != NULL, "%s: want '%s', got '%s'", c->name,
              c->want, why ? why : "(applicable)");
  }
}

Test(fast_lt, plan_table) {
  xte_gemm_args g;
  xte_gemm_problem p;
  xte_lt_call call;
  const float *bias_odd = g_out + 1;
  plan_case c;
#define CASE(nm, cc_, want_, ra, rb, setup)  \
  do {                                       \
    base(&g, &p, 256, 512, 1024);            \
    setup;                                   \
    c = (plan_case){nm, cc_, want_, ra, rb}; \
    run_case(&c, &g);                        \
  } while (0)
  CASE("1x128 x 128x128, TE_GEMM", 9, NULL, 0, 0, (void)0);
  CASE("128x128 x 1x128", 9, NULL, 0, 0,
       (g.a.bi = 128, g.a.s.sr = 8, g.a.s.sc = 1, g.b.bi = 1, g.b.s.sr = 1, g.b.s.sc = 512));
  CASE("1x128 x 1x128", 9, NULL, 0, 0, (g.b.bi = 1, g.b.s.sr = 1, g.b.s.sc = 512));
  CASE("128x128 x 128x128", 9, "128x128 x 128x128", 0, 0,
       (g.a.bi = 128, g.a.s.sr = 8, g.a.s.sc = 1));
  CASE("compact A scales: repacked", 9, NULL, 1, 0, (g.a.s.sr = 8, g.a.s.sc = 1));
  CASE("compact B, K blocks 9 (ld 12): repacked", 9, NULL, 0, 1,
       (p.k = 1152, g.a.rs = g.b.rs = 1152, g.b.s.sr = 9));
  CASE("TE_GEMM B, K blocks 9", 9, NULL, 0, 0, (p.k = 1152, g.a.rs = g.b.rs = 1152, g.b.s.sr = 12));
  CASE("sm_80", 8, "compute capability", 0, 0, (void)0);
  CASE("sm_100", 10, "compute capability", 0, 0, (void)0);
  CASE("EXACT mode", 9, "EXACT", 0, 0, g.mode = 0);
  CASE("MXFP8", 9, "MXFP8", 0, 0, g.kblock = 32);
  CASE("masked", 9, "masked", 0, 0, g.masked_m = (const int32_t *)g_scales);
  CASE("A not K-contiguous", 9, "K-contiguous", 0, 0, (g.a.ks = 256, g.a.rs = 1, g.a.sswap = 1));
  CASE("per-tensor", 9, "per-tensor", 0, 0,
       (g.a.bi = g.b.bi = (int64_t)1 << 50, g.a.bk = g.b.bk = (int64_t)1 << 50));
  CASE("M = 257", 9, "M not a multiple of 8", 0, 0, p.m = 257);
  CASE("N = 500", 9, "N not a multiple of 8", 0, 0, p.n = 500);
  /* multiples of 4 but not of 8 (a planted M % 4 rule passed every row above) */
  CASE("M = 260", 9, "M not a multiple of 8", 0, 0, (p.m = 260, g.a.s.sc = 260));
  CASE("N = 516", 9, "N not a multiple of 8", 0, 0, (p.n = 516, g.ld_d = 520));
  CASE("K = 1000", 9, "K not a multiple of 16", 0, 0, p.k = 1000);
  CASE("row stride 1000", 9, "row stride", 0, 0, g.a.rs = 1000);
  CASE("data unaligned", 9, "16-byte aligned", 0, 0, g.a.data = g_codes + 16 * 1 + 8);
  CASE("e4m3 x e5m2", 9, NULL, 0, 0, g.b.fmt = 1);
  CASE("e5m2 x e5m2", 9, "e5m2 x e5m2", 0, 0, (g.a.fmt = 1, g.b.fmt = 1));
  CASE("fp32 D, ld 520", 9, NULL, 0, 0, (g.d_dtype = XTE_DTYPE_FP32, g.ld_d = 520));
  CASE("fp32 D, ld 514", 9, "D rows", 0, 0, (g.d_dtype = XTE_DTYPE_FP32, g.ld_d = 514));
  CASE("C bf16 in place", 9, NULL, 0, 0, (g.c = g.d, g.c_dtype = XTE_DTYPE_BF16, g.ld_c = 512));
  CASE("C fp32, D bf16", 9, "C dtype", 0, 0, (g.c = g_scales, g.c_dtype = XTE_DTYPE_FP32));
  CASE("bias", 9, NULL, 0, 0, g.bias = g_scales);
  CASE("bias unaligned", 9, "bias", 0, 0, g.bias = bias_odd);
  CASE("C and bias", 9, "C and bias", 0, 0,
       (g.c = g.d, g.c_dtype = XTE_DTYPE_BF16, g.ld_c = 512, g.bias = g_scales));
  CASE("group rows from 304 (A scale ld of all rows): repacked", 9, NULL, 1, 0,
       (p.a_i0 = 304, p.m = 64, g.a.s.sc = 368));
  CASE("B group from row 384", 9, NULL, 0, 0, (p.b_i0 = 384, p.n = 128));
  CASE("B group from row 200", 9, "do not start on a block", 0, 0, (p.b_i0 = 200, p.n = 128));
  CASE("K group from K 512: B ld of all K blocks: repacked", 9, NULL, 0, 1,
       (p.a_k0 = p.b_k0 = 512, p.k = 256));
  /* an empty problem is applicable and marked empty */
  base(&g, &p, 256, 512, 1024);
  p.m = 0;
  cr_expect(xte_lt_plan(&g, 9, 0, &call) == NULL && call.empty == 1, "empty problem");
  /* geometry of the baseline call */
  base(&g, &p, 256, 512, 1024);
  cr_assert(xte_lt_plan(&g, 9, 0, &call) == NULL);
  cr_expect_eq(call.a.scale_mode, XTE_LT_SCALE_VEC128_32F);
  cr_expect_eq(call.b.scale_mode, XTE_LT_SCALE_BLK128x128_32F);
  cr_expect_eq(call.a.s_ld, 256);
  cr_expect_eq(call.b.s_ld, 8);
  cr_expect_eq(call.a.ld, 1024);
  cr_expect(call.c == NULL && call.bias == NULL);
  /* repacked sizes: compact A (256 rows x 8 K blocks) */
  g.a.s.sr = 8;
  g.a.s.sc = 1;
  cr_assert(xte_lt_plan(&g, 9, 0, &call) == NULL);
  cr_expect_eq(call.a.s_floats, 256 * 8);
#undef CASE
}

Test(fast_lt, abi) {
#ifdef XTE_TEST_HAVE_LT_HEADER
  cr_expect_eq((long)XTE_LT_DESC_TRANSA, (long)CUBLASLT_MATMUL_DESC_TRANSA);
  cr_expect_eq((long)XTE_LT_DESC_TRANSB, (long)CUBLASLT_MATMUL_DESC_TRANSB);
  cr_expect_eq((long)XTE_LT_DESC_EPILOGUE, (long)CUBLASLT_MATMUL_DESC_EPILOGUE);
  cr_expect_eq((long)XTE_LT_DESC_BIAS_POINTER, (long)CUBLASLT_MATMUL_DESC_BIAS_POINTER);
  cr_expect_eq((long)XTE_LT_DESC_A_SCALE_POINTER, (long)CUBLASLT_MATMUL_DESC_A_SCALE_POINTER);
  cr_expect_eq((long)XTE_LT_DESC_B_SCALE_POINTER, (long)CUBLASLT_MATMUL_DESC_B_SCALE_POINTER);
  cr_expect_eq((long)XTE_LT_DESC_FAST_ACCUM, (long)CUBLASLT_MATMUL_DESC_FAST_ACCUM);
  cr_expect_eq((long)XTE_LT_DESC_BIAS_DATA_TYPE, (long)CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
  cr_expect_eq((long)XTE_LT_DESC_A_SCALE_MODE, (long)CUBLASLT_MATMUL_DESC_A_SCALE_MODE);
  cr_expect_eq((long)XTE_LT_DESC_B_SCALE_MODE, (long)CUBLASLT_MATMUL_DESC_B_SCALE_MODE);
  cr_expect_eq((long)XTE_LT_EPILOGUE_DEFAULT, (long)CUBLASLT_EPILOGUE_DEFAULT);
  cr_expect_eq((long)XTE_LT_EPILOGUE_BIAS, (long)CUBLASLT_EPILOGUE_BIAS);
  cr_expect_eq((long)XTE_LT_SCALE_VEC128_32F, (long)CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F);
  cr_expect_eq((long)XTE_LT_SCALE_BLK128x128_32F,
               (long)CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F);
  cr_expect_eq((long)XTE_LT_PREF_MAX_WORKSPACE_BYTES,
               (long)CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);
  cr_expect_eq((long)XTE_LT_ALGO_CONFIG_SPLITK_NUM, (long)CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  cr_expect_eq((long)XTE_LT_COMPUTE_32F, (long)CUBLAS_COMPUTE_32F);
  cr_expect_eq((long)XTE_LT_OP_T, (long)CUBLAS_OP_T);
  cr_expect_eq((long)XTE_LT_R_32F, (long)CUDA_R_32F);
  cr_expect_eq((long)XTE_LT_R_16BF, (long)CUDA_R_16BF);
  cr_expect_eq((long)XTE_LT_R_8F_E4M3, (long)CUDA_R_8F_E4M3);
  cr_expect_eq((long)XTE_LT_R_8F_E5M2, (long)CUDA_R_8F_E5M2);
  cr_expect_eq(sizeof(xte_lt_algo), sizeof(cublasLtMatmulAlgo_t));
  cr_expect_eq(sizeof(xte_lt_heuristic), sizeof(cublasLtMatmulHeuristicResult_t));
  cr_expect_eq(offsetof(xte_lt_heuristic, state), offsetof(cublasLtMatmulHeuristicResult_t, state));
#else
  fprintf(stderr, "SKIPPED: cublasLt.h was not found at build time\n");
  cr_skip_test("SKIPPED: cublasLt.h was not found at build time");
#endif
}

Test(fast_lt, plugin_refuses) {
  xte_stream s;
  xte_status st = xte_stream_create(XTE_BACKEND_CUDA, 0, NULL, &s);
  static char buf[8192];
  cr_assert_eq(xte_backend_info_string(buf, sizeof buf), XTE_SUCCESS);
  if (st == XTE_SUCCESS) {
    /* a device: its line names the FAST path */
    cr_expect(strstr(buf, "FAST: ") != NULL, "xte info does not name the FAST path:\n%s", buf);
    xte_stream_destroy(s);
    return;
  }
  cr_expect_eq(st, XTE_ERROR_BACKEND_UNAVAILABLE, "%s", xte_last_error());
#ifdef XTE_TEST_HAVE_CUDA_PLUGIN
  cr_expect(strstr(buf, "FAST: ") != NULL, "xte info does not name the FAST path:\n%s", buf);
#endif
  {
    /* a FAST GEMM on the CUDA backend without a device: refused, nothing written */
    uint8_t a[128 * 128], b[128 * 128];
    float sa[128], sb[4], d[128 * 128];
    xte_qtensor qa, qb;
    xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_FP32, 128, 128);
    xte_gemm_config cfg = xte_gemm_config_default();
    memset(&qa, 0, sizeof qa);
    memset(a, 0x38, sizeof a);
    memset(b, 0x38, sizeof b);
    memset(d, 0x7F, sizeof d);
    qa.scaling_mode = XTE_SCALING_BLOCK_1x128;
    qa.recipe = XTE_RECIPE_TE_BLOCK;
    qa.rowwise = xte_tensor_2d(a, XTE_DTYPE_E4M3, 128, 128);
    qa.rowwise_scale_inv = (xte_scale_tensor){sa, XTE_DTYPE_FP32, 128, 1, XTE_SCALE_LAYOUT_COMPACT};
    qb = qa;
    qb.scaling_mode = XTE_SCALING_BLOCK_128x128;
    qb.rowwise = xte_tensor_2d(b, XTE_DTYPE_E4M3, 128, 128);
    qb.rowwise_scale_inv = (xte_scale_tensor){sb, XTE_DTYPE_FP32, 1, 1, XTE_SCALE_LAYOUT_COMPACT};
    cfg.mode = XTE_GEMM_FAST;
    cr_expect_eq(xte_gemm(&qa, &qb, NULL, &D, &cfg, (xte_stream)NULL), XTE_SUCCESS,
                 "FAST on the default (CPU) stream: %s", xte_last_error());
  }
}

/* A FAST call with a bias gives cuBLASLt no bias (its FP8 table lists only a bf16 one; the
 * contract adds the fp32 bias in fp32): cuBLASLt writes fp32, into D when D is fp32, into the fp32
 * workspace slice when D is bf16; without a bias it writes D's own dtype into D. */
Test(fast_lt, bias_after_cublaslt) {
  static const float bias[8];
  xte_lt_call c;
  memset(&c, 0, sizeof c);
  c.d_type = XTE_LT_R_32F;
  cr_expect_eq(xte_lt_out_type(&c), XTE_LT_R_32F);
  cr_expect_eq(xte_lt_out_in_workspace(&c), 0);
  c.d_type = XTE_LT_R_16BF;
  cr_expect_eq(xte_lt_out_type(&c), XTE_LT_R_16BF);
  cr_expect_eq(xte_lt_out_in_workspace(&c), 0);
  c.bias = bias;
  cr_expect_eq(xte_lt_out_type(&c), XTE_LT_R_32F);
  cr_expect_eq(xte_lt_out_in_workspace(&c), 1);
  c.d_type = XTE_LT_R_32F;
  cr_expect_eq(xte_lt_out_type(&c), XTE_LT_R_32F);
  cr_expect_eq(xte_lt_out_in_workspace(&c), 0);
}

/* libcublasLt (hundreds of MB) is loaded at the first FAST call that could use it, never when
 * libxte loads the plugin: after the plugin's init (xte info) it is not in the process. */
Test(fast_lt, loaded_lazily) {
  static char buf[8192];
  void *h;
  cr_assert_eq(xte_backend_info_string(buf, sizeof buf), XTE_SUCCESS);
#ifdef XTE_TEST_HAVE_CUDA_PLUGIN
  cr_expect(strstr(buf, "libxte_cuda.so loaded") != NULL, "the plugin did not load:\n%s", buf);
#endif
  h = dlopen("libcublasLt.so.13", RTLD_LAZY | RTLD_NOLOAD);
  if (!h) h = dlopen("libcublasLt.so.12", RTLD_LAZY | RTLD_NOLOAD);
  cr_expect(h == NULL, "libcublasLt is loaded after the plugin's init:\n%s", buf);
  if (h) dlclose(h);
}
