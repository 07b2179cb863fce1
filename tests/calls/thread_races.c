/* Thread-count invariance and concurrent callers over every entry point (tests/calls/calls.c);
 * meant to be built with -fsanitize=thread as well (XTE_SANITIZE=thread), where any data race in
 * the pool or a kernel is reported.
 *  1. Every case with 1, 2, 3 and 7 pool threads (ISA left at its default): the output bytes
 *     must be identical (results never depend on the thread count), and the 7-thread run is
 *     repeated once.
 *  2. Two application threads run all cases at the same time, each on its own contexts (one
 *     from the front of the table, one from the back), while a third changes the pool's thread
 *     count between 2, 3 and 7: every run must succeed with the bytes of part 1.
 * Usage: test_thread_races [case-name substring]. Exit 0: all passed; 1: a failure. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "calls.h"

typedef struct slot {
  int ci;         /* case index */
  calls_ctx c[2]; /* contexts of part 1 (and app thread 0) and of app thread 1 */
  uint8_t *ref;
  int ok;
} slot;

static slot *slots;
static int nslots;
static atomic_int failures;
static atomic_int app_done;

static void describe(const calls_ctx *c, const uint8_t *ref, int o, size_t off) {
  size_t base = 0;
  int i;
  for (i = 0; i < o; i++) base += c->out[i].bytes;
  printf("    first differing byte: output '%s' byte %zu of %zu: 0x%02x, want 0x%02x\n",
         c->out[o].name, off, c->out[o].bytes, ((const uint8_t *)c->out[o].p)[off],
         ref[base + off]);
}

/* Runs the case on context c from the sentinel; compares with ref (NULL: records it). */
static int run_and_check(slot *s, calls_ctx *c, uint8_t *ref, const char *what) {
  xte_status st;
  int o;
  size_t off;
  calls_fill_sentinel(c);
  st = calls_table[s->ci].run(c);
  if (st != XTE_SUCCESS) {
    printf("FAIL %-28s %s: %s (%s)\n", calls_table[s->ci].name, what, xte_status_string(st),
           xte_last_error());
    return 1;
  }
  if (!ref) { /* the reference: every listed output must have been written */
    int64_t base = 0;
    calls_snapshot(c, s->ref);
    for (o = 0; o < c->nout; o++) {
      size_t i, w = 0;
      for (i = 0; i < c->out[o].bytes; i++) w += s->ref[base + (int64_t)i] != calls_sentinel(o, i);
      base += (int64_t)c->out[o].bytes;
      if (!w) {
        printf("FAIL %-28s %s: output '%s' was not written\n", calls_table[s->ci].name, what,
               c->out[o].name);
        return 1;
      }
    }
    return 0;
  }
  if (calls_compare(c, ref, &o, &off) >= 0) {
    printf("FAIL %-28s %s: the bytes differ from 1 thread\n", calls_table[s->ci].name, what);
    describe(c, ref, o, off);
    return 1;
  }
  return 0;
}

static int part1(void) {
  static const int threads[] = {1, 2, 3, 7, 7};
  int i, t, bad = 0;
  for (i = 0; i < nslots; i++) {
    slot *s = &slots[i];
    int sbad = 0;
    for (t = 0; t < 5; t++) {
      char what[64];
      xte_cpu_set_num_threads(threads[t]);
      snprintf(what, sizeof what, "%d threads%s", threads[t], t == 4 ? " (again)" : "");
      sbad += run_and_check(s, &s->c[0], t ? s->ref : NULL, what);
      if (t == 0 && sbad) break; /* no reference */
    }
    s->ok = !sbad;
    printf("%-4s %-28s 1 / 2 / 3 / 7 threads\n", sbad ? "FAIL" : "ok", calls_table[s->ci].name);
    fflush(stdout);
    bad += sbad != 0;
  }
  return bad;
}

static void *app_thread(void *arg) {
  int me = (int)(intptr_t)arg, j;
  for (j = 0; j < nslots; j++) {
    slot *s = &slots[me ? nslots - 1 - j : j];
    char what[64];
    if (!s->ok) continue;
    snprintf(what, sizeof what, "application thread %d", me);
    if (run_and_check(s, &s->c[me], s->ref, what)) atomic_fetch_add(&failures, 1);
  }
  atomic_fetch_add(&app_done, 1);
  return NULL;
}

static void *toggler(void *arg) {
  static const int threads[] = {2, 3, 7};
  struct timespec ts = {0, 2000000}; /* 2 ms */
  int i = 0;
  (void)arg;
  while (atomic_load(&app_done) < 2) {
    xte_cpu_set_num_threads(threads[i++ % 3]);
    nanosleep(&ts, NULL);
  }
  return NULL;
}

int main(int argc, char **argv) {
  const char *filter = calls_filter(argc, argv);
  pthread_t th[3];
  int i, bad = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  slots = (slot *)calloc((size_t)calls_count, sizeof(slot));
  for (i = 0; i < calls_count; i++) {
    slot *s;
    if (!calls_match(calls_table[i].name, filter)) continue;
    s = &slots[nslots++];
    s->ci = i;
    if (calls_setup(i, &s->c[0]) || calls_setup(i, &s->c[1])) {
      printf("FAIL %-28s setup\n", calls_table[i].name);
      bad++;
      nslots--;
      calls_free(&s->c[0]);
      continue;
    }
    s->ref = (uint8_t *)malloc(calls_out_bytes(&s->c[0]) + 1);
  }
  if (!nslots && !bad) {
    printf("FAIL: no case matches '%s'\n", filter ? filter : "");
    return 1;
  }
  bad += part1();
  /* part 2: two application threads and a thread-count toggler */
  xte_cpu_set_num_threads(3);
  if (pthread_create(&th[0], NULL, app_thread, (void *)(intptr_t)0) ||
      pthread_create(&th[1], NULL, app_thread, (void *)(intptr_t)1) ||
      pthread_create(&th[2], NULL, toggler, NULL)) {
    printf("FAIL: pthread_create\n");
    return 1;
  }
  for (i = 0; i < 3; i++) pthread_join(th[i], NULL);
  printf("%-4s two application threads over %d cases, pool threads changing under them\n",
         atomic_load(&failures) ? "FAIL" : "ok", nslots);
  bad += atomic_load(&failures);
  xte_cpu_set_num_threads(0);
  for (i = 0; i < nslots; i++) {
    calls_free(&slots[i].c[0]);
    calls_free(&slots[i].c[1]);
    free(slots[i].ref);
  }
  free(slots);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("%s: %d failures (isa %s, %.1f s)\n", bad ? "FAIL" : "PASS", bad,
         xte_cpu_isa_name(xte_cpu_get_isa()),
         (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
  return bad ? 1 : 0;
}
