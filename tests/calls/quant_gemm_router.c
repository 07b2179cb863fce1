/* Cases of the table of valid calls (calls_cases.h): quantize, dequantize, cast; GEMM (dense,
 * grouped); router and aux loss. */
#define _POSIX_C_SOURCE 200809L
#include "calls_cases.h"

/* ------------------------------------------------------------------ quantize, dequantize, cast */

typedef struct q_state {
  xte_tensor in, out;
  xte_qtensor q;
  xte_quant_config cfg;
  int columnwise, saturate;
} q_state;

static int quant_setup(calls_ctx *c, int64_t M, int64_t K, xte_dtype in_dt, int specials,
                       xte_scaling_mode mode, xte_recipe rec, xte_scale_layout lay, xte_dtype dt,
                       int amax, int scale) {
  STATE(q_state);
  void *x = data(c, in_dt, M * K, 3.0f, specials);
  if (!x) return fail(c, "out of buffer slots");
  s->in = xte_tensor_2d(x, in_dt, M, K);
  s->cfg = xte_quant_config_default();
  if (make_q(c, &s->q, M, K, mode, rec, lay, dt, 1, 1)) return 1;
  if (amax) {
    ALLOC(s->q.amax, float, 1);
    calls_output(c, s->q.amax, 4, "amax");
  }
  if (scale) {
    ALLOC(s->q.scale, float, 1);
    calls_output(c, s->q.scale, 4, "scale");
  }
  return 0;
}

xte_status quant_run(calls_ctx *c) {
  q_state *s = (q_state *)c->state;
  return xte_quantize(&s->in, &s->q, &s->cfg, NULL);
}

int setup_quantize_1x128(calls_ctx *c) {
  return quant_setup(c, 300, 400, XTE_DTYPE_FP32, 1, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                     XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3, 1, 0);
}
int setup_quantize_128x128(calls_ctx *c) {
  return quant_setup(c, 300, 384, XTE_DTYPE_BF16, 1, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
                     XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_E4M3, 1, 0);
}
int setup_quantize_mxfp8(calls_ctx *c) {
  return quant_setup(c, 256, 320, XTE_DTYPE_BF16, 1, XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_TE,
                     XTE_SCALE_LAYOUT_MX_SWIZZLED, XTE_DTYPE_E4M3, 1, 0);
}
int setup_quantize_current(calls_ctx *c) {
  return quant_setup(c, 300, 256, XTE_DTYPE_FP32, 2, XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_CURRENT,
                     XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E5M2, 1, 1);
}

static int dequant_setup(calls_ctx *c, xte_scaling_mode mode, int col, xte_dtype out_dt) {
  const int64_t M = 300, K = 384;
  STATE(q_state);
  float *x = (float *)data(c, XTE_DTYPE_FP32, M * K, 5.0f, 1);
  if (!x) return fail(c, "out of buffer slots");
  if (quantized(c, &s->q, x, M, K, mode, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT,
                XTE_DTYPE_E4M3, 1))
    return 1;
  s->columnwise = col;
  return out2d(c, &s->out, out_dt, col ? K : M, col ? M : K, "out");
}

xte_status dequant_run(calls_ctx *c) {
  q_state *s = (q_state *)c->state;
  return xte_dequantize(&s->q, s->columnwise, &s->out, NULL);
}

int setup_dequantize_1x128_col(calls_ctx *c) {
  return dequant_setup(c, XTE_SCALING_BLOCK_1x128, 1, XTE_DTYPE_FP32);
}
int setup_dequantize_128x128(calls_ctx *c) {
  return dequant_setup(c, XTE_SCALING_BLOCK_128x128, 0, XTE_DTYPE_BF16);
}

static int cast_setup(calls_ctx *c, xte_dtype in_dt, xte_dtype out_dt, int saturate) {
  const int64_t M = 300, K = 256;
  STATE(q_state);
  void *x = data(c, in_dt, M * K, 1000.0f, 1);
  if (!x) return fail(c, "out of buffer slots");
  s->in = xte_tensor_2d(x, in_dt, M, K);
  s->saturate = saturate;
  return out2d(c, &s->out, out_dt, M, K, "out");
}

xte_status cast_run(calls_ctx *c) {
  q_state *s = (q_state *)c->state;
  return xte_cast(&s->in, &s->out, s->saturate, NULL);
}

int setup_cast_fp32_e5m2(calls_ctx *c) {
  return cast_setup(c, XTE_DTYPE_FP32, XTE_DTYPE_E5M2, 0);
}
int setup_cast_e4m3_bf16(calls_ctx *c) {
  return cast_setup(c, XTE_DTYPE_E4M3, XTE_DTYPE_BF16, 1);
}

/* ------------------------------------------------------------------ GEMM */

typedef struct g_state {
  xte_qtensor A, B;
  xte_tensor C, D, bias, masked_m;
  xte_gemm_config cfg;
  xte_gemm_groups groups;
  int64_t sizes[8];
  int grouped;
} g_state;

xte_status gemm_run(calls_ctx *c) {
  g_state *s = (g_state *)c->state;
  if (s->grouped)
    return xte_gemm_grouped(&s->A, &s->B, s->cfg.accumulate ? &s->C : NULL, &s->D, &s->groups,
                            &s->cfg, NULL);
  return xte_gemm(&s->A, &s->B, s->cfg.accumulate ? &s->C : NULL, &s->D, &s->cfg, NULL);
}

/* A 1x128 [M, K] x B 128x128 (X [N, K], or X [K, N] with trans_b) */
static int gemm_setup_b(calls_ctx *c, int trans_b, int acc_bias, xte_dtype d_dt, xte_dtype b_dt) {
  const int64_t M = 200, N = 256, K = 384;
  STATE(g_state);
  float *xa = (float *)data(c, XTE_DTYPE_FP32, M * K, 2.0f, 2);
  float *xb = (float *)data(c, XTE_DTYPE_FP32, N * K, 2.0f, 2);
  if (!xa || !xb) return fail(c, "out of buffer slots");
  s->cfg = xte_gemm_config_default();
  s->cfg.trans_b = trans_b;
  if (quantized(c, &s->A, xa, M, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_E4M3, 0) ||
      quantized(c, &s->B, xb, trans_b ? K : N, trans_b ? N : K, XTE_SCALING_BLOCK_128x128,
                XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT, b_dt, 0))
    return 1;
  if (acc_bias) {
    void *cd = data(c, XTE_DTYPE_FP32, M * N, 100.0f, 0),
         *bd = data(c, XTE_DTYPE_FP32, N, 10.0f, 0);
    if (!cd || !bd) return fail(c, "out of buffer slots");
    s->C = xte_tensor_2d(cd, XTE_DTYPE_FP32, M, N);
    s->bias = xte_tensor_1d(bd, XTE_DTYPE_FP32, N);
    s->cfg.accumulate = 1;
    s->cfg.bias = &s->bias;
  }
  return out2d(c, &s->D, d_dt, M, N, "D");
}

static int gemm_setup(calls_ctx *c, int trans_b, int acc_bias, xte_dtype d_dt) {
  return gemm_setup_b(c, trans_b, acc_bias, d_dt, XTE_DTYPE_E4M3);
}

int setup_gemm_1x128_128x128(calls_ctx *c) {
  return gemm_setup(c, 0, 0, XTE_DTYPE_BF16);
}
int setup_gemm_trans_b_acc_bias(calls_ctx *c) {
  return gemm_setup(c, 1, 1, XTE_DTYPE_FP32);
}
/* XTE_GEMM_FAST with an e5m2 B (the fp32 kernels on every machine: no AMX-INT8 path for it) */
int setup_gemm_fast_e5m2_acc_bias(calls_ctx *c) {
  int r = gemm_setup_b(c, 0, 1, XTE_DTYPE_BF16, XTE_DTYPE_E5M2);
  if (r == 0) ((g_state *)c->state)->cfg.mode = XTE_GEMM_FAST;
  return r;
}

/* contiguous (masked = 0) or masked M-grouped */
static int grouped_m_setup(calls_ctx *c, int masked) {
  enum { G = 4, N = 128, K = 256, ALIGN = 128, MMAX = 130 };
  const int64_t sizes[G] = {70, 0, 130, 37};
  int64_t rows = 0, g;
  int32_t *mm;
  float *xa, *xb;
  STATE(g_state);
  for (g = 0; g < G; g++) {
    s->sizes[g] = sizes[g];
    rows += masked ? MMAX : (sizes[g] + ALIGN - 1) / ALIGN * ALIGN;
  }
  xa = (float *)data(c, XTE_DTYPE_FP32, rows * K, 2.0f, 2);
  xb = (float *)data(c, XTE_DTYPE_FP32, G * N * K, 2.0f, 2);
  ALLOC(mm, int32_t, G);
  if (!xa || !xb) return fail(c, "out of buffer slots");
  for (g = 0; g < G; g++) mm[g] = (int32_t)sizes[g];
  s->masked_m = xte_tensor_1d(mm, XTE_DTYPE_INT32, G);
  s->cfg = xte_gemm_config_default();
  s->grouped = 1;
  s->groups.kind = masked ? XTE_GEMM_GROUPED_MASKED : XTE_GEMM_GROUPED_CONTIGUOUS;
  s->groups.num_groups = G;
  s->groups.group_sizes = s->sizes;
  s->groups.alignment = ALIGN;
  s->groups.masked_m = &s->masked_m;
  if (quantized(c, &s->A, xa, rows, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3, 0) ||
      quantized(c, &s->B, xb, G * N, K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
                XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3, 0))
    return 1;
  return out2d(c, &s->D, XTE_DTYPE_FP32, rows, N, "D");
}

int setup_gemm_grouped_contiguous(calls_ctx *c) {
  return grouped_m_setup(c, 0);
}
int setup_gemm_grouped_masked(calls_ctx *c) {
  return grouped_m_setup(c, 1);
}
int setup_gemm_grouped_masked_fast(calls_ctx *c) {
  int r = grouped_m_setup(c, 1);
  if (r == 0) ((g_state *)c->state)->cfg.mode = XTE_GEMM_FAST;
  return r;
}

/* K-grouped weight gradient: dY [T, M] and X [T, N] quantized 1x128 with columnwise copies;
 * D[g] = C[g] + dY_g^T X_g. */
int setup_gemm_grouped_k(calls_ctx *c) {
  enum { G = 3, M = 96, N = 80 };
  const int64_t ks[G] = {128, 0, 200};
  const int64_t T = 328;
  float *xa, *xb;
  void *cd;
  int g;
  STATE(g_state);
  xa = (float *)data(c, XTE_DTYPE_FP32, T * M, 2.0f, 2);
  xb = (float *)data(c, XTE_DTYPE_FP32, T * N, 2.0f, 2);
  cd = data(c, XTE_DTYPE_FP32, G * M * N, 50.0f, 0);
  if (!xa || !xb || !cd) return fail(c, "out of buffer slots");
  for (g = 0; g < G; g++) s->sizes[g] = ks[g];
  s->cfg = xte_gemm_config_default();
  s->cfg.trans_a = s->cfg.trans_b = 1;
  s->cfg.accumulate = 1;
  s->grouped = 1;
  s->groups.kind = XTE_GEMM_GROUPED_K;
  s->groups.num_groups = G;
  s->groups.group_sizes = s->sizes;
  s->C = xte_tensor_2d(cd, XTE_DTYPE_FP32, G * M, N);
  if (quantized(c, &s->A, xa, T, M, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_E5M2, 1) ||
      quantized(c, &s->B, xb, T, N, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_E4M3, 1))
    return 1;
  return out2d(c, &s->D, XTE_DTYPE_FP32, G * M, N, "D");
}

/* ------------------------------------------------------------------ router and aux loss */

typedef struct r_state {
  xte_tensor logits, bias, grad, map, saved, grad_logits, scores, tpe;
  xte_router_config cfg;
  xte_router_outputs out;
  int topk, backward, aux;
  xte_router_score score;
  int64_t total;
  float coeff, grad_aux, *aux_loss;
} r_state;

xte_status router_run(calls_ctx *c) {
  r_state *s = (r_state *)c->state;
  if (s->aux)
    return s->backward ? xte_router_aux_scores_backward(&s->grad, &s->saved, &s->logits, s->topk,
                                                        s->score, &s->grad_logits, NULL)
                       : xte_router_aux_scores(&s->logits, s->topk, s->score, &s->scores, &s->map,
                                               &s->saved, NULL);
  if (s->backward)
    return xte_router_backward(&s->grad, &s->map, &s->saved, &s->logits, &s->cfg, &s->grad_logits,
                               NULL);
  return xte_router_forward(&s->logits, s->bias.data ? &s->bias : NULL, &s->cfg, &s->out, NULL);
}

/* Router forward (backward = 0) or backward; grouped: sigmoid with 8 groups, bias, bf16. */
static int router_setup(calls_ctx *c, int grouped, int backward) {
  const int64_t T = 300, E = 64;
  STATE(r_state);
  xte_dtype ldt = grouped && !backward ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32;
  void *x = data(c, ldt, T * E, 4.0f, 1);
  int k = grouped ? 8 : 4;
  if (!x) return fail(c, "out of buffer slots");
  s->logits = xte_tensor_2d(x, ldt, T, E);
  s->cfg = xte_router_config_default();
  s->cfg.topk = k;
  s->backward = backward;
  if (grouped) {
    void *b = calls_alloc(c, 4 * (size_t)E);
    int e;
    if (!b) return fail(c, "out of buffer slots");
    for (e = 0; e < E; e++) ((float *)b)[e] = (float)(rnd(c) % 8) * 0.0625f;
    s->bias = xte_tensor_1d(b, XTE_DTYPE_FP32, E);
    s->cfg.score_function = XTE_ROUTER_SIGMOID;
    s->cfg.num_groups = 8;
    s->cfg.group_topk = 4;
    s->cfg.scaling_factor = 2.5f;
  } else {
    s->cfg.use_pre_softmax = backward;
  }
  if (!backward) {
    memset(&s->out, 0, sizeof s->out);
    if (out2d(c, &s->out.probs, XTE_DTYPE_FP32, T, E, "probs") ||
        out2d(c, &s->out.routing_map, XTE_DTYPE_UINT8, T, E, "routing_map") ||
        out2d(c, &s->out.routing_bits, XTE_DTYPE_UINT8, T, (E + 7) / 8, "routing_bits") ||
        out2d(c, &s->out.topk_idx, grouped ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64, T, k, "topk_idx") ||
        out2d(c, &s->out.topk_weights, XTE_DTYPE_FP32, T, k, "topk_weights") ||
        out2d(c, &s->out.saved, XTE_DTYPE_FP32, T, E, "saved"))
      return 1;
    return 0;
  }
  {
    xte_router_outputs o;
    void *m = calls_alloc(c, (size_t)(T * E)), *sv = calls_alloc(c, 4 * (size_t)(T * E));
    void *g = data(c, XTE_DTYPE_FP32, T * E, 1.0f, 0);
    if (!m || !sv || !g) return fail(c, "out of buffer slots");
    memset(&o, 0, sizeof o);
    o.routing_map = s->map = xte_tensor_2d(m, XTE_DTYPE_UINT8, T, E);
    o.saved = s->saved = xte_tensor_2d(sv, XTE_DTYPE_FP32, T, E);
    s->grad = xte_tensor_2d(g, XTE_DTYPE_FP32, T, E);
    TRY_X(xte_router_forward(&s->logits, s->bias.data ? &s->bias : NULL, &s->cfg, &o, NULL));
    return out2d(c, &s->grad_logits, grouped ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, T, E,
                 "grad_logits");
  }
}

int setup_router_fwd_softmax(calls_ctx *c) {
  return router_setup(c, 0, 0);
}
int setup_router_fwd_sigmoid_grouped(calls_ctx *c) {
  return router_setup(c, 1, 0);
}
int setup_router_bwd_softmax(calls_ctx *c) {
  return router_setup(c, 0, 1);
}
int setup_router_bwd_sigmoid_grouped(calls_ctx *c) {
  return router_setup(c, 1, 1);
}

static int aux_scores_setup(calls_ctx *c, xte_router_score score, int backward) {
  const int64_t T = 300, E = 40;
  STATE(r_state);
  void *x = data(c, XTE_DTYPE_FP32, T * E, 3.0f, 1);
  if (!x) return fail(c, "out of buffer slots");
  s->aux = 1;
  s->backward = backward;
  s->topk = 4;
  s->score = score;
  s->logits = xte_tensor_2d(x, XTE_DTYPE_FP32, T, E);
  if (!backward)
    return out2d(c, &s->scores, XTE_DTYPE_FP32, T, E, "scores") ||
           out2d(c, &s->map, XTE_DTYPE_UINT8, T, E, "routing_map") ||
           out2d(c, &s->saved, XTE_DTYPE_FP32, T, E, "saved");
  {
    void *sc = calls_alloc(c, 4 * (size_t)(T * E)), *sv = calls_alloc(c, 4 * (size_t)(T * E));
    void *g = data(c, XTE_DTYPE_FP32, T * E, 1.0f, 0);
    xte_tensor st;
    if (!sc || !sv || !g) return fail(c, "out of buffer slots");
    st = xte_tensor_2d(sc, XTE_DTYPE_FP32, T, E);
    s->saved = xte_tensor_2d(sv, XTE_DTYPE_FP32, T, E);
    s->grad = xte_tensor_2d(g, XTE_DTYPE_FP32, T, E);
    TRY_X(xte_router_aux_scores(&s->logits, s->topk, score, &st, NULL, &s->saved, NULL));
    return out2d(c, &s->grad_logits, XTE_DTYPE_FP32, T, E, "grad_logits");
  }
}

int setup_aux_scores_softmax(calls_ctx *c) {
  return aux_scores_setup(c, XTE_ROUTER_SOFTMAX, 0);
}
int setup_aux_scores_sigmoid(calls_ctx *c) {
  return aux_scores_setup(c, XTE_ROUTER_SIGMOID, 0);
}
int setup_aux_scores_bwd_softmax(calls_ctx *c) {
  return aux_scores_setup(c, XTE_ROUTER_SOFTMAX, 1);
}
int setup_aux_scores_bwd_sigmoid(calls_ctx *c) {
  return aux_scores_setup(c, XTE_ROUTER_SIGMOID, 1);
}

xte_status aux_loss_run(calls_ctx *c) {
  r_state *s = (r_state *)c->state;
  if (s->backward)
    return xte_moe_aux_loss_backward(&s->tpe, s->total, s->topk, s->coeff, s->grad_aux,
                                     &s->grad_logits, NULL);
  return xte_moe_aux_loss_forward(&s->scores, &s->tpe, s->total, s->topk, s->coeff, s->aux_loss,
                                  NULL);
}

static int aux_loss_setup(calls_ctx *c, int backward) {
  const int64_t T = 2100, E = 32; /* more than two 1024-token blocks */
  int64_t *tpe, e;
  STATE(r_state);
  void *p = data(c, XTE_DTYPE_FP32, T * E, 1.0f, 0);
  ALLOC(tpe, int64_t, E);
  if (!p) return fail(c, "out of buffer slots");
  for (e = 0; e < E; e++) tpe[e] = rnd(c) % 1000;
  s->scores = xte_tensor_2d(p, XTE_DTYPE_FP32, T, E);
  s->tpe = xte_tensor_1d(tpe, XTE_DTYPE_INT64, E);
  s->total = T;
  s->topk = 4;
  s->coeff = 1e-2f;
  s->grad_aux = 0.75f;
  s->backward = backward;
  if (backward) return out2d(c, &s->grad_logits, XTE_DTYPE_FP32, T, E, "grad_probs");
  ALLOC(s->aux_loss, float, 1);
  calls_output(c, s->aux_loss, 4, "aux_loss");
  return 0;
}

int setup_aux_loss_fwd(calls_ctx *c) {
  return aux_loss_setup(c, 0);
}
int setup_aux_loss_bwd(calls_ctx *c) {
  return aux_loss_setup(c, 1);
}

/* Quantile Balancing (xte_router_qb_forward), the aux scores with a bit map and the
 * sequence-level aux loss (the _ex entry points). */
typedef struct qb_state {
  xte_tensor logits, bias, cutoff, hist, scores, bits, saved, tpe, grad;
  xte_router_outputs out;
  float *aux_loss;
  int which; /* 0 QB, 1 aux scores bits, 2 aux loss forward, 3 aux loss backward */
} qb_state;

xte_status qb_run(calls_ctx *c) {
  qb_state *s = (qb_state *)c->state;
  switch (s->which) {
    case 0:
      return xte_router_qb_forward(&s->logits, &s->bias, 8, 1.5f, -1.2f, 1.2f, &s->out, &s->cutoff,
                                   &s->hist, NULL);
    case 1:
      return xte_router_aux_scores_ex(&s->logits, 4, XTE_ROUTER_SQRTSOFTPLUS, &s->scores, NULL,
                                      &s->bits, &s->saved, NULL);
    case 2:
      return xte_moe_aux_loss_forward_ex(&s->scores, &s->tpe, 1500, 32, 4, 1e-2f, s->aux_loss,
                                         NULL);
    default:
      return xte_moe_aux_loss_backward_ex(&s->tpe, 1500, 32, 4, 1e-2f, 0.75f, &s->grad, NULL);
  }
}

static int qb_setup(calls_ctx *c, int which) {
  const int64_t T = 300, E = 96, bins = 50;
  STATE(qb_state);
  void *x = data(c, XTE_DTYPE_FP32, T * E, 3.0f, 1);
  if (!x) return fail(c, "out of buffer slots");
  s->which = which;
  s->logits = xte_tensor_2d(x, XTE_DTYPE_FP32, T, E);
  if (which == 0) {
    void *b = data(c, XTE_DTYPE_FP32, E, 0.2f, 0), *h = calls_alloc(c, 4 * (size_t)(E * bins));
    if (!b || !h) return fail(c, "out of buffer slots");
    memset(h, 0, 4 * (size_t)(E * bins));
    s->bias = xte_tensor_1d(b, XTE_DTYPE_FP32, E);
    s->hist = xte_tensor_2d(h, XTE_DTYPE_INT32, E, bins);
    calls_output(c, h, 4 * (size_t)(E * bins), "histogram");
    memset(&s->out, 0, sizeof s->out);
    return out2d(c, &s->out.probs, XTE_DTYPE_FP32, T, E, "probs") ||
           out2d(c, &s->out.routing_bits, XTE_DTYPE_UINT8, T, (E + 7) / 8, "routing_bits") ||
           out2d(c, &s->out.topk_idx, XTE_DTYPE_INT32, T, 8, "topk_idx") ||
           out2d(c, &s->out.saved, XTE_DTYPE_FP32, T, E, "saved") ||
           out2d(c, &s->cutoff, XTE_DTYPE_FP32, T, 1, "cutoff");
  }
  if (which == 1)
    return out2d(c, &s->scores, XTE_DTYPE_FP32, T, E, "scores") ||
           out2d(c, &s->bits, XTE_DTYPE_UINT8, T, (E + 7) / 8, "routing_bits") ||
           out2d(c, &s->saved, XTE_DTYPE_FP32, T, E, "saved");
  {
    /* 3 sequences of 32 experts: tokens_per_expert fp32 [96] */
    float *tpe;
    int64_t e;
    ALLOC(tpe, float, E);
    for (e = 0; e < E; e++) tpe[e] = (float)(rnd(c) % 1000);
    s->tpe = xte_tensor_1d(tpe, XTE_DTYPE_FP32, E);
    s->scores = xte_tensor_2d(x, XTE_DTYPE_FP32, T, E);
    if (which == 3) return out2d(c, &s->grad, XTE_DTYPE_FP32, T, E, "grad_probs");
    ALLOC(s->aux_loss, float, 1);
    calls_output(c, s->aux_loss, 4, "aux_loss");
    return 0;
  }
}

int setup_router_qb(calls_ctx *c) {
  return qb_setup(c, 0);
}
int setup_aux_scores_bits(calls_ctx *c) {
  return qb_setup(c, 1);
}
int setup_aux_loss_seq_fwd(calls_ctx *c) {
  return qb_setup(c, 2);
}
int setup_aux_loss_seq_bwd(calls_ctx *c) {
  return qb_setup(c, 3);
}
