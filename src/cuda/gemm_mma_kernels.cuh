/* The exact FP8 GEMM, stage 2: the block partials on the fp64 tensor cores (DMMA), in two shapes
 * (src/cuda/xte_dmma.cuh): SHAPE 4, mma.sync.aligned.m8n8k4.row.col.f64 (sm_80 and later), and
 * SHAPE 16, mma.sync.aligned.m16n8k16.row.col.f64 (sm_90 and later: one instruction of 16 x 8 x 16,
 * 16 times the work of an m8n8k4, for a quarter of the fragment loads per product and of the
 * instructions). Included by gemm_kernels.cuh, whose driver launches one in place of the SIMT
 * kernel when its runtime policy says so (src/cuda/gemm.cu: m16n8k16 on a device of compute
 * capability >= 9.0 running that kernel's sm_90+ code, m8n8k4 on one of compute capability >= 8.0
 * running its sm_80+ code; tests/simt/simt_plugin.cpp: on request, with 32-lane warps only). Same
 * arguments, same tiles (64 x 64 of D per 256-thread block, the same tile order, grid stride and
 * problem lookup), same staging (xte_gemm_stage: codes decoded to fp64 in shared memory, the e5m2
 * class split) and the same per-block update and epilogue (xte_gemm_block_update,
 * xte_gemm_store): only the sum of the block partial differs. One kernel text serves both shapes
 * through xte_gemm_dmma_shape<SHAPE> (the fragment layouts, below).
 *
 * Why the bytes are the CPU's: the block partial of an output element is the sum of up to 128
 * (MXFP8: 32) products of two decoded FP8 values (one class of the e5m2 operand with SPLIT). The
 * SIMT kernel sums them by DFMA in K order, the MMAs in the order of their k-steps (4 or 16) and
 * whatever order the tensor core uses inside one; docs/numerics.md ("How the block partial is
 * exact") shows every product and every partial sum of a class is exactly representable in fp64
 * (e4m3 x e4m3: multiples of 2^-18 below 2^43 units; the e5m2 classes: 42.7 and 40.9 bits), so
 * every order, every grouping (an m16n8k16 may add its 16 products in a tree, or fuse them) and
 * every fused or unfused evaluation gives the same exact sum; NaN and inf propagate alike (a NaN
 * or inf code of row r / column c reaches only the outputs of that row / column, and a sum
 * holding +inf and -inf is NaN in any order). The zeros staged past kn (a ragged K step rounded
 * up to the MMA's k of 4 or 16; KS is a multiple of both) add 0 * 0 = +0 terms, which change no
 * sum: both kernels start every partial at +0, so an exact zero sum is +0 in both (RNE), and a
 * nonzero one is what it is.
 *
 * An MMA tile of a warp with no row < mv or no column < n is skipped (uniform over the warp).
 * Warps: 8 per block; warp w owns rows 32 (w % 2) .. + 31 and columns 16 (w / 2) .. + 15 of the
 * tile: m8n8k4, 4 x 2 MMA tiles of 8 x 8; m16n8k16, 2 x 2 MMA tiles of 16 x 8. Per thread: 16
 * fp64 partials P (and 16 Q for the split's low class), 16 fp32 accumulators in both; the lane's
 * elements of MMA tile (i, j) are those of the accumulator layout (xte_gemm_dmma_shape::c_row /
 * c_col). Shared rows are BM + 4 doubles long: the fragment loads of a half-warp (lanes
 * g = 0..3 or 4..7, t = 0..3, address (4 q + t) (BM + 4) + g + const for both shapes and
 * operands, 68 = 4 mod 16) fall into 16 distinct 8-byte bank pairs. */
#ifndef XTE_GEMM_MMA_KERNELS_CUH
#define XTE_GEMM_MMA_KERNELS_CUH

#include "cuda/xte_dmma.cuh"

#define XTE_GEMM_DMMA_LD (XTE_GEMM_BM + 4) /* row length of the shared arrays (doubles) */
#define XTE_GEMM_DMMA_WM 32                /* warp tile rows */
#define XTE_GEMM_DMMA_WN 16                /* warp tile columns */

/* The MMA shapes: M x N x K; per lane NA / NB / NC elements of A / B / C; lane (g, t) =
 * (lane >> 2, lane & 3) holds A[a_row(g, r)][a_k(t, r)] as its r-th A element,
 * B[b_k(t, r)][b_col(g)] as its r-th B element and C[c_row(g, e)][c_col(t, e)] as its e-th
 * accumulator (src/cuda/xte_dmma.cuh: the PTX ISA's layouts). */
template <int SHAPE>
struct xte_gemm_dmma_shape;
template <>
struct xte_gemm_dmma_shape<4> { /* m8n8k4 */
  static constexpr int M = 8, N = 8, K = 4, NA = 1, NB = 1, NC = 2;
  static __device__ __forceinline__ int a_row(int g, int) { return g; }
  static __device__ __forceinline__ int a_k(int t, int) { return t; }
  static __device__ __forceinline__ int b_k(int t, int) { return t; }
  static __device__ __forceinline__ int b_col(int g) { return g; }
  static __device__ __forceinline__ int c_row(int g, int) { return g; }
  static __device__ __forceinline__ int c_col(int t, int e) { return 2 * t + e; }
  static __device__ __forceinline__ void mma(double d[NC], const double a[NA], const double b[NB],
                                             const double c[NC]) {
    xte_dmma_m8n8k4(d, a[0], b[0], c);
  }
};
template <>
struct xte_gemm_dmma_shape<16> { /* m16n8k16 */
  static constexpr int M = 16, N = 8, K = 16, NA = 8, NB = 4, NC = 4;
  static __device__ __forceinline__ int a_row(int g, int r) { return g + 8 * (r & 1); }
  static __device__ __forceinline__ int a_k(int t, int r) { return 4 * (r >> 1) + t; }
  static __device__ __forceinline__ int b_k(int t, int r) { return 4 * r + t; }
  static __device__ __forceinline__ int b_col(int g) { return g; }
  static __device__ __forceinline__ int c_row(int g, int e) { return g + 8 * (e >> 1); }
  static __device__ __forceinline__ int c_col(int t, int e) { return 2 * t + (e & 1); }
  static __device__ __forceinline__ void mma(double d[NC], const double a[NA], const double b[NB],
                                             const double c[NC]) {
    xte_dmma_m16n8k16(d, a, b, c);
  }
};

/* The MMA tiles of a warp's MI x NI grid (F::M x F::N each) that hold an output element, given
 * the rows (mrest) and columns (nrest) of the problem from the warp tile's first on: i < mlive,
 * j < nlive (uniform over the warp; the others are skipped, their outputs are not written). */
template <class F, int MI, int NI>
__device__ __forceinline__ void xte_gemm_warp_live(int64_t mrest, int64_t nrest, int &mlive,
                                                   int &nlive) {
  mlive = mrest <= 0 ? 0 : (mrest >= F::M * MI ? MI : (int)((mrest + F::M - 1) / F::M));
  nlive = nrest <= 0 ? 0 : (nrest >= F::N * NI ? NI : (int)((nrest + F::N - 1) / F::N));
}

/* The epilogue of a warp's accumulators (the CPU's store_d): acc[i][j][e] is element
 * (r0 + F::M i + F::c_row(lg, e), c0 + F::N j + F::c_col(lt, e)) of D (r0, c0: the warp tile's
 * first row and column in the problem); only rows < mv and columns < p.n are written. */
template <class F, int MI, int NI>
__device__ __forceinline__ void xte_gemm_warp_store(const xte_gemm_args &g,
                                                    const xte_gemm_problem &p, int64_t mv,
                                                    int64_t r0, int64_t c0, int lg, int lt,
                                                    const float (&acc)[MI][NI][F::NC]) {
  XTE_GEMM_UNROLL
  for (int i = 0; i < MI; i++) XTE_GEMM_UNROLL
  for (int e = 0; e < F::NC; e++) {
    const int64_t r = r0 + F::M * i + F::c_row(lg, e);
    if (r >= mv) continue;
    XTE_GEMM_UNROLL
    for (int j = 0; j < NI; j++) {
      const int64_t c = c0 + F::N * j + F::c_col(lt, e);
      if (c < p.n) xte_gemm_store(g, p, r, c, acc[i][j][e]);
    }
  }
}

/* m16n8k16 without SPLIT: at most 128 registers, 2 blocks per SM (as the m8n8k4 kernel without
 * SPLIT, 121 registers unbounded); the others take 1 block per SM (about 160 - 190 registers) */
template <int SPLIT, int SHAPE>
__global__ void __launch_bounds__(XTE_GEMM_NT, (SHAPE == 16 && SPLIT == 0) ? 2 : 1)
    xte_gemm_dmma_kernel(xte_gemm_args g, xte_gemm_problem p1, const xte_gemm_problem *probs,
                         const int64_t *tstart, int64_t G, int64_t total, xte_gemm_shifts sh) {
  using F = xte_gemm_dmma_shape<SHAPE>;
  constexpr int KS = XTE_GEMM_KS(SPLIT), LD = XTE_GEMM_DMMA_LD;
  constexpr int MI = XTE_GEMM_DMMA_WM / F::M, NI = XTE_GEMM_DMMA_WN / F::N, NC = F::NC;
  static_assert(XTE_GEMM_NT == 256 && XTE_GEMM_BM == 64 && XTE_GEMM_BN == 64 && KS % F::K == 0 &&
                    XTE_GEMM_DMMA_WM % F::M == 0 && XTE_GEMM_DMMA_WN % F::N == 0,
                "8 warps of 32 x 16 cover the 64 x 64 tile; K steps of the MMA's k");
  __shared__ double s_a[KS][LD];
  __shared__ double s_b[KS][LD];
  __shared__ double s_lo[SPLIT ? KS : 1][SPLIT ? LD : 1];
  __shared__ float s_sa[XTE_GEMM_BM], s_sb[XTE_GEMM_BN];
  const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int lg = lane >> 2, lt = lane & 3; /* groupID, threadID_in_group */
  const int wr = (warp & 1) * XTE_GEMM_DMMA_WM, wc = (warp >> 1) * XTE_GEMM_DMMA_WN;
  const int kblock = g.kblock;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    xte_gemm_problem p;
    int64_t mv, row0, col0;
    xte_gemm_find_tile(t, p1, probs, tstart, G, g.masked_m, p, mv, row0, col0);
    if (row0 >= mv) continue; /* masked rows: nothing to write (uniform) */
    /* the warp's MMA tiles that hold an output element: i < mlive, j < nlive (uniform over the
     * warp; the others are skipped, their outputs are not written) */
    int mlive, nlive;
    xte_gemm_warp_live<F, MI, NI>(mv - row0 - wr, p.n - col0 - wc, mlive, nlive);
    float acc[MI][NI][NC];
    XTE_GEMM_UNROLL
    for (int i = 0; i < MI; i++) XTE_GEMM_UNROLL
    for (int j = 0; j < NI; j++) XTE_GEMM_UNROLL
    for (int e = 0; e < NC; e++) acc[i][j][e] = 0.0f;
    for (int64_t k0 = 0; k0 < p.k; k0 += kblock) {
      const int kl = (int)(p.k - k0 < kblock ? p.k - k0 : kblock);
      double P[MI][NI][NC], Q[MI][NI][NC];
      XTE_GEMM_UNROLL
      for (int i = 0; i < MI; i++) XTE_GEMM_UNROLL
      for (int j = 0; j < NI; j++) XTE_GEMM_UNROLL
      for (int e = 0; e < NC; e++) {
        P[i][j][e] = 0.0;
        Q[i][j][e] = 0.0;
      }
      for (int ks = 0; ks < kl; ks += KS) {
        const int kn = kl - ks < KS ? kl - ks : KS;
        __syncthreads(); /* the previous step's readers of the shared arrays are done */
        xte_gemm_stage<SPLIT, KS, LD>(g, p, sh, mv, row0, col0, k0, ks, kn, tid, s_a, s_b, s_lo,
                                      s_sa, s_sb);
        __syncthreads();
        /* k steps of F::K up to kn rounded up (zeros staged past kn; KS % F::K == 0); kn is
         * uniform, so every lane of every warp runs the same MMAs */
        for (int kk = 0; kk < kn; kk += F::K) {
          /* B's fragments (and its low class's) for every j, then per i A's (and its low
           * class's) and the MMAs of row i: the A fragments of one i live at a time (m16n8k16:
           * 8 doubles each, 16 with SPLIT 1), which keeps the registers within 2 blocks per SM
           * without SPLIT */
          double b[NI][F::NB], lb[NI][F::NB];
          XTE_GEMM_UNROLL
          for (int j = 0; j < NI; j++) XTE_GEMM_UNROLL
          for (int r = 0; r < F::NB; r++) {
            const int kr = kk + F::b_k(lt, r), cc = wc + F::N * j + F::b_col(lg);
            b[j][r] = s_b[kr][cc];
            if (SPLIT == 2) lb[j][r] = s_lo[kr][cc];
          }
          XTE_GEMM_UNROLL
          for (int i = 0; i < MI; i++) {
            if (i >= mlive) continue;
            double a[F::NA], la[F::NA];
            XTE_GEMM_UNROLL
            for (int r = 0; r < F::NA; r++) {
              const int kr = kk + F::a_k(lt, r), rr = wr + F::M * i + F::a_row(lg, r);
              a[r] = s_a[kr][rr];
              if (SPLIT == 1) la[r] = s_lo[kr][rr];
            }
            XTE_GEMM_UNROLL
            for (int j = 0; j < NI; j++) {
              if (j >= nlive) continue;
              F::mma(P[i][j], a, b[j], P[i][j]);
              if (SPLIT == 1) F::mma(Q[i][j], la, b[j], Q[i][j]);
              if (SPLIT == 2) F::mma(Q[i][j], a, lb[j], Q[i][j]);
            }
          }
        }
      }
      /* the block's contribution, in K order (as the SIMT kernel) */
      XTE_GEMM_UNROLL
      for (int i = 0; i < MI; i++) XTE_GEMM_UNROLL
      for (int j = 0; j < NI; j++) XTE_GEMM_UNROLL
      for (int e = 0; e < NC; e++) {
        const float pp = SPLIT ? xte_gemm_round2_f32(P[i][j][e], Q[i][j][e]) : (float)P[i][j][e];
        acc[i][j][e] =
            xte_gemm_block_update(acc[i][j][e], pp, s_sa[wr + F::M * i + F::c_row(lg, e)],
                                  s_sb[wc + F::N * j + F::c_col(lt, e)]);
      }
    }
    xte_gemm_warp_store<F, MI, NI>(g, p, mv, row0 + wr, col0 + wc, lg, lt, acc);
  }
}

#endif /* XTE_GEMM_MMA_KERNELS_CUH */
