/* The rows back and forth: combine and dispatch_backward (expert rows back to the tokens' ranks,
 * then the one-process gather-sum there), combine_backward (the reverse); each after its checks. */
#include "xte/moe.h"

#include "ep/ep_core.h"

/* The block lists of the rows of every received (record, local slot), read or written in place
 * at rows (ld elements apart), and of this rank's own slot rows in buf (src_row_map's order:
 * per rank, (expert, token) ascending), cut alike on both sides: a block per (source rank,
 * local expert), the expert's rows of that rank's records being consecutive rows, or a block
 * per row where the expert side's rows are not dense (bit 0 of its agreement sig[5]).
 * rows_send: rows are sent (combine, dispatch_backward), else received (combine_backward). */
static void slot_blocks(const struct xte_ep_group_s *g, const xte_ep_handle *eh, char *rows,
                        int64_t ld, size_t es, size_t row_bytes, char *buf, int rows_send,
                        xte_ep_blist *bs, xte_ep_blist *br) {
  int64_t l, k, El = g->El;
  int r;
  xte_ep_blist *side_rows = rows_send ? bs : br, *side_buf = rows_send ? br : bs;
  const int me_dense = (int)(g->agree[g->tr.rank].sig[5] & 1);
  for (r = 0; r < g->R; r++) {
    const int r_dense = (int)(g->agree[r].sig[5] & 1);
    int64_t off = eh->slot_off[r];
    xte_ep_blist_peer(side_rows, r);
    for (l = 0; l < El; l++) {
      int64_t n = eh->ein_cnt[r * El + l], row = eh->ein_row[r * El + l];
      for (k = 0; k < n; k++)
        xte_ep_blist_seg(side_rows, rows + (size_t)(row + k) * (size_t)ld * es, (int64_t)row_bytes,
                         me_dense && k > 0);
    }
    xte_ep_blist_peer(side_buf, r);
    for (l = 0; l < El; l++) {
      int64_t n = eh->ecnt_out[r * El + l];
      for (k = 0; k < n; k++)
        xte_ep_blist_seg(side_buf, buf + (size_t)(off + k) * row_bytes, (int64_t)row_bytes,
                         r_dense && k > 0);
      off += n;
    }
  }
  xte_ep_blist_peer(bs, g->R);
  xte_ep_blist_peer(br, g->R);
}

/* The routing of this rank's own tokens (the handle's int32 copy) and src_row_map as tensors. */
static xte_status own_routing(xte_ep_call *c, const xte_ep_handle *eh, xte_tensor *idx,
                              xte_tensor *rm, xte_moe_routing *routing) {
  const struct xte_ep_group_s *g = c->g;
  int64_t T = eh->h->T;
  void *pi = T ? (void *)eh->topk : (void *)xte_ep_empty_row;
  void *pr = T ? (void *)eh->src_row_map : (void *)xte_ep_empty_row;
  if (c->gpu && T) {
    /* the token movement kernels read them from device memory: uploaded */
    size_t b = (size_t)T * (size_t)g->K * 4;
    char *d = NULL;
    XTE_TRY(xte_ep_ws_data(c, 0, 3, 2, b, (void **)&d));
    XTE_TRY(xte_ep_to_device(c, d, eh->topk, b));
    XTE_TRY(xte_ep_to_device(c, d + b, eh->src_row_map, b));
    pi = d;
    pr = d + b;
  }
  *idx = xte_ep_mk2d(pi, XTE_DTYPE_INT32, T, g->K, g->K);
  *rm = xte_ep_mk2d(pr, XTE_DTYPE_INT32, T, g->K, g->K);
  routing->routing_map = NULL;
  routing->topk_idx = idx;
  routing->num_experts = g->E;
  return XTE_SUCCESS;
}

xte_status xte_ep_return_run(xte_ep_call *c, xte_ep_handle *eh, xte_status st,
                             const xte_tensor *rows, int64_t ld, const xte_tensor *weights,
                             xte_tensor *out, xte_tensor *slot_rows, int backward,
                             xte_stream stream) {
  static const char *const names[XTE_EP_NSIG] = {
      "the expert rows' dtype", NULL, NULL, NULL, NULL, NULL};
  struct xte_ep_group_s *g = c->g;
  const int64_t H = g->H;
  size_t es = 0, rb = 0;
  char *sendbuf = NULL, *recvbuf = NULL;
  int64_t sig[XTE_EP_NSIG] = {0}, t0;
  if (st == XTE_SUCCESS) {
    size_t lb = 0;
    es = xte_dtype_size(rows->dtype);
    rb = (size_t)H * es;
    if (!xte_ep_blist_bytes(eh->h->nret + g->R, eh->h->nslot + g->R, g->R, &lb))
      st = xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "workspace size overflows");
    if (st == XTE_SUCCESS) st = xte_ep_ws_alloc(g, 0, 1, lb, (void **)&sendbuf);
    /* received into workspace even when slot_rows is given: slot_rows is written only after the
     * local sum succeeded (nothing written on error) */
    if (st == XTE_SUCCESS) st = xte_ep_ws_data(c, 1, 0, eh->h->nslot, rb, (void **)&recvbuf);
    if (st == XTE_SUCCESS)
      st = xte_ep_reserve(g, (eh->h->nret > eh->h->nslot ? eh->h->nret : eh->h->nslot) + g->R,
                          eh->h->nret * (int64_t)rb, eh->h->nslot * (int64_t)rb);
    sig[0] = rows->dtype;
    sig[5] = ld == H; /* not compared: this rank's expert rows are dense */
  }
  st = xte_ep_agree_or_free(g, st, sig, names, sendbuf, recvbuf);
  if (st != XTE_SUCCESS) return xte_ep_call_end(c, st);
  t0 = xte_ep_now_ns();
  {
    /* the expert rows are sent in place (no staging copy) */
    xte_ep_blist bs, br;
    xte_ep_blist_init(sendbuf, eh->h->nret + g->R, eh->h->nslot + g->R, g->R, &bs, &br);
    slot_blocks(g, eh, (char *)rows->data, ld, es, rb, recvbuf, 1, &bs, &br);
    g->stats.pack_ns += xte_ep_now_ns() - t0;
    st = xte_ep_exchange(g, &bs, &br, 1);
  }
  xte_ep_ws_free(g, sendbuf);
  t0 = xte_ep_now_ns();
  if (st == XTE_SUCCESS) {
    xte_tensor idx, rm, in = xte_ep_mk2d(recvbuf, rows->dtype, eh->h->nslot, H, H);
    xte_moe_routing routing;
    st = own_routing(c, eh, &idx, &rm, &routing);
    if (st == XTE_SUCCESS && backward)
      st = xte_moe_permute_backward(&in, &routing, &rm, out, stream);
    else if (st == XTE_SUCCESS)
      st = xte_moe_unpermute(&in, &routing, &rm, weights, out, stream);
  }
  if (st == XTE_SUCCESS && slot_rows && eh->h->nslot)
    xte_ep_mv_copy(c, slot_rows->data, recvbuf, (size_t)eh->h->nslot * rb);
  st = xte_ep_call_end(c, st);
  xte_ep_ws_free(g, recvbuf);
  g->stats.local_ns += xte_ep_now_ns() - t0;
  g->stats.calls++;
  if (st == XTE_SUCCESS) xte_clear_error();
  return st;
}

xte_status xte_ep_combine_backward_run(xte_ep_call *c, xte_ep_handle *eh, xte_status st,
                                       const xte_tensor *grad_out, const xte_tensor *topk_weights,
                                       const xte_tensor *slot_rows, xte_tensor *grad_expert_out,
                                       int64_t ldg, int64_t nrows, xte_tensor *grad_weights,
                                       xte_stream stream) {
  static const char *const names[XTE_EP_NSIG] = {
      "grad_expert_out->dtype", NULL, NULL, NULL, NULL, NULL};
  struct xte_ep_group_s *g = c->g;
  const int64_t H = g->H;
  size_t es = 0, rb = 0;
  char *sendbuf = NULL, *recvbuf = NULL;
  int64_t sig[XTE_EP_NSIG] = {0}, t0;
  if (st == XTE_SUCCESS) {
    size_t lb = 0;
    es = xte_dtype_size(grad_expert_out->dtype);
    rb = (size_t)H * es;
    st = xte_ep_ws_data(c, 0, 1, eh->h->nslot, rb, (void **)&sendbuf);
    if (st == XTE_SUCCESS &&
        !xte_ep_blist_bytes(eh->h->nslot + g->R, eh->h->nret + g->R, g->R, &lb))
      st = xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "workspace size overflows");
    if (st == XTE_SUCCESS) st = xte_ep_ws_alloc(g, 1, 1, lb, (void **)&recvbuf);
    if (st == XTE_SUCCESS)
      st = xte_ep_reserve(g, (eh->h->nret > eh->h->nslot ? eh->h->nret : eh->h->nslot) + g->R,
                          eh->h->nslot * (int64_t)rb, eh->h->nret * (int64_t)rb);
    sig[0] = grad_expert_out->dtype;
    sig[5] = ldg == H; /* not compared: this rank's expert rows are dense */
  }
  st = xte_ep_agree_or_free(g, st, sig, names, sendbuf, recvbuf);
  if (st != XTE_SUCCESS) return xte_ep_call_end(c, st);
  t0 = xte_ep_now_ns();
  {
    xte_tensor idx, rm, gi = xte_ep_mk2d(sendbuf, grad_expert_out->dtype, eh->h->nslot, H, H);
    xte_moe_routing routing;
    st = own_routing(c, eh, &idx, &rm, &routing);
    if (st == XTE_SUCCESS)
      st = xte_moe_unpermute_backward(grad_out, grad_weights ? slot_rows : NULL, &routing, &rm,
                                      topk_weights, &gi, grad_weights, stream);
  }
  g->stats.local_ns += xte_ep_now_ns() - t0;
  if (st == XTE_SUCCESS) {
    /* received straight into grad_expert_out's rows */
    xte_ep_blist bs, br;
    t0 = xte_ep_now_ns();
    xte_ep_blist_init(recvbuf, eh->h->nslot + g->R, eh->h->nret + g->R, g->R, &bs, &br);
    slot_blocks(g, eh, (char *)grad_expert_out->data, ldg, es, rb, sendbuf, 0, &bs, &br);
    g->stats.pack_ns += xte_ep_now_ns() - t0;
    st = xte_ep_exchange(g, &bs, &br, 1);
  }
  xte_ep_ws_free(g, sendbuf);
  t0 = xte_ep_now_ns();
  if (st == XTE_SUCCESS)
    xte_ep_zero_unrouted(c, eh, g->El, (char *)grad_expert_out->data, (size_t)ldg * es, rb, nrows);
  st = xte_ep_call_end(c, st);
  g->stats.local_ns += xte_ep_now_ns() - t0;
  g->stats.calls++;
  xte_ep_ws_free(g, recvbuf);
  if (st == XTE_SUCCESS) xte_clear_error();
  return st;
}
