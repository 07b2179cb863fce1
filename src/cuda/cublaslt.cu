/* XTE_GEMM_FAST on CUDA through cuBLASLt's block scaling (see xte_cublaslt.h): one cuBLASLt
 * handle per device, the stream handle's cached workspace (cuBLASLt's workspace, then room for
 * the scales repacked into the layout cuBLASLt reads when the caller's layout is another, then the
 * fp32 result of a problem with a bias and a bf16 D), one dense call per problem (a grouped call
 * is a loop of dense calls). A bias is never cuBLASLt's: after each problem's cuBLASLt call (fp32
 * result, no epilogue) the exact kernels' epilogue adds it in fp32 (xte_gpu_gemm_bias_epilogue).
 * Every problem is planned and its algorithm chosen before anything is enqueued: when one cannot
 * run here the whole call goes to the exact kernel, and nothing has been written. MUSA builds have
 * no cuBLASLt: FAST runs the exact kernel there. */
#include "cuda/xte_cublaslt.h"
#include "cuda/xte_fast.h"
#include "cuda/xte_gpu.h"
#include "cuda/xte_gpu_report.h"
#include "numerics/xte_numerics.h"

#if defined(__MUSACC__) || defined(XTE_MUSA)

bool xte_gpu_gemm_fast(const xte_gemm_args *a, xte_gpu_stream *, xte_status *, const char **why) {
  *why = a->mode != 1 ? "EXACT mode" : "no cuBLASLt on " XTE_GPU_NAME;
  return false;
}

void xte_gpu_fast_describe(int, char *buf, size_t size) {
  snprintf(buf, size, "FAST: exact kernel (no cuBLASLt on %s)", XTE_GPU_NAME);
}

#else

namespace {

#define XTE_LT_MAX_DEVICES 64
#define XTE_LT_WORKSPACE ((size_t)32 << 20) /* cuBLASLt's workspace (Hopper: 32 MiB advised) */
#define XTE_LT_ALGOS 8

pthread_mutex_t g_lt_lock = PTHREAD_MUTEX_INITIALIZER;
void *g_lt_handle[XTE_LT_MAX_DEVICES];

/* The cuBLASLt handle of the current device (dev), created on first use. */
void *lt_handle(const xte_lt_api *api, int dev) {
  void *h = NULL;
  if (dev < 0 || dev >= XTE_LT_MAX_DEVICES) return NULL;
  pthread_mutex_lock(&g_lt_lock);
  if (!g_lt_handle[dev] && api->create(&h) == XTE_LT_OK) g_lt_handle[dev] = h;
  h = g_lt_handle[dev];
  pthread_mutex_unlock(&g_lt_lock);
  return h;
}

int cc_major(int dev, cudaError_t prior) {
  int major = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e != cudaSuccess) {
    if (e != prior && cudaPeekAtLastError() == e) (void)cudaGetLastError();
    return 0;
  }
  return major;
}

/* Scales of operand o for one problem, from any layout into the one cuBLASLt reads:
 * VEC128: dst[kb * s_ld + r] (r < s_ld, padding 0); BLK128x128: dst[rb * s_ld + kb]. */
__global__ void lt_repack_scales(xte_gemm_operand o, int64_t i0b, int64_t kb0, int64_t rows,
                                 int64_t nkb, int64_t s_ld, int64_t total, float *dst) {
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t outer = t / s_ld, inner = t % s_ld;
    const int64_t r = o.bi == 1 ? inner : outer, kb = o.bi == 1 ? outer : inner;
    float v = 0.0f;
    if (r < rows && kb < nkb) {
      const int64_t gi = i0b + r, gj = kb0 + kb;
      v = ((const float *)
               o.s.data)[o.sswap ? xte_scale_offset(&o.s, gj, gi) : xte_scale_offset(&o.s, gi, gj)];
    }
    dst[t] = v;
  }
}

/* Enqueues the repack of one operand's scales (see lt_repack_scales). */
void lt_repack(cudaStream_t st, const xte_gemm_operand &o, const xte_lt_operand &p, int64_t rows,
               int64_t k, float *dst) {
  const int64_t nkb = (k + 127) / 128,
                n = p.scale_mode == XTE_LT_SCALE_VEC128_32F ? rows : (rows + 127) / 128;
  const int64_t blocks = (p.s_floats + 255) / 256 < 4096 ? (p.s_floats + 255) / 256 : 4096;
  // clang-format off
  lt_repack_scales<<<(unsigned)blocks, 256, 0, st>>>(o, p.i0 / o.bi, p.kb0, n, nkb, p.s_ld,
                                                     p.s_floats, dst);
  // clang-format on
}

/* The cuBLASLt descriptors of one call. */
struct lt_descs {
  const xte_lt_api *api;
  void *op = nullptr, *la = nullptr, *lb = nullptr, *lc = nullptr, *ld = nullptr;
  void *pref = nullptr;
  explicit lt_descs(const xte_lt_api *a) : api(a) {}
  lt_descs(const lt_descs &) = delete;
  lt_descs &operator=(const lt_descs &) = delete;
  ~lt_descs() {
    if (pref) api->pref_destroy(pref);
    if (ld) api->layout_destroy(ld);
    if (lc && lc != ld) api->layout_destroy(lc);
    if (lb) api->layout_destroy(lb);
    if (la) api->layout_destroy(la);
    if (op) api->desc_destroy(op);
  }
  /* scale pointers are set at enqueue time (repacked ones live in the workspace). No bias
   * epilogue: with a bias cuBLASLt writes fp32 accumulators (xte_lt_out_type), ld_out floats
   * apart, and xte_gemm_bias_epilogue adds it */
  bool build(const xte_lt_call &c, int64_t ld_out) {
    const int32_t ta = XTE_LT_OP_T, tb = XTE_LT_OP_N;
    const int32_t sa = c.b.scale_mode, sb = c.a.scale_mode; /* cuBLASLt's A is our B */
    const int8_t fast = 0;
    const uint32_t epi = XTE_LT_EPILOGUE_DEFAULT;
    const uint64_t ws = XTE_LT_WORKSPACE;
    if (api->desc_create(&op, XTE_LT_COMPUTE_32F, XTE_LT_R_32F) != XTE_LT_OK) return false;
    if (api->desc_set(op, XTE_LT_DESC_TRANSA, &ta, sizeof ta) != XTE_LT_OK ||
        api->desc_set(op, XTE_LT_DESC_TRANSB, &tb, sizeof tb) != XTE_LT_OK ||
        api->desc_set(op, XTE_LT_DESC_FAST_ACCUM, &fast, sizeof fast) != XTE_LT_OK ||
        api->desc_set(op, XTE_LT_DESC_A_SCALE_MODE, &sa, sizeof sa) != XTE_LT_OK ||
        api->desc_set(op, XTE_LT_DESC_B_SCALE_MODE, &sb, sizeof sb) != XTE_LT_OK ||
        api->desc_set(op, XTE_LT_DESC_EPILOGUE, &epi, sizeof epi) != XTE_LT_OK)
      return false;
    /* cuBLASLt's A: our B stored [k, n] column-major (rows of B K-contiguous), op T */
    if (api->layout_create(&la, c.b.type, (uint64_t)c.k, (uint64_t)c.n, c.b.ld) != XTE_LT_OK ||
        api->layout_create(&lb, c.a.type, (uint64_t)c.k, (uint64_t)c.m, c.a.ld) != XTE_LT_OK ||
        api->layout_create(&ld, xte_lt_out_type(&c), (uint64_t)c.n, (uint64_t)c.m, ld_out) !=
            XTE_LT_OK)
      return false;
    if (c.c) {
      if (api->layout_create(&lc, c.d_type, (uint64_t)c.n, (uint64_t)c.m, c.ld_c) != XTE_LT_OK)
        return false;
    } else {
      lc = ld;
    }
    if (api->pref_create(&pref) != XTE_LT_OK ||
        api->pref_set(pref, XTE_LT_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) != XTE_LT_OK)
      return false;
    return true;
  }
};

/* An algorithm for the call: the first heuristic answer that needs no split-K (the blocks are
 * then summed in K order by one accumulator chain) and fits the workspace. */
bool lt_pick(const xte_lt_api *api, void *handle, lt_descs &d, xte_lt_algo *algo) {
  xte_lt_heuristic r[XTE_LT_ALGOS];
  int n = 0, i;
  memset(r, 0, sizeof r);
  if (api->heuristic(handle, d.op, d.la, d.lb, d.lc, d.ld, d.pref, XTE_LT_ALGOS, r, &n) !=
      XTE_LT_OK)
    return false;
  for (i = 0; i < n; i++) {
    uint32_t splitk = 1;
    size_t w = 0;
    if (r[i].state != XTE_LT_OK || r[i].workspace_size > XTE_LT_WORKSPACE) continue;
    if (api->algo_config_get(&r[i].algo, XTE_LT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk,
                             &w) != XTE_LT_OK)
      continue;
    if (splitk > 1) continue;
    *algo = r[i].algo;
    return true;
  }
  return false;
}

size_t rup256(size_t b) {
  return (b + 255) / 256 * 256;
}

/* The row stride (elements) of the result cuBLASLt writes for call c: the workspace slice's (n)
 * or D's. */
int64_t lt_ld_out(const xte_lt_call &c) {
  return xte_lt_out_in_workspace(&c) ? c.n : c.ld_d;
}

}  // namespace

bool xte_gpu_gemm_fast(const xte_gemm_args *a, xte_gpu_stream *h, xte_status *st,
                       const char **why) {
  const xte_lt_api *api;
  const cudaError_t prior = cudaPeekAtLastError();
  void *handle, *ws = nullptr;
  size_t repack_bytes = 0, acc_bytes = 0;
  xte_lt_call *calls;
  xte_lt_algo *algos;
  int64_t i, ncalls = 0;
  bool ok = true;
  if (a->mode != 1 /* XTE_GEMM_FAST */) {
    *why = "EXACT mode";
    return false;
  }
  if (a->num_problems <= 0) {
    *why = "no problem";
    return false;
  }
  {
    const int major = cc_major(h->device, prior);
    xte_lt_call probe;
    /* a cheap first look (problem 0) before the library or any allocation */
    if ((*why = xte_lt_plan(a, major, 0, &probe)) != NULL) return false;
  }
  api = xte_lt_get(); /* loaded here, at the first FAST call that could use it */
  if (!api->usable) {
    *why = api->why;
    return false;
  }
  {
    const int major = cc_major(h->device, prior);
    calls = (xte_lt_call *)calloc((size_t)a->num_problems, sizeof *calls);
    algos = (xte_lt_algo *)calloc((size_t)a->num_problems, sizeof *algos);
    if (!calls || !algos) {
      free(calls);
      free(algos);
      *why = "out of host memory for the plan";
      return false;
    }
    for (i = 0; i < a->num_problems && ok; i++) {
      const char *w = xte_lt_plan(a, major, i, &calls[i]);
      ok = w == NULL;
      if (!ok) *why = w;
      if (ok) {
        const size_t rb =
            rup256((size_t)calls[i].a.s_floats * 4) + rup256((size_t)calls[i].b.s_floats * 4);
        if (rb > repack_bytes) repack_bytes = rb;
        if (xte_lt_out_in_workspace(&calls[i])) { /* the fp32 slice of a bf16 D with a bias */
          size_t ab = 0;
          if (__builtin_mul_overflow((size_t)calls[i].m, (size_t)calls[i].n, &ab) ||
              __builtin_mul_overflow(ab, (size_t)4, &ab) || ab > SIZE_MAX - 255) {
            ok = false;
            *why = "the fp32 result of a bf16 D with a bias does not fit size_t";
          } else if (rup256(ab) > acc_bytes) {
            acc_bytes = rup256(ab);
          }
        }
      }
    }
  }
  handle = ok ? lt_handle(api, h->device) : nullptr;
  if (ok && !handle) *why = "cublasLtCreate failed";
  for (i = 0; i < a->num_problems && ok && handle; i++) {
    if (calls[i].empty) continue;
    lt_descs d(api);
    if (!d.build(calls[i], lt_ld_out(calls[i]))) {
      ok = false;
      *why = "cuBLASLt refused a descriptor attribute";
    } else if (!lt_pick(api, handle, d, &algos[i])) {
      ok = false;
      *why = "cuBLASLt's heuristic gave no algorithm without split-K for this shape";
    }
    ncalls++;
  }
  if (!ok || !handle) {
    free(calls);
    free(algos);
    return false;
  }
  /* every problem runs here: from now on errors are reported, not passed to the exact kernel */
  {
    xte_gpu_lock lock(h);
    /* checked: 256 + XTE_LT_WORKSPACE + repack_bytes + acc_bytes (before anything is enqueued) */
    size_t total = 256 + XTE_LT_WORKSPACE;
    if (repack_bytes > SIZE_MAX - total || acc_bytes > SIZE_MAX - total - repack_bytes)
      *st = xte_gpu_services()->set_error(
          XTE_ERROR_OUT_OF_MEMORY, "%s: FAST GEMM: workspace size overflows size_t", XTE_GPU_NAME);
    else
      *st = xte_gpu_workspace(h, total + repack_bytes + acc_bytes, &ws);
    if (*st == XTE_SUCCESS) {
      char *base = (char *)ws + (256 - (uintptr_t)ws % 256) % 256;
      float *rep_a = (float *)(base + XTE_LT_WORKSPACE);
      /* the fp32 result of a problem with a bias and a bf16 D (one slice, reused in stream
       * order: the epilogue of problem i reads it before problem i + 1's cuBLASLt call writes) */
      float *acc32 = (float *)((char *)rep_a + repack_bytes);
      const float one = 1.0f, zero = 0.0f;
      for (i = 0; i < a->num_problems && *st == XTE_SUCCESS; i++) {
        const xte_lt_call &c = calls[i];
        const float *sa = c.a.scale, *sb = c.b.scale;
        float *rep_b = (float *)((char *)rep_a + rup256((size_t)c.a.s_floats * 4));
        const int64_t ld_out = lt_ld_out(c);
        void *out = xte_lt_out_in_workspace(&c) ? (void *)acc32 : c.d;
        int lst;
        if (c.empty) continue;
        if (c.a.repack) {
          lt_repack(h->stream, a->a, c.a, c.m, c.k, rep_a);
          sa = rep_a;
        }
        if (c.b.repack) {
          lt_repack(h->stream, a->b, c.b, c.n, c.k, rep_b);
          sb = rep_b;
        }
        *st = xte_gpu_launch_check(prior, "FAST GEMM scale repack launch");
        if (*st != XTE_SUCCESS) break;
        {
          lt_descs d(api);
          if (!d.build(c, ld_out) ||
              api->desc_set(d.op, XTE_LT_DESC_A_SCALE_POINTER, &sb, sizeof sb) != XTE_LT_OK ||
              api->desc_set(d.op, XTE_LT_DESC_B_SCALE_POINTER, &sa, sizeof sa) != XTE_LT_OK) {
            *st = xte_gpu_services()->set_error(
                XTE_ERROR_DEVICE, "%s: FAST GEMM: cuBLASLt descriptor failed", XTE_GPU_NAME);
            break;
          }
          lst = api->matmul(handle, d.op, &one, c.b.data, d.la, c.a.data, d.lb, c.c ? &one : &zero,
                            c.c ? c.c : out, d.lc, out, d.ld, &algos[i], base, XTE_LT_WORKSPACE,
                            (void *)h->stream);
          if (lst != XTE_LT_OK) {
            *st = xte_gpu_services()->set_error(XTE_ERROR_DEVICE,
                                                "%s: FAST GEMM: cublasLtMatmul failed (status %d)",
                                                XTE_GPU_NAME, lst);
            break;
          }
        }
        if (c.bias) { /* the contract's epilogue on cuBLASLt's fp32 accumulators */
          xte_gpu_gemm_bias_epilogue(a, &a->problems[i], (const float *)out, ld_out, h->stream);
          *st = xte_gpu_launch_check(prior, "FAST GEMM bias epilogue launch");
        }
      }
      if (*st == XTE_SUCCESS) *st = xte_gpu_launch_check(prior, "FAST GEMM (cuBLASLt) launch");
    }
  }
  if (*st == XTE_SUCCESS) xte_gpu_report_lt(api->lib, api->version, ncalls, a->bias != NULL);
  free(calls);
  free(algos);
  return true;
}

void xte_gpu_fast_describe(int dev, char *buf, size_t size) {
  if (dev >= 0) {
    const int major = cc_major(dev, cudaPeekAtLastError());
    if (major != 9) {
      snprintf(buf, size, "FAST: exact kernel (sm_%dx: cuBLASLt block scaling is Hopper only)",
               major);
      return;
    }
  }
  if (!xte_lt_loaded()) {
    snprintf(buf, size, "FAST: cuBLASLt (loaded at the first FAST call)");
    return;
  }
  {
    const xte_lt_api *api = xte_lt_get();
    if (!api->usable)
      snprintf(buf, size, "FAST: exact kernel (%s)", api->why);
    else
      snprintf(buf, size, "FAST: cuBLASLt %zu.%zu.%zu", api->version / 10000,
               api->version / 100 % 100, api->version % 100);
  }
}

#endif
