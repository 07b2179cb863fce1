/* GPU exact GEMM (XTE_GEMM_EXACT, stage 1: SIMT fp64; XTE_GEMM_FAST runs it too): dense and
 * grouped (contiguous, masked, K-grouped). The kernels and the host steps live in
 * gemm_kernels.cuh, written against a runtime policy; this file gives it the CUDA runtime.
 * tests/simt/simt_plugin.cpp gives the same driver the host SIMT runner: keep the two policies in
 * step (same operations, same order). */
#include <stdlib.h>

#include "cuda/gemm_kernels.cuh"
#include "cuda/xte_gpu.h"

namespace {

/* The CUDA runtime policy of gemm_kernels.cuh's driver, on one stream. */
struct cuda_gemm_rt {
  cudaStream_t st;
  const xte_core_services *svc;
  cudaError_t prior; /* the application's pending error, left alone */

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

}  // namespace

static xte_status gpu_gemm(const xte_gemm_args *a, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  cuda_gemm_rt rt{h->stream, xte_gpu_services(), cudaPeekAtLastError()};
  return xte_gemm_run(rt, a);
}

const xte_gemm_ops xte_gpu_gemm_ops = {gpu_gemm};
