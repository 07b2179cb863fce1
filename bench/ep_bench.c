/* `xte bench ep`: expert-parallel dispatch and combine over MPI, each next to its anchor in the
 * same run: MPI_Alltoallv of the same payload bytes (each token's row, scale row and top-k
 * weights once per destination rank for dispatch; each routed slot's row for combine), from
 * contiguous buffers, on the same communicator. Run under mpirun:
 *
 *     mpirun -np 4 xte bench ep [--tokens T] [--hidden H] [--experts E] [--topk K]
 *                               [--dtype e4m3|bf16] [--iters N] [--token-major] [--json F]
 *
 * --token-major times xte_ep_dispatch_tokens (one row per received token, DeepEP's normal-mode
 * layout) instead of xte_ep_dispatch (the expert-major rows of the grouped GEMM, which writes
 * each received row once per local expert of its token).
 *
 * Times: per iteration the slowest rank's time (ranks start together after a barrier); the
 * median over iterations. Ratio = anchor time / xte time (1.0: as fast as the bare exchange).
 * The share columns split xte's own time (xte_ep_group_stats): packing rows into send buffers,
 * the transport's exchange, and the local permute / unpermute. Rank 0 first prints the machine
 * record (bench/bench_common.h). --json F: rank 0 also writes the run as one JSON object to F:
 * "context" (the machine record, as `xte bench --json` writes it), "config" (ranks, tokens, shape,
 * dtype, iterations, the dispatch layout) and "ops" (per op: MB per rank, xte and anchor ms,
 * ratio, GB/s, the pack / exchange / local shares of rank 0); scripts/perf_tables.py renders
 * it. */
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
  const char *json;
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

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

/* One op of the JSON report: the same figures as print_row. */
static void json_op(FILE *f, const char *op, double mb, double tx, double ta,
                    const xte_ep_stats *s) {
  double tot = (double)(s->pack_ns + s->exchange_ns + s->local_ns);
  if (tot <= 0) tot = 1;
  fprintf(f,
          "  {\"op\": \"%s\", \"mb_per_rank\": %.6g, \"xte_ms\": %.6g, \"anchor\": "
          "\"MPI_Alltoallv\", \"anchor_ms\": %.6g, \"ratio\": %.6g, \"gb_s\": %.6g, "
          "\"pack_share\": %.4f, \"exchange_share\": %.4f, \"local_share\": %.4f}",
          op, mb, tx * 1e3, ta * 1e3, ta / tx, mb / 1e3 / tx, s->pack_ns / tot,
          s->exchange_ns / tot, s->local_ns / tot);
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
    } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
      o->json = argv[++i];
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

/* Everything one run holds: the routing and tensors of this rank, the group and its handle, the
 * anchors' counts and buffers, the per-iteration times. */
typedef struct epb_run {
  epb_opts o;
  MPI_Comm comm;
  int R, rank;
  long T, H, K, E, El;
  size_t xe, S, payload;
  xte_ep_group g;
  xte_ep_counts c;
  xte_ep_stats sd, sc;
  void *handle;
  int32_t *idx;
  float *w, *xs, *rs, *rw;
  uint8_t *x, *rx, *yo, *out, *abuf_s, *abuf_r, *cbuf_s, *cbuf_r;
  int *a_sc, *a_sd, *a_rc, *a_rd, *c_sc, *c_sd, *c_rc, *c_rd;
  double *td, *tc, *tad, *tac;
} epb_run;

/* This rank's tokens: top-K distinct experts of E uniformly (seeded by the rank), weights 1/8,
 * rows of 0x3C bytes, scales 1. */
static void make_tokens(epb_run *b) {
  uint64_t seed = 0x1234 + (uint64_t)b->rank;
  long T = b->T, K = b->K, i;
  b->idx = (int32_t *)malloc((size_t)(T * K) * 4);
  b->w = (float *)malloc((size_t)(T * K) * 4);
  b->x = (uint8_t *)malloc((size_t)(T * b->H) * b->xe);
  b->xs = (float *)malloc((size_t)T * (b->S ? b->S : 1) * 4);
  for (i = 0; i < T; i++) {
    int j, q;
    for (j = 0; j < K; j++) {
      int32_t e;
      do {
        e = (int32_t)(epb_rng(&seed) % (uint64_t)b->E);
        for (q = 0; q < j && b->idx[i * K + q] != e; q++) {
        }
      } while (q < j);
      b->idx[i * K + j] = e;
      b->w[i * K + j] = 0.125f;
    }
  }
  memset(b->x, 0x3C, (size_t)(T * b->H) * b->xe);
  for (i = 0; i < (long)(T * (long)(b->S ? b->S : 1)); i++) b->xs[i] = 1.0f;
}

/* The group, the prepared handle and the receive tensors' memory. */
static void make_group(epb_run *b) {
  xte_ep_config cfg = xte_ep_config_default();
  size_t hb = 0;
  xte_tensor ti;
  cfg.experts_per_rank = b->El;
  cfg.hidden = b->H;
  cfg.topk = (int32_t)b->K;
  cfg.max_tokens_per_rank = b->T;
  if (xte_ep_group_create_mpi(&b->comm, &cfg, &b->g) != XTE_SUCCESS) {
    fprintf(stderr, "rank %d: %s\n", b->rank, xte_last_error());
    MPI_Abort(b->comm, 1);
  }
  xte_ep_handle_size(b->g, &hb);
  b->handle = malloc(hb);
  ti = xte_tensor_2d(b->idx, XTE_DTYPE_INT32, b->T, b->K);
  if (xte_ep_prepare(b->g, &ti, b->handle, hb, &b->c, NULL, NULL) != XTE_SUCCESS) {
    fprintf(stderr, "rank %d: %s\n", b->rank, xte_last_error());
    MPI_Abort(b->comm, 1);
  }
  b->rx = (uint8_t *)malloc((size_t)(b->c.recv_rows ? b->c.recv_rows : 1) * (size_t)b->H * b->xe);
  b->rs = (float *)malloc((size_t)(b->c.recv_rows ? b->c.recv_rows : 1) * (b->S ? b->S : 1) * 4);
  /* recv_weights [recv_rows], or recv_topk_idx and recv_topk_weights [recv_tokens, K] */
  b->rw = (float *)malloc((size_t)(b->c.recv_rows + 2 * b->c.recv_tokens * b->K + 1) * 4);
  b->yo = (uint8_t *)calloc((size_t)(b->c.recv_rows ? b->c.recv_rows : 1) * (size_t)b->H, 2);
  b->out = (uint8_t *)malloc((size_t)(b->T ? b->T : 1) * (size_t)b->H * 2);
}

/* The anchors' counts, from the routing (independently of xte): tokens to each rank once, and
 * each routed slot's row back; their buffers, written. */
static void make_anchors(epb_run *b) {
  const int R = b->R;
  long *tok = (long *)calloc((size_t)R, sizeof(long)),
       *slot = (long *)calloc((size_t)R, sizeof(long));
  long i, as = 0, ar = 0, cs = 0, cr = 0;
  int r;
  b->a_sc = (int *)calloc((size_t)R * 8, sizeof(int));
  b->a_sd = b->a_sc + R;
  b->a_rc = b->a_sd + R;
  b->a_rd = b->a_rc + R;
  b->c_sc = b->a_rd + R;
  b->c_sd = b->c_sc + R;
  b->c_rc = b->c_sd + R;
  b->c_rd = b->c_rc + R;
  for (i = 0; i < b->T; i++) {
    int j, seen[4096 / 32 + 1];
    memset(seen, 0, sizeof seen);
    for (j = 0; j < b->K; j++) {
      int d = b->idx[i * b->K + j] / (int)b->El;
      slot[d]++;
      if (!(seen[d / 32] >> (d % 32) & 1)) {
        seen[d / 32] |= 1 << (d % 32);
        tok[d]++;
      }
    }
  }
  for (r = 0; r < R; r++) {
    b->a_sc[r] = (int)(tok[r] * (long)b->payload);
    b->c_rc[r] = (int)(slot[r] * b->H * 2);
  }
  free(tok);
  free(slot);
  MPI_Alltoall(b->a_sc, 1, MPI_INT, b->a_rc, 1, MPI_INT, b->comm);
  MPI_Alltoall(b->c_rc, 1, MPI_INT, b->c_sc, 1, MPI_INT, b->comm);
  for (r = 0; r < R; r++) {
    b->a_sd[r] = (int)as;
    as += b->a_sc[r];
    b->a_rd[r] = (int)ar;
    ar += b->a_rc[r];
    b->c_sd[r] = (int)cs;
    cs += b->c_sc[r];
    b->c_rd[r] = (int)cr;
    cr += b->c_rc[r];
  }
  b->abuf_s = (uint8_t *)calloc((size_t)as + 1, 1);
  b->abuf_r = (uint8_t *)calloc((size_t)ar + 1, 1);
  b->cbuf_s = (uint8_t *)calloc((size_t)cs + 1, 1);
  b->cbuf_r = (uint8_t *)calloc((size_t)cr + 1, 1);
  /* written, so that the anchor reads real pages (calloc's untouched pages all map the one zero
   * page, which would flatter the anchor) */
  memset(b->abuf_s, 0x3C, (size_t)as + 1);
  memset(b->cbuf_s, 0x3C, (size_t)cs + 1);
}

/* Dispatch, then combine, each next to its anchor per iteration (two warm-up iterations);
 * returns 1 when a call failed. */
static int time_calls(epb_run *b) {
  const epb_opts *o = &b->o;
  const int64_t S = (int64_t)b->S, nr = b->c.recv_rows, nt = b->c.recv_tokens;
  xte_tensor tx = xte_tensor_2d(b->x, o->fp8 ? XTE_DTYPE_E4M3 : XTE_DTYPE_BF16, b->T, b->H);
  xte_tensor tsx = xte_tensor_2d(b->xs, XTE_DTYPE_FP32, b->T, S);
  xte_tensor tw = xte_tensor_2d(b->w, XTE_DTYPE_FP32, b->T, b->K);
  xte_tensor trx = xte_tensor_2d(b->rx, tx.dtype, nr, b->H);
  xte_tensor trs = xte_tensor_2d(b->rs, XTE_DTYPE_FP32, nr, S);
  xte_tensor trw = xte_tensor_1d(b->rw, XTE_DTYPE_FP32, nr);
  xte_tensor ttx = xte_tensor_2d(b->rx, tx.dtype, nt, b->H);
  xte_tensor tts = xte_tensor_2d(b->rs, XTE_DTYPE_FP32, nt, S);
  xte_tensor tti = xte_tensor_2d(b->rw, XTE_DTYPE_INT32, nt, b->K);
  xte_tensor ttw = xte_tensor_2d(b->rw + nt * b->K, XTE_DTYPE_FP32, nt, b->K);
  xte_tensor tyo = xte_tensor_2d(b->yo, XTE_DTYPE_BF16, nr, b->H);
  xte_tensor tout = xte_tensor_2d(b->out, XTE_DTYPE_BF16, b->T, b->H);
  int it, rc = 0;
  for (it = -2; it < o->iters; it++) {
    double t0, t1, ta;
    if (it == 0) xte_ep_group_stats(b->g, NULL, 1);
    MPI_Barrier(b->comm);
    t0 = MPI_Wtime();
    if (o->token_major)
      rc |= xte_ep_dispatch_tokens(b->g, b->handle, &tx, o->fp8 ? &tsx : NULL, &tw, &ttx,
                                   o->fp8 ? &tts : NULL, &tti, &ttw, NULL) != XTE_SUCCESS;
    else
      rc |= xte_ep_dispatch(b->g, b->handle, &tx, o->fp8 ? &tsx : NULL, &tw, &trx,
                            o->fp8 ? &trs : NULL, &trw, NULL) != XTE_SUCCESS;
    t1 = MPI_Wtime();
    if (it >= 0) b->td[it] = t1 - t0;
    ta = timed_alltoallv(b->abuf_s, b->a_sc, b->a_sd, b->abuf_r, b->a_rc, b->a_rd, b->comm);
    if (it >= 0) b->tad[it] = ta;
  }
  b->sd.struct_size = sizeof b->sd;
  xte_ep_group_stats(b->g, &b->sd, 1);
  for (it = -2; it < o->iters; it++) {
    double t0, t1, ta;
    if (it == 0) xte_ep_group_stats(b->g, NULL, 1);
    MPI_Barrier(b->comm);
    t0 = MPI_Wtime();
    rc |= xte_ep_combine(b->g, b->handle, &tyo, &tw, &tout, NULL, NULL) != XTE_SUCCESS;
    t1 = MPI_Wtime();
    if (it >= 0) b->tc[it] = t1 - t0;
    ta = timed_alltoallv(b->cbuf_s, b->c_sc, b->c_sd, b->cbuf_r, b->c_rc, b->c_rd, b->comm);
    if (it >= 0) b->tac[it] = ta;
  }
  b->sc.struct_size = sizeof b->sc;
  xte_ep_group_stats(b->g, &b->sc, 1);
  return rc;
}

/* The medians of the slowest rank and, on rank 0, the table (and the JSON report); returns 1
 * when the JSON file could not be written. */
static int report(epb_run *b) {
  const epb_opts *o = &b->o;
  double d_x = median_max(b->td, (int)o->iters, b->comm);
  double c_x = median_max(b->tc, (int)o->iters, b->comm);
  double d_a = median_max(b->tad, (int)o->iters, b->comm);
  double c_a = median_max(b->tac, (int)o->iters, b->comm);
  double mb_d, mb_c;
  long v[2] = {0, 0}, all[2];
  char info[4096];
  char *cpu = info;
  int r;
  for (r = 0; r < b->R; r++) {
    v[0] += b->a_sc[r];
    v[1] += b->c_sc[r];
  }
  MPI_Allreduce(v, all, 2, MPI_LONG, MPI_SUM, b->comm);
  mb_d = (double)all[0] / b->R / 1e6;
  mb_c = (double)all[1] / b->R / 1e6;
  if (b->rank != 0) return 0;
  xte_backend_info_string(info, sizeof info);
  cpu = strstr(info, "cpu: ");
  if (cpu) *strchr(cpu, '\n') = '\0';
  printf(
      "xte bench ep: %d ranks (mpi) on %s; %ld tokens per rank, hidden %ld, %s%s, top-%ld "
      "of %ld experts, %ld iterations (median of the slowest rank)%s\n",
      b->R, cpu ? cpu + 5 : "?", b->T, b->H, o->fp8 ? "e4m3 rows + fp32 1x128 scales" : "bf16 rows",
      ", fp32 weights", b->K, b->E, o->iters,
      o->token_major ? "; dispatch: xte_ep_dispatch_tokens (token-major, no expansion)" : "");
  printf("%-9s %14s %9s %16s %9s %8s %6s %10s %7s\n", "op", "MB per rank", "xte ms",
         "MPI_Alltoallv ms", "ratio", "GB/s", "pack%", "exchange%", "local%");
  print_row("dispatch", mb_d, d_x, d_a, &b->sd);
  print_row("combine", mb_c, c_x, c_a, &b->sc);
  printf(
      "(shares: rank 0; combine output bf16, fp32 accumulation in xte_moe_unpermute's "
      "order)\n");
  if (o->json) {
    FILE *f = fopen(o->json, "w");
    char lib[MPI_MAX_LIBRARY_VERSION_STRING], date[32];
    time_t now = time(NULL);
    int k, len = 0;
    if (!f) {
      fprintf(stderr, "xte bench ep: --json %s: cannot write\n", o->json);
      return 1;
    }
    MPI_Get_library_version(lib, &len);
    lib[strcspn(lib, "\n,")] = '\0'; /* the first clause: name and version */
    fprintf(f, "{\"command\": \"bench ep\",\n \"context\": {");
    for (k = 0; k < xte_bench_machine_count(); k++) {
      fprintf(f, "%s\n  ", k ? "," : "");
      json_str(f, xte_bench_machine_key(k));
      fputs(": ", f);
      json_str(f, xte_bench_machine_value(k));
    }
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S+00:00", gmtime(&now));
    fprintf(f, ",\n  \"date\": \"%s\"", date); /* the run's time, as Google Benchmark records it */
    fprintf(f, "},\n \"config\": {\"ranks\": %d, \"transport\": \"mpi\", \"mpi_library\": ", b->R);
    json_str(f, lib);
    fprintf(f,
            ", \"tokens_per_rank\": %ld, \"hidden\": %ld, \"experts\": %ld, \"topk\": %ld, "
            "\"dtype\": \"%s\", \"iters\": %ld, \"dispatch\": \"%s\", \"statistic\": \"median over "
            "iterations of the slowest rank\", \"shares\": \"rank 0\"},\n \"ops\": [\n",
            b->T, b->H, b->E, b->K, o->fp8 ? "e4m3" : "bf16", o->iters,
            o->token_major ? "token-major" : "expert-major");
    json_op(f, "dispatch", mb_d, d_x, d_a, &b->sd);
    fputs(",\n", f);
    json_op(f, "combine", mb_c, c_x, c_a, &b->sc);
    fputs("\n ]\n}\n", f);
    if (fclose(f) != 0) {
      fprintf(stderr, "xte bench ep: --json %s: cannot write\n", o->json);
      return 1;
    }
  }
  return 0;
}

static void release(epb_run *b) {
  xte_ep_group_destroy(b->g);
  free(b->handle);
  free(b->idx);
  free(b->w);
  free(b->x);
  free(b->xs);
  free(b->rx);
  free(b->rs);
  free(b->rw);
  free(b->yo);
  free(b->out);
  free(b->a_sc);
  free(b->abuf_s);
  free(b->abuf_r);
  free(b->cbuf_s);
  free(b->cbuf_r);
  free(b->td);
}

int xte_bench_ep(int argc, char **argv) {
  epb_opts o = {4096, 7168, 64, 8, 10, 1, 0, NULL};
  int init = 0, rc;
  epb_run b;
  memset(&b, 0, sizeof b);
  b.comm = MPI_COMM_WORLD;
  MPI_Initialized(&init);
  if (!init) MPI_Init(&argc, &argv);
  MPI_Comm_size(b.comm, &b.R);
  MPI_Comm_rank(b.comm, &b.rank);
  if (!parse(argc, argv, &o) || o.experts % b.R) {
    if (b.rank == 0)
      fprintf(stderr,
              "usage: mpirun -np R xte bench ep [--tokens T] [--hidden H] [--experts E "
              "(a multiple of R)] [--topk K <= 16] [--dtype e4m3|bf16] [--iters N] "
              "[--token-major] [--json FILE]\n");
    if (!init) MPI_Finalize();
    return 2;
  }
  /* the machine record (rank 0's machine), as every benchmark prints it; no OpenBLAS re-exec:
   * the anchor here is MPI_Alltoallv */
  if (b.rank == 0) xte_bench_machine_setup(NULL, stdout);
  b.o = o;
  b.T = o.tokens;
  b.H = o.hidden;
  b.K = o.topk;
  b.E = o.experts;
  b.El = b.E / b.R;
  b.xe = o.fp8 ? 1 : 2;
  b.S = o.fp8 ? (size_t)(b.H + 127) / 128 : 0;
  b.payload = (size_t)b.H * b.xe + b.S * 4 + (size_t)b.K * 4;
  make_tokens(&b);
  make_group(&b);
  make_anchors(&b);
  b.td = (double *)calloc((size_t)o.iters * 4, sizeof(double));
  b.tc = b.td + o.iters;
  b.tad = b.tc + o.iters;
  b.tac = b.tad + o.iters;
  rc = time_calls(&b);
  if (rc) fprintf(stderr, "rank %d: %s\n", b.rank, xte_last_error());
  if (report(&b)) rc = 1;
  release(&b);
  if (!init) MPI_Finalize();
  return rc ? 1 : 0;
}
#endif
