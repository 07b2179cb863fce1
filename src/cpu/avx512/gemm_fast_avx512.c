/* AVX-512 FAST GEMM micro-kernel: a 14 x 32 fp32 tile (14 broadcast rows of A x two zmm of B
 * columns, 28 accumulators), src/cpu/gemm_fast_template.h. Built natively and against SIMDe
 * (XTE_AVX512_SIMDE), like gemm_avx512.c. */
#include "cpu/avx512/isa_avx512.h"

#include "cpu/gemm_kernels.h"
#include "cpu/xte_cpu.h"

#define MR 14
#define NR 32
#define XS_W 16
typedef __m512 xs;
#define xs_zero() _mm512_setzero_ps()
#define xs_ld(p) _mm512_loadu_ps(p)
#define xs_st(p, v) _mm512_storeu_ps((p), (v))
#define xs_1(x) _mm512_set1_ps(x)
#define xs_fma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define xs_fold(p, sa, sb, acc) _mm512_fmadd_ps((p), _mm512_mul_ps((sa), (sb)), (acc))
#ifndef XTE_AVX512_SIMDE
#define xs_prefetch(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#endif

#include "cpu/gemm_fast_template.h"

const xte_gemm_fast_kernels XTE_AVX512_NAME(xte_gemm_fast_kernels) = {
    .isa = XTE_AVX512_ISA,
    .mr = MR,
    .nr = NR,
    .tile = fast_tile,
};
