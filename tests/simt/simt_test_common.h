/* The harness shared by the SIMT runner's tests (tests/simt/test_simt_*.cpp): the two streams
 * (the CPU backend and the CUDA backend that is the runner's stand-in plugin), the verdict
 * counters, byte comparison with the CPU backend and the report of differing bytes, status /
 * message comparison of a refusal, the xorshift generator, argument parsing (--reduced, --full,
 * --verbose, --warp N) and the summary line. Included by exactly one source file of each test
 * program (everything here is static).
 *
 * A test program:
 *   int main(int argc, char **argv) {
 *     const simt_args args = simt_parse_args(argc, argv);   (then its own list flags from args)
 *     if (!simt_open("simt foo", args.warp)) return 2;       (streams, the plugin check)
 *     std::printf("simt foo: CPU ISA %s, %s list\n", simt_isa(), ...);
 *     ...cases: report / same / both_status / run_both...
 *     return simt_close("simt foo");                         (summary; 1 on any mismatch)
 *   }
 * Define SIMT_TEST_SEED before the include for another xorshift seed. */
#ifndef SIMT_TEST_COMMON_H
#define SIMT_TEST_COMMON_H

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "xte/xte.h"

#ifndef SIMT_PLUGIN_DIR
#error "SIMT_PLUGIN_DIR: the folder of the SIMT runner's libxte_cuda.so"
#endif

/* ---------------------------------------------------------------- device mode
 * SIMT_DEVICE_MODE (tests/cmake/gpu.cmake: test_device_moe, test_device_router, for
 * tests/device/run.sh): the same cases against the real CUDA plugin on a GPU. Every buffer (buf)
 * is managed memory (cuMemAllocManaged of libcuda.so.1, the runtime's primary context on device
 * 0), so that the CPU backend and the GPU read and write the same bytes; CUDA_LAUNCH_BLOCKING=1
 * makes every launch complete before the xte call returns, so the host compares finished bytes.
 * SIMT_DEVICE_MEMORY=host: plain host memory instead (the dry run, where the plugin is the host
 * SIMT runner's and there is no driver). No fallback otherwise: without the driver's managed
 * memory the program stops (FATAL), never runs on host memory unseen. */
#ifdef SIMT_DEVICE_MODE
#include <dlfcn.h>

#include <new>

struct simt_dev_api {
  int ready = 0, host = 0;
  int (*alloc_managed)(unsigned long long *, size_t, unsigned) = nullptr;
  int (*mem_free)(unsigned long long) = nullptr;
};

static inline simt_dev_api &simt_dev() {
  static simt_dev_api api;
  if (api.ready) return api;
  api.ready = 1;
  const char *m = std::getenv("SIMT_DEVICE_MEMORY");
  if (m && !std::strcmp(m, "host")) {
    api.host = 1;
    return api;
  }
  setenv("CUDA_LAUNCH_BLOCKING", "1", 1);
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  int (*init)(unsigned) = nullptr;
  int (*dev_get)(int *, int) = nullptr;
  int (*retain)(void **, int) = nullptr;
  int (*set_current)(void *) = nullptr;
  int dev = 0;
  void *ctx = nullptr;
  if (lib) {
    *(void **)&init = dlsym(lib, "cuInit");
    *(void **)&dev_get = dlsym(lib, "cuDeviceGet");
    *(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&set_current = dlsym(lib, "cuCtxSetCurrent");
    *(void **)&api.alloc_managed = dlsym(lib, "cuMemAllocManaged");
    *(void **)&api.mem_free = dlsym(lib, "cuMemFree_v2");
  }
  if (!lib || !init || !dev_get || !retain || !set_current || !api.alloc_managed || !api.mem_free ||
      init(0) != 0 || dev_get(&dev, 0) != 0 || retain(&ctx, dev) != 0 || set_current(ctx) != 0) {
    std::fprintf(stderr,
                 "FATAL: device mode: no managed memory from libcuda.so.1 (%s); "
                 "SIMT_DEVICE_MEMORY=host runs on host memory\n",
                 lib ? "a driver call failed" : dlerror());
    std::exit(2);
  }
  return api;
}

template <class T>
struct simt_dev_alloc {
  using value_type = T;
  simt_dev_alloc() = default;
  template <class U>
  simt_dev_alloc(const simt_dev_alloc<U> &) {}
  T *allocate(size_t n) {
    simt_dev_api &api = simt_dev();
    const size_t bytes = n > 0 ? n * sizeof(T) : 1;
    if (api.host) {
      void *p = std::malloc(bytes);
      if (!p) throw std::bad_alloc();
      return (T *)p;
    }
    unsigned long long p = 0;
    if (api.alloc_managed(&p, bytes, 1 /* CU_MEM_ATTACH_GLOBAL */) != 0) throw std::bad_alloc();
    return (T *)(uintptr_t)p;
  }
  void deallocate(T *p, size_t) {
    simt_dev_api &api = simt_dev();
    if (api.host)
      std::free(p);
    else
      (void)api.mem_free((unsigned long long)(uintptr_t)p);
  }
  bool operator==(const simt_dev_alloc &) const { return true; }
  bool operator!=(const simt_dev_alloc &) const { return false; }
};
#endif

/* ---------------------------------------------------------------- streams and verdicts */

static xte_stream gpu, cpu;
/* failures: mismatches; cases_run: cases compared; refused: cases both backends refused alike */
static int failures, cases_run, refused, verbose;
static const int max_reported = 40;
/* set: the summary also counts the mismatches by operation (a description up to its first space) */
static bool report_by_op;
static std::map<std::string, int> failures_by_op;
static std::chrono::steady_clock::time_point simt_t0;

#ifdef SIMT_DEVICE_MODE
typedef std::vector<uint8_t, simt_dev_alloc<uint8_t>> buf;
#else
typedef std::vector<uint8_t> buf;
#endif

static inline void report(const std::string &desc, const char *what) {
  failures++;
  if (report_by_op) failures_by_op[desc.substr(0, desc.find(' '))]++;
  if (failures <= max_reported) std::fprintf(stderr, "MISMATCH %s: %s\n", desc.c_str(), what);
}

/* The n bytes at g (the SIMT runner's) and c (the CPU's) equal; else one report: how many
 * differ, the first one. */
static inline bool same(const char *what, const std::string &desc, const void *g, const void *c,
                        size_t n) {
#ifdef SIMT_DEVICE_MODE
  (void)xte_stream_synchronize(gpu); /* work the launches left queued (a memset) done first */
#endif
  const uint8_t *a = (const uint8_t *)g, *b = (const uint8_t *)c;
  if (n == 0 || std::memcmp(a, b, n) == 0) return true;
  size_t i = 0, diff = 0;
  while (a[i] == b[i]) i++;
  for (size_t j = 0; j < n; j++) diff += a[j] != b[j];
  char m[200];
  std::snprintf(m, sizeof m, "%s: %zu of %zu bytes differ, first at %zu: simt 0x%02x, cpu 0x%02x",
                what, diff, n, i, a[i], b[i]);
  report(desc, m);
  return false;
}

static inline bool same(const char *what, const std::string &desc, const buf &g, const buf &c) {
  if (g.size() != c.size()) {
    report(desc, "buffer sizes differ (test bug)");
    return false;
  }
  return same(what, desc, g.data(), c.data(), g.size());
}

/* Both backends on one case: the same status, and on a refusal the same message. Counts the case
 * (and a refusal); false when the statuses differ (nothing more to compare). */
static inline bool both_status(const std::string &d, xte_status sc, const std::string &mc,
                               xte_status sg, const std::string &mg) {
  cases_run++;
  if (sc != sg) {
    char m[600];
    std::snprintf(m, sizeof m, "status cpu %d (%s), simt %d (%s)", (int)sc, mc.c_str(), (int)sg,
                  mg.c_str());
    report(d, m);
    return false;
  }
  if (sc != XTE_SUCCESS) {
    refused++;
    if (verbose) std::printf("refused %s: %s\n", d.c_str(), mc.c_str());
    if (mc != mg) report(d, ("message cpu '" + mc + "', simt '" + mg + "'").c_str());
  }
  return true;
}

/* Runs f(stream) on the CPU stream, then on the SIMT stream; compares as both_status. */
template <class F>
static inline bool run_both(const std::string &d, F &&f) {
  const xte_status sc = f(cpu);
  const std::string mc = sc ? xte_last_error() : "";
  const xte_status sg = f(gpu);
  const std::string mg = sg ? xte_last_error() : "";
  return both_status(d, sc, mc, sg, mg);
}

/* ---------------------------------------------------------------- inputs */

#ifndef SIMT_TEST_SEED
#define SIMT_TEST_SEED 0x9E3779B97F4A7C15ull
#endif
static uint64_t rng = SIMT_TEST_SEED;
static inline uint64_t rnd() {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static inline uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
static inline float bitsf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static inline size_t esz(int dt) {
  return xte_dtype_size((xte_dtype)dt);
}

/* A [rows, cols] view of b with leading dimension ld (0: the library's default, cols). */
static inline xte_tensor t2(buf &b, int dt, int64_t rows, int64_t cols, int64_t ld = 0) {
  xte_tensor t = xte_tensor_2d(b.data(), (xte_dtype)dt, rows, cols);
  t.ld = ld;
  return t;
}

/* ---------------------------------------------------------------- arguments, start, summary */

struct simt_args {
  int reduced = 0; /* --reduced: the short list (sanitized builds, the ThreadSanitizer variant) */
  int full = 0;    /* --full: every case (never in CI) */
  int verbose = 0; /* --verbose: every refusal and its message */
  int warp = 32;   /* --warp 32|64|128: the runner's warp size (SIMT_WARP_SIZE for the plugin) */
  int bad = 0;     /* an unusable --warp */
};

/* Unknown arguments are ignored. Sets the global verbose. */
static inline simt_args simt_parse_args(int argc, char **argv) {
  simt_args a;
  for (int i = 1; i < argc; i++)
    if (!std::strcmp(argv[i], "--reduced"))
      a.reduced = 1;
    else if (!std::strcmp(argv[i], "--full"))
      a.full = 1;
    else if (!std::strcmp(argv[i], "--verbose"))
      a.verbose = 1;
    else if (!std::strcmp(argv[i], "--warp") && i + 1 < argc)
      a.warp = std::atoi(argv[++i]);
  if (a.warp != 32 && a.warp != 64 && a.warp != 128) {
    std::fprintf(stderr, "--warp: 32, 64 or 128\n");
    a.bad = 1;
  }
  verbose = a.verbose;
  return a;
}

static inline const char *simt_isa() {
  return xte_cpu_isa_name(xte_cpu_get_isa());
}

/* Points libxte at the runner's plugin (warp: its warp size; 0 leaves SIMT_WARP_SIZE alone),
 * creates the two streams and checks that the CUDA backend is that plugin (at that warp size).
 * Under ThreadSanitizer the CPU backend (the reference, not built with TSan: its pool's
 * synchronization is invisible to TSan; its bytes do not depend on the threads) runs on the
 * calling thread only. Starts the clock of the summary. false (after a FATAL line) on failure. */
static inline bool simt_open(const char *name, int warp) {
#ifdef SIMT_DEVICE_MODE
  /* the plugin libxte finds itself (XTE_PLUGIN_DIR as the caller set it); any device */
  (void)warp;
  (void)simt_dev(); /* the driver's context (and CUDA_LAUNCH_BLOCKING) before the plugin's */
  simt_t0 = std::chrono::steady_clock::now();
  if (xte_stream_create(XTE_BACKEND_CPU, 0, nullptr, &cpu) != XTE_SUCCESS ||
      xte_stream_create(XTE_BACKEND_CUDA, 0, nullptr, &gpu) != XTE_SUCCESS) {
    std::fprintf(stderr, "FATAL %s: streams: %s\n", name, xte_last_error());
    return false;
  }
  xte_backend_info dbi;
  if (xte_get_backend_info(&dbi) == XTE_SUCCESS && dbi.num_cuda_gpus > 0)
    std::printf("%s: device mode on %s (%s), %s memory\n", name, dbi.cuda_gpus[0].name,
                dbi.cuda_gpus[0].arch, simt_dev().host ? "host" : "managed");
  return true;
#endif
  setenv("XTE_PLUGIN_DIR", SIMT_PLUGIN_DIR, 1);
  if (warp) {
    char w[16];
    std::snprintf(w, sizeof w, "%d", warp);
    setenv("SIMT_WARP_SIZE", w, 1);
  }
#if defined(__SANITIZE_THREAD__)
  xte_cpu_set_num_threads(1);
#endif
  simt_t0 = std::chrono::steady_clock::now();
  if (xte_stream_create(XTE_BACKEND_CPU, 0, nullptr, &cpu) != XTE_SUCCESS ||
      xte_stream_create(XTE_BACKEND_CUDA, 0, nullptr, &gpu) != XTE_SUCCESS) {
    std::fprintf(stderr, "FATAL %s: streams: %s\n", name, xte_last_error());
    return false;
  }
  xte_backend_info bi;
  char arch[32];
  std::snprintf(arch, sizeof arch, "simt_w%d", warp);
  if (xte_get_backend_info(&bi) != XTE_SUCCESS || bi.num_cuda_gpus != 1 ||
      std::strcmp(bi.cuda_gpus[0].name, "simt host runner") != 0 ||
      (warp && std::strcmp(bi.cuda_gpus[0].arch, arch) != 0)) {
    std::fprintf(stderr, "FATAL %s: libxte loaded another libxte_cuda.so than %s (or not at %s)\n",
                 name, SIMT_PLUGIN_DIR, warp ? arch : "its warp size");
    return false;
  }
  return true;
}

/* The summary ("<name>: N cases (R refused alike by both backends), F mismatches, S s"), the
 * streams destroyed; the exit status: 1 on any mismatch. */
static inline int simt_close(const char *name) {
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - simt_t0).count();
  if (failures > max_reported) std::fprintf(stderr, "... %d more\n", failures - max_reported);
  for (const auto &f : failures_by_op)
    std::fprintf(stderr, "mismatches in %s: %d\n", f.first.c_str(), f.second);
  std::printf("%s: %d cases (%d refused alike by both backends), %d mismatches, %.1f s\n", name,
              cases_run, refused, failures, secs);
  xte_stream_destroy(gpu);
  xte_stream_destroy(cpu);
  return failures ? 1 : 0;
}

#endif /* SIMT_TEST_COMMON_H */
