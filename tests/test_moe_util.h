/* Helpers shared by the MoE tests: a deterministic generator and the list of CPU ISAs. */
#ifndef TEST_MOE_UTIL_H
#define TEST_MOE_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xte/xte.h>

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static inline void rng_seed(uint64_t s) {
  g_rng = s * 0x9E3779B97F4A7C15ull + 1;
}
static inline uint32_t rng_u32(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (uint32_t)(g_rng >> 11);
}
/* uniform in [-1, 1) */
static inline float rng_f(void) {
  return (float)((double)(rng_u32() & 0xFFFFFF) / 8388608.0 - 1.0);
}

/* The ISAs this machine and build can run (scalar first). */
static inline int moe_isas(xte_cpu_isa *out) {
  xte_backend_info info;
  int n = 0, i;
  xte_get_backend_info(&info);
  for (i = 0; i < XTE_CPU_ISA_COUNT; i++)
    if (info.cpu_isa_available & (1u << i)) out[n++] = (xte_cpu_isa)i;
  return n;
}

static inline void *zalloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  return p;
}

#endif
