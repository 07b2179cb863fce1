/* The MoE router kernels of the CUDA plugin (the fused top-k router forward and backward, the aux
 * scores and their backward, the aux loss forward and backward) and the host steps that drive
 * them, over the runtime policy RT of moe_kernels.cuh (no runtime call here): src/cuda/moe.cu
 * instantiates the drivers with the CUDA runtime, tests/simt/simt_plugin.cpp with the host SIMT
 * runner, which checks them byte for byte against the CPU backend
 * (tests/simt/test_simt_router.cpp).
 *
 * The contract is the CPU backend's bytes (src/cpu/moe_router.c, docs/numerics.md section 8):
 *  - one thread block per token (grid-stride over the tokens); the row lives in a global-memory
 *    slot of the block (E and topk up to XTE_ROUTER_MAX_EXPERTS do not fit shared memory);
 *    the element-wise steps (scores, exponentials, divisions, outputs) are spread over the
 *    block's threads, and every reduction whose order the contract fixes (the softmax maximum and
 *    sum, the normalisation sum, the group scores, the backward dot products) is one thread's
 *    sequential loop in that order, as the CPU's;
 *  - the top-k is found by ranks: expert e's rank is the number of allowed experts that go
 *    before it in the rank order (xte_moe_before, a total order), so the k experts of rank < k
 *    land in their places whatever thread finds them; the ranks are counted over per-strip
 *    sorted lists of candidates, not all pairs (see xte_rt_forward); groups likewise (rank
 *    within the group, then the group scores ranked);
 *  - the aux loss: fp64 column sums over fixed blocks of 1024 tokens (one thread per block and
 *    expert, tokens ascending), the block partials added in block order (one thread per expert),
 *    then one thread adds the experts in order; fp64 NaN steps through the shared numerics
 *    (xte_add_f64_nanprop, ...) so the bits are the CPU's. No atomics;
 *  - nothing depends on the warp size (block-wide steps go through shared memory and
 *    __syncthreads). */
#ifndef XTE_MOE_ROUTER_KERNELS_CUH
#define XTE_MOE_ROUTER_KERNELS_CUH

#include "cuda/moe_kernels.cuh"
#include "numerics/xte_moe_numerics.h"

#define XTE_AUX_BLOCK 1024
#define XTE_RT_STRIPS 32 /* the top-k's strips of experts (a count of lists, not of lanes) */
/* The most bytes of router row workspace (all blocks together) before the grid is capped. */
#define XTE_RT_WS_CAP ((int64_t)1 << 28)

/* One token's row, in a global-memory slot per block (E and topk are bounded only by
 * XTE_ROUTER_MAX_EXPERTS, too large for shared memory). Offsets of the arrays in a slot
 * (xte_rt_layout); the slot of block b starts at base + b * stride. */
struct xte_rt_ws {
  char *base;
  size_t stride;
  size_t x, sc, sel, w, gsum, rank, keep, mark, idx, asc, cv, ci, nc;
};

struct xte_rt_row {
  float *x, *sc, *sel, *w;
  float *gsum; /* group scores */
  int *rank;   /* rank of an expert within its group */
  unsigned char *keep, *mark;
  int *idx, *asc; /* [k] */
  float *cv;      /* the top-k's strip lists: [XTE_RT_STRIPS][k] */
  int *ci, *nc;   /* [XTE_RT_STRIPS][k], [XTE_RT_STRIPS] */
};

/* The block's reductions, read by all its threads. */
struct xte_rt_shared {
  float m, sum;
};

__device__ __forceinline__ xte_rt_row xte_rt_slot(const xte_rt_ws &w) {
  char *p = w.base + (size_t)blockIdx.x * w.stride;
  xte_rt_row r;
  r.x = (float *)(p + w.x);
  r.sc = (float *)(p + w.sc);
  r.sel = (float *)(p + w.sel);
  r.w = (float *)(p + w.w);
  r.gsum = (float *)(p + w.gsum);
  r.rank = (int *)(p + w.rank);
  r.keep = (unsigned char *)(p + w.keep);
  r.mark = (unsigned char *)(p + w.mark);
  r.idx = (int *)(p + w.idx);
  r.asc = (int *)(p + w.asc);
  r.cv = (float *)(p + w.cv);
  r.ci = (int *)(p + w.ci);
  r.nc = (int *)(p + w.nc);
  return r;
}

/* The slot layout for E experts and topk k, by checked arithmetic (0: too large). */
static inline int xte_rt_layout(int64_t E, int64_t k, xte_rt_ws *w) {
  size_t t = 0;
  int64_t sk = 0;
  if (__builtin_mul_overflow((int64_t)XTE_RT_STRIPS, k, &sk)) return 0;
  if (!xte_moe_ws_add(&t, E, 4, &w->x) || !xte_moe_ws_add(&t, E, 4, &w->sc) ||
      !xte_moe_ws_add(&t, E, 4, &w->sel) || !xte_moe_ws_add(&t, E, 4, &w->w) ||
      !xte_moe_ws_add(&t, E, 4, &w->gsum) || !xte_moe_ws_add(&t, E, 4, &w->rank) ||
      !xte_moe_ws_add(&t, E, 1, &w->keep) || !xte_moe_ws_add(&t, E, 1, &w->mark) ||
      !xte_moe_ws_add(&t, k, 4, &w->idx) || !xte_moe_ws_add(&t, k, 4, &w->asc) ||
      !xte_moe_ws_add(&t, sk, 4, &w->cv) || !xte_moe_ws_add(&t, sk, 4, &w->ci) ||
      !xte_moe_ws_add(&t, XTE_RT_STRIPS, 4, &w->nc))
    return 0;
  w->stride = t;
  return 1;
}

/* The softmax over all E of r.x into r.sc (src/cpu/moe_router.c softmax_all, scalar order). */
__device__ __forceinline__ void xte_rt_softmax_all(const xte_rt_row &r, xte_rt_shared &sh, int E) {
  if (threadIdx.x == 0) {
    float m = xte_bits_f32(0xFF800000u);
    for (int e = 0; e < E; e++) m = xte_fmaxf(m, r.x[e]);
    sh.m = m;
  }
  __syncthreads();
  const float m = sh.m;
  for (int e = threadIdx.x; e < E; e += blockDim.x) r.sc[e] = xte_expf(xte_sub_nanprop(r.x[e], m));
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    XTE_MOE_NO_UNROLL
    for (int e = 0; e < E; e++) s = xte_add_nanprop(s, r.sc[e]);
    sh.sum = s;
  }
  __syncthreads();
  const float s = sh.sum;
  for (int e = threadIdx.x; e < E; e += blockDim.x) r.sc[e] = xte_div_nanprop(r.sc[e], s);
  __syncthreads();
}

__global__ void __launch_bounds__(XTE_MOE_NT) xte_rt_forward(xte_router_args a, xte_rt_ws ws) {
  __shared__ xte_rt_shared sh;
  const xte_rt_row r = xte_rt_slot(ws);
  const int E = (int)a.E, k = a.topk, fn = a.score;
  const int softmax = fn == XTE_MOE_SOFTMAX;
  for (int64_t t = blockIdx.x; t < a.T; t += gridDim.x) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) r.x[e] = xte_moe_load(a.logits, t, e);
    __syncthreads();
    /* scores */
    if (softmax && a.pre_softmax) {
      xte_rt_softmax_all(r, sh, E);
    } else {
      for (int e = threadIdx.x; e < E; e += blockDim.x)
        r.sc[e] = softmax ? r.x[e] : xte_moe_score(r.x[e], fn);
      __syncthreads();
    }
    const int norm_all = a.aux && !softmax; /* aux scores: normalised over all E */
    if (norm_all && threadIdx.x == 0) {
      float s = 0.0f;
      XTE_MOE_NO_UNROLL
      for (int e = 0; e < E; e++) s = xte_add_nanprop(s, r.sc[e]);
      sh.sum = xte_add_nanprop(s, XTE_MOE_NORM_EPS);
    }
    __syncthreads();
    {
      float *sv = a.saved.data && (!softmax || a.pre_softmax)
                      ? (float *)a.saved.data + t * a.saved.ld
                      : (float *)0;
      const float s = sh.sum;
      for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float v = r.sc[e];
        if (sv) sv[e] = v; /* the scores before the aux normalisation */
        if (norm_all) r.sc[e] = v = xte_div_nanprop(v, s);
        /* the selection score (a plain add, as the CPU's: it is only ranked) */
        r.sel[e] = a.bias ? v + a.bias[e] : v;
        r.keep[e] = 1;
      }
    }
    __syncthreads();
    /* group-limited routing: the allowed experts */
    if (a.num_groups > 1) {
      const int G = a.num_groups, gs = E / G, per = k / a.group_topk;
      for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const int g0 = (e / gs) * gs;
        const float v = r.sel[e];
        int n = 0;
        XTE_MOE_NO_UNROLL
        for (int f = g0; f < g0 + gs; f++) n += xte_moe_before(r.sel[f], f, v, e);
        r.rank[e] = n;
      }
      __syncthreads();
      for (int g = threadIdx.x; g < G; g += blockDim.x) {
        float s = 0.0f; /* the group's top `per` in rank order */
        XTE_MOE_NO_UNROLL
        for (int q = 0; q < per; q++)
          for (int e = g * gs; e < (g + 1) * gs; e++)
            if (r.rank[e] == q) s = xte_add_nanprop(s, r.sel[e]);
        r.gsum[g] = s;
      }
      __syncthreads();
      for (int g = threadIdx.x; g < G; g += blockDim.x) {
        const float v = r.gsum[g];
        int n = 0;
        XTE_MOE_NO_UNROLL
        for (int h = 0; h < G; h++) n += xte_moe_before(r.gsum[h], h, v, g);
        r.rank[g] = n; /* (the within-group ranks are no longer needed) */
      }
      __syncthreads();
      for (int e = threadIdx.x; e < E; e += blockDim.x) r.keep[e] = r.rank[e / gs] < a.group_topk;
      __syncthreads();
    }
    /* top-k by ranks among the allowed experts (there are at least k: the core checks it).
     * The experts are cut into XTE_RT_STRIPS strips; one thread per strip lists the strip's
     * first k allowed experts in rank order (xte_moe_topk_insert). Every expert of rank < k is in
     * its strip's list (fewer than k experts go before it at all). A listed expert's rank is its
     * place in its own list plus, for every other list, the length of the prefix that goes
     * before it (a binary search: the lists are sorted). That count is exact whenever the rank
     * is below k (then fewer than k of that strip go before it, all of them listed), and at least
     * k otherwise, so the experts of rank < k and their places are exactly those of the plain
     * rank count. */
    /* Quantile Balancing ranks k + 1 experts (ks lists) and marks the first k; the expert of
     * rank k is dropped and its selection score is the token's cutoff. */
    const int ks = k + (a.qb ? 1 : 0);
    {
      const int L = (E + XTE_RT_STRIPS - 1) / XTE_RT_STRIPS;
      for (int e = threadIdx.x; e < E; e += blockDim.x) r.mark[e] = 0;
      for (int i = threadIdx.x; i < XTE_RT_STRIPS; i += blockDim.x) {
        const int e1 = (i + 1) * L < E ? (i + 1) * L : E;
        int n = 0;
        XTE_MOE_NO_UNROLL
        for (int e = i * L; e < e1; e++)
          if (r.keep[e])
            xte_moe_topk_insert(r.cv + (size_t)i * ks, r.ci + (size_t)i * ks, &n, ks, r.sel[e], e);
        r.nc[i] = n;
      }
      __syncthreads();
      for (int q = threadIdx.x; q < XTE_RT_STRIPS * ks; q += blockDim.x) {
        const int i = q / ks, p = q % ks;
        if (p >= r.nc[i]) continue;
        const float v = r.cv[q];
        const int e = r.ci[q];
        int n = p;
        XTE_MOE_NO_UNROLL
        for (int j = 0; j < XTE_RT_STRIPS && n < ks; j++) {
          const float *cvj = r.cv + (size_t)j * ks;
          const int *cij = r.ci + (size_t)j * ks;
          int lo = 0, hi = j == i ? 0 : r.nc[j];
          while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (xte_moe_before(cvj[mid], cij[mid], v, e))
              lo = mid + 1;
            else
              hi = mid;
          }
          n += lo;
        }
        if (n < ks) {
          r.idx[n] = e;
          if (n < k) r.mark[e] = 1;
        }
      }
    }
    __syncthreads();
    if (a.qb && threadIdx.x == 0) ((float *)a.cutoff.data)[t * a.cutoff.ld] = r.sel[r.idx[k]];
    /* the selected experts ascending: the marked experts in index order (one thread) */
    if (threadIdx.x == 0) {
      int j = 0;
      for (int e = 0; e < E && j < k; e++)
        if (r.mark[e]) r.asc[j++] = e;
    }
    __syncthreads();
    /* weights: r.w (unbiased scores; read at the selected experts, at all for aux) */
    if (a.aux) {
      for (int e = threadIdx.x; e < E; e += blockDim.x) r.w[e] = r.sc[e];
    } else if (softmax && !a.pre_softmax) {
      for (int e = threadIdx.x; e < E; e += blockDim.x) r.w[e] = 0.0f;
      __syncthreads();
      if (threadIdx.x == 0) { /* the softmax over the k selected, ascending */
        float m = xte_bits_f32(0xFF800000u), s = 0.0f;
        for (int j = 0; j < k; j++) m = xte_fmaxf(m, r.sc[r.asc[j]]);
        for (int j = 0; j < k; j++) {
          const float p = xte_expf(xte_sub_nanprop(r.sc[r.asc[j]], m));
          r.w[r.asc[j]] = p;
          s = xte_add_nanprop(s, p);
        }
        for (int j = 0; j < k; j++) r.w[r.asc[j]] = xte_div_nanprop(r.w[r.asc[j]], s);
      }
      __syncthreads();
      if (a.saved.data) {
        float *sv = (float *)a.saved.data + t * a.saved.ld;
        for (int e = threadIdx.x; e < E; e += blockDim.x) sv[e] = r.w[e];
      }
    } else if (threadIdx.x == 0) {
      if (!softmax && k > 1) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s = xte_add_nanprop(s, r.sc[r.asc[j]]);
        s = xte_add_nanprop(s, XTE_MOE_NORM_EPS);
        for (int j = 0; j < k; j++) r.w[r.asc[j]] = xte_div_nanprop(r.sc[r.asc[j]], s);
      } else {
        for (int j = 0; j < k; j++) r.w[r.asc[j]] = r.sc[r.asc[j]];
      }
    }
    __syncthreads();
    /* outputs */
    if (a.probs.data) {
      float *p = (float *)a.probs.data + t * a.probs.ld;
      for (int e = threadIdx.x; e < E; e += blockDim.x)
        p[e] = a.aux ? r.w[e] : (r.mark[e] ? xte_mul_nanprop(a.scaling, r.w[e]) : 0.0f);
    }
    if (a.map.data) {
      uint8_t *m = (uint8_t *)a.map.data + t * a.map.ld;
      for (int e = threadIdx.x; e < E; e += blockDim.x) m[e] = r.mark[e];
    }
    if (a.bits.data) {
      uint8_t *b = (uint8_t *)a.bits.data + t * a.bits.ld;
      for (int i = threadIdx.x; i < (E + 7) / 8; i += blockDim.x) {
        unsigned v = 0;
        for (int q = 0; q < 8 && 8 * i + q < E; q++) v |= (unsigned)r.mark[8 * i + q] << q;
        b[i] = (uint8_t)v;
      }
    }
    if (a.idx.data) {
      for (int j = threadIdx.x; j < k; j += blockDim.x) {
        if (a.idx.dtype == XTE_DTYPE_INT32)
          ((int32_t *)a.idx.data)[t * a.idx.ld + j] = r.idx[j];
        else
          ((int64_t *)a.idx.data)[t * a.idx.ld + j] = r.idx[j];
      }
    }
    if (a.weights.data) {
      for (int j = threadIdx.x; j < k; j += blockDim.x)
        ((float *)a.weights.data)[t * a.weights.ld + j] = xte_mul_nanprop(a.scaling, r.w[r.idx[j]]);
    }
    __syncthreads(); /* the row is reused by the next token */
  }
}

/* The Quantile Balancing histogram: one thread per expert, tokens ascending (the CPU's counts;
 * no atomics). */
__global__ void __launch_bounds__(XTE_MOE_NT) xte_rt_qb_hist(xte_router_args a, float scale) {
  for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < a.E;
       x += (int64_t)gridDim.x * blockDim.x) {
    uint32_t *h = (uint32_t *)a.hist.data + x * a.hist.ld;
    XTE_MOE_NO_UNROLL
    for (int64_t t = 0; t < a.T; t++) {
      const float c = ((const float *)a.cutoff.data)[t * a.cutoff.ld];
      const float sc = ((const float *)a.saved.data)[t * a.saved.ld + x];
      h[xte_moe_qb_bin(c, sc, a.qb_lower, scale, a.qb_bins)] += 1u;
    }
  }
}

/* ---------------------------------------------------------------- backward */

/* The backward's row slot: dp, s, x (fp32 [E]) and the selection bytes in [E]. */
struct xte_rt_bwd_ws {
  char *base;
  size_t stride, dp, s, x, in;
};

static inline int xte_rt_bwd_layout(int64_t E, xte_rt_bwd_ws *w) {
  size_t t = 0;
  if (!xte_moe_ws_add(&t, E, 4, &w->dp) || !xte_moe_ws_add(&t, E, 4, &w->s) ||
      !xte_moe_ws_add(&t, E, 4, &w->x) || !xte_moe_ws_add(&t, E, 1, &w->in))
    return 0;
  w->stride = t;
  return 1;
}

struct xte_rt_bwd_shared {
  float dot, D;
};

__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_rt_backward(xte_router_bwd_args a, xte_rt_bwd_ws ws) {
  __shared__ xte_rt_bwd_shared sh;
  char *slot = ws.base + (size_t)blockIdx.x * ws.stride;
  float *rdp = (float *)(slot + ws.dp), *rs = (float *)(slot + ws.s), *rx = (float *)(slot + ws.x);
  unsigned char *rin = (unsigned char *)(slot + ws.in);
  const int E = (int)a.E, fn = a.score;
  const int norm = fn != XTE_MOE_SOFTMAX && (a.topk > 1 || a.aux);
  for (int64_t t = blockIdx.x; t < a.T; t += gridDim.x) {
    const float *g = (const float *)a.grad_probs.data + t * a.grad_probs.ld;
    const uint8_t *m = a.map.data ? (const uint8_t *)a.map.data + t * a.map.ld : (const uint8_t *)0;
    const float *s = (const float *)a.saved.data + t * a.saved.ld;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const int in = a.aux || m[e];
      rin[e] = (unsigned char)in;
      rdp[e] = in ? xte_mul_nanprop(a.scaling, g[e]) : 0.0f;
      rs[e] = s[e];
      if (fn != XTE_MOE_SOFTMAX) rx[e] = a.logits.data ? xte_moe_load(a.logits, t, e) : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float dot = 0.0f, D = 0.0f;
      if (fn == XTE_MOE_SOFTMAX) {
        XTE_MOE_NO_UNROLL
        for (int e = 0; e < E; e++) dot = xte_fma_nanprop(rs[e], rdp[e], dot);
      } else if (norm) {
        XTE_MOE_NO_UNROLL
        for (int e = 0; e < E; e++)
          if (rin[e]) {
            D = xte_add_nanprop(D, rs[e]);
            dot = xte_fma_nanprop(rdp[e], rs[e], dot);
          }
        D = xte_add_nanprop(D, XTE_MOE_NORM_EPS);
      }
      sh.dot = dot;
      sh.D = D;
    }
    __syncthreads();
    const float dot = sh.dot, D = sh.D;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      float gx;
      if (fn == XTE_MOE_SOFTMAX) {
        gx = xte_mul_nanprop(rs[e], xte_sub_nanprop(rdp[e], dot));
      } else {
        float gs = rdp[e];
        if (norm)
          gs = rin[e] ? xte_div_nanprop(xte_sub_nanprop(rdp[e], xte_div_nanprop(dot, D)), D) : 0.0f;
        gx = xte_mul_nanprop(gs, xte_moe_dscore(rs[e], rx[e], fn));
      }
      xte_moe_store(a.grad_logits, t, e, gx);
    }
    __syncthreads();
  }
}

/* ---------------------------------------------------------------- aux loss */

/* partial[b][e]: the fp64 sum over the tokens of block b (ascending) of probs[t, e]. */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_aux_partial(xte_moe_view probs, int64_t T, int64_t E, int64_t nb, double *partial) {
  for (int64_t b = blockIdx.x; b < nb; b += gridDim.x) {
    const int64_t t1 = (b + 1) * XTE_AUX_BLOCK < T ? (b + 1) * XTE_AUX_BLOCK : T;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
      double p = 0.0;
      XTE_MOE_NO_UNROLL
      for (int64_t t = b * XTE_AUX_BLOCK; t < t1; t++)
        p = xte_add_f64_nanprop(p, xte_f32_to_f64(((const float *)probs.data)[t * probs.ld + e]));
      partial[b * E + e] = p;
    }
  }
}

__device__ __forceinline__ double xte_aux_tpe(const xte_moe_view &v, int64_t e) {
  if (v.dtype == XTE_DTYPE_INT32) return (double)((const int32_t *)v.data)[e];
  if (v.dtype == XTE_DTYPE_INT64) return (double)((const int64_t *)v.data)[e];
  if (v.dtype == XTE_DTYPE_FP32) return xte_f32_to_f64(((const float *)v.data)[e]);
  return xte_f32_to_f64(xte_bf16_to_f32(((const uint16_t *)v.data)[e]));
}

/* colsum[e] = the block partials added in block order; then one thread:
 * aux = fp32(C * sum_e colsum[e] * tpe[e]), experts ascending. */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_aux_colsum(const double *partial, int64_t E, int64_t nb, double *colsum) {
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < E;
       e += (int64_t)gridDim.x * blockDim.x) {
    double cs = 0.0;
    XTE_MOE_NO_UNROLL
    for (int64_t b = 0; b < nb; b++) cs = xte_add_f64_nanprop(cs, partial[b * E + e]);
    colsum[e] = cs;
  }
}

__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_aux_total(const double *colsum, xte_moe_view tpe, int64_t E, double C, float *out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = 0.0;
  XTE_MOE_NO_UNROLL
  for (int64_t e = 0; e < E; e++)
    total = xte_add_f64_nanprop(total, xte_mul_f64_nanprop(colsum[e], xte_aux_tpe(tpe, e)));
  *out = xte_f64_to_f32(xte_mul_f64_nanprop(C, total));
}

/* grad_probs[t, e] = fp32(C * tpe[e]) * grad_aux */
__global__ void __launch_bounds__(XTE_MOE_NT) xte_aux_backward(xte_aux_loss_args a, double C) {
  for (int64_t t = blockIdx.x; t < a.T; t += gridDim.x) {
    float *row = (float *)a.grad_probs.data + t * a.grad_probs.ld;
    for (int64_t e = threadIdx.x; e < a.E; e += blockDim.x)
      row[e] = xte_mul_nanprop(xte_f64_to_f32(C * xte_aux_tpe(a.tpe, e)), a.grad_aux);
  }
}

/* ---------------------------------------------------------------- host steps */

/* The grid of a router launch: one block per token up to the usual cap, and fewer when the
 * blocks' row slots would pass XTE_RT_WS_CAP bytes (the blocks stride over the tokens). */
static inline int64_t xte_rt_grid(int64_t T, size_t stride) {
  int64_t g = xte_moe_grid(T), most = XTE_RT_WS_CAP / (int64_t)(stride ? stride : 1);
  if (most < 1) most = 1;
  return g < most ? g : most;
}

template <class RT>
static xte_status xte_rt_forward_run(RT &rt, const xte_router_args *a) {
  xte_rt_ws ws;
  size_t total;
  int64_t grid;
  xte_status st;
  if (a->T <= 0) return XTE_SUCCESS;
  if (!xte_rt_layout(a->E, (int64_t)a->topk + (a->qb ? 1 : 0), &ws) ||
      __builtin_mul_overflow((size_t)(grid = xte_rt_grid(a->T, ws.stride)), ws.stride, &total))
    return rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "router workspace (E = %lld, topk = %d)",
                             (long long)a->E, a->topk);
  XTE_MOE_TRY(rt.alloc((void **)&ws.base, total));
  st = rt.launch(grid, xte_rt_forward, *a, ws);
  if (st == XTE_SUCCESS && a->qb)
    st = rt.launch(xte_moe_grid_threads(a->E), xte_rt_qb_hist, *a,
                   xte_moe_qb_scale(a->qb_lower, a->qb_upper, a->qb_bins));
  if (st == XTE_SUCCESS) st = rt.finish();
  rt.release(ws.base);
  return st;
}

template <class RT>
static xte_status xte_rt_backward_run(RT &rt, const xte_router_bwd_args *a) {
  xte_rt_bwd_ws ws;
  size_t total;
  int64_t grid;
  xte_status st;
  if (a->T <= 0) return XTE_SUCCESS;
  if (!xte_rt_bwd_layout(a->E, &ws) ||
      __builtin_mul_overflow((size_t)(grid = xte_rt_grid(a->T, ws.stride)), ws.stride, &total))
    return rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "router backward workspace (E = %lld)",
                             (long long)a->E);
  XTE_MOE_TRY(rt.alloc((void **)&ws.base, total));
  st = rt.launch(grid, xte_rt_backward, *a, ws);
  if (st == XTE_SUCCESS) st = rt.finish();
  rt.release(ws.base);
  return st;
}

template <class RT>
static xte_status xte_aux_loss_run(RT &rt, const xte_aux_loss_args *a, int backward) {
  /* the CPU's constant, on the host: the same fp64 operations */
  const double C =
      (double)a->num_experts * (double)a->coeff / ((double)a->topk * (double)a->N * (double)a->N);
  if (backward) {
    if (a->T <= 0) return XTE_SUCCESS;
    XTE_MOE_TRY(rt.launch(xte_moe_grid(a->T), xte_aux_backward, *a, C));
    return rt.finish();
  }
  const int64_t nb = (a->T + XTE_AUX_BLOCK - 1) / XTE_AUX_BLOCK;
  size_t total = 0, o_part, o_col;
  int64_t np = 0;
  char *ws = NULL;
  xte_status st;
  if (__builtin_mul_overflow(nb, a->E, &np) || !xte_moe_ws_add(&total, np, 8, &o_part) ||
      !xte_moe_ws_add(&total, a->E, 8, &o_col))
    return rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "aux loss workspace");
  XTE_MOE_TRY(rt.alloc((void **)&ws, total));
  double *part = (double *)(ws + o_part), *col = (double *)(ws + o_col);
  do {
    if (nb > 0 && (st = rt.launch(xte_moe_grid(nb), xte_aux_partial, a->probs, a->T, a->E, nb,
                                  part)) != XTE_SUCCESS)
      break;
    if ((st = rt.launch(xte_moe_grid_threads(a->E), xte_aux_colsum, (const double *)part, a->E, nb,
                        col)) != XTE_SUCCESS)
      break;
    if ((st = rt.launch(1, xte_aux_total, (const double *)col, a->tpe, a->E, C, a->aux_out)) !=
        XTE_SUCCESS)
      break;
    st = rt.finish();
  } while (0);
  rt.release(ws);
  return st;
}

#endif /* XTE_MOE_ROUTER_KERNELS_CUH */
