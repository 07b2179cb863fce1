/* The avx2 ISA's table: AVX2 + FMA + F16C (cmake/XteCpuIsa.cmake, xte_cpu_isa_avx2). */
#include "cpu/attention_kernels.h"
#include "cpu/gemm_kernels.h"
#include "cpu/moe_cpu.h"
#include "cpu/xte_cpu.h"

extern const xte_quant_kernels xte_quant_kernels_avx2;         /* quantize_avx2.c */
extern const xte_gemm_ukernel xte_gemm_ukernel_avx2;           /* gemm_avx2.c */
extern const xte_gemm_fast_kernels xte_gemm_fast_kernels_avx2; /* gemm_fast_avx2.c */
extern const xte_attn_kernels xte_attn_kernels_avx2;           /* attention_avx2.c */
extern const xte_moe_kernels xte_moe_kernels_avx2;             /* moe_avx2.c */

const xte_cpu_isa_table xte_cpu_isa_table_avx2 = {
    .isa = XTE_CPU_ISA_AVX2,
    .quant = &xte_quant_kernels_avx2,
    .gemm = &xte_gemm_ukernel_avx2,
    .gemm_fast = &xte_gemm_fast_kernels_avx2,
    .attn = &xte_attn_kernels_avx2,
    .moe = &xte_moe_kernels_avx2,
};
