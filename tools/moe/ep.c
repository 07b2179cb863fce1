/* `xte moe --ep N` (moe_ep_main, declared in tools/moe/moe.h, called from tools/cmd_moe.c): the MoE
 * layer of `xte moe` with its routed experts split over the N ranks of MPI_COMM_WORLD, forward and
 * backward, checked byte for byte against the same layer run in one process.
 *
 *   mpirun -np 4 xte moe --ep 4 [--tokens N --experts N --hidden N --ffn N --topk N ...]
 *
 * Every rank builds the problem from the seed: all tokens' x (bf16) and router logits (fp32,
 * generated directly: no gate GEMM), the expert bias, the output gradient, and the FP8 weights
 * (128x128 blocks, from the same per-expert streams as `xte moe`) of the experts it needs.
 * Rank r owns tokens [r*T/N, (r+1)*T/N) (uneven splits and ranks with no token allowed) and
 * experts [r*El, (r+1)*El), El = E / N.
 *
 * The EP run (every rank; timed, per step the max over ranks):
 *   forward   xte_router_forward (its tokens: topk_idx, topk_weights) -> xte_ep_prepare ->
 *             xte_ep_dispatch of the bf16 rows -> the local experts' FFN on the received
 *             expert-major rows (each expert padded to 128 rows): quantize 1x128, grouped GEMM
 *             gate/up, SwiGLU + quantize, grouped GEMM down -> xte_ep_combine with the top-k
 *             weights
 *   backward  xte_ep_combine_backward (grad rows + grad of the top-k weights) -> quantize,
 *             grouped down dgrad, k-grouped down wgrad, dSwiGLU + quantize, grouped gate/up dgrad,
 *             k-grouped gate/up wgrad -> xte_ep_dispatch_backward (fp32 grad x) -> the router
 *             backward (grad logits)
 * Rows travel in bf16, not FP8: the backward's wgrad GEMMs need the columnwise (128x1, along the
 * tokens) quantization of each expert's rows, which only exists once the rows are grouped by
 * expert on the expert's rank; FP8 rows would have to travel with their bf16 originals anyway.
 *
 * The one-process run (rank 0, all tokens and all experts, untimed but reported): the same
 * router, xte_moe_permute (topk_idx routing, align 128), the same FFN calls on all experts,
 * xte_moe_unpermute; unpermute backward, the FFN backward, xte_moe_permute_backward, router
 * backward. Rank 0 then sends every rank the one-process bytes of its tokens (out, grad x, grad
 * top-k weights, grad logits) and of its experts (weight gradients), in chunks; each rank
 * compares them with its own, and rank 0 prints the table. Exit 0 only if every rank matched.
 *
 * Test hook: the environment variable XTE_MOE_EP_FAULT plants a bug in the EP run, so that the
 * tests can show the check fails: "weights" combines without the top-k weights, "offset" gives
 * each rank the weights of the experts one past its own. (tests/cmake/moe_layer.cmake) */
#define _GNU_SOURCE /* posix_memalign */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "synth.h"
#include "xte/xte.h"

#ifndef XTE_HAVE_MPI

int moe_ep_main(const moe_opts *o) {
  (void)o;
  fprintf(stderr,
          "xte moe: --ep: this xte was built without MPI (expert parallelism needs it: "
          "install Open MPI, e.g. openmpi-bin libopenmpi-dev, and reconfigure)\n");
  return 2;
}

#else

#include <mpi.h>

/* ================================================================== small helpers */

static int g_rank, g_size;

static void die(const char *what, xte_status st) {
  fprintf(stderr, "xte moe --ep: rank %d: %s: %s: %s\n", g_rank, what, xte_status_string(st),
          xte_last_error());
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

#define OK(what, call)                      \
  do {                                      \
    xte_status st_ = (call);                \
    if (st_ != XTE_SUCCESS) die(what, st_); \
  } while (0)

/* Zeroed, 64-byte aligned, never NULL (an empty tensor still has a data pointer); freed by
 * free_all. A failure aborts the job (a rank leaving alone would hang the others). */
#define EP_MAX_BUFS 128
static void *g_bufs[EP_MAX_BUFS];
static int g_nbufs;

static void *zalloc(size_t n) {
  void *p = NULL;
  if (n < 64) n = 64;
  if (g_nbufs >= EP_MAX_BUFS || posix_memalign(&p, 64, n) != 0 || !p) {
    fprintf(stderr,
            "xte moe --ep: rank %d: out of memory (%zu bytes): lower --experts or "
            "--tokens\n",
            g_rank, n);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
  }
  memset(p, 0, n);
  g_bufs[g_nbufs++] = p;
  return p;
}

static void free_all(void) {
  while (g_nbufs > 0) free(g_bufs[--g_nbufs]);
}

static xte_tensor T2(void *p, xte_dtype dt, int64_t r, int64_t c) {
  return xte_tensor_2d(p, dt, r, c);
}

/* ================================================================== the experts' FFN
 * G experts on expert-major rows (expert g's m[g] rows, padded to kpad[g], a multiple of 128),
 * the calls and modes of tools/moe/layer.c's run_layer: the EP run (the local experts) and the
 * one-process run (all experts) both go through here. */

#define ALIGN 128

typedef struct ffn {
  int64_t G, rows, H, F;
  xte_recipe recipe;
  xte_gemm_mode mode; /* of every GEMM (--mode) */
  int bwd;
  int64_t *m, *kpad; /* [G] host arrays: rows and padded rows per expert */
  xte_qtensor Wgu, Wd, qx, qa, qdyp, qdh;
  uint16_t *xp, *h, *y, *dyp, *da, *dxp; /* bf16 */
  float *dWgu, *dWd, *stage;
} ffn;

static void *ep_alloc(void *ctx, size_t n, int cat) {
  (void)ctx;
  (void)cat;
  return zalloc(n);
}

/* layer.c's moe_qalloc from zalloc; row / col: which copies. */
static void qalloc(xte_qtensor *q, int64_t M, int64_t K, xte_scaling_mode mode, xte_recipe recipe,
                   int row, int col) {
  OK("scale shape", moe_qalloc(q, M, K, mode, recipe, row, col, ep_alloc, NULL, CAT_ACT));
}

/* One weight stack [G, N, K] in 128x128 blocks, expert g from the stream of global expert
 * (e0 + g) mod E, as tools/moe/layer.c's generate_weights
 * (moe_weight_expert, tools/moe/synth.c: the same bytes). */
static void quantize_experts(ffn *f, xte_qtensor *W, int64_t N, int64_t K, int64_t e0, int64_t E,
                             int down, uint64_t seed, xte_stream st) {
  int64_t g;
  for (g = 0; g < f->G; g++)
    OK("quantizing the expert weights",
       moe_weight_expert(W, g, N, K, f->stage, seed,
                         (uint64_t)(S_EXPERT0 + 2 * ((e0 + g) % E) + down), st));
}

static void ffn_weights(ffn *f, int64_t G, int64_t H, int64_t F, xte_recipe recipe,
                        xte_gemm_mode mode, int bwd, int64_t e0, int64_t E, uint64_t seed,
                        xte_stream st) {
  memset(f, 0, sizeof *f);
  f->mode = mode;
  f->G = G;
  f->H = H;
  f->F = F;
  f->recipe = recipe;
  f->bwd = bwd;
  f->m = (int64_t *)zalloc((size_t)G * 8);
  f->kpad = (int64_t *)zalloc((size_t)G * 8);
  {
    size_t a = moe_weight_stage_floats(2 * F, H), b = moe_weight_stage_floats(H, F);
    f->stage = (float *)zalloc((a > b ? a : b) * 4);
  }
  qalloc(&f->Wgu, G * 2 * F, H, XTE_SCALING_BLOCK_128x128, recipe, 1, 0);
  qalloc(&f->Wd, G * H, F, XTE_SCALING_BLOCK_128x128, recipe, 1, 0);
  quantize_experts(f, &f->Wgu, 2 * F, H, e0, E, 0, seed, st);
  quantize_experts(f, &f->Wd, H, F, e0, E, 1, seed, st);
  if (bwd) {
    f->dWgu = (float *)zalloc((size_t)(G * 2 * F * H) * 4);
    f->dWd = (float *)zalloc((size_t)(G * H * F) * 4);
  }
}

/* The activations for `rows` expert-major rows (once: the routing is the same every step). */
static void ffn_acts(ffn *f, int64_t rows) {
  int64_t H = f->H, F = f->F, R = rows;
  int b = f->bwd;
  xte_recipe rc = f->recipe;
  f->rows = R;
  f->xp = (uint16_t *)zalloc((size_t)(R * H) * 2);
  f->h = (uint16_t *)zalloc((size_t)(R * 2 * F) * 2);
  f->y = (uint16_t *)zalloc((size_t)(R * H) * 2);
  if (R > 0) {
    qalloc(&f->qx, R, H, XTE_SCALING_BLOCK_1x128, rc, 1, b);
    qalloc(&f->qa, R, F, XTE_SCALING_BLOCK_1x128, rc, 1, b);
  }
  if (!b) return;
  f->dyp = (uint16_t *)zalloc((size_t)(R * H) * 2);
  f->da = (uint16_t *)zalloc((size_t)(R * F) * 2);
  f->dxp = (uint16_t *)zalloc((size_t)(R * H) * 2);
  if (R > 0) {
    qalloc(&f->qdyp, R, H, XTE_SCALING_BLOCK_1x128, rc, 1, 1);
    qalloc(&f->qdh, R, 2 * F, XTE_SCALING_BLOCK_1x128, rc, 1, 1);
  }
}

static xte_gemm_groups groups_contig(const ffn *f) {
  xte_gemm_groups g;
  memset(&g, 0, sizeof g);
  g.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
  g.num_groups = (int)f->G;
  g.group_sizes = f->m;
  g.alignment = ALIGN;
  return g;
}

/* xp -> y. No rows (a rank no token was routed to): nothing to compute. */
static void ffn_forward(ffn *f, xte_stream st) {
  int64_t R = f->rows, H = f->H, F = f->F;
  xte_tensor xpt = T2(f->xp, XTE_DTYPE_BF16, R, H), ht = T2(f->h, XTE_DTYPE_BF16, R, 2 * F);
  xte_tensor yt = T2(f->y, XTE_DTYPE_BF16, R, H);
  xte_gemm_groups gc = groups_contig(f);
  xte_gemm_config fw = xte_gemm_config_default();
  fw.mode = f->mode;
  if (R == 0) return;
  OK("quantize 1x128", xte_quantize(&xpt, &f->qx, NULL, st));
  OK("grouped GEMM gate/up", xte_gemm_grouped(&f->qx, &f->Wgu, NULL, &ht, &gc, &fw, st));
  OK("SwiGLU + quantize", xte_swiglu_quantize(&ht, XTE_DTYPE_BF16, &f->qa, NULL, st));
  OK("grouped GEMM down", xte_gemm_grouped(&f->qa, &f->Wd, NULL, &yt, &gc, &fw, st));
}

/* dyp -> dxp, dWd, dWgu (the weight gradients stay zero without rows). */
static void ffn_backward(ffn *f, xte_stream st) {
  int64_t R = f->rows, H = f->H, F = f->F, G = f->G;
  xte_tensor dypt = T2(f->dyp, XTE_DTYPE_BF16, R, H), dat = T2(f->da, XTE_DTYPE_BF16, R, F);
  xte_tensor dxpt = T2(f->dxp, XTE_DTYPE_BF16, R, H), ht = T2(f->h, XTE_DTYPE_BF16, R, 2 * F);
  xte_tensor dWdt = T2(f->dWd, XTE_DTYPE_FP32, G * H, F);
  xte_tensor dWgut = T2(f->dWgu, XTE_DTYPE_FP32, G * 2 * F, H);
  xte_gemm_groups gc = groups_contig(f), gk;
  xte_gemm_config dg = xte_gemm_config_default(), wg;
  dg.mode = f->mode;
  wg = dg;
  if (R == 0) return;
  memset(&gk, 0, sizeof gk);
  gk.kind = XTE_GEMM_GROUPED_K;
  gk.num_groups = (int)G;
  gk.group_sizes = f->kpad;
  dg.trans_b = 1; /* dgrad: op(B) = W^T */
  wg.trans_a = 1; /* wgrad: op(A) = grad^T, op(B) = act^T (token axis = K) */
  wg.trans_b = 1;
  OK("quantize grad (row + col)", xte_quantize(&dypt, &f->qdyp, NULL, st));
  OK("grouped GEMM down dgrad", xte_gemm_grouped(&f->qdyp, &f->Wd, NULL, &dat, &gc, &dg, st));
  OK("k-grouped GEMM down wgrad", xte_gemm_grouped(&f->qdyp, &f->qa, NULL, &dWdt, &gk, &wg, st));
  OK("dSwiGLU + quantize", xte_dswiglu_quantize(&dat, &ht, XTE_DTYPE_BF16, &f->qdh, NULL, st));
  OK("grouped GEMM gate/up dgrad", xte_gemm_grouped(&f->qdh, &f->Wgu, NULL, &dxpt, &gc, &dg, st));
  OK("k-grouped GEMM gate/up wgrad", xte_gemm_grouped(&f->qdh, &f->qx, NULL, &dWgut, &gk, &wg, st));
}

/* ================================================================== the router */

typedef struct router {
  int64_t T, E, k;
  int32_t *topk;  /* [T, k] */
  float *w;       /* [T, k] topk_weights */
  uint8_t *map;   /* [T, E] */
  float *saved;   /* [T, E] */
  float *gw;      /* [T, k] grad of the top-k weights */
  float *gprobs;  /* [T, E] */
  float *dlogits; /* [T, E] */
} router;

static void router_alloc(router *r, int64_t T, int64_t E, int64_t k) {
  r->T = T;
  r->E = E;
  r->k = k;
  r->topk = (int32_t *)zalloc((size_t)(T * k) * 4);
  r->w = (float *)zalloc((size_t)(T * k) * 4);
  r->map = (uint8_t *)zalloc((size_t)(T * E));
  r->saved = (float *)zalloc((size_t)(T * E) * 4);
  r->gw = (float *)zalloc((size_t)(T * k) * 4);
  r->gprobs = (float *)zalloc((size_t)(T * E) * 4);
  r->dlogits = (float *)zalloc((size_t)(T * E) * 4);
}

static void router_forward(router *r, const float *logits, const float *bias,
                           const xte_router_config *cfg, xte_stream st) {
  xte_tensor lt = T2((void *)logits, XTE_DTYPE_FP32, r->T, r->E);
  xte_tensor bt = xte_tensor_1d((void *)bias, XTE_DTYPE_FP32, r->E);
  xte_router_outputs ro;
  if (r->T == 0) return;
  memset(&ro, 0, sizeof ro);
  ro.topk_idx = T2(r->topk, XTE_DTYPE_INT32, r->T, r->k);
  ro.topk_weights = T2(r->w, XTE_DTYPE_FP32, r->T, r->k);
  ro.routing_map = T2(r->map, XTE_DTYPE_UINT8, r->T, r->E);
  ro.saved = T2(r->saved, XTE_DTYPE_FP32, r->T, r->E);
  OK("router forward", xte_router_forward(&lt, &bt, cfg, &ro, st));
}

/* grad of the top-k weights -> grad probs [T, E] (at each slot's expert) -> grad logits. */
static void router_backward(router *r, const xte_router_config *cfg, xte_stream st) {
  xte_tensor gpt = T2(r->gprobs, XTE_DTYPE_FP32, r->T, r->E);
  xte_tensor mapt = T2(r->map, XTE_DTYPE_UINT8, r->T, r->E);
  xte_tensor savedt = T2(r->saved, XTE_DTYPE_FP32, r->T, r->E);
  xte_tensor dlt = T2(r->dlogits, XTE_DTYPE_FP32, r->T, r->E);
  int64_t t, j;
  if (r->T == 0) return;
  memset(r->gprobs, 0, (size_t)(r->T * r->E) * 4);
  for (t = 0; t < r->T; t++)
    for (j = 0; j < r->k; j++)
      if (r->topk[t * r->k + j] >= 0)
        r->gprobs[t * r->E + r->topk[t * r->k + j]] = r->gw[t * r->k + j];
  OK("router backward", xte_router_backward(&gpt, &mapt, &savedt, NULL, cfg, &dlt, st));
}

/* ================================================================== the problem */

typedef struct problem {
  int64_t T, E, H, F, k, El, Tmax;
  int N, bwd;
  xte_recipe recipe;
  xte_gemm_mode mode;
  uint64_t seed;
  xte_router_config rcfg;
  uint16_t *x, *dy; /* [T, H] all tokens */
  float *logits;    /* [T, E] */
  float *bias;      /* [E] */
} problem;

static int64_t tok0(const problem *p, int r) {
  return p->T * r / p->N;
}

/* ================================================================== the EP run */

enum {
  P_ROUTER,
  P_PREPARE,
  P_DISPATCH,
  P_FFN,
  P_COMBINE,
  P_COMBINE_B,
  P_FFN_B,
  P_DISPATCH_B,
  P_ROUTER_B,
  NSTEP
};
static const char *step_names[NSTEP] = {
    "router forward (own tokens)",    "ep prepare",           "ep dispatch (bf16 rows)",
    "experts forward (grouped FP8)",  "ep combine",           "ep combine backward",
    "experts backward (dgrad+wgrad)", "ep dispatch backward", "router backward (own tokens)"};

typedef struct eprun {
  int rank, fault;
  int64_t t0, Tr, e0;
  xte_ep_group g;
  void *handle;
  size_t hbytes;
  xte_ep_counts c;
  int64_t *tpe;
  router rt;
  ffn f;
  uint16_t *out, *slots;
  float *dx;
  double t[NSTEP];
  double bytes[NSTEP];
  int acts;
} eprun;

static void step_stats(eprun *e, int s, int timed) {
  xte_ep_stats es;
  memset(&es, 0, sizeof es);
  es.struct_size = sizeof es;
  OK("ep stats", xte_ep_group_stats(e->g, &es, 1));
  if (timed) e->bytes[s] += (double)es.bytes_sent;
}

/* A timed step starts with the ranks synchronised (the barrier is not timed), so a collective's
 * time is its own and not the wait for a slower rank's experts. */
#define STEP(id, body)                      \
  do {                                      \
    double t0_;                             \
    if (timed) MPI_Barrier(MPI_COMM_WORLD); \
    t0_ = now_s();                          \
    body;                                   \
    if (timed) e->t[id] += now_s() - t0_;   \
  } while (0)

static void ep_step(const problem *p, eprun *e, xte_stream st, int timed) {
  int64_t H = p->H, k = p->k, Tr = e->Tr, El = p->El, l;
  xte_tensor idx = T2(e->rt.topk, XTE_DTYPE_INT32, Tr, k);
  xte_tensor tpe = xte_tensor_1d(e->tpe, XTE_DTYPE_INT64, El);
  xte_tensor x = T2(p->x + e->t0 * H, XTE_DTYPE_BF16, Tr, H);
  xte_tensor w = T2(e->rt.w, XTE_DTYPE_FP32, Tr, k);
  xte_tensor outt = T2(e->out, XTE_DTYPE_BF16, Tr, H);
  xte_tensor dyt = T2(p->dy + e->t0 * H, XTE_DTYPE_BF16, Tr, H);
  xte_tensor gwt = T2(e->rt.gw, XTE_DTYPE_FP32, Tr, k);
  xte_tensor dxt = T2(e->dx, XTE_DTYPE_FP32, Tr, H);
  xte_tensor rx, yt, slots, dyp, dxp;
  int64_t sum = 0;

  STEP(P_ROUTER, router_forward(&e->rt, p->logits + e->t0 * p->E, p->bias, &p->rcfg, st));
  STEP(P_PREPARE,
       OK("xte_ep_prepare", xte_ep_prepare(e->g, &idx, e->handle, e->hbytes, &e->c, &tpe, st)));
  step_stats(e, P_PREPARE, timed);
  for (l = 0; l < El; l++) {
    e->f.m[l] = e->tpe[l];
    e->f.kpad[l] = (e->tpe[l] + ALIGN - 1) / ALIGN * ALIGN;
    sum += e->f.kpad[l];
  }
  if (sum != e->c.recv_rows) {
    fprintf(stderr,
            "xte moe --ep: rank %d: xte_ep_prepare: recv_rows %lld, but the local "
            "experts' rows padded to %d sum to %lld\n",
            e->rank, (long long)e->c.recv_rows, ALIGN, (long long)sum);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (!e->acts) {
    ffn_acts(&e->f, e->c.recv_rows);
    e->slots = (uint16_t *)zalloc((size_t)(e->c.slot_rows * H) * 2);
    e->acts = 1;
  } else if (e->f.rows != e->c.recv_rows) {
    fprintf(stderr, "xte moe --ep: rank %d: recv_rows changed between steps\n", e->rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  rx = T2(e->f.xp, XTE_DTYPE_BF16, e->f.rows, H);
  yt = T2(e->f.y, XTE_DTYPE_BF16, e->f.rows, H);
  slots = T2(e->slots, XTE_DTYPE_BF16, e->c.slot_rows, H);
  dyp = T2(e->f.dyp, XTE_DTYPE_BF16, e->f.rows, H);
  dxp = T2(e->f.dxp, XTE_DTYPE_BF16, e->f.rows, H);

  STEP(P_DISPATCH,
       OK("xte_ep_dispatch", xte_ep_dispatch(e->g, e->handle, &x, NULL, &w, &rx, NULL, NULL, st)));
  step_stats(e, P_DISPATCH, timed);
  STEP(P_FFN, ffn_forward(&e->f, st));
  STEP(P_COMBINE,
       OK("xte_ep_combine",
          xte_ep_combine(e->g, e->handle, &yt, e->fault == 1 ? NULL : &w, &outt, &slots, st)));
  step_stats(e, P_COMBINE, timed);
  if (!p->bwd) return;
  STEP(P_COMBINE_B, OK("xte_ep_combine_backward",
                       xte_ep_combine_backward(e->g, e->handle, &dyt, &w, &slots, &dyp, &gwt, st)));
  step_stats(e, P_COMBINE_B, timed);
  STEP(P_FFN_B, ffn_backward(&e->f, st));
  STEP(P_DISPATCH_B,
       OK("xte_ep_dispatch_backward", xte_ep_dispatch_backward(e->g, e->handle, &dxp, &dxt, st)));
  step_stats(e, P_DISPATCH_B, timed);
  STEP(P_ROUTER_B, router_backward(&e->rt, &p->rcfg, st));
}

/* ================================================================== the one-process run */

typedef struct refrun {
  router rt;
  ffn f;
  int32_t *row_map; /* [T, k] */
  int64_t *offs;    /* [E + 1] */
  int64_t *tpe;     /* [E] */
  uint16_t *out;    /* [T, H] */
  float *dx;        /* [T, H] */
  double t;
} refrun;

static void ref_run(const problem *p, refrun *q, xte_stream st) {
  int64_t T = p->T, H = p->H, E = p->E, k = p->k, e, rows = 0;
  xte_tensor idx, rowm, xt, xpt, w, yt, outt, dyt, dypt, gwt, dxpt, dxt;
  xte_moe_routing rt;
  xte_permute_config pc;
  xte_permute_outputs po;
  double t0 = now_s();
  router_alloc(&q->rt, T, E, k);
  ffn_weights(&q->f, E, H, p->F, p->recipe, p->mode, p->bwd, 0, E, p->seed, st);
  q->row_map = (int32_t *)zalloc((size_t)(T * k) * 4);
  q->offs = (int64_t *)zalloc((size_t)(E + 1) * 8);
  q->tpe = (int64_t *)zalloc((size_t)E * 8);
  q->out = (uint16_t *)zalloc((size_t)(T * H) * 2);
  q->dx = (float *)zalloc((size_t)(T * H) * 4);
  t0 = now_s();
  router_forward(&q->rt, p->logits, p->bias, &p->rcfg, st);
  idx = T2(q->rt.topk, XTE_DTYPE_INT32, T, k);
  memset(&rt, 0, sizeof rt);
  rt.topk_idx = &idx;
  rt.num_experts = E;
  pc = xte_permute_config_default();
  pc.num_out_tokens = -1;
  pc.align = ALIGN;
  OK("xte_moe_permute_rows", xte_moe_permute_rows(&rt, &pc, &rows, st));
  ffn_acts(&q->f, rows);
  memset(&po, 0, sizeof po);
  po.expert_offsets = xte_tensor_1d(q->offs, XTE_DTYPE_INT64, E + 1);
  po.tokens_per_expert = xte_tensor_1d(q->tpe, XTE_DTYPE_INT64, E);
  rowm = T2(q->row_map, XTE_DTYPE_INT32, T, k);
  xt = T2(p->x, XTE_DTYPE_BF16, T, H);
  xpt = T2(q->f.xp, XTE_DTYPE_BF16, rows, H);
  OK("xte_moe_permute", xte_moe_permute(&xt, NULL, &rt, &pc, &xpt, NULL, &rowm, &po, st));
  for (e = 0; e < E; e++) {
    q->f.m[e] = q->tpe[e];
    q->f.kpad[e] = q->offs[e + 1] - q->offs[e];
  }
  ffn_forward(&q->f, st);
  w = T2(q->rt.w, XTE_DTYPE_FP32, T, k);
  yt = T2(q->f.y, XTE_DTYPE_BF16, rows, H);
  outt = T2(q->out, XTE_DTYPE_BF16, T, H);
  OK("xte_moe_unpermute", xte_moe_unpermute(&yt, &rt, &rowm, &w, &outt, st));
  if (p->bwd) {
    dyt = T2(p->dy, XTE_DTYPE_BF16, T, H);
    dypt = T2(q->f.dyp, XTE_DTYPE_BF16, rows, H);
    gwt = T2(q->rt.gw, XTE_DTYPE_FP32, T, k);
    OK("xte_moe_unpermute_backward",
       xte_moe_unpermute_backward(&dyt, &yt, &rt, &rowm, &w, &dypt, &gwt, st));
    ffn_backward(&q->f, st);
    dxpt = T2(q->f.dxp, XTE_DTYPE_BF16, rows, H);
    dxt = T2(q->dx, XTE_DTYPE_FP32, T, H);
    OK("xte_moe_permute_backward", xte_moe_permute_backward(&dxpt, &rt, &rowm, &dxt, st));
    router_backward(&q->rt, &p->rcfg, st);
  }
  q->t = now_s() - t0;
}

/* ================================================================== the byte check */

enum { I_OUT, I_GW, I_DX, I_DLOGITS, I_DWGU, I_DWD, NITEM };
static const char *item_names[NITEM] = {"out [T, H] bf16",          "grad top-k weights [T, k]",
                                        "grad x [T, H] fp32",       "grad logits [T, E] fp32",
                                        "dW gate/up (own experts)", "dW down (own experts)"};

/* Item i's element size, row length, and rows of rank r (first row, count). */
static void item_shape(const problem *p, int i, int r, size_t *esz, int64_t *cols, int64_t *row0,
                       int64_t *nrows) {
  int64_t t0 = tok0(p, r), t1 = tok0(p, r + 1);
  *esz = i == I_OUT ? 2 : 4;
  *row0 = t0;
  *nrows = t1 - t0;
  switch (i) {
    case I_OUT:
    case I_DX:
      *cols = p->H;
      break;
    case I_GW:
      *cols = p->k;
      break;
    case I_DLOGITS:
      *cols = p->E;
      break;
    case I_DWGU:
      *cols = p->H;
      *row0 = r * p->El * 2 * p->F;
      *nrows = p->El * 2 * p->F;
      break;
    default:
      *cols = p->F;
      *row0 = r * p->El * p->H;
      *nrows = p->El * p->H;
      break;
  }
}

static const uint8_t *item_ep(const eprun *e, int i) {
  switch (i) {
    case I_OUT:
      return (const uint8_t *)e->out;
    case I_GW:
      return (const uint8_t *)e->rt.gw;
    case I_DX:
      return (const uint8_t *)e->dx;
    case I_DLOGITS:
      return (const uint8_t *)e->rt.dlogits;
    case I_DWGU:
      return (const uint8_t *)e->f.dWgu;
    default:
      return (const uint8_t *)e->f.dWd;
  }
}

static const uint8_t *item_ref(const refrun *q, int i) {
  switch (i) {
    case I_OUT:
      return (const uint8_t *)q->out;
    case I_GW:
      return (const uint8_t *)q->rt.gw;
    case I_DX:
      return (const uint8_t *)q->dx;
    case I_DLOGITS:
      return (const uint8_t *)q->rt.dlogits;
    case I_DWGU:
      return (const uint8_t *)q->f.dWgu;
    default:
      return (const uint8_t *)q->f.dWd;
  }
}

#define CHUNK ((size_t)16 << 20)

/* Compares this rank's item with the one-process bytes (rank 0: from q; others: received from
 * rank 0 in chunks). res[0]: elements that differ; res[1]: the first one (-1: none). */
static void check_item(const problem *p, const eprun *e, const refrun *q, int i, int64_t *res,
                       uint8_t *buf) {
  size_t esz, bytes, done, n;
  int64_t cols, row0, nrows;
  const uint8_t *mine = item_ep(e, i);
  item_shape(p, i, e->rank, &esz, &cols, &row0, &nrows);
  bytes = (size_t)(nrows * cols) * esz;
  res[0] = 0;
  res[1] = -1;
  for (done = 0; done < bytes; done += n) {
    const uint8_t *want;
    size_t el;
    n = bytes - done < CHUNK ? bytes - done : CHUNK;
    if (e->rank == 0) {
      want = item_ref(q, i) + (size_t)(row0 * cols) * esz + done;
    } else {
      MPI_Recv(buf, (int)n, MPI_BYTE, 0, 100 + i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      want = buf;
    }
    for (el = 0; el < n; el += esz)
      if (memcmp(mine + done + el, want + el, esz) != 0) {
        if (res[1] < 0) res[1] = (int64_t)((done + el) / esz);
        res[0]++;
      }
  }
  if (res[0])
    fprintf(stderr,
            "xte moe --ep: rank %d: %s: %lld of %lld elements differ from one process, the first "
            "at row %lld col %lld (global row %lld)\n",
            e->rank, item_names[i], (long long)res[0], (long long)(nrows * cols),
            (long long)(res[1] / cols), (long long)(res[1] % cols),
            (long long)(row0 + res[1] / cols));
}

/* Rank 0: sends rank r its rows of every item, in the order check_item receives them. */
static void send_items(const problem *p, const refrun *q, int nitems) {
  int r, i;
  for (r = 1; r < p->N; r++)
    for (i = 0; i < nitems; i++) {
      size_t esz, bytes, done, n;
      int64_t cols, row0, nrows;
      item_shape(p, i, r, &esz, &cols, &row0, &nrows);
      bytes = (size_t)(nrows * cols) * esz;
      for (done = 0; done < bytes; done += n) {
        n = bytes - done < CHUNK ? bytes - done : CHUNK;
        MPI_Send(item_ref(q, i) + (size_t)(row0 * cols) * esz + done, (int)n, MPI_BYTE, r, 100 + i,
                 MPI_COMM_WORLD);
      }
    }
}

/* ================================================================== main, by step */

/* Usage: every rank sees the same options and size, so every rank fails alike. 0 ok, 2 usage. */
static int ep_usage(const moe_opts *o, const char *fault) {
  if (o->ep != g_size)
    fprintf(stderr,
            "xte moe: rank %d: --ep %d but the MPI job has %d ranks: run it as "
            "mpirun -np %d xte moe --ep %d\n",
            g_rank, (int)o->ep, g_size, (int)o->ep, (int)o->ep);
  else if (o->experts % o->ep != 0)
    fprintf(stderr,
            "xte moe: rank %d: --experts %lld is not a multiple of --ep %d (each rank holds "
            "experts / ranks experts)\n",
            g_rank, (long long)o->experts, (int)o->ep);
  else if (fault && strcmp(fault, "weights") != 0 && strcmp(fault, "offset") != 0)
    fprintf(stderr,
            "xte moe: rank %d: XTE_MOE_EP_FAULT='%s': want weights or offset (a planted "
            "bug for the tests)\n",
            g_rank, fault);
  else
    return 0;
  return 2;
}

/* The problem every rank builds from the seed: all tokens' x, dy, logits; the expert bias. */
static void problem_make(problem *P, const moe_opts *o) {
  int r;
  memset(P, 0, sizeof *P);
  P->T = o->tokens;
  P->E = o->experts;
  P->H = o->hidden;
  P->F = o->ffn;
  P->k = o->topk;
  P->N = g_size;
  P->El = P->E / P->N;
  P->bwd = o->backward != 0;
  P->recipe = o->recipe;
  P->mode = o->mode;
  P->seed = o->seed;
  P->rcfg = xte_router_config_default();
  P->rcfg.topk = (int)P->k;
  P->rcfg.score_function = XTE_ROUTER_SIGMOID;
  P->rcfg.scaling_factor = o->scaling;
  for (r = 0; r < P->N; r++)
    if (tok0(P, r + 1) - tok0(P, r) > P->Tmax) P->Tmax = tok0(P, r + 1) - tok0(P, r);
  P->x = (uint16_t *)zalloc((size_t)(P->T * P->H) * 2);
  P->dy = (uint16_t *)zalloc((size_t)(P->T * P->H) * 2);
  P->logits = (float *)zalloc((size_t)(P->T * P->E) * 4);
  P->bias = (float *)zalloc((size_t)P->E * 4);
  moe_fill_bf16(P->x, (size_t)(P->T * P->H), P->seed, S_X, 1.0f);
  moe_fill_bf16(P->dy, (size_t)(P->T * P->H), P->seed, S_DY, 1.0f);
  moe_fill_f32(P->logits, (size_t)(P->T * P->E), P->seed, S_LOGITS, 2.0f);
  moe_fill_f32(P->bias, (size_t)P->E, P->seed, S_BIAS, 0.1f);
}

/* This rank's EP group, handle, router and experts (fault 2: the weights of the experts one
 * past its own). */
static void ep_setup(const problem *P, eprun *E, int fault, xte_stream st) {
  xte_ep_config cfg;
  MPI_Comm world = MPI_COMM_WORLD;
  memset(E, 0, sizeof *E);
  E->rank = g_rank;
  E->fault = fault;
  E->t0 = tok0(P, g_rank);
  E->Tr = tok0(P, g_rank + 1) - E->t0;
  E->e0 = (int64_t)g_rank * P->El;
  cfg = xte_ep_config_default();
  cfg.experts_per_rank = P->El;
  cfg.hidden = P->H;
  cfg.topk = (int32_t)P->k;
  cfg.align = ALIGN;
  cfg.max_tokens_per_rank = P->Tmax;
  OK("xte_ep_group_create_mpi", xte_ep_group_create_mpi(&world, &cfg, &E->g));
  OK("xte_ep_handle_size", xte_ep_handle_size(E->g, &E->hbytes));
  E->handle = zalloc(E->hbytes);
  E->tpe = (int64_t *)zalloc((size_t)P->El * 8);
  router_alloc(&E->rt, E->Tr, P->E, P->k);
  ffn_weights(&E->f, P->El, P->H, P->F, P->recipe, P->mode, P->bwd, E->e0 + (E->fault == 2 ? 1 : 0),
              P->E, P->seed, st);
  E->out = (uint16_t *)zalloc((size_t)(E->Tr * P->H) * 2);
  E->dx = (float *)zalloc((size_t)(E->Tr * P->H) * 4);
}

/* What rank 0 reports: per step the max over ranks of the mean time (tmax[NSTEP]: of their
 * sum), the bytes sent (all ranks), every rank's tokens and received rows. */
typedef struct ep_times {
  double tmax[NSTEP + 1], bsum[NSTEP];
  int64_t *rows; /* [N, 2], rank 0 only */
} ep_times;

static void ep_timed_runs(const problem *P, eprun *E, const moe_opts *o, xte_stream st,
                          ep_times *tm) {
  double tmine[NSTEP + 1];
  int64_t mine[2];
  int it, i;
  for (it = 0; it < o->warmup + o->iters; it++) {
    MPI_Barrier(MPI_COMM_WORLD);
    ep_step(P, E, st, it >= o->warmup);
  }
  for (i = 0; i < NSTEP; i++) tmine[i] = E->t[i] / o->iters;
  tmine[NSTEP] = 0;
  for (i = 0; i < NSTEP; i++) tmine[NSTEP] += tmine[i];
  MPI_Reduce(tmine, tm->tmax, NSTEP + 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(E->bytes, tm->bsum, NSTEP, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  mine[0] = E->Tr;
  mine[1] = E->c.recv_rows;
  tm->rows = NULL;
  if (g_rank == 0) tm->rows = (int64_t *)zalloc((size_t)g_size * 2 * 8);
  MPI_Gather(mine, 2, MPI_INT64_T, tm->rows, 2, MPI_INT64_T, 0, MPI_COMM_WORLD);
}

/* Every rank compares its items with the one-process bytes; gres (rank 0): per rank and item
 * the differing elements and the first one. Returns 1 when every rank matched. */
static int ep_byte_check(const problem *P, const eprun *E, const refrun *Q, int nitems,
                         int64_t **gres) {
  int64_t res[2 * NITEM];
  uint8_t *buf = (uint8_t *)zalloc(CHUNK);
  int i, pass = 1;
  if (g_rank == 0) send_items(P, Q, nitems);
  for (i = 0; i < NITEM; i++) {
    res[2 * i] = 0;
    res[2 * i + 1] = -1;
    if (i < nitems) check_item(P, E, Q, i, res + 2 * i, buf);
  }
  *gres = NULL;
  if (g_rank == 0) *gres = (int64_t *)zalloc((size_t)g_size * 2 * NITEM * 8);
  MPI_Gather(res, 2 * NITEM, MPI_INT64_T, *gres, 2 * NITEM, MPI_INT64_T, 0, MPI_COMM_WORLD);
  for (i = 0; i < NITEM; i++) pass &= res[2 * i] == 0;
  MPI_Allreduce(MPI_IN_PLACE, &pass, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return pass;
}

/* Rank 0: the header, the step table and the byte-check table. */
static void ep_report(const problem *P, const eprun *E, const refrun *Q, const moe_opts *o,
                      const char *fault, const ep_times *tm, const int64_t *gres, int nitems,
                      int pass) {
  const char *tr = "?";
  double tot_bytes = 0;
  int i, r;
  xte_ep_group_info(E->g, NULL, NULL, &tr);
  printf(
      "xte moe --ep %d: %d ranks (%s), %lld routed experts (%lld per rank), %lld tokens "
      "(%lld to %lld per rank), hidden %lld, FFN %lld, top-%lld, %s, %s, GEMM mode %s\n",
      P->N, P->N, tr, (long long)P->E, (long long)P->El, (long long)P->T, (long long)(P->T / P->N),
      (long long)P->Tmax, (long long)P->H, (long long)P->F, (long long)P->k,
      moe_recipe_names[P->recipe], P->bwd ? "forward + backward" : "forward only",
      P->mode == XTE_GEMM_FAST ? "fast" : "exact");
  printf(
      "  rows travel in bf16 (the wgrad GEMMs need each expert's columnwise 128x1 "
      "quantization, formed on its rank)%s\n",
      o->shared ? "; the shared expert is data-parallel: not part of this run" : "");
  printf("  tokens / received rows (padded to %d) per rank:", ALIGN);
  for (r = 0; r < P->N; r++)
    printf(" %lld/%lld", (long long)tm->rows[2 * r], (long long)tm->rows[2 * r + 1]);
  printf("\n");
  if (fault) printf("  XTE_MOE_EP_FAULT=%s: a planted bug (the check must fail)\n", fault);
  printf("\n  %-34s %12s %16s\n", "step (synchronised, mean of iters)", "max ms", "KiB sent (all)");
  for (i = 0; i < NSTEP; i++) {
    if (!P->bwd && i >= P_COMBINE_B) break;
    if (i == P_DISPATCH || i == P_COMBINE || i == P_COMBINE_B || i == P_DISPATCH_B) {
      printf("  %-34s %12.3f %16.1f\n", step_names[i], 1e3 * tm->tmax[i],
             tm->bsum[i] / o->iters / 1024.0);
      tot_bytes += tm->bsum[i] / o->iters;
    } else {
      printf("  %-34s %12.3f %16s\n", step_names[i], 1e3 * tm->tmax[i], "");
    }
  }
  printf("  %-34s %12.3f %16.1f\n", "layer (max over ranks of the sum)", 1e3 * tm->tmax[NSTEP],
         tot_bytes / 1024.0);
  printf("  %-34s %12.3f\n\n", "one process, all experts (rank 0)", 1e3 * Q->t);
  printf("  %-28s", "byte check vs one process");
  for (r = 0; r < P->N; r++) printf(" %8s%-2d", "rank ", r);
  printf("\n");
  for (i = 0; i < nitems; i++) {
    printf("  %-28s", item_names[i]);
    for (r = 0; r < P->N; r++) {
      int64_t nd = gres[(size_t)r * 2 * NITEM + 2 * i];
      char cell[32];
      if (nd == 0)
        snprintf(cell, sizeof cell, "PASS");
      else
        snprintf(cell, sizeof cell, "FAIL(%lld)", (long long)nd);
      printf(" %10s", cell);
    }
    printf("\n");
  }
  printf("\nep check: %s (%d ranks: %s byte-equal to the one-process layer)\n",
         pass ? "PASS" : "FAIL", P->N,
         P->bwd ? "out, grad x, grad top-k weights, grad logits and the experts' weight grads"
                : "out");
  fflush(stdout);
}

int moe_ep_main(const moe_opts *o) {
  int inited = 0, we_init = 0, nitems, pass;
  problem P;
  eprun E;
  refrun Q;
  ep_times tm;
  xte_stream st = NULL;
  const char *fault = getenv("XTE_MOE_EP_FAULT");
  int64_t *gres = NULL;
  int ret = 1;

  MPI_Initialized(&inited);
  if (!inited) {
    if (MPI_Init(NULL, NULL) != MPI_SUCCESS) {
      fprintf(stderr, "xte moe --ep: MPI_Init failed\n");
      return 1;
    }
    we_init = 1;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (ep_usage(o, fault)) {
    ret = 2;
    goto done;
  }
  if (o->isa >= 0) OK("--isa", xte_cpu_set_isa((xte_cpu_isa)o->isa));
  {
    int th = o->threads;
    if (th <= 0) th = xte_cpu_get_num_threads() / g_size;
    OK("--threads", xte_cpu_set_num_threads(th > 0 ? th : 1));
  }
  OK("CPU stream", xte_stream_create(XTE_BACKEND_CPU, 0, NULL, &st));

  problem_make(&P, o);
  ep_setup(&P, &E, !fault ? 0 : strcmp(fault, "weights") == 0 ? 1 : 2, st);
  ep_timed_runs(&P, &E, o, st, &tm);
  memset(&Q, 0, sizeof Q);
  if (g_rank == 0) {
    if (!o->quiet) fprintf(stderr, "xte moe --ep: the one-process layer on rank 0 ...\n");
    ref_run(&P, &Q, st);
  }
  nitems = P.bwd ? NITEM : 1;
  pass = ep_byte_check(&P, &E, &Q, nitems, &gres);
  if (g_rank == 0) ep_report(&P, &E, &Q, o, fault, &tm, gres, nitems, pass);
  ret = pass ? 0 : 1;
  xte_ep_group_destroy(E.g);

done:
  if (st) xte_stream_destroy(st);
  free_all();
  if (we_init) MPI_Finalize();
  return ret;
}

#endif /* XTE_HAVE_MPI */
