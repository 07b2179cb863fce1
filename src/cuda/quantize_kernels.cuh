/* The quantize / dequantize / cast kernels of the CUDA plugin (__global__ and __device__ code
 * only: no runtime calls, no launches). src/cuda/quantize.cu includes this header and launches
 * them; tests/simt/ compiles the same text as C++ for the host (tests/simt/simt.h maps the CUDA
 * keywords and built-ins) and checks every kernel byte for byte against the CPU backend.
 *
 * The quantize is one thread block per 128 x 128 tile of the input, the walk of
 * quantize_tile.cuh over the input tensor; the per-tensor amax and scale kernels before it. */
#ifndef XTE_QUANTIZE_KERNELS_CUH
#define XTE_QUANTIZE_KERNELS_CUH

#include "cuda/quantize_tile.cuh"

/* Whole-tensor amax (per-tensor current scaling) into *acc (fp32 bits; amax >= +0, never NaN,
 * so the unsigned order of the bits is the float order). The tensor is walked as M rows of
 * ceil(K / (16 / esize)) chunks of 16 bytes, chunk index i = row * cpr + chunk, grid-stride over
 * i; (row, chunk) step by a fixed (dr, dc) (one 64-bit division per thread, none per element).
 * A chunk at a 16-byte aligned address that lies wholly inside its row is one 16-byte load. */
__global__ void __launch_bounds__(NT) amax_kernel(xte_quant_args a, unsigned *acc) {
  __shared__ float red[NT];
  const int es = xte_q_esize(a.in_kind), epc = 16 / es;
  const int64_t cpr = (a.K + epc - 1) / epc, nch = a.M * cpr;
  const int64_t i0 = (int64_t)blockIdx.x * NT + threadIdx.x, step = (int64_t)gridDim.x * NT;
  float m = 0.0f;
  if ((int64_t)blockIdx.x * NT >= nch) return; /* the whole block: no barrier is skipped */
  if (i0 < nch) {
    const int64_t dr = step / cpr, dc = step % cpr;
    int64_t r = i0 / cpr, ch = i0 % cpr;
    while (r < a.M) {
      const int64_t c = ch * epc;
      const int n = (int)(a.K - c < epc ? a.K - c : epc);
      const uint8_t *p = (const uint8_t *)a.in + ((size_t)r * (size_t)a.ld_in + (size_t)c) * es;
      if (n == epc && ((uintptr_t)p & 15) == 0) {
        m = xte_q_amax16(m, *(const uint4 *)p, a.in_kind, n);
      } else {
        int e;
        for (e = 0; e < n; e++) m = xte_amax_update(m, xte_q_ld(p, a.in_kind, e));
      }
      r += dr;
      ch += dc;
      if (ch >= cpr) {
        ch -= cpr;
        r++;
      }
    }
  }
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

__global__ void __launch_bounds__(NT)
    quant_tiles(xte_quant_args a, const float *tensor_scale, unsigned *amax_acc, int64_t ntc) {
  xte_q_tile_walk(a, tensor_scale, amax_acc, ntc, xte_q_src_in());
}

/* ---------------------------------------------------------------- dequantize */

/* x / d for 0 <= x, 0 < d: a 32-bit division whenever x fits (every realistic row or column
 * index), the 64-bit one otherwise. */
__device__ __forceinline__ int64_t xte_q_div(int64_t x, int d) {
  return x <= (int64_t)0xFFFFFFFFu ? (int64_t)((uint32_t)x / (uint32_t)d) : x / d;
}

/* Grid-stride over the R x C elements; (r, c) step by a fixed (dr, dc), so the only 64-bit
 * divisions are one per thread. */
__global__ void __launch_bounds__(NT) dequant_kernel(xte_dequant_args a) {
  const int64_t n = a.R * a.C, i0 = (int64_t)blockIdx.x * NT + threadIdx.x;
  const int64_t step = (int64_t)gridDim.x * NT;
  int64_t r, c, dr, dc;
  if (i0 >= n) return;
  dr = step / a.C;
  dc = step % a.C;
  r = i0 / a.C;
  c = i0 % a.C;
  while (r < a.R) {
    const float s = xte_load_scale_inv(&a.s, xte_q_div(r, a.bh), xte_q_div(c, a.bw));
    const float v =
        xte_mul_nanprop(xte_fp8_to_f32(a.q[(size_t)r * (size_t)a.ld_q + (size_t)c], a.fmt), s);
    const size_t o = (size_t)r * (size_t)a.ld_out + (size_t)c;
    if (a.out_dtype == XTE_DTYPE_FP32)
      ((uint32_t *)a.out)[o] = xte_f32_bits(v);
    else if (a.out_dtype == XTE_DTYPE_BF16)
      ((uint16_t *)a.out)[o] = xte_f32_to_bf16(v);
    else
      ((uint16_t *)a.out)[o] = xte_f32_to_fp16(v);
    r += dr;
    c += dc;
    if (c >= a.C) {
      c -= a.C;
      r++;
    }
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
