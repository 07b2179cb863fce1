/* Expert parallelism in the CUDA plugin (src/xte_ep_ops.h): the NCCL transport of src/ep/transport/ccl.h
 * (libnccl.so.2 loaded with dlopen; the MUSA build of this file is the MCCL one, its names from
 * src/musa/xte_musa_compat.h) and the device block move of src/cuda/ep_kernels.cuh, both on the
 * CUDA runtime. */
#include <stdlib.h>
#include <string.h>

#include "cuda/xte_gpu.h"
#include "ep/transport/ccl.h"
#include "cuda/ep_kernels.cuh"

namespace {

/* The block move: the list staged into the handle's cached workspace (one copy), one launch. */
xte_status ep_blocks(void *handle, const xte_ep_block *b, int64_t n) {
  xte_gpu_stream *h;
  void *ws = nullptr;
  cudaError_t prior;
  XTE_GPU_ENTER(handle, h);
  if (n <= 0) return XTE_SUCCESS;
  if ((uint64_t)n > SIZE_MAX / sizeof *b)
    return xte_gpu_services()->set_error(XTE_ERROR_OUT_OF_MEMORY, "EP block list size overflows");
  xte_gpu_lock g(h);
  XTE_GPU_PASS(xte_gpu_workspace(h, (size_t)n * sizeof *b, &ws));
  XTE_GPU_TRY(cudaMemcpyAsync(ws, b, (size_t)n * sizeof *b, cudaMemcpyHostToDevice, h->stream),
              "cudaMemcpyAsync (EP block list)");
  prior = cudaPeekAtLastError();
  xte_ep_blocks_kernel<<<xte_ep_grid(n), XTE_EP_NT, 0, h->stream>>>((const xte_ep_block *)ws,
                                                                    (long long)n);
  return xte_gpu_launch_check(prior, "EP block move kernel launch");
}

struct cuda_ep_rt {
  static const xte_core_services *svc() { return xte_gpu_services(); }
  static xte_status dalloc(void *handle, size_t bytes, void **p) {
    xte_gpu_stream *h;
    XTE_GPU_ENTER(handle, h);
    *p = nullptr;
    if (!bytes) return XTE_SUCCESS;
    return xte_gpu_check(cudaMalloc(p, bytes), "cudaMalloc (EP staging)");
  }
  static void dfree(void *handle, void *p) {
    xte_gpu_device_scope scope;
    xte_gpu_stream *h;
    if (!p || xte_gpu_resolve(handle, &h, &scope) != XTE_SUCCESS) return;
    (void)cudaFree(p);
  }
  static xte_status copy(void *handle, void *dst, const void *src, size_t n, int kind) {
    xte_gpu_stream *h;
    XTE_GPU_ENTER(handle, h);
    if (!n) return XTE_SUCCESS;
    return xte_gpu_check(
        cudaMemcpyAsync(dst, src, n, kind == 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                        h->stream),
        "cudaMemcpyAsync (EP staging)");
  }
  static xte_status sync(void *handle) {
    xte_gpu_stream *h;
    XTE_GPU_ENTER(handle, h);
    return xte_gpu_check(cudaStreamSynchronize(h->stream), "cudaStreamSynchronize (EP)");
  }
  static xte_status blocks(void *handle, const xte_ep_block *b, int64_t n) {
    return ep_blocks(handle, b, n);
  }
  static void *native(void *handle) {
    xte_gpu_device_scope scope;
    xte_gpu_stream *h;
    if (xte_gpu_resolve(handle, &h, &scope) != XTE_SUCCESS) return nullptr;
    return (void *)h->stream;
  }
  static int device(void *handle) { return handle ? ((xte_gpu_stream *)handle)->device : 0; }
};

xte_status ep_transport_create(const void *comm, void *stream, xte_ep_transport *t) {
  return xte_ep_ccl<cuda_ep_rt>::create(comm, stream, t);
}

}  // namespace

extern const xte_ep_ops xte_gpu_ep_ops;
const xte_ep_ops xte_gpu_ep_ops = {XTE_CCL_NAME, ep_transport_create, ep_blocks};
