/* CPU ISA selection, the one place that names the ISAs: CPUID plus the OS check (XGETBV) decide
 * which ISA tables can run here (an ISA is available only where this CPU runs its objects: the
 * flags of cmake/XteCpuIsa.cmake); one is chosen once, capped by XTE_CPU_ISA or set by
 * xte_cpu_set_isa(); the extensions (AMX, VNNI, AVX512-BF16) are attached to the avx512 table where
 * built and usable. Drivers reach the kernels through xte_cpu_isa_table_get() only. */
#include <cpuid.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention_kernels.h"
#include "cpu/gemm_kernels.h"
#include "cpu/moe_cpu.h"
#include "cpu/xte_cpu.h"
#include "xte_internal.h"

/* Each ISA folder's table (src/cpu/<isa>/table_<isa>.c), and the extensions' tables */
extern const xte_cpu_isa_table xte_cpu_isa_table_scalar;
#ifdef XTE_HAVE_ISA_AVX2
extern const xte_cpu_isa_table xte_cpu_isa_table_avx2;
#endif
#ifdef XTE_HAVE_ISA_AVX512
extern const xte_cpu_isa_table xte_cpu_isa_table_avx512;
#endif
#ifdef XTE_HAVE_ISA_AVX512_SIMDE
extern const xte_cpu_isa_table xte_cpu_isa_table_avx512_simde;
#endif
#ifdef XTE_HAVE_ISA_AMX
extern const xte_gemm_amx_kernels xte_gemm_amx_table;
int xte_gemm_amx_usable(void); /* src/cpu/amx/gemm_amx.h */
#ifdef XTE_HAVE_AMX_BF16
extern const xte_gemm_fast_amx_kernels xte_gemm_fast_amx_table;
int xte_gemm_fast_amx_usable(void); /* src/cpu/amx/gemm_fast_amx.c */
#endif
#endif
#ifdef XTE_HAVE_ISA_BF16
extern const xte_attn_bf16_kernels xte_attn_bf16_table;
int xte_attn_bf16_usable(void); /* src/cpu/bf16/attention_bf16.c */
#ifdef XTE_HAVE_ATTN_AMX
extern const xte_attn_bf16_kernels xte_attn_amx_bf16_table;
int xte_attn_amx_bf16_usable(void); /* src/cpu/bf16/attention_amx_bf16.c */
#endif
#endif
#ifdef XTE_HAVE_ISA_VNNI
extern const xte_gemm_vnni_kernels xte_gemm_vnni_table;
int xte_gemm_vnni_usable(void); /* src/cpu/vnni/gemm_vnni.h */
#endif

/* The table an ISA folder built (NULL: not built) */
static const xte_cpu_isa_table *built_table(int isa) {
  switch (isa) {
    case XTE_CPU_ISA_SCALAR:
      return &xte_cpu_isa_table_scalar;
#ifdef XTE_HAVE_ISA_AVX2
    case XTE_CPU_ISA_AVX2:
      return &xte_cpu_isa_table_avx2;
#endif
#ifdef XTE_HAVE_ISA_AVX512
    case XTE_CPU_ISA_AVX512:
      return &xte_cpu_isa_table_avx512;
#endif
#ifdef XTE_HAVE_ISA_AVX512_SIMDE
    case XTE_CPU_ISA_AVX512_SIMDE:
      return &xte_cpu_isa_table_avx512_simde;
#endif
    default:
      return NULL;
  }
}

static unsigned long long xgetbv0(void) {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((unsigned long long)hi << 32) | lo;
}

/* Bit i set: ISA i is built and runs on this machine. why[i]: the reason it does not. */
static unsigned detect_available(const char **why) {
  unsigned a, b, c, d, avail = 1u << XTE_CPU_ISA_SCALAR;
  unsigned long long xcr0 = 0;
  int osxsave, avx, fma, f16c, avx2 = 0, avx512 = 0, i, cpu_avx2, cpu_avx512;
  for (i = 0; i < XTE_CPU_ISA_COUNT; i++) why[i] = built_table(i) ? NULL : "not built";
  if (!__get_cpuid(1, &a, &b, &c, &d)) {
    for (i = 1; i < XTE_CPU_ISA_COUNT; i++)
      if (!why[i]) why[i] = "no CPUID leaf 1";
    return avail;
  }
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
  /* the avx2 objects and the SIMDe build of avx512 are compiled for AVX2 + FMA + F16C, with
   * the OS saving the ymm state */
  cpu_avx2 = avx && avx2 && fma && f16c && (xcr0 & 0x6) == 0x6;
  /* the native avx512 objects: AVX-512 F, BW, VL, DQ, with the OS saving the zmm and k state */
  cpu_avx512 = cpu_avx2 && avx512 && (xcr0 & 0xE6) == 0xE6;
  for (i = 1; i < XTE_CPU_ISA_COUNT; i++) {
    const int runs = i == XTE_CPU_ISA_AVX512 ? cpu_avx512 : cpu_avx2;
    if (why[i]) continue;
    if (runs)
      avail |= 1u << i;
    else
      why[i] = i == XTE_CPU_ISA_AVX512 ? "this CPU or OS lacks AVX-512 F/BW/VL/DQ"
                                       : "this CPU or OS lacks AVX2 + FMA + F16C";
  }
  return avail;
}

static unsigned isa_avail;
static int isa_best;
static _Atomic int isa_current = -1;
static const char *isa_why[XTE_CPU_ISA_COUNT];
/* the runnable tables, the extensions attached (isa_avail says which are set) */
static xte_cpu_isa_table isa_tables[XTE_CPU_ISA_COUNT];
static char isa_note[160];

static int parse_isa(const char *s) {
  int i;
  for (i = 0; i < XTE_CPU_ISA_COUNT; i++)
    if (!strcmp(s, xte_cpu_isa_name((xte_cpu_isa)i))) return i;
  return -1;
}

static void init_isa(void) {
  const char *env = getenv("XTE_CPU_ISA");
  int i, pick;
  isa_avail = detect_available(isa_why);
  isa_best = XTE_CPU_ISA_SCALAR;
  for (i = 0; i < XTE_CPU_ISA_COUNT; i++)
    if (isa_avail & (1u << i)) isa_tables[i] = *built_table(i);
  /* the best native ISA (the emulated one is never picked by itself) */
  for (i = XTE_CPU_ISA_SCALAR; i <= XTE_CPU_ISA_AVX512; i++)
    if (isa_avail & (1u << i)) isa_best = i;
  if (isa_avail & (1u << XTE_CPU_ISA_AVX512)) {
    /* the extensions need the avx512 objects' ISA and their own (checked by usable()) */
#ifdef XTE_HAVE_ISA_AMX
    if (xte_gemm_amx_usable()) isa_tables[XTE_CPU_ISA_AVX512].amx = &xte_gemm_amx_table;
#ifdef XTE_HAVE_AMX_BF16
    if (xte_gemm_fast_amx_usable())
      isa_tables[XTE_CPU_ISA_AVX512].fast_amx = &xte_gemm_fast_amx_table;
#endif
#endif
#ifdef XTE_HAVE_ISA_BF16
    if (xte_attn_bf16_usable()) isa_tables[XTE_CPU_ISA_AVX512].attn_bf16 = &xte_attn_bf16_table;
#ifdef XTE_HAVE_ATTN_AMX
    if (xte_attn_bf16_usable() && xte_attn_amx_bf16_usable())
      isa_tables[XTE_CPU_ISA_AVX512].attn_amx = &xte_attn_amx_bf16_table;
#endif
#endif
#ifdef XTE_HAVE_ISA_VNNI
    if (xte_gemm_vnni_usable()) isa_tables[XTE_CPU_ISA_AVX512].vnni = &xte_gemm_vnni_table;
#endif
  }
  pick = isa_best;
  if (env && *env) {
    int cap = parse_isa(env);
    if (cap < 0)
      snprintf(isa_note, sizeof isa_note, "XTE_CPU_ISA=%.40s ignored: not an ISA name", env);
    else if (!(isa_avail & (1u << cap)))
      snprintf(isa_note, sizeof isa_note, "XTE_CPU_ISA=%s: %s cannot run here (%s); using %s", env,
               env, isa_why[cap], xte_cpu_isa_name((xte_cpu_isa)(cap < pick ? cap : pick)));
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
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "isa %s cannot run here: %s", xte_cpu_isa_name(isa),
                         isa_why[isa]);
  atomic_store(&isa_current, (int)isa);
  xte_clear_error();
  return XTE_SUCCESS;
}

const xte_cpu_isa_table *xte_cpu_isa_table_for(xte_cpu_isa isa) {
  ensure_isa();
  if ((unsigned)isa >= XTE_CPU_ISA_COUNT || !(isa_avail & (1u << isa))) return NULL;
  return &isa_tables[isa];
}

const xte_cpu_isa_table *xte_cpu_isa_table_get(void) {
  return xte_cpu_isa_table_for(xte_cpu_get_isa());
}

const char *xte_cpu_isa_note(void) {
  ensure_isa();
  return isa_note[0] ? isa_note : NULL;
}

const char *xte_cpu_isa_unavailable(xte_cpu_isa isa) {
  ensure_isa();
  return (unsigned)isa < XTE_CPU_ISA_COUNT ? isa_why[isa] : "not an xte_cpu_isa";
}

xte_status xte_internal_cpu_isa_kernels(xte_cpu_isa isa, int out[6]) {
  const xte_cpu_isa_table *T = xte_cpu_isa_table_for(isa);
  if (!out) return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "out is NULL");
  if (!T)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "isa %s cannot run here: %s", xte_cpu_isa_name(isa),
                         xte_cpu_isa_unavailable(isa));
  out[0] = T->quant->isa;
  out[1] = T->gemm->isa;
  out[2] = T->attn->isa;
  out[3] = T->moe->isa;
  out[4] = T->amx != NULL;
  out[5] = T->vnni != NULL;
  xte_clear_error();
  return XTE_SUCCESS;
}

void xte_cpu_isa_info(xte_backend_info *info) {
  ensure_isa();
  info->cpu_isa = xte_cpu_get_isa();
  info->cpu_isa_best = (xte_cpu_isa)isa_best;
  info->cpu_isa_available = isa_avail;
}
