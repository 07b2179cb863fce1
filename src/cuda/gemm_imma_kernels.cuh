/* The exact FP8 GEMM, stage 3: e4m3 x e4m3 block partials as int8 digit products on the integer
 * tensor cores (mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32, sm_80 and later:
 * src/cuda/xte_imma.cuh). Included by gemm_kernels.cuh after gemm_mma_kernels.cuh; its driver
 * launches it when the runtime policy asks for XTE_GEMM_KERNEL_IMMA and neither operand is e5m2
 * (src/cuda/gemm.cu: XTE_CUDA_GEMM_KERNEL=imma on a device of compute capability >= 8.0 running
 * its sm_80+ code; not chosen by default yet; tests/simt/simt_plugin.cpp: on request, with 32-lane
 * warps only). Same arguments, tiles, tile order, grid stride and problem lookup as the SIMT and
 * DMMA kernels, the same staging walk and scales (xte_gemm_stage_walk), the DMMA kernel's warp
 * tiling (8 warps of 32 x 16, xte_gemm_warp_live) and epilogue (xte_gemm_warp_store), the same
 * per-block update (xte_gemm_block_update): only the block partial differs.
 *
 * The block partial (src/numerics/xte_gemm_digits.h): each code c is staged as the three int8
 * digits of n = v(c) 2^9 = d2 2^14 + d1 2^7 + d0 (three digit planes per operand in shared
 * memory, K-contiguous rows). Per k step of 32 and output element, per weight 2^(7 w), w = 0..4,
 * the MMAs of the digit pairs d_i(a) d_j(b) with i + j = w (9 MMAs per k step: every pair once)
 * sum into one int32 sv (|sv| <= 2^18), which is added at once (xte_gemm_digits_fold) to one of the
 * block's two int32 sums lo = acc_0 + 2^7 acc_1, hi = acc_2 + 2^7 acc_3 + 2^14 acc_4 (acc_w: the
 * block's sum of weight w; |lo| < 2^28, |hi| < 2^29, every partial sum too: exact in any order);
 * one sv lives at a time. At the end of the block S = lo + 2^14 hi = sum_w acc_w 2^(7 w) in int64
 * (exact, |S| < 2^43), and p = RNE_fp32(S 2^-18) (xte_gemm_digits_partial): the exact block sum
 * rounded once, the bytes of the SIMT kernel's (float)P. Zeros staged past kn and outside the
 * problem have digits 0 and add nothing (an all-zero sum is S = 0, p = +0, as the fp64 kernels'
 * +0 start). NaN codes (0x7F, 0xFF; e4m3 has no inf) have digits 0 and stamp their row (A) or
 * column (B) with the K block's serial number q in s_qa / s_qb; an output element whose row or
 * column carries stamp q at the end of block q gets p = NaN, as the fp64 kernels' NaN products
 * make it. The stamps need no reset: q grows by one per K block over the whole launch (int64),
 * every stamp names the block that wrote it, and block q's writes happen between its first
 * staging barrier and its last, its reads after its last (the next block's writes come after
 * the next barrier).
 *
 * Shared memory: digit rows of KS = 64 codes, LDW = 20 words (16 + 4 padding) long; a fragment
 * load of a warp (lane (g, t): word (row0 + g) LDW + const + t) hits banks 20 g + t mod 32: 32
 * distinct banks. 2 x 3 x 64 x 80 bytes = 30 KiB of digits (31.5 KiB in all: 2 blocks per SM fit
 * on sm_80 / 89 / 90). */
#ifndef XTE_GEMM_IMMA_KERNELS_CUH
#define XTE_GEMM_IMMA_KERNELS_CUH

#include "cuda/xte_imma.cuh"
#include "numerics/xte_gemm_digits.h"

#define XTE_GEMM_IMMA_KS 64                          /* K values staged at a time */
#define XTE_GEMM_IMMA_LDW (XTE_GEMM_IMMA_KS / 4 + 4) /* row length of a digit plane (words) */

/* The m16n8k32 shape as the warp helpers of gemm_mma_kernels.cuh see it (the accumulator layout
 * of xte_imma.cuh, the same as m16n8k16's). */
struct xte_gemm_imma_shape {
  static constexpr int M = 16, N = 8, K = 32, NC = 4;
  static __device__ __forceinline__ int c_row(int g, int e) { return g + 8 * (e >> 1); }
  static __device__ __forceinline__ int c_col(int t, int e) { return 2 * t + (e & 1); }
};

/* The staging of the digit kernel: code -> its three digits, byte kk of row i of each plane; a
 * NaN code stamps row i with the block's serial number q. */
struct xte_gemm_put_digits {
  uint32_t (*s)[XTE_GEMM_BM][XTE_GEMM_IMMA_LDW]; /* [3] planes */
  int64_t *stamp;
  int64_t q;
  __device__ __forceinline__ void operator()(int kk, int i, bool, uint8_t code) const {
    int8_t d[3];
    if (xte_gemm_e4m3_digits(code, d)) stamp[i] = q;
    XTE_GEMM_UNROLL
    for (int j = 0; j < 3; j++) reinterpret_cast<int8_t *>(s[j][i])[kk] = d[j];
  }
};

/* 2 blocks per SM: at most 128 registers (136 unbounded at sm_90a); a lane holds 32 int32 block
 * sums (lo, hi), 16 fp32 accumulators, 12 + 6 fragment words and one sv of 4 */
__global__ void __launch_bounds__(XTE_GEMM_NT, 2)
    xte_gemm_imma_kernel(xte_gemm_args g, xte_gemm_problem p1, const xte_gemm_problem *probs,
                         const int64_t *tstart, int64_t G, int64_t total, xte_gemm_shifts sh) {
  using F = xte_gemm_imma_shape;
  constexpr int KS = XTE_GEMM_IMMA_KS, LDW = XTE_GEMM_IMMA_LDW;
  constexpr int MI = XTE_GEMM_DMMA_WM / F::M, NI = XTE_GEMM_DMMA_WN / F::N, NC = F::NC;
  static_assert(XTE_GEMM_NT == 256 && XTE_GEMM_BM == 64 && XTE_GEMM_BN == 64 && KS % F::K == 0 &&
                    XTE_GEMM_DMMA_WM % F::M == 0 && XTE_GEMM_DMMA_WN % F::N == 0,
                "8 warps of 32 x 16 cover the 64 x 64 tile; K steps of 32 inside a staging step");
  __shared__ uint32_t s_ad[3][XTE_GEMM_BM][LDW];
  __shared__ uint32_t s_bd[3][XTE_GEMM_BN][LDW];
  __shared__ int64_t s_qa[XTE_GEMM_BM], s_qb[XTE_GEMM_BN];
  __shared__ float s_sa[XTE_GEMM_BM], s_sb[XTE_GEMM_BN];
  const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int lg = lane >> 2, lt = lane & 3; /* groupID, threadID_in_group */
  const int wr = (warp & 1) * XTE_GEMM_DMMA_WM, wc = (warp >> 1) * XTE_GEMM_DMMA_WN;
  const int kblock = g.kblock;
  /* no stamp yet (read only after the first staging's barriers) */
  if (tid < XTE_GEMM_BM)
    s_qa[tid] = -1;
  else if (tid < XTE_GEMM_BM + XTE_GEMM_BN)
    s_qb[tid - XTE_GEMM_BM] = -1;
  int64_t q = 0; /* the K block's serial number in this launch (uniform) */
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    xte_gemm_problem p;
    int64_t mv, row0, col0;
    xte_gemm_find_tile(t, p1, probs, tstart, G, g.masked_m, p, mv, row0, col0);
    if (row0 >= mv) continue; /* masked rows: nothing to write (uniform) */
    int mlive, nlive;
    xte_gemm_warp_live<F, MI, NI>(mv - row0 - wr, p.n - col0 - wc, mlive, nlive);
    float acc[MI][NI][NC];
    XTE_GEMM_UNROLL
    for (int i = 0; i < MI; i++) XTE_GEMM_UNROLL
    for (int j = 0; j < NI; j++) XTE_GEMM_UNROLL
    for (int e = 0; e < NC; e++) acc[i][j][e] = 0.0f;
    for (int64_t k0 = 0; k0 < p.k; k0 += kblock, q++) {
      const int kl = (int)(p.k - k0 < kblock ? p.k - k0 : kblock);
      int32_t lo[MI][NI][NC], hi[MI][NI][NC]; /* the block's folded sums */
      XTE_GEMM_UNROLL
      for (int i = 0; i < MI; i++) XTE_GEMM_UNROLL
      for (int j = 0; j < NI; j++) XTE_GEMM_UNROLL
      for (int e = 0; e < NC; e++) lo[i][j][e] = hi[i][j][e] = 0;
      const xte_gemm_put_digits put_a = {s_ad, s_qa, q}, put_b = {s_bd, s_qb, q};
      for (int ks = 0; ks < kl; ks += KS) {
        const int kn = kl - ks < KS ? kl - ks : KS;
        __syncthreads(); /* the previous step's readers of the shared arrays are done */
        xte_gemm_stage_walk<KS>(g, p, sh, mv, row0, col0, k0, ks, kn, tid, s_sa, s_sb, put_a,
                                put_b);
        __syncthreads();
        /* k steps of 32 up to kn rounded up (zero digits staged past kn); uniform */
        for (int kk = 0; kk < kn; kk += F::K) {
          const int kw = kk / 4 + lt; /* the lane's first word in a digit row */
          XTE_GEMM_UNROLL
          for (int i = 0; i < MI; i++) {
            if (i >= mlive) continue;
            /* A's fragments of row tile i (3 digits x 4 words), then per column tile j B's (3 x
             * 2: loaded per (i, j), which keeps a lane within 128 registers, 2 blocks per SM) */
            uint32_t a[3][4];
            XTE_GEMM_UNROLL
            for (int d = 0; d < 3; d++) XTE_GEMM_UNROLL
            for (int r = 0; r < 4; r++)
              a[d][r] = s_ad[d][wr + F::M * i + lg + 8 * (r & 1)][kw + 4 * (r >> 1)];
            XTE_GEMM_UNROLL
            for (int j = 0; j < NI; j++) {
              if (j >= nlive) continue;
              uint32_t b[3][2];
              XTE_GEMM_UNROLL
              for (int d = 0; d < 3; d++) XTE_GEMM_UNROLL
              for (int r = 0; r < 2; r++) b[d][r] = s_bd[d][wc + F::N * j + lg][kw + 4 * r];
              /* per weight 2^(7 v) the pairs d_da(a) d_db(b), da + db = v, into one int32 sum
               * sv, then added to lo (v < 2) or hi (xte_gemm_digits_fold): one sv lives at a
               * time */
              XTE_GEMM_UNROLL
              for (int v = 0; v < 5; v++) {
                int32_t sv[NC] = {0, 0, 0, 0};
                XTE_GEMM_UNROLL
                for (int da = v < 2 ? 0 : v - 2; da <= (v < 2 ? v : 2); da++)
                  xte_imma_m16n8k32(sv, a[da], b[v - da], sv);
                XTE_GEMM_UNROLL
                for (int e = 0; e < NC; e++) {
                  if (v < 2)
                    lo[i][j][e] = xte_gemm_digits_fold(lo[i][j][e], sv[e], v);
                  else
                    hi[i][j][e] = xte_gemm_digits_fold(hi[i][j][e], sv[e], v);
                }
              }
            }
          }
        }
      }
      /* the block's contribution, in K order (as the SIMT kernel) */
      XTE_GEMM_UNROLL
      for (int i = 0; i < MI; i++) XTE_GEMM_UNROLL
      for (int j = 0; j < NI; j++) XTE_GEMM_UNROLL
      for (int e = 0; e < NC; e++) {
        const int rr = wr + F::M * i + F::c_row(lg, e), cc = wc + F::N * j + F::c_col(lt, e);
        const float pp =
            xte_gemm_digits_partial(lo[i][j][e], hi[i][j][e], s_qa[rr] == q || s_qb[cc] == q);
        acc[i][j][e] = xte_gemm_block_update(acc[i][j][e], pp, s_sa[rr], s_sb[cc]);
      }
    }
    xte_gemm_warp_store<F, MI, NI>(g, p, mv, row0 + wr, col0 + wc, lg, lt, acc);
  }
}

#endif /* XTE_GEMM_IMMA_KERNELS_CUH */
