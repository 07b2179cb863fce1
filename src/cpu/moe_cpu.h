/* CPU MoE drivers (src/cpu/moe_*.c); the backend's table is assembled in src/cpu/cpu_backend.c. */
#ifndef XTE_MOE_CPU_H
#define XTE_MOE_CPU_H

#include "cpu/xte_cpu.h"
#include "xte_internal.h"
#include "xte_moe_ops.h"

/* Workspace sizes by checked arithmetic: *bytes = n * size + extra (at least 1). Returns 0 when
 * an operand is negative or the size does not fit (the caller reports XTE_ERROR_OUT_OF_MEMORY
 * before writing anything). */
static inline int xte_moe_ws_bytes(int64_t n, int64_t size, int64_t extra, size_t *bytes) {
  int64_t r;
  if (n < 0 || size < 0 || extra < 0 || __builtin_mul_overflow(n, size, &r) ||
      __builtin_add_overflow(r, extra, &r) || (uint64_t)r > (uint64_t)SIZE_MAX)
    return 0;
  *bytes = r > 0 ? (size_t)r : 1;
  return 1;
}

/* The ISA-independent drivers (src/cpu/moe_router.c, moe_permute.c) */
xte_status xte_cpu_moe_aux_loss(const xte_aux_loss_args *a, int backward, void *handle);
xte_status xte_cpu_moe_permute(const xte_permute_args *a, void *handle);
xte_status xte_cpu_moe_sort_chunks(const xte_sort_chunks_args *a, void *handle);
xte_status xte_cpu_moe_dispatch_layout(const xte_dispatch_args *a, void *handle);

/* The MoE kernels of an ISA (the moe entry of src/cpu/xte_cpu.h's xte_cpu_isa_table): the
 * drivers whose loops each ISA compiles with its own code generation or vector lanes, all with
 * the scalar build's bytes (tests compare every ISA). */
typedef struct xte_moe_kernels {
  int isa; /* xte_cpu_isa */
  xte_status (*router_forward)(const xte_router_args *a, void *handle);
  xte_status (*router_backward)(const xte_router_bwd_args *a, void *handle);
  xte_status (*unpermute)(const xte_unpermute_args *a, int which, void *handle);
  xte_status (*swiglu)(const xte_swiglu_args *a, void *handle);
} xte_moe_kernels;

/* The scalar ISA's: the generic build of src/cpu/moe_router.c, moe_permute.c, moe_swiglu.c. */
xte_status xte_cpu_moe_router_forward_scalar(const xte_router_args *a, void *handle);
xte_status xte_cpu_moe_router_backward_scalar(const xte_router_bwd_args *a, void *handle);
xte_status xte_cpu_moe_unpermute_scalar(const xte_unpermute_args *a, int which, void *handle);
xte_status xte_cpu_moe_swiglu_scalar(const xte_swiglu_args *a, void *handle);

/* The same drivers compiled with AVX2 + FMA (src/cpu/avx2/moe_avx2.c); the avx512 ISA's table
 * (both of its builds) uses the unpermute of these, with its own router and SwiGLU. */
xte_status xte_cpu_moe_unpermute_avx2(const xte_unpermute_args *a, int which, void *handle);
xte_status xte_cpu_moe_swiglu_avx2(const xte_swiglu_args *a, void *handle);

#endif /* XTE_MOE_CPU_H */
