/* Attention forward against an fp64 oracle (FlashAttention's criterion: max error at most twice
 * the naive same-precision algorithm's, plus a small absolute term), across layouts, masks,
 * GQA ratios, head dims, dtypes, softcap, ALiBi, varlen and padding. */
#include <criterion/criterion.h>

#include "test_attention_oracle.h"

static acase mk(xte_attn_layout L, xte_dtype dt, int64_t b, int64_t sq, int64_t skv, int64_t hq,
                int64_t hkv, int64_t dqk, int64_t dv, xte_attn_mask m) {
  acase c = ta_case(L, dt, b, sq, skv, hq, hkv, dqk, dv, m);
  c.seed = (uint64_t)(sq * 131 + skv * 7 + hq * 3 + dqk + (int)m * 1000 + (int)dt * 77);
  return c;
}

static void run(acase c, const char *name) {
  int bad = ta_run_check(&c, 0);
  cr_expect_eq(bad, 0, "%s failed", name);
}

Test(attention_fwd, masks_bshd_fp32) {
  run(mk(BSHD, F32, 2, 70, 70, 2, 2, 64, 64, NOMASK), "none");
  run(mk(BSHD, F32, 2, 70, 70, 2, 2, 64, 64, CAUSAL), "causal");
  run(mk(BSHD, F32, 1, 50, 130, 2, 1, 64, 64, CAUSAL), "causal tl sq<skv");
  run(mk(BSHD, F32, 1, 50, 130, 2, 1, 64, 64, CAUSAL_BR), "causal br sq<skv");
  run(mk(BSHD, F32, 1, 130, 50, 2, 1, 64, 64, CAUSAL_BR), "causal br sq>skv (masked rows)");
  run(mk(BSHD, F32, 1, 130, 50, 2, 1, 64, 64, CAUSAL), "causal tl sq>skv");
}

Test(attention_fwd, windows) {
  acase c = mk(BSHD, F32, 1, 150, 150, 2, 2, 64, 64, NOMASK);
  c.wl = 20;
  c.wr = 5;
  run(c, "window 20,5");
  c.mask = CAUSAL_BR;
  c.wr = -1;
  c.wl = 70;
  run(c, "causal + window left 70");
  c = mk(BSHD, F32, 1, 40, 200, 1, 1, 64, 64, NOMASK);
  c.wl = 10;
  c.wr = 0;
  run(c, "window bottom-right sq<skv");
  c = mk(BSHD, F32, 1, 200, 40, 1, 1, 64, 64, NOMASK);
  c.wl = 3;
  c.wr = 3;
  run(c, "window sq>skv (rows with no keys)");
}

Test(attention_fwd, layouts_and_gqa) {
  run(mk(SBHD, F32, 3, 33, 45, 4, 2, 64, 64, CAUSAL_BR), "sbhd gqa 2");
  run(mk(BSHD, BF16, 2, 65, 65, 8, 1, 64, 64, CAUSAL), "bshd mqa bf16");
  run(mk(SBHD, F16, 2, 17, 17, 6, 3, 128, 128, NOMASK), "sbhd fp16 d128");
}

Test(attention_fwd, head_dims) {
  run(mk(BSHD, BF16, 1, 129, 129, 2, 2, 128, 128, CAUSAL), "d128 bf16");
  run(mk(BSHD, BF16, 1, 100, 100, 2, 1, 192, 128, CAUSAL), "mla 192/128");
  run(mk(BSHD, F32, 1, 80, 80, 1, 1, 256, 256, NOMASK), "d256");
  run(mk(BSHD, F32, 1, 17, 17, 1, 1, 17, 5, NOMASK), "d17/5");
  run(mk(BSHD, F16, 1, 1, 1, 1, 1, 1, 1, NOMASK), "d1 s1");
}

Test(attention_fwd, softcap_alibi) {
  acase c = mk(BSHD, F32, 1, 90, 90, 2, 1, 64, 64, CAUSAL);
  c.softcap = 5.0f;
  run(c, "softcap");
  c.softcap = 0.0f;
  c.alibi = 1;
  run(c, "alibi");
  c = mk(BSHD, BF16, 1, 40, 100, 2, 2, 64, 64, NOMASK);
  c.alibi = 1;
  c.softcap = 3.0f;
  c.scale = 0.3f;
  run(c, "alibi + softcap + scale, sq<skv");
}

Test(attention_fwd, varlen_thd) {
  static const int32_t lq[5] = {5, 0, 1, 70, 130};
  static const int32_t lk[5] = {5, 3, 1, 140, 64};
  acase c = mk(THD, F32, 5, 0, 0, 4, 2, 64, 64, CAUSAL_BR);
  c.lens_q = lq;
  c.lens_kv = lk;
  run(c, "thd causal br");
  c.mask = NOMASK;
  c.dt = BF16;
  run(c, "thd none bf16");
  c.mask = CAUSAL;
  c.wl = 16;
  c.wr = 4;
  run(c, "thd causal window");
}

Test(attention_fwd, padding_bshd) {
  static const int32_t lq[3] = {50, 0, 17};
  static const int32_t lk[3] = {64, 10, 1};
  acase c = mk(BSHD, F32, 3, 70, 80, 2, 1, 64, 64, CAUSAL_BR);
  c.padded = 1;
  c.lens_q = lq;
  c.lens_kv = lk;
  run(c, "padding bshd");
  c.layout = SBHD;
  c.mask = NOMASK;
  c.dt = F16;
  run(c, "padding sbhd fp16");
}

Test(attention_fwd, long_sequence) {
  run(mk(BSHD, BF16, 1, 1000, 1000, 1, 1, 128, 128, CAUSAL), "s1000 bf16 causal");
}

/* A NaN in one key: the rows that see it give NaN (canonical bits) in every output column and
 * in the LSE; rows that do not see it (causal) are untouched by it (before the fix the rows
 * that saw it came out as O = 0, LSE = -inf, like rows with no visible key). */
Test(attention_fwd, nan_key_gives_nan_rows) {
  adata d;
  acase c = mk(BSHD, F32, 1, 6, 70, 1, 1, 16, 16, CAUSAL);
  int64_t i, cc;
  uint32_t bits;
  ta_setup(&d, &c);
  ((float *)d.Kr)[ta_off(&d, 1, 0, 3, 0, 5, 1, 16)] = NAN;
  cr_assert_eq(xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  for (i = 0; i < 6; i++) {
    for (cc = 0; cc < 16; cc++) {
      float o = ((float *)d.Or)[ta_off(&d, 0, 0, i, 0, cc, 1, 16)];
      memcpy(&bits, &o, 4);
      if (i < 3)
        cr_expect(isfinite(o), "row %lld col %lld: %g", (long long)i, (long long)cc, o);
      else
        cr_expect_eq(bits, 0x7FC00000u, "row %lld col %lld: 0x%08x", (long long)i, (long long)cc,
                     bits);
    }
    memcpy(&bits, &d.lse[ta_loff(&d, 0, i, 0)], 4);
    if (i < 3)
      cr_expect(isfinite(d.lse[ta_loff(&d, 0, i, 0)]), "lse row %lld", (long long)i);
    else
      cr_expect_eq(bits, 0x7FC00000u, "lse row %lld: 0x%08x", (long long)i, bits);
  }
  ta_free(&d);
}
