/* Backend registry: the built-in CPU table, CUDA / MUSA plugin libraries loaded with dlopen on
 * first use, streams, device memory, backend info. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/xte_cpu.h"
#include "ep/ep_transport.h"
#include "xte_ep_ops.h"
#include "xte_internal.h"

struct xte_stream_s {
  xte_backend backend;
  int device;
  void *handle;
};

typedef struct plugin_slot {
  const char *lib;
  pthread_once_t once;
  const xte_backend_ops *ops;
  int ndev;
  char why[160];
} plugin_slot;

static plugin_slot plugins[3] = {
    {NULL, PTHREAD_ONCE_INIT, NULL, 0, ""},
    {"libxte_cuda.so", PTHREAD_ONCE_INIT, NULL, 0, ""},
    {"libxte_musa.so", PTHREAD_ONCE_INIT, NULL, 0, ""},
};

static const xte_core_services core_services = {xte_set_error};

static void *open_plugin(const char *lib, char *why, size_t why_size) {
  char path[4096];
  const char *dir = getenv("XTE_PLUGIN_DIR");
  void *h = NULL;
  Dl_info self;
  if (dir && *dir) {
    snprintf(path, sizeof path, "%s/%s", dir, lib);
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
  }
  /* next to libxte itself */
  if (dladdr((void *)&open_plugin, &self) && self.dli_fname) {
    const char *slash = strrchr(self.dli_fname, '/');
    if (slash) {
      int n = (int)(slash - self.dli_fname);
      snprintf(path, sizeof path, "%.*s/%s", n, self.dli_fname, lib);
      h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h) return h;
    }
  }
  h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) snprintf(why, why_size, "%s not loaded: %s", lib, dlerror());
  return h;
}

static void load_plugin(plugin_slot *s) {
  void *h = open_plugin(s->lib, s->why, sizeof s->why);
  xte_plugin_get_ops_fn get;
  const xte_backend_ops *ops;
  if (!h) return;
  *(void **)&get = dlsym(h, "xte_plugin_get_ops");
  if (!get) {
    snprintf(s->why, sizeof s->why, "%s has no xte_plugin_get_ops", s->lib);
    return;
  }
  ops = get(XTE_PLUGIN_ABI);
  if (!ops || ops->abi != XTE_PLUGIN_ABI) {
    snprintf(s->why, sizeof s->why, "%s speaks another plugin ABI (want %d)", s->lib,
             XTE_PLUGIN_ABI);
    return;
  }
  if (ops->init(&core_services, s->why, sizeof s->why) != XTE_SUCCESS) {
    if (!s->why[0]) snprintf(s->why, sizeof s->why, "%s: runtime init failed", s->lib);
    s->ndev = 0;
    s->ops = ops; /* loaded, but no usable device */
    return;
  }
  s->ndev = ops->device_count();
  {
    /* a note the plugin's init left on success (the CUDA plugin: which FAST GEMM it runs) */
    char note[sizeof s->why];
    snprintf(note, sizeof note, "%s", s->why);
    if (s->ndev <= 0)
      snprintf(s->why, sizeof s->why, "%s loaded, no device found", s->lib);
    else
      snprintf(s->why, sizeof s->why, "%s loaded, %d device(s)%s%.100s", s->lib, s->ndev,
               note[0] ? "; " : "", note);
  }
  s->ops = ops;
}

static void load_cuda(void) {
  load_plugin(&plugins[XTE_BACKEND_CUDA]);
}
static void load_musa(void) {
  load_plugin(&plugins[XTE_BACKEND_MUSA]);
}

static plugin_slot *get_plugin(xte_backend b) {
  if (b == XTE_BACKEND_CUDA)
    pthread_once(&plugins[b].once, load_cuda);
  else
    pthread_once(&plugins[b].once, load_musa);
  return &plugins[b];
}

const char *xte_backend_name(xte_backend backend) {
  switch (backend) {
    case XTE_BACKEND_CPU:
      return "cpu";
    case XTE_BACKEND_CUDA:
      return "cuda";
    case XTE_BACKEND_MUSA:
      return "musa";
  }
  return "unknown";
}

static xte_status backend_ops(xte_backend b, int device, const xte_backend_ops **ops) {
  plugin_slot *s;
  *ops = NULL;
  if (b == XTE_BACKEND_CPU) {
    if (device != 0)
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "device %d: the CPU backend has device 0",
                           device);
    *ops = xte_cpu_backend_ops();
    return XTE_SUCCESS;
  }
  if (b != XTE_BACKEND_CUDA && b != XTE_BACKEND_MUSA)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "backend %d is not an xte_backend", (int)b);
  s = get_plugin(b);
  if (!s->ops || s->ndev <= 0)
    return xte_set_error(XTE_ERROR_BACKEND_UNAVAILABLE, "backend %s unavailable: %s",
                         xte_backend_name(b), s->why);
  if (device < 0 || device >= s->ndev)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "device %d: backend %s has %d device(s)",
                         device, xte_backend_name(b), s->ndev);
  *ops = s->ops;
  return XTE_SUCCESS;
}

static xte_status default_backend(xte_backend *b) {
  *b = XTE_BACKEND_CPU;
  const char *e = getenv("XTE_BACKEND");
  if (!e || !*e || !strcmp(e, "cpu"))
    *b = XTE_BACKEND_CPU;
  else if (!strcmp(e, "cuda"))
    *b = XTE_BACKEND_CUDA;
  else if (!strcmp(e, "musa"))
    *b = XTE_BACKEND_MUSA;
  else
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "XTE_BACKEND=%s: want cpu, cuda or musa", e);
  return XTE_SUCCESS;
}

xte_status xte_resolve_stream(xte_stream stream, xte_exec *exec) {
  exec->backend = XTE_BACKEND_CPU;
  exec->ops = NULL;
  if (stream) {
    exec->backend = stream->backend;
    exec->device = stream->device;
    exec->handle = stream->handle;
    return backend_ops(stream->backend, stream->device, &exec->ops);
  }
  XTE_TRY(default_backend(&exec->backend));
  exec->device = 0;
  exec->handle = NULL;
  return backend_ops(exec->backend, 0, &exec->ops);
}

xte_status xte_stream_create(xte_backend backend, int device, void *native_stream,
                             xte_stream *stream) {
  const xte_backend_ops *ops = NULL;
  struct xte_stream_s *s;
  XTE_CHECK_PTR(stream, "stream");
  XTE_TRY(backend_ops(backend, device, &ops));
  s = (struct xte_stream_s *)xte_aligned_calloc(1, sizeof *s);
  if (!s) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "stream: out of host memory");
  s->backend = backend;
  s->device = device;
  if (ops->stream_create) {
    xte_status st = ops->stream_create(device, native_stream, &s->handle);
    if (st != XTE_SUCCESS) {
      xte_aligned_free(s);
      return st;
    }
  }
  *stream = s;
  xte_clear_error();
  return XTE_SUCCESS;
}

xte_status xte_stream_destroy(xte_stream stream) {
  const xte_backend_ops *ops = NULL;
  xte_clear_error();
  if (!stream) return XTE_SUCCESS;
  if (backend_ops(stream->backend, stream->device, &ops) == XTE_SUCCESS && ops->stream_destroy)
    ops->stream_destroy(stream->handle);
  xte_aligned_free(stream);
  xte_clear_error();
  return XTE_SUCCESS;
}

xte_backend xte_stream_backend(xte_stream stream) {
  xte_backend b = XTE_BACKEND_CPU;
  if (stream) return stream->backend;
  default_backend(&b);
  return b;
}

xte_status xte_stream_synchronize(xte_stream stream) {
  xte_exec ex;
  XTE_TRY(xte_resolve_stream(stream, &ex));
  xte_clear_error();
  return ex.ops->synchronize ? ex.ops->synchronize(ex.handle) : XTE_SUCCESS;
}

xte_status xte_malloc(xte_stream stream, size_t bytes, void **ptr) {
  xte_exec ex;
  XTE_CHECK_PTR(ptr, "ptr");
  XTE_TRY(xte_resolve_stream(stream, &ex));
  xte_clear_error();
  return ex.ops->alloc(ex.device, bytes, ptr);
}

xte_status xte_free(xte_stream stream, void *ptr) {
  xte_exec ex;
  xte_clear_error();
  if (!ptr) return XTE_SUCCESS;
  XTE_TRY(xte_resolve_stream(stream, &ex));
  xte_clear_error();
  return ex.ops->dealloc(ex.device, ptr);
}

xte_status xte_memcpy(xte_stream stream, void *dst, const void *src, size_t bytes,
                      xte_memcpy_kind kind) {
  xte_exec ex;
  xte_clear_error();
  if (bytes == 0) return XTE_SUCCESS;
  XTE_CHECK_PTR(dst, "dst");
  XTE_CHECK_PTR(src, "src");
  if ((unsigned)kind > XTE_MEMCPY_DEVICE_TO_DEVICE)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "kind %d is not an xte_memcpy_kind",
                         (int)kind);
  XTE_TRY(xte_resolve_stream(stream, &ex));
  xte_clear_error();
  return ex.ops->copy(ex.handle, dst, src, bytes, (int)kind);
}

xte_status xte_memset(xte_stream stream, void *dst, int value, size_t bytes) {
  xte_exec ex;
  xte_clear_error();
  if (bytes == 0) return XTE_SUCCESS;
  XTE_CHECK_PTR(dst, "dst");
  XTE_TRY(xte_resolve_stream(stream, &ex));
  xte_clear_error();
  return ex.ops->fill(ex.handle, dst, value, bytes);
}

static void fill_gpus(xte_backend b, int *n, xte_gpu_info *gpus, int *found, char *why,
                      size_t why_size) {
  plugin_slot *s = get_plugin(b);
  int i;
  *found = s->ops != NULL;
  snprintf(why, why_size, "%s", s->why);
  *n = 0;
  if (!s->ops || s->ndev <= 0) return;
  for (i = 0; i < s->ndev && i < XTE_INFO_MAX_GPUS; i++)
    if (s->ops->device_info && s->ops->device_info(i, &gpus[*n]) == XTE_SUCCESS) (*n)++;
}

xte_status xte_get_backend_info(xte_backend_info *info) {
  XTE_CHECK_PTR(info, "info");
  memset(info, 0, sizeof *info);
  info->version = XTE_VERSION;
  xte_cpu_fill_info(info);
  fill_gpus(XTE_BACKEND_CUDA, &info->num_cuda_gpus, info->cuda_gpus, &info->cuda_plugin_found,
            info->cuda_plugin_status, sizeof info->cuda_plugin_status);
  fill_gpus(XTE_BACKEND_MUSA, &info->num_musa_gpus, info->musa_gpus, &info->musa_plugin_found,
            info->musa_plugin_status, sizeof info->musa_plugin_status);
  xte_clear_error();
  return XTE_SUCCESS;
}

xte_status xte_backend_info_string(char *buf, size_t size) {
  xte_backend_info in;
  size_t o = 0;
  int i;
  XTE_CHECK_PTR(buf, "buf");
  if (size == 0) return xte_set_error(XTE_ERROR_BUFFER_TOO_SMALL, "size is 0");
  XTE_TRY(xte_get_backend_info(&in));
#define XTE_PUT(...)                                                     \
  do {                                                                   \
    if (o < size) o += (size_t)snprintf(buf + o, size - o, __VA_ARGS__); \
  } while (0)
  XTE_PUT("xte %d.%d.%d\n", in.version / 10000, in.version / 100 % 100, in.version % 100);
  XTE_PUT("cpu: %s\n", in.cpu_name);
  XTE_PUT("  cores %d, threads %d, L1d %zu KiB, L2 %zu KiB, L3 %zu KiB\n", in.cpu_cores,
          in.cpu_threads, in.l1d_bytes >> 10, in.l2_bytes >> 10, in.l3_bytes >> 10);
  XTE_PUT("  isa in use %s, best %s, available:", xte_cpu_isa_name(in.cpu_isa),
          xte_cpu_isa_name(in.cpu_isa_best));
  for (i = 0; i < XTE_CPU_ISA_COUNT; i++)
    if (in.cpu_isa_available & (1u << i)) XTE_PUT(" %s", xte_cpu_isa_name((xte_cpu_isa)i));
  XTE_PUT("\n");
  for (i = 0; i < XTE_CPU_ISA_COUNT; i++)
    if (!(in.cpu_isa_available & (1u << i)))
      XTE_PUT("  isa %s unavailable: %s\n", xte_cpu_isa_name((xte_cpu_isa)i),
              xte_cpu_isa_unavailable((xte_cpu_isa)i));
  if (xte_cpu_isa_note()) XTE_PUT("  %s\n", xte_cpu_isa_note());
  XTE_PUT("  exact e4m3 GEMM: %s\n",
          xte_cpu_gemm_amx() ? "amx-int8 digit products" : "fp64 fma (no amx-int8 in use)");
  if (xte_cpu_gemm_vnni_rows() > 0)
    XTE_PUT("  exact e4m3 GEMM, 1-%d rows: avx512-vnni digit products\n", xte_cpu_gemm_vnni_rows());
  else
    XTE_PUT("  exact e4m3 GEMM, few rows: no avx512-vnni in use\n");
  XTE_PUT("  FAST GEMM, panels: %s\n",
          xte_cpu_gemm_fast_amx() ? "amx-bf16 tiles" : "fp32 fma (no amx-bf16 in use)");
  {
    /* the row counts of few rows that FAST hands to the exact driver (e4m3 x e4m3) */
    int m, lo = 0, n = 0;
    XTE_PUT("  FAST e4m3 GEMM, few rows: fp32 fma");
    for (m = 1; m <= 33; m++) {
      const int ex = m <= 32 && xte_cpu_gemm_fast_small_exact(m);
      if (ex && !lo) lo = m;
      if (!ex && lo) {
        XTE_PUT("%s %d", n++ ? "," : "; the exact path at rows", lo);
        if (m - 1 > lo) XTE_PUT("-%d", m - 1);
        lo = 0;
      }
    }
    XTE_PUT("\n");
  }
  XTE_PUT("cuda: %s\n", in.cuda_plugin_status);
  for (i = 0; i < in.num_cuda_gpus; i++)
    XTE_PUT("  gpu %d: %s (%s, %zu MiB)\n", i, in.cuda_gpus[i].name, in.cuda_gpus[i].arch,
            in.cuda_gpus[i].memory_bytes >> 20);
  XTE_PUT("musa: %s\n", in.musa_plugin_status);
  for (i = 0; i < in.num_musa_gpus; i++)
    XTE_PUT("  gpu %d: %s (%s, %zu MiB)\n", i, in.musa_gpus[i].name, in.musa_gpus[i].arch,
            in.musa_gpus[i].memory_bytes >> 20);
  XTE_PUT("expert parallelism: threads%s", xte_ep_have_mpi() ? ", mpi" : " (built without MPI)");
  {
    /* a GPU plugin's collective library is opened only when a group is made: its name here */
    static const xte_backend gb[2] = {XTE_BACKEND_CUDA, XTE_BACKEND_MUSA};
    for (i = 0; i < 2; i++) {
      const plugin_slot *s = get_plugin(gb[i]);
      if (s->ops && s->ops->ep && s->ops->ep->ccl_name)
        XTE_PUT(", %s (%s plugin, loaded at group creation)", s->ops->ep->ccl_name,
                xte_backend_name(gb[i]));
    }
  }
  XTE_PUT("\n");
#undef XTE_PUT
  return XTE_SUCCESS;
}
