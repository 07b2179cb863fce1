/* The avx512 ISA's table (AVX-512 F, BW, VL, DQ), in both builds of this folder: native, and
 * against SIMDe on the AVX2 baseline (avx512_simde; src/cpu/avx512/isa_avx512.h). src/cpu/isa.c
 * attaches the AMX and VNNI extensions to the native one. */
#include "cpu/avx512/isa_avx512.h"
#include "cpu/attention_kernels.h"
#include "cpu/gemm_kernels.h"
#include "cpu/moe_cpu.h"
#include "cpu/xte_cpu.h"

extern const xte_quant_kernels XTE_AVX512_NAME(xte_quant_kernels);         /* quantize_avx512.c */
extern const xte_gemm_ukernel XTE_AVX512_NAME(xte_gemm_ukernel);           /* gemm_avx512.c */
extern const xte_gemm_fast_kernels XTE_AVX512_NAME(xte_gemm_fast_kernels); /* gemm_fast_avx512.c */
extern const xte_attn_kernels XTE_AVX512_NAME(xte_attn_kernels);           /* attention_avx512.c */
extern const xte_moe_kernels XTE_AVX512_NAME(xte_moe_kernels);             /* moe_avx512.c */

const xte_cpu_isa_table XTE_AVX512_NAME(xte_cpu_isa_table) = {
    .isa = XTE_AVX512_ISA,
    .quant = &XTE_AVX512_NAME(xte_quant_kernels),
    .gemm = &XTE_AVX512_NAME(xte_gemm_ukernel),
    .gemm_fast = &XTE_AVX512_NAME(xte_gemm_fast_kernels),
    .attn = &XTE_AVX512_NAME(xte_attn_kernels),
    .moe = &XTE_AVX512_NAME(xte_moe_kernels),
};
