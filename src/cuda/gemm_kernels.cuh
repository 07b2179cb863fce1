/* The exact FP8 GEMM of the CUDA plugin (XTE_GEMM_EXACT, stage 1: SIMT fp64; stage 2, the fp64
 * tensor-core kernel of gemm_mma_kernels.cuh, included below), dense and grouped,
 * and the host steps that drive it, written against a small runtime policy RT (allocation,
 * host-to-device upload, device-to-host read of a verdict, launch): no runtime call appears here.
 * src/cuda/gemm.cu instantiates the driver with the CUDA runtime; tests/simt/simt_plugin.cpp with
 * the host SIMT runner (simt.h), so the same text is checked byte for byte against the CPU backend
 * (tests/simt/test_simt_gemm.cpp).
 *
 * The contract is docs/numerics.md section 6 (include/xte/gemm.h), the CPU backend's bytes:
 *  - a block of XTE_GEMM_NT threads owns a 64 x 64 tile of D of one problem; each thread a 4 x 4
 *    register tile (rows ty + 16 i, columns tx + 16 j);
 *  - per K block (128, or 32 for MXFP8) the operands' codes are decoded to fp64 (exact) into
 *    shared memory, 32 (16 with an e5m2 operand) values of K at a time, and every thread sums its
 * 16 block partials in fp64 (exact in any order: src/numerics/xte_gemm_numerics.h); with an e5m2
 * operand its values are split into the classes |v| >= 1 (and NaN, inf) and |v| < 1, summed apart
 * and rounded once by xte_gemm_round2_f32, as the CPU does;
 *  - then, per block in K order: p = RNE_fp32(partial), acc = fmaf(p, RNE_fp32(sa * sb), acc)
 *    (xte_gemm_block_update), and at the end the epilogue (C, bias, output rounding, canonical
 *    NaN) of the shared numerics. Only rows < m (masked_m) and columns < n are written: padding
 *    rows of a contiguous grouping and rows past masked_m are left alone, as on the CPU;
 *  - masked_m lives in device memory: a validation kernel finds the first group outside
 *    [0, m_max] (integer atomicMin: the result does not depend on the order of the atomics), the
 *    host reads the verdict back and refuses with the CPU's message before any output is written;
 *  - no atomics in the GEMM itself, no warp-size assumption (no warp intrinsics) in this SIMT
 *    kernel: it runs on every device and on MUSA. The DMMA kernel (stage 2) shares its tiles,
 *    staging, block update and epilogue and needs NVIDIA's 32-lane warps and sm_80 (its m16n8k16
 *    form sm_90): the runtime policy's `dmma` (XTE_GEMM_KERNEL_*) says which one the driver
 *    launches (XTE_GEMM_DMMA: compiled at all).
 * Scale blocks are powers of two along both axes (1, 32, 128 or the per-tensor 2^50: see
 * src/gemm_api.c), so block coordinates are shifts, never a 64-bit division on the device. */
#ifndef XTE_GEMM_KERNELS_CUH
#define XTE_GEMM_KERNELS_CUH

#include <stdint.h>
#include <string.h>

#include "numerics/xte_gemm_numerics.h"
#include "xte_backend.h"
#include "xte_gemm_ops.h"

#define XTE_GEMM_NT 256 /* threads per block: 16 x 16 */
#define XTE_GEMM_BM 64  /* tile rows (of A / D) */
#define XTE_GEMM_BN 64  /* tile columns (rows of B) */
#define XTE_GEMM_TM 4   /* per thread: rows ty + 16 i */
#define XTE_GEMM_TN 4   /* per thread: columns tx + 16 j */
/* K values staged in shared memory at a time (divides 32 and 128): 32, or 16 with a split operand
 * (its low class takes a third array; static shared memory stays under 48 KiB) */
#define XTE_GEMM_KS(split) ((split) ? 16 : 32)
#define XTE_GEMM_GRID_CAP (1 << 20) /* blocks of a launch (tiles beyond: grid stride) */
#define XTE_GEMM_NONE 0xFFFFFFFFFFFFFFFFull

typedef unsigned long long xte_gemm_u64;

/* Register-tile loops unrolled on the device; nothing for the host runner. */
#if defined(__CUDACC__) || defined(__MUSACC__)
#define XTE_GEMM_UNROLL _Pragma("unroll")
#else
#define XTE_GEMM_UNROLL
#endif

#define XTE_GEMM_TRY(expr)                              \
  do {                                                  \
    xte_status xte_gemm_s_ = (expr);                    \
    if (xte_gemm_s_ != XTE_SUCCESS) return xte_gemm_s_; \
  } while (0)

/* log2 of the scale blocks of the two operands (rows, K) */
typedef struct xte_gemm_shifts {
  int a_i, a_k, b_i, b_k;
} xte_gemm_shifts;

/* scale_inv of operand row i (absolute) at absolute K index k */
__device__ __forceinline__ float xte_gemm_scale(const xte_gemm_operand &o, int sh_i, int sh_k,
                                                int64_t i, int64_t k) {
  const xte_scale_map m = o.s;
  const int64_t gi = i >> sh_i, gk = k >> sh_k;
  return o.sswap ? xte_load_scale_inv(&m, gk, gi) : xte_load_scale_inv(&m, gi, gk);
}

/* masked_m[g] outside [0, problems[g].m]: the first such g into *bad */
__global__ void __launch_bounds__(XTE_GEMM_NT)
    xte_gemm_check_masked(const int32_t *masked_m, const xte_gemm_problem *probs, int64_t G,
                          xte_gemm_u64 *bad) {
  for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < G;
       g += (int64_t)gridDim.x * blockDim.x) {
    const int32_t v = masked_m[g];
    if (v < 0 || (int64_t)v > probs[g].m) atomicMin(bad, (xte_gemm_u64)g);
  }
}

/* The problem p of tile t (uniform over the block): G == 1 and probs == NULL: p1; else probs[gi],
 * the last gi with tstart[gi] <= t, whose first tile is tstart[gi]. mv: the problem's rows to
 * write (masked_m[gi] when masked_m is given); row0, col0: the tile's first output element. */
__device__ __forceinline__ void xte_gemm_find_tile(int64_t t, const xte_gemm_problem &p1,
                                                   const xte_gemm_problem *probs,
                                                   const int64_t *tstart, int64_t G,
                                                   const int32_t *masked_m, xte_gemm_problem &p,
                                                   int64_t &mv, int64_t &row0, int64_t &col0) {
  int64_t gi = 0, t0 = 0;
  p = p1;
  if (probs) {
    int64_t lo = 0, hi = G - 1;
    while (lo < hi) { /* last g with tstart[g] <= t */
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (tstart[mid] <= t)
        lo = mid;
      else
        hi = mid - 1;
    }
    gi = lo;
    p = probs[gi];
    t0 = tstart[gi];
  }
  mv = masked_m ? (int64_t)masked_m[gi] : p.m;
  const uint32_t ntn = (uint32_t)((p.n + XTE_GEMM_BN - 1) / XTE_GEMM_BN);
  const uint32_t local = (uint32_t)(t - t0);
  row0 = (int64_t)(local / ntn) * XTE_GEMM_BM;
  col0 = (int64_t)(local % ntn) * XTE_GEMM_BN;
}

/* The staging walk of every kernel (all XTE_GEMM_NT threads, between two barriers): with ks == 0
 * the scales of the tile's rows and columns for K block k0 into s_sa / s_sb; then every code
 * [row][k0 + ks + kk], kk < KS, of the tile's A rows goes to put_a(kk, row, live, code) and of its
 * B rows (the output's columns) to put_b(kk, col, live, code); live: inside the problem and
 * kk < kn (code 0 otherwise). The walk follows the operand's contiguous axis. */
template <int KS, class PA, class PB>
__device__ __forceinline__ void xte_gemm_stage_walk(const xte_gemm_args &g,
                                                    const xte_gemm_problem &p,
                                                    const xte_gemm_shifts &sh, int64_t mv,
                                                    int64_t row0, int64_t col0, int64_t k0, int ks,
                                                    int kn, int tid, float *s_sa, float *s_sb,
                                                    const PA &put_a, const PB &put_b) {
  if (ks == 0) {
    if (tid < XTE_GEMM_BM) {
      const int64_t r = row0 + tid;
      s_sa[tid] = r < mv ? xte_gemm_scale(g.a, sh.a_i, sh.a_k, p.a_i0 + r, p.a_k0 + k0) : 0.0f;
    } else if (tid < XTE_GEMM_BM + XTE_GEMM_BN) {
      const int64_t c = col0 + (tid - XTE_GEMM_BM);
      s_sb[tid - XTE_GEMM_BM] =
          c < p.n ? xte_gemm_scale(g.b, sh.b_i, sh.b_k, p.b_i0 + c, p.b_k0 + k0) : 0.0f;
    }
  }
  for (int idx = tid; idx < KS * XTE_GEMM_BM; idx += XTE_GEMM_NT) {
    const int kk = g.a.ks == 1 ? idx % KS : idx / XTE_GEMM_BM;
    const int r = g.a.ks == 1 ? idx / KS : idx % XTE_GEMM_BM;
    const bool live = row0 + r < mv && kk < kn;
    const uint8_t code =
        live ? g.a.data[(p.a_i0 + row0 + r) * g.a.rs + (p.a_k0 + k0 + ks + kk) * g.a.ks] : 0;
    put_a(kk, r, live, code);
  }
  for (int idx = tid; idx < KS * XTE_GEMM_BN; idx += XTE_GEMM_NT) {
    const int kk = g.b.ks == 1 ? idx % KS : idx / XTE_GEMM_BN;
    const int c = g.b.ks == 1 ? idx / KS : idx % XTE_GEMM_BN;
    const bool live = col0 + c < p.n && kk < kn;
    const uint8_t code =
        live ? g.b.data[(p.b_i0 + col0 + c) * g.b.rs + (p.b_k0 + k0 + ks + kk) * g.b.ks] : 0;
    put_b(kk, c, live, code);
  }
}

/* The fp64 staging of the SIMT and DMMA kernels: a code decoded to fp64 (exact) into s[kk][i],
 * zero when not live; operand WHICH (1 A, 2 B) == SPLIT is the e5m2 one, whose classes go to s
 * (|v| >= 1, NaN, inf) and lo (|v| < 1). */
template <int SPLIT, int WHICH, int LD>
struct xte_gemm_put_f64 {
  double (*s)[LD];
  double (*lo)[SPLIT ? LD : 1];
  int fmt;
  __device__ __forceinline__ void operator()(int kk, int i, bool live, uint8_t code) const {
    const double v = live ? xte_fp8_to_f64(code, fmt) : 0.0;
    if (SPLIT == WHICH) {
      s[kk][i] = xte_gemm_class_hi(v);
      lo[kk][i] = xte_gemm_class_lo(v);
    } else {
      s[kk][i] = v;
    }
  }
};

/* One staging step of the SIMT and DMMA kernels: xte_gemm_stage_walk with the codes decoded to
 * fp64 into s_a[kk][row] / s_b[kk][col] (and with SPLIT the e5m2 operand's low class into s_lo).
 * LD: the row length of the shared arrays (the kernels pad it differently). */
template <int SPLIT, int KS, int LD>
__device__ __forceinline__ void xte_gemm_stage(const xte_gemm_args &g, const xte_gemm_problem &p,
                                               const xte_gemm_shifts &sh, int64_t mv, int64_t row0,
                                               int64_t col0, int64_t k0, int ks, int kn, int tid,
                                               double (*s_a)[LD], double (*s_b)[LD],
                                               double (*s_lo)[SPLIT ? LD : 1], float *s_sa,
                                               float *s_sb) {
  const xte_gemm_put_f64<SPLIT, 1, LD> put_a = {s_a, s_lo, g.a.fmt};
  const xte_gemm_put_f64<SPLIT, 2, LD> put_b = {s_b, s_lo, g.b.fmt};
  xte_gemm_stage_walk<KS>(g, p, sh, mv, row0, col0, k0, ks, kn, tid, s_sa, s_sb, put_a, put_b);
}

/* One output element of D through the epilogue, the CPU's store_d (row r < mv, column c < p.n of
 * the tile's problem). */
__device__ __forceinline__ void xte_gemm_store(const xte_gemm_args &g, const xte_gemm_problem &p,
                                               int64_t r, int64_t c, float acc) {
  const int64_t rd = p.d_r0 + r;
  float cv = 0.0f;
  if (g.c)
    cv = g.c_dtype == XTE_DTYPE_BF16 ? xte_bf16_to_f32(((const uint16_t *)g.c)[rd * g.ld_c + c])
                                     : ((const float *)g.c)[rd * g.ld_c + c];
  const float o =
      xte_gemm_epilogue(acc, g.c != NULL, cv, g.bias != NULL, g.bias ? g.bias[c] : 0.0f);
  if (g.d_dtype == XTE_DTYPE_BF16)
    ((uint16_t *)g.d)[rd * g.ld_d + c] = xte_gemm_out_bf16(o);
  else
    ((float *)g.d)[rd * g.ld_d + c] = xte_gemm_out_f32(o);
}

/* XTE_GEMM_FAST with a bias (src/cuda/cublaslt.cu): cuBLASLt wrote problem p's accumulators, fp32,
 * no C, no bias, to src [p.m, p.n] (row stride ld floats); every element goes through the epilogue
 * of the exact kernels (xte_gemm_store: t = RNE_fp32(acc + bias[c]), then RNE to D's dtype,
 * canonical NaN). src may be D itself (fp32 D): each element is read, then written, by one thread.
 * One block per row (grid stride), threads along the columns. */
__global__ void __launch_bounds__(XTE_GEMM_NT)
    xte_gemm_bias_epilogue(xte_gemm_args g, xte_gemm_problem p, const float *src, int64_t ld) {
  for (int64_t r = blockIdx.x; r < p.m; r += gridDim.x)
    for (int64_t c = threadIdx.x; c < p.n; c += blockDim.x)
      xte_gemm_store(g, p, r, c, src[r * ld + c]);
}

/* The GEMM. SPLIT: 0 no e5m2 operand, 1 A is e5m2, 2 B is e5m2 (the low class of that operand
 * staged apart). Problems: G == 1 and probs == NULL: p1; else probs[g] with its first tile at
 * tstart[g] (tstart[G] = total). Tiles of a problem: row-major over (m tiles, n tiles). */
template <int SPLIT>
__global__ void __launch_bounds__(XTE_GEMM_NT)
    xte_gemm_exact_kernel(xte_gemm_args g, xte_gemm_problem p1, const xte_gemm_problem *probs,
                          const int64_t *tstart, int64_t G, int64_t total, xte_gemm_shifts sh) {
  constexpr int KS = XTE_GEMM_KS(SPLIT);
  /* rows padded by one double: the staging stores of a K-contiguous operand (consecutive threads,
   * consecutive kk, one row) fall into different banks */
  __shared__ double s_a[KS][XTE_GEMM_BM + 1];
  __shared__ double s_b[KS][XTE_GEMM_BN + 1];
  __shared__ double s_lo[SPLIT ? KS : 1][SPLIT ? 65 : 1];
  __shared__ float s_sa[XTE_GEMM_BM], s_sb[XTE_GEMM_BN];
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int kblock = g.kblock;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    xte_gemm_problem p;
    int64_t mv, row0, col0;
    xte_gemm_find_tile(t, p1, probs, tstart, G, g.masked_m, p, mv, row0, col0);
    if (row0 >= mv) continue; /* masked rows: nothing to write (uniform) */
    float acc[XTE_GEMM_TM][XTE_GEMM_TN];
    XTE_GEMM_UNROLL
    for (int i = 0; i < XTE_GEMM_TM; i++) XTE_GEMM_UNROLL
    for (int j = 0; j < XTE_GEMM_TN; j++) acc[i][j] = 0.0f;
    for (int64_t k0 = 0; k0 < p.k; k0 += kblock) {
      const int kl = (int)(p.k - k0 < kblock ? p.k - k0 : kblock);
      double P[XTE_GEMM_TM][XTE_GEMM_TN], Q[XTE_GEMM_TM][XTE_GEMM_TN];
      XTE_GEMM_UNROLL
      for (int i = 0; i < XTE_GEMM_TM; i++) XTE_GEMM_UNROLL
      for (int j = 0; j < XTE_GEMM_TN; j++) {
        P[i][j] = 0.0;
        Q[i][j] = 0.0;
      }
      for (int ks = 0; ks < kl; ks += KS) {
        const int kn = kl - ks < KS ? kl - ks : KS;
        __syncthreads(); /* the previous step's readers of the shared arrays are done */
        xte_gemm_stage<SPLIT, KS, XTE_GEMM_BM + 1>(g, p, sh, mv, row0, col0, k0, ks, kn, tid, s_a,
                                                   s_b, s_lo, s_sa, s_sb);
        __syncthreads();
        for (int kk = 0; kk < kn; kk++) {
          double a[XTE_GEMM_TM], b[XTE_GEMM_TN], l[SPLIT == 1 ? XTE_GEMM_TM : XTE_GEMM_TN];
          XTE_GEMM_UNROLL
          for (int i = 0; i < XTE_GEMM_TM; i++) a[i] = s_a[kk][ty + 16 * i];
          XTE_GEMM_UNROLL
          for (int j = 0; j < XTE_GEMM_TN; j++) b[j] = s_b[kk][tx + 16 * j];
          if (SPLIT == 1) {
            XTE_GEMM_UNROLL
            for (int i = 0; i < XTE_GEMM_TM; i++) l[i] = s_lo[kk][ty + 16 * i];
          } else if (SPLIT == 2) {
            XTE_GEMM_UNROLL
            for (int j = 0; j < XTE_GEMM_TN; j++) l[j] = s_lo[kk][tx + 16 * j];
          }
          XTE_GEMM_UNROLL
          for (int i = 0; i < XTE_GEMM_TM; i++) XTE_GEMM_UNROLL
          for (int j = 0; j < XTE_GEMM_TN; j++) {
            P[i][j] = xte_gemm_dot_step(P[i][j], a[i], b[j]);
            if (SPLIT == 1) Q[i][j] = xte_gemm_dot_step(Q[i][j], l[i], b[j]);
            if (SPLIT == 2) Q[i][j] = xte_gemm_dot_step(Q[i][j], a[i], l[j]);
          }
        }
      }
      /* the block's contribution, in K order (the scales were staged with ks == 0; the next
       * writes to them come after the next step's first barrier) */
      XTE_GEMM_UNROLL
      for (int i = 0; i < XTE_GEMM_TM; i++) XTE_GEMM_UNROLL
      for (int j = 0; j < XTE_GEMM_TN; j++) {
        const float pp = SPLIT ? xte_gemm_round2_f32(P[i][j], Q[i][j]) : (float)P[i][j];
        acc[i][j] = xte_gemm_block_update(acc[i][j], pp, s_sa[ty + 16 * i], s_sb[tx + 16 * j]);
      }
    }
    /* the epilogue, the CPU's store_d */
    XTE_GEMM_UNROLL
    for (int i = 0; i < XTE_GEMM_TM; i++) {
      const int64_t r = row0 + ty + 16 * i;
      if (r >= mv) continue;
      XTE_GEMM_UNROLL
      for (int j = 0; j < XTE_GEMM_TN; j++) {
        const int64_t c = col0 + tx + 16 * j;
        if (c < p.n) xte_gemm_store(g, p, r, c, acc[i][j]);
      }
    }
  }
}

/* The kernel a runtime policy's `dmma` picks: the SIMT one (stage 1), or stage 2 with
 * mma m8n8k4 (sm_80+) or m16n8k16 (sm_90+), or stage 3, the int8 digit kernel (sm_80+; e4m3 x
 * e4m3 only: with an e5m2 operand the driver runs the SIMT kernel instead) */
#define XTE_GEMM_KERNEL_SIMT 0
#define XTE_GEMM_KERNEL_DMMA4 1
#define XTE_GEMM_KERNEL_DMMA16 2
#define XTE_GEMM_KERNEL_IMMA 3

/* Stage 2, the fp64 tensor-core kernel: NVIDIA only (PTX mma), not in the MUSA build. */
#if defined(XTE_MUSA) || defined(__MUSACC__)
#define XTE_GEMM_DMMA 0
#else
#define XTE_GEMM_DMMA 1
#include "cuda/gemm_mma_kernels.cuh"
#include "cuda/gemm_imma_kernels.cuh"
#endif

/* ---------------------------------------------------------------- host steps */

/* log2 of a power of two, -1 otherwise */
static inline int xte_gemm_log2(int64_t v) {
  if (v <= 0 || (v & (v - 1)) != 0) return -1;
  return __builtin_ctzll((unsigned long long)v);
}

/* The tiles of one problem (its rows at most m_max): 0 for an empty one. */
static inline int64_t xte_gemm_tiles(const xte_gemm_problem *p) {
  if (p->m <= 0 || p->n <= 0) return 0;
  return ((p->m + XTE_GEMM_BM - 1) / XTE_GEMM_BM) * ((p->n + XTE_GEMM_BN - 1) / XTE_GEMM_BN);
}

#if XTE_GEMM_DMMA
template <int SHAPE, class RT, class... A>
static xte_status xte_gemm_launch_dmma(RT &rt, int split, int64_t grid, A... args) {
  if (split == 1) return rt.launch(grid, xte_gemm_dmma_kernel<1, SHAPE>, args...);
  if (split == 2) return rt.launch(grid, xte_gemm_dmma_kernel<2, SHAPE>, args...);
  return rt.launch(grid, xte_gemm_dmma_kernel<0, SHAPE>, args...);
}
#endif

/* Launches the main kernel of rt.dmma's choice; records the kernel that really runs in
 * rt.ran (bit XTE_GEMM_KERNEL_*: the plugin reports it, src/cuda/xte_gpu_report.h). */
template <class RT, class... A>
static xte_status xte_gemm_launch_split(RT &rt, int split, int64_t grid, A... args) {
#if XTE_GEMM_DMMA
  if (rt.dmma == XTE_GEMM_KERNEL_IMMA && split == 0) {
    rt.ran |= 1u << XTE_GEMM_KERNEL_IMMA;
    return rt.launch(grid, xte_gemm_imma_kernel, args...);
  }
  if (rt.dmma == XTE_GEMM_KERNEL_DMMA16) {
    rt.ran |= 1u << XTE_GEMM_KERNEL_DMMA16;
    return xte_gemm_launch_dmma<16>(rt, split, grid, args...);
  }
  if (rt.dmma == XTE_GEMM_KERNEL_DMMA4) {
    rt.ran |= 1u << XTE_GEMM_KERNEL_DMMA4;
    return xte_gemm_launch_dmma<4>(rt, split, grid, args...);
  }
#endif
  rt.ran |= 1u << XTE_GEMM_KERNEL_SIMT;
  if (split == 1) return rt.launch(grid, xte_gemm_exact_kernel<1>, args...);
  if (split == 2) return rt.launch(grid, xte_gemm_exact_kernel<2>, args...);
  return rt.launch(grid, xte_gemm_exact_kernel<0>, args...);
}

/* The whole call: checks, workspace (grouped: the problem list and tile starts on the device),
 * the masked_m verdict, then the GEMM launch (the DMMA kernel of shape rt.dmma when that is
 * XTE_GEMM_KERNEL_DMMA4 / DMMA16 and XTE_GEMM_DMMA, the int8 digit kernel when it is
 * XTE_GEMM_KERNEL_IMMA, XTE_GEMM_DMMA and no operand is e5m2, else the SIMT one). RT: dmma (int),
 * ran (unsigned, or-ed with the bit of each kernel launched),
 * alloc(void
 * **, bytes), release(p), upload(dev, host, bytes), read(host, dev, bytes) (checks the launches
 * before it first), memset(p, v, bytes), launch(grid, kernel, args...), finish(), host_alloc(bytes)
 * / host_free(p) (host memory); svc->set_error. */
template <class RT>
static xte_status xte_gemm_run(RT &rt, const xte_gemm_args *g) {
  const int64_t G = g->num_problems;
  xte_gemm_shifts sh;
  int64_t total = 0, i;
  const int split = g->a.fmt == XTE_FP8_E5M2 ? 1 : (g->b.fmt == XTE_FP8_E5M2 ? 2 : 0);
  sh.a_i = xte_gemm_log2(g->a.bi);
  sh.a_k = xte_gemm_log2(g->a.bk);
  sh.b_i = xte_gemm_log2(g->b.bi);
  sh.b_k = xte_gemm_log2(g->b.bk);
  if (sh.a_i < 0 || sh.a_k < 0 || sh.b_i < 0 || sh.b_k < 0 || g->kblock % 32 != 0)
    return rt.svc->set_error(XTE_ERROR_UNSUPPORTED,
                             "gemm: scale blocks %lld x %lld (A), %lld x %lld (B), K block %d: "
                             "the GPU kernel takes powers of two",
                             (long long)g->a.bi, (long long)g->a.bk, (long long)g->b.bi,
                             (long long)g->b.bk, g->kblock);
  if (G <= 0) return XTE_SUCCESS;
  for (i = 0; i < G; i++) {
    const int64_t nt = xte_gemm_tiles(&g->problems[i]);
    if (nt > 0x7FFFFFFF || __builtin_add_overflow(total, nt, &total))
      return rt.svc->set_error(XTE_ERROR_UNSUPPORTED, "gemm: group %lld has more than 2^31 tiles",
                               (long long)i);
  }
  const int64_t grid = total < XTE_GEMM_GRID_CAP ? total : XTE_GEMM_GRID_CAP;
  if (G == 1 && !g->masked_m) {
    /* dense: no workspace, nothing to wait for */
    if (total == 0) return XTE_SUCCESS;
    XTE_GEMM_TRY(xte_gemm_launch_split(rt, split, grid, *g, g->problems[0],
                                       (const xte_gemm_problem *)NULL, (const int64_t *)NULL,
                                       (int64_t)1, total, sh));
    return rt.finish();
  }
  /* workspace: verdict (8), problems (G), tile starts (G + 1) */
  size_t o_prob = 16, o_ts, bytes;
  int64_t *ts_host = NULL;
  char *ws = NULL;
  xte_status st = XTE_SUCCESS;
  if ((size_t)G > ((size_t)1 << 40) / sizeof(xte_gemm_problem))
    return rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "gemm: %lld groups", (long long)G);
  o_ts = o_prob + (size_t)G * sizeof(xte_gemm_problem);
  o_ts = (o_ts + 15) / 16 * 16;
  bytes = o_ts + (size_t)(G + 1) * sizeof(int64_t);
  ts_host = (int64_t *)rt.host_alloc((size_t)(G + 1) * sizeof(int64_t));
  if (!ts_host)
    return rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "gemm: %lld groups", (long long)G);
  ts_host[0] = 0;
  for (i = 0; i < G; i++) ts_host[i + 1] = ts_host[i] + xte_gemm_tiles(&g->problems[i]);
  do {
    if ((st = rt.alloc((void **)&ws, bytes)) != XTE_SUCCESS) break;
    xte_gemm_u64 *bad = (xte_gemm_u64 *)ws;
    xte_gemm_problem *probs = (xte_gemm_problem *)(ws + o_prob);
    int64_t *ts = (int64_t *)(ws + o_ts);
    if ((st = rt.upload(probs, g->problems, (size_t)G * sizeof(xte_gemm_problem))) != XTE_SUCCESS)
      break;
    if ((st = rt.upload(ts, ts_host, (size_t)(G + 1) * sizeof(int64_t))) != XTE_SUCCESS) break;
    if (g->masked_m) {
      /* masked_m is checked before anything is written */
      xte_gemm_u64 hv = XTE_GEMM_NONE;
      int32_t mv = 0;
      const int64_t cg = (G + XTE_GEMM_NT - 1) / XTE_GEMM_NT;
      if ((st = rt.memset(bad, 0xFF, 8)) != XTE_SUCCESS) break;
      if ((st = rt.launch(cg < 65535 ? cg : 65535, xte_gemm_check_masked, g->masked_m,
                          (const xte_gemm_problem *)probs, G, bad)) != XTE_SUCCESS)
        break;
      if ((st = rt.read(&hv, bad, 8)) != XTE_SUCCESS) break;
      if (hv != XTE_GEMM_NONE) {
        if ((st = rt.read(&mv, g->masked_m + hv, 4)) != XTE_SUCCESS) break;
        st = rt.svc->set_error(XTE_ERROR_INVALID_ARGUMENT,
                               "groups->masked_m[%lld] = %d is outside [0, m_max = %lld]",
                               (long long)hv, (int)mv, (long long)g->problems[hv].m);
        break;
      }
    }
    if (total > 0 && (st = xte_gemm_launch_split(rt, split, grid, *g, g->problems[0],
                                                 (const xte_gemm_problem *)probs,
                                                 (const int64_t *)ts, G, total, sh)) != XTE_SUCCESS)
      break;
    st = rt.finish();
  } while (0);
  rt.release(ws);
  rt.host_free(ts_host);
  return st;
}

#endif /* XTE_GEMM_KERNELS_CUH */
