/* Router tests: xte_router_forward / backward, aux scores and the aux loss against oracles
 * written here from the contract (include/xte/moe.h, docs/numerics.md section 8): selection by
 * sorting every candidate with qsort on (value desc, index asc, NaN last), the fp32 steps in the
 * stated order with the shared math functions (src/numerics/xte_math.h, tested exhaustively
 * elsewhere). Bit-exact on every CPU ISA, on logits with ties, -inf, NaN and huge values. The
 * backward is also checked against central finite differences of an fp64 re-computation. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>

#include "numerics/xte_math.h"
#include "test_moe_util.h"

typedef struct cand {
  float v;
  int i;
} cand;

static int cand_cmp(const void *pa, const void *pb) {
  const cand *a = (const cand *)pa, *b = (const cand *)pb;
  int na = isnan(a->v), nb = isnan(b->v);
  if (na != nb) return na ? 1 : -1;
  if (!na && a->v != b->v) return a->v > b->v ? -1 : 1;
  return a->i < b->i ? -1 : 1;
}

static int icmp(const void *a, const void *b) {
  return *(const int *)a - *(const int *)b;
}

/* The oracle's bounds (above the router's old limits, E 512 and topk 16). */
#define OMAXE 4096
#define OMAXK 4096

typedef struct rcfg {
  int E, k, score, pre, groups, gtopk, bias, bf16;
  float scale;
} rcfg;

/* The oracle for one row: probs, map, idx (rank order), weights, saved. */
static void oracle_row(const rcfg *c, const float *x, const float *bias, float *probs, uint8_t *map,
                       int *idx, float *wts, float *saved) {
  const int E = c->E < 1 ? 1 : (c->E > OMAXE ? OMAXE : c->E), k = c->k;
  int e, j;
  static float sc[OMAXE], sel[OMAXE], w[OMAXE];
  static cand cs[OMAXE];
  static uint8_t allowed[OMAXE];
  static int sel_idx[OMAXK], asc[OMAXK];
  int n = 0;
  memset(saved, 0, sizeof(float) * (size_t)E);
  if (c->score == 0) {
    if (c->pre) {
      float m = -INFINITY, s = 0.0f;
      for (e = 0; e < E; e++)
        if (!isnan(x[e]) && x[e] > m) m = x[e];
      for (e = 0; e < E; e++) {
        sc[e] = xte_expf(x[e] - m);
        s += sc[e];
      }
      for (e = 0; e < E; e++) sc[e] = sc[e] / s;
      memcpy(saved, sc, sizeof(float) * (size_t)E);
    } else {
      memcpy(sc, x, sizeof(float) * (size_t)E);
    }
  } else {
    for (e = 0; e < E; e++) sc[e] = c->score == 1 ? xte_sigmoidf(x[e]) : xte_sqrtsoftplusf(x[e]);
    memcpy(saved, sc, sizeof(float) * (size_t)E);
  }
  for (e = 0; e < E; e++) sel[e] = bias ? sc[e] + bias[e] : sc[e];
  memset(allowed, 1, (size_t)E);
  if (c->groups > 1) {
    int gs = E / c->groups, per = k / c->gtopk, g;
    static cand gc[OMAXE];
    for (g = 0; g < c->groups; g++) {
      float s = 0.0f;
      for (e = 0; e < gs; e++) {
        cs[e].v = sel[g * gs + e];
        cs[e].i = g * gs + e;
      }
      qsort(cs, (size_t)gs, sizeof(cand), cand_cmp);
      for (j = 0; j < per; j++) s += cs[j].v;
      gc[g].v = s;
      gc[g].i = g;
    }
    qsort(gc, (size_t)c->groups, sizeof(cand), cand_cmp);
    memset(allowed, 0, (size_t)E);
    for (g = 0; g < c->gtopk; g++) memset(allowed + gc[g].i * gs, 1, (size_t)gs);
  }
  for (e = 0; e < E; e++)
    if (allowed[e]) {
      cs[n].v = sel[e];
      cs[n].i = e;
      n++;
    }
  qsort(cs, (size_t)n, sizeof(cand), cand_cmp);
  for (j = 0; j < k; j++) sel_idx[j] = asc[j] = cs[j].i;
  qsort(asc, (size_t)k, sizeof(int), icmp);
  for (e = 0; e < E; e++) w[e] = 0.0f;
  if (c->score == 0 && !c->pre) {
    float m = -INFINITY, s = 0.0f;
    for (j = 0; j < k; j++)
      if (!isnan(sc[asc[j]]) && sc[asc[j]] > m) m = sc[asc[j]];
    for (j = 0; j < k; j++) {
      w[asc[j]] = xte_expf(sc[asc[j]] - m);
      s += w[asc[j]];
    }
    for (j = 0; j < k; j++) w[asc[j]] = w[asc[j]] / s;
    memcpy(saved, w, sizeof(float) * (size_t)E);
  } else if (c->score != 0 && k > 1) {
    float s = 0.0f;
    for (j = 0; j < k; j++) s += sc[asc[j]];
    s += 1e-20f;
    for (j = 0; j < k; j++) w[asc[j]] = sc[asc[j]] / s;
  } else {
    for (j = 0; j < k; j++) w[asc[j]] = sc[asc[j]];
  }
  for (e = 0; e < E; e++) {
    probs[e] = 0.0f;
    map[e] = 0;
  }
  for (j = 0; j < k; j++) {
    probs[sel_idx[j]] = c->scale * w[sel_idx[j]];
    map[sel_idx[j]] = 1;
    idx[j] = sel_idx[j];
    wts[j] = c->scale * w[sel_idx[j]];
  }
}

/* Logits with ties (values on a coarse grid), -inf, NaN and huge values. */
static void gen_logits(float *x, int T, int E, int special) {
  int i;
  for (i = 0; i < T * E; i++) {
    uint32_t r = rng_u32() % 1000;
    x[i] = (float)((int)(rng_u32() % 64) - 32) * 0.125f; /* many ties */
    if (special) {
      if (r < 5)
        x[i] = -INFINITY;
      else if (r < 8)
        x[i] = NAN;
      else if (r < 12)
        x[i] = (r & 1) ? 3e4f : -3e4f;
    }
    if (rng_u32() % 4 == 0) x[i] = rng_f() * 6.0f;
  }
}

static int same_bits(const void *a, const void *b, size_t n) {
  return memcmp(a, b, n) == 0;
}

static void run_case(const rcfg *c, int T, int special) {
  const int E = c->E, k = c->k;
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, t;
  float *x = (float *)zalloc(sizeof(float) * (size_t)(T * E));
  uint16_t *xb = (uint16_t *)zalloc(2 * (size_t)(T * E));
  float *bias = (float *)zalloc(sizeof(float) * (size_t)E);
  float *probs = (float *)zalloc(4 * (size_t)(T * E)),
        *saved = (float *)zalloc(4 * (size_t)(T * E));
  float *wts = (float *)zalloc(4 * (size_t)(T * k));
  uint8_t *map = (uint8_t *)zalloc((size_t)(T * E)),
          *bits = (uint8_t *)zalloc((size_t)(T * ((E + 7) / 8)));
  int64_t *idx = (int64_t *)zalloc(8 * (size_t)(T * k));
  static float op[OMAXE], ow[OMAXK], os[OMAXE];
  static uint8_t om[OMAXE];
  static int oi[OMAXK];
  int i;
  cr_assert(E <= OMAXE && k <= OMAXK);
  gen_logits(x, T, E, special);
  for (i = 0; i < T * E; i++) {
    xb[i] = (uint16_t)(*(uint32_t *)&x[i] >> 16);
    if (c->bf16) memcpy(&x[i], &(uint32_t){(uint32_t)xb[i] << 16}, 4);
  }
  for (i = 0; i < E; i++) bias[i] = (float)(rng_u32() % 8) * 0.0625f;
  for (ii = 0; ii < nisa; ii++) {
    xte_router_config cfg = xte_router_config_default();
    xte_router_outputs out;
    xte_tensor lt =
        c->bf16 ? xte_tensor_2d(xb, XTE_DTYPE_BF16, T, E) : xte_tensor_2d(x, XTE_DTYPE_FP32, T, E);
    xte_tensor bt = xte_tensor_1d(bias, XTE_DTYPE_FP32, E);
    cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
    cfg.topk = k;
    cfg.score_function = (xte_router_score)c->score;
    cfg.use_pre_softmax = c->pre;
    cfg.num_groups = c->groups;
    cfg.group_topk = c->gtopk;
    cfg.scaling_factor = c->scale;
    memset(&out, 0, sizeof out);
    out.probs = xte_tensor_2d(probs, XTE_DTYPE_FP32, T, E);
    out.routing_map = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E);
    out.routing_bits = xte_tensor_2d(bits, XTE_DTYPE_UINT8, T, (E + 7) / 8);
    out.topk_idx = xte_tensor_2d(idx, XTE_DTYPE_INT64, T, k);
    out.topk_weights = xte_tensor_2d(wts, XTE_DTYPE_FP32, T, k);
    out.saved = xte_tensor_2d(saved, XTE_DTYPE_FP32, T, E);
    cr_assert_eq(xte_router_forward(&lt, c->bias ? &bt : NULL, &cfg, &out, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    for (t = 0; t < T; t++) {
      int j, e;
      oracle_row(c, x + t * E, c->bias ? bias : NULL, op, om, oi, ow, os);
      cr_assert(same_bits(op, probs + t * E, 4 * (size_t)E),
                "probs row %d (isa %d, E %d k %d score %d)", t, (int)isas[ii], E, k, c->score);
      cr_assert(same_bits(om, map + t * E, (size_t)E), "map row %d", t);
      cr_assert(same_bits(os, saved + t * E, 4 * (size_t)E), "saved row %d", t);
      cr_assert(same_bits(ow, wts + t * k, 4 * (size_t)k), "weights row %d", t);
      for (j = 0; j < k; j++) cr_assert_eq(idx[t * k + j], oi[j], "idx row %d slot %d", t, j);
      for (e = 0; e < E; e++)
        cr_assert_eq((bits[t * ((E + 7) / 8) + e / 8] >> (e % 8)) & 1, om[e], "bits row %d", t);
    }
  }
  xte_cpu_set_isa(isas[nisa - 1]);
  free(x), free(xb), free(bias), free(probs), free(saved), free(wts), free(map), free(bits),
      free(idx);
}

Test(moe_router, softmax_pre_and_post) {
  rcfg c1 = {64, 8, 0, 1, 0, 0, 0, 0, 1.0f}, c2 = {64, 8, 0, 0, 0, 0, 0, 0, 2.5f};
  rcfg c3 = {7, 1, 0, 1, 0, 0, 1, 1, 1.0f};
  rng_seed(1);
  run_case(&c1, 97, 1);
  run_case(&c2, 97, 1);
  run_case(&c3, 50, 0);
}

Test(moe_router, sigmoid_bias_groups) {
  rcfg c1 = {384, 8, 1, 0, 0, 0, 1, 0, 2.827f}; /* Kimi-K2 */
  rcfg c2 = {256, 8, 1, 0, 8, 4, 1, 0, 2.5f};   /* DeepSeek-V3 */
  rcfg c3 = {512, 16, 1, 0, 16, 3, 1, 1, 1.0f};
  rng_seed(2);
  run_case(&c1, 61, 1);
  run_case(&c2, 61, 1);
  run_case(&c3, 33, 1);
}

/* Past the old limits (E 512, topk 16): topk 32 / 1024 experts as TE tests them, topk above
 * the CPU's merge-sort switch (64), topk = E, odd E, groups; every ISA, ties and specials. */
Test(moe_router, raised_limits) {
  rcfg c1 = {1024, 32, 1, 0, 8, 4, 1, 0, 1.2f}, c2 = {2051, 100, 0, 1, 0, 0, 0, 0, 1.0f};
  rcfg c3 = {96, 96, 2, 0, 0, 0, 1, 1, 1.0f}, c4 = {4096, 70, 0, 0, 0, 0, 0, 0, 2.0f};
  rcfg c5 = {1024, 65, 1, 0, 4, 2, 1, 0, 1.0f}, c6 = {130, 17, 2, 0, 0, 0, 0, 0, 1.0f};
  rng_seed(4);
  run_case(&c1, 9, 1);
  run_case(&c2, 5, 1);
  run_case(&c3, 7, 0);
  run_case(&c4, 3, 1);
  run_case(&c5, 5, 0);
  run_case(&c6, 11, 1);
}

Test(moe_router, sqrtsoftplus) {
  rcfg c1 = {128, 6, 2, 0, 4, 2, 1, 0, 1.5f}, c2 = {33, 1, 2, 0, 0, 0, 0, 0, 1.0f};
  rng_seed(3);
  run_case(&c1, 80, 1);
  run_case(&c2, 80, 1);
}

/* ---------------------------------------------------------------- backward */

/* fp64 forward with a fixed selection (sel ascending experts): probs of the selected. */
static void fwd64(const rcfg *c, const double *x, const int *sel, int k, double *p) {
  int j, e;
  double s = 0.0, m = -INFINITY;
  if (c->score == 0 && c->pre) {
    double q[512];
    for (e = 0; e < c->E; e++) m = x[e] > m ? x[e] : m;
    for (e = 0; e < c->E; e++) s += (q[e] = exp(x[e] - m));
    for (j = 0; j < k; j++) p[j] = c->scale * q[sel[j]] / s;
  } else if (c->score == 0) {
    for (j = 0; j < k; j++) m = x[sel[j]] > m ? x[sel[j]] : m;
    for (j = 0; j < k; j++) s += exp(x[sel[j]] - m);
    for (j = 0; j < k; j++) p[j] = c->scale * exp(x[sel[j]] - m) / s;
  } else {
    double sc[16];
    for (j = 0; j < k; j++) {
      double v = x[sel[j]];
      sc[j] = c->score == 1 ? 1.0 / (1.0 + exp(-v)) : sqrt(log1p(exp(v)));
      s += sc[j];
    }
    for (j = 0; j < k; j++) p[j] = c->scale * (k > 1 ? sc[j] / (s + 1e-20) : sc[j]);
  }
}

static void bwd_case(const rcfg *c, int T) {
  const int E = c->E, k = c->k;
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, t, e, j;
  float *x = (float *)zalloc(4 * (size_t)(T * E)), *probs = (float *)zalloc(4 * (size_t)(T * E));
  float *saved = (float *)zalloc(4 * (size_t)(T * E)), *g = (float *)zalloc(4 * (size_t)(T * E));
  float *gx = (float *)zalloc(4 * (size_t)(T * E)), *gx0 = (float *)zalloc(4 * (size_t)(T * E));
  uint8_t *map = (uint8_t *)zalloc((size_t)(T * E));
  xte_router_config cfg = xte_router_config_default();
  xte_router_outputs out;
  xte_tensor lt = xte_tensor_2d(x, XTE_DTYPE_FP32, T, E);
  xte_tensor gt = xte_tensor_2d(g, XTE_DTYPE_FP32, T, E),
             st = xte_tensor_2d(saved, XTE_DTYPE_FP32, T, E);
  xte_tensor mt = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E),
             gxt = xte_tensor_2d(gx, XTE_DTYPE_FP32, T, E);
  for (e = 0; e < T * E; e++) {
    x[e] = rng_f() * 4.0f;
    g[e] = rng_f();
  }
  cfg.topk = k;
  cfg.score_function = (xte_router_score)c->score;
  cfg.use_pre_softmax = c->pre;
  cfg.scaling_factor = c->scale;
  memset(&out, 0, sizeof out);
  out.probs = xte_tensor_2d(probs, XTE_DTYPE_FP32, T, E);
  out.routing_map = mt;
  out.saved = st;
  cr_assert_eq(xte_router_forward(&lt, NULL, &cfg, &out, NULL), XTE_SUCCESS);
  for (ii = 0; ii < nisa; ii++) {
    cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
    cr_assert_eq(xte_router_backward(&gt, &mt, &st, &lt, &cfg, &gxt, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    if (ii == 0)
      memcpy(gx0, gx, 4 * (size_t)(T * E));
    else
      cr_assert(same_bits(gx0, gx, 4 * (size_t)(T * E)), "isa %d differs", (int)isas[ii]);
  }
  /* central differences of L = sum_j g[sel_j] p_j(x) in fp64 */
  for (t = 0; t < T; t++) {
    int sel[16], n = 0;
    double x64[512], pp[16], pm[16], gmax = 0.0;
    for (e = 0; e < E; e++) {
      x64[e] = x[t * E + e];
      if (map[t * E + e]) sel[n++] = e;
    }
    cr_assert_eq(n, k);
    for (e = 0; e < E; e++) gmax = fmax(gmax, fabs((double)gx[t * E + e]));
    for (e = 0; e < E; e++) {
      const double h = 1e-6;
      double lp = 0.0, lm = 0.0, fd;
      x64[e] += h;
      fwd64(c, x64, sel, k, pp);
      x64[e] -= 2 * h;
      fwd64(c, x64, sel, k, pm);
      x64[e] += h;
      for (j = 0; j < k; j++) {
        lp += (double)g[t * E + sel[j]] * pp[j];
        lm += (double)g[t * E + sel[j]] * pm[j];
      }
      fd = (lp - lm) / (2 * h);
      /* fp32 kernel: a few roundings on terms bounded by the row's scale */
      cr_assert(fabs(fd - (double)gx[t * E + e]) <= 2e-6 * fmax(1.0, gmax) * c->scale * 4,
                "grad_logits[%d, %d] = %.9g, finite differences %.9g (score %d)", t, e,
                (double)gx[t * E + e], fd, c->score);
    }
  }
  free(x), free(probs), free(saved), free(g), free(gx), free(gx0), free(map);
}

Test(moe_router, backward_vs_finite_differences) {
  rcfg c1 = {32, 4, 0, 1, 0, 0, 0, 0, 1.0f}, c2 = {32, 4, 0, 0, 0, 0, 0, 0, 2.0f};
  rcfg c3 = {48, 8, 1, 0, 0, 0, 0, 0, 2.827f}, c4 = {24, 3, 2, 0, 0, 0, 0, 0, 1.0f};
  rcfg c5 = {24, 1, 1, 0, 0, 0, 0, 0, 1.0f};
  rng_seed(4);
  bwd_case(&c1, 20);
  bwd_case(&c2, 20);
  bwd_case(&c3, 20);
  bwd_case(&c4, 20);
  bwd_case(&c5, 20);
}

/* ---------------------------------------------------------------- aux loss */

static uint32_t tb32(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static float tf32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* The aux loss with NaN probs: the NaN rule of docs/numerics.md section 2 (the first NaN operand
 * as written, quieted) over the documented order (experts ascending; per expert, blocks of 1024
 * tokens ascending, tokens ascending inside a block, each sum starting from +0 with the
 * accumulator as the first operand; colsum * tpe, then C * total) keeps the first NaN met when
 * walking experts ascending and, per expert, tokens ascending: the oracle is that walk (the fp32
 * NaN quieted, fp32 -> fp64 -> fp32 keeps its sign and payload). Columns with two NaNs of
 * different payloads (in one block and across blocks), a NaN column with tpe 0, every ISA. */
Test(moe_router, aux_loss_nan_first_operand) {
  const int T = 2100, E = 6;
  float *p = (float *)zalloc(4 * (size_t)T * E), *gp = (float *)zalloc(4 * (size_t)T * E);
  int32_t tpe[6] = {3, 0, 7, 1, 2, 5};
  xte_tensor pt = xte_tensor_2d(p, XTE_DTYPE_FP32, T, E),
             tt = xte_tensor_1d(tpe, XTE_DTYPE_INT32, E),
             gt = xte_tensor_2d(gp, XTE_DTYPE_FP32, T, E);
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, t, e, cse;
  /* {column, token, bits} NaNs planted per case; -1 ends */
  static const int cols[4][6] = {
      {1, 1, -1},    /* case 0: two NaNs in column 1, one block */
      {2, 2, -1},    /* case 1: column 2, across blocks */
      {4, 1, 1, -1}, /* case 2: column 4 at token 0, column 1 later: the lower expert wins */
      {3, 3, 5, -1}, /* case 3: tpe 1 column, then column 5 */
  };
  static const int toks[4][6] = {
      {17, 900},
      {1500, 2050},
      {0, 2000, 2001},
      {10, 11, 0},
  };
  static const uint32_t nb[4][6] = {
      {0x7F800123u, 0xFFC45678u},
      {0xFFA00001u, 0x7FC0BEEFu},
      {0x7F812345u, 0xFFC00077u, 0x7FC00099u},
      {0xFF9ABCDEu, 0x7FFFFFFFu, 0xFFC0CAFEu},
  };
  for (t = 0; t < T * E; t++) p[t] = (float)((t * 37) % 101) / 128.0f;
  for (cse = 0; cse < 4; cse++) {
    uint32_t want = 0;
    int i, found = 0;
    float *saved = (float *)zalloc(4 * (size_t)T * E);
    memcpy(saved, p, 4 * (size_t)T * E);
    for (i = 0; cols[cse][i] >= 0; i++) p[toks[cse][i] * E + cols[cse][i]] = tf32(nb[cse][i]);
    for (e = 0; e < E && !found; e++) /* the oracle: the first NaN in (expert, token) order */
      for (t = 0; t < T && !found; t++)
        if (isnan(p[t * E + e])) want = tb32(p[t * E + e]) | 0x00400000u, found = 1;
    cr_assert(found);
    for (ii = 0; ii < nisa; ii++) {
      float aux = 0.0f;
      cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
      cr_assert_eq(xte_moe_aux_loss_forward(&pt, &tt, T, 2, 1e-2f, &aux, NULL), XTE_SUCCESS, "%s",
                   xte_last_error());
      cr_assert_eq(tb32(aux), want, "case %d isa %d: aux 0x%08x, want 0x%08x", cse, (int)isas[ii],
                   tb32(aux), want);
    }
    memcpy(p, saved, 4 * (size_t)T * E);
    free(saved);
  }
  /* backward: fp32(C * tpe) overflows to inf for tpe 2e9 at coeff 3e38, times grad_aux 0 is a
   * NaN made by the operation: x86's default NaN (the GPU's in the NaN-simulating build); the
   * other columns are +0 */
  tpe[3] = 2000000000;
  for (ii = 0; ii < nisa; ii++) {
    cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
    cr_assert_eq(xte_moe_aux_loss_backward(&tt, T, 2, 3e38f, 0.0f, &gt, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    for (t = 0; t < T * E; t++) {
#ifdef XTE_NAN_SIM
      const uint32_t nan = 0x7FFFFFFFu;
#else
      const uint32_t nan = 0xFFC00000u;
#endif
      cr_assert_eq(tb32(gp[t]), t % E == 3 ? nan : 0u, "grad_probs[%d] 0x%08x (isa %d)", t,
                   tb32(gp[t]), (int)isas[ii]);
    }
  }
  xte_cpu_set_isa(isas[nisa - 1]);
  free(p), free(gp);
}

Test(moe_router, aux_scores_and_loss) {
  const int T = 2500, E = 40, k = 4;
  float *x = (float *)zalloc(4 * T * E), *sc = (float *)zalloc(4 * T * E);
  float *sv = (float *)zalloc(4 * T * E), *gp = (float *)zalloc(4 * T * E);
  uint8_t *map = (uint8_t *)zalloc(T * E);
  int32_t tpe[40];
  xte_tensor lt = xte_tensor_2d(x, XTE_DTYPE_FP32, T, E),
             st = xte_tensor_2d(sc, XTE_DTYPE_FP32, T, E);
  xte_tensor vt = xte_tensor_2d(sv, XTE_DTYPE_FP32, T, E),
             mt = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E);
  xte_tensor tt = xte_tensor_1d(tpe, XTE_DTYPE_INT32, E),
             gt = xte_tensor_2d(gp, XTE_DTYPE_FP32, T, E);
  float aux;
  int i, e, t, b;
  double C, total = 0.0;
  rng_seed(5);
  for (i = 0; i < T * E; i++) x[i] = rng_f() * 3.0f;
  cr_assert_eq(xte_router_aux_scores(&lt, k, XTE_ROUTER_SIGMOID, &st, &mt, &vt, NULL), XTE_SUCCESS,
               "%s", xte_last_error());
  for (t = 0; t < T; t++) { /* sigmoid normalised over all E */
    float s = 0.0f, q[40];
    int cnt = 0;
    for (e = 0; e < E; e++) s += (q[e] = xte_sigmoidf(x[t * E + e]));
    s += 1e-20f;
    for (e = 0; e < E; e++) {
      float v = q[e] / s;
      cr_assert(same_bits(&v, &sc[t * E + e], 4), "aux score [%d, %d]", t, e);
      cnt += map[t * E + e];
    }
    cr_assert_eq(cnt, k);
  }
  for (e = 0; e < E; e++) tpe[e] = (int32_t)(rng_u32() % 1000);
  cr_assert_eq(xte_moe_aux_loss_forward(&st, &tt, T, k, 1e-2f, &aux, NULL), XTE_SUCCESS);
  C = (double)E * (double)1e-2f / ((double)k * (double)T * (double)T);
  for (e = 0; e < E; e++) {
    double cs = 0.0;
    for (b = 0; b * 1024 < T; b++) {
      double p = 0.0;
      for (t = b * 1024; t < T && t < (b + 1) * 1024; t++) p += (double)sc[t * E + e];
      cs += p;
    }
    total += cs * (double)tpe[e];
  }
  cr_assert_eq(aux, (float)(C * total), "aux %.9g vs %.9g", (double)aux, C * total);
  cr_assert_eq(xte_moe_aux_loss_backward(&tt, T, k, 1e-2f, 0.5f, &gt, NULL), XTE_SUCCESS);
  for (e = 0; e < E; e++) cr_assert_eq(gp[7 * E + e], (float)(C * (double)tpe[e]) * 0.5f);
  free(x), free(sc), free(sv), free(gp), free(map);
}

/* ---------------------------------------------------------------- SIMD lanes
 * The AVX2 / AVX-512 router evaluates sigmoid and the softmax exponentials lane-wise and selects
 * with a vectorised threshold filter. Lanes: every ISA's saved scores equal xte_sigmoidf over a
 * stride of the whole fp32 line (NaN, inf, subnormals) and a dense sweep of [-110, 100]; the
 * pre-softmax saved output of every ISA equals the scalar ISA's over rows whose max is 0 (so the
 * exponentials see the swept values as they are). Selection: every ISA equals the oracle on rows
 * with few ties, many ties (more than 16 candidates), many NaNs (the full scan), and a size whose
 * dense outputs are written with non-temporal stores. */
static float sweep_value(uint32_t i, uint32_t n) {
  if (i % 2 == 0) { /* the fp32 line on a stride */
    uint32_t u = (uint32_t)(((uint64_t)(i / 2) * 0x100000000ull) / (n / 2));
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  return -110.0f + 210.0f * (float)((double)(i / 2) / (double)(n / 2));
}

Test(moe_router, simd_lanes_exact) {
  const int E = 512, T = 4096;
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, i;
  float *x = (float *)zalloc(4 * (size_t)T * E), *sv = (float *)zalloc(4 * (size_t)T * E);
  float *ref = (float *)zalloc(4 * (size_t)T * E);
  uint8_t *map = (uint8_t *)zalloc((size_t)T * E);
  for (i = 0; i < T * E; i++) x[i] = sweep_value((uint32_t)i, (uint32_t)(T * E));
  for (ii = 0; ii < nisa; ii++) {
    xte_router_config cfg = xte_router_config_default();
    xte_router_outputs out;
    xte_tensor lt = xte_tensor_2d(x, XTE_DTYPE_FP32, T, E);
    cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
    cfg.topk = 4;
    cfg.score_function = XTE_ROUTER_SIGMOID;
    memset(&out, 0, sizeof out);
    out.routing_map = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E);
    out.saved = xte_tensor_2d(sv, XTE_DTYPE_FP32, T, E);
    cr_assert_eq(xte_router_forward(&lt, NULL, &cfg, &out, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    for (i = 0; i < T * E; i++) {
      float want = xte_sigmoidf(x[i]);
      cr_assert(xte_f32_bits(sv[i]) == xte_f32_bits(want), "sigmoid(%a) = %a, want %a (isa %d)",
                (double)x[i], (double)sv[i], (double)want, (int)isas[ii]);
    }
  }
  /* exponentials: non-positive sweeps, a 0 at the front of each row */
  for (i = 0; i < T * E; i++) {
    float v = sweep_value((uint32_t)i, (uint32_t)(T * E));
    x[i] = i % E == 0 ? 0.0f : (v > 0.0f ? -v : v);
  }
  for (ii = 0; ii < nisa; ii++) {
    xte_router_config cfg = xte_router_config_default();
    xte_router_outputs out;
    xte_tensor lt = xte_tensor_2d(x, XTE_DTYPE_FP32, T, E);
    cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
    cfg.topk = 4;
    cfg.use_pre_softmax = 1;
    memset(&out, 0, sizeof out);
    out.routing_map = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E);
    out.saved = xte_tensor_2d(ii == 0 ? ref : sv, XTE_DTYPE_FP32, T, E);
    cr_assert_eq(xte_router_forward(&lt, NULL, &cfg, &out, NULL), XTE_SUCCESS);
    if (ii > 0)
      for (i = 0; i < T * E; i++)
        cr_assert(xte_f32_bits(sv[i]) == xte_f32_bits(ref[i]), "softmax [%d] (x %a) isa %d", i,
                  (double)x[i], (int)isas[ii]);
  }
  xte_cpu_set_isa(isas[nisa - 1]);
  free(x), free(sv), free(ref), free(map);
}

/* Rows with many NaNs (the filter finds fewer than k), with ties (more than 16 candidates). */
static void gen_hard(float *x, int T, int E, int kind) {
  int i;
  for (i = 0; i < T * E; i++) {
    uint32_t r = rng_u32() % 1000;
    if (kind == 0) /* odd rows: fewer numbers than k, the rest NaN */
      x[i] = r < ((i / E) % 2 ? 995u : 900u) ? NAN : rng_f() * 4.0f;
    else
      x[i] = (float)((int)(rng_u32() % 4)) * 0.5f + (r < 20 ? NAN : 0.0f);
  }
}

Test(moe_router, simd_selection_paths) {
  rcfg c1 = {384, 8, 1, 0, 0, 0, 1, 0, 2.827f}, c2 = {384, 16, 1, 0, 0, 0, 0, 0, 1.0f};
  rcfg c3 = {200, 5, 0, 1, 0, 0, 1, 0, 1.0f}, c4 = {96, 3, 0, 0, 0, 0, 0, 0, 1.0f};
  const rcfg *cs[4] = {&c1, &c2, &c3, &c4};
  int kind, ci;
  rng_seed(5);
  for (ci = 0; ci < 4; ci++)
    for (kind = 0; kind < 2; kind++) {
      const rcfg *c = cs[ci];
      const int T = 64, E = c->E;
      float *x = (float *)zalloc(4 * (size_t)T * E), *probs = (float *)zalloc(4 * (size_t)T * E);
      uint8_t *map = (uint8_t *)zalloc((size_t)T * E);
      xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
      int nisa = moe_isas(isas), ii, t;
      float bias[512], op[512], ow[16], os[512];
      uint8_t om[512];
      int oi[16];
      gen_hard(x, T, E, kind);
      for (t = 0; t < E; t++) bias[t] = (float)(rng_u32() % 4) * 0.25f;
      for (ii = 0; ii < nisa; ii++) {
        xte_router_config cfg = xte_router_config_default();
        xte_router_outputs out;
        xte_tensor lt = xte_tensor_2d(x, XTE_DTYPE_FP32, T, E),
                   bt = xte_tensor_1d(bias, XTE_DTYPE_FP32, E);
        cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
        cfg.topk = c->k;
        cfg.score_function = (xte_router_score)c->score;
        cfg.use_pre_softmax = c->pre;
        cfg.scaling_factor = c->scale;
        memset(&out, 0, sizeof out);
        out.probs = xte_tensor_2d(probs, XTE_DTYPE_FP32, T, E);
        out.routing_map = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E);
        cr_assert_eq(xte_router_forward(&lt, c->bias ? &bt : NULL, &cfg, &out, NULL), XTE_SUCCESS);
        for (t = 0; t < T; t++) {
          oracle_row(c, x + t * E, c->bias ? bias : NULL, op, om, oi, ow, os);
          cr_assert(same_bits(op, probs + (size_t)t * E, 4 * (size_t)E),
                    "probs row %d (isa %d, case %d kind %d)", t, (int)isas[ii], ci, kind);
          cr_assert(same_bits(om, map + (size_t)t * E, (size_t)E), "map row %d", t);
        }
      }
      xte_cpu_set_isa(isas[nisa - 1]);
      free(x), free(probs), free(map);
    }
}

Test(moe_router, simd_streamed_outputs) {
  rcfg c = {384, 8, 1, 0, 0, 0, 1, 0, 2.827f}; /* 6000 x 384 fp32 probs: non-temporal stores */
  rng_seed(6);
  run_case(&c, 6000, 1);
}

/* The fused lane pass (score, bias, lane maxima in one pass; no groups, not aux) on every score
 * function, bf16 logits, and sizes with a single-vector and a scalar tail on both lane widths. */
Test(moe_router, simd_fused_pass_shapes) {
  rcfg c1 = {408, 8, 1, 0, 0, 0, 1, 1, 2.827f}; /* bf16; 408 = 12 * 32 + 16 + 8 */
  rcfg c2 = {100, 4, 2, 0, 0, 0, 1, 0, 1.5f};   /* sqrtsoftplus, no groups */
  rcfg c3 = {392, 6, 0, 1, 0, 0, 1, 1, 1.0f};   /* pre-softmax + bias, bf16 */
  rcfg c4 = {72, 1, 0, 0, 0, 0, 1, 0, 3.0f};    /* post-softmax + bias, topk 1 */
  rcfg c5 = {384, 8, 1, 0, 0, 0, 0, 0, 1.0f};   /* sigmoid without bias */
  rng_seed(7);
  run_case(&c1, 57, 1);
  run_case(&c2, 57, 1);
  run_case(&c3, 57, 1);
  run_case(&c4, 57, 1);
  run_case(&c5, 57, 1);
}

/* ---------------------------------------------------------------- backward: documented order
 * The router backward (and the aux-scores backward) on every ISA against a plain restatement of
 * docs/numerics.md section 8, compared bit for bit: dp = scaling * grad on the selected experts
 * (all for aux); softmax: dot = fmaf(saved_e, dp_e, dot) over e ascending from +0,
 * gx = saved * (dp - dot); normalised scores (topk > 1, or aux scores at any topk):
 * D = (fp32 adds of the selected saved scores, ascending, from +0) + 1e-20,
 * dot = fmaf(dp_e, s_e, dot) ascending over the selected, gs = (dp - dot / D) / D on the
 * selected, 0 elsewhere; else gs = dp; gx = gs * dscore with dscore = s (1 - s) (sigmoid) or
 * sigmoid(x) / (2 s), 0 where s == 0 (sqrtsoftplus). The finite-difference test above has a
 * tolerance; this one sees a change of summation order. */
static uint16_t bf16_rne(float f) { /* finite and inf only (no NaN here) */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static void oracle_bwd_row(int E, int score, int topk, int aux, float scale, const float *g,
                           const uint8_t *m, const float *s, const float *x, float *gx) {
  float dp[512], gs[512];
  int e;
  for (e = 0; e < E; e++) dp[e] = (aux || m[e]) ? scale * g[e] : 0.0f;
  if (score == 0) {
    float dot = 0.0f;
    for (e = 0; e < E; e++) dot = fmaf(s[e], dp[e], dot);
    for (e = 0; e < E; e++) gx[e] = s[e] * (dp[e] - dot);
    return;
  }
  if (topk > 1 || aux) {
    float D = 0.0f, dot = 0.0f;
    for (e = 0; e < E; e++)
      if (aux || m[e]) D = D + s[e];
    D = D + 1e-20f;
    for (e = 0; e < E; e++)
      if (aux || m[e]) dot = fmaf(dp[e], s[e], dot);
    for (e = 0; e < E; e++) gs[e] = (aux || m[e]) ? (dp[e] - dot / D) / D : 0.0f;
  } else {
    for (e = 0; e < E; e++) gs[e] = dp[e];
  }
  for (e = 0; e < E; e++) {
    float d;
    if (score == 1)
      d = s[e] * (1.0f - s[e]);
    else
      d = s[e] == 0.0f ? 0.0f : xte_sigmoidf(x[e]) / (2.0f * s[e]);
    gx[e] = gs[e] * d;
  }
}

/* aux: the aux-scores pair (topk k, no config); else the router with rcfg c. out_bf16: the
 * gradient in bf16. */
static void bwd_order_case(const rcfg *c, int aux, int T, int out_bf16) {
  const int E = c->E, k = c->k;
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, t, e;
  float *x = (float *)zalloc(4 * (size_t)(T * E)), *probs = (float *)zalloc(4 * (size_t)(T * E));
  float *saved = (float *)zalloc(4 * (size_t)(T * E)), *g = (float *)zalloc(4 * (size_t)(T * E));
  float *gx = (float *)zalloc(4 * (size_t)(T * E)), want[512];
  uint8_t *map = (uint8_t *)zalloc((size_t)(T * E));
  xte_router_config cfg = xte_router_config_default();
  xte_tensor lt = xte_tensor_2d(x, XTE_DTYPE_FP32, T, E);
  xte_tensor gt = xte_tensor_2d(g, XTE_DTYPE_FP32, T, E),
             st = xte_tensor_2d(saved, XTE_DTYPE_FP32, T, E);
  xte_tensor mt = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E),
             gxt = xte_tensor_2d(gx, out_bf16 ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, T, E),
             pt = xte_tensor_2d(probs, XTE_DTYPE_FP32, T, E);
  for (e = 0; e < T * E; e++) {
    uint32_t r = rng_u32() % 64;
    /* spread magnitudes so that the order of the sums shows in the last bits */
    x[e] = r == 0 ? 0.0f : r == 1 ? 30.0f : r == 2 ? -30.0f : rng_f() * 6.0f;
    g[e] = rng_f() * (r < 8 ? 1000.0f : 1.0f);
  }
  cfg.topk = k;
  cfg.score_function = (xte_router_score)c->score;
  cfg.use_pre_softmax = c->pre;
  cfg.scaling_factor = c->scale;
  if (aux) {
    cr_assert_eq(xte_router_aux_scores(&lt, k, (xte_router_score)c->score, &pt, &mt, &st, NULL),
                 XTE_SUCCESS, "%s", xte_last_error());
  } else {
    xte_router_outputs out;
    memset(&out, 0, sizeof out);
    out.probs = pt;
    out.routing_map = mt;
    out.saved = st;
    cr_assert_eq(xte_router_forward(&lt, NULL, &cfg, &out, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
  }
  for (ii = 0; ii < nisa; ii++) {
    cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
    memset(gx, 0x5A, 4 * (size_t)(T * E));
    if (aux)
      cr_assert_eq(
          xte_router_aux_scores_backward(&gt, &st, &lt, k, (xte_router_score)c->score, &gxt, NULL),
          XTE_SUCCESS, "%s", xte_last_error());
    else
      cr_assert_eq(xte_router_backward(&gt, &mt, &st, &lt, &cfg, &gxt, NULL), XTE_SUCCESS, "%s",
                   xte_last_error());
    for (t = 0; t < T; t++) {
      oracle_bwd_row(E, c->score, k, aux, aux ? 1.0f : c->scale, g + t * E, map + t * E,
                     saved + t * E, x + t * E, want);
      for (e = 0; e < E; e++) {
        if (out_bf16) {
          uint16_t w16 = bf16_rne(want[e]), got = ((const uint16_t *)gx)[t * E + e];
          cr_assert_eq(got, w16,
                       "isa %d aux %d score %d k %d: grad_logits[%d, %d] 0x%04x, want 0x%04x",
                       (int)isas[ii], aux, c->score, k, t, e, got, w16);
        } else {
          cr_assert(same_bits(&want[e], &gx[t * E + e], 4),
                    "isa %d aux %d score %d k %d pre %d: grad_logits[%d, %d] = %a, want %a",
                    (int)isas[ii], aux, c->score, k, c->pre, t, e, (double)gx[t * E + e],
                    (double)want[e]);
        }
      }
    }
  }
  xte_cpu_set_isa(isas[nisa - 1]);
  free(x), free(probs), free(saved), free(g), free(gx), free(map);
}

Test(moe_router, backward_documented_order_bits) {
  rcfg sm_pre = {64, 4, 0, 1, 0, 0, 0, 0, 1.0f}, sm_post = {40, 6, 0, 0, 0, 0, 0, 0, 2.5f};
  rcfg sm_wide = {300, 8, 0, 1, 0, 0, 0, 0, 1.0f}, sg8 = {64, 8, 1, 0, 0, 0, 0, 0, 2.827f};
  rcfg sg1 = {33, 1, 1, 0, 0, 0, 0, 0, 1.0f}, sp3 = {48, 3, 2, 0, 0, 0, 0, 0, 1.0f};
  rcfg sp1 = {17, 1, 2, 0, 0, 0, 0, 0, 0.5f};
  rng_seed(31);
  bwd_order_case(&sm_pre, 0, 24, 0);
  bwd_order_case(&sm_post, 0, 24, 0);
  bwd_order_case(&sm_wide, 0, 8, 0);
  bwd_order_case(&sm_pre, 0, 16, 1);
  bwd_order_case(&sg8, 0, 24, 0);
  bwd_order_case(&sg1, 0, 24, 0);
  bwd_order_case(&sp3, 0, 24, 1);
  bwd_order_case(&sp1, 0, 24, 0);
}

/* Aux scores as TransformerEngine's compute_score_for_moe_aux_loss: sigmoid / sqrtsoftplus are
 * normalised over all E for every topk, topk = 1 included (TE normalises unconditionally, in its
 * PyTorch reference and its kernels, forward and backward); saved holds the unnormalised scores.
 * Forward against the plain steps (scores, fp32 adds ascending from +0, + 1e-20, one division),
 * backward against the documented order, bit for bit on every ISA. */
Test(moe_router, aux_scores_normalised_every_topk) {
  const int T = 40, E = 24;
  const int ks[3] = {1, 2, 5};
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, sc, ki, t, e;
  float *x = (float *)zalloc(4 * T * E), *s = (float *)zalloc(4 * T * E);
  float *sv = (float *)zalloc(4 * T * E);
  uint8_t *map = (uint8_t *)zalloc(T * E);
  xte_tensor lt = xte_tensor_2d(x, XTE_DTYPE_FP32, T, E),
             st = xte_tensor_2d(s, XTE_DTYPE_FP32, T, E);
  xte_tensor vt = xte_tensor_2d(sv, XTE_DTYPE_FP32, T, E),
             mt = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E);
  rng_seed(32);
  for (e = 0; e < T * E; e++) x[e] = rng_f() * 5.0f;
  for (sc = 1; sc <= 2; sc++)
    for (ki = 0; ki < 3; ki++)
      for (ii = 0; ii < nisa; ii++) {
        cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
        cr_assert_eq(xte_router_aux_scores(&lt, ks[ki], (xte_router_score)sc, &st, &mt, &vt, NULL),
                     XTE_SUCCESS, "%s", xte_last_error());
        for (t = 0; t < T; t++) {
          float q[24], D = 0.0f;
          int cnt = 0;
          for (e = 0; e < E; e++) {
            q[e] = sc == 1 ? xte_sigmoidf(x[t * E + e]) : xte_sqrtsoftplusf(x[t * E + e]);
            D = D + q[e];
          }
          D = D + 1e-20f;
          for (e = 0; e < E; e++) {
            float v = q[e] / D;
            cr_assert(same_bits(&v, &s[t * E + e], 4),
                      "isa %d score %d topk %d: aux score [%d, %d] = %a, want %a", (int)isas[ii],
                      sc, ks[ki], t, e, (double)s[t * E + e], (double)v);
            cr_assert(same_bits(&q[e], &sv[t * E + e], 4), "saved [%d, %d]", t, e);
            cnt += map[t * E + e];
          }
          cr_assert_eq(cnt, ks[ki]);
        }
      }
  xte_cpu_set_isa(isas[nisa - 1]);
  {
    rcfg a1 = {24, 1, 1, 0, 0, 0, 0, 0, 1.0f}, a2 = {24, 1, 2, 0, 0, 0, 0, 0, 1.0f};
    rcfg a3 = {24, 3, 2, 0, 0, 0, 0, 0, 1.0f}, a4 = {24, 1, 0, 1, 0, 0, 0, 0, 1.0f};
    bwd_order_case(&a1, 1, 20, 0);
    bwd_order_case(&a2, 1, 20, 0);
    bwd_order_case(&a3, 1, 20, 1);
    bwd_order_case(&a4, 1, 20, 0);
  }
  free(x), free(s), free(sv), free(map);
}
