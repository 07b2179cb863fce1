/* `xte moe`: the memory book (what each category of buffers costs, the allocation with every
 * page present before a kernel runs), the clock and the progress line (tools/moe/moe.h). */
#define _GNU_SOURCE /* clock_gettime, posix_memalign, MAP_ANONYMOUS */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "moe.h"

const char *const moe_cat_names[CAT_COUNT] = {"inputs, router, outputs", "FP8 weights",
                                              "fp32 weight grads", "activations", "fp64 check"};

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ================================================================== progress line */

static struct {
  double t0, last;
  int on, tty, shown;
} prog;

void progress(const char *fmt, ...) {
  char line[200];
  va_list ap;
  double t = now_s();
  if (!prog.on || t - prog.t0 < 2.0) return;
  if (!prog.tty && t - prog.last < 5.0) return;
  prog.last = t;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (prog.tty)
    fprintf(stderr, "\r\033[Kxte moe [%6.1f s] %s", t - prog.t0, line);
  else
    fprintf(stderr, "xte moe [%6.1f s] %s\n", t - prog.t0, line);
  prog.shown = 1;
}

void progress_done(void) {
  if (prog.on && prog.tty && prog.shown) fprintf(stderr, "\r\033[K");
  prog.shown = 0;
}

void progress_init(double t0, int on) {
  prog.t0 = t0;
  prog.last = 0;
  prog.tty = isatty(2);
  prog.on = on;
  prog.shown = 0;
}

/* ================================================================== memory */

/* Page-aligned, zeroed, every page present before any kernel runs (no page fault inside a timed
 * kernel). Large buffers are mmap()ed and their pages faulted in by the team's threads, each on
 * its part (madvise(MADV_POPULATE_WRITE): the kernel's populate path without a trap per page,
 * cheaper than touching each page; a write per page where the kernel lacks it), except the FP8
 * weights (CAT_WEIGHT): the weight generation writes every byte of them, on the library's
 * threads, and faults their pages in as it goes (17 GB for Kimi-K2: touching them first would
 * cost a pass of its own). The weights are MADV_HUGEPAGE (m->thp, --huge-pages 1, the default):
 * the first touch (the kernel's fault and zeroing, in a VM the host's fault too) is most of
 * what the setup costs, and 2 MiB pages take a 512th of the faults, although with THP defrag =
 * madvise some of them compact memory synchronously (--huge-pages 0 turns the advice off; the
 * measurements: docs/performance.md, the xte moe layer). The other buffers: no MADV_HUGEPAGE. In
 * dry mode only counts. NULL (and failed set) when the allocation fails. */
#define MMAP_MIN ((size_t)16 << 20)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

typedef struct touch_job {
  char *p;
  size_t pages;
} touch_job;

static void touch_part(void *ctx, int t, int nt) {
  const touch_job *j = (const touch_job *)ctx;
  size_t lo = j->pages * (size_t)t / (size_t)nt, hi = j->pages * (size_t)(t + 1) / (size_t)nt, i;
  if (lo >= hi) return;
  if (madvise(j->p + lo * 4096, (hi - lo) * 4096, MADV_POPULATE_WRITE) == 0) return;
  for (i = lo; i < hi; i++) ((volatile char *)j->p)[i * 4096] = 0;
}

void *mem(membook *m, size_t bytes, int cat) {
  size_t rounded = (bytes + 4095) / 4096 * 4096;
  void *p = NULL;
  if (bytes == 0) return NULL;
  m->bytes[cat] += (double)bytes;
  if (m->dry || m->failed) return NULL;
  if (m->nbufs >= MAX_BUFS) {
    m->failed = 1;
    return NULL;
  }
  if (rounded >= MMAP_MIN) {
    p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      p = NULL;
    } else if (cat == CAT_WEIGHT) {
      if (m->thp) (void)madvise(p, rounded, MADV_HUGEPAGE); /* advice: failure is harmless */
    } else {
      touch_job j;
      j.p = (char *)p;
      j.pages = rounded / 4096;
      xte_bench_team_run(touch_part, &j);
    }
  } else if (posix_memalign(&p, 4096, rounded) == 0 && p) {
    memset(p, 0, rounded);
  } else {
    p = NULL;
  }
  if (!p) {
    m->failed = 1;
    return NULL;
  }
  m->done += (double)rounded;
  if (rounded >= MMAP_MIN) progress("setup: allocating buffers, %.2f GiB so far", GiB(m->done));
  m->bcat[m->nbufs] = cat;
  m->bsize[m->nbufs] = rounded;
  m->bufs[m->nbufs++] = p;
  return p;
}

static void mem_release(void *p, size_t rounded) {
  if (rounded >= MMAP_MIN)
    munmap(p, rounded);
  else
    free(p);
}

void mem_free_all(membook *m) {
  int i;
  for (i = 0; i < m->nbufs; i++) mem_release(m->bufs[i], m->bsize[i]);
  m->nbufs = 0;
}

void mem_free_cat(membook *m, int cat) {
  int i, n = 0;
  for (i = 0; i < m->nbufs; i++) {
    if (m->bcat[i] == cat) {
      mem_release(m->bufs[i], m->bsize[i]);
    } else {
      m->bufs[n] = m->bufs[i];
      m->bsize[n] = m->bsize[i];
      m->bcat[n++] = m->bcat[i];
    }
  }
  m->nbufs = n;
}

/* Peak: the layer holds everything but the check; the fp64 check runs after the FP8 weights and
 * the activations are freed. */
double mem_peak(const membook *m) {
  const double *b = m->bytes;
  double lay = b[CAT_WEIGHT] + b[CAT_ACT];
  return b[CAT_INPUT] + b[CAT_WGRAD] + (lay > b[CAT_CHECK] ? lay : b[CAT_CHECK]);
}
