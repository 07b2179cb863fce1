/* Entry points of the MoE API (include/xte/moe.h): argument checks, then dispatch to the
 * backend's MoE table. Nothing is written to an output before every check has passed. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/config.h"
#include "core/quant.h"
#include "core/tensor.h"
#include "xte_internal.h"
#include "xte_moe_ops.h"

#define DT(d) (1u << (unsigned)(d))
#define XTE_MOE_MAX_E XTE_ROUTER_MAX_EXPERTS

static int64_t cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

/* Checks tensor t (dtype in mask; rows / cols when >= 0) into v. */
static xte_status view(const xte_tensor *t, const char *name, unsigned mask, int64_t want_r,
                       int64_t want_c, xte_moe_view *v) {
  int64_t r, c, ld;
  XTE_TRY(xte_tensor_view2d(t, name, &r, &c, &ld));
  if (!(mask & DT(t->dtype))) {
    char buf[160];
    size_t n = 0;
    int d;
    buf[0] = '\0';
    for (d = 0; d < XTE_DTYPE_COUNT; d++)
      if (mask & DT(d))
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", n ? " / " : "",
                              xte_dtype_name((xte_dtype)d));
    return xte_set_error(XTE_ERROR_DTYPE, "%s->dtype is %s: want %s", name,
                         xte_dtype_name(t->dtype), buf);
  }
  if ((uintptr_t)t->data % xte_dtype_size(t->dtype))
    return xte_set_error(XTE_ERROR_ALIGNMENT, "%s->data is not aligned to its element size", name);
  if ((want_r >= 0 && r != want_r) || (want_c >= 0 && c != want_c))
    return xte_set_error(XTE_ERROR_SHAPE, "%s is [%lld, %lld]: want [%lld, %lld]", name,
                         (long long)r, (long long)c, (long long)(want_r >= 0 ? want_r : r),
                         (long long)(want_c >= 0 ? want_c : c));
  v->data = t->data;
  v->dtype = (int)t->dtype;
  v->rows = r;
  v->cols = c;
  v->ld = ld;
  return XTE_SUCCESS;
}

/* The same for an optional tensor (NULL or data NULL: absent, v->data = NULL). */
static xte_status view_opt(const xte_tensor *t, const char *name, unsigned mask, int64_t want_r,
                           int64_t want_c, xte_moe_view *v) {
  memset(v, 0, sizeof *v);
  if (!t || !t->data) return XTE_SUCCESS;
  return view(t, name, mask, want_r, want_c, v);
}

/* A vector [n] given as rank 1 ([n]) or rank 2 ([1, n] / [n, 1]). */
static xte_status vec(const xte_tensor *t, const char *name, unsigned mask, int64_t n,
                      xte_moe_view *v) {
  int64_t r, c, ld;
  XTE_TRY(xte_tensor_view2d(t, name, &r, &c, &ld));
  if (r * c != n || (r != 1 && c != 1) || (c == 1 && r > 1 && ld != 1))
    return xte_set_error(XTE_ERROR_SHAPE, "%s holds [%lld, %lld]: want a dense vector of %lld",
                         name, (long long)r, (long long)c, (long long)n);
  XTE_TRY(view(t, name, mask, r, c, v));
  v->rows = 1;
  v->cols = n;
  v->ld = n;
  return XTE_SUCCESS;
}

static xte_status vec_opt(const xte_tensor *t, const char *name, unsigned mask, int64_t n,
                          xte_moe_view *v) {
  memset(v, 0, sizeof *v);
  if (!t || !t->data) return XTE_SUCCESS;
  return vec(t, name, mask, n, v);
}

static xte_status moe_exec(xte_stream stream, xte_exec *ex) {
  XTE_TRY(xte_resolve_stream(stream, ex));
  if (!ex->ops->moe)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "backend %s has no MoE kernels",
                         xte_backend_name(ex->backend));
  return XTE_SUCCESS;
}

/* A backend's MoE table may leave an operation out (NULL): XTE_ERROR_UNSUPPORTED. */
static xte_status moe_has(const xte_exec *ex, int have, const char *op) {
  if (!have)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "backend %s has no MoE %s kernel",
                         xte_backend_name(ex->backend), op);
  return XTE_SUCCESS;
}

/* ================================================================== router */

xte_router_config xte_router_config_default(void) {
  xte_router_config c;
  memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.topk = 1;
  c.score_function = XTE_ROUTER_SOFTMAX;
  c.scaling_factor = 1.0f;
  return c;
}

/* The caller's config (not NULL) under the config ABI rule (src/core/config.h) into *cfg, and
 * config pointed at it. */
static xte_status read_router_config(const xte_router_config **config, xte_router_config *cfg) {
  const xte_router_config def = xte_router_config_default();
  XTE_CHECK_PTR(*config, "config");
  XTE_TRY(xte_config_read(*config, "config", XTE_CONFIG_END(xte_router_config, scaling_factor),
                          sizeof *cfg, &def, cfg));
  *config = cfg;
  return XTE_SUCCESS;
}

static xte_status check_score(xte_router_score s, const char *name) {
  if ((unsigned)s >= XTE_ROUTER_SCORE_COUNT)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "%s = %d is not an xte_router_score", name,
                         (int)s);
  return XTE_SUCCESS;
}

static xte_status check_config(const xte_router_config *c, int64_t E) {
  XTE_TRY(check_score(c->score_function, "config->score_function"));
  if (c->topk < 1)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->topk = %d: want 1..E", c->topk);
  if (c->topk > E)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "config->topk = %d is larger than the %lld experts", c->topk,
                         (long long)E);
  if (c->use_pre_softmax != 0 && c->use_pre_softmax != 1)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->use_pre_softmax must be 0 or 1");
  if (!isfinite(c->scaling_factor))
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->scaling_factor must be finite");
  if (c->num_groups < 0 || c->num_groups > E)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->num_groups = %d: want 0..%lld",
                         c->num_groups, (long long)E);
  if (c->num_groups > 1) {
    int64_t gs;
    if (E % c->num_groups)
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "config->num_groups = %d does not divide the %lld experts",
                           c->num_groups, (long long)E);
    if (c->group_topk < 1 || c->group_topk > c->num_groups)
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "config->group_topk = %d: want 1..num_groups (%d)", c->group_topk,
                           c->num_groups);
    if (c->group_topk > c->topk)
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "config->group_topk = %d is larger than config->topk = %d (each kept "
                           "group is scored by its top topk / group_topk experts)",
                           c->group_topk, c->topk);
    gs = E / c->num_groups;
    if (c->topk / c->group_topk > gs || (int64_t)c->group_topk * gs < c->topk)
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "config: %d groups of %lld experts cannot supply topk = %d with "
                           "group_topk = %d",
                           c->num_groups, (long long)gs, c->topk, c->group_topk);
  }
  return XTE_SUCCESS;
}

#define F32 DT(XTE_DTYPE_FP32)
#define BF16 DT(XTE_DTYPE_BF16)
#define F16 DT(XTE_DTYPE_FP16)
#define U8 DT(XTE_DTYPE_UINT8)
#define I32 DT(XTE_DTYPE_INT32)
#define I64 DT(XTE_DTYPE_INT64)

static xte_status logits_view(const xte_tensor *logits, xte_moe_view *v, int64_t *T, int64_t *E) {
  XTE_TRY(view(logits, "logits", F32 | BF16, -1, -1, v));
  *T = v->rows;
  *E = v->cols;
  if (*E < 1 || *E > XTE_MOE_MAX_E)
    return xte_set_error(XTE_ERROR_SHAPE, "logits has %lld experts (columns): want 1..%d",
                         (long long)*E, XTE_MOE_MAX_E);
  return XTE_SUCCESS;
}

xte_status xte_router_forward(const xte_tensor *logits, const xte_tensor *expert_bias,
                              const xte_router_config *config, xte_router_outputs *out,
                              xte_stream stream) {
  xte_router_args a;
  xte_router_config rcfg;
  xte_exec ex;
  xte_moe_view bv;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(logits, "logits");
  XTE_TRY(read_router_config(&config, &rcfg));
  XTE_CHECK_PTR(out, "out");
  XTE_TRY(logits_view(logits, &a.logits, &a.T, &a.E));
  XTE_TRY(check_config(config, a.E));
  XTE_TRY(vec_opt(expert_bias, "expert_bias", F32, a.E, &bv));
  a.bias = (const float *)bv.data;
  XTE_TRY(view_opt(&out->probs, "out->probs", F32, a.T, a.E, &a.probs));
  XTE_TRY(view_opt(&out->routing_map, "out->routing_map", U8, a.T, a.E, &a.map));
  XTE_TRY(view_opt(&out->routing_bits, "out->routing_bits", U8, a.T, cdiv(a.E, 8), &a.bits));
  XTE_TRY(view_opt(&out->topk_idx, "out->topk_idx", I32 | I64, a.T, config->topk, &a.idx));
  XTE_TRY(view_opt(&out->topk_weights, "out->topk_weights", F32, a.T, config->topk, &a.weights));
  XTE_TRY(view_opt(&out->saved, "out->saved", F32, a.T, a.E, &a.saved));
  if (!a.probs.data && !a.map.data && !a.bits.data && !a.idx.data && !a.weights.data &&
      !a.saved.data)
    return xte_set_error(XTE_ERROR_NULL_POINTER, "out: every output's data is NULL");
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->router_forward != NULL, "router_forward"));
  a.topk = config->topk;
  a.score = (int)config->score_function;
  a.pre_softmax = config->use_pre_softmax;
  a.num_groups = config->num_groups > 1 ? config->num_groups : 1;
  a.group_topk = config->num_groups > 1 ? config->group_topk : 1;
  a.scaling = config->scaling_factor;
  xte_clear_error();
  return ex.ops->moe->router_forward(&a, ex.handle);
}

xte_status xte_router_qb_forward(const xte_tensor *logits, const xte_tensor *expert_bias, int topk,
                                 float scaling_factor, float lower, float upper,
                                 xte_router_outputs *out, xte_tensor *cutoff, xte_tensor *histogram,
                                 xte_stream stream) {
  xte_router_args a;
  xte_exec ex;
  xte_moe_view bv;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(logits, "logits");
  XTE_CHECK_PTR(expert_bias, "expert_bias");
  XTE_CHECK_PTR(out, "out");
  XTE_CHECK_PTR(cutoff, "cutoff");
  XTE_CHECK_PTR(histogram, "histogram");
  XTE_TRY(logits_view(logits, &a.logits, &a.T, &a.E));
  if (topk < 1 || topk >= a.E)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "topk = %d: want 1..E - 1 (%lld; Quantile Balancing selects topk + 1)",
                         topk, (long long)a.E - 1);
  if (!isfinite(scaling_factor))
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "scaling_factor must be finite");
  if (!isfinite(lower) || !isfinite(upper) || !(lower < upper))
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "bin bounds [lower, upper] = [%g, %g]: want finite with lower < upper",
                         (double)lower, (double)upper);
  if (!expert_bias->data) return xte_set_error(XTE_ERROR_NULL_POINTER, "expert_bias->data");
  XTE_TRY(vec(expert_bias, "expert_bias", F32, a.E, &bv));
  a.bias = (const float *)bv.data;
  XTE_TRY(view_opt(&out->probs, "out->probs", F32, a.T, a.E, &a.probs));
  XTE_TRY(view_opt(&out->routing_map, "out->routing_map", U8, a.T, a.E, &a.map));
  XTE_TRY(view_opt(&out->routing_bits, "out->routing_bits", U8, a.T, cdiv(a.E, 8), &a.bits));
  XTE_TRY(view_opt(&out->topk_idx, "out->topk_idx", I32 | I64, a.T, topk, &a.idx));
  XTE_TRY(view_opt(&out->topk_weights, "out->topk_weights", F32, a.T, topk, &a.weights));
  if (!out->saved.data)
    return xte_set_error(XTE_ERROR_NULL_POINTER,
                         "out->saved: Quantile Balancing needs the scores (the histogram's input)");
  XTE_TRY(view(&out->saved, "out->saved", F32, a.T, a.E, &a.saved));
  XTE_TRY(vec(cutoff, "cutoff", F32, a.T, &a.cutoff));
  a.cutoff.ld = 1;
  XTE_TRY(view(histogram, "histogram", I32, a.E, -1, &a.hist));
  if (a.hist.cols < 1) return xte_set_error(XTE_ERROR_SHAPE, "histogram has no bins (columns)");
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->router_forward != NULL, "router_forward"));
  a.topk = topk;
  a.score = XTE_ROUTER_SIGMOID;
  a.num_groups = a.group_topk = 1;
  a.scaling = scaling_factor;
  a.qb = 1;
  a.qb_bins = a.hist.cols;
  a.qb_lower = lower;
  a.qb_upper = upper;
  xte_clear_error();
  return ex.ops->moe->router_forward(&a, ex.handle);
}

/* topk of the aux-score entry points: 1..E. */
static xte_status check_topk(int topk, int64_t E) {
  if (topk < 1 || topk > E)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "topk = %d: want 1..E (%lld)", topk,
                         (long long)E);
  return XTE_SUCCESS;
}

/* The gradient [T, E] of a router backward: sets a->T, a->E. */
static xte_status grad_view(const xte_tensor *g, const char *name, xte_router_bwd_args *a) {
  XTE_TRY(view(g, name, F32, -1, -1, &a->grad_probs));
  a->T = a->grad_probs.rows;
  a->E = a->grad_probs.cols;
  if (a->E < 1 || a->E > XTE_MOE_MAX_E)
    return xte_set_error(XTE_ERROR_SHAPE, "%s has %lld experts (columns): want 1..%d", name,
                         (long long)a->E, XTE_MOE_MAX_E);
  return XTE_SUCCESS;
}

/* saved, the logits (sqrtsoftplus only) and grad_logits of a router backward, all [T, E]. */
static xte_status bwd_views(const xte_tensor *saved, const xte_tensor *logits, int score,
                            xte_tensor *grad_logits, xte_router_bwd_args *a) {
  XTE_TRY(view(saved, "saved", F32, a->T, a->E, &a->saved));
  if (score == XTE_ROUTER_SQRTSOFTPLUS) {
    if (!logits || !logits->data)
      return xte_set_error(XTE_ERROR_NULL_POINTER,
                           "logits is NULL: the sqrtsoftplus backward needs the logits");
    XTE_TRY(view(logits, "logits", F32 | BF16, a->T, a->E, &a->logits));
  }
  return view(grad_logits, "grad_logits", F32 | BF16, a->T, a->E, &a->grad_logits);
}

xte_status xte_router_backward(const xte_tensor *grad_probs, const xte_tensor *routing_map,
                               const xte_tensor *saved, const xte_tensor *logits,
                               const xte_router_config *config, xte_tensor *grad_logits,
                               xte_stream stream) {
  xte_router_bwd_args a;
  xte_router_config rcfg;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(grad_probs, "grad_probs");
  XTE_CHECK_PTR(routing_map, "routing_map");
  XTE_CHECK_PTR(saved, "saved");
  XTE_TRY(read_router_config(&config, &rcfg));
  XTE_CHECK_PTR(grad_logits, "grad_logits");
  XTE_TRY(grad_view(grad_probs, "grad_probs", &a));
  XTE_TRY(check_config(config, a.E));
  XTE_TRY(view(routing_map, "routing_map", U8, a.T, a.E, &a.map));
  XTE_TRY(bwd_views(saved, logits, (int)config->score_function, grad_logits, &a));
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->router_backward != NULL, "router_backward"));
  a.topk = config->topk;
  a.score = (int)config->score_function;
  a.pre_softmax = config->use_pre_softmax;
  a.scaling = config->scaling_factor;
  xte_clear_error();
  return ex.ops->moe->router_backward(&a, ex.handle);
}

xte_status xte_router_aux_scores(const xte_tensor *logits, int topk,
                                 xte_router_score score_function, xte_tensor *scores,
                                 xte_tensor *routing_map, xte_tensor *saved, xte_stream stream) {
  return xte_router_aux_scores_ex(logits, topk, score_function, scores, routing_map, NULL, saved,
                                  stream);
}

xte_status xte_router_aux_scores_ex(const xte_tensor *logits, int topk,
                                    xte_router_score score_function, xte_tensor *scores,
                                    xte_tensor *routing_map, xte_tensor *routing_bits,
                                    xte_tensor *saved, xte_stream stream) {
  xte_router_args a;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(logits, "logits");
  XTE_CHECK_PTR(scores, "scores");
  XTE_CHECK_PTR(saved, "saved");
  XTE_TRY(logits_view(logits, &a.logits, &a.T, &a.E));
  XTE_TRY(check_score(score_function, "score_function"));
  XTE_TRY(check_topk(topk, a.E));
  XTE_TRY(view(scores, "scores", F32, a.T, a.E, &a.probs));
  XTE_TRY(view_opt(routing_map, "routing_map", U8, a.T, a.E, &a.map));
  XTE_TRY(view_opt(routing_bits, "routing_bits", U8, a.T, cdiv(a.E, 8), &a.bits));
  XTE_TRY(view(saved, "saved", F32, a.T, a.E, &a.saved));
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->router_forward != NULL, "router_forward"));
  a.topk = topk;
  a.score = (int)score_function;
  a.pre_softmax = 1;
  a.num_groups = a.group_topk = 1;
  a.scaling = 1.0f;
  a.aux = 1;
  xte_clear_error();
  return ex.ops->moe->router_forward(&a, ex.handle);
}

xte_status xte_router_aux_scores_backward(const xte_tensor *grad_scores, const xte_tensor *saved,
                                          const xte_tensor *logits, int topk,
                                          xte_router_score score_function, xte_tensor *grad_logits,
                                          xte_stream stream) {
  xte_router_bwd_args a;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(grad_scores, "grad_scores");
  XTE_CHECK_PTR(saved, "saved");
  XTE_CHECK_PTR(grad_logits, "grad_logits");
  XTE_TRY(check_score(score_function, "score_function"));
  XTE_TRY(grad_view(grad_scores, "grad_scores", &a));
  XTE_TRY(check_topk(topk, a.E));
  XTE_TRY(bwd_views(saved, logits, (int)score_function, grad_logits, &a));
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->router_backward != NULL, "router_backward"));
  a.topk = topk;
  a.score = (int)score_function;
  a.pre_softmax = 1;
  a.scaling = 1.0f;
  a.aux = 1;
  xte_clear_error();
  return ex.ops->moe->router_backward(&a, ex.handle);
}

/* num_experts < 0: the columns E (the token-level loss); else 1..E dividing E (the sequence-level
 * loss: E = num_experts * sequences). */
static xte_status aux_common(const xte_tensor *tpe, int64_t E, int64_t num_experts, int64_t N,
                             int topk, float coeff, xte_aux_loss_args *a) {
  XTE_TRY(vec(tpe, "tokens_per_expert", I32 | I64 | F32 | BF16, E, &a->tpe));
  if (num_experts < 0) num_experts = E;
  if (num_experts < 1 || num_experts > E || E % num_experts)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "num_experts = %lld: want 1..%lld dividing the %lld columns",
                         (long long)num_experts, (long long)E, (long long)E);
  a->num_experts = num_experts;
  if (N < 1)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "total_num_tokens = %lld: want >= 1",
                         (long long)N);
  if (topk < 1 || topk > num_experts)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "topk = %d: want 1..num_experts (%lld)", topk,
                         (long long)num_experts);
  if (!isfinite(coeff)) return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "coeff must be finite");
  a->N = N;
  a->topk = topk;
  a->coeff = coeff;
  return XTE_SUCCESS;
}

xte_status xte_moe_aux_loss_forward(const xte_tensor *probs, const xte_tensor *tokens_per_expert,
                                    int64_t total_num_tokens, int topk, float coeff,
                                    float *aux_loss, xte_stream stream) {
  return xte_moe_aux_loss_forward_ex(probs, tokens_per_expert, total_num_tokens, -1, topk, coeff,
                                     aux_loss, stream);
}

xte_status xte_moe_aux_loss_forward_ex(const xte_tensor *probs, const xte_tensor *tokens_per_expert,
                                       int64_t total_num_tokens, int64_t num_experts, int topk,
                                       float coeff, float *aux_loss, xte_stream stream) {
  xte_aux_loss_args a;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(probs, "probs");
  XTE_CHECK_PTR(tokens_per_expert, "tokens_per_expert");
  XTE_CHECK_PTR(aux_loss, "aux_loss");
  if ((uintptr_t)aux_loss % _Alignof(float))
    return xte_set_error(XTE_ERROR_ALIGNMENT, "aux_loss is not aligned to %d bytes",
                         (int)_Alignof(float));
  XTE_TRY(view(probs, "probs", F32, -1, -1, &a.probs));
  a.T = a.probs.rows;
  a.E = a.probs.cols;
  if (a.E < 1) return xte_set_error(XTE_ERROR_SHAPE, "probs has no experts (columns)");
  XTE_TRY(aux_common(tokens_per_expert, a.E, num_experts, total_num_tokens, topk, coeff, &a));
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->aux_loss != NULL, "aux_loss"));
  a.aux_out = aux_loss;
  xte_clear_error();
  return ex.ops->moe->aux_loss(&a, 0, ex.handle);
}

xte_status xte_moe_aux_loss_backward(const xte_tensor *tokens_per_expert, int64_t total_num_tokens,
                                     int topk, float coeff, float grad_aux, xte_tensor *grad_probs,
                                     xte_stream stream) {
  return xte_moe_aux_loss_backward_ex(tokens_per_expert, total_num_tokens, -1, topk, coeff,
                                      grad_aux, grad_probs, stream);
}

xte_status xte_moe_aux_loss_backward_ex(const xte_tensor *tokens_per_expert,
                                        int64_t total_num_tokens, int64_t num_experts, int topk,
                                        float coeff, float grad_aux, xte_tensor *grad_probs,
                                        xte_stream stream) {
  xte_aux_loss_args a;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(tokens_per_expert, "tokens_per_expert");
  XTE_CHECK_PTR(grad_probs, "grad_probs");
  XTE_TRY(view(grad_probs, "grad_probs", F32, -1, -1, &a.grad_probs));
  a.T = a.grad_probs.rows;
  a.E = a.grad_probs.cols;
  if (a.E < 1) return xte_set_error(XTE_ERROR_SHAPE, "grad_probs has no experts (columns)");
  XTE_TRY(aux_common(tokens_per_expert, a.E, num_experts, total_num_tokens, topk, coeff, &a));
  if (!isfinite(grad_aux))
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "grad_aux must be finite");
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->aux_loss != NULL, "aux_loss"));
  a.grad_aux = grad_aux;
  xte_clear_error();
  return ex.ops->moe->aux_loss(&a, 1, ex.handle);
}

/* ================================================================== token movement */

static xte_status route_view(const xte_moe_routing *routing, xte_moe_route *r, int64_t T_want) {
  XTE_CHECK_PTR(routing, "routing");
  memset(r, 0, sizeof *r);
  if ((routing->routing_map && routing->routing_map->data) ==
      (routing->topk_idx && routing->topk_idx->data))
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "routing: give exactly one of routing_map and topk_idx");
  if (routing->num_experts < 1 || routing->num_experts > XTE_MOE_MAX_EXPERTS)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "routing->num_experts = %lld: want 1..%lld",
                         (long long)routing->num_experts, (long long)XTE_MOE_MAX_EXPERTS);
  r->E = routing->num_experts;
  if (routing->routing_map && routing->routing_map->data) {
    XTE_TRY(view(routing->routing_map, "routing->routing_map", U8, T_want, r->E, &r->map));
    r->T = r->map.rows;
  } else {
    XTE_TRY(view(routing->topk_idx, "routing->topk_idx", I32 | I64, T_want, -1, &r->idx));
    r->T = r->idx.rows;
    r->K = r->idx.cols;
    if (r->K < 1) return xte_set_error(XTE_ERROR_SHAPE, "routing->topk_idx has no columns");
  }
  return XTE_SUCCESS;
}

xte_permute_config xte_permute_config_default(void) {
  xte_permute_config c;
  memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.num_out_tokens = -1;
  c.align = 1;
  return c;
}

/* The caller's config (NULL: the default) under the config ABI rule (src/core/config.h). */
static xte_status permute_cfg(const xte_permute_config *config, xte_permute_args *a) {
  const xte_permute_config def = xte_permute_config_default();
  xte_permute_config c;
  XTE_TRY(xte_config_read(config, "config", XTE_CONFIG_END(xte_permute_config, align), sizeof c,
                          &def, &c));
  a->cap = c.num_out_tokens;
  a->align = c.align > 1 ? c.align : 1;
  if (a->cap < 0) a->cap = -1;
  if (a->align > (1 << 20))
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->align = %lld is too large",
                         (long long)a->align);
  return XTE_SUCCESS;
}

xte_status xte_moe_permute_rows(const xte_moe_routing *routing, const xte_permute_config *config,
                                int64_t *rows, xte_stream stream) {
  xte_permute_args a;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(rows, "rows");
  if ((uintptr_t)rows % _Alignof(int64_t))
    return xte_set_error(XTE_ERROR_ALIGNMENT, "rows is not aligned to %d bytes",
                         (int)_Alignof(int64_t));
  XTE_TRY(route_view(routing, &a.r, -1));
  if (!a.r.K) a.r.K = a.r.E;
  XTE_TRY(permute_cfg(config, &a));
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->permute != NULL, "permute"));
  a.rows_out = rows;
  xte_clear_error();
  return ex.ops->moe->permute(&a, ex.handle);
}

xte_status xte_moe_permute(const xte_tensor *input, const xte_tensor *input_scales,
                           const xte_moe_routing *routing, const xte_permute_config *config,
                           xte_tensor *output, xte_tensor *output_scales, xte_tensor *row_map,
                           xte_permute_outputs *extra, xte_stream stream) {
  xte_permute_args a;
  xte_exec ex;
  int fp8;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(input, "input");
  XTE_CHECK_PTR(output, "output");
  XTE_CHECK_PTR(row_map, "row_map");
  XTE_TRY(view(input, "input", F32 | BF16 | F16 | DT(XTE_DTYPE_E4M3) | DT(XTE_DTYPE_E5M2), -1, -1,
               &a.in));
  XTE_TRY(route_view(routing, &a.r, a.in.rows));
  XTE_TRY(view(row_map, "row_map", I32, a.in.rows, a.r.idx.data ? a.r.K : -1, &a.row_map));
  a.r.K = a.row_map.cols;
  if (a.r.K < 1) return xte_set_error(XTE_ERROR_SHAPE, "row_map has no columns");
  XTE_TRY(permute_cfg(config, &a));
  XTE_TRY(view(output, "output", DT(input->dtype), -1, a.in.cols, &a.out));
  fp8 = input->dtype == XTE_DTYPE_E4M3 || input->dtype == XTE_DTYPE_E5M2;
  if (fp8) {
    if (!input_scales || !input_scales->data || !output_scales || !output_scales->data)
      return xte_set_error(
          XTE_ERROR_NULL_POINTER, "%s is NULL: an fp8 input moves its scales along",
          (!input_scales || !input_scales->data) ? "input_scales" : "output_scales");
    XTE_TRY(view(input_scales, "input_scales", F32 | DT(XTE_DTYPE_E8M0), a.in.rows, -1, &a.in_s));
    XTE_TRY(view(output_scales, "output_scales", DT(input_scales->dtype), a.out.rows, a.in_s.cols,
                 &a.out_s));
  } else if ((input_scales && input_scales->data) || (output_scales && output_scales->data)) {
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "input_scales / output_scales are for fp8 inputs only (input is %s)",
                         xte_dtype_name(input->dtype));
  }
  if (extra) {
    XTE_TRY(vec_opt(&extra->expert_offsets, "extra->expert_offsets", I64, a.r.E + 1, &a.offsets));
    XTE_TRY(
        vec_opt(&extra->tokens_per_expert, "extra->tokens_per_expert", I32 | I64, a.r.E, &a.tpe));
    XTE_TRY(
        vec_opt(&extra->row_to_expert, "extra->row_to_expert", I32, a.out.rows, &a.row_to_expert));
  }
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->permute != NULL, "permute"));
  xte_clear_error();
  return ex.ops->moe->permute(&a, ex.handle);
}

static xte_status unpermute_common(const xte_moe_routing *routing, const xte_tensor *row_map,
                                   const xte_tensor *probs, int64_t T, xte_unpermute_args *a) {
  XTE_TRY(route_view(routing, &a->r, T));
  XTE_TRY(view(row_map, "row_map", I32, T, a->r.idx.data ? a->r.K : -1, &a->row_map));
  a->r.K = a->row_map.cols;
  if (a->r.K < 1) return xte_set_error(XTE_ERROR_SHAPE, "row_map has no columns");
  a->probs_dense = a->r.map.data != NULL;
  XTE_TRY(view_opt(probs, "probs", F32, T, a->probs_dense ? a->r.E : a->r.K, &a->probs));
  return XTE_SUCCESS;
}

/* out[t] = sum over the token's slots of (prob *) in[row]: the unpermute, and the backward of the
 * permute (no probs), which is the same gather-sum. */
static xte_status gather_sum(const xte_tensor *in, const char *in_name, xte_tensor *out,
                             const char *out_name, const xte_moe_routing *routing,
                             const xte_tensor *row_map, const xte_tensor *probs,
                             xte_stream stream) {
  xte_unpermute_args a;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(in, in_name);
  XTE_CHECK_PTR(row_map, "row_map");
  XTE_CHECK_PTR(out, out_name);
  XTE_TRY(view(in, in_name, F32 | BF16 | F16, -1, -1, &a.in));
  XTE_TRY(view(out, out_name, F32 | BF16 | F16, -1, a.in.cols, &a.out));
  XTE_TRY(unpermute_common(routing, row_map, probs, a.out.rows, &a));
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->unpermute != NULL, "unpermute"));
  xte_clear_error();
  return ex.ops->moe->unpermute(&a, XTE_UNPERMUTE_FWD, ex.handle);
}

xte_status xte_moe_unpermute(const xte_tensor *input, const xte_moe_routing *routing,
                             const xte_tensor *row_map, const xte_tensor *probs, xte_tensor *out,
                             xte_stream stream) {
  return gather_sum(input, "input", out, "out", routing, row_map, probs, stream);
}

xte_status xte_moe_permute_backward(const xte_tensor *grad_output, const xte_moe_routing *routing,
                                    const xte_tensor *row_map, xte_tensor *grad_input,
                                    xte_stream stream) {
  return gather_sum(grad_output, "grad_output", grad_input, "grad_input", routing, row_map, NULL,
                    stream);
}

xte_status xte_moe_unpermute_backward(const xte_tensor *grad_out, const xte_tensor *input,
                                      const xte_moe_routing *routing, const xte_tensor *row_map,
                                      const xte_tensor *probs, xte_tensor *grad_input,
                                      xte_tensor *grad_probs, xte_stream stream) {
  xte_unpermute_args a;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(grad_out, "grad_out");
  XTE_CHECK_PTR(row_map, "row_map");
  XTE_CHECK_PTR(grad_input, "grad_input");
  XTE_TRY(view(grad_out, "grad_out", F32 | BF16 | F16, -1, -1, &a.grad_out));
  XTE_TRY(view(grad_input, "grad_input", F32 | BF16 | F16, -1, a.grad_out.cols, &a.grad_in));
  XTE_TRY(unpermute_common(routing, row_map, probs, a.grad_out.rows, &a));
  if (grad_probs && grad_probs->data) {
    if (!a.probs.data)
      return xte_set_error(XTE_ERROR_NULL_POINTER, "probs is NULL but grad_probs is asked for");
    XTE_CHECK_PTR(input, "input");
    XTE_TRY(view(input, "input", F32 | BF16 | F16, a.grad_in.rows, a.grad_out.cols, &a.fwd_in));
    XTE_TRY(view(grad_probs, "grad_probs", F32, a.probs.rows, a.probs.cols, &a.grad_probs));
  }
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->unpermute != NULL, "unpermute"));
  xte_clear_error();
  return ex.ops->moe->unpermute(&a, XTE_UNPERMUTE_BWD, ex.handle);
}

xte_status xte_moe_sort_chunks_by_index(const xte_tensor *input, const xte_tensor *split_sizes,
                                        const xte_tensor *sorted_index, xte_tensor *output,
                                        xte_tensor *row_map, xte_stream stream) {
  xte_sort_chunks_args a;
  xte_exec ex;
  int64_t n, r, c, ld;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(input, "input");
  XTE_CHECK_PTR(split_sizes, "split_sizes");
  XTE_CHECK_PTR(sorted_index, "sorted_index");
  XTE_CHECK_PTR(output, "output");
  XTE_TRY(view(input, "input", 0xFFFFFFFFu, -1, -1, &a.in));
  XTE_TRY(view(output, "output", DT(input->dtype), a.in.rows, a.in.cols, &a.out));
  XTE_TRY(xte_tensor_view2d(split_sizes, "split_sizes", &r, &c, &ld));
  n = r * c;
  if (n < 1) return xte_set_error(XTE_ERROR_SHAPE, "split_sizes is empty");
  XTE_TRY(vec(split_sizes, "split_sizes", I32 | I64, n, &a.split));
  XTE_TRY(vec(sorted_index, "sorted_index", I32 | I64, n, &a.index));
  XTE_TRY(vec_opt(row_map, "row_map", I32, a.in.rows, &a.row_map));
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->sort_chunks != NULL, "sort_chunks"));
  a.n = n;
  xte_clear_error();
  return ex.ops->moe->sort_chunks(&a, ex.handle);
}

xte_status xte_moe_sort_chunks_backward(const xte_tensor *grad_output, const xte_tensor *row_map,
                                        xte_tensor *grad_input, xte_stream stream) {
  xte_sort_chunks_args a;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(grad_output, "grad_output");
  XTE_CHECK_PTR(row_map, "row_map");
  XTE_CHECK_PTR(grad_input, "grad_input");
  XTE_TRY(view(grad_output, "grad_output", 0xFFFFFFFFu, -1, -1, &a.in));
  XTE_TRY(view(grad_input, "grad_input", DT(grad_output->dtype), a.in.rows, a.in.cols, &a.out));
  XTE_TRY(vec(row_map, "row_map", I32, a.in.rows, &a.row_map));
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->sort_chunks != NULL, "sort_chunks"));
  a.backward = 1;
  xte_clear_error();
  return ex.ops->moe->sort_chunks(&a, ex.handle);
}

xte_status xte_moe_dispatch_layout(const xte_tensor *topk_idx, int64_t num_experts, int num_ranks,
                                   xte_tensor *tokens_per_rank, xte_tensor *tokens_per_expert,
                                   xte_tensor *is_token_in_rank, xte_stream stream) {
  xte_dispatch_args a;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(topk_idx, "topk_idx");
  XTE_TRY(view(topk_idx, "topk_idx", I32 | I64, -1, -1, &a.idx));
  if (num_experts < 1 || num_experts > XTE_MOE_MAX_EXPERTS)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "num_experts = %lld: want 1..%lld",
                         (long long)num_experts, (long long)XTE_MOE_MAX_EXPERTS);
  if (num_ranks < 1 || num_experts % num_ranks)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "num_ranks = %d: want >= 1 and a divisor of num_experts (%lld)", num_ranks,
                         (long long)num_experts);
  a.T = a.idx.rows;
  a.E = num_experts;
  a.ranks = num_ranks;
  XTE_TRY(vec_opt(tokens_per_rank, "tokens_per_rank", I32, num_ranks, &a.tpr));
  XTE_TRY(vec_opt(tokens_per_expert, "tokens_per_expert", I32, num_experts, &a.tpe));
  XTE_TRY(view_opt(is_token_in_rank, "is_token_in_rank", U8, a.T, num_ranks, &a.in_rank));
  if (!a.tpr.data && !a.tpe.data && !a.in_rank.data)
    return xte_set_error(XTE_ERROR_NULL_POINTER, "every output of the dispatch layout is NULL");
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->dispatch_layout != NULL, "dispatch_layout"));
  xte_clear_error();
  return ex.ops->moe->dispatch_layout(&a, ex.handle);
}

/* ================================================================== SwiGLU */

static xte_status swiglu_in(const xte_tensor *input, xte_swiglu_args *a) {
  XTE_TRY(view(input, "input", F32 | BF16, -1, -1, &a->x));
  if (a->x.cols % 2)
    return xte_set_error(XTE_ERROR_SHAPE, "input has %lld columns: want an even 2F (gate | up)",
                         (long long)a->x.cols);
  a->T = a->x.rows;
  a->F = a->x.cols / 2;
  return XTE_SUCCESS;
}

xte_status xte_swiglu(const xte_tensor *input, xte_tensor *out, xte_stream stream) {
  xte_swiglu_args a;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(input, "input");
  XTE_CHECK_PTR(out, "out");
  XTE_TRY(swiglu_in(input, &a));
  XTE_TRY(view(out, "out", F32 | BF16, a.T, a.F, &a.out));
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->swiglu != NULL, "swiglu"));
  xte_clear_error();
  return ex.ops->moe->swiglu(&a, ex.handle);
}

xte_status xte_dswiglu(const xte_tensor *grad_out, const xte_tensor *input, xte_tensor *grad_input,
                       xte_stream stream) {
  xte_swiglu_args a;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(grad_out, "grad_out");
  XTE_CHECK_PTR(input, "input");
  XTE_CHECK_PTR(grad_input, "grad_input");
  XTE_TRY(swiglu_in(input, &a));
  XTE_TRY(view(grad_out, "grad_out", F32 | BF16, a.T, a.F, &a.dy));
  XTE_TRY(view(grad_input, "grad_input", F32 | BF16, a.T, 2 * a.F, &a.out));
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->swiglu != NULL, "swiglu"));
  a.backward = 1;
  xte_clear_error();
  return ex.ops->moe->swiglu(&a, ex.handle);
}

/* The quantization half of a fused SwiGLU: the output checks of xte_quantize, restricted to the
 * 1x128 block recipes and their fp32-scale layouts. */
static xte_status fused_quant(int64_t M, int64_t K, xte_dtype act_dtype, xte_qtensor *out,
                              const xte_quant_config *config, xte_quant_args *q) {
  int c;
  XTE_CHECK_PTR(out, "out");
  if (act_dtype != XTE_DTYPE_FP32 && act_dtype != XTE_DTYPE_BF16)
    return xte_set_error(XTE_ERROR_DTYPE, "act_dtype is %s: want fp32 or bf16",
                         xte_dtype_name(act_dtype));
  if (out->scaling_mode != XTE_SCALING_BLOCK_1x128)
    return xte_set_error(XTE_ERROR_UNSUPPORTED,
                         "out->scaling_mode %d: the fused SwiGLU quantizes in 1x128 blocks only",
                         (int)out->scaling_mode);
  for (c = 0; c < 2; c++) {
    const xte_scale_tensor *s = c ? &out->columnwise_scale_inv : &out->rowwise_scale_inv;
    if ((c ? out->columnwise.data : out->rowwise.data) && s->layout != XTE_SCALE_LAYOUT_COMPACT &&
        s->layout != XTE_SCALE_LAYOUT_TE_GEMM && s->layout != XTE_SCALE_LAYOUT_DEEPGEMM)
      return xte_set_error(XTE_ERROR_UNSUPPORTED, "%s.layout %d: want COMPACT, TE_GEMM or DEEPGEMM",
                           c ? "out->columnwise_scale_inv" : "out->rowwise_scale_inv",
                           (int)s->layout);
  }
  return xte_quant_prepare(M, K, act_dtype == XTE_DTYPE_BF16 ? XTE_NUM_IN_BF16 : XTE_NUM_IN_F32,
                           out, config, q);
}

xte_status xte_swiglu_quantize(const xte_tensor *input, xte_dtype act_dtype, xte_qtensor *out,
                               const xte_quant_config *config, xte_stream stream) {
  xte_swiglu_args a;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(input, "input");
  XTE_TRY(swiglu_in(input, &a));
  XTE_TRY(fused_quant(a.T, a.F, act_dtype, out, config, &a.q));
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->swiglu != NULL, "swiglu"));
  a.fused = 1;
  a.act_dtype = (int)act_dtype;
  xte_clear_error();
  return ex.ops->moe->swiglu(&a, ex.handle);
}

xte_status xte_dswiglu_quantize(const xte_tensor *grad_out, const xte_tensor *input,
                                xte_dtype act_dtype, xte_qtensor *out,
                                const xte_quant_config *config, xte_stream stream) {
  xte_swiglu_args a;
  xte_exec ex;
  memset(&a, 0, sizeof a);
  XTE_CHECK_PTR(grad_out, "grad_out");
  XTE_CHECK_PTR(input, "input");
  XTE_TRY(swiglu_in(input, &a));
  XTE_TRY(view(grad_out, "grad_out", F32 | BF16, a.T, a.F, &a.dy));
  XTE_TRY(fused_quant(a.T, 2 * a.F, act_dtype, out, config, &a.q));
  XTE_TRY(moe_exec(stream, &ex));
  XTE_TRY(moe_has(&ex, ex.ops->moe->swiglu != NULL, "swiglu"));
  a.fused = 1;
  a.backward = 1;
  a.act_dtype = (int)act_dtype;
  xte_clear_error();
  return ex.ops->moe->swiglu(&a, ex.handle);
}
