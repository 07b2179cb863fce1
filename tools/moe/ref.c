/* `xte moe`: the fp64 check (tools/moe/moe.h). The same layer in fp64 (OpenBLAS dgemm, libm)
 * from the unquantized inputs (bf16 x and grad, fp32 router weights) and the FP8 weights the
 * layer used (each expert's codes and block scales made again by moe_weight_expert, then
 * dequantized exactly in fp64: synth.h), one expert at a time, on a deterministic subset of the
 * tokens; plus the weight gradients of the busiest expert (all its tokens). What it measures is
 * thus the error of the layer's kernels (activation quantization, FP8 GEMMs, bf16 outputs), not
 * the weights' own rounding to FP8 (the weights are FP8 by construction). */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe.h"
#include "synth.h"

#define DW_CHUNK 256 /* rows of a weight gradient the check forms at a time */

/* Memory of the fp64 check (added to the estimate; allocated after the layer ran). */
double check_bytes(const layer *L) {
  double H = (double)L->H, F = (double)L->F, n = (double)L->T; /* an expert's token list: <= T */
  double b;
  if (L->o.check_tokens == 0) return 0;
  b = 8.0 * (3 * F * H);                            /* one expert's weights */
  b += 2 * F * H + 4.0 * (2 * F / 128) * (H / 128); /* its FP8 codes + scales (the larger one) */
  b += 8.0 * n * (H + 2 * F + F + H);               /* X, Hh, A, Y */
  b += 8.0 * (double)L->T * (double)L->E * 3;       /* logits, scores, grad probs */
  b += 8.0 * (double)L->o.check_tokens * H * 2;     /* out, dx references */
  b += 8.0 * (double)L->E * H;                      /* Wr */
  if (L->bwd) b += 8.0 * n * (H + F + 2 * F + H) + 8.0 * DW_CHUNK * (F + H); /* dW chunks */
  return b;
}

static void cmp_add(cmp *c, double x, double r) {
  double d = x - r;
  if (!isfinite(x)) {
    c->nonfinite = 1;
    return;
  }
  c->sxx += x * x;
  c->syy += r * r;
  c->sxy += x * r;
  c->sdd += d * d;
  if (fabs(d) > c->maxd) c->maxd = fabs(d);
  if (fabs(r) > c->maxr) c->maxr = fabs(r);
  c->n++;
}

double cmp_rel(const cmp *c) {
  return c->syy > 0 ? sqrt(c->sdd / c->syy) : sqrt(c->sdd);
}
double cmp_diff(const cmp *c) { /* DeepGEMM's calc_diff */
  double den = c->sxx + c->syy;
  return den > 0 ? 1.0 - 2.0 * c->sxy / den : 0.0;
}
double cmp_maxrel(const cmp *c) {
  return c->maxr > 0 ? c->maxd / c->maxr : c->maxd;
}

const char *const moe_cmp_names[C_COUNT] = {"out", "dx", "dW down", "dW gate/up"};
/* Bounds the run must meet (FP8 e4m3 1x128 / 128x128 with bf16 activations): above the errors
 * of two chained FP8 GEMMs and the SwiGLU with every block recipe (docs/numerics.md section 8;
 * the measured errors: docs/performance.md, the xte moe layer), far below a wrong kernel's errors
 * of order 1. */
const double moe_bound_rel = 0.10, moe_bound_diff = 0.006;

/* XTE_GEMM_FAST (docs/numerics.md section 6) lets each 128-element block partial of a GEMM be
 * off by up to KB * 2^-13 = 2^-6 of its sum of |code products|; a checked tensor passes through
 * two chained FP8 GEMMs (gate/up then down, or their dgrad / wgrad pairs), so fast mode adds
 * 2 * 2^-6 to the relative-error bound, charged against the tensor's norm, and widens DeepGEMM's
 * diff (about rel^2 / 2 for an error uncorrelated with the values) by the square of the ratio of
 * the two relative bounds. Exact mode: the bounds above. */
#define MOE_FAST_REL (2.0 * 128.0 / 8192.0)
double moe_bound_rel_for(xte_gemm_mode mode) {
  return mode == XTE_GEMM_FAST ? moe_bound_rel + MOE_FAST_REL : moe_bound_rel;
}
double moe_bound_diff_for(xte_gemm_mode mode) {
  double r = moe_bound_rel_for(mode) / moe_bound_rel;
  return moe_bound_diff * r * r;
}

static int64_t busiest_expert(const layer *L) {
  int64_t e, best = 0;
  for (e = 1; e < L->E; e++)
    if (L->tpe[e] > L->tpe[best]) best = e;
  return best;
}

typedef struct refctx {
  const layer *L;
  check *ck;
  double *Wgu, *Wd, *X, *Hh, *A, *Y, *dYp, *dA, *dH, *dX, *dWr, *dWg;
  double *out, *dx; /* [n, H] references */
  double *gp;       /* [T, E] fp64 grad probs */
  double *p64;      /* [T, E] fp64 probs */
  double *s64;      /* [T, E] fp64 sigmoid scores */
  double *Wr;       /* [E, H] */
  uint8_t *q8;      /* one weight matrix's FP8 codes */
  float *qs;        /* and its block scales */
} refctx;

/* The fp64 values of expert weight matrix [N, K] of a stream: its codes and scales made again
 * (moe_weight_expert, the bytes the layer used), dequantized exactly. */
static int ref_weights(const refctx *c, double *out, int64_t N, int64_t K, uint64_t stream) {
  const layer *L = c->L;
  xte_qtensor q;
  xte_status rc;
  memset(&q, 0, sizeof q);
  q.scaling_mode = XTE_SCALING_BLOCK_128x128;
  q.recipe = L->o.recipe;
  q.rowwise = xte_tensor_2d(c->q8, XTE_DTYPE_E4M3, N, K);
  q.rowwise_scale_inv.data = c->qs;
  q.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  q.rowwise_scale_inv.rows = N / 128;
  q.rowwise_scale_inv.cols = K / 128;
  q.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  rc = moe_weight_expert(&q, 0, N, K, NULL, L->o.seed, stream, L->st);
  if (rc != XTE_SUCCESS) {
    fprintf(stderr, "xte moe: fp64 check: weights of stream %llu: %s: %s\n",
            (unsigned long long)stream, xte_status_string(rc), xte_last_error());
    return -1;
  }
  moe_dequant_128(out, c->q8, c->qs, N, K);
  return 0;
}

static double silu_d(double g) {
  return g / (1.0 + exp(-g));
}

/* The fp64 expert on the token list tok[0..n): forward into out (subset tokens, times p), and
 * with the backward: grad probs (routed), dx (subset), and the weight gradients when wexp. */
static void ref_expert(refctx *c, int64_t n, const int64_t *tok, int64_t e, int shared, int wexp) {
  const layer *L = c->L;
  int64_t H = L->H, F = L->F, E = L->E, i, j;
  for (i = 0; i < n; i++)
    for (j = 0; j < H; j++) c->X[i * H + j] = (double)xte_bf16_to_f32(L->x[tok[i] * H + j]);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)(2 * F), (int)H, 1.0, c->X,
              (int)H, c->Wgu, (int)H, 0.0, c->Hh, (int)(2 * F));
  for (i = 0; i < n; i++)
    for (j = 0; j < F; j++)
      c->A[i * F + j] = silu_d(c->Hh[i * 2 * F + j]) * c->Hh[i * 2 * F + F + j];
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)H, (int)F, 1.0, c->A, (int)F,
              c->Wd, (int)F, 0.0, c->Y, (int)H);
  for (i = 0; i < n; i++) {
    int64_t s = c->ck->slot[tok[i]];
    double p = shared ? 1.0 : c->p64[tok[i] * E + e];
    if (s >= 0)
      for (j = 0; j < H; j++) c->out[s * H + j] += p * c->Y[i * H + j];
  }
  if (!L->bwd) return;
  for (i = 0; i < n; i++) {
    int64_t t = tok[i];
    double p = shared ? 1.0 : c->p64[t * E + e], g = 0;
    for (j = 0; j < H; j++) {
      double d = (double)xte_bf16_to_f32(L->dy[t * H + j]);
      g += d * c->Y[i * H + j];
      c->dYp[i * H + j] = p * d;
    }
    if (!shared) c->gp[t * E + e] = g;
  }
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)F, (int)H, 1.0, c->dYp,
              (int)H, c->Wd, (int)F, 0.0, c->dA, (int)F);
  for (i = 0; i < n; i++)
    for (j = 0; j < F; j++) {
      double g = c->Hh[i * 2 * F + j], u = c->Hh[i * 2 * F + F + j], da = c->dA[i * F + j];
      double sg = 1.0 / (1.0 + exp(-g));
      c->dH[i * 2 * F + j] = da * u * sg * (1.0 + g * (1.0 - sg));
      c->dH[i * 2 * F + F + j] = da * g * sg;
    }
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)H, (int)(2 * F), 1.0, c->dH,
              (int)(2 * F), c->Wgu, (int)H, 0.0, c->dX, (int)H);
  for (i = 0; i < n; i++) {
    int64_t s = c->ck->slot[tok[i]];
    if (s >= 0)
      for (j = 0; j < H; j++) c->dx[s * H + j] += c->dX[i * H + j];
  }
  if (wexp) {
    const float *lwd = L->dWd + e * H * F, *lwg = L->dWgu + e * 2 * F * H;
    int64_t r0, nr;
    for (r0 = 0; r0 < H; r0 += DW_CHUNK) { /* dW down rows r0.. = dYp[:, r0..]^T A */
      nr = H - r0 < DW_CHUNK ? H - r0 : DW_CHUNK;
      cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nr, (int)F, (int)n, 1.0,
                  c->dYp + r0, (int)H, c->A, (int)F, 0.0, c->dWr, (int)F);
      for (i = 0; i < nr * F; i++) cmp_add(&c->ck->c[C_DWD], (double)lwd[r0 * F + i], c->dWr[i]);
    }
    for (r0 = 0; r0 < 2 * F; r0 += DW_CHUNK) { /* dW gate/up rows r0.. = dH[:, r0..]^T X */
      nr = 2 * F - r0 < DW_CHUNK ? 2 * F - r0 : DW_CHUNK;
      cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nr, (int)H, (int)n, 1.0, c->dH + r0,
                  (int)(2 * F), c->X, (int)H, 0.0, c->dWg, (int)H);
      for (i = 0; i < nr * H; i++) cmp_add(&c->ck->c[C_DWGU], (double)lwg[r0 * H + i], c->dWg[i]);
    }
    c->ck->have[C_DWD] = c->ck->have[C_DWGU] = 1;
  }
}

int run_check(layer *L, check *ck) {
  int64_t T = L->T, H = L->H, F = L->F, E = L->E, k = L->k, n = L->o.check_tokens, i, j, e;
  int64_t nmax = T; /* an expert's token list (the busiest: all its tokens) */
  membook mb;
  refctx c;
  int64_t *list;
  double t0 = now_s();
  memset(ck, 0, sizeof *ck);
  memset(&mb, 0, sizeof mb);
  memset(&c, 0, sizeof c);
  c.L = L;
  c.ck = ck;
  ck->n = n;
  ck->bound_rel = moe_bound_rel_for(L->o.mode);
  ck->bound_diff = moe_bound_diff_for(L->o.mode);
  ck->wexpert = L->bwd ? busiest_expert(L) : -1;
  ck->slot = (int64_t *)mem(&mb, (size_t)T * 8, CAT_CHECK);
  ck->toks = (int64_t *)mem(&mb, (size_t)n * 8, CAT_CHECK);
  list = (int64_t *)mem(&mb, (size_t)T * 8, CAT_CHECK);
  c.Wgu = (double *)mem(&mb, (size_t)(2 * F * H) * 8, CAT_CHECK);
  c.Wd = (double *)mem(&mb, (size_t)(H * F) * 8, CAT_CHECK);
  c.X = (double *)mem(&mb, (size_t)(nmax * H) * 8, CAT_CHECK);
  c.Hh = (double *)mem(&mb, (size_t)(nmax * 2 * F) * 8, CAT_CHECK);
  c.A = (double *)mem(&mb, (size_t)(nmax * F) * 8, CAT_CHECK);
  c.Y = (double *)mem(&mb, (size_t)(nmax * H) * 8, CAT_CHECK);
  c.out = (double *)mem(&mb, (size_t)(n * H) * 8, CAT_CHECK);
  c.p64 = (double *)mem(&mb, (size_t)(T * E) * 8, CAT_CHECK);
  c.s64 = (double *)mem(&mb, (size_t)(T * E) * 8, CAT_CHECK);
  c.Wr = (double *)mem(&mb, (size_t)(E * H) * 8, CAT_CHECK);
  c.q8 = (uint8_t *)mem(&mb, (size_t)(2 * F * H), CAT_CHECK);
  c.qs = (float *)mem(&mb, (size_t)(2 * F / 128 * (H / 128)) * 4, CAT_CHECK);
  if (L->bwd) {
    c.dYp = (double *)mem(&mb, (size_t)(nmax * H) * 8, CAT_CHECK);
    c.dA = (double *)mem(&mb, (size_t)(nmax * F) * 8, CAT_CHECK);
    c.dH = (double *)mem(&mb, (size_t)(nmax * 2 * F) * 8, CAT_CHECK);
    c.dX = (double *)mem(&mb, (size_t)(nmax * H) * 8, CAT_CHECK);
    c.dx = (double *)mem(&mb, (size_t)(n * H) * 8, CAT_CHECK);
    c.gp = (double *)mem(&mb, (size_t)(T * E) * 8, CAT_CHECK);
    c.dWr = (double *)mem(&mb, (size_t)(DW_CHUNK * F) * 8, CAT_CHECK);
    c.dWg = (double *)mem(&mb, (size_t)(DW_CHUNK * H) * 8, CAT_CHECK);
  }
  if (mb.failed) {
    mem_free_all(&mb);
    fprintf(stderr, "xte moe: out of memory for the fp64 check (--check-tokens 0 skips it)\n");
    return -1;
  }
  for (i = 0; i < T; i++) ck->slot[i] = -1;
  for (i = 0; i < n; i++) {
    ck->toks[i] = i * T / n;
    ck->slot[ck->toks[i]] = i;
  }
  /* Router in fp64 on every token (the weight-gradient check needs all tokens of an expert):
   * the selection is xte's (the routing map); the fp64 top-k is compared with it. */
  moe_fill_f64(c.Wr, (size_t)(E * H), L->o.seed, S_WR, moe_w_scale(H));
  for (i = 0; i < T; i++) {
    double D = 0;
    int64_t sel = 0, agree = 1;
    for (e = 0; e < E; e++) {
      double l = 0;
      const uint16_t *xr = L->x + i * H;
      const double *wr = c.Wr + e * H;
      for (j = 0; j < H; j++) l += (double)xte_bf16_to_f32(xr[j]) * wr[j];
      c.s64[i * E + e] = 1.0 / (1.0 + exp(-l));
      if (L->map[i * E + e]) D += c.s64[i * E + e];
    }
    for (e = 0; e < E; e++) /* normalised over the top-k when k > 1 */
      c.p64[i * E + e] = !L->map[i * E + e] ? 0.0
                         : k > 1            ? (double)L->o.scaling * c.s64[i * E + e] / (D + 1e-20)
                                            : (double)L->o.scaling * c.s64[i * E + e];
    /* fp64 top-k by score + bias: the same set iff every selected expert beats every other */
    for (e = 0; e < E; e++) {
      int64_t f;
      if (!L->map[i * E + e]) continue;
      sel++;
      for (f = 0; f < E; f++)
        if (!L->map[i * E + f] &&
            c.s64[i * E + f] + (double)L->bias[f] > c.s64[i * E + e] + (double)L->bias[e])
          agree = 0;
    }
    if (sel != k) agree = 0;
    ck->agree += agree;
  }
  /* shared expert */
  if (L->shared) {
    if (ref_weights(&c, c.Wgu, 2 * F, H, S_SGU) || ref_weights(&c, c.Wd, H, F, S_SD)) {
      mem_free_all(&mb);
      return -1;
    }
    ref_expert(&c, n, ck->toks, -1, 1, 0);
  }
  /* routed experts, one at a time */
  for (e = 0; e < E; e++) {
    int64_t m = 0, wexp = e == ck->wexpert;
    for (i = 0; i < T; i++)
      if (L->map[i * E + e] && (wexp || ck->slot[i] >= 0)) list[m++] = i;
    if (m == 0) continue;
    if (ref_weights(&c, c.Wgu, 2 * F, H, (uint64_t)(S_EXPERT0 + 2 * e)) ||
        ref_weights(&c, c.Wd, H, F, (uint64_t)(S_EXPERT0 + 2 * e + 1))) {
      mem_free_all(&mb);
      return -1;
    }
    ref_expert(&c, m, list, e, 0, (int)wexp);
    progress("fp64 check: expert %lld / %lld", (long long)(e + 1), (long long)E);
  }
  /* router backward (subset tokens) and the gate's dgrad */
  if (L->bwd) {
    for (i = 0; i < n; i++) {
      int64_t t = ck->toks[i];
      double D = 0, dot = 0;
      double sc = (double)L->o.scaling;
      for (e = 0; e < E; e++)
        if (L->map[t * E + e]) {
          D += c.s64[t * E + e];
          dot += sc * c.gp[t * E + e] * c.s64[t * E + e];
        }
      D += 1e-20;
      for (e = 0; e < E; e++) {
        double s, gs, dl;
        if (!L->map[t * E + e]) continue;
        s = c.s64[t * E + e];
        gs = k > 1 ? (sc * c.gp[t * E + e] - dot / D) / D : sc * c.gp[t * E + e];
        dl = gs * s * (1.0 - s);
        for (j = 0; j < H; j++) c.dx[i * H + j] += dl * c.Wr[e * H + j];
      }
    }
  }
  for (i = 0; i < n; i++) {
    int64_t t = ck->toks[i];
    for (j = 0; j < H; j++)
      cmp_add(&ck->c[C_OUT], (double)xte_bf16_to_f32(L->out[t * H + j]), c.out[i * H + j]);
    if (L->bwd)
      for (j = 0; j < H; j++) cmp_add(&ck->c[C_DX], (double)L->dx[t * H + j], c.dx[i * H + j]);
  }
  ck->have[C_OUT] = 1;
  ck->have[C_DX] = L->bwd;
  ck->t = now_s() - t0;
  mem_free_all(&mb);
  return 0;
}

int check_pass(const check *ck) {
  int i;
  for (i = 0; i < C_COUNT; i++)
    if (ck->have[i] && (ck->c[i].nonfinite || !(cmp_rel(&ck->c[i]) <= ck->bound_rel) ||
                        !(cmp_diff(&ck->c[i]) <= ck->bound_diff)))
      return 0;
  return 1;
}
