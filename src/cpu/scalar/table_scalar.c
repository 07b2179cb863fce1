/* The scalar ISA's table: plain C on the baseline x86-64 (any CPU), the reference every other
 * ISA's bytes are tested against. */
#include "cpu/attention_kernels.h"
#include "cpu/gemm_kernels.h"
#include "cpu/moe_cpu.h"
#include "cpu/xte_cpu.h"

extern const xte_quant_kernels xte_quant_kernels_scalar;         /* quantize_scalar.c */
extern const xte_gemm_ukernel xte_gemm_ukernel_scalar;           /* gemm_scalar.c */
extern const xte_gemm_fast_kernels xte_gemm_fast_kernels_scalar; /* gemm_fast_scalar.c */
extern const xte_attn_kernels xte_attn_kernels_scalar;           /* attention_scalar.c */

static const xte_moe_kernels moe_scalar = {
    .isa = XTE_CPU_ISA_SCALAR,
    .router_forward = xte_cpu_moe_router_forward_scalar,
    .router_backward = xte_cpu_moe_router_backward_scalar,
    .unpermute = xte_cpu_moe_unpermute_scalar,
    .swiglu = xte_cpu_moe_swiglu_scalar,
};

const xte_cpu_isa_table xte_cpu_isa_table_scalar = {
    .isa = XTE_CPU_ISA_SCALAR,
    .quant = &xte_quant_kernels_scalar,
    .gemm = &xte_gemm_ukernel_scalar,
    .gemm_fast = &xte_gemm_fast_kernels_scalar,
    .attn = &xte_attn_kernels_scalar,
    .moe = &moe_scalar,
};
