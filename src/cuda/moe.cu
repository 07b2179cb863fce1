/* GPU MoE operators: token movement (permute / unpermute and their backwards, sort chunks
 * (+ backward), the dispatch layout; moe_kernels.cuh), the router, aux scores and aux loss
 * (moe_router_kernels.cuh), SwiGLU and its fused quantize forms (moe_swiglu_kernels.cuh). The
 * kernels and the host steps
 * (validation kernels, the read-back of their verdict, then the write kernels) live in
 * moe_kernels.cuh, written against a runtime policy; this file gives it the CUDA runtime.
 * tests/simt/simt_plugin.cpp gives the same driver the host SIMT runner: keep the two policies in
 * step (same operations, same order). */
#include "cuda/moe_kernels.cuh"
#include "cuda/moe_router_kernels.cuh"
#include "cuda/moe_swiglu_kernels.cuh"
#include "cuda/xte_gpu.h"

namespace {

/* The CUDA runtime policy of moe_kernels.cuh's driver, on one stream handle, whose lock the
 * operation holds from its workspace's allocation until its last kernel is enqueued. The
 * workspace is the handle's cached one (xte_gpu_workspace): no allocation, no free and no
 * synchronization in steady state; the only waits left are the reads of the validation verdicts
 * (the host decides from them, before any output byte is written). */
struct cuda_rt {
  xte_gpu_stream *h;
  cudaStream_t st;
  const xte_core_services *svc;
  cudaError_t prior;      /* the application's pending error, left alone */
  void *cached = nullptr; /* the handle's workspace, handed out (once per operation) */

  xte_status alloc(void **p, size_t bytes) {
    if (!cached) { /* every driver asks once */
      XTE_GPU_PASS(xte_gpu_workspace(h, bytes, p));
      cached = *p;
      return XTE_SUCCESS;
    }
    /* a second workspace in one operation: an allocation of its own */
    return xte_gpu_check(cudaMalloc(p, bytes ? bytes : 1), "cudaMalloc (MoE workspace)");
  }
  void release(void *p) {
    if (!p) return;
    if (p == cached) { /* stays with the handle; the stream orders its next use */
      cached = nullptr;
      return;
    }
    (void)cudaStreamSynchronize(st); /* kernels still read it */
    (void)cudaFree(p);
  }
  xte_status memset(void *p, int v, size_t bytes) {
    if (!bytes) return XTE_SUCCESS;
    return xte_gpu_check(cudaMemsetAsync(p, v, bytes, st), "cudaMemsetAsync (MoE workspace)");
  }
  /* A verdict of the validation kernels: their launches checked first (a launch that failed
   * would leave the verdict at "no error"). */
  xte_status read(void *host, const void *dev, size_t bytes) {
    XTE_GPU_PASS(xte_gpu_launch_check(prior, "MoE validation kernel launch"));
    XTE_GPU_TRY(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, st),
                "cudaMemcpyAsync (MoE verdict)");
    return xte_gpu_check(cudaStreamSynchronize(st), "cudaStreamSynchronize (MoE verdict)");
  }
  template <class... P, class... A>
  xte_status launch(int64_t grid, void (*k)(P...), A... args) {
    k<<<(unsigned)grid, XTE_MOE_NT, 0, st>>>(args...);
    return XTE_SUCCESS;
  }
  xte_status finish() { return xte_gpu_launch_check(prior, "MoE kernel launch"); }
};

}  // namespace

static xte_status gpu_permute(const xte_permute_args *a, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  xte_gpu_lock g(h);
  cuda_rt rt{h, h->stream, xte_gpu_services(), cudaPeekAtLastError()};
  return xte_moe_permute_run(rt, a);
}

static xte_status gpu_unpermute(const xte_unpermute_args *a, int which, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  xte_gpu_lock g(h);
  cuda_rt rt{h, h->stream, xte_gpu_services(), cudaPeekAtLastError()};
  return xte_moe_unpermute_run(rt, a, which);
}

static xte_status gpu_sort_chunks(const xte_sort_chunks_args *a, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  xte_gpu_lock g(h);
  cuda_rt rt{h, h->stream, xte_gpu_services(), cudaPeekAtLastError()};
  return xte_moe_sort_chunks_run(rt, a);
}

static xte_status gpu_dispatch_layout(const xte_dispatch_args *a, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  xte_gpu_lock g(h);
  cuda_rt rt{h, h->stream, xte_gpu_services(), cudaPeekAtLastError()};
  return xte_moe_dispatch_run(rt, a);
}

static xte_status gpu_router_forward(const xte_router_args *a, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  xte_gpu_lock g(h);
  cuda_rt rt{h, h->stream, xte_gpu_services(), cudaPeekAtLastError()};
  return xte_rt_forward_run(rt, a);
}

static xte_status gpu_router_backward(const xte_router_bwd_args *a, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  xte_gpu_lock g(h);
  cuda_rt rt{h, h->stream, xte_gpu_services(), cudaPeekAtLastError()};
  return xte_rt_backward_run(rt, a);
}

/* aux_out is device memory (one fp32), written by the last kernel, stream-ordered. */
static xte_status gpu_aux_loss(const xte_aux_loss_args *a, int backward, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  xte_gpu_lock g(h);
  cuda_rt rt{h, h->stream, xte_gpu_services(), cudaPeekAtLastError()};
  return xte_aux_loss_run(rt, a, backward);
}

static xte_status gpu_swiglu(const xte_swiglu_args *a, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  xte_gpu_lock g(h);
  cuda_rt rt{h, h->stream, xte_gpu_services(), cudaPeekAtLastError()};
  return xte_swiglu_run(rt, a);
}

/* The operations not provided are NULL (the core reports XTE_ERROR_UNSUPPORTED). */
const xte_moe_ops xte_gpu_moe_ops = {
    gpu_router_forward,  /* router_forward */
    gpu_router_backward, /* router_backward */
    gpu_aux_loss,        /* aux_loss */
    gpu_permute,         /* permute */
    gpu_unpermute,       /* unpermute */
    gpu_sort_chunks,     /* sort_chunks */
    gpu_dispatch_layout, /* dispatch_layout */
    gpu_swiglu,          /* swiglu */
};
