/* XTE_GEMM_FAST through cuBLASLt's block scaling (VEC128_32F / BLK128x128_32F, cuBLASLt >= 12.9,
 * compute capability 9.x), loaded with dlopen: the plugin never links libcublasLt.
 *
 * This header is plain C (static inline functions, no CUDA types), so that the host tests
 * (tests/test_gpu_fast_lt.c) run the loader and the applicability decision without a GPU; the
 * plugin's src/cuda/cublaslt.cu includes it and adds the device work (handles, workspace, scale
 * repacking, the matmul calls).
 *
 * No cuBLASLt header is included: the few enum values and the two structs used are written out
 * here (the ABI numbers of cublasLt.h; tests/test_gpu_fast_lt.c checks them against the installed
 * header when it is there). Names avoid NVIDIA's prefixes, so the MUSA compat check
 * (tests/check_musa_compat.py) has nothing to map.
 *
 * Library: $XTE_CUBLASLT_LIBRARY when set (a name or a path; tests), else the first of
 * libcublasLt.so.13, libcublasLt.so.12, libcublasLt.so that loads. Resolved once per process. */
#ifndef XTE_CUBLASLT_H
#define XTE_CUBLASLT_H

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xte_gemm_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- ABI values (cublasLt.h) */
enum {
  XTE_LT_OK = 0,            /* CUBLAS_STATUS_SUCCESS */
  XTE_LT_OP_N = 0,          /* CUBLAS_OP_N */
  XTE_LT_OP_T = 1,          /* CUBLAS_OP_T */
  XTE_LT_COMPUTE_32F = 68,  /* CUBLAS_COMPUTE_32F */
  XTE_LT_R_32F = 0,         /* CUDA_R_32F */
  XTE_LT_R_16BF = 14,       /* CUDA_R_16BF */
  XTE_LT_R_8F_E4M3 = 28,    /* CUDA_R_8F_E4M3 */
  XTE_LT_R_8F_E5M2 = 29,    /* CUDA_R_8F_E5M2 */
  XTE_LT_DESC_TRANSA = 3,   /* CUBLASLT_MATMUL_DESC_TRANSA (int32) */
  XTE_LT_DESC_TRANSB = 4,   /* CUBLASLT_MATMUL_DESC_TRANSB (int32) */
  XTE_LT_DESC_EPILOGUE = 7, /* uint32 */
  XTE_LT_DESC_BIAS_POINTER = 8,
  XTE_LT_DESC_A_SCALE_POINTER = 17,
  XTE_LT_DESC_B_SCALE_POINTER = 18,
  XTE_LT_DESC_FAST_ACCUM = 25,     /* int8 */
  XTE_LT_DESC_BIAS_DATA_TYPE = 26, /* int32 */
  XTE_LT_DESC_A_SCALE_MODE = 31,   /* int32 */
  XTE_LT_DESC_B_SCALE_MODE = 32,   /* int32 */
  XTE_LT_EPILOGUE_DEFAULT = 1,
  XTE_LT_EPILOGUE_BIAS = 4,
  XTE_LT_SCALE_VEC128_32F = 4,     /* CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F */
  XTE_LT_SCALE_BLK128x128_32F = 5, /* CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F */
  XTE_LT_PREF_MAX_WORKSPACE_BYTES = 1,
  XTE_LT_ALGO_CONFIG_SPLITK_NUM = 2 /* uint32 */
};

typedef struct xte_lt_algo {
  uint64_t data[8];
} xte_lt_algo; /* cublasLtMatmulAlgo_t */

typedef struct xte_lt_heuristic {
  xte_lt_algo algo;
  size_t workspace_size;
  int state;
  float waves;
  int reserved[4];
} xte_lt_heuristic; /* cublasLtMatmulHeuristicResult_t */

/* The minimum library version (cublasLtGetVersion(): major * 10000 + minor * 100 + patch). */
#define XTE_LT_MIN_VERSION 120900

typedef struct xte_lt_api {
  size_t (*get_version)(void);
  int (*create)(void **handle);
  int (*desc_create)(void **desc, int compute, int scale_type);
  int (*desc_destroy)(void *desc);
  int (*desc_set)(void *desc, int attr, const void *buf, size_t size);
  int (*layout_create)(void **layout, int type, uint64_t rows, uint64_t cols, int64_t ld);
  int (*layout_destroy)(void *layout);
  int (*pref_create)(void **pref);
  int (*pref_destroy)(void *pref);
  int (*pref_set)(void *pref, int attr, const void *buf, size_t size);
  int (*heuristic)(void *handle, void *desc, void *a, void *b, void *c, void *d, void *pref,
                   int requested, xte_lt_heuristic *results, int *returned);
  int (*algo_config_get)(const xte_lt_algo *algo, int attr, void *buf, size_t size,
                         size_t *written);
  int (*matmul)(void *handle, void *desc, const void *alpha, const void *a, void *adesc,
                const void *b, void *bdesc, const void *beta, const void *c, void *cdesc, void *d,
                void *ddesc, const xte_lt_algo *algo, void *workspace, size_t workspace_size,
                void *stream);
  size_t version; /* cublasLtGetVersion() */
  int usable;     /* every symbol resolved and version >= XTE_LT_MIN_VERSION */
  char lib[96];   /* the library that loaded */
  char why[160];  /* when not usable: why */
} xte_lt_api;

/* Loads the library and resolves the symbols (no GPU needed). Fills api; returns api->usable. */
static inline int xte_lt_load(xte_lt_api *api) {
  static const char *const names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
  const char *env = getenv("XTE_CUBLASLT_LIBRARY");
  void *lib = NULL;
  const char *err = "";
  size_t i;
  memset(api, 0, sizeof *api);
  if (env && *env) {
    lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!lib) err = dlerror();
    snprintf(api->lib, sizeof api->lib, "%.95s", env);
  } else {
    for (i = 0; i < sizeof names / sizeof names[0] && !lib; i++) {
      lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
      if (lib) snprintf(api->lib, sizeof api->lib, "%s", names[i]);
    }
    if (!lib) err = "not found";
  }
  if (!lib) {
    snprintf(api->why, sizeof api->why, "%.30s: %.120s", env && *env ? api->lib : "libcublasLt",
             err ? err : "not loaded");
    return 0;
  }
#define XTE_LT_SYM(field, name)                                               \
  do {                                                                        \
    *(void **)&api->field = dlsym(lib, name);                                 \
    if (!api->field) {                                                        \
      snprintf(api->why, sizeof api->why, "%.80s has no %s", api->lib, name); \
      return 0;                                                               \
    }                                                                         \
  } while (0)
  XTE_LT_SYM(get_version, "cublasLtGetVersion");
  api->version = api->get_version();
  if (api->version < XTE_LT_MIN_VERSION) {
    snprintf(api->why, sizeof api->why, "%.80s is version %zu, block scaling needs >= %d", api->lib,
             api->version, XTE_LT_MIN_VERSION);
    return 0;
  }
  XTE_LT_SYM(create, "cublasLtCreate");
  XTE_LT_SYM(desc_create, "cublasLtMatmulDescCreate");
  XTE_LT_SYM(desc_destroy, "cublasLtMatmulDescDestroy");
  XTE_LT_SYM(desc_set, "cublasLtMatmulDescSetAttribute");
  XTE_LT_SYM(layout_create, "cublasLtMatrixLayoutCreate");
  XTE_LT_SYM(layout_destroy, "cublasLtMatrixLayoutDestroy");
  XTE_LT_SYM(pref_create, "cublasLtMatmulPreferenceCreate");
  XTE_LT_SYM(pref_destroy, "cublasLtMatmulPreferenceDestroy");
  XTE_LT_SYM(pref_set, "cublasLtMatmulPreferenceSetAttribute");
  XTE_LT_SYM(heuristic, "cublasLtMatmulAlgoGetHeuristic");
  XTE_LT_SYM(algo_config_get, "cublasLtMatmulAlgoConfigGetAttribute");
  XTE_LT_SYM(matmul, "cublasLtMatmul");
#undef XTE_LT_SYM
  api->usable = 1; /* the library stays loaded for the process */
  return 1;
}

/* The process-wide table, loaded once (thread-safe), at the first FAST call that needs it (never
 * at plugin init: the library is hundreds of MB). */
static xte_lt_api xte_lt_g_api;
static pthread_once_t xte_lt_g_once = PTHREAD_ONCE_INIT;
static int xte_lt_g_loaded; /* set once the load was attempted */
static inline void xte_lt_load_once(void) {
  (void)xte_lt_load(&xte_lt_g_api);
  __atomic_store_n(&xte_lt_g_loaded, 1, __ATOMIC_RELEASE);
}
/* 1 once the library load was attempted (xte_lt_get called), without attempting it. */
static inline int xte_lt_loaded(void) {
  return __atomic_load_n(&xte_lt_g_loaded, __ATOMIC_ACQUIRE);
}
static inline const xte_lt_api *xte_lt_get(void) {
  pthread_once(&xte_lt_g_once, xte_lt_load_once);
  return &xte_lt_g_api;
}

/* ---------------------------------------------------------------- the applicability decision */

/* One operand of one cuBLASLt call: data (codes of row 0, k 0 of the problem; rows K-contiguous
 * with stride ld), its scale mode, and where its scales come from: zero-copy at scale (repack =
 * 0), or repacked into floats of workspace in the layout cuBLASLt reads (repack = 1). */
typedef struct xte_lt_operand {
  const uint8_t *data;
  int64_t ld;
  int type;        /* XTE_LT_R_8F_* */
  int scale_mode;  /* XTE_LT_SCALE_* */
  int64_t rows;    /* rows of this problem */
  int64_t i0, kb0; /* first row and first K block in the operand's scale grid */
  const float *scale;
  int repack;
  int64_t s_ld;     /* leading dimension of the scale tensor cuBLASLt reads */
  int64_t s_floats; /* floats of the repacked tensor (0 when zero-copy) */
} xte_lt_operand;

/* One dense cuBLASLt call (problem pi of args): D_lt [N, M] column-major = D [M, N] row-major;
 * cuBLASLt's A is our B (transposed, K-contiguous: "T"), its B is our A ("N"). */
typedef struct xte_lt_call {
  int64_t m, n, k; /* our M, N, K */
  xte_lt_operand a, b;
  void *d;
  const void *c; /* NULL: beta 0 */
  int64_t ld_d, ld_c;
  int d_type;        /* XTE_LT_R_32F / XTE_LT_R_16BF */
  const float *bias; /* NULL: none */
  int empty;         /* nothing to compute (m or n is 0) */
} xte_lt_call;

/* A FAST call with a bias sets no cuBLASLt bias epilogue: cuBLASLt's FP8 table lists only a bf16
 * bias for fp32 and bf16 outputs, and the contract adds the fp32 bias in fp32
 * (include/xte/gemm.h). cuBLASLt writes the fp32 accumulators instead (there is no C: C and a bias
 * together never come here), into D itself when D is fp32, else into an fp32 workspace slice
 * [m, n] (row stride n); the exact kernels' epilogue (xte_gemm_bias_epilogue) then adds the bias
 * and rounds to D's dtype. The cuBLASLt type of the result cuBLASLt writes for call c: */
static inline int xte_lt_out_type(const xte_lt_call *c) {
  return c->bias ? XTE_LT_R_32F : c->d_type;
}
/* 1: cuBLASLt writes call c's result into the fp32 workspace slice (a bias and a bf16 D). */
static inline int xte_lt_out_in_workspace(const xte_lt_call *c) {
  return c->bias && c->d_type == XTE_LT_R_16BF;
}

static inline int64_t xte_lt_rup(int64_t a, int64_t b) {
  return (a + b - 1) / b * b;
}

static inline const char *xte_lt_operand_plan(const xte_gemm_operand *o, int64_t i0, int64_t k0,
                                              int64_t rows, int64_t k, xte_lt_operand *out) {
  const int64_t nkb = (k + 127) / 128;
  int64_t rstr, kstr;
  memset(out, 0, sizeof *out);
  if (o->ks != 1 || o->sswap)
    return "an operand is not K-contiguous (cuBLASLt FP8 on Hopper takes TN only)";
  if (o->bk != 128 || (o->bi != 1 && o->bi != 128))
    return "scaling other than 1x128 / 128x128 (per-tensor, MXFP8)";
  if (o->s.e8m0) return "E8M0 scales";
  if (o->rs % 16 != 0) return "a row stride that is not a multiple of 16 bytes";
  out->data = o->data + i0 * o->rs + k0;
  if ((uintptr_t)out->data % 16 != 0) return "operand data not 16-byte aligned";
  out->ld = o->rs;
  out->type = o->fmt == 0 /* XTE_FP8_E4M3 */ ? XTE_LT_R_8F_E4M3 : XTE_LT_R_8F_E5M2;
  out->rows = rows;
  out->i0 = i0;
  out->kb0 = k0 / 128;
  if (o->bi == 1) {
    out->scale_mode = XTE_LT_SCALE_VEC128_32F;
    /* [K blocks, roundup(rows, 4)]: rows contiguous (TE's GEMM-ready 1D layout) */
    out->s_ld = xte_lt_rup(rows, 4);
  } else {
    if (i0 % 128 != 0) return "a 128x128-block operand whose rows do not start on a block";
    out->scale_mode = XTE_LT_SCALE_BLK128x128_32F;
    /* [row blocks, roundup(K blocks, 4)]: K blocks contiguous (TE's GEMM-ready 2D layout) */
    out->s_ld = xte_lt_rup(nkb, 4);
  }
  rstr = o->s.sr;
  kstr = o->s.sc;
  if (o->s.kind == XTE_SMAP_LINEAR) {
    const int64_t ib = i0 / o->bi;
    const float *p = (const float *)o->s.data + ib * rstr + out->kb0 * kstr;
    const int fits =
        o->bi == 1 ? (rstr == 1 && kstr == out->s_ld) : (kstr == 1 && rstr == out->s_ld);
    if (fits && (uintptr_t)p % 16 == 0) {
      out->scale = p;
      return NULL;
    }
  }
  out->repack = 1;
  out->s_floats = o->bi == 1 ? out->s_ld * nkb : (rows + 127) / 128 * out->s_ld;
  return NULL;
}

/* NULL when problem pi of args runs through cuBLASLt (fills *call); else the reason it does not
 * (the exact kernel runs the whole call then). cc_major: the device's compute capability. */
static inline const char *xte_lt_plan(const xte_gemm_args *g, int cc_major, int64_t pi,
                                      xte_lt_call *call) {
  const xte_gemm_problem *p = &g->problems[pi];
  const size_t es = g->d_dtype == XTE_DTYPE_BF16 ? 2 : 4;
  const char *why;
  memset(call, 0, sizeof *call);
  if (g->mode != 1) return "EXACT mode";
  if (cc_major != 9) return "compute capability is not 9.x";
  if (g->kblock != 128) return "MXFP8 (1x32 blocks)";
  if (g->masked_m) return "masked grouping (row counts live on the device)";
  if (g->d_dtype != XTE_DTYPE_FP32 && g->d_dtype != XTE_DTYPE_BF16) return "D dtype";
  call->m = p->m;
  call->n = p->n;
  call->k = p->k;
  if (p->m <= 0 || p->n <= 0) {
    call->empty = 1;
    return NULL;
  }
  if (p->k <= 0) return "K = 0";
  if (p->k % 16 != 0) return "K not a multiple of 16";
  /* TE's checks for block-scaled cuBLASLt GEMMs: cuBLASLt's m (our N) a multiple of 8, and its n
   * (our M) too when its B (our A) is 1D-scaled; kept for both (conservative). */
  if (p->n % 8 != 0) return "N not a multiple of 8";
  if (p->m % 8 != 0) return "M not a multiple of 8";
  why = xte_lt_operand_plan(&g->a, p->a_i0, p->a_k0, p->m, p->k, &call->a);
  if (!why) why = xte_lt_operand_plan(&g->b, p->b_i0, p->b_k0, p->n, p->k, &call->b);
  if (why) return why;
  if (call->a.scale_mode == XTE_LT_SCALE_BLK128x128_32F &&
      call->b.scale_mode == XTE_LT_SCALE_BLK128x128_32F)
    return "128x128 x 128x128";
  if (call->a.type == XTE_LT_R_8F_E5M2 && call->b.type == XTE_LT_R_8F_E5M2) return "e5m2 x e5m2";
  call->d_type = g->d_dtype == XTE_DTYPE_BF16 ? XTE_LT_R_16BF : XTE_LT_R_32F;
  call->ld_d = g->ld_d;
  call->d = (char *)g->d + (size_t)p->d_r0 * (size_t)g->ld_d * es;
  if (((size_t)g->ld_d * es) % 16 != 0 || (uintptr_t)call->d % 16 != 0)
    return "D rows not 16-byte aligned";
  if (g->c) {
    if (g->c_dtype != g->d_dtype) return "C dtype differs from D dtype";
    /* The contract adds C, then the bias; the order cuBLASLt's epilogue uses is not established */
    if (g->bias) return "C and bias together (epilogue order not established)";
    call->ld_c = g->ld_c;
    call->c = (const char *)g->c + (size_t)p->d_r0 * (size_t)g->ld_c * es;
    if (((size_t)g->ld_c * es) % 16 != 0 || (uintptr_t)call->c % 16 != 0)
      return "C rows not 16-byte aligned";
  }
  if (g->bias) {
    if ((uintptr_t)g->bias % 16 != 0) return "bias not 16-byte aligned";
    call->bias = g->bias;
  }
  return NULL;
}

#ifdef __cplusplus
}
#endif

#endif /* XTE_CUBLASLT_H */
