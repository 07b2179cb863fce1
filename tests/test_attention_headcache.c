/* Attention's per-thread fp32 head caches (bf16 / fp16 / e4m3 inputs, src/cpu/attention_driver.c:
 * K and V of a KV head converted once per thread in the forward and the dQ pass, Q and dO of its
 * query heads in the dK / dV pass, tasks listed head by head) give the same bytes as the
 * block-by-block conversion (caches off through xte_internal_attention_cache_limit(0)) and as
 * the scalar ISA on one thread, on every ISA and at 1, 2 and 7 threads: odd sequence lengths,
 * GQA, several sequences (the cache tag names the sequence), varlen with empty sequences,
 * NaN / inf inputs, and e4m3 with per-(batch, KV head) descales. */
#include <criterion/criterion.h>

#include "test_attention_oracle.h"

/* the test hook of src/cpu/attention_kernels.h (not on this test's include path) */
XTE_API size_t xte_internal_attention_cache_limit(size_t bytes);

typedef struct outs {
  void *o, *dq, *dk, *dv;
  float *lse;
} outs;

static void *dup(const void *p, size_t n) {
  void *r = malloc(n + 4);
  memcpy(r, p, n);
  return r;
}

static void run_once(adata *d, outs *r) {
  const size_t es = xte_dtype_size(d->c.dt);
  memset(d->Or, 0x5A, (size_t)d->no * es);
  memset(d->dQr, 0x5A, (size_t)d->nq * es);
  memset(d->dKr, 0x5A, (size_t)d->nk * es);
  memset(d->dVr, 0x5A, (size_t)d->nv * es);
  cr_assert_eq(xte_attention_fwd(&d->Q, &d->K, &d->V, &d->O, &d->L, &d->cfg, NULL), XTE_SUCCESS,
               "%s", xte_last_error());
  cr_assert_eq(xte_attention_bwd(&d->Q, &d->K, &d->V, &d->O, &d->dO, &d->L, &d->dQ, &d->dK, &d->dV,
                                 &d->cfg, NULL),
               XTE_SUCCESS, "%s", xte_last_error());
  r->o = dup(d->Or, (size_t)d->no * es);
  r->dq = dup(d->dQr, (size_t)d->nq * es);
  r->dk = dup(d->dKr, (size_t)d->nk * es);
  r->dv = dup(d->dVr, (size_t)d->nv * es);
  r->lse = (float *)dup(d->lse, (size_t)d->nl * 4);
}

static void outs_free(outs *r) {
  free(r->o);
  free(r->dq);
  free(r->dk);
  free(r->dv);
  free(r->lse);
}

static void compare(const adata *d, const outs *a, const outs *b, const char *what) {
  const size_t es = xte_dtype_size(d->c.dt);
  cr_expect(memcmp(a->o, b->o, (size_t)d->no * es) == 0, "%s: O differs", what);
  cr_expect(memcmp(a->lse, b->lse, (size_t)d->nl * 4) == 0, "%s: LSE differs", what);
  cr_expect(memcmp(a->dq, b->dq, (size_t)d->nq * es) == 0, "%s: dQ differs", what);
  cr_expect(memcmp(a->dk, b->dk, (size_t)d->nk * es) == 0, "%s: dK differs", what);
  cr_expect(memcmp(a->dv, b->dv, (size_t)d->nv * es) == 0, "%s: dV differs", what);
}

static const xte_cpu_isa isas[4] = {XTE_CPU_ISA_SCALAR, XTE_CPU_ISA_AVX2, XTE_CPU_ISA_AVX512,
                                    XTE_CPU_ISA_AVX512_SIMDE};
static const int threads[3] = {1, 2, 7};

/* called on the inputs after ta_setup when set (special values) */
static void (*poison)(adata *d);

/* when non-zero, check_case also runs every ISA and thread count with this cache limit (a small
 * one splits the backward's (sequence, KV head) pairs into rounds of (query head, tile) units) */
static size_t small_limit;

/* reference: caches off, scalar, one thread; then caches on and off on every ISA and thread
 * count */
static void check_case(const acase *c, const char *name) {
  xte_cpu_isa saved = xte_cpu_get_isa();
  size_t lim = xte_internal_attention_cache_limit(0);
  adata d;
  outs ref, o;
  int i, t, on;
  char what[200];
  ta_setup(&d, c);
  if (poison) poison(&d);
  cr_assert_eq(xte_cpu_set_isa(XTE_CPU_ISA_SCALAR), XTE_SUCCESS);
  cr_assert_eq(xte_cpu_set_num_threads(1), XTE_SUCCESS);
  run_once(&d, &ref);
  for (on = 2; on >= 0; on--) {
    if (on == 2 && !small_limit) continue;
    xte_internal_attention_cache_limit(on == 2 ? small_limit : on ? lim : 0);
    for (i = 0; i < 4; i++) {
      xte_status st = xte_cpu_set_isa(isas[i]);
      if (st == XTE_ERROR_UNSUPPORTED) continue;
      cr_assert_eq(st, XTE_SUCCESS);
      for (t = 0; t < 3; t++) {
        if (!on && i == 0 && t == 0) continue;
        cr_assert_eq(xte_cpu_set_num_threads(threads[t]), XTE_SUCCESS);
        run_once(&d, &o);
        snprintf(what, sizeof what, "%s: caches %s, %s, %d threads", name,
                 on == 2 ? "small"
                 : on    ? "on"
                         : "off",
                 xte_cpu_isa_name(isas[i]), threads[t]);
        compare(&d, &ref, &o, what);
        outs_free(&o);
      }
    }
  }
  xte_internal_attention_cache_limit(lim);
  outs_free(&ref);
  ta_free(&d);
  xte_cpu_set_num_threads(0);
  xte_cpu_set_isa(saved);
}

static acase base(xte_attn_layout L, xte_dtype dt, int64_t b, int64_t sq, int64_t skv, int64_t hq,
                  int64_t hkv, int64_t dqk, int64_t dv, xte_attn_mask m) {
  acase c = ta_case(L, dt, b, sq, skv, hq, hkv, dqk, dv, m);
  c.seed = 4242;
  return c;
}

/* two sequences, GQA 6:2, odd lengths (tails in both the query tiles and the KV blocks), head
 * dims not multiples of 16 (padding columns of the cached rows) */
Test(attention_headcache, bf16_gqa_odd_two_sequences) {
  acase c =
      base(XTE_ATTN_LAYOUT_BSHD, XTE_DTYPE_BF16, 2, 131, 197, 6, 2, 40, 24, XTE_ATTN_MASK_CAUSAL);
  check_case(&c, "bf16 gqa causal");
  c.mask = XTE_ATTN_MASK_NONE;
  c.softcap = 3.0f;
  c.alibi = 1;
  check_case(&c, "bf16 gqa softcap alibi");
}

/* a cache limit of 200000 bytes with skv >= 257 and two query heads per KV head: the backward's
 * S / dP store cannot hold one (sequence, KV head) pair, so the pair runs in rounds of (query
 * head, tile) units whose dK / dV sums carry over between rounds; fp32 (read through the caches
 * since issue 16) and bf16 */
Test(attention_headcache, split_pair_rounds) {
  acase c =
      base(XTE_ATTN_LAYOUT_BSHD, XTE_DTYPE_FP32, 1, 97, 301, 4, 2, 64, 64, XTE_ATTN_MASK_CAUSAL);
  small_limit = 200000;
  check_case(&c, "fp32 split pairs causal");
  c.dt = XTE_DTYPE_BF16;
  c.mask = XTE_ATTN_MASK_NONE;
  check_case(&c, "bf16 split pairs");
  small_limit = 0;
}

/* A pair longer than the S store's base budget (8 MiB per thread: one KV head of 47 query tiles x
 * 47 KV blocks is 70 MiB of S / dP tiles) gets four times the budget, and at 2 threads that still
 * splits it into two rounds; at 7 threads it fits whole. Head dim 16 keeps the work small. The
 * bytes must be those of the backward without a store (S and dP recomputed), on this machine's
 * best ISA, at 1, 2 and 7 threads. */
Test(attention_headcache, long_pair_bigger_store) {
  xte_cpu_isa saved = xte_cpu_get_isa();
  size_t lim = xte_internal_attention_cache_limit(0);
  acase c =
      base(XTE_ATTN_LAYOUT_BSHD, XTE_DTYPE_FP32, 1, 3001, 3001, 1, 1, 16, 16, XTE_ATTN_MASK_NONE);
  adata d;
  outs ref, o;
  int m, t;
  char what[160];
  for (m = 0; m < 2; m++) {
    c.mask = m ? XTE_ATTN_MASK_CAUSAL : XTE_ATTN_MASK_NONE;
    ta_setup(&d, &c);
    xte_internal_attention_cache_limit(0); /* no store, no caches */
    cr_assert_eq(xte_cpu_set_num_threads(2), XTE_SUCCESS);
    run_once(&d, &ref);
    xte_internal_attention_cache_limit(lim);
    for (t = 0; t < 3; t++) {
      cr_assert_eq(xte_cpu_set_num_threads(threads[t]), XTE_SUCCESS);
      run_once(&d, &o);
      snprintf(what, sizeof what, "s 3001 %s, store, %d threads", m ? "causal" : "full",
               threads[t]);
      compare(&d, &ref, &o, what);
      outs_free(&o);
    }
    outs_free(&ref);
    ta_free(&d);
  }
  xte_internal_attention_cache_limit(lim);
  xte_cpu_set_num_threads(0);
  xte_cpu_set_isa(saved);
}

Test(attention_headcache, fp16_varlen_empty_window) {
  static const int32_t lq[5] = {70, 0, 1, 129, 33};
  static const int32_t lk[5] = {65, 3, 0, 130, 200};
  acase c = base(XTE_ATTN_LAYOUT_THD, XTE_DTYPE_FP16, 5, 0, 0, 4, 1, 64, 48,
                 XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT);
  c.lens_q = lq;
  c.lens_kv = lk;
  c.wl = 50;
  c.wr = 3;
  check_case(&c, "fp16 varlen window");
}

/* bf16 NaN / inf / huge in Q, K, V and dO of both sequences and heads */
static void put_specials(adata *d) {
  uint16_t *q = (uint16_t *)d->Qr, *k = (uint16_t *)d->Kr, *v = (uint16_t *)d->Vr,
           *g = (uint16_t *)d->dOr;
  q[5 * 32 + 3] = 0x7FC0;            /* NaN */
  q[d->nq - 70] = 0x7F7F;            /* huge: inf logits */
  k[17 * 32 + 4] = 0xFFC1;           /* a NaN with payload */
  k[d->nk - 100] = 0x7F80;           /* inf */
  v[33 * 32 + 7] = 0x7FC0;           /* NaN */
  v[d->nv - 121] = 0xFF80;           /* -inf */
  g[d->nv / 2 + 5] = 0x7FC0;         /* NaN */
  q[d->nq / 2 + 1] = (uint16_t)0x80; /* a subnormal */
}

Test(attention_headcache, bf16_specials) {
  acase c = base(XTE_ATTN_LAYOUT_SBHD, XTE_DTYPE_BF16, 2, 131, 150, 2, 1, 32, 32,
                 XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT);
  poison = put_specials;
  check_case(&c, "bf16 specials");
  c.mask = XTE_ATTN_MASK_NONE;
  c.softcap = 5.0f;
  check_case(&c, "bf16 specials softcap");
  poison = NULL;
}

/* e4m3 forward (BSHD b 2, sq 77, skv 141, hq 4, hkv 2, d 48, descales per (b, KV head)), bf16
 * output: caches on and off, every ISA and thread count, the same bytes as scalar, caches off,
 * one thread. Codes cover the whole byte range but the NaNs (0x7F, 0xFF) except for one. */
Test(attention_headcache, e4m3_forward) {
  enum { B = 2, SQ = 77, SKV = 141, HQ = 4, HKV = 2, D = 48 };
  static uint8_t q[B * SQ * HQ * D], k[B * SKV * HKV * D], v[B * SKV * HKV * D];
  static uint16_t o[B * SQ * HQ * D], oref[B * SQ * HQ * D];
  static float lse[B * HQ * SQ], lref[B * HQ * SQ];
  float dsq[B * HKV] = {0.5f, 0.25f, 1.0f, 0.125f}, dsk[B * HKV] = {0.75f, 0.5f, 0.25f, 1.0f},
                dsv[B * HKV] = {2.0f, 0.5f, 1.5f, 0.25f};
  uint64_t s = 777;
  size_t i;
  int m, iv, t, on;
  xte_cpu_isa saved = xte_cpu_get_isa();
  size_t lim = xte_internal_attention_cache_limit(0);
  xte_tensor Q, K, V, O, L;
  xte_attention_config cfg = xte_attention_config_default();
  for (i = 0; i < sizeof q; i++) q[i] = (uint8_t)(ta_rng(&s) % 256) & 0xF7;
  for (i = 0; i < sizeof k; i++) k[i] = (uint8_t)(ta_rng(&s) % 256) & 0xF7;
  for (i = 0; i < sizeof v; i++) v[i] = (uint8_t)(ta_rng(&s) % 256) & 0xF7;
  k[3 * HKV * D + 5] = 0x7F; /* a NaN key */
  Q = xte_tensor_2d(q, XTE_DTYPE_E4M3, 1, 1);
  Q.rank = 4;
  Q.shape[0] = B;
  Q.shape[1] = SQ;
  Q.shape[2] = HQ;
  Q.shape[3] = D;
  K = Q;
  K.data = k;
  K.shape[1] = SKV;
  K.shape[2] = HKV;
  V = K;
  V.data = v;
  O = Q;
  O.data = o;
  O.dtype = XTE_DTYPE_BF16;
  L = xte_tensor_2d(lse, XTE_DTYPE_FP32, 1, 1);
  L.rank = 3;
  L.shape[0] = B;
  L.shape[1] = HQ;
  L.shape[2] = SQ;
  cfg.descale_q = dsq;
  cfg.descale_k = dsk;
  cfg.descale_v = dsv;
  for (m = 0; m < 2; m++) {
    cfg.mask = m ? XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT : XTE_ATTN_MASK_NONE;
    cr_assert_eq(xte_cpu_set_isa(XTE_CPU_ISA_SCALAR), XTE_SUCCESS);
    cr_assert_eq(xte_cpu_set_num_threads(1), XTE_SUCCESS);
    xte_internal_attention_cache_limit(0);
    cr_assert_eq(xte_attention_fwd(&Q, &K, &V, &O, &L, &cfg, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    memcpy(oref, o, sizeof o);
    memcpy(lref, lse, sizeof lse);
    for (on = 1; on >= 0; on--) {
      xte_internal_attention_cache_limit(on ? lim : 0);
      for (iv = 0; iv < 4; iv++) {
        xte_status st = xte_cpu_set_isa(isas[iv]);
        if (st == XTE_ERROR_UNSUPPORTED) continue;
        for (t = 0; t < 3; t++) {
          cr_assert_eq(xte_cpu_set_num_threads(threads[t]), XTE_SUCCESS);
          memset(o, 0x5A, sizeof o);
          cr_assert_eq(xte_attention_fwd(&Q, &K, &V, &O, &L, &cfg, NULL), XTE_SUCCESS);
          cr_expect(memcmp(o, oref, sizeof o) == 0 && memcmp(lse, lref, sizeof lse) == 0,
                    "e4m3 mask %d: caches %s, %s, %d threads: O / LSE differ", m, on ? "on" : "off",
                    xte_cpu_isa_name(isas[iv]), threads[t]);
        }
      }
    }
  }
  xte_internal_attention_cache_limit(lim);
  xte_cpu_set_num_threads(0);
  xte_cpu_set_isa(saved);
}
