/* FP32 attention accuracy: FlashAttention's criterion as a sweep. For many random fp32 cases
 * (layouts, masks, windows, GQA, head dims, softcap, ALiBi, varlen, and few query rows, where the
 * dK / dV sums are short and the naive reference is most accurate), every output of the forward
 * (O, LSE) and of the backward (dQ, dK, dV) must satisfy
 *     max |xte - oracle| <= 2 x max |naive - oracle| + atol x max(1, max |oracle|)
 * against the fp64 oracle of test_attention_oracle.h, the naive reference being the same
 * computation done plainly in fp32, atol = ta_atol: 2^-22, 2^-21 with softcap (docs/numerics.md
 * section 7, "Accuracy"). Prints the number of cases and the worst ratio err / (2 naive + atol)
 * per output; TA_ACC_CASES=n runs n cases (default 240).
 * Before the order of docs/numerics.md section 7 (sequential sums, base-2 logits, P from the
 * fp32 LSE alone) one of the 240 cases failed (dQ and dV at 1.10 and 1.19 x the bound). */
#include <criterion/criterion.h>

#include "test_attention_oracle.h"

/* err and naive err of n elements (outside-sequence elements included: both are exact 0) */
static void errs(const adata *d, const void *raw, const double *ref, const double *nv, int64_t n,
                 double *ex, double *en, double *mr) {
  int64_t i;
  *ex = *en = *mr = 0.0;
  for (i = 0; i < n; i++) {
    double x = ta_get(raw, d->c.dt, i), e = fabs(x - ref[i]), f = fabs(nv[i] - ref[i]);
    if (!(e <= *ex)) *ex = isnan(e) ? INFINITY : e;
    if (f > *en) *en = f;
    if (fabs(ref[i]) > *mr) *mr = fabs(ref[i]);
  }
}

static int64_t pick(uint64_t *s, int64_t lo, int64_t hi) { /* uniform in [lo, hi] */
  return lo + (int64_t)(ta_rng(s) % (uint64_t)(hi - lo + 1));
}

/* Random case number k. Lengths live in *lq / *lk (THD / padding). */
static acase random_case(int k, int32_t *lq, int32_t *lk) {
  uint64_t s = 0xA77E1234ull + (uint64_t)k * 7919u;
  static const int64_t dims[8] = {64, 128, 32, 16, 80, 7, 192, 3};
  static const int64_t groups[4] = {1, 2, 4, 1};
  int few = k % 3 == 0; /* a third of the cases: 1 .. 8 query rows */
  int64_t G = groups[pick(&s, 0, 3)], hkv = pick(&s, 1, 2), b = pick(&s, 1, 3), i;
  int64_t dqk = dims[pick(&s, 0, 7)], dv = pick(&s, 0, 3) == 0 ? dims[pick(&s, 0, 7)] : dqk;
  int64_t sq = few ? pick(&s, 1, 8) : pick(&s, 1, 160), skv = pick(&s, 1, 200);
  xte_attn_layout L = (xte_attn_layout)pick(&s, 0, 2);
  acase c = ta_case(L, F32, b, sq, skv, G * hkv, hkv, dqk, dv, (xte_attn_mask)pick(&s, 0, 2));
  if (pick(&s, 0, 3) == 0) {
    c.wl = pick(&s, -1, 80);
    c.wr = pick(&s, -1, 20);
  }
  if (pick(&s, 0, 5) == 0) c.softcap = (float)pick(&s, 2, 30);
  if (pick(&s, 0, 5) == 0) c.alibi = 1;
  if (pick(&s, 0, 7) == 0) c.scale = 0.5f / (float)pick(&s, 1, 8);
  if (L == THD || pick(&s, 0, 3) == 0) {
    for (i = 0; i < b; i++) {
      lq[i] = (int32_t)pick(&s, few ? 1 : 0, sq);
      lk[i] = (int32_t)pick(&s, 0, skv);
    }
    c.lens_q = lq;
    c.lens_kv = lk;
    c.padded = L != THD;
  }
  c.seed = s | 1;
  return c;
}

Test(attention_accuracy, fp32_criterion_sweep) {
  static const char *names[5] = {"O", "LSE", "dQ", "dK", "dV"};
  const char *env = getenv("TA_ACC_CASES");
  int ncases = env ? atoi(env) : 240, k, w, fails = 0, failcase[5] = {0};
  double worst[5] = {0}, worst_nv[5] = {0}; /* ratio err / (2 naive + atol); and err / naive */
  int worst_k[5] = {0};
  for (k = 0; k < ncases; k++) {
    int32_t lq[3], lk[3];
    acase c = random_case(k, lq, lk);
    adata d;
    double ex[5], en[5], mr[5];
    int bad = 0;
    ta_setup(&d, &c);
    cr_assert_eq(xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    cr_assert_eq(
        xte_attention_bwd(&d.Q, &d.K, &d.V, &d.O, &d.dO, &d.L, &d.dQ, &d.dK, &d.dV, &d.cfg, NULL),
        XTE_SUCCESS, "%s", xte_last_error());
    ta_oracle(&d, 1);
    errs(&d, d.Or, d.o_ref, d.o_nv, d.no, &ex[0], &en[0], &mr[0]);
    { /* LSE: finite elements; -inf where the oracle's is */
      int64_t i;
      ex[1] = en[1] = 0.0;
      mr[1] = 0.0;
      for (i = 0; i < d.nl; i++) {
        double r = d.lse_ref[i], x = d.lse[i];
        int outside = c.layout == THD && i >= d.cu_q[c.b] * c.hq;
        if (isinf(r) || outside) {
          cr_expect(isinf(x) && x < 0, "case %d: lse[%lld] = %g, want -inf", k, (long long)i, x);
          continue;
        }
        if (!(fabs(x - r) <= ex[1])) ex[1] = isnan(x) ? INFINITY : fabs(x - r);
        if (fabs(r) > mr[1]) mr[1] = fabs(r);
        if (fabs(d.lse_nv[i] - r) > en[1]) en[1] = fabs(d.lse_nv[i] - r);
      }
    }
    errs(&d, d.dQr, d.dq_ref, d.dq_nv, d.nq, &ex[2], &en[2], &mr[2]);
    errs(&d, d.dKr, d.dk_ref, d.dk_nv, d.nk, &ex[3], &en[3], &mr[3]);
    errs(&d, d.dVr, d.dv_ref, d.dv_nv, d.nv, &ex[4], &en[4], &mr[4]);
    for (w = 0; w < 5; w++) {
      double bound = 2.0 * en[w] + ta_atol(&c) * (mr[w] > 1.0 ? mr[w] : 1.0);
      double r = ex[w] / bound, rn = en[w] > 0 ? ex[w] / en[w] : (ex[w] > 0 ? INFINITY : 0.0);
      if (r > worst[w]) {
        worst[w] = r;
        worst_k[w] = k;
      }
      if (rn > worst_nv[w]) worst_nv[w] = rn;
      if (!(ex[w] <= bound)) {
        failcase[w]++;
        bad = 1;
        cr_expect(0,
                  "case %d (layout %d b %lld sq %lld skv %lld hq %lld hkv %lld d %lld/%lld mask "
                  "%d win %lld,%lld cap %g alibi %d): %s err %.3g > 2 x naive %.3g + atol",
                  k, (int)c.layout, (long long)c.b, (long long)c.sq, (long long)c.skv,
                  (long long)c.hq, (long long)c.hkv, (long long)c.dqk, (long long)c.dv, (int)c.mask,
                  (long long)c.wl, (long long)c.wr, (double)c.softcap, c.alibi, names[w], ex[w],
                  en[w]);
      }
    }
    fails += bad;
    ta_free(&d);
  }
  printf("attention fp32 criterion (%s): %d cases, %d failing\n",
         xte_cpu_isa_name(xte_cpu_get_isa()), ncases, fails);
  for (w = 0; w < 5; w++)
    printf("  %-3s worst err / (2 naive + atol) = %.3f (case %d), err / naive = %.3f, %d failing\n",
           names[w], worst[w], worst_k[w], worst_nv[w], failcase[w]);
  fflush(stdout);
}
