/* Fuzz target: xte_router_forward / backward, xte_router_aux_scores (+ backward),
 * xte_moe_aux_loss_forward / backward. */
#include "fuzz_common.h"

static const xte_dtype k_logit[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16};
static const xte_dtype k_f32[] = {XTE_DTYPE_FP32};
static const xte_dtype k_u8[] = {XTE_DTYPE_UINT8};
static const xte_dtype k_idx[] = {XTE_DTYPE_INT32, XTE_DTYPE_INT64};
static const xte_dtype k_tpe[] = {XTE_DTYPE_INT32, XTE_DTYPE_INT64, XTE_DTYPE_FP32, XTE_DTYPE_BF16};

/* A routing map: arbitrary bytes usually with about topk non-zero entries per row. */
static void fill_map(fz *f, xte_tensor *t, int topk) {
  int bad;
  size_t n = fz_tensor_bytes(t, &bad), i;
  uint8_t *m = (uint8_t *)t->data;
  if (bad || fz_g.skip || t->dtype != XTE_DTYPE_UINT8 || (fz_u8(f) & 3) == 0) return;
  memset(m, 0, n);
  for (i = 0; i < n; i++)
    if (fz_u8(f) % 8 < (unsigned)(topk > 0 ? topk : 1)) m[i] = fz_rare(f, 16) ? fz_u8(f) : 1;
  fz_resnap(m);
}

static void do_forward(fz *f) {
  int64_t T = fz_dim(f, 40), E = fz_dim(f, 40);
  xte_tensor logits, bias;
  xte_router_config cfg = xte_router_config_default();
  xte_router_outputs out;
  int have = 0, use_cfg;
  xte_status st;
  if (fz_rare(f, 16)) E = XTE_ROUTER_MAX_EXPERTS + (fz_u8(f) & 1);
  cfg.topk = fz_rare(f, 16) ? fz_enum(f, 20) : 1 + fz_u8(f) % 8;
  cfg.score_function = (xte_router_score)fz_enum(f, XTE_ROUTER_SCORE_COUNT);
  cfg.use_pre_softmax = fz_flag(f);
  cfg.num_groups = fz_rare(f, 128) ? fz_enum(f, 64) : fz_u8(f) % 5;
  cfg.group_topk = fz_rare(f, 128) ? fz_enum(f, 64) : fz_u8(f) % 4;
  cfg.scaling_factor = (fz_u8(f) & 1) ? fz_f32(f) : 1.0f;
  use_cfg = !fz_rare(f, 4);
  if (!use_cfg) cfg = xte_router_config_default();
  fz_tensor2(f, &logits, fz_dtype(f, k_logit, 2), T, E, 0, 1, "logits");
  if (fz_u8(f) & 1)
    fz_tensor2(f, &bias, fz_dtype(f, k_f32, 1), 1, E, 0, 1, "expert_bias");
  else
    memset(&bias, 0, sizeof bias);
  memset(&out, 0, sizeof out);
  if (fz_u8(f) & 1) fz_tensor2(f, &out.probs, fz_dtype(f, k_f32, 1), T, E, 1, 1, "probs"), have++;
  if (fz_u8(f) & 1)
    fz_tensor2(f, &out.routing_map, fz_dtype(f, k_u8, 1), T, E, 1, 1, "routing_map"), have++;
  if (fz_u8(f) & 1)
    fz_tensor2(f, &out.routing_bits, fz_dtype(f, k_u8, 1), T,
               E >= 0 && E < ((int64_t)1 << 40) ? (E + 7) / 8 : E, 1, 1, "routing_bits"),
        have++;
  if (fz_u8(f) & 1)
    fz_tensor2(f, &out.topk_idx, fz_dtype(f, k_idx, 2), T, cfg.topk, 1, 1, "topk_idx"), have++;
  if (fz_u8(f) & 1)
    fz_tensor2(f, &out.topk_weights, fz_dtype(f, k_f32, 1), T, cfg.topk, 1, 1, "topk_weights"),
        have++;
  if (fz_u8(f) & 1) fz_tensor2(f, &out.saved, fz_dtype(f, k_f32, 1), T, E, 1, 1, "saved"), have++;
  if (E > XTE_ROUTER_MAX_EXPERTS) fz_mark_impossible("E > XTE_ROUTER_MAX_EXPERTS");
  if (cfg.topk < 1 || cfg.topk > E) fz_mark_impossible("topk out of range");
  if (!isfinite(cfg.scaling_factor)) fz_mark_impossible("scaling_factor not finite");
  if ((unsigned)cfg.score_function >= XTE_ROUTER_SCORE_COUNT) fz_mark_impossible("score");
  if (!have) fz_mark_impossible("no output");
  if (fz_g.skip) return;
  st = xte_router_forward(&logits, bias.data ? &bias : NULL, use_cfg ? &cfg : NULL, &out,
                          fz_pick_stream(f));
  fz_check(st, "router_forward");
}

static void do_backward(fz *f) {
  int64_t T = fz_dim(f, 40), E = fz_dim(f, 40);
  xte_tensor gp, map, saved, logits, gl;
  xte_router_config cfg = xte_router_config_default();
  int with_logits;
  xte_status st;
  cfg.topk = fz_rare(f, 16) ? fz_enum(f, 20) : 1 + fz_u8(f) % 8;
  cfg.score_function = (xte_router_score)fz_enum(f, XTE_ROUTER_SCORE_COUNT);
  cfg.use_pre_softmax = fz_flag(f);
  cfg.num_groups = fz_u8(f) % 3;
  cfg.group_topk = fz_u8(f) % 3;
  cfg.scaling_factor = (fz_u8(f) & 1) ? fz_f32(f) : 1.0f;
  fz_tensor2(f, &gp, fz_dtype(f, k_f32, 1), T, E, 0, 1, "grad_probs");
  fz_tensor2(f, &map, fz_dtype(f, k_u8, 1), T, E, 0, 1, "routing_map");
  fill_map(f, &map, cfg.topk);
  fz_tensor2(f, &saved, fz_dtype(f, k_f32, 1), T, E, 0, 1, "saved");
  with_logits = (fz_u8(f) & 3) != 0;
  if (with_logits)
    fz_tensor2(f, &logits, fz_dtype(f, k_logit, 2), T, E, 0,
               cfg.score_function == XTE_ROUTER_SQRTSOFTPLUS, "logits");
  fz_tensor2(f, &gl, fz_dtype(f, k_logit, 2), T, E, 1, 1, "grad_logits");
  if (cfg.topk < 1 || cfg.topk > E) fz_mark_impossible("topk out of range");
  if ((unsigned)cfg.score_function >= XTE_ROUTER_SCORE_COUNT) fz_mark_impossible("score");
  if (fz_g.skip) return;
  st = xte_router_backward(&gp, &map, &saved, with_logits ? &logits : NULL, &cfg, &gl,
                           fz_pick_stream(f));
  fz_check(st, "router_backward");
}

static void do_aux_scores(fz *f, int backward) {
  int64_t T = fz_dim(f, 40), E = fz_dim(f, 40);
  int topk = fz_rare(f, 16) ? fz_enum(f, 20) : 1 + fz_u8(f) % 8;
  xte_router_score sf = (xte_router_score)fz_enum(f, XTE_ROUTER_SCORE_COUNT);
  xte_tensor logits, scores, map, saved, gs, gl;
  int with_map, with_logits;
  xte_status st;
  if (topk < 1 || topk > E) fz_mark_impossible("topk out of range");
  if ((unsigned)sf >= XTE_ROUTER_SCORE_COUNT) fz_mark_impossible("score");
  if (!backward) {
    fz_tensor2(f, &logits, fz_dtype(f, k_logit, 2), T, E, 0, 1, "logits");
    fz_tensor2(f, &scores, fz_dtype(f, k_f32, 1), T, E, 1, 1, "scores");
    with_map = fz_u8(f) & 1;
    if (with_map) fz_tensor2(f, &map, fz_dtype(f, k_u8, 1), T, E, 1, 1, "routing_map");
    fz_tensor2(f, &saved, fz_dtype(f, k_f32, 1), T, E, 1, 1, "saved");
    if (fz_g.skip) return;
    st = xte_router_aux_scores(&logits, topk, sf, &scores, with_map ? &map : NULL, &saved,
                               fz_pick_stream(f));
    fz_check(st, "router_aux_scores");
  } else {
    /* known defect: the aux backward offsets the NULL routing map (UBSan, moe_router.c) */
    if (fz_avoid("router_aux_bwd_null")) return;
    fz_tensor2(f, &gs, fz_dtype(f, k_f32, 1), T, E, 0, 1, "grad_scores");
    fz_tensor2(f, &saved, fz_dtype(f, k_f32, 1), T, E, 0, 1, "saved");
    with_logits = (fz_u8(f) & 3) != 0;
    if (with_logits)
      fz_tensor2(f, &logits, fz_dtype(f, k_logit, 2), T, E, 0, sf == XTE_ROUTER_SQRTSOFTPLUS,
                 "logits");
    fz_tensor2(f, &gl, fz_dtype(f, k_logit, 2), T, E, 1, 1, "grad_logits");
    if (fz_g.skip) return;
    st = xte_router_aux_scores_backward(&gs, &saved, with_logits ? &logits : NULL, topk, sf, &gl,
                                        fz_pick_stream(f));
    fz_check(st, "router_aux_scores_backward");
  }
}

static void do_aux_loss(fz *f, int backward) {
  int64_t T = fz_dim(f, 40), E = fz_dim(f, 40);
  int64_t N = fz_rare(f, 32) ? fz_hostile_i64[fz_u8(f) % FZ_NHOSTILE] : fz_dim(f, 200);
  int topk = fz_rare(f, 16) ? fz_enum(f, 20) : 1 + fz_u8(f) % 8;
  float coeff = (fz_u8(f) & 1) ? fz_f32(f) : 0.01f;
  xte_tensor probs, tpe, gp;
  xte_status st;
  void *buf;
  buf = fz_tensor2(f, &tpe, fz_dtype(f, k_tpe, 4), 1, E, 0, 1, "tokens_per_expert");
  if (fz_rare(f, 32)) { /* hostile counts */
    int bad;
    size_t nb = fz_tensor_bytes(&tpe, &bad), es = tpe.dtype == XTE_DTYPE_INT64 ? 8 : 4, i;
    if (!bad && !fz_g.skip && (tpe.dtype == XTE_DTYPE_INT32 || tpe.dtype == XTE_DTYPE_INT64)) {
      for (i = 0; (i + 1) * es <= nb; i++)
        fz_put_index(buf, tpe.dtype, (int64_t)i, fz_index(f, 0, 1000, 128));
      fz_resnap(buf);
    }
  }
  if (N < 1) fz_mark_impossible("total_num_tokens < 1");
  if (topk < 1 || topk > E) fz_mark_impossible("topk out of range");
  if (!isfinite(coeff)) fz_mark_impossible("coeff not finite");
  if (!backward) {
    float *loss;
    fz_tensor2(f, &probs, fz_dtype(f, k_f32, 1), T, E, 0, 1, "probs");
    loss = (float *)fz_alloc(f, 4, fz_misalign(f), 1, "aux_loss");
    if (fz_g.skip) return;
    st = xte_moe_aux_loss_forward(&probs, &tpe, N, topk, coeff, loss, fz_pick_stream(f));
    fz_check(st, "moe_aux_loss_forward");
  } else {
    float g = (fz_u8(f) & 1) ? fz_f32(f) : 1.0f;
    if (!isfinite(g)) fz_mark_impossible("grad_aux not finite");
    fz_tensor2(f, &gp, fz_dtype(f, k_f32, 1), T, E, 1, 1, "grad_probs");
    if (fz_g.skip) return;
    st = xte_moe_aux_loss_backward(&tpe, N, topk, coeff, g, &gp, fz_pick_stream(f));
    fz_check(st, "moe_aux_loss_backward");
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  fz_begin(&f, data, size);
  fz_pick_isa(&f);
  switch (fz_u8(&f) % 6) {
    case 0:
      do_forward(&f);
      break;
    case 1:
      do_backward(&f);
      break;
    case 2:
      do_aux_scores(&f, 0);
      break;
    case 3:
      do_aux_scores(&f, 1);
      break;
    case 4:
      do_aux_loss(&f, 0);
      break;
    default:
      do_aux_loss(&f, 1);
      break;
  }
  fz_end();
  return 0;
}
