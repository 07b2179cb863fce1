/* MoE suite: the router (Kimi-K2: 384 experts, top-8, sigmoid + expert bias, scaling 2.827) and
 * token movement (permute / unpermute, bf16, hidden 7168, top-8 over 64 experts) on all of xte's
 * CPU threads, each next to a streaming copy of the same bytes (the anchor).
 * Rates: bytes read + written per call.
 *  router:    logits fp32 [T, E] read; probs fp32 [T, E] + routing map [T, E] + topk_idx int32
 *             [T, 8] + topk_weights [T, 8] written.
 *  permute:   input [T, H] read, output [T k, H] written (+ row map).
 *  unpermute: input [T k, H] read, output [T, H] written (+ probs).
 * Targets (docs/numerics.md section 8): router >= 0.5 of the copy, permute / unpermute >= 0.7. */
#include <stdio.h>
#include <string.h>

#include "bench_common.h"
#include "xte/xte.h"
#include "xte_bench.h"

#define RT 16384
#define RE 384
#define RK 8
#define PT 2048
#define PH 7168
#define PE 64
#define PK 8

static float *r_logits, *r_bias, *r_probs, *r_w;
static uint8_t *r_map;
static int32_t *r_idx, *p_rm;
static int64_t *p_idx;
static uint16_t *p_x, *p_y, *p_back;
static float *p_w;

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

static void perm_alloc(void) {
  int t, j;
  if (p_x) return;
  p_x = (uint16_t *)xte_bench_alloc(2ull * PT * PH);
  p_y = (uint16_t *)xte_bench_alloc(2ull * PT * PK * PH);
  p_back = (uint16_t *)xte_bench_alloc(2ull * PT * PH);
  p_idx = (int64_t *)xte_bench_alloc(8ull * PT * PK);
  p_rm = (int32_t *)xte_bench_alloc(4ull * PT * PK);
  p_w = (float *)xte_bench_alloc(4ull * PT * PK);
  xte_bench_fill(p_x, XTE_DTYPE_BF16, (size_t)PT * PH, 9);
  for (t = 0; t < PT; t++)
    for (j = 0; j < PK; j++) {
      p_idx[t * PK + j] = (t * 7 + j * 8) % PE; /* distinct within a token */
      p_w[t * PK + j] = 0.125f;
    }
}

static void run_permute(xte_bench_state *st, void *arg) {
  xte_tensor x, y, it, rm;
  xte_moe_routing r;
  int unperm = arg != NULL;
  xte_status rc;
  perm_alloc();
  x = xte_tensor_2d(p_x, XTE_DTYPE_BF16, PT, PH);
  y = xte_tensor_2d(p_y, XTE_DTYPE_BF16, (int64_t)PT * PK, PH);
  it = xte_tensor_2d(p_idx, XTE_DTYPE_INT64, PT, PK);
  rm = xte_tensor_2d(p_rm, XTE_DTYPE_INT32, PT, PK);
  r.routing_map = NULL;
  r.topk_idx = &it;
  r.num_experts = PE;
  rc = xte_moe_permute(&x, NULL, &r, NULL, &y, NULL, &rm, NULL, NULL);
  if (rc == XTE_SUCCESS && unperm) {
    xte_tensor b = xte_tensor_2d(p_back, XTE_DTYPE_BF16, PT, PH);
    xte_tensor w = xte_tensor_2d(p_w, XTE_DTYPE_FP32, PT, PK);
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
  xte_bench_set_bytes(st, 2.0 * PT * PH + 2.0 * PT * PK * PH + 12.0 * PT * PK);
}

void xte_bench_suite_moe(void) {
  static int registered;
  const char *ra, *pa;
  if (registered) return;
  registered = 1;
  /* anchors: a copy of the same bytes (half read, half written) */
  ra = xte_bench_register_copy("moe/router", (size_t)(router_bytes() / 2));
  pa = xte_bench_register_copy("moe/permute", (size_t)((2.0 * PT * PH + 2.0 * PT * PK * PH) / 2));
  xte_bench_register("moe/router/kimi-k2/T16384", ra, "GB/s", run_router, NULL);
  xte_bench_register("moe/permute/bf16/H7168/top8", pa, "GB/s", run_permute, NULL);
  xte_bench_register("moe/unpermute/bf16/H7168/top8", pa, "GB/s", run_permute, (void *)1);
}
