/* Exact attention on the CUDA plugin: the SIMT forward and the two-pass backward, and the host
 * steps that drive them, written against a small runtime policy RT (allocation, memset,
 * device-to-host read, launch): no runtime call appears here. src/cuda/attention.cu instantiates
 * the driver with the CUDA runtime; tests/simt/simt_plugin.cpp with the host SIMT runner
 * (simt.h), where the same text is checked byte for byte against the CPU backend.
 *
 * The contract is docs/numerics.md section 7 (the CPU backend's bytes, src/cpu/attention_driver.c).
 * Every per-element step is a function of src/numerics/xte_attention_numerics.h; this file only
 * maps the contract's order to threads:
 *  - forward (xte_attn_fwd_kernel): one block per (sequence, query head, 16 query rows). For each
 *    64-key block that one of its rows sees, in order: thread (row, slot) computes the logit (the
 *    dot product is one fmaf chain over the head dim from +0); thread row runs the online-softmax
 *    step of its row (max chain over the 64 slots, xte_attn_new_max, xte_attn_exp,
 *    fmaf(l, alpha, xte_attn_sum64)); thread (row, column) runs the P V chain over the block's
 *    keys from +0 and xte_attn_rescale. The forward does not depend on the tile height (rows
 *    are independent), so the 16-row tiles give the CPU's 64-row tiles' bytes;
 *  - backward pass B (xte_attn_dq_kernel): one block per (sequence, query head, 16 rows): D (the
 *    dO . O chain), then per active KV block u, dS' (slots j < nb for dS', all 64 for u), the
 *    row's lambda += sum64(u), and thread (row, column) the dQ part (chain over the block's keys
 *    from +0) added to the running sum; at the end dQ = acc / lambda and corr = log(lambda)
 *    into the workspace;
 *  - backward pass A (xte_attn_dkv_kernel, after pass B): one block per (sequence, KV head, 64-key
 *    block, quarter of 16 keys). For each query head of the group, for each 64-row query tile
 *    that has a row seeing the 64-key block (the activity test uses the whole 64-key block, as
 *    the CPU): thread (row, key) computes p and dS; thread (key, column) runs the chain over the
 *    tile's active rows in order from +0 and adds it to the key's running sum;
 *  - no atomics in the compute kernels, no warp-level operation (block-wide steps through shared
 * memory and
 *    __syncthreads), so nothing depends on the warp size or on scheduling;
 *  - cu_seqlens (device memory) are checked in parallel (every sequence at once; the first faulty
 *    one found by atomicMin, so the verdict is the CPU's scan order's); the host reads the verdict
 *    and reports the CPU's message before anything is written;
 *  - every NaN written is the canonical one (xte_attn_nan, bf16 0x7FC0, fp16 0x7E00). */
#ifndef XTE_ATTENTION_KERNELS_CUH
#define XTE_ATTENTION_KERNELS_CUH

#include <stdint.h>

#include "numerics/xte_attention_numerics.h"
#include "xte_attention_ops.h"
#include "xte_backend.h"

#define XTE_ATTN_NT 128   /* threads per block */
#define XTE_ATTN_R 16     /* query rows per block of the forward and of pass B */
#define XTE_ATTN_KC 16    /* keys per block of pass A (a quarter of a 64-key block) */
#define XTE_ATTN_DMAX 256 /* XTE_ATTN_MAX_HEAD_DIM */
#define XTE_ATTN_GRID_CAP 65535

#define XTE_ATTN_TRY(expr)                              \
  do {                                                  \
    xte_status xte_attn_s_ = (expr);                    \
    if (xte_attn_s_ != XTE_SUCCESS) return xte_attn_s_; \
  } while (0)

/* Loops kept rolled on the device (the dot products' chains); nothing for the host runner. */
#if defined(__CUDACC__) || defined(__MUSACC__)
#define XTE_ATTN_NO_UNROLL _Pragma("unroll 1")
#else
#define XTE_ATTN_NO_UNROLL
#endif

/* ---------------------------------------------------------------- element access */

__device__ __forceinline__ float xte_attn_ld(const void *p, int dtype, int64_t i) {
  switch (dtype) {
    case XTE_DTYPE_FP32:
      return ((const float *)p)[i];
    case XTE_DTYPE_BF16:
      return xte_bf16_to_f32(((const uint16_t *)p)[i]);
    case XTE_DTYPE_FP16:
      return xte_fp16_to_f32(((const uint16_t *)p)[i]);
    default:
      return xte_e4m3_to_f32(((const uint8_t *)p)[i]);
  }
}

/* Stores x rounded to dtype (RNE); a NaN as the canonical one. */
__device__ __forceinline__ void xte_attn_st(void *p, int dtype, int64_t i, float x) {
  if (xte_f32_isnan(x)) x = xte_attn_nan();
  if (dtype == XTE_DTYPE_FP32)
    ((float *)p)[i] = x;
  else if (dtype == XTE_DTYPE_BF16)
    ((uint16_t *)p)[i] = xte_f32_to_bf16(x);
  else
    ((uint16_t *)p)[i] = xte_f32_to_fp16(x);
}

__host__ __device__ __forceinline__ int64_t xte_attn_eoff(const xte_attn_tensor &t, int64_t b,
                                                          int64_t tok, int64_t h) {
  return b * t.bs + tok * t.ts + h * t.hs;
}
__host__ __device__ __forceinline__ int64_t xte_attn_loff(const xte_attn_args &a, int64_t b,
                                                          int64_t tok, int64_t h) {
  return b * a.lse_bs + tok * a.lse_ts + h * a.lse_hs;
}

/* Sequence b of the queries (kv = 0) or keys (kv = 1): first token (packed; else 0), length. */
__device__ __forceinline__ void xte_attn_seq(const xte_attn_args &a, int kv, int64_t b, int64_t *t0,
                                             int64_t *len) {
  const int32_t *cu = kv ? a.cu_kv : a.cu_q;
  *t0 = a.packed ? cu[b] : 0;
  *len = cu ? (int64_t)cu[b + 1] - cu[b] : kv ? a.skv : a.sq;
}

/* The score parameters of (sequence b, query head h) (the CPU's score_for). */
__device__ __forceinline__ xte_attn_score xte_attn_score_for(const xte_attn_args &a, int64_t b,
                                                             int64_t h, float *vdesc) {
  float scale = a.scale;
  const int64_t hk = h / (a.hq / a.hkv);
  if (a.descale_q) scale = scale * a.descale_q[b * a.hkv + hk];
  if (a.descale_k) scale = scale * a.descale_k[b * a.hkv + hk];
  if (vdesc) *vdesc = a.descale_v ? a.descale_v[b * a.hkv + hk] : 1.0f;
  return xte_attn_score_make(scale, a.softcap, a.alibi != NULL, a.alibi ? a.alibi[h] : 0.0f);
}

/* dot(x[0..n), y[0..n)): one fmaf chain from +0, fmaf(x_k, y_k, acc) in increasing k. */
__device__ __forceinline__ float xte_attn_dot(const void *x, const void *y, int dtype, int64_t n) {
  float acc = 0.0f;
  XTE_ATTN_NO_UNROLL
  for (int64_t k = 0; k < n; k++)
    acc = xte_fmaf(xte_attn_ld(x, dtype, k), xte_attn_ld(y, dtype, k), acc);
  return acc;
}

__device__ __forceinline__ const void *xte_attn_ptr(const xte_attn_tensor &t, int dtype,
                                                    int64_t off) {
  const int64_t es = dtype == XTE_DTYPE_FP32 ? 4 : dtype == XTE_DTYPE_E4M3 ? 1 : 2;
  return (const char *)t.data + off * es;
}

__device__ __forceinline__ int64_t xte_attn_min(int64_t x, int64_t y) {
  return x < y ? x : y;
}
__device__ __forceinline__ int64_t xte_attn_max(int64_t x, int64_t y) {
  return x > y ? x : y;
}

/* ---------------------------------------------------------------- cu_seqlens check
 * In parallel, with the CPU's verdict: the CPU scans q (cu[0], then the sequences in order, then
 * cu[batch]) and then kv, and reports the first fault. Here w[0] / w[1] get the first sequence b
 * whose q / kv length is negative or past the max (atomicMin over all sequences at once: the
 * same b the scan stops at), w[2] / w[3] the longest q / kv sequence (atomicMax); one thread then
 * composes the CPU's verdict from them: v[0]: 0 good, 1 cu[0] < 0, 2 decreasing, 3 a length past
 * the max, 4 cu[batch] past the tensor; v[1]: 0 q / 1 kv; v[2]: b; v[3], v[4]: the values of the
 * message; v[5], v[6]: the longest q / kv sequence. */
#define XTE_ATTN_CHECK_NONE 0xFFFFFFFFFFFFFFFFull

__global__ void __launch_bounds__(XTE_ATTN_NT) xte_attn_check_init(unsigned long long *w) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  w[0] = w[1] = XTE_ATTN_CHECK_NONE;
  w[2] = w[3] = 0;
}

__global__ void __launch_bounds__(XTE_ATTN_NT)
    xte_attn_check_scan(xte_attn_args a, unsigned long long *w) {
  for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < a.batch;
       b += (int64_t)gridDim.x * blockDim.x) {
    const int64_t lq = (int64_t)a.cu_q[b + 1] - a.cu_q[b],
                  lk = (int64_t)a.cu_kv[b + 1] - a.cu_kv[b];
    if (lq < 0 || lq > a.sq)
      atomicMin(w, (unsigned long long)b);
    else
      atomicMax(w + 2, (unsigned long long)lq);
    if (lk < 0 || lk > a.skv)
      atomicMin(w + 1, (unsigned long long)b);
    else
      atomicMax(w + 3, (unsigned long long)lk);
  }
}

/* the verdict of one side (cu, its first faulty sequence bad) into v; 1 when faulty */
__device__ __forceinline__ int xte_attn_check_one(const int32_t *cu, int64_t batch, int64_t total,
                                                  int64_t maxlen, int packed,
                                                  unsigned long long bad, int64_t *v) {
  if (packed && cu[0] < 0) {
    v[0] = 1;
    v[3] = cu[0];
    return 1;
  }
  if (bad != XTE_ATTN_CHECK_NONE) {
    const int64_t b = (int64_t)bad, len = (int64_t)cu[b + 1] - cu[b];
    v[2] = b;
    if (len < 0) {
      v[0] = 2;
      v[3] = cu[b];
      v[4] = cu[b + 1];
    } else {
      v[0] = 3;
      v[3] = len;
      v[4] = maxlen;
    }
    return 1;
  }
  if (packed && (int64_t)cu[batch] > total) {
    v[0] = 4;
    v[3] = cu[batch];
    v[4] = total;
    return 1;
  }
  return 0;
}

__global__ void __launch_bounds__(XTE_ATTN_NT)
    xte_attn_check_kernel(xte_attn_args a, const unsigned long long *w, int64_t *v) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (int i = 0; i < 8; i++) v[i] = 0;
  if (xte_attn_check_one(a.cu_q, a.batch, a.total_q, a.sq, a.packed, w[0], v)) return;
  v[1] = 1;
  if (xte_attn_check_one(a.cu_kv, a.batch, a.total_kv, a.skv, a.packed, w[1], v)) return;
  v[1] = 0;
  v[5] = (int64_t)w[2];
  v[6] = (int64_t)w[3];
}

/* ---------------------------------------------------------------- work lists
 * With cu_seqlens, the grids are sized by the real work, not by batch x heads x the longest
 * sequence's tiles (THD with many empty or short sequences): off[b] is the exclusive prefix sum
 * of the units of the sequences before b (q: 16-row tiles; kv: 64-key blocks), off[batch] the
 * total; a block finds its sequence by binary search. One block scans (block-wide steps through
 * shared memory, no warp-level operation), chunk after chunk. A faulty cu_seqlens (refused
 * before any launch that reads the lists) counts a negative length as 0. */
__global__ void __launch_bounds__(XTE_ATTN_NT)
    xte_attn_work_scan(xte_attn_args a, int64_t *qoff, int64_t *kvoff) {
  __shared__ int64_t sq[XTE_ATTN_NT], sk[XTE_ATTN_NT];
  __shared__ int64_t carry[2];
  const int tid = (int)threadIdx.x, nt = (int)blockDim.x;
  if (tid == 0) carry[0] = carry[1] = 0;
  __syncthreads();
  for (int64_t c0 = 0; c0 < a.batch; c0 += nt) {
    const int64_t b = c0 + tid;
    int64_t uq = 0, uk = 0;
    if (b < a.batch) {
      const int64_t lq = (int64_t)a.cu_q[b + 1] - a.cu_q[b],
                    lk = (int64_t)a.cu_kv[b + 1] - a.cu_kv[b];
      uq = lq > 0 ? (lq + XTE_ATTN_R - 1) / XTE_ATTN_R : 0;
      uk = lk > 0 ? (lk + XTE_ATTN_BN - 1) / XTE_ATTN_BN : 0;
    }
    sq[tid] = uq;
    sk[tid] = uk;
    __syncthreads();
    for (int d = 1; d < nt; d *= 2) { /* inclusive scan (Hillis-Steele) */
      const int64_t xq = tid >= d ? sq[tid - d] : 0, xk = tid >= d ? sk[tid - d] : 0;
      __syncthreads();
      sq[tid] += xq;
      sk[tid] += xk;
      __syncthreads();
    }
    if (b < a.batch) {
      qoff[b] = carry[0] + sq[tid] - uq;
      kvoff[b] = carry[1] + sk[tid] - uk;
    }
    __syncthreads();
    if (tid == nt - 1) {
      carry[0] += sq[tid];
      carry[1] += sk[tid];
    }
    __syncthreads();
  }
  if (tid == 0) {
    qoff[a.batch] = carry[0];
    kvoff[a.batch] = carry[1];
  }
}

/* The sequence of unit g of a work list off (off[b] <= g < off[b + 1]; g < off[batch]). */
__device__ __forceinline__ int64_t xte_attn_work_seq(const int64_t *off, int64_t batch, int64_t g) {
  int64_t lo = 0, hi = batch - 1;
  while (lo < hi) { /* the last b with off[b] <= g: empty sequences before it are skipped */
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (off[mid] <= g)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/* ---------------------------------------------------------------- padding
 * Positions outside every sequence: O / dQ (kv = 0) or dK, dV (kv = 1) rows 0, LSE -inf (fwd).
 * Grid-stride over (position, head); BSHD / SBHD position b * s + t, THD token t. */
__global__ void __launch_bounds__(XTE_ATTN_NT)
    xte_attn_pad_kernel(xte_attn_args a, int kv, int fwd) {
  const int64_t heads = kv ? a.hkv : a.hq;
  const int64_t npos = a.packed ? (kv ? a.total_kv : a.total_q) : a.batch * (kv ? a.skv : a.sq);
  const int64_t s = kv ? a.skv : a.sq;
  const int32_t *cu = kv ? a.cu_kv : a.cu_q;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < npos * heads;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t pos = e / heads, h = e % heads;
    int64_t b, t;
    if (a.packed) {
      b = 0;
      t = pos;
      if (t >= cu[0] && t < cu[a.batch]) continue;
    } else {
      b = pos / s;
      t = pos % s;
      if (t < (int64_t)cu[b + 1] - cu[b]) continue;
    }
    if (fwd) {
      const int64_t o = xte_attn_eoff(a.o, b, t, h);
      for (int64_t c = 0; c < a.dv; c++) xte_attn_st(a.o.data, a.out_dtype, o + c, 0.0f);
      a.lse[xte_attn_loff(a, b, t, h)] = xte_attn_neg_inf();
    } else if (!kv) {
      const int64_t o = xte_attn_eoff(a.dq, b, t, h);
      for (int64_t c = 0; c < a.dqk; c++) xte_attn_st(a.dq.data, a.dtype, o + c, 0.0f);
    } else {
      const int64_t ok = xte_attn_eoff(a.dk, b, t, h), ov = xte_attn_eoff(a.dv_, b, t, h);
      for (int64_t c = 0; c < a.dqk; c++) xte_attn_st(a.dk.data, a.dtype, ok + c, 0.0f);
      for (int64_t c = 0; c < a.dv; c++) xte_attn_st(a.dv_.data, a.dtype, ov + c, 0.0f);
    }
  }
}

/* ---------------------------------------------------------------- forward
 * Block: (sequence b, query head h, rows [i0, i0 + 16)), blockIdx.x = (b * hq + h) * ntile +
 * tile. */
__global__ void __launch_bounds__(XTE_ATTN_NT)
    xte_attn_fwd_kernel(xte_attn_args a, int64_t ntile, const int64_t *qoff) {
  const int R = XTE_ATTN_R, BN = XTE_ATTN_BN;
  __shared__ float sX[XTE_ATTN_R][XTE_ATTN_BN]; /* logits, then probabilities */
  __shared__ float sO[XTE_ATTN_R][XTE_ATTN_DMAX];
  __shared__ float sm[XTE_ATTN_R], sl[XTE_ATTN_R], sal[XTE_ATTN_R];
  __shared__ int64_t slo[XTE_ATTN_R], shi[XTE_ATTN_R];
  __shared__ int sact[XTE_ATTN_R];
  const int tid = (int)threadIdx.x;
  int64_t tile, h, b;
  if (qoff) { /* the work list: blockIdx.x = global tile * hq + h */
    const int64_t g = (int64_t)blockIdx.x / a.hq;
    h = (int64_t)blockIdx.x % a.hq;
    b = xte_attn_work_seq(qoff, a.batch, g);
    tile = g - qoff[b];
  } else {
    tile = (int64_t)blockIdx.x % ntile;
    h = (int64_t)blockIdx.x / ntile % a.hq;
    b = (int64_t)blockIdx.x / ntile / a.hq;
  }
  const int64_t hk = h / (a.hq / a.hkv);
  const int64_t dq = a.dqk, dv = a.dv;
  int64_t qt0, lq, kt0, lkv;
  xte_attn_seq(a, 0, b, &qt0, &lq);
  xte_attn_seq(a, 1, b, &kt0, &lkv);
  const int64_t i0 = tile * R;
  if (i0 >= lq) return; /* the whole block */
  const int64_t nr = xte_attn_min(R, lq - i0), off = lkv - lq;
  float vdesc;
  const xte_attn_score sp = xte_attn_score_for(a, b, h, &vdesc);
  int64_t jlo = INT64_MAX, jhi = 0;
  for (int r = 0; r < nr; r++) { /* every thread: the hull of the rows' visible keys */
    int64_t lo, hi;
    xte_attn_row_range(i0 + r, lq, lkv, a.mask, a.window_left, a.window_right, &lo, &hi);
    if (lo < hi) {
      jlo = xte_attn_min(jlo, lo);
      jhi = xte_attn_max(jhi, hi);
    }
    if (tid == r) {
      slo[r] = lo;
      shi[r] = hi;
      sm[r] = xte_attn_neg_inf();
      sl[r] = 0.0f;
    }
  }
  for (int64_t e = tid; e < R * dv; e += blockDim.x) sO[e / dv][e % dv] = 0.0f;
  __syncthreads();
  for (int64_t j0 = jlo < jhi ? jlo / BN * BN : 0; j0 < jhi; j0 += BN) {
    const int64_t nb = xte_attn_min(BN, lkv - j0);
    int any = 0;
    for (int r = 0; r < nr; r++) any |= xte_attn_max(slo[r], j0) < xte_attn_min(shi[r], j0 + nb);
    if (!any) continue; /* uniform: every thread read the same shared values */
    if (tid < nr) sact[tid] = xte_attn_max(slo[tid], j0) < xte_attn_min(shi[tid], j0 + nb);
    /* logits: slot j of row r (hidden and past-nb slots -inf) */
    for (int e = tid; e < R * BN; e += (int)blockDim.x) {
      const int r = e / BN, j = e % BN;
      if (r >= nr) continue;
      const int64_t lo = slo[r], hi = shi[r];
      if (!(xte_attn_max(lo, j0) < xte_attn_min(hi, j0 + nb))) continue;
      float x = xte_attn_neg_inf();
      if (j0 + j >= lo && j0 + j < hi && j < nb) {
        const float s = xte_attn_dot(
            xte_attn_ptr(a.k, a.dtype, xte_attn_eoff(a.k, b, kt0 + j0 + j, hk)),
            xte_attn_ptr(a.q, a.dtype, xte_attn_eoff(a.q, b, qt0 + i0 + r, h)), a.dtype, dq);
        x = xte_attn_logit(s, &sp, i0 + r + off - (j0 + j));
      }
      sX[r][j] = x;
    }
    __syncthreads();
    if (tid < nr && sact[tid]) { /* the online-softmax step of row tid */
      float mb = xte_attn_neg_inf();
      for (int j = 0; j < BN; j++) mb = xte_fmaxf(mb, sX[tid][j]);
      float m = sm[tid];
      const float alpha = xte_attn_new_max(&m, mb);
      for (int j = 0; j < BN; j++) sX[tid][j] = xte_attn_exp(sX[tid][j], m);
      sm[tid] = m;
      sal[tid] = alpha;
      sl[tid] = xte_fmaf(sl[tid], alpha, xte_attn_sum64(sX[tid]));
    }
    __syncthreads();
    /* P V of the block from +0, then the rescale */
    for (int64_t e = tid; e < R * dv; e += blockDim.x) {
      const int r = (int)(e / dv);
      const int64_t c = e % dv;
      if (r >= nr || !sact[r]) continue;
      float pv = 0.0f;
      const int64_t vo = xte_attn_eoff(a.v, b, kt0 + j0, hk) + c;
      XTE_ATTN_NO_UNROLL
      for (int64_t j = 0; j < nb; j++)
        pv = xte_fmaf(sX[r][j], xte_attn_ld(a.v.data, a.dtype, vo + j * a.v.ts), pv);
      sO[r][c] = xte_attn_rescale(sO[r][c], sal[r], pv);
    }
    __syncthreads();
  }
  for (int64_t e = tid; e < nr * dv; e += blockDim.x) {
    const int r = (int)(e / dv);
    const int64_t c = e % dv;
    const float l = sl[r];
    float o;
    if (l > 0.0f) {
      o = xte_attn_finish(sO[r][c], l);
      if (a.dtype == XTE_DTYPE_E4M3) o = o * vdesc;
    } else {
      o = xte_f32_isnan(l) ? xte_attn_nan() : 0.0f;
    }
    xte_attn_st(a.o.data, a.out_dtype, xte_attn_eoff(a.o, b, qt0 + i0 + r, h) + c, o);
  }
  if (tid < nr) a.lse[xte_attn_loff(a, b, qt0 + i0 + tid, h)] = xte_attn_lse(sm[tid], sl[tid]);
}

/* ---------------------------------------------------------------- backward pass B: D, dQ, corr
 * Block as the forward's. Dbuf, Cbuf: indexed like the LSE. */
__global__ void __launch_bounds__(XTE_ATTN_NT)
    xte_attn_dq_kernel(xte_attn_args a, int64_t ntile, const int64_t *qoff, float *Dbuf,
                       float *Cbuf) {
  const int R = XTE_ATTN_R, BN = XTE_ATTN_BN;
  __shared__ float sP[XTE_ATTN_R][XTE_ATTN_BN];
  __shared__ float sDS[XTE_ATTN_R][XTE_ATTN_BN];
  __shared__ float sQ[XTE_ATTN_R][XTE_ATTN_DMAX]; /* the dQ sums */
  __shared__ float sL[XTE_ATTN_R], sD[XTE_ATTN_R], sls[XTE_ATTN_R];
  __shared__ int64_t slo[XTE_ATTN_R], shi[XTE_ATTN_R];
  __shared__ int sact[XTE_ATTN_R];
  const int tid = (int)threadIdx.x;
  int64_t tile, h, b;
  if (qoff) { /* the work list: blockIdx.x = global tile * hq + h */
    const int64_t g = (int64_t)blockIdx.x / a.hq;
    h = (int64_t)blockIdx.x % a.hq;
    b = xte_attn_work_seq(qoff, a.batch, g);
    tile = g - qoff[b];
  } else {
    tile = (int64_t)blockIdx.x % ntile;
    h = (int64_t)blockIdx.x / ntile % a.hq;
    b = (int64_t)blockIdx.x / ntile / a.hq;
  }
  const int64_t hk = h / (a.hq / a.hkv);
  const int64_t dq = a.dqk, dv = a.dv;
  int64_t qt0, lq, kt0, lkv;
  xte_attn_seq(a, 0, b, &qt0, &lq);
  xte_attn_seq(a, 1, b, &kt0, &lkv);
  const int64_t i0 = tile * R;
  if (i0 >= lq) return;
  const int64_t nr = xte_attn_min(R, lq - i0), off = lkv - lq;
  const xte_attn_score sp = xte_attn_score_for(a, b, h, NULL);
  int64_t jlo = INT64_MAX, jhi = 0;
  for (int r = 0; r < nr; r++) {
    int64_t lo, hi;
    xte_attn_row_range(i0 + r, lq, lkv, a.mask, a.window_left, a.window_right, &lo, &hi);
    if (lo < hi) {
      jlo = xte_attn_min(jlo, lo);
      jhi = xte_attn_max(jhi, hi);
    }
    if (tid == r) {
      const int64_t li = xte_attn_loff(a, b, qt0 + i0 + r, h);
      slo[r] = lo;
      shi[r] = hi;
      sls[r] = 0.0f;
      sL[r] = a.lse[li];
      /* D = sum_c dO * O, one fmaf chain from +0 */
      const float d = xte_attn_dot(
          xte_attn_ptr(a.dout, a.dtype, xte_attn_eoff(a.dout, b, qt0 + i0 + r, h)),
          xte_attn_ptr(a.o, a.dtype, xte_attn_eoff(a.o, b, qt0 + i0 + r, h)), a.dtype, dv);
      sD[r] = d;
      Dbuf[li] = d;
    }
  }
  for (int64_t e = tid; e < R * dq; e += blockDim.x) sQ[e / dq][e % dq] = 0.0f;
  __syncthreads();
  for (int64_t j0 = jlo < jhi ? jlo / BN * BN : 0; j0 < jhi; j0 += BN) {
    const int64_t nb = xte_attn_min(BN, lkv - j0);
    int any = 0;
    for (int r = 0; r < nr; r++) any |= xte_attn_max(slo[r], j0) < xte_attn_min(shi[r], j0 + nb);
    if (!any) continue;
    if (tid < nr) sact[tid] = xte_attn_max(slo[tid], j0) < xte_attn_min(shi[tid], j0 + nb);
    /* u and dS' of slot j of row r (dS' only for j < nb: the others are never used) */
    for (int e = tid; e < R * BN; e += (int)blockDim.x) {
      const int r = e / BN, j = e % BN;
      if (r >= nr) continue;
      const int64_t lo = slo[r], hi = shi[r];
      if (!(xte_attn_max(lo, j0) < xte_attn_min(hi, j0 + nb))) continue;
      float x = xte_attn_neg_inf(), ds = 0.0f, p;
      if (j < nb) {
        const int64_t qo = xte_attn_eoff(a.q, b, qt0 + i0 + r, h);
        const int64_t go = xte_attn_eoff(a.dout, b, qt0 + i0 + r, h);
        const float s =
            xte_attn_dot(xte_attn_ptr(a.k, a.dtype, xte_attn_eoff(a.k, b, kt0 + j0 + j, hk)),
                         xte_attn_ptr(a.q, a.dtype, qo), a.dtype, dq);
        const float dp =
            xte_attn_dot(xte_attn_ptr(a.v, a.dtype, xte_attn_eoff(a.v, b, kt0 + j0 + j, hk)),
                         xte_attn_ptr(a.dout, a.dtype, go), a.dtype, dv);
        if (j0 + j >= lo && j0 + j < hi) x = xte_attn_logit(s, &sp, i0 + r + off - (j0 + j));
        p = xte_attn_exp(x - sL[r], 0.0f);
        ds = xte_attn_ds(p, dp, sD[r], sp.softcap ? xte_attn_dlogit(s, &sp) : sp.scale);
      } else {
        p = xte_attn_exp(x - sL[r], 0.0f);
      }
      sP[r][j] = p;
      sDS[r][j] = ds;
    }
    __syncthreads();
    if (tid < nr && sact[tid]) sls[tid] = xte_attn_add(sls[tid], xte_attn_sum64(sP[tid]));
    /* the block's dQ part from +0 over its keys, added to the running sum */
    for (int64_t e = tid; e < R * dq; e += blockDim.x) {
      const int r = (int)(e / dq);
      const int64_t c = e % dq;
      if (r >= nr || !sact[r]) continue;
      float part = 0.0f;
      const int64_t ko = xte_attn_eoff(a.k, b, kt0 + j0, hk) + c;
      XTE_ATTN_NO_UNROLL
      for (int64_t j = 0; j < nb; j++)
        part = xte_fmaf(sDS[r][j], xte_attn_ld(a.k.data, a.dtype, ko + j * a.k.ts), part);
      sQ[r][c] = xte_attn_add(sQ[r][c], part);
    }
    __syncthreads();
  }
  for (int64_t e = tid; e < nr * dq; e += blockDim.x) {
    const int r = (int)(e / dq);
    const int64_t c = e % dq;
    const float ls = sls[r];
    const float g = ls > 0.0f ? xte_attn_finish(sQ[r][c], ls) : sQ[r][c];
    xte_attn_st(a.dq.data, a.dtype, xte_attn_eoff(a.dq, b, qt0 + i0 + r, h) + c, g);
  }
  if (tid < nr)
    Cbuf[xte_attn_loff(a, b, qt0 + i0 + tid, h)] = sls[tid] > 0.0f ? xte_logf(sls[tid]) : 0.0f;
}

/* ---------------------------------------------------------------- backward pass A: dK, dV
 * Block: (sequence b, KV head hk, 64-key block kb, quarter q of 16 keys), blockIdx.x =
 * ((b * hkv + hk) * nkb + kb) * 4 + q. */
/* (min 1 block per SM: without it ptxas held sm_90a to 96 registers and spilled the work-list
 * decode; it takes 104) */
__global__ void __launch_bounds__(XTE_ATTN_NT, 1)
    xte_attn_dkv_kernel(xte_attn_args a, int64_t nkb, const int64_t *kvoff, const float *Dbuf,
                        const float *Cbuf) {
  const int BN = XTE_ATTN_BN, BM = XTE_ATTN_BM, KC = XTE_ATTN_KC;
  __shared__ float sK[XTE_ATTN_KC][XTE_ATTN_DMAX]; /* the dK sums */
  __shared__ float sV[XTE_ATTN_KC][XTE_ATTN_DMAX]; /* the dV sums */
  __shared__ float sP[XTE_ATTN_BM][XTE_ATTN_KC];
  __shared__ float sDS[XTE_ATTN_BM][XTE_ATTN_KC];
  __shared__ float sL[XTE_ATTN_BM], sC[XTE_ATTN_BM], sD[XTE_ATTN_BM];
  __shared__ int64_t slo[XTE_ATTN_BM], shi[XTE_ATTN_BM];
  __shared__ int sact[XTE_ATTN_BM];
  const int tid = (int)threadIdx.x;
  /* the block: (b, hk, kb, quarter) from blockIdx.x = ((b * hkv + hk) * nkb + kb) * 4 + quarter,
   * or with a work list from blockIdx.x = (global key block * 4 + quarter) * hkv + hk (below
   * 2^31: 32-bit steps) */
  int64_t quarter, kb, hk, b;
  if (kvoff) {
    const uint32_t hkv = (uint32_t)a.hkv, g = blockIdx.x / hkv;
    hk = (int64_t)(blockIdx.x - g * hkv);
    quarter = (int64_t)(g % (BN / KC));
    b = xte_attn_work_seq(kvoff, a.batch, (int64_t)(g / (BN / KC)));
    kb = (int64_t)(g / (BN / KC)) - kvoff[b];
  } else {
    const int64_t rest = (int64_t)blockIdx.x / (BN / KC), bh = rest / nkb;
    quarter = (int64_t)blockIdx.x % (BN / KC);
    kb = rest % nkb;
    hk = bh % a.hkv;
    b = bh / a.hkv;
  }
  const int64_t G = a.hq / a.hkv;
  const int64_t dq = a.dqk, dv = a.dv;
  int64_t qt0, lq, kt0, lkv;
  xte_attn_seq(a, 0, b, &qt0, &lq);
  xte_attn_seq(a, 1, b, &kt0, &lkv);
  const int64_t j0 = kb * BN, k0 = quarter * KC;
  if (j0 >= lkv) return;
  const int64_t nb = xte_attn_min(BN, lkv - j0), kc = xte_attn_min(KC, nb - k0);
  if (kc <= 0) return;
  const int64_t off = lkv - lq;
  for (int64_t e = tid; e < KC * dq; e += blockDim.x) sK[e / dq][e % dq] = 0.0f;
  for (int64_t e = tid; e < KC * dv; e += blockDim.x) sV[e / dv][e % dv] = 0.0f;
  /* no query rows: no query heads to visit (G may be 2^31 when dQ is empty) */
  for (int64_t g = 0; g < (lq > 0 ? G : 0); g++) {
    const int64_t h = hk * G + g;
    const xte_attn_score sp = xte_attn_score_for(a, b, h, NULL);
    for (int64_t i0 = 0; i0 < lq; i0 += BM) {
      const int64_t nr = xte_attn_min(BM, lq - i0);
      __syncthreads(); /* the previous tile's sP, sDS, sact are read */
      for (int r = tid; r < BM; r += (int)blockDim.x) {
        int64_t lo = 0, hi = 0;
        int act = 0;
        if (r < nr) {
          xte_attn_row_range(i0 + r, lq, lkv, a.mask, a.window_left, a.window_right, &lo, &hi);
          act = xte_attn_max(lo, j0) < xte_attn_min(hi, j0 + nb);
        }
        slo[r] = lo;
        shi[r] = hi;
        sact[r] = act;
        if (act) {
          const int64_t li = xte_attn_loff(a, b, qt0 + i0 + r, h);
          sL[r] = a.lse[li];
          sC[r] = Cbuf[li];
          sD[r] = Dbuf[li];
        }
      }
      __syncthreads();
      int any = 0;
      for (int r = 0; r < nr; r++) any |= sact[r];
      if (!any) continue; /* uniform */
      /* p and dS of (row r, key k0 + jj) */
      for (int e = tid; e < BM * KC; e += (int)blockDim.x) {
        const int r = e / KC, jj = e % KC;
        if (r >= nr || !sact[r] || jj >= kc) continue;
        const int64_t j = k0 + jj; /* in the 64-key block */
        const float s = xte_attn_dot(
            xte_attn_ptr(a.q, a.dtype, xte_attn_eoff(a.q, b, qt0 + i0 + r, h)),
            xte_attn_ptr(a.k, a.dtype, xte_attn_eoff(a.k, b, kt0 + j0 + j, hk)), a.dtype, dq);
        const float dp = xte_attn_dot(
            xte_attn_ptr(a.dout, a.dtype, xte_attn_eoff(a.dout, b, qt0 + i0 + r, h)),
            xte_attn_ptr(a.v, a.dtype, xte_attn_eoff(a.v, b, kt0 + j0 + j, hk)), a.dtype, dv);
        float x = xte_attn_neg_inf();
        if (j0 + j >= slo[r] && j0 + j < shi[r])
          x = xte_attn_logit(s, &sp, i0 + r + off - (j0 + j));
        const float p = xte_attn_exp(x - sL[r], sC[r]);
        sP[r][jj] = p;
        sDS[r][jj] = xte_attn_ds(p, dp, sD[r], sp.softcap ? xte_attn_dlogit(s, &sp) : sp.scale);
      }
      __syncthreads();
      /* the tile's parts: chains over its active rows in order from +0, added to the sums */
      for (int64_t e = tid; e < kc * (dq + dv); e += blockDim.x) {
        const int jj = (int)(e / (dq + dv));
        const int64_t c = e % (dq + dv);
        float part = 0.0f;
        if (c < dv) {
          XTE_ATTN_NO_UNROLL
          for (int r = 0; r < nr; r++)
            if (sact[r])
              part = xte_fmaf(
                  sP[r][jj],
                  xte_attn_ld(a.dout.data, a.dtype, xte_attn_eoff(a.dout, b, qt0 + i0 + r, h) + c),
                  part);
          sV[jj][c] = xte_attn_add(sV[jj][c], part);
        } else {
          const int64_t cq = c - dv;
          XTE_ATTN_NO_UNROLL
          for (int r = 0; r < nr; r++)
            if (sact[r])
              part = xte_fmaf(
                  sDS[r][jj],
                  xte_attn_ld(a.q.data, a.dtype, xte_attn_eoff(a.q, b, qt0 + i0 + r, h) + cq),
                  part);
          sK[jj][cq] = xte_attn_add(sK[jj][cq], part);
        }
      }
    }
  }
  __syncthreads();
  for (int64_t e = tid; e < kc * dq; e += blockDim.x) {
    const int64_t jj = e / dq, c = e % dq;
    xte_attn_st(a.dk.data, a.dtype, xte_attn_eoff(a.dk, b, kt0 + j0 + k0 + jj, hk) + c, sK[jj][c]);
  }
  for (int64_t e = tid; e < kc * dv; e += blockDim.x) {
    const int64_t jj = e / dv, c = e % dv;
    xte_attn_st(a.dv_.data, a.dtype, xte_attn_eoff(a.dv_, b, kt0 + j0 + k0 + jj, hk) + c,
                sV[jj][c]);
  }
}

/* ---------------------------------------------------------------- host steps
 * RT: xte_status alloc(void **, size_t), void release(void *), xte_status read(void *host,
 * const void *dev, size_t), template launch(int64_t grid, kernel, args...) (XTE_ATTN_NT threads),
 * xte_status finish(), and svc (the core's set_error). */

/* Checks the cu_seqlens (device memory) as the CPU does and gives the longest sequences; with
 * cu_seqlens also the work lists (*lists: qoff [batch + 1] then kvoff [batch + 1], device memory
 * the caller releases; *nq / *nkv their totals). */
template <class RT>
xte_status xte_attn_prepare(RT &rt, const xte_attn_args *a, int64_t *mq, int64_t *mkv,
                            int64_t **lists, int64_t *nq, int64_t *nkv) {
  *mq = a->sq;
  *mkv = a->skv;
  *lists = nullptr;
  if (!a->packed && !a->cu_q) return XTE_SUCCESS;
  int64_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tot[2] = {0, 0};
  void *dv = nullptr, *dl = nullptr;
  size_t lbytes;
  if (__builtin_mul_overflow((size_t)a->batch + 1, 2 * sizeof(int64_t), &lbytes))
    return rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "attention: work list size overflows");
  XTE_ATTN_TRY(rt.alloc(&dv, sizeof v + 4 * sizeof(unsigned long long)));
  unsigned long long *w = (unsigned long long *)((char *)dv + sizeof v);
  int64_t grid = (a->batch + XTE_ATTN_NT - 1) / XTE_ATTN_NT;
  if (grid > XTE_ATTN_GRID_CAP) grid = XTE_ATTN_GRID_CAP;
  xte_status st = rt.launch(1, xte_attn_check_init, w);
  if (st == XTE_SUCCESS && grid > 0) st = rt.launch(grid, xte_attn_check_scan, *a, w);
  if (st == XTE_SUCCESS)
    st = rt.launch(1, xte_attn_check_kernel, *a, (const unsigned long long *)w, (int64_t *)dv);
  if (st == XTE_SUCCESS) st = rt.read(v, dv, sizeof v);
  rt.release(dv);
  XTE_ATTN_TRY(st);
  const char *name = v[1] ? "cu_seqlens_kv" : "cu_seqlens_q";
  switch (v[0]) {
    case 1:
      return rt.svc->set_error(XTE_ERROR_INVALID_ARGUMENT, "config->%s[0] = %d is negative", name,
                               (int)v[3]);
    case 2:
      return rt.svc->set_error(XTE_ERROR_INVALID_ARGUMENT,
                               "config->%s is not non-decreasing: [%lld] = %d > [%lld] = %d", name,
                               (long long)v[2], (int)v[3], (long long)(v[2] + 1), (int)v[4]);
    case 3:
      return rt.svc->set_error(
          XTE_ERROR_SHAPE, "config->%s: sequence %lld has length %lld > %s %lld", name,
          (long long)v[2], (long long)v[3], a->packed ? "the max_seqlen" : "the padded length s",
          (long long)v[4]);
    case 4:
      return rt.svc->set_error(XTE_ERROR_SHAPE,
                               "config->%s[%lld] = %d is beyond the tensor's %lld tokens", name,
                               (long long)a->batch, (int)v[3], (long long)v[4]);
    default:
      break;
  }
  *mq = v[5];
  *mkv = v[6];
  if (a->no_output || a->batch <= 0) return XTE_SUCCESS;
  XTE_ATTN_TRY(rt.alloc(&dl, lbytes));
  int64_t *qoff = (int64_t *)dl, *kvoff = qoff + a->batch + 1;
  st = rt.launch(1, xte_attn_work_scan, *a, qoff, kvoff);
  if (st == XTE_SUCCESS) st = rt.read(&tot[0], qoff + a->batch, sizeof(int64_t));
  if (st == XTE_SUCCESS) st = rt.read(&tot[1], kvoff + a->batch, sizeof(int64_t));
  if (st != XTE_SUCCESS) {
    rt.release(dl);
    return st;
  }
  *lists = qoff;
  *nq = tot[0];
  *nkv = tot[1];
  return XTE_SUCCESS;
}

/* grid = x * y * z blocks, refused past 2^31 - 1 */
inline xte_status xte_attn_grid(const xte_core_services *svc, int64_t x, int64_t y, int64_t z,
                                int64_t *grid) {
  int64_t g;
  if (__builtin_mul_overflow(x, y, &g) || __builtin_mul_overflow(g, z, &g) || g > 0x7FFFFFFF)
    return svc->set_error(
        XTE_ERROR_UNSUPPORTED,
        "attention: more than 2^31 - 1 thread blocks (sequences x heads x tiles)");
  *grid = g;
  return XTE_SUCCESS;
}

/* The padding kernel over npos positions x heads (grid-stride, capped grid). */
template <class RT>
xte_status xte_attn_pad(RT &rt, const xte_attn_args *a, int kv, int fwd) {
  if (!a->packed && !a->cu_q) return XTE_SUCCESS;
  const int64_t npos =
      a->packed ? (kv ? a->total_kv : a->total_q) : a->batch * (kv ? a->skv : a->sq);
  const int64_t n = npos * (kv ? a->hkv : a->hq);
  if (n <= 0) return XTE_SUCCESS;
  int64_t grid = (n + XTE_ATTN_NT - 1) / XTE_ATTN_NT;
  if (grid > XTE_ATTN_GRID_CAP) grid = XTE_ATTN_GRID_CAP;
  return rt.launch(grid, xte_attn_pad_kernel, *a, kv, fwd);
}

template <class RT>
xte_status xte_attn_fwd_run(RT &rt, const xte_attn_args *a) {
  int64_t mq, mkv, grid = 0, nq = 0, nkv = 0, *lists = nullptr;
  XTE_ATTN_TRY(xte_attn_prepare(rt, a, &mq, &mkv, &lists, &nq, &nkv));
  if (a->no_output) return XTE_SUCCESS;
  const int64_t ntile = (mq + XTE_ATTN_R - 1) / XTE_ATTN_R;
  xte_status st = lists ? xte_attn_grid(rt.svc, nq, a->hq, 1, &grid)
                        : xte_attn_grid(rt.svc, a->batch, a->hq, ntile, &grid);
  if (st == XTE_SUCCESS) st = xte_attn_pad(rt, a, 0, 1);
  if (st == XTE_SUCCESS && grid > 0)
    st = rt.launch(grid, xte_attn_fwd_kernel, *a, ntile, (const int64_t *)lists);
  if (st == XTE_SUCCESS) st = rt.finish();
  if (lists) rt.release(lists);
  return st;
}

template <class RT>
xte_status xte_attn_bwd_run(RT &rt, const xte_attn_args *a) {
  int64_t mq, mkv, gq = 0, gkv = 0, nl = 0, nq = 0, nkv = 0, *lists = nullptr;
  size_t bytes = 0;
  XTE_ATTN_TRY(xte_attn_prepare(rt, a, &mq, &mkv, &lists, &nq, &nkv));
  if (a->no_output) return XTE_SUCCESS;
  const int64_t ntile = (mq + XTE_ATTN_R - 1) / XTE_ATTN_R;
  const int64_t nkb = (mkv + XTE_ATTN_BN - 1) / XTE_ATTN_BN;
  const int64_t *qoff = lists, *kvoff = lists ? lists + a->batch + 1 : nullptr;
  void *ws = nullptr;
  xte_status st = lists ? xte_attn_grid(rt.svc, nq, a->hq, 1, &gq)
                        : xte_attn_grid(rt.svc, a->batch, a->hq, ntile, &gq);
  if (st == XTE_SUCCESS)
    st = lists ? xte_attn_grid(rt.svc, nkv, a->hkv, XTE_ATTN_BN / XTE_ATTN_KC, &gkv)
               : xte_attn_grid(rt.svc, a->batch * a->hkv, nkb, XTE_ATTN_BN / XTE_ATTN_KC, &gkv);
  /* D and corr, indexed like the LSE: allocated before the first output byte */
  if (st == XTE_SUCCESS &&
      (__builtin_mul_overflow(a->packed ? a->total_q : a->batch * a->sq, a->hq, &nl) ||
       __builtin_mul_overflow((size_t)nl * 2 + 16, sizeof(float), &bytes)))
    st = rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "attention: D buffer size overflows");
  if (st == XTE_SUCCESS) st = rt.alloc(&ws, bytes);
  if (st != XTE_SUCCESS) {
    if (lists) rt.release(lists);
    return st;
  }
  float *Dbuf = (float *)ws, *Cbuf = Dbuf + nl;
  st = xte_attn_pad(rt, a, 0, 0);
  if (st == XTE_SUCCESS) st = xte_attn_pad(rt, a, 1, 0);
  if (st == XTE_SUCCESS && gq > 0)
    st = rt.launch(gq, xte_attn_dq_kernel, *a, ntile, qoff, Dbuf, Cbuf);
  if (st == XTE_SUCCESS && gkv > 0)
    st = rt.launch(gkv, xte_attn_dkv_kernel, *a, nkb, kvoff, (const float *)Dbuf,
                   (const float *)Cbuf);
  if (st == XTE_SUCCESS) st = rt.finish();
  rt.release(ws);
  if (lists) rt.release(lists);
  return st;
}

#endif /* XTE_ATTENTION_KERNELS_CUH */
