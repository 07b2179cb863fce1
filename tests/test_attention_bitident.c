/* Attention bit-identity: the forward (O, LSE) and the backward (dQ, dK, dV) give the same bytes
 * on every ISA (scalar, AVX2, AVX-512, AVX-512 emulated by SIMDe) and thread count (1, 2, 7).
 * ISAs this machine or build cannot run (XTE_ERROR_UNSUPPORTED) are skipped. */
#include <criterion/criterion.h>

#include "test_attention_oracle.h"

typedef struct outs {
  void *o, *dq, *dk, *dv;
  float *lse;
} outs;

static void run_once(adata *d, outs *r) {
  cr_assert_eq(xte_attention_fwd(&d->Q, &d->K, &d->V, &d->O, &d->L, &d->cfg, NULL), XTE_SUCCESS,
               "%s", xte_last_error());
  cr_assert_eq(xte_attention_bwd(&d->Q, &d->K, &d->V, &d->O, &d->dO, &d->L, &d->dQ, &d->dK, &d->dV,
                                 &d->cfg, NULL),
               XTE_SUCCESS, "%s", xte_last_error());
  r->o = malloc((size_t)d->no * 4 + 4);
  r->dq = malloc((size_t)d->nq * 4 + 4);
  r->dk = malloc((size_t)d->nk * 4 + 4);
  r->dv = malloc((size_t)d->nv * 4 + 4);
  r->lse = (float *)malloc((size_t)d->nl * 4 + 4);
  memcpy(r->o, d->Or, (size_t)d->no * 4);
  memcpy(r->dq, d->dQr, (size_t)d->nq * 4);
  memcpy(r->dk, d->dKr, (size_t)d->nk * 4);
  memcpy(r->dv, d->dVr, (size_t)d->nv * 4);
  memcpy(r->lse, d->lse, (size_t)d->nl * 4);
}

static void outs_free(outs *r) {
  free(r->o);
  free(r->dq);
  free(r->dk);
  free(r->dv);
  free(r->lse);
}

static void compare(const adata *d, const outs *a, const outs *b, const char *what) {
  size_t es = xte_dtype_size(d->c.dt);
  cr_expect(memcmp(a->o, b->o, (size_t)d->no * es) == 0, "%s: O differs", what);
  cr_expect(memcmp(a->lse, b->lse, (size_t)d->nl * 4) == 0, "%s: LSE differs", what);
  cr_expect(memcmp(a->dq, b->dq, (size_t)d->nq * es) == 0, "%s: dQ differs", what);
  cr_expect(memcmp(a->dk, b->dk, (size_t)d->nk * es) == 0, "%s: dK differs", what);
  cr_expect(memcmp(a->dv, b->dv, (size_t)d->nv * es) == 0, "%s: dV differs", what);
}

/* called on the inputs after ta_setup when set (special values) */
static void (*poison)(adata *d);

static void check_case(const acase *c, const char *name) {
  static const xte_cpu_isa isas[4] = {XTE_CPU_ISA_SCALAR, XTE_CPU_ISA_AVX2, XTE_CPU_ISA_AVX512,
                                      XTE_CPU_ISA_AVX512_SIMDE};
  static const int threads[3] = {1, 2, 7};
  xte_cpu_isa saved = xte_cpu_get_isa();
  adata d;
  outs ref, o;
  int i, t;
  char what[160];
  ta_setup(&d, c);
  if (poison) poison(&d);
  cr_assert_eq(xte_cpu_set_isa(XTE_CPU_ISA_SCALAR), XTE_SUCCESS);
  cr_assert_eq(xte_cpu_set_num_threads(1), XTE_SUCCESS);
  run_once(&d, &ref);
  for (i = 0; i < 4; i++) {
    xte_status st = xte_cpu_set_isa(isas[i]);
    if (st == XTE_ERROR_UNSUPPORTED) continue;
    cr_assert_eq(st, XTE_SUCCESS);
    for (t = 0; t < 3; t++) {
      if (i == 0 && t == 0) continue;
      cr_assert_eq(xte_cpu_set_num_threads(threads[t]), XTE_SUCCESS);
      run_once(&d, &o);
      snprintf(what, sizeof what, "%s: %s, %d threads", name, xte_cpu_isa_name(isas[i]),
               threads[t]);
      compare(&d, &ref, &o, what);
      outs_free(&o);
    }
  }
  outs_free(&ref);
  ta_free(&d);
  xte_cpu_set_num_threads(0);
  xte_cpu_set_isa(saved);
}

static acase base(xte_attn_layout L, xte_dtype dt, int64_t b, int64_t sq, int64_t skv, int64_t hq,
                  int64_t hkv, int64_t dqk, int64_t dv, xte_attn_mask m) {
  acase c = ta_case(L, dt, b, sq, skv, hq, hkv, dqk, dv, m);
  c.seed = 99;
  return c;
}

Test(attention_bitident, fp32_causal_gqa) {
  acase c =
      base(XTE_ATTN_LAYOUT_BSHD, XTE_DTYPE_FP32, 2, 150, 150, 4, 2, 64, 64, XTE_ATTN_MASK_CAUSAL);
  check_case(&c, "fp32 causal gqa");
}

Test(attention_bitident, bf16_mla_softcap_alibi_window) {
  acase c =
      base(XTE_ATTN_LAYOUT_SBHD, XTE_DTYPE_BF16, 1, 100, 170, 2, 1, 192, 128, XTE_ATTN_MASK_NONE);
  c.softcap = 4.0f;
  c.alibi = 1;
  c.wl = 40;
  c.wr = 8;
  check_case(&c, "bf16 mla softcap alibi window");
}

Test(attention_bitident, fp16_varlen) {
  static const int32_t lq[4] = {0, 1, 77, 130};
  static const int32_t lk[4] = {2, 1, 140, 65};
  acase c = base(XTE_ATTN_LAYOUT_THD, XTE_DTYPE_FP16, 4, 0, 0, 3, 1, 80, 48,
                 XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT);
  c.lens_q = lq;
  c.lens_kv = lk;
  check_case(&c, "fp16 varlen");
}

/* fp32 NaN / inf / huge inputs through the in-place paths (head dims multiples of 16) and the
 * transposed kernels: a NaN in a query row, in a key, in a value, an inf key column and a huge
 * query (inf logits); the bytes (canonical NaNs included) agree across ISAs and threads. */
static void put_specials(adata *d) {
  float *q = (float *)d->Qr, *k = (float *)d->Kr, *v = (float *)d->Vr, *g = (float *)d->dOr;
  const float nan = nanf(""), inf = INFINITY;
  q[5 * 32 + 3] = nan;    /* a query row */
  q[70 * 32 + 1] = 3e38f; /* a huge query: inf logits */
  k[17 * 32 + 4] = nan;   /* a key seen by many rows */
  k[100 * 32 + 0] = inf;  /* an inf key */
  v[33 * 32 + 7] = nan;   /* a value */
  v[120 * 32 + 2] = -inf;
  g[90 * 32 + 5] = nan; /* a dO entry */
}

Test(attention_bitident, fp32_specials_in_place) {
  acase c = base(XTE_ATTN_LAYOUT_BSHD, XTE_DTYPE_FP32, 1, 131, 150, 1, 1, 32, 32,
                 XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT);
  poison = put_specials;
  check_case(&c, "fp32 specials");
  c.mask = XTE_ATTN_MASK_NONE;
  c.softcap = 5.0f;
  check_case(&c, "fp32 specials softcap");
  poison = NULL;
}
