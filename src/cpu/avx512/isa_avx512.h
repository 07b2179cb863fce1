/* The two builds of this folder (cmake/XteCpuIsa.cmake): native AVX-512 (F, BW, VL, DQ), and
 * XTE_AVX512_SIMDE, the same sources against SIMDe on the AVX2 baseline, so that these kernels
 * run and are byte-tested on machines without AVX-512. XTE_AVX512_NAME gives each build's
 * exported symbols their own names; XTE_AVX512_ISA is the build's xte_cpu_isa. */
#ifndef XTE_ISA_AVX512_H
#define XTE_ISA_AVX512_H

#ifdef XTE_AVX512_SIMDE
#include "cpu/avx512/simde_avx512.h"
#define XTE_AVX512_NAME(x) x##_avx512_simde
#define XTE_AVX512_ISA XTE_CPU_ISA_AVX512_SIMDE
#else
#include <immintrin.h>
#define XTE_AVX512_NAME(x) x##_avx512
#define XTE_AVX512_ISA XTE_CPU_ISA_AVX512
#endif

#endif /* XTE_ISA_AVX512_H */
