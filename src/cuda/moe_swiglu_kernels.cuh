/* SwiGLU on the CUDA plugin: forward, backward, and both fused with 1x128 quantization, over the
 * runtime policy RT of moe_kernels.cuh (src/cuda/moe.cu: CUDA; tests/simt/simt_plugin.cpp: the
 * host SIMT runner, checked byte for byte against the CPU backend by test_simt_router).
 *
 * Every output element is one thread's xte_swiglu_fwd / xte_dswiglu_gate / xte_dswiglu_up
 * (src/numerics/xte_moe_numerics.h), as the CPU's act_value; blocks over rows, threads over
 * columns.
 *
 * The fused forms are one pass: quantize's tile walk (quantize_kernels.cuh xte_q_tile_walk, one
 * block per 128 x 128 output tile) with a source that stages the tile's activation, computed from
 * x (and dy) and rounded to act_dtype, instead of reading it from memory. The staged slab holds
 * exactly the bits that the activation written to memory would hold, so the bytes are
 * xte_quantize(xte_swiglu(x)), which is what the CPU's one-pass kernel is tested to give
 * (docs/numerics.md section 8). Inputs are read with 16-byte loads where a run of the chunk is
 * aligned and lies in one half; with an fp32 activation whose 1x128 row blocks span both 64-column
 * slabs, the first slab is computed twice (the tile walk restages it once the scales are known). */
#ifndef XTE_MOE_SWIGLU_KERNELS_CUH
#define XTE_MOE_SWIGLU_KERNELS_CUH

#include <limits.h>

#include "cuda/moe_kernels.cuh"
#include "cuda/quantize_tile.cuh"
#include "numerics/xte_moe_numerics.h"

/* The activation's element (r, c) in fp32 (before the rounding to the output's dtype). */
__device__ __forceinline__ float xte_swiglu_value(const xte_swiglu_args &a, int64_t r, int64_t c) {
  const int64_t F = a.F;
  if (!a.backward) return xte_swiglu_fwd(xte_moe_load(a.x, r, c), xte_moe_load(a.x, r, c + F));
  if (c < F)
    return xte_dswiglu_gate(xte_moe_load(a.dy, r, c), xte_moe_load(a.x, r, c),
                            xte_moe_load(a.x, r, c + F));
  return xte_dswiglu_up(xte_moe_load(a.dy, r, c - F), xte_moe_load(a.x, r, c - F));
}

/* out[r, c] for the T x out.cols elements. */
__global__ void __launch_bounds__(XTE_MOE_NT) xte_swiglu_kernel(xte_swiglu_args a) {
  for (int64_t r = blockIdx.x; r < a.T; r += gridDim.x)
    for (int64_t c = threadIdx.x; c < a.out.cols; c += blockDim.x)
      xte_moe_store(a.out, r, c, xte_swiglu_value(a, r, c));
}

/* The 8 elements of row r of v from column c as fp32 (o[e] for e < n <= 8; the rest untouched):
 * 16-byte loads where the address is aligned, element loads elsewhere. */
__device__ __forceinline__ void xte_swiglu_ld8(const xte_moe_view &v, int64_t r, int64_t c, int n,
                                               float (&o)[8]) {
  int e, h;
  if (v.dtype == XTE_DTYPE_FP32) {
    const float *p = (const float *)v.data + r * v.ld + c;
    XTE_Q_UNROLL
    for (h = 0; h < 2; h++) {
      if (h * 4 + 4 <= n && ((uintptr_t)(p + h * 4) & 15) == 0) {
        const uint4 q = *(const uint4 *)(p + h * 4);
        o[h * 4 + 0] = xte_bits_f32(q.x);
        o[h * 4 + 1] = xte_bits_f32(q.y);
        o[h * 4 + 2] = xte_bits_f32(q.z);
        o[h * 4 + 3] = xte_bits_f32(q.w);
      } else {
        XTE_Q_UNROLL
        for (e = h * 4; e < h * 4 + 4; e++)
          if (e < n) o[e] = p[e];
      }
    }
  } else {
    const uint16_t *p = (const uint16_t *)v.data + r * v.ld + c;
    if (n == 8 && ((uintptr_t)p & 15) == 0) {
      const uint4 q = *(const uint4 *)p;
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
      XTE_Q_UNROLL
      for (e = 0; e < 8; e++) o[e] = xte_bf16_to_f32((uint16_t)(w[e >> 1] >> ((e & 1) * 16)));
    } else {
      XTE_Q_UNROLL
      for (e = 0; e < 8; e++)
        if (e < n) o[e] = xte_bf16_to_f32(p[e]);
    }
  }
}

/* quant_tiles' source for the fused forms: the activation of output columns [cg, cg + ncs) of
 * rows r0 + [0, nr), rounded to act_dtype (a.in_kind), in the slab format of xte_q_stage. Each
 * thread makes 16-byte chunks of the slab (8 bf16 or 4 fp32 values) and stores each whole. */
struct xte_swiglu_src {
  xte_swiglu_args s;

  __device__ __forceinline__ void stage(const xte_quant_args &a, uint8_t *stg, int64_t r0,
                                        int64_t cg, int nr, int ncs) const {
    const int es = xte_q_esize(a.in_kind), epc = 16 / es;
    const int64_t F = s.F;
    for (int k = threadIdx.x; k < TILE * 16; k += NT) {
      const int r = k >> 4, j0 = (k & 15) * epc;
      if (r >= nr || j0 >= ncs) continue;
      const int n = ncs - j0 < epc ? ncs - j0 : epc;
      const int64_t gr = r0 + r, c = cg + j0;
      float v[8], g[8], u[8], d[8];
      int e;
      XTE_Q_UNROLL
      for (e = 0; e < 8; e++) v[e] = g[e] = u[e] = d[e] = 0.0f;
      /* the operands: forward gate x[:, c] and up x[:, c + F]; backward, output columns c < F
       * (the gate half) dy[:, c], x[:, c], x[:, c + F], columns c >= F (the up half) dy[:, c - F],
       * x[:, c - F]; a chunk across the two halves element by element */
      if (!s.backward || c + n <= F) {
        if (s.backward) xte_swiglu_ld8(s.dy, gr, c, n, d);
        xte_swiglu_ld8(s.x, gr, c, n, g);
        xte_swiglu_ld8(s.x, gr, c + F, n, u);
      } else if (c >= F) {
        xte_swiglu_ld8(s.dy, gr, c - F, n, d);
        xte_swiglu_ld8(s.x, gr, c - F, n, g);
      } else {
        XTE_Q_UNROLL
        for (e = 0; e < 8; e++) {
          const int64_t ce = c + e, cx = ce < F ? ce : ce - F;
          if (e >= n) continue;
          d[e] = xte_moe_load(s.dy, gr, cx);
          g[e] = xte_moe_load(s.x, gr, cx);
          if (ce < F) u[e] = xte_moe_load(s.x, gr, cx + F);
        }
      }
      XTE_Q_UNROLL
      for (e = 0; e < 8; e++)
        if (e < n)
          v[e] = !s.backward ? xte_swiglu_fwd(g[e], u[e])
                 : c + e < F ? xte_dswiglu_gate(d[e], g[e], u[e])
                             : xte_dswiglu_up(d[e], g[e]);
      uint32_t w[4] = {0u, 0u, 0u, 0u};
      if (es == 4) {
        XTE_Q_UNROLL
        for (e = 0; e < 4; e++)
          if (e < n) w[e] = xte_f32_bits(v[e]);
      } else {
        XTE_Q_UNROLL
        for (e = 0; e < 8; e++)
          if (e < n) w[e >> 1] |= (uint32_t)xte_f32_to_bf16(v[e]) << ((e & 1) * 16);
      }
      /* rows of the slab are 16-byte aligned and j0 * es is a multiple of 16: the chunk is one
       * store (bytes past n are never read) */
      *(uint4 *)(stg + r * XTE_Q_SROW + j0 * es) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
};

/* The fused forms: one block per 128 x 128 tile of the [M, K] output (K = F, or 2F backward). */
__global__ void __launch_bounds__(NT, 2)
    xte_swiglu_quant_kernel(xte_swiglu_args a, unsigned *amax_acc, int64_t ntc) {
  /* 1x128 blocks only (the API's rule): no per-tensor scale is read */
  xte_q_tile_walk(a.q, (const float *)0, amax_acc, ntc, xte_swiglu_src{a});
}

template <class RT>
static xte_status xte_swiglu_run(RT &rt, const xte_swiglu_args *a) {
  if (!a->fused) {
    /* an empty [T, 0] tensor has nothing to write, however many rows it claims */
    if (a->T <= 0 || a->F <= 0) return XTE_SUCCESS;
    XTE_MOE_TRY(rt.launch(xte_moe_grid(a->T), xte_swiglu_kernel, *a));
    return rt.finish();
  }
  /* as xte_quantize: the scale maps zeroed (their padding), the amax reset, then the tiles */
  const xte_quant_args &q = a->q;
  const int64_t ntr = xte_q_tiles(q.M), ntc = xte_q_tiles(q.K);
  const int empty = q.M <= 0 || q.K <= 0;
  if (!empty && ntr * ntc > INT_MAX)
    return rt.svc->set_error(XTE_ERROR_UNSUPPORTED, "fused SwiGLU: more than 2^31 tiles");
  XTE_MOE_TRY(rt.memset(q.row_s.data, 0, xte_q_scale_bytes(&q.row_s)));
  XTE_MOE_TRY(rt.memset(q.col_s.data, 0, xte_q_scale_bytes(&q.col_s)));
  if (q.amax_out) XTE_MOE_TRY(rt.memset(q.amax_out, 0, sizeof(float)));
  if (!empty)
    XTE_MOE_TRY(rt.launch(ntr * ntc, xte_swiglu_quant_kernel, *a, (unsigned *)q.amax_out, ntc));
  return rt.finish();
}

#endif /* XTE_MOE_SWIGLU_KERNELS_CUH */
