/* The backend table: what the core calls on a backend. CPU is built in; CUDA and MUSA are
 * plugin libraries exporting xte_plugin_get_ops(). Entries a backend lacks are NULL, which the
 * core reports as XTE_ERROR_UNSUPPORTED. New entries are appended (the ABI number goes up). */
#ifndef XTE_BACKEND_H
#define XTE_BACKEND_H

#include <stddef.h>

#include "xte/core.h"
#include "xte_kernel_args.h"

#define XTE_PLUGIN_ABI 1

typedef struct xte_core_services {
  /* Records the thread's error message (printf format). Returns status for convenience. */
  xte_status (*set_error)(xte_status status, const char *fmt, ...);
} xte_core_services;

typedef struct xte_backend_ops {
  int abi;
  const char *name;
  /* Probes the runtime and devices; on failure fills why (no device, no driver). */
  xte_status (*init)(const xte_core_services *svc, char *why, size_t why_size);
  int (*device_count)(void);
  xte_status (*device_info)(int device, xte_gpu_info *info);
  xte_status (*stream_create)(int device, void *native, void **handle);
  xte_status (*stream_destroy)(void *handle);
  xte_status (*synchronize)(void *handle);
  xte_status (*alloc)(int device, size_t bytes, void **ptr);
  xte_status (*dealloc)(int device, void *ptr);
  xte_status (*copy)(void *handle, void *dst, const void *src, size_t bytes, int kind);
  xte_status (*fill)(void *handle, void *dst, int value, size_t bytes);
  /* kernels */
  xte_status (*quantize)(const xte_quant_args *args, void *handle);
  xte_status (*dequantize)(const xte_dequant_args *args, void *handle);
  xte_status (*cast)(const xte_cast_args *args, void *handle);
  /* Capabilities past quantization: each has its own table, declared in its own header
   * (src/xte_gemm_ops.h, src/xte_attention_ops.h, src/xte_moe_ops.h). NULL: not provided. */
  const struct xte_gemm_ops *gemm;
  const struct xte_attention_ops *attention;
  const struct xte_moe_ops *moe;
  /* Expert parallelism on this backend's memory (src/xte_ep_ops.h): the collective library's
   * transport and the device block moves. NULL: not provided. */
  const struct xte_ep_ops *ep;
  void *reserved[15];
} xte_backend_ops;

typedef const xte_backend_ops *(*xte_plugin_get_ops_fn)(int abi);

#endif /* XTE_BACKEND_H */
