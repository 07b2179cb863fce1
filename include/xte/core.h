/* xte core API: status codes, dtypes, tensor descriptors, backends, streams, device memory. */
#ifndef XTE_CORE_H
#define XTE_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "xte/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define XTE_API __declspec(dllexport)
#else
#define XTE_API __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------ status */
typedef enum xte_status {
  XTE_SUCCESS = 0,
  XTE_ERROR_INVALID_ARGUMENT = 1,    /* a value out of range, an unknown enum */
  XTE_ERROR_NULL_POINTER = 2,        /* a required pointer is NULL */
  XTE_ERROR_DTYPE = 3,               /* a dtype the operation does not take */
  XTE_ERROR_SHAPE = 4,               /* shapes that do not match */
  XTE_ERROR_BUFFER_TOO_SMALL = 5,    /* a scale / workspace buffer smaller than required */
  XTE_ERROR_ALIGNMENT = 6,           /* a pointer or leading dimension misaligned */
  XTE_ERROR_UNSUPPORTED = 7,         /* a valid request this build or recipe does not define */
  XTE_ERROR_BACKEND_UNAVAILABLE = 8, /* plugin library missing or no device */
  XTE_ERROR_DEVICE = 9,              /* a GPU runtime call failed */
  XTE_ERROR_OUT_OF_MEMORY = 10,
  XTE_ERROR_INTERNAL = 11
} xte_status;

/* A static string naming the status ("XTE_ERROR_SHAPE"). Never NULL. */
XTE_API const char *xte_status_string(xte_status status);

/* The message of the last failed call on this thread, naming the argument at fault; "" after a
 * successful call. The pointer is valid until the next xte call on this thread. */
XTE_API const char *xte_last_error(void);

/* Version of the loaded library, XTE_VERSION_MAJOR * 10000 + MINOR * 100 + PATCH. */
XTE_API int xte_version(void);

/* ------------------------------------------------------------------ dtypes */
typedef enum xte_dtype {
  XTE_DTYPE_FP32 = 0,
  XTE_DTYPE_FP16 = 1,
  XTE_DTYPE_BF16 = 2,
  XTE_DTYPE_E4M3 = 3, /* fp8 e4m3fn: max 448, NaN 0x7F/0xFF, no inf */
  XTE_DTYPE_E5M2 = 4, /* fp8 e5m2: max 57344, inf 0x7C/0xFC */
  XTE_DTYPE_E8M0 = 5, /* unsigned power-of-two scale, 2^(e-127), 0xFF NaN */
  XTE_DTYPE_INT32 = 6,
  XTE_DTYPE_INT64 = 7,
  XTE_DTYPE_UINT8 = 8,
  XTE_DTYPE_FP64 = 9,
  XTE_DTYPE_COUNT
} xte_dtype;

XTE_API size_t xte_dtype_size(xte_dtype dtype);      /* bytes per element, 0 if unknown */
XTE_API const char *xte_dtype_name(xte_dtype dtype); /* "fp32", "e4m3", ... */

/* ------------------------------------------------------------------ tensors */
#define XTE_MAX_RANK 8

/* A non-owning, row-major tensor view. All dimensions but the last are flattened into rows
 * for 2-D operations: rows = shape[0] * ... * shape[rank-2], cols = shape[rank-1].
 * ld is the distance in elements between consecutive rows (0 means dense: ld = cols). */
typedef struct xte_tensor {
  void *data;
  xte_dtype dtype;
  int32_t rank;
  int64_t shape[XTE_MAX_RANK];
  int64_t ld;
} xte_tensor;

static inline xte_tensor xte_tensor_2d(void *data, xte_dtype dtype, int64_t rows, int64_t cols) {
  xte_tensor t;
  int i;
  t.data = data;
  t.dtype = dtype;
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  for (i = 2; i < XTE_MAX_RANK; i++) t.shape[i] = 0;
  t.ld = 0;
  return t;
}

static inline xte_tensor xte_tensor_1d(void *data, xte_dtype dtype, int64_t n) {
  xte_tensor t = xte_tensor_2d(data, dtype, n, 0);
  t.rank = 1;
  t.shape[1] = 0;
  return t;
}

/* ------------------------------------------------------------------ backends */
typedef enum xte_backend {
  XTE_BACKEND_CPU = 0,
  XTE_BACKEND_CUDA = 1,
  XTE_BACKEND_MUSA = 2
} xte_backend;

XTE_API const char *xte_backend_name(xte_backend backend);

typedef enum xte_cpu_isa {
  XTE_CPU_ISA_SCALAR = 0,
  XTE_CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
  XTE_CPU_ISA_AVX512 = 2, /* AVX-512 F/BW/VL/DQ */
  /* The AVX-512 kernels compiled against SIMDe (emulated); present only in builds with
   * XTE_SIMDE=ON, selectable only explicitly (tests), never chosen automatically. */
  XTE_CPU_ISA_AVX512_SIMDE = 3,
  XTE_CPU_ISA_COUNT
} xte_cpu_isa;

XTE_API const char *xte_cpu_isa_name(xte_cpu_isa isa);

/* The ISA the CPU kernels use: the best the machine and OS support, capped by the environment
 * variable XTE_CPU_ISA=scalar|avx2|avx512|avx512_simde, or by xte_cpu_set_isa(). */
XTE_API xte_cpu_isa xte_cpu_get_isa(void);
/* Selects the ISA for subsequent calls (process-wide). XTE_ERROR_UNSUPPORTED if this machine or
 * build cannot run it. */
XTE_API xte_status xte_cpu_set_isa(xte_cpu_isa isa);
/* Threads of the CPU pool (XTE_NUM_THREADS, else the physical cores, from hwloc or sysfs). Results
 * never depend on it. n = 0 restores the default. */
XTE_API xte_status xte_cpu_set_num_threads(int n);
XTE_API int xte_cpu_get_num_threads(void);

#define XTE_INFO_MAX_GPUS 16
typedef struct xte_gpu_info {
  char name[128];
  char arch[32]; /* "sm_90", "mp_31" */
  size_t memory_bytes;
} xte_gpu_info;

typedef struct xte_backend_info {
  int version;
  xte_cpu_isa cpu_isa;        /* in use */
  xte_cpu_isa cpu_isa_best;   /* best the machine supports */
  unsigned cpu_isa_available; /* bit i set: ISA i can run */
  int cpu_cores;              /* physical cores (hwloc or sysfs) */
  int cpu_threads;            /* pool size */
  size_t l1d_bytes, l2_bytes, l3_bytes;
  char cpu_name[128];
  int cuda_plugin_found, musa_plugin_found; /* libxte_cuda.so / libxte_musa.so loaded */
  char cuda_plugin_status[160], musa_plugin_status[160];
  int num_cuda_gpus, num_musa_gpus;
  xte_gpu_info cuda_gpus[XTE_INFO_MAX_GPUS];
  xte_gpu_info musa_gpus[XTE_INFO_MAX_GPUS];
} xte_backend_info;

XTE_API xte_status xte_get_backend_info(xte_backend_info *info);
/* Writes a human-readable report of xte_get_backend_info() into buf (always NUL-terminated). */
XTE_API xte_status xte_backend_info_string(char *buf, size_t size);

/* ------------------------------------------------------------------ streams */
/* A stream binds calls to a backend, a device index and optionally a native stream
 * (cudaStream_t / musaStream_t). A NULL xte_stream means the default backend: XTE_BACKEND
 * (cpu|cuda|musa) from the environment, else the CPU. Data pointers must live on the stream's
 * backend (host memory for the CPU). */
typedef struct xte_stream_s *xte_stream;

XTE_API xte_status xte_stream_create(xte_backend backend, int device, void *native_stream,
                                     xte_stream *stream);
XTE_API xte_status xte_stream_destroy(xte_stream stream);
XTE_API xte_status xte_stream_synchronize(xte_stream stream);
XTE_API xte_backend xte_stream_backend(xte_stream stream);

/* Memory on the stream's backend (64-byte aligned on the CPU). */
XTE_API xte_status xte_malloc(xte_stream stream, size_t bytes, void **ptr);
XTE_API xte_status xte_free(xte_stream stream, void *ptr);

typedef enum xte_memcpy_kind {
  XTE_MEMCPY_HOST_TO_DEVICE = 0,
  XTE_MEMCPY_DEVICE_TO_HOST = 1,
  XTE_MEMCPY_DEVICE_TO_DEVICE = 2
} xte_memcpy_kind;
/* Copies and waits for completion. On the CPU every kind is a memcpy. */
XTE_API xte_status xte_memcpy(xte_stream stream, void *dst, const void *src, size_t bytes,
                              xte_memcpy_kind kind);
XTE_API xte_status xte_memset(xte_stream stream, void *dst, int value, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* XTE_CORE_H */
