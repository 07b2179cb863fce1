/* The CUDA plugin's backend table (libxte_cuda.so; the same source builds libxte_musa.so):
 * runtime probing, devices, streams, memory. libxte dlopens the plugin and reaches it only
 * through xte_plugin_get_ops(); the plugin reaches the core only through the services that
 * init() receives (it does not link libxte). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/xte_fast.h"
#include "cuda/xte_gpu.h"

static const xte_core_services *g_svc;
static int g_ndev;

const xte_core_services *xte_gpu_services(void) {
  return g_svc;
}

xte_status xte_gpu_check(cudaError_t e, const char *what) {
  xte_status st;
  if (e == cudaSuccess) return XTE_SUCCESS;
  st = e == cudaErrorMemoryAllocation ? XTE_ERROR_OUT_OF_MEMORY : XTE_ERROR_DEVICE;
  if (g_svc && g_svc->set_error)
    return g_svc->set_error(st, "%s: %s: %s (%s)", XTE_GPU_NAME, what, cudaGetErrorString(e),
                            cudaGetErrorName(e));
  return st;
}

xte_status xte_gpu_launch_check(cudaError_t prior, const char *what) {
  cudaError_t e = cudaPeekAtLastError();
  if (e == cudaSuccess || e == prior) return XTE_SUCCESS;
  (void)cudaGetLastError(); /* ours: consumed, so the application does not see it again */
  return xte_gpu_check(e, what);
}

/* ---------------------------------------------------------------- runtime, devices */

static xte_status gpu_init(const xte_core_services *svc, char *why, size_t why_size) {
  int n = 0;
  cudaError_t e;
  g_svc = svc;
  if (why_size) why[0] = '\0';
  e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    /* Without any driver the runtime says "driver version is insufficient": say what it is. */
    void *drv = dlopen(XTE_GPU_DRIVER_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!drv)
      snprintf(why, why_size, "%s loaded, no usable device: no driver (%s not found)", XTE_GPU_LIB,
               XTE_GPU_DRIVER_LIB);
    else
      snprintf(why, why_size, "%s loaded, no usable device: %s (%s)", XTE_GPU_LIB,
               cudaGetErrorString(e), cudaGetErrorName(e));
    if (drv) dlclose(drv);
    (void)cudaGetLastError();
    {
      char fast[96];
      size_t n = strlen(why);
      xte_gpu_fast_describe(-1, fast, sizeof fast);
      if (n < why_size) snprintf(why + n, why_size - n, "; %s", fast);
    }
    g_ndev = 0;
    return XTE_ERROR_BACKEND_UNAVAILABLE;
  }
  if (n <= 0) {
    snprintf(why, why_size, "%s loaded, no device found", XTE_GPU_LIB);
    g_ndev = 0;
    return XTE_ERROR_BACKEND_UNAVAILABLE;
  }
  g_ndev = n;
  /* which FAST GEMM device 0 runs (`xte info` appends it to the plugin's status; cublaslt.cu) */
  xte_gpu_fast_describe(0, why, why_size);
  return XTE_SUCCESS;
}

static int gpu_device_count(void) {
  return g_ndev;
}

static xte_status gpu_device_info(int device, xte_gpu_info *info) {
  cudaDeviceProp p;
  memset(info, 0, sizeof *info);
  XTE_GPU_TRY(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  snprintf(info->name, sizeof info->name, "%.127s", p.name);
  snprintf(info->arch, sizeof info->arch, "%s%d%d", XTE_GPU_ARCH_PREFIX, p.major, p.minor);
  info->memory_bytes = (size_t)p.totalGlobalMem;
  return XTE_SUCCESS;
}

/* ---------------------------------------------------------------- streams */

static xte_status alloc_scratch(xte_gpu_stream *h) {
  void *p = NULL;
  if (h->scratch) return XTE_SUCCESS;
  XTE_GPU_TRY(cudaMalloc(&p, XTE_GPU_SCRATCH_FLOATS * sizeof(float)), "cudaMalloc (scratch)");
  h->scratch = (float *)p;
  return XTE_SUCCESS;
}

static xte_status gpu_stream_create(int device, void *native, void **handle) {
  xte_gpu_device_scope scope;
  xte_gpu_stream *h = (xte_gpu_stream *)calloc(1, sizeof *h);
  xte_status st;
  if (!h) return g_svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "stream: out of host memory");
  if (pthread_mutex_init(&h->lock, NULL) != 0) {
    free(h);
    return g_svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "stream: pthread_mutex_init failed");
  }
  h->device = device;
  st = xte_gpu_check(scope.enter(device), "cudaSetDevice");
  if (st == XTE_SUCCESS) {
    if (native) {
      h->stream = (cudaStream_t)native;
    } else {
      st = xte_gpu_check(cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking),
                         "cudaStreamCreateWithFlags");
      h->owned = st == XTE_SUCCESS;
    }
  }
  if (st == XTE_SUCCESS) st = alloc_scratch(h);
  if (st != XTE_SUCCESS) {
    if (h->owned) (void)cudaStreamDestroy(h->stream);
    pthread_mutex_destroy(&h->lock);
    free(h);
    return st;
  }
  *handle = h;
  return XTE_SUCCESS;
}

static xte_status gpu_stream_destroy(void *handle) {
  xte_gpu_stream *h = (xte_gpu_stream *)handle;
  xte_gpu_device_scope scope;
  xte_status st = XTE_SUCCESS;
  if (!h) return XTE_SUCCESS;
  (void)scope.enter(h->device);
  if (h->scratch) {
    /* pending work on the stream may still read the scratch */
    st = xte_gpu_check(cudaStreamSynchronize(h->stream), "cudaStreamSynchronize");
    (void)cudaFree(h->scratch);
  }
  if (h->owned) (void)cudaStreamDestroy(h->stream);
  pthread_mutex_destroy(&h->lock);
  free(h);
  return st;
}

/* The handle for a NULL stream: device 0, the legacy default stream, shared by every host thread
 * (its lock orders their scratch use; see xte_gpu_stream). */
static xte_gpu_stream g_default = {NULL, 0, 0, NULL, PTHREAD_MUTEX_INITIALIZER};

xte_status xte_gpu_resolve(void *handle, xte_gpu_stream **out, xte_gpu_device_scope *scope) {
  xte_gpu_stream *h = (xte_gpu_stream *)handle;
  if (!h) {
    xte_status st;
    XTE_GPU_TRY(scope->enter(0), "cudaSetDevice");
    pthread_mutex_lock(&g_default.lock);
    st = alloc_scratch(&g_default);
    pthread_mutex_unlock(&g_default.lock);
    if (st != XTE_SUCCESS) return st;
    *out = &g_default;
    return XTE_SUCCESS;
  }
  XTE_GPU_TRY(scope->enter(h->device), "cudaSetDevice");
  *out = h;
  return XTE_SUCCESS;
}

static xte_status gpu_synchronize(void *handle) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  return xte_gpu_check(cudaStreamSynchronize(h->stream), "cudaStreamSynchronize");
}

/* ---------------------------------------------------------------- memory */

static xte_status gpu_alloc(int device, size_t bytes, void **ptr) {
  xte_gpu_device_scope scope;
  void *p = NULL;
  xte_status st;
  XTE_GPU_TRY(scope.enter(device), "cudaSetDevice");
  if (bytes == 0) {
    *ptr = NULL;
    return XTE_SUCCESS;
  }
  st = xte_gpu_check(cudaMalloc(&p, bytes), "cudaMalloc");
  if (st == XTE_SUCCESS) *ptr = p; /* written only on success */
  return st;
}

static xte_status gpu_dealloc(int device, void *ptr) {
  xte_gpu_device_scope scope;
  if (!ptr) return XTE_SUCCESS;
  XTE_GPU_TRY(scope.enter(device), "cudaSetDevice");
  return xte_gpu_check(cudaFree(ptr), "cudaFree");
}

static xte_status gpu_copy(void *handle, void *dst, const void *src, size_t bytes, int kind) {
  xte_gpu_stream *h;
  cudaMemcpyKind k = kind == 0   ? cudaMemcpyHostToDevice
                     : kind == 1 ? cudaMemcpyDeviceToHost
                                 : cudaMemcpyDeviceToDevice;
  XTE_GPU_ENTER(handle, h);
  XTE_GPU_TRY(cudaMemcpyAsync(dst, src, bytes, k, h->stream), "cudaMemcpyAsync");
  return xte_gpu_check(cudaStreamSynchronize(h->stream), "cudaStreamSynchronize (copy)");
}

static xte_status gpu_fill(void *handle, void *dst, int value, size_t bytes) {
  xte_gpu_stream *h;
  XTE_GPU_ENTER(handle, h);
  XTE_GPU_TRY(cudaMemsetAsync(dst, value, bytes, h->stream), "cudaMemsetAsync");
  return xte_gpu_check(cudaStreamSynchronize(h->stream), "cudaStreamSynchronize (fill)");
}

/* ---------------------------------------------------------------- the table */

/* Exact attention (src/cuda/attention.cu). */
extern const struct xte_attention_ops xte_gpu_attention_ops;
/* Expert parallelism: the NCCL (MUSA: MCCL) transport and the block move (src/cuda/ep_nccl.cu). */
extern const struct xte_ep_ops xte_gpu_ep_ops;

static xte_backend_ops g_ops;
static pthread_once_t g_ops_once = PTHREAD_ONCE_INIT;

static void fill_ops(void) {
  memset(&g_ops, 0, sizeof g_ops);
  g_ops.abi = XTE_PLUGIN_ABI;
  g_ops.name = XTE_GPU_NAME;
  g_ops.init = gpu_init;
  g_ops.device_count = gpu_device_count;
  g_ops.device_info = gpu_device_info;
  g_ops.stream_create = gpu_stream_create;
  g_ops.stream_destroy = gpu_stream_destroy;
  g_ops.synchronize = gpu_synchronize;
  g_ops.alloc = gpu_alloc;
  g_ops.dealloc = gpu_dealloc;
  g_ops.copy = gpu_copy;
  g_ops.fill = gpu_fill;
  g_ops.quantize = xte_gpu_quantize;
  g_ops.dequantize = xte_gpu_dequantize;
  g_ops.cast = xte_gpu_cast;
  g_ops.moe = &xte_gpu_moe_ops;
  g_ops.attention = &xte_gpu_attention_ops;
  g_ops.gemm = &xte_gpu_gemm_ops;
  g_ops.ep = &xte_gpu_ep_ops;
}

/* The one exported symbol. */
extern "C" __attribute__((visibility("default"))) const xte_backend_ops *xte_plugin_get_ops(
    int abi) {
  if (abi != XTE_PLUGIN_ABI) return NULL;
  pthread_once(&g_ops_once, fill_ops);
  return &g_ops;
}
