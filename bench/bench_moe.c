/* MoE suite: the router (Kimi-K2: 384 experts, top-8, sigmoid + expert bias, scaling 2.827) and
 * token movement (permute / unpermute, bf16, hidden 7168, top-8 over 64 experts) on all of xte's
 * CPU threads, each next to a streaming copy of the same bytes (the anchor).
 * Rates: bytes read + written per call.
 *  router:    logits fp32 [T, E] read; probs fp32 [T, E] + routing map [T, E] + topk_idx int32
 *             [T, 8] + topk_weights [T, 8] written.
 *  permute:   input [T, H] read, output [T k, H] written (+ row map).
 *  unpermute: input [T k, H] read, output [T, H] written (+ probs).
 * Permute / unpermute run at T = 2048 tokens and at "dram": as many tokens as make the bytes
 * moved 4 x the last-level cache read at run time (xte_bench_dram_bytes()), each beside a copy
 * of its own bytes.
 *  SwiGLU (Kimi-K2's expert FFN 2048, T = 4096 rows, bf16): forward input [T, 2F] read, output
 *             [T, F] written; backward grad_out [T, F] + input [T, 2F] read, grad_input [T, 2F]
 *             written; the fused quantize variants (bf16 activation, TE_BLOCK 1x128, rowwise and
 *             transposed columnwise e4m3 copies) write the two e4m3 copies and their fp32 scales.
 * Targets (docs/performance.md, MoE): router >= 0.5 of the copy, permute / unpermute >= 0.7,
 * SwiGLU / dSwiGLU (+ quantize) >= 0.5. */
#include <stdio.h>
#include <string.h>

#include "bench_common.h"
#include "bench_gpu.h"
#include "xte/xte.h"
#include "xte_bench.h"

#define RT 16384
#define RE 384
#define RK 8
#define PH 7168
#define PE 64
#define PK 8

static float *r_logits, *r_bias, *r_probs, *r_w;
static uint8_t *r_map;
static int32_t *r_idx;

/* a permute size: T tokens, buffers allocated on first use */
typedef struct psize {
  int64_t T;
  int32_t *rm;
  int64_t *idx;
  uint16_t *x, *y, *back;
  float *w;
} psize;
static psize psizes[2] = {{2048, NULL, NULL, NULL, NULL, NULL, NULL},
                          {0, NULL, NULL, NULL, NULL, NULL, NULL}}; /* [1]: dram, set at run time */

typedef struct pcase {
  psize *sz;
  int unperm;
} pcase;
static pcase pcases[4];

static void router_alloc(void) {
  if (r_logits) return;
  r_logits = (float *)xte_bench_alloc(4ull * RT * RE);
  r_bias = (float *)xte_bench_alloc(4ull * RE);
  r_probs = (float *)xte_bench_alloc(4ull * RT * RE);
  r_w = (float *)xte_bench_alloc(4ull * RT * RK);
  r_map = (uint8_t *)xte_bench_alloc(1ull * RT * RE);
  r_idx = (int32_t *)xte_bench_alloc(4ull * RT * RK);
  xte_bench_fill_f32(r_logits, (size_t)RT * RE, 7);
  xte_bench_fill_f32(r_bias, RE, 8);
}

static double router_bytes(void) {
  return 4.0 * RT * RE + 4.0 * RT * RE + 1.0 * RT * RE + 8.0 * RT * RK;
}

static void run_router(xte_bench_state *st, void *arg) {
  xte_tensor lt, bt;
  xte_router_config c = xte_router_config_default();
  xte_router_outputs o;
  xte_status rc;
  (void)arg;
  router_alloc();
  lt = xte_tensor_2d(r_logits, XTE_DTYPE_FP32, RT, RE);
  bt = xte_tensor_1d(r_bias, XTE_DTYPE_FP32, RE);
  c.topk = RK;
  c.score_function = XTE_ROUTER_SIGMOID;
  c.scaling_factor = 2.827f;
  memset(&o, 0, sizeof o);
  o.probs = xte_tensor_2d(r_probs, XTE_DTYPE_FP32, RT, RE);
  o.routing_map = xte_tensor_2d(r_map, XTE_DTYPE_UINT8, RT, RE);
  o.topk_idx = xte_tensor_2d(r_idx, XTE_DTYPE_INT32, RT, RK);
  o.topk_weights = xte_tensor_2d(r_w, XTE_DTYPE_FP32, RT, RK);
  rc = xte_router_forward(&lt, &bt, &c, &o, NULL);
  if (rc != XTE_SUCCESS) {
    xte_bench_fail(st, xte_last_error());
    while (xte_bench_keep_running(st)) {
    }
    return;
  }
  while (xte_bench_keep_running(st)) (void)xte_router_forward(&lt, &bt, &c, &o, NULL);
  xte_bench_set_bytes(st, router_bytes());
}

static void perm_alloc(psize *p) {
  const size_t T = (size_t)p->T;
  size_t t, j;
  if (p->x) return;
  p->x = (uint16_t *)xte_bench_alloc(2ull * T * PH);
  p->y = (uint16_t *)xte_bench_alloc(2ull * T * PK * PH);
  p->back = (uint16_t *)xte_bench_alloc(2ull * T * PH);
  p->idx = (int64_t *)xte_bench_alloc(8ull * T * PK);
  p->rm = (int32_t *)xte_bench_alloc(4ull * T * PK);
  p->w = (float *)xte_bench_alloc(4ull * T * PK);
  xte_bench_fill(p->x, XTE_DTYPE_BF16, T * PH, 9);
  for (t = 0; t < T; t++)
    for (j = 0; j < PK; j++) {
      p->idx[t * PK + j] = (int64_t)((t * 7 + j * 8) % PE); /* distinct within a token */
      p->w[t * PK + j] = 0.125f;
    }
}

/* bytes a permute moves (read + written): input [T, H] + output [T k, H], bf16 */
static double perm_copy_bytes(int64_t T) {
  return 2.0 * (double)T * PH + 2.0 * (double)T * PK * PH;
}

static void run_permute(xte_bench_state *st, void *arg) {
  const pcase *pc = (const pcase *)arg;
  psize *p = pc->sz;
  const int64_t PT = p->T;
  xte_tensor x, y, it, rm;
  xte_moe_routing r;
  int unperm = pc->unperm;
  xte_status rc;
  perm_alloc(p);
  x = xte_tensor_2d(p->x, XTE_DTYPE_BF16, PT, PH);
  y = xte_tensor_2d(p->y, XTE_DTYPE_BF16, (int64_t)PT * PK, PH);
  it = xte_tensor_2d(p->idx, XTE_DTYPE_INT64, PT, PK);
  rm = xte_tensor_2d(p->rm, XTE_DTYPE_INT32, PT, PK);
  r.routing_map = NULL;
  r.topk_idx = &it;
  r.num_experts = PE;
  rc = xte_moe_permute(&x, NULL, &r, NULL, &y, NULL, &rm, NULL, NULL);
  if (rc == XTE_SUCCESS && unperm) {
    xte_tensor b = xte_tensor_2d(p->back, XTE_DTYPE_BF16, PT, PH);
    xte_tensor w = xte_tensor_2d(p->w, XTE_DTYPE_FP32, PT, PK);
    rc = xte_moe_unpermute(&y, &r, &rm, &w, &b, NULL);
    while (rc == XTE_SUCCESS && xte_bench_keep_running(st))
      (void)xte_moe_unpermute(&y, &r, &rm, &w, &b, NULL);
  } else {
    while (rc == XTE_SUCCESS && xte_bench_keep_running(st))
      (void)xte_moe_permute(&x, NULL, &r, NULL, &y, NULL, &rm, NULL, NULL);
  }
  if (rc != XTE_SUCCESS) {
    xte_bench_fail(st, xte_last_error());
    while (xte_bench_keep_running(st)) {
    }
    return;
  }
  xte_bench_set_bytes(st, perm_copy_bytes(PT) + 12.0 * (double)PT * PK);
}

/* ---------------------------------------------------------------- SwiGLU */
#define ST 4096
#define SF 2048

static uint16_t *s_x, *s_dy, *s_out;
static uint8_t *s_rq, *s_cq;
static float *s_rs, *s_cs;

static void swiglu_alloc(void) {
  if (s_x) return;
  s_x = (uint16_t *)xte_bench_alloc(2ull * ST * 2 * SF);
  s_dy = (uint16_t *)xte_bench_alloc(2ull * ST * SF);
  s_out = (uint16_t *)xte_bench_alloc(2ull * ST * 2 * SF);
  s_rq = (uint8_t *)xte_bench_alloc(1ull * ST * 2 * SF);
  s_cq = (uint8_t *)xte_bench_alloc(1ull * ST * 2 * SF);
  s_rs = (float *)xte_bench_alloc(4ull * ST * (2 * SF / 128));
  s_cs = (float *)xte_bench_alloc(4ull * (ST / 128) * 2 * SF);
  xte_bench_fill(s_x, XTE_DTYPE_BF16, (size_t)ST * 2 * SF, 11);
  xte_bench_fill(s_dy, XTE_DTYPE_BF16, (size_t)ST * SF, 12);
}

/* kind: 0 swiglu, 1 dswiglu, 2 swiglu_quantize, 3 dswiglu_quantize */
static double swiglu_bytes(int kind) {
  const double TF = (double)ST * SF, K = kind % 2 ? 2.0 : 1.0; /* output columns / F */
  const double in = kind % 2 ? 6.0 * TF : 4.0 * TF;
  if (kind < 2) return in + 2.0 * K * TF;
  return in + 2.0 * K * TF + 4.0 * K * TF / 128.0 * 2.0; /* two e4m3 copies + scales */
}

static void swiglu_scales(xte_scale_tensor *t, float *data, int64_t rows, int64_t cols) {
  t->data = data;
  t->dtype = XTE_DTYPE_FP32;
  t->rows = rows;
  t->cols = cols;
  t->layout = XTE_SCALE_LAYOUT_COMPACT;
}

/* TE_BLOCK 1x128 e4m3 of [ST, K]: rowwise and transposed columnwise, COMPACT scales */
static void swiglu_q(xte_qtensor *q, int64_t K) {
  int64_t sr = 0, sc = 0;
  memset(q, 0, sizeof *q);
  q->scaling_mode = XTE_SCALING_BLOCK_1x128;
  q->recipe = XTE_RECIPE_TE_BLOCK;
  (void)xte_quantize_scale_shape(ST, K, q->scaling_mode, q->recipe, XTE_SCALE_LAYOUT_COMPACT, 0,
                                 &sr, &sc);
  q->rowwise = xte_tensor_2d(s_rq, XTE_DTYPE_E4M3, ST, K);
  swiglu_scales(&q->rowwise_scale_inv, s_rs, sr, sc);
  (void)xte_quantize_scale_shape(ST, K, q->scaling_mode, q->recipe, XTE_SCALE_LAYOUT_COMPACT, 1,
                                 &sr, &sc);
  q->columnwise = xte_tensor_2d(s_cq, XTE_DTYPE_E4M3, K, ST);
  swiglu_scales(&q->columnwise_scale_inv, s_cs, sr, sc);
}

static xte_status swiglu_call(int kind, xte_tensor *x, xte_tensor *dy, xte_tensor *o,
                              xte_qtensor *q) {
  switch (kind) {
    case 0:
      return xte_swiglu(x, o, NULL);
    case 1:
      return xte_dswiglu(dy, x, o, NULL);
    case 2:
      return xte_swiglu_quantize(x, XTE_DTYPE_BF16, q, NULL, NULL);
    default:
      return xte_dswiglu_quantize(dy, x, XTE_DTYPE_BF16, q, NULL, NULL);
  }
}

static const int swiglu_kinds[4] = {0, 1, 2, 3};

static void run_swiglu(xte_bench_state *st, void *arg) {
  const int kind = *(const int *)arg;
  const int64_t K = kind % 2 ? 2 * SF : SF;
  xte_tensor x, dy, o;
  xte_qtensor q;
  xte_status rc;
  swiglu_alloc();
  x = xte_tensor_2d(s_x, XTE_DTYPE_BF16, ST, 2 * SF);
  dy = xte_tensor_2d(s_dy, XTE_DTYPE_BF16, ST, SF);
  o = xte_tensor_2d(s_out, XTE_DTYPE_BF16, ST, K);
  swiglu_q(&q, K);
  rc = swiglu_call(kind, &x, &dy, &o, &q);
  if (rc != XTE_SUCCESS) {
    xte_bench_fail(st, xte_last_error());
    while (xte_bench_keep_running(st)) {
    }
    return;
  }
  while (xte_bench_keep_running(st)) (void)swiglu_call(kind, &x, &dy, &o, &q);
  xte_bench_set_bytes(st, swiglu_bytes(kind));
}

void xte_bench_suite_moe(void) {
  static const char *const snames[4] = {
      "moe/swiglu/bf16/T4096/F2048", "moe/dswiglu/bf16/T4096/F2048",
      "moe/swiglu_quantize/bf16/T4096/F2048", "moe/dswiglu_quantize/bf16/T4096/F2048"};
  static const char *const slabels[4] = {"moe/swiglu", "moe/dswiglu", "moe/swiglu_quantize",
                                         "moe/dswiglu_quantize"};
  static int registered;
  static char names[4][96];
  const char *ra, *pa = NULL;
  int i;
  if (registered) return;
  registered = 1;
  /* dram: the bytes moved (read + written) 4 x the last-level cache */
  psizes[1].T = (int64_t)((double)xte_bench_dram_bytes() / perm_copy_bytes(1)) + 1;
  /* anchors: a copy of the same bytes (half read, half written) */
  ra = xte_bench_register_copy("moe/router", (size_t)(router_bytes() / 2));
  xte_bench_register("moe/router/kimi-k2/T16384", ra, "GB/s", run_router, NULL);
  for (i = 0; i < 4; i++) {
    pcase *c = &pcases[i];
    const char *tag = i / 2 ? "/dram" : "";
    c->sz = &psizes[i / 2];
    c->unperm = i % 2;
    if (c->unperm == 0)
      pa = xte_bench_register_copy(i / 2 ? "moe/permute/dram" : "moe/permute",
                                   (size_t)(perm_copy_bytes(c->sz->T) / 2));
    snprintf(names[i], sizeof names[i], "moe/%s/bf16/H7168/top8%s",
             c->unperm ? "unpermute" : "permute", tag);
    xte_bench_register(names[i], pa, "GB/s", run_permute, c);
  }
  /* SwiGLU, each beside a copy of its own bytes */
  for (i = 0; i < 4; i++)
    xte_bench_register(snames[i],
                       xte_bench_register_copy(slabels[i], (size_t)(swiglu_bytes(i) / 2)), "GB/s",
                       run_swiglu, (void *)&swiglu_kinds[i]);
}

/* ---------------------------------------------------------------- CUDA (--backend cuda)
 * The same operations on the CUDA backend (bench/bench_gpu.h): the router at Kimi-K2's shape
 * (T = 16384, 384 experts, top-8, sigmoid + bias, scaling 2.827) and permute / unpermute (bf16,
 * hidden 7168, top-8 over 64 experts) at T = 2048 and 16384, the same byte counts as above; each
 * beside a device-to-device copy of its bytes, CUDA events, the L2 flushed before every
 * iteration. Permute and unpermute check their routing on the device and read the verdict back
 * before writing (src/cuda/moe.cu): that wait is inside the timed interval, as a caller sees it.
 * --smoke: T = 40 (router: 64 experts), hidden 256. */
typedef struct gmoe {
  int64_t T, E, K, H; /* router: T, E, K; permute: T, H (E = PE, K = PK) */
  int kind;           /* 0 router, 1 permute, 2 unpermute */
  /* device buffers */
  float *logits, *bias, *probs, *w;
  uint8_t *map;
  int32_t *idx32, *rm;
  int64_t *idx;
  uint16_t *x, *y, *back;
  xte_tensor t_in, t_bias, t_out, t_idx, t_rm, t_w;
  xte_router_config rc;
  xte_router_outputs ro;
  xte_moe_routing r;
} gmoe;

static gmoe gm_cases[5];

/* n random fp32 / bf16 on the host, copied to dev; 0 ok */
static int gm_put_random(void *dev, xte_dtype dt, size_t n, uint64_t seed, char *why, size_t wn) {
  void *h = xte_bench_alloc(n * xte_dtype_size(dt));
  int rc;
  xte_bench_fill(h, dt, n, seed);
  rc = xte_gpu_upload(dev, h, n * xte_dtype_size(dt));
  if (rc != 0) snprintf(why, wn, "upload: %s", xte_last_error());
  xte_bench_free(h);
  return rc;
}

static xte_status gm_run(void *arg) {
  gmoe *c = (gmoe *)arg;
  xte_stream s = xte_gpu_stream();
  if (c->kind == 0) return xte_router_forward(&c->t_in, &c->t_bias, &c->rc, &c->ro, s);
  if (c->kind == 1)
    return xte_moe_permute(&c->t_in, NULL, &c->r, NULL, &c->t_out, NULL, &c->t_rm, NULL, s);
  return xte_moe_unpermute(&c->t_in, &c->r, &c->t_rm, &c->t_w, &c->t_out, s);
}

static int gm_setup(void *arg, char *why, size_t wn) {
  gmoe *c = (gmoe *)arg;
  const size_t T = (size_t)c->T;
  xte_status st;
  if (c->kind == 0) {
    const size_t E = (size_t)c->E, K = (size_t)c->K;
    c->logits = (float *)xte_gpu_alloc(4 * T * E);
    c->bias = (float *)xte_gpu_alloc(4 * E);
    c->probs = (float *)xte_gpu_alloc(4 * T * E);
    c->map = (uint8_t *)xte_gpu_alloc(T * E);
    c->idx32 = (int32_t *)xte_gpu_alloc(4 * T * K);
    c->w = (float *)xte_gpu_alloc(4 * T * K);
    if (!c->logits || !c->bias || !c->probs || !c->map || !c->idx32 || !c->w) {
      snprintf(why, wn, "device buffers: %s", xte_last_error());
      return -1;
    }
    if (gm_put_random(c->logits, XTE_DTYPE_FP32, T * E, 7, why, wn) != 0 ||
        gm_put_random(c->bias, XTE_DTYPE_FP32, E, 8, why, wn) != 0)
      return -1;
    c->t_in = xte_tensor_2d(c->logits, XTE_DTYPE_FP32, c->T, c->E);
    c->t_bias = xte_tensor_1d(c->bias, XTE_DTYPE_FP32, c->E);
    c->rc = xte_router_config_default();
    c->rc.topk = (int)c->K;
    c->rc.score_function = XTE_ROUTER_SIGMOID;
    c->rc.scaling_factor = 2.827f;
    memset(&c->ro, 0, sizeof c->ro);
    c->ro.probs = xte_tensor_2d(c->probs, XTE_DTYPE_FP32, c->T, c->E);
    c->ro.routing_map = xte_tensor_2d(c->map, XTE_DTYPE_UINT8, c->T, c->E);
    c->ro.topk_idx = xte_tensor_2d(c->idx32, XTE_DTYPE_INT32, c->T, c->K);
    c->ro.topk_weights = xte_tensor_2d(c->w, XTE_DTYPE_FP32, c->T, c->K);
  } else {
    const size_t H = (size_t)c->H;
    int64_t *hidx = (int64_t *)xte_bench_alloc(8 * T * PK);
    float *hw = (float *)xte_bench_alloc(4 * T * PK);
    size_t t, j;
    int bad;
    for (t = 0; t < T; t++)
      for (j = 0; j < PK; j++) {
        hidx[t * PK + j] = (int64_t)((t * 7 + j * 8) % PE); /* distinct within a token */
        hw[t * PK + j] = 0.125f;
      }
    c->x = (uint16_t *)xte_gpu_alloc(2 * T * H);
    c->y = (uint16_t *)xte_gpu_alloc(2 * T * PK * H);
    c->back = (uint16_t *)xte_gpu_alloc(2 * T * H);
    c->idx = (int64_t *)xte_gpu_alloc(8 * T * PK);
    c->rm = (int32_t *)xte_gpu_alloc(4 * T * PK);
    c->w = (float *)xte_gpu_alloc(4 * T * PK);
    bad = !c->x || !c->y || !c->back || !c->idx || !c->rm || !c->w;
    if (bad) snprintf(why, wn, "device buffers: %s", xte_last_error());
    if (!bad && (xte_gpu_upload(c->idx, hidx, 8 * T * PK) != 0 ||
                 xte_gpu_upload(c->w, hw, 4 * T * PK) != 0)) {
      snprintf(why, wn, "upload: %s", xte_last_error());
      bad = 1;
    }
    xte_bench_free(hidx);
    xte_bench_free(hw);
    if (bad || gm_put_random(c->x, XTE_DTYPE_BF16, T * H, 9, why, wn) != 0) return -1;
    c->t_idx = xte_tensor_2d(c->idx, XTE_DTYPE_INT64, c->T, PK);
    c->r.routing_map = NULL;
    c->r.topk_idx = &c->t_idx;
    c->r.num_experts = PE;
    c->t_rm = xte_tensor_2d(c->rm, XTE_DTYPE_INT32, c->T, PK);
    c->t_w = xte_tensor_2d(c->w, XTE_DTYPE_FP32, c->T, PK);
    /* the permute first (the unpermute reads its output and row map) */
    c->t_in = xte_tensor_2d(c->x, XTE_DTYPE_BF16, c->T, c->H);
    c->t_out = xte_tensor_2d(c->y, XTE_DTYPE_BF16, c->T * PK, c->H);
    st = xte_moe_permute(&c->t_in, NULL, &c->r, NULL, &c->t_out, NULL, &c->t_rm, NULL,
                         xte_gpu_stream());
    if (st != XTE_SUCCESS) {
      snprintf(why, wn, "xte_moe_permute: %s: %s", xte_status_string(st), xte_last_error());
      return -1;
    }
    if (c->kind == 2) {
      c->t_in = xte_tensor_2d(c->y, XTE_DTYPE_BF16, c->T * PK, c->H);
      c->t_out = xte_tensor_2d(c->back, XTE_DTYPE_BF16, c->T, c->H);
    }
  }
  st = gm_run(c);
  if (st == XTE_SUCCESS && xte_gpu_sync() != 0) st = XTE_ERROR_DEVICE;
  if (st != XTE_SUCCESS) {
    snprintf(why, wn, "%s: %s: %s", c->kind == 0 ? "xte_router_forward" : "token movement",
             xte_status_string(st), xte_last_error());
    return -1;
  }
  return 0;
}

void xte_bench_gpu_suite_moe(void) {
  static int registered;
  const int smoke = xte_gpu_smoke();
  const int64_t H = smoke ? 256 : PH, Ts[2] = {smoke ? 40 : 2048, 16384};
  int i, n = 0;
  gmoe *c;
  char name[128];
  double bytes;
  if (registered) return;
  registered = 1;
  c = &gm_cases[n++];
  c->kind = 0;
  c->T = smoke ? 40 : RT;
  c->E = smoke ? 64 : RE;
  c->K = RK;
  bytes =
      4.0 * (double)(c->T * c->E) * 2 + 1.0 * (double)(c->T * c->E) + 8.0 * (double)(c->T * c->K);
  snprintf(name, sizeof name, "moe/router/%s/T%lld", smoke ? "E64-top8" : "kimi-k2",
           (long long)c->T);
  xte_gpu_register(name, xte_gpu_register_copy(bytes), "GB/s", bytes, gm_setup, gm_run, c);
  for (i = 0; i < (smoke ? 2 : 4); i++) {
    c = &gm_cases[n++];
    c->kind = 1 + i % 2;
    c->T = Ts[i / 2];
    c->H = H;
    bytes = 2.0 * (double)(c->T * H) + 2.0 * (double)(c->T * PK * H) + 12.0 * (double)(c->T * PK);
    snprintf(name, sizeof name, "moe/%s/bf16/H%lld/top8/T%lld",
             c->kind == 1 ? "permute" : "unpermute", (long long)H, (long long)c->T);
    xte_gpu_register(name, xte_gpu_register_copy(bytes), "GB/s", bytes, gm_setup, gm_run, c);
  }
}
