/* Internals shared by the sources of the CUDA (and MUSA) plugin. Not installed. */
#ifndef XTE_GPU_H
#define XTE_GPU_H

#include "cuda/xte_gpu_runtime.h"
#include "xte_backend.h"

/* A plugin stream handle: the native stream, its device and a little device scratch memory
 * (the per-tensor amax and scale of a quantize). */
typedef struct xte_gpu_stream {
  cudaStream_t stream;
  int device;
  int owned;      /* 1: created here, destroyed with the handle */
  float *scratch; /* XTE_GPU_SCRATCH_FLOATS floats of device memory */
} xte_gpu_stream;

#define XTE_GPU_SCRATCH_FLOATS 4

/* The handle to run on: handle itself, or for NULL (the default stream of device 0) a
 * process-wide one. Makes its device current and its scratch allocated. */
xte_status xte_gpu_resolve(void *handle, xte_gpu_stream **out);

/* XTE_SUCCESS for cudaSuccess; else records "what: <runtime message>" and returns
 * XTE_ERROR_DEVICE (XTE_ERROR_OUT_OF_MEMORY for an allocation failure). */
xte_status xte_gpu_check(cudaError_t e, const char *what);

#define XTE_GPU_TRY(call, what)                            \
  do {                                                     \
    xte_status xte_gpu_s_ = xte_gpu_check((call), (what)); \
    if (xte_gpu_s_ != XTE_SUCCESS) return xte_gpu_s_;      \
  } while (0)

#define XTE_GPU_PASS(expr)                            \
  do {                                                \
    xte_status xte_gpu_s_ = (expr);                   \
    if (xte_gpu_s_ != XTE_SUCCESS) return xte_gpu_s_; \
  } while (0)

#define XTE_TRY_GPU_RESOLVE(handle, h)                       \
  do {                                                       \
    xte_status xte_gpu_s_ = xte_gpu_resolve((handle), &(h)); \
    if (xte_gpu_s_ != XTE_SUCCESS) return xte_gpu_s_;        \
  } while (0)

/* Kernels (src/cuda/quantize.cu). */
xte_status xte_gpu_quantize(const xte_quant_args *a, void *handle);
xte_status xte_gpu_dequantize(const xte_dequant_args *a, void *handle);
xte_status xte_gpu_cast(const xte_cast_args *a, void *handle);

#endif /* XTE_GPU_H */
