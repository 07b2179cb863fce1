/* Expert parallelism on a GPU group (xte_ep_group_create_nccl) run on the host: the SIMT runner's
 * libxte_cuda.so (its "device" memory is host memory, its block-move kernel the text of
 * src/cuda/ep_kernels.cuh, its NCCL transport src/ep/transport/ccl.h) with a fake libnccl.so.2 over
 * threads (tests/simt/fake_nccl.c, loaded through XTE_NCCL_LIBRARY). 1 to 4 rank threads, each
 * with its own CUDA stream and communicator; all tensors are device memory (xte_malloc /
 * xte_memcpy on the CUDA stream); every output is compared byte for byte with the one-process CPU
 * calls (tests/ep_common.h: xte_moe_permute / unpermute and their backwards on the CPU backend)
 * or, for dispatch_tokens and combine's slot_rows, with the rows picked straight from the
 * problem. A bad argument on one rank fails every rank and writes nothing; create_nccl without a
 * loadable library is XTE_ERROR_UNSUPPORTED with a message.
 *
 *   test_simt_ep           the SIMT runner and the fake library (ctest)
 *   test_simt_ep --real    the build's CUDA plugin and the real NCCL (XTE_NCCL_LIBRARY or
 *                          libnccl.so.2) on GPU 0, one rank; test_ep_nccl_device is this program
 *                          built for that alone (tests/device/run.sh step ep_nccl) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>

#include "../ep_common.h"

typedef struct {
  char internal[128];
} nccl_id;

static struct {
  int (*get_id)(nccl_id *);
  int (*init_rank)(void **, int, nccl_id, int);
  int (*destroy)(void *);
  void (*world_destroy)(nccl_id); /* the fake's only */
} N;

static int failures, cases, real_gpu;

/* ---------------------------------------------------------------- device buffers */

static void *dnew(xte_stream s, size_t n, const void *init, int fill) {
  void *d = NULL;
  void *tmp;
  if (xte_malloc(s, n ? n : 1, &d) != XTE_SUCCESS) {
    fprintf(stderr, "xte_malloc: %s\n", xte_last_error());
    abort();
  }
  if (!n) init = NULL; /* an empty tensor: its one byte is filler (init may point past its array) */
  tmp = init ? NULL : malloc(n ? n : 1);
  if (!init) memset(tmp, fill, n ? n : 1);
  if (xte_memcpy(s, d, init ? init : tmp, n ? n : 1, XTE_MEMCPY_HOST_TO_DEVICE) != XTE_SUCCESS)
    abort();
  free(tmp);
  return d;
}

static uint8_t *dget(xte_stream s, const void *d, size_t n) {
  uint8_t *h = (uint8_t *)ep_alloc((int64_t)n);
  if (n && xte_memcpy(s, h, d, n, XTE_MEMCPY_DEVICE_TO_HOST) != XTE_SUCCESS) abort();
  return h;
}

#define CMP(what, dev, want, n)                                                   \
  do {                                                                            \
    uint8_t *h_ = dget(s, (dev), (n));                                            \
    if (!rc) rc |= ep_cmp((what), h_, (const uint8_t *)(want), (n), err, errlen); \
    free(h_);                                                                     \
  } while (0)
#define ALL(what, dev, v, n)                                  \
  do {                                                        \
    uint8_t *h_ = dget(s, (dev), (n));                        \
    if (!rc) rc |= ep_all((what), h_, (v), (n), err, errlen); \
    free(h_);                                                 \
  } while (0)

/* One rank's step on device memory, compared with the one-process result. */
static int run_rank(const ep_problem *p, xte_ep_group g, int rank, xte_stream s, char *err,
                    size_t errlen) {
  const int64_t H = p->H, K = p->K, T = p->T[rank], t0 = p->toff[rank], El = p->El, extra = 3;
  const int64_t lo = p->eoff[rank * El], hi = p->eoff[(rank + 1) * El];
  int64_t nr = hi - lo, e, t, j, i, ntok = 0, nslot = 0;
  const size_t xe = ep_sz(p->xdt), ye = ep_sz(p->ydt), se = p->S ? ep_sz(p->sdt) : 0;
  size_t hb = 0;
  void *handle;
  xte_ep_counts c;
  int rc = 0;
  int64_t tpe_want[64];
  uint8_t *tx, *txs, *tti, *ttw, *slots_want; /* dispatch_tokens' and slot_rows' expected rows */
  void *d_idx, *d_tpe, *d_x, *d_xs = NULL, *d_w, *d_rx, *d_rs = NULL, *d_rw, *d_tx, *d_txs = NULL,
                             *d_tti, *d_ttw, *d_y, *d_out, *d_slots, *d_gout, *d_gy, *d_gw, *d_G,
                             *d_gx;
  xte_tensor idx, tpe_t, x, xs, w, rx, rs, rw, txt, txst, ttit, ttwt, y, out, slots, gout, gy, gw,
      G, gx;
  EP_OK(xte_ep_handle_size(g, &hb));
  handle = ep_alloc((int64_t)hb);
  /* the independent expectations: tokens of every rank with an expert here, global order */
  tx = (uint8_t *)ep_alloc((p->Tall + extra) * H * (int64_t)xe);
  txs = (uint8_t *)ep_alloc((p->Tall + extra) * (p->S ? p->S : 1) * (int64_t)(se ? se : 1));
  tti = (uint8_t *)ep_alloc((p->Tall + extra) * K * 4);
  ttw = (uint8_t *)ep_alloc((p->Tall + extra) * K * 4);
  for (t = 0; t < p->Tall; t++) {
    int any = 0;
    for (j = 0; j < K; j++) any |= p->topk[t * K + j] >= 0 && p->topk[t * K + j] / El == rank;
    if (!any) continue;
    memcpy(tx + (size_t)(ntok * H) * xe, p->x + (size_t)(t * H) * xe, (size_t)H * xe);
    if (p->S)
      memcpy(txs + (size_t)(ntok * p->S) * se, p->xs + (size_t)(t * p->S) * se, (size_t)p->S * se);
    for (j = 0; j < K; j++) {
      int32_t ev = p->topk[t * K + j],
              l = ev >= 0 && ev / El == rank ? ev - rank * (int32_t)El : -1;
      float wv = l >= 0 ? p->w[t * K + j] : 0.0f;
      memcpy(tti + (size_t)(ntok * K + j) * 4, &l, 4);
      memcpy(ttw + (size_t)(ntok * K + j) * 4, &wv, 4);
    }
    ntok++;
  }
  for (i = ntok * K; i < (ntok + extra) * K; i++) {
    int32_t m1 = -1;
    memcpy(tti + (size_t)i * 4, &m1, 4);
  }
  slots_want = (uint8_t *)ep_alloc(T * K * H * (int64_t)ye);
  for (e = 0; e < p->E; e++)
    for (t = 0; t < T; t++)
      for (j = 0; j < K; j++)
        if (p->topk[(t0 + t) * K + j] == e)
          memcpy(slots_want + (size_t)(nslot++ * H) * ye,
                 p->Y + (size_t)(p->row_map[(t0 + t) * K + j] * H) * ye, (size_t)H * ye);
  for (e = 0; e < El; e++) {
    tpe_want[e] = 0;
    for (i = 0; i < p->Tall * K; i++) tpe_want[e] += p->topk[i] == rank * El + e;
  }

  /* prepare */
  d_idx = dnew(s, (size_t)(T * K) * 4, p->topk + t0 * K, 0);
  d_tpe = dnew(s, (size_t)El * 8, NULL, 0xAB);
  idx = ep_t2(d_idx, XTE_DTYPE_INT32, T, K);
  tpe_t = ep_t2(d_tpe, XTE_DTYPE_INT64, 1, El);
  EP_OK(xte_ep_prepare(g, &idx, handle, hb, &c, &tpe_t, s));
  if (c.recv_rows != nr || c.recv_tokens != ntok || c.slot_rows != nslot) {
    snprintf(err, errlen, "counts %lld / %lld / %lld, want %lld / %lld / %lld",
             (long long)c.recv_rows, (long long)c.recv_tokens, (long long)c.slot_rows,
             (long long)nr, (long long)ntok, (long long)nslot);
    rc = 1;
    nr = c.recv_rows < nr ? c.recv_rows : nr;
    ntok = c.recv_tokens < ntok ? c.recv_tokens : ntok;
  }
  CMP("tokens_per_expert", d_tpe, tpe_want, (size_t)El * 8);

  /* dispatch: buffers with extra rows, pre-filled with garbage */
  d_x = dnew(s, (size_t)(T * H) * xe, p->x + (size_t)(t0 * H) * xe, 0);
  if (p->S) d_xs = dnew(s, (size_t)(T * p->S) * se, p->xs + (size_t)(t0 * p->S) * se, 0);
  d_w = dnew(s, (size_t)(T * K) * 4, p->w + t0 * K, 0);
  d_rx = dnew(s, (size_t)((nr + extra) * H) * xe, NULL, 0xAB);
  if (p->S) d_rs = dnew(s, (size_t)((nr + extra) * p->S) * se, NULL, 0xAB);
  d_rw = dnew(s, (size_t)(nr + extra) * 4, NULL, 0xAB);
  x = ep_t2(d_x, p->xdt, T, H);
  xs = ep_t2(d_xs, p->sdt, T, p->S);
  w = ep_t2(d_w, XTE_DTYPE_FP32, T, K);
  rx = ep_t2(d_rx, p->xdt, nr + extra, H);
  rs = ep_t2(d_rs, p->sdt, nr + extra, p->S);
  rw = ep_t2(d_rw, XTE_DTYPE_FP32, 1, nr + extra);
  EP_OK(xte_ep_dispatch(g, handle, &x, p->S ? &xs : NULL, &w, &rx, p->S ? &rs : NULL, &rw, s));
  CMP("recv_x", d_rx, p->px + (size_t)(lo * H) * xe, (size_t)(nr * H) * xe);
  ALL("recv_x extra rows", (uint8_t *)d_rx + (size_t)(nr * H) * xe, 0, (size_t)(extra * H) * xe);
  if (p->S) {
    CMP("recv_scales", d_rs, p->pxs + (size_t)(lo * p->S) * se, (size_t)(nr * p->S) * se);
    ALL("recv_scales extra rows", (uint8_t *)d_rs + (size_t)(nr * p->S) * se, 0,
        (size_t)(extra * p->S) * se);
  }
  CMP("recv_weights", d_rw, p->pw + lo, (size_t)nr * 4);
  ALL("recv_weights extra rows", (float *)d_rw + nr, 0, (size_t)extra * 4);

  /* dispatch_tokens (then the step goes on from it) */
  d_tx = dnew(s, (size_t)((ntok + extra) * H) * xe, NULL, 0xAB);
  if (p->S) d_txs = dnew(s, (size_t)((ntok + extra) * p->S) * se, NULL, 0xAB);
  d_tti = dnew(s, (size_t)((ntok + extra) * K) * 4, NULL, 0xAB);
  d_ttw = dnew(s, (size_t)((ntok + extra) * K) * 4, NULL, 0xAB);
  txt = ep_t2(d_tx, p->xdt, ntok + extra, H);
  txst = ep_t2(d_txs, p->sdt, ntok + extra, p->S);
  ttit = ep_t2(d_tti, XTE_DTYPE_INT32, ntok + extra, K);
  ttwt = ep_t2(d_ttw, XTE_DTYPE_FP32, ntok + extra, K);
  EP_OK(xte_ep_dispatch_tokens(g, handle, &x, p->S ? &xs : NULL, &w, &txt, p->S ? &txst : NULL,
                               &ttit, &ttwt, s));
  CMP("dispatch_tokens recv_x", d_tx, tx, (size_t)((ntok + extra) * H) * xe);
  if (p->S) CMP("dispatch_tokens recv_scales", d_txs, txs, (size_t)((ntok + extra) * p->S) * se);
  CMP("dispatch_tokens recv_topk_idx", d_tti, tti, (size_t)((ntok + extra) * K) * 4);
  CMP("dispatch_tokens recv_topk_weights", d_ttw, ttw, (size_t)((ntok + extra) * K) * 4);

  /* combine */
  d_y = dnew(s, (size_t)(nr * H) * ye, p->Y + (size_t)(lo * H) * ye, 0);
  d_out = dnew(s, (size_t)(T * H) * ye, NULL, 0xAB);
  d_slots = dnew(s, (size_t)(nslot * H) * ye, NULL, 0xAB);
  y = ep_t2(d_y, p->ydt, nr, H);
  out = ep_t2(d_out, p->ydt, T, H);
  slots = ep_t2(d_slots, p->ydt, nslot, H);
  EP_OK(xte_ep_combine(g, handle, &y, &w, &out, &slots, s));
  CMP("combine out", d_out, p->out + (size_t)(t0 * H) * ye, (size_t)(T * H) * ye);
  CMP("combine slot_rows", d_slots, slots_want, (size_t)(nslot * H) * ye);

  /* combine backward */
  d_gout = dnew(s, (size_t)(T * H) * ye, p->gout + (size_t)(t0 * H) * ye, 0);
  d_gy = dnew(s, (size_t)((nr + extra) * H) * ye, NULL, 0xAB);
  d_gw = dnew(s, (size_t)(T * K) * 4, NULL, 0xAB);
  gout = ep_t2(d_gout, p->ydt, T, H);
  gy = ep_t2(d_gy, p->ydt, nr + extra, H);
  gw = ep_t2(d_gw, XTE_DTYPE_FP32, T, K);
  EP_OK(xte_ep_combine_backward(g, handle, &gout, &w, &slots, &gy, &gw, s));
  CMP("grad_expert_out", d_gy, p->gY + (size_t)(lo * H) * ye, (size_t)(nr * H) * ye);
  ALL("grad_expert_out extra rows", (uint8_t *)d_gy + (size_t)(nr * H) * ye, 0,
      (size_t)(extra * H) * ye);
  CMP("grad_weights", d_gw, p->gw + t0 * K, (size_t)(T * K) * 4);

  /* dispatch backward */
  d_G = dnew(s, (size_t)(nr * H) * ye, p->G + (size_t)(lo * H) * ye, 0);
  d_gx = dnew(s, (size_t)(T * H) * ye, NULL, 0xAB);
  G = ep_t2(d_G, p->ydt, nr, H);
  gx = ep_t2(d_gx, p->ydt, T, H);
  EP_OK(xte_ep_dispatch_backward(g, handle, &G, &gx, s));
  CMP("grad_x", d_gx, p->gx + (size_t)(t0 * H) * ye, (size_t)(T * H) * ye);

  if (rc) {
    size_t n = strlen(err);
    snprintf(err + n, errlen - n, " (rank %d)", rank);
  }
  {
    void *d[] = {d_idx, d_tpe, d_x, d_xs,  d_w,     d_rx,   d_rs, d_rw, d_tx, d_txs,
                 d_tti, d_ttw, d_y, d_out, d_slots, d_gout, d_gy, d_gw, d_G,  d_gx};
    for (i = 0; i < (int64_t)(sizeof d / sizeof d[0]); i++)
      if (d[i]) xte_free(s, d[i]);
  }
  free(tx);
  free(txs);
  free(tti);
  free(ttw);
  free(slots_want);
  free(handle);
  return rc;
}

/* A step where rank bad_rank gives a bad argument: mode 1 an expert out of range in prepare,
 * mode 2 a recv_x with rows one element short in dispatch. Every rank must fail and recv_x stay as
 * it was. */
static int run_bad(const ep_problem *p, xte_ep_group g, int rank, int bad_rank, int mode,
                   xte_stream s, char *err, size_t errlen) {
  const int64_t H = p->H, K = p->K, T = p->T[rank], t0 = p->toff[rank];
  const size_t xe = ep_sz(p->xdt), se = p->S ? ep_sz(p->sdt) : 0;
  size_t hb = 0;
  void *handle, *d_idx, *d_x, *d_xs = NULL, *d_rx, *d_rs = NULL;
  int32_t *topk = (int32_t *)ep_alloc(T * K * 4);
  xte_ep_counts c;
  xte_tensor idx, x, xs, rx, rs;
  xte_status st;
  int rc = 0;
  int64_t rows;
  memcpy(topk, p->topk + t0 * K, (size_t)(T * K) * 4);
  if (mode == 1 && rank == bad_rank && T > 0) topk[T * K - 1] = (int32_t)p->E;
  EP_OK(xte_ep_handle_size(g, &hb));
  handle = ep_alloc((int64_t)hb);
  d_idx = dnew(s, (size_t)(T * K) * 4, topk, 0);
  idx = ep_t2(d_idx, XTE_DTYPE_INT32, T, K);
  st = xte_ep_prepare(g, &idx, handle, hb, &c, NULL, s);
  if (mode == 1) {
    if (st == XTE_SUCCESS)
      rc = 1, snprintf(err, errlen, "prepare succeeded with a bad expert on rank %d", bad_rank);
    else if (rank != bad_rank && !strstr(xte_last_error(), "failed its checks"))
      rc = 1, snprintf(err, errlen, "prepare's message on rank %d: %s", rank, xte_last_error());
    else if (rank == bad_rank && !strstr(xte_last_error(), "topk_idx"))
      rc = 1, snprintf(err, errlen, "prepare's message on the bad rank: %s", xte_last_error());
  } else {
    if (st != XTE_SUCCESS) EP_FAIL("prepare: %s", xte_last_error());
    rows = c.recv_rows + 2;
    d_x = dnew(s, (size_t)(T * H) * xe, p->x + (size_t)(t0 * H) * xe, 0);
    if (p->S) d_xs = dnew(s, (size_t)(T * p->S) * se, p->xs + (size_t)(t0 * p->S) * se, 0);
    d_rx = dnew(s, (size_t)(rows * H) * xe, NULL, 0xAB);
    if (p->S) d_rs = dnew(s, (size_t)(rows * p->S) * se, NULL, 0xAB);
    x = ep_t2(d_x, p->xdt, T, H);
    xs = ep_t2(d_xs, p->sdt, T, p->S);
    rx = ep_t2(d_rx, p->xdt, rows, rank == bad_rank ? H - 1 : H); /* the bad one: short rows */
    rs = ep_t2(d_rs, p->sdt, rows, p->S);
    st = xte_ep_dispatch(g, handle, &x, p->S ? &xs : NULL, NULL, &rx, p->S ? &rs : NULL, NULL, s);
    if (st == XTE_SUCCESS)
      rc = 1,
      snprintf(err, errlen, "dispatch succeeded with short recv_x rows on rank %d", bad_rank);
    ALL("recv_x after a refused dispatch", d_rx, 0xAB, (size_t)(rows * H) * xe);
    xte_free(s, d_x);
    if (d_xs) xte_free(s, d_xs);
    xte_free(s, d_rx);
    if (d_rs) xte_free(s, d_rs);
  }
  xte_free(s, d_idx);
  free(handle);
  free(topk);
  return rc;
}

typedef struct rank_arg {
  const ep_problem *p;
  nccl_id id;
  xte_ep_config cfg;
  int rank, mode, bad_rank, rc;
  char err[512];
} rank_arg;

/* Real GPUs: the devices ranks run on (rank r on device r: NCCL takes one GPU per rank, two ranks
 * on one GPU are refused as a duplicate GPU), so at most g_ndev ranks. The rank thread makes
 * its device's primary context current through the driver (libcuda.so.1), so that NCCL (which
 * asks the runtime for the current device) sees it. */
static int g_ndev = 1;
static int rank_device(int rank) {
  int (*retain)(void **, int) = NULL, (*set_current)(void *) = NULL, (*dev_get)(int *, int) = NULL;
  void *lib, *ctx = NULL;
  int dev = 0;
  if (!real_gpu || rank == 0) return 0;
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return -1;
  *(void **)&dev_get = dlsym(lib, "cuDeviceGet");
  *(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&set_current = dlsym(lib, "cuCtxSetCurrent");
  if (!dev_get || !retain || !set_current || dev_get(&dev, rank) != 0 || retain(&ctx, dev) != 0 ||
      set_current(ctx) != 0)
    return -1;
  return rank;
}

static void *rank_main(void *v) {
  rank_arg *a = (rank_arg *)v;
  xte_stream s = NULL;
  xte_ep_group g = NULL;
  void *comm = NULL;
  const char *tr = NULL;
  int rr = -1, nn = -1;
  const int dev = rank_device(a->rank);
  if (dev < 0) {
    snprintf(a->err, sizeof a->err, "rank %d: no context on device %d (libcuda.so.1)", a->rank,
             a->rank);
    a->rc = 1;
    return NULL;
  }
  if (xte_stream_create(XTE_BACKEND_CUDA, dev, NULL, &s) != XTE_SUCCESS) {
    snprintf(a->err, sizeof a->err, "stream: %s", xte_last_error());
    a->rc = 1;
    return NULL;
  }
  if (N.init_rank(&comm, a->p->R, a->id, a->rank) != 0) {
    snprintf(a->err, sizeof a->err, "ncclCommInitRank failed");
    a->rc = 1;
    xte_stream_destroy(s);
    return NULL;
  }
  if (xte_ep_group_create_nccl(&comm, &a->cfg, s, &g) != XTE_SUCCESS) {
    snprintf(a->err, sizeof a->err, "group: %s", xte_last_error());
    a->rc = 1;
  } else if (xte_ep_group_info(g, &rr, &nn, &tr) != XTE_SUCCESS || rr != a->rank || nn != a->p->R ||
             strcmp(tr, "nccl") != 0) {
    snprintf(a->err, sizeof a->err, "group info: rank %d of %d, transport %s", rr, nn,
             tr ? tr : "?");
    a->rc = 1;
  } else if (a->mode == 0) {
    a->rc = run_rank(a->p, g, a->rank, s, a->err, sizeof a->err);
  } else {
    a->rc = run_bad(a->p, g, a->rank, a->bad_rank, a->mode, s, a->err, sizeof a->err);
  }
  xte_ep_group_destroy(g);
  N.destroy(comm);
  xte_stream_destroy(s);
  return NULL;
}

static void run_case(int R, int64_t El, int K, int64_t H, const int64_t *T, int skew, xte_dtype xdt,
                     xte_dtype sdt, int64_t S, int align, uint64_t seed, int mode, int bad_rank) {
  ep_problem p;
  char err[512] = "";
  rank_arg a[4];
  pthread_t th[4];
  nccl_id id;
  int r;
  ep_problem_make(&p, R, El, K, H, T, skew, xdt, sdt, S, align, seed);
  if (ep_problem_reference(&p, err, sizeof err)) {
    fprintf(stderr, "FAIL reference: %s\n", err);
    failures++;
    ep_problem_free(&p);
    return;
  }
  if (N.get_id(&id) != 0) {
    fprintf(stderr, "FAIL ncclGetUniqueId\n");
    failures++;
    ep_problem_free(&p);
    return;
  }
  for (r = 0; r < R; r++) {
    a[r].p = &p;
    a[r].id = id;
    a[r].cfg = ep_problem_config(&p);
    a[r].rank = r;
    a[r].mode = mode;
    a[r].bad_rank = bad_rank;
    a[r].rc = 0;
    a[r].err[0] = '\0';
    pthread_create(&th[r], NULL, rank_main, &a[r]);
  }
  for (r = 0; r < R; r++) pthread_join(th[r], NULL);
  cases++;
  for (r = 0; r < R; r++)
    if (a[r].rc) {
      failures++;
      fprintf(stderr, "FAIL R=%d El=%lld K=%d H=%lld %s align %d skew %d mode %d: rank %d: %s\n", R,
              (long long)El, K, (long long)H, xte_dtype_name(xdt), align, skew, mode, r, a[r].err);
    }
  if (N.world_destroy) N.world_destroy(id);
  ep_problem_free(&p);
}

int main(int argc, char **argv) {
  const char *lib;
  void *dl;
  xte_stream gs = NULL, cs = NULL;
  xte_ep_group g = NULL;
  xte_ep_config cfg = xte_ep_config_default();
  xte_status st;
  void *fake_comm = &cfg; /* never used: the library does not load */
  struct timespec t0, t1;
  int R;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  real_gpu = argc > 1 && strcmp(argv[1], "--real") == 0;
#ifdef XTE_EP_TEST_REAL_ONLY
  real_gpu = 1; /* test_ep_nccl_device: no SIMT runner, no fake library */
#endif
  if (!real_gpu) setenv("XTE_PLUGIN_DIR", SIMT_PLUGIN_DIR, 1);
  if (xte_stream_create(XTE_BACKEND_CUDA, 0, NULL, &gs) != XTE_SUCCESS ||
      xte_stream_create(XTE_BACKEND_CPU, 0, NULL, &cs) != XTE_SUCCESS) {
    fprintf(stderr, "test_simt_ep: no CUDA stream: %s\n", xte_last_error());
    return 2;
  }
  cfg.hidden = 16;
  cfg.max_tokens_per_rank = 4;

  /* no loadable library: UNSUPPORTED, saying what to set */
  if (!real_gpu) {
    setenv("XTE_NCCL_LIBRARY", "/nonexistent/libnccl-missing.so.2", 1);
    st = xte_ep_group_create_nccl(&fake_comm, &cfg, gs, &g);
    cases++;
    if (st != XTE_ERROR_UNSUPPORTED || !strstr(xte_last_error(), "XTE_NCCL_LIBRARY") ||
        !strstr(xte_last_error(), "libnccl-missing")) {
      fprintf(stderr, "FAIL missing library: %s: %s\n", xte_status_string(st), xte_last_error());
      failures++;
    }
  }
  /* a CPU stream for an NCCL group */
  st = xte_ep_group_create_nccl(&fake_comm, &cfg, cs, &g);
  cases++;
  if (st != XTE_ERROR_INVALID_ARGUMENT || !strstr(xte_last_error(), "stream")) {
    fprintf(stderr, "FAIL CPU stream: %s: %s\n", xte_status_string(st), xte_last_error());
    failures++;
  }

  if (real_gpu) {
    lib = getenv("XTE_NCCL_LIBRARY");
    if (!lib || !lib[0]) lib = "libnccl.so.2";
  } else {
    lib = FAKE_NCCL_PATH;
    setenv("XTE_NCCL_LIBRARY", lib, 1);
  }
  dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    fprintf(stderr, "test_simt_ep: %s: %s\n", lib, dlerror());
    return 2;
  }
  *(void **)&N.get_id = dlsym(dl, "ncclGetUniqueId");
  *(void **)&N.init_rank = dlsym(dl, "ncclCommInitRank");
  *(void **)&N.destroy = dlsym(dl, "ncclCommDestroy");
  *(void **)&N.world_destroy = dlsym(dl, "fake_ncclWorldDestroy");
  if (!N.get_id || !N.init_rank || !N.destroy) {
    fprintf(stderr, "test_simt_ep: %s lacks the communicator functions\n", lib);
    return 2;
  }

  if (real_gpu) {
    xte_backend_info bi;
    if (xte_get_backend_info(&bi) == XTE_SUCCESS && bi.num_cuda_gpus > 1)
      g_ndev = bi.num_cuda_gpus < 4 ? bi.num_cuda_gpus : 4;
    printf("test_simt_ep: real NCCL, ranks 1 to %d (%d GPU(s): NCCL takes one GPU per rank)\n",
           g_ndev, g_ndev);
    if (g_ndev < 2)
      printf(
          "test_simt_ep: more than 1 rank: not possible here (one GPU; two ranks on one GPU "
          "are a duplicate GPU to NCCL)\n");
  }
  for (R = 1; R <= (real_gpu ? g_ndev : 4); R++) {
    static const int64_t T[4] = {29, 0, 23, 5};
    static const int64_t T1[4] = {9, 17, 0, 3};
    run_case(R, 3, 4, 96, T, 1, XTE_DTYPE_BF16, XTE_DTYPE_FP32, 0, 8, 21 + (uint64_t)R, 0, 0);
    run_case(R, 2, 3, 256, T, 2, XTE_DTYPE_E4M3, XTE_DTYPE_FP32, 2, 16, 31 + (uint64_t)R, 0, 0);
    run_case(R, 2, 2, 130, T1, 1, XTE_DTYPE_E4M3, XTE_DTYPE_E8M0, 2, 4, 41 + (uint64_t)R, 0, 0);
    run_case(R, 1, 2, 36, T1, 0, XTE_DTYPE_FP32, XTE_DTYPE_FP32, 0, 1, 51 + (uint64_t)R, 0, 0);
  }
  {
    static const int64_t T[4] = {12, 0, 7, 9};
    const int Rb = real_gpu ? g_ndev : 3;
    int bad;
    for (bad = 0; bad < Rb; bad++) {
      run_case(Rb, 2, 2, 64, T, 0, XTE_DTYPE_BF16, XTE_DTYPE_FP32, 0, 4, 61, 1,
               bad == 1 && Rb > 2 ? 2 : bad);
      run_case(Rb, 2, 2, 128, T, 0, XTE_DTYPE_E4M3, XTE_DTYPE_E8M0, 1, 4, 62, 2, bad);
    }
  }
  xte_stream_destroy(gs);
  xte_stream_destroy(cs);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("test_simt_ep (%s, up to %d ranks): %d cases, %d failures, %.1f s\n",
         real_gpu ? "real NCCL" : "SIMT runner, fake NCCL", real_gpu ? g_ndev : 4, cases, failures,
         (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
  return failures ? 1 : 0;
}
