/* Cases of the table of valid calls (calls_cases.h): attention; streams and memory; expert
 * parallelism on one rank. */
#define _POSIX_C_SOURCE 200809L
#include "calls_cases.h"

/* ------------------------------------------------------------------ attention */

typedef struct a_state {
  int bwd;
  xte_tensor Q, K, V, O, L, dO, dQ, dK, dV;
  xte_attention_config cfg;
} a_state;

xte_status attn_run(calls_ctx *c) {
  a_state *s = (a_state *)c->state;
  if (s->bwd)
    return xte_attention_bwd(&s->Q, &s->K, &s->V, &s->O, &s->dO, &s->L, &s->dQ, &s->dK, &s->dV,
                             &s->cfg, NULL);
  return xte_attention_fwd(&s->Q, &s->K, &s->V, &s->O, &s->L, &s->cfg, NULL);
}

static xte_tensor attn_tensor(void *p, xte_dtype dt, int thd, int64_t b, int64_t s, int64_t h,
                              int64_t d) {
  xte_tensor t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.dtype = dt;
  if (thd) {
    t.rank = 3;
    t.shape[0] = s;
    t.shape[1] = h;
    t.shape[2] = d;
  } else {
    t.rank = 4;
    t.shape[0] = b;
    t.shape[1] = s;
    t.shape[2] = h;
    t.shape[3] = d;
  }
  return t;
}

/* BSHD causal GQA (b 2, s 96, h 4 / 2, d 64) or THD varlen (5 sequences, bottom-right causal, one
 * token outside every sequence); fp32 or bf16. */
static int attn_setup_mode(calls_ctx *c, int thd, xte_dtype dt, int bwd, xte_attention_mode mode);
static int attn_setup(calls_ctx *c, int thd, xte_dtype dt, int bwd) {
  return attn_setup_mode(c, thd, dt, bwd, XTE_ATTENTION_EXACT);
}
/* ... in XTE_ATTENTION_FAST (mode) */
static int attn_setup_mode(calls_ctx *c, int thd, xte_dtype dt, int bwd, xte_attention_mode mode) {
  static const int32_t lq[5] = {5, 0, 70, 130, 33}, lk[5] = {5, 3, 70, 140, 64};
  const int64_t hq = 4, hkv = 2, D = 64;
  int64_t b = thd ? 1 : 2, sq = 96, skv = 96, nl;
  size_t es = xte_dtype_size(dt);
  void *q, *k, *v, *o, *l, *dout = NULL;
  STATE(a_state);
  s->bwd = bwd;
  s->cfg = xte_attention_config_default();
  s->cfg.mode = mode;
  if (thd) {
    int32_t *cq, *ck;
    int i;
    ALLOC(cq, int32_t, 6);
    ALLOC(ck, int32_t, 6);
    for (i = 0; i < 5; i++) {
      cq[i + 1] = cq[i] + lq[i];
      ck[i + 1] = ck[i] + lk[i];
    }
    sq = cq[5] + 1;
    skv = ck[5] + 1;
    s->cfg.layout = XTE_ATTN_LAYOUT_THD;
    s->cfg.mask = XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    s->cfg.cu_seqlens_q = cq;
    s->cfg.cu_seqlens_kv = ck;
    s->cfg.batch = 5;
    s->cfg.max_seqlen_q = 130;
    s->cfg.max_seqlen_kv = 140;
  } else {
    s->cfg.mask = XTE_ATTN_MASK_CAUSAL;
  }
  q = data(c, dt, b * sq * hq * D, 1.0f, 0);
  k = data(c, dt, b * skv * hkv * D, 1.0f, 0);
  v = data(c, dt, b * skv * hkv * D, 1.0f, 0);
  nl = b * sq * hq;
  if (!q || !k || !v) return fail(c, "out of buffer slots");
  s->Q = attn_tensor(q, dt, thd, b, sq, hq, D);
  s->K = attn_tensor(k, dt, thd, b, skv, hkv, D);
  s->V = attn_tensor(v, dt, thd, b, skv, hkv, D);
  if (!bwd) {
    o = calls_alloc(c, es * (size_t)(b * sq * hq * D));
    l = calls_alloc(c, 4 * (size_t)nl);
    if (!o || !l) return fail(c, "out of buffer slots");
    calls_output(c, o, es * (size_t)(b * sq * hq * D), "O");
    calls_output(c, l, 4 * (size_t)nl, "lse");
  } else {
    o = calls_alloc(c, es * (size_t)(b * sq * hq * D));
    l = calls_alloc(c, 4 * (size_t)nl);
    dout = data(c, dt, b * sq * hq * D, 1.0f, 0);
    if (!o || !l || !dout) return fail(c, "out of buffer slots");
  }
  s->O = attn_tensor(o, dt, thd, b, sq, hq, D);
  if (thd)
    s->L = xte_tensor_2d(l, XTE_DTYPE_FP32, sq, hq);
  else {
    memset(&s->L, 0, sizeof s->L);
    s->L.data = l;
    s->L.dtype = XTE_DTYPE_FP32;
    s->L.rank = 3;
    s->L.shape[0] = b;
    s->L.shape[1] = hq;
    s->L.shape[2] = sq;
  }
  if (bwd) {
    void *dq = calls_alloc(c, es * (size_t)(b * sq * hq * D));
    void *dk = calls_alloc(c, es * (size_t)(b * skv * hkv * D));
    void *dv = calls_alloc(c, es * (size_t)(b * skv * hkv * D));
    if (!dq || !dk || !dv) return fail(c, "out of buffer slots");
    TRY_X(xte_attention_fwd(&s->Q, &s->K, &s->V, &s->O, &s->L, &s->cfg, NULL));
    s->dO = attn_tensor(dout, dt, thd, b, sq, hq, D);
    s->dQ = attn_tensor(dq, dt, thd, b, sq, hq, D);
    s->dK = attn_tensor(dk, dt, thd, b, skv, hkv, D);
    s->dV = attn_tensor(dv, dt, thd, b, skv, hkv, D);
    calls_output(c, dq, es * (size_t)(b * sq * hq * D), "dQ");
    calls_output(c, dk, es * (size_t)(b * skv * hkv * D), "dK");
    calls_output(c, dv, es * (size_t)(b * skv * hkv * D), "dV");
  }
  return 0;
}

int setup_attn_fast_fwd_thd_bf16(calls_ctx *c) {
  return attn_setup_mode(c, 1, XTE_DTYPE_BF16, 0, XTE_ATTENTION_FAST);
}
int setup_attn_fast_bwd_bshd_fp32(calls_ctx *c) {
  return attn_setup_mode(c, 0, XTE_DTYPE_FP32, 1, XTE_ATTENTION_FAST);
}
int setup_attn_fwd_bshd_fp32(calls_ctx *c) {
  return attn_setup(c, 0, XTE_DTYPE_FP32, 0);
}
int setup_attn_fwd_bshd_bf16(calls_ctx *c) {
  return attn_setup(c, 0, XTE_DTYPE_BF16, 0);
}
int setup_attn_fwd_thd_fp32(calls_ctx *c) {
  return attn_setup(c, 1, XTE_DTYPE_FP32, 0);
}
int setup_attn_fwd_thd_bf16(calls_ctx *c) {
  return attn_setup(c, 1, XTE_DTYPE_BF16, 0);
}
int setup_attn_bwd_bshd_fp32(calls_ctx *c) {
  return attn_setup(c, 0, XTE_DTYPE_FP32, 1);
}
int setup_attn_bwd_bshd_bf16(calls_ctx *c) {
  return attn_setup(c, 0, XTE_DTYPE_BF16, 1);
}
int setup_attn_bwd_thd_fp32(calls_ctx *c) {
  return attn_setup(c, 1, XTE_DTYPE_FP32, 1);
}
int setup_attn_bwd_thd_bf16(calls_ctx *c) {
  return attn_setup(c, 1, XTE_DTYPE_BF16, 1);
}

/* ------------------------------------------------------------------ streams and memory */

#define MEM_BYTES 4096
#define HANDLE_SENTINEL ((uintptr_t)0x5E5E5E5E5E5E5E40ull)

typedef struct m_state {
  uint8_t *flag; /* 1 after a success; on an error written only when the handle was clobbered */
  uint8_t *mem;  /* what the memory held */
} m_state;

int mem_setup(calls_ctx *c) {
  STATE(m_state);
  ALLOC(s->flag, uint8_t, 1);
  ALLOC(s->mem, uint8_t, MEM_BYTES);
  calls_output(c, s->flag, 1, "handle_untouched");
  calls_output(c, s->mem, MEM_BYTES, "memory");
  return 0;
}

static void clobbered(calls_ctx *c) {
  m_state *s = (m_state *)c->state;
  s->flag[0] = (uint8_t)~calls_sentinel(0, 0);
}

/* create a CPU stream, a memset through it, synchronize, destroy */
xte_status stream_run(calls_ctx *c) {
  m_state *s = (m_state *)c->state;
  xte_stream h = (xte_stream)HANDLE_SENTINEL;
  xte_status st = xte_stream_create(XTE_BACKEND_CPU, 0, NULL, &h), st2;
  if (st != XTE_SUCCESS) {
    if (h != (xte_stream)HANDLE_SENTINEL) clobbered(c);
    return st;
  }
  s->flag[0] = 1;
  st = xte_memset(h, s->mem, 0x3C, MEM_BYTES);
  if (st == XTE_SUCCESS) st = xte_stream_synchronize(h);
  st2 = xte_stream_destroy(h);
  return st != XTE_SUCCESS ? st : st2;
}

/* xte_malloc, memset, copy out, xte_free */
xte_status malloc_run(calls_ctx *c) {
  m_state *s = (m_state *)c->state;
  void *p = (void *)HANDLE_SENTINEL;
  xte_status st = xte_malloc(NULL, MEM_BYTES, &p), st2;
  if (st != XTE_SUCCESS) {
    if (p != (void *)HANDLE_SENTINEL) clobbered(c);
    return st;
  }
  s->flag[0] = 1;
  st = xte_memset(NULL, p, 0x6B, MEM_BYTES);
  if (st == XTE_SUCCESS) st = xte_memcpy(NULL, s->mem, p, MEM_BYTES, XTE_MEMCPY_DEVICE_TO_HOST);
  st2 = xte_free(NULL, p);
  return st != XTE_SUCCESS ? st : st2;
}

/* ------------------------------------------------------------------ expert parallelism */

/* One rank (a threads world of one): its step moves every row to itself through the transport
 * and the same packing as any rank count. op: 0 prepare, 1 dispatch, 2 combine, 3 combine
 * backward, 4 dispatch backward; the steps before op run in the setup. */
typedef struct ep_state {
  int op;
  xte_ep_threads_world world;
  xte_ep_group g;
  void *handle;
  size_t hb;
  xte_ep_counts counts, *pcounts;
  xte_tensor idx, x, xs, w, rx, rs, rw, tpe, y, out, slots, gout, gy, gw, gr, gx;
} ep_state;

static void ep_cleanup(calls_ctx *c) {
  ep_state *s = (ep_state *)c->state;
  if (!s) return;
  xte_ep_group_destroy(s->g);
  xte_ep_threads_world_destroy(s->world);
  s->g = NULL;
  s->world = NULL;
}

xte_status ep_run(calls_ctx *c) {
  ep_state *s = (ep_state *)c->state;
  switch (s->op) {
    case 0:
      return xte_ep_prepare(s->g, &s->idx, s->handle, s->hb, s->pcounts, &s->tpe, NULL);
    case 1:
      return xte_ep_dispatch(s->g, s->handle, &s->x, &s->xs, &s->w, &s->rx, &s->rs, &s->rw, NULL);
    case 2:
      return xte_ep_combine(s->g, s->handle, &s->y, &s->w, &s->out, &s->slots, NULL);
    case 3:
      return xte_ep_combine_backward(s->g, s->handle, &s->gout, &s->w, &s->slots, &s->gy, &s->gw,
                                     NULL);
    default:
      return xte_ep_dispatch_backward(s->g, s->handle, &s->gr, &s->gx, NULL);
  }
}

static int ep_setup(calls_ctx *c, int op) {
  const int64_t T = 100, H = 256, El = 8, K = 4, S = 2;
  xte_ep_config cfg = xte_ep_config_default();
  int32_t *idx;
  float *w;
  int64_t t, j, rows;
  STATE(ep_state);
  s->op = op;
  c->cleanup = ep_cleanup;
  ALLOC(idx, int32_t, T * K);
  ALLOC(w, float, T *K);
  for (t = 0; t < T; t++)
    for (j = 0; j < K; j++) {
      idx[t * K + j] = (int32_t)((t * 3 + j * 5) % El); /* distinct within a token (5 k < 8) */
      if ((t + j) % 11 == 0) idx[t * K + j] = -1;
      w[t * K + j] = (float)(t % 7 + j) / 8.0f;
    }
  s->idx = xte_tensor_2d(idx, XTE_DTYPE_INT32, T, K);
  s->w = xte_tensor_2d(w, XTE_DTYPE_FP32, T, K);
  s->x = xte_tensor_2d(data(c, XTE_DTYPE_E4M3, T * H, 1.0f, 0), XTE_DTYPE_E4M3, T, H);
  s->xs = xte_tensor_2d(data(c, XTE_DTYPE_FP32, T * S, 1.0f, 0), XTE_DTYPE_FP32, T, S);
  if (!s->x.data || !s->xs.data) return fail(c, "out of buffer slots");
  cfg.experts_per_rank = El;
  cfg.hidden = H;
  cfg.topk = (int32_t)K;
  cfg.align = 16;
  cfg.max_tokens_per_rank = T;
  TRY_X(xte_ep_threads_world_create(1, &s->world));
  TRY_X(xte_ep_group_create_threads(s->world, 0, &cfg, &s->g));
  TRY_X(xte_ep_handle_size(s->g, &s->hb));
  s->handle = calls_alloc(c, s->hb);
  if (!s->handle) return fail(c, "out of buffer slots (handle)");
  if (op == 0) {
    /* the handle is opaque (it holds the group's address, which differs between contexts): the
     * counts and tokens_per_expert are the outputs compared */
    s->pcounts = (xte_ep_counts *)calls_alloc(c, sizeof(xte_ep_counts));
    if (!s->pcounts) return fail(c, "out of buffer slots (counts)");
    calls_output(c, s->pcounts, sizeof(xte_ep_counts), "counts");
    return out2d(c, &s->tpe, XTE_DTYPE_INT64, 1, El, "tokens_per_expert");
  }
  TRY_X(xte_ep_prepare(s->g, &s->idx, s->handle, s->hb, &s->counts, NULL, NULL));
  rows = s->counts.recv_rows;
  if (op == 1)
    return out2d(c, &s->rx, XTE_DTYPE_E4M3, rows, H, "recv_x") ||
           out2d(c, &s->rs, XTE_DTYPE_FP32, rows, S, "recv_scales") ||
           out2d(c, &s->rw, XTE_DTYPE_FP32, 1, rows, "recv_weights");
  ALLOC(s->rx.data, uint8_t, rows * H);
  ALLOC(s->rs.data, float, rows *S);
  s->rx = xte_tensor_2d(s->rx.data, XTE_DTYPE_E4M3, rows, H);
  s->rs = xte_tensor_2d(s->rs.data, XTE_DTYPE_FP32, rows, S);
  TRY_X(xte_ep_dispatch(s->g, s->handle, &s->x, &s->xs, NULL, &s->rx, &s->rs, NULL, NULL));
  s->y = xte_tensor_2d(data(c, XTE_DTYPE_BF16, rows * H, 2.0f, 1), XTE_DTYPE_BF16, rows, H);
  s->gr = xte_tensor_2d(data(c, XTE_DTYPE_FP32, rows * H, 2.0f, 1), XTE_DTYPE_FP32, rows, H);
  s->gout = xte_tensor_2d(data(c, XTE_DTYPE_BF16, T * H, 2.0f, 1), XTE_DTYPE_BF16, T, H);
  if (!s->y.data || !s->gr.data || !s->gout.data) return fail(c, "out of buffer slots");
  if (op == 2)
    return out2d(c, &s->out, XTE_DTYPE_BF16, T, H, "out") ||
           out2d(c, &s->slots, XTE_DTYPE_BF16, s->counts.slot_rows, H, "slot_rows");
  if (op == 3) {
    ALLOC(s->out.data, uint16_t, T * H);
    ALLOC(s->slots.data, uint16_t, s->counts.slot_rows * H);
    s->out = xte_tensor_2d(s->out.data, XTE_DTYPE_BF16, T, H);
    s->slots = xte_tensor_2d(s->slots.data, XTE_DTYPE_BF16, s->counts.slot_rows, H);
    TRY_X(xte_ep_combine(s->g, s->handle, &s->y, &s->w, &s->out, &s->slots, NULL));
    return out2d(c, &s->gy, XTE_DTYPE_BF16, rows + 3, H, "grad_expert_out") ||
           out2d(c, &s->gw, XTE_DTYPE_FP32, T, K, "grad_weights");
  }
  return out2d(c, &s->gx, XTE_DTYPE_FP32, T, H, "grad_x");
}

int setup_ep_prepare(calls_ctx *c) {
  return ep_setup(c, 0);
}
int setup_ep_dispatch_e4m3(calls_ctx *c) {
  return ep_setup(c, 1);
}
int setup_ep_combine_bf16(calls_ctx *c) {
  return ep_setup(c, 2);
}
int setup_ep_combine_bwd(calls_ctx *c) {
  return ep_setup(c, 3);
}
int setup_ep_dispatch_bwd(calls_ctx *c) {
  return ep_setup(c, 4);
}
