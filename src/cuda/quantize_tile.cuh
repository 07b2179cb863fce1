/* The quantize tile walk of the CUDA plugin, device code only (no __global__ kernel, no runtime
 * call): the launch geometry, the staging of a 128 x 128 tile in shared memory and the walk that
 * takes its amaxes and writes both copies and their scales (xte_q_tile_walk), over a source that
 * stages the tile. quantize_kernels.cuh builds the quantize kernel on it (the source: the input
 * tensor), moe_swiglu_kernels.cuh the fused SwiGLU + quantize one (the source: the activation,
 * computed while staging). Every element, block amax and scale is computed by the shared
 * numerics (src/numerics/xte_numerics.h, src/xte_kernel_args.h), so the bytes are the CPU's
 * (src/cpu/quantize.c cuts the work the same way). Block amaxes are max reductions
 * (order-independent, a NaN never wins), done through shared memory so that nothing depends on
 * the warp size (the same source builds for MUSA). Built with -fmad=false (nvcc) /
 * -ffp-contract=off (MUSA, the host runner): no fused multiply-adds. */
#ifndef XTE_QUANTIZE_TILE_CUH
#define XTE_QUANTIZE_TILE_CUH

#include <stdint.h>

#include "xte/quantize.h"
#include "xte_kernel_args.h"

#define TILE 128
#define NT 256 /* threads per block: 8 rows of 32 */

/* ---------------------------------------------------------------- launch geometry
 * Plain host arithmetic, shared by the launches in quantize.cu and by the host SIMT runner's
 * plugin (tests/simt/simt_plugin.cpp), which restates those launches. */

/* Blocks of the whole-tensor amax kernel over an [M, K] input of in_kind (XTE_NUM_IN_*): the
 * kernel walks the tensor as one sequence of 16-byte row chunks (ceil(K / (16 / esize)) per row),
 * so a single row or a single column is spread over the grid as well as a square tensor. One
 * block per XTE_Q_AMAX_CPB chunks (16 KiB of input: 4 chunks per thread), at least 1, at most
 * XTE_Q_AMAX_BLOCKS (about one wave of 256-thread blocks on an H100 / H200, reached from 16 MiB
 * of input on): a small tensor launches few blocks, a big one (tall-skinny too) the whole grid,
 * its threads striding over the chunks. */
#define XTE_Q_AMAX_CPB 1024
#define XTE_Q_AMAX_BLOCKS 1024
static inline int xte_q_amax_grid(int64_t M, int64_t K, int in_kind) {
  const int64_t epc = in_kind == XTE_NUM_IN_F32 ? 4 : 8;
  int64_t cpr, b;
  if (M <= 0 || K <= 0) return 1;
  cpr = (K + epc - 1) / epc;
  /* past XTE_Q_AMAX_CPB * XTE_Q_AMAX_BLOCKS chunks, the whole grid (no product that overflows) */
  if (M > (int64_t)XTE_Q_AMAX_CPB * XTE_Q_AMAX_BLOCKS / cpr) return XTE_Q_AMAX_BLOCKS;
  b = (M * cpr + XTE_Q_AMAX_CPB - 1) / XTE_Q_AMAX_CPB;
  return (int)(b < 1 ? 1 : b < XTE_Q_AMAX_BLOCKS ? b : XTE_Q_AMAX_BLOCKS);
}

/* The per-handle device workspace (src/cuda/quantize.cu xte_gpu_workspace; the SIMT runner's
 * plugin restates it): each stream handle owns one buffer, whose first XTE_WS_BASE bytes are the
 * quantize's scratch (the per-tensor amax and scale) and the rest the workspace of the operation
 * being enqueued (the MoE drivers' verdicts and counters, the fused SwiGLU's activation). Used
 * under the handle's lock only; grows (never shrinks), freed with the handle: steady-state calls
 * allocate nothing. */
#define XTE_WS_BASE 256
#define XTE_WS_STEP ((size_t)1 << 16) /* capacities are multiples of 64 KiB */

/* Buffer bytes for an operation workspace of `bytes`; 0 when that overflows. */
static inline size_t xte_ws_need(size_t bytes) {
  size_t n;
  if (__builtin_add_overflow(bytes, (size_t)XTE_WS_BASE, &n)) return 0;
  return n;
}

/* The capacity to grow to from cap for need (> cap): at least a quarter more than cap (a few
 * growths reach any steady size), in whole XTE_WS_STEPs; 0 when that overflows. */
static inline size_t xte_ws_grow(size_t cap, size_t need) {
  size_t n = cap + cap / 4;
  if (n < cap || n < need) n = need;
  if (__builtin_add_overflow(n, XTE_WS_STEP - 1, &n)) return 0;
  return n / XTE_WS_STEP * XTE_WS_STEP;
}

/* Bytes of a scale map that a quantize zeroes before its tiles write their scales (the padding
 * of the TE_GEMM / DEEPGEMM layouts is zero): 0 when there is none. */
static inline size_t xte_q_scale_bytes(const xte_scale_map *m) {
  if (!m->data || m->total <= 0) return 0;
  return (size_t)m->total * (m->e8m0 ? 1u : 4u);
}

/* Tiles of an [M, K] quantize along each dimension. */
static inline int64_t xte_q_tiles(int64_t n) {
  return (n + TILE - 1) / TILE;
}

/* Blocks of a grid-stride elementwise kernel over n elements (NT threads each). */
#define XTE_Q_GRID_CAP (1 << 20)
static inline int xte_q_grid_for(int64_t n) {
  int64_t b = (n + NT - 1) / NT;
  if (b < 1) b = 1;
  return (int)(b < XTE_Q_GRID_CAP ? b : XTE_Q_GRID_CAP);
}

/* ---------------------------------------------------------------- quantize
 * quant_tiles stages its tile in shared memory once (16-byte loads where the address allows),
 * then takes every amax and writes every output from there: each input element is read from
 * global memory once. The stage holds 256 bytes of each of the tile's 128 rows (a slab): the
 * whole tile for 16-bit inputs, half of it (64 columns) for fp32 inputs (128 x 128 fp32 = 64 KiB
 * would pass the 48 KiB of static shared memory). The one exception: fp32 inputs whose blocks
 * span both slabs (1 x 128 rowwise blocks, 128 x 128 blocks) read the first slab again after the
 * block scales are known. Outputs go out in runs of 16 bytes (one 16-byte store where aligned). */

/* Register loops unrolled on the device (indices into small arrays stay constants: no local
 * memory); nothing for the host runner. */
#if defined(__CUDACC__) || defined(__MUSACC__)
#define XTE_Q_UNROLL _Pragma("unroll")
#define XTE_Q_NO_UNROLL _Pragma("unroll 1")
#else
#define XTE_Q_UNROLL
#define XTE_Q_NO_UNROLL
#endif

#define XTE_Q_SROW 272 /* bytes per staged row: 256 + 16 of padding (rows stay 16-byte aligned) */

__device__ __forceinline__ int xte_q_esize(int in_kind) {
  return in_kind == XTE_NUM_IN_F32 ? 4 : 2;
}

/* Input bits -> fp32, as the CPU's load_f32 */
__device__ __forceinline__ float xte_q_f32_of(int in_kind, uint32_t u) {
  if (in_kind == XTE_NUM_IN_F32) return xte_bits_f32(u);
  if (in_kind == XTE_NUM_IN_BF16) return xte_bf16_to_f32((uint16_t)u);
  return xte_fp16_to_f32((uint16_t)u);
}

/* Element j of a staged row (or of any row in memory) as fp32 */
__device__ __forceinline__ float xte_q_ld(const uint8_t *row, int in_kind, int j) {
  if (in_kind == XTE_NUM_IN_F32) return xte_bits_f32(((const uint32_t *)row)[j]);
  return xte_q_f32_of(in_kind, ((const uint16_t *)row)[j]);
}

/* amax over the n (<= 16 / esize) elements of the 16 bytes at v */
__device__ __forceinline__ float xte_q_amax16(float m, uint4 v, int in_kind, int n) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  int e;
  if (in_kind == XTE_NUM_IN_F32) {
    XTE_Q_UNROLL
    for (e = 0; e < 4; e++)
      if (e < n) m = xte_amax_update(m, xte_bits_f32(w[e]));
  } else {
    XTE_Q_UNROLL
    for (e = 0; e < 8; e++)
      if (e < n)
        m = xte_amax_update(m, xte_q_f32_of(in_kind, (w[e >> 1] >> ((e & 1) * 16)) & 0xFFFFu));
  }
  return m;
}

/* Max over the block (every thread gets it); red holds NT floats. */
static __device__ float block_max(float v, float *red) {
  int s;
  red[threadIdx.x] = v;
  __syncthreads();
  for (s = NT / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) red[threadIdx.x] = xte_fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  v = red[0];
  __syncthreads();
  return v;
}

/* Stages rows [0, nr) and columns [cg, cg + ncs) of the input (global row r0) into stg: 16
 * chunks of 16 bytes per row; a chunk at an aligned address wholly inside the slab is one
 * 16-byte load, any other one is read element by element. */
__device__ __forceinline__ void xte_q_stage(const xte_quant_args &a, uint8_t *stg, int64_t r0,
                                            int64_t cg, int nr, int ncs) {
  const int es = xte_q_esize(a.in_kind), epc = 16 / es;
  int k;
  for (k = threadIdx.x; k < TILE * 16; k += NT) {
    const int r = k >> 4, j0 = (k & 15) * epc;
    if (r < nr && j0 < ncs) {
      const uint8_t *src =
          (const uint8_t *)a.in + ((size_t)(r0 + r) * (size_t)a.ld_in + (size_t)(cg + j0)) * es;
      uint8_t *dst = stg + r * XTE_Q_SROW + j0 * es;
      if (j0 + epc <= ncs && ((uintptr_t)src & 15) == 0) {
        *(uint4 *)dst = *(const uint4 *)src;
      } else {
        int e;
        for (e = 0; e < epc && j0 + e < ncs; e++) {
          if (es == 4)
            ((uint32_t *)dst)[e] = ((const uint32_t *)src)[e];
          else
            ((uint16_t *)dst)[e] = ((const uint16_t *)src)[e];
        }
      }
    }
  }
}

/* Scale sources of an output element (r, j) (tile row, slab column) */
enum { XTE_Q_UNIFORM = 0, XTE_Q_ROWS = 1, XTE_Q_COLS = 2 };

/* Quantizes n <= 16 staged elements starting at (r, j), stepping (dr, dj) = (0, 1) along a row
 * or (1, 0) down a column, into the n bytes at dst: one 16-byte store when n = 16 and dst is
 * aligned. Scales: su (uniform), gsc[r][(js + j) / 32] (1 x row_bw blocks; js: the slab's first
 * tile column) or csc[r / 32][j] (col_bh x 1 blocks). */
__device__ __forceinline__ void xte_q_run16(const xte_quant_args &a, const uint8_t *stg, int r,
                                            int j, int dr, int dj, int n, int how, float su,
                                            const float (*gsc)[4], const float (*csc)[TILE], int js,
                                            uint8_t *dst) {
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  int e;
  XTE_Q_UNROLL
  for (e = 0; e < 16; e++) {
    if (e < n) {
      const int rr = r + e * dr, jj = j + e * dj;
      const float s = how == XTE_Q_UNIFORM ? su
                      : how == XTE_Q_ROWS  ? gsc[rr][(js + jj) >> 5]
                                           : csc[rr >> 5][jj];
      const uint32_t q = xte_f32_to_fp8(
          xte_mul_nanprop(xte_q_ld(stg + rr * XTE_Q_SROW, a.in_kind, jj), s), a.fmt, a.saturate);
      w[e >> 2] |= q << ((e & 3) * 8);
    }
  }
  if (n == 16 && ((uintptr_t)dst & 15) == 0) {
    *(uint4 *)dst = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    XTE_Q_UNROLL
    for (e = 0; e < 16; e++)
      if (e < n) dst[e] = (uint8_t)(w[e >> 2] >> ((e & 3) * 8));
  }
}

/* The outputs of the staged slab (rows [0, nr), slab columns [0, ncs), tile columns from js):
 * the rowwise copy when do_row (scales: row_how), the columnwise copy when do_col (col_how).
 * Row-major copies in runs of 16 along a row; a transposed columnwise copy (column c0 + js + j
 * of the input is its row c0 + js + j) in runs of 16 down a column, 8 threads writing one
 * 128-byte output row. No barrier inside. */
__device__ __forceinline__ void xte_q_outputs(const xte_quant_args &a, const uint8_t *stg,
                                              int64_t r0, int64_t c0, int js, int nr, int ncs,
                                              int do_row, int do_col, int row_how, int col_how,
                                              float su, const float (*gsc)[4],
                                              const float (*csc)[TILE]) {
  int k, o;
  XTE_Q_NO_UNROLL
  for (o = 0; o < 2; o++) {
    uint8_t *q = o ? a.col_q : a.row_q;
    const int64_t ld = o ? a.ld_col_q : a.ld_row_q;
    const int how = o ? col_how : row_how;
    if (!(o ? do_col && !a.col_transposed : do_row)) continue;
    for (k = threadIdx.x; k < TILE * 8; k += NT) {
      const int r = k >> 3, j = (k & 7) * 16;
      if (r < nr && j < ncs)
        xte_q_run16(a, stg, r, j, 0, 1, ncs - j < 16 ? ncs - j : 16, how, su, gsc, csc, js,
                    q + (size_t)(r0 + r) * (size_t)ld + (size_t)(c0 + js + j));
    }
  }
  if (do_col && a.col_transposed) {
    for (k = threadIdx.x; k < TILE * 8; k += NT) {
      const int j = k >> 3, r = (k & 7) * 16;
      if (j < ncs && r < nr)
        xte_q_run16(a, stg, r, j, 1, 0, nr - r < 16 ? nr - r : 16, col_how, su, gsc, csc, js,
                    a.col_q + (size_t)(c0 + js + j) * (size_t)a.ld_col_q + (size_t)(r0 + r));
    }
  }
}

/* The square (128 x 128) block's scale from the tile amax tam (every thread): returns the scale,
 * thread 0 stores scale_inv for both copies. */
__device__ __forceinline__ float xte_q_square_scale(const xte_quant_args &a, float tam, int64_t tr,
                                                    int64_t tc) {
  const xte_block_scale bs = xte_quant_block_scale(&a, tam);
  if (threadIdx.x == 0) {
    if (a.row_q) xte_store_scale(&a.row_s, tr, tc, bs);
    if (a.col_q) {
      if (a.col_transposed)
        xte_store_scale(&a.col_s, tc, tr, bs);
      else
        xte_store_scale(&a.col_s, tr, tc, bs);
    }
  }
  return bs.scale;
}

/* The input source of quant_tiles: the slab staged from a.in (xte_q_stage). Another source
 * (src/cuda/moe_swiglu_kernels.cuh: the SwiGLU activation computed from its inputs) stages the
 * same slab, in the same format (a.in_kind), from elsewhere; the rest of the tile walk is one. */
struct xte_q_src_in {
  __device__ __forceinline__ void stage(const xte_quant_args &a, uint8_t *stg, int64_t r0,
                                        int64_t cg, int nr, int ncs) const {
    xte_q_stage(a, stg, r0, cg, nr, ncs);
  }
};

/* One 128 x 128 tile per block: both copies, their scales, the tile's amax; the slabs from
 * src.stage (called by every thread of the block, the barriers around it here). */
template <class Src>
__device__ __forceinline__ void xte_q_tile_walk(const xte_quant_args &a, const float *tensor_scale,
                                                unsigned *amax_acc, int64_t ntc, const Src &src) {
  __shared__ uint4 stg4[TILE * XTE_Q_SROW / 16]; /* the staged slab */
  __shared__ float red[NT];
  __shared__ float gam[TILE][4]; /* rowwise: amax of each 32-wide group of a row */
  __shared__ float gsc[TILE][4]; /* rowwise: the scale of each group's block */
  __shared__ float cam[4][TILE]; /* columnwise: amax of each 32-row group of a slab column */
  __shared__ float csc[4][TILE]; /* columnwise: the scale of each 32-row group's block */
  uint8_t *stg = (uint8_t *)stg4;
  const int tid = threadIdx.x;
  const int64_t tr = (int64_t)blockIdx.x / ntc, tc = (int64_t)blockIdx.x % ntc;
  const int64_t r0 = tr * TILE, c0 = tc * TILE;
  const int nr = (int)(a.M - r0 < TILE ? a.M - r0 : TILE);
  const int nc = (int)(a.K - c0 < TILE ? a.K - c0 : TILE);
  const int es = xte_q_esize(a.in_kind), W = 256 / es, lw = es == 4 ? 6 : 7, ng = W / 32;
  const int nslab = (nc + W - 1) / W;
  const int sq = a.square, uni = sq || a.mode == XTE_SCALING_PER_TENSOR;
  /* blocks that need both slabs before their scale is known: the first slab is read again */
  const int split = nslab > 1 && (sq || (!uni && a.row_q && a.row_bw == 128));
  const int row_how = uni ? XTE_Q_UNIFORM : XTE_Q_ROWS, col_how = uni ? XTE_Q_UNIFORM : XTE_Q_COLS;
  const int nit = split ? 2 * nslab : nslab;
  float tam = 0.0f, su = uni && !sq ? *tensor_scale : 0.0f;
  int it, k;

  /* Passes: the slabs in order (amaxes, scales, outputs); under split, then the slabs again in
   * reverse order (the last one is still staged) for the outputs that waited for the scales. */
  for (it = 0; it < nit; it++) {
    const int late = it >= nslab, s = late ? nit - 1 - it : it;
    const int js = s * W, ncs = nc - js < W ? nc - js : W;
    if (it != nslab) {         /* it == nslab: a split's second pass starts on the staged slab */
      if (it) __syncthreads(); /* every reader of the previous slab is done */
      src.stage(a, stg, r0, c0 + js, nr, ncs);
      __syncthreads();
    }
    if (!late) {
      if (uni) { /* per-tensor or 128 x 128 blocks: the tile amax */
        for (k = tid; k < TILE * W; k += NT) {
          const int r = k >> lw, j = k & (W - 1);
          if (r < nr && j < ncs)
            tam = xte_amax_update(tam, xte_q_ld(stg + r * XTE_Q_SROW, a.in_kind, j));
        }
        if (sq && !split) su = xte_q_square_scale(a, tam = block_max(tam, red), tr, tc);
      } else {
        if (a.row_q) { /* 1 x row_bw blocks (row_bw = 32 or 128): amax of each 32-wide group */
          for (k = tid; k < TILE * ng; k += NT) {
            const int r = k >> (lw - 5), g = k & (ng - 1);
            float m = 0.0f;
            int j;
            if (r < nr)
              for (j = g * 32; j < g * 32 + 32 && j < ncs; j++)
                m = xte_amax_update(m, xte_q_ld(stg + r * XTE_Q_SROW, a.in_kind, j));
            gam[r][s * ng + g] = m;
          }
        }
        if (a.col_q) { /* col_bh x 1 blocks (col_bh = 32 or 128): amax of each 32-row group */
          for (k = tid; k < 4 * W; k += NT) {
            const int j = k & (W - 1), h = k >> lw;
            float m = 0.0f;
            int r;
            if (j < ncs)
              for (r = h * 32; r < h * 32 + 32 && r < nr; r++)
                m = xte_amax_update(m, xte_q_ld(stg + r * XTE_Q_SROW, a.in_kind, j));
            cam[h][j] = m;
          }
        }
        __syncthreads();
        if (a.row_q && !split) { /* the scales of the row blocks that lie in this slab */
          const int gpb = a.row_bw / 32;
          for (k = tid; k < TILE * ng; k += NT) {
            const int r = k >> (lw - 5), g = s * ng + (k & (ng - 1));
            if (r < nr && g % gpb == 0 && g * 32 < nc) {
              float am = 0.0f;
              xte_block_scale bs;
              int h;
              for (h = g; h < g + gpb && h * 32 < nc; h++) am = xte_fmaxf(am, gam[r][h]);
              bs = xte_quant_block_scale(&a, am);
              tam = xte_fmaxf(tam, am);
              xte_store_scale(&a.row_s, r0 + r, (c0 >> (a.row_bw == 128 ? 7 : 5)) + g / gpb, bs);
              for (h = g; h < g + gpb; h++) gsc[r][h] = bs.scale;
            }
          }
        }
        if (a.col_q) { /* the column blocks' scales */
          const int hpb = a.col_bh / 32;
          for (k = tid; k < 4 * W; k += NT) {
            const int j = k & (W - 1), h = k >> lw;
            if (j < ncs && h % hpb == 0 && h * 32 < nr) {
              float am = 0.0f;
              xte_block_scale bs;
              const int64_t gblk = (r0 >> (a.col_bh == 128 ? 7 : 5)) + h / hpb;
              int y;
              for (y = h; y < h + hpb && y * 32 < nr; y++) am = xte_fmaxf(am, cam[y][j]);
              bs = xte_quant_block_scale(&a, am);
              tam = xte_fmaxf(tam, am);
              if (a.col_transposed)
                xte_store_scale(&a.col_s, c0 + js + j, gblk, bs);
              else
                xte_store_scale(&a.col_s, gblk, c0 + js + j, bs);
              for (y = h; y < h + hpb; y++) csc[y][j] = bs.scale;
            }
          }
        }
        __syncthreads();
      }
    } else if (it == nslab) { /* split (fp32, nc > 64): the scales that needed both slabs */
      if (sq) {
        su = xte_q_square_scale(a, tam = block_max(tam, red), tr, tc);
      } else { /* 1 x 128 row blocks */
        for (k = tid; k < TILE; k += NT) {
          if (k < nr) {
            float am = 0.0f;
            xte_block_scale bs;
            int h;
            for (h = 0; h < 4 && h * 32 < nc; h++) am = xte_fmaxf(am, gam[k][h]);
            bs = xte_quant_block_scale(&a, am);
            tam = xte_fmaxf(tam, am);
            xte_store_scale(&a.row_s, r0 + k, c0 >> 7, bs);
            for (h = 0; h < 4; h++) gsc[k][h] = bs.scale;
          }
        }
        __syncthreads();
      }
    }
    /* under split the rowwise copy (and with 128 x 128 blocks the columnwise one) waits */
    xte_q_outputs(a, stg, r0, c0, js, nr, ncs, a.row_q && (!split || late),
                  a.col_q && (split && uni ? late : !late), row_how, col_how, su, gsc, csc);
  }
  if (amax_acc) {
    tam = block_max(tam, red);
    if (tid == 0) atomicMax(amax_acc, xte_f32_bits(tam));
  }
}
#endif /* XTE_QUANTIZE_TILE_CUH */
