/* XTE_GEMM_FAST for a few rows of A, plain C (src/cpu/gemm_kernels.h, xte_gemm_fs_fn): each block
 * partial is the fp32 sum of its products in K order (every product of two FP8 values is exact in
 * fp32), then the contract's block update. B's codes decode through a 256-entry fp32 table of the
 * values the SIMD kernels take (value * 2^-8 for e4m3, its fp16 image; e5m2 as it is). */
#include "numerics/xte_gemm_numerics.h"
#include "cpu/gemm_kernels.h"

void xte_gemm_fast_small_scalar(int m, int mp, int64_t nblk, int kb, int kl, const float *a,
                                int64_t lda, const float *sa, const uint8_t *const *cols, int fmt,
                                const float *sb, float *w) {
  float tab[256];
  int c, r, j;
  int64_t bl;
  for (c = 0; c < 256; c++)
    tab[c] = xte_fp8_to_f32((uint8_t)c, fmt) * (fmt == XTE_FP8_E4M3 ? 0x1p-8f : 1.0f);
  for (r = 0; r < mp; r++)
    for (j = 0; j < XTE_GEMM_FS_NC; j++) w[r * XTE_GEMM_FS_NC + j] = 0.0f;
  for (bl = 0; bl < nblk; bl++) {
    const int len = bl == nblk - 1 ? kl : kb;
    const int64_t k0 = bl * kb;
    for (j = 0; j < XTE_GEMM_FS_NC; j++) {
      const uint8_t *b = cols[j] + k0;
      for (r = 0; r < m; r++) {
        const float *ar = a + r * lda + k0;
        float p = 0.0f;
        int k;
        for (k = 0; k < len; k++) p = p + ar[k] * tab[b[k]];
        w[r * XTE_GEMM_FS_NC + j] = xte_gemm_block_update(
            w[r * XTE_GEMM_FS_NC + j], p, sa[bl * mp + r], sb[bl * XTE_GEMM_FS_NC + j]);
      }
    }
  }
}
