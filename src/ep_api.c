/* Entry points of expert parallelism (include/xte/ep.h): the argument checks of each call, then
 * the EP core (src/ep/ep_core.h: group, agreement, handle, prepare, dispatch, combine), which runs
 * the step over a transport (src/ep/transport/, behind the table of src/ep/ep_transport.h).
 *
 * A check that fails on one rank still reaches the core: the ranks agree on their statuses
 * before any data moves, so every rank fails together (docs/ep.md). */
#include <stddef.h>
#include <string.h>

#include "core/config.h"
#include "core/tensor.h"
#include "ep/ep_core.h"
#include "ep/ep_transport.h"
#include "xte/ep.h"
#include "xte/moe.h"

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
  if (!xte_ep_handle_layout(g, NULL, NULL, &g->handle_bytes))
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "config: the routing handle's size overflows (max_tokens_per_rank %lld, "
                         "%d ranks)",
                         (long long)g->Tmax, R);
  return XTE_SUCCESS;
}

/* A group over transport tr (owned from here on): the configuration checked, then the core's
 * agreement on it. ex: the stream of a GPU group's creation (NULL: a CPU group). */
static xte_status group_finish(xte_ep_transport *tr, const xte_ep_config *config,
                               xte_ep_group *group, const xte_exec *ex) {
  struct xte_ep_group_s cfg;
  xte_status st;
  memset(&cfg, 0, sizeof cfg);
  st = check_config(config, tr->size, &cfg);
  return xte_ep_group_finish(tr, &cfg, st, group, ex);
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
    xte_ep_group_release(group);
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

/* ------------------------------------------------------------------ prepare */

xte_status xte_ep_prepare(xte_ep_group group, const xte_tensor *topk_idx, void *handle,
                          size_t handle_bytes, xte_ep_counts *counts, xte_tensor *tokens_per_expert,
                          xte_stream stream) {
  struct xte_ep_group_s *g = group;
  xte_status st = XTE_SUCCESS;
  int64_t T = 0, ld = 0, t, j, i;
  int K;
  int64_t El;
  int tpe_i64 = 0;
  int64_t tpe_ld = 1;
  xte_ep_call c;
  xte_ep_prepare_args a;
  const void *tdata = NULL; /* topk_idx's values in host memory */
  void *tcopy = NULL;       /* their copy (GPU group) */
  XTE_CHECK_PTR(g, "group");
  K = g->K;
  El = g->El;
  /* local checks: nothing written yet */
  st = xte_ep_call_stream(g, stream, &c);
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
  memset(&a, 0, sizeof a);
  a.tdata = tdata;
  a.tcopy = tcopy;
  a.i64 = st == XTE_SUCCESS && topk_idx->dtype == XTE_DTYPE_INT64;
  a.T = T;
  a.ld = ld;
  a.handle = handle;
  a.counts = counts;
  a.tokens_per_expert = tokens_per_expert && tokens_per_expert->data ? tokens_per_expert : NULL;
  a.tpe_i64 = tpe_i64;
  return xte_ep_prepare_run(&c, st, &a);
}

/* ------------------------------------------------------------------ dispatch */

/* xte_ep_dispatch (tm 0: expert-major rows, recv_weights) and xte_ep_dispatch_tokens (tm 1: one
 * row per received token, recv_topk_idx / recv_topk_weights). */
static xte_status dispatch_checks(xte_ep_group group, void *handle, const xte_tensor *x,
                                  const xte_tensor *x_scales, const xte_tensor *topk_weights,
                                  xte_tensor *recv_x, xte_tensor *recv_scales,
                                  xte_tensor *recv_weights, xte_tensor *recv_topk_idx,
                                  xte_tensor *recv_topk_weights, int tm, xte_stream stream) {
  struct xte_ep_group_s *g = group;
  xte_ep_handle eh;
  xte_status st;
  int64_t T = 0, H, K, ldx = 0, lds = 0, ldw = 0, S = 0, nrows = 0, ldo = 0, ldrs = 0;
  int64_t ldti = 0, ldtw = 0;
  int fp8 = 0, has_w = 0;
  size_t es = 0, ss = 0;
  xte_ep_call c;
  xte_ep_dispatch_args a;
  XTE_CHECK_PTR(g, "group");
  H = g->H;
  K = g->K;
  memset(&eh, 0, sizeof eh);
  st = xte_ep_call_stream(g, stream, &c);
  if (st == XTE_SUCCESS) st = xte_ep_get_handle(g, handle, 0, &eh);
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
    int64_t sr, sc;
    st = xte_tensor_view2d(recv_scales, "recv_scales", &sr, &sc, &ldrs);
    if (!ldrs) ldrs = S;
  }
  memset(&a, 0, sizeof a);
  a.tm = tm;
  a.x = x;
  a.x_scales = x_scales;
  a.topk_weights = topk_weights;
  a.recv_x = recv_x;
  a.recv_scales = recv_scales;
  a.recv_weights = recv_weights && recv_weights->data ? recv_weights : NULL;
  a.recv_topk_idx = recv_topk_idx && recv_topk_idx->data ? recv_topk_idx : NULL;
  a.recv_topk_weights = recv_topk_weights && recv_topk_weights->data ? recv_topk_weights : NULL;
  a.T = T;
  a.ldx = ldx;
  a.lds = lds;
  a.ldw = ldw;
  a.S = S;
  a.nrows = nrows;
  a.ldo = ldo;
  a.ldrs = ldrs;
  a.ldti = ldti;
  a.ldtw = ldtw;
  a.fp8 = fp8;
  a.has_w = has_w;
  a.es = es;
  a.ss = ss;
  return xte_ep_dispatch_run(&c, &eh, st, &a);
}

xte_status xte_ep_dispatch(xte_ep_group group, void *handle, const xte_tensor *x,
                           const xte_tensor *x_scales, const xte_tensor *topk_weights,
                           xte_tensor *recv_x, xte_tensor *recv_scales, xte_tensor *recv_weights,
                           xte_stream stream) {
  return dispatch_checks(group, handle, x, x_scales, topk_weights, recv_x, recv_scales,
                         recv_weights, NULL, NULL, 0, stream);
}

xte_status xte_ep_dispatch_tokens(xte_ep_group group, void *handle, const xte_tensor *x,
                                  const xte_tensor *x_scales, const xte_tensor *topk_weights,
                                  xte_tensor *recv_x, xte_tensor *recv_scales,
                                  xte_tensor *recv_topk_idx, xte_tensor *recv_topk_weights,
                                  xte_stream stream) {
  return dispatch_checks(group, handle, x, x_scales, topk_weights, recv_x, recv_scales, NULL,
                         recv_topk_idx, recv_topk_weights, 1, stream);
}

/* ------------------------------------------------------------------ rows back and forth */

/* combine and dispatch_backward: the checks, then the core's return of the rows and the sum. */
static xte_status return_checks(struct xte_ep_group_s *g, void *handle, const xte_tensor *rows,
                                const char *rows_name, const xte_tensor *weights, xte_tensor *out,
                                const char *out_name, xte_tensor *slot_rows, int backward,
                                xte_stream stream) {
  xte_ep_handle eh;
  xte_status st;
  int64_t T = 0, H = g->H, ld = 0, nrows = 0, sld = 0;
  int want_slots = 0;
  xte_ep_call c;
  memset(&eh, 0, sizeof eh);
  st = xte_ep_call_stream(g, stream, &c);
  if (st == XTE_SUCCESS) st = xte_ep_get_handle(g, handle, 1, &eh);
  if (st == XTE_SUCCESS) {
    T = eh.h->T;
    st = tview(rows, rows_name, F32 | BF16, -1, eh.h->recv_rows, H, &nrows, &ld);
  }
  if (st == XTE_SUCCESS) st = tview(out, out_name, F32 | BF16, T, 0, H, NULL, NULL);
  if (st == XTE_SUCCESS && weights && weights->data)
    st = tview(weights, "topk_weights", F32, T, 0, g->K, NULL, NULL);
  if (st == XTE_SUCCESS && slot_rows && slot_rows->data) {
    st = tview(slot_rows, "slot_rows", DT(rows->dtype), eh.h->nslot, 0, H, NULL, &sld);
    if (st == XTE_SUCCESS && sld != H)
      st = xte_set_error(XTE_ERROR_SHAPE, "slot_rows->ld = %lld: want a dense tensor",
                         (long long)sld);
    want_slots = 1;
  }
  return xte_ep_return_run(&c, &eh, st, rows, ld, weights && weights->data ? weights : NULL, out,
                           want_slots ? slot_rows : NULL, backward, stream);
}

xte_status xte_ep_combine(xte_ep_group group, void *handle, const xte_tensor *expert_out,
                          const xte_tensor *topk_weights, xte_tensor *out, xte_tensor *slot_rows,
                          xte_stream stream) {
  XTE_CHECK_PTR(group, "group");
  return return_checks(group, handle, expert_out, "expert_out", topk_weights, out, "out", slot_rows,
                       0, stream);
}

xte_status xte_ep_dispatch_backward(xte_ep_group group, void *handle, const xte_tensor *grad_recv,
                                    xte_tensor *grad_x, xte_stream stream) {
  XTE_CHECK_PTR(group, "group");
  return return_checks(group, handle, grad_recv, "grad_recv", NULL, grad_x, "grad_x", NULL, 1,
                       stream);
}

xte_status xte_ep_combine_backward(xte_ep_group group, void *handle, const xte_tensor *grad_out,
                                   const xte_tensor *topk_weights, const xte_tensor *slot_rows,
                                   xte_tensor *grad_expert_out, xte_tensor *grad_weights,
                                   xte_stream stream) {
  struct xte_ep_group_s *g = group;
  xte_ep_handle eh;
  xte_status st;
  int64_t T = 0, H, K, ldg = 0, nrows = 0;
  int want_gw = 0;
  xte_ep_call c;
  XTE_CHECK_PTR(g, "group");
  H = g->H;
  K = g->K;
  memset(&eh, 0, sizeof eh);
  st = xte_ep_call_stream(g, stream, &c);
  if (st == XTE_SUCCESS) st = xte_ep_get_handle(g, handle, 1, &eh);
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
  return xte_ep_combine_backward_run(
      &c, &eh, st, grad_out, topk_weights && topk_weights->data ? topk_weights : NULL, slot_rows,
      grad_expert_out, ldg, nrows, want_gw ? grad_weights : NULL, stream);
}
