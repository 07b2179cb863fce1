/* Cases of the table of valid calls (calls_cases.h): token movement (permute, unpermute, sort
 * chunks, dispatch layout); SwiGLU. */
#define _POSIX_C_SOURCE 200809L
#include "calls_cases.h"

/* ------------------------------------------------------------------ token movement */

enum {
  P_ROWS,
  P_PERMUTE,
  P_UNPERMUTE,
  P_PERMUTE_BWD,
  P_UNPERMUTE_BWD,
  P_SORT,
  P_SORT_BWD,
  P_LAYOUT
};

typedef struct p_state {
  int op;
  xte_tensor map, idx, input, input_scales, output, output_scales, row_map, probs, grad_in,
      grad_probs, split, sorted;
  xte_moe_routing routing;
  xte_permute_config cfg;
  xte_permute_outputs extra;
  int64_t *rows, E;
  int ranks, fp8;
} p_state;

xte_status perm_run(calls_ctx *c) {
  p_state *s = (p_state *)c->state;
  switch (s->op) {
    case P_ROWS:
      return xte_moe_permute_rows(&s->routing, &s->cfg, s->rows, NULL);
    case P_PERMUTE:
      return xte_moe_permute(&s->input, s->fp8 ? &s->input_scales : NULL, &s->routing, &s->cfg,
                             &s->output, s->fp8 ? &s->output_scales : NULL, &s->row_map, &s->extra,
                             NULL);
    case P_UNPERMUTE:
      return xte_moe_unpermute(&s->input, &s->routing, &s->row_map, &s->probs, &s->output, NULL);
    case P_PERMUTE_BWD:
      return xte_moe_permute_backward(&s->input, &s->routing, &s->row_map, &s->output, NULL);
    case P_UNPERMUTE_BWD:
      return xte_moe_unpermute_backward(&s->grad_in, &s->input, &s->routing, &s->row_map, &s->probs,
                                        &s->output, &s->grad_probs, NULL);
    case P_SORT:
      return xte_moe_sort_chunks_by_index(&s->input, &s->split, &s->sorted, &s->output, &s->row_map,
                                          NULL);
    case P_SORT_BWD:
      return xte_moe_sort_chunks_backward(&s->input, &s->row_map, &s->output, NULL);
    default:
      return xte_moe_dispatch_layout(&s->idx, s->E, s->ranks, &s->extra.tokens_per_expert,
                                     &s->extra.expert_offsets, &s->output, NULL);
  }
}

/* A routing of T tokens over E experts, k distinct experts each; with topk_idx (use_map = 0)
 * about one slot in 7 is -1. */
static int gen_routing(calls_ctx *c, p_state *s, int64_t T, int64_t E, int k, int use_map,
                       xte_dtype idx_dt) {
  uint8_t *map;
  void *idx;
  int64_t t;
  int j, i;
  map = (uint8_t *)calls_alloc(c, (size_t)(T * E));
  idx = calls_alloc(c, 8 * (size_t)(T * k));
  if (!map || !idx) return fail(c, "out of buffer slots");
  for (t = 0; t < T; t++) {
    int64_t sel[16];
    for (j = 0; j < k; j++) {
      int64_t e;
      int dup;
      do {
        e = (int64_t)(rnd(c) % (uint32_t)E);
        dup = 0;
        for (i = 0; i < j; i++) dup |= sel[i] == e;
      } while (dup);
      sel[j] = e;
      map[t * E + e] = 1;
      if (!use_map && rnd(c) % 7 == 0) e = -1;
      if (idx_dt == XTE_DTYPE_INT32)
        ((int32_t *)idx)[t * k + j] = (int32_t)e;
      else
        ((int64_t *)idx)[t * k + j] = e;
    }
  }
  s->map = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E);
  s->idx = xte_tensor_2d(idx, idx_dt, T, k);
  s->routing.routing_map = use_map ? &s->map : NULL;
  s->routing.topk_idx = use_map ? NULL : &s->idx;
  s->routing.num_experts = E;
  s->E = E;
  s->cfg = xte_permute_config_default();
  s->cfg.num_out_tokens = -1;
  s->cfg.align = 1;
  return 0;
}

#define PT 300
#define PE 16
#define PK 4
#define PH 256

int setup_permute_rows_map(calls_ctx *c) {
  STATE(p_state);
  s->op = P_ROWS;
  if (gen_routing(c, s, PT, PE, PK, 1, XTE_DTYPE_INT64)) return 1;
  ALLOC(s->rows, int64_t, 1);
  calls_output(c, s->rows, 8, "rows");
  return 0;
}

int setup_permute_rows_topk_align(calls_ctx *c) {
  STATE(p_state);
  s->op = P_ROWS;
  if (gen_routing(c, s, PT, PE, PK, 0, XTE_DTYPE_INT64)) return 1;
  s->cfg.num_out_tokens = 900;
  s->cfg.align = 16;
  ALLOC(s->rows, int64_t, 1);
  calls_output(c, s->rows, 8, "rows");
  return 0;
}

/* permute: map + bf16 (no cap) or topk_idx int32 + e4m3 with scales, cap and align 16 */
static int permute_setup(calls_ctx *c, int use_map) {
  int64_t R, OR;
  xte_dtype dt = use_map ? XTE_DTYPE_BF16 : XTE_DTYPE_E4M3;
  void *x;
  STATE(p_state);
  s->op = P_PERMUTE;
  if (gen_routing(c, s, PT, PE, PK, use_map, use_map ? XTE_DTYPE_INT64 : XTE_DTYPE_INT32)) return 1;
  if (!use_map) {
    s->cfg.num_out_tokens = 900;
    s->cfg.align = 16;
  }
  TRY_X(xte_moe_permute_rows(&s->routing, &s->cfg, &R, NULL));
  OR = R + 5;
  x = data(c, dt, PT * PH, 2.0f, 1);
  if (!x) return fail(c, "out of buffer slots");
  s->input = xte_tensor_2d(x, dt, PT, PH);
  if (!use_map) {
    void *xs = data(c, XTE_DTYPE_FP32, PT * 2, 1.0f, 0);
    if (!xs) return fail(c, "out of buffer slots");
    s->fp8 = 1;
    s->input_scales = xte_tensor_2d(xs, XTE_DTYPE_FP32, PT, 2);
    if (out2d(c, &s->output_scales, XTE_DTYPE_FP32, OR, 2, "output_scales")) return 1;
  }
  memset(&s->extra, 0, sizeof s->extra);
  return out2d(c, &s->output, dt, OR, PH, "output") ||
         out2d(c, &s->row_map, XTE_DTYPE_INT32, PT, PK, "row_map") ||
         out2d(c, &s->extra.expert_offsets, XTE_DTYPE_INT64, PE + 1, 0, "expert_offsets") ||
         out2d(c, &s->extra.tokens_per_expert, use_map ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64, PE, 0,
               "tokens_per_expert") ||
         out2d(c, &s->extra.row_to_expert, XTE_DTYPE_INT32, OR, 0, "row_to_expert");
}

int setup_permute_map_bf16(calls_ctx *c) {
  return permute_setup(c, 1);
}
int setup_permute_topk_e4m3_align(calls_ctx *c) {
  return permute_setup(c, 0);
}

/* The inputs of the unpermute family: a routing, a permuted tensor [R, H] of dtype dt (by a
 * permute of random tokens: its row_map), probs ([T, E] with a map, [T, k] with topk_idx). */
static int unpermute_inputs(calls_ctx *c, p_state *s, int use_map, xte_dtype dt, int64_t *R) {
  void *x, *px, *rm;
  if (gen_routing(c, s, PT, PE, PK, use_map, XTE_DTYPE_INT64)) return 1;
  TRY_X(xte_moe_permute_rows(&s->routing, &s->cfg, R, NULL));
  x = data(c, dt, PT * PH, 2.0f, 1);
  px = calls_alloc(c, xte_dtype_size(dt) * (size_t)(*R * PH));
  rm = calls_alloc(c, 4 * (size_t)(PT * PK));
  if (!x || !px || !rm) return fail(c, "out of buffer slots");
  {
    xte_tensor in = xte_tensor_2d(x, dt, PT, PH);
    s->input = xte_tensor_2d(px, dt, *R, PH);
    s->row_map = xte_tensor_2d(rm, XTE_DTYPE_INT32, PT, PK);
    TRY_X(
        xte_moe_permute(&in, NULL, &s->routing, &s->cfg, &s->input, NULL, &s->row_map, NULL, NULL));
  }
  {
    int64_t pc = use_map ? PE : PK;
    void *p = data(c, XTE_DTYPE_FP32, PT * pc, 1.0f, 0);
    if (!p) return fail(c, "out of buffer slots");
    s->probs = xte_tensor_2d(p, XTE_DTYPE_FP32, PT, pc);
  }
  return 0;
}

static int unpermute_setup(calls_ctx *c, int use_map, xte_dtype dt) {
  int64_t R;
  STATE(p_state);
  s->op = P_UNPERMUTE;
  if (unpermute_inputs(c, s, use_map, dt, &R)) return 1;
  return out2d(c, &s->output, dt, PT, PH, "out");
}

int setup_unpermute_map_fp32(calls_ctx *c) {
  return unpermute_setup(c, 1, XTE_DTYPE_FP32);
}
int setup_unpermute_topk_bf16(calls_ctx *c) {
  return unpermute_setup(c, 0, XTE_DTYPE_BF16);
}

int setup_permute_bwd_map(calls_ctx *c) {
  int64_t R;
  STATE(p_state);
  s->op = P_PERMUTE_BWD;
  if (unpermute_inputs(c, s, 1, XTE_DTYPE_FP32, &R)) return 1;
  return out2d(c, &s->output, XTE_DTYPE_FP32, PT, PH, "grad_input");
}

int setup_permute_bwd_topk_bf16(calls_ctx *c) {
  int64_t R;
  STATE(p_state);
  s->op = P_PERMUTE_BWD;
  if (unpermute_inputs(c, s, 0, XTE_DTYPE_BF16, &R)) return 1;
  return out2d(c, &s->output, XTE_DTYPE_BF16, PT, PH, "grad_input");
}

static int unpermute_bwd_setup(calls_ctx *c, int use_map, xte_dtype dt) {
  int64_t R;
  void *g;
  STATE(p_state);
  s->op = P_UNPERMUTE_BWD;
  if (unpermute_inputs(c, s, use_map, dt, &R)) return 1;
  g = data(c, dt, PT * PH, 1.0f, 0);
  if (!g) return fail(c, "out of buffer slots");
  s->grad_in = xte_tensor_2d(g, dt, PT, PH);
  return out2d(c, &s->output, dt, R, PH, "grad_input") ||
         out2d(c, &s->grad_probs, XTE_DTYPE_FP32, PT, s->probs.shape[1], "grad_probs");
}

int setup_unpermute_bwd_topk_fp32(calls_ctx *c) {
  return unpermute_bwd_setup(c, 0, XTE_DTYPE_FP32);
}
int setup_unpermute_bwd_map_bf16(calls_ctx *c) {
  return unpermute_bwd_setup(c, 1, XTE_DTYPE_BF16);
}

/* sort chunks: R = 600 rows in 12 chunks (one empty), a fixed permutation */
static int sort_inputs(calls_ctx *c, p_state *s, int64_t *R) {
  enum { NCH = 12 };
  static const int64_t sizes[NCH] = {50, 7, 0, 100, 63, 41, 90, 1, 88, 60, 30, 70};
  static const int32_t order[NCH] = {3, 11, 0, 7, 2, 9, 5, 1, 10, 4, 8, 6};
  int64_t *sp;
  int32_t *ix;
  int i;
  ALLOC(sp, int64_t, NCH);
  ALLOC(ix, int32_t, NCH);
  *R = 0;
  for (i = 0; i < NCH; i++) {
    sp[i] = sizes[i];
    ix[i] = order[i];
    *R += sizes[i];
  }
  s->split = xte_tensor_1d(sp, XTE_DTYPE_INT64, NCH);
  s->sorted = xte_tensor_1d(ix, XTE_DTYPE_INT32, NCH);
  return 0;
}

int setup_sort_chunks(calls_ctx *c) {
  int64_t R;
  void *x;
  STATE(p_state);
  s->op = P_SORT;
  if (sort_inputs(c, s, &R)) return 1;
  x = data(c, XTE_DTYPE_BF16, R * 96, 1.0f, 1);
  if (!x) return fail(c, "out of buffer slots");
  s->input = xte_tensor_2d(x, XTE_DTYPE_BF16, R, 96);
  return out2d(c, &s->output, XTE_DTYPE_BF16, R, 96, "output") ||
         out2d(c, &s->row_map, XTE_DTYPE_INT32, R, 0, "row_map");
}

int setup_sort_chunks_bwd(calls_ctx *c) {
  int64_t R;
  void *x, *y, *rm;
  STATE(p_state);
  s->op = P_SORT_BWD;
  if (sort_inputs(c, s, &R)) return 1;
  x = data(c, XTE_DTYPE_FP32, R * 96, 1.0f, 1);
  y = calls_alloc(c, 4 * (size_t)(R * 96));
  rm = calls_alloc(c, 4 * (size_t)R);
  if (!x || !y || !rm) return fail(c, "out of buffer slots");
  {
    xte_tensor in = xte_tensor_2d(x, XTE_DTYPE_FP32, R, 96), out;
    out = xte_tensor_2d(y, XTE_DTYPE_FP32, R, 96);
    s->row_map = xte_tensor_1d(rm, XTE_DTYPE_INT32, R);
    TRY_X(xte_moe_sort_chunks_by_index(&in, &s->split, &s->sorted, &out, &s->row_map, NULL));
    s->input = out; /* grad_output: the forward's output, as good as any */
  }
  return out2d(c, &s->output, XTE_DTYPE_FP32, R, 96, "grad_input");
}

int setup_dispatch_layout(calls_ctx *c) {
  const int64_t E = 64;
  STATE(p_state);
  s->op = P_LAYOUT;
  if (gen_routing(c, s, PT, E, 8, 0, XTE_DTYPE_INT64)) return 1;
  s->ranks = 8;
  return out2d(c, &s->extra.tokens_per_expert, XTE_DTYPE_INT32, s->ranks, 0, "tokens_per_rank") ||
         out2d(c, &s->extra.expert_offsets, XTE_DTYPE_INT32, E, 0, "tokens_per_expert") ||
         out2d(c, &s->output, XTE_DTYPE_UINT8, PT, s->ranks, "is_token_in_rank");
}

/* ------------------------------------------------------------------ SwiGLU */

typedef struct s_state {
  int op; /* 0 swiglu, 1 dswiglu, 2 swiglu_quantize, 3 dswiglu_quantize */
  xte_tensor in, gout, out;
  xte_qtensor q;
  xte_quant_config cfg;
  xte_dtype act;
} s_state;

xte_status swiglu_run(calls_ctx *c) {
  s_state *s = (s_state *)c->state;
  switch (s->op) {
    case 0:
      return xte_swiglu(&s->in, &s->out, NULL);
    case 1:
      return xte_dswiglu(&s->gout, &s->in, &s->out, NULL);
    case 2:
      return xte_swiglu_quantize(&s->in, s->act, &s->q, &s->cfg, NULL);
    default:
      return xte_dswiglu_quantize(&s->gout, &s->in, s->act, &s->q, &s->cfg, NULL);
  }
}

static int swiglu_setup(calls_ctx *c, int op, xte_dtype dt, xte_dtype out_dt, xte_recipe rec,
                        xte_scale_layout lay) {
  const int64_t T = 300, F = 256;
  void *x, *g;
  STATE(s_state);
  s->op = op;
  x = data(c, dt, T * 2 * F, 4.0f, 1);
  g = data(c, dt, T * F, 1.0f, 1);
  if (!x || !g) return fail(c, "out of buffer slots");
  s->in = xte_tensor_2d(x, dt, T, 2 * F);
  s->gout = xte_tensor_2d(g, dt, T, F);
  s->act = out_dt;
  s->cfg = xte_quant_config_default();
  switch (op) {
    case 0:
      return out2d(c, &s->out, out_dt, T, F, "out");
    case 1:
      return out2d(c, &s->out, out_dt, T, 2 * F, "grad_input");
    default: {
      int64_t K = op == 2 ? F : 2 * F;
      if (make_q(c, &s->q, T, K, XTE_SCALING_BLOCK_1x128, rec, lay, XTE_DTYPE_E4M3, 1, 1)) return 1;
      ALLOC(s->q.amax, float, 1);
      calls_output(c, s->q.amax, 4, "amax");
      return 0;
    }
  }
}

int setup_swiglu_fp32(calls_ctx *c) {
  return swiglu_setup(c, 0, XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_RECIPE_TE_BLOCK,
                      XTE_SCALE_LAYOUT_COMPACT);
}
int setup_dswiglu_bf16(calls_ctx *c) {
  return swiglu_setup(c, 1, XTE_DTYPE_BF16, XTE_DTYPE_BF16, XTE_RECIPE_TE_BLOCK,
                      XTE_SCALE_LAYOUT_COMPACT);
}
int setup_swiglu_quantize(calls_ctx *c) {
  return swiglu_setup(c, 2, XTE_DTYPE_BF16, XTE_DTYPE_BF16, XTE_RECIPE_TE_BLOCK,
                      XTE_SCALE_LAYOUT_TE_GEMM);
}
int setup_dswiglu_quantize(calls_ctx *c) {
  return swiglu_setup(c, 3, XTE_DTYPE_FP32, XTE_DTYPE_FP32, XTE_RECIPE_MTFP8,
                      XTE_SCALE_LAYOUT_COMPACT);
}
