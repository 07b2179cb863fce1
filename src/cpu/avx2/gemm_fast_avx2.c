/* AVX2 FAST GEMM micro-kernel: a 6 x 16 fp32 tile (6 broadcast rows of A x two ymm of B columns,
 * 12 accumulators), src/cpu/gemm_fast_template.h. */
#include <immintrin.h>

#include "cpu/gemm_kernels.h"
#include "cpu/xte_cpu.h"

#define MR 6
#define NR 16
#define XS_W 8
typedef __m256 xs;
#define xs_zero() _mm256_setzero_ps()
#define xs_ld(p) _mm256_loadu_ps(p)
#define xs_st(p, v) _mm256_storeu_ps((p), (v))
#define xs_1(x) _mm256_set1_ps(x)
#define xs_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define xs_fold(p, sa, sb, acc) _mm256_fmadd_ps((p), _mm256_mul_ps((sa), (sb)), (acc))
#define xs_prefetch(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)

#include "cpu/gemm_fast_template.h"

const xte_gemm_fast_kernels xte_gemm_fast_kernels_avx2 = {
    .isa = XTE_CPU_ISA_AVX2,
    .mr = MR,
    .nr = NR,
    .tile = fast_tile,
};
