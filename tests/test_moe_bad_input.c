/* Bad input to the MoE API: a clear status, a message naming the argument, and nothing written
 * (every output buffer keeps its sentinel bytes). */
#include <criterion/criterion.h>
#include <stdio.h>

#include "test_moe_util.h"

#define T 8
#define E 16

static float logits[T * E], probs[T * E], saved[T * E], w[T * 4];
static uint8_t map[T * E];
static int32_t idx[T * 4];

static void sentinel(void) {
  memset(probs, 0x77, sizeof probs);
  memset(saved, 0x77, sizeof saved);
  memset(w, 0x77, sizeof w);
  memset(map, 0x77, sizeof map);
  memset(idx, 0x77, sizeof idx);
}

static int untouched(void) {
  size_t i;
  const uint8_t *p[5] = {(const uint8_t *)probs, (const uint8_t *)saved, (const uint8_t *)w, map,
                         (const uint8_t *)idx};
  size_t n[5] = {sizeof probs, sizeof saved, sizeof w, sizeof map, sizeof idx};
  int b;
  for (b = 0; b < 5; b++)
    for (i = 0; i < n[b]; i++)
      if (p[b][i] != 0x77) return 0;
  return 1;
}

static xte_status route(xte_router_config cfg, int64_t map_cols) {
  xte_tensor lt = xte_tensor_2d(logits, XTE_DTYPE_FP32, T, E);
  xte_router_outputs out;
  memset(&out, 0, sizeof out);
  out.probs = xte_tensor_2d(probs, XTE_DTYPE_FP32, T, E);
  out.saved = xte_tensor_2d(saved, XTE_DTYPE_FP32, T, E);
  out.routing_map = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, map_cols);
  out.topk_idx =
      xte_tensor_2d(idx, XTE_DTYPE_INT32, T, cfg.topk > 0 && cfg.topk <= 4 ? cfg.topk : 4);
  out.topk_weights =
      xte_tensor_2d(w, XTE_DTYPE_FP32, T, cfg.topk > 0 && cfg.topk <= 4 ? cfg.topk : 4);
  sentinel();
  return xte_router_forward(&lt, NULL, &cfg, &out, NULL);
}

static void expect_bad(xte_status s, xte_status want, const char *needle) {
  cr_expect_eq(s, want, "status %s, want %s (%s)", xte_status_string(s), xte_status_string(want),
               xte_last_error());
  cr_expect(strstr(xte_last_error(), needle) != NULL, "message '%s' does not name '%s'",
            xte_last_error(), needle);
  cr_expect(untouched(), "an output was written on bad input");
}

Test(moe_bad_input, router_config) {
  xte_router_config c = xte_router_config_default();
  c.topk = 4;
  c.score_function = XTE_ROUTER_SIGMOID;
  cr_assert_eq(route(c, E), XTE_SUCCESS, "%s", xte_last_error());
  c.topk = E + 1; /* topk is 1..E */
  expect_bad(route(c, E), XTE_ERROR_INVALID_ARGUMENT, "topk");
  c.topk = 4;
  c.num_groups = 4;
  c.group_topk = 5;
  expect_bad(route(c, E), XTE_ERROR_INVALID_ARGUMENT, "group_topk");
  c.num_groups = 3;
  c.group_topk = 1;
  expect_bad(route(c, E), XTE_ERROR_INVALID_ARGUMENT, "num_groups");
  c.num_groups = 0;
  expect_bad(route(c, E + 1), XTE_ERROR_SHAPE, "routing_map");
  c.score_function = (xte_router_score)9;
  expect_bad(route(c, E), XTE_ERROR_INVALID_ARGUMENT, "score_function");
}

Test(moe_bad_input, topk_larger_than_experts) {
  float l[4 * 3];
  xte_tensor lt = xte_tensor_2d(l, XTE_DTYPE_FP32, 4, 3);
  xte_router_config c = xte_router_config_default();
  xte_router_outputs out;
  memset(&out, 0, sizeof out);
  sentinel();
  out.probs = xte_tensor_2d(probs, XTE_DTYPE_FP32, 4, 3);
  c.topk = 4;
  memset(l, 0, sizeof l);
  expect_bad(xte_router_forward(&lt, NULL, &c, &out, NULL), XTE_ERROR_INVALID_ARGUMENT, "topk");
}

Test(moe_bad_input, permute_bad_index_and_rows) {
  float x[T * 4], y[T * 4 * 4];
  int32_t rm[T * 4];
  int64_t ti[T * 4];
  int i;
  xte_tensor xt = xte_tensor_2d(x, XTE_DTYPE_FP32, T, 4),
             yt = xte_tensor_2d(y, XTE_DTYPE_FP32, T * 4, 4);
  xte_tensor it = xte_tensor_2d(ti, XTE_DTYPE_INT64, T, 4),
             rmt = xte_tensor_2d(rm, XTE_DTYPE_INT32, T, 4);
  xte_moe_routing r = {NULL, &it, E};
  for (i = 0; i < T * 4; i++) ti[i] = i % 4;
  memset(x, 0, sizeof x);
  memset(y, 0x77, sizeof y);
  memset(rm, 0x77, sizeof rm);
  ti[5] = E; /* out of range */
  cr_expect_eq(xte_moe_permute(&xt, NULL, &r, NULL, &yt, NULL, &rmt, NULL, NULL),
               XTE_ERROR_INVALID_ARGUMENT);
  cr_expect(strstr(xte_last_error(), "topk_idx") != NULL, "%s", xte_last_error());
  ti[5] = 0; /* duplicate of slot 4's expert 0 */
  cr_expect_eq(xte_moe_permute(&xt, NULL, &r, NULL, &yt, NULL, &rmt, NULL, NULL),
               XTE_ERROR_INVALID_ARGUMENT);
  ti[5] = 1;
  yt = xte_tensor_2d(y, XTE_DTYPE_FP32, T * 4 - 1, 4); /* one row short */
  cr_expect_eq(xte_moe_permute(&xt, NULL, &r, NULL, &yt, NULL, &rmt, NULL, NULL), XTE_ERROR_SHAPE);
  cr_expect(strstr(xte_last_error(), "output") != NULL, "%s", xte_last_error());
  rmt = xte_tensor_2d(rm, XTE_DTYPE_INT32, T, 3); /* wrong row_map shape */
  yt = xte_tensor_2d(y, XTE_DTYPE_FP32, T * 4, 4);
  cr_expect_eq(xte_moe_permute(&xt, NULL, &r, NULL, &yt, NULL, &rmt, NULL, NULL), XTE_ERROR_SHAPE);
  cr_expect(strstr(xte_last_error(), "row_map") != NULL, "%s", xte_last_error());
  for (i = 0; i < (int)sizeof y; i++) cr_assert_eq(((uint8_t *)y)[i], 0x77);
  for (i = 0; i < (int)sizeof rm; i++) cr_assert_eq(((uint8_t *)rm)[i], 0x77);
}

Test(moe_bad_input, swiglu_shapes) {
  float x[4 * 6], y[4 * 4];
  xte_tensor xt = xte_tensor_2d(x, XTE_DTYPE_FP32, 4, 5),
             yt = xte_tensor_2d(y, XTE_DTYPE_FP32, 4, 3);
  memset(y, 0x77, sizeof y);
  cr_expect_eq(xte_swiglu(&xt, &yt, NULL), XTE_ERROR_SHAPE);
  cr_expect(strstr(xte_last_error(), "input") != NULL, "%s", xte_last_error());
  xt = xte_tensor_2d(x, XTE_DTYPE_FP32, 4, 6);
  yt = xte_tensor_2d(y, XTE_DTYPE_FP32, 4, 4);
  cr_expect_eq(xte_swiglu(&xt, &yt, NULL), XTE_ERROR_SHAPE);
  cr_expect(strstr(xte_last_error(), "out") != NULL, "%s", xte_last_error());
  for (int i = 0; i < (int)sizeof y; i++) cr_assert_eq(((uint8_t *)y)[i], 0x77);
}
