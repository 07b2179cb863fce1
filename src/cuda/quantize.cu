/* GPU quantize / dequantize / cast: the launches. The kernels live in quantize_kernels.cuh (no
 * runtime calls there), so tests/simt/ runs the same kernel text on the host and compares its
 * bytes with the CPU backend; tests/simt/simt_plugin.cpp restates the launches below (with the
 * launch geometry helpers of the header): keep the two in step. */
#include <limits.h>

#include "cuda/quantize_kernels.cuh"
#include "cuda/xte_gpu.h"

static xte_status zero_scales(const xte_scale_map *m, cudaStream_t st) {
  const size_t n = xte_q_scale_bytes(m);
  if (!n) return XTE_SUCCESS;
  return xte_gpu_check(cudaMemsetAsync(m->data, 0, n, st), "cudaMemsetAsync (scales)");
}

xte_status xte_gpu_workspace(xte_gpu_stream *h, size_t bytes, void **out) {
  const size_t cap = h->scratch_bytes ? h->scratch_bytes : XTE_GPU_SCRATCH_FLOATS * sizeof(float);
  const size_t need = xte_ws_need(bytes);
  if (!need) return xte_gpu_check(cudaErrorMemoryAllocation, "workspace size");
  if (need > cap) {
    const size_t grow = xte_ws_grow(cap, need);
    void *p = NULL;
    cudaError_t e;
    if (grow < need) return xte_gpu_check(cudaErrorMemoryAllocation, "workspace size");
    XTE_GPU_TRY(cudaMalloc(&p, grow), "cudaMalloc (workspace)");
    /* kernels enqueued before on this stream may still use the old buffer */
    if ((e = cudaStreamSynchronize(h->stream)) != cudaSuccess) {
      (void)cudaFree(p);
      return xte_gpu_check(e, "cudaStreamSynchronize (workspace)");
    }
    (void)cudaFree(h->scratch);
    h->scratch = (float *)p;
    h->scratch_bytes = grow;
  }
  *out = (char *)h->scratch + XTE_WS_BASE;
  return XTE_SUCCESS;
}

/* The enqueue of one quantize; the caller holds the handle's lock (the scratch is the handle's). */
static xte_status quantize_locked(const xte_quant_args *a, xte_gpu_stream *h) {
  const cudaStream_t st = h->stream;
  const int64_t ntr = xte_q_tiles(a->M), ntc = xte_q_tiles(a->K);
  const int empty = a->M <= 0 || a->K <= 0;
  cudaError_t prior;
  if (!empty && ntr * ntc > INT_MAX)
    return xte_gpu_check(cudaErrorInvalidValue, "quantize: more than 2^31 tiles");
  prior = cudaPeekAtLastError();
  XTE_GPU_PASS(zero_scales(&a->row_s, st));
  XTE_GPU_PASS(zero_scales(&a->col_s, st));
  if (a->mode == XTE_SCALING_PER_TENSOR) {
    if (a->recipe == XTE_RECIPE_TE_CURRENT) {
      XTE_GPU_TRY(cudaMemsetAsync(h->scratch, 0, sizeof(float), st), "cudaMemsetAsync (amax)");
      if (!empty)
        amax_kernel<<<xte_q_amax_grid(a->M, a->K, a->in_kind), NT, 0, st>>>(*a,
                                                                            (unsigned *)h->scratch);
    }
    tensor_scale_kernel<<<1, 1, 0, st>>>(*a, h->scratch);
  }
  if (a->amax_out)
    XTE_GPU_TRY(cudaMemsetAsync(a->amax_out, 0, sizeof(float), st), "cudaMemsetAsync (amax)");
  if (!empty)
    quant_tiles<<<(int)(ntr * ntc), NT, 0, st>>>(*a, h->scratch + 1, (unsigned *)a->amax_out, ntc);
  return xte_gpu_launch_check(prior, "quantize kernel launch");
}

xte_status xte_gpu_quantize(const xte_quant_args *a, void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  /* Two host threads on one handle (the NULL stream's is process-wide) would otherwise mix their
   * amax / scale scratch: the whole enqueue goes in under the handle's lock, and the stream runs
   * it in that order. */
  xte_gpu_lock g(h);
  return quantize_locked(a, h);
}

xte_status xte_gpu_dequantize(const xte_dequant_args *a, void *handle) {
  xte_gpu_stream *h;
  cudaError_t prior;
  XTE_GPU_ENTER(handle, h);
  if (a->R <= 0 || a->C <= 0) return XTE_SUCCESS;
  prior = cudaPeekAtLastError();
  dequant_kernel<<<xte_q_grid_for(a->R * a->C), NT, 0, h->stream>>>(*a);
  return xte_gpu_launch_check(prior, "dequantize kernel launch");
}

xte_status xte_gpu_cast(const xte_cast_args *a, void *handle) {
  xte_gpu_stream *h;
  cudaError_t prior;
  XTE_GPU_ENTER(handle, h);
  if (a->n <= 0) return XTE_SUCCESS;
  prior = cudaPeekAtLastError();
  cast_kernel<<<xte_q_grid_for(a->n), NT, 0, h->stream>>>(*a);
  return xte_gpu_launch_check(prior, "cast kernel launch");
}
