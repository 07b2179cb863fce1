/* The fp64 tensor-core MMAs of the exact GEMM's stage 2 (src/cuda/gemm_mma_kernels.cuh), each
 * behind one wrapper:
 *
 *   xte_dmma_m8n8k4(d, a, b, c):    D = A * B + C, A 8 x 4 (row), B 4 x 8 (col), C and D 8 x 8,
 *   xte_dmma_m16n8k16(d, a, b, c):  D = A * B + C, A 16 x 16 (row), B 16 x 8 (col), C, D 16 x 8,
 *
 * all fp64, called by every lane of a warp of 32 lanes, each holding its fragment of A, B, C and
 * getting its fragment of D. The fragment layouts are the PTX ISA's, with
 * groupID g = %laneid >> 2 and threadID_in_group t = %laneid % 4:
 *
 *  m8n8k4, section 9.7.14.5.2 "Matrix Fragments for mma.m8n8k4 with .f64 floating point type"
 *  (PTX ISA 9.x; 9.7.13.4.2 in older releases):
 *   A (a0):        row = %laneid >> 2,   col = %laneid % 4
 *   B (b0):        row = %laneid % 4,    col = %laneid >> 2
 *   C, D (c0, c1): row = groupID,        col = threadID_in_group * 2 + i   for ci, i = 0, 1
 *
 *  m16n8k16, section 9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point type",
 *  the .f64 parts (Figures 80, 82 and 83 of PTX ISA 9.x):
 *   A (a0..a7):    row = g for ai, i even; g + 8 for i odd
 *                  col = i * 2 + t for i even; i * 2 - 2 + t for i odd
 *                  (a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4), ... a7 (g + 8, t +
 * 12)) B (b0..b3):    row = t + 4 i,        col = g C, D (c0..c3): row = g for i < 2, g + 8 for i
 * >= 2;  col = t * 2 + (i & 1)
 *
 *  - device code: the instructions themselves (inline PTX),
 *    mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 for sm_80 and later, and
 *    mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 (PTX ISA 7.8) for sm_90 and later. Device
 *    code for older architectures traps: the host side never selects a kernel that calls them
 *    there (src/cuda/gemm.cu checks the device and the kernel's binary version);
 *  - host code (the kernel text compiled by the SIMT runner, tests/simt/simt.h): an emulation of
 *    each warp-wide instruction, a warp exchange following the layouts above: in m8n8k4 lane
 *    (g, t) gathers A[g][k] from lane 4 g + k and B[k][2 t + i] from lane 4 (2 t + i) + k; in
 *    m16n8k16 A[r][k] is element 2 (k / 4) + r / 8 of lane 4 (r % 8) + k % 4 and B[k][n] element
 *    k / 4 of lane 4 n + k % 4. They need warps of 32 lanes (mma is NVIDIA-only; the runner's
 *    64- / 128-lane warps model MUSA, where the GEMM keeps its SIMT kernel) and abort otherwise.
 *    The emulations sum c + a0 b0 + a1 b1 + ... in K order with separate roundings; the
 *    instruction's internal order and rounding are the hardware's. Both agree whenever every
 *    partial sum is exact, which is the only way the exact GEMM uses them (docs/numerics.md: the
 *    block partials of FP8 products are exact in fp64 in any order).
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
   * a warp exchange is its barriers: one __shfl_sync per value would be 12 barriers per MMA). */
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

__device__ __forceinline__ void xte_dmma_m16n8k16(double d[4], const double a[8], const double b[4],
                                                  const double c[4]) {
#if defined(__CUDACC__) || defined(__MUSACC__)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, {%16, %17, %18, %19};\n"
      : "=d"(d[0]), "=d"(d[1]), "=d"(d[2]), "=d"(d[3])
      : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]),
        "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]), "d"(c[0]), "d"(c[1]), "d"(c[2]), "d"(c[3]));
#elif defined(__CUDA_ARCH__)
  (void)a;
  (void)b;
  (void)c;
  d[0] = d[1] = d[2] = d[3] = 0.0;
  __trap(); /* never selected below sm_90 */
#else
  (void)a;
  (void)b;
  (void)c;
  d[0] = d[1] = d[2] = d[3] = 0.0;
#endif
#else
  /* the SIMT runner: as xte_dmma_m8n8k4's emulation (one double-buffered exchange array per warp,
   * one warp barrier per MMA), 12 values per lane: a0..a7, b0..b3 */
  static double xch[2][32][32][12]; /* [buffer][warp of the block][lane][a0..a7, b0..b3] */
  static unsigned phase[32][32];    /* per lane: calls made (all lanes of a warp make the same) */
  if (warpSize != 32) {
    std::fprintf(stderr, "xte_dmma_m16n8k16: needs 32-lane warps (the runner has %d)\n", warpSize);
    std::abort();
  }
  const unsigned lin = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  const unsigned w = lin / 32u;
  const int lane = (int)(lin % 32u), g = lane >> 2, t = lane & 3;
  if (w >= 32u) std::abort();
  double(*const x)[12] = xch[phase[w][lane]++ & 1u][w];
  for (int i = 0; i < 8; i++) x[lane][i] = a[i];
  for (int i = 0; i < 4; i++) x[lane][8 + i] = b[i];
  __syncwarp(0xFFFFFFFFu);
  double s[4];
  for (int e = 0; e < 4; e++) {
    const int r = g + 8 * (e >> 1), n = 2 * t + (e & 1); /* D[r][n] */
    s[e] = c[e];
    for (int k = 0; k < 16; k++) {
      const double ak = x[4 * (r & 7) + (k & 3)][2 * (k >> 2) + (r >> 3)]; /* A[r][k] */
      const double bk = x[4 * n + (k & 3)][8 + (k >> 2)];                  /* B[k][n] */
      s[e] = s[e] + ak * bk;
    }
  }
  for (int e = 0; e < 4; e++) d[e] = s[e];
#endif
}

#endif /* XTE_DMMA_CUH */
