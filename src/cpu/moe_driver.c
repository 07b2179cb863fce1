/* The CPU backend's MoE table (replaces the weak fallback in cpu_capabilities.c). The MoE
 * kernels are portable C shared by every ISA (the fp8 quantization inside the fused SwiGLU uses
 * the ISA's quantize kernels), so all ISAs give the same bytes by construction. */
#include "cpu/moe_cpu.h"

static const xte_moe_ops cpu_moe_ops = {xte_cpu_moe_router_forward,  xte_cpu_moe_router_backward,
                                        xte_cpu_moe_aux_loss,        xte_cpu_moe_permute,
                                        xte_cpu_moe_unpermute,       xte_cpu_moe_sort_chunks,
                                        xte_cpu_moe_dispatch_layout, xte_cpu_moe_swiglu};

const struct xte_moe_ops *xte_cpu_moe_ops(void) {
  return &cpu_moe_ops;
}
