/* xte_isa_digest (digest.h): attention forward / backward. */
#define _POSIX_C_SOURCE 200809L
#include "digest.h"

/* ================================================================== attention */

aspec aspec_make(xte_dtype dt, int64_t b, int64_t s, int64_t hq, int64_t hkv, int64_t d,
                 xte_attn_mask mask) {
  aspec a;
  memset(&a, 0, sizeof a);
  a.layout = XTE_ATTN_LAYOUT_BSHD;
  a.dt = a.out_dt = dt;
  a.b = b;
  a.sq = a.skv = s;
  a.hq = hq;
  a.hkv = hkv;
  a.dqk = a.dv = d;
  a.mask = mask;
  a.wl = a.wr = -1;
  a.tag = "";
  return a;
}

static xte_tensor attn_t(void *p, xte_dtype dt, const aspec *a, int64_t s, int64_t h, int64_t d) {
  xte_tensor t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.dtype = dt;
  if (a->layout == XTE_ATTN_LAYOUT_THD) {
    t.rank = 3;
    t.shape[0] = s;
    t.shape[1] = h;
    t.shape[2] = d;
  } else {
    t.rank = 4;
    t.shape[0] = a->layout == XTE_ATTN_LAYOUT_BSHD ? a->b : s;
    t.shape[1] = a->layout == XTE_ATTN_LAYOUT_BSHD ? s : a->b;
    t.shape[2] = h;
    t.shape[3] = d;
  }
  return t;
}

void attn_case(const aspec *a, int bwd) {
  static const char *lays[] = {"bshd", "sbhd", "thd"};
  static const char *masks[] = {"none", "causal", "causal_br"};
  int mark = mem_mark();
  xte_attention_config cfg = xte_attention_config_default();
  int thd = a->layout == XTE_ATTN_LAYOUT_THD;
  int64_t b = thd ? 1 : a->b, sq = a->sq, skv = a->skv, i;
  int64_t nq, nk, nv, no, nl;
  size_t es = xte_dtype_size(a->dt), eo = xte_dtype_size(a->out_dt);
  xte_tensor Q, K, V, O, L, dO, dQ, dK, dV;
  void *q, *k, *v, *o, *l;
  xte_status st;
  int64_t nsq = a->sq, nskv = a->skv; /* THD: the tokens (those past the last sequence too) */
  if (thd)
    for (i = 0; i < a->nlen; i++) {
      nsq += a->lq[i];
      nskv += a->lk[i];
    }
  case_begin("attn_%s.%s.%s%s%s.b%lld.s%lldx%lld.h%lldx%lld.d%lldx%lld.%s%s%s%s%s%s%s%s",
             bwd ? "bwd" : "fwd", lays[a->layout], dtn(a->dt), a->out_dt != a->dt ? "_" : "",
             a->out_dt != a->dt ? dtn(a->out_dt) : "", (long long)(thd ? a->nlen : a->b),
             (long long)nsq, (long long)nskv, (long long)a->hq, (long long)a->hkv,
             (long long)a->dqk, (long long)a->dv, masks[a->mask],
             a->wl >= 0 || a->wr >= 0 ? ".win" : "", a->softcap > 0 ? ".softcap" : "",
             a->alibi ? ".alibi" : "", a->pad ? ".pad" : "", a->descale ? ".descale" : "",
             a->specials ? ".specials" : "", a->tag);
  cfg.layout = a->layout;
  cfg.mask = a->mask;
  cfg.window_left = a->wl;
  cfg.window_right = a->wr;
  cfg.softcap = a->softcap;
  cfg.softmax_scale = a->scale;
  if (thd || a->pad) {
    int n = thd ? a->nlen : (int)a->b;
    int32_t *cq = (int32_t *)xalloc(4 * (size_t)(n + 1)),
            *ck = (int32_t *)xalloc(4 * (size_t)(n + 1));
    int32_t mq = 0, mk = 0;
    for (i = 0; i < n; i++) { /* THD: the sequences; BSHD / SBHD: each entry's valid length */
      cq[i + 1] = cq[i] + a->lq[i];
      ck[i + 1] = ck[i] + a->lk[i];
      if (a->lq[i] > mq) mq = a->lq[i];
      if (a->lk[i] > mk) mk = a->lk[i];
    }
    cfg.cu_seqlens_q = cq;
    cfg.cu_seqlens_kv = ck;
    if (thd) {
      cfg.batch = n;
      cfg.max_seqlen_q = mq;
      cfg.max_seqlen_kv = mk;
      sq = cq[n] + a->sq; /* a->sq / a->skv: tokens past the last sequence */
      skv = ck[n] + a->skv;
    }
  }
  if (a->alibi) {
    float *sl = (float *)xalloc(4 * (size_t)a->hq);
    for (i = 0; i < a->hq; i++) sl[i] = ldexpf(1.0f, -(int)(i + 1));
    cfg.alibi_slopes = sl;
  }
  nq = b * sq * a->hq * a->dqk;
  nk = b * skv * a->hkv * a->dqk;
  nv = b * skv * a->hkv * a->dv;
  no = b * sq * a->hq * a->dv;
  nl = b * sq * a->hq;
  if (a->dt == XTE_DTYPE_E4M3) {
    q = xalloc((size_t)nq);
    k = xalloc((size_t)nk);
    v = xalloc((size_t)nv);
    gen_e4m3_codes((uint8_t *)q, nq);
    gen_e4m3_codes((uint8_t *)k, nk);
    gen_e4m3_codes((uint8_t *)v, nv);
    if (a->descale) {
      int64_t nd = (thd ? a->nlen : a->b) * a->hkv;
      float *d3 = (float *)xalloc(4 * (size_t)(3 * nd));
      for (i = 0; i < 3 * nd; i++) d3[i] = ldexpf(1.0f + (float)rndn(16) / 16.0f, -(int)rndn(4));
      cfg.descale_q = d3;
      cfg.descale_k = d3 + nd;
      cfg.descale_v = d3 + 2 * nd;
    }
  } else {
    q = gen_new(a->dt, nq, P_UNIT, 1.5f);
    k = gen_new(a->dt, nk, P_UNIT, 1.5f);
    v = gen_new(a->dt, nv, P_UNIT, 1.0f);
    if (a->specials) { /* NaN / inf / huge values in a few places */
      static const uint32_t sp[] = {0x7FC00000u, 0x7F800000u, 0xFF800000u, 0x501502F9u,
                                    0x00000001u};
      for (i = 0; i < 6; i++) {
        float f = from_bits(sp[rndn(5)]);
        int64_t pos;
        void *tgt = i % 3 == 0 ? q : i % 3 == 1 ? k : v;
        int64_t n = i % 3 == 0 ? nq : i % 3 == 1 ? nk : nv;
        pos = (int64_t)(rnd() % (uint32_t)n);
        if (a->dt == XTE_DTYPE_FP32)
          ((float *)tgt)[pos] = f;
        else
          ((uint16_t *)tgt)[pos] = a->dt == XTE_DTYPE_BF16 ? f2bf(f) : f2h(f);
      }
    }
  }
  Q = attn_t(q, a->dt, a, sq, a->hq, a->dqk);
  K = attn_t(k, a->dt, a, skv, a->hkv, a->dqk);
  V = attn_t(v, a->dt, a, skv, a->hkv, a->dv);
  o = xalloc(eo * (size_t)no);
  l = xalloc(4 * (size_t)nl);
  O = attn_t(o, a->out_dt, a, sq, a->hq, a->dv);
  if (thd) {
    L = t2(l, XTE_DTYPE_FP32, sq, a->hq);
  } else {
    memset(&L, 0, sizeof L);
    L.data = l;
    L.dtype = XTE_DTYPE_FP32;
    L.rank = 3;
    L.shape[0] = b;
    L.shape[1] = a->hq;
    L.shape[2] = sq;
  }
  if (!bwd) {
    out_buf("O", o, eo * (size_t)no, a->out_dt, 1);
    out_buf("lse", l, 4 * (size_t)nl, XTE_DTYPE_FP32, 1);
    case_end(xte_attention_fwd(&Q, &K, &V, &O, &L, &cfg, NULL), 1);
    mem_release(mark);
    return;
  }
  if (!setup_ok(xte_attention_fwd(&Q, &K, &V, &O, &L, &cfg, NULL), "attention_fwd")) {
    mem_release(mark);
    return;
  }
  dO = attn_t(gen_new(a->dt, no, P_UNIT, 1.0f), a->dt, a, sq, a->hq, a->dv);
  {
    void *dq = xalloc(es * (size_t)nq), *dk = xalloc(es * (size_t)nk),
         *dvp = xalloc(es * (size_t)nv);
    dQ = attn_t(dq, a->dt, a, sq, a->hq, a->dqk);
    dK = attn_t(dk, a->dt, a, skv, a->hkv, a->dqk);
    dV = attn_t(dvp, a->dt, a, skv, a->hkv, a->dv);
    out_buf("dQ", dq, es * (size_t)nq, a->dt, 1);
    out_buf("dK", dk, es * (size_t)nk, a->dt, 1);
    out_buf("dV", dvp, es * (size_t)nv, a->dt, 1);
  }
  st = xte_attention_bwd(&Q, &K, &V, &O, &dO, &L, &dQ, &dK, &dV, &cfg, NULL);
  case_end(st, 1);
  mem_release(mark);
}

void attn_both(const aspec *a) {
  attn_case(a, 0);
  if (a->dt != XTE_DTYPE_E4M3) attn_case(a, 1);
}

void attention_cases(void) {
  static const xte_dtype dts[3] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  int i, m;
  aspec a;
  /* BSHD, GQA, odd length: each dtype, causal and not */
  for (i = 0; i < 3; i++)
    for (m = 0; m < 2; m++) {
      a = g_small
              ? aspec_make(dts[i], 1, 37, 2, 1, 64, m ? XTE_ATTN_MASK_CAUSAL : XTE_ATTN_MASK_NONE)
              : aspec_make(dts[i], 2, 77, 4, 2, 64, m ? XTE_ATTN_MASK_CAUSAL : XTE_ATTN_MASK_NONE);
      attn_both(&a);
    }
  /* s_q != s_kv, bottom-right causal, head dim 40 */
  for (i = 0; i < 3; i++) {
    if (g_small && i == 2) continue;
    a = aspec_make(dts[i], 1, 33, 2, 2, 40, XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT);
    a.skv = g_small ? 70 : 130;
    attn_both(&a);
    a.mask = XTE_ATTN_MASK_CAUSAL; /* top-left with s_q < s_kv */
    attn_both(&a);
  }
  /* SBHD, MQA, d_qk != d_v, sliding window */
  for (i = 0; i < 2; i++) {
    a = aspec_make(dts[i], 3, g_small ? 33 : 65, 2, 1, 48, XTE_ATTN_MASK_NONE);
    a.layout = XTE_ATTN_LAYOUT_SBHD;
    a.dv = 24;
    a.wl = 16;
    a.wr = 3;
    attn_both(&a);
  }
  /* THD varlen: empty sequences, a token outside every sequence */
  for (i = 0; i < 3; i++)
    for (m = 0; m < 2; m++) {
      static const int32_t lq[5] = {5, 0, 70, 130, 33}, lk[5] = {5, 3, 70, 140, 64};
      int j;
      if ((g_small && (i == 2 || m == 0)) || (i > 0 && m == 0)) continue;
      a = aspec_make(dts[i], 1, 1, g_small ? 2 : 4, g_small ? 1 : 2, 64,
                     m ? XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT : XTE_ATTN_MASK_NONE);
      a.layout = XTE_ATTN_LAYOUT_THD;
      a.nlen = 5;
      for (j = 0; j < 5; j++) {
        a.lq[j] = g_small ? lq[j] / 2 : lq[j];
        a.lk[j] = g_small ? lk[j] / 2 : lk[j];
      }
      a.sq = 1;
      a.skv = 1;
      attn_both(&a);
    }
  /* softcap, ALiBi, explicit scale */
  for (i = 0; i < 2; i++) {
    a = aspec_make(dts[i], 1, g_small ? 50 : 80, 2, 2, 32, XTE_ATTN_MASK_CAUSAL);
    a.softcap = 30.0f;
    a.alibi = 1;
    a.scale = 0.3f;
    attn_both(&a);
    a.softcap = 0.0f; /* ALiBi alone (the S store of the backward) */
    attn_both(&a);
  }
  /* BSHD padding */
  for (i = 0; i < 2; i++) {
    a = aspec_make(dts[i], 2, 37, 2, 1, 64, i ? XTE_ATTN_MASK_CAUSAL : XTE_ATTN_MASK_NONE);
    a.pad = 1;
    a.lq[0] = 20;
    a.lq[1] = 37;
    a.lk[0] = 37;
    a.lk[1] = 11;
    attn_both(&a);
  }
  /* MLA head dims, wide and tiny heads */
  a = aspec_make(XTE_DTYPE_BF16, 1, g_small ? 17 : 33, 2, g_small ? 1 : 2, 192,
                 XTE_ATTN_MASK_CAUSAL);
  a.dv = 128;
  attn_both(&a);
  if (!g_small) {
    a = aspec_make(XTE_DTYPE_FP32, 1, 20, 2, 1, 256, XTE_ATTN_MASK_NONE);
    attn_both(&a);
    a = aspec_make(XTE_DTYPE_FP16, 1, 20, 2, 1, 256, XTE_ATTN_MASK_CAUSAL);
    attn_both(&a);
  }
  a = aspec_make(XTE_DTYPE_FP32, 2, 19, 3, 1, 3, XTE_ATTN_MASK_NONE);
  attn_both(&a);
  a = aspec_make(XTE_DTYPE_BF16, 1, 1, 2, 2, 16, XTE_ATTN_MASK_CAUSAL); /* one token */
  attn_both(&a);
  /* longer: several KV blocks and query tiles */
  for (i = 0; i < 2; i++) {
    if (g_small && i) continue;
    a = aspec_make(dts[i], 1, g_small ? 70 : 200, 2, 1, 64, XTE_ATTN_MASK_CAUSAL);
    attn_both(&a);
  }
  /* special values */
  for (i = 0; i < 3; i++) {
    a = aspec_make(dts[i], 1, 40, 2, 2, 32, i == 1 ? XTE_ATTN_MASK_CAUSAL : XTE_ATTN_MASK_NONE);
    a.specials = 1;
    attn_both(&a);
  }
  /* FP8 e4m3 forward: output bf16 / fp16 / fp32, descales or none; THD */
  for (i = 0; i < 3; i++)
    for (m = 0; m < 2; m++) {
      a = aspec_make(XTE_DTYPE_E4M3, 2, 37, g_small ? 2 : 4, g_small ? 1 : 2, 64,
                     m ? XTE_ATTN_MASK_CAUSAL : XTE_ATTN_MASK_NONE);
      a.out_dt = i == 0 ? XTE_DTYPE_BF16 : i == 1 ? XTE_DTYPE_FP16 : XTE_DTYPE_FP32;
      a.descale = m == 0 || i == 0;
      attn_both(&a);
    }
  {
    static const int32_t lq[3] = {17, 0, 40}, lk[3] = {17, 5, 64};
    int j;
    a = aspec_make(XTE_DTYPE_E4M3, 1, 0, 2, 2, 48, XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT);
    a.layout = XTE_ATTN_LAYOUT_THD;
    a.out_dt = XTE_DTYPE_BF16;
    a.nlen = 3;
    for (j = 0; j < 3; j++) {
      a.lq[j] = lq[j];
      a.lk[j] = lk[j];
    }
    a.descale = 1;
    attn_both(&a);
    a.out_dt = XTE_DTYPE_E4M3; /* refused: no fp8 output */
    a.tag = ".fp8_out";
    attn_case(&a, 0);
  }
}
