/* Expert parallelism over the threads transport (one thread per rank): every rank's dispatch,
 * combine and backwards byte-equal to the one-process token movement (tests/ep_common.h), for 1
 * to 4 ranks, every row dtype, fp32 and e8m0 scale rows, padding, skewed loads, a rank with no
 * tokens and a rank that receives nothing; argument errors on one rank fail every rank before
 * anything moves. The MPI transport runs the same checks (tests/ep/test_ep_mpi.c). */
#include <criterion/criterion.h>
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
  int64_t tmax = 0;
  ep_problem_make(&p, R, El, K, H, T, skew, xdt, sdt, S, align, seed);
  err[0] = '\0';
  cr_assert_eq(ep_problem_reference(&p, err, sizeof err), 0, "reference: %s", err);
  cr_assert_eq(xte_ep_threads_world_create(R, &world), XTE_SUCCESS);
  for (r = 0; r < R; r++) tmax = T[r] > tmax ? T[r] : tmax;
  for (r = 0; r < R; r++) {
    a[r].p = &p;
    a[r].world = world;
    a[r].cfg = xte_ep_config_default();
    a[r].cfg.experts_per_rank = El;
    a[r].cfg.hidden = H;
    a[r].cfg.topk = K;
    a[r].cfg.align = align;
    a[r].cfg.max_tokens_per_rank = tmax;
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
    int32_t idx[8] = {0};
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
