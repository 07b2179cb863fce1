/* xte_ep_prepare's step (after its checks): the handle built from the routing, the send lists,
 * one exchange of counts, records and tokens, then the receive side's rows. */
#include "ep/ep_core.h"

/* The handle's header and its int32 copy of the routing. */
static void handle_init(struct xte_ep_group_s *g, xte_ep_handle *eh, const xte_ep_prepare_args *a) {
  size_t bytes;
  int64_t t, j, K = g->K, T = a->T, ld = a->ld;
  xte_ep_handle_layout(g, (char *)a->handle, eh, &bytes);
  memset(eh->h, 0, sizeof *eh->h);
  eh->h->magic = XTE_EP_MAGIC;
  eh->h->group = g;
  eh->h->T = T;
  for (t = 0; t < T; t++)
    for (j = 0; j < K; j++)
      eh->topk[t * K + j] = (int32_t)(a->i64 ? ((const int64_t *)a->tdata)[t * ld + j]
                                             : ((const int32_t *)a->tdata)[t * ld + j]);
}

/* Send lists: rank-major, tokens ascending (send_tok, and sendrec: each record's k local ids);
 * my slots per rank, and src_row_map: the slot rows that come back (combine) in (expert, token)
 * order, an expert's rows from one rank being consecutive rows of recv_x (one block).
 * cnt: scratch [4 R + E]. */
static void send_lists(struct xte_ep_group_s *g, xte_ep_handle *eh, int32_t *sendrec,
                       int64_t *cnt) {
  const int R = g->R, K = g->K;
  const int64_t El = g->El, T = eh->h->T;
  int64_t t, j, r, i, e, acc = 0;
  int64_t *sp = cnt, *pp = cnt + R, *cur = cnt + 4 * (int64_t)R; /* [R], [R], [E] */
  for (r = 0; r < R; r++) eh->send_cnt[r] = eh->slot_cnt[r] = 0;
  for (t = 0; t < T; t++) {
    uint64_t seen[(4096 + 63) / 64];
    memset(seen, 0, sizeof(uint64_t) * (size_t)((R + 63) / 64));
    for (j = 0; j < K; j++) {
      int32_t ex = eh->topk[t * K + j];
      if (ex < 0) continue;
      r = ex / El;
      eh->slot_cnt[r]++;
      if (!(seen[r / 64] >> (r % 64) & 1)) {
        seen[r / 64] |= 1ull << (r % 64);
        eh->send_cnt[r]++;
      }
    }
  }
  eh->send_off[0] = eh->slot_off[0] = 0;
  for (r = 0; r < R; r++) {
    eh->send_off[r + 1] = eh->send_off[r] + eh->send_cnt[r];
    eh->slot_off[r + 1] = eh->slot_off[r] + eh->slot_cnt[r];
  }
  eh->h->nsend = eh->send_off[R];
  eh->h->nslot = eh->slot_off[R];
  for (r = 0; r < R; r++) {
    sp[r] = eh->send_off[r];
    pp[r] = eh->slot_off[r];
  }
  /* rank-major order: walk the ranks, then the tokens */
  for (t = 0; t < T * K; t++) eh->src_row_map[t] = -1;
  for (r = 0; r < R; r++) {
    for (t = 0; t < T; t++) {
      int any = 0;
      for (j = 0; j < K; j++) {
        int32_t ex = eh->topk[t * K + j];
        if (ex >= 0 && ex / El == r) {
          any = 1;
          eh->src_row_map[t * K + j] = (int32_t)pp[r]++;
        }
      }
      if (!any) continue;
      i = sp[r]++;
      eh->send_tok[i] = (int32_t)t;
      for (j = 0; j < K; j++) {
        int32_t ex = eh->topk[t * K + j];
        sendrec[i * K + j] = (ex >= 0 && ex / El == r) ? (int32_t)(ex - r * El) : -1;
      }
    }
  }
  for (e = 0; e < g->E; e++) eh->ecnt_out[e] = 0;
  for (t = 0; t < T * K; t++)
    if (eh->topk[t] >= 0) eh->ecnt_out[eh->topk[t]]++;
  for (e = 0; e < g->E; e++) {
    cur[e] = acc;
    acc += eh->ecnt_out[e];
  }
  for (t = 0; t < T * K; t++)
    if (eh->topk[t] >= 0) eh->src_row_map[t] = (int32_t)cur[eh->topk[t]]++;
}

/* The exchange of the counts, then the records' routing and tokens. */
static xte_status exchange_routing(struct xte_ep_group_s *g, xte_ep_handle *eh,
                                   const int32_t *sendrec, int64_t *cnt) {
  const int R = g->R;
  int64_t *one = cnt + 2 * R, *idx = cnt + 3 * R;
  int r;
  xte_status st;
  for (r = 0; r < R; r++) {
    one[r] = 1;
    idx[r] = r;
  }
  st = g->tr.alltoallv(g->tr.ctx, eh->send_cnt, one, idx, eh->recv_cnt, one, idx, 8);
  if (st == XTE_SUCCESS) {
    eh->recv_off[0] = 0;
    for (r = 0; r < R; r++) eh->recv_off[r + 1] = eh->recv_off[r] + eh->recv_cnt[r];
    eh->h->nrecv = eh->recv_off[R];
    st = g->tr.alltoallv(g->tr.ctx, sendrec, eh->send_cnt, eh->send_off, eh->recv_topk,
                         eh->recv_cnt, eh->recv_off, (size_t)g->K * 4);
  }
  if (st == XTE_SUCCESS)
    st = g->tr.alltoallv(g->tr.ctx, eh->send_tok, eh->send_cnt, eh->send_off, eh->recv_tok,
                         eh->recv_cnt, eh->recv_off, 4);
  return st;
}

/* The receive side: rows back to each rank, rows per local expert, padded rows, and the rows of
 * recv_x (xte_moe_permute's row map over the received records: within an expert, records
 * ascending, i.e. (source rank, token) ascending). cnt: scratch [El]. */
static xte_status receive_side(struct xte_ep_group_s *g, xte_ep_handle *eh, int64_t *cnt) {
  const int R = g->R, K = g->K;
  const int64_t El = g->El;
  int64_t e, rows = 0, i, j;
  int r;
  for (e = 0; e < El; e++) eh->tpe[e] = 0;
  for (e = 0; e < g->E; e++) eh->ein_cnt[e] = 0;
  eh->ret_off[0] = 0;
  for (r = 0; r < R; r++) {
    int64_t n = 0;
    for (i = eh->recv_off[r]; i < eh->recv_off[r + 1]; i++)
      for (j = 0; j < K; j++) {
        int32_t l = eh->recv_topk[i * K + j];
        if (l < 0) continue;
        if (l >= El)
          return xte_set_error(XTE_ERROR_INTERNAL, "rank %d sent local expert %d", r, (int)l);
        n++;
        eh->tpe[l]++;
        eh->ein_cnt[r * El + l]++;
      }
    eh->ret_cnt[r] = n;
    eh->ret_off[r + 1] = eh->ret_off[r] + n;
  }
  eh->h->nret = eh->ret_off[R];
  eh->poff[0] = 0;
  for (e = 0; e < El; e++) {
    rows += (eh->tpe[e] + g->align - 1) / g->align * g->align;
    eh->poff[e + 1] = rows;
  }
  eh->h->recv_rows = rows;
  for (e = 0; e < El; e++) {
    int64_t row = eh->poff[e];
    for (r = 0; r < R; r++) {
      eh->ein_row[r * El + e] = row;
      row += eh->ein_cnt[r * El + e];
    }
  }
  for (e = 0; e < El; e++) cnt[e] = eh->poff[e];
  for (i = 0; i < eh->h->nrecv; i++)
    for (j = 0; j < K; j++) {
      int32_t l = eh->recv_topk[i * K + j];
      eh->row_map[i * K + j] = l < 0 ? -1 : (int32_t)cnt[l]++;
    }
  return XTE_SUCCESS;
}

/* counts and tokens_per_expert (cnt: El scratch values for a GPU group's upload). */
static xte_status outputs(xte_ep_call *c, const xte_ep_handle *eh, const xte_ep_prepare_args *a,
                          int64_t *cnt) {
  const int64_t El = c->g->El;
  int64_t e;
  void *dst;
  if (a->counts) {
    a->counts->recv_rows = eh->h->recv_rows;
    a->counts->slot_rows = eh->h->nslot;
    a->counts->recv_tokens = eh->h->nrecv;
  }
  if (!a->tokens_per_expert) return XTE_SUCCESS;
  /* a GPU group's: built on the host, then copied */
  dst = c->gpu ? (void *)cnt : a->tokens_per_expert->data;
  for (e = 0; e < El; e++) {
    if (a->tpe_i64)
      ((int64_t *)dst)[e] = eh->tpe[e];
    else
      ((int32_t *)dst)[e] = (int32_t)eh->tpe[e];
  }
  if (!c->gpu) return XTE_SUCCESS;
  return xte_ep_to_device(c, a->tokens_per_expert->data, dst, (size_t)El * (a->tpe_i64 ? 8 : 4));
}

xte_status xte_ep_prepare_run(xte_ep_call *c, xte_status st, xte_ep_prepare_args *a) {
  struct xte_ep_group_s *g = c->g;
  const int R = g->R, K = g->K;
  const int64_t T = a->T, kr = K < R ? K : R;
  int32_t *sendrec = NULL;
  int64_t *cnt = NULL;
  xte_ep_handle eh;
  /* workspace: the send records (k local ids per (token, rank)) and count scratch */
  if (st == XTE_SUCCESS) {
    st = xte_ep_ws_alloc(NULL, 0, T * kr, (size_t)K * 4, (void **)&sendrec);
    if (st == XTE_SUCCESS) st = xte_ep_ws_alloc(NULL, 0, 4 * (int64_t)R + g->E, 8, (void **)&cnt);
    /* a GPU transport stages the exchanges below through device memory */
    if (st == XTE_SUCCESS && c->gpu)
      st = xte_ep_reserve(g, 0, T * kr * K * 4 + 8 * (int64_t)R,
                          g->Tmax * R * K * 4 + 8 * (int64_t)R);
  }
  st = xte_ep_agree(g, st, NULL, NULL);
  if (st == XTE_SUCCESS) {
    handle_init(g, &eh, a);
    send_lists(g, &eh, sendrec, cnt);
    st = exchange_routing(g, &eh, sendrec, cnt);
  }
  if (st == XTE_SUCCESS) st = receive_side(g, &eh, cnt);
  if (st == XTE_SUCCESS) {
    eh.h->prepared = 1;
    st = outputs(c, &eh, a, cnt);
  }
  /* fresh host buffers (xte_ep_ws_alloc without a group), whatever the group's kind */
  xte_ep_ws_free(NULL, sendrec);
  xte_ep_ws_free(NULL, cnt);
  xte_aligned_free(a->tcopy);
  a->tcopy = NULL;
  st = xte_ep_call_end(c, st);
  if (st == XTE_SUCCESS) xte_clear_error();
  return st;
}
