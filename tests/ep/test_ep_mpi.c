/* Expert parallelism over MPI: run by mpiexec with 1..4 ranks (tests/ep/CMakeLists.txt). Every
 * rank builds the same problems (tests/ep_common.h), computes the one-process result and checks
 * its EP step against it byte for byte; then an argument error on one rank must fail every rank.
 * Prints one line per case and exits non-zero on any failure (on any rank). */
#include <mpi.h>

#include "../ep_common.h"

static int run_case(MPI_Comm comm, int64_t El, int K, int64_t H, int skew, xte_dtype xdt,
                    xte_dtype sdt, int64_t S, int align, uint64_t seed) {
  int R, rank, rc, all_rc = 0;
  int64_t T[64];
  ep_problem p;
  xte_ep_group g = NULL;
  xte_ep_config cfg;
  char err[512] = "";
  MPI_Comm_size(comm, &R);
  MPI_Comm_rank(comm, &rank);
  for (int r = 0; r < R; r++) T[r] = (r == 1) ? 0 : 23 + 41 * r; /* rank 1 has no tokens */
  ep_problem_make(&p, R, El, K, H, T, skew, xdt, sdt, S, align, seed);
  rc = ep_problem_reference(&p, err, sizeof err);
  cfg = ep_problem_config(&p);
  if (!rc) {
    xte_status st = xte_ep_group_create_mpi(&comm, &cfg, &g);
    if (st != XTE_SUCCESS) {
      snprintf(err, sizeof err, "group: %s", xte_last_error());
      rc = 1;
    }
  }
  if (!rc) rc = ep_rank_run(&p, g, rank, err, sizeof err);
  /* the same step with rows not back to back on some ranks (every rank runs it, even after a
   * failure above, so that no rank waits alone) */
  if (g) {
    char err2[512] = "";
    int rc2 = ep_rank_run_views(&p, g, rank, err2, sizeof err2);
    if (rc2 && !rc) memcpy(err, err2, sizeof err);
    rc |= rc2;
  }
  xte_ep_group_destroy(g);
  ep_problem_free(&p);
  MPI_Allreduce(&rc, &all_rc, 1, MPI_INT, MPI_MAX, comm);
  if (rc) fprintf(stderr, "rank %d: FAIL: %s\n", rank, err);
  if (rank == 0)
    printf("%s ranks=%d El=%lld k=%d H=%lld %s align=%d skew=%d\n", all_rc ? "FAIL" : "ok", R,
           (long long)El, K, (long long)H, xte_dtype_name(xdt), align, skew);
  return all_rc;
}

/* rank R-1 passes an out-of-range expert: every rank must return an error (no hang) */
static int run_bad(MPI_Comm comm) {
  int R, rank, bad = 0, all_bad = 0;
  xte_ep_group g = NULL;
  xte_ep_config cfg = xte_ep_config_default();
  int32_t idx[2] = {0, -1};
  size_t hb = 0;
  void *h;
  xte_tensor ti = xte_tensor_2d(idx, XTE_DTYPE_INT32, 1, 2);
  xte_status st;
  MPI_Comm_size(comm, &R);
  MPI_Comm_rank(comm, &rank);
  cfg.experts_per_rank = 2;
  cfg.hidden = 16;
  cfg.topk = 2;
  cfg.max_tokens_per_rank = 1;
  if (xte_ep_group_create_mpi(&comm, &cfg, &g) != XTE_SUCCESS) return 1;
  xte_ep_handle_size(g, &hb);
  h = calloc(1, hb);
  if (rank == R - 1) idx[1] = 2 * R;
  st = xte_ep_prepare(g, &ti, h, hb, NULL, NULL, NULL);
  bad = st == XTE_SUCCESS || xte_last_error()[0] == '\0';
  free(h);
  xte_ep_group_destroy(g);
  MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_MAX, comm);
  if (rank == 0)
    printf("%s ranks=%d an error on rank %d fails every rank\n", all_bad ? "FAIL" : "ok", R, R - 1);
  return all_bad;
}

int main(int argc, char **argv) {
  int fails = 0, rank;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fails += run_case(MPI_COMM_WORLD, 3, 4, 96, 1, XTE_DTYPE_BF16, XTE_DTYPE_FP32, 0, 8, 5);
  fails += run_case(MPI_COMM_WORLD, 2, 3, 256, 2, XTE_DTYPE_E4M3, XTE_DTYPE_FP32, 2, 16, 6);
  fails += run_case(MPI_COMM_WORLD, 2, 2, 130, 0, XTE_DTYPE_E5M2, XTE_DTYPE_E8M0, 5, 1, 7);
  fails += run_case(MPI_COMM_WORLD, 96, 8, 128, 1, XTE_DTYPE_E4M3, XTE_DTYPE_FP32, 1, 128, 8);
  fails += run_case(MPI_COMM_WORLD, 64, 8, 64, 2, XTE_DTYPE_FP32, XTE_DTYPE_FP32, 0, 128, 9);
  fails += run_bad(MPI_COMM_WORLD);
  MPI_Finalize();
  return fails ? 1 : 0;
}
