/* `xte moe`: the layer (tools/moe/moe.h): its buffers, its weights, the kernel steps with their
 * flops and bytes, and one forward (+ backward) through xte.
 *
 * Forward:  router gate (fp32 GEMM, OpenBLAS) -> xte_router_forward -> xte_moe_permute (bf16,
 *           each expert padded to 128 rows with the backward) -> xte_quantize 1x128 (rowwise,
 *           + columnwise with the backward) -> grouped GEMM gate/up (128x128 weights) ->
 *           xte_swiglu_quantize -> grouped GEMM down -> xte_moe_unpermute with the probs; the
 *           shared expert: quantize -> GEMM -> SwiGLU + quantize -> GEMM accumulating into the
 *           routed output.
 * Backward: unpermute backward (grad rows + grad probs) -> quantize -> grouped down dgrad and
 *           k-grouped down wgrad -> dSwiGLU + quantize -> grouped gate/up dgrad and k-grouped
 *           gate/up wgrad -> permute backward; the shared expert's dgrad / wgrad GEMMs; the router
 *           backward and its gate GEMMs (fp32, OpenBLAS). */
#include <cblas.h>
#include <stdio.h>
#include <string.h>

#include "moe.h"
#include "synth.h"

int moe_col_transposed(xte_recipe r) {
  return r != XTE_RECIPE_MTFP8 && r != XTE_RECIPE_MX_TE && r != XTE_RECIPE_MX_OCP;
}

static void scale_tensor(xte_scale_tensor *s, void *data, int64_t rows, int64_t cols) {
  s->data = data;
  s->dtype = XTE_DTYPE_FP32;
  s->rows = rows;
  s->cols = cols;
  s->layout = XTE_SCALE_LAYOUT_COMPACT;
}

xte_status moe_qalloc(xte_qtensor *q, int64_t M, int64_t K, xte_scaling_mode mode,
                      xte_recipe recipe, int row, int col, moe_alloc_fn alloc, void *ctx, int cat) {
  int64_t sr = 0, sc = 0;
  xte_status rc = XTE_SUCCESS, r;
  memset(q, 0, sizeof *q);
  q->scaling_mode = mode;
  q->recipe = recipe;
  if (row) {
    rc = xte_quantize_scale_shape(M, K, mode, recipe, XTE_SCALE_LAYOUT_COMPACT, 0, &sr, &sc);
    q->rowwise = xte_tensor_2d(alloc(ctx, (size_t)(M * K), cat), XTE_DTYPE_E4M3, M, K);
    scale_tensor(&q->rowwise_scale_inv, alloc(ctx, (size_t)(sr * sc) * 4, cat), sr, sc);
  }
  if (col) {
    int tr = moe_col_transposed(recipe);
    r = xte_quantize_scale_shape(M, K, mode, recipe, XTE_SCALE_LAYOUT_COMPACT, 1, &sr, &sc);
    if (rc == XTE_SUCCESS) rc = r;
    q->columnwise =
        xte_tensor_2d(alloc(ctx, (size_t)(M * K), cat), XTE_DTYPE_E4M3, tr ? K : M, tr ? M : K);
    scale_tensor(&q->columnwise_scale_inv, alloc(ctx, (size_t)(sr * sc) * 4, cat), sr, sc);
  }
  return rc;
}

static void *book_alloc(void *ctx, size_t bytes, int cat) {
  return mem((membook *)ctx, bytes, cat);
}

/* A qtensor for an [M, K] input of the layer's recipe, from the memory book (dry: counted). */
static void qalloc(layer *L, xte_qtensor *q, int64_t M, int64_t K, xte_scaling_mode mode, int row,
                   int col, int cat) {
  (void)moe_qalloc(q, M, K, mode, L->o.recipe, row, col, book_alloc, &L->mb, cat);
}

/* Phase A: inputs, router outputs (small; needed to know the permuted rows R). */
void alloc_inputs(layer *L) {
  membook *m = &L->mb;
  int64_t T = L->T, H = L->H, E = L->E, k = L->k;
  L->x = (uint16_t *)mem(m, (size_t)(T * H) * 2, CAT_INPUT);
  L->xf = (float *)mem(m, (size_t)(T * H) * 4, CAT_INPUT);
  L->Wr = (float *)mem(m, (size_t)(E * H) * 4, CAT_INPUT);
  L->bias = (float *)mem(m, (size_t)E * 4, CAT_INPUT);
  L->logits = (float *)mem(m, (size_t)(T * E) * 4, CAT_INPUT);
  L->probs = (float *)mem(m, (size_t)(T * E) * 4, CAT_INPUT);
  L->saved = (float *)mem(m, (size_t)(T * E) * 4, CAT_INPUT);
  L->map = (uint8_t *)mem(m, (size_t)(T * E), CAT_INPUT);
  L->row_map = (int32_t *)mem(m, (size_t)(T * k) * 4, CAT_INPUT);
  L->offs = (int64_t *)mem(m, (size_t)(E + 1) * 8, CAT_INPUT);
  L->tpe = (int64_t *)mem(m, (size_t)E * 8, CAT_INPUT);
  L->m = (int64_t *)mem(m, (size_t)E * 8, CAT_INPUT);
  L->kpad = (int64_t *)mem(m, (size_t)E * 8, CAT_INPUT);
  if (L->bwd) {
    L->dy = (uint16_t *)mem(m, (size_t)(T * H) * 2, CAT_INPUT);
    L->gprobs = (float *)mem(m, (size_t)(T * E) * 4, CAT_INPUT);
    L->dlogits = (float *)mem(m, (size_t)(T * E) * 4, CAT_INPUT);
    L->dWr = (float *)mem(m, (size_t)(E * H) * 4, CAT_WGRAD);
  }
}

/* Phase B: weights, activations, gradients (R known). */
void alloc_layer(layer *L) {
  membook *m = &L->mb;
  int64_t T = L->T, H = L->H, F = L->F, E = L->E, R = L->R;
  int b = L->bwd, s = L->shared;
  qalloc(L, &L->Wgu, E * 2 * F, H, XTE_SCALING_BLOCK_128x128, 1, 0, CAT_WEIGHT);
  qalloc(L, &L->Wd, E * H, F, XTE_SCALING_BLOCK_128x128, 1, 0, CAT_WEIGHT);
  L->xp = (uint16_t *)mem(m, (size_t)(R * H) * 2, CAT_ACT);
  qalloc(L, &L->qx, R, H, XTE_SCALING_BLOCK_1x128, 1, b, CAT_ACT);
  L->h = (uint16_t *)mem(m, (size_t)(R * 2 * F) * 2, CAT_ACT);
  qalloc(L, &L->qa, R, F, XTE_SCALING_BLOCK_1x128, 1, b, CAT_ACT);
  L->y = (uint16_t *)mem(m, (size_t)(R * H) * 2, CAT_ACT);
  L->out = (uint16_t *)mem(m, (size_t)(T * H) * 2, CAT_INPUT);
  if (s) {
    qalloc(L, &L->Wsgu, 2 * F, H, XTE_SCALING_BLOCK_128x128, 1, 0, CAT_WEIGHT);
    qalloc(L, &L->Wsd, H, F, XTE_SCALING_BLOCK_128x128, 1, 0, CAT_WEIGHT);
    qalloc(L, &L->qxs, T, H, XTE_SCALING_BLOCK_1x128, 1, b, CAT_ACT);
    L->hs = (uint16_t *)mem(m, (size_t)(T * 2 * F) * 2, CAT_ACT);
    qalloc(L, &L->qas, T, F, XTE_SCALING_BLOCK_1x128, 1, b, CAT_ACT);
  }
  if (!b) return;
  L->dyp = (uint16_t *)mem(m, (size_t)(R * H) * 2, CAT_ACT);
  qalloc(L, &L->qdyp, R, H, XTE_SCALING_BLOCK_1x128, 1, 1, CAT_ACT);
  L->da = (uint16_t *)mem(m, (size_t)(R * F) * 2, CAT_ACT);
  qalloc(L, &L->qdh, R, 2 * F, XTE_SCALING_BLOCK_1x128, 1, 1, CAT_ACT);
  L->dxp = (uint16_t *)mem(m, (size_t)(R * H) * 2, CAT_ACT);
  L->dx = (float *)mem(m, (size_t)(T * H) * 4, CAT_INPUT);
  L->dWd = (float *)mem(m, (size_t)(E * H * F) * 4, CAT_WGRAD);
  L->dWgu = (float *)mem(m, (size_t)(E * 2 * F * H) * 4, CAT_WGRAD);
  if (s) {
    qalloc(L, &L->qdy, T, H, XTE_SCALING_BLOCK_1x128, 1, 1, CAT_ACT);
    L->das = (uint16_t *)mem(m, (size_t)(T * F) * 2, CAT_ACT);
    qalloc(L, &L->qdhs, T, 2 * F, XTE_SCALING_BLOCK_1x128, 1, 1, CAT_ACT);
    L->dWsd = (float *)mem(m, (size_t)(H * F) * 4, CAT_WGRAD);
    L->dWsgu = (float *)mem(m, (size_t)(2 * F * H) * 4, CAT_WGRAD);
  }
}

/* ---------------------------------------------------------------- weights */

/* Every expert's weights: moe_weight_expert (synth.c) makes its FP8 codes and block scales
 * directly (no fp32 weights), on the team's threads; the pages of the weight stacks are faulted
 * in by these writes (mem.c leaves them untouched). */
static int weight_stack(layer *L, const xte_qtensor *W, int64_t G, int64_t N, int64_t K,
                        int stream0, int stride, const char *what) {
  int64_t g;
  for (g = 0; g < G; g++) {
    xte_status rc =
        moe_weight_expert(W, g, N, K, NULL, L->o.seed, (uint64_t)(stream0 + stride * g), L->st);
    if (rc != XTE_SUCCESS) {
      fprintf(stderr, "xte moe: weights %s %lld: %s: %s\n", what, (long long)g,
              xte_status_string(rc), xte_last_error());
      return -1;
    }
    progress("setup: weights %s %lld / %lld", what, (long long)(g + 1), (long long)G);
  }
  return 0;
}

int generate_weights(layer *L) {
  int64_t H = L->H, F = L->F, E = L->E;
  if (weight_stack(L, &L->Wgu, E, 2 * F, H, S_EXPERT0, 2, "gate/up") ||
      weight_stack(L, &L->Wd, E, H, F, S_EXPERT0 + 1, 2, "down"))
    return -1;
  if (L->shared && (weight_stack(L, &L->Wsgu, 1, 2 * F, H, S_SGU, 0, "shared gate/up") ||
                    weight_stack(L, &L->Wsd, 1, H, F, S_SD, 0, "shared down")))
    return -1;
  return 0;
}

/* ---------------------------------------------------------------- steps */

static void def_step(layer *L, int id, const char *name, int bwd, int kind, int shared,
                     double flops, double bytes) {
  step *s = &L->steps[id];
  s->name = name;
  s->bwd = bwd;
  s->kind = kind;
  s->shared = shared;
  s->flops = flops;
  s->bytes = bytes;
  s->t = 0;
}

void define_steps(layer *L) {
  double T = (double)L->T, H = (double)L->H, F = (double)L->F, E = (double)L->E, k = (double)L->k,
         R = (double)L->R, N = (double)L->Nr;
  double q = 1.0 + 4.0 / 128; /* fp8 byte + its fp32 scale per 128 */
  int c = L->bwd;             /* columnwise copies too */
  memset(L->steps, 0, sizeof L->steps);
  def_step(L, F_RGATE, "router gate GEMM (fp32, OpenBLAS)", 0, K_GEMM32, 0, 2 * T * H * E,
           4 * (T * H + E * H + T * E));
  def_step(L, F_ROUTER, "router: sigmoid, bias, top-k", 0, K_MEM, 0, 0, 4 * T * E + 13 * T * E);
  def_step(L, F_PERMUTE, "permute (bf16)", 0, K_MEM, 0, 0, 2 * T * H + 2 * R * H + 4 * T * k);
  def_step(L, F_QX, c ? "quantize 1x128 (row + col)" : "quantize 1x128", 0, K_MEM, 0, 0,
           2 * R * H + (1 + c) * q * R * H);
  def_step(L, F_GU, "grouped GEMM gate/up", 0, K_GEMM8, 0, 2 * N * 2 * F * H, 0);
  def_step(L, F_SWIGLU, "SwiGLU + quantize", 0, K_MEM, 0, 0, 2 * R * 2 * F + (1 + c) * q * R * F);
  def_step(L, F_DOWN, "grouped GEMM down", 0, K_GEMM8, 0, 2 * N * H * F, 0);
  def_step(L, F_UNPERM, "unpermute with probs", 0, K_MEM, 0, 0, 2 * N * H + 2 * T * H + 4 * T * E);
  if (L->shared) {
    def_step(L, F_S_QX, c ? "shared: quantize x (row + col)" : "shared: quantize x", 0, K_MEM, 1, 0,
             2 * T * H + (1 + c) * q * T * H);
    def_step(L, F_S_GU, "shared: GEMM gate/up", 0, K_GEMM8, 1, 2 * T * 2 * F * H, 0);
    def_step(L, F_S_SWIGLU, "shared: SwiGLU + quantize", 0, K_MEM, 1, 0,
             2 * T * 2 * F + (1 + c) * q * T * F);
    def_step(L, F_S_DOWN, "shared: GEMM down (+= routed)", 0, K_GEMM8, 1, 2 * T * H * F, 0);
  }
  if (!L->bwd) return;
  def_step(L, B_UNPERM, "unpermute backward (+ grad probs)", 1, K_MEM, 0, 0,
           2 * T * H + 2 * N * H + 2 * R * H + 8 * T * E);
  def_step(L, B_QDY, "quantize grad (row + col)", 1, K_MEM, 0, 0, 2 * R * H + 2 * q * R * H);
  def_step(L, B_DOWN_DG, "grouped GEMM down dgrad", 1, K_GEMM8, 0, 2 * N * H * F, 0);
  def_step(L, B_DOWN_WG, "k-grouped GEMM down wgrad", 1, K_GEMM8, 0, 2 * N * H * F, 0);
  L->steps[B_DOWN_WG].xflops = 2 * R * H * F;
  def_step(L, B_DSWIGLU, "dSwiGLU + quantize", 1, K_MEM, 0, 0,
           2 * R * F + 2 * R * 2 * F + 2 * q * R * 2 * F);
  def_step(L, B_GU_DG, "grouped GEMM gate/up dgrad", 1, K_GEMM8, 0, 2 * N * 2 * F * H, 0);
  def_step(L, B_GU_WG, "k-grouped GEMM gate/up wgrad", 1, K_GEMM8, 0, 2 * N * 2 * F * H, 0);
  L->steps[B_GU_WG].xflops = 2 * R * 2 * F * H;
  def_step(L, B_PERM, "permute backward (fp32 dx)", 1, K_MEM, 0, 0, 2 * N * H + 4 * T * H);
  if (L->shared) {
    def_step(L, B_S_QDY, "shared: quantize grad (row + col)", 1, K_MEM, 1, 0,
             2 * T * H + 2 * q * T * H);
    def_step(L, B_S_DOWN_DG, "shared: GEMM down dgrad", 1, K_GEMM8, 1, 2 * T * H * F, 0);
    def_step(L, B_S_DOWN_WG, "shared: GEMM down wgrad", 1, K_GEMM8, 1, 2 * T * H * F, 0);
    def_step(L, B_S_DSWIGLU, "shared: dSwiGLU + quantize", 1, K_MEM, 1, 0,
             2 * T * F + 2 * T * 2 * F + 2 * q * T * 2 * F);
    def_step(L, B_S_GU_DG, "shared: GEMM gate/up dgrad (+= dx)", 1, K_GEMM8, 1, 2 * T * 2 * F * H,
             0);
    def_step(L, B_S_GU_WG, "shared: GEMM gate/up wgrad", 1, K_GEMM8, 1, 2 * T * 2 * F * H, 0);
  }
  def_step(L, B_ROUTER, "router backward", 1, K_MEM, 0, 0, 4 * T * E * 3 + T * E);
  def_step(L, B_RGATE_DG, "router gate dgrad (fp32, OpenBLAS, += dx)", 1, K_GEMM32, 0,
           2 * T * H * E, 4 * (2 * T * H + E * H + T * E));
  def_step(L, B_RGATE_WG, "router gate wgrad (fp32, OpenBLAS)", 1, K_GEMM32, 0, 2 * T * H * E,
           4 * (T * H + 2 * E * H + T * E));
}

static int step_fail(const layer *L, int id, xte_status rc) {
  progress_done();
  fprintf(stderr, "xte moe: %s: %s: %s\n", L->steps[id].name, xte_status_string(rc),
          xte_last_error());
  return -1;
}

#define RUN(id, call)                                                                 \
  do {                                                                                \
    double t0_ = now_s();                                                             \
    xte_status rc_ = (call);                                                          \
    if (rc_ == XTE_SUCCESS && L->st) rc_ = xte_stream_synchronize(L->st);             \
    if (timed) L->steps[id].t += now_s() - t0_;                                       \
    if (rc_ != XTE_SUCCESS) return step_fail(L, id, rc_);                             \
    progress("%s: %s", L->steps[id].bwd ? "backward" : "forward", L->steps[id].name); \
  } while (0)

#define RUN_BLAS(id, call)                      \
  do {                                          \
    double t0_ = now_s();                       \
    call;                                       \
    if (timed) L->steps[id].t += now_s() - t0_; \
  } while (0)

static xte_tensor T2(void *p, xte_dtype dt, int64_t r, int64_t c) {
  return xte_tensor_2d(p, dt, r, c);
}

xte_status router_fwd(layer *L) {
  xte_tensor lt = T2(L->logits, XTE_DTYPE_FP32, L->T, L->E);
  xte_tensor bt = xte_tensor_1d(L->bias, XTE_DTYPE_FP32, L->E);
  xte_router_outputs ro;
  memset(&ro, 0, sizeof ro);
  ro.probs = T2(L->probs, XTE_DTYPE_FP32, L->T, L->E);
  ro.routing_map = T2(L->map, XTE_DTYPE_UINT8, L->T, L->E);
  ro.saved = T2(L->saved, XTE_DTYPE_FP32, L->T, L->E);
  return xte_router_forward(&lt, &bt, &L->rcfg, &ro, L->st);
}

void router_gate(layer *L) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)L->T, (int)L->E, (int)L->H, 1.0f, L->xf,
              (int)L->H, L->Wr, (int)L->H, 0.0f, L->logits, (int)L->E);
}

/* One forward (+ backward) of the layer; timed: add the kernel times to the steps. */
int run_layer(layer *L, int timed) {
  int64_t T = L->T, H = L->H, F = L->F, E = L->E, k = L->k, R = L->R;
  xte_moe_routing rt;
  xte_tensor mapt = T2(L->map, XTE_DTYPE_UINT8, T, E);
  xte_tensor rowm = T2(L->row_map, XTE_DTYPE_INT32, T, k);
  xte_tensor probs = T2(L->probs, XTE_DTYPE_FP32, T, E);
  xte_tensor xt = T2(L->x, XTE_DTYPE_BF16, T, H), xpt = T2(L->xp, XTE_DTYPE_BF16, R, H);
  xte_tensor ht = T2(L->h, XTE_DTYPE_BF16, R, 2 * F), yt = T2(L->y, XTE_DTYPE_BF16, R, H);
  xte_tensor outt = T2(L->out, XTE_DTYPE_BF16, T, H);
  xte_permute_config pc;
  xte_permute_outputs po;
  xte_gemm_groups gc, gk;
  xte_gemm_config fw = xte_gemm_config_default(); /* the forward GEMMs: --mode */

  fw.mode = L->o.mode;
  memset(&rt, 0, sizeof rt);
  rt.routing_map = &mapt;
  rt.num_experts = E;
  pc = xte_permute_config_default();
  pc.num_out_tokens = -1;
  pc.align = L->align;
  memset(&po, 0, sizeof po);
  po.expert_offsets = xte_tensor_1d(L->offs, XTE_DTYPE_INT64, E + 1);
  po.tokens_per_expert = xte_tensor_1d(L->tpe, XTE_DTYPE_INT64, E);
  memset(&gc, 0, sizeof gc);
  gc.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
  gc.num_groups = (int)E;
  gc.group_sizes = L->m;
  gc.alignment = L->align;
  memset(&gk, 0, sizeof gk);
  gk.kind = XTE_GEMM_GROUPED_K;
  gk.num_groups = (int)E;
  gk.group_sizes = L->kpad;

  /* ---------------------------------------------------------------- forward */
  RUN_BLAS(F_RGATE, router_gate(L));
  RUN(F_ROUTER, router_fwd(L));
  RUN(F_PERMUTE, xte_moe_permute(&xt, NULL, &rt, &pc, &xpt, NULL, &rowm, &po, L->st));
  /* group sizes: host arrays (the CPU backend's outputs are host memory) */
  {
    int64_t e;
    for (e = 0; e < E; e++) {
      L->m[e] = L->tpe[e];
      L->kpad[e] = L->offs[e + 1] - L->offs[e];
    }
  }
  RUN(F_QX, xte_quantize(&xpt, &L->qx, NULL, L->st));
  RUN(F_GU, xte_gemm_grouped(&L->qx, &L->Wgu, NULL, &ht, &gc, &fw, L->st));
  RUN(F_SWIGLU, xte_swiglu_quantize(&ht, XTE_DTYPE_BF16, &L->qa, NULL, L->st));
  RUN(F_DOWN, xte_gemm_grouped(&L->qa, &L->Wd, NULL, &yt, &gc, &fw, L->st));
  RUN(F_UNPERM, xte_moe_unpermute(&yt, &rt, &rowm, &probs, &outt, L->st));
  if (L->shared) {
    xte_tensor hst = T2(L->hs, XTE_DTYPE_BF16, T, 2 * F);
    xte_gemm_config acc = fw;
    acc.accumulate = 1;
    RUN(F_S_QX, xte_quantize(&xt, &L->qxs, NULL, L->st));
    RUN(F_S_GU, xte_gemm(&L->qxs, &L->Wsgu, NULL, &hst, &fw, L->st));
    RUN(F_S_SWIGLU, xte_swiglu_quantize(&hst, XTE_DTYPE_BF16, &L->qas, NULL, L->st));
    RUN(F_S_DOWN, xte_gemm(&L->qas, &L->Wsd, &outt, &outt, &acc, L->st));
  }
  if (!L->bwd) return 0;

  /* ---------------------------------------------------------------- backward */
  {
    xte_tensor dyt = T2(L->dy, XTE_DTYPE_BF16, T, H), dypt = T2(L->dyp, XTE_DTYPE_BF16, R, H);
    xte_tensor gpt = T2(L->gprobs, XTE_DTYPE_FP32, T, E), dat = T2(L->da, XTE_DTYPE_BF16, R, F);
    xte_tensor dxpt = T2(L->dxp, XTE_DTYPE_BF16, R, H), dxt = T2(L->dx, XTE_DTYPE_FP32, T, H);
    xte_tensor dWdt = T2(L->dWd, XTE_DTYPE_FP32, E * H, F);
    xte_tensor dWgut = T2(L->dWgu, XTE_DTYPE_FP32, E * 2 * F, H);
    xte_tensor dlt = T2(L->dlogits, XTE_DTYPE_FP32, T, E);
    xte_tensor savedt = T2(L->saved, XTE_DTYPE_FP32, T, E);
    xte_gemm_config dg = fw, wg = fw;
    dg.trans_b = 1; /* dgrad: op(B) = W^T */
    wg.trans_a = 1; /* wgrad: op(A) = grad^T, op(B) = act^T (token axis = K) */
    wg.trans_b = 1;

    RUN(B_UNPERM, xte_moe_unpermute_backward(&dyt, &yt, &rt, &rowm, &probs, &dypt, &gpt, L->st));
    RUN(B_QDY, xte_quantize(&dypt, &L->qdyp, NULL, L->st));
    RUN(B_DOWN_DG, xte_gemm_grouped(&L->qdyp, &L->Wd, NULL, &dat, &gc, &dg, L->st));
    RUN(B_DOWN_WG, xte_gemm_grouped(&L->qdyp, &L->qa, NULL, &dWdt, &gk, &wg, L->st));
    RUN(B_DSWIGLU, xte_dswiglu_quantize(&dat, &ht, XTE_DTYPE_BF16, &L->qdh, NULL, L->st));
    RUN(B_GU_DG, xte_gemm_grouped(&L->qdh, &L->Wgu, NULL, &dxpt, &gc, &dg, L->st));
    RUN(B_GU_WG, xte_gemm_grouped(&L->qdh, &L->qx, NULL, &dWgut, &gk, &wg, L->st));
    RUN(B_PERM, xte_moe_permute_backward(&dxpt, &rt, &rowm, &dxt, L->st));
    if (L->shared) {
      xte_tensor hst = T2(L->hs, XTE_DTYPE_BF16, T, 2 * F);
      xte_tensor dast = T2(L->das, XTE_DTYPE_BF16, T, F);
      xte_tensor dWsdt = T2(L->dWsd, XTE_DTYPE_FP32, H, F);
      xte_tensor dWsgut = T2(L->dWsgu, XTE_DTYPE_FP32, 2 * F, H);
      xte_gemm_config dga = dg;
      dga.accumulate = 1;
      RUN(B_S_QDY, xte_quantize(&dyt, &L->qdy, NULL, L->st));
      RUN(B_S_DOWN_DG, xte_gemm(&L->qdy, &L->Wsd, NULL, &dast, &dg, L->st));
      RUN(B_S_DOWN_WG, xte_gemm(&L->qdy, &L->qas, NULL, &dWsdt, &wg, L->st));
      RUN(B_S_DSWIGLU, xte_dswiglu_quantize(&dast, &hst, XTE_DTYPE_BF16, &L->qdhs, NULL, L->st));
      RUN(B_S_GU_DG, xte_gemm(&L->qdhs, &L->Wsgu, &dxt, &dxt, &dga, L->st));
      RUN(B_S_GU_WG, xte_gemm(&L->qdhs, &L->qxs, NULL, &dWsgut, &wg, L->st));
    }
    RUN(B_ROUTER, xte_router_backward(&gpt, &mapt, &savedt, NULL, &L->rcfg, &dlt, L->st));
    RUN_BLAS(B_RGATE_DG,
             cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)H, (int)E, 1.0f,
                         L->dlogits, (int)E, L->Wr, (int)H, 1.0f, L->dx, (int)H));
    RUN_BLAS(B_RGATE_WG,
             cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)E, (int)H, (int)T, 1.0f,
                         L->dlogits, (int)E, L->xf, (int)H, 0.0f, L->dWr, (int)H));
  }
  return 0;
}

/* ---------------------------------------------------------------- checksums */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = (const uint8_t *)p;
  size_t i;
  if (!p) return h;
  for (i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static uint64_t fnv_q(uint64_t h, const xte_qtensor *q) { /* 2-D rowwise data + fp32 scales */
  const xte_scale_tensor *s = &q->rowwise_scale_inv;
  h = fnv(h, q->rowwise.data, (size_t)(q->rowwise.shape[0] * q->rowwise.shape[1]));
  return fnv(h, s->data, (size_t)(s->rows * s->cols) * 4);
}

void layer_checksum(const layer *L, uint64_t *weights, uint64_t *outputs) {
  uint64_t h = 1469598103934665603ull;
  int64_t T = L->T, H = L->H, F = L->F, E = L->E;
  h = fnv_q(fnv_q(h, &L->Wgu), &L->Wd);
  if (L->shared) h = fnv_q(fnv_q(h, &L->Wsgu), &L->Wsd);
  *weights = h;
  h = fnv(1469598103934665603ull, L->out, (size_t)(T * H) * 2);
  if (L->bwd) {
    h = fnv(h, L->dx, (size_t)(T * H) * 4);
    h = fnv(h, L->dWd, (size_t)(E * H * F) * 4);
    h = fnv(h, L->dWgu, (size_t)(E * 2 * F * H) * 4);
    if (L->shared) h = fnv(fnv(h, L->dWsd, (size_t)(H * F) * 4), L->dWsgu, (size_t)(2 * F * H) * 4);
    h = fnv(h, L->dWr, (size_t)(E * H) * 4);
  }
  *outputs = h;
}
