/* Attention backward: dQ, dK, dV against the fp64 oracle (FlashAttention's criterion) across
 * layouts, masks, GQA, head dims, softcap, ALiBi, varlen; against central finite differences
 * in fp64 on small shapes; run-to-run bitwise repeatability. */
#include <criterion/criterion.h>
#include <time.h>

#include "test_attention_oracle.h"

static acase mk(xte_attn_layout L, xte_dtype dt, int64_t b, int64_t sq, int64_t skv, int64_t hq,
                int64_t hkv, int64_t dqk, int64_t dv, xte_attn_mask m) {
  acase c = ta_case(L, dt, b, sq, skv, hq, hkv, dqk, dv, m);
  c.seed = (uint64_t)(sq * 31 + skv * 17 + hq * 5 + dqk + (int)m * 100 + (int)dt * 7);
  return c;
}

static void run(acase c, const char *name) {
  int bad = ta_run_check(&c, 1);
  cr_expect_eq(bad, 0, "%s failed", name);
}

Test(attention_bwd, masks) {
  run(mk(BSHD, F32, 2, 70, 70, 2, 2, 64, 64, NOMASK), "none");
  run(mk(BSHD, F32, 1, 100, 100, 2, 1, 64, 64, CAUSAL), "causal gqa");
  run(mk(BSHD, F32, 1, 50, 130, 2, 2, 64, 64, CAUSAL_BR), "causal br sq<skv");
  run(mk(BSHD, F32, 1, 130, 50, 2, 2, 64, 64, CAUSAL_BR), "causal br sq>skv");
  {
    acase c = mk(BSHD, F32, 1, 150, 150, 2, 1, 64, 64, NOMASK);
    c.wl = 20;
    c.wr = 5;
    run(c, "window");
  }
}

Test(attention_bwd, layouts_dtypes_dims) {
  run(mk(SBHD, BF16, 2, 65, 65, 4, 2, 128, 128, CAUSAL), "sbhd bf16 d128");
  run(mk(BSHD, F16, 1, 33, 40, 3, 1, 64, 64, NOMASK), "fp16 mqa");
  run(mk(BSHD, BF16, 1, 80, 80, 2, 2, 192, 128, CAUSAL), "mla 192/128");
  run(mk(BSHD, F32, 1, 40, 40, 1, 1, 256, 256, CAUSAL), "d256");
  run(mk(BSHD, F32, 1, 17, 17, 2, 1, 17, 9, NOMASK), "odd dims");
}

Test(attention_bwd, softcap_alibi) {
  acase c = mk(BSHD, F32, 1, 90, 90, 2, 1, 64, 64, CAUSAL);
  c.softcap = 5.0f;
  run(c, "softcap");
  c.softcap = 0.0f;
  c.alibi = 1;
  run(c, "alibi");
}

Test(attention_bwd, varlen) {
  static const int32_t lq[5] = {5, 0, 1, 70, 130};
  static const int32_t lk[5] = {5, 3, 1, 140, 64};
  acase c = mk(THD, F32, 5, 0, 0, 4, 2, 64, 64, CAUSAL_BR);
  c.lens_q = lq;
  c.lens_kv = lk;
  run(c, "thd causal br");
  c.dt = BF16;
  c.mask = NOMASK;
  c.wl = 10;
  c.wr = 10;
  run(c, "thd window bf16");
  c = mk(BSHD, F32, 5, 130, 140, 2, 2, 64, 64, CAUSAL);
  c.padded = 1;
  c.lens_q = lq;
  c.lens_kv = lk;
  run(c, "bshd padding");
}

Test(attention_bwd, long_sequence) {
  run(mk(BSHD, BF16, 1, 1000, 1000, 1, 1, 64, 64, CAUSAL), "s1000 bf16 causal");
}

/* L = sum dO * O; dL/dx by central differences of the fp64 oracle. */
static double loss(adata *d) {
  double L = 0.0;
  int64_t i;
  double *lse = (double *)calloc((size_t)d->nl + 1, sizeof(double));
  memset(d->o_ref, 0, sizeof(double) * (size_t)d->no);
  ta_reference(d, 0, d->o_ref, lse, NULL, NULL, NULL);
  for (i = 0; i < d->no; i++) L += d->o_ref[i] * d->dout[i];
  free(lse);
  return L;
}

static void fd_case(acase c, const char *name) {
  adata d;
  int64_t i;
  double *arrs[3];
  void *grads[3];
  int64_t ns[3];
  int w;
  const double hstep = 1e-5;
  ta_setup(&d, &c);
  d.o_ref = (double *)calloc((size_t)d.no + 1, sizeof(double));
  cr_assert_eq(xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL), XTE_SUCCESS);
  cr_assert_eq(
      xte_attention_bwd(&d.Q, &d.K, &d.V, &d.O, &d.dO, &d.L, &d.dQ, &d.dK, &d.dV, &d.cfg, NULL),
      XTE_SUCCESS);
  arrs[0] = d.q;
  arrs[1] = d.k;
  arrs[2] = d.v;
  grads[0] = d.dQr;
  grads[1] = d.dKr;
  grads[2] = d.dVr;
  ns[0] = d.nq;
  ns[1] = d.nk;
  ns[2] = d.nv;
  for (w = 0; w < 3; w++)
    for (i = 0; i < ns[w]; i++) {
      double x0 = arrs[w][i], lp, lm, fd, g;
      arrs[w][i] = x0 + hstep;
      lp = loss(&d);
      arrs[w][i] = x0 - hstep;
      lm = loss(&d);
      arrs[w][i] = x0;
      fd = (lp - lm) / (2 * hstep);
      g = ((float *)grads[w])[i];
      cr_expect(fabs(g - fd) <= 2e-5 * (1.0 + fabs(fd)), "%s: grad %d[%lld]: xte %g fd %g", name, w,
                (long long)i, g, fd);
    }
  ta_free(&d);
}

Test(attention_bwd, finite_differences) {
  acase c = mk(BSHD, F32, 1, 5, 7, 2, 1, 4, 3, CAUSAL_BR);
  fd_case(c, "causal br gqa");
  c = mk(BSHD, F32, 1, 6, 6, 1, 1, 5, 4, NOMASK);
  c.softcap = 2.0f;
  c.alibi = 1;
  fd_case(c, "softcap alibi");
  c.softcap = 0.0f;
  c.alibi = 0;
  c.wl = 1;
  c.wr = 2;
  fd_case(c, "window");
}

Test(attention_bwd, repeatable) {
  acase c = mk(BSHD, F32, 2, 150, 150, 4, 2, 64, 64, CAUSAL);
  adata d;
  void *a[3];
  int r, w;
  ta_setup(&d, &c);
  cr_assert_eq(xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL), XTE_SUCCESS);
  for (w = 0; w < 3; w++) a[w] = malloc((size_t)(w == 0 ? d.nq : w == 1 ? d.nk : d.nv) * 4);
  for (r = 0; r < 3; r++) {
    cr_assert_eq(
        xte_attention_bwd(&d.Q, &d.K, &d.V, &d.O, &d.dO, &d.L, &d.dQ, &d.dK, &d.dV, &d.cfg, NULL),
        XTE_SUCCESS);
    if (r == 0) {
      memcpy(a[0], d.dQr, (size_t)d.nq * 4);
      memcpy(a[1], d.dKr, (size_t)d.nk * 4);
      memcpy(a[2], d.dVr, (size_t)d.nv * 4);
    } else {
      cr_expect(memcmp(a[0], d.dQr, (size_t)d.nq * 4) == 0, "dQ differs on run %d", r);
      cr_expect(memcmp(a[1], d.dKr, (size_t)d.nk * 4) == 0, "dK differs on run %d", r);
      cr_expect(memcmp(a[2], d.dVr, (size_t)d.nv * 4) == 0, "dV differs on run %d", r);
    }
  }
  for (w = 0; w < 3; w++) free(a[w]);
  ta_free(&d);
}

/* No query rows (dQ empty) with 2^31 - 1 query heads on one KV head: dK and dV are +0 and the
 * call takes no time per empty head (it looped over every query head per KV block: 30 s, a
 * fuzz timeout). */
static void shape4(xte_tensor *t, void *data, int64_t s, int64_t h, int64_t d) {
  memset(t, 0, sizeof *t);
  t->dtype = XTE_DTYPE_FP32;
  t->rank = 4;
  t->data = data;
  t->shape[0] = 1;
  t->shape[1] = s;
  t->shape[2] = h;
  t->shape[3] = d;
}

Test(attention_bwd, no_query_rows_many_heads) {
  const int64_t hq = ((int64_t)1 << 31) - 1;
  float k[5 * 8], v[5 * 8], dk[5 * 8], dv[5 * 8], none[4] = {0};
  xte_tensor Q, K, V, O, dO, L, dQ, dK, dV;
  xte_attention_config cfg = xte_attention_config_default();
  clock_t t0;
  double secs;
  int i;
  for (i = 0; i < 40; i++) k[i] = v[i] = (float)(i % 7) - 3.0f, dk[i] = dv[i] = -1.0f;
  shape4(&Q, none, 0, hq, 8);
  shape4(&O, none, 0, hq, 8);
  shape4(&dO, none, 0, hq, 8);
  shape4(&dQ, none, 0, hq, 8);
  shape4(&K, k, 5, 1, 8);
  shape4(&V, v, 5, 1, 8);
  shape4(&dK, dk, 5, 1, 8);
  shape4(&dV, dv, 5, 1, 8);
  memset(&L, 0, sizeof L);
  L.dtype = XTE_DTYPE_FP32;
  L.rank = 3;
  L.data = none;
  L.shape[0] = 1;
  L.shape[1] = hq;
  L.shape[2] = 0;
  t0 = clock();
  cr_assert_eq(xte_attention_bwd(&Q, &K, &V, &O, &dO, &L, &dQ, &dK, &dV, &cfg, NULL), XTE_SUCCESS,
               "%s", xte_last_error());
  secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
  for (i = 0; i < 40; i++) {
    uint32_t a, b;
    memcpy(&a, &dk[i], 4);
    memcpy(&b, &dv[i], 4);
    cr_expect(a == 0 && b == 0, "dK[%d] = 0x%08x, dV[%d] = 0x%08x, want +0", i, a, i, b);
  }
  cr_expect(secs < 3.0, "%.1f s of CPU time for no query rows", secs);
}

/* THD with max_seqlen_q far beyond every sequence (2^40; the sequences hold 7 tokens each): the
 * same bytes as with the tight bound, at once (the S store was sized by max_seqlen: 2^25 rounds,
 * a fuzz timeout). */
Test(attention_bwd, thd_max_seqlen_far_above) {
  enum { TQ = 14, TK = 13, D = 24 };
  static float q[TQ * D], k[TK * D], v[TK * D], o[2][TQ * D], g[TQ * D], l[2][TQ];
  static float dq[2][TQ * D], dk[2][TK * D], dv[2][TK * D];
  const int32_t cuq[3] = {0, 7, 14}, cuk[3] = {0, 6, 13};
  int i, r;
  clock_t t0;
  double secs = 0.0;
  for (i = 0; i < TQ * D; i++)
    q[i] = (float)((i * 7) % 11) * 0.25f - 1.0f, g[i] = (float)(i % 5) - 2.0f;
  for (i = 0; i < TK * D; i++)
    k[i] = (float)((i * 3) % 13) * 0.125f - 0.75f, v[i] = (float)(i % 9) - 4.0f;
  for (r = 0; r < 2; r++) { /* r 0: max_seqlen_q 7; r 1: 2^40 */
    xte_attention_config cfg = xte_attention_config_default();
    xte_tensor Q = ta_thd_f32(q, TQ, 1, D), K = ta_thd_f32(k, TK, 1, D),
               V = ta_thd_f32(v, TK, 1, D);
    xte_tensor O = ta_thd_f32(o[r], TQ, 1, D), dO = ta_thd_f32(g, TQ, 1, D),
               L = ta_thd_f32(l[r], TQ, 1, 1);
    xte_tensor dQ = ta_thd_f32(dq[r], TQ, 1, D), dK = ta_thd_f32(dk[r], TK, 1, D),
               dV = ta_thd_f32(dv[r], TK, 1, D);
    L.rank = 2;
    cfg.layout = XTE_ATTN_LAYOUT_THD;
    cfg.mask = XTE_ATTN_MASK_CAUSAL;
    cfg.batch = 2;
    cfg.cu_seqlens_q = cuq;
    cfg.cu_seqlens_kv = cuk;
    cfg.max_seqlen_q = r ? (int64_t)1 << 40 : 7;
    cfg.max_seqlen_kv = 7;
    t0 = clock();
    cr_assert_eq(xte_attention_fwd(&Q, &K, &V, &O, &L, &cfg, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    cr_assert_eq(xte_attention_bwd(&Q, &K, &V, &O, &dO, &L, &dQ, &dK, &dV, &cfg, NULL), XTE_SUCCESS,
                 "%s", xte_last_error());
    if (r) secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
  }
  cr_expect(memcmp(o[0], o[1], sizeof o[0]) == 0, "O differs");
  cr_expect(memcmp(l[0], l[1], sizeof l[0]) == 0, "LSE differs");
  cr_expect(memcmp(dq[0], dq[1], sizeof dq[0]) == 0, "dQ differs");
  cr_expect(memcmp(dk[0], dk[1], sizeof dk[0]) == 0, "dK differs");
  cr_expect(memcmp(dv[0], dv[1], sizeof dv[0]) == 0, "dV differs");
  cr_expect(secs < 3.0, "%.1f s of CPU time with max_seqlen 2^40", secs);
}
