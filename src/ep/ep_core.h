/* The expert-parallelism core: what src/ep_api.c (argument checks, then these calls) and the step
 * files of src/ep/ share. One file per step:
 *
 *  group.c     the group (transport, configuration, agreement records, workspace), a call's
 *              stream and byte moves, workspace, block lists, the timed exchange
 *  agree.c     the ranks' agreement: every rank's status and signature, gathered
 *  handle.c    the routing handle's layout
 *  prepare.c   routing -> the send lists and the receive side's rows (one exchange of counts and
 *              records)
 *  dispatch.c  token rows to the experts' ranks, into the expert-major or token-major layout
 *  combine.c   expert rows back to the tokens' ranks and the one-process sum there (combine,
 *              dispatch_backward), and the reverse (combine_backward)
 *
 * The transports (src/ep/transport/) fill the table of src/ep/ep_transport.h; the core only calls
 * it. Token arithmetic is the one-process token movement's (xte_moe_permute / unpermute and their
 * backwards): every sum is the one-process sum, in its order.
 *
 * Data movement of a step, for rank me:
 *  prepare   the send lists (token t goes to rank r once when one of its experts lives on r) and
 *            the receive side's routing (each received token's k slots as local expert ids, -1
 *            where the expert is elsewhere, and the sender's token index), exchanged once.
 *  dispatch  one exchange: per (token, rank) the x row, read in place, then per peer the small
 *            records [scale row | k weights]. The rows land token-major (in recv_x for
 *            dispatch_tokens, else in workspace that the expert-major expansion copies to each
 *            local slot's row; a rank's rows to itself skip that workspace: the expansion reads
 *            them from x, while the exchange is in flight where the transport allows).
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
 * transport can move each block as it is, with no staging copy.
 *
 * Agreement: each collective first runs every local check (and allocates its workspace), then
 * all ranks exchange their status with an allgather; one failing rank fails all of them before
 * any data moves. */
#ifndef XTE_EP_CORE_H
#define XTE_EP_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "xte/ep.h"
#include "xte_ep_ops.h"
#include "xte_internal.h"

#define XTE_EP_MAGIC 0x7874652d65702d31ull /* "xte-ep-1" */
#define XTE_EP_NSIG 6
#define XTE_EP_MV_CAP 4096
/* A CPU group's expert-major dispatch writes its rows with streaming stores when they come to
 * at least this many bytes (the size past which xte_moe_unpermute streams too); the variable
 * XTE_EP_STREAM_MIN, read at group creation, sets another (0: always, as the tests run it). */
#define XTE_EP_STREAM_MIN_DEFAULT ((int64_t)8 << 20)

/* One rank's record in an agreement. */
typedef struct xte_ep_agree_msg {
  int32_t status;
  int32_t pad;
  int64_t sig[XTE_EP_NSIG];
  char msg[144];
} xte_ep_agree_msg;

struct xte_ep_group_s {
  xte_ep_transport tr;
  int R;
  int64_t El, E, H, Tmax;
  int K, align;
  size_t handle_bytes;
  xte_ep_agree_msg *agree; /* [R] */
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
  xte_ep_block *mv;   /* the host move list of a call, flushed when full */
  int64_t stream_min; /* XTE_EP_STREAM_MIN */
};

/* A collective call's execution: the stream handle of a GPU group's call and its pending moves. */
typedef struct xte_ep_call {
  struct xte_ep_group_s *g;
  int gpu;
  int queue;                      /* moves queued in g->mv and run by mvops->blocks (else memcpy) */
  const struct xte_ep_ops *mvops; /* the block move: the GPU backend's, or the CPU backend's */
  void *h;
  int64_t n;     /* pending moves in g->mv */
  xte_status st; /* the first failed flush */
} xte_ep_call;

/* The handle: this header, then the arrays at offsets fixed by the group. */
typedef struct xte_ep_hdr {
  uint64_t magic;
  const struct xte_ep_group_s *group;
  int64_t T, nsend, nrecv, nslot, nret, recv_rows;
  int32_t prepared, dispatched;
} xte_ep_hdr;

typedef struct xte_ep_handle {
  xte_ep_hdr *h;
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
} xte_ep_handle;

/* Block lists for the transport's alltoallw: the rows a rank sends or receives, described in
 * place (addresses and lengths), per peer. */
typedef struct xte_ep_blist {
  intptr_t *addr;
  int64_t *len;
  int64_t *off; /* [R + 1] */
  int64_t n, peer_start;
} xte_ep_blist;

/* A row of zero bytes: the non-NULL pointer of an empty workspace or tensor. */
extern char xte_ep_empty_row[64];

int64_t xte_ep_now_ns(void);

/* ---- handle.c */
/* Lays out the handle at base (NULL: only computes the size into *bytes); 0 on overflow. */
int xte_ep_handle_layout(const struct xte_ep_group_s *g, char *base, xte_ep_handle *eh,
                         size_t *bytes);
/* A handle prepared by group (and dispatched when need_dispatch). */
xte_status xte_ep_get_handle(struct xte_ep_group_s *g, void *handle, int need_dispatch,
                             xte_ep_handle *eh);

/* ---- agree.c */
/* Every rank calls this with its local status (XTE_SUCCESS or the error it recorded) and its
 * signature (values that must be equal on every rank, sig_names[i] naming sig[i]; NULL names
 * an unused slot). Returns the same status on every rank. */
xte_status xte_ep_agree(struct xte_ep_group_s *g, xte_status st, const int64_t *sig,
                        const char *const *sig_names);
/* xte_ep_agree that also releases the call's two workspaces when the ranks do not go ahead. */
xte_status xte_ep_agree_or_free(struct xte_ep_group_s *g, xte_status st, const int64_t *sig,
                                const char *const *names, void *ws_a, void *ws_b);

/* ---- group.c */
/* A group over transport tr (owned from here on): g's configuration fields set by the caller's
 * checks (st: their status), agreement over them. ex: the stream of a GPU group's creation (NULL:
 * a CPU group). */
xte_status xte_ep_group_finish(xte_ep_transport *tr, struct xte_ep_group_s *cfg, xte_status st,
                               xte_ep_group *group, const xte_exec *ex);
void xte_ep_group_release(struct xte_ep_group_s *g);
/* The call's stream: a CPU stream (NULL or the CPU backend) for a CPU group; a stream of the
 * group's backend and device for a GPU group, bound to its transport (on failure the group's
 * creation stream is bound, so that the agreement still runs). */
xte_status xte_ep_call_stream(struct xte_ep_group_s *g, xte_stream stream, xte_ep_call *c);
/* A CPU call's byte moves from here on queued and run by the CPU backend's block move (long
 * moves with streaming stores); no effect on a GPU call. */
void xte_ep_call_stream_rows(xte_ep_call *c);
/* Runs the call's pending moves (queued: a GPU call, a streaming CPU call). */
xte_status xte_ep_mv_flush(xte_ep_call *c);
void xte_ep_mv_add(xte_ep_call *c, const void *src, void *dst, size_t len);
/* The end of a call: pending moves run; a GPU call's stream finished (the group's workspace is
 * reused by the next call, which may come on another stream). */
xte_status xte_ep_call_end(xte_ep_call *c, xte_status st);
/* Host bytes to device memory of a GPU call (synchronized). */
xte_status xte_ep_to_device(xte_ep_call *c, void *dst, const void *src, size_t bytes);
/* Workspace of n_rows * row_bytes bytes (a non-NULL pointer when that is 0): the group's buffer
 * `slot` (0 send, 1 receive), grown when too small, or with g NULL a fresh allocation. */
xte_status xte_ep_ws_alloc(struct xte_ep_group_s *g, int slot, int64_t n_rows, size_t row_bytes,
                           void **p);
/* Frees a workspace of xte_ep_ws_alloc (the group's buffers stay). */
void xte_ep_ws_free(struct xte_ep_group_s *g, void *p);
/* Workspace for tensor rows of a call: host memory (xte_ep_ws_alloc's buffer `slot`) for a CPU
 * group, else the group's device buffer dslot (grown when too small, after the stream finished
 * what may still use the old one). */
xte_status xte_ep_ws_data(xte_ep_call *c, int slot, int dslot, int64_t n_rows, size_t row_bytes,
                          void **p);
/* Bytes of two block lists (send and receive) of at most ns and nr blocks over R peers. */
int xte_ep_blist_bytes(int64_t ns, int64_t nr, int R, size_t *bytes);
/* Carves the two lists out of mem (xte_ep_blist_bytes of it). */
void xte_ep_blist_init(void *mem, int64_t ns, int64_t nr, int R, xte_ep_blist *s, xte_ep_blist *r);
/* Room in the transport for an exchange (before the agreement: a failure is a local error). */
xte_status xte_ep_reserve(struct xte_ep_group_s *g, int64_t nblocks, int64_t sbytes,
                          int64_t rbytes);
/* The exchange of two block lists (xte_ep_blist_peer(R) closed them), timed and counted;
 * matched: the lists were cut alike on both sides of every pair (xte_ep_blist_seg). */
xte_status xte_ep_exchange(struct xte_ep_group_s *g, xte_ep_blist *s, xte_ep_blist *r, int matched);
/* xte_ep_exchange of matched lists with work(arg) done while the exchange is in flight (where the
 * transport splits it: alltoallw_matched_start / alltoallw_wait), else after it; work touches
 * no block of either list. work's time counts as local. */
xte_status xte_ep_exchange_overlap(struct xte_ep_group_s *g, xte_ep_blist *s, xte_ep_blist *r,
                                   void (*work)(void *), void *arg);
/* Zeroes recv rows that no (token, slot) fills: each expert's padding and rows [recv_rows,
 * nrows) of data (row_bytes per row, ld bytes apart). */
void xte_ep_zero_unrouted(xte_ep_call *c, const xte_ep_handle *eh, int64_t El, char *data,
                          size_t ld, size_t row_bytes, int64_t nrows);

/* Tensor bytes moved: in place on the host, or queued for the block move (a GPU group's device
 * move, a streaming CPU call's host move). */
static inline void xte_ep_mv_copy(xte_ep_call *c, void *dst, const void *src, size_t len) {
  if (!c->queue)
    memcpy(dst, src, len);
  else
    xte_ep_mv_add(c, src, dst, len);
}

static inline void xte_ep_mv_zero(xte_ep_call *c, void *dst, size_t len) {
  if (!c->queue)
    memset(dst, 0, len);
  else
    xte_ep_mv_add(c, NULL, dst, len);
}

static inline void xte_ep_blist_peer(xte_ep_blist *b, int peer) {
  b->off[peer] = b->n;
  b->peer_start = b->n;
}

/* A block of a matched list (both sides of a pair cut their stream alike): cont 1 extends the
 * peer's last block (p must follow it in memory), else a new block starts. */
static inline void xte_ep_blist_seg(xte_ep_blist *b, const void *p, int64_t len, int cont) {
  if (len <= 0) return;
  if (cont && b->n > b->peer_start) {
    b->len[b->n - 1] += len;
    return;
  }
  b->addr[b->n] = (intptr_t)p;
  b->len[b->n] = len;
  b->n++;
}

static inline xte_tensor xte_ep_mk2d(void *data, xte_dtype dt, int64_t rows, int64_t cols,
                                     int64_t ld) {
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

/* ---- prepare.c: the checked arguments of xte_ep_prepare */
typedef struct xte_ep_prepare_args {
  const void *tdata; /* topk_idx's values in host memory */
  void *tcopy;       /* their host copy (a GPU group's; freed by the step) */
  int i64;           /* topk_idx is int64 */
  int64_t T, ld;
  void *handle;
  xte_ep_counts *counts;
  xte_tensor *tokens_per_expert; /* NULL: not asked for */
  int tpe_i64;
} xte_ep_prepare_args;

/* st: the checks' status. Workspace, agreement, then the routing of the step. */
xte_status xte_ep_prepare_run(xte_ep_call *c, xte_status st, xte_ep_prepare_args *a);

/* ---- dispatch.c: the checked arguments of xte_ep_dispatch / xte_ep_dispatch_tokens */
typedef struct xte_ep_dispatch_args {
  int tm; /* token-major (dispatch_tokens) */
  const xte_tensor *x, *x_scales, *topk_weights;
  xte_tensor *recv_x, *recv_scales, *recv_weights, *recv_topk_idx, *recv_topk_weights;
  int64_t T, ldx, lds, ldw, S, nrows, ldo, ldrs, ldti, ldtw;
  int fp8, has_w;
  size_t es, ss;
} xte_ep_dispatch_args;

xte_status xte_ep_dispatch_run(xte_ep_call *c, xte_ep_handle *eh, xte_status st,
                               const xte_ep_dispatch_args *a);

/* ---- combine.c */
/* combine (backward 0) and dispatch_backward (1), checked: the expert rows (ld elements apart,
 * nrows of them) back to the tokens' ranks, then the one-process gather-sum into out. slot_rows:
 * NULL or a dense copy of the received slot rows to write. */
xte_status xte_ep_return_run(xte_ep_call *c, xte_ep_handle *eh, xte_status st,
                             const xte_tensor *rows, int64_t ld, const xte_tensor *weights,
                             xte_tensor *out, xte_tensor *slot_rows, int backward,
                             xte_stream stream);
/* combine_backward, checked: unpermute backward at the tokens' rank, rows out to the experts'
 * grad_expert_out (ldg elements apart, nrows rows). */
xte_status xte_ep_combine_backward_run(xte_ep_call *c, xte_ep_handle *eh, xte_status st,
                                       const xte_tensor *grad_out, const xte_tensor *topk_weights,
                                       const xte_tensor *slot_rows, xte_tensor *grad_expert_out,
                                       int64_t ldg, int64_t nrows, xte_tensor *grad_weights,
                                       xte_stream stream);

#endif /* XTE_EP_CORE_H */
