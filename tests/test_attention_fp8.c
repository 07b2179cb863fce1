/* FP8 (e4m3) attention forward with per-(batch, KV head) descale factors (FlashAttention-3):
 * against the fp64 oracle on the decoded, descaled values; output bf16 / fp32. */
#include <criterion/criterion.h>

#include "test_attention_oracle.h"

static double e4m3_dec(uint8_t b) {
  int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  double v = e == 0 ? ldexp(m, -9) : ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

static uint8_t rnd_code(uint64_t *s) {
  for (;;) {
    uint8_t b = (uint8_t)(ta_rng(s) & 0xFF);
    if ((b & 0x7F) != 0x7F && ((b >> 3) & 15) <= 8) return b; /* |x| <= 3.75, no NaN */
  }
}

static void fp8_case(xte_attn_mask mask, xte_dtype out, int64_t sq, int64_t skv, int64_t hq,
                     int64_t hkv) {
  acase c;
  adata d;
  uint64_t s = 777;
  uint8_t *q8, *k8, *v8;
  float dsq[2 * 4], dsk[2 * 4], dsv[2 * 4];
  int64_t b, i, h, e, n;
  void *o;
  xte_tensor Q, K, V, O;
  xte_attention_config cfg;
  c = ta_case(BSHD, F32, 2, sq, skv, hq, hkv, 64, 64, mask);
  ta_setup(&d, &c);
  for (i = 0; i < c.b * hkv; i++) {
    dsq[i] = 0.25f + 0.125f * (float)i;
    dsk[i] = 0.5f + 0.0625f * (float)i;
    dsv[i] = 1.5f - 0.125f * (float)i;
  }
  q8 = (uint8_t *)malloc((size_t)d.nq);
  k8 = (uint8_t *)malloc((size_t)d.nk);
  v8 = (uint8_t *)malloc((size_t)d.nv);
  /* codes, and the oracle's exact values code * descale (tensor order [b, s, h, d]) */
  for (b = 0; b < c.b; b++)
    for (i = 0; i < sq; i++)
      for (h = 0; h < hq; h++)
        for (e = 0; e < 64; e++) {
          n = ((b * sq + i) * hq + h) * 64 + e;
          q8[n] = rnd_code(&s);
          d.q[n] = e4m3_dec(q8[n]) * dsq[b * hkv + h / (hq / hkv)];
        }
  for (b = 0; b < c.b; b++)
    for (i = 0; i < skv; i++)
      for (h = 0; h < hkv; h++)
        for (e = 0; e < 64; e++) {
          n = ((b * skv + i) * hkv + h) * 64 + e;
          k8[n] = rnd_code(&s);
          v8[n] = rnd_code(&s);
          d.k[n] = e4m3_dec(k8[n]) * dsk[b * hkv + h];
          d.v[n] = e4m3_dec(v8[n]) * dsv[b * hkv + h];
        }
  ta_oracle(&d, 0);
  Q = d.Q;
  K = d.K;
  V = d.V;
  O = d.O;
  Q.data = q8;
  K.data = k8;
  V.data = v8;
  Q.dtype = K.dtype = V.dtype = XTE_DTYPE_E4M3;
  o = calloc((size_t)d.no, 4);
  O.data = o;
  O.dtype = out;
  cfg = d.cfg;
  cfg.descale_q = dsq;
  cfg.descale_k = dsk;
  cfg.descale_v = dsv;
  cr_assert_eq(xte_attention_fwd(&Q, &K, &V, &O, &d.L, &cfg, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  d.c.dt = out; /* read O back in its dtype */
  cr_expect_eq(
      ta_check("O fp8", &d, o, d.o_ref, d.o_nv, d.no, out == XTE_DTYPE_FP32 ? 1e-5 : 1.0 / 256), 0);
  d.c.dt = XTE_DTYPE_FP32;
  cr_expect_eq(ta_check_lse(&d), 0);
  free(o);
  free(q8);
  free(k8);
  free(v8);
  ta_free(&d);
}

Test(attention_fp8, e4m3_bf16_out) {
  fp8_case(XTE_ATTN_MASK_NONE, XTE_DTYPE_BF16, 70, 90, 4, 2);
  fp8_case(XTE_ATTN_MASK_CAUSAL, XTE_DTYPE_BF16, 130, 130, 2, 2);
}

Test(attention_fp8, e4m3_fp32_out) {
  fp8_case(XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, XTE_DTYPE_FP32, 40, 100, 4, 1);
}

Test(attention_fp8, bad_descale_dtype) {
  acase c;
  adata d;
  float one = 1.0f;
  memset(&c, 0, sizeof c);
  c.layout = XTE_ATTN_LAYOUT_BSHD;
  c.dt = XTE_DTYPE_FP32;
  c.b = 1;
  c.sq = c.skv = 4;
  c.hq = c.hkv = 1;
  c.dqk = c.dv = 16;
  c.wl = c.wr = -1;
  ta_setup(&d, &c);
  d.cfg.descale_q = &one; /* descale with fp32 inputs */
  cr_expect_eq(xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL),
               XTE_ERROR_INVALID_ARGUMENT);
  cr_expect(strstr(xte_last_error(), "descale") != NULL);
  d.cfg.descale_q = NULL;
  d.Q.dtype = d.K.dtype = d.V.dtype = XTE_DTYPE_E4M3;
  d.O.dtype = XTE_DTYPE_E4M3; /* fp8 output is not offered */
  cr_expect_eq(xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL), XTE_ERROR_DTYPE);
  ta_free(&d);
}
