/* The fp64 tensor-core MMA of the exact GEMM's stage 2 (src/cuda/gemm_mma_kernels.cuh), behind
 * one wrapper:
 *
 *   xte_dmma_m8n8k4(d, a, b, c):  D = A * B + C, A 8 x 4 (row), B 4 x 8 (col), C and D 8 x 8, fp64,
 *
 * called by every lane of a warp of 32 lanes, each holding its fragment of A, B, C and getting its
 * fragment of D. The fragment layout is the PTX ISA's, section 9.7.14.5.2 "Matrix Fragments for
 * mma.m8n8k4 with .f64 floating point type" (PTX ISA 9.x; 9.7.13.4.2 in older releases), with
 * groupID = %laneid >> 2 and threadID_in_group = %laneid % 4:
 *   A (a0):        row = %laneid >> 2,   col = %laneid % 4
 *   B (b0):        row = %laneid % 4,    col = %laneid >> 2
 *   C, D (c0, c1): row = groupID,        col = threadID_in_group * 2 + i   for ci, i = 0, 1
 *
 *  - device code for sm_80 and later: the instruction itself,
 *    mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 (inline PTX). Device code for older
 *    architectures traps: the host side never selects a kernel that calls this there
 *    (src/cuda/gemm.cu checks the device and the kernel's binary version);
 *  - host code (the kernel text compiled by the SIMT runner, tests/simt/simt.h): an emulation of
 *    the warp-wide instruction, a warp exchange following the layout above: lane (g, t) gathers
 *    A[g][k] from lane 4 g + k and B[k][2 t + i] from lane 4 (2 t + i) + k. It needs warps of 32
 *    lanes (mma is NVIDIA-only; the runner's 64- / 128-lane warps model MUSA, where the GEMM keeps
 *    its SIMT kernel) and aborts otherwise. The emulation sums c + a0 b0 + a1 b1 + a2 b2 + a3 b3 in
 *    that order with separate roundings; the instruction's internal order and rounding are the
 *    hardware's. Both agree whenever every partial sum is exact, which is the only way the exact
 *    GEMM uses it (docs/numerics.md: the block partials of FP8 products are exact in fp64 in any
 *    order).
 * d may alias c. */
#ifndef XTE_DMMA_CUH
#define XTE_DMMA_CUH

#if !defined(__CUDACC__) && !defined(__MUSACC__)
#include <cstdio>
#include <cstdlib>
#endif

__device__ __forceinline__ void xte_dmma_m8n8k4(double d[2], double a, double b,
                                                const double c[2]) {
#if defined(__CUDACC__) || defined(__MUSACC__)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%4, %5};\n"
               : "=d"(d[0]), "=d"(d[1])
               : "d"(a), "d"(b), "d"(c[0]), "d"(c[1]));
#elif defined(__CUDA_ARCH__)
  (void)a;
  (void)b;
  (void)c;
  d[0] = d[1] = 0.0;
  __trap(); /* never selected below sm_80 */
#else
  (void)a;
  (void)b;
  (void)c;
  d[0] = d[1] = 0.0;
#endif
#else
  /* the SIMT runner: lane = the linear thread index modulo the warp size. Every lane publishes
   * its (a, b) in its warp's slot of a double-buffered exchange array (blocks run one at a time:
   * one array serves every launch), one warp barrier, then every lane reads the lanes the layout
   * names. The barrier also separates this call's reads from the next call's writes into the
   * other buffer, and the call after that (same buffer) writes only after every lane passed the
   * next call's barrier, i.e. after this call's reads: one barrier per MMA (the runner's cost of
   * a warp exchange is its barriers: one __shfl_sync per value, 12 per MMA, made the DMMA pass of
   * test_simt_gemm about 20 times slower). */
  static double xch[2][32][32][2]; /* [buffer][warp of the block][lane][a, b] */
  static unsigned phase[32][32];   /* per lane: calls made (all lanes of a warp make the same) */
  if (warpSize != 32) {
    std::fprintf(stderr, "xte_dmma_m8n8k4: needs 32-lane warps (the runner has %d)\n", warpSize);
    std::abort();
  }
  const unsigned lin = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  const unsigned w = lin / 32u;
  const int lane = (int)(lin % 32u), g = lane >> 2, t = lane & 3;
  if (w >= 32u) std::abort();
  double(*const x)[2] = xch[phase[w][lane]++ & 1u][w];
  x[lane][0] = a;
  x[lane][1] = b;
  __syncwarp(0xFFFFFFFFu);
  double s0 = c[0], s1 = c[1];
  for (int k = 0; k < 4; k++) {
    const double ak = x[4 * g + k][0];           /* A[g][k]: lane 4 g + k */
    const double b0 = x[4 * (2 * t) + k][1];     /* B[k][2 t]: lane 4 (2 t) + k */
    const double b1 = x[4 * (2 * t + 1) + k][1]; /* B[k][2 t + 1]: lane 4 (2 t + 1) + k */
    s0 = s0 + ak * b0;
    s1 = s1 + ak * b1;
  }
  d[0] = s0;
  d[1] = s1;
#endif
}

#endif /* XTE_DMMA_CUH */
