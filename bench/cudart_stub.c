/* A stand-in for libcudart.so for the tests of `xte bench --backend cuda` on machines without a
 * GPU (bench/CMakeLists.txt: libxte_cudart_stub.so, handed over as XTE_BENCH_CUDART): the calls
 * bench/bench_gpu.c resolves, on the host. "Device" memory is host memory (as in the host SIMT
 * runner's plugin, tests/simt/simt_plugin.cpp, which stands in for libxte_cuda.so beside it);
 * work is done when enqueued, so an event records the host clock.
 *
 *   XTE_CUDART_STUB_DEVICES=N   cudaGetDeviceCount's answer (default 1; 0: the no-device skip)
 *   XTE_CUDART_STUB_FAIL=name   that call (without "cuda") fails with error 999 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))

static int fails(const char *name) {
  const char *f = getenv("XTE_CUDART_STUB_FAIL");
  return f && strcmp(f, name) == 0;
}

typedef struct stub_event {
  double t;
} stub_event;

static int stream_tag; /* the one stream's address */

API int cudaGetDeviceCount(int *n) {
  const char *d = getenv("XTE_CUDART_STUB_DEVICES");
  if (fails("GetDeviceCount")) return 999;
  *n = d ? atoi(d) : 1;
  return *n > 0 ? 0 : 100; /* cudaErrorNoDevice */
}

API int cudaSetDevice(int d) {
  return fails("SetDevice") || d < 0 ? 999 : 0;
}

API int cudaDeviceGetAttribute(int *v, int attr, int dev) {
  (void)dev;
  switch (attr) {
    case 13:
      *v = 1000000;
      break; /* clock, kHz */
    case 16:
      *v = 4;
      break; /* SMs */
    case 36:
      *v = 2000000;
      break; /* memory clock, kHz */
    case 37:
      *v = 256;
      break; /* bus width */
    case 38:
      *v = 1 << 20;
      break; /* L2 bytes */
    case 75:
      *v = 9;
      break; /* compute capability */
    case 76:
      *v = 0;
      break;
    default:
      *v = 0;
  }
  return 0;
}

API int cudaRuntimeGetVersion(int *v) {
  *v = 13000;
  return 0;
}

API int cudaDriverGetVersion(int *v) {
  *v = 13000;
  return 0;
}

API const char *cudaGetErrorString(int e) {
  return e == 0     ? "no error"
         : e == 100 ? "no CUDA-capable device is detected (stub)"
                    : "stub error";
}

API int cudaStreamCreateWithFlags(void **s, unsigned flags) {
  (void)flags;
  if (fails("StreamCreateWithFlags")) return 999;
  *s = &stream_tag;
  return 0;
}

API int cudaStreamSynchronize(void *s) {
  (void)s;
  return 0;
}

API int cudaEventCreate(void **e) {
  stub_event *ev = (stub_event *)calloc(1, sizeof *ev);
  if (!ev) return 2;
  *e = ev;
  return 0;
}

API int cudaEventRecord(void *e, void *s) {
  struct timespec ts;
  (void)s;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ((stub_event *)e)->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  return 0;
}

API int cudaEventSynchronize(void *e) {
  (void)e;
  return 0;
}

API int cudaEventElapsedTime(float *ms, void *a, void *b) {
  double d = ((stub_event *)b)->t - ((stub_event *)a)->t;
  *ms = (float)(d * 1e3);
  if (*ms <= 0) *ms = 1e-4f; /* a clock step too fine to see */
  return 0;
}

API int cudaMemsetAsync(void *p, int v, size_t n, void *s) {
  (void)s;
  if (fails("MemsetAsync")) return 999;
  memset(p, v, n);
  return 0;
}

API int cudaMemcpyAsync(void *d, const void *src, size_t n, int kind, void *s) {
  (void)kind;
  (void)s;
  if (fails("MemcpyAsync")) return 999;
  memmove(d, src, n);
  return 0;
}
