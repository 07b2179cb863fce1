/* Fuzz target: xte_attention_fwd / xte_attention_bwd (BSHD / SBHD / THD, masks, windows,
 * softcap, ALiBi, padding with cu_seqlens, GQA, MLA head dims, e4m3 with descales). */
#include "fuzz_common.h"

static const xte_dtype k_hp[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
static const xte_dtype k_fwd_in[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16,
                                     XTE_DTYPE_E4M3};

static int64_t small(fz *f, int64_t lo, int64_t hi) {
  if (fz_rare(f, 12)) return fz_dim(f, hi);
  return lo + fz_u8(f) % (hi - lo + 1);
}

/* cu_seqlens of n + 1 entries for lengths up to maxlen each (BSHD padding) or partitioning
 * total tokens (THD); hostile entries sometimes. Flags impossible descriptors. */
static int32_t *make_cu(fz *f, int64_t n, int thd, int64_t total, int64_t s, int64_t max_seqlen,
                        const char *name) {
  int32_t *cu;
  int64_t i, acc = 0;
  if (n > ((int64_t)1 << 16)) fz_g.skip = 1; /* a valid call could have that many entries */
  if (n < 0 || n > ((int64_t)1 << 16)) return (int32_t *)fz_alloc(f, 4, 0, 0, name);
  cu = (int32_t *)fz_alloc(f, (size_t)(n + 1) * 4, fz_misalign(f), 0, name);
  if ((uintptr_t)cu % 4) return cu;
  cu[0] = 0;
  for (i = 1; i <= n; i++) {
    int64_t len;
    if (thd) {
      int64_t left = total - acc;
      if (left <= 0 || left > 100000)
        len = 0;
      else
        len = i == n ? (fz_u8(f) & 3 ? left : fz_u8(f) % (left + 1)) : fz_u8(f) % (left + 1);
      acc += len;
      cu[i] = (int32_t)acc;
    } else {
      len = s >= 0 && s < 100000 ? fz_u8(f) % (s + 1) : 0;
      acc += len;
      cu[i] = (int32_t)acc;
    }
  }
  if (fz_rare(f, 24)) cu[fz_u8(f) % (n + 1)] = (int32_t)fz_index(f, 0, 1, 255);
  fz_resnap(cu);
  for (i = 0; i < n; i++) {
    int64_t len = (int64_t)cu[i + 1] - cu[i];
    if (len < 0) fz_mark_impossible("cu_seqlens decreasing");
    if (thd && cu[i] < 0) fz_mark_impossible("THD cu_seqlens negative");
    if (!thd && len > s) fz_mark_impossible("cu_seqlens length > s");
    if (thd && len > max_seqlen) fz_mark_impossible("sequence longer than max_seqlen");
  }
  if (thd && cu[n] > total) fz_mark_impossible("cu_seqlens past the tensor");
  return cu;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  int bwd, thd, layout;
  int64_t b, sq, skv, hq, hkv, dqk, dv, batch_cfg;
  int64_t qs[4], ks[4], vs[4], os[4], ls[3];
  int rank, use_cfg;
  xte_attention_config cfg = xte_attention_config_default();
  xte_tensor Q, K, V, O, L, dO, dQ, dK, dV;
  xte_dtype dt, odt;
  xte_status st;

  fz_begin(&f, data, size);
  fz_pick_isa(&f);
  bwd = fz_u8(&f) & 1;
  layout = fz_enum(&f, XTE_ATTN_LAYOUT_COUNT);
  cfg.layout = (xte_attn_layout)layout;
  cfg.mask = (xte_attn_mask)fz_enum(&f, XTE_ATTN_MASK_COUNT);
  cfg.window_left = fz_rare(&f, 96) ? fz_index(&f, -1, 8, 64) : -1;
  cfg.window_right = fz_rare(&f, 96) ? fz_index(&f, -1, 8, 64) : -1;
  if (fz_rare(&f, 32)) cfg.softmax_scale = fz_f32(&f);
  if (fz_rare(&f, 32)) cfg.softcap = (fz_u8(&f) & 1) ? fz_f32(&f) : 30.0f;
  use_cfg = !fz_rare(&f, 4);
  if (!use_cfg) { /* NULL config: the default (BSHD, no mask) */
    cfg = xte_attention_config_default();
    layout = (int)cfg.layout;
  }
  thd = layout == XTE_ATTN_LAYOUT_THD;
  b = small(&f, 1, 3);
  sq = small(&f, 0, 20);
  skv = small(&f, 0, 20);
  hkv = small(&f, 1, 2);
  hq = fz_wmul(hkv, 1 + fz_u8(&f) % 3);
  if (fz_rare(&f, 16)) hq = small(&f, 0, 5);
  dqk = fz_rare(&f, 32) ? small(&f, 0, 300) : 1 + fz_u8(&f) % 24;
  dv = (fz_u8(&f) & 3) ? dqk : (fz_rare(&f, 32) ? small(&f, 0, 300) : 1 + fz_u8(&f) % 24);
  dt = bwd ? fz_dtype(&f, k_hp, 3) : fz_dtype(&f, k_fwd_in, 4);
  odt = dt == XTE_DTYPE_E4M3 ? fz_dtype(&f, k_hp, 3) : dt;
  if (fz_rare(&f, 16)) odt = fz_dtype(&f, k_fwd_in, 4);

  if (sq < 0 || skv < 0 || hq < 0 || hkv < 0) fz_mark_impossible("negative dimension");
  if (!thd && b < 0) fz_mark_impossible("negative batch");
  if (dqk < 1 || dqk > 256 || dv < 1 || dv > 256) fz_mark_impossible("head dim outside 1..256");
  if (hkv < 1 || hq < 1 || hq % hkv) fz_mark_impossible("h_q not a multiple of h_kv");
  /* throughput: valid calls past about 2^21 multiply-adds (seconds each under ASan, tens of
   * seconds on a loaded machine: libFuzzer timeouts) are skipped; the blocking is the same for
   * smaller shapes. Computed in double: the dimensions may be hostile. */
  if ((double)(thd || b < 1 ? 1 : b) * (double)(sq > 0 ? sq : 0) * (double)(skv > 0 ? skv : 0) *
          (double)(hq > 0 ? hq : 0) * ((double)(dqk > 0 ? dqk : 0) + (double)(dv > 0 ? dv : 0)) >
      (double)(1 << 21))
    fz_g.skip = 1;
  if ((unsigned)layout >= XTE_ATTN_LAYOUT_COUNT || (unsigned)cfg.mask >= XTE_ATTN_MASK_COUNT)
    fz_mark_impossible("enum out of range");

  if (thd) {
    /* sq, skv: total tokens; b: the sequences */
    batch_cfg = fz_rare(&f, 32) ? fz_index(&f, 0, 1, 255) : b;
    if (batch_cfg < 0) batch_cfg = -1;
    if (batch_cfg > 4096) batch_cfg = b; /* cu_seqlens must hold batch + 1 entries */
    cfg.batch = batch_cfg;
    cfg.max_seqlen_q = fz_rare(&f, 16) ? fz_index(&f, 0, fz_wadd(sq, 1), 64) : sq;
    cfg.max_seqlen_kv = fz_rare(&f, 16) ? fz_index(&f, 0, fz_wadd(skv, 1), 64) : skv;
    if (batch_cfg < 0) fz_mark_impossible("THD batch < 0");
    cfg.cu_seqlens_q =
        fz_rare(&f, 8) ? NULL : make_cu(&f, batch_cfg, 1, sq, sq, cfg.max_seqlen_q, "cu_q");
    cfg.cu_seqlens_kv =
        fz_rare(&f, 8) ? NULL : make_cu(&f, batch_cfg, 1, skv, skv, cfg.max_seqlen_kv, "cu_kv");
    rank = 3;
    qs[0] = sq, qs[1] = hq, qs[2] = dqk;
    ks[0] = skv, ks[1] = hkv, ks[2] = dqk;
    vs[0] = skv, vs[1] = hkv, vs[2] = dv;
    os[0] = sq, os[1] = hq, os[2] = dv;
    ls[0] = sq, ls[1] = hq;
  } else {
    int sb = layout == XTE_ATTN_LAYOUT_SBHD;
    batch_cfg = b;
    if (use_cfg && fz_rare(&f, 32)) cfg.batch = fz_index(&f, 0, 4, 255);
    if (use_cfg && fz_rare(&f, 48)) {
      cfg.cu_seqlens_q = make_cu(&f, b, 0, 0, sq, 0, "cu_q");
      cfg.cu_seqlens_kv = make_cu(&f, b, 0, 0, skv, 0, "cu_kv");
    }
    rank = 4;
    qs[0] = sb ? sq : b, qs[1] = sb ? b : sq, qs[2] = hq, qs[3] = dqk;
    ks[0] = sb ? skv : b, ks[1] = sb ? b : skv, ks[2] = hkv, ks[3] = dqk;
    vs[0] = sb ? skv : b, vs[1] = sb ? b : skv, vs[2] = hkv, vs[3] = dv;
    os[0] = sb ? sq : b, os[1] = sb ? b : sq, os[2] = hq, os[3] = dv;
    ls[0] = b, ls[1] = hq, ls[2] = sq;
  }
  if (use_cfg && fz_rare(&f, 32) && hq >= 0 && hq <= 64) {
    cfg.alibi_slopes = (const float *)fz_alloc(&f, (size_t)(hq > 0 ? hq : 1) * 4, fz_misalign(&f),
                                               0, "alibi_slopes");
  }
  if (use_cfg && dt == XTE_DTYPE_E4M3 && (fz_u8(&f) & 1) && batch_cfg >= 1 && batch_cfg <= 64 &&
      hkv >= 1 && hkv <= 64) {
    size_t n = (size_t)(batch_cfg * hkv) * 4;
    cfg.descale_q = (const float *)fz_alloc(&f, n, 0, 0, "descale_q");
    cfg.descale_k = (fz_u8(&f) & 1) ? (const float *)fz_alloc(&f, n, 0, 0, "descale_k") : NULL;
    cfg.descale_v = (fz_u8(&f) & 1) ? (const float *)fz_alloc(&f, n, 0, 0, "descale_v") : NULL;
  }
  fz_tensorn(&f, &Q, dt, rank, qs, 0, 1, "Q");
  fz_tensorn(&f, &K, dt, rank, ks, 0, 1, "K");
  fz_tensorn(&f, &V, dt, rank, vs, 0, 1, "V");
  if (fz_rare(&f, 16)) Q.ld = fz_index(&f, 0, fz_wadd(dqk, 2), 64); /* ld must be 0 or d */
  if (!bwd) {
    fz_tensorn(&f, &O, odt, rank, os, 1, 1, "O");
    fz_tensorn(&f, &L, fz_rare(&f, 16) ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, thd ? 2 : 3, ls, 1, 1,
               "lse");
    if (fz_g.skip) goto out;
    st = xte_attention_fwd(&Q, &K, &V, &O, &L, use_cfg ? &cfg : NULL, fz_pick_stream(&f));
    fz_check(st, "attention_fwd");
  } else {
    fz_tensorn(&f, &O, dt, rank, os, 0, 1, "O");
    fz_tensorn(&f, &dO, dt, rank, os, 0, 1, "dO");
    fz_tensorn(&f, &L, XTE_DTYPE_FP32, thd ? 2 : 3, ls, 0, 1, "lse");
    fz_tensorn(&f, &dQ, dt, rank, qs, 1, 1, "dQ");
    fz_tensorn(&f, &dK, dt, rank, ks, 1, 1, "dK");
    fz_tensorn(&f, &dV, dt, rank, vs, 1, 1, "dV");
    if (fz_g.skip) goto out;
    st = xte_attention_bwd(&Q, &K, &V, &O, &dO, &L, &dQ, &dK, &dV, use_cfg ? &cfg : NULL,
                           fz_pick_stream(&f));
    fz_check(st, "attention_bwd");
  }
out:
  fz_end();
  return 0;
}
