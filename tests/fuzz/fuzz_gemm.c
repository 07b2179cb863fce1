/* Fuzz target: xte_gemm (every operand pair, transposes, accumulate, bias, output dtypes). */
#include "fuzz_common.h"
#include "fuzz_gemm_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  int64_t M, N, K;
  xte_qtensor A, B;
  xte_tensor C, D, bias;
  xte_gemm_config cfg = xte_gemm_config_default();
  fzg_pair pr;
  unsigned wa, wb;
  int use_cfg;
  xte_status st;

  fz_begin(&f, data, size);
  fz_pick_isa(&f);
  M = fz_dim(&f, 48);
  N = fz_dim(&f, 48);
  K = fz_dim(&f, 300);
  fzg_pick_pair(&f, &pr);
  cfg.trans_a = fz_flag(&f);
  cfg.trans_b = fz_flag(&f);
  cfg.accumulate = fz_flag(&f);
  cfg.mode = (xte_gemm_mode)fz_enum(&f, 2);
  use_cfg = !fz_rare(&f, 16);
  if (!use_cfg) cfg = xte_gemm_config_default();
  wa = 1u + fz_u8(&f) % 3;
  wb = 1u + fz_u8(&f) % 3;
  /* X of A: [M, K] or [K, M]; X of B: [N, K] or [K, N] */
  fz_qtensor(&f, &A, cfg.trans_a == 1 ? K : M, cfg.trans_a == 1 ? M : K, pr.ma, pr.ra, pr.la, wa,
             (wa == 3) ? 0u : wa, 0, "A");
  fz_qtensor(&f, &B, cfg.trans_b == 1 ? K : N, cfg.trans_b == 1 ? N : K, pr.mb, pr.rb, pr.lb, wb,
             (wb == 3) ? 0u : wb, 0, "B");
  fzg_per_tensor_scale(&f, &A);
  fzg_per_tensor_scale(&f, &B);
  if (M < 0 || N < 0 || K < 0) fz_mark_impossible("negative M, N or K");
  fz_tensor2(&f, &C, fz_dtype(&f, fzg_out_dtypes, 2), M, N, 0, cfg.accumulate == 1, "C");
  if (fz_rare(&f, 64)) C.data = NULL;
  if (use_cfg && (fz_u8(&f) & 1)) {
    int64_t bn = fz_rare(&f, 16) ? fz_wadd(N, 1) : N;
    if (fz_u8(&f) & 1) {
      const int64_t shp[1] = {bn};
      fz_tensorn(&f, &bias, fz_dtype(&f, fzg_out_dtypes, 1), 1, shp, 0, 1, "bias");
    } else {
      fz_tensor2(&f, &bias, fz_dtype(&f, fzg_out_dtypes, 1), 1, bn, 0, 1, "bias");
    }
    cfg.bias = &bias;
  }
  fz_tensor2(&f, &D, fz_dtype(&f, fzg_out_dtypes, 2), M, N, 1, 1, "D");
  if (cfg.trans_a != 0 && cfg.trans_a != 1) fz_mark_impossible("trans_a not 0 or 1");
  if (cfg.trans_b != 0 && cfg.trans_b != 1) fz_mark_impossible("trans_b not 0 or 1");
  if (cfg.accumulate != 0 && cfg.accumulate != 1) fz_mark_impossible("accumulate not 0 or 1");
  if ((unsigned)cfg.mode > 1) fz_mark_impossible("mode out of range");
  /* throughput: the exact kernel under ASan costs about 50 ns a multiply-add; calls past 2^22
   * are skipped (the blocking is the same for smaller shapes) */
  if (M > 0 && N > 0 && K > 0 && M < (1 << 20) && N < (1 << 20) && K < (1 << 20) &&
      M * N * K > ((int64_t)1 << 22))
    fz_g.skip = 1;
  if (fz_g.skip) goto out;
  st = xte_gemm(&A, &B, &C, &D, use_cfg ? &cfg : NULL, fz_pick_stream(&f));
  fz_check(st, "gemm");
out:
  fz_end();
  return 0;
}
