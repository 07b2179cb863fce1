/* Fuzz target: expert parallelism (include/xte/ep.h) on a one-rank threads world: group creation
 * from a fuzzed config, xte_ep_prepare from a fuzzed topk_idx and handle buffer, then one of
 * dispatch, combine, combine backward, dispatch backward with fuzzed tensors (the steps before it
 * run first with the decoded tensors too, each checked). Every call is checked against the
 * contract of fuzz_common.h: an error changes no buffer (the handle included) and says why. */
#include "fuzz_common.h"

static const xte_dtype k_idx[] = {XTE_DTYPE_INT32, XTE_DTYPE_INT64};
static const xte_dtype k_x[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_E4M3, XTE_DTYPE_E5M2};
static const xte_dtype k_rows[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16};
static const xte_dtype k_scale[] = {XTE_DTYPE_FP32, XTE_DTYPE_E8M0};

static xte_ep_threads_world g_world;

/* A value that is usually v, sometimes off by a little or hostile. */
static int64_t near(fz *f, int64_t v) {
  uint8_t b = fz_u8(f);
  if (b < 232) return v;
  if (b < 248) return fz_wadd(v, (int64_t)(b & 3) - 2);
  return fz_hostile_i64[b % FZ_NHOSTILE];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  xte_ep_config cfg = xte_ep_config_default();
  xte_ep_group g = NULL;
  xte_ep_counts *counts;
  xte_status st;
  xte_tensor idx, tpe, x, xs, w, rx, rs, rw, y, out, slots, gout, gy, gw, gr, gx;
  int64_t T, K, El, rows, S = 0, t, j, E;
  size_t hb = 0, hgive;
  void *handle;
  uint8_t op;
  int fp8;
  xte_dtype xd;
  fz_begin(&f, data, size);
  if (!g_world && xte_ep_threads_world_create(1, &g_world) != XTE_SUCCESS) abort();
  fz_pick_isa(&f);
  op = fz_u8(&f) % 5;
  cfg.experts_per_rank = fz_dim(&f, 12);
  cfg.hidden = fz_dim(&f, 160);
  cfg.topk = (int32_t)fz_dim(&f, 6);
  cfg.align = (int32_t)(fz_rare(&f, 32) ? fz_dim(&f, 1 << 21) : fz_u8(&f) % 20);
  cfg.max_tokens_per_rank = fz_dim(&f, 40);
  if (fz_rare(&f, 16)) cfg.struct_size = (size_t)fz_dim(&f, 200);
  st = xte_ep_group_create_threads(g_world, 0, &cfg, &g);
  if (st == XTE_SUCCESS &&
      (cfg.experts_per_rank < 1 || cfg.hidden < 1 || cfg.topk < 1 || cfg.topk > XTE_EP_MAX_TOPK ||
       cfg.max_tokens_per_rank < 0 || cfg.struct_size != sizeof cfg))
    fz_mark_impossible("bad config");
  fz_check(st, "ep_group_create");
  if (st != XTE_SUCCESS) goto done;
  El = cfg.experts_per_rank;
  E = El;
  K = cfg.topk;
  if (xte_ep_handle_size(g, &hb) != XTE_SUCCESS) fz_fail("handle_size", "ep", XTE_SUCCESS);
  if (hb > FZ_CAP_BYTES) goto done;

  /* prepare */
  T = fz_dim(&f, cfg.max_tokens_per_rank < 40 ? cfg.max_tokens_per_rank : 40);
  if (T < 0) fz_mark_impossible("negative T");
  fz_tensor2(&f, &idx, fz_dtype(&f, k_idx, 2), T, near(&f, K), 0, 1, "topk_idx");
  if (fz_g.skip) goto done;
  if (!fz_g.impossible && idx.dtype >= 0 && idx.dtype < XTE_DTYPE_COUNT &&
      (idx.dtype == XTE_DTYPE_INT32 || idx.dtype == XTE_DTYPE_INT64) && idx.rank == 2 &&
      idx.ld == 0 && idx.shape[1] == K && T > 0) {
    for (t = 0; t < T; t++)
      for (j = 0; j < K; j++) {
        int64_t e = fz_index(&f, -1, E, 16);
        if (idx.dtype == XTE_DTYPE_INT32) e = (int32_t)(uint32_t)(uint64_t)e; /* as stored */
        if (e < -1 || e >= E) fz_mark_impossible("topk_idx entry out of range");
        fz_put_index(idx.data, idx.dtype, t * K + j, e);
      }
    fz_resnap(idx.data);
  }
  hgive = fz_rare(&f, 16) ? hb / 2 : hb;
  handle = fz_alloc(&f, hb, fz_rare(&f, 16) ? 4 : 0, 1, "handle");
  counts = (xte_ep_counts *)fz_alloc(&f, sizeof *counts, 0, 1, "counts");
  memset(&tpe, 0, sizeof tpe);
  if (fz_u8(&f) & 1)
    fz_tensor2(&f, &tpe, fz_dtype(&f, k_idx, 2), 1, near(&f, El), 1, 1, "tokens_per_expert");
  if (fz_g.skip) goto done;
  st = xte_ep_prepare(g, &idx, handle, hgive, counts, tpe.data ? &tpe : NULL, fz_pick_stream(&f));
  fz_check(st, "ep_prepare");
  if (st != XTE_SUCCESS || op == 0) goto done;
  fz_resnap_all();
  rows = counts->recv_rows;

  /* dispatch */
  xd = fz_dtype(&f, k_x, 4);
  fp8 = xd == XTE_DTYPE_E4M3 || xd == XTE_DTYPE_E5M2;
  fz_tensor2(&f, &x, xd, near(&f, T), near(&f, cfg.hidden), 0, 1, "x");
  memset(&xs, 0, sizeof xs);
  memset(&rs, 0, sizeof rs);
  memset(&w, 0, sizeof w);
  memset(&rw, 0, sizeof rw);
  if (fp8 || fz_rare(&f, 16)) {
    S = 1 + fz_u8(&f) % 3;
    xte_dtype sd = fz_dtype(&f, k_scale, 2);
    fz_tensor2(&f, &xs, sd, near(&f, T), S, 0, 1, "x_scales");
    fz_tensor2(&f, &rs, sd, near(&f, rows), near(&f, S), 1, 1, "recv_scales");
  }
  if (fz_u8(&f) & 1) {
    fz_tensor2(&f, &w, XTE_DTYPE_FP32, near(&f, T), near(&f, K), 0, 1, "topk_weights");
    if (fz_u8(&f) & 1) fz_tensor2(&f, &rw, XTE_DTYPE_FP32, 1, near(&f, rows), 1, 1, "recv_weights");
  }
  fz_tensor2(&f, &rx, xd, near(&f, rows), near(&f, cfg.hidden), 1, 1, "recv_x");
  if (fz_g.skip) goto done;
  st = xte_ep_dispatch(g, handle, &x, xs.data ? &xs : NULL, w.data ? &w : NULL, &rx,
                       rs.data ? &rs : NULL, rw.data ? &rw : NULL, fz_pick_stream(&f));
  fz_check(st, "ep_dispatch");
  if (st != XTE_SUCCESS || op == 1) goto done;
  fz_resnap_all();

  /* combine / combine backward / dispatch backward */
  if (op == 2 || op == 3) {
    memset(&slots, 0, sizeof slots);
    fz_tensor2(&f, &y, fz_dtype(&f, k_rows, 2), near(&f, rows), near(&f, cfg.hidden), 0, 1,
               "expert_out");
    fz_tensor2(&f, &out, fz_dtype(&f, k_rows, 2), near(&f, T), near(&f, cfg.hidden), 1, 1, "out");
    if (fz_u8(&f) & 1)
      fz_tensor2(&f, &slots, y.dtype, near(&f, counts->slot_rows), near(&f, cfg.hidden), 1, 1,
                 "slot_rows");
    if (fz_g.skip) goto done;
    st = xte_ep_combine(g, handle, &y, w.data ? &w : NULL, &out, slots.data ? &slots : NULL,
                        fz_pick_stream(&f));
    fz_check(st, "ep_combine");
    if (st != XTE_SUCCESS || op == 2) goto done;
    fz_resnap_all();
    memset(&gw, 0, sizeof gw);
    fz_tensor2(&f, &gout, fz_dtype(&f, k_rows, 2), near(&f, T), near(&f, cfg.hidden), 0, 1,
               "grad_out");
    fz_tensor2(&f, &gy, fz_dtype(&f, k_rows, 2), near(&f, rows), near(&f, cfg.hidden), 1, 1,
               "grad_expert_out");
    if (fz_u8(&f) & 1)
      fz_tensor2(&f, &gw, XTE_DTYPE_FP32, near(&f, T), near(&f, K), 1, 1, "grad_weights");
    if (fz_g.skip) goto done;
    st = xte_ep_combine_backward(g, handle, &gout, w.data ? &w : NULL, slots.data ? &slots : NULL,
                                 &gy, gw.data ? &gw : NULL, fz_pick_stream(&f));
    fz_check(st, "ep_combine_backward");
  } else {
    fz_tensor2(&f, &gr, fz_dtype(&f, k_rows, 2), near(&f, rows), near(&f, cfg.hidden), 0, 1,
               "grad_recv");
    fz_tensor2(&f, &gx, fz_dtype(&f, k_rows, 2), near(&f, T), near(&f, cfg.hidden), 1, 1, "grad_x");
    if (fz_g.skip) goto done;
    st = xte_ep_dispatch_backward(g, handle, &gr, &gx, fz_pick_stream(&f));
    fz_check(st, "ep_dispatch_backward");
  }
done:
  xte_ep_group_destroy(g);
  fz_end();
  return 0;
}
