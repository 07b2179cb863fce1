/* Attention test helpers: problem set-up, an fp64 oracle (the full s_q x s_kv matrix, libm exp
 * in double) and the naive algorithm in the input precision (fp32 arithmetic, P and outputs
 * rounded to the input dtype), written independently of the library. */
#ifndef TEST_ATTENTION_ORACLE_H
#define TEST_ATTENTION_ORACLE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xte/xte.h"

typedef struct acase {
  xte_attn_layout layout;
  xte_dtype dt;
  int64_t b, sq, skv, hq, hkv, dqk, dv;
  xte_attn_mask mask;
  int64_t wl, wr;
  float softcap;
  int alibi;
  float scale;                     /* 0: default */
  int padded;                      /* BSHD / SBHD: use lens_q / lens_kv as padding */
  const int32_t *lens_q, *lens_kv; /* THD / padded: [b] */
  uint64_t seed;
  int fast; /* XTE_ATTENTION_FAST (also for every case when TA_MODE=fast is set: ta_fast_env) */
} acase;

typedef struct adata {
  acase c;
  xte_attention_config cfg;
  int32_t *cu_q, *cu_kv;
  int64_t tq, tkv; /* tokens of THD tensors, or s */
  int64_t nq, nk, nv, no, nl;
  double *q, *k, *v, *dout, *alibi_d; /* exact values, tensor order */
  float *alibi;
  void *Qr, *Kr, *Vr, *Or, *dOr, *dQr, *dKr, *dVr;
  float *lse;
  xte_tensor Q, K, V, O, L, dO, dQ, dK, dV;
  /* oracle (fp64) and naive (input precision) results, tensor order */
  double *o_ref, *lse_ref, *dq_ref, *dk_ref, *dv_ref;
  double *o_nv, *lse_nv, *dq_nv, *dk_nv, *dv_nv;
} adata;

/* Short names for the case tables. */
#define BSHD XTE_ATTN_LAYOUT_BSHD
#define SBHD XTE_ATTN_LAYOUT_SBHD
#define THD XTE_ATTN_LAYOUT_THD
#define F32 XTE_DTYPE_FP32
#define BF16 XTE_DTYPE_BF16
#define F16 XTE_DTYPE_FP16
#define NOMASK XTE_ATTN_MASK_NONE
#define CAUSAL XTE_ATTN_MASK_CAUSAL
#define CAUSAL_BR XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT

/* A case without window, softcap, ALiBi, explicit scale or lengths; seed 0 (ta_setup's default). */
static inline acase ta_case(xte_attn_layout L, xte_dtype dt, int64_t b, int64_t sq, int64_t skv,
                            int64_t hq, int64_t hkv, int64_t dqk, int64_t dv, xte_attn_mask m) {
  acase c;
  memset(&c, 0, sizeof c);
  c.layout = L;
  c.dt = dt;
  c.b = b;
  c.sq = sq;
  c.skv = skv;
  c.hq = hq;
  c.hkv = hkv;
  c.dqk = dqk;
  c.dv = dv;
  c.mask = m;
  c.wl = c.wr = -1;
  return c;
}

static inline uint64_t ta_rng(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Round x to a binary format with mbits fraction bits and min normal exponent emin (RNE). */
static inline double ta_round(double x, int mbits, int emin) {
  int e;
  double ulp;
  if (x == 0.0 || !isfinite(x)) return x;
  frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
  e -= 1;
  if (e < emin) e = emin;
  ulp = ldexp(1.0, e - mbits);
  return nearbyint(x / ulp) * ulp;
}
static inline double ta_round_dt(double x, xte_dtype dt) {
  if (dt == XTE_DTYPE_BF16) return ta_round(x, 7, -126);
  if (dt == XTE_DTYPE_FP16) return ta_round(x, 10, -14);
  return (double)(float)x;
}

static inline uint16_t ta_enc16(double x, int mbits, int ebias) { /* exact value, normal or zero */
  uint16_t s = x < 0 ? 0x8000 : 0;
  int e;
  double a = fabs(x), m;
  if (a == 0.0) return s;
  m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
  e -= 1;
  m = m * 2.0 - 1.0;
  return (uint16_t)(s | ((e + ebias) << mbits) | (uint16_t)(m * (1 << mbits)));
}
static inline double ta_dec16(uint16_t h, int mbits, int ebias, int ebits) {
  int s = h >> 15, e = (h >> mbits) & ((1 << ebits) - 1);
  double m = h & ((1 << mbits) - 1), v;
  if (e == (1 << ebits) - 1)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp(m, 1 - ebias - mbits);
  else
    v = ldexp(1.0 + m / (1 << mbits), e - ebias);
  return s ? -v : v;
}

static inline void ta_put(void *raw, xte_dtype dt, int64_t i, double x) {
  if (dt == XTE_DTYPE_FP32)
    ((float *)raw)[i] = (float)x;
  else if (dt == XTE_DTYPE_BF16)
    ((uint16_t *)raw)[i] = ta_enc16(x, 7, 127);
  else
    ((uint16_t *)raw)[i] = ta_enc16(x, 10, 15);
}
static inline double ta_get(const void *raw, xte_dtype dt, int64_t i) {
  if (dt == XTE_DTYPE_FP32) return ((const float *)raw)[i];
  if (dt == XTE_DTYPE_BF16) return ta_dec16(((const uint16_t *)raw)[i], 7, 127, 8);
  return ta_dec16(((const uint16_t *)raw)[i], 10, 15, 5);
}

static inline int64_t ta_lq(const adata *d, int64_t b) {
  return d->cu_q ? d->cu_q[b + 1] - d->cu_q[b] : d->c.sq;
}
static inline int64_t ta_lkv(const adata *d, int64_t b) {
  return d->cu_kv ? d->cu_kv[b + 1] - d->cu_kv[b] : d->c.skv;
}
/* element offset of (b, i, h, c) in a tensor with H heads and head dim D */
static inline int64_t ta_off(const adata *d, int kv, int64_t b, int64_t i, int64_t h, int64_t c,
                             int64_t H, int64_t D) {
  const acase *a = &d->c;
  if (a->layout == XTE_ATTN_LAYOUT_THD) {
    int64_t t = (kv ? d->cu_kv[b] : d->cu_q[b]) + i;
    return (t * H + h) * D + c;
  }
  if (a->layout == XTE_ATTN_LAYOUT_BSHD) {
    int64_t s = kv ? a->skv : a->sq;
    return ((b * s + i) * H + h) * D + c;
  }
  return ((i * a->b + b) * H + h) * D + c;
}
static inline int64_t ta_loff(const adata *d, int64_t b, int64_t i, int64_t h) {
  if (d->c.layout == XTE_ATTN_LAYOUT_THD) return (d->cu_q[b] + i) * d->c.hq + h;
  return (b * d->c.hq + h) * d->c.sq + i;
}

static inline xte_tensor ta_tensor(const adata *d, void *data, xte_dtype dt, int64_t s, int64_t H,
                                   int64_t D) {
  xte_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dt;
  if (d->c.layout == XTE_ATTN_LAYOUT_THD) {
    t.rank = 3;
    t.shape[0] = s;
    t.shape[1] = H;
    t.shape[2] = D;
  } else {
    t.rank = 4;
    t.shape[0] = d->c.layout == XTE_ATTN_LAYOUT_BSHD ? d->c.b : s;
    t.shape[1] = d->c.layout == XTE_ATTN_LAYOUT_BSHD ? s : d->c.b;
    t.shape[2] = H;
    t.shape[3] = D;
  }
  return t;
}

/* A rank-3 fp32 THD tensor [t, h, d] over data (dense). */
static inline xte_tensor ta_thd_f32(void *data, int64_t t, int64_t h, int64_t d) {
  xte_tensor x;
  memset(&x, 0, sizeof x);
  x.dtype = XTE_DTYPE_FP32;
  x.rank = 3;
  x.data = data;
  x.shape[0] = t;
  x.shape[1] = h;
  x.shape[2] = d;
  return x;
}

static inline double ta_value(uint64_t *s) { /* k / 64, k in [-127, 127]: exact in bf16 and fp16 */
  return (double)((int)(ta_rng(s) % 255) - 127) / 64.0;
}

/* TA_MODE=fast in the environment: every case of the table-driven tests runs in
 * XTE_ATTENTION_FAST (tests/CMakeLists.txt registers them so, <test>@fast@<isa>), against the
 * same oracle and bound. */
static inline int ta_fast_env(void) {
  const char *m = getenv("TA_MODE");
  return m && strcmp(m, "fast") == 0;
}

static inline void ta_setup(adata *d, const acase *c) {
  int64_t i, bsz;
  uint64_t s = c->seed ? c->seed : 12345;
  memset(d, 0, sizeof *d);
  d->c = *c;
  d->cfg = xte_attention_config_default();
  d->cfg.layout = c->layout;
  d->cfg.mask = c->mask;
  d->cfg.window_left = c->wl;
  d->cfg.window_right = c->wr;
  d->cfg.softcap = c->softcap;
  d->cfg.softmax_scale = c->scale;
  d->cfg.mode = c->fast || ta_fast_env() ? XTE_ATTENTION_FAST : XTE_ATTENTION_EXACT;
  if (c->layout == XTE_ATTN_LAYOUT_THD || c->padded) {
    d->cu_q = (int32_t *)calloc((size_t)c->b + 1, 4);
    d->cu_kv = (int32_t *)calloc((size_t)c->b + 1, 4);
    for (i = 0; i < c->b; i++) {
      d->cu_q[i + 1] = d->cu_q[i] + c->lens_q[i];
      d->cu_kv[i + 1] = d->cu_kv[i] + c->lens_kv[i];
    }
    d->cfg.cu_seqlens_q = d->cu_q;
    d->cfg.cu_seqlens_kv = d->cu_kv;
  }
  if (c->layout == XTE_ATTN_LAYOUT_THD) {
    int64_t mq = 0, mk = 0;
    for (i = 0; i < c->b; i++) {
      if (c->lens_q[i] > mq) mq = c->lens_q[i];
      if (c->lens_kv[i] > mk) mk = c->lens_kv[i];
    }
    d->tq = d->cu_q[c->b] + 1; /* one token outside every sequence */
    d->tkv = d->cu_kv[c->b] + 1;
    d->cfg.batch = c->b;
    d->cfg.max_seqlen_q = mq;
    d->cfg.max_seqlen_kv = mk;
    bsz = 1;
  } else {
    d->tq = c->sq;
    d->tkv = c->skv;
    bsz = c->b;
  }
  d->nq = bsz * d->tq * c->hq * c->dqk;
  d->nk = bsz * d->tkv * c->hkv * c->dqk;
  d->nv = bsz * d->tkv * c->hkv * c->dv;
  d->no = bsz * d->tq * c->hq * c->dv;
  d->nl = bsz * d->tq * c->hq;
#define TA_ALLOC(p, n, T) p = (T *)calloc((size_t)(n) + 1, sizeof(T))
  TA_ALLOC(d->q, d->nq, double);
  TA_ALLOC(d->k, d->nk, double);
  TA_ALLOC(d->v, d->nv, double);
  TA_ALLOC(d->dout, d->no, double);
  TA_ALLOC(d->Qr, d->nq * 4, char);
  TA_ALLOC(d->Kr, d->nk * 4, char);
  TA_ALLOC(d->Vr, d->nv * 4, char);
  TA_ALLOC(d->Or, d->no * 4, char);
  TA_ALLOC(d->dOr, d->no * 4, char);
  TA_ALLOC(d->dQr, d->nq * 4, char);
  TA_ALLOC(d->dKr, d->nk * 4, char);
  TA_ALLOC(d->dVr, d->nv * 4, char);
  TA_ALLOC(d->lse, d->nl, float);
  for (i = 0; i < d->nq; i++) ta_put(d->Qr, c->dt, i, d->q[i] = ta_value(&s));
  for (i = 0; i < d->nk; i++) ta_put(d->Kr, c->dt, i, d->k[i] = ta_value(&s));
  for (i = 0; i < d->nv; i++) ta_put(d->Vr, c->dt, i, d->v[i] = ta_value(&s));
  for (i = 0; i < d->no; i++) ta_put(d->dOr, c->dt, i, d->dout[i] = ta_value(&s));
  if (c->alibi) {
    TA_ALLOC(d->alibi, c->hq, float);
    for (i = 0; i < c->hq; i++)
      d->alibi[i] = (float)pow(2.0, -8.0 * (double)(i + 1) / (double)c->hq);
    d->cfg.alibi_slopes = d->alibi;
  }
  d->Q = ta_tensor(d, d->Qr, c->dt, d->tq, c->hq, c->dqk);
  d->K = ta_tensor(d, d->Kr, c->dt, d->tkv, c->hkv, c->dqk);
  d->V = ta_tensor(d, d->Vr, c->dt, d->tkv, c->hkv, c->dv);
  d->O = ta_tensor(d, d->Or, c->dt, d->tq, c->hq, c->dv);
  d->dO = ta_tensor(d, d->dOr, c->dt, d->tq, c->hq, c->dv);
  d->dQ = ta_tensor(d, d->dQr, c->dt, d->tq, c->hq, c->dqk);
  d->dK = ta_tensor(d, d->dKr, c->dt, d->tkv, c->hkv, c->dqk);
  d->dV = ta_tensor(d, d->dVr, c->dt, d->tkv, c->hkv, c->dv);
  if (c->layout == XTE_ATTN_LAYOUT_THD)
    d->L = xte_tensor_2d(d->lse, XTE_DTYPE_FP32, d->tq, c->hq);
  else {
    memset(&d->L, 0, sizeof d->L);
    d->L.data = d->lse;
    d->L.dtype = XTE_DTYPE_FP32;
    d->L.rank = 3;
    d->L.shape[0] = c->b;
    d->L.shape[1] = c->hq;
    d->L.shape[2] = c->sq;
  }
}

static inline void ta_free(adata *d) {
  void *ps[] = {d->cu_q, d->cu_kv,  d->q,     d->k,       d->v,      d->dout,   d->alibi,
                d->Qr,   d->Kr,     d->Vr,    d->Or,      d->dOr,    d->dQr,    d->dKr,
                d->dVr,  d->lse,    d->o_ref, d->lse_ref, d->dq_ref, d->dk_ref, d->dv_ref,
                d->o_nv, d->lse_nv, d->dq_nv, d->dk_nv,   d->dv_nv};
  size_t i;
  for (i = 0; i < sizeof ps / sizeof ps[0]; i++) free(ps[i]);
}

static inline int ta_visible(const acase *c, int64_t i, int64_t j, int64_t lq, int64_t lkv) {
  int64_t off = lkv - lq;
  if (c->mask == XTE_ATTN_MASK_CAUSAL && j > i) return 0;
  if (c->mask == XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT && j > i + off) return 0;
  if (c->wl >= 0 && j < i + off - c->wl) return 0;
  if (c->wr >= 0 && j > i + off + c->wr) return 0;
  return 1;
}

/* The oracle (prec = 0, fp64) or the naive algorithm in the input precision (prec = 1).
 * Writes O, LSE and, when dout given, dQ, dK, dV (tensor order, doubles). */
static inline void ta_reference(adata *d, int prec, double *O, double *LSE, double *dQ, double *dK,
                                double *dV) {
  const acase *c = &d->c;
  const int64_t G = c->hq / c->hkv;
  const double scale = c->scale != 0.0f ? c->scale : 1.0 / sqrt((double)c->dqk);
  int64_t b, h, i, j, e;
  for (b = 0; b < c->b; b++) {
    const int64_t lq = ta_lq(d, b), lkv = ta_lkv(d, b);
    double *x = (double *)malloc(sizeof(double) * (size_t)(lkv + 1));
    double *p = (double *)malloc(sizeof(double) * (size_t)(lkv + 1));
    double *sv = (double *)malloc(sizeof(double) * (size_t)(lkv + 1));
    char *vis = (char *)malloc((size_t)lkv + 1);
    for (h = 0; h < c->hq; h++) {
      const int64_t hk = h / G;
      for (i = 0; i < lq; i++) {
        double mx = -INFINITY, sum = 0.0, lse, D = 0.0;
        for (j = 0; j < lkv; j++) {
          double s = 0.0;
          float sf = 0.0f;
          vis[j] = (char)ta_visible(c, i, j, lq, lkv);
          for (e = 0; e < c->dqk; e++) {
            double qv = d->q[ta_off(d, 0, b, i, h, e, c->hq, c->dqk)];
            double kv = d->k[ta_off(d, 1, b, j, hk, e, c->hkv, c->dqk)];
            if (prec)
              sf = sf + (float)qv * (float)kv;
            else
              s += qv * kv;
          }
          if (prec) s = sf;
          sv[j] = s;
          if (c->softcap > 0) {
            x[j] = prec ? (double)((float)c->softcap * tanhf((float)s * (float)scale / c->softcap))
                        : c->softcap * tanh(s * scale / c->softcap);
          } else {
            x[j] = prec ? (double)((float)s * (float)scale) : s * scale;
          }
          if (c->alibi) x[j] -= (double)d->alibi[h] * fabs((double)(i + lkv - lq - j));
          if (prec) x[j] = (float)x[j];
          if (vis[j] && x[j] > mx) mx = x[j];
        }
        for (j = 0; j < lkv; j++) {
          p[j] = vis[j] ? (prec ? (double)expf((float)(x[j] - mx)) : exp(x[j] - mx)) : 0.0;
          sum = prec ? (double)((float)sum + (float)p[j]) : sum + p[j];
        }
        lse = sum > 0 ? mx + log(sum) : -INFINITY;
        if (prec) lse = (float)lse;
        LSE[ta_loff(d, b, i, h)] = lse;
        for (j = 0; j < lkv; j++) {
          p[j] = sum > 0 ? p[j] / sum : 0.0;
          if (prec) p[j] = ta_round_dt((float)p[j], c->dt);
        }
        for (e = 0; e < c->dv; e++) {
          double o = 0.0;
          float of = 0.0f;
          for (j = 0; j < lkv; j++) {
            double vv = d->v[ta_off(d, 1, b, j, hk, e, c->hkv, c->dv)];
            if (prec)
              of = of + (float)p[j] * (float)vv;
            else
              o += p[j] * vv;
          }
          if (prec) o = ta_round_dt(of, c->dt);
          O[ta_off(d, 0, b, i, h, e, c->hq, c->dv)] = o;
        }
        if (!dQ) continue;
        /* backward of this row */
        for (e = 0; e < c->dv; e++) {
          int64_t oo = ta_off(d, 0, b, i, h, e, c->hq, c->dv);
          D = prec ? (double)((float)D + (float)d->dout[oo] * (float)O[oo])
                   : D + d->dout[oo] * O[oo];
        }
        for (j = 0; j < lkv; j++) {
          double dp = 0.0, ds, g;
          float dpf = 0.0f;
          if (p[j] == 0.0) continue;
          for (e = 0; e < c->dv; e++) {
            double go = d->dout[ta_off(d, 0, b, i, h, e, c->hq, c->dv)];
            double vv = d->v[ta_off(d, 1, b, j, hk, e, c->hkv, c->dv)];
            if (prec)
              dpf = dpf + (float)go * (float)vv;
            else
              dp += go * vv;
            /* dV */
            {
              double *t = &dV[ta_off(d, 1, b, j, hk, e, c->hkv, c->dv)];
              *t = prec ? (double)((float)*t + (float)p[j] * (float)go) : *t + p[j] * go;
            }
          }
          if (prec) dp = dpf;
          g = scale;
          if (c->softcap > 0 && prec) { /* plainly in fp32, as the logit above */
            float th = tanhf((float)sv[j] * (float)scale / c->softcap);
            g = (double)((float)scale * (1.0f - th * th));
          } else if (c->softcap > 0) {
            double th = tanh(sv[j] * scale / c->softcap);
            g = scale * (1.0 - th * th);
          }
          ds = p[j] * (dp - D) * g;
          if (prec) ds = ta_round_dt((float)ds, c->dt);
          for (e = 0; e < c->dqk; e++) {
            int64_t qo = ta_off(d, 0, b, i, h, e, c->hq, c->dqk);
            int64_t ko = ta_off(d, 1, b, j, hk, e, c->hkv, c->dqk);
            dQ[qo] = prec ? (double)((float)dQ[qo] + (float)ds * (float)d->k[ko])
                          : dQ[qo] + ds * d->k[ko];
            dK[ko] = prec ? (double)((float)dK[ko] + (float)ds * (float)d->q[qo])
                          : dK[ko] + ds * d->q[qo];
          }
        }
      }
    }
    free(x);
    free(p);
    free(sv);
    free(vis);
  }
  if (prec && dQ) { /* the naive outputs are in the input dtype */
    for (i = 0; i < d->nq; i++) dQ[i] = ta_round_dt((float)dQ[i], c->dt);
    for (i = 0; i < d->nk; i++) dK[i] = ta_round_dt((float)dK[i], c->dt);
    for (i = 0; i < d->nv; i++) dV[i] = ta_round_dt((float)dV[i], c->dt);
  }
}

static inline void ta_oracle(adata *d, int bwd) {
#define TA_Z(p, n) p = (double *)calloc((size_t)(n) + 1, sizeof(double))
  TA_Z(d->o_ref, d->no);
  TA_Z(d->lse_ref, d->nl);
  TA_Z(d->o_nv, d->no);
  TA_Z(d->lse_nv, d->nl);
  {
    int64_t i;
    for (i = 0; i < d->nl; i++) d->lse_ref[i] = d->lse_nv[i] = -INFINITY;
  }
  if (bwd) {
    TA_Z(d->dq_ref, d->nq);
    TA_Z(d->dk_ref, d->nk);
    TA_Z(d->dv_ref, d->nv);
    TA_Z(d->dq_nv, d->nq);
    TA_Z(d->dk_nv, d->nk);
    TA_Z(d->dv_nv, d->nv);
  }
  ta_reference(d, 0, d->o_ref, d->lse_ref, d->dq_ref, d->dk_ref, d->dv_ref);
  ta_reference(d, 1, d->o_nv, d->lse_nv, d->dq_nv, d->dk_nv, d->dv_nv);
}

/* FlashAttention's criterion on the elements of one output: max |xte - ref| <= 2 max |naive -
 * ref| + atol * max(1, max |ref|). Elements outside every sequence must be exactly 0. Returns 0
 * when it holds, else prints and returns 1. */
static inline int ta_check(const char *what, const adata *d, const void *raw, const double *ref,
                           const double *nv, int64_t n, double atol_rel) {
  int64_t i;
  double ex = 0, en = 0, mr = 0;
  int64_t worst = 0;
  for (i = 0; i < n; i++) {
    double x = ta_get(raw, d->c.dt, i), e = fabs(x - ref[i]), f = fabs(nv[i] - ref[i]);
    if (!(e <= ex)) {
      ex = isnan(e) ? INFINITY : e;
      worst = i;
    }
    if (f > en) en = f;
    if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
  }
  if (getenv("TA_VERBOSE"))
    fprintf(stderr, "  %s: err %.3g naive %.3g max|ref| %.3g\n", what, ex, en, mr);
  if (ex <= 2.0 * en + atol_rel * (mr > 1.0 ? mr : 1.0)) return 0;
  fprintf(stderr, "%s: max err %g (at %lld: xte %g ref %g) > 2 x naive %g + %g\n", what, ex,
          (long long)worst, ta_get(raw, d->c.dt, worst), ref[worst], en,
          atol_rel * (mr > 1.0 ? mr : 1.0));
  return 1;
}

static inline int ta_check_lse(const adata *d) {
  int64_t i;
  double ex = 0, en = 0;
  for (i = 0; i < d->nl; i++) {
    double r = d->lse_ref[i], x = d->lse[i];
    if (isinf(r) || (d->c.layout == XTE_ATTN_LAYOUT_THD && i >= d->cu_q[d->c.b] * d->c.hq)) {
      if (!(isinf(x) && x < 0)) {
        fprintf(stderr, "lse[%lld] = %g: want -inf\n", (long long)i, x);
        return 1;
      }
      continue;
    }
    if (!(fabs(x - r) <= ex)) ex = isnan(x) ? INFINITY : fabs(x - r);
    if (fabs(d->lse_nv[i] - r) > en) en = fabs(d->lse_nv[i] - r);
  }
  if (ex <= 2.0 * en + 1e-5) return 0;
  fprintf(stderr, "lse: max err %g > 2 x naive %g + 1e-5\n", ex, en);
  return 1;
}

/* atol of FlashAttention's criterion (docs/numerics.md section 7): fp32 2^-22, 2^-21 with
 * softcap (xte_tanhf against libm's tanhf in the naive reference); fp16 2^-12; bf16 2^-9. */
static inline double ta_atol(const acase *c) {
  if (c->dt == XTE_DTYPE_FP32) return c->softcap > 0.0f ? 1.0 / 2097152 : 1.0 / 4194304;
  return c->dt == XTE_DTYPE_FP16 ? 1.0 / 4096 : 1.0 / 512;
}

/* Runs the forward (and the backward) and checks them against the oracle; 0 = pass. */
static inline int ta_run_check(const acase *c, int bwd) {
  adata d;
  int bad = 0;
  xte_status st;
  ta_setup(&d, c);
  memset(d.Or, 0x7F, (size_t)(d.no * 4)); /* garbage: padding rows must be written */
  st = xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL);
  if (st != XTE_SUCCESS) {
    fprintf(stderr, "xte_attention_fwd: %s: %s\n", xte_status_string(st), xte_last_error());
    ta_free(&d);
    return 1;
  }
  ta_oracle(&d, bwd);
  bad |= ta_check("O", &d, d.Or, d.o_ref, d.o_nv, d.no, ta_atol(c));
  bad |= ta_check_lse(&d);
  if (bwd && !bad) {
    memset(d.dQr, 0x7F, (size_t)(d.nq * 4));
    memset(d.dKr, 0x7F, (size_t)(d.nk * 4));
    memset(d.dVr, 0x7F, (size_t)(d.nv * 4));
    st = xte_attention_bwd(&d.Q, &d.K, &d.V, &d.O, &d.dO, &d.L, &d.dQ, &d.dK, &d.dV, &d.cfg, NULL);
    if (st != XTE_SUCCESS) {
      fprintf(stderr, "xte_attention_bwd: %s: %s\n", xte_status_string(st), xte_last_error());
      bad = 1;
    } else {
      bad |= ta_check("dQ", &d, d.dQr, d.dq_ref, d.dq_nv, d.nq, ta_atol(c));
      bad |= ta_check("dK", &d, d.dKr, d.dk_ref, d.dk_nv, d.nk, ta_atol(c));
      bad |= ta_check("dV", &d, d.dVr, d.dv_ref, d.dv_nv, d.nv, ta_atol(c));
    }
  }
  ta_free(&d);
  return bad;
}

#endif /* TEST_ATTENTION_ORACLE_H */
