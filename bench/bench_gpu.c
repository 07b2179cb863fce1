/* `xte bench <suite> --backend cuda` (see bench_gpu.h): the CUDA runtime loaded with dlopen, the
 * bench's stream, device buffers, the event-timed loop with the L2 flush, the table and the JSON
 * report. The only file of the bench that speaks to the CUDA runtime. */
#define _GNU_SOURCE /* RTLD_DEFAULT-free dlopen / dlsym, strdup */
#include "bench_gpu.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

/* ---------------------------------------------------------------- the CUDA runtime
 * cudaError_t is an int, cudaStream_t / cudaEvent_t pointers; the enum values below are the
 * runtime's (driver_types.h), stable across its versions. */
enum {
  CUDA_SUCCESS = 0,
  CUDA_STREAM_NON_BLOCKING = 1,
  CUDA_MEMCPY_D2D = 3,
  ATTR_CLOCK_KHZ = 13,
  ATTR_SM_COUNT = 16,
  ATTR_MEM_CLOCK_KHZ = 36,
  ATTR_BUS_WIDTH = 37,
  ATTR_L2_BYTES = 38,
  ATTR_CC_MAJOR = 75,
  ATTR_CC_MINOR = 76
};

typedef struct cudart {
  void *lib;
  char path[256];
  int (*GetDeviceCount)(int *);
  int (*SetDevice)(int);
  int (*DeviceGetAttribute)(int *, int, int);
  int (*RuntimeGetVersion)(int *);
  int (*DriverGetVersion)(int *);
  const char *(*GetErrorString)(int);
  int (*StreamCreateWithFlags)(void **, unsigned);
  int (*StreamSynchronize)(void *);
  int (*EventCreate)(void **);
  int (*EventRecord)(void *, void *);
  int (*EventSynchronize)(void *);
  int (*EventElapsedTime)(float *, void *, void *);
  int (*MemsetAsync)(void *, int, size_t, void *);
  int (*MemcpyAsync)(void *, const void *, size_t, int, void *);
} cudart;

static cudart rt;

static struct {
  int open, smoke, device, sm_count;
  size_t l2_bytes, flush_bytes;
  void *native; /* the cudaStream_t */
  xte_stream stream;
  void *flush;
  unsigned flush_value;
} g;

static const char *cuda_err(int e) {
  const char *s = rt.GetErrorString ? rt.GetErrorString(e) : NULL;
  return s ? s : "unknown CUDA error";
}

/* Loads the library at path (or the first of the usual names); 0 ok, else why. */
static int cudart_load(char *why, size_t n) {
  static const char *const names[] = {"libcudart.so.13",
                                      "libcudart.so.12",
                                      "libcudart.so",
                                      "/usr/local/cuda/lib64/libcudart.so.13",
                                      "/usr/local/cuda/lib64/libcudart.so.12",
                                      "/usr/local/cuda/lib64/libcudart.so",
                                      NULL};
  const char *forced = getenv("XTE_BENCH_CUDART");
  const char *first_err = NULL;
  char err0[200] = "";
  int i;
  if (rt.lib) return 0;
  if (forced && *forced) {
    rt.lib = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
    if (!rt.lib) {
      const char *e = dlerror();
      snprintf(why, n, "no CUDA runtime: XTE_BENCH_CUDART=%s: %s", forced, e ? e : "not loaded");
      return -1;
    }
    snprintf(rt.path, sizeof rt.path, "%s", forced);
  } else {
    for (i = 0; names[i] && !rt.lib; i++) {
      rt.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
      if (rt.lib) {
        snprintf(rt.path, sizeof rt.path, "%s", names[i]);
      } else if (!first_err) {
        first_err = dlerror();
        snprintf(err0, sizeof err0, "%s", first_err ? first_err : names[i]);
        first_err = err0;
      }
    }
    if (!rt.lib) {
      snprintf(why, n, "no CUDA runtime (libcudart.so.13 / .12 / .so): %s", err0);
      return -1;
    }
  }
#define SYM(f)                                                         \
  do {                                                                 \
    *(void **)&rt.f = dlsym(rt.lib, "cuda" #f);                        \
    if (!rt.f) {                                                       \
      snprintf(why, n, "no CUDA runtime: %s has no cuda" #f, rt.path); \
      dlclose(rt.lib);                                                 \
      memset(&rt, 0, sizeof rt);                                       \
      return -1;                                                       \
    }                                                                  \
  } while (0)
  SYM(GetDeviceCount);
  SYM(SetDevice);
  SYM(DeviceGetAttribute);
  SYM(RuntimeGetVersion);
  SYM(DriverGetVersion);
  SYM(GetErrorString);
  SYM(StreamCreateWithFlags);
  SYM(StreamSynchronize);
  SYM(EventCreate);
  SYM(EventRecord);
  SYM(EventSynchronize);
  SYM(EventElapsedTime);
  SYM(MemsetAsync);
  SYM(MemcpyAsync);
#undef SYM
  return 0;
}

static int attr(int a) {
  int v = 0;
  if (rt.DeviceGetAttribute(&v, a, g.device) != CUDA_SUCCESS) return 0;
  return v;
}

static void record_machine(void) {
  xte_backend_info bi;
  char b[512];
  int v, cc_major = attr(ATTR_CC_MAJOR), cc_minor = attr(ATTR_CC_MINOR);
  memset(&bi, 0, sizeof bi);
  xte_bench_machine_add("backend", "cuda");
  if (xte_get_backend_info(&bi) == XTE_SUCCESS && g.device < bi.num_cuda_gpus &&
      g.device < XTE_INFO_MAX_GPUS) {
    xte_bench_machine_add("gpu_name", bi.cuda_gpus[g.device].name);
    xte_bench_machine_add("gpu_arch_xte", bi.cuda_gpus[g.device].arch);
    snprintf(b, sizeof b, "%zu", bi.cuda_gpus[g.device].memory_bytes);
    xte_bench_machine_add("gpu_memory_bytes", b);
    xte_bench_machine_add("xte_cuda_plugin", bi.cuda_plugin_status);
  }
  snprintf(b, sizeof b, "%d", g.device);
  xte_bench_machine_add("gpu_device", b);
  snprintf(b, sizeof b, "%d.%d", cc_major, cc_minor);
  xte_bench_machine_add("gpu_compute_capability", b);
  snprintf(b, sizeof b, "%d", g.sm_count);
  xte_bench_machine_add("gpu_sm_count", b);
  snprintf(b, sizeof b, "%zu", g.l2_bytes);
  xte_bench_machine_add("gpu_l2_bytes", b);
  v = attr(ATTR_CLOCK_KHZ);
  snprintf(b, sizeof b, "%d", v);
  xte_bench_machine_add("gpu_clock_khz", v ? b : "(not reported)");
  v = attr(ATTR_MEM_CLOCK_KHZ);
  snprintf(b, sizeof b, "%d", v);
  xte_bench_machine_add("gpu_memory_clock_khz", v ? b : "(not reported)");
  v = attr(ATTR_BUS_WIDTH);
  snprintf(b, sizeof b, "%d", v);
  xte_bench_machine_add("gpu_memory_bus_bits", v ? b : "(not reported)");
  v = 0;
  (void)rt.RuntimeGetVersion(&v);
  snprintf(b, sizeof b, "%d (%s)", v, rt.path);
  xte_bench_machine_add("cuda_runtime", b);
  v = 0;
  (void)rt.DriverGetVersion(&v);
  snprintf(b, sizeof b, "%d", v);
  xte_bench_machine_add("cuda_driver", b);
  snprintf(b, sizeof b,
           "CUDA events on the bench's stream; L2 flushed before every iteration (memset of %zu "
           "bytes, outside the timed interval); a round's time is the median iteration",
           g.flush_bytes);
  xte_bench_machine_add("gpu_timing", b);
}

int xte_gpu_bench_open(int device, int smoke, char *why, size_t n) {
  int count = 0, e;
  xte_status st;
  if (g.open) return 0;
  if (cudart_load(why, n) != 0) return XTE_GPU_BENCH_SKIP;
  e = rt.GetDeviceCount(&count);
  if (e != CUDA_SUCCESS) {
    snprintf(why, n, "no CUDA device: cudaGetDeviceCount: %s (error %d)", cuda_err(e), e);
    return XTE_GPU_BENCH_SKIP;
  }
  if (count <= 0) {
    snprintf(why, n, "no CUDA device (cudaGetDeviceCount: 0)");
    return XTE_GPU_BENCH_SKIP;
  }
  if (device < 0 || device >= count) {
    snprintf(why, n, "--device %d: the machine has %d CUDA device(s)", device, count);
    return 1;
  }
  g.device = device;
  g.smoke = smoke;
  if ((e = rt.SetDevice(device)) != CUDA_SUCCESS ||
      (e = rt.StreamCreateWithFlags(&g.native, CUDA_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
    snprintf(why, n, "CUDA device %d: %s (error %d)", device, cuda_err(e), e);
    return 1;
  }
  st = xte_stream_create(XTE_BACKEND_CUDA, device, g.native, &g.stream);
  if (st != XTE_SUCCESS) {
    snprintf(why, n, "xte's CUDA backend: %s: %s", xte_status_string(st), xte_last_error());
    return XTE_GPU_BENCH_SKIP;
  }
  g.sm_count = attr(ATTR_SM_COUNT);
  g.l2_bytes = (size_t)attr(ATTR_L2_BYTES);
  /* 2 x L2 (at least 64 MiB when unknown; 1 MiB for --smoke) */
  g.flush_bytes = g.l2_bytes ? 2 * g.l2_bytes : 64 * XTE_BENCH_MiB;
  if (smoke) g.flush_bytes = XTE_BENCH_MiB;
  g.flush = xte_gpu_alloc(g.flush_bytes);
  if (!g.flush) {
    snprintf(why, n, "L2 flush buffer of %zu bytes: %s", g.flush_bytes, xte_last_error());
    return 1;
  }
  g.open = 1;
  record_machine();
  return 0;
}

xte_stream xte_gpu_stream(void) {
  return g.stream;
}
int xte_gpu_smoke(void) {
  return g.smoke;
}
size_t xte_gpu_l2_bytes(void) {
  return g.l2_bytes;
}
int xte_gpu_sm_count(void) {
  return g.sm_count;
}

void *xte_gpu_alloc(size_t bytes) {
  void *p = NULL;
  if (!g.stream) return NULL;
  if (xte_malloc(g.stream, bytes ? bytes : 1, &p) != XTE_SUCCESS) return NULL;
  return p;
}

int xte_gpu_upload(void *dev, const void *host, size_t bytes) {
  return xte_memcpy(g.stream, dev, host, bytes, XTE_MEMCPY_HOST_TO_DEVICE) == XTE_SUCCESS ? 0 : -1;
}

int xte_gpu_copy_d2d(void *dst, const void *src, size_t bytes) {
  return rt.MemcpyAsync(dst, src, bytes, CUDA_MEMCPY_D2D, g.native) == CUDA_SUCCESS ? 0 : -1;
}

int xte_gpu_sync(void) {
  return rt.StreamSynchronize(g.native) == CUDA_SUCCESS ? 0 : -1;
}

/* ---------------------------------------------------------------- cuBLAS (the GEMM anchor) */

static struct {
  void *lib, *handle;
  int tried, ok;
  char why[300];
  int (*Create)(void **);
  int (*SetStream)(void *, void *);
  int (*GemmEx)(void *, int, int, int, int, int, const void *, const void *, int, int, const void *,
                int, int, const void *, void *, int, int, int, int);
} cb;

int xte_gpu_cublas_open(char *why, size_t n) {
  static const char *const names[] = {"libcublas.so.13",
                                      "libcublas.so.12",
                                      "libcublas.so",
                                      "/usr/local/cuda/lib64/libcublas.so.13",
                                      "/usr/local/cuda/lib64/libcublas.so.12",
                                      NULL};
  const char *forced = getenv("XTE_BENCH_CUBLAS");
  int i, e;
  if (!cb.tried) {
    cb.tried = 1;
    if (forced && *forced) {
      cb.lib = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
    } else {
      for (i = 0; names[i] && !cb.lib; i++) cb.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    }
    if (!cb.lib) {
      const char *d = dlerror();
      snprintf(cb.why, sizeof cb.why, "no cuBLAS (%s): %s",
               forced && *forced ? forced : "libcublas.so.13 / .12 / .so", d ? d : "not loaded");
    } else {
      *(void **)&cb.Create = dlsym(cb.lib, "cublasCreate_v2");
      *(void **)&cb.SetStream = dlsym(cb.lib, "cublasSetStream_v2");
      *(void **)&cb.GemmEx = dlsym(cb.lib, "cublasGemmEx");
      if (!cb.Create || !cb.SetStream || !cb.GemmEx)
        snprintf(cb.why, sizeof cb.why, "cuBLAS without cublasCreate_v2 / SetStream_v2 / GemmEx");
      else if ((e = cb.Create(&cb.handle)) != 0)
        snprintf(cb.why, sizeof cb.why, "cublasCreate: status %d", e);
      else if ((e = cb.SetStream(cb.handle, g.native)) != 0)
        snprintf(cb.why, sizeof cb.why, "cublasSetStream: status %d", e);
      else
        cb.ok = 1;
    }
  }
  if (!cb.ok) snprintf(why, n, "%s", cb.why);
  return cb.ok ? 0 : -1;
}

xte_status xte_gpu_cublas_bf16_gemm(int64_t M, int64_t N, int64_t K, const void *x, const void *w,
                                    void *d) {
  /* column-major: D^T [N, M] = W [K, N]^T * X^T [K, M] */
  enum { OP_N = 0, OP_T = 1, R_16BF = 14, COMPUTE_32F = 68, GEMM_DEFAULT = -1 };
  const float one = 1.0f, zero = 0.0f;
  int e;
  if (!cb.ok) return XTE_ERROR_BACKEND_UNAVAILABLE;
  if (M > 2147483647 || N > 2147483647 || K > 2147483647) return XTE_ERROR_INVALID_ARGUMENT;
  e = cb.GemmEx(cb.handle, OP_T, OP_N, (int)N, (int)M, (int)K, &one, w, R_16BF, (int)K, x, R_16BF,
                (int)K, &zero, d, R_16BF, (int)N, COMPUTE_32F, GEMM_DEFAULT);
  if (e != 0) {
    fprintf(stderr, "xte bench: cublasGemmEx: status %d\n", e);
    return XTE_ERROR_DEVICE;
  }
  return XTE_SUCCESS;
}

/* ---------------------------------------------------------------- cases */

typedef struct gcase {
  char *name, *anchor, *library;
  char metric[16];
  double work;
  xte_gpu_setup_fn setup;
  xte_gpu_run_fn run;
  void *arg;
  int set_up, failed, want;
  char why[512];
  double *times; /* seconds per iteration, the median of each round */
  int nrounds;
  long iters; /* iterations of the last round */
} gcase;

static gcase *cases;
static int ncases, capcases;

static struct { char *lib, *why; } distrust[8];
static int ndistrust;

static char *dupstr(const char *s) {
  char *d = strdup(s ? s : "");
  if (!d) abort();
  return d;
}

static gcase *find(const char *name) {
  int i;
  for (i = 0; i < ncases; i++)
    if (strcmp(cases[i].name, name) == 0) return &cases[i];
  return NULL;
}

void xte_gpu_register(const char *name, const char *anchor, const char *metric, double work,
                      xte_gpu_setup_fn setup, xte_gpu_run_fn run, void *arg) {
  gcase *c = find(name);
  if (!c) {
    if (ncases == capcases) {
      capcases = capcases ? 2 * capcases : 64;
      cases = (gcase *)realloc(cases, (size_t)capcases * sizeof *cases);
      if (!cases) abort();
    }
    c = &cases[ncases++];
    memset(c, 0, sizeof *c);
    c->name = dupstr(name);
    c->library = dupstr("");
  } else {
    free(c->anchor);
  }
  c->anchor = dupstr(anchor);
  snprintf(c->metric, sizeof c->metric, "%s", metric ? metric : "GB/s");
  c->work = work;
  c->setup = setup;
  c->run = run;
  c->arg = arg;
}

void xte_gpu_uses(const char *name, const char *library) {
  gcase *c = name ? find(name) : NULL;
  if (!c) return;
  free(c->library);
  c->library = dupstr(library);
}

void xte_gpu_distrust(const char *library, const char *why) {
  if (!library || ndistrust == (int)(sizeof distrust / sizeof distrust[0])) return;
  distrust[ndistrust].lib = dupstr(library);
  distrust[ndistrust].why = dupstr(why ? why : "distrusted");
  ndistrust++;
}

static const char *distrusted(const char *lib) {
  int i;
  if (!lib || !*lib) return NULL;
  for (i = 0; i < ndistrust; i++)
    if (strcmp(distrust[i].lib, lib) == 0) return distrust[i].why;
  return NULL;
}

/* the copy anchor */
typedef struct copy_arg {
  size_t bytes;
  void *src, *dst;
} copy_arg;

static int copy_setup(void *arg, char *why, size_t n) {
  copy_arg *c = (copy_arg *)arg;
  c->src = xte_gpu_alloc(c->bytes);
  c->dst = xte_gpu_alloc(c->bytes);
  if (!c->src || !c->dst) {
    snprintf(why, n, "copy buffers of %zu bytes: %s", c->bytes, xte_last_error());
    return -1;
  }
  /* the bytes' values do not matter to a copy; set them once so nothing reads garbage */
  if (xte_memset(g.stream, c->src, 0x3C, c->bytes) != XTE_SUCCESS) {
    snprintf(why, n, "xte_memset: %s", xte_last_error());
    return -1;
  }
  return 0;
}

static xte_status copy_run(void *arg) {
  copy_arg *c = (copy_arg *)arg;
  int e = rt.MemcpyAsync(c->dst, c->src, c->bytes, CUDA_MEMCPY_D2D, g.native);
  if (e != CUDA_SUCCESS) {
    fprintf(stderr, "xte bench: cudaMemcpyAsync: %s\n", cuda_err(e));
    return XTE_ERROR_DEVICE;
  }
  return XTE_SUCCESS;
}

const char *xte_gpu_register_copy(double bytes) {
  size_t half = (size_t)ceil(bytes / 2.0);
  char name[64];
  copy_arg *c;
  half = (half + 255) / 256 * 256;
  if (half == 0) half = 256;
  snprintf(name, sizeof name, "copy/%zuB", 2 * half);
  if (find(name)) return find(name)->name;
  c = (copy_arg *)calloc(1, sizeof *c);
  if (!c) abort();
  c->bytes = half;
  xte_gpu_register(name, NULL, "GB/s", 2.0 * (double)half, copy_setup, copy_run, c);
  return find(name)->name;
}

/* ---------------------------------------------------------------- timing */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  double *t;
  double m;
  if (n <= 0) return NAN;
  t = (double *)malloc((size_t)n * sizeof *t);
  if (!t) abort();
  memcpy(t, v, (size_t)n * sizeof *t);
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  free(t);
  return m;
}

static void case_fail(gcase *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void case_fail(gcase *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->why, sizeof c->why, fmt, ap);
  va_end(ap);
  c->failed = 1;
}

#define BATCH 32
#define MAX_ITERS 100000

/* One round of case c: its median iteration time into c->times[c->nrounds++]. */
static void time_case(gcase *c, double min_time) {
  static void *ev[2 * BATCH];
  static int have_events;
  double *it = NULL, total = 0;
  long n = 0, cap = 0;
  int min_iters = g.smoke ? 2 : 3, e, i;
  xte_status st;
  if (!have_events) {
    for (i = 0; i < 2 * BATCH; i++)
      if ((e = rt.EventCreate(&ev[i])) != CUDA_SUCCESS) {
        case_fail(c, "cudaEventCreate: %s", cuda_err(e));
        return;
      }
    have_events = 1;
  }
  if (!c->set_up) {
    c->set_up = 1;
    if (c->setup && c->setup(c->arg, c->why, sizeof c->why) != 0) {
      c->failed = 1;
      if (!c->why[0]) snprintf(c->why, sizeof c->why, "setup failed");
      return;
    }
  }
  /* warm-up (and the check that the call runs) */
  st = c->run(c->arg);
  if (st != XTE_SUCCESS) {
    case_fail(c, "%s: %s", xte_status_string(st), xte_last_error());
    return;
  }
  if ((e = rt.StreamSynchronize(g.native)) != CUDA_SUCCESS) {
    case_fail(c, "cudaStreamSynchronize: %s", cuda_err(e));
    return;
  }
  while (n < MAX_ITERS && (n < min_iters || (!g.smoke && total < min_time))) {
    int b, nb = BATCH;
    if (g.smoke && min_iters - n < nb) nb = (int)(min_iters - n);
    for (b = 0; b < nb; b++) {
      /* the flush, outside the timed interval: a new value each time, so no write is elided */
      g.flush_value = (g.flush_value + 1) & 0xFF;
      if ((e = rt.MemsetAsync(g.flush, (int)g.flush_value, g.flush_bytes, g.native)) !=
              CUDA_SUCCESS ||
          (e = rt.EventRecord(ev[2 * b], g.native)) != CUDA_SUCCESS) {
        case_fail(c, "L2 flush / cudaEventRecord: %s", cuda_err(e));
        goto out;
      }
      st = c->run(c->arg);
      if (st != XTE_SUCCESS) {
        case_fail(c, "%s: %s", xte_status_string(st), xte_last_error());
        goto out;
      }
      if ((e = rt.EventRecord(ev[2 * b + 1], g.native)) != CUDA_SUCCESS) {
        case_fail(c, "cudaEventRecord: %s", cuda_err(e));
        goto out;
      }
    }
    if ((e = rt.EventSynchronize(ev[2 * nb - 1])) != CUDA_SUCCESS) {
      case_fail(c, "cudaEventSynchronize: %s", cuda_err(e));
      goto out;
    }
    if (n + nb > cap) {
      cap = cap ? 2 * cap : 256;
      while (cap < n + nb) cap *= 2;
      it = (double *)realloc(it, (size_t)cap * sizeof *it);
      if (!it) abort();
    }
    for (b = 0; b < nb; b++) {
      float ms = 0;
      if ((e = rt.EventElapsedTime(&ms, ev[2 * b], ev[2 * b + 1])) != CUDA_SUCCESS) {
        case_fail(c, "cudaEventElapsedTime: %s", cuda_err(e));
        goto out;
      }
      it[n++] = 1e-3 * (double)ms;
      total += 1e-3 * (double)ms;
    }
  }
  c->iters = n;
  c->times[c->nrounds++] = median(it, (int)n);
out:
  free(it);
}

/* ---------------------------------------------------------------- report */

static double scale_of(const char *metric) {
  return metric[0] == 'T' ? 1e-12 : metric[0] == 'M' ? 1e-6 : 1e-9;
}

static double rate_of(const gcase *c, const char *metric) {
  double t = median(c->times, c->nrounds);
  if (c->failed || c->nrounds == 0 || !(t > 0) || !(c->work > 0)) return NAN;
  return c->work / t * scale_of(metric);
}

/* c against its anchor a: the median of the rounds' ratios, else the ratio of the rates. */
static double ratio_of(const gcase *c, const gcase *a) {
  if (c->nrounds > 1 && c->nrounds == a->nrounds && c->work > 0 && a->work > 0) {
    double q[128];
    int i, n = c->nrounds < 128 ? c->nrounds : 128;
    for (i = 0; i < n; i++) q[i] = (c->work / c->times[i]) / (a->work / a->times[i]);
    return median(q, n);
  }
  return rate_of(c, c->metric) / rate_of(a, c->metric);
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

static void json_num(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.6g", v);
  else
    fputs("null", f);
}

static int write_json(const char *path) {
  FILE *f = fopen(path, "w");
  int i, first = 1, k;
  if (!f) {
    fprintf(stderr, "xte bench: --json %s: cannot write\n", path);
    return -1;
  }
  fprintf(f, "{\n  \"context\": {\n");
  for (k = 0; k < xte_bench_machine_count(); k++) {
    fprintf(f, "%s    ", k ? ",\n" : "");
    json_str(f, xte_bench_machine_key(k));
    fputs(": ", f);
    json_str(f, xte_bench_machine_value(k));
  }
  fprintf(f, "\n  },\n  \"benchmarks\": [");
  for (i = 0; i < ncases; i++) {
    const gcase *c = &cases[i];
    if (!c->want) continue;
    fprintf(f, "%s\n    {\"name\": ", first ? "" : ",");
    first = 0;
    json_str(f, c->name);
    fprintf(f, ", \"run_type\": \"iteration\", \"iterations\": %ld, \"real_time\": ", c->iters);
    json_num(f, c->nrounds ? median(c->times, c->nrounds) * 1e6 : NAN);
    fprintf(f, ", \"time_unit\": \"us\", \"work_per_iteration\": %.0f", c->work);
    fprintf(f, ", \"metric\": ");
    json_str(f, c->metric);
    fprintf(f, ", \"rate\": ");
    json_num(f, rate_of(c, c->metric));
    if (c->failed) {
      fprintf(f, ", \"error_occurred\": true, \"error_message\": ");
      json_str(f, c->why);
    }
    fputc('}', f);
  }
  fprintf(f, "\n  ],\n  \"xte_ratios\": [");
  first = 1;
  for (i = 0; i < ncases; i++) {
    const gcase *c = &cases[i], *a;
    const char *ref;
    if (!c->want || c->failed) continue;
    a = *c->anchor ? find(c->anchor) : NULL;
    ref = a ? (distrusted(c->library) ? distrusted(c->library) : distrusted(a->library)) : NULL;
    fprintf(f, "%s\n    {\"name\": ", first ? "" : ",");
    first = 0;
    json_str(f, c->name);
    fprintf(f, ", \"metric\": ");
    json_str(f, c->metric);
    fprintf(f, ", \"rate\": ");
    json_num(f, rate_of(c, c->metric));
    fprintf(f, ", \"anchor\": ");
    json_str(f, c->anchor);
    fprintf(f, ", \"anchor_rate\": ");
    json_num(f, a ? rate_of(a, c->metric) : NAN);
    fprintf(f, ", \"ratio\": ");
    json_num(f, a && !ref && !a->failed ? ratio_of(c, a) : NAN);
    if (ref) {
      fprintf(f, ", \"refused\": ");
      json_str(f, ref);
    }
    fputc('}', f);
  }
  fprintf(f, "\n  ]\n}\n");
  return fclose(f) == 0 ? 0 : -1;
}

int xte_gpu_bench_run(const char *filter, const char *json_path, double min_time, int rounds) {
  int i, r, n = 0, failed = 0, any_refused = 0;
  size_t w = 4;
  if (!g.open) {
    fprintf(stderr, "xte bench: the CUDA backend is not open\n");
    return 1;
  }
  if (!(min_time > 0)) min_time = 0.2;
  if (rounds < 1) rounds = 1;
  for (i = 0; i < ncases; i++)
    cases[i].want = !filter || !*filter || strstr(cases[i].name, filter) != NULL;
  for (i = 0; i < ncases; i++)
    if (cases[i].want && *cases[i].anchor && find(cases[i].anchor)) find(cases[i].anchor)->want = 1;
  for (i = 0; i < ncases; i++) {
    gcase *c = &cases[i];
    if (!c->want) continue;
    n++;
    free(c->times);
    c->times = (double *)calloc((size_t)rounds, sizeof *c->times);
    if (!c->times) abort();
    c->nrounds = 0;
    if (strlen(c->name) > w) w = strlen(c->name);
  }
  if (n == 0) {
    fprintf(stderr, "xte bench: no case matches filter '%s'\n", filter ? filter : "");
    return 2;
  }
  printf("\n%-*s %12s %10s %8s\n", (int)w, "case (cuda)", "time (us)", "rate", "iters");
  for (r = 0; r < rounds; r++) {
    if (rounds > 1) printf("round %d of %d\n", r + 1, rounds);
    for (i = 0; i < ncases; i++) {
      gcase *c = &cases[i];
      if (!c->want || c->failed) continue;
      time_case(c, min_time);
      if (c->failed)
        printf("%-*s FAILED: %s\n", (int)w, c->name, c->why);
      else
        printf("%-*s %12.2f %10.2f %8ld  %s\n", (int)w, c->name, c->times[c->nrounds - 1] * 1e6,
               c->work / c->times[c->nrounds - 1] * scale_of(c->metric), c->iters, c->metric);
      fflush(stdout);
    }
  }
  /* the ratio table, as bench/shim.cc prints it */
  printf("\n%-*s %14s  %-*s %12s %8s\n", (int)w, "case", "rate", (int)w, "anchor", "anchor rate",
         "ratio");
  for (i = 0; i < ncases; i++) {
    const gcase *c = &cases[i], *a;
    const char *ref;
    char rate[40], arate[40];
    if (!c->want) continue;
    if (c->failed) {
      failed = 1;
      printf("%-*s FAILED: %s\n", (int)w, c->name, c->why);
      continue;
    }
    snprintf(rate, sizeof rate, "%.2f %s", rate_of(c, c->metric), c->metric);
    if (!*c->anchor) {
      int k, is_anchor = 0;
      for (k = 0; k < ncases; k++) is_anchor |= cases[k].want && !strcmp(cases[k].anchor, c->name);
      printf("%-*s %14s  %-*s\n", (int)w, c->name, rate, (int)w,
             is_anchor ? "(anchor)" : "(no anchor)");
      continue;
    }
    a = find(c->anchor);
    if (!a) {
      printf("%-*s %14s  %-*s %12s\n", (int)w, c->name, rate, (int)w, c->anchor, "(unknown)");
      continue;
    }
    snprintf(arate, sizeof arate, "%.2f", rate_of(a, c->metric));
    ref = distrusted(c->library) ? distrusted(c->library) : distrusted(a->library);
    if (a->failed)
      printf("%-*s %14s  %-*s %12s %8s\n", (int)w, c->name, rate, (int)w, c->anchor, "FAILED", "-");
    else if (ref) {
      any_refused = 1;
      printf("%-*s %14s  %-*s %12s  refused\n", (int)w, c->name, rate, (int)w, c->anchor, arate);
    } else
      printf("%-*s %14s  %-*s %12s %8.3f\n", (int)w, c->name, rate, (int)w, c->anchor, arate,
             ratio_of(c, a));
  }
  if (any_refused)
    for (i = 0; i < ndistrust; i++)
      printf("ratios involving %s refused: %s\n", distrust[i].lib, distrust[i].why);
  fflush(stdout);
  if (json_path && *json_path && write_json(json_path) != 0) failed = 1;
  return failed ? 1 : 0;
}
