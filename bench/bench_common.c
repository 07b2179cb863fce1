#define _GNU_SOURCE /* pthread_setaffinity_np, madvise */
/* Helpers shared by the benchmark suites (see bench_common.h). */
#include "bench_common.h"

#include "cpu/xte_spin.h"

#include <pthread.h>
#include <sched.h>
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
