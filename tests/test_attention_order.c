/* Attention bits against the documented order: the forward (O, LSE) and the backward (dQ, dK,
 * dV) must equal, bit for bit, a plain restatement of docs/numerics.md section 7 written here
 * from the text (loops over rows, keys and columns in the stated order; no code shared with
 * src/ but the deterministic math functions xte_expf / xte_logf / xte_tanhf of xte_math.h, which
 * the contract names). Small fp32 shapes with several KV blocks and query tiles, on every ISA
 * (xte_cpu_set_isa; an ISA this machine or build cannot run is skipped and printed).
 * It catches any change of order: the 64-lane sum done as a plain sum, a sequential dQ / dK / dV
 * chain instead of the blocked one, exp2 for exp, a missing normalisation, ... */
#include <criterion/criterion.h>

#include "numerics/xte_math.h"
#include "test_attention_oracle.h"

#define NB 64 /* keys per KV block */
#define NM 64 /* query rows per query tile */

static float neg_inf(void) {
  return -INFINITY;
}
static float maxf(float a, float b) {
  return a > b ? a : b;
}

/* sum64: 16 lanes, lane[L] = ((p[L] + p[16+L]) + p[32+L]) + p[48+L]; then lane[L] += lane[L+8]
 * (L < 8), += lane[L+4] (L < 4), += lane[L+2] (L < 2); result lane[0] + lane[1]. */
static float doc_sum64(const float *p) {
  float lane[16];
  int L;
  for (L = 0; L < 16; L++) {
    lane[L] = p[L] + p[16 + L];
    lane[L] = lane[L] + p[32 + L];
    lane[L] = lane[L] + p[48 + L];
  }
  for (L = 0; L < 8; L++) lane[L] = lane[L] + lane[L + 8];
  for (L = 0; L < 4; L++) lane[L] = lane[L] + lane[L + 4];
  for (L = 0; L < 2; L++) lane[L] = lane[L] + lane[L + 2];
  return lane[0] + lane[1];
}

typedef struct ctx {
  const adata *d;
  int64_t b, lq, lkv, off;
  float scale;
} ctx;

static float qv(const ctx *c, int64_t i, int64_t h, int64_t k) {
  return ((const float *)c->d->Qr)[ta_off(c->d, 0, c->b, i, h, k, c->d->c.hq, c->d->c.dqk)];
}
static float kv(const ctx *c, int64_t j, int64_t hk, int64_t k) {
  return ((const float *)c->d->Kr)[ta_off(c->d, 1, c->b, j, hk, k, c->d->c.hkv, c->d->c.dqk)];
}
static float vv(const ctx *c, int64_t j, int64_t hk, int64_t k) {
  return ((const float *)c->d->Vr)[ta_off(c->d, 1, c->b, j, hk, k, c->d->c.hkv, c->d->c.dv)];
}
static float ov(const ctx *c, int64_t i, int64_t h, int64_t k) {
  return ((const float *)c->d->Or)[ta_off(c->d, 0, c->b, i, h, k, c->d->c.hq, c->d->c.dv)];
}
static float gv(const ctx *c, int64_t i, int64_t h, int64_t k) {
  return ((const float *)c->d->dOr)[ta_off(c->d, 0, c->b, i, h, k, c->d->c.hq, c->d->c.dv)];
}

static int visible(const ctx *c, int64_t i, int64_t j) {
  return j >= 0 && j < c->lkv && ta_visible(&c->d->c, i, j, c->lq, c->lkv);
}
/* A block [j0, j0 + nb) is active for row i when one of its keys is visible to i. */
static int active(const ctx *c, int64_t i, int64_t j0, int64_t nb) {
  int64_t j;
  for (j = j0; j < j0 + nb; j++)
    if (visible(c, i, j)) return 1;
  return 0;
}

/* s = dot(q_i, k_j): one fmaf chain in increasing k from +0 */
static float dot_qk(const ctx *c, int64_t i, int64_t h, int64_t j) {
  const int64_t hk = h / (c->d->c.hq / c->d->c.hkv);
  float s = 0.0f;
  int64_t k;
  for (k = 0; k < c->d->c.dqk; k++) s = fmaf(qv(c, i, h, k), kv(c, j, hk, k), s);
  return s;
}
/* dp = dot(dO_i, v_j) */
static float dot_gv(const ctx *c, int64_t i, int64_t h, int64_t j) {
  const int64_t hk = h / (c->d->c.hq / c->d->c.hkv);
  float s = 0.0f;
  int64_t k;
  for (k = 0; k < c->d->c.dv; k++) s = fmaf(gv(c, i, h, k), vv(c, j, hk, k), s);
  return s;
}

/* The logit of a visible key (natural units); -inf for hidden keys and slots past the block. */
static float logit(const ctx *c, int64_t i, int64_t h, int64_t j, float *sout) {
  const acase *a = &c->d->c;
  float s, x;
  if (!visible(c, i, j)) return neg_inf();
  s = dot_qk(c, i, h, j);
  if (sout) *sout = s;
  if (a->softcap > 0.0f)
    x = xte_tanhf(s * (c->scale / a->softcap)) * a->softcap;
  else
    x = s * c->scale;
  if (a->alibi) {
    int64_t dist = i + c->off - j;
    x = fmaf(-(float)(dist < 0 ? -dist : dist), c->d->alibi[h], x);
  }
  return x;
}

/* dx/ds */
static float dlogit(const ctx *c, float s) {
  const acase *a = &c->d->c;
  float th;
  if (!(a->softcap > 0.0f)) return c->scale;
  th = xte_tanhf(s * (c->scale / a->softcap));
  return fmaf(-th, th, 1.0f) * c->scale;
}

/* The forward of row i of head h: o[dv], *lse. */
static void doc_fwd_row(const ctx *c, int64_t i, int64_t h, float *o, float *lse) {
  const acase *a = &c->d->c;
  const int64_t hk = h / (a->hq / a->hkv);
  float m = neg_inf(), l = 0.0f, x[NB], p[NB];
  int64_t j0, jj, cc;
  for (cc = 0; cc < a->dv; cc++) o[cc] = 0.0f;
  for (j0 = 0; j0 < c->lkv; j0 += NB) {
    const int64_t nb = c->lkv - j0 < NB ? c->lkv - j0 : NB;
    float mb = neg_inf(), mn, alpha;
    if (!active(c, i, j0, nb)) continue;
    for (jj = 0; jj < NB; jj++) x[jj] = jj < nb ? logit(c, i, h, j0 + jj, NULL) : neg_inf();
    for (jj = 0; jj < NB; jj++) mb = maxf(mb, x[jj]);
    mn = maxf(m, mb);
    alpha = xte_expf(m - mn);
    m = mn;
    for (jj = 0; jj < NB; jj++) p[jj] = xte_expf(x[jj] - m);
    l = fmaf(l, alpha, doc_sum64(p));
    for (cc = 0; cc < a->dv; cc++) {
      float pv = 0.0f;
      for (jj = 0; jj < nb; jj++) pv = fmaf(p[jj], vv(c, j0 + jj, hk, cc), pv);
      o[cc] = fmaf(o[cc], alpha, pv);
    }
  }
  if (l > 0.0f) {
    for (cc = 0; cc < a->dv; cc++) o[cc] = o[cc] / l;
    *lse = m + xte_logf(l);
  } else {
    for (cc = 0; cc < a->dv; cc++) o[cc] = 0.0f;
    *lse = neg_inf();
  }
}

static int same_bits(float x, float y) {
  uint32_t a, b;
  memcpy(&a, &x, 4);
  memcpy(&b, &y, 4);
  return a == b;
}

/* Expects n floats to have the documented bits; prints the first that differs. */
static void expect_same(const char *name, const char *out, const char *isa, const float *got,
                        const float *want, int64_t n) {
  int64_t i, bad = 0;
  for (i = 0; i < n; i++)
    if (!same_bits(got[i], want[i])) {
      if (bad == 0)
        fprintf(stderr, "%s: %s (%s): [%lld] xte %a, documented order %a\n", name, out, isa,
                (long long)i, got[i], want[i]);
      bad++;
    }
  cr_expect_eq(bad, 0, "%s: %s (%s): %lld elements differ from the documented order", name, out,
               isa, (long long)bad);
}

/* The per-sequence context of sequence b. */
static ctx seq_ctx(const adata *d, const acase *cs, int64_t b) {
  ctx c;
  c.d = d;
  c.b = b;
  c.lq = ta_lq(d, b);
  c.lkv = ta_lkv(d, b);
  c.off = c.lkv - c.lq;
  c.scale = cs->scale != 0.0f ? cs->scale : 1.0f / sqrtf((float)cs->dqk);
  return c;
}

static float lse_of(const ctx *c, int64_t i, int64_t h) {
  return c->d->lse[ta_loff(c->d, c->b, i, h)];
}

/* The backward of sequence c->b into dq, dk, dv (tensor order, fp32). */
static void doc_bwd_seq(const ctx *c, float *dq, float *dk, float *dv) {
  const acase *a = &c->d->c;
  const int64_t G = a->hq / a->hkv, lq = c->lq;
  float *D = (float *)calloc((size_t)(a->hq * lq + 1), 4);
  float *corr = (float *)calloc((size_t)(a->hq * lq + 1), 4);
  float *acc = (float *)calloc((size_t)(NB * (a->dqk + a->dv) + 256), 4);
  float *part = (float *)calloc((size_t)(NB * (a->dqk + a->dv) + 256), 4);
  float x[NB], sv[NB], u[NB], dp[NB], ds[NB];
  int64_t h, i, j0, jj, cc, hk;
  /* D_i = fmaf chain over c of dO_ic * O_ic from +0 */
  for (h = 0; h < a->hq; h++)
    for (i = 0; i < lq; i++) {
      float s = 0.0f;
      for (cc = 0; cc < a->dv; cc++) s = fmaf(gv(c, i, h, cc), ov(c, i, h, cc), s);
      D[h * lq + i] = s;
    }
  /* dQ: per active block in order, u = expf(x - LSE); lambda = lambda + sum64(u);
   * part = chain over the block's keys of fmaf(ds', k, .) from +0, acc = acc + part;
   * dQ = acc / lambda; corr = logf(lambda) (0 when lambda = 0, dQ then 0). */
  for (h = 0; h < a->hq; h++) {
    hk = h / G;
    for (i = 0; i < lq; i++) {
      float lam = 0.0f, Di = D[h * lq + i], L = lse_of(c, i, h);
      for (cc = 0; cc < a->dqk; cc++) acc[cc] = 0.0f;
      for (j0 = 0; j0 < c->lkv; j0 += NB) {
        const int64_t nb = c->lkv - j0 < NB ? c->lkv - j0 : NB;
        if (!active(c, i, j0, nb)) continue;
        for (jj = 0; jj < NB; jj++) {
          sv[jj] = 0.0f;
          x[jj] = jj < nb ? logit(c, i, h, j0 + jj, &sv[jj]) : neg_inf();
          u[jj] = xte_expf(x[jj] - L);
          dp[jj] = jj < nb ? dot_gv(c, i, h, j0 + jj) : 0.0f;
          ds[jj] = (u[jj] * (dp[jj] - Di)) * dlogit(c, sv[jj]);
        }
        lam = lam + doc_sum64(u);
        for (cc = 0; cc < a->dqk; cc++) {
          float s = 0.0f;
          for (jj = 0; jj < nb; jj++) s = fmaf(ds[jj], kv(c, j0 + jj, hk, cc), s);
          acc[cc] = acc[cc] + s;
        }
      }
      for (cc = 0; cc < a->dqk; cc++)
        dq[ta_off(c->d, 0, c->b, i, h, cc, a->hq, a->dqk)] = lam > 0.0f ? acc[cc] / lam : acc[cc];
      corr[h * lq + i] = lam > 0.0f ? xte_logf(lam) : 0.0f;
    }
  }
  /* dK, dV of each block: per query head of the group, per 64-row query tile in order, a chain
   * from +0 over the tile's active rows in order; the tiles' parts added in order from +0. */
  for (hk = 0; hk < a->hkv; hk++)
    for (j0 = 0; j0 < c->lkv; j0 += NB) {
      const int64_t nb = c->lkv - j0 < NB ? c->lkv - j0 : NB;
      float *aK = acc, *aV = acc + NB * a->dqk, *pK = part, *pV = part + NB * a->dqk;
      int64_t g, t0;
      for (cc = 0; cc < NB * (a->dqk + a->dv); cc++) acc[cc] = 0.0f;
      for (g = 0; g < G; g++) {
        h = hk * G + g;
        for (t0 = 0; t0 < lq; t0 += NM) {
          int any = 0;
          for (cc = 0; cc < NB * (a->dqk + a->dv); cc++) part[cc] = 0.0f;
          for (i = t0; i < lq && i < t0 + NM; i++) {
            float Di = D[h * lq + i], L = lse_of(c, i, h), ci = corr[h * lq + i];
            if (!active(c, i, j0, nb)) continue;
            any = 1;
            for (jj = 0; jj < nb; jj++) {
              float p;
              sv[jj] = 0.0f;
              x[jj] = logit(c, i, h, j0 + jj, &sv[jj]);
              p = xte_expf((x[jj] - L) - ci);
              u[jj] = p;
              ds[jj] = (p * (dot_gv(c, i, h, j0 + jj) - Di)) * dlogit(c, sv[jj]);
              for (cc = 0; cc < a->dv; cc++)
                pV[jj * a->dv + cc] = fmaf(u[jj], gv(c, i, h, cc), pV[jj * a->dv + cc]);
              for (cc = 0; cc < a->dqk; cc++)
                pK[jj * a->dqk + cc] = fmaf(ds[jj], qv(c, i, h, cc), pK[jj * a->dqk + cc]);
            }
          }
          if (!any) continue;
          for (cc = 0; cc < NB * (a->dqk + a->dv); cc++) acc[cc] = acc[cc] + part[cc];
        }
      }
      for (jj = 0; jj < nb; jj++) {
        for (cc = 0; cc < a->dqk; cc++)
          dk[ta_off(c->d, 1, c->b, j0 + jj, hk, cc, a->hkv, a->dqk)] = aK[jj * a->dqk + cc];
        for (cc = 0; cc < a->dv; cc++)
          dv[ta_off(c->d, 1, c->b, j0 + jj, hk, cc, a->hkv, a->dv)] = aV[jj * a->dv + cc];
      }
    }
  free(D);
  free(corr);
  free(acc);
  free(part);
}

static void check_case(const acase *cs, const char *name) {
  static const xte_cpu_isa isas[4] = {XTE_CPU_ISA_SCALAR, XTE_CPU_ISA_AVX2, XTE_CPU_ISA_AVX512,
                                      XTE_CPU_ISA_AVX512_SIMDE};
  const xte_cpu_isa saved = xte_cpu_get_isa();
  int k;
  for (k = 0; k < 4; k++) {
    const char *isa = xte_cpu_isa_name(isas[k]);
    xte_status st = xte_cpu_set_isa(isas[k]);
    adata d;
    float *o, *lse, *dq, *dk, *dv;
    int64_t b, h, i, cc;
    if (st == XTE_ERROR_UNSUPPORTED) {
      printf("attention order: %s: ISA %s cannot run here: skipped\n", name, isa);
      continue;
    }
    cr_assert_eq(st, XTE_SUCCESS);
    ta_setup(&d, cs);
    cr_assert_eq(xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    o = (float *)calloc((size_t)d.no + 1, 4);
    lse = (float *)calloc((size_t)d.nl + 1, 4);
    dq = (float *)calloc((size_t)d.nq + 1, 4);
    dk = (float *)calloc((size_t)d.nk + 1, 4);
    dv = (float *)calloc((size_t)d.nv + 1, 4);
    for (i = 0; i < d.nl; i++) lse[i] = neg_inf(); /* positions outside every sequence */
    for (b = 0; b < cs->b; b++) {
      ctx c = seq_ctx(&d, cs, b);
      for (h = 0; h < cs->hq; h++)
        for (i = 0; i < c.lq; i++) {
          float row[256], l;
          doc_fwd_row(&c, i, h, row, &l);
          for (cc = 0; cc < cs->dv; cc++) o[ta_off(&d, 0, b, i, h, cc, cs->hq, cs->dv)] = row[cc];
          lse[ta_loff(&d, b, i, h)] = l;
        }
    }
    expect_same(name, "O", isa, (const float *)d.Or, o, d.no);
    expect_same(name, "LSE", isa, d.lse, lse, d.nl);
    /* the backward, from xte's O and LSE */
    cr_assert_eq(
        xte_attention_bwd(&d.Q, &d.K, &d.V, &d.O, &d.dO, &d.L, &d.dQ, &d.dK, &d.dV, &d.cfg, NULL),
        XTE_SUCCESS, "%s", xte_last_error());
    for (b = 0; b < cs->b; b++) {
      ctx c = seq_ctx(&d, cs, b);
      doc_bwd_seq(&c, dq, dk, dv);
    }
    expect_same(name, "dQ", isa, (const float *)d.dQr, dq, d.nq);
    expect_same(name, "dK", isa, (const float *)d.dKr, dk, d.nk);
    expect_same(name, "dV", isa, (const float *)d.dVr, dv, d.nv);
    free(o);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
    ta_free(&d);
  }
  xte_cpu_set_isa(saved);
}

static acase mk(xte_attn_layout L, int64_t b, int64_t sq, int64_t skv, int64_t hq, int64_t hkv,
                int64_t dqk, int64_t dv, xte_attn_mask m) {
  acase c = ta_case(L, F32, b, sq, skv, hq, hkv, dqk, dv, m);
  c.seed = (uint64_t)(sq * 13 + skv * 7 + hq + dqk * 3 + (int)m);
  return c;
}

Test(attention_order, gqa_causal_two_tiles) {
  /* 2 query tiles, 3 KV blocks (the last partial), GQA 2 */
  acase c = mk(BSHD, 1, 70, 150, 4, 2, 16, 8, CAUSAL_BR);
  check_case(&c, "bshd gqa causal-br 70x150");
}

Test(attention_order, no_mask_odd_dims) {
  acase c = mk(SBHD, 2, 66, 129, 2, 1, 7, 5, NOMASK);
  check_case(&c, "sbhd mqa 66x129 d7/5");
}

Test(attention_order, window_softcap_alibi) {
  acase c = mk(BSHD, 1, 80, 140, 2, 2, 16, 16, NOMASK);
  c.wl = 50;
  c.wr = 3;
  c.softcap = 6.0f;
  c.alibi = 1;
  check_case(&c, "window softcap alibi 80x140");
}

Test(attention_order, thd_varlen_padding) {
  static const int32_t lq[3] = {65, 0, 3};
  static const int32_t lk[3] = {130, 2, 70};
  acase c = mk(THD, 3, 0, 0, 2, 1, 8, 8, CAUSAL);
  c.lens_q = lq;
  c.lens_kv = lk;
  check_case(&c, "thd varlen causal");
  c = mk(BSHD, 3, 66, 131, 2, 2, 8, 8, NOMASK);
  c.padded = 1;
  c.lens_q = lq;
  c.lens_kv = lk;
  c.scale = 0.3f;
  check_case(&c, "bshd padded scale 0.3");
}

/* The transposed kernels (fwd_softmax_t, bwd_p_t: 16 query rows per vector) with fp32 K, V, Q, dO
 * read in place (head dims multiples of 16), no softcap / ALiBi: query counts that are not a
 * multiple of 16 (a partial group of columns), a window that leaves rows of a group without the
 * block (their state must not change), several KV blocks. */
Test(attention_order, plain_in_place_window_tails) {
  acase c = mk(BSHD, 1, 83, 147, 2, 1, 32, 16, CAUSAL_BR);
  c.wl = 9;
  c.wr = 0;
  check_case(&c, "bshd plain window 83x147 d32/16");
  c = mk(SBHD, 2, 67, 67, 2, 2, 16, 32, NOMASK);
  check_case(&c, "sbhd plain 67x67 d16/32");
  c = mk(BSHD, 1, 130, 70, 1, 1, 16, 16, CAUSAL);
  c.wl = 20;
  c.wr = 5;
  check_case(&c, "bshd causal window 130x70 d16");
}
