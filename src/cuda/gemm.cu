/* GPU exact GEMM (XTE_GEMM_EXACT; XTE_GEMM_FAST runs it too): dense and grouped (contiguous,
 * masked, K-grouped). Stage 2, the fp64 tensor-core kernel (gemm_mma_kernels.cuh), on devices of
 * compute capability >= 8.0 whose code for it was built for sm_80 or later; stage 1, the SIMT fp64
 * kernel, elsewhere and on MUSA. Both give the same bytes. XTE_CUDA_GEMM_KERNEL=simt forces the
 * SIMT kernel (read at every call: the device script times both). The kernels and the host steps
 * live in gemm_kernels.cuh, written against a runtime policy; this file gives it the CUDA runtime.
 * tests/simt/simt_plugin.cpp gives the same driver the host SIMT runner: keep the two policies in
 * step (same operations, same order). */
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "cuda/gemm_kernels.cuh"
#include "cuda/xte_gpu.h"

namespace {

/* The CUDA runtime policy of gemm_kernels.cuh's driver, on one stream. */
struct cuda_gemm_rt {
  cudaStream_t st;
  const xte_core_services *svc;
  cudaError_t prior; /* the application's pending error, left alone */
  bool dmma;         /* launch the DMMA kernel (stage 2) */

  xte_status alloc(void **p, size_t bytes) {
    return xte_gpu_check(cudaMalloc(p, bytes), "cudaMalloc (GEMM workspace)");
  }
  void release(void *p) {
    if (!p) return;
    (void)cudaStreamSynchronize(st); /* kernels still read it */
    (void)cudaFree(p);
  }
  /* the plugin does not link libxte (no xte_aligned_alloc): the C allocator, as backend.cu */
  void *host_alloc(size_t bytes) { return malloc(bytes); }
  void host_free(void *p) { free(p); }
  xte_status upload(void *dev, const void *host, size_t bytes) {
    /* from pageable memory: returns once the source has been staged, so the caller may free it */
    return xte_gpu_check(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, st),
                         "cudaMemcpyAsync (GEMM problem list)");
  }
  xte_status memset(void *p, int v, size_t bytes) {
    if (!bytes) return XTE_SUCCESS;
    return xte_gpu_check(cudaMemsetAsync(p, v, bytes, st), "cudaMemsetAsync (GEMM workspace)");
  }
  /* a verdict of the validation kernel: its launch checked first */
  xte_status read(void *host, const void *dev, size_t bytes) {
    XTE_GPU_PASS(xte_gpu_launch_check(prior, "GEMM validation kernel launch"));
    XTE_GPU_TRY(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, st),
                "cudaMemcpyAsync (GEMM verdict)");
    return xte_gpu_check(cudaStreamSynchronize(st), "cudaStreamSynchronize (GEMM verdict)");
  }
  template <class... P, class... A>
  xte_status launch(int64_t grid, void (*k)(P...), A... args) {
    k<<<(unsigned)grid, XTE_GEMM_NT, 0, st>>>(args...);
    return XTE_SUCCESS;
  }
  xte_status finish() { return xte_gpu_launch_check(prior, "GEMM kernel launch"); }
};

#if XTE_GEMM_DMMA
/* Whether device dev runs the DMMA kernel: compute capability >= 8.0 and the kernel's code for it
 * (SASS or PTX JIT-compiled) built for sm_80 or later (a build for older architectures only has
 * a trapping stub there). Cached per device; a failing query means no (its error consumed unless
 * it was the application's). */
#define XTE_GEMM_MAX_DEVICES 64
std::atomic<int> g_dmma_ok[XTE_GEMM_MAX_DEVICES]; /* 0 unknown, 1 no, 2 yes */

bool dmma_query(int dev, cudaError_t prior) {
  int major = 0;
  cudaFuncAttributes fa;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess && major >= 8) e = cudaFuncGetAttributes(&fa, xte_gemm_dmma_kernel<0>);
  if (e != cudaSuccess) {
    if (e != prior && cudaPeekAtLastError() == e) (void)cudaGetLastError();
    return false;
  }
  return major >= 8 && fa.binaryVersion >= 80;
}

bool dmma_selected(int dev, cudaError_t prior) {
  const char *env = getenv("XTE_CUDA_GEMM_KERNEL");
  if (env && strcmp(env, "simt") == 0) return false;
  if (dev < 0 || dev >= XTE_GEMM_MAX_DEVICES) return dmma_query(dev, prior);
  int v = g_dmma_ok[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    v = dmma_query(dev, prior) ? 2 : 1;
    g_dmma_ok[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}
#else
bool dmma_selected(int, cudaError_t) {
  return false;
}
#endif

}  // namespace

static xte_status gpu_gemm(const xte_gemm_args *a, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  const cudaError_t prior = cudaPeekAtLastError();
  cuda_gemm_rt rt{h->stream, xte_gpu_services(), prior, dmma_selected(h->device, prior)};
  return xte_gemm_run(rt, a);
}

const xte_gemm_ops xte_gpu_gemm_ops = {gpu_gemm};
