/* Fuzz target: xte_gemm_grouped (contiguous, masked and K-grouped; hostile group sizes,
 * alignments, group counts and masked_m values). */
#include "fuzz_common.h"
#include "fuzz_gemm_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  int64_t M = 0, N, K, G, i, rows_a, rows_d, kb, Ktot = 0;
  int64_t *gs = NULL;
  xte_qtensor A, B;
  xte_tensor C, D, bias, masked;
  xte_gemm_config cfg = xte_gemm_config_default();
  xte_gemm_groups groups;
  fzg_pair pr;
  unsigned wa, wb;
  int kind, hostile_sizes;
  xte_status st;

  fz_begin(&f, data, size);
  fz_pick_isa(&f);
  memset(&groups, 0, sizeof groups);
  kind = fz_enum(&f, 3);
  groups.kind = (xte_gemm_grouping)kind;
  {
    uint8_t b = fz_u8(&f);
    if (b < 230)
      G = 1 + b % 6;
    else if (b < 240)
      G = 0;
    else if (b < 250)
      G = (int64_t)1 << (fz_u8(&f) % 17);
    else
      G = (b & 1) ? -1 : INT32_MIN;
  }
  groups.num_groups = (int)G;
  N = fz_dim(&f, 40);
  K = fz_dim(&f, 200);
  fzg_pick_pair(&f, &pr);
  kb = pr.ma == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  cfg.trans_b = fz_flag(&f);
  cfg.accumulate = fz_flag(&f);
  cfg.trans_a = fz_rare(&f, 32) ? 1 : 0;
  hostile_sizes = fz_rare(&f, 24);
  groups.alignment = fz_rare(&f, 16) ? fz_hostile_i64[fz_u8(&f) % FZ_NHOSTILE]
                                     : (int64_t)(fz_u8(&f) % 4 == 0 ? 0 : 1 << (fz_u8(&f) % 4));
  if (G > 0) gs = (int64_t *)fz_alloc(&f, (size_t)G * 8, 0, 0, "group_sizes");

  if (kind == XTE_GEMM_GROUPED_K) {
    /* op(A) [M, Ktot], op(B) [N, Ktot], D [G * M, N] */
    M = fz_dim(&f, 40);
    for (i = 0; i < G; i++) {
      int64_t k = (i + 1 < G) ? kb * (fz_u8(&f) % 3) : fz_u8(&f) % 140;
      if (hostile_sizes && (fz_u8(&f) & 3) == 0) k = fz_index(&f, 0, 1, 255);
      gs[i] = k;
      if (Ktot >= 0 && !__builtin_add_overflow(Ktot, k, &Ktot)) {
      } else {
        Ktot = -1;
      }
    }
    if (Ktot < 0 || Ktot > 4096) Ktot = fz_u8(&f);
    if (G > 0) fz_resnap(gs);
    wa = 1u + fz_u8(&f) % 3;
    wb = 1u + fz_u8(&f) % 3;
    fz_qtensor(&f, &A, cfg.trans_a == 1 ? Ktot : M, cfg.trans_a == 1 ? M : Ktot, pr.ma, pr.ra,
               pr.la, wa, 0, 0, "A");
    fz_qtensor(&f, &B, cfg.trans_b == 1 ? Ktot : N, cfg.trans_b == 1 ? N : Ktot, pr.mb, pr.rb,
               pr.lb, wb, 0, 0, "B");
    rows_d = (G > 0 && M >= 0 && !__builtin_mul_overflow(G, M, &rows_d)) ? rows_d : 0;
  } else {
    int64_t mmax = fz_dim(&f, 24), rows = 0;
    if (kind == XTE_GEMM_GROUPED_CONTIGUOUS) {
      int64_t al = groups.alignment > 1 && groups.alignment <= 64 ? groups.alignment : 1;
      for (i = 0; i < G; i++) {
        int64_t m = fz_u8(&f) % 20;
        if (hostile_sizes && (fz_u8(&f) & 3) == 0) m = fz_index(&f, 0, 1, 255);
        gs[i] = m;
        if (rows >= 0 && m >= 0 && m < 4096)
          rows += (m + al - 1) / al * al;
        else
          rows = -1;
      }
      if (G > 0) fz_resnap(gs);
      rows_a = rows >= 0 ? rows : fz_u8(&f);
      if (fz_rare(&f, 16)) rows_a = fz_wadd(rows_a, 1); /* not what the groups need */
    } else {
      rows_a = (G > 0 && G < 4096 && mmax >= 0 && mmax < 100000) ? G * mmax : fz_u8(&f);
      if (fz_rare(&f, 16)) rows_a = fz_wadd(rows_a, 1);
    }
    wa = 1u + fz_u8(&f) % 3;
    wb = 1u + fz_u8(&f) % 3;
    fz_qtensor(&f, &A, cfg.trans_a == 1 ? K : rows_a, cfg.trans_a == 1 ? rows_a : K, pr.ma, pr.ra,
               pr.la, wa, 0, 0, "A");
    {
      int64_t GN = (G > 0 && G < 4096 && N >= 0 && N < 100000) ? G * N : N;
      int64_t GK = (G > 0 && G < 4096 && K >= 0 && K < 100000) ? G * K : K;
      if (cfg.trans_b == 1)
        fz_qtensor(&f, &B, GK, N, pr.mb, pr.rb, pr.lb, wb, 0, 0, "B");
      else
        fz_qtensor(&f, &B, GN, K, pr.mb, pr.rb, pr.lb, wb, 0, 0, "B");
    }
    if (kind == XTE_GEMM_GROUPED_MASKED) {
      int64_t mg = G > 0 && G < 100000 ? G : 1;
      int32_t *mm;
      if (fz_rare(&f, 16)) mg += 1;
      mm = (int32_t *)fz_tensor2(&f, &masked, fz_rare(&f, 8) ? XTE_DTYPE_INT64 : XTE_DTYPE_INT32, 1,
                                 mg, 0, 0, "masked_m");
      if (masked.dtype == XTE_DTYPE_INT32 && masked.rank >= 1 && !fz_g.skip) {
        int bad;
        size_t nb = fz_tensor_bytes(&masked, &bad);
        for (i = 0; !bad && (size_t)(i + 1) * 4 <= nb; i++) {
          int64_t v = fz_index(&f, 0, fz_wadd(mmax, 1), 24);
          memcpy(mm + i, &(int32_t){(int32_t)v}, 4);
        }
        fz_resnap(mm);
      }
      groups.masked_m = &masked;
    }
    rows_d = rows_a;
  }
  groups.group_sizes = fz_rare(&f, 8) ? NULL : gs;
  fzg_per_tensor_scale(&f, &A);
  fzg_per_tensor_scale(&f, &B);
  fz_tensor2(&f, &C, fz_dtype(&f, fzg_out_dtypes, 2), rows_d, N, 0, cfg.accumulate == 1, "C");
  if (fz_u8(&f) & 1) {
    fz_tensor2(&f, &bias, XTE_DTYPE_FP32, 1, fz_rare(&f, 16) ? fz_wadd(N, 1) : N, 0, 1, "bias");
    cfg.bias = &bias;
  }
  fz_tensor2(&f, &D, fz_dtype(&f, fzg_out_dtypes, 2), rows_d, N, 1, 1, "D");
  if (G <= 0) fz_mark_impossible("num_groups <= 0");
  if ((unsigned)kind > 2) fz_mark_impossible("kind out of range");
  if (cfg.trans_b != 0 && cfg.trans_b != 1) fz_mark_impossible("trans_b not 0 or 1");
  if (cfg.accumulate != 0 && cfg.accumulate != 1) fz_mark_impossible("accumulate not 0 or 1");
  if (kind != XTE_GEMM_GROUPED_K && cfg.trans_a != 0) fz_mark_impossible("trans_a != 0");
  if (gs && kind != XTE_GEMM_GROUPED_MASKED)
    for (i = 0; i < G; i++)
      if (gs[i] < 0) fz_mark_impossible("negative group size");
  if (fz_g.skip) goto out;
  st = xte_gemm_grouped(&A, &B, &C, &D, fz_rare(&f, 4) ? NULL : &groups, &cfg, fz_pick_stream(&f));
  fz_check(st, "gemm_grouped");
out:
  fz_end();
  return 0;
}
