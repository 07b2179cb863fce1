/* CPU ISA selection: CPUID plus the OS check (XGETBV), chosen once, capped by XTE_CPU_ISA or
 * xte_cpu_set_isa(). */
#include <cpuid.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/xte_cpu.h"
#include "xte_internal.h"

static unsigned long long xgetbv0(void) {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((unsigned long long)hi << 32) | lo;
}

/* Bit i set: ISA i runs on this machine and is built. */
static unsigned detect_available(void) {
  unsigned a, b, c, d, avail = 1u << XTE_CPU_ISA_SCALAR;
  unsigned long long xcr0 = 0;
  int osxsave, avx, fma, f16c, avx2 = 0, avx512 = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return avail;
  osxsave = (c >> 27) & 1;
  avx = (c >> 28) & 1;
  fma = (c >> 12) & 1;
  f16c = (c >> 29) & 1;
  if (osxsave) xcr0 = xgetbv0();
  if (__get_cpuid_max(0, NULL) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    avx2 = (b >> 5) & 1;
    /* F (16), DQ (17), BW (30), VL (31) */
    avx512 = ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);
  }
  if (avx && avx2 && fma && f16c && (xcr0 & 0x6) == 0x6) avail |= 1u << XTE_CPU_ISA_AVX2;
#ifdef XTE_HAVE_ISA_AVX512_SIMDE
  /* the SIMDe objects are compiled for AVX2 + FMA + F16C */
  if (avail & (1u << XTE_CPU_ISA_AVX2)) avail |= 1u << XTE_CPU_ISA_AVX512_SIMDE;
#endif
#ifdef XTE_HAVE_ISA_AVX512
  if ((avail & (1u << XTE_CPU_ISA_AVX2)) && avx512 && (xcr0 & 0xE6) == 0xE6)
    avail |= 1u << XTE_CPU_ISA_AVX512;
#else
  (void)avx512;
#endif
  return avail;
}

static unsigned isa_avail;
static int isa_best;
static _Atomic int isa_current = -1;

static int parse_isa(const char *s) {
  if (!strcmp(s, "scalar")) return XTE_CPU_ISA_SCALAR;
  if (!strcmp(s, "avx2")) return XTE_CPU_ISA_AVX2;
  if (!strcmp(s, "avx512")) return XTE_CPU_ISA_AVX512;
  if (!strcmp(s, "avx512_simde")) return XTE_CPU_ISA_AVX512_SIMDE;
  return -1;
}

static void init_isa(void) {
  const char *env = getenv("XTE_CPU_ISA");
  int i, pick;
  isa_avail = detect_available();
  isa_best = XTE_CPU_ISA_SCALAR;
  for (i = XTE_CPU_ISA_SCALAR; i <= XTE_CPU_ISA_AVX512; i++)
    if (isa_avail & (1u << i)) isa_best = i;
  pick = isa_best;
  if (env && *env) {
    int cap = parse_isa(env);
    if (cap == XTE_CPU_ISA_AVX512_SIMDE && (isa_avail & (1u << cap)))
      pick = cap;
    else if (cap >= 0 && cap <= XTE_CPU_ISA_AVX512 && cap < pick)
      pick = cap; /* a cap: never above what the machine runs */
  }
  atomic_store(&isa_current, pick);
}

static void ensure_isa(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, init_isa);
}

const char *xte_cpu_isa_name(xte_cpu_isa isa) {
  switch (isa) {
    case XTE_CPU_ISA_SCALAR:
      return "scalar";
    case XTE_CPU_ISA_AVX2:
      return "avx2";
    case XTE_CPU_ISA_AVX512:
      return "avx512";
    case XTE_CPU_ISA_AVX512_SIMDE:
      return "avx512_simde";
    default:
      return "unknown";
  }
}

xte_cpu_isa xte_cpu_get_isa(void) {
  ensure_isa();
  return (xte_cpu_isa)atomic_load(&isa_current);
}

xte_status xte_cpu_set_isa(xte_cpu_isa isa) {
  ensure_isa();
  if ((unsigned)isa >= XTE_CPU_ISA_COUNT)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "isa %d is not an xte_cpu_isa", (int)isa);
  if (!(isa_avail & (1u << isa)))
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "isa %s cannot run on this machine or build",
                         xte_cpu_isa_name(isa));
  atomic_store(&isa_current, (int)isa);
  xte_clear_error();
  return XTE_SUCCESS;
}

const xte_cpu_kernels *xte_cpu_kernels_for(xte_cpu_isa isa) {
  ensure_isa();
  if ((unsigned)isa >= XTE_CPU_ISA_COUNT || !(isa_avail & (1u << isa))) return NULL;
  switch (isa) {
    case XTE_CPU_ISA_AVX2:
      return &xte_cpu_kernels_avx2;
#ifdef XTE_HAVE_ISA_AVX512
    case XTE_CPU_ISA_AVX512:
      return &xte_cpu_kernels_avx512;
#endif
#ifdef XTE_HAVE_ISA_AVX512_SIMDE
    case XTE_CPU_ISA_AVX512_SIMDE:
      return &xte_cpu_kernels_avx512_simde;
#endif
    default:
      return &xte_cpu_kernels_scalar;
  }
}

const xte_cpu_kernels *xte_cpu_kernels_get(void) {
  return xte_cpu_kernels_for(xte_cpu_get_isa());
}

void xte_cpu_isa_info(xte_backend_info *info) {
  ensure_isa();
  info->cpu_isa = xte_cpu_get_isa();
  info->cpu_isa_best = (xte_cpu_isa)isa_best;
  info->cpu_isa_available = isa_avail;
}
