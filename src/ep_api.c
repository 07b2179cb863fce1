/* Entry points of expert parallelism (include/xte/ep.h): argument checks, the ranks' agreement,
 * then token rows moved by a transport (src/ep/) around the one-process token movement calls
 * (xte_moe_permute / unpermute and their backwards), which do all the arithmetic. The transport
 * only moves bytes, so every sum is the one-process sum, in its order.
 *
 * Data movement of a step, for rank me:
 *  prepare   the send lists (token t goes to rank r once when one of its experts lives on r) and
 *            the receive side's routing (each received token's k slots as local expert ids, -1
 *            where the expert is elsewhere, and the sender's token index), exchanged once.
 *  dispatch  one exchange: per (token, rank) the x row, read in place, then per peer the small
 *            records [scale row | k weights]. The rows land token-major (in recv_x for
 *            dispatch_tokens, else in workspace that the expert-major expansion copies to each
 *            local slot's row).
 *  combine / dispatch_backward
 *            the rows of each received (token, local slot) go back to the token's rank, in the
 *            order (local expert, token): one block of consecutive rows per (rank, expert); the
 *            token's rank finds the row of its slot (t, j) at src_row_map[t, j] and runs the
 *            one-process unpermute / permute backward (its sum order is the slots', whatever
 *            the buffer's row order).
 *  combine_backward
 *            the reverse: unpermute backward at the token's rank, rows out to the experts.
 *
 * Every exchange is "matched": both sides of a pair cut their stream into the same blocks (runs
 * of consecutive tokens, (rank, expert) row groups; one block per row where a rank's rows are
 * not back to back, which the ranks learn from each other in the agreement), so that a
 * transport can move each block as it is, with no staging copy (src/ep/mpi.c does for large
 * blocks).
 *
 * Agreement: each collective first runs every local check (and allocates its workspace), then
 * all ranks exchange their status with an allgather; one failing rank fails all of them before
 * any data moves. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/config.h"
#include "core/tensor.h"
#include "ep/ep_transport.h"
#include "xte/ep.h"
#include "xte/moe.h"
#include "xte_internal.h"

#define EP_MAGIC 0x7874652d65702d31ull /* "xte-ep-1" */
#define NSIG 6

typedef struct agree_msg {
  int32_t status;
  int32_t pad;
  int64_t sig[NSIG];
  char msg[144];
} agree_msg;

struct xte_ep_group_s {
  xte_ep_transport tr;
  int R;
  int64_t El, E, H, Tmax;
  int K, align;
  size_t handle_bytes;
  agree_msg *agree; /* [R] */
  xte_ep_stats stats;
  void *ws[2]; /* send / receive workspace, kept and grown across calls (no page faults per call) */
  size_t ws_bytes[2];
  /* GPU groups (NCCL / MCCL): tensor memory is device memory of `device`, which the core never
   * dereferences: every byte move of tensor data goes through the backend's block move (gops->ep),
   * reads the host needs are copies. The routing handle stays in host memory. */
  int gpu;
  xte_backend backend;
  int device;
  const xte_backend_ops *gops;
  void *h0;     /* the stream handle given at creation (agreements of a call whose stream failed) */
  void *dws[4]; /* device workspace: receive rows, send rows, send records, uploads */
  size_t dws_bytes[4];
  xte_ep_block *mv; /* the host move list of a call, flushed when full */
};

#define EP_MV_CAP 4096

/* A collective call's execution: the stream handle of a GPU group's call and its pending moves. */
typedef struct ep_call {
  struct xte_ep_group_s *g;
  int gpu;
  void *h;
  int64_t n;     /* pending moves in g->mv */
  xte_status st; /* the first failed flush */
} ep_call;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The handle: this header, then the arrays at offsets fixed by the group. */
typedef struct ep_hdr {
  uint64_t magic;
  const struct xte_ep_group_s *group;
  int64_t T, nsend, nrecv, nslot, nret, recv_rows;
  int32_t prepared, dispatched;
} ep_hdr;

typedef struct ep_handle {
  ep_hdr *h;
  int64_t *send_cnt, *send_off; /* tokens to rank r          [R], [R + 1] */
  int64_t *slot_cnt, *slot_off; /* my routed slots on rank r [R], [R + 1] */
  int64_t *recv_cnt, *recv_off; /* records from rank r       [R], [R + 1] */
  int64_t *ret_cnt, *ret_off;   /* rows back to rank r       [R], [R + 1] */
  int64_t *tpe;                 /* rows per local expert     [El] */
  int64_t *poff;                /* first row of local expert [El + 1] (padded) */
  int64_t *ecnt_out;            /* my routed slots per global expert [E] */
  int64_t *ein_cnt, *ein_row;   /* rows of (source rank r, local expert l) [E]: count, first */
  int32_t *send_tok;            /* [Tmax * min(K, R)] */
  int32_t *topk;                /* [Tmax * K] global experts, -1 none */
  int32_t *src_row_map;         /* [Tmax * K] */
  int32_t *recv_topk;           /* [R * Tmax * K] local experts, -1 elsewhere */
  int32_t *row_map;             /* [R * Tmax * K] rows of recv_x */
  int32_t *recv_tok;            /* [R * Tmax] the sender's token of each received record */
} ep_handle;

/* ------------------------------------------------------------------ sizes */

static int add_sz(size_t *acc, size_t n, size_t elem) {
  size_t b;
  if (__builtin_mul_overflow(n, elem, &b)) return 0;
  b = (b + 63) & ~(size_t)63;
  if (b < n * elem || __builtin_add_overflow(*acc, b, acc)) return 0;
  return 1;
}

/* Lays out the handle at base (NULL: only computes the size into *bytes). */
static int handle_layout(const struct xte_ep_group_s *g, char *base, ep_handle *eh, size_t *bytes) {
  size_t off = 0, R = (size_t)g->R, R1 = R + 1, K = (size_t)g->K, T = (size_t)g->Tmax;
  size_t kr = K < R ? K : R, RT;
  size_t o[20];
  int n = 0;
  if (__builtin_mul_overflow(R, T, &RT)) return 0;
#define EP_ARR(cnt, elem)                       \
  do {                                          \
    o[n++] = off;                               \
    if (!add_sz(&off, (cnt), (elem))) return 0; \
  } while (0)
  EP_ARR(1, sizeof(ep_hdr));
  EP_ARR(R, 8);
  EP_ARR(R1, 8);
  EP_ARR(R, 8);
  EP_ARR(R1, 8);
  EP_ARR(R, 8);
  EP_ARR(R1, 8);
  EP_ARR(R, 8);
  EP_ARR(R1, 8);
  EP_ARR((size_t)g->El, 8);
  EP_ARR((size_t)g->El + 1, 8);
  EP_ARR((size_t)g->E, 8);
  EP_ARR((size_t)g->E, 8);
  EP_ARR((size_t)g->E, 8);
  if (T && kr > SIZE_MAX / T) return 0;
  EP_ARR(T * kr, 4);
  if (T && K > SIZE_MAX / T) return 0;
  EP_ARR(T * K, 4);
  EP_ARR(T * K, 4);
  if (RT && K > SIZE_MAX / RT) return 0;
  EP_ARR(RT * K, 4);
  EP_ARR(RT * K, 4);
  EP_ARR(RT, 4);
#undef EP_ARR
  *bytes = off;
  if (base && eh) {
    eh->h = (ep_hdr *)(base + o[0]);
    eh->send_cnt = (int64_t *)(base + o[1]);
    eh->send_off = (int64_t *)(base + o[2]);
    eh->slot_cnt = (int64_t *)(base + o[3]);
    eh->slot_off = (int64_t *)(base + o[4]);
    eh->recv_cnt = (int64_t *)(base + o[5]);
    eh->recv_off = (int64_t *)(base + o[6]);
    eh->ret_cnt = (int64_t *)(base + o[7]);
    eh->ret_off = (int64_t *)(base + o[8]);
    eh->tpe = (int64_t *)(base + o[9]);
    eh->poff = (int64_t *)(base + o[10]);
    eh->ecnt_out = (int64_t *)(base + o[11]);
    eh->ein_cnt = (int64_t *)(base + o[12]);
    eh->ein_row = (int64_t *)(base + o[13]);
    eh->send_tok = (int32_t *)(base + o[14]);
    eh->topk = (int32_t *)(base + o[15]);
    eh->src_row_map = (int32_t *)(base + o[16]);
    eh->recv_topk = (int32_t *)(base + o[17]);
    eh->row_map = (int32_t *)(base + o[18]);
    eh->recv_tok = (int32_t *)(base + o[19]);
  }
  return 1;
}

/* ------------------------------------------------------------------ agreement */

/* Every rank calls this with its local status (XTE_SUCCESS or the error it recorded) and its
 * signature (values that must be equal on every rank, sig_names[i] naming sig[i]; NULL names
 * an unused slot). Returns the same status on every rank. */
static xte_status agree(struct xte_ep_group_s *g, xte_status st, const int64_t *sig,
                        const char *const *sig_names) {
  agree_msg me;
  xte_status ts;
  int r, i;
  memset(&me, 0, sizeof me);
  me.status = (int32_t)st;
  if (sig)
    for (i = 0; i < NSIG; i++) me.sig[i] = sig[i];
  if (st != XTE_SUCCESS) snprintf(me.msg, sizeof me.msg, "%s", xte_last_error());
  ts = g->tr.allgather(g->tr.ctx, &me, g->agree, sizeof me);
  if (ts != XTE_SUCCESS) return ts;
  for (r = 0; r < g->R; r++) {
    if (g->agree[r].status == XTE_SUCCESS) continue;
    if (r == g->tr.rank) return st; /* our own message stands */
    return xte_set_error((xte_status)g->agree[r].status, "rank %d failed its checks: %s", r,
                         g->agree[r].msg);
  }
  if (st != XTE_SUCCESS) return st; /* cannot happen: our status was gathered */
  if (sig_names)
    for (i = 0; i < NSIG; i++) {
      if (!sig_names[i]) continue;
      for (r = 1; r < g->R; r++)
        if (g->agree[r].sig[i] != g->agree[0].sig[i])
          return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                               "%s differs between ranks: %lld on rank 0, %lld on rank %d",
                               sig_names[i], (long long)g->agree[0].sig[i],
                               (long long)g->agree[r].sig[i], r);
    }
  return XTE_SUCCESS;
}

/* ------------------------------------------------------------------ groups */

xte_ep_config xte_ep_config_default(void) {
  xte_ep_config c;
  memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.experts_per_rank = 1;
  c.hidden = 0;
  c.topk = 1;
  c.align = 1;
  c.max_tokens_per_rank = 0;
  return c;
}

static xte_status check_config(const xte_ep_config *config, int R, struct xte_ep_group_s *g) {
  const xte_ep_config def = xte_ep_config_default();
  xte_ep_config cfg;
  const xte_ep_config *c = &cfg;
  XTE_CHECK_PTR(config, "config");
  if (R > 4096)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "the communicator has %d ranks: at most 4096", R);
  /* the config ABI rule (src/core/config.h) */
  XTE_TRY(xte_config_read(config, "config", XTE_CONFIG_END(xte_ep_config, max_tokens_per_rank),
                          sizeof cfg, &def, &cfg));
  if (c->experts_per_rank < 1 || c->experts_per_rank > XTE_MOE_MAX_EXPERTS / R)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "config->experts_per_rank = %lld: want 1..%lld (%d ranks)",
                         (long long)c->experts_per_rank, (long long)(XTE_MOE_MAX_EXPERTS / R), R);
  if (c->hidden < 1 || c->hidden > ((int64_t)1 << 24))
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->hidden = %lld: want 1..2^24",
                         (long long)c->hidden);
  if (c->topk < 1 || c->topk > XTE_EP_MAX_TOPK)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->topk = %d: want 1..%d", c->topk,
                         XTE_EP_MAX_TOPK);
  if (c->align > (1 << 20))
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->align = %d: want <= 2^20", c->align);
  if (c->max_tokens_per_rank < 0 || c->max_tokens_per_rank > INT32_MAX / c->topk / R)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "config->max_tokens_per_rank = %lld: want 0..%lld (int32 rows for %d "
                         "ranks of topk %d)",
                         (long long)c->max_tokens_per_rank, (long long)(INT32_MAX / c->topk / R), R,
                         c->topk);
  /* every row index of a step (received slots plus each expert's padding) fits the int32 row
   * maps of the token movement calls */
  if ((int64_t)R * c->max_tokens_per_rank * c->topk +
          c->experts_per_rank * (int64_t)(c->align > 1 ? c->align - 1 : 0) >
      INT32_MAX)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "config: %d ranks x max_tokens_per_rank %lld x topk %d plus %lld experts' "
                         "padding to align %d can exceed 2^31 - 1 rows",
                         R, (long long)c->max_tokens_per_rank, c->topk,
                         (long long)c->experts_per_rank, c->align);
  g->R = R;
  g->El = c->experts_per_rank;
  g->E = c->experts_per_rank * R;
  g->H = c->hidden;
  g->K = c->topk;
  g->align = c->align > 1 ? c->align : 1;
  g->Tmax = c->max_tokens_per_rank;
  if (!handle_layout(g, NULL, NULL, &g->handle_bytes))
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "config: the routing handle's size overflows (max_tokens_per_rank %lld, "
                         "%d ranks)",
                         (long long)g->Tmax, R);
  return XTE_SUCCESS;
}

static void group_free(struct xte_ep_group_s *g) {
  int i;
  for (i = 0; i < 4; i++)
    if (g->dws[i]) (void)g->gops->dealloc(g->device, g->dws[i]);
  xte_aligned_free(g->mv);
  xte_aligned_free(g->agree);
  xte_aligned_free(g);
}

/* Finishes a group over transport tr (owned from here on): config checks, agreement. ex: the
 * stream of a GPU group's creation (NULL: a CPU group). */
static xte_status group_finish(xte_ep_transport *tr, const xte_ep_config *config,
                               xte_ep_group *group, const xte_exec *ex) {
  static const char *const names[NSIG] = {"config->experts_per_rank",
                                          "config->hidden",
                                          "config->topk",
                                          "config->align",
                                          "config->max_tokens_per_rank",
                                          NULL};
  struct xte_ep_group_s *g;
  xte_status st;
  int64_t sig[NSIG] = {0};
  g = (struct xte_ep_group_s *)xte_aligned_calloc(1, sizeof *g);
  if (g) g->agree = (agree_msg *)xte_aligned_calloc((size_t)tr->size, sizeof(agree_msg));
  if (g && ex) g->mv = (xte_ep_block *)xte_aligned_calloc(EP_MV_CAP, sizeof(xte_ep_block));
  if (!g || !g->agree || (ex && !g->mv)) {
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
  if (ex) {
    g->gpu = 1;
    g->backend = ex->backend;
    g->device = ex->device;
    g->gops = ex->ops;
    g->h0 = ex->handle;
  }
  st = check_config(config, tr->size, g);
  if (st == XTE_SUCCESS) {
    sig[0] = g->El;
    sig[1] = g->H;
    sig[2] = g->K;
    sig[3] = g->align;
    sig[4] = g->Tmax;
  }
  st = agree(g, st, sig, names);
  if (st != XTE_SUCCESS) {
    g->tr.destroy(g->tr.ctx);
    group_free(g);
    return st;
  }
  *group = g;
  xte_clear_error();
  return XTE_SUCCESS;
}

xte_status xte_ep_group_create_mpi(const void *mpi_comm, const xte_ep_config *config,
                                   xte_ep_group *group) {
  xte_ep_transport tr;
  XTE_CHECK_PTR(group, "group");
  XTE_TRY(xte_ep_mpi_transport(mpi_comm, &tr));
  return group_finish(&tr, config, group, NULL);
}

xte_status xte_ep_group_create_threads(xte_ep_threads_world world, int rank,
                                       const xte_ep_config *config, xte_ep_group *group) {
  xte_ep_transport tr;
  XTE_CHECK_PTR(group, "group");
  XTE_TRY(xte_ep_threads_transport(world, rank, &tr));
  return group_finish(&tr, config, group, NULL);
}

/* A group over a GPU plugin's collective library: stream on backend (CUDA: NCCL, MUSA: MCCL). */
static xte_status group_create_gpu(const void *comm, const xte_ep_config *config, xte_stream stream,
                                   xte_ep_group *group, xte_backend backend, const char *ccl) {
  xte_ep_transport tr;
  xte_exec ex;
  XTE_CHECK_PTR(group, "group");
  XTE_CHECK_PTR(comm, "comm");
  XTE_TRY(xte_resolve_stream(stream, &ex));
  if (ex.backend != backend)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "stream: a %s stream; the %s transport wants a %s stream (its device is "
                         "the communicator's)",
                         xte_backend_name(ex.backend), ccl, xte_backend_name(backend));
  if (!ex.ops || !ex.ops->ep || !ex.ops->ep->transport_create || !ex.ops->ep->blocks)
    return xte_set_error(XTE_ERROR_UNSUPPORTED,
                         "the %s plugin has no expert-parallelism table (an older plugin): no %s "
                         "transport",
                         xte_backend_name(backend), ccl);
  XTE_TRY(ex.ops->ep->transport_create(comm, ex.handle, &tr));
  return group_finish(&tr, config, group, &ex);
}

xte_status xte_ep_group_create_nccl(const void *nccl_comm, const xte_ep_config *config,
                                    xte_stream stream, xte_ep_group *group) {
  return group_create_gpu(nccl_comm, config, stream, group, XTE_BACKEND_CUDA, "nccl");
}

xte_status xte_ep_group_create_mccl(const void *mccl_comm, const xte_ep_config *config,
                                    xte_stream stream, xte_ep_group *group) {
  return group_create_gpu(mccl_comm, config, stream, group, XTE_BACKEND_MUSA, "mccl");
}

xte_status xte_ep_group_destroy(xte_ep_group group) {
  if (group) {
    xte_aligned_free(group->ws[0]);
    xte_aligned_free(group->ws[1]);
    group->tr.destroy(group->tr.ctx);
    group_free(group);
  }
  xte_clear_error();
  return XTE_SUCCESS;
}

xte_status xte_ep_group_info(xte_ep_group group, int *rank, int *num_ranks,
                             const char **transport) {
  XTE_CHECK_PTR(group, "group");
  if (rank) *rank = group->tr.rank;
  if (num_ranks) *num_ranks = group->R;
  if (transport) *transport = group->tr.name;
  xte_clear_error();
  return XTE_SUCCESS;
}

xte_status xte_ep_group_stats(xte_ep_group group, xte_ep_stats *stats, int reset) {
  XTE_CHECK_PTR(group, "group");
  if (stats) {
    if (stats->struct_size < sizeof(xte_ep_stats))
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "stats->struct_size = %zu: want sizeof(xte_ep_stats) = %zu",
                           stats->struct_size, sizeof(xte_ep_stats));
    *stats = group->stats;
    stats->struct_size = sizeof(xte_ep_stats);
  }
  if (reset) memset(&group->stats, 0, sizeof group->stats);
  xte_clear_error();
  return XTE_SUCCESS;
}

xte_status xte_ep_handle_size(xte_ep_group group, size_t *bytes) {
  XTE_CHECK_PTR(group, "group");
  XTE_CHECK_PTR(bytes, "bytes");
  *bytes = group->handle_bytes;
  xte_clear_error();
  return XTE_SUCCESS;
}

/* ------------------------------------------------------------------ helpers */

/* The call's stream: a CPU stream (NULL or the CPU backend) for a CPU group; a stream of the
 * group's backend and device for a GPU group, bound to its transport (on failure the group's
 * creation stream is bound, so that the agreement still runs). */
static xte_status call_stream(struct xte_ep_group_s *g, xte_stream stream, ep_call *c) {
  xte_exec ex;
  xte_status st;
  memset(c, 0, sizeof *c);
  c->g = g;
  c->gpu = g->gpu;
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

/* Enqueues the pending moves of a GPU call (one launch). */
static xte_status mv_flush(ep_call *c) {
  if (c->gpu && c->n) {
    xte_status st = c->g->gops->ep->blocks(c->h, c->g->mv, c->n);
    if (st != XTE_SUCCESS && c->st == XTE_SUCCESS) c->st = st;
    c->n = 0;
  }
  return c->st;
}

static void mv_add(ep_call *c, const void *src, void *dst, size_t len) {
  xte_ep_block *last = c->n ? &c->g->mv[c->n - 1] : NULL;
  if (!len) return;
  /* the continuation of the last move (rows back to back on both sides) extends it */
  if (last && (char *)last->dst + last->len == (char *)dst &&
      ((!src && !last->src) ||
       (src && last->src && (const char *)last->src + last->len == (const char *)src))) {
    last->len += (int64_t)len;
    return;
  }
  if (c->n == EP_MV_CAP) (void)mv_flush(c);
  c->g->mv[c->n].src = src;
  c->g->mv[c->n].dst = dst;
  c->g->mv[c->n].len = (int64_t)len;
  c->n++;
}

/* Tensor bytes moved: in place on the host, queued for the device block move of a GPU group. */
static inline void mv_copy(ep_call *c, void *dst, const void *src, size_t len) {
  if (!c->gpu)
    memcpy(dst, src, len);
  else
    mv_add(c, src, dst, len);
}

static inline void mv_zero(ep_call *c, void *dst, size_t len) {
  if (!c->gpu)
    memset(dst, 0, len);
  else
    mv_add(c, NULL, dst, len);
}

/* The end of a GPU call: pending moves enqueued, the stream finished (the group's workspace is
 * reused by the next call, which may come on another stream). */
static xte_status call_end(ep_call *c, xte_status st) {
  xte_status fs;
  if (!c->gpu) return st;
  fs = mv_flush(c);
  if (st == XTE_SUCCESS) st = fs;
  fs = c->g->gops->synchronize(c->h);
  return st == XTE_SUCCESS ? fs : st;
}

/* Host bytes to device memory of a GPU call (synchronized). */
static xte_status to_device(ep_call *c, void *dst, const void *src, size_t bytes) {
  if (!bytes) return XTE_SUCCESS;
  XTE_TRY(mv_flush(c));
  return c->g->gops->copy(c->h, dst, src, bytes, 0);
}

/* A 2-D view of t with dtype in mask, rows (when >= 0, else at least min_rows) and cols. */
static xte_status tview(const xte_tensor *t, const char *name, unsigned mask, int64_t rows,
                        int64_t min_rows, int64_t cols, int64_t *r_out, int64_t *ld_out) {
  int64_t r, c, ld;
  XTE_TRY(xte_tensor_view2d(t, name, &r, &c, &ld));
  if (!(mask & (1u << (unsigned)t->dtype)))
    return xte_set_error(XTE_ERROR_DTYPE, "%s->dtype is %s: not taken here", name,
                         xte_dtype_name(t->dtype));
  if ((uintptr_t)t->data % xte_dtype_size(t->dtype))
    return xte_set_error(XTE_ERROR_ALIGNMENT, "%s->data is not aligned to its element size", name);
  if ((rows >= 0 && r != rows) || r < min_rows || (cols >= 0 && c != cols))
    return xte_set_error(XTE_ERROR_SHAPE, "%s is [%lld, %lld]: want [%s%lld, %lld]", name,
                         (long long)r, (long long)c,
                         rows >= 0 ? "" : ">= ", (long long)(rows >= 0 ? rows : min_rows),
                         (long long)(cols >= 0 ? cols : c));
  if (r_out) *r_out = r;
  if (ld_out) *ld_out = ld ? ld : c;
  return XTE_SUCCESS;
}

#define DT(d) (1u << (unsigned)(d))
#define F32 DT(XTE_DTYPE_FP32)
#define BF16 DT(XTE_DTYPE_BF16)
#define FP8 (DT(XTE_DTYPE_E4M3) | DT(XTE_DTYPE_E5M2))

static xte_tensor mk2d(void *data, xte_dtype dt, int64_t rows, int64_t cols, int64_t ld) {
  xte_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dt;
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.ld = ld == cols ? 0 : ld;
  return t;
}

/* A handle prepared by group (and dispatched when need_dispatch). */
static xte_status get_handle(struct xte_ep_group_s *g, void *handle, int need_dispatch,
                             ep_handle *eh) {
  size_t bytes;
  XTE_CHECK_PTR(handle, "handle");
  if ((uintptr_t)handle % 8)
    return xte_set_error(XTE_ERROR_ALIGNMENT, "handle is not 8-byte aligned");
  handle_layout(g, (char *)handle, eh, &bytes);
  if (eh->h->magic != EP_MAGIC || eh->h->group != g || !eh->h->prepared)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "handle was not prepared by xte_ep_prepare on this group");
  if (need_dispatch && !eh->h->dispatched)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "handle: xte_ep_dispatch has not run on it (combine and the backwards "
                         "use its rows)");
  return XTE_SUCCESS;
}

static char g_empty_row[64] __attribute__((aligned(64)));

/* Workspace of n_rows * row_bytes bytes (a non-NULL pointer when that is 0): the group's buffer
 * `slot` (0 send, 1 receive), grown when too small, or with g NULL a fresh allocation. */
static xte_status ws_alloc(struct xte_ep_group_s *g, int slot, int64_t n_rows, size_t row_bytes,
                           void **p) {
  size_t b;
  if (n_rows < 0 || __builtin_mul_overflow((size_t)n_rows, row_bytes, &b))
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "workspace size overflows");
  if (b == 0) {
    *p = g_empty_row;
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
static void ws_free(struct xte_ep_group_s *g, void *p) {
  if (!p || p == (void *)g_empty_row) return;
  if (g && (p == g->ws[0] || p == g->ws[1])) return;
  if (g && g->gpu) return; /* device workspace: the group's, kept */
  xte_aligned_free(p);
}

/* Workspace for tensor rows of a call: host memory (ws_alloc's buffer `slot`, 0 or 1) for a CPU
 * group, else the group's device buffer dslot (grown when too small, after the stream finished
 * what may still use the old one). */
static xte_status ws_data(ep_call *c, int slot, int dslot, int64_t n_rows, size_t row_bytes,
                          void **p) {
  struct xte_ep_group_s *g = c->g;
  size_t b;
  void *q = NULL;
  if (!c->gpu) return ws_alloc(g, slot, n_rows, row_bytes, p);
  if (n_rows < 0 || __builtin_mul_overflow((size_t)n_rows, row_bytes, &b))
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "workspace size overflows");
  if (b == 0) {
    *p = g_empty_row; /* never dereferenced: no rows */
    return XTE_SUCCESS;
  }
  if (g->dws_bytes[dslot] >= b) {
    *p = g->dws[dslot];
    return XTE_SUCCESS;
  }
  b = (b + 255) & ~(size_t)255;
  if (g->dws[dslot]) {
    XTE_TRY(mv_flush(c));
    XTE_TRY(g->gops->synchronize(c->h));
  }
  XTE_TRY(g->gops->alloc(g->device, b, &q));
  if (g->dws[dslot]) (void)g->gops->dealloc(g->device, g->dws[dslot]);
  g->dws[dslot] = q;
  g->dws_bytes[dslot] = b;
  *p = q;
  return XTE_SUCCESS;
}

/* agree() that also releases the call's two workspaces when the ranks do not go ahead. */
static xte_status agree_or_free(struct xte_ep_group_s *g, xte_status st, const int64_t *sig,
                                const char *const *names, void *ws_a, void *ws_b) {
  st = agree(g, st, sig, names);
  if (st != XTE_SUCCESS) {
    ws_free(g, ws_a);
    ws_free(g, ws_b);
  }
  return st;
}

/* Block lists for the transport's alltoallw: the rows a rank sends or receives, described in
 * place (addresses and lengths), per peer. */
typedef struct blist {
  intptr_t *addr;
  int64_t *len;
  int64_t *off; /* [R + 1] */
  int64_t n, peer_start;
} blist;

/* Bytes of two block lists (send and receive) of at most ns and nr blocks over R peers. */
static int blist_bytes(int64_t ns, int64_t nr, int R, size_t *bytes) {
  size_t n, b;
  if (ns < 0 || nr < 0 || __builtin_add_overflow((size_t)ns, (size_t)nr, &n) ||
      __builtin_add_overflow(n, (size_t)2 * ((size_t)R + 1), &n) ||
      __builtin_mul_overflow(n, (size_t)16, &b))
    return 0;
  *bytes = b;
  return 1;
}

/* Carves the two lists out of mem (blist_bytes of it). */
static void blist_init(void *mem, int64_t ns, int64_t nr, int R, blist *s, blist *r) {
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

static void blist_peer(blist *b, int peer) {
  b->off[peer] = b->n;
  b->peer_start = b->n;
}

/* A block of a matched list (both sides of a pair cut their stream alike): cont 1 extends the
 * peer's last block (p must follow it in memory), else a new block starts. */
static inline void blist_seg(blist *b, const void *p, int64_t len, int cont) {
  if (len <= 0) return;
  if (cont && b->n > b->peer_start) {
    b->len[b->n - 1] += len;
    return;
  }
  b->addr[b->n] = (intptr_t)p;
  b->len[b->n] = len;
  b->n++;
}

/* Room in the transport for an exchange (before the agreement: a failure is a local error). */
static xte_status tr_reserve(struct xte_ep_group_s *g, int64_t nblocks, int64_t sbytes,
                             int64_t rbytes) {
  if (!g->tr.reserve) return XTE_SUCCESS;
  return g->tr.reserve(g->tr.ctx, nblocks, sbytes, rbytes);
}

/* The exchange of two block lists (blist_peer(R) closed them), timed and counted; matched: the
 * lists were cut alike on both sides of every pair (blist_seg). */
static xte_status exchange_w(struct xte_ep_group_s *g, blist *s, blist *r, int matched) {
  int64_t t0 = now_ns(), b;
  int p;
  xte_status st =
      matched && g->tr.alltoallw_matched
          ? g->tr.alltoallw_matched(g->tr.ctx, s->addr, s->len, s->off, r->addr, r->len, r->off)
          : g->tr.alltoallw(g->tr.ctx, s->addr, s->len, s->off, r->addr, r->len, r->off);
  g->stats.exchange_ns += now_ns() - t0;
  for (p = 0; p < g->R; p++) {
    if (p == g->tr.rank) continue;
    for (b = s->off[p]; b < s->off[p + 1]; b++) g->stats.bytes_sent += s->len[b];
    for (b = r->off[p]; b < r->off[p + 1]; b++) g->stats.bytes_received += r->len[b];
  }
  return st;
}

/* Zeroes recv rows that no (token, slot) fills: each expert's padding and rows [recv_rows,
 * nrows) of data (row_bytes per row, ld bytes apart). */
static void zero_unrouted(ep_call *c, const ep_handle *eh, int64_t El, char *data, size_t ld,
                          size_t row_bytes, int64_t nrows) {
  int64_t e, row;
  for (e = 0; e <= El; e++) {
    int64_t r0 = e < El ? eh->poff[e] + eh->tpe[e] : eh->h->recv_rows;
    int64_t r1 = e < El ? eh->poff[e + 1] : nrows;
    for (row = r0; row < r1; row++) mv_zero(c, data + (size_t)row * ld, row_bytes);
  }
}

/* ------------------------------------------------------------------ prepare */

xte_status xte_ep_prepare(xte_ep_group group, const xte_tensor *topk_idx, void *handle,
                          size_t handle_bytes, xte_ep_counts *counts, xte_tensor *tokens_per_expert,
                          xte_stream stream) {
  struct xte_ep_group_s *g = group;
  ep_handle eh;
  xte_status st = XTE_SUCCESS;
  int64_t T = 0, ld = 0, t, j, r, i;
  int R, K;
  int64_t El;
  int32_t *sendrec = NULL;
  int64_t *cnt1 = NULL;
  size_t bytes;
  int tpe_i64 = 0;
  int64_t tpe_ld = 1;
  ep_call c;
  const void *tdata = NULL; /* topk_idx's values in host memory */
  void *tcopy = NULL;       /* their copy (GPU group) */
  XTE_CHECK_PTR(g, "group");
  R = g->R;
  K = g->K;
  El = g->El;
  memset(&eh, 0, sizeof eh);
  /* local checks: nothing written yet */
  st = call_stream(g, stream, &c);
  if (st == XTE_SUCCESS)
    st = tview(topk_idx, "topk_idx", DT(XTE_DTYPE_INT32) | DT(XTE_DTYPE_INT64), -1, 0, K, &T, &ld);
  if (st == XTE_SUCCESS) tdata = topk_idx->data;
  if (st == XTE_SUCCESS && c.gpu && T > 0 && T <= g->Tmax) {
    /* the host reads the routing (DeepEP's normal mode synchronizes for its counts too) */
    size_t b = ((size_t)(T - 1) * (size_t)ld + (size_t)K) * xte_dtype_size(topk_idx->dtype);
    tcopy = xte_aligned_alloc(b);
    if (!tcopy)
      st = xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "out of memory for %zu bytes", b);
    else
      st = g->gops->copy(c.h, tcopy, topk_idx->data, b, 1);
    tdata = tcopy;
  }
  if (st == XTE_SUCCESS && T > g->Tmax)
    st = xte_set_error(XTE_ERROR_SHAPE,
                       "topk_idx has %lld tokens: more than "
                       "config->max_tokens_per_rank = %lld",
                       (long long)T, (long long)g->Tmax);
  if (st == XTE_SUCCESS) {
    for (t = 0; t < T && st == XTE_SUCCESS; t++)
      for (j = 0; j < K; j++) {
        int64_t e = topk_idx->dtype == XTE_DTYPE_INT32 ? ((const int32_t *)tdata)[t * ld + j]
                                                       : ((const int64_t *)tdata)[t * ld + j];
        if (e < -1 || e >= g->E) {
          st = xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                             "topk_idx[%lld, %lld] = %lld: want -1 or an expert in [0, %lld)",
                             (long long)t, (long long)j, (long long)e, (long long)g->E);
          break;
        }
        /* a token lists an expert at most once (as xte_moe_permute wants): refused here, on
         * every rank, before any row moves */
        for (i = 0; i < j && e >= 0; i++) {
          int64_t f = topk_idx->dtype == XTE_DTYPE_INT32 ? ((const int32_t *)tdata)[t * ld + i]
                                                         : ((const int64_t *)tdata)[t * ld + i];
          if (f == e) {
            st = xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                               "topk_idx row %lld lists expert %lld twice", (long long)t,
                               (long long)e);
            break;
          }
        }
        if (st != XTE_SUCCESS) break;
      }
  }
  if (st == XTE_SUCCESS && !handle) st = xte_set_error(XTE_ERROR_NULL_POINTER, "handle is NULL");
  if (st == XTE_SUCCESS && (uintptr_t)handle % 8)
    st = xte_set_error(XTE_ERROR_ALIGNMENT, "handle is not 8-byte aligned");
  if (st == XTE_SUCCESS && handle_bytes < g->handle_bytes)
    st = xte_set_error(XTE_ERROR_BUFFER_TOO_SMALL,
                       "handle_bytes = %zu: want >= %zu (xte_ep_handle_size)", handle_bytes,
                       g->handle_bytes);
  if (st == XTE_SUCCESS && tokens_per_expert && tokens_per_expert->data) {
    int64_t rr, cc;
    st = xte_tensor_view2d(tokens_per_expert, "tokens_per_expert", &rr, &cc, &tpe_ld);
    if (st == XTE_SUCCESS &&
        (rr * cc != El || (rr != 1 && cc != 1) || (cc == 1 && rr > 1 && tpe_ld > 1)))
      st = xte_set_error(XTE_ERROR_SHAPE,
                         "tokens_per_expert holds [%lld, %lld]: want a dense "
                         "vector of %lld",
                         (long long)rr, (long long)cc, (long long)El);
    if (st == XTE_SUCCESS && tokens_per_expert->dtype != XTE_DTYPE_INT32 &&
        tokens_per_expert->dtype != XTE_DTYPE_INT64)
      st = xte_set_error(XTE_ERROR_DTYPE, "tokens_per_expert->dtype is %s: want int32 / int64",
                         xte_dtype_name(tokens_per_expert->dtype));
    if (st == XTE_SUCCESS &&
        (uintptr_t)tokens_per_expert->data % xte_dtype_size(tokens_per_expert->dtype))
      st = xte_set_error(XTE_ERROR_ALIGNMENT, "tokens_per_expert->data is not aligned");
    tpe_i64 = tokens_per_expert->dtype == XTE_DTYPE_INT64;
  }
  if (st == XTE_SUCCESS && counts && (uintptr_t)counts % 8)
    st = xte_set_error(XTE_ERROR_ALIGNMENT, "counts is not 8-byte aligned");
  /* workspace: the send records (k local ids per (token, rank)) and count scratch */
  if (st == XTE_SUCCESS) {
    int64_t kr = K < R ? K : R;
    st = ws_alloc(NULL, 0, T * kr, (size_t)K * 4, (void **)&sendrec);
    if (st == XTE_SUCCESS) st = ws_alloc(NULL, 0, 4 * (int64_t)R + g->E, 8, (void **)&cnt1);
    /* a GPU transport stages the exchanges below through device memory */
    if (st == XTE_SUCCESS && c.gpu)
      st = tr_reserve(g, 0, T * kr * K * 4 + 8 * (int64_t)R, g->Tmax * R * K * 4 + 8 * (int64_t)R);
  }
  st = agree(g, st, NULL, NULL);
  if (st != XTE_SUCCESS) {
    /* fresh host buffers (ws_alloc without a group), whatever the group's kind */
    ws_free(NULL, sendrec);
    ws_free(NULL, cnt1);
    xte_aligned_free(tcopy);
    return call_end(&c, st);
  }

  /* the handle */
  handle_layout(g, (char *)handle, &eh, &bytes);
  memset(eh.h, 0, sizeof *eh.h);
  eh.h->magic = EP_MAGIC;
  eh.h->group = g;
  eh.h->T = T;
  for (t = 0; t < T; t++)
    for (j = 0; j < K; j++)
      eh.topk[t * K + j] =
          (int32_t)(topk_idx->dtype == XTE_DTYPE_INT32 ? ((const int32_t *)tdata)[t * ld + j]
                                                       : ((const int64_t *)tdata)[t * ld + j]);
  xte_aligned_free(tcopy);
  /* send lists: rank-major, tokens ascending; my slots per rank, (token, slot) ascending */
  for (r = 0; r < R; r++) eh.send_cnt[r] = eh.slot_cnt[r] = 0;
  for (t = 0; t < T; t++) {
    uint64_t seen[(4096 + 63) / 64];
    memset(seen, 0, sizeof(uint64_t) * (size_t)((R + 63) / 64));
    for (j = 0; j < K; j++) {
      int32_t e = eh.topk[t * K + j];
      if (e < 0) continue;
      r = e / El;
      eh.slot_cnt[r]++;
      if (!(seen[r / 64] >> (r % 64) & 1)) {
        seen[r / 64] |= 1ull << (r % 64);
        eh.send_cnt[r]++;
      }
    }
  }
  eh.send_off[0] = eh.slot_off[0] = 0;
  for (r = 0; r < R; r++) {
    eh.send_off[r + 1] = eh.send_off[r] + eh.send_cnt[r];
    eh.slot_off[r + 1] = eh.slot_off[r] + eh.slot_cnt[r];
  }
  eh.h->nsend = eh.send_off[R];
  eh.h->nslot = eh.slot_off[R];
  {
    int64_t *sp = cnt1, *pp = cnt1 + R; /* next send record / slot row of each rank */
    for (r = 0; r < R; r++) {
      sp[r] = eh.send_off[r];
      pp[r] = eh.slot_off[r];
    }
    /* rank-major order: walk the ranks, then the tokens (the slot rows of rank r in (token,
     * slot) order) */
    for (t = 0; t < T * K; t++) eh.src_row_map[t] = -1;
    for (r = 0; r < R; r++) {
      for (t = 0; t < T; t++) {
        int any = 0;
        for (j = 0; j < K; j++) {
          int32_t e = eh.topk[t * K + j];
          if (e >= 0 && e / El == r) {
            any = 1;
            eh.src_row_map[t * K + j] = (int32_t)pp[r]++;
          }
        }
        if (!any) continue;
        i = sp[r]++;
        eh.send_tok[i] = (int32_t)t;
        for (j = 0; j < K; j++) {
          int32_t e = eh.topk[t * K + j];
          sendrec[i * K + j] = (e >= 0 && e / El == r) ? (int32_t)(e - r * El) : -1;
        }
      }
    }
  }
  /* the slot rows that come back (combine), in (expert, token) order: an expert's rows from
   * one rank are consecutive rows of recv_x, so they travel as one block */
  {
    int64_t e, *cur = cnt1 + 4 * (int64_t)R, acc = 0; /* [E] */
    for (e = 0; e < g->E; e++) eh.ecnt_out[e] = 0;
    for (t = 0; t < T * K; t++)
      if (eh.topk[t] >= 0) eh.ecnt_out[eh.topk[t]]++;
    for (e = 0; e < g->E; e++) {
      cur[e] = acc;
      acc += eh.ecnt_out[e];
    }
    for (t = 0; t < T * K; t++)
      if (eh.topk[t] >= 0) eh.src_row_map[t] = (int32_t)cur[eh.topk[t]]++;
  }
  /* exchange the counts, then the records' routing and tokens */
  {
    int64_t *one = cnt1 + 2 * R, *idx = cnt1 + 3 * R;
    for (r = 0; r < R; r++) {
      one[r] = 1;
      idx[r] = r;
    }
    st = g->tr.alltoallv(g->tr.ctx, eh.send_cnt, one, idx, eh.recv_cnt, one, idx, 8);
  }
  if (st == XTE_SUCCESS) {
    eh.recv_off[0] = 0;
    for (r = 0; r < R; r++) eh.recv_off[r + 1] = eh.recv_off[r] + eh.recv_cnt[r];
    eh.h->nrecv = eh.recv_off[R];
    st = g->tr.alltoallv(g->tr.ctx, sendrec, eh.send_cnt, eh.send_off, eh.recv_topk, eh.recv_cnt,
                         eh.recv_off, (size_t)K * 4);
  }
  if (st == XTE_SUCCESS)
    st = g->tr.alltoallv(g->tr.ctx, eh.send_tok, eh.send_cnt, eh.send_off, eh.recv_tok, eh.recv_cnt,
                         eh.recv_off, 4);
  ws_free(NULL, sendrec);
  if (st != XTE_SUCCESS) {
    ws_free(NULL, cnt1);
    return call_end(&c, st);
  }
  /* the receive side: rows back to each rank, rows per local expert, padded rows */
  {
    int64_t e, rows = 0;
    for (e = 0; e < El; e++) eh.tpe[e] = 0;
    for (e = 0; e < g->E; e++) eh.ein_cnt[e] = 0;
    eh.ret_off[0] = 0;
    for (r = 0; r < R; r++) {
      int64_t n = 0;
      for (i = eh.recv_off[r]; i < eh.recv_off[r + 1]; i++)
        for (j = 0; j < K; j++) {
          int32_t l = eh.recv_topk[i * K + j];
          if (l < 0) continue;
          if (l >= El) {
            ws_free(NULL, cnt1);
            return call_end(&c, xte_set_error(XTE_ERROR_INTERNAL, "rank %lld sent local expert %d",
                                              (long long)r, l));
          }
          n++;
          eh.tpe[l]++;
          eh.ein_cnt[r * El + l]++;
        }
      eh.ret_cnt[r] = n;
      eh.ret_off[r + 1] = eh.ret_off[r] + n;
    }
    eh.h->nret = eh.ret_off[R];
    eh.poff[0] = 0;
    for (e = 0; e < El; e++) {
      rows += (eh.tpe[e] + g->align - 1) / g->align * g->align;
      eh.poff[e + 1] = rows;
    }
    eh.h->recv_rows = rows;
    for (e = 0; e < El; e++) {
      int64_t row = eh.poff[e];
      for (r = 0; r < R; r++) {
        eh.ein_row[r * El + e] = row;
        row += eh.ein_cnt[r * El + e];
      }
    }
    /* the rows of recv_x (xte_moe_permute's row map over the received records: within an
     * expert, records ascending, i.e. (source rank, token) ascending) */
    {
      int64_t *cur = cnt1; /* [El] */
      for (e = 0; e < El; e++) cur[e] = eh.poff[e];
      for (i = 0; i < eh.h->nrecv; i++)
        for (j = 0; j < K; j++) {
          int32_t l = eh.recv_topk[i * K + j];
          eh.row_map[i * K + j] = l < 0 ? -1 : (int32_t)cur[l]++;
        }
    }
  }
  eh.h->prepared = 1;
  if (counts) {
    counts->recv_rows = eh.h->recv_rows;
    counts->slot_rows = eh.h->nslot;
    counts->recv_tokens = eh.h->nrecv;
  }
  if (tokens_per_expert && tokens_per_expert->data) {
    int64_t e;
    /* a GPU group's: built on the host (in the handle's scratch count array), then copied */
    void *dst = c.gpu ? (void *)cnt1 : tokens_per_expert->data;
    for (e = 0; e < El; e++) {
      if (tpe_i64)
        ((int64_t *)dst)[e] = eh.tpe[e];
      else
        ((int32_t *)dst)[e] = (int32_t)eh.tpe[e];
    }
    if (c.gpu) st = to_device(&c, tokens_per_expert->data, dst, (size_t)El * (tpe_i64 ? 8 : 4));
  }
  ws_free(NULL, cnt1);
  st = call_end(&c, st);
  if (st != XTE_SUCCESS) return st;
  xte_clear_error();
  return XTE_SUCCESS;
}

/* ------------------------------------------------------------------ dispatch */

/* xte_ep_dispatch (tm 0: expert-major rows, recv_weights) and xte_ep_dispatch_tokens (tm 1: one
 * row per received token, recv_topk_idx / recv_topk_weights). */
static xte_status dispatch_impl(xte_ep_group group, void *handle, const xte_tensor *x,
                                const xte_tensor *x_scales, const xte_tensor *topk_weights,
                                xte_tensor *recv_x, xte_tensor *recv_scales,
                                xte_tensor *recv_weights, xte_tensor *recv_topk_idx,
                                xte_tensor *recv_topk_weights, int tm, xte_stream stream) {
  static const char *const names[NSIG] = {
      "x->dtype", "x_scales->dtype", "x_scales' columns", "topk_weights (given or not)", NULL,
      NULL};
  struct xte_ep_group_s *g = group;
  ep_handle eh;
  xte_status st;
  int64_t T = 0, H, K, ldx = 0, lds = 0, ldw = 0, S = 0, nrows = 0, ldo = 0, ldrs = 0, i, j, r;
  int64_t ldti = 0, ldtw = 0;
  int fp8 = 0, has_w = 0;
  size_t es = 0, ss = 0, xb, sb, wb;
  char *blk = NULL, *wbuf = NULL, *dmeta = NULL;
  int64_t sig[NSIG] = {0}, t_pack = 0, t_local = 0;
  ep_call c;
  XTE_CHECK_PTR(g, "group");
  H = g->H;
  K = g->K;
  memset(&eh, 0, sizeof eh);
  st = call_stream(g, stream, &c);
  if (st == XTE_SUCCESS) st = get_handle(g, handle, 0, &eh);
  if (st == XTE_SUCCESS) {
    T = eh.h->T;
    st = tview(x, "x", F32 | BF16 | FP8, T, 0, H, NULL, &ldx);
  }
  if (st == XTE_SUCCESS) {
    fp8 = x->dtype == XTE_DTYPE_E4M3 || x->dtype == XTE_DTYPE_E5M2;
    es = xte_dtype_size(x->dtype);
    st = tview(recv_x, "recv_x", DT(x->dtype), -1, tm ? eh.h->nrecv : eh.h->recv_rows, H, &nrows,
               &ldo);
  }
  if (st == XTE_SUCCESS && fp8) {
    if (!x_scales || !x_scales->data || !recv_scales || !recv_scales->data)
      st = xte_set_error(XTE_ERROR_NULL_POINTER, "%s is NULL: an fp8 x moves its scales along",
                         (!x_scales || !x_scales->data) ? "x_scales" : "recv_scales");
    if (st == XTE_SUCCESS) {
      int64_t cols, rr, ld2;
      st = xte_tensor_view2d(x_scales, "x_scales", &rr, &cols, &ld2);
      S = cols;
      if (st == XTE_SUCCESS)
        st = tview(x_scales, "x_scales", F32 | DT(XTE_DTYPE_E8M0), T, 0, -1, NULL, &lds);
      if (st == XTE_SUCCESS && S < 1)
        st = xte_set_error(XTE_ERROR_SHAPE, "x_scales has no columns");
      if (st == XTE_SUCCESS)
        st = tview(recv_scales, "recv_scales", DT(x_scales->dtype), nrows, 0, S, NULL, NULL);
      if (st == XTE_SUCCESS) ss = xte_dtype_size(x_scales->dtype);
    }
  } else if (st == XTE_SUCCESS &&
             ((x_scales && x_scales->data) || (recv_scales && recv_scales->data))) {
    st = xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                       "x_scales / recv_scales are for fp8 x only (x is %s)",
                       xte_dtype_name(x->dtype));
  }
  if (st == XTE_SUCCESS && topk_weights && topk_weights->data) {
    has_w = 1;
    st = tview(topk_weights, "topk_weights", F32, T, 0, K, NULL, &ldw);
  }
  if (st == XTE_SUCCESS && recv_topk_idx && recv_topk_idx->data)
    st = tview(recv_topk_idx, "recv_topk_idx", DT(XTE_DTYPE_INT32), nrows, 0, K, NULL, &ldti);
  if (st == XTE_SUCCESS && recv_topk_weights && recv_topk_weights->data) {
    if (!has_w)
      st = xte_set_error(XTE_ERROR_NULL_POINTER,
                         "topk_weights is NULL but recv_topk_weights is asked for");
    if (st == XTE_SUCCESS)
      st = tview(recv_topk_weights, "recv_topk_weights", F32, nrows, 0, K, NULL, &ldtw);
  }
  if (st == XTE_SUCCESS && recv_weights && recv_weights->data) {
    int64_t rr, cc, l2;
    if (!has_w)
      st = xte_set_error(XTE_ERROR_NULL_POINTER,
                         "topk_weights is NULL but recv_weights is asked "
                         "for");
    if (st == XTE_SUCCESS) st = xte_tensor_view2d(recv_weights, "recv_weights", &rr, &cc, &l2);
    if (st == XTE_SUCCESS &&
        (rr * cc != nrows || (rr != 1 && cc != 1) || (cc == 1 && rr > 1 && l2 > 1)))
      st = xte_set_error(XTE_ERROR_SHAPE,
                         "recv_weights holds [%lld, %lld]: want a dense vector of "
                         "%lld (recv_x's rows)",
                         (long long)rr, (long long)cc, (long long)nrows);
    if (st == XTE_SUCCESS && recv_weights->dtype != XTE_DTYPE_FP32)
      st = xte_set_error(XTE_ERROR_DTYPE, "recv_weights->dtype is %s: want fp32",
                         xte_dtype_name(recv_weights->dtype));
    if (st == XTE_SUCCESS && (uintptr_t)recv_weights->data % 4)
      st = xte_set_error(XTE_ERROR_ALIGNMENT, "recv_weights->data is not aligned");
  }
  if (st == XTE_SUCCESS && fp8) {
    int64_t a, b;
    st = xte_tensor_view2d(recv_scales, "recv_scales", &a, &b, &ldrs);
    if (!ldrs) ldrs = S;
  }
  if (st == XTE_SUCCESS) {
    size_t lb = 0, rec = 0, sall = 0, rall = 0;
    xb = (size_t)H * es;
    sb = (size_t)S * ss;
    wb = has_w ? (size_t)K * 4 : 0;
    size_t mb = sb + wb, smeta;
    /* receive workspace: the meta records [nrecv, mb], then (expert-major) the token rows
     * [nrecv, xb] that the expansion copies to their slots */
    if (!blist_bytes(eh.h->nsend + g->R, eh.h->nrecv + g->R, g->R, &lb) ||
        __builtin_mul_overflow((size_t)eh.h->nsend, mb, &smeta) ||
        __builtin_add_overflow(lb, smeta, &lb) || __builtin_add_overflow(mb, tm ? 0 : xb, &rec) ||
        __builtin_mul_overflow((size_t)eh.h->nsend, xb + mb, &sall) ||
        __builtin_mul_overflow((size_t)eh.h->nrecv, xb + mb, &rall))
      st = xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "workspace size overflows");
    if (st == XTE_SUCCESS) st = ws_alloc(g, 0, 1, lb, (void **)&blk);
    if (st == XTE_SUCCESS) st = ws_data(&c, 1, 0, eh.h->nrecv, rec, (void **)&wbuf);
    /* a GPU group's send records: device memory (a CPU group's follow the block lists) */
    if (st == XTE_SUCCESS && c.gpu) st = ws_data(&c, 0, 2, eh.h->nsend, mb, (void **)&dmeta);
    if (st == XTE_SUCCESS)
      st = tr_reserve(g, (eh.h->nsend > eh.h->nrecv ? eh.h->nsend : eh.h->nrecv) + g->R,
                      (int64_t)sall, (int64_t)rall);
    sig[0] = x->dtype;
    sig[1] = fp8 ? (int64_t)x_scales->dtype : -1;
    sig[2] = S;
    sig[3] = has_w;
    /* not compared: whether this rank's x rows and received rows lie back to back */
    sig[5] = (ldx == H) | (!tm || ldo == H) << 1;
  } else {
    xb = sb = wb = 0;
  }
  st = agree_or_free(g, st, sig, names, blk, wbuf);
  if (st != XTE_SUCCESS) return call_end(&c, st);
  /* Each (token, rank) once, in one exchange: per peer the x rows read in place, then the
   * small records of scale rows and weights. Both sides cut a pair's stream alike: a block per
   * run of consecutive tokens (one per token unless the sender's x and the receiver's rows
   * are dense), then the records; the transport can then move each block as it is. The rows
   * land token-major: in recv_x (xte_ep_dispatch_tokens) or in workspace that the expansion
   * then copies to each local slot's row of recv_x (xte_ep_dispatch). */
  t_pack = now_ns();
  {
    blist bs, br;
    const size_t mb = sb + wb;
    size_t lb = 0;
    const char *xd = (const char *)x->data;
    const char *sd = fp8 ? (const char *)x_scales->data : NULL;
    const char *wd = has_w ? (const char *)topk_weights->data : NULL;
    char *ox = (char *)recv_x->data, *smeta, *xw = wbuf + (size_t)eh.h->nrecv * mb;
    const int64_t me_bits = g->agree[g->tr.rank].sig[5];
    blist_bytes(eh.h->nsend + g->R, eh.h->nrecv + g->R, g->R, &lb);
    smeta = c.gpu ? dmeta : blk + lb;
    for (i = 0; i < eh.h->nsend && mb; i++) {
      int64_t t = eh.send_tok[i];
      if (sb) mv_copy(&c, smeta + (size_t)i * mb, sd + (size_t)(t * lds) * ss, sb);
      if (wb) mv_copy(&c, smeta + (size_t)i * mb + sb, wd + (size_t)(t * ldw) * 4, wb);
    }
    st = mv_flush(&c);
    blist_init(blk, eh.h->nsend + g->R, eh.h->nrecv + g->R, g->R, &bs, &br);
    for (r = 0; r < g->R; r++) {
      int64_t b0 = eh.send_off[r], b1 = eh.send_off[r + 1];
      int runs = (me_bits & 1) && (g->agree[r].sig[5] & 2);
      blist_peer(&bs, (int)r);
      for (i = b0; i < b1; i++)
        blist_seg(&bs, xd + (size_t)(eh.send_tok[i] * ldx) * es, (int64_t)xb,
                  runs && i > b0 && eh.send_tok[i] == eh.send_tok[i - 1] + 1);
      blist_seg(&bs, smeta + (size_t)b0 * mb, (b1 - b0) * (int64_t)mb, 0);
      b0 = eh.recv_off[r];
      b1 = eh.recv_off[r + 1];
      runs = (g->agree[r].sig[5] & 1) && (me_bits & 2);
      blist_peer(&br, (int)r);
      for (i = b0; i < b1; i++)
        blist_seg(&br, tm ? ox + (size_t)(i * ldo) * es : xw + (size_t)i * xb, (int64_t)xb,
                  runs && i > b0 && eh.recv_tok[i] == eh.recv_tok[i - 1] + 1);
      blist_seg(&br, wbuf + (size_t)b0 * mb, (b1 - b0) * (int64_t)mb, 0);
    }
    blist_peer(&bs, g->R);
    blist_peer(&br, g->R);
    g->stats.pack_ns += now_ns() - t_pack;
    if (st == XTE_SUCCESS) st = exchange_w(g, &bs, &br, 1);
  }
  t_local = now_ns();
  if (st == XTE_SUCCESS && tm) {
    /* one row per token: scale rows, the slots' local experts and weights; zero rows after */
    const size_t mb = sb + wb;
    int64_t nrecv = eh.h->nrecv;
    char *ox = (char *)recv_x->data, *os = fp8 ? (char *)recv_scales->data : NULL;
    int32_t *ti = recv_topk_idx && recv_topk_idx->data ? (int32_t *)recv_topk_idx->data : NULL;
    float *tw =
        recv_topk_weights && recv_topk_weights->data ? (float *)recv_topk_weights->data : NULL;
    int32_t *hti = ti, *uti = NULL; /* a GPU group's recv_topk_idx: built here, then uploaded */
    if (ti && c.gpu) {
      hti = (int32_t *)xte_aligned_alloc((size_t)(nrows ? nrows : 1) * (size_t)K * 4);
      if (!hti) st = xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "out of memory (recv_topk_idx)");
      if (st == XTE_SUCCESS) st = ws_data(&c, 0, 3, nrows, (size_t)K * 4, (void **)&uti);
    }
    for (i = 0; i < nrows && st == XTE_SUCCESS; i++) {
      const char *meta = i < nrecv ? wbuf + (size_t)i * mb : wbuf;
      if (i >= nrecv) {
        mv_zero(&c, ox + (size_t)(i * ldo) * es, xb);
        if (sb) mv_zero(&c, os + (size_t)(i * ldrs) * ss, sb);
      } else if (sb) {
        mv_copy(&c, os + (size_t)(i * ldrs) * ss, meta, sb);
      }
      for (j = 0; j < K; j++) {
        int32_t l = i < nrecv ? eh.recv_topk[i * K + j] : -1;
        if (ti) hti[c.gpu ? i * K + j : i * ldti + j] = l;
        if (tw) {
          if (l >= 0)
            mv_copy(&c, &tw[i * ldtw + j], meta + sb + (size_t)j * 4, 4);
          else
            mv_zero(&c, &tw[i * ldtw + j], 4);
        }
      }
    }
    if (ti && c.gpu && st == XTE_SUCCESS) {
      st = to_device(&c, uti, hti, (size_t)nrows * (size_t)K * 4);
      for (i = 0; i < nrows && st == XTE_SUCCESS; i++)
        mv_copy(&c, ti + i * ldti, uti + i * K, (size_t)K * 4);
    }
    if (c.gpu) xte_aligned_free(hti);
  } else if (st == XTE_SUCCESS) {
    /* the expert-major expansion: each received row to the recv_x row of each local slot */
    const size_t mb = sb + wb;
    int64_t nrecv = eh.h->nrecv;
    char *ox = (char *)recv_x->data, *os = fp8 ? (char *)recv_scales->data : NULL;
    const char *xw = wbuf + (size_t)nrecv * mb;
    float *w = recv_weights && recv_weights->data ? (float *)recv_weights->data : NULL;
    /* (a GPU group's moves of one launch must not write a byte twice: its weights of the
     * unrouted rows are zeroed below instead) */
    if (w && !c.gpu) memset(w, 0, (size_t)nrows * sizeof(float));
    for (i = 0; i < nrecv; i++) {
      const int32_t *rm = eh.row_map + i * K;
      const char *meta = wbuf + (size_t)i * mb, *xr = xw + (size_t)i * xb;
      for (j = 0; j < K; j++) {
        int64_t row = rm[j];
        if (row < 0) continue;
        if (w) mv_copy(&c, &w[row], meta + sb + (size_t)j * 4, 4);
        if (sb) mv_copy(&c, os + (size_t)(row * ldrs) * ss, meta, sb);
        mv_copy(&c, ox + (size_t)(row * ldo) * es, xr, xb);
      }
    }
    zero_unrouted(&c, &eh, g->El, ox, (size_t)ldo * es, xb, nrows);
    if (sb) zero_unrouted(&c, &eh, g->El, os, (size_t)ldrs * ss, sb, nrows);
    if (w && c.gpu) zero_unrouted(&c, &eh, g->El, (char *)w, 4, 4, nrows);
  }
  st = call_end(&c, st);
  ws_free(g, blk);
  ws_free(g, wbuf);
  g->stats.local_ns += now_ns() - t_local;
  g->stats.calls++;
  if (st != XTE_SUCCESS) return st;
  eh.h->dispatched = 1;
  xte_clear_error();
  return XTE_SUCCESS;
}

xte_status xte_ep_dispatch(xte_ep_group group, void *handle, const xte_tensor *x,
                           const xte_tensor *x_scales, const xte_tensor *topk_weights,
                           xte_tensor *recv_x, xte_tensor *recv_scales, xte_tensor *recv_weights,
                           xte_stream stream) {
  return dispatch_impl(group, handle, x, x_scales, topk_weights, recv_x, recv_scales, recv_weights,
                       NULL, NULL, 0, stream);
}

xte_status xte_ep_dispatch_tokens(xte_ep_group group, void *handle, const xte_tensor *x,
                                  const xte_tensor *x_scales, const xte_tensor *topk_weights,
                                  xte_tensor *recv_x, xte_tensor *recv_scales,
                                  xte_tensor *recv_topk_idx, xte_tensor *recv_topk_weights,
                                  xte_stream stream) {
  return dispatch_impl(group, handle, x, x_scales, topk_weights, recv_x, recv_scales, NULL,
                       recv_topk_idx, recv_topk_weights, 1, stream);
}

/* ------------------------------------------------------------------ rows back and forth */

/* The block lists of the rows of every received (record, local slot), read or written in place
 * at rows (ld elements apart), and of this rank's own slot rows in buf (src_row_map's order:
 * per rank, (expert, token) ascending), cut alike on both sides: a block per (source rank,
 * local expert), the expert's rows of that rank's records being consecutive rows, or a block
 * per row where the expert side's rows are not dense (bit 0 of its agreement sig[5]).
 * rows_send: rows are sent (combine, dispatch_backward), else received (combine_backward). */
static void slot_blocks(const struct xte_ep_group_s *g, const ep_handle *eh, char *rows, int64_t ld,
                        size_t es, size_t row_bytes, char *buf, int rows_send, blist *bs,
                        blist *br) {
  int64_t l, k, El = g->El;
  int r;
  blist *side_rows = rows_send ? bs : br, *side_buf = rows_send ? br : bs;
  const int me_dense = (int)(g->agree[g->tr.rank].sig[5] & 1);
  for (r = 0; r < g->R; r++) {
    const int r_dense = (int)(g->agree[r].sig[5] & 1);
    int64_t off = eh->slot_off[r];
    blist_peer(side_rows, r);
    for (l = 0; l < El; l++) {
      int64_t n = eh->ein_cnt[r * El + l], row = eh->ein_row[r * El + l];
      for (k = 0; k < n; k++)
        blist_seg(side_rows, rows + (size_t)(row + k) * (size_t)ld * es, (int64_t)row_bytes,
                  me_dense && k > 0);
    }
    blist_peer(side_buf, r);
    for (l = 0; l < El; l++) {
      int64_t n = eh->ecnt_out[r * El + l];
      for (k = 0; k < n; k++)
        blist_seg(side_buf, buf + (size_t)(off + k) * row_bytes, (int64_t)row_bytes,
                  r_dense && k > 0);
      off += n;
    }
  }
  blist_peer(bs, g->R);
  blist_peer(br, g->R);
}

/* The routing of this rank's own tokens (the handle's int32 copy) and src_row_map as tensors. */
static xte_status own_routing(ep_call *c, const ep_handle *eh, xte_tensor *idx, xte_tensor *rm,
                              xte_moe_routing *routing) {
  const struct xte_ep_group_s *g = c->g;
  int64_t T = eh->h->T;
  void *pi = T ? (void *)eh->topk : (void *)g_empty_row;
  void *pr = T ? (void *)eh->src_row_map : (void *)g_empty_row;
  if (c->gpu && T) {
    /* the token movement kernels read them from device memory: uploaded */
    size_t b = (size_t)T * (size_t)g->K * 4;
    char *d = NULL;
    XTE_TRY(ws_data(c, 0, 3, 2, b, (void **)&d));
    XTE_TRY(to_device(c, d, eh->topk, b));
    XTE_TRY(to_device(c, d + b, eh->src_row_map, b));
    pi = d;
    pr = d + b;
  }
  *idx = mk2d(pi, XTE_DTYPE_INT32, T, g->K, g->K);
  *rm = mk2d(pr, XTE_DTYPE_INT32, T, g->K, g->K);
  routing->routing_map = NULL;
  routing->topk_idx = idx;
  routing->num_experts = g->E;
  return XTE_SUCCESS;
}

/* combine and dispatch_backward: rows of the received slots back to the tokens' ranks, then the
 * one-process gather-sum there. */
static xte_status return_and_sum(struct xte_ep_group_s *g, void *handle, const xte_tensor *rows,
                                 const char *rows_name, const xte_tensor *weights, xte_tensor *out,
                                 const char *out_name, xte_tensor *slot_rows, int backward,
                                 xte_stream stream) {
  static const char *const names[NSIG] = {"the expert rows' dtype", NULL, NULL, NULL, NULL, NULL};
  ep_handle eh;
  xte_status st;
  int64_t T = 0, H = g->H, ld = 0, nrows = 0, sld = 0;
  size_t es = 0, rb = 0;
  char *sendbuf = NULL, *recvbuf = NULL;
  int want_slots = 0;
  int64_t sig[NSIG] = {0}, t0;
  ep_call c;
  memset(&eh, 0, sizeof eh);
  st = call_stream(g, stream, &c);
  if (st == XTE_SUCCESS) st = get_handle(g, handle, 1, &eh);
  if (st == XTE_SUCCESS) {
    T = eh.h->T;
    st = tview(rows, rows_name, F32 | BF16, -1, eh.h->recv_rows, H, &nrows, &ld);
  }
  if (st == XTE_SUCCESS) st = tview(out, out_name, F32 | BF16, T, 0, H, NULL, NULL);
  if (st == XTE_SUCCESS && weights && weights->data)
    st = tview(weights, "topk_weights", F32, T, 0, g->K, NULL, NULL);
  if (st == XTE_SUCCESS) {
    es = xte_dtype_size(rows->dtype);
    rb = (size_t)H * es;
  }
  if (st == XTE_SUCCESS && slot_rows && slot_rows->data) {
    st = tview(slot_rows, "slot_rows", DT(rows->dtype), eh.h->nslot, 0, H, NULL, &sld);
    if (st == XTE_SUCCESS && sld != H)
      st = xte_set_error(XTE_ERROR_SHAPE, "slot_rows->ld = %lld: want a dense tensor",
                         (long long)sld);
    want_slots = 1;
  }
  if (st == XTE_SUCCESS) {
    size_t lb = 0;
    if (!blist_bytes(eh.h->nret + g->R, eh.h->nslot + g->R, g->R, &lb))
      st = xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "workspace size overflows");
    if (st == XTE_SUCCESS) st = ws_alloc(g, 0, 1, lb, (void **)&sendbuf);
    /* received into workspace even when slot_rows is given: slot_rows is written only after the
     * local sum succeeded (nothing written on error) */
    if (st == XTE_SUCCESS) st = ws_data(&c, 1, 0, eh.h->nslot, rb, (void **)&recvbuf);
    if (st == XTE_SUCCESS)
      st = tr_reserve(g, (eh.h->nret > eh.h->nslot ? eh.h->nret : eh.h->nslot) + g->R,
                      eh.h->nret * (int64_t)rb, eh.h->nslot * (int64_t)rb);
    sig[0] = rows->dtype;
    sig[5] = ld == H; /* not compared: this rank's expert rows are dense */
  }
  st = agree_or_free(g, st, sig, names, sendbuf, recvbuf);
  if (st != XTE_SUCCESS) return call_end(&c, st);
  t0 = now_ns();
  {
    /* the expert rows are sent in place (no staging copy) */
    blist bs, br;
    blist_init(sendbuf, eh.h->nret + g->R, eh.h->nslot + g->R, g->R, &bs, &br);
    slot_blocks(g, &eh, (char *)rows->data, ld, es, rb, recvbuf, 1, &bs, &br);
    g->stats.pack_ns += now_ns() - t0;
    st = exchange_w(g, &bs, &br, 1);
  }
  ws_free(g, sendbuf);
  t0 = now_ns();
  if (st == XTE_SUCCESS) {
    xte_tensor idx, rm, in = mk2d(recvbuf, rows->dtype, eh.h->nslot, H, H);
    xte_moe_routing routing;
    st = own_routing(&c, &eh, &idx, &rm, &routing);
    if (st == XTE_SUCCESS && backward)
      st = xte_moe_permute_backward(&in, &routing, &rm, out, stream);
    else if (st == XTE_SUCCESS)
      st = xte_moe_unpermute(&in, &routing, &rm, weights && weights->data ? weights : NULL, out,
                             stream);
  }
  if (st == XTE_SUCCESS && want_slots && eh.h->nslot)
    mv_copy(&c, slot_rows->data, recvbuf, (size_t)eh.h->nslot * rb);
  st = call_end(&c, st);
  ws_free(g, recvbuf);
  g->stats.local_ns += now_ns() - t0;
  g->stats.calls++;
  if (st == XTE_SUCCESS) xte_clear_error();
  return st;
}

xte_status xte_ep_combine(xte_ep_group group, void *handle, const xte_tensor *expert_out,
                          const xte_tensor *topk_weights, xte_tensor *out, xte_tensor *slot_rows,
                          xte_stream stream) {
  XTE_CHECK_PTR(group, "group");
  return return_and_sum(group, handle, expert_out, "expert_out", topk_weights, out, "out",
                        slot_rows, 0, stream);
}

xte_status xte_ep_dispatch_backward(xte_ep_group group, void *handle, const xte_tensor *grad_recv,
                                    xte_tensor *grad_x, xte_stream stream) {
  XTE_CHECK_PTR(group, "group");
  return return_and_sum(group, handle, grad_recv, "grad_recv", NULL, grad_x, "grad_x", NULL, 1,
                        stream);
}

xte_status xte_ep_combine_backward(xte_ep_group group, void *handle, const xte_tensor *grad_out,
                                   const xte_tensor *topk_weights, const xte_tensor *slot_rows,
                                   xte_tensor *grad_expert_out, xte_tensor *grad_weights,
                                   xte_stream stream) {
  static const char *const names[NSIG] = {"grad_expert_out->dtype", NULL, NULL, NULL, NULL, NULL};
  struct xte_ep_group_s *g = group;
  ep_handle eh;
  xte_status st;
  int64_t T = 0, H, K, ldg = 0, nrows = 0;
  size_t es = 0, rb = 0;
  char *sendbuf = NULL, *recvbuf = NULL;
  int want_gw = 0;
  int64_t sig[NSIG] = {0}, t0;
  ep_call c;
  XTE_CHECK_PTR(g, "group");
  H = g->H;
  K = g->K;
  memset(&eh, 0, sizeof eh);
  st = call_stream(g, stream, &c);
  if (st == XTE_SUCCESS) st = get_handle(g, handle, 1, &eh);
  if (st == XTE_SUCCESS) {
    T = eh.h->T;
    st = tview(grad_out, "grad_out", F32 | BF16, T, 0, H, NULL, NULL);
  }
  if (st == XTE_SUCCESS)
    st =
        tview(grad_expert_out, "grad_expert_out", F32 | BF16, -1, eh.h->recv_rows, H, &nrows, &ldg);
  if (st == XTE_SUCCESS && topk_weights && topk_weights->data)
    st = tview(topk_weights, "topk_weights", F32, T, 0, K, NULL, NULL);
  if (st == XTE_SUCCESS && grad_weights && grad_weights->data) {
    want_gw = 1;
    if (!topk_weights || !topk_weights->data)
      st = xte_set_error(XTE_ERROR_NULL_POINTER,
                         "topk_weights is NULL but grad_weights is asked "
                         "for");
    else if (!slot_rows || !slot_rows->data)
      st = xte_set_error(XTE_ERROR_NULL_POINTER,
                         "slot_rows is NULL but grad_weights is asked "
                         "for (combine's slot_rows)");
    if (st == XTE_SUCCESS)
      st = tview(slot_rows, "slot_rows", F32 | BF16, eh.h->nslot, 0, H, NULL, NULL);
    if (st == XTE_SUCCESS) st = tview(grad_weights, "grad_weights", F32, T, 0, K, NULL, NULL);
  }
  if (st == XTE_SUCCESS) {
    size_t lb = 0;
    es = xte_dtype_size(grad_expert_out->dtype);
    rb = (size_t)H * es;
    st = ws_data(&c, 0, 1, eh.h->nslot, rb, (void **)&sendbuf);
    if (st == XTE_SUCCESS && !blist_bytes(eh.h->nslot + g->R, eh.h->nret + g->R, g->R, &lb))
      st = xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "workspace size overflows");
    if (st == XTE_SUCCESS) st = ws_alloc(g, 1, 1, lb, (void **)&recvbuf);
    if (st == XTE_SUCCESS)
      st = tr_reserve(g, (eh.h->nret > eh.h->nslot ? eh.h->nret : eh.h->nslot) + g->R,
                      eh.h->nslot * (int64_t)rb, eh.h->nret * (int64_t)rb);
    sig[0] = grad_expert_out->dtype;
    sig[5] = ldg == H; /* not compared: this rank's expert rows are dense */
  }
  st = agree_or_free(g, st, sig, names, sendbuf, recvbuf);
  if (st != XTE_SUCCESS) return call_end(&c, st);
  t0 = now_ns();
  {
    xte_tensor idx, rm, gi = mk2d(sendbuf, grad_expert_out->dtype, eh.h->nslot, H, H);
    xte_moe_routing routing;
    st = own_routing(&c, &eh, &idx, &rm, &routing);
    if (st == XTE_SUCCESS)
      st = xte_moe_unpermute_backward(grad_out, want_gw ? slot_rows : NULL, &routing, &rm,
                                      topk_weights && topk_weights->data ? topk_weights : NULL, &gi,
                                      want_gw ? grad_weights : NULL, stream);
  }
  g->stats.local_ns += now_ns() - t0;
  if (st == XTE_SUCCESS) {
    /* received straight into grad_expert_out's rows */
    blist bs, br;
    t0 = now_ns();
    blist_init(recvbuf, eh.h->nslot + g->R, eh.h->nret + g->R, g->R, &bs, &br);
    slot_blocks(g, &eh, (char *)grad_expert_out->data, ldg, es, rb, sendbuf, 0, &bs, &br);
    g->stats.pack_ns += now_ns() - t0;
    st = exchange_w(g, &bs, &br, 1);
  }
  ws_free(g, sendbuf);
  t0 = now_ns();
  if (st == XTE_SUCCESS)
    zero_unrouted(&c, &eh, g->El, (char *)grad_expert_out->data, (size_t)ldg * es, rb, nrows);
  st = call_end(&c, st);
  g->stats.local_ns += now_ns() - t0;
  g->stats.calls++;
  ws_free(g, recvbuf);
  if (st == XTE_SUCCESS) xte_clear_error();
  return st;
}
