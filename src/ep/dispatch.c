/* xte_ep_dispatch / xte_ep_dispatch_tokens's step (after their checks): workspace and agreement,
 * one matched exchange of the token rows and their records, then the rows' local layout
 * (token-major: the records into recv_topk_idx / recv_topk_weights; expert-major: the
 * expansion into the local slots' rows). */
#include "ep/ep_core.h"

/* The workspace of a call: the block lists (then, on the host, the send records) in blk, the
 * receive records [nrecv, mb] (then, expert-major, the token rows [nrecv, xb]) in wbuf, a GPU
 * group's send records in device memory dmeta. sig: the agreement's signature. */
typedef struct dws {
  char *blk, *wbuf, *dmeta;
  size_t xb, sb, wb, mb;
} dws;

static xte_status dispatch_ws(xte_ep_call *c, const xte_ep_handle *eh,
                              const xte_ep_dispatch_args *a, dws *w, int64_t *sig) {
  struct xte_ep_group_s *g = c->g;
  size_t lb = 0, rec = 0, sall = 0, rall = 0, smeta;
  xte_status st = XTE_SUCCESS;
  const int64_t ns = eh->h->nsend, nr = eh->h->nrecv;
  w->xb = (size_t)g->H * a->es;
  w->sb = (size_t)a->S * a->ss;
  w->wb = a->has_w ? (size_t)g->K * 4 : 0;
  w->mb = w->sb + w->wb;
  if (!xte_ep_blist_bytes(ns + g->R, nr + g->R, g->R, &lb) ||
      __builtin_mul_overflow((size_t)ns, w->mb, &smeta) || __builtin_add_overflow(lb, smeta, &lb) ||
      __builtin_add_overflow(w->mb, a->tm ? 0 : w->xb, &rec) ||
      __builtin_mul_overflow((size_t)ns, w->xb + w->mb, &sall) ||
      __builtin_mul_overflow((size_t)nr, w->xb + w->mb, &rall))
    st = xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "workspace size overflows");
  if (st == XTE_SUCCESS) st = xte_ep_ws_alloc(g, 0, 1, lb, (void **)&w->blk);
  if (st == XTE_SUCCESS) st = xte_ep_ws_data(c, 1, 0, nr, rec, (void **)&w->wbuf);
  /* a GPU group's send records: device memory (a CPU group's follow the block lists) */
  if (st == XTE_SUCCESS && c->gpu) st = xte_ep_ws_data(c, 0, 2, ns, w->mb, (void **)&w->dmeta);
  if (st == XTE_SUCCESS)
    st = xte_ep_reserve(g, (ns > nr ? ns : nr) + g->R, (int64_t)sall, (int64_t)rall);
  sig[0] = a->x->dtype;
  sig[1] = a->fp8 ? (int64_t)a->x_scales->dtype : -1;
  sig[2] = a->S;
  sig[3] = a->has_w;
  /* not compared: whether this rank's x rows and received rows lie back to back */
  sig[5] = (a->ldx == g->H) | (!a->tm || a->ldo == g->H) << 1;
  return st;
}

/* Expert-major: records [i0, i1), each received row to the recv_x row of each local slot (this
 * rank's own rows straight from x), its scale row and weight along. */
typedef struct expand_job {
  xte_ep_call *c;
  const xte_ep_handle *eh;
  const xte_ep_dispatch_args *a;
  const dws *w;
  int64_t i0, i1;
} expand_job;

static void expand_rows(const expand_job *job) {
  xte_ep_call *c = job->c;
  const xte_ep_handle *eh = job->eh;
  const xte_ep_dispatch_args *a = job->a;
  const dws *w = job->w;
  const int64_t K = c->g->K, nrecv = eh->h->nrecv;
  const size_t xb = w->xb, sb = w->sb, mb = w->mb, es = a->es, ss = a->ss;
  char *ox = (char *)a->recv_x->data, *os = a->fp8 ? (char *)a->recv_scales->data : NULL;
  const char *xw = w->wbuf + (size_t)nrecv * mb, *xd = (const char *)a->x->data;
  const int64_t self0 = eh->recv_off[c->g->tr.rank], self1 = eh->recv_off[c->g->tr.rank + 1];
  float *wt = a->recv_weights ? (float *)a->recv_weights->data : NULL;
  int64_t i, j;
  for (i = job->i0; i < job->i1; i++) {
    const int32_t *rm = eh->row_map + i * K;
    const char *meta = w->wbuf + (size_t)i * mb;
    const char *xr = i >= self0 && i < self1 ? xd + (size_t)(eh->recv_tok[i] * a->ldx) * es
                                             : xw + (size_t)i * xb;
    for (j = 0; j < K; j++) {
      int64_t row = rm[j];
      if (row < 0) continue;
      if (wt) xte_ep_mv_copy(c, &wt[row], meta + sb + (size_t)j * 4, 4);
      if (sb) xte_ep_mv_copy(c, os + (size_t)(row * a->ldrs) * ss, meta, sb);
      xte_ep_mv_copy(c, ox + (size_t)(row * a->ldo) * es, xr, xb);
    }
  }
}

/* The expansion of this rank's own records (their rows come from x, their records arrive with
 * the exchange's start): the work done while the exchange is in flight. */
static void expand_self(void *arg) {
  const expand_job *job = (const expand_job *)arg;
  expand_rows(job);
  if (!job->c->gpu) (void)xte_ep_mv_flush(job->c); /* a streaming CPU call's rows, now */
}

/* Each (token, rank) once, in one exchange: per peer the x rows read in place, then the small
 * records of scale rows and weights. Both sides cut a pair's stream alike: a block per run of
 * consecutive tokens (one per token unless the sender's x and the receiver's rows are dense),
 * then the records; the transport can then move each block as it is. The rows land
 * token-major: in recv_x (token-major) or in workspace after the records (expert-major, where a
 * rank's rows to itself stay out of the exchange: the expansion reads them from x, one copy
 * fewer). */
static xte_status dispatch_exchange(xte_ep_call *c, const xte_ep_handle *eh,
                                    const xte_ep_dispatch_args *a, const dws *w) {
  struct xte_ep_group_s *g = c->g;
  xte_ep_blist bs, br;
  const size_t xb = w->xb, sb = w->sb, wb = w->wb, mb = w->mb, es = a->es;
  size_t lb = 0;
  const char *xd = (const char *)a->x->data;
  const char *sd = a->fp8 ? (const char *)a->x_scales->data : NULL;
  const char *wd = a->has_w ? (const char *)a->topk_weights->data : NULL;
  char *ox = (char *)a->recv_x->data, *smeta, *xw = w->wbuf + (size_t)eh->h->nrecv * mb;
  const int64_t me_bits = g->agree[g->tr.rank].sig[5];
  int64_t i, t_pack = xte_ep_now_ns();
  int r;
  xte_status st;
  xte_ep_blist_bytes(eh->h->nsend + g->R, eh->h->nrecv + g->R, g->R, &lb);
  smeta = c->gpu ? w->dmeta : w->blk + lb;
  for (i = 0; i < eh->h->nsend && mb; i++) {
    int64_t t = eh->send_tok[i];
    if (sb) xte_ep_mv_copy(c, smeta + (size_t)i * mb, sd + (size_t)(t * a->lds) * a->ss, sb);
    if (wb) xte_ep_mv_copy(c, smeta + (size_t)i * mb + sb, wd + (size_t)(t * a->ldw) * 4, wb);
  }
  st = xte_ep_mv_flush(c);
  xte_ep_blist_init(w->blk, eh->h->nsend + g->R, eh->h->nrecv + g->R, g->R, &bs, &br);
  for (r = 0; r < g->R; r++) {
    int64_t b0 = eh->send_off[r], b1 = eh->send_off[r + 1];
    int runs = (me_bits & 1) && (g->agree[r].sig[5] & 2);
    /* expert-major: this rank's own rows skip the exchange (the expansion reads them from x) */
    const int rows = a->tm || r != g->tr.rank;
    xte_ep_blist_peer(&bs, r);
    for (i = b0; i < b1 && rows; i++)
      xte_ep_blist_seg(&bs, xd + (size_t)(eh->send_tok[i] * a->ldx) * es, (int64_t)xb,
                       runs && i > b0 && eh->send_tok[i] == eh->send_tok[i - 1] + 1);
    xte_ep_blist_seg(&bs, smeta + (size_t)b0 * mb, (b1 - b0) * (int64_t)mb, 0);
    b0 = eh->recv_off[r];
    b1 = eh->recv_off[r + 1];
    runs = (g->agree[r].sig[5] & 1) && (me_bits & 2);
    xte_ep_blist_peer(&br, r);
    for (i = b0; i < b1 && rows; i++)
      xte_ep_blist_seg(&br, a->tm ? ox + (size_t)(i * a->ldo) * es : xw + (size_t)i * xb,
                       (int64_t)xb, runs && i > b0 && eh->recv_tok[i] == eh->recv_tok[i - 1] + 1);
    xte_ep_blist_seg(&br, w->wbuf + (size_t)b0 * mb, (b1 - b0) * (int64_t)mb, 0);
  }
  xte_ep_blist_peer(&bs, g->R);
  xte_ep_blist_peer(&br, g->R);
  g->stats.pack_ns += xte_ep_now_ns() - t_pack;
  if (st == XTE_SUCCESS && a->tm) {
    st = xte_ep_exchange(g, &bs, &br, 1);
  } else if (st == XTE_SUCCESS) {
    /* (a GPU group's moves of one launch must not write a byte twice: its weights of the
     * unrouted rows are zeroed after the expansion instead) */
    float *wt = a->recv_weights ? (float *)a->recv_weights->data : NULL;
    const int me = g->tr.rank;
    expand_job job = {c, eh, a, w, eh->recv_off[me], eh->recv_off[me + 1]};
    if (wt && !c->gpu) memset(wt, 0, (size_t)a->nrows * sizeof(float));
    st = xte_ep_exchange_overlap(g, &bs, &br, expand_self, &job);
  }
  return st;
}

/* Token-major: one row per token; scale rows, the slots' local experts and weights; zero rows
 * after the received ones. */
static xte_status tokens_out(xte_ep_call *c, const xte_ep_handle *eh, const xte_ep_dispatch_args *a,
                             const dws *w) {
  const int64_t K = c->g->K, nrows = a->nrows, nrecv = eh->h->nrecv;
  const size_t xb = w->xb, sb = w->sb, mb = w->mb, es = a->es, ss = a->ss;
  char *ox = (char *)a->recv_x->data, *os = a->fp8 ? (char *)a->recv_scales->data : NULL;
  int32_t *ti = a->recv_topk_idx ? (int32_t *)a->recv_topk_idx->data : NULL;
  float *tw = a->recv_topk_weights ? (float *)a->recv_topk_weights->data : NULL;
  int32_t *hti = ti, *uti = NULL; /* a GPU group's recv_topk_idx: built here, then uploaded */
  int64_t i, j;
  xte_status st = XTE_SUCCESS;
  if (ti && c->gpu) {
    hti = (int32_t *)xte_aligned_alloc((size_t)(nrows ? nrows : 1) * (size_t)K * 4);
    if (!hti) st = xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "out of memory (recv_topk_idx)");
    if (st == XTE_SUCCESS) st = xte_ep_ws_data(c, 0, 3, nrows, (size_t)K * 4, (void **)&uti);
  }
  for (i = 0; i < nrows && st == XTE_SUCCESS; i++) {
    const char *meta = i < nrecv ? w->wbuf + (size_t)i * mb : w->wbuf;
    if (i >= nrecv) {
      xte_ep_mv_zero(c, ox + (size_t)(i * a->ldo) * es, xb);
      if (sb) xte_ep_mv_zero(c, os + (size_t)(i * a->ldrs) * ss, sb);
    } else if (sb) {
      xte_ep_mv_copy(c, os + (size_t)(i * a->ldrs) * ss, meta, sb);
    }
    for (j = 0; j < K; j++) {
      int32_t l = i < nrecv ? eh->recv_topk[i * K + j] : -1;
      if (ti) hti[c->gpu ? i * K + j : i * a->ldti + j] = l;
      if (tw) {
        if (l >= 0)
          xte_ep_mv_copy(c, &tw[i * a->ldtw + j], meta + sb + (size_t)j * 4, 4);
        else
          xte_ep_mv_zero(c, &tw[i * a->ldtw + j], 4);
      }
    }
  }
  if (ti && c->gpu && st == XTE_SUCCESS) {
    st = xte_ep_to_device(c, uti, hti, (size_t)nrows * (size_t)K * 4);
    for (i = 0; i < nrows && st == XTE_SUCCESS; i++)
      xte_ep_mv_copy(c, ti + i * a->ldti, uti + i * K, (size_t)K * 4);
  }
  if (c->gpu) xte_aligned_free(hti);
  return st;
}

/* Expert-major, after the exchange: the peers' records expanded; padding and rows past
 * recv_rows zeroed. */
static void expand_rest(xte_ep_call *c, const xte_ep_handle *eh, const xte_ep_dispatch_args *a,
                        const dws *w) {
  const int64_t El = c->g->El, nrows = a->nrows, me = c->g->tr.rank;
  const size_t xb = w->xb, sb = w->sb, es = a->es, ss = a->ss;
  char *ox = (char *)a->recv_x->data, *os = a->fp8 ? (char *)a->recv_scales->data : NULL;
  float *wt = a->recv_weights ? (float *)a->recv_weights->data : NULL;
  expand_job job = {c, eh, a, w, 0, eh->recv_off[me]};
  expand_rows(&job);
  job.i0 = eh->recv_off[me + 1];
  job.i1 = eh->h->nrecv;
  expand_rows(&job);
  xte_ep_zero_unrouted(c, eh, El, ox, (size_t)a->ldo * es, xb, nrows);
  if (sb) xte_ep_zero_unrouted(c, eh, El, os, (size_t)a->ldrs * ss, sb, nrows);
  if (wt && c->gpu) xte_ep_zero_unrouted(c, eh, El, (char *)wt, 4, 4, nrows);
}

xte_status xte_ep_dispatch_run(xte_ep_call *c, xte_ep_handle *eh, xte_status st,
                               const xte_ep_dispatch_args *a) {
  static const char *const names[XTE_EP_NSIG] = {
      "x->dtype", "x_scales->dtype", "x_scales' columns", "topk_weights (given or not)", NULL,
      NULL};
  struct xte_ep_group_s *g = c->g;
  int64_t sig[XTE_EP_NSIG] = {0}, t_local;
  dws w;
  memset(&w, 0, sizeof w);
  if (st == XTE_SUCCESS) st = dispatch_ws(c, eh, a, &w, sig);
  st = xte_ep_agree_or_free(g, st, sig, names, w.blk, w.wbuf);
  if (st != XTE_SUCCESS) return xte_ep_call_end(c, st);
  /* expert-major rows far past the caches: written with streaming stores (the grouped GEMM reads
   * them much later; a cached write would first read every destination line) */
  if (!a->tm && (uint64_t)a->nrows * w.xb >= (uint64_t)g->stream_min) xte_ep_call_stream_rows(c);
  st = dispatch_exchange(c, eh, a, &w);
  t_local = xte_ep_now_ns();
  if (st == XTE_SUCCESS && a->tm)
    st = tokens_out(c, eh, a, &w);
  else if (st == XTE_SUCCESS)
    expand_rest(c, eh, a, &w);
  st = xte_ep_call_end(c, st);
  xte_ep_ws_free(g, w.blk);
  xte_ep_ws_free(g, w.wbuf);
  g->stats.local_ns += xte_ep_now_ns() - t_local;
  g->stats.calls++;
  if (st != XTE_SUCCESS) return st;
  eh->h->dispatched = 1;
  xte_clear_error();
  return XTE_SUCCESS;
}
