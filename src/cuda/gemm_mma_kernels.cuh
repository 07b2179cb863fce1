/* The exact FP8 GEMM, stage 2: the block partials on the fp64 tensor cores (DMMA,
 * mma.sync.aligned.m8n8k4.row.col.f64, sm_80 and later, through xte_dmma_m8n8k4 in
 * src/cuda/xte_dmma.cuh). Included by gemm_kernels.cuh, whose driver launches it in place of the
 * SIMT kernel when its runtime policy says so (src/cuda/gemm.cu: a device of compute capability
 * >= 8.0 running this kernel's sm_80+ code; tests/simt/simt_plugin.cpp: on request, with 32-lane
 * warps only). Same arguments, same tiles (64 x 64 of D per 256-thread block, the same tile
 * order, grid stride and problem lookup), same staging (xte_gemm_stage: codes decoded to fp64 in
 * shared memory, the e5m2 class split) and the same per-block update and epilogue
 * (xte_gemm_block_update, xte_gemm_store): only the sum of the block partial differs.
 *
 * Why the bytes are the CPU's: the block partial of an output element is the sum of up to 128
 * (MXFP8: 32) products of two decoded FP8 values (one class of the e5m2 operand with SPLIT). The
 * SIMT kernel sums them by DFMA in K order, the MMA in the order of its k-steps of 4 and whatever
 * order the tensor core uses inside one; docs/numerics.md ("How the block partial is exact") shows
 * every product and every partial sum of a class is exactly representable in fp64 (e4m3 x e4m3:
 * multiples of 2^-18 below 2^43 units; the e5m2 classes: 42.7 and 40.9 bits), so every order and
 * every fused or unfused evaluation gives the same exact sum; NaN and inf propagate alike (a NaN or
 * inf code of row r / column c reaches only the outputs of that row / column, and a sum holding
 * +inf and -inf is NaN in any order). The zeros staged past kn (a ragged K step rounded up to the
 * MMA's k of 4) add 0 * 0 = +0 terms, which change no sum: both kernels start every partial at
 * +0, so an exact zero sum is +0 in both (RNE), and a nonzero one is what it is.
 *
 * An MMA tile of a warp with no row < mv or no column < n is skipped (uniform over the warp).
 * Warps: 8 per block; warp w owns rows 32 (w % 2) .. + 31 and columns 16 (w / 2) .. + 15 of the
 * tile, 4 x 2 MMA tiles of 8 x 8; lane (g = lane / 4, t = lane % 4) holds D[8 i + g][8 j + 2 t + e]
 * of MMA tile (i, j), e = 0, 1 (the accumulator layout of src/cuda/xte_dmma.cuh). Per thread:
 * 16 fp64 partials P (and 16 Q for the split's low class), 16 fp32 accumulators.
 * Shared rows are BM + 4 doubles long: the fragment loads of a half-warp (lanes g = 0..3 or
 * 4..7, t = 0..3, address t (BM + 4) + g + const) fall into 16 distinct 8-byte bank pairs. */
#ifndef XTE_GEMM_MMA_KERNELS_CUH
#define XTE_GEMM_MMA_KERNELS_CUH

#include "cuda/xte_dmma.cuh"

#define XTE_GEMM_DMMA_LD (XTE_GEMM_BM + 4) /* row length of the shared arrays (doubles) */
#define XTE_GEMM_DMMA_MI 4                 /* MMA tiles per warp along M (32 rows) */
#define XTE_GEMM_DMMA_NI 2                 /* MMA tiles per warp along N (16 columns) */

template <int SPLIT>
__global__ void __launch_bounds__(XTE_GEMM_NT)
    xte_gemm_dmma_kernel(xte_gemm_args g, xte_gemm_problem p1, const xte_gemm_problem *probs,
                         const int64_t *tstart, int64_t G, int64_t total, xte_gemm_shifts sh) {
  constexpr int KS = XTE_GEMM_KS(SPLIT), LD = XTE_GEMM_DMMA_LD;
  constexpr int MI = XTE_GEMM_DMMA_MI, NI = XTE_GEMM_DMMA_NI;
  static_assert(XTE_GEMM_NT == 256 && XTE_GEMM_BM == 64 && XTE_GEMM_BN == 64 && KS % 4 == 0,
                "8 warps of 32 x 16 cover the 64 x 64 tile; K steps of 4");
  __shared__ double s_a[KS][LD];
  __shared__ double s_b[KS][LD];
  __shared__ double s_lo[SPLIT ? KS : 1][SPLIT ? LD : 1];
  __shared__ float s_sa[XTE_GEMM_BM], s_sb[XTE_GEMM_BN];
  const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int lg = lane >> 2, lt = lane & 3; /* groupID, threadID_in_group */
  const int wr = (warp & 1) * (8 * MI), wc = (warp >> 1) * (8 * NI);
  const int kblock = g.kblock;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    xte_gemm_problem p;
    int64_t mv, row0, col0;
    xte_gemm_find_tile(t, p1, probs, tstart, G, g.masked_m, p, mv, row0, col0);
    if (row0 >= mv) continue; /* masked rows: nothing to write (uniform) */
    /* the warp's MMA tiles that hold an output element: i < mlive, j < nlive (uniform over the
     * warp; the others are skipped, their outputs are not written) */
    const int64_t mrest = mv - row0 - wr, nrest = p.n - col0 - wc;
    const int mlive = mrest <= 0 ? 0 : (mrest >= 8 * MI ? MI : (int)((mrest + 7) / 8));
    const int nlive = nrest <= 0 ? 0 : (nrest >= 8 * NI ? NI : (int)((nrest + 7) / 8));
    float acc[MI][NI][2];
    XTE_GEMM_UNROLL
    for (int i = 0; i < MI; i++) XTE_GEMM_UNROLL
    for (int j = 0; j < NI; j++) acc[i][j][0] = acc[i][j][1] = 0.0f;
    for (int64_t k0 = 0; k0 < p.k; k0 += kblock) {
      const int kl = (int)(p.k - k0 < kblock ? p.k - k0 : kblock);
      double P[MI][NI][2], Q[MI][NI][2];
      XTE_GEMM_UNROLL
      for (int i = 0; i < MI; i++) XTE_GEMM_UNROLL
      for (int j = 0; j < NI; j++) {
        P[i][j][0] = P[i][j][1] = 0.0;
        Q[i][j][0] = Q[i][j][1] = 0.0;
      }
      for (int ks = 0; ks < kl; ks += KS) {
        const int kn = kl - ks < KS ? kl - ks : KS;
        __syncthreads(); /* the previous step's readers of the shared arrays are done */
        xte_gemm_stage<SPLIT, KS, LD>(g, p, sh, mv, row0, col0, k0, ks, kn, tid, s_a, s_b, s_lo,
                                      s_sa, s_sb);
        __syncthreads();
        /* k steps of 4 up to kn rounded up (zeros staged past kn; KS % 4 == 0); kn is uniform,
         * so every lane of every warp runs the same MMAs */
        for (int kk = 0; kk < kn; kk += 4) {
          double a[MI], b[NI], l[SPLIT == 1 ? MI : NI];
          XTE_GEMM_UNROLL
          for (int i = 0; i < MI; i++) a[i] = s_a[kk + lt][wr + 8 * i + lg]; /* A[lg][lt] */
          XTE_GEMM_UNROLL
          for (int j = 0; j < NI; j++) b[j] = s_b[kk + lt][wc + 8 * j + lg]; /* B[lt][lg] */
          if (SPLIT == 1) {
            XTE_GEMM_UNROLL
            for (int i = 0; i < MI; i++) l[i] = s_lo[kk + lt][wr + 8 * i + lg];
          } else if (SPLIT == 2) {
            XTE_GEMM_UNROLL
            for (int j = 0; j < NI; j++) l[j] = s_lo[kk + lt][wc + 8 * j + lg];
          }
          XTE_GEMM_UNROLL
          for (int i = 0; i < MI; i++) XTE_GEMM_UNROLL
          for (int j = 0; j < NI; j++) {
            if (i >= mlive || j >= nlive) continue;
            xte_dmma_m8n8k4(P[i][j], a[i], b[j], P[i][j]);
            if (SPLIT == 1) xte_dmma_m8n8k4(Q[i][j], l[i], b[j], Q[i][j]);
            if (SPLIT == 2) xte_dmma_m8n8k4(Q[i][j], a[i], l[j], Q[i][j]);
          }
        }
      }
      /* the block's contribution, in K order (as the SIMT kernel) */
      XTE_GEMM_UNROLL
      for (int i = 0; i < MI; i++) XTE_GEMM_UNROLL
      for (int j = 0; j < NI; j++) XTE_GEMM_UNROLL
      for (int e = 0; e < 2; e++) {
        const float pp = SPLIT ? xte_gemm_round2_f32(P[i][j][e], Q[i][j][e]) : (float)P[i][j][e];
        acc[i][j][e] = xte_gemm_block_update(acc[i][j][e], pp, s_sa[wr + 8 * i + lg],
                                             s_sb[wc + 8 * j + 2 * lt + e]);
      }
    }
    /* the epilogue, the CPU's store_d */
    XTE_GEMM_UNROLL
    for (int i = 0; i < MI; i++) {
      const int64_t r = row0 + wr + 8 * i + lg;
      if (r >= mv) continue;
      XTE_GEMM_UNROLL
      for (int j = 0; j < NI; j++) XTE_GEMM_UNROLL
      for (int e = 0; e < 2; e++) {
        const int64_t c = col0 + wc + 8 * j + 2 * lt + e;
        if (c < p.n) xte_gemm_store(g, p, r, c, acc[i][j][e]);
      }
    }
  }
}

#endif /* XTE_GEMM_MMA_KERNELS_CUH */
