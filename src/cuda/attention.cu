/* GPU exact attention: the forward and the two-pass backward of docs/numerics.md section 7. The
 * kernels and the host steps (the cu_seqlens check kernel and the read-back of its verdict, the
 * padding, the passes) live in attention_kernels.cuh, written against a runtime policy; this
 * file gives it the CUDA runtime. tests/simt/simt_plugin.cpp gives the same driver the host SIMT
 * runner: keep the two policies in step (same operations, same order). */
#include "cuda/attention_kernels.cuh"
#include "cuda/xte_gpu.h"

namespace {

/* The CUDA runtime policy of attention_kernels.cuh's driver, on one stream. */
struct attn_cuda_rt {
  cudaStream_t st;
  const xte_core_services *svc;
  cudaError_t prior; /* the application's pending error, left alone */

  xte_status alloc(void **p, size_t bytes) {
    return xte_gpu_check(cudaMalloc(p, bytes), "cudaMalloc (attention workspace)");
  }
  void release(void *p) {
    if (!p) return;
    (void)cudaStreamSynchronize(st); /* kernels still read it */
    (void)cudaFree(p);
  }
  /* The verdict of the cu_seqlens check: its launch checked first. */
  xte_status read(void *host, const void *dev, size_t bytes) {
    XTE_GPU_PASS(xte_gpu_launch_check(prior, "attention check kernel launch"));
    XTE_GPU_TRY(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, st),
                "cudaMemcpyAsync (attention verdict)");
    return xte_gpu_check(cudaStreamSynchronize(st), "cudaStreamSynchronize (attention verdict)");
  }
  template <class... P, class... A>
  xte_status launch(int64_t grid, void (*k)(P...), A... args) {
    k<<<(unsigned)grid, XTE_ATTN_NT, 0, st>>>(args...);
    return XTE_SUCCESS;
  }
  xte_status finish() { return xte_gpu_launch_check(prior, "attention kernel launch"); }
};

}  // namespace

static xte_status gpu_attn_fwd(const xte_attn_args *a, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  attn_cuda_rt rt{h->stream, xte_gpu_services(), cudaPeekAtLastError()};
  return xte_attn_fwd_run(rt, a);
}

static xte_status gpu_attn_bwd(const xte_attn_args *a, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  attn_cuda_rt rt{h->stream, xte_gpu_services(), cudaPeekAtLastError()};
  return xte_attn_bwd_run(rt, a);
}

extern const struct xte_attention_ops xte_gpu_attention_ops;
const struct xte_attention_ops xte_gpu_attention_ops = {gpu_attn_fwd, gpu_attn_bwd};
