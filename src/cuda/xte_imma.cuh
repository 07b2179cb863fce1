/* The int8 tensor-core MMA of the exact GEMM's digit kernel (src/cuda/gemm_imma_kernels.cuh):
 *
 *   xte_imma_m16n8k32(d, a, b, c):  D = A * B + C, A 16 x 32 (row), B 32 x 8 (col), s8 x s8,
 *                                   C and D 16 x 8 s32,
 *
 * called by every lane of a warp of 32 lanes, each holding its fragment of A (4 .b32 registers of
 * four s8 each, element a0 in the low byte of a[0]), B (2 registers) and C (4 s32) and getting
 * its fragment of D. The layouts are the PTX ISA's, section 9.7.14.5.10 "Matrix Fragments for
 * mma.m16n8k32" (the .s8 / .u8 parts, Figures 88, 90, 91 and 92 of PTX ISA 9.x), with groupID
 * g = %laneid >> 2 and threadID_in_group t = %laneid % 4:
 *   A (a0..a15):  row = g for ai, 0 <= i < 4 or 8 <= i < 12; g + 8 otherwise
 *                 col = 4 t + (i & 3) for i < 8; 4 t + (i & 3) + 16 for i >= 8
 *                 (register r = i / 4: rows g, g + 8, g, g + 8; columns 4 t .. 4 t + 3, the
 *                 same, + 16, + 16)
 *   B (b0..b7):   row = 4 t + (i & 3) for i < 4; 4 t + (i & 3) + 16 for i >= 4;  col = g
 *   C, D (c0..c3): row = g for i < 2, g + 8 for i >= 2;  col = 2 t + (i & 1)
 *
 *  - device code: mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 (sm_80 and later; no
 *    .satfinite: the digit kernel's sums stay far inside int32, see
 * src/numerics/xte_gemm_digits.h). Older architectures trap: the host side never selects the kernel
 * there (src/cuda/gemm.cu);
 *  - host code (the SIMT runner, tests/simt/simt.h): an emulation through a per-warp exchange
 *    array, as xte_dmma.cuh's: A[r][k] is byte k % 4 of register (r / 8) + 2 (k / 16) of lane
 *    4 (r % 8) + (k % 16) / 4, B[k][n] byte k % 4 of register k / 16 of lane 4 n + (k % 16) / 4.
 *    Integer sums: exact in any order (wrapping modulo 2^32 as the instruction would, never
 *    reached here). Needs warps of 32 lanes and aborts otherwise.
 * d may alias c. */
#ifndef XTE_IMMA_CUH
#define XTE_IMMA_CUH

#include <stdint.h>

#if !defined(__CUDACC__) && !defined(__MUSACC__)
#include <cstdio>
#include <cstdlib>
#endif

__device__ __forceinline__ void xte_imma_m16n8k32(int32_t d[4], const uint32_t a[4],
                                                  const uint32_t b[2], const int32_t c[4]) {
#if defined(__CUDACC__) || defined(__MUSACC__)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c[0]), "r"(c[1]),
        "r"(c[2]), "r"(c[3]));
#elif defined(__CUDA_ARCH__)
  (void)a;
  (void)b;
  (void)c;
  d[0] = d[1] = d[2] = d[3] = 0;
  __trap(); /* never selected below sm_80 */
#else
  (void)a;
  (void)b;
  (void)c;
  d[0] = d[1] = d[2] = d[3] = 0;
#endif
#else
  /* the SIMT runner: one double-buffered exchange array per warp, one warp barrier per MMA (see
   * xte_dmma_m8n8k4), 6 words per lane: a0..a3, b0, b1 */
  static uint32_t xch[2][32][32][6]; /* [buffer][warp of the block][lane][a0..a3, b0, b1] */
  static unsigned phase[32][32];     /* per lane: calls made (all lanes of a warp make the same) */
  if (warpSize != 32) {
    std::fprintf(stderr, "xte_imma_m16n8k32: needs 32-lane warps (the runner has %d)\n", warpSize);
    std::abort();
  }
  const unsigned lin = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  const unsigned w = lin / 32u;
  const int lane = (int)(lin % 32u), g = lane >> 2, t = lane & 3;
  if (w >= 32u) std::abort();
  uint32_t(*const x)[6] = xch[phase[w][lane]++ & 1u][w];
  for (int i = 0; i < 4; i++) x[lane][i] = a[i];
  for (int i = 0; i < 2; i++) x[lane][4 + i] = b[i];
  __syncwarp(0xFFFFFFFFu);
  uint32_t s[4];
  for (int e = 0; e < 4; e++) {
    const int r = g + 8 * (e >> 1), n = 2 * t + (e & 1); /* D[r][n] */
    s[e] = (uint32_t)c[e];
    for (int k = 0; k < 32; k++) {
      const uint32_t aw = x[4 * (r & 7) + ((k & 15) >> 2)][(r >> 3) + 2 * (k >> 4)];
      const uint32_t bw = x[4 * n + ((k & 15) >> 2)][4 + (k >> 4)];
      const int32_t ak = (int8_t)(uint8_t)(aw >> (8 * (k & 3))); /* A[r][k] */
      const int32_t bk = (int8_t)(uint8_t)(bw >> (8 * (k & 3))); /* B[k][n] */
      s[e] += (uint32_t)(ak * bk);
    }
  }
  for (int e = 0; e < 4; e++) d[e] = (int32_t)s[e];
#endif
}

#endif /* XTE_IMMA_CUH */
