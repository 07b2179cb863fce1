/* Exhaustive lane check of the attention kernels' SIMD exp (src/cpu/avx2/attention_avx2.c,
 * src/cpu/avx512/attention_avx512.c, the latter native and emulated by SIMDe) against the scalar
 * xte_expf of src/numerics/xte_math.h: the same bits for every fp32 x in [-105, 90] (which
 * holds the subnormal results, the overflow and both zeros), every +-inf and NaN bit pattern, and
 * every 4099th bit pattern of the rest. The SIMD function is reached through the internal test hook
 * xte_internal_attention_exp (src/xte_attention_ops.h), which runs every element, a chunk's
 * tail too, through the vector lanes.
 *
 * ISAs this machine or build cannot run (XTE_ERROR_UNSUPPORTED) are skipped. The sweep runs on
 * XTE_TEST_THREADS threads (default 2). */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "numerics/xte_math.h"
#include "xte/xte.h"
#include "cpu/attention_kernels.h"

#define NISA 3
#define CHUNK 65536 /* values per work item; the last of a range is shorter (SIMD tails) */
#define STRIDE 4099 /* outside the dense ranges */

static const xte_cpu_isa isas[NISA] = {XTE_CPU_ISA_AVX2, XTE_CPU_ISA_AVX512,
                                       XTE_CPU_ISA_AVX512_SIMDE};

/* Bit patterns lo, lo + step, ... <= hi (unsigned). */
typedef struct range {
  uint32_t lo, hi, step;
} range;

static range ranges[8];
static int nranges;
static int64_t chunk_end[8]; /* cumulative number of chunks up to range i */

typedef struct sweep {
  int active[NISA];
  _Atomic int64_t next;
  int64_t nchunks;
} sweep;

typedef struct result {
  int64_t checked;
  int64_t bad[NISA];
  uint32_t first_x[NISA], first_got[NISA], first_want[NISA];
} result;

typedef struct worker {
  sweep *sw;
  result res;
} worker;

static void add_range(uint32_t lo, uint32_t hi, uint32_t step) {
  int64_t n = ((int64_t)hi - lo) / step + 1;
  ranges[nranges].lo = lo;
  ranges[nranges].hi = hi;
  ranges[nranges].step = step;
  chunk_end[nranges] = (nranges ? chunk_end[nranges - 1] : 0) + (n + CHUNK - 1) / CHUNK;
  nranges++;
}

/* The reference xte_expf(x[j]), j < n, compiled for hardware FMA (libm's fmaf calls would take
 * most of the time): every ISA checked here has FMA, and fmaf rounds the same either way. */
__attribute__((target("fma"))) static void exp_ref(const float *x, float *y, int64_t n) {
  int64_t j;
  for (j = 0; j < n; j++) y[j] = xte_expf(x[j]);
}

static void *sweep_run(void *p) {
  worker *w = (worker *)p;
  sweep *sw = w->sw;
  float *x = (float *)malloc(CHUNK * sizeof(float));
  float *want = (float *)malloc(CHUNK * sizeof(float));
  float *got = (float *)malloc(CHUNK * sizeof(float));
  int64_t ci;
  if (!x || !want || !got) abort();
  while ((ci = atomic_fetch_add(&sw->next, 1)) < sw->nchunks) {
    int ri = 0, k;
    int64_t j, n, first;
    while (ci >= chunk_end[ri]) ri++;
    first = (ci - (ri ? chunk_end[ri - 1] : 0)) * CHUNK;
    n = ((int64_t)ranges[ri].hi - ranges[ri].lo) / ranges[ri].step + 1 - first;
    if (n > CHUNK) n = CHUNK;
    for (j = 0; j < n; j++)
      x[j] = xte_bits_f32(ranges[ri].lo + (uint32_t)((first + j) * ranges[ri].step));
    exp_ref(x, want, n);
    w->res.checked += n;
    for (k = 0; k < NISA; k++) {
      if (!sw->active[k]) continue;
      if (xte_internal_attention_exp(isas[k], x, got, n) != XTE_SUCCESS) abort();
      for (j = 0; j < n; j++) {
        const uint32_t g = xte_f32_bits(got[j]), e = xte_f32_bits(want[j]);
        if (g == e) continue;
        if (w->res.bad[k]++ == 0 || xte_f32_bits(x[j]) < w->res.first_x[k]) {
          w->res.first_x[k] = xte_f32_bits(x[j]);
          w->res.first_got[k] = g;
          w->res.first_want[k] = e;
        }
      }
    }
  }
  free(x);
  free(want);
  free(got);
  return NULL;
}

Test(attention_lanes, exp_every_lane_bit_identical) {
  const uint32_t top = xte_f32_bits(90.0f), bottom = xte_f32_bits(-105.0f);
  const char *env = getenv("XTE_TEST_THREADS");
  int nthreads = env ? atoi(env) : 2, i, k, any = 0;
  worker w[64];
  pthread_t th[64];
  sweep sw;
  result tot;
  struct timespec t0, t1;
  float x[1] = {1.0f}, y[1];

  if (nthreads < 1) nthreads = 1;
  if (nthreads > 64) nthreads = 64;
  memset(&sw, 0, sizeof sw);
  memset(&tot, 0, sizeof tot);
  for (k = 0; k < NISA; k++) {
    xte_status st = xte_internal_attention_exp(isas[k], x, y, 1);
    cr_assert(st == XTE_SUCCESS || st == XTE_ERROR_UNSUPPORTED, "%s", xte_last_error());
    sw.active[k] = st == XTE_SUCCESS;
    any |= sw.active[k];
    if (!sw.active[k])
      printf("attention lanes: %s not available, skipped\n", xte_cpu_isa_name(isas[k]));
  }
  if (!any) cr_skip_test("no SIMD ISA available");
  cr_assert_eq(xte_internal_attention_exp(XTE_CPU_ISA_COUNT, x, y, 1), XTE_ERROR_UNSUPPORTED);

  nranges = 0;
  add_range(0x00000000u, top, 1);             /* +0 .. 90 */
  add_range(0x80000000u, bottom, 1);          /* -0 .. -105 */
  add_range(0x7F800000u, 0x7FFFFFFFu, 1);     /* +inf, NaNs */
  add_range(0xFF800000u, 0xFFFFFFFFu, 1);     /* -inf, NaNs */
  add_range(top + 1, 0x7F7FFFFFu, STRIDE);    /* (90, max] */
  add_range(bottom + 1, 0xFF7FFFFFu, STRIDE); /* (-max, -105) */
  sw.nchunks = chunk_end[nranges - 1];
  atomic_store(&sw.next, 0);

  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (i = 0; i < nthreads; i++) {
    memset(&w[i].res, 0, sizeof w[i].res);
    w[i].sw = &sw;
    cr_assert_eq(pthread_create(&th[i], NULL, sweep_run, &w[i]), 0);
  }
  for (i = 0; i < nthreads; i++) {
    pthread_join(th[i], NULL);
    tot.checked += w[i].res.checked;
    for (k = 0; k < NISA; k++) {
      if (w[i].res.bad[k] && (tot.bad[k] == 0 || w[i].res.first_x[k] < tot.first_x[k])) {
        tot.first_x[k] = w[i].res.first_x[k];
        tot.first_got[k] = w[i].res.first_got[k];
        tot.first_want[k] = w[i].res.first_want[k];
      }
      tot.bad[k] += w[i].res.bad[k];
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("attention lanes: %lld inputs per ISA, %d threads, %.1f s\n", (long long)tot.checked,
         nthreads, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
  for (k = 0; k < NISA; k++) {
    if (!sw.active[k]) continue;
    printf("attention lanes: %s exp: %lld differ\n", xte_cpu_isa_name(isas[k]),
           (long long)tot.bad[k]);
    cr_expect_eq(tot.bad[k], 0,
                 "%s exp: %lld inputs differ from xte_expf; first x = %a (0x%08x): got 0x%08x, "
                 "want 0x%08x",
                 xte_cpu_isa_name(isas[k]), (long long)tot.bad[k],
                 (double)xte_bits_f32(tot.first_x[k]), tot.first_x[k], tot.first_got[k],
                 tot.first_want[k]);
  }
}

/* Short inputs: every length 0 .. 40 (partial vectors) through the lanes. */
Test(attention_lanes, exp_short_lengths) {
  float x[40], y[40];
  int k, n, j;
  for (j = 0; j < 40; j++) x[j] = -104.5f + 5.0f * (float)j;
  for (k = 0; k < NISA; k++)
    for (n = 0; n <= 40; n++) {
      xte_status st;
      for (j = 0; j < 40; j++) y[j] = -1.0f;
      st = xte_internal_attention_exp(isas[k], x, y, n);
      if (st == XTE_ERROR_UNSUPPORTED) break;
      cr_assert_eq(st, XTE_SUCCESS);
      for (j = 0; j < 40; j++)
        cr_expect_eq(xte_f32_bits(y[j]), xte_f32_bits(j < n ? xte_expf(x[j]) : -1.0f),
                     "%s n = %d, j = %d", xte_cpu_isa_name(isas[k]), n, j);
    }
}
