/* The quantize / dequantize / cast kernels of the CUDA plugin (__global__ and __device__ code
 * only: no runtime calls, no launches). src/cuda/quantize.cu includes this header and launches
 * them; tests/simt/ compiles the same text as C++ for the host (tests/simt/simt.h maps the CUDA
 * keywords and built-ins) and checks every kernel byte for byte against the CPU backend.
 *
 * The work is cut as the CPU driver (src/cpu/quantize.c) cuts it: one thread block per 128 x 128
 * tile of the input; every element, block amax and scale is computed by the shared numerics
 * (src/numerics/xte_numerics.h, src/xte_kernel_args.h), so the bytes are the CPU's. Block amaxes
 * are max reductions (order-independent, a NaN never wins), done through shared memory so that
 * nothing depends on the warp size (the same source builds for MUSA). Built with -fmad=false
 * (nvcc) / -ffp-contract=off (MUSA, the host runner): no fused multiply-adds. */
#ifndef XTE_QUANTIZE_KERNELS_CUH
#define XTE_QUANTIZE_KERNELS_CUH

#include <stdint.h>

#include "xte/quantize.h"
#include "xte_kernel_args.h"

#define TILE 128
#define NT 256 /* threads per block: 8 rows of 32 */

/* ---------------------------------------------------------------- launch geometry
 * Plain host arithmetic, shared by the launches in quantize.cu and by the host SIMT runner's
 * plugin (tests/simt/simt_plugin.cpp), which restates those launches. */

/* Blocks of the whole-tensor amax kernel: one row per block, at most 1024 blocks. */
static inline int xte_q_amax_grid(int64_t M) {
  return (int)(M < 1024 ? M : 1024);
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

/* ---------------------------------------------------------------- quantize */

/* Element (r, c) of the input as fp32 (as the CPU's load_f32). */
__device__ __forceinline__ float load_in(const xte_quant_args &a, int64_t r, int64_t c) {
  size_t o = (size_t)r * (size_t)a.ld_in + (size_t)c;
  if (a.in_kind == XTE_NUM_IN_F32) return xte_bits_f32(((const uint32_t *)a.in)[o]);
  if (a.in_kind == XTE_NUM_IN_BF16) return xte_bf16_to_f32(((const uint16_t *)a.in)[o]);
  return xte_fp16_to_f32(((const uint16_t *)a.in)[o]);
}

/* Max over the block (every thread gets it); red holds NT floats. */
__device__ float block_max(float v, float *red) {
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

/* Whole-tensor amax (per-tensor current scaling) into *acc (fp32 bits; amax >= +0, never NaN,
 * so the unsigned order of the bits is the float order). */
__global__ void __launch_bounds__(NT) amax_kernel(xte_quant_args a, unsigned *acc) {
  __shared__ float red[NT];
  float m = 0.0f;
  int64_t r, c;
  for (r = blockIdx.x; r < a.M; r += gridDim.x)
    for (c = threadIdx.x; c < a.K; c += NT) m = xte_amax_update(m, load_in(a, r, c));
  m = block_max(m, red);
  if (threadIdx.x == 0) atomicMax(acc, xte_f32_bits(m));
}

/* Per-tensor scale from the amax in scratch[0] (current) or the given scale (delayed); the
 * scale goes to scratch[1] for the tiles. */
__global__ void tensor_scale_kernel(xte_quant_args a, float *scratch) {
  float am = a.recipe == XTE_RECIPE_TE_CURRENT ? scratch[0] : 0.0f;
  xte_block_scale s = xte_quant_block_scale(&a, am);
  if (a.row_s.data) xte_store_scale(&a.row_s, 0, 0, s);
  if (a.col_s.data) xte_store_scale(&a.col_s, 0, 0, s);
  if (a.scale_out) *a.scale_out = s.scale;
  scratch[1] = s.scale;
}

/* One 128 x 128 tile per block: both copies, their scales, the tile's amax. */
__global__ void __launch_bounds__(NT)
    quant_tiles(xte_quant_args a, const float *tensor_scale, unsigned *amax_acc, int64_t ntc) {
  __shared__ uint8_t tq[TILE][TILE + 4]; /* the columnwise bytes before the transposed store */
  __shared__ float red[NT];
  __shared__ float gam[TILE][4]; /* rowwise: amax of each 32-wide group of a row */
  __shared__ float gsc[TILE][4]; /* rowwise: the scale of each group's block */
  __shared__ float csc[32];      /* columnwise: the scales of a 32-column strip */
  const int tid = threadIdx.x, tx = tid & 31, ty = tid >> 5;
  const int64_t tr = (int64_t)blockIdx.x / ntc, tc = (int64_t)blockIdx.x % ntc;
  const int64_t r0 = tr * TILE, c0 = tc * TILE;
  const int nr = (int)(a.M - r0 < TILE ? a.M - r0 : TILE);
  const int nc = (int)(a.K - c0 < TILE ? a.K - c0 : TILE);
  const int stage = a.col_q && a.col_transposed;
  float tam = 0.0f;
  int r, c, k;

  if (a.mode == XTE_SCALING_PER_TENSOR || a.square) {
    xte_block_scale s;
    for (r = ty; r < nr; r += 8)
      for (c = tx; c < nc; c += 32) tam = xte_amax_update(tam, load_in(a, r0 + r, c0 + c));
    tam = block_max(tam, red);
    if (a.square) {
      s = xte_quant_block_scale(&a, tam);
      if (tid == 0) {
        if (a.row_q) xte_store_scale(&a.row_s, tr, tc, s);
        if (a.col_q) {
          if (a.col_transposed)
            xte_store_scale(&a.col_s, tc, tr, s);
          else
            xte_store_scale(&a.col_s, tr, tc, s);
        }
      }
    } else {
      s.scale = *tensor_scale;
    }
    for (r = ty; r < nr; r += 8) {
      for (c = tx; c < nc; c += 32) {
        uint8_t q =
            xte_f32_to_fp8(xte_mul_nanprop(load_in(a, r0 + r, c0 + c), s.scale), a.fmt, a.saturate);
        if (a.row_q) a.row_q[(size_t)(r0 + r) * (size_t)a.ld_row_q + (size_t)(c0 + c)] = q;
        if (stage)
          tq[r][c] = q;
        else if (a.col_q)
          a.col_q[(size_t)(r0 + r) * (size_t)a.ld_col_q + (size_t)(c0 + c)] = q;
      }
    }
  } else {
    if (a.row_q) { /* 1 x row_bw blocks (row_bw = 32 or 128) */
      const int gpb = a.row_bw / 32;
      for (k = tid; k < TILE * 4; k += NT) {
        int g = k & 3, j;
        float m = 0.0f;
        r = k >> 2;
        if (r < nr)
          for (j = 0; j < 32 && g * 32 + j < nc; j++)
            m = xte_amax_update(m, load_in(a, r0 + r, c0 + g * 32 + j));
        gam[r][g] = m;
      }
      __syncthreads();
      for (k = tid; k < TILE * 4; k += NT) {
        int g = k & 3, h;
        r = k >> 2;
        if (r < nr && g % gpb == 0 && g * 32 < nc) {
          float am = 0.0f;
          xte_block_scale s;
          for (h = g; h < g + gpb; h++) am = xte_fmaxf(am, gam[r][h]);
          s = xte_quant_block_scale(&a, am);
          tam = xte_fmaxf(tam, am);
          xte_store_scale(&a.row_s, r0 + r, (c0 + g * 32) / a.row_bw, s);
          for (h = g; h < g + gpb; h++) gsc[r][h] = s.scale;
        }
      }
      __syncthreads();
      for (r = ty; r < nr; r += 8)
        for (c = tx; c < nc; c += 32)
          a.row_q[(size_t)(r0 + r) * (size_t)a.ld_row_q + (size_t)(c0 + c)] = xte_f32_to_fp8(
              xte_mul_nanprop(load_in(a, r0 + r, c0 + c), gsc[r][c >> 5]), a.fmt, a.saturate);
    }
    if (a.col_q) { /* col_bh x 1 blocks (col_bh = 32 or 128), strips of 32 columns */
      const int bh = a.col_bh;
      int cs, g;
      for (cs = 0; cs * 32 < nc; cs++) {
        const int cc = cs * 32 + tx, cv = cc < nc;
        for (g = 0; g < nr; g += bh) {
          const int gr = nr - g < bh ? nr - g : bh;
          float m = 0.0f;
          if (cv)
            for (r = ty; r < gr; r += 8) m = xte_amax_update(m, load_in(a, r0 + g + r, c0 + cc));
          red[tid] = m;
          __syncthreads();
          if (ty == 0 && cv) {
            float am = 0.0f;
            int y;
            int64_t gblk = (r0 + g) / bh;
            xte_block_scale s;
            for (y = 0; y < 8; y++) am = xte_fmaxf(am, red[y * 32 + tx]);
            s = xte_quant_block_scale(&a, am);
            tam = xte_fmaxf(tam, am);
            if (a.col_transposed)
              xte_store_scale(&a.col_s, c0 + cc, gblk, s);
            else
              xte_store_scale(&a.col_s, gblk, c0 + cc, s);
            csc[tx] = s.scale;
          }
          __syncthreads();
          if (cv) {
            for (r = ty; r < gr; r += 8) {
              uint8_t q = xte_f32_to_fp8(xte_mul_nanprop(load_in(a, r0 + g + r, c0 + cc), csc[tx]),
                                         a.fmt, a.saturate);
              if (stage)
                tq[g + r][cc] = q;
              else
                a.col_q[(size_t)(r0 + g + r) * (size_t)a.ld_col_q + (size_t)(c0 + cc)] = q;
            }
          }
          __syncthreads();
        }
      }
    }
  }

  if (stage) { /* the tile transposed: column c of the input is row c0 + c of col_q */
    __syncthreads();
    for (c = ty; c < nc; c += 8)
      for (r = tx; r < nr; r += 32)
        a.col_q[(size_t)(c0 + c) * (size_t)a.ld_col_q + (size_t)(r0 + r)] = tq[r][c];
  }
  if (amax_acc) {
    tam = block_max(tam, red);
    if (tid == 0) atomicMax(amax_acc, xte_f32_bits(tam));
  }
}

/* ---------------------------------------------------------------- dequantize */

__global__ void __launch_bounds__(NT) dequant_kernel(xte_dequant_args a) {
  const int64_t n = a.R * a.C;
  int64_t i;
  for (i = (int64_t)blockIdx.x * NT + threadIdx.x; i < n; i += (int64_t)gridDim.x * NT) {
    const int64_t r = i / a.C, c = i % a.C;
    const float s = xte_load_scale_inv(&a.s, r / a.bh, c / a.bw);
    const float v =
        xte_mul_nanprop(xte_fp8_to_f32(a.q[(size_t)r * (size_t)a.ld_q + (size_t)c], a.fmt), s);
    const size_t o = (size_t)r * (size_t)a.ld_out + (size_t)c;
    if (a.out_dtype == XTE_DTYPE_FP32)
      ((uint32_t *)a.out)[o] = xte_f32_bits(v);
    else if (a.out_dtype == XTE_DTYPE_BF16)
      ((uint16_t *)a.out)[o] = xte_f32_to_bf16(v);
    else
      ((uint16_t *)a.out)[o] = xte_f32_to_fp16(v);
  }
}

/* ---------------------------------------------------------------- cast */

__global__ void __launch_bounds__(NT) cast_kernel(xte_cast_args a) {
  int64_t i;
  for (i = (int64_t)blockIdx.x * NT + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * NT) {
    float v;
    switch (a.in_dtype) {
      case XTE_DTYPE_E4M3:
        v = xte_e4m3_to_f32(((const uint8_t *)a.in)[i]);
        break;
      case XTE_DTYPE_E5M2:
        v = xte_e5m2_to_f32(((const uint8_t *)a.in)[i]);
        break;
      case XTE_DTYPE_E8M0:
        v = xte_e8m0_to_f32(((const uint8_t *)a.in)[i]);
        break;
      case XTE_DTYPE_BF16:
        v = xte_bf16_to_f32(((const uint16_t *)a.in)[i]);
        break;
      case XTE_DTYPE_FP16:
        v = xte_fp16_to_f32(((const uint16_t *)a.in)[i]);
        break;
      default:
        v = xte_bits_f32(((const uint32_t *)a.in)[i]);
        break;
    }
    switch (a.out_dtype) {
      case XTE_DTYPE_FP32:
        ((uint32_t *)a.out)[i] = xte_f32_bits(v);
        break;
      case XTE_DTYPE_BF16:
        ((uint16_t *)a.out)[i] = xte_f32_to_bf16(v);
        break;
      case XTE_DTYPE_FP16:
        ((uint16_t *)a.out)[i] = xte_f32_to_fp16(v);
        break;
      case XTE_DTYPE_E4M3:
        ((uint8_t *)a.out)[i] = xte_f32_to_e4m3(v, a.saturate);
        break;
      case XTE_DTYPE_E8M0:
        ((uint8_t *)a.out)[i] = xte_f32_to_e8m0(v, a.saturate);
        break;
      default:
        ((uint8_t *)a.out)[i] = xte_f32_to_e5m2(v, a.saturate);
        break;
    }
  }
}

#endif /* XTE_QUANTIZE_KERNELS_CUH */
