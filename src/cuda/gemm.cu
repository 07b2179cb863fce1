/* GPU exact GEMM (XTE_GEMM_EXACT; XTE_GEMM_FAST runs it too): dense and grouped (contiguous,
 * masked, K-grouped). Stage 2, the fp64 tensor-core kernel (gemm_mma_kernels.cuh): with
 * mma m16n8k16 on devices of compute capability >= 9.0 whose code for it was built for sm_90 or
 * later, with mma m8n8k4 on those of >= 8.0 built for sm_80 or later; stage 1, the SIMT fp64
 * kernel, elsewhere and on MUSA. Stage 3, the int8 digit kernel (gemm_imma_kernels.cuh, e4m3 x
 * e4m3 only, sm_80+), runs only on request for now. All give the same bytes.
 * XTE_CUDA_GEMM_KERNEL=simt / dmma4 / dmma16 / imma forces one (read at every call: the device
 * script runs each); every call reports the kernel that really ran (src/cuda/xte_gpu_report.h),
 * and why a forced one could not. The kernels and the host
 * steps live in gemm_kernels.cuh, written against a runtime policy; this file gives it the CUDA
 * runtime. tests/simt/simt_plugin.cpp gives the same driver the host SIMT runner: keep the two
 * policies in step (same operations, same order). */
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "cuda/gemm_kernels.cuh"
#include "cuda/xte_fast.h" /* XTE_GEMM_FAST through cuBLASLt (cublaslt.cu) */
#include "cuda/xte_gpu.h"
#include "cuda/xte_gpu_report.h"

namespace {

/* The CUDA runtime policy of gemm_kernels.cuh's driver, on one stream. */
struct cuda_gemm_rt {
  cudaStream_t st;
  const xte_core_services *svc;
  cudaError_t prior; /* the application's pending error, left alone */
  int dmma;          /* the kernel: XTE_GEMM_KERNEL_SIMT / DMMA4 / DMMA16 / IMMA */
  unsigned ran = 0;  /* bit k: kernel k was launched (xte_gemm_launch_split) */

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
/* The stage 2 and 3 kernels device dev runs: bit 0 the m8n8k4 one (compute capability >= 8.0 and
 * its code for the device, SASS or PTX JIT-compiled, built for sm_80 or later), bit 1 the
 * m16n8k16 one (compute capability >= 9.0 and its code built for sm_90 or later), bit 2 the int8
 * digit kernel (as bit 0, its own code); a build for older architectures has only trapping stubs
 * there. Cached per device (the bits + 1; 0 unknown); a failing query means none (its error
 * consumed unless it was the application's). */
#define XTE_GEMM_MAX_DEVICES 64
std::atomic<int> g_dmma_ok[XTE_GEMM_MAX_DEVICES];

int dmma_query(int dev, cudaError_t prior) {
  int major = 0, ok = 0;
  cudaFuncAttributes fa;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess && major >= 8) {
    e = cudaFuncGetAttributes(&fa, xte_gemm_dmma_kernel<0, 4>);
    if (e == cudaSuccess && fa.binaryVersion >= 80) ok |= 1;
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, xte_gemm_imma_kernel);
    if (e == cudaSuccess && fa.binaryVersion >= 80) ok |= 4;
  }
  if (e == cudaSuccess && major >= 9) {
    e = cudaFuncGetAttributes(&fa, xte_gemm_dmma_kernel<0, 16>);
    if (e == cudaSuccess && fa.binaryVersion >= 90) ok |= 2;
  }
  if (e != cudaSuccess) {
    if (e != prior && cudaPeekAtLastError() == e) (void)cudaGetLastError();
    return 0;
  }
  return ok;
}

/* The kernel of this call (XTE_GEMM_KERNEL_*): m16n8k16 where the device runs it, else m8n8k4
 * where it runs that, else SIMT. requested (XTE_CUDA_GEMM_KERNEL: xte_gemm_kernel_requested)
 * forces one (read at every call: the device script runs each); a forced kernel the device
 * cannot run, or imma with an operand that is not e4m3, gives the automatic choice and *why says
 * so (the report carries it: a forced kernel that did not run is visible, never silent). The int8
 * digit kernel is not an automatic choice yet (never timed on a GPU). */
int dmma_selected(int dev, cudaError_t prior, const xte_gemm_args *a, int requested,
                  const char **why) {
  int ok, autok;
  *why = NULL;
  if (requested == XTE_GEMM_KERNEL_SIMT) return XTE_GEMM_KERNEL_SIMT;
  if (dev < 0 || dev >= XTE_GEMM_MAX_DEVICES) {
    ok = dmma_query(dev, prior);
  } else {
    ok = g_dmma_ok[dev].load(std::memory_order_relaxed) - 1;
    if (ok < 0) {
      ok = dmma_query(dev, prior);
      g_dmma_ok[dev].store(ok + 1, std::memory_order_relaxed);
    }
  }
  autok =
      (ok & 2) ? XTE_GEMM_KERNEL_DMMA16 : ((ok & 1) ? XTE_GEMM_KERNEL_DMMA4 : XTE_GEMM_KERNEL_SIMT);
  if (requested == XTE_GEMM_KERNEL_DMMA4) {
    if (ok & 1) return XTE_GEMM_KERNEL_DMMA4;
    *why = "dmma4: no m8n8k4 code for this device (compute capability < 8.0 or not built)";
  } else if (requested == XTE_GEMM_KERNEL_DMMA16) {
    if (ok & 2) return XTE_GEMM_KERNEL_DMMA16;
    *why = "dmma16: no m16n8k16 code for this device (compute capability < 9.0 or not built)";
  } else if (requested == XTE_GEMM_KERNEL_IMMA) {
    if ((ok & 4) && a->a.fmt == XTE_FP8_E4M3 && a->b.fmt == XTE_FP8_E4M3)
      return XTE_GEMM_KERNEL_IMMA;
    *why = (ok & 4) ? "imma: an operand is e5m2 (the int8 digit kernel takes e4m3 x e4m3)"
                    : "imma: no int8 digit code for this device (compute capability < 8.0)";
  } else if (requested == -2) {
    *why = "XTE_CUDA_GEMM_KERNEL: not simt, dmma4, dmma16, imma or auto";
  }
  return autok;
}
#else
int dmma_selected(int, cudaError_t, const xte_gemm_args *, int requested, const char **why) {
  *why = requested > XTE_GEMM_KERNEL_SIMT || requested == -2
             ? "only the SIMT kernel is built for this runtime"
             : NULL;
  return XTE_GEMM_KERNEL_SIMT;
}
#endif

}  // namespace

void xte_gpu_gemm_bias_epilogue(const xte_gemm_args *a, const xte_gemm_problem *p, const float *src,
                                int64_t ld, cudaStream_t st) {
  const int64_t grid = p->m < XTE_GEMM_GRID_CAP ? p->m : XTE_GEMM_GRID_CAP;
  if (grid > 0 && p->n > 0)
    xte_gemm_bias_epilogue<<<(unsigned)grid, XTE_GEMM_NT, 0, st>>>(*a, *p, src, ld);
}

static xte_status gpu_gemm(const xte_gemm_args *a, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  xte_status fast_st;
  const char *fast_why = NULL, *not_honoured;
  /* FAST: cuBLASLt where it applies (it reports the call itself); else fast_why says why not */
  if (xte_gpu_gemm_fast(a, h, &fast_st, &fast_why)) return fast_st;
  const cudaError_t prior = cudaPeekAtLastError();
  const int requested = xte_gemm_kernel_requested(getenv("XTE_CUDA_GEMM_KERNEL"));
  const int chosen = dmma_selected(h->device, prior, a, requested, &not_honoured);
  cuda_gemm_rt rt{h->stream, xte_gpu_services(), prior, chosen};
  const xte_status st = xte_gemm_run(rt, a);
  if (st == XTE_SUCCESS)
    xte_gpu_report_exact(a->mode == 1, requested, chosen, rt.ran, not_honoured, fast_why);
  return st;
}

const xte_gemm_ops xte_gpu_gemm_ops = {gpu_gemm};
