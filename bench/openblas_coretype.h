/* Which OpenBLAS kernel target the benchmarks force when OpenBLAS picked a generic one.
 *
 * A DYNAMIC_ARCH OpenBLAS picks its kernels in its constructor from the CPU model it knows; on a
 * CPU model newer than the library (Debian's 0.3.21 on recent Xeons) it falls back to a generic
 * core such as "Prescott" (SSE3 kernels, several times slower than the machine's dgemm), and a
 * ratio to that anchor flatters the kernel it is compared with. OPENBLAS_CORETYPE=<target> set
 * before the library loads overrides the choice.
 *
 * Header only (static functions, no dependencies) so that tests/test_bench_coretype.c checks the
 * very code bench/bench_common.c runs. */
#ifndef XTE_BENCH_OPENBLAS_CORETYPE_H
#define XTE_BENCH_OPENBLAS_CORETYPE_H

#include <ctype.h>
#include <stddef.h>

/* 1 if `core` (any case) is one of the names in list (NULL-terminated, lower case): whole names
 * only. */
static int xte_bench_openblas_core_in(const char *core, const char *const *list) {
  size_t i;
  for (i = 0; list[i]; i++) {
    const char *a = core, *b = list[i];
    while (*a && *b && tolower((unsigned char)*a) == *b) {
      a++;
      b++;
    }
    if (!*a && !*b) return 1;
  }
  return 0;
}

/* 1 if OpenBLAS core name `core` (openblas_get_corename(), any case) has no AVX2 kernels: the
 * x86 targets of OpenBLAS's dynamic.c before Haswell, plus the AMD cores without AVX2, plus
 * "Unknown" and an empty or NULL name. A name not in the list (Haswell, Zen, SkylakeX,
 * Cooperlake, SapphireRapids, a target newer than this list) is not generic. */
static int xte_bench_openblas_core_is_generic(const char *core) {
  static const char *const generic[] = {
      "unknown",   "katmai",       "coppermine",  "northwood",  "prescott",    "banias",
      "atom",      "core2",        "penryn",      "dunnington", "nehalem",     "athlon",
      "opteron",   "opteron_sse3", "barcelona",   "nano",       "sandybridge", "bobcat",
      "bulldozer", "piledriver",   "steamroller", "generic",    NULL};
  if (!core || !*core) return 1;
  return xte_bench_openblas_core_in(core, generic);
}

/* 1 if `core` is one of OpenBLAS's targets with AVX-512 kernels (any case). */
static int xte_bench_openblas_core_has_avx512(const char *core) {
  static const char *const avx512[] = {"skylakex", "cooperlake", "sapphirerapids", NULL};
  return core && xte_bench_openblas_core_in(core, avx512);
}

/* The OPENBLAS_CORETYPE value to force for a CPU with these features when OpenBLAS reports
 * `core`: NULL when the core is not generic, or when the CPU has no AVX2 (nothing better to
 * pick); else "Cooperlake" (AVX-512 with BF16), "SkylakeX" (AVX-512 F), or "Haswell" (AVX2). */
static const char *xte_bench_openblas_coretype_for(const char *core, int avx2, int avx512f,
                                                   int avx512bf16) {
  if (!xte_bench_openblas_core_is_generic(core)) return NULL;
  if (avx512f && avx512bf16) return "Cooperlake";
  if (avx512f) return "SkylakeX";
  if (avx2) return "Haswell";
  return NULL;
}

/* The OPENBLAS_CORETYPE value to force when xte's kernels are held to AVX2 (--isa avx2 on a CPU
 * with AVX-512), so that the anchor runs the kernels an AVX2 machine would run beside them:
 * "Haswell" when OpenBLAS reports a target with AVX-512 kernels or a generic core, on a CPU with
 * AVX2; NULL otherwise (an AVX2 target such as Haswell or Zen already, or no AVX2). */
static const char *xte_bench_openblas_coretype_for_avx2(const char *core, int avx2) {
  if (!avx2) return NULL;
  if (xte_bench_openblas_core_is_generic(core) || xte_bench_openblas_core_has_avx512(core))
    return "Haswell";
  return NULL;
}

#endif /* XTE_BENCH_OPENBLAS_CORETYPE_H */
