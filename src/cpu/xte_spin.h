/* Spin-then-sleep waiting, shared by xte's CPU thread pool and the benchmarks' thread team: a
 * waiter spins (with pause) for up to XTE_SPIN_NS before it sleeps on a condition variable, as
 * OpenMP runtimes do, so that back-to-back jobs cost no wake-up. Header only: static inline. */
#ifndef XTE_SPIN_H
#define XTE_SPIN_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define XTE_SPIN_NS 200000 /* 0.2 ms */

static inline int64_t xte_spin_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void xte_spin_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Spins while *v == old (want_change) or *v != 0 (!want_change), for up to XTE_SPIN_NS;
 * returns 1 when the wait is over, 0 when the caller should sleep. */
static inline int xte_spin_wait(_Atomic unsigned long *v, unsigned long old, int want_change) {
  int64_t end = 0;
  int i;
  for (;;) {
    for (i = 0; i < 64; i++) {
      unsigned long x = atomic_load_explicit(v, memory_order_acquire);
      if (want_change ? x != old : x == 0) return 1;
      xte_spin_relax();
    }
    if (!end)
      end = xte_spin_now_ns() + XTE_SPIN_NS;
    else if (xte_spin_now_ns() > end)
      return 0;
  }
}

#endif /* XTE_SPIN_H */
