#define _GNU_SOURCE /* pthread_setaffinity_np, madvise */
/* Helpers shared by the benchmark suites (see bench_common.h). */
#include "bench_common.h"

#include "cpu/xte_spin.h"
#ifndef XTE_BENCH_NO_OPENBLAS
#include "openblas_coretype.h"

#include <cblas.h>
#endif
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---------------------------------------------------------------- buffers */

void *xte_bench_alloc(size_t bytes) {
  size_t align = bytes >= 4 * XTE_BENCH_MiB ? 2 * XTE_BENCH_MiB : 4096;
  size_t rounded = (bytes + align - 1) / align * align;
  void *p = NULL;
  if (rounded == 0) rounded = align;
  if (posix_memalign(&p, align, rounded) != 0 || p == NULL) {
    fprintf(stderr, "xte bench: out of memory (%zu bytes)\n", bytes);
    abort();
  }
#ifdef MADV_HUGEPAGE
  if (align > 4096) (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
  memset(p, 0, rounded);
  return p;
}

void xte_bench_free(void *p) {
  free(p);
}

/* ---------------------------------------------------------------- random data */

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void xte_bench_fill_f32(float *x, size_t n, uint64_t seed) {
  uint64_t s = seed;
  float mag = 1.0f;
  size_t i;
  for (i = 0; i < n; i++) {
    uint64_t r = splitmix64(&s);
    if (i % 128 == 0) {
      int e = (int)(r % 17) - 8; /* 2^-8 .. 2^8 */
      mag = e >= 0 ? (float)(1u << e) : 1.0f / (float)(1u << -e);
      r = splitmix64(&s);
    }
    /* uniform in [-1, 1) from the top 24 bits */
    x[i] = mag * ((float)(r >> 40) * (1.0f / 8388608.0f) - 1.0f);
  }
}

void xte_bench_fill(void *x, xte_dtype dtype, size_t n, uint64_t seed) {
  const size_t chunk = (size_t)1 << 16;
  float *tmp;
  size_t i;
  if (dtype == XTE_DTYPE_FP32) {
    xte_bench_fill_f32((float *)x, n, seed);
    return;
  }
  tmp = (float *)malloc(chunk * sizeof(float));
  if (!tmp) abort();
  for (i = 0; i < n; i += chunk) {
    size_t m = n - i < chunk ? n - i : chunk;
    xte_tensor in, out;
    xte_bench_fill_f32(tmp, m, seed + i); /* a different stream per chunk */
    in = xte_tensor_1d(tmp, XTE_DTYPE_FP32, (int64_t)m);
    out = xte_tensor_1d((char *)x + i * xte_dtype_size(dtype), dtype, (int64_t)m);
    if (xte_cast(&in, &out, 1, NULL) != XTE_SUCCESS) {
      fprintf(stderr, "xte bench: xte_cast to %s failed: %s\n", xte_dtype_name(dtype),
              xte_last_error());
      abort();
    }
  }
  free(tmp);
}

/* ---------------------------------------------------------------- thread team */

#define TEAM_MAX 256

static struct {
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  int created;
  _Atomic unsigned long gen, pending;
  int nt;
  xte_bench_team_fn fn;
  void *ctx;
} team = {PTHREAD_MUTEX_INITIALIZER,
          PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER,
          0,
          0,
          0,
          0,
          NULL,
          NULL};

static pthread_mutex_t team_job = PTHREAD_MUTEX_INITIALIZER;

static void *team_worker(void *arg) {
  int me = (int)(intptr_t)arg;
  unsigned long seen = 0;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (ncpu > 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)(me % ncpu), &set);
    (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  }
  for (;;) { /* spin, then sleep, as xte's own pool does (cpu/xte_spin.h) */
    xte_bench_team_fn fn;
    void *ctx;
    int nt;
    (void)xte_spin_wait(&team.gen, seen, 1);
    pthread_mutex_lock(&team.mu);
    while (atomic_load(&team.gen) == seen) pthread_cond_wait(&team.wake, &team.mu);
    seen = atomic_load(&team.gen);
    fn = team.fn;
    ctx = team.ctx;
    nt = team.nt;
    pthread_mutex_unlock(&team.mu);
    if (me < nt) {
      fn(ctx, me, nt);
      if (atomic_fetch_sub(&team.pending, 1) == 1) {
        pthread_mutex_lock(&team.mu);
        pthread_cond_signal(&team.done);
        pthread_mutex_unlock(&team.mu);
      }
    }
  }
  return NULL;
}

int xte_bench_threads(void) {
  int n = xte_cpu_get_num_threads();
  if (n < 1) n = 1;
  if (n > TEAM_MAX) n = TEAM_MAX;
  return n;
}

void xte_bench_team_run(xte_bench_team_fn fn, void *ctx) {
  int nt = xte_bench_threads();
  if (nt <= 1) {
    fn(ctx, 0, 1);
    return;
  }
  pthread_mutex_lock(&team_job);
  pthread_mutex_lock(&team.mu);
  while (team.created < nt - 1) {
    pthread_t th;
    int id = team.created + 1;
    if (pthread_create(&th, NULL, team_worker, (void *)(intptr_t)id) != 0) break;
    pthread_detach(th);
    team.created++;
  }
  if (team.created < nt - 1) nt = team.created + 1;
  team.fn = fn;
  team.ctx = ctx;
  team.nt = nt;
  atomic_store(&team.pending, (unsigned long)(nt - 1));
  atomic_fetch_add_explicit(&team.gen, 1, memory_order_release);
  pthread_cond_broadcast(&team.wake);
  pthread_mutex_unlock(&team.mu);
  fn(ctx, 0, nt);
  if (!xte_spin_wait(&team.pending, 0, 0)) {
    pthread_mutex_lock(&team.mu);
    while (atomic_load(&team.pending) > 0) pthread_cond_wait(&team.done, &team.mu);
    pthread_mutex_unlock(&team.mu);
  }
  pthread_mutex_unlock(&team_job);
}

/* ---------------------------------------------------------------- streaming copy */

typedef struct copy_job {
  char *dst;
  const char *src;
  size_t bytes;
} copy_job;

static void copy_part(void *vctx, int t, int nt) {
  const copy_job *j = (const copy_job *)vctx;
  /* parts on 4 KiB boundaries */
  size_t pages = (j->bytes + 4095) / 4096;
  size_t b = pages * (size_t)t / (size_t)nt * 4096, e = pages * (size_t)(t + 1) / (size_t)nt * 4096;
  if (e > j->bytes) e = j->bytes;
  if (b < e) memcpy(j->dst + b, j->src + b, e - b);
}

void xte_bench_parallel_copy(void *dst, const void *src, size_t bytes) {
  copy_job j;
  j.dst = (char *)dst;
  j.src = (const char *)src;
  j.bytes = bytes;
  xte_bench_team_run(copy_part, &j);
}

typedef struct copy_case {
  char name[96];
  size_t bytes;
  void *src, *dst;
} copy_case;

static void run_copy_case(xte_bench_state *st, void *arg) {
  copy_case *c = (copy_case *)arg;
  if (!c->src) {
    c->src = xte_bench_alloc(c->bytes);
    c->dst = xte_bench_alloc(c->bytes);
    xte_bench_fill_f32((float *)c->src, c->bytes / 4, 1);
  }
  while (xte_bench_keep_running(st)) xte_bench_parallel_copy(c->dst, c->src, c->bytes);
  xte_bench_set_bytes(st, 2.0 * (double)c->bytes);
}

const char *xte_bench_register_copy(const char *label, size_t bytes) {
  copy_case *c = (copy_case *)calloc(1, sizeof *c); /* lives as long as the process */
  if (!c) abort();
  snprintf(c->name, sizeof c->name, "copy/%s", label);
  c->bytes = bytes;
  xte_bench_register(c->name, NULL, "GB/s", run_copy_case, c);
  return c->name;
}

/* ---------------------------------------------------------------- the machine record */

#define MACHINE_MAX 64

static struct {
  int n, collected;
  char key[MACHINE_MAX][40];
  char *val[MACHINE_MAX];
} machine;

static void machine_set(const char *key, const char *val) {
  int i;
  for (i = 0; i < machine.n; i++)
    if (strcmp(machine.key[i], key) == 0) break;
  if (i == machine.n) {
    if (machine.n == MACHINE_MAX) return;
    snprintf(machine.key[machine.n++], sizeof machine.key[0], "%s", key);
  }
  free(machine.val[i]);
  machine.val[i] = strdup(val ? val : "");
  if (!machine.val[i]) abort();
}

static void machine_setf(const char *key, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void machine_setf(const char *key, const char *fmt, ...) {
  char b[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  machine_set(key, b);
}

/* The value of "key : value" of the first CPU in /proc/cpuinfo into out (empty if none). */
static void cpuinfo_field(const char *key, char *out, size_t size) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[8192];
  size_t n = strlen(key);
  out[0] = 0;
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    char *c = strchr(line, ':');
    size_t k;
    if (strncmp(line, key, n) != 0 || !c) continue;
    for (k = n; line + k < c; k++)
      if (line[k] != ' ' && line[k] != '\t') break;
    if (line + k != c) continue; /* "model" must not match "model name" */
    c++;
    while (*c == ' ') c++;
    c[strcspn(c, "\n")] = 0;
    snprintf(out, size, "%s", c);
    break;
  }
  fclose(f);
}

/* 1 if the CPU's flags (/proc/cpuinfo; else the compiler's cpuid check) have `flag`. */
static int cpu_has(const char *flags, const char *flag) {
  size_t n = strlen(flag);
  const char *p = flags;
  if (!*flags) {
#if defined(__x86_64__) || defined(__i386__)
    if (strcmp(flag, "avx2") == 0) return __builtin_cpu_supports("avx2");
    if (strcmp(flag, "avx512f") == 0) return __builtin_cpu_supports("avx512f");
#endif
    return 0;
  }
  while ((p = strstr(p, flag)) != NULL) {
    if ((p == flags || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return 1;
    p += n;
  }
  return 0;
}

/* The first line of a small file into out, without the newline ("" if unreadable). */
static void read_line(const char *path, char *out, size_t size) {
  FILE *f = fopen(path, "r");
  out[0] = 0;
  if (!f) return;
  if (!fgets(out, (int)size, f)) out[0] = 0;
  out[strcspn(out, "\n")] = 0;
  fclose(f);
}

double xte_bench_mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  double v = -1;
  if (!f) return -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long long kb;
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
      v = (double)kb * 1024.0;
      break;
    }
  }
  fclose(f);
  return v;
}

static xte_backend_info *binfo(void) {
  static xte_backend_info info;
  static int have;
  if (!have) {
    memset(&info, 0, sizeof info);
    if (xte_get_backend_info(&info) != XTE_SUCCESS) memset(&info, 0, sizeof info);
    have = 1;
  }
  return &info;
}

size_t xte_bench_llc_bytes(void) {
  const xte_backend_info *i = binfo();
  if (i->l3_bytes) return i->l3_bytes;
  if (i->l2_bytes) return i->l2_bytes;
  return 32 * XTE_BENCH_MiB;
}

size_t xte_bench_dram_bytes(void) {
  static size_t once; /* decided once: the record states the size the cases use */
  size_t b;
  double avail;
  if (once) return once;
  b = 4 * xte_bench_llc_bytes();
  avail = xte_bench_mem_available();
  if (b < 64 * XTE_BENCH_MiB) b = 64 * XTE_BENCH_MiB;
  if (avail >= 1 && (double)b > avail / 8) b = (size_t)(avail / 8);
  if (b < 4 * XTE_BENCH_MiB) b = 4 * XTE_BENCH_MiB;
  once = b / XTE_BENCH_MiB * XTE_BENCH_MiB;
  return once;
}

static const char *simd_flags(const char *flags, char *out, size_t size) {
  static const char *const want[] = {"sse4_2",   "avx",         "avx2",        "fma",
                                     "f16c",     "avx512f",     "avx512bw",    "avx512vl",
                                     "avx512dq", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                                     "amx_bf16", "amx_int8",    NULL};
  size_t k, used = 0;
  out[0] = 0;
  for (k = 0; want[k]; k++)
    if (cpu_has(flags, want[k]) && used + strlen(want[k]) + 2 < size)
      used += (size_t)snprintf(out + used, size - used, "%s%s", used ? " " : "", want[k]);
  return out;
}

static char cpu_flags[8192];

static void machine_collect(void) {
  const xte_backend_info *bi = binfo();
  char b[1024], fam[64], mod[64], step[64], ld[256];
#ifndef XTE_BENCH_NO_OPENBLAS
  const char *ct = getenv("OPENBLAS_CORETYPE"), *mark = getenv("XTE_BENCH_OPENBLAS_REEXEC");
#endif
  machine.collected = 1;
  cpuinfo_field("flags", cpu_flags, sizeof cpu_flags);
  cpuinfo_field("model name", b, sizeof b);
  machine_set("cpu_model", *b ? b : bi->cpu_name);
  cpuinfo_field("cpu family", fam, sizeof fam);
  cpuinfo_field("model", mod, sizeof mod);
  cpuinfo_field("stepping", step, sizeof step);
  machine_setf("cpu_family_model_stepping", "%s/%s/%s", *fam ? fam : "?", *mod ? mod : "?",
               *step ? step : "?");
  machine_set("cpu_simd_flags", simd_flags(cpu_flags, b, sizeof b));
  machine_set("xte_cpu_isa", xte_cpu_isa_name(xte_cpu_get_isa()));
  machine_set("xte_cpu_isa_best", xte_cpu_isa_name(bi->cpu_isa_best));
  machine_setf("cores", "%d", bi->cpu_cores);
  machine_setf("logical_cpus", "%ld", sysconf(_SC_NPROCESSORS_ONLN));
  machine_setf("xte_cpu_threads", "%d", xte_cpu_get_num_threads());
  {
    /* which kernels the exact e4m3 GEMM runs on (AMX-INT8 digit products or fp64 FMAs) */
    static char info[4096];
    const char *l = NULL;
    if (xte_backend_info_string(info, sizeof info) == XTE_SUCCESS)
      l = strstr(info, "exact e4m3 GEMM: ");
    if (l) {
      l += strlen("exact e4m3 GEMM: ");
      snprintf(b, sizeof b, "%.*s", (int)strcspn(l, "\n"), l);
    }
    machine_set("xte_gemm_e4m3", l ? b : "(unknown)");
    /* and for few rows (AVX512-VNNI digit products, or not in use) */
    l = strstr(info, "exact e4m3 GEMM, ");
    if (l) {
      l += strlen("exact e4m3 GEMM, ");
      snprintf(b, sizeof b, "%.*s", (int)strcspn(l, "\n"), l);
    }
    machine_set("xte_gemm_e4m3_small_m", l ? b : "(unknown)");
  }
  machine_setf("bench_threads", "%d", xte_bench_threads());
  machine_setf("l1d_bytes", "%zu", bi->l1d_bytes);
  machine_setf("l2_bytes", "%zu", bi->l2_bytes);
  machine_setf("l3_bytes", "%zu", bi->l3_bytes);
  machine_setf("dram_case_bytes", "%zu", xte_bench_dram_bytes());
  read_line("/sys/kernel/mm/transparent_hugepage/enabled", b, sizeof b);
  machine_set("transparent_hugepage", *b ? b : "(unknown)");
  read_line("/proc/loadavg", ld, sizeof ld);
  machine_set("load_avg_1_5_15", ld);
#ifndef XTE_BENCH_NO_OPENBLAS
  machine_set("openblas_corename", openblas_get_corename());
  machine_setf("openblas_num_threads", "%d", openblas_get_num_threads());
  snprintf(b, sizeof b, "%s", openblas_get_config());
  b[strcspn(b, "\n")] = 0;
  machine_set("openblas_config", b);
  if (!ct)
    machine_set("openblas_coretype", "(not set: OpenBLAS's own choice)");
  else if (mark)
    machine_setf("openblas_coretype", "%s (set by xte bench: OpenBLAS had picked %s)", ct, mark);
  else
    machine_setf("openblas_coretype", "%s (set by the user)", ct);
  if (!xte_bench_machine_get("openblas_anchor")) machine_set("openblas_anchor", "trusted");
#endif
}

static void machine_need(void) {
  if (!machine.collected) machine_collect();
}

int xte_bench_machine_count(void) {
  machine_need();
  return machine.n;
}

const char *xte_bench_machine_key(int i) {
  machine_need();
  return i >= 0 && i < machine.n ? machine.key[i] : NULL;
}

const char *xte_bench_machine_value(int i) {
  machine_need();
  return i >= 0 && i < machine.n ? machine.val[i] : NULL;
}

const char *xte_bench_machine_get(const char *key) {
  int i;
  for (i = 0; i < machine.n; i++)
    if (strcmp(machine.key[i], key) == 0) return machine.val[i];
  return NULL;
}

void xte_bench_machine_add(const char *key, const char *value) {
  if (key) machine_set(key, value);
}

#ifndef XTE_BENCH_NO_OPENBLAS
static void distrust_openblas(const char *why) {
  machine_setf("openblas_anchor", "REFUSED: %s", why);
  xte_bench_distrust("openblas", why);
}

void xte_bench_machine_setup(char **main_argv, FILE *f) {
  const char *core = openblas_get_corename();
  const char *ct = getenv("OPENBLAS_CORETYPE"), *mark = getenv("XTE_BENCH_OPENBLAS_REEXEC");
  int avx2, avx512f, bf16, held, nt = xte_bench_threads(), i;
  char why[512];
  cpuinfo_field("flags", cpu_flags, sizeof cpu_flags);
  avx2 = cpu_has(cpu_flags, "avx2");
  avx512f = cpu_has(cpu_flags, "avx512f");
  bf16 = cpu_has(cpu_flags, "avx512_bf16");
  held = xte_cpu_get_isa() == XTE_CPU_ISA_AVX2 && avx512f;
  if (main_argv && !ct && !mark) {
    /* xte held to AVX2 on an AVX-512 CPU: the anchor an AVX2 machine has (else a ratio sets
     * xte's AVX2 kernels against OpenBLAS's AVX-512 ones) */
    const char *want = held ? xte_bench_openblas_coretype_for_avx2(core, avx2)
                            : xte_bench_openblas_coretype_for(core, avx2, avx512f, bf16);
    if (want) {
      /* OpenBLAS read its target in its constructor: only a fresh process takes a new one */
      if (f && held) {
        fprintf(f,
                "xte bench: xte's kernels are held to AVX2 and OpenBLAS picked its %s kernels on "
                "this AVX-512 CPU; running again with OPENBLAS_CORETYPE=%s (an AVX2 machine's)\n",
                core, want);
        fflush(f);
      } else if (f) {
        fprintf(f,
                "xte bench: OpenBLAS picked its generic %s kernels on this %s CPU; running again "
                "with OPENBLAS_CORETYPE=%s\n",
                core, avx512f ? "AVX-512" : "AVX2", want);
        fflush(f);
      }
      fflush(stdout);
      if (setenv("OPENBLAS_CORETYPE", want, 1) == 0 &&
          setenv("XTE_BENCH_OPENBLAS_REEXEC", core && *core ? core : "?", 1) == 0)
        execv("/proc/self/exe", main_argv);
      /* exec failed: carry on, distrusted below */
      if (f) fprintf(f, "xte bench: re-exec failed: %s\n", strerror(errno));
      unsetenv("OPENBLAS_CORETYPE");
      unsetenv("XTE_BENCH_OPENBLAS_REEXEC");
    }
  }
  machine_collect();
  openblas_set_num_threads(nt);
  machine_setf("openblas_num_threads", "%d", openblas_get_num_threads());
  if (xte_bench_openblas_core_is_generic(core) && (avx2 || avx512f)) {
    snprintf(why, sizeof why,
             "OpenBLAS runs its generic %s kernels on this %s CPU%s%s%s: set OPENBLAS_CORETYPE to "
             "a target this OpenBLAS has (Cooperlake, SkylakeX, Haswell)",
             core, avx512f ? "AVX-512" : "AVX2", ct ? " (OPENBLAS_CORETYPE=" : "", ct ? ct : "",
             ct ? ")" : "");
    distrust_openblas(why);
  } else if (openblas_get_num_threads() != nt) {
    snprintf(why, sizeof why, "OpenBLAS runs %d threads, xte %d", openblas_get_num_threads(), nt);
    distrust_openblas(why);
  } else if (held && xte_bench_openblas_core_has_avx512(core)) {
    /* the user's OPENBLAS_CORETYPE, or the re-exec failed: recorded (a key of its own: the
     * anchor's verdict stays `trusted` / `REFUSED: why`), not refused */
    machine_setf("openblas_isa_mismatch", "OpenBLAS's %s (AVX-512) kernels against xte's AVX2 ones",
                 core);
  }
  if (!f) return;
  fprintf(f, "machine:\n");
  for (i = 0; i < machine.n; i++) fprintf(f, "  %-26s %s\n", machine.key[i], machine.val[i]);
  fflush(f);
}
#else
/* Without OpenBLAS (the GPU-only xte): the record without its keys, no re-exec. */
void xte_bench_machine_setup(char **main_argv, FILE *f) {
  int i;
  (void)main_argv;
  machine_collect();
  if (!f) return;
  fprintf(f, "machine:\n");
  for (i = 0; i < machine.n; i++) fprintf(f, "  %-26s %s\n", machine.key[i], machine.val[i]);
  fflush(f);
}
#endif
