/* Fuzz target: MoE token movement: xte_moe_permute_rows, xte_moe_permute, xte_moe_unpermute,
 * xte_moe_permute_backward, xte_moe_unpermute_backward, xte_moe_sort_chunks_by_index (+ backward),
 * xte_moe_dispatch_layout. Row maps come from a real permute (valid) with hostile entries mixed
 * in: out of range, duplicated, on empty slots. */
#include "fuzz_common.h"

static const xte_dtype k_idx[] = {XTE_DTYPE_INT32, XTE_DTYPE_INT64};
static const xte_dtype k_i32[] = {XTE_DTYPE_INT32};
static const xte_dtype k_u8[] = {XTE_DTYPE_UINT8};
static const xte_dtype k_act[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
static const xte_dtype k_perm_in[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_E4M3,
                                      XTE_DTYPE_E5M2, XTE_DTYPE_FP16};
static const xte_dtype k_any[] = {XTE_DTYPE_FP32,  XTE_DTYPE_BF16,  XTE_DTYPE_E4M3,
                                  XTE_DTYPE_UINT8, XTE_DTYPE_INT64, XTE_DTYPE_FP16};

typedef struct route {
  xte_moe_routing r;
  xte_tensor map, idx;
  int64_t T, E, K; /* K: slots per token (topk_idx columns, or the most a map row holds) */
  int64_t *counts; /* map: routed experts of each token (NULL when unknown) */
  int valid;       /* a descriptor a valid call can have */
} route;

static int64_t g_counts[64];

/* The routing: a map or topk_idx (exactly one mostly), valid values mostly. */
static void make_route(fz *f, route *rt) {
  int64_t t, j, e;
  memset(rt, 0, sizeof *rt);
  rt->T = fz_dim(f, 24);
  rt->E = fz_rare(f, 16) ? fz_hostile_i64[fz_u8(f) % FZ_NHOSTILE] : 1 + fz_u8(f) % 10;
  rt->valid = rt->T >= 0 && rt->E >= 1;
  rt->r.num_experts = rt->E;
  if (fz_u8(f) & 1) {
    int64_t E = rt->E >= 1 && rt->E <= 64 ? rt->E : (fz_u8(f) & 7);
    uint8_t *m =
        (uint8_t *)fz_tensor2(f, &rt->map, fz_dtype(f, k_u8, 1), rt->T, E, 0, 1, "routing_map");
    int bad;
    size_t nb = fz_tensor_bytes(&rt->map, &bad);
    rt->r.routing_map = &rt->map;
    rt->K = 0;
    if (!bad && !fz_g.skip && rt->map.rank == 2 && rt->map.ld == 0 && rt->T <= 64 &&
        rt->T * E == (int64_t)nb) {
      int topk = 1 + fz_u8(f) % 4;
      for (t = 0; t < rt->T; t++) {
        g_counts[t] = 0;
        for (e = 0; e < E; e++) {
          m[t * E + e] = (fz_u8(f) % 8) < (unsigned)topk ? (fz_rare(f, 16) ? fz_u8(f) : 1) : 0;
          g_counts[t] += m[t * E + e] != 0;
        }
        if (g_counts[t] > rt->K) rt->K = g_counts[t];
      }
      rt->counts = g_counts;
      fz_resnap(m);
    }
    if (rt->K == 0) rt->K = 1;
    if (fz_rare(f, 16)) { /* a topk_idx too: must be rejected */
      rt->r.topk_idx = &rt->idx;
      fz_tensor2(f, &rt->idx, XTE_DTYPE_INT32, rt->T, 1, 0, 0, "topk_idx");
      rt->valid = 0;
    }
  } else {
    int64_t k = fz_rare(f, 16) ? fz_dim(f, 20) : 1 + fz_u8(f) % 4;
    void *p = fz_tensor2(f, &rt->idx, fz_dtype(f, k_idx, 2), rt->T, k, 0, 1, "topk_idx");
    int bad;
    size_t nb = fz_tensor_bytes(&rt->idx, &bad);
    size_t es = rt->idx.dtype == XTE_DTYPE_INT64 ? 8 : 4;
    rt->r.topk_idx = &rt->idx;
    rt->K = k;
    if (!bad && !fz_g.skip && rt->idx.rank == 2 && rt->idx.ld == 0 && k >= 1 && rt->T >= 0 &&
        (rt->idx.dtype == XTE_DTYPE_INT32 || rt->idx.dtype == XTE_DTYPE_INT64) &&
        (size_t)(rt->T * k) * es == nb && (fz_u8(f) & 3)) {
      int64_t E = rt->E >= 1 && rt->E <= 64 ? rt->E : 8;
      for (t = 0; t < rt->T; t++) {
        uint64_t used = 0;
        for (j = 0; j < k; j++) {
          int64_t v = fz_index(f, -1, E, 16);
          if (v >= 0 && v < 64 && (used >> v & 1)) v = -1; /* distinct experts */
          if (v >= 0 && v < 64) used |= 1ull << v;
          fz_put_index(p, rt->idx.dtype, t * k + j, v);
        }
      }
      fz_resnap(p);
    }
    if (fz_rare(f, 16)) rt->r.routing_map = NULL, rt->r.topk_idx = NULL, rt->valid = 0;
  }
  if (rt->E > 1 << 20) rt->valid = 0;
}

static void make_cfg(fz *f, xte_permute_config *c) {
  *c = xte_permute_config_default();
  c->num_out_tokens = fz_rare(f, 32) ? fz_hostile_i64[fz_u8(f) % FZ_NHOSTILE]
                                     : ((fz_u8(f) & 3) ? -1 : fz_u8(f) % 40);
  c->align = fz_rare(f, 32) ? fz_hostile_i64[fz_u8(f) % FZ_NHOSTILE]
                            : (fz_u8(f) & 1 ? 0 : 1 << (fz_u8(f) % 4));
}

/* Rows of the permuted tensor as the library computes them (-1 if it fails). The call is a
 * checked call of its own. */
static int64_t permute_rows(fz *f, route *rt, const xte_permute_config *c) {
  int64_t *rows = (int64_t *)fz_alloc(f, 8, 0, 1, "rows");
  xte_status st = xte_moe_permute_rows(&rt->r, c, rows, NULL);
  int64_t r = st == XTE_SUCCESS ? *rows : -1;
  if (!rt->valid) fz_mark_impossible("routing");
  fz_check(st, "moe_permute_rows");
  fz_g.impossible = 0;
  fz_g.why = NULL;
  fz_resnap_all();
  if (st == XTE_SUCCESS && r < 0) fz_fail("negative rows", "moe_permute_rows", st);
  return r;
}

/* A row map for the backward ops: from a real permute of a scratch tensor when it succeeds,
 * else fuzz values; then hostile entries. Flags the descriptor impossible when an entry is
 * out of range (outside [-1, rows)), duplicated, or on an empty slot of a map (with probs). R:
 * the rows the map is built for (R <= rows; rows > R: an empty [rows, 0] tensor of a huge row
 * count, whose rows past R are valid but never named). */
static int32_t *make_row_map(fz *f, route *rt, const xte_permute_config *c, int64_t R, int64_t rows,
                             xte_tensor *rm, int with_probs, int dup_bad) {
  int64_t T = rt->T, K = rt->K, t, j, i;
  int32_t *p;
  int bad;
  size_t nb;
  p = (int32_t *)fz_tensor2(f, rm, fz_dtype(f, k_i32, 1), T, K, 0, 1, "row_map");
  nb = fz_tensor_bytes(rm, &bad);
  if (bad || fz_g.skip || (uintptr_t)p % 4 || rm->dtype != XTE_DTYPE_INT32 || rm->rank != 2 ||
      rm->ld != 0 || T < 0 || K < 1 || (size_t)(T * K) * 4 != nb || R < 0 || R > 4096)
    return p;
  if (fz_u8(f) & 3) {
    xte_tensor in, out;
    float *bin = (float *)calloc((size_t)(T > 0 ? T : 1), 4);
    float *bout = (float *)calloc((size_t)(R > 0 ? R : 1), 4);
    int32_t *brm = (int32_t *)malloc(nb ? nb : 4);
    xte_tensor trm = *rm;
    xte_status st;
    if (!bin || !bout || !brm) abort();
    in = xte_tensor_2d(bin, XTE_DTYPE_FP32, T, 1);
    out = xte_tensor_2d(bout, XTE_DTYPE_FP32, R, 1);
    trm.data = brm;
    st = xte_moe_permute(&in, NULL, &rt->r, c, &out, NULL, &trm, NULL, NULL);
    if (st == XTE_SUCCESS) memcpy(p, brm, nb);
    free(bin);
    free(bout);
    free(brm);
  } else {
    for (i = 0; i < T * K; i++) p[i] = (int32_t)fz_index(f, -1, R, 0);
  }
  /* hostile entries */
  if (fz_rare(f, 64)) {
    int n = 1 + (fz_u8(f) & 3);
    while (n-- > 0 && T * K > 0) {
      int64_t at = fz_u16(f) % (T * K);
      uint8_t how = fz_u8(f) % 3;
      if (how == 0)
        p[at] = (int32_t)fz_index(f, -1, R, 255);
      else if (how == 1)
        p[at] = p[fz_u16(f) % (T * K)]; /* duplicate */
      else
        p[at] = (int32_t)fz_index(f, -1, R, 0);
    }
  }
  fz_resnap(p);
  /* what no valid call has (duplicates by a seen-table over the R <= 4096 rows: the pairwise
   * scan was quadratic in T * K, 200 s for one input of a long run) */
  {
    uint8_t seen[4096];
    memset(seen, 0, sizeof seen);
    for (t = 0; t < T; t++)
      for (j = 0; j < K; j++) {
        int32_t v = p[t * K + j];
        if (v < -1 || v >= rows) fz_mark_impossible("row_map entry out of range");
        if (v >= 0 && with_probs && rt->r.routing_map && rt->counts && j >= rt->counts[t])
          fz_mark_impossible("row_map entry on an empty slot");
        if (v >= 0 && v < R && dup_bad) {
          if (seen[v]) fz_mark_impossible("duplicate row_map entry");
          seen[v] = 1;
        }
      }
  }
  return p;
}

static void do_token_ops(fz *f, int op) {
  route rt;
  xte_permute_config cfg;
  int64_t R, H = fz_dim(f, 20), rows, map_rows;
  xte_status st;
  int use_cfg;
  make_route(f, &rt);
  make_cfg(f, &cfg);
  use_cfg = !fz_rare(f, 16);
  if (fz_g.skip) return;
  R = permute_rows(f, &rt, use_cfg ? &cfg : NULL);
  rows = R >= 0 && R <= 4096 ? R + (fz_rare(f, 32) ? fz_u8(f) % 3 : 0) : fz_u8(f) % 8;
  map_rows = rows;
  /* an empty hidden dim: sometimes a huge row count of no bytes for the permute's output and the
   * gathers' input / grad_input (the zeroing walked all 2^40 rows of nothing: h4's sweep) */
  if (H == 0 && R >= 0 && R <= 4096 && fz_rare(f, 32))
    rows = (fz_u8(f) & 1) ? (int64_t)1 << 40 : ((int64_t)1 << 32) + 1;
  if (op == 1) { /* permute */
    xte_tensor in, sc, out, osc, rm;
    xte_permute_outputs ex;
    xte_dtype dt = fz_dtype(f, k_perm_in, 5);
    int fp8 = dt == XTE_DTYPE_E4M3 || dt == XTE_DTYPE_E5M2;
    int64_t S = 1 + fz_u8(f) % 3, want_rows = rows;
    int with_ex;
    if (R > 0 && fz_rare(f, 16)) {
      want_rows = R - 1; /* too few output rows: must fail */
      fz_mark_impossible("output rows < R");
    }
    fz_tensor2(f, &in, dt, rt.T, H, 0, 1, "input");
    memset(&sc, 0, sizeof sc);
    memset(&osc, 0, sizeof osc);
    if (fp8 || fz_rare(f, 16)) {
      xte_dtype sd = (fz_u8(f) & 1) ? XTE_DTYPE_FP32 : XTE_DTYPE_E8M0;
      fz_tensor2(f, &sc, sd, rt.T, S, 0, fp8, "input_scales");
      fz_tensor2(f, &osc, sd, want_rows, S, 1, fp8, "output_scales");
    }
    fz_tensor2(f, &out, dt, want_rows, H, 1, 1, "output");
    fz_tensor2(f, &rm, fz_dtype(f, k_i32, 1), rt.T, rt.K, 1, 1, "row_map");
    memset(&ex, 0, sizeof ex);
    with_ex = fz_u8(f) & 1;
    if (with_ex && (fz_u8(f) & 1))
      fz_tensor2(f, &ex.expert_offsets, fz_dtype(f, k_idx, 2), 1,
                 rt.E >= 0 && rt.E < 64 ? rt.E + 1 : 1, 1, 1, "expert_offsets");
    if (with_ex && (fz_u8(f) & 1))
      fz_tensor2(f, &ex.tokens_per_expert, fz_dtype(f, k_idx, 2), 1,
                 rt.E >= 0 && rt.E < 64 ? rt.E : 1, 1, 1, "tokens_per_expert");
    if (with_ex && (fz_u8(f) & 1))
      fz_tensor2(f, &ex.row_to_expert, fz_dtype(f, k_i32, 1), want_rows, 1, 1, 1, "row_to_expert");
    if (!rt.valid) fz_mark_impossible("routing");
    if (fz_g.skip) return;
    st = xte_moe_permute(&in, sc.data ? &sc : NULL, &rt.r, use_cfg ? &cfg : NULL, &out,
                         osc.data ? &osc : NULL, &rm, with_ex ? &ex : NULL, fz_pick_stream(f));
    fz_check(st, "moe_permute");
  } else if (op == 2 || op == 3) { /* unpermute / permute backward (gathers) */
    xte_tensor in, rm, probs, out;
    int with_probs = op == 2 && (fz_u8(f) & 1);
    if (!rt.valid) fz_mark_impossible("routing");
    make_row_map(f, &rt, use_cfg ? &cfg : NULL, map_rows, rows, &rm, with_probs, 0);
    fz_tensor2(f, &in, fz_dtype(f, k_act, 3), rows, H, 0, 1, "input");
    if (with_probs)
      fz_tensor2(f, &probs, XTE_DTYPE_FP32, rt.T, rt.r.routing_map ? rt.map.shape[1] : rt.K, 0, 1,
                 "probs");
    fz_tensor2(f, &out, fz_dtype(f, k_act, 3), rt.T, H, 1, 1, "out");
    if (fz_g.skip) return;
    if (op == 2)
      st = xte_moe_unpermute(&in, &rt.r, &rm, with_probs ? &probs : NULL, &out, fz_pick_stream(f));
    else
      st = xte_moe_permute_backward(&in, &rt.r, &rm, &out, fz_pick_stream(f));
    fz_check(st, op == 2 ? "moe_unpermute" : "moe_permute_backward");
  } else { /* unpermute backward (a scatter) */
    xte_tensor go, in, rm, probs, gi, gp;
    int with_probs = fz_u8(f) & 1, with_gp = with_probs && (fz_u8(f) & 1);
    int64_t pc = rt.r.routing_map ? rt.map.shape[1] : rt.K;
    if (!rt.valid) fz_mark_impossible("routing");
    make_row_map(f, &rt, use_cfg ? &cfg : NULL, map_rows, rows, &rm, with_probs, 1);
    fz_tensor2(f, &go, fz_dtype(f, k_act, 3), rt.T, H, 0, 1, "grad_out");
    fz_tensor2(f, &in, fz_dtype(f, k_act, 3), rows, H, 0, with_gp, "input");
    if (with_probs) fz_tensor2(f, &probs, XTE_DTYPE_FP32, rt.T, pc, 0, 1, "probs");
    fz_tensor2(f, &gi, fz_dtype(f, k_act, 3), rows, H, 1, 1, "grad_input");
    if (with_gp) fz_tensor2(f, &gp, XTE_DTYPE_FP32, rt.T, pc, 1, 1, "grad_probs");
    if (fz_g.skip) return;
    st = xte_moe_unpermute_backward(&go, (fz_u8(f) & 3) ? &in : NULL, &rt.r, &rm,
                                    with_probs ? &probs : NULL, &gi, with_gp ? &gp : NULL,
                                    fz_pick_stream(f));
    fz_check(st, "moe_unpermute_backward");
  }
}

static void do_sort_chunks(fz *f, int backward) {
  int64_t R = fz_dim(f, 40), H = fz_dim(f, 12), n = 1 + fz_u8(f) % 6, i, sum = 0;
  xte_dtype dt = fz_dtype(f, k_any, 6);
  xte_tensor in, out, ss, si, rm;
  xte_status st;
  if (!backward) {
    void *sp, *ip;
    int hostile = fz_rare(f, 32), bad;
    fz_tensor2(f, &in, dt, R, H, 0, 1, "input");
    sp = fz_tensor2(f, &ss, fz_dtype(f, k_idx, 2), 1, n, 0, 1, "split_sizes");
    ip = fz_tensor2(f, &si, fz_dtype(f, k_idx, 2), 1, n, 0, 1, "sorted_index");
    if (!fz_g.skip && ss.rank == 2 && ss.ld == 0 &&
        fz_tensor_bytes(&ss, &bad) == (size_t)n * xte_dtype_size(ss.dtype) && !bad &&
        (ss.dtype == XTE_DTYPE_INT32 || ss.dtype == XTE_DTYPE_INT64) && R >= 0 && (fz_u8(f) & 7)) {
      int64_t left = R;
      for (i = 0; i < n; i++) {
        int64_t v = i + 1 < n ? (left > 0 && left < 100000 ? fz_u8(f) % (left + 1) : 0) : left;
        if (hostile && (fz_u8(f) & 1)) v = fz_index(f, 0, 1, 255);
        left = (int64_t)((uint64_t)left - (uint64_t)v);
        fz_put_index(sp, ss.dtype, i, v);
      }
      if (hostile && n >= 2 && ss.dtype == XTE_DTYPE_INT64 && (fz_u8(f) & 1)) {
        /* two sizes whose sum wraps to R */
        int64_t a = INT64_MAX - (fz_u8(f) & 3), b = (int64_t)((uint64_t)R - (uint64_t)a);
        fz_put_index(sp, ss.dtype, 0, a);
        fz_put_index(sp, ss.dtype, 1, b);
        for (i = 2; i < n; i++) fz_put_index(sp, ss.dtype, i, 0);
      }
      fz_resnap(sp);
      for (i = 0; i < n; i++) {
        int64_t v = fz_get_index(sp, ss.dtype, i);
        if (v < 0 || __builtin_add_overflow(sum, v, &sum)) fz_mark_impossible("split_sizes");
      }
    }
    if (!fz_g.skip && si.rank == 2 && si.ld == 0 &&
        fz_tensor_bytes(&si, &bad) == (size_t)n * xte_dtype_size(si.dtype) && !bad &&
        (si.dtype == XTE_DTYPE_INT32 || si.dtype == XTE_DTYPE_INT64) && (fz_u8(f) & 7)) {
      uint64_t seen = 0;
      for (i = 0; i < n; i++) fz_put_index(ip, si.dtype, i, i);
      for (i = n - 1; i > 0; i--) { /* shuffle */
        int64_t j = fz_u8(f) % (i + 1), a, b;
        a = fz_get_index(ip, si.dtype, i);
        b = fz_get_index(ip, si.dtype, j);
        fz_put_index(ip, si.dtype, i, b);
        fz_put_index(ip, si.dtype, j, a);
      }
      if (fz_rare(f, 32)) fz_put_index(ip, si.dtype, fz_u8(f) % n, fz_index(f, 0, n, 128));
      fz_resnap(ip);
      for (i = 0; i < n; i++) {
        int64_t v = fz_get_index(ip, si.dtype, i);
        if (v < 0 || v >= n || (seen >> v & 1))
          fz_mark_impossible("sorted_index");
        else
          seen |= 1ull << v;
      }
    }
    /* known defect: 0 input rows give a misaligned int64 workspace (moe_permute.c) */
    if (R == 0 && fz_avoid("sort_chunks_ws_align")) return;
    fz_tensor2(f, &out, dt, R, H, 1, 1, "output");
    if (fz_u8(f) & 1)
      fz_tensor2(f, &rm, fz_dtype(f, k_i32, 1), 1, R, 1, 1, "row_map");
    else
      memset(&rm, 0, sizeof rm);
    if (fz_g.skip) return;
    st = xte_moe_sort_chunks_by_index(&in, &ss, &si, &out, rm.data ? &rm : NULL, fz_pick_stream(f));
    fz_check(st, "moe_sort_chunks_by_index");
  } else {
    int32_t *p;
    int bad;
    fz_tensor2(f, &in, dt, R, H, 0, 1, "grad_output");
    p = (int32_t *)fz_tensor2(f, &rm, fz_dtype(f, k_i32, 1), 1, R, 0, 1, "row_map");
    if (!fz_g.skip && (uintptr_t)p % 4 == 0 && rm.dtype == XTE_DTYPE_INT32 && rm.rank == 2 &&
        rm.ld == 0 && R >= 0 && fz_tensor_bytes(&rm, &bad) == (size_t)R * 4 && !bad) {
      int h = fz_rare(f, 32) ? 64 : 0;
      for (i = 0; i < R; i++) p[i] = (int32_t)fz_index(f, 0, R, h);
      fz_resnap(p);
      for (i = 0; i < R; i++)
        if (p[i] < 0 || p[i] >= R) fz_mark_impossible("row_map entry out of range");
    }
    fz_tensor2(f, &out, dt, R, H, 1, 1, "grad_input");
    if (fz_g.skip) return;
    st = xte_moe_sort_chunks_backward(&in, &rm, &out, fz_pick_stream(f));
    fz_check(st, "moe_sort_chunks_backward");
  }
}

static void do_dispatch(fz *f) {
  route rt;
  int ranks = fz_rare(f, 16) ? fz_enum(f, 64) : 1 + fz_u8(f) % 4;
  xte_tensor tpr, tpe, itr;
  int64_t E;
  xte_status st;
  int any = 0;
  do {
    make_route(f, &rt);
  } while (0);
  if (rt.r.routing_map) { /* dispatch takes topk_idx only: the map is not consulted */
    fz_g.impossible = 0;
    fz_g.why = NULL;
  }
  if (rt.r.topk_idx == NULL) {
    /* make_route gave no topk_idx (a map, or rarely no routing at all after building one):
     * what it built is not consulted, so its marks go too (fuzz finding: a bad-dtype topk_idx
     * dropped by make_route left the flag set for the fresh, valid one below) */
    fz_g.impossible = 0;
    fz_g.why = NULL;
    fz_tensor2(f, &rt.idx, XTE_DTYPE_INT32, rt.T, 2, 0, 1, "topk_idx");
  }
  E = rt.E;
  memset(&tpr, 0, sizeof tpr);
  memset(&tpe, 0, sizeof tpe);
  memset(&itr, 0, sizeof itr);
  if (fz_u8(f) & 1)
    any++, fz_tensor2(f, &tpr, fz_dtype(f, k_i32, 1), 1, ranks, 1, 1, "tokens_per_rank");
  if (fz_u8(f) & 1)
    any++, fz_tensor2(f, &tpe, fz_dtype(f, k_i32, 1), 1, E >= 0 && E < 64 ? E : 1, 1, 1,
                      "tokens_per_expert");
  if (fz_u8(f) & 1)
    any++, fz_tensor2(f, &itr, fz_dtype(f, k_u8, 1), rt.T, ranks, 1, 1, "is_token_in_rank");
  if (ranks < 1 || E < 1 || (E % ranks) != 0) fz_mark_impossible("num_ranks / num_experts");
  { /* expert indices must be -1 or in [0, E) */
    int bad;
    size_t nb = fz_tensor_bytes(&rt.idx, &bad), es = rt.idx.dtype == XTE_DTYPE_INT64 ? 8 : 4, i;
    if (!bad && !fz_g.skip && rt.idx.ld == 0 &&
        (rt.idx.dtype == XTE_DTYPE_INT32 || rt.idx.dtype == XTE_DTYPE_INT64))
      for (i = 0; (i + 1) * es <= nb; i++) {
        int64_t v = fz_get_index(rt.idx.data, rt.idx.dtype, (int64_t)i);
        if (v < -1 || v >= E) fz_mark_impossible("topk_idx entry out of range");
      }
  }
  if (fz_g.skip) return;
  st = xte_moe_dispatch_layout(&rt.idx, E, ranks, tpr.data ? &tpr : NULL, tpe.data ? &tpe : NULL,
                               itr.data ? &itr : NULL, fz_pick_stream(f));
  fz_check(st, "moe_dispatch_layout");
  (void)any;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  uint8_t op;
  fz_begin(&f, data, size);
  fz_pick_isa(&f);
  op = fz_u8(&f) % 8;
  if (op <= 4) {
    if (op == 0) {
      route rt;
      xte_permute_config cfg;
      make_route(&f, &rt);
      make_cfg(&f, &cfg);
      if (!fz_g.skip) permute_rows(&f, &rt, (fz_u8(&f) & 7) ? &cfg : NULL);
    } else {
      do_token_ops(&f, op);
    }
  } else if (op <= 6) {
    do_sort_chunks(&f, op == 6);
  } else {
    do_dispatch(&f);
  }
  fz_end();
  return 0;
}
