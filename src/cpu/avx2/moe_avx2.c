/* The portable MoE drivers compiled a second time with AVX2 + FMA code generation (this folder's
 * flags), so that the explicit fmaf of the shared numerics is one instruction and the loops
 * vectorise. Same source, same operations, exactly rounded fmaf: the same bits as the generic
 * build, which the scalar ISA keeps using (tests compare every ISA). */
#define XTE_MOE_NAME(x) x##_avx2
#include "cpu/moe_permute.c"
#include "cpu/moe_router.c"
#include "cpu/moe_swiglu.c"
