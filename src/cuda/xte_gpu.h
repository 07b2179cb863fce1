/* Internals shared by the sources of the CUDA (and MUSA) plugin. Not installed. */
#ifndef XTE_GPU_H
#define XTE_GPU_H

#include <pthread.h>

#include "cuda/xte_gpu_runtime.h"
#include "xte_backend.h"
#include "xte_gemm_ops.h"
#include "xte_moe_ops.h"

/* A plugin stream handle: the native stream, its device and a little device scratch memory
 * (the per-tensor amax and scale of a quantize). */
typedef struct xte_gpu_stream {
  cudaStream_t stream;
  int device;
  int owned;      /* 1: created here, destroyed with the handle */
  float *scratch; /* XTE_GPU_SCRATCH_FLOATS floats of device memory */
  /* held while an operation that uses the scratch is enqueued: two host threads on one handle
   * (the NULL stream's handle is process-wide) never interleave their scratch writes */
  pthread_mutex_t lock;
  /* bytes at scratch, which grows into the handle's cached workspace (xte_gpu_workspace); 0: the
   * XTE_GPU_SCRATCH_FLOATS floats allocated with the handle. Freed with scratch. */
  size_t scratch_bytes = 0;
} xte_gpu_stream;

#define XTE_GPU_SCRATCH_FLOATS 4

/* The calling thread's current device, saved on entry to the plugin and restored on the way out
 * (the application's choice of device is never changed by an xte call). */
struct xte_gpu_device_scope {
  int saved = -1; /* the device to restore; -1: nothing to restore */
  xte_gpu_device_scope() = default;
  xte_gpu_device_scope(const xte_gpu_device_scope &) = delete;
  xte_gpu_device_scope &operator=(const xte_gpu_device_scope &) = delete;
  /* Makes device current (a no-op when it already is). */
  cudaError_t enter(int device) {
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
    if (cur == device) return cudaSuccess;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) saved = cur;
    return e;
  }
  ~xte_gpu_device_scope() {
    if (saved >= 0) (void)cudaSetDevice(saved);
  }
};

/* The handle to run on: handle itself, or for NULL (the default stream of device 0) a
 * process-wide one. Makes its device current through scope (restored when scope goes out of
 * scope) and its scratch allocated. */
xte_status xte_gpu_resolve(void *handle, xte_gpu_stream **out, xte_gpu_device_scope *scope);

/* XTE_SUCCESS for cudaSuccess; else records "what: <runtime message>" and returns
 * XTE_ERROR_DEVICE (XTE_ERROR_OUT_OF_MEMORY for an allocation failure). */
xte_status xte_gpu_check(cudaError_t e, const char *what);

/* After kernel launches: their own error. prior is cudaPeekAtLastError() taken before the first
 * launch. An error of the application's that was already pending stays pending for it (not
 * consumed, not reported as xte's); a new one is consumed and reported. (A launch failing with
 * exactly the pending error's code cannot be told apart from it and is not reported.) */
xte_status xte_gpu_launch_check(cudaError_t prior, const char *what);

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

/* Entry of a plugin call on a stream handle: resolves it into h and makes its device current
 * until the calling function returns. */
#define XTE_GPU_ENTER(handle, h)                                              \
  xte_gpu_device_scope xte_gpu_scope_;                                        \
  do {                                                                        \
    xte_status xte_gpu_s_ = xte_gpu_resolve((handle), &(h), &xte_gpu_scope_); \
    if (xte_gpu_s_ != XTE_SUCCESS) return xte_gpu_s_;                         \
  } while (0)

/* The core's services given to init() (set_error). */
const xte_core_services *xte_gpu_services(void);

/* Holds a handle's lock for a scope: while an operation that uses the handle's scratch or
 * workspace is enqueued. */
struct xte_gpu_lock {
  pthread_mutex_t *m;
  explicit xte_gpu_lock(xte_gpu_stream *h) : m(&h->lock) { pthread_mutex_lock(m); }
  xte_gpu_lock(const xte_gpu_lock &) = delete;
  xte_gpu_lock &operator=(const xte_gpu_lock &) = delete;
  ~xte_gpu_lock() { pthread_mutex_unlock(m); }
};

/* The handle's cached workspace (src/cuda/quantize.cu): *out = bytes of device memory, past the
 * quantize's scratch, for the operation being enqueued; grown when too small (the handle's stream
 * synchronized first: work enqueued before may still use the old buffer). The caller holds the
 * handle's lock until its last use of the workspace is enqueued (the stream then orders the next
 * operation's use after it). */
xte_status xte_gpu_workspace(xte_gpu_stream *h, size_t bytes, void **out);

/* Kernels (src/cuda/quantize.cu). */
xte_status xte_gpu_quantize(const xte_quant_args *a, void *handle);
xte_status xte_gpu_dequantize(const xte_dequant_args *a, void *handle);
xte_status xte_gpu_cast(const xte_cast_args *a, void *handle);

/* MoE token movement (src/cuda/moe.cu); NULL for the operations not provided. */
extern const xte_moe_ops xte_gpu_moe_ops;

/* The exact GEMM, dense and grouped (src/cuda/gemm.cu). */
extern const xte_gemm_ops xte_gpu_gemm_ops;

#endif /* XTE_GPU_H */
