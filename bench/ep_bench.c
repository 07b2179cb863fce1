/* `xte bench ep`: expert-parallel dispatch and combine over MPI, each next to its anchor in the
 * same run: MPI_Alltoallv of the same payload bytes (each token's row, scale row and top-k
 * weights once per destination rank for dispatch; each routed slot's row for combine), from
 * contiguous buffers, on the same communicator. Run under mpirun:
 *
 *     mpirun -np 4 xte bench ep [--tokens T] [--hidden H] [--experts E] [--topk K]
 *                               [--dtype e4m3|bf16] [--iters N] [--token-major]
 *
 * --token-major times xte_ep_dispatch_tokens (one row per received token, DeepEP's normal-mode
 * layout) instead of xte_ep_dispatch (the expert-major rows of the grouped GEMM, which writes
 * each received row once per local expert of its token).
 *
 * Times: per iteration the slowest rank's time (ranks start together after a barrier); the
 * median over iterations. Ratio = anchor time / xte time (1.0: as fast as the bare exchange).
 * The share columns split xte's own time (xte_ep_group_stats): packing rows into send buffers,
 * the transport's exchange, and the local permute / unpermute. Rank 0 first prints the machine
 * record (bench/bench_common.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xte/xte.h"

int xte_bench_ep(int argc, char **argv);

#ifndef XTE_HAVE_MPI
int xte_bench_ep(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr,
          "xte bench ep: this xte was built without MPI (install libopenmpi-dev and "
          "reconfigure)\n");
  return 1;
}
#else
#include <mpi.h>
#include <time.h>

#include "bench_common.h"

typedef struct epb_opts {
  long tokens, hidden, experts, topk, iters;
  int fp8, token_major;
} epb_opts;

static uint64_t epb_rng(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* median over iterations of the slowest rank's seconds */
static double median_max(double *t, int n, MPI_Comm comm) {
  int i;
  for (i = 0; i < n; i++) {
    double v = t[i];
    MPI_Allreduce(&v, &t[i], 1, MPI_DOUBLE, MPI_MAX, comm);
  }
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return t[n / 2];
}

/* Seconds of one MPI_Alltoallv in bytes (the anchor), the ranks started together. */
static double timed_alltoallv(const void *sb, const int *sc, const int *sd, void *rb, const int *rc,
                              const int *rd, MPI_Comm comm) {
  double t0;
  MPI_Barrier(comm);
  t0 = MPI_Wtime();
  MPI_Alltoallv(sb, sc, sd, MPI_BYTE, rb, rc, rd, MPI_BYTE, comm);
  return MPI_Wtime() - t0;
}

/* One row of the table: the op, MB per rank, xte and anchor seconds, xte's time split. */
static void print_row(const char *op, double mb, double tx, double ta, const xte_ep_stats *s) {
  double tot = (double)(s->pack_ns + s->exchange_ns + s->local_ns);
  if (tot <= 0) tot = 1;
  printf("%-9s %14.2f %9.3f %16.3f %9.2f %8.2f %6.1f %10.1f %7.1f\n", op, mb, tx * 1e3, ta * 1e3,
         ta / tx, mb / 1e3 / tx, 100 * s->pack_ns / tot, 100 * s->exchange_ns / tot,
         100 * s->local_ns / tot);
}

static int parse(int argc, char **argv, epb_opts *o) {
  int i;
  for (i = 1; i < argc; i++) {
    long *dst = NULL;
    if (!strcmp(argv[i], "--tokens"))
      dst = &o->tokens;
    else if (!strcmp(argv[i], "--hidden"))
      dst = &o->hidden;
    else if (!strcmp(argv[i], "--experts"))
      dst = &o->experts;
    else if (!strcmp(argv[i], "--topk"))
      dst = &o->topk;
    else if (!strcmp(argv[i], "--iters"))
      dst = &o->iters;
    else if (!strcmp(argv[i], "--token-major")) {
      o->token_major = 1;
      continue;
    } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
      i++;
      if (!strcmp(argv[i], "e4m3"))
        o->fp8 = 1;
      else if (!strcmp(argv[i], "bf16"))
        o->fp8 = 0;
      else
        return 0;
      continue;
    } else {
      return 0;
    }
    if (i + 1 >= argc) return 0;
    *dst = strtol(argv[++i], NULL, 10);
    if (*dst < 1) return 0;
  }
  return o->topk <= XTE_EP_MAX_TOPK && o->topk <= o->experts && o->hidden <= (1 << 20);
}

int xte_bench_ep(int argc, char **argv) {
  epb_opts o = {4096, 7168, 64, 8, 10, 1, 0};
  int init = 0, R, rank, i, r, rc = 0;
  MPI_Comm comm = MPI_COMM_WORLD;
  xte_ep_group g = NULL;
  xte_ep_config cfg = xte_ep_config_default();
  xte_ep_counts c;
  xte_ep_stats sd, sc;
  size_t hb = 0, xe, S, payload;
  void *handle = NULL;
  uint64_t seed;
  int32_t *idx;
  float *w, *xs, *rs, *rw;
  uint8_t *x, *rx, *yo, *out, *abuf_s, *abuf_r, *cbuf_s, *cbuf_r;
  int *a_sc, *a_sd, *a_rc, *a_rd, *c_sc, *c_sd, *c_rc, *c_rd;
  double *td, *tc, *tad, *tac, d_x, c_x, d_a, c_a;
  long T, H, K, E, El;
  MPI_Initialized(&init);
  if (!init) MPI_Init(&argc, &argv);
  MPI_Comm_size(comm, &R);
  MPI_Comm_rank(comm, &rank);
  if (!parse(argc, argv, &o) || o.experts % R) {
    if (rank == 0)
      fprintf(stderr,
              "usage: mpirun -np R xte bench ep [--tokens T] [--hidden H] [--experts E "
              "(a multiple of R)] [--topk K <= 16] [--dtype e4m3|bf16] [--iters N] "
              "[--token-major]\n");
    if (!init) MPI_Finalize();
    return 2;
  }
  /* the machine record (rank 0's machine), as every benchmark prints it; no OpenBLAS re-exec:
   * the anchor here is MPI_Alltoallv */
  if (rank == 0) xte_bench_machine_setup(NULL, stdout);
  T = o.tokens;
  H = o.hidden;
  K = o.topk;
  E = o.experts;
  El = E / R;
  xe = o.fp8 ? 1 : 2;
  S = o.fp8 ? (size_t)(H + 127) / 128 : 0;
  payload = (size_t)H * xe + S * 4 + (size_t)K * 4;
  seed = 0x1234 + (uint64_t)rank;
  idx = (int32_t *)malloc((size_t)(T * K) * 4);
  w = (float *)malloc((size_t)(T * K) * 4);
  x = (uint8_t *)malloc((size_t)(T * H) * xe);
  xs = (float *)malloc((size_t)T * (S ? S : 1) * 4);
  for (i = 0; i < T; i++) {
    int j, q;
    for (j = 0; j < K; j++) {
      int32_t e;
      do {
        e = (int32_t)(epb_rng(&seed) % (uint64_t)E);
        for (q = 0; q < j && idx[i * K + q] != e; q++) {
        }
      } while (q < j);
      idx[i * K + j] = e;
      w[i * K + j] = 0.125f;
    }
  }
  memset(x, 0x3C, (size_t)(T * H) * xe);
  for (i = 0; i < (long)(T * (long)(S ? S : 1)); i++) xs[i] = 1.0f;

  cfg.experts_per_rank = El;
  cfg.hidden = H;
  cfg.topk = (int32_t)K;
  cfg.max_tokens_per_rank = T;
  if (xte_ep_group_create_mpi(&comm, &cfg, &g) != XTE_SUCCESS) {
    fprintf(stderr, "rank %d: %s\n", rank, xte_last_error());
    MPI_Abort(comm, 1);
  }
  xte_ep_handle_size(g, &hb);
  handle = malloc(hb);
  {
    xte_tensor ti = xte_tensor_2d(idx, XTE_DTYPE_INT32, T, K);
    if (xte_ep_prepare(g, &ti, handle, hb, &c, NULL, NULL) != XTE_SUCCESS) {
      fprintf(stderr, "rank %d: %s\n", rank, xte_last_error());
      MPI_Abort(comm, 1);
    }
  }
  rx = (uint8_t *)malloc((size_t)(c.recv_rows ? c.recv_rows : 1) * (size_t)H * xe);
  rs = (float *)malloc((size_t)(c.recv_rows ? c.recv_rows : 1) * (S ? S : 1) * 4);
  /* recv_weights [recv_rows], or recv_topk_idx and recv_topk_weights [recv_tokens, K] */
  rw = (float *)malloc((size_t)(c.recv_rows + 2 * c.recv_tokens * K + 1) * 4);
  yo = (uint8_t *)calloc((size_t)(c.recv_rows ? c.recv_rows : 1) * (size_t)H, 2);
  out = (uint8_t *)malloc((size_t)(T ? T : 1) * (size_t)H * 2);

  /* the anchors' counts, from the routing (independently of xte): tokens to each rank once,
   * and each routed slot's row back */
  a_sc = (int *)calloc((size_t)R * 8, sizeof(int));
  a_sd = a_sc + R;
  a_rc = a_sd + R;
  a_rd = a_rc + R;
  c_sc = a_rd + R;
  c_sd = c_sc + R;
  c_rc = c_sd + R;
  c_rd = c_rc + R;
  {
    long *tok = (long *)calloc((size_t)R, sizeof(long)),
         *slot = (long *)calloc((size_t)R, sizeof(long));
    for (i = 0; i < T; i++) {
      int j, seen[4096 / 32 + 1];
      memset(seen, 0, sizeof seen);
      for (j = 0; j < K; j++) {
        int d = idx[i * K + j] / (int)El;
        slot[d]++;
        if (!(seen[d / 32] >> (d % 32) & 1)) {
          seen[d / 32] |= 1 << (d % 32);
          tok[d]++;
        }
      }
    }
    for (r = 0; r < R; r++) {
      a_sc[r] = (int)(tok[r] * (long)payload);
      c_rc[r] = (int)(slot[r] * H * 2);
    }
    free(tok);
    free(slot);
  }
  MPI_Alltoall(a_sc, 1, MPI_INT, a_rc, 1, MPI_INT, comm);
  MPI_Alltoall(c_rc, 1, MPI_INT, c_sc, 1, MPI_INT, comm);
  {
    long as = 0, ar = 0, cs = 0, cr = 0;
    for (r = 0; r < R; r++) {
      a_sd[r] = (int)as;
      as += a_sc[r];
      a_rd[r] = (int)ar;
      ar += a_rc[r];
      c_sd[r] = (int)cs;
      cs += c_sc[r];
      c_rd[r] = (int)cr;
      cr += c_rc[r];
    }
    abuf_s = (uint8_t *)calloc((size_t)as + 1, 1);
    abuf_r = (uint8_t *)calloc((size_t)ar + 1, 1);
    cbuf_s = (uint8_t *)calloc((size_t)cs + 1, 1);
    cbuf_r = (uint8_t *)calloc((size_t)cr + 1, 1);
    /* written, so that the anchor reads real pages (calloc's untouched pages all map the one
     * zero page, which would flatter the anchor) */
    memset(abuf_s, 0x3C, (size_t)as + 1);
    memset(cbuf_s, 0x3C, (size_t)cs + 1);
  }

  td = (double *)calloc((size_t)o.iters * 4, sizeof(double));
  tc = td + o.iters;
  tad = tc + o.iters;
  tac = tad + o.iters;
  {
    xte_tensor tx = xte_tensor_2d(x, o.fp8 ? XTE_DTYPE_E4M3 : XTE_DTYPE_BF16, T, H);
    xte_tensor tsx = xte_tensor_2d(xs, XTE_DTYPE_FP32, T, (int64_t)S);
    xte_tensor tw = xte_tensor_2d(w, XTE_DTYPE_FP32, T, K);
    xte_tensor trx = xte_tensor_2d(rx, tx.dtype, c.recv_rows, H);
    xte_tensor trs = xte_tensor_2d(rs, XTE_DTYPE_FP32, c.recv_rows, (int64_t)S);
    xte_tensor trw = xte_tensor_1d(rw, XTE_DTYPE_FP32, c.recv_rows);
    xte_tensor ttx = xte_tensor_2d(rx, tx.dtype, c.recv_tokens, H);
    xte_tensor tts = xte_tensor_2d(rs, XTE_DTYPE_FP32, c.recv_tokens, (int64_t)S);
    xte_tensor tti = xte_tensor_2d(rw, XTE_DTYPE_INT32, c.recv_tokens, K);
    xte_tensor ttw = xte_tensor_2d(rw + c.recv_tokens * K, XTE_DTYPE_FP32, c.recv_tokens, K);
    xte_tensor tyo = xte_tensor_2d(yo, XTE_DTYPE_BF16, c.recv_rows, H);
    xte_tensor tout = xte_tensor_2d(out, XTE_DTYPE_BF16, T, H);
    int it;
    for (it = -2; it < o.iters; it++) {
      double t0, t1, ta;
      if (it == 0) {
        xte_ep_group_stats(g, NULL, 1);
      }
      MPI_Barrier(comm);
      t0 = MPI_Wtime();
      if (o.token_major)
        rc |= xte_ep_dispatch_tokens(g, handle, &tx, o.fp8 ? &tsx : NULL, &tw, &ttx,
                                     o.fp8 ? &tts : NULL, &tti, &ttw, NULL) != XTE_SUCCESS;
      else
        rc |= xte_ep_dispatch(g, handle, &tx, o.fp8 ? &tsx : NULL, &tw, &trx, o.fp8 ? &trs : NULL,
                              &trw, NULL) != XTE_SUCCESS;
      t1 = MPI_Wtime();
      if (it >= 0) td[it] = t1 - t0;
      ta = timed_alltoallv(abuf_s, a_sc, a_sd, abuf_r, a_rc, a_rd, comm);
      if (it >= 0) tad[it] = ta;
    }
    sd.struct_size = sizeof sd;
    xte_ep_group_stats(g, &sd, 1);
    for (it = -2; it < o.iters; it++) {
      double t0, t1, ta;
      if (it == 0) xte_ep_group_stats(g, NULL, 1);
      MPI_Barrier(comm);
      t0 = MPI_Wtime();
      rc |= xte_ep_combine(g, handle, &tyo, &tw, &tout, NULL, NULL) != XTE_SUCCESS;
      t1 = MPI_Wtime();
      if (it >= 0) tc[it] = t1 - t0;
      ta = timed_alltoallv(cbuf_s, c_sc, c_sd, cbuf_r, c_rc, c_rd, comm);
      if (it >= 0) tac[it] = ta;
    }
    sc.struct_size = sizeof sc;
    xte_ep_group_stats(g, &sc, 1);
  }
  if (rc) fprintf(stderr, "rank %d: %s\n", rank, xte_last_error());
  d_x = median_max(td, (int)o.iters, comm);
  c_x = median_max(tc, (int)o.iters, comm);
  d_a = median_max(tad, (int)o.iters, comm);
  c_a = median_max(tac, (int)o.iters, comm);
  {
    double mb_d = 0, mb_c = 0;
    long v[2] = {0, 0}, all[2];
    for (r = 0; r < R; r++) {
      v[0] += a_sc[r];
      v[1] += c_sc[r];
    }
    MPI_Allreduce(v, all, 2, MPI_LONG, MPI_SUM, comm);
    mb_d = (double)all[0] / R / 1e6;
    mb_c = (double)all[1] / R / 1e6;
    if (rank == 0) {
      char info[4096];
      char *cpu = info;
      xte_backend_info_string(info, sizeof info);
      cpu = strstr(info, "cpu: ");
      if (cpu) *strchr(cpu, '\n') = '\0';
      printf(
          "xte bench ep: %d ranks (mpi) on %s; %ld tokens per rank, hidden %ld, %s%s, top-%ld "
          "of %ld experts, %ld iterations (median of the slowest rank)%s\n",
          R, cpu ? cpu + 5 : "?", T, H, o.fp8 ? "e4m3 rows + fp32 1x128 scales" : "bf16 rows",
          ", fp32 weights", K, E, o.iters,
          o.token_major ? "; dispatch: xte_ep_dispatch_tokens (token-major, no expansion)" : "");
      printf("%-9s %14s %9s %16s %9s %8s %6s %10s %7s\n", "op", "MB per rank", "xte ms",
             "MPI_Alltoallv ms", "ratio", "GB/s", "pack%", "exchange%", "local%");
      print_row("dispatch", mb_d, d_x, d_a, &sd);
      print_row("combine", mb_c, c_x, c_a, &sc);
      printf(
          "(shares: rank 0; combine output bf16, fp32 accumulation in xte_moe_unpermute's "
          "order)\n");
    }
  }
  xte_ep_group_destroy(g);
  free(handle);
  free(idx);
  free(w);
  free(x);
  free(xs);
  free(rx);
  free(rs);
  free(rw);
  free(yo);
  free(out);
  free(a_sc);
  free(abuf_s);
  free(abuf_r);
  free(cbuf_s);
  free(cbuf_r);
  free(td);
  if (!init) MPI_Finalize();
  return rc ? 1 : 0;
}
#endif
