/* The group and a call's machinery: group creation over a transport (agreement on the
 * configuration) and release, a call's stream and byte moves (in place on the host, queued block
 * moves on a GPU), workspace kept across calls, block lists and the timed exchange. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdlib.h>
#include <time.h>

#include "ep/ep_core.h"

char xte_ep_empty_row[64] __attribute__((aligned(64)));

int64_t xte_ep_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void xte_ep_group_release(struct xte_ep_group_s *g) {
  int i;
  for (i = 0; i < 4; i++)
    if (g->dws[i]) (void)g->gops->dealloc(g->device, g->dws[i]);
  xte_aligned_free(g->mv);
  xte_aligned_free(g->agree);
  xte_aligned_free(g);
}

xte_status xte_ep_group_finish(xte_ep_transport *tr, struct xte_ep_group_s *cfg, xte_status st,
                               xte_ep_group *group, const xte_exec *ex) {
  static const char *const names[XTE_EP_NSIG] = {"config->experts_per_rank",
                                                 "config->hidden",
                                                 "config->topk",
                                                 "config->align",
                                                 "config->max_tokens_per_rank",
                                                 NULL};
  struct xte_ep_group_s *g;
  int64_t sig[XTE_EP_NSIG] = {0};
  g = (struct xte_ep_group_s *)xte_aligned_calloc(1, sizeof *g);
  if (g)
    g->agree = (xte_ep_agree_msg *)xte_aligned_calloc((size_t)tr->size, sizeof(xte_ep_agree_msg));
  /* the move list: every GPU call's, and a CPU call's that streams its rows
   * (xte_ep_call_stream_rows) */
  if (g) g->mv = (xte_ep_block *)xte_aligned_calloc(XTE_EP_MV_CAP, sizeof(xte_ep_block));
  if (!g || !g->agree || !g->mv) {
    /* no agreement without its buffer: the other ranks may wait for this one (documented) */
    if (g) {
      xte_aligned_free(g->mv);
      xte_aligned_free(g->agree);
      xte_aligned_free(g);
    }
    tr->destroy(tr->ctx);
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "group: out of memory");
  }
  g->tr = *tr;
  {
    const char *e = getenv("XTE_EP_STREAM_MIN");
    g->stream_min = e && e[0] ? strtoll(e, NULL, 10) : XTE_EP_STREAM_MIN_DEFAULT;
  }
  if (ex) {
    g->gpu = 1;
    g->backend = ex->backend;
    g->device = ex->device;
    g->gops = ex->ops;
    g->h0 = ex->handle;
  }
  if (st == XTE_SUCCESS) {
    g->R = cfg->R;
    g->El = cfg->El;
    g->E = cfg->E;
    g->H = cfg->H;
    g->K = cfg->K;
    g->align = cfg->align;
    g->Tmax = cfg->Tmax;
    g->handle_bytes = cfg->handle_bytes;
    sig[0] = g->El;
    sig[1] = g->H;
    sig[2] = g->K;
    sig[3] = g->align;
    sig[4] = g->Tmax;
  }
  st = xte_ep_agree(g, st, sig, names);
  if (st != XTE_SUCCESS) {
    g->tr.destroy(g->tr.ctx);
    xte_ep_group_release(g);
    return st;
  }
  *group = g;
  xte_clear_error();
  return XTE_SUCCESS;
}

/* The call's stream: a CPU stream (NULL or the CPU backend) for a CPU group; a stream of the
 * group's backend and device for a GPU group, bound to its transport (on failure the group's
 * creation stream is bound, so that the agreement still runs). */
xte_status xte_ep_call_stream(struct xte_ep_group_s *g, xte_stream stream, xte_ep_call *c) {
  xte_exec ex;
  xte_status st;
  memset(c, 0, sizeof *c);
  c->g = g;
  c->gpu = g->gpu;
  c->queue = g->gpu;
  c->mvops = g->gpu ? g->gops->ep : NULL;
  c->h = g->h0;
  if (g->gpu && g->tr.bind) g->tr.bind(g->tr.ctx, g->h0);
  st = xte_resolve_stream(stream, &ex);
  if (st != XTE_SUCCESS) return st;
  if (!g->gpu) {
    if (ex.backend != XTE_BACKEND_CPU)
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "stream: a %s stream, but this group's transport (%s) runs on the CPU "
                           "backend (want NULL or a CPU stream)",
                           xte_backend_name(ex.backend), g->tr.name);
    return XTE_SUCCESS;
  }
  if (ex.backend != g->backend || ex.device != g->device)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "stream: a %s stream of device %d; this %s group wants a %s stream of "
                         "device %d",
                         xte_backend_name(ex.backend), ex.device, g->tr.name,
                         xte_backend_name(g->backend), g->device);
  c->h = ex.handle;
  if (g->tr.bind) g->tr.bind(g->tr.ctx, ex.handle);
  return XTE_SUCCESS;
}

/* A CPU call's moves from here on queued and run by the CPU backend's block move, which writes
 * long moves with streaming stores: for outputs far larger than the caches, which then skip the
 * read of each destination line before its write. */
void xte_ep_call_stream_rows(xte_ep_call *c) {
  const xte_backend_ops *cpu = xte_cpu_backend_ops();
  if (c->gpu || !cpu->ep || !cpu->ep->blocks) return;
  c->mvops = cpu->ep;
  c->queue = 1;
}

/* Runs the pending moves of a call: a GPU call's enqueued (one launch), a streaming CPU call's
 * done on the host. */
xte_status xte_ep_mv_flush(xte_ep_call *c) {
  if (c->queue && c->n) {
    xte_status st = c->mvops->blocks(c->h, c->g->mv, c->n);
    if (st != XTE_SUCCESS && c->st == XTE_SUCCESS) c->st = st;
    c->n = 0;
  }
  return c->st;
}

void xte_ep_mv_add(xte_ep_call *c, const void *src, void *dst, size_t len) {
  xte_ep_block *last = c->n ? &c->g->mv[c->n - 1] : NULL;
  if (!len) return;
  /* the continuation of the last move (rows back to back on both sides) extends it */
  if (last && (char *)last->dst + last->len == (char *)dst &&
      ((!src && !last->src) ||
       (src && last->src && (const char *)last->src + last->len == (const char *)src))) {
    last->len += (int64_t)len;
    return;
  }
  if (c->n == XTE_EP_MV_CAP) (void)xte_ep_mv_flush(c);
  c->g->mv[c->n].src = src;
  c->g->mv[c->n].dst = dst;
  c->g->mv[c->n].len = (int64_t)len;
  c->n++;
}

/* The end of a GPU call: pending moves enqueued, the stream finished (the group's workspace is
 * reused by the next call, which may come on another stream). */
xte_status xte_ep_call_end(xte_ep_call *c, xte_status st) {
  xte_status fs;
  if (!c->gpu) {
    fs = xte_ep_mv_flush(c);
    return st == XTE_SUCCESS ? fs : st;
  }
  fs = xte_ep_mv_flush(c);
  if (st == XTE_SUCCESS) st = fs;
  fs = c->g->gops->synchronize(c->h);
  return st == XTE_SUCCESS ? fs : st;
}

/* Host bytes to device memory of a GPU call (synchronized). */
xte_status xte_ep_to_device(xte_ep_call *c, void *dst, const void *src, size_t bytes) {
  if (!bytes) return XTE_SUCCESS;
  XTE_TRY(xte_ep_mv_flush(c));
  return c->g->gops->copy(c->h, dst, src, bytes, 0);
}

/* Workspace of n_rows * row_bytes bytes (a non-NULL pointer when that is 0): the group's buffer
 * `slot` (0 send, 1 receive), grown when too small, or with g NULL a fresh allocation. */
xte_status xte_ep_ws_alloc(struct xte_ep_group_s *g, int slot, int64_t n_rows, size_t row_bytes,
                           void **p) {
  size_t b;
  if (n_rows < 0 || __builtin_mul_overflow((size_t)n_rows, row_bytes, &b))
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "workspace size overflows");
  if (b == 0) {
    *p = xte_ep_empty_row;
    return XTE_SUCCESS;
  }
  if (g && g->ws_bytes[slot] >= b) {
    *p = g->ws[slot];
    return XTE_SUCCESS;
  }
  *p = xte_aligned_alloc(b);
  if (!*p) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "out of memory for %zu bytes", b);
  if (g) {
    xte_aligned_free(g->ws[slot]);
    g->ws[slot] = *p;
    g->ws_bytes[slot] = b;
  }
  return XTE_SUCCESS;
}

/* Frees a workspace of ws_alloc (the group's buffers stay). */
void xte_ep_ws_free(struct xte_ep_group_s *g, void *p) {
  if (!p || p == (void *)xte_ep_empty_row) return;
  if (g && (p == g->ws[0] || p == g->ws[1])) return;
  if (g && g->gpu) return; /* device workspace: the group's, kept */
  xte_aligned_free(p);
}

/* Workspace for tensor rows of a call: host memory (ws_alloc's buffer `slot`, 0 or 1) for a CPU
 * group, else the group's device buffer dslot (grown when too small, after the stream finished
 * what may still use the old one). */
xte_status xte_ep_ws_data(xte_ep_call *c, int slot, int dslot, int64_t n_rows, size_t row_bytes,
                          void **p) {
  struct xte_ep_group_s *g = c->g;
  size_t b;
  void *q = NULL;
  if (!c->gpu) return xte_ep_ws_alloc(g, slot, n_rows, row_bytes, p);
  if (n_rows < 0 || __builtin_mul_overflow((size_t)n_rows, row_bytes, &b))
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "workspace size overflows");
  if (b == 0) {
    *p = xte_ep_empty_row; /* never dereferenced: no rows */
    return XTE_SUCCESS;
  }
  if (g->dws_bytes[dslot] >= b) {
    *p = g->dws[dslot];
    return XTE_SUCCESS;
  }
  b = (b + 255) & ~(size_t)255;
  if (g->dws[dslot]) {
    XTE_TRY(xte_ep_mv_flush(c));
    XTE_TRY(g->gops->synchronize(c->h));
  }
  XTE_TRY(g->gops->alloc(g->device, b, &q));
  if (g->dws[dslot]) (void)g->gops->dealloc(g->device, g->dws[dslot]);
  g->dws[dslot] = q;
  g->dws_bytes[dslot] = b;
  *p = q;
  return XTE_SUCCESS;
}

/* Bytes of two block lists (send and receive) of at most ns and nr blocks over R peers. */
int xte_ep_blist_bytes(int64_t ns, int64_t nr, int R, size_t *bytes) {
  size_t n, b;
  if (ns < 0 || nr < 0 || __builtin_add_overflow((size_t)ns, (size_t)nr, &n) ||
      __builtin_add_overflow(n, (size_t)2 * ((size_t)R + 1), &n) ||
      __builtin_mul_overflow(n, (size_t)16, &b))
    return 0;
  *bytes = b;
  return 1;
}

/* Carves the two lists out of mem (blist_bytes of it). */
void xte_ep_blist_init(void *mem, int64_t ns, int64_t nr, int R, xte_ep_blist *s, xte_ep_blist *r) {
  char *p = (char *)mem;
  s->addr = (intptr_t *)p;
  s->len = (int64_t *)(p + (size_t)ns * 8);
  s->off = (int64_t *)(p + (size_t)ns * 16);
  p += (size_t)ns * 16 + ((size_t)R + 1) * 8;
  r->addr = (intptr_t *)p;
  r->len = (int64_t *)(p + (size_t)nr * 8);
  r->off = (int64_t *)(p + (size_t)nr * 16);
  s->n = s->peer_start = r->n = r->peer_start = 0;
}

/* Room in the transport for an exchange (before the agreement: a failure is a local error). */
xte_status xte_ep_reserve(struct xte_ep_group_s *g, int64_t nblocks, int64_t sbytes,
                          int64_t rbytes) {
  if (!g->tr.reserve) return XTE_SUCCESS;
  return g->tr.reserve(g->tr.ctx, nblocks, sbytes, rbytes);
}

/* The exchange of two block lists (xte_ep_blist_peer(R) closed them), timed and counted; matched:
 * the lists were cut alike on both sides of every pair (blist_seg). */
xte_status xte_ep_exchange(struct xte_ep_group_s *g, xte_ep_blist *s, xte_ep_blist *r,
                           int matched) {
  int64_t t0 = xte_ep_now_ns(), b;
  int p;
  xte_status st =
      matched && g->tr.alltoallw_matched
          ? g->tr.alltoallw_matched(g->tr.ctx, s->addr, s->len, s->off, r->addr, r->len, r->off)
          : g->tr.alltoallw(g->tr.ctx, s->addr, s->len, s->off, r->addr, r->len, r->off);
  g->stats.exchange_ns += xte_ep_now_ns() - t0;
  for (p = 0; p < g->R; p++) {
    if (p == g->tr.rank) continue;
    for (b = s->off[p]; b < s->off[p + 1]; b++) g->stats.bytes_sent += s->len[b];
    for (b = r->off[p]; b < r->off[p + 1]; b++) g->stats.bytes_received += r->len[b];
  }
  return st;
}

xte_status xte_ep_exchange_overlap(struct xte_ep_group_s *g, xte_ep_blist *s, xte_ep_blist *r,
                                   void (*work)(void *), void *arg) {
  int64_t t0, t1;
  xte_status st, ws;
  if (!g->tr.alltoallw_matched_start || !g->tr.alltoallw_wait) {
    st = xte_ep_exchange(g, s, r, 1);
    t0 = xte_ep_now_ns();
    if (st == XTE_SUCCESS) work(arg);
    g->stats.local_ns += xte_ep_now_ns() - t0;
    return st;
  }
  t0 = xte_ep_now_ns();
  st = g->tr.alltoallw_matched_start(g->tr.ctx, s->addr, s->len, s->off, r->addr, r->len, r->off);
  t1 = xte_ep_now_ns();
  g->stats.exchange_ns += t1 - t0;
  if (st == XTE_SUCCESS) work(arg);
  t0 = xte_ep_now_ns();
  g->stats.local_ns += t0 - t1;
  ws = g->tr.alltoallw_wait(g->tr.ctx);
  g->stats.exchange_ns += xte_ep_now_ns() - t0;
  if (st == XTE_SUCCESS) st = ws;
  /* the bytes, counted as xte_ep_exchange counts them */
  {
    int p;
    int64_t b;
    for (p = 0; p < g->R; p++) {
      if (p == g->tr.rank) continue;
      for (b = s->off[p]; b < s->off[p + 1]; b++) g->stats.bytes_sent += s->len[b];
      for (b = r->off[p]; b < r->off[p + 1]; b++) g->stats.bytes_received += r->len[b];
    }
  }
  return st;
}

/* Zeroes recv rows that no (token, slot) fills: each expert's padding and rows [recv_rows,
 * nrows) of data (row_bytes per row, ld bytes apart). */
void xte_ep_zero_unrouted(xte_ep_call *c, const xte_ep_handle *eh, int64_t El, char *data,
                          size_t ld, size_t row_bytes, int64_t nrows) {
  int64_t e, row;
  for (e = 0; e <= El; e++) {
    int64_t r0 = e < El ? eh->poff[e] + eh->tpe[e] : eh->h->recv_rows;
    int64_t r1 = e < El ? eh->poff[e + 1] : nrows;
    for (row = r0; row < r1; row++) xte_ep_mv_zero(c, data + (size_t)row * ld, row_bytes);
  }
}
