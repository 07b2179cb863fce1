/* Scalar FAST GEMM micro-kernel: a 4 x 8 fp32 tile in plain C (src/cpu/gemm_fast_template.h with
 * one lane): each partial step a rounded product and a rounded sum (-ffp-contract=off), the block
 * step the shared numerics' xte_gemm_block_update (so the NaN-simulating build covers it). */
#include "cpu/gemm_kernels.h"
#include "cpu/xte_cpu.h"
#include "numerics/xte_gemm_numerics.h"

#define MR 4
#define NR 8
#define XS_W 1
typedef float xs;
#define xs_zero() 0.0f
#define xs_ld(p) (*(p))
#define xs_st(p, v) (*(p) = (v))
#define xs_1(x) (x)
#define xs_fma(a, b, c) ((a) * (b) + (c))
#define xs_fold(p, sa, sb, acc) xte_gemm_block_update((acc), (p), (sa), (sb))

#include "cpu/gemm_fast_template.h"

const xte_gemm_fast_kernels xte_gemm_fast_kernels_scalar = {
    .isa = XTE_CPU_ISA_SCALAR,
    .mr = MR,
    .nr = NR,
    .tile = fast_tile,
};
