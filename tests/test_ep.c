/* Expert parallelism over the threads transport (one thread per rank): every rank's dispatch,
 * combine and backwards byte-equal to the one-process token movement (tests/ep_common.h), for 1
 * to 4 ranks, every row dtype, fp32 and e8m0 scale rows, padding, skewed loads, a rank with no
 * tokens and a rank that receives nothing; argument errors on one rank fail every rank before
 * anything moves. The MPI transport runs the same checks (tests/ep/test_ep_mpi.c). */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>

#include "ep_common.h"

typedef struct rank_arg {
  const ep_problem *p;
  xte_ep_threads_world world;
  xte_ep_config cfg;
  int rank, rc;
  char err[512];
} rank_arg;

static void *rank_main(void *v) {
  rank_arg *a = (rank_arg *)v;
  xte_ep_group g = NULL;
  xte_status st = xte_ep_group_create_threads(a->world, a->rank, &a->cfg, &g);
  if (st != XTE_SUCCESS) {
    snprintf(a->err, sizeof a->err, "group: %s", xte_last_error());
    a->rc = 1;
    return NULL;
  }
  a->rc = ep_rank_run(a->p, g, a->rank, a->err, sizeof a->err);
  /* the same step with rows not back to back on some ranks (run even after a failure: the
   * other ranks wait for this one) */
  {
    char err2[512] = "";
    int rc2 = ep_rank_run_views(a->p, g, a->rank, err2, sizeof err2);
    if (rc2 && !a->rc) memcpy(a->err, err2, sizeof a->err);
    a->rc |= rc2;
  }
  xte_ep_group_destroy(g);
  return NULL;
}

static void run_case(int R, int64_t El, int K, int64_t H, const int64_t *T, int skew, xte_dtype xdt,
                     xte_dtype sdt, int64_t S, int align, uint64_t seed) {
  ep_problem p;
  char err[512];
  rank_arg a[8];
  pthread_t th[8];
  xte_ep_threads_world world;
  int r;
  ep_problem_make(&p, R, El, K, H, T, skew, xdt, sdt, S, align, seed);
  err[0] = '\0';
  cr_assert_eq(ep_problem_reference(&p, err, sizeof err), 0, "reference: %s", err);
  cr_assert_eq(xte_ep_threads_world_create(R, &world), XTE_SUCCESS);
  for (r = 0; r < R; r++) {
    a[r].p = &p;
    a[r].world = world;
    a[r].cfg = ep_problem_config(&p);
    a[r].rank = r;
    a[r].rc = 0;
    a[r].err[0] = '\0';
    pthread_create(&th[r], NULL, rank_main, &a[r]);
  }
  for (r = 0; r < R; r++) pthread_join(th[r], NULL);
  for (r = 0; r < R; r++)
    cr_expect_eq(a[r].rc, 0, "R=%d El=%lld K=%d H=%lld %s align %d skew %d: rank %d: %s", R,
                 (long long)El, K, (long long)H, xte_dtype_name(xdt), align, skew, r, a[r].err);
  xte_ep_threads_world_destroy(world);
  ep_problem_free(&p);
}

Test(ep, bytes_equal_one_process_1_to_4_ranks) {
  static const int64_t T[4] = {37, 0, 64, 5};
  int R;
  for (R = 1; R <= 4; R++) {
    run_case(R, 3, 4, 96, T, 0, XTE_DTYPE_FP32, XTE_DTYPE_FP32, 0, 1, 11 + (uint64_t)R);
    run_case(R, 3, 4, 96, T, 1, XTE_DTYPE_BF16, XTE_DTYPE_FP32, 0, 8, 21 + (uint64_t)R);
    run_case(R, 2, 3, 256, T, 2, XTE_DTYPE_E4M3, XTE_DTYPE_FP32, 2, 16, 31 + (uint64_t)R);
    run_case(R, 2, 2, 130, T, 1, XTE_DTYPE_E5M2, XTE_DTYPE_E8M0, 5, 4, 41 + (uint64_t)R);
  }
}

/* Kimi-K2 (384 experts, top-8) and DeepSeek-V3 (256 experts, top-8) routings over 4 ranks,
 * skewed, with the grouped GEMM's 128-row alignment. */
Test(ep, kimi_k2_and_deepseek_v3_routings) {
  static const int64_t T[4] = {96, 17, 0, 64};
  run_case(4, 96, 8, 128, T, 1, XTE_DTYPE_E4M3, XTE_DTYPE_FP32, 1, 128, 7);
  run_case(4, 64, 8, 64, T, 2, XTE_DTYPE_BF16, XTE_DTYPE_FP32, 0, 128, 8);
  run_case(3, 128, 8, 32, T, 0, XTE_DTYPE_FP32, XTE_DTYPE_FP32, 0, 1, 9);
}

/* repeated runs give the same bytes (the comparison with the one-process result is exact, so
 * a second run on the same problem checks determinism across thread schedules) */
Test(ep, repeated_runs) {
  static const int64_t T[3] = {50, 50, 50};
  int i;
  for (i = 0; i < 3; i++) run_case(3, 4, 4, 64, T, 1, XTE_DTYPE_BF16, XTE_DTYPE_FP32, 0, 4, 99);
}

/* ---------------------------------------------------------------- errors on one rank */

typedef struct bad_arg {
  xte_ep_threads_world world;
  int rank, bad_rank, mode;
  xte_status st;
  char msg[256];
  uint8_t recv_before, recv_after;
} bad_arg;

static void *bad_main(void *v) {
  bad_arg *a = (bad_arg *)v;
  xte_ep_group g = NULL;
  xte_ep_config cfg = xte_ep_config_default();
  size_t hb = 0;
  int32_t idx[4 * 2] = {0, 1, 2, 3, 1, -1, 3, 0};
  float x[4 * 8], rx[16 * 8];
  void *handle;
  xte_tensor ti, tx, trx;
  xte_status st;
  int i;
  cfg.experts_per_rank = 2;
  cfg.hidden = 8;
  cfg.topk = 2;
  cfg.max_tokens_per_rank = 4;
  if (a->mode == 0 && a->rank == a->bad_rank) cfg.hidden = 9; /* configs disagree */
  st = xte_ep_group_create_threads(a->world, a->rank, &cfg, &g);
  if (a->mode == 0) {
    a->st = st;
    snprintf(a->msg, sizeof a->msg, "%s", xte_last_error());
    xte_ep_group_destroy(g);
    return NULL;
  }
  if (st != XTE_SUCCESS) {
    a->st = st;
    return NULL;
  }
  xte_ep_handle_size(g, &hb);
  handle = calloc(1, hb);
  for (i = 0; i < 32; i++) x[i] = (float)i;
  memset(rx, 0x5A, sizeof rx);
  ti = xte_tensor_2d(idx, XTE_DTYPE_INT32, 4, 2);
  if (a->mode == 1 && a->rank == a->bad_rank) idx[5] = 4 * 2; /* an expert out of range */
  st = xte_ep_prepare(g, &ti, handle, hb, NULL, NULL, NULL);
  if (a->mode == 1) {
    a->st = st;
    snprintf(a->msg, sizeof a->msg, "%s", xte_last_error());
  } else {
    tx = xte_tensor_2d(x, a->mode == 2 && a->rank == a->bad_rank ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32,
                       4, 8);
    trx = xte_tensor_2d(rx, tx.dtype, 16, 8);
    a->st = st == XTE_SUCCESS ? xte_ep_dispatch(g, handle, &tx, NULL, NULL, &trx, NULL, NULL, NULL)
                              : st;
    snprintf(a->msg, sizeof a->msg, "%s", xte_last_error());
    a->recv_before = 0x5A;
    a->recv_after = ((uint8_t *)rx)[0];
    for (i = 0; i < (int)sizeof rx; i++)
      if (((uint8_t *)rx)[i] != 0x5A) a->recv_after = ((uint8_t *)rx)[i];
  }
  free(handle);
  xte_ep_group_destroy(g);
  return NULL;
}

static void run_bad(int R, int bad_rank, int mode) {
  bad_arg a[4];
  pthread_t th[4];
  xte_ep_threads_world world;
  int r;
  cr_assert_eq(xte_ep_threads_world_create(R, &world), XTE_SUCCESS);
  for (r = 0; r < R; r++) {
    memset(&a[r], 0, sizeof a[r]);
    a[r].world = world;
    a[r].rank = r;
    a[r].bad_rank = bad_rank;
    a[r].mode = mode;
    pthread_create(&th[r], NULL, bad_main, &a[r]);
  }
  for (r = 0; r < R; r++) pthread_join(th[r], NULL);
  for (r = 0; r < R; r++) {
    cr_expect_neq(a[r].st, XTE_SUCCESS, "mode %d: rank %d succeeded", mode, r);
    cr_expect(a[r].msg[0] != '\0', "mode %d: rank %d has no message", mode, r);
    if (r != bad_rank && mode != 0)
      cr_expect(strstr(a[r].msg, "rank") != NULL, "mode %d: rank %d: '%s' names no rank", mode, r,
                a[r].msg);
    if (mode == 2) cr_expect_eq(a[r].recv_after, 0x5A, "mode 2: rank %d wrote recv_x", r);
  }
  if (mode == 0) cr_expect(strstr(a[0].msg, "config->hidden") != NULL, "'%s'", a[0].msg);
  if (mode == 1) cr_expect(strstr(a[bad_rank].msg, "topk_idx[") != NULL, "'%s'", a[bad_rank].msg);
  xte_ep_threads_world_destroy(world);
}

Test(ep, an_error_on_one_rank_fails_every_rank) {
  run_bad(3, 1, 0); /* disagreeing configs */
  run_bad(3, 2, 1); /* a bad topk_idx entry */
  run_bad(2, 0, 2); /* x dtypes disagree: nothing written anywhere */
  run_bad(1, 0, 1);
}

Test(ep, bad_arguments) {
  xte_ep_threads_world world;
  xte_ep_group g = NULL;
  xte_ep_config cfg = xte_ep_config_default();
  cr_assert_eq(xte_ep_threads_world_create(0, &world), XTE_ERROR_INVALID_ARGUMENT);
  cr_assert_eq(xte_ep_threads_world_create(1, &world), XTE_SUCCESS);
  cr_expect_eq(xte_ep_group_create_threads(world, 0, NULL, &g), XTE_ERROR_NULL_POINTER);
  cr_expect_eq(xte_ep_group_create_threads(world, 1, &cfg, &g), XTE_ERROR_INVALID_ARGUMENT);
  cr_expect_eq(xte_ep_group_create_threads(world, 0, &cfg, &g), XTE_ERROR_INVALID_ARGUMENT,
               "hidden 0 accepted");
  cfg.hidden = 8;
  cfg.topk = 17;
  cr_expect_eq(xte_ep_group_create_threads(world, 0, &cfg, &g), XTE_ERROR_INVALID_ARGUMENT);
  cfg.topk = 2;
  cfg.struct_size = 8;
  cr_expect_eq(xte_ep_group_create_threads(world, 0, &cfg, &g), XTE_ERROR_INVALID_ARGUMENT);
  cfg.struct_size = sizeof cfg;
  cfg.max_tokens_per_rank = (int64_t)1 << 40;
  cr_expect_eq(xte_ep_group_create_threads(world, 0, &cfg, &g), XTE_ERROR_INVALID_ARGUMENT);
  cfg.max_tokens_per_rank = 4;
  cfg.experts_per_rank = (int64_t)1 << 19; /* padding to align 2^20: rows past int32 */
  cfg.align = 1 << 20;
  cr_expect_eq(xte_ep_group_create_threads(world, 0, &cfg, &g), XTE_ERROR_INVALID_ARGUMENT);
  cfg.experts_per_rank = 1;
  cfg.align = 1;
  cr_assert_eq(xte_ep_group_create_threads(world, 0, &cfg, &g), XTE_SUCCESS);
  {
    size_t hb = 0;
    int32_t idx[8] = {0, -1, 0, -1, 0, -1, 0, -1};
    char h[8];
    void *handle;
    float x[64], rx[64];
    xte_tensor ti = xte_tensor_2d(idx, XTE_DTYPE_INT32, 4, 2), tx, trx;
    cr_assert_eq(xte_ep_handle_size(g, &hb), XTE_SUCCESS);
    cr_expect_eq(xte_ep_prepare(g, &ti, h, sizeof h, NULL, NULL, NULL), XTE_ERROR_BUFFER_TOO_SMALL);
    handle = calloc(1, hb);
    tx = xte_tensor_2d(x, XTE_DTYPE_FP32, 4, 8);
    trx = xte_tensor_2d(rx, XTE_DTYPE_FP32, 8, 8);
    cr_expect_eq(xte_ep_dispatch(g, handle, &tx, NULL, NULL, &trx, NULL, NULL, NULL),
                 XTE_ERROR_INVALID_ARGUMENT, "an unprepared handle accepted");
    ti = xte_tensor_2d(idx, XTE_DTYPE_INT32, 5, 2);
    cr_expect_eq(xte_ep_prepare(g, &ti, handle, hb, NULL, NULL, NULL), XTE_ERROR_SHAPE,
                 "more tokens than max_tokens_per_rank accepted");
    ti = xte_tensor_2d(idx, XTE_DTYPE_INT32, 4, 2);
    cr_assert_eq(xte_ep_prepare(g, &ti, handle, hb, NULL, NULL, NULL), XTE_SUCCESS);
    cr_expect_eq(xte_ep_combine(g, handle, &trx, NULL, &tx, NULL, NULL), XTE_ERROR_INVALID_ARGUMENT,
                 "combine before dispatch accepted");
    free(handle);
  }
  xte_ep_group_destroy(g);
  xte_ep_threads_world_destroy(world);
}

/* ---------------------------------------------------------------- strided views, duplicates */

typedef struct ld_arg {
  xte_ep_threads_world world;
  int rank, R, pad; /* pad: extra elements per row of every strided view (0: dense) */
  int rc;
  char err[256];
  uint8_t *rx, *rs, *gy, *out, *gx; /* outputs, dense copies of the views' rows */
  float *rw, *gw;
  int64_t recv_rows;
} ld_arg;

/* One rank's step with x, recv_x, recv_scales and grad_expert_out as views with an ld past
 * their row (pad > 0) or dense; the outputs' rows are copied out dense for the comparison.
 * Views with an ld are filled with 0xCD first: the gap between rows must keep it. */
static void *ld_main(void *v) {
  ld_arg *a = (ld_arg *)v;
  enum { El = 3, K = 3, H = 160, S = 2, T = 29 };
  const int64_t P = a->pad, ldx = H + P, lds = S + P;
  xte_ep_group g = NULL;
  xte_ep_config cfg = xte_ep_config_default();
  xte_ep_counts c;
  int32_t idx[T * K];
  uint8_t *x = calloc((size_t)T * (size_t)ldx, 1);
  float *xs = calloc((size_t)T * (size_t)lds, 4), w[T * K];
  uint16_t *y, *yo, *gout;
  uint8_t *rx, *gyv;
  float *rs;
  size_t hb = 0;
  void *handle;
  int64_t t, j, rows, r, q;
  uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(a->rank + 1);
  cfg.experts_per_rank = El;
  cfg.hidden = H;
  cfg.topk = K;
  cfg.align = 4;
  cfg.max_tokens_per_rank = T;
  for (t = 0; t < T; t++)
    for (j = 0; j < K; j++) {
      int64_t e;
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      e = (int64_t)((s >> 33) % (uint64_t)(El * a->R));
      for (q = 0; q < j; q++)
        if (idx[t * K + q] == e) e = -1;
      idx[t * K + j] = (int32_t)e;
      w[t * K + j] = (float)(t * K + j) * 0.25f + 1.0f;
    }
  for (t = 0; t < T; t++) {
    for (q = 0; q < H; q++) x[t * ldx + q] = (uint8_t)((t * H + q) * 131 + a->rank * 7 + 1);
    for (q = 0; q < S; q++) xs[t * lds + q] = (float)(t * S + q) + 0.5f * (float)a->rank;
  }
  if (xte_ep_group_create_threads(a->world, a->rank, &cfg, &g) != XTE_SUCCESS) goto fail;
  xte_ep_handle_size(g, &hb);
  handle = calloc(1, hb);
  {
    xte_tensor ti = xte_tensor_2d(idx, XTE_DTYPE_INT32, T, K);
    if (xte_ep_prepare(g, &ti, handle, hb, &c, NULL, NULL) != XTE_SUCCESS) goto fail;
  }
  rows = c.recv_rows + 2;
  a->recv_rows = rows;
  rx = malloc((size_t)(rows * ldx));
  rs = malloc((size_t)(rows * lds) * 4);
  memset(rx, 0xCD, (size_t)(rows * ldx));
  memset(rs, 0xCD, (size_t)(rows * lds) * 4);
  a->rw = malloc((size_t)rows * 4);
  {
    xte_tensor tx = xte_tensor_2d(x, XTE_DTYPE_E4M3, T, H),
               txs = xte_tensor_2d(xs, XTE_DTYPE_FP32, T, S);
    xte_tensor tw = xte_tensor_2d(w, XTE_DTYPE_FP32, T, K);
    xte_tensor trx = xte_tensor_2d(rx, XTE_DTYPE_E4M3, rows, H);
    xte_tensor trs = xte_tensor_2d(rs, XTE_DTYPE_FP32, rows, S);
    xte_tensor trw = xte_tensor_1d(a->rw, XTE_DTYPE_FP32, rows);
    tx.ld = P ? ldx : 0;
    txs.ld = P ? lds : 0;
    trx.ld = P ? ldx : 0;
    trs.ld = P ? lds : 0;
    if (xte_ep_dispatch(g, handle, &tx, &txs, &tw, &trx, &trs, &trw, NULL) != XTE_SUCCESS)
      goto fail;
  }
  a->rx = malloc((size_t)(rows * H));
  a->rs = malloc((size_t)(rows * S) * 4);
  for (r = 0; r < rows; r++) {
    memcpy(a->rx + r * H, rx + r * ldx, H);
    memcpy(a->rs + r * S * 4, (uint8_t *)(rs + r * lds), S * 4);
    for (q = H; q < ldx; q++)
      if (rx[r * ldx + q] != 0xCD) {
        snprintf(a->err, sizeof a->err, "recv_x row %lld: the gap past the row was written",
                 (long long)r);
        a->rc = 1;
      }
    for (q = S * 4; q < lds * 4; q++)
      if (((uint8_t *)(rs + r * lds))[q] != 0xCD) {
        snprintf(a->err, sizeof a->err, "recv_scales row %lld: the gap was written", (long long)r);
        a->rc = 1;
      }
  }
  /* expert outputs: bf16 rows made from recv_x's bytes; combine, its backward and the dispatch
   * backward with a strided grad_expert_out */
  y = malloc((size_t)(rows * H) * 2);
  for (q = 0; q < rows * H; q++) y[q] = (uint16_t)(0x3F00 | (a->rx[q] & 0x7F));
  yo = malloc((size_t)(T * H) * 2);
  gout = malloc((size_t)(T * H) * 2);
  for (q = 0; q < T * H; q++) gout[q] = (uint16_t)(0x3E80 + (q * 7 + a->rank) % 200);
  gyv = malloc((size_t)(rows * ldx) * 2);
  memset(gyv, 0xCD, (size_t)(rows * ldx) * 2);
  a->gw = malloc((size_t)(T * K) * 4);
  a->out = malloc((size_t)(T * H) * 2);
  a->gx = malloc((size_t)(T * H) * 2);
  {
    uint16_t *slots = malloc((size_t)((c.slot_rows ? c.slot_rows : 1) * H) * 2);
    xte_tensor ty = xte_tensor_2d(y, XTE_DTYPE_BF16, rows, H);
    xte_tensor tw = xte_tensor_2d(w, XTE_DTYPE_FP32, T, K);
    xte_tensor tout = xte_tensor_2d(a->out, XTE_DTYPE_BF16, T, H);
    xte_tensor tsl = xte_tensor_2d(slots, XTE_DTYPE_BF16, c.slot_rows, H);
    xte_tensor tgo = xte_tensor_2d(gout, XTE_DTYPE_BF16, T, H);
    xte_tensor tgy = xte_tensor_2d(gyv, XTE_DTYPE_BF16, rows, H);
    xte_tensor tgw = xte_tensor_2d(a->gw, XTE_DTYPE_FP32, T, K);
    xte_tensor tgx = xte_tensor_2d(a->gx, XTE_DTYPE_BF16, T, H);
    tgy.ld = P ? ldx : 0;
    if (xte_ep_combine(g, handle, &ty, &tw, &tout, &tsl, NULL) != XTE_SUCCESS ||
        xte_ep_combine_backward(g, handle, &tgo, &tw, &tsl, &tgy, &tgw, NULL) != XTE_SUCCESS ||
        xte_ep_dispatch_backward(g, handle, &ty, &tgx, NULL) != XTE_SUCCESS) {
      free(slots);
      goto fail;
    }
    free(slots);
  }
  a->gy = malloc((size_t)(rows * H) * 2);
  for (r = 0; r < rows; r++) {
    memcpy(a->gy + r * H * 2, gyv + r * ldx * 2, H * 2);
    for (q = H * 2; q < ldx * 2; q++)
      if (gyv[r * ldx * 2 + q] != 0xCD) {
        snprintf(a->err, sizeof a->err, "grad_expert_out row %lld: the gap was written",
                 (long long)r);
        a->rc = 1;
      }
  }
  free(y);
  free(yo);
  free(gout);
  free(gyv);
  free(rx);
  free(rs);
  free(handle);
  free(x);
  free(xs);
  xte_ep_group_destroy(g);
  return NULL;
fail:
  snprintf(a->err, sizeof a->err, "%s", xte_last_error());
  a->rc = 1;
  return NULL;
}

static void run_ld(int R, int pad, ld_arg *a) {
  pthread_t th[4];
  xte_ep_threads_world world;
  int r;
  cr_assert_eq(xte_ep_threads_world_create(R, &world), XTE_SUCCESS);
  for (r = 0; r < R; r++) {
    memset(&a[r], 0, sizeof a[r]);
    a[r].world = world;
    a[r].rank = r;
    a[r].R = R;
    a[r].pad = pad;
    pthread_create(&th[r], NULL, ld_main, &a[r]);
  }
  for (r = 0; r < R; r++) pthread_join(th[r], NULL);
  for (r = 0; r < R; r++) cr_assert_eq(a[r].rc, 0, "R %d pad %d rank %d: %s", R, pad, r, a[r].err);
  xte_ep_threads_world_destroy(world);
}

/* The rows are read and written in place (the transport's block lists): views whose rows are
 * ld apart give the dense views' bytes in every output, and the gap after each row of recv_x,
 * recv_scales and grad_expert_out is left alone. */
Test(ep, strided_views_give_the_dense_bytes) {
  for (int R = 1; R <= 3; R++) {
    ld_arg d[4], s[4];
    run_ld(R, 0, d);
    run_ld(R, 5, s);
    for (int r = 0; r < R; r++) {
      const int64_t rows = d[r].recv_rows, H = 160, T = 29, K = 3;
      cr_assert_eq(rows, s[r].recv_rows);
      cr_expect_arr_eq(d[r].rx, s[r].rx, (size_t)(rows * H), "recv_x, R %d rank %d", R, r);
      cr_expect_arr_eq(d[r].rs, s[r].rs, (size_t)(rows * 2 * 4), "recv_scales, R %d rank %d", R, r);
      cr_expect_arr_eq(d[r].rw, s[r].rw, (size_t)rows * 4, "recv_weights, R %d rank %d", R, r);
      cr_expect_arr_eq(d[r].out, s[r].out, (size_t)(T * H * 2), "combine, R %d rank %d", R, r);
      cr_expect_arr_eq(d[r].gy, s[r].gy, (size_t)(rows * H * 2), "grad_expert_out R %d rank %d", R,
                       r);
      cr_expect_arr_eq(d[r].gw, s[r].gw, (size_t)(T * K * 4), "grad_weights R %d rank %d", R, r);
      cr_expect_arr_eq(d[r].gx, s[r].gx, (size_t)(T * H * 2), "grad_x R %d rank %d", R, r);
      for (int q = 0; q < 2; q++) {
        ld_arg *z = q ? &s[r] : &d[r];
        free(z->rx);
        free(z->rs);
        free(z->rw);
        free(z->out);
        free(z->gy);
        free(z->gw);
        free(z->gx);
      }
    }
  }
}

typedef struct dup_arg {
  xte_ep_threads_world world;
  int rank, bad_rank;
  xte_status st;
  char msg[256];
  int handle_changed;
} dup_arg;

static void *dup_main(void *v) {
  dup_arg *a = (dup_arg *)v;
  xte_ep_group g = NULL;
  xte_ep_config cfg = xte_ep_config_default();
  int32_t idx[3 * 2] = {0, 3, 1, -1, 2, 1};
  size_t hb = 0, i;
  uint8_t *h;
  xte_tensor ti;
  cfg.experts_per_rank = 2;
  cfg.hidden = 8;
  cfg.topk = 2;
  cfg.max_tokens_per_rank = 3;
  if (xte_ep_group_create_threads(a->world, a->rank, &cfg, &g) != XTE_SUCCESS) {
    a->st = XTE_SUCCESS; /* flagged below as "succeeded" */
    snprintf(a->msg, sizeof a->msg, "group: %s", xte_last_error());
    return NULL;
  }
  xte_ep_handle_size(g, &hb);
  h = malloc(hb);
  memset(h, 0x77, hb);
  if (a->rank == a->bad_rank) idx[5] = 2; /* token 2 lists expert 2 twice */
  ti = xte_tensor_2d(idx, XTE_DTYPE_INT32, 3, 2);
  a->st = xte_ep_prepare(g, &ti, h, hb, NULL, NULL, NULL);
  snprintf(a->msg, sizeof a->msg, "%s", xte_last_error());
  for (i = 0; i < hb; i++) a->handle_changed |= h[i] != 0x77;
  free(h);
  xte_ep_group_destroy(g);
  return NULL;
}

/* A token that lists an expert twice is refused by prepare on every rank, before the handle is
 * written (xte_moe_permute refuses it; before, only the receiving rank's dispatch did, after the
 * rows had moved, and the other ranks went on). */
Test(ep, a_duplicate_expert_fails_prepare_on_every_rank) {
  dup_arg a[3];
  pthread_t th[3];
  xte_ep_threads_world world;
  int r;
  cr_assert_eq(xte_ep_threads_world_create(3, &world), XTE_SUCCESS);
  for (r = 0; r < 3; r++) {
    memset(&a[r], 0, sizeof a[r]);
    a[r].world = world;
    a[r].rank = r;
    a[r].bad_rank = 1;
    pthread_create(&th[r], NULL, dup_main, &a[r]);
  }
  for (r = 0; r < 3; r++) pthread_join(th[r], NULL);
  for (r = 0; r < 3; r++) {
    cr_expect_eq(a[r].st, XTE_ERROR_INVALID_ARGUMENT, "rank %d: %s", r, a[r].msg);
    cr_expect(strstr(a[r].msg, "lists expert 2 twice") != NULL, "rank %d: '%s'", r, a[r].msg);
    cr_expect(!a[r].handle_changed, "rank %d wrote its handle", r);
  }
  xte_ep_threads_world_destroy(world);
}

/* ---------------------------------------------------------------- token-major dispatch */

typedef struct tm_arg {
  const ep_problem *p;
  xte_ep_threads_world world;
  int rank, rc;
  char err[512];
} tm_arg;

#define TM_CHECK_FAIL(...)                        \
  do {                                            \
    snprintf(a->err, sizeof a->err, __VA_ARGS__); \
    a->rc = 1;                                    \
    goto checked;                                 \
  } while (0)

#define TM_FAIL(...)                              \
  do {                                            \
    snprintf(a->err, sizeof a->err, __VA_ARGS__); \
    a->rc = 1;                                    \
    goto done;                                    \
  } while (0)

/* xte_ep_dispatch_tokens on one rank against an oracle written from the routing alone: the
 * tokens of every rank (source ranks ascending, tokens ascending) that list an expert of this
 * rank, each once, with its row, scale row, local experts and weights; then xte_moe_permute of
 * them gives the one-process permuted rows, and combine after it the one-process combine. */
static void *tm_main(void *v) {
  tm_arg *a = (tm_arg *)v;
  const ep_problem *p = a->p;
  const int64_t H = p->H, K = p->K, El = p->El, me = a->rank, extra = 2;
  const size_t xe = xte_dtype_size(p->xdt), se = p->S ? xte_dtype_size(p->sdt) : 0;
  const size_t ye = xte_dtype_size(p->ydt);
  int64_t lo = p->eoff[me * El], hi = p->eoff[(me + 1) * El], nr = hi - lo, n = 0, s, t, j, i;
  xte_ep_group g = NULL;
  xte_ep_config cfg = ep_problem_config(p);
  xte_ep_counts c;
  size_t hb = 0;
  void *handle = NULL;
  uint8_t *rx = NULL, *rs = NULL, *px = NULL, *pxs = NULL, *out = NULL;
  int32_t *ti = NULL, *rm = NULL;
  float *tw = NULL;
  if (xte_ep_group_create_threads(a->world, a->rank, &cfg, &g) != XTE_SUCCESS)
    TM_FAIL("group: %s", xte_last_error());
  xte_ep_handle_size(g, &hb);
  handle = calloc(1, hb);
  {
    xte_tensor idx = ep_t2(p->topk + p->toff[me] * K, XTE_DTYPE_INT32, p->T[me], K);
    if (xte_ep_prepare(g, &idx, handle, hb, &c, NULL, NULL) != XTE_SUCCESS)
      TM_FAIL("prepare: %s", xte_last_error());
  }
  rx = malloc((size_t)((c.recv_tokens + extra) * H) * xe);
  rs = malloc((size_t)((c.recv_tokens + extra) * (p->S ? p->S : 1)) * (se ? se : 1));
  ti = malloc((size_t)((c.recv_tokens + extra) * K) * 4);
  tw = malloc((size_t)((c.recv_tokens + extra) * K) * 4);
  memset(rx, 0xAB, (size_t)((c.recv_tokens + extra) * H) * xe);
  memset(rs, 0xAB, (size_t)((c.recv_tokens + extra) * (p->S ? p->S : 1)) * (se ? se : 1));
  memset(ti, 0xAB, (size_t)((c.recv_tokens + extra) * K) * 4);
  memset(tw, 0xAB, (size_t)((c.recv_tokens + extra) * K) * 4);
  {
    xte_tensor x = ep_t2(p->x + (size_t)(p->toff[me] * H) * xe, p->xdt, p->T[me], H);
    xte_tensor xs =
        ep_t2(p->S ? p->xs + (size_t)(p->toff[me] * p->S) * se : NULL, p->sdt, p->T[me], p->S);
    xte_tensor w = ep_t2(p->w + p->toff[me] * K, XTE_DTYPE_FP32, p->T[me], K);
    xte_tensor trx = ep_t2(rx, p->xdt, c.recv_tokens + extra, H);
    xte_tensor trs = ep_t2(rs, p->sdt, c.recv_tokens + extra, p->S);
    xte_tensor tti = ep_t2(ti, XTE_DTYPE_INT32, c.recv_tokens + extra, K);
    xte_tensor ttw = ep_t2(tw, XTE_DTYPE_FP32, c.recv_tokens + extra, K);
    if (xte_ep_dispatch_tokens(g, handle, &x, p->S ? &xs : NULL, &w, &trx, p->S ? &trs : NULL, &tti,
                               &ttw, NULL) != XTE_SUCCESS)
      TM_FAIL("dispatch_tokens: %s", xte_last_error());
  }
  /* the oracle */
  for (s = 0; s < p->R; s++)
    for (t = p->toff[s]; t < p->toff[s] + p->T[s]; t++) {
      int any = 0;
      for (j = 0; j < K; j++) any |= p->topk[t * K + j] >= 0 && p->topk[t * K + j] / El == me;
      if (!any) continue;
      if (n >= c.recv_tokens)
        TM_CHECK_FAIL("more tokens than recv_tokens %lld", (long long)c.recv_tokens);
      if (memcmp(rx + (size_t)(n * H) * xe, p->x + (size_t)(t * H) * xe, (size_t)H * xe))
        TM_CHECK_FAIL("recv_x row %lld is not token %lld's row", (long long)n, (long long)t);
      if (p->S &&
          memcmp(rs + (size_t)(n * p->S) * se, p->xs + (size_t)(t * p->S) * se, (size_t)p->S * se))
        TM_CHECK_FAIL("recv_scales row %lld", (long long)n);
      for (j = 0; j < K; j++) {
        int32_t e = p->topk[t * K + j];
        int32_t want = e >= 0 && e / El == me ? (int32_t)(e - me * El) : -1;
        float wv = want >= 0 ? p->w[t * K + j] : 0.0f;
        if (ti[n * K + j] != want)
          TM_CHECK_FAIL("recv_topk_idx[%lld, %lld] = %d, want %d", (long long)n, (long long)j,
                        ti[n * K + j], want);
        if (memcmp(&tw[n * K + j], &wv, 4))
          TM_CHECK_FAIL("recv_topk_weights[%lld, %lld]", (long long)n, (long long)j);
      }
      n++;
    }
  if (n != c.recv_tokens)
    TM_CHECK_FAIL("recv_tokens %lld, want %lld", (long long)c.recv_tokens, (long long)n);
  for (i = n; i < n + extra; i++) {
    for (j = 0; j < (int64_t)(H * (int64_t)xe); j++)
      if (rx[(size_t)(i * H) * xe + (size_t)j])
        TM_CHECK_FAIL("recv_x extra row %lld not zero", (long long)i);
    for (j = 0; j < K; j++)
      if (ti[i * K + j] != -1 || tw[i * K + j] != 0.0f || signbit(tw[i * K + j]))
        TM_CHECK_FAIL("extra row %lld: topk idx / weights not -1 / +0", (long long)i);
    for (j = 0; j < (int64_t)(p->S * (int64_t)se); j++)
      if (rs[(size_t)(i * p->S) * se + (size_t)j]) TM_CHECK_FAIL("recv_scales extra row not zero");
  }
  /* permute them: the expert-major rows of the one-process permute */
  px = malloc((size_t)((nr ? nr : 1) * H) * xe);
  pxs = malloc((size_t)((nr ? nr : 1) * (p->S ? p->S : 1)) * (se ? se : 1));
  rm = malloc((size_t)((n ? n : 1) * K) * 4);
  {
    xte_tensor in = ep_t2(rx, p->xdt, n, H), ins = ep_t2(rs, p->sdt, n, p->S);
    xte_tensor idx = ep_t2(ti, XTE_DTYPE_INT32, n, K), o = ep_t2(px, p->xdt, nr, H);
    xte_tensor os = ep_t2(pxs, p->sdt, nr, p->S), trm = ep_t2(rm, XTE_DTYPE_INT32, n, K);
    xte_moe_routing routing;
    xte_permute_config pc;
    memset(&routing, 0, sizeof routing);
    routing.topk_idx = &idx;
    routing.num_experts = El;
    pc = xte_permute_config_default();
    pc.num_out_tokens = -1;
    pc.align = p->align;
    if (xte_moe_permute(&in, p->S ? &ins : NULL, &routing, &pc, &o, p->S ? &os : NULL, &trm, NULL,
                        NULL) != XTE_SUCCESS)
      TM_CHECK_FAIL("permute: %s", xte_last_error());
    if (memcmp(px, p->px + (size_t)(lo * H) * xe, (size_t)(nr * H) * xe))
      TM_CHECK_FAIL("permuted recv_x differs from the one-process permute");
    if (p->S && memcmp(pxs, p->pxs + (size_t)(lo * p->S) * se, (size_t)(nr * p->S) * se))
      TM_CHECK_FAIL("permuted recv_scales differ");
  }
checked:
  /* combine after the token-major dispatch */
  out = malloc((size_t)((p->T[me] ? p->T[me] : 1) * H) * ye);
  {
    xte_tensor y = ep_t2(p->Y + (size_t)(lo * H) * ye, p->ydt, nr, H);
    xte_tensor w = ep_t2(p->w + p->toff[me] * K, XTE_DTYPE_FP32, p->T[me], K);
    xte_tensor o = ep_t2(out, p->ydt, p->T[me], H);
    if (xte_ep_combine(g, handle, &y, &w, &o, NULL, NULL) != XTE_SUCCESS)
      TM_FAIL("combine: %s", xte_last_error());
    if (!a->rc && memcmp(out, p->out + (size_t)(p->toff[me] * H) * ye, (size_t)(p->T[me] * H) * ye))
      TM_FAIL("combine after dispatch_tokens differs from the one-process unpermute");
  }
done:
  free(rx);
  free(rs);
  free(ti);
  free(tw);
  free(px);
  free(pxs);
  free(rm);
  free(out);
  free(handle);
  xte_ep_group_destroy(g);
  return NULL;
}

static void run_tm(int R, int64_t El, int K, int64_t H, const int64_t *T, int skew, xte_dtype xdt,
                   xte_dtype sdt, int64_t S, int align, uint64_t seed) {
  ep_problem p;
  char err[512] = "";
  tm_arg a[4];
  pthread_t th[4];
  xte_ep_threads_world world;
  int r;
  ep_problem_make(&p, R, El, K, H, T, skew, xdt, sdt, S, align, seed);
  cr_assert_eq(ep_problem_reference(&p, err, sizeof err), 0, "reference: %s", err);
  cr_assert_eq(xte_ep_threads_world_create(R, &world), XTE_SUCCESS);
  for (r = 0; r < R; r++) {
    memset(&a[r], 0, sizeof a[r]);
    a[r].p = &p;
    a[r].world = world;
    a[r].rank = r;
    pthread_create(&th[r], NULL, tm_main, &a[r]);
  }
  for (r = 0; r < R; r++) pthread_join(th[r], NULL);
  /* a failing rank may leave the others waiting in a collective: each has its own verdict */
  for (r = 0; r < R; r++)
    cr_expect_eq(a[r].rc, 0, "R %d %s align %d: rank %d: %s", R, xte_dtype_name(xdt), align, r,
                 a[r].err);
  xte_ep_threads_world_destroy(world);
  ep_problem_free(&p);
}

Test(ep, dispatch_tokens_then_permute_gives_the_expert_major_rows) {
  static const int64_t T[4] = {37, 0, 64, 5};
  for (int R = 1; R <= 4; R++) {
    run_tm(R, 3, 4, 96, T, 1, XTE_DTYPE_BF16, XTE_DTYPE_FP32, 0, 8, 51 + (uint64_t)R);
    run_tm(R, 2, 3, 256, T, 2, XTE_DTYPE_E4M3, XTE_DTYPE_FP32, 2, 16, 61 + (uint64_t)R);
    run_tm(R, 2, 2, 130, T, 0, XTE_DTYPE_E5M2, XTE_DTYPE_E8M0, 5, 1, 71 + (uint64_t)R);
  }
}
