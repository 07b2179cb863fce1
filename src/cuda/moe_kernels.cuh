/* The MoE token-movement kernels of the CUDA plugin (permute, unpermute and their backwards) and
 * the host steps that drive them, written against a small runtime policy RT (allocation, memset,
 * device-to-host read, launch, error reporting): no runtime call appears here. src/cuda/moe.cu
 * instantiates the driver with the CUDA runtime; tests/simt/simt_plugin.cpp with the host SIMT
 * runner (simt.h), so the same text is checked byte for byte against the CPU backend there.
 *
 * The contract is the CPU backend's bytes (src/cpu/moe_permute.c, docs/numerics.md "Token
 * movement"):
 *  - every data-dependent check (expert index out of range, an expert twice in a token, a token
 *    routed to more experts than row_map has columns, a bad row_map entry) runs in validation
 *    kernels that write only device workspace; the host reads their verdict back (the first bad
 *    token / slot in the CPU's scan order, found with integer atomicMin, whose result does not
 *    depend on the order of the atomics) and, on an error, re-derives the CPU's message from that
 *    one row; only then are the write kernels launched;
 *  - the row map is the CPU's: expert-major, tokens ascending within an expert, ranks from
 *    per-chunk counts (each chunk of tokens counted by one thread, scanned per expert in chunk
 *    order: no atomics);
 *  - the unpermute sums in slot order with xte_fma_nanprop from +0 (one thread per output element,
 *    the CPU's chain exactly); the unpermute backward's dot products run over h ascending by one
 *    thread per slot. No floating-point atomics anywhere;
 *  - rows move with 16-byte accesses when both rows and the row length are 16-byte aligned;
 *  - nothing depends on the warp size (block-wide steps go through shared memory). */
#ifndef XTE_MOE_KERNELS_CUH
#define XTE_MOE_KERNELS_CUH

#include <stdint.h>

#include "numerics/xte_math.h"
#include "numerics/xte_moe_numerics.h"
#include "xte_backend.h"
#include "xte_moe_ops.h"

#define XTE_MOE_NT 256            /* threads per block */
#define XTE_MOE_GRID_CAP 65535    /* blocks of a grid-stride launch */
#define XTE_MOE_CNT_CAP (1 << 22) /* chunk x expert counters of the rank pass */
#define XTE_MOE_NONE 0xFFFFFFFFFFFFFFFFull

typedef unsigned long long xte_moe_u64;

/* Loops kept rolled (their unrolled forms make ptxas spill); nothing for the host runner. */
#if defined(__CUDACC__) || defined(__MUSACC__)
#define XTE_MOE_NO_UNROLL _Pragma("unroll 1")
#else
#define XTE_MOE_NO_UNROLL
#endif

#define XTE_MOE_TRY(expr)                             \
  do {                                                \
    xte_status xte_moe_s_ = (expr);                   \
    if (xte_moe_s_ != XTE_SUCCESS) return xte_moe_s_; \
  } while (0)

/* ---------------------------------------------------------------- small helpers */

__host__ __device__ __forceinline__ int64_t xte_moe_esize(int dtype) {
  switch (dtype) {
    case XTE_DTYPE_FP32:
    case XTE_DTYPE_INT32:
      return 4;
    case XTE_DTYPE_FP16:
    case XTE_DTYPE_BF16:
      return 2;
    case XTE_DTYPE_INT64:
    case XTE_DTYPE_FP64:
      return 8;
    default:
      return 1;
  }
}

__device__ __forceinline__ int64_t xte_moe_idx_at(const xte_moe_view &v, int64_t t, int64_t j) {
  return v.dtype == XTE_DTYPE_INT32 ? (int64_t)((const int32_t *)v.data)[t * v.ld + j]
                                    : ((const int64_t *)v.data)[t * v.ld + j];
}

/* fp32 / bf16 / fp16 elements as fp32 (exact), and fp32 rounded (RNE) into them. */
__device__ __forceinline__ float xte_moe_load(const xte_moe_view &v, int64_t row, int64_t h) {
  if (v.dtype == XTE_DTYPE_FP32) return ((const float *)v.data)[row * v.ld + h];
  if (v.dtype == XTE_DTYPE_BF16) return xte_bf16_to_f32(((const uint16_t *)v.data)[row * v.ld + h]);
  return xte_fp16_to_f32(((const uint16_t *)v.data)[row * v.ld + h]);
}

__device__ __forceinline__ void xte_moe_store(const xte_moe_view &v, int64_t row, int64_t h,
                                              float x) {
  if (v.dtype == XTE_DTYPE_FP32)
    ((float *)v.data)[row * v.ld + h] = x;
  else if (v.dtype == XTE_DTYPE_BF16)
    ((uint16_t *)v.data)[row * v.ld + h] = xte_f32_to_bf16(x);
  else
    ((uint16_t *)v.data)[row * v.ld + h] = xte_f32_to_fp16(x);
}

/* n bytes from src to dst (src NULL: zeros) by the threads of the block: 16-byte accesses when
 * dst, src and n are 16-byte aligned, else 4-byte, else bytes. */
__device__ __forceinline__ void xte_moe_block_copy(char *dst, const char *src, size_t n) {
  const uintptr_t al = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)n;
  size_t i;
  if ((al & 15) == 0) {
    for (i = threadIdx.x; i < n / 16; i += blockDim.x) {
      uint4 v = src ? ((const uint4 *)src)[i] : make_uint4(0, 0, 0, 0);
      ((uint4 *)dst)[i] = v;
    }
  } else if ((al & 3) == 0) {
    for (i = threadIdx.x; i < n / 4; i += blockDim.x)
      ((uint32_t *)dst)[i] = src ? ((const uint32_t *)src)[i] : 0u;
  } else {
    for (i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src ? src[i] : (char)0;
  }
}

/* ---------------------------------------------------------------- routing */

/* The expert of every slot (T x K, -1 none). A token the CPU's route_slots would reject gets
 * every slot -1 and its index goes into *bad (atomicMin: the first bad token). */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_route_kernel(xte_moe_route r, int32_t *slots, xte_moe_u64 *bad) {
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < r.T;
       t += (int64_t)gridDim.x * blockDim.x) {
    int32_t *st = slots + t * r.K;
    int ok = 1;
    int64_t j, n = 0;
    if (r.map.data) {
      const uint8_t *m = (const uint8_t *)r.map.data + t * r.map.ld;
      for (int64_t e = 0; e < r.E && ok; e++) {
        if (!m[e]) continue;
        if (n == r.K)
          ok = 0;
        else
          st[n++] = (int32_t)e;
      }
    } else {
      for (j = 0; j < r.K && ok; j++) {
        const int64_t v = xte_moe_idx_at(r.idx, t, j);
        if (v < -1 || v >= r.E) ok = 0;
        for (int64_t i = 0; i < j && v >= 0 && ok; i++)
          if (st[i] == v) ok = 0;
        if (ok) st[j] = (int32_t)v;
      }
      n = ok ? r.K : 0;
    }
    if (!ok) {
      n = 0;
      atomicMin(bad, (xte_moe_u64)t);
    }
    for (; n < r.K; n++) st[n] = -1;
  }
}

/* ---------------------------------------------------------------- permute */

/* cnt[c][e]: slots of chunk c (tokens [c TB, (c + 1) TB)) routed to e; one thread per chunk
 * (cnt zeroed before). */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_chunk_count(const int32_t *slots, int64_t T, int64_t K, int64_t E, int64_t TB,
                        int64_t NC, int32_t *cnt) {
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < NC;
       c += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t1 = (c + 1) * TB < T ? (c + 1) * TB : T;
    int32_t *row = cnt + c * E;
    for (int64_t p = c * TB * K; p < t1 * K; p++)
      if (slots[p] >= 0) row[slots[p]]++;
  }
}

/* Per expert: cnt[c][e] becomes the rank of chunk c's first slot within e (exclusive prefix over
 * the chunks), count[e] the total. */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_expert_scan(int32_t *cnt, int64_t NC, int64_t E, int64_t *count) {
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < E;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t run = 0;
    for (int64_t c = 0; c < NC; c++) {
      const int32_t v = cnt[c * E + e];
      cnt[c * E + e] = (int32_t)run;
      run += v;
    }
    count[e] = run;
  }
}

/* k rounded up to a multiple of align (k >= 0, 1 <= align <= 2^20), exactly: the quotient from
 * k times inv = 1 / align (fp64, from the host), then corrected with integer multiplications (no
 * division on the device: a 64-bit or fp64 division is a subroutine call that makes ptxas
 * spill). */
__host__ __device__ __forceinline__ int64_t xte_moe_roundup(int64_t k, int64_t align, double inv) {
  if (align <= 1) return k;
  int64_t q = (int64_t)((double)k * inv);
  while (q > 0 && q * align > k) q--;
  while ((q + 1) * align <= k) q++;
  return q * align == k ? k : (q + 1) * align;
}

/* Exclusive prefix sum over the block: each thread gives the sum of its range and gets the sum
 * of the ranges before it (.before) and of all of them (.total). sh holds XTE_MOE_NT + 1 int64. */
struct xte_moe_scan {
  int64_t before, total;
};
__device__ __forceinline__ xte_moe_scan xte_moe_block_exscan(int64_t v, int64_t *sh) {
  xte_moe_scan r;
  sh[threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t run = 0;
    for (unsigned i = 0; i < blockDim.x; i++) {
      const int64_t x = sh[i];
      sh[i] = run;
      run += x;
    }
    sh[blockDim.x] = run;
  }
  __syncthreads();
  r.before = sh[threadIdx.x];
  r.total = sh[blockDim.x];
  __syncthreads();
  return r;
}

/* One block: kept[e] (the cap applied to the unpadded expert-major positions), poff[0..E]
 * (padded offsets), out[0] = R. Each thread owns a contiguous range of experts. */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_offsets(const int64_t *count, int64_t E, int64_t cap, int64_t align, double inv_align,
                    int64_t *kept, int64_t *poff, int64_t *R_out) {
  __shared__ int64_t sh[XTE_MOE_NT + 1];
  /* E <= XTE_MOE_MAX_EXPERTS (2^20): 32-bit arithmetic */
  const int64_t per = (int64_t)(((unsigned)E + blockDim.x - 1) / blockDim.x);
  const int64_t e0 = (int64_t)threadIdx.x * per < E ? (int64_t)threadIdx.x * per : E;
  const int64_t e1 = e0 + per < E ? e0 + per : E;
  int64_t s = 0, e;
  XTE_MOE_NO_UNROLL
  for (e = e0; e < e1; e++) s += count[e];
  int64_t uoff = xte_moe_block_exscan(s, sh).before;
  s = 0;
  XTE_MOE_NO_UNROLL
  for (e = e0; e < e1; e++) {
    int64_t k = count[e];
    if (cap >= 0) {
      const int64_t room = cap - uoff;
      k = room < 0 ? 0 : (room < k ? room : k);
    }
    kept[e] = k;
    uoff += count[e];
    s += xte_moe_roundup(k, align, inv_align);
  }
  const xte_moe_scan sc = xte_moe_block_exscan(s, sh);
  int64_t off = sc.before;
  XTE_MOE_NO_UNROLL
  for (e = e0; e < e1; e++) {
    poff[e] = off;
    off += xte_moe_roundup(kept[e], align, inv_align);
  }
  if (threadIdx.x == 0) {
    poff[E] = sc.total;
    *R_out = sc.total;
  }
}

/* The row map: one thread per chunk walks its tokens in order, the chunk's counters (from
 * xte_moe_expert_scan) as cursors. */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_row_map(const int32_t *slots, int64_t T, int64_t K, int64_t E, int64_t TB, int64_t NC,
                    int32_t *cnt, const int64_t *kept, const int64_t *poff, xte_moe_view rmv) {
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < NC;
       c += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t1 = (c + 1) * TB < T ? (c + 1) * TB : T;
    int32_t *cur = cnt + c * E;
    for (int64_t t = c * TB; t < t1; t++) {
      int32_t *rm = (int32_t *)rmv.data + t * rmv.ld;
      for (int64_t j = 0; j < K; j++) {
        const int32_t ex = slots[t * K + j];
        if (ex < 0) {
          rm[j] = -1;
          continue;
        }
        const int64_t rank = cur[ex]++;
        rm[j] = rank < kept[ex] ? (int32_t)(poff[ex] + rank) : -1;
      }
    }
  }
}

/* The rows (and fp8 scale rows) of every kept slot; one block per token. */
__global__ void __launch_bounds__(XTE_MOE_NT) xte_moe_move_rows(xte_permute_args a) {
  const size_t es = (size_t)xte_moe_esize(a.in.dtype), rb = (size_t)a.in.cols * es;
  const size_t ss = a.in_s.data ? (size_t)xte_moe_esize(a.in_s.dtype) : 0;
  const size_t sb = (size_t)a.in_s.cols * ss;
  for (int64_t t = blockIdx.x; t < a.r.T; t += gridDim.x) {
    const int32_t *rm = (const int32_t *)a.row_map.data + t * a.row_map.ld;
    for (int64_t j = 0; j < a.r.K; j++) {
      const int64_t row = rm[j];
      if (row < 0) continue;
      xte_moe_block_copy((char *)a.out.data + (size_t)row * (size_t)a.out.ld * es,
                         (const char *)a.in.data + (size_t)t * (size_t)a.in.ld * es, rb);
      if (ss)
        xte_moe_block_copy((char *)a.out_s.data + (size_t)row * (size_t)a.out_s.ld * ss,
                           (const char *)a.in_s.data + (size_t)t * (size_t)a.in_s.ld * ss, sb);
    }
  }
}

/* Zero rows: each expert's padding (block x < E) and the rows past R (blocks >= E, strided). */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_zero_rows(xte_permute_args a, const int64_t *kept, const int64_t *poff, int64_t R) {
  const size_t es = (size_t)xte_moe_esize(a.in.dtype), rb = (size_t)a.in.cols * es;
  const size_t ss = a.in_s.data ? (size_t)xte_moe_esize(a.in_s.dtype) : 0;
  const size_t sb = (size_t)a.in_s.cols * ss;
  const int64_t E = a.r.E;
  for (int64_t x = blockIdx.x; x < E + (a.out.rows - R); x += gridDim.x) {
    const int64_t r0 = x < E ? poff[x] + kept[x] : R + (x - E);
    const int64_t r1 = x < E ? poff[x + 1] : r0 + 1;
    for (int64_t row = r0; row < r1; row++) {
      xte_moe_block_copy((char *)a.out.data + (size_t)row * (size_t)a.out.ld * es, NULL, rb);
      if (ss)
        xte_moe_block_copy((char *)a.out_s.data + (size_t)row * (size_t)a.out_s.ld * ss, NULL, sb);
    }
  }
}

/* expert_offsets, tokens_per_expert, row_to_expert (the optional outputs). */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_extra(xte_permute_args a, const int64_t *kept, const int64_t *poff) {
  const int64_t E = a.r.E, R = poff[E];
  /* past E + 1 only row_to_expert (data of out.rows entries) has work: an empty [2^40, 0]
   * output with only the offsets asked for must not stride through its rows */
  const int64_t rows = a.row_to_expert.data ? a.out.rows : 0;
  const int64_t n = E + 1 > rows ? E + 1 : rows;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    if (a.offsets.data && i <= E) ((int64_t *)a.offsets.data)[i] = poff[i];
    if (a.tpe.data && i < E) {
      if (a.tpe.dtype == XTE_DTYPE_INT32)
        ((int32_t *)a.tpe.data)[i] = (int32_t)kept[i];
      else
        ((int64_t *)a.tpe.data)[i] = kept[i];
    }
    if (a.row_to_expert.data && i < a.out.rows) {
      int32_t ex = -1;
      if (i < R) { /* the e with poff[e] <= i < poff[e + 1] */
        int64_t lo = 0, hi = E - 1;
        while (lo < hi) {
          const int64_t mid = lo + (hi - lo + 1) / 2;
          if (poff[mid] <= i)
            lo = mid;
          else
            hi = mid - 1;
        }
        ex = i < poff[lo] + kept[lo] ? (int32_t)lo : -1;
      }
      ((int32_t *)a.row_to_expert.data)[i] = ex;
    }
  }
}

/* ---------------------------------------------------------------- row map checks */

/* The table of the row map checks: first[v], the first slot (t K + j, scan order) whose entry is
 * the valid row v. Direct (keys NULL: entry v) when the rows are few (at most twice the T K
 * slots); else an open-addressing hash table of 2^lg entries (at least twice the slots, so it
 * never fills) keyed by v (keys[i] == XTE_MOE_NONE: empty), so that the workspace grows with the
 * slots and never with the rows (an empty [2^31, 0] input costs nothing). */
__device__ __forceinline__ xte_moe_u64 *xte_moe_rm_entry(xte_moe_u64 *first, xte_moe_u64 *keys,
                                                         int lg, int64_t v, int insert) {
  if (!keys) return first + v;
  const xte_moe_u64 mask = ((xte_moe_u64)1 << lg) - 1, key = (xte_moe_u64)v;
  xte_moe_u64 i = lg ? ((key * 0x9E3779B97F4A7C15ull) >> (64 - lg)) : 0;
  for (;;) {
    const xte_moe_u64 k = insert ? atomicCAS(keys + i, (xte_moe_u64)XTE_MOE_NONE, key) : keys[i];
    if (k == key || (insert && k == (xte_moe_u64)XTE_MOE_NONE)) return first + i;
    if (!insert && k == (xte_moe_u64)XTE_MOE_NONE) return NULL; /* not there */
    i = (i + 1) & mask;
  }
}

/* Fills the table: one thread per token. */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_rm_first(xte_moe_view rmv, const int32_t *slots, int64_t T, int64_t K, int64_t rows,
                     xte_moe_u64 *first, xte_moe_u64 *keys, int lg) {
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < T;
       t += (int64_t)gridDim.x * blockDim.x) {
    const int32_t *rm = (const int32_t *)rmv.data + t * rmv.ld;
    XTE_MOE_NO_UNROLL
    for (int64_t j = 0; j < K; j++) {
      const int64_t v = rm[j];
      if (v < 0 || v >= rows || slots[t * K + j] < 0) continue;
      atomicMin(xte_moe_rm_entry(first, keys, lg, v, 1), (xte_moe_u64)(t * K + j));
    }
  }
}

/* *bad: the first slot whose entry the CPU's check_row_map rejects (out of range, on a slot with
 * no expert, or a row an earlier slot maps). One thread per token. */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_rm_check(xte_moe_view rmv, const int32_t *slots, int64_t T, int64_t K, int64_t rows,
                     xte_moe_u64 *first, xte_moe_u64 *keys, int lg, xte_moe_u64 *bad) {
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < T;
       t += (int64_t)gridDim.x * blockDim.x) {
    const int32_t *rm = (const int32_t *)rmv.data + t * rmv.ld;
    XTE_MOE_NO_UNROLL
    for (int64_t j = 0; j < K; j++) {
      const int64_t v = rm[j], p = t * K + j;
      if (v == -1) continue;
      const xte_moe_u64 *f =
          v < 0 || v >= rows || slots[p] < 0 ? NULL : xte_moe_rm_entry(first, keys, lg, v, 0);
      if (!f || *f != (xte_moe_u64)p) {
        atomicMin(bad, (xte_moe_u64)p);
        break;
      }
    }
  }
}

/* ---------------------------------------------------------------- unpermute */

__device__ __forceinline__ float xte_moe_weight(const xte_unpermute_args &a, const int32_t *slots,
                                                int64_t t, int64_t j) {
  if (!a.probs.data) return 1.0f;
  const float *p = (const float *)a.probs.data + t * a.probs.ld;
  return a.probs_dense ? p[slots[t * a.r.K + j]] : p[j];
}

/* out[t][h] = fmaf chain over the slots in ascending j, from +0; one block per token. */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_unpermute_fwd(xte_unpermute_args a, const int32_t *slots) {
  const int64_t K = a.r.K, H = a.in.cols;
  for (int64_t t = blockIdx.x; t < a.out.rows; t += gridDim.x) {
    const int32_t *rm = (const int32_t *)a.row_map.data + t * a.row_map.ld;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
      float acc = 0.0f;
      for (int64_t j = 0; j < K; j++) {
        const int64_t row = rm[j];
        if (row < 0) continue;
        acc = xte_fma_nanprop(xte_moe_weight(a, slots, t, j), xte_moe_load(a.in, row, h), acc);
      }
      xte_moe_store(a.out, t, h, acc);
    }
  }
}

/* Zero grad_in rows (rows no slot maps stay zero). */
__global__ void __launch_bounds__(XTE_MOE_NT) xte_moe_zero_view(xte_moe_view v) {
  const size_t es = (size_t)xte_moe_esize(v.dtype);
  for (int64_t r = blockIdx.x; r < v.rows; r += gridDim.x)
    xte_moe_block_copy((char *)v.data + (size_t)r * (size_t)v.ld * es, NULL, (size_t)v.cols * es);
}

/* grad_in[row] = fp32(w g) per slot; grad_probs[t] zeroed, then each slot's fmaf dot product over
 * h ascending (one thread per slot); one block per token. */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_unpermute_bwd(xte_unpermute_args a, const int32_t *slots) {
  const int64_t K = a.r.K, H = a.grad_out.cols;
  for (int64_t t = blockIdx.x; t < a.grad_out.rows; t += gridDim.x) {
    const int32_t *rm = (const int32_t *)a.row_map.data + t * a.row_map.ld;
    for (int64_t j = 0; j < K; j++) {
      const int64_t row = rm[j];
      if (row < 0) continue;
      const float w = xte_moe_weight(a, slots, t, j);
      for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
        xte_moe_store(a.grad_in, row, h, xte_mul_nanprop(w, xte_moe_load(a.grad_out, t, h)));
    }
    if (a.grad_probs.data) {
      float *gp = (float *)a.grad_probs.data + t * a.grad_probs.ld;
      for (int64_t e = threadIdx.x; e < a.grad_probs.cols; e += blockDim.x) gp[e] = 0.0f;
      __syncthreads();
      for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
        const int64_t row = rm[j];
        double dot = 0.0;
        if (row < 0) continue;
        for (int64_t h = 0; h < H; h++)
          dot =
              xte_dot_step_f64(dot, xte_moe_load(a.grad_out, t, h), xte_moe_load(a.fwd_in, row, h));
        gp[a.probs_dense ? slots[t * K + j] : j] = xte_f64_to_f32(dot);
      }
      __syncthreads();
    }
  }
}

/* ---------------------------------------------------------------- sort chunks */

__device__ __forceinline__ int64_t xte_moe_vec_at(const xte_moe_view &v, int64_t i) {
  return v.dtype == XTE_DTYPE_INT32 ? (int64_t)((const int32_t *)v.data)[i]
                                    : ((const int64_t *)v.data)[i];
}

/* One thread, the CPU's checks in the CPU's order (split sizes >= 0, the running sum never past
 * R, sorted_index a permutation, the sum exactly R); v[0..2] = {kind, i, value} (kind 0: fine),
 * then start[i] (first input row of chunk i) and dst[i] (its first output row). seen: n bytes,
 * zeroed before. */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_sc_validate(xte_sort_chunks_args a, int64_t R, int64_t *start, int64_t *dst,
                        uint8_t *seen, int64_t *v) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int64_t total = 0, i;
  v[0] = 0;
  for (i = 0; i < a.n; i++) {
    const int64_t sz = xte_moe_vec_at(a.split, i), x = xte_moe_vec_at(a.index, i);
    if (sz < 0 || sz > R - total) {
      v[0] = sz < 0 ? 1 : 2;
      v[1] = i;
      v[2] = sz;
      return;
    }
    if (x < 0 || x >= a.n || seen[x]) {
      v[0] = 3;
      v[1] = i;
      v[2] = x;
      return;
    }
    seen[x] = 1;
    start[i] = total;
    total += sz;
  }
  if (total != R) {
    v[0] = 4;
    v[2] = total;
    return;
  }
  total = 0;
  for (i = 0; i < a.n; i++) {
    const int64_t x = xte_moe_vec_at(a.index, i);
    dst[x] = total;
    total += xte_moe_vec_at(a.split, x);
  }
}

/* Row r of the input to its output row (chunk by binary search over start: the last chunk
 * starting at or before r, never an empty one); row_map[r] when asked. One block per row. */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_sc_rows(xte_sort_chunks_args a, const int64_t *start, const int64_t *dst) {
  const size_t es = (size_t)xte_moe_esize(a.in.dtype), rb = (size_t)a.in.cols * es;
  for (int64_t r = blockIdx.x; r < a.in.rows; r += gridDim.x) {
    int64_t lo = 0, hi = a.n - 1;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (start[mid] <= r)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int64_t m = dst[lo] + (r - start[lo]);
    if (a.row_map.data && threadIdx.x == 0) ((int32_t *)a.row_map.data)[r] = (int32_t)m;
    xte_moe_block_copy((char *)a.out.data + (size_t)m * (size_t)a.out.ld * es,
                       (const char *)a.in.data + (size_t)r * (size_t)a.in.ld * es, rb);
  }
}

/* Backward: the first row_map entry out of [0, R) into *bad. */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_sc_check(xte_moe_view m, int64_t R, xte_moe_u64 *bad) {
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < R;
       r += (int64_t)gridDim.x * blockDim.x) {
    const int32_t v = ((const int32_t *)m.data)[r];
    if (v < 0 || v >= R) atomicMin(bad, (xte_moe_u64)r);
  }
}

/* Backward: out[r] = in[row_map[r]]; one block per row. */
__global__ void __launch_bounds__(XTE_MOE_NT) xte_moe_sc_gather(xte_sort_chunks_args a) {
  const size_t es = (size_t)xte_moe_esize(a.in.dtype), rb = (size_t)a.in.cols * es;
  for (int64_t r = blockIdx.x; r < a.in.rows; r += gridDim.x) {
    const int64_t src = ((const int32_t *)a.row_map.data)[r];
    xte_moe_block_copy((char *)a.out.data + (size_t)r * (size_t)a.out.ld * es,
                       (const char *)a.in.data + (size_t)src * (size_t)a.in.ld * es, rb);
  }
}

/* ---------------------------------------------------------------- dispatch layout */

/* The first (t, j) (t k + j) with an index out of [-1, E) into *bad; one thread per token. */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_moe_dl_check(xte_dispatch_args a, xte_moe_u64 *bad) {
  const int64_t K = a.idx.cols;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < a.T;
       t += (int64_t)gridDim.x * blockDim.x)
    for (int64_t j = 0; j < K; j++) {
      const int64_t v = xte_moe_idx_at(a.idx, t, j);
      if (v < -1 || v >= a.E) {
        atomicMin(bad, (xte_moe_u64)(t * K + j));
        break;
      }
    }
}

/* One thread per token: tokens_per_expert and tokens_per_rank by integer atomicAdd (counts: the
 * result does not depend on their order), is_token_in_rank's row written whole. */
__global__ void __launch_bounds__(XTE_MOE_NT) xte_moe_dl_count(xte_dispatch_args a) {
  const int64_t K = a.idx.cols, per = a.E / a.ranks;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < a.T;
       t += (int64_t)gridDim.x * blockDim.x) {
    uint8_t *row = a.in_rank.data ? (uint8_t *)a.in_rank.data + t * a.in_rank.ld : NULL;
    if (row)
      for (int64_t r = 0; r < a.ranks; r++) row[r] = 0;
    for (int64_t j = 0; j < K; j++) {
      const int64_t v = xte_moe_idx_at(a.idx, t, j);
      if (v < 0) continue;
      if (a.tpe.data) atomicAdd((int *)a.tpe.data + v, 1);
      const int64_t rk = v / per;
      int first = 1;
      for (int64_t i = 0; i < j && first; i++) {
        const int64_t u = xte_moe_idx_at(a.idx, t, i);
        if (u >= 0 && u / per == rk) first = 0;
      }
      if (!first) continue;
      if (a.tpr.data) atomicAdd((int *)a.tpr.data + rk, 1);
      if (row) row[rk] = 1;
    }
  }
}

/* ================================================================ host driver
 * RT (the runtime policy) provides:
 *   xte_status alloc(void **p, size_t bytes);   void release(void *p);
 *   xte_status memset(void *p, int v, size_t bytes);          (stream-ordered)
 *   xte_status read(void *host, const void *dev, size_t bytes); (waits for the stream)
 *   template <class... P, class... A> xte_status launch(int64_t grid, void (*k)(P...), A...);
 *   const xte_core_services *svc;  (set_error)
 *   xte_status finish();  (launch errors; called once at the end) */

static inline int64_t xte_moe_grid(int64_t n_blocks) {
  return n_blocks < 1 ? 1 : (n_blocks < XTE_MOE_GRID_CAP ? n_blocks : XTE_MOE_GRID_CAP);
}
static inline int64_t xte_moe_grid_threads(int64_t n) {
  return xte_moe_grid((n + XTE_MOE_NT - 1) / XTE_MOE_NT);
}

/* Bytes rounded up to 256 (each workspace part starts aligned). */
static inline int xte_moe_ws_add(size_t *total, int64_t n, int64_t size, size_t *off) {
  int64_t b;
  if (n < 0 || __builtin_mul_overflow(n, size, &b) || b > ((int64_t)1 << 50)) return 0;
  *off = *total;
  *total += ((size_t)b + 255) / 256 * 256;
  return 1;
}

template <class RT>
static xte_status xte_moe_read_idx(RT &rt, const xte_moe_view *v, int64_t es, int64_t t, int64_t j,
                                   int64_t *out) {
  const char *p = (const char *)v->data + (size_t)(t * v->ld + j) * (size_t)es;
  if (es == 8) return rt.read(out, p, 8);
  int32_t v32 = 0;
  XTE_MOE_TRY(rt.read(&v32, p, 4));
  *out = v32;
  return XTE_SUCCESS;
}

/* The CPU's message for the routing of token t (rejected by xte_moe_route_kernel). */
template <class RT>
static xte_status xte_moe_route_error(RT &rt, const xte_moe_route *r, int64_t t) {
  const xte_core_services *s = rt.svc;
  if (r->map.data) {
    return s->set_error(XTE_ERROR_SHAPE,
                        "routing->routing_map row %lld routes to more than the %lld experts "
                        "row_map has columns for",
                        (long long)t, (long long)r->K);
  }
  const int64_t es = xte_moe_esize(r->idx.dtype);
  int64_t prev[64]; /* the row's first entries; later ones are read again when compared */
  for (int64_t j = 0; j < r->K; j++) {
    int64_t v = 0;
    XTE_MOE_TRY(xte_moe_read_idx(rt, &r->idx, es, t, j, &v));
    if (v < -1 || v >= r->E)
      return s->set_error(XTE_ERROR_INVALID_ARGUMENT,
                          "routing->topk_idx[%lld, %lld] = %lld: want -1 or an expert in [0, %lld)",
                          (long long)t, (long long)j, (long long)v, (long long)r->E);
    for (int64_t i = 0; i < j && v >= 0; i++) {
      int64_t u = 0;
      if (i < 64)
        u = prev[i];
      else
        XTE_MOE_TRY(xte_moe_read_idx(rt, &r->idx, es, t, i, &u));
      if (u == v)
        return s->set_error(XTE_ERROR_INVALID_ARGUMENT,
                            "routing->topk_idx row %lld lists expert %lld twice", (long long)t,
                            (long long)v);
    }
    if (j < 64) prev[j] = v;
  }
  return s->set_error(XTE_ERROR_INVALID_ARGUMENT, "routing->topk_idx row %lld is invalid",
                      (long long)t);
}

/* The CPU's message for row_map slot p (rejected by xte_moe_rm_check). */
template <class RT>
static xte_status xte_moe_rm_error(RT &rt, const xte_moe_view *rmv, const int32_t *slots, int64_t K,
                                   int64_t rows, const char *rows_name, xte_moe_u64 p) {
  const int64_t t = (int64_t)(p / (xte_moe_u64)K), j = (int64_t)(p % (xte_moe_u64)K);
  int32_t v32 = 0, slot = 0;
  XTE_MOE_TRY(rt.read(&v32, (const int32_t *)rmv->data + t * rmv->ld + j, 4));
  XTE_MOE_TRY(rt.read(&slot, slots + p, 4));
  const int64_t v = v32;
  if (v < 0 || v >= rows)
    return rt.svc->set_error(XTE_ERROR_INVALID_ARGUMENT,
                             "row_map[%lld, %lld] = %lld: want -1 or a row of %s in [0, %lld)",
                             (long long)t, (long long)j, (long long)v, rows_name, (long long)rows);
  if (slot < 0)
    return rt.svc->set_error(XTE_ERROR_INVALID_ARGUMENT,
                             "row_map[%lld, %lld] = %lld: the routing has no expert in slot %lld "
                             "of token %lld (want -1)",
                             (long long)t, (long long)j, (long long)v, (long long)j, (long long)t);
  return rt.svc->set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "row_map[%lld, %lld] = %lld: row %lld is mapped by an earlier slot too",
                           (long long)t, (long long)j, (long long)v, (long long)v);
}

template <class RT>
static xte_status xte_moe_permute_run(RT &rt, const xte_permute_args *a) {
  const int64_t T = a->r.T, E = a->r.E, K = a->r.K;
  /* chunks of TB tokens, at most XTE_MOE_CNT_CAP counters */
  int64_t TB = 16;
  if (T > 0 && E > 0 && (T + TB - 1) / TB * E > XTE_MOE_CNT_CAP)
    TB = (T + XTE_MOE_CNT_CAP / E - 1) / (XTE_MOE_CNT_CAP / E > 0 ? XTE_MOE_CNT_CAP / E : 1);
  const int64_t NC = T > 0 ? (T + TB - 1) / TB : 0;
  int64_t slots_n = 0, cnt_n = 0;
  size_t total = 0, o_err, o_slots, o_cnt, o_count, o_kept, o_poff;
  char *ws = NULL;
  xte_status st;
  if (__builtin_mul_overflow(T, K, &slots_n) || __builtin_mul_overflow(NC, E, &cnt_n) ||
      !xte_moe_ws_add(&total, 4, 8, &o_err) || !xte_moe_ws_add(&total, slots_n, 4, &o_slots) ||
      !xte_moe_ws_add(&total, cnt_n, 4, &o_cnt) || !xte_moe_ws_add(&total, E, 8, &o_count) ||
      !xte_moe_ws_add(&total, E, 8, &o_kept) || !xte_moe_ws_add(&total, E + 1, 8, &o_poff))
    return rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "permute workspace");
  XTE_MOE_TRY(rt.alloc((void **)&ws, total));
  xte_moe_u64 *err = (xte_moe_u64 *)(ws + o_err);
  int32_t *slots = (int32_t *)(ws + o_slots), *cnt = (int32_t *)(ws + o_cnt);
  int64_t *count = (int64_t *)(ws + o_count), *kept = (int64_t *)(ws + o_kept);
  int64_t *poff = (int64_t *)(ws + o_poff);
  xte_moe_u64 hv[2] = {XTE_MOE_NONE, 0};
  do {
    /* validation and sizes: workspace only */
    if ((st = rt.memset(err, 0xFF, 8)) != XTE_SUCCESS) break;
    if ((st = rt.memset(cnt, 0, (size_t)cnt_n * 4)) != XTE_SUCCESS) break;
    if (T > 0 && (st = rt.launch(xte_moe_grid_threads(T), xte_moe_route_kernel, a->r, slots,
                                 err)) != XTE_SUCCESS)
      break;
    if (NC > 0 && (st = rt.launch(xte_moe_grid_threads(NC), xte_moe_chunk_count,
                                  (const int32_t *)slots, T, K, E, TB, NC, cnt)) != XTE_SUCCESS)
      break;
    if ((st = rt.launch(xte_moe_grid_threads(E), xte_moe_expert_scan, cnt, NC, E, count)) !=
        XTE_SUCCESS)
      break;
    if ((st = rt.launch(1, xte_moe_offsets, (const int64_t *)count, E, a->cap, a->align,
                        1.0 / (double)a->align, kept, poff, (int64_t *)(err + 1))) != XTE_SUCCESS)
      break;
    if ((st = rt.read(hv, err, 16)) != XTE_SUCCESS) break;
    if (hv[0] != XTE_MOE_NONE) {
      st = xte_moe_route_error(rt, &a->r, (int64_t)hv[0]);
      break;
    }
    const int64_t R = (int64_t)hv[1];
    if (R > INT32_MAX) {
      st = rt.svc->set_error(XTE_ERROR_SHAPE,
                             "the routing needs %lld output rows: row_map (int32) holds at most %d",
                             (long long)R, INT32_MAX);
      break;
    }
    if (a->rows_out) {
      *a->rows_out = R;
      break;
    }
    if (a->out.rows < R) {
      st = rt.svc->set_error(XTE_ERROR_SHAPE,
                             "output has %lld rows: the routing needs %lld (xte_moe_permute_rows)",
                             (long long)a->out.rows, (long long)R);
      break;
    }
    /* the writes */
    if (NC > 0 && (st = rt.launch(xte_moe_grid_threads(NC), xte_moe_row_map, (const int32_t *)slots,
                                  T, K, E, TB, NC, cnt, (const int64_t *)kept,
                                  (const int64_t *)poff, a->row_map)) != XTE_SUCCESS)
      break;
    if (a->offsets.data || a->tpe.data || a->row_to_expert.data)
      if ((st = rt.launch(xte_moe_grid_threads(
                              a->row_to_expert.data && a->out.rows > E + 1 ? a->out.rows : E + 1),
                          xte_moe_extra, *a, (const int64_t *)kept, (const int64_t *)poff)) !=
          XTE_SUCCESS)
        break;
    if (T > 0 && (st = rt.launch(xte_moe_grid(T), xte_moe_move_rows, *a)) != XTE_SUCCESS) break;
    /* rows of no bytes (an empty [rows, 0] output, no scales) need no zeroing: else each block
     * strides through up to 2^40 rows of nothing */
    if ((a->in.cols > 0 || (a->in_s.data && a->in_s.cols > 0)) &&
        (st = rt.launch(xte_moe_grid(E + (a->out.rows - R)), xte_moe_zero_rows, *a,
                        (const int64_t *)kept, (const int64_t *)poff, R)) != XTE_SUCCESS)
      break;
    st = rt.finish();
  } while (0);
  rt.release(ws);
  return st;
}

/* The routing and row map checks of the unpermute and both backwards, then the kernels. */
template <class RT>
static xte_status xte_moe_unpermute_run(RT &rt, const xte_unpermute_args *a, int which) {
  const int64_t T = a->r.T, K = a->r.K;
  const int64_t rows0 = which == XTE_UNPERMUTE_FWD ? a->in.rows : a->grad_in.rows;
  const int64_t rows = rows0 < (int64_t)INT32_MAX + 1 ? rows0 : (int64_t)INT32_MAX + 1;
  int64_t slots_n = 0, tab = 0;
  int lg = 0;
  size_t total = 0, o_err, o_slots, o_first, o_keys = 0;
  char *ws = NULL;
  xte_status st;
  if (__builtin_mul_overflow(T, K, &slots_n) || !xte_moe_ws_add(&total, 2, 8, &o_err) ||
      !xte_moe_ws_add(&total, slots_n, 4, &o_slots))
    return rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "unpermute workspace");
  /* the row map table (xte_moe_rm_entry): direct for few rows, else hashed by row */
  const int hashed = slots_n < (int64_t)1 << 40 && rows > 2 * slots_n;
  if (hashed) {
    while (((int64_t)1 << lg) < 2 * slots_n) lg++;
    tab = (int64_t)1 << lg;
  } else {
    tab = rows;
  }
  if (!xte_moe_ws_add(&total, tab, 8, &o_first) ||
      (hashed && !xte_moe_ws_add(&total, tab, 8, &o_keys)))
    return rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "unpermute workspace");
  XTE_MOE_TRY(rt.alloc((void **)&ws, total));
  xte_moe_u64 *err = (xte_moe_u64 *)(ws + o_err), *first = (xte_moe_u64 *)(ws + o_first);
  xte_moe_u64 *keys = hashed ? (xte_moe_u64 *)(ws + o_keys) : NULL;
  int32_t *slots = (int32_t *)(ws + o_slots);
  xte_moe_u64 hv[2];
  do {
    if ((st = rt.memset(err, 0xFF, 16)) != XTE_SUCCESS) break;
    if ((st = rt.memset(first, 0xFF, (size_t)tab * 8)) != XTE_SUCCESS) break;
    if (keys && (st = rt.memset(keys, 0xFF, (size_t)tab * 8)) != XTE_SUCCESS) break;
    if (T > 0) {
      if ((st = rt.launch(xte_moe_grid_threads(T), xte_moe_route_kernel, a->r, slots, err)) !=
          XTE_SUCCESS)
        break;
      if ((st = rt.launch(xte_moe_grid_threads(T), xte_moe_rm_first, a->row_map,
                          (const int32_t *)slots, T, K, rows, first, keys, lg)) != XTE_SUCCESS)
        break;
      if ((st = rt.launch(xte_moe_grid_threads(T), xte_moe_rm_check, a->row_map,
                          (const int32_t *)slots, T, K, rows, first, keys, lg, err + 1)) !=
          XTE_SUCCESS)
        break;
    }
    if ((st = rt.read(hv, err, 16)) != XTE_SUCCESS) break;
    if (hv[0] != XTE_MOE_NONE) {
      st = xte_moe_route_error(rt, &a->r, (int64_t)hv[0]);
      break;
    }
    if (hv[1] != XTE_MOE_NONE) {
      st = xte_moe_rm_error(rt, &a->row_map, slots, K, rows0,
                            which == XTE_UNPERMUTE_FWD ? "the input" : "grad_input", hv[1]);
      break;
    }
    if (which == XTE_UNPERMUTE_FWD) {
      if (a->out.rows > 0 && (st = rt.launch(xte_moe_grid(a->out.rows), xte_moe_unpermute_fwd, *a,
                                             (const int32_t *)slots)) != XTE_SUCCESS)
        break;
    } else {
      /* an empty [rows, 0] grad_input has nothing to zero, however many rows it claims */
      if (a->grad_in.rows > 0 && a->grad_in.cols > 0 &&
          (st = rt.launch(xte_moe_grid(a->grad_in.rows), xte_moe_zero_view, a->grad_in)) !=
              XTE_SUCCESS)
        break;
      if (a->grad_out.rows > 0 &&
          (st = rt.launch(xte_moe_grid(a->grad_out.rows), xte_moe_unpermute_bwd, *a,
                          (const int32_t *)slots)) != XTE_SUCCESS)
        break;
    }
    st = rt.finish();
  } while (0);
  rt.release(ws);
  return st;
}

template <class RT>
static xte_status xte_moe_sort_chunks_run(RT &rt, const xte_sort_chunks_args *a) {
  const int64_t R = a->in.rows, n = a->n;
  size_t total = 0, o_err, o_start, o_dst, o_seen;
  char *ws = NULL;
  xte_status st;
  if (a->backward) {
    if (!xte_moe_ws_add(&total, 1, 8, &o_err))
      return rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "sort chunks workspace");
    XTE_MOE_TRY(rt.alloc((void **)&ws, total));
    xte_moe_u64 *bad = (xte_moe_u64 *)(ws + o_err), hv = XTE_MOE_NONE;
    do {
      if ((st = rt.memset(bad, 0xFF, 8)) != XTE_SUCCESS) break;
      if (R > 0 && (st = rt.launch(xte_moe_grid_threads(R), xte_moe_sc_check, a->row_map, R,
                                   bad)) != XTE_SUCCESS)
        break;
      if ((st = rt.read(&hv, bad, 8)) != XTE_SUCCESS) break;
      if (hv != XTE_MOE_NONE) {
        int32_t v = 0;
        if ((st = rt.read(&v, (const int32_t *)a->row_map.data + hv, 4)) != XTE_SUCCESS) break;
        st = rt.svc->set_error(XTE_ERROR_INVALID_ARGUMENT, "row_map[%lld] = %d: want [0, %lld)",
                               (long long)hv, v, (long long)R);
        break;
      }
      if (R > 0 && (st = rt.launch(xte_moe_grid(R), xte_moe_sc_gather, *a)) != XTE_SUCCESS) break;
      st = rt.finish();
    } while (0);
    rt.release(ws);
    return st;
  }
  if (R > INT32_MAX)
    return rt.svc->set_error(XTE_ERROR_SHAPE,
                             "input has %lld rows: row_map (int32) holds at most %d", (long long)R,
                             INT32_MAX);
  if (!xte_moe_ws_add(&total, 3, 8, &o_err) || !xte_moe_ws_add(&total, n, 8, &o_start) ||
      !xte_moe_ws_add(&total, n, 8, &o_dst) || !xte_moe_ws_add(&total, n, 1, &o_seen))
    return rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "sort chunks workspace");
  XTE_MOE_TRY(rt.alloc((void **)&ws, total));
  int64_t *v = (int64_t *)(ws + o_err), hv[3] = {0, 0, 0};
  int64_t *start = (int64_t *)(ws + o_start), *dst = (int64_t *)(ws + o_dst);
  do {
    if ((st = rt.memset(ws + o_seen, 0, (size_t)n)) != XTE_SUCCESS) break;
    if ((st = rt.launch(1, xte_moe_sc_validate, *a, R, start, dst, (uint8_t *)(ws + o_seen), v)) !=
        XTE_SUCCESS)
      break;
    if ((st = rt.read(hv, v, 24)) != XTE_SUCCESS) break;
    if (hv[0] == 1) {
      st = rt.svc->set_error(XTE_ERROR_INVALID_ARGUMENT, "split_sizes[%lld] = %lld is negative",
                             (long long)hv[1], (long long)hv[2]);
      break;
    }
    if (hv[0] == 2) {
      st = rt.svc->set_error(XTE_ERROR_SHAPE,
                             "split_sizes[%lld] = %lld: the sizes up to it sum past the %lld "
                             "input rows",
                             (long long)hv[1], (long long)hv[2], (long long)R);
      break;
    }
    if (hv[0] == 3) {
      st = rt.svc->set_error(XTE_ERROR_INVALID_ARGUMENT,
                             "sorted_index[%lld] = %lld: want a permutation of 0..%lld",
                             (long long)hv[1], (long long)hv[2], (long long)(n - 1));
      break;
    }
    if (hv[0] == 4) {
      st = rt.svc->set_error(XTE_ERROR_SHAPE, "split_sizes sum to %lld: input has %lld rows",
                             (long long)hv[2], (long long)R);
      break;
    }
    /* rows to move or a row map to write (else only the checks: R rows may have no bytes) */
    if (R > 0 && (a->in.cols > 0 || a->row_map.data) &&
        (st = rt.launch(xte_moe_grid(R), xte_moe_sc_rows, *a, (const int64_t *)start,
                        (const int64_t *)dst)) != XTE_SUCCESS)
      break;
    st = rt.finish();
  } while (0);
  rt.release(ws);
  return st;
}

template <class RT>
static xte_status xte_moe_dispatch_run(RT &rt, const xte_dispatch_args *a) {
  const int64_t K = a->idx.cols;
  int64_t n = 0;
  size_t total = 0, o_err;
  char *ws = NULL;
  xte_status st;
  if (__builtin_mul_overflow(a->T, K, &n) || !xte_moe_ws_add(&total, 1, 8, &o_err))
    return rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "dispatch layout workspace");
  XTE_MOE_TRY(rt.alloc((void **)&ws, total));
  xte_moe_u64 *bad = (xte_moe_u64 *)(ws + o_err), hv = XTE_MOE_NONE;
  do {
    if ((st = rt.memset(bad, 0xFF, 8)) != XTE_SUCCESS) break;
    if (n > 0 &&
        (st = rt.launch(xte_moe_grid_threads(a->T), xte_moe_dl_check, *a, bad)) != XTE_SUCCESS)
      break;
    if ((st = rt.read(&hv, bad, 8)) != XTE_SUCCESS) break;
    if (hv != XTE_MOE_NONE) {
      const int64_t t = (int64_t)(hv / (xte_moe_u64)K), j = (int64_t)(hv % (xte_moe_u64)K);
      int64_t v = 0;
      if ((st = xte_moe_read_idx(rt, &a->idx, xte_moe_esize(a->idx.dtype), t, j, &v)) !=
          XTE_SUCCESS)
        break;
      st = rt.svc->set_error(XTE_ERROR_INVALID_ARGUMENT,
                             "topk_idx[%lld, %lld] = %lld: want -1 or an expert in [0, %lld)",
                             (long long)t, (long long)j, (long long)v, (long long)a->E);
      break;
    }
    if (a->tpr.data && (st = rt.memset(a->tpr.data, 0, (size_t)a->ranks * 4)) != XTE_SUCCESS) break;
    if (a->tpe.data && (st = rt.memset(a->tpe.data, 0, (size_t)a->E * 4)) != XTE_SUCCESS) break;
    if (a->T > 0 &&
        (st = rt.launch(xte_moe_grid_threads(a->T), xte_moe_dl_count, *a)) != XTE_SUCCESS)
      break;
    st = rt.finish();
  } while (0);
  rt.release(ws);
  return st;
}

#endif /* XTE_MOE_KERNELS_CUH */
