/* Attention suite: xte_attention_fwd / xte_attention_bwd at b = 1, h = 8, d = 128, fp32, BSHD,
 * s in {1024, 4096}, causal (top-left) and not, on all of xte's CPU threads; each case in EXACT
 * ("attention/fwd/...") and in XTE_ATTENTION_FAST ("attention/fast_fwd/..."), side by side
 * against the same anchor.
 *
 * Anchors: "attention/naive_fwd/..." and "attention/naive_bwd/...": naive attention from
 * OpenBLAS cblas_sgemm on the same shapes and threads (per head: S = scale Q K^T, a softmax
 * row by row over the full S x S matrix with libm expf (causal: masked entries 0), O = P V; the
 * backward recomputes S and P, then dV = P^T dO, dP = dO V^T, dS = P (dP - D) scale,
 * dQ = dS K, dK = dS^T Q: five sgemms).
 * Rate: GFLOP/s with FLOPs = 4 s^2 d h forward (half for causal), 2.5x that backward, the same
 * count for the kernel and its anchor. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench_common.h"
#include "xte/xte.h"
#include "xte_bench.h"

#define H 8
#define D 128

typedef struct asize {
  int64_t s;
  float *q, *k, *v, *o, *dout, *dq, *dk, *dv, *lse;
  float *no, *ndq, *ndk, *ndv; /* naive outputs */
  float *S, *dP, *Dv;          /* naive work */
} asize;

typedef struct acase_b {
  char name[96], anchor[96];
  asize *sz;
  int causal, bwd, checked, fast;
} acase_b;

static asize sizes[2] = {{1024, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                          NULL, NULL, NULL, NULL, NULL},
                         {4096, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                          NULL, NULL, NULL, NULL, NULL}};
static acase_b cases[24];

static void size_alloc(asize *z) {
  size_t n = (size_t)z->s * H * D;
  if (z->q) return;
#define BA(p, cnt) p = (float *)xte_bench_alloc((cnt) * sizeof(float))
  BA(z->q, n);
  BA(z->k, n);
  BA(z->v, n);
  BA(z->o, n);
  BA(z->dout, n);
  BA(z->dq, n);
  BA(z->dk, n);
  BA(z->dv, n);
  BA(z->no, n);
  BA(z->ndq, n);
  BA(z->ndk, n);
  BA(z->ndv, n);
  BA(z->lse, (size_t)z->s * H);
  BA(z->S, (size_t)z->s * (size_t)z->s);
  BA(z->dP, (size_t)z->s * (size_t)z->s);
  BA(z->Dv, (size_t)z->s);
  xte_bench_fill_f32(z->q, n, 1);
  xte_bench_fill_f32(z->k, n, 2);
  xte_bench_fill_f32(z->v, n, 3);
  xte_bench_fill_f32(z->dout, n, 4);
  { /* moderate magnitudes (the fill varies them by 2^+-8 per 128 elements) */
    size_t i;
    for (i = 0; i < n; i++) {
      z->q[i] = tanhf(z->q[i]);
      z->k[i] = tanhf(z->k[i]);
      z->v[i] = tanhf(z->v[i]);
      z->dout[i] = tanhf(z->dout[i]);
    }
  }
}

static xte_tensor t4(float *p, int64_t s) {
  xte_tensor t = xte_tensor_2d(p, XTE_DTYPE_FP32, 1, s);
  t.rank = 4;
  t.shape[0] = 1;
  t.shape[1] = s;
  t.shape[2] = H;
  t.shape[3] = D;
  return t;
}

/* ---------------------------------------------------------------- naive anchor */
typedef struct sm_job {
  float *S, *dP, *Dv;
  const float *o, *dout;
  int64_t s, h;
  int causal, bwd;
  float scale;
} sm_job;

static void softmax_rows(void *ctx, int t, int nt) {
  sm_job *j = (sm_job *)ctx;
  int64_t i0 = j->s * t / nt, i1 = j->s * (t + 1) / nt, i, c;
  for (i = i0; i < i1; i++) {
    float *r = j->S + i * j->s, mx = -INFINITY, sum = 0.0f, inv;
    int64_t n = j->causal ? i + 1 : j->s;
    for (c = 0; c < n; c++) mx = r[c] > mx ? r[c] : mx;
    for (c = 0; c < n; c++) sum += (r[c] = expf(r[c] - mx));
    inv = 1.0f / sum;
    for (c = 0; c < n; c++) r[c] *= inv;
    for (c = n; c < j->s; c++) r[c] = 0.0f;
  }
}

/* dS = P (dP - D) scale in place of dP, D = rowsum(dO * O) */
static void dsoftmax_rows(void *ctx, int t, int nt) {
  sm_job *j = (sm_job *)ctx;
  int64_t i0 = j->s * t / nt, i1 = j->s * (t + 1) / nt, i, c;
  for (i = i0; i < i1; i++) {
    const float *p = j->S + i * j->s, *g = j->dout + i * H * D + j->h * D,
                *o = j->o + i * H * D + j->h * D;
    float *dp = j->dP + i * j->s, Dv = 0.0f;
    for (c = 0; c < D; c++) Dv += g[c] * o[c];
    for (c = 0; c < j->s; c++) dp[c] = p[c] * (dp[c] - Dv) * j->scale;
  }
}

static void naive_fwd(asize *z, int causal, int bwd) {
  const int s = (int)z->s, ld = H * D;
  const float scale = 1.0f / sqrtf((float)D);
  int h;
  sm_job j;
  for (h = 0; h < H; h++) {
    memset(&j, 0, sizeof j);
    j.S = z->S;
    j.s = s;
    j.h = h;
    j.causal = causal;
    j.scale = scale;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, s, D, scale, z->q + h * D, ld,
                z->k + h * D, ld, 0.0f, z->S, s);
    xte_bench_team_run(softmax_rows, &j);
    if (!bwd) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, D, s, 1.0f, z->S, s, z->v + h * D,
                  ld, 0.0f, z->no + h * D, ld);
      continue;
    }
    /* backward from the recomputed P */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s, D, s, 1.0f, z->S, s, z->dout + h * D,
                ld, 0.0f, z->ndv + h * D, ld);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, s, D, 1.0f, z->dout + h * D, ld,
                z->v + h * D, ld, 0.0f, z->dP, s);
    j.dP = z->dP;
    j.o = z->no;
    j.dout = z->dout;
    xte_bench_team_run(dsoftmax_rows, &j);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, D, s, 1.0f, z->dP, s, z->k + h * D,
                ld, 0.0f, z->ndq + h * D, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s, D, s, 1.0f, z->dP, s, z->q + h * D, ld,
                0.0f, z->ndk + h * D, ld);
  }
}

static double flops(const acase_b *c) {
  double f = 4.0 * (double)c->sz->s * (double)c->sz->s * D * H;
  if (c->causal) f *= 0.5;
  return c->bwd ? 2.5 * f : f;
}

static void run_naive(xte_bench_state *st, void *arg) {
  acase_b *c = (acase_b *)arg;
  size_alloc(c->sz);
  if (c->bwd) naive_fwd(c->sz, c->causal, 0); /* O for D */
  while (xte_bench_keep_running(st)) naive_fwd(c->sz, c->causal, c->bwd);
  xte_bench_set_flops(st, flops(c));
}

static float max_rel_diff(const float *a, const float *b, size_t n) {
  size_t i;
  float m = 0.0f, mx = 0.0f;
  for (i = 0; i < n; i++) {
    float d = fabsf(a[i] - b[i]);
    if (!(d <= m)) m = d;
    if (fabsf(b[i]) > mx) mx = fabsf(b[i]);
  }
  return m / (mx > 0.0f ? mx : 1.0f);
}

static void run_xte(xte_bench_state *st, void *arg) {
  acase_b *c = (acase_b *)arg;
  asize *z = c->sz;
  xte_attention_config cfg = xte_attention_config_default();
  xte_tensor Q, K, V, O, L, dO, dQ, dK, dV;
  xte_status rc;
  size_alloc(z);
  cfg.mask = c->causal ? XTE_ATTN_MASK_CAUSAL : XTE_ATTN_MASK_NONE;
  cfg.mode = c->fast ? XTE_ATTENTION_FAST : XTE_ATTENTION_EXACT;
  Q = t4(z->q, z->s);
  K = t4(z->k, z->s);
  V = t4(z->v, z->s);
  O = t4(z->o, z->s);
  dO = t4(z->dout, z->s);
  dQ = t4(z->dq, z->s);
  dK = t4(z->dk, z->s);
  dV = t4(z->dv, z->s);
  L = xte_tensor_2d(z->lse, XTE_DTYPE_FP32, H, z->s);
  L.rank = 3;
  L.shape[0] = 1;
  L.shape[1] = H;
  L.shape[2] = z->s;
  rc = xte_attention_fwd(&Q, &K, &V, &O, &L, &cfg, NULL);
  if (rc == XTE_SUCCESS && c->bwd)
    rc = xte_attention_bwd(&Q, &K, &V, &O, &dO, &L, &dQ, &dK, &dV, &cfg, NULL);
  if (rc != XTE_SUCCESS) {
    char why[512];
    snprintf(why, sizeof why, "xte_attention: %s: %s", xte_status_string(rc), xte_last_error());
    xte_bench_fail(st, why);
    while (xte_bench_keep_running(st)) {
    }
    return;
  }
  if (!c->checked) { /* against the naive anchor */
    size_t n = (size_t)z->s * H * D;
    float e;
    naive_fwd(z, c->causal, c->bwd);
    e = max_rel_diff(z->o, z->no, n);
    if (c->bwd) {
      float e2 = max_rel_diff(z->dq, z->ndq, n), e3 = max_rel_diff(z->dk, z->ndk, n),
            e4 = max_rel_diff(z->dv, z->ndv, n);
      e = e2 > e ? e2 : e;
      e = e3 > e ? e3 : e;
      e = e4 > e ? e4 : e;
    }
    if (!(e < 1e-3f)) {
      char why[128];
      snprintf(why, sizeof why, "xte differs from the naive sgemm attention: rel %g", (double)e);
      xte_bench_fail(st, why);
    }
    c->checked = 1;
  }
  while (xte_bench_keep_running(st)) {
    if (c->bwd)
      (void)xte_attention_bwd(&Q, &K, &V, &O, &dO, &L, &dQ, &dK, &dV, &cfg, NULL);
    else
      (void)xte_attention_fwd(&Q, &K, &V, &O, &L, &cfg, NULL);
  }
  xte_bench_set_flops(st, flops(c));
}

void xte_bench_suite_attention(void) {
  static int registered;
  int n = 0, si, causal, bwd;
  if (registered) return;
  registered = 1;
  for (si = 0; si < 2; si++)
    for (bwd = 0; bwd <= 1; bwd++)
      for (causal = 0; causal <= 1; causal++) {
        acase_b *a = &cases[n++], *x = &cases[n++], *f = &cases[n++];
        a->sz = x->sz = f->sz = &sizes[si];
        a->causal = x->causal = f->causal = causal;
        a->bwd = x->bwd = f->bwd = bwd;
        f->fast = 1;
        snprintf(a->name, sizeof a->name, "attention/naive_%s/s%lld/%s", bwd ? "bwd" : "fwd",
                 (long long)sizes[si].s, causal ? "causal" : "full");
        snprintf(x->name, sizeof x->name, "attention/%s/s%lld/%s", bwd ? "bwd" : "fwd",
                 (long long)sizes[si].s, causal ? "causal" : "full");
        xte_bench_register(a->name, NULL, "GFLOP/s", run_naive, a);
        snprintf(f->name, sizeof f->name, "attention/fast_%s/s%lld/%s", bwd ? "bwd" : "fwd",
                 (long long)sizes[si].s, causal ? "causal" : "full");
        xte_bench_register(x->name, a->name, "GFLOP/s", run_xte, x);
        xte_bench_register(f->name, a->name, "GFLOP/s", run_xte, f);
        xte_bench_uses(a->name, "openblas");
      }
}
