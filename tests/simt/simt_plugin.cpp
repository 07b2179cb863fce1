/* libxte_cuda.so for the host SIMT runner: a plugin with the CUDA plugin's backend table whose
 * "device" is host memory and whose kernels are the CUDA kernel text of
 * src/cuda/quantize_kernels.cuh and src/cuda/moe_kernels.cuh, compiled for the host (simt.h) and
 * launched by simt::launch. test_simt_quantize points XTE_PLUGIN_DIR at the folder holding it, so
 * libxte's core validates and prepares every argument exactly as for the CUDA plugin, and the bytes
 * of the CUDA backend stream can be compared with the CPU backend's.
 *
 * The launches below restate src/cuda/quantize.cu's (same order, same launch geometry through the
 * header's helpers, cudaMemsetAsync as memset): keep the two in step. */
#include "simt.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "cuda/attention_kernels.cuh"
#include "ep/transport/ccl.h"
#include "cuda/ep_kernels.cuh"
#include "cuda/gemm_kernels.cuh"
#include "cuda/moe_kernels.cuh"
#include "cuda/moe_router_kernels.cuh"
#include "cuda/moe_swiglu_kernels.cuh"
#include "cuda/quantize_kernels.cuh"
#include "cuda/xte_cublaslt.h"
#include "cuda/xte_gpu_report.h"
#include "xte_backend.h"

namespace {

const xte_core_services *g_svc;

/* quantize.cu / xte_gpu.h: xte_gpu_stream. scratch: the quantize's scratch, growing into the
 * handle's cached workspace (workspace() below); its 16 bytes at creation, as the CUDA plugin's
 * XTE_GPU_SCRATCH_FLOATS floats. */
struct handle {
  float *scratch = nullptr;
  size_t scratch_bytes = 0;
  std::mutex lock;
  ~handle() { std::free(scratch); }
};
handle g_default;

/* quantize.cu: xte_gpu_workspace (the caller holds h->lock). A grown buffer starts as garbage, as
 * cudaMalloc's memory may: the drivers set every workspace byte they read. */
xte_status workspace(handle *h, size_t bytes, void **out) {
  const size_t cap = h->scratch_bytes ? h->scratch_bytes : 4 * sizeof(float);
  const size_t need = xte_ws_need(bytes);
  if (!need) return g_svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "simt: workspace size");
  if (need > cap) {
    const size_t grow = xte_ws_grow(cap, need);
    void *p;
    if (!grow || grow < need)
      return g_svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "simt: workspace size");
    if (!(p = std::aligned_alloc(256, grow)))
      return g_svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "simt: out of memory");
    std::memset(p, 0xA5, grow);
    std::free(h->scratch);
    h->scratch = (float *)p;
    h->scratch_bytes = grow;
  }
  *out = (char *)h->scratch + XTE_WS_BASE;
  return XTE_SUCCESS;
}

/* backend.cu: xte_gpu_resolve (the NULL stream's handle; its scratch allocated by init) */
handle *resolve(void *hv) {
  return hv ? static_cast<handle *>(hv) : &g_default;
}

xte_status launch_failed(const char *what) {
  return g_svc->set_error(XTE_ERROR_DEVICE, "simt: %s: invalid launch configuration", what);
}

#define SIMT_TRY(call, what)                            \
  do {                                                  \
    if ((call) != simt::ok) return launch_failed(what); \
  } while (0)

xte_status init(const xte_core_services *svc, char *why, size_t why_size) {
  g_svc = svc;
  if (why_size) why[0] = '\0';
  /* the warp size of the runner's launches (test_simt_router --warp N): 32, 64 or 128 */
  if (const char *w = std::getenv("SIMT_WARP_SIZE")) simt::set_warp_size(std::atoi(w));
  if (!g_default.scratch) g_default.scratch = (float *)std::aligned_alloc(256, 256);
  /* the FAST line as backend.cu writes it (see gemm() below for what the stand-in does) */
  if (why_size)
    std::snprintf(why, why_size,
                  "FAST: cuBLASLt 13.0.0 (simt stand-in: cublaslt.cu's plan, "
                  "computed by the exact kernel)");
  return XTE_SUCCESS;
}
int device_count() {
  return 1;
}
xte_status device_info(int, xte_gpu_info *info) {
  std::memset(info, 0, sizeof *info);
  std::snprintf(info->name, sizeof info->name, "simt host runner");
  std::snprintf(info->arch, sizeof info->arch, "simt_w%d", warpSize);
  return XTE_SUCCESS;
}
xte_status stream_create(int, void *, void **out) {
  handle *h = new handle;
  h->scratch = (float *)std::aligned_alloc(256, 256);
  *out = h;
  return XTE_SUCCESS;
}
xte_status stream_destroy(void *h) {
  delete static_cast<handle *>(h);
  return XTE_SUCCESS;
}
xte_status synchronize(void *) {
  return XTE_SUCCESS;
}
xte_status alloc(int, size_t bytes, void **ptr) {
  void *p;
  if (bytes == 0) {
    *ptr = nullptr;
    return XTE_SUCCESS;
  }
  p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!p) return g_svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "simt: out of memory");
  *ptr = p;
  return XTE_SUCCESS;
}
xte_status dealloc(int, void *ptr) {
  std::free(ptr);
  return XTE_SUCCESS;
}
xte_status copy(void *, void *dst, const void *src, size_t bytes, int) {
  if (bytes) std::memcpy(dst, src, bytes);
  return XTE_SUCCESS;
}
xte_status fill(void *, void *dst, int value, size_t bytes) {
  if (bytes) std::memset(dst, value, bytes);
  return XTE_SUCCESS;
}

void zero_scales(const xte_scale_map *m) {
  if (const size_t n = xte_q_scale_bytes(m)) std::memset(m->data, 0, n);
}

/* quantize.cu: xte_gpu_quantize (the enqueue under the handle's lock) */
xte_status quantize(const xte_quant_args *a, void *hv) {
  handle *h = resolve(hv);
  std::lock_guard<std::mutex> g(h->lock);
  const int64_t ntr = xte_q_tiles(a->M), ntc = xte_q_tiles(a->K);
  const int empty = a->M <= 0 || a->K <= 0;
  if (!empty && ntr * ntc > INT_MAX)
    return g_svc->set_error(XTE_ERROR_DEVICE, "simt: quantize: more than 2^31 tiles");
  zero_scales(&a->row_s);
  zero_scales(&a->col_s);
  if (a->mode == XTE_SCALING_PER_TENSOR) {
    if (a->recipe == XTE_RECIPE_TE_CURRENT) {
      std::memset(&h->scratch[0], 0, sizeof h->scratch[0]); /* the amax accumulator */
      if (!empty)
        SIMT_TRY(simt::launch(dim3((unsigned)xte_q_amax_grid(a->M, a->K, a->in_kind)), dim3(NT), 0,
                              amax_kernel, *a, (unsigned *)h->scratch),
                 "amax_kernel");
    }
    SIMT_TRY(simt::launch(dim3(1), dim3(1), 0, tensor_scale_kernel, *a, h->scratch + 0),
             "tensor_scale_kernel");
  }
  if (a->amax_out) std::memset(a->amax_out, 0, sizeof(float));
  if (!empty)
    SIMT_TRY(simt::launch(dim3((unsigned)(ntr * ntc)), dim3(NT), 0, quant_tiles, *a,
                          (const float *)(h->scratch + 1), (unsigned *)a->amax_out, ntc),
             "quant_tiles");
  return XTE_SUCCESS;
}

xte_status dequantize(const xte_dequant_args *a, void *) {
  if (a->R <= 0 || a->C <= 0) return XTE_SUCCESS;
  SIMT_TRY(
      simt::launch(dim3((unsigned)xte_q_grid_for(a->R * a->C)), dim3(NT), 0, dequant_kernel, *a),
      "dequant_kernel");
  return XTE_SUCCESS;
}

xte_status cast(const xte_cast_args *a, void *) {
  if (a->n <= 0) return XTE_SUCCESS;
  SIMT_TRY(simt::launch(dim3((unsigned)xte_q_grid_for(a->n)), dim3(NT), 0, cast_kernel, *a),
           "cast_kernel");
  return XTE_SUCCESS;
}

/* moe.cu: cuda_rt, the runtime policy of moe_kernels.cuh's driver (the device is host memory,
 * cudaMemsetAsync / cudaMemcpyAsync are memset / memcpy, a launch is simt::launch); the
 * workspace is the handle's cached one, the operation holds the handle's lock. */
struct host_rt {
  const xte_core_services *svc;
  handle *h = nullptr;
  void *cached = nullptr;
  size_t cached_bytes = 0;
  xte_status alloc(void **p, size_t bytes) {
    if (!cached) {
      xte_status st = workspace(h, bytes, p);
      if (st == XTE_SUCCESS) cached = *p, cached_bytes = bytes;
      return st;
    }
    return ::alloc(0, bytes ? bytes : 1, p);
  }
  void release(void *p) {
    if (p == cached) { /* stays with the handle: garbage for the next operation */
      if (p) std::memset(p, 0x5A, cached_bytes);
      cached = nullptr;
      return;
    }
    std::free(p);
  }
  xte_status memset(void *p, int v, size_t bytes) {
    if (bytes) std::memset(p, v, bytes);
    return XTE_SUCCESS;
  }
  xte_status read(void *host, const void *dev, size_t bytes) {
    if (bytes) std::memcpy(host, dev, bytes);
    return XTE_SUCCESS;
  }
  template <class... P, class... A>
  xte_status launch(int64_t grid, void (*k)(P...), A... args) {
    SIMT_TRY(simt::launch(dim3((unsigned)grid), dim3(XTE_MOE_NT), 0, k, args...), "moe kernel");
    return XTE_SUCCESS;
  }
  xte_status finish() { return XTE_SUCCESS; }
};

/* moe.cu: gpu_permute, gpu_unpermute, gpu_sort_chunks, gpu_dispatch_layout */
xte_status moe_permute(const xte_permute_args *a, void *hv) {
  handle *h = resolve(hv);
  std::lock_guard<std::mutex> g(h->lock);
  host_rt rt{g_svc, h};
  return xte_moe_permute_run(rt, a);
}
xte_status moe_unpermute(const xte_unpermute_args *a, int which, void *hv) {
  handle *h = resolve(hv);
  std::lock_guard<std::mutex> g(h->lock);
  host_rt rt{g_svc, h};
  return xte_moe_unpermute_run(rt, a, which);
}
xte_status moe_sort_chunks(const xte_sort_chunks_args *a, void *hv) {
  handle *h = resolve(hv);
  std::lock_guard<std::mutex> g(h->lock);
  host_rt rt{g_svc, h};
  return xte_moe_sort_chunks_run(rt, a);
}
xte_status moe_dispatch_layout(const xte_dispatch_args *a, void *hv) {
  handle *h = resolve(hv);
  std::lock_guard<std::mutex> g(h->lock);
  host_rt rt{g_svc, h};
  return xte_moe_dispatch_run(rt, a);
}
/* moe.cu: gpu_router_forward, gpu_router_backward, gpu_aux_loss, gpu_swiglu */
xte_status moe_router_forward(const xte_router_args *a, void *hv) {
  handle *h = resolve(hv);
  std::lock_guard<std::mutex> g(h->lock);
  host_rt rt{g_svc, h};
  return xte_rt_forward_run(rt, a);
}
xte_status moe_router_backward(const xte_router_bwd_args *a, void *hv) {
  handle *h = resolve(hv);
  std::lock_guard<std::mutex> g(h->lock);
  host_rt rt{g_svc, h};
  return xte_rt_backward_run(rt, a);
}
xte_status moe_aux_loss(const xte_aux_loss_args *a, int backward, void *hv) {
  handle *h = resolve(hv);
  std::lock_guard<std::mutex> g(h->lock);
  host_rt rt{g_svc, h};
  return xte_aux_loss_run(rt, a, backward);
}
xte_status moe_swiglu(const xte_swiglu_args *a, void *hv) {
  handle *h = resolve(hv);
  std::lock_guard<std::mutex> g(h->lock);
  host_rt rt{g_svc, h};
  return xte_swiglu_run(rt, a);
}
const xte_moe_ops g_moe_ops = {moe_router_forward,  moe_router_backward, moe_aux_loss,
                               moe_permute,         moe_unpermute,       moe_sort_chunks,
                               moe_dispatch_layout, moe_swiglu};

/* GEMM kernel launches: [0] the SIMT kernel (stage 1), [1] the DMMA kernel (stage 2) with mma
 * m8n8k4, [2] with mma m16n8k16, [3] the int8 digit kernel (stage 3) */
std::atomic<long> g_gemm_launches[4];

/* gemm.cu: cuda_gemm_rt, the runtime policy of gemm_kernels.cuh's driver (host memory) */
struct host_gemm_rt {
  const xte_core_services *svc;
  int dmma;         /* the kernel, XTE_GEMM_KERNEL_SIMT / DMMA4 / DMMA16 / IMMA: see gemm() */
  unsigned ran = 0; /* bit k: kernel k launched (reported as gemm.cu reports it) */
  xte_status alloc(void **p, size_t bytes) { return ::alloc(0, bytes ? bytes : 1, p); }
  void release(void *p) { std::free(p); }
  void *host_alloc(size_t bytes) { return std::malloc(bytes); }
  void host_free(void *p) { std::free(p); }
  xte_status upload(void *dev, const void *host, size_t bytes) {
    if (bytes) std::memcpy(dev, host, bytes);
    return XTE_SUCCESS;
  }
  xte_status memset(void *p, int v, size_t bytes) {
    if (bytes) std::memset(p, v, bytes);
    return XTE_SUCCESS;
  }
  xte_status read(void *host, const void *dev, size_t bytes) {
    if (bytes) std::memcpy(host, dev, bytes);
    return XTE_SUCCESS;
  }
  template <class... P, class... A>
  xte_status launch(int64_t grid, void (*k)(P...), A... args) {
    count_launch(reinterpret_cast<void (*)(void)>(k));
    SIMT_TRY(simt::launch(dim3((unsigned)grid), dim3(XTE_GEMM_NT), 0, k, args...), "gemm kernel");
    return XTE_SUCCESS;
  }
  /* test_simt_gemm checks which GEMM kernel ran: simt_gemm_launches() */
  static void count_launch(void (*k)(void)) {
    using vf = void (*)(void);
    if (k == reinterpret_cast<vf>(&xte_gemm_dmma_kernel<0, 4>) ||
        k == reinterpret_cast<vf>(&xte_gemm_dmma_kernel<1, 4>) ||
        k == reinterpret_cast<vf>(&xte_gemm_dmma_kernel<2, 4>))
      g_gemm_launches[1].fetch_add(1);
    else if (k == reinterpret_cast<vf>(&xte_gemm_dmma_kernel<0, 16>) ||
             k == reinterpret_cast<vf>(&xte_gemm_dmma_kernel<1, 16>) ||
             k == reinterpret_cast<vf>(&xte_gemm_dmma_kernel<2, 16>))
      g_gemm_launches[2].fetch_add(1);
    else if (k == reinterpret_cast<vf>(&xte_gemm_exact_kernel<0>) ||
             k == reinterpret_cast<vf>(&xte_gemm_exact_kernel<1>) ||
             k == reinterpret_cast<vf>(&xte_gemm_exact_kernel<2>))
      g_gemm_launches[0].fetch_add(1);
    else if (k == reinterpret_cast<vf>(&xte_gemm_imma_kernel))
      g_gemm_launches[3].fetch_add(1);
  }
  xte_status finish() { return XTE_SUCCESS; }
};

/* cublaslt.cu's FAST call with a bias, the exact kernel standing in for cuBLASLt: the fp32
 * accumulators, no bias, into D itself when D is fp32, else into an fp32 buffer [rows, n] (the
 * workspace slice of cublaslt.cu), then xte_gemm_bias_epilogue per problem with the launch
 * geometry of gemm.cu's xte_gpu_gemm_bias_epilogue. */
xte_status fast_with_bias(host_gemm_rt &rt, const xte_gemm_args *a) {
  xte_gemm_args acc = *a;
  void *tmp = nullptr;
  xte_status st = XTE_SUCCESS;
  acc.bias = nullptr;
  if (a->d_dtype == XTE_DTYPE_BF16) {
    int64_t rows = 0, n = 0;
    for (int64_t i = 0; i < a->num_problems; i++) {
      const xte_gemm_problem &p = a->problems[i];
      if (p.d_r0 + p.m > rows) rows = p.d_r0 + p.m;
      if (p.n > n) n = p.n;
    }
    st = ::alloc(0, (size_t)rows * (size_t)n * 4, &tmp);
    acc.d = tmp;
    acc.ld_d = n;
    acc.d_dtype = XTE_DTYPE_FP32;
  }
  if (st == XTE_SUCCESS) st = xte_gemm_run(rt, &acc);
  for (int64_t i = 0; i < a->num_problems && st == XTE_SUCCESS; i++) {
    const xte_gemm_problem &p = a->problems[i];
    const float *src = (const float *)acc.d + p.d_r0 * acc.ld_d;
    const int64_t grid = p.m < XTE_GEMM_GRID_CAP ? p.m : XTE_GEMM_GRID_CAP;
    if (grid <= 0 || p.n <= 0) continue;
    if (simt::launch(dim3((unsigned)grid), dim3(XTE_GEMM_NT), 0, xte_gemm_bias_epilogue, *a, p, src,
                     acc.ld_d) != simt::ok)
      st = launch_failed("gemm bias epilogue");
  }
  std::free(tmp);
  return st;
}

/* gemm.cu: gpu_gemm. The kernel: SIMT_GEMM_KERNEL=dmma asks for the DMMA kernel (stage 2) with mma
 * m8n8k4, SIMT_GEMM_KERNEL=dmma16 for the one with mma m16n8k16, SIMT_GEMM_KERNEL=imma for the int8
 * digit kernel (stage 3; e4m3 x e4m3 only, else the driver runs the SIMT kernel, as gemm.cu falls
 * back to its automatic choice); they run only with 32-lane warps
 * (as gemm.cu selects them only on NVIDIA devices of compute capability >= 8.0 / 9.0; with the
 * runner's 64- / 128-lane warps, MUSA's, the SIMT kernel runs);
 * SIMT_WARP_SIZE (32, 64, 128): the runner's warp size, read at every call.
 * XTE_CUDA_GEMM_KERNEL (simt / dmma4 / dmma16 / imma, the CUDA plugin's name for it) asks the same
 * way, and every call is reported as gemm.cu reports it (src/cuda/xte_gpu_report.h), so that the
 * device script's dry run (tests/device/dryrun.sh) checks its kernel naming here.
 *
 * XTE_GEMM_FAST: the stand-in for cuBLASLt. The real applicability decision of the CUDA plugin
 * (xte_lt_plan of src/cuda/xte_cublaslt.h, as on a compute capability 9.x device) decides; where
 * it applies, the call is computed by the exact kernel chosen as for EXACT (its bytes are within
 * the FAST bound; with a bias, without it and then through xte_gemm_bias_epilogue as cublaslt.cu
 * runs it: fast_with_bias) and
 * reported as path=cublaslt with lib=simt-stand-in; else it is reported as the exact kernel and
 * why, as cublaslt.cu reports a fallback.
 *
 * XTE_DEVICE_PLANT (the dry run's planted bugs, this stand-in only): "kernel" ignores a forced
 * kernel (the SIMT kernel runs, and is reported as what ran); "fast" makes every FAST call fall
 * back ("planted fallback"); "fast-bias" makes the FAST calls with a bias fall back. */
xte_status gemm(const xte_gemm_args *a, void *) {
  if (const char *w = std::getenv("SIMT_WARP_SIZE")) simt::set_warp_size(std::atoi(w));
  const char *k = std::getenv("SIMT_GEMM_KERNEL");
  const char *plant = std::getenv("XTE_DEVICE_PLANT");
  int requested = xte_gemm_kernel_requested(std::getenv("XTE_CUDA_GEMM_KERNEL"));
  const char *fast_why = nullptr, *not_honoured = nullptr;
  int kern = XTE_GEMM_KERNEL_SIMT;
  if (k && warpSize == 32 && !std::strcmp(k, "dmma")) kern = XTE_GEMM_KERNEL_DMMA4;
  if (k && warpSize == 32 && !std::strcmp(k, "dmma16")) kern = XTE_GEMM_KERNEL_DMMA16;
  if (k && warpSize == 32 && !std::strcmp(k, "imma")) kern = XTE_GEMM_KERNEL_IMMA;
  if (requested >= 0) {
    if (warpSize == 32) {
      kern = requested;
      if (kern == XTE_GEMM_KERNEL_IMMA && (a->a.fmt != XTE_FP8_E4M3 || a->b.fmt != XTE_FP8_E4M3)) {
        kern = XTE_GEMM_KERNEL_SIMT;
        not_honoured = "imma: an operand is e5m2 (the int8 digit kernel takes e4m3 x e4m3)";
      }
    } else if (requested != XTE_GEMM_KERNEL_SIMT) {
      not_honoured = "MMA kernels need 32-lane warps";
    }
    if (plant && !std::strcmp(plant, "kernel")) kern = XTE_GEMM_KERNEL_SIMT; /* planted */
  } else if (requested == -2) {
    not_honoured = "XTE_CUDA_GEMM_KERNEL: not simt, dmma4, dmma16, imma or auto";
  }
  if (a->mode == 1) { /* XTE_GEMM_FAST */
    xte_lt_call call;
    for (int64_t i = 0; i < a->num_problems && !fast_why; i++)
      fast_why = xte_lt_plan(a, 9, i, &call);
    if (!fast_why && a->num_problems <= 0) fast_why = "no problem";
    if (!fast_why && plant && !std::strcmp(plant, "fast")) fast_why = "planted fallback";
    if (!fast_why && plant && !std::strcmp(plant, "fast-bias") && a->bias)
      fast_why = "planted fallback of a call with a bias";
    if (!fast_why) {
      host_gemm_rt rt{g_svc, kern}; /* the kernel EXACT would run (coverage) */
      const xte_status st = a->bias ? fast_with_bias(rt, a) : xte_gemm_run(rt, a);
      if (st == XTE_SUCCESS)
        xte_gpu_report_lt("simt-stand-in", 130000, (long long)a->num_problems, a->bias != NULL);
      return st;
    }
  }
  host_gemm_rt rt{g_svc, kern};
  const xte_status st = xte_gemm_run(rt, a);
  if (st == XTE_SUCCESS)
    xte_gpu_report_exact(a->mode == 1, requested, kern, rt.ran, not_honoured, fast_why);
  return st;
}
const xte_gemm_ops g_gemm_ops = {gemm};

/* attention.cu: attn_cuda_rt, the runtime policy of attention_kernels.cuh's driver */
struct host_attn_rt {
  const xte_core_services *svc;
  xte_status alloc(void **p, size_t bytes) { return ::alloc(0, bytes ? bytes : 1, p); }
  void release(void *p) { std::free(p); }
  xte_status read(void *host, const void *dev, size_t bytes) {
    if (bytes) std::memcpy(host, dev, bytes);
    return XTE_SUCCESS;
  }
  template <class... P, class... A>
  xte_status launch(int64_t grid, void (*k)(P...), A... args) {
    SIMT_TRY(simt::launch(dim3((unsigned)grid), dim3(XTE_ATTN_NT), 0, k, args...),
             "attention kernel");
    return XTE_SUCCESS;
  }
  xte_status finish() { return XTE_SUCCESS; }
};

/* attention.cu: gpu_attn_fwd, gpu_attn_bwd. SIMT_WARP_SIZE (32, 64, 128): the runner's warp
 * size for the launches (test_simt_attention runs every case at 32 and 128). */
void attn_warp_size() {
  if (const char *w = std::getenv("SIMT_WARP_SIZE")) simt::set_warp_size(std::atoi(w));
}
xte_status attn_fwd(const xte_attn_args *a, void *) {
  attn_warp_size();
  host_attn_rt rt{g_svc};
  return xte_attn_fwd_run(rt, a);
}
xte_status attn_bwd(const xte_attn_args *a, void *) {
  attn_warp_size();
  host_attn_rt rt{g_svc};
  return xte_attn_bwd_run(rt, a);
}
const xte_attention_ops g_attn_ops = {attn_fwd, attn_bwd};

/* ep_nccl.cu: ep_blocks (the list staged into "device" memory, one launch of the block-move
 * kernel) and cuda_ep_rt, the runtime policy of the NCCL transport of cuda/ep_ccl.h, here over
 * host memory; the library is the one XTE_NCCL_LIBRARY names (tests/simt/fake_nccl.c). */
xte_status ep_blocks(void *, const xte_ep_block *b, int64_t n) {
  void *dev = nullptr;
  xte_status st;
  if (n <= 0) return XTE_SUCCESS;
  if ((st = alloc(0, (size_t)n * sizeof *b, &dev)) != XTE_SUCCESS) return st;
  std::memcpy(dev, b, (size_t)n * sizeof *b);
  const auto r = simt::launch(dim3(xte_ep_grid(n)), dim3(XTE_EP_NT), 0, xte_ep_blocks_kernel,
                              (const xte_ep_block *)dev, (long long)n);
  std::free(dev);
  if (r != simt::ok) return launch_failed("EP block move kernel");
  return XTE_SUCCESS;
}
struct host_ep_rt {
  static const xte_core_services *svc() { return g_svc; }
  static xte_status dalloc(void *, size_t bytes, void **p) { return alloc(0, bytes, p); }
  static void dfree(void *, void *p) { std::free(p); }
  static xte_status copy(void *, void *dst, const void *src, size_t n, int) {
    if (n) std::memcpy(dst, src, n);
    return XTE_SUCCESS;
  }
  static xte_status sync(void *) { return XTE_SUCCESS; }
  static xte_status blocks(void *h, const xte_ep_block *b, int64_t n) { return ep_blocks(h, b, n); }
  static void *native(void *h) { return h; }
  static int device(void *) { return 0; }
};
xte_status ep_transport_create(const void *comm, void *stream, xte_ep_transport *t) {
  return xte_ep_ccl<host_ep_rt>::create(comm, stream, t);
}
const xte_ep_ops g_ep_ops = {XTE_CCL_NAME, ep_transport_create, ep_blocks};

xte_backend_ops g_ops;
std::once_flag g_once;

void fill_ops() {
  std::memset(&g_ops, 0, sizeof g_ops);
  g_ops.abi = XTE_PLUGIN_ABI;
  g_ops.name = "cuda";
  g_ops.init = init;
  g_ops.device_count = device_count;
  g_ops.device_info = device_info;
  g_ops.stream_create = stream_create;
  g_ops.stream_destroy = stream_destroy;
  g_ops.synchronize = synchronize;
  g_ops.alloc = alloc;
  g_ops.dealloc = dealloc;
  g_ops.copy = copy;
  g_ops.fill = fill;
  g_ops.quantize = quantize;
  g_ops.dequantize = dequantize;
  g_ops.cast = cast;
  g_ops.moe = &g_moe_ops;
  g_ops.attention = &g_attn_ops;
  g_ops.gemm = &g_gemm_ops;
  g_ops.ep = &g_ep_ops;
}

}  // namespace

/* test_simt_gemm: launches of the SIMT (dmma = 0) or the DMMA GEMM kernel, m8n8k4 (dmma = 1) or
 * m16n8k16 (dmma = 2), or of the int8 digit kernel (dmma = 3), so far */
extern "C" __attribute__((visibility("default"))) long simt_gemm_launches(int dmma) {
  return g_gemm_launches[dmma >= 0 && dmma <= 3 ? dmma : 0].load();
}

extern "C" __attribute__((visibility("default"))) const xte_backend_ops *xte_plugin_get_ops(
    int abi) {
  if (abi != XTE_PLUGIN_ABI) return nullptr;
  std::call_once(g_once, fill_ops);
  return &g_ops;
}
