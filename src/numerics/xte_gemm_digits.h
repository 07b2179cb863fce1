/* xte GEMM numerics, the int8 digit form of e4m3 x e4m3 block partials (the exact GEMM's int8
 * tensor-core kernel, src/cuda/gemm_imma_kernels.cuh; docs/numerics.md section 6). Build with
 * -ffp-contract=off.
 *
 * An e4m3 value v times 2^9 is an integer n (subnormals are m 2^-9, normals (8 + m) 2^(e - 10)),
 * |n| <= 448 * 2^9 = 229376 = 14 * 2^14 < 2^18. It is written in balanced base 2^7:
 *
 *   n = d2 2^14 + d1 2^7 + d0,   d0, d1 in [-64, 63],   |d2| <= 14
 *
 * d0 is the one residue of n mod 128 in [-64, 63] (unique), q = (n - d0) / 128 is an integer with
 * |q| <= (|n| + 64) / 128 < 1793, d1 the residue of q in [-64, 63], d2 = (q - d1) / 128 with
 * |d2| <= (1792 + 64) / 128 < 14.5. All three fit int8; the split is exact and unique.
 *
 * A block partial of up to 128 products: sum_k a_k b_k = 2^-18 sum_k n_a n_b, and
 * n_a n_b = sum_{i,j} d_i(a) d_j(b) 2^(7 (i + j)). Grouped by weight w = i + j (0..4), one int32
 * sum per weight: per k at most 4096 (w = 0), 2 * 64 * 64 = 8192 (w = 1), 2 * 64 * 14 + 64 * 64 =
 * 5888 (w = 2), 2 * 64 * 14 = 1792 (w = 3), 14 * 14 = 196 (w = 4), so |acc_w| <= 128 * 8192 =
 * 2^20 over a K block (every partial sum too): no int32 overflow, and the integer sums are exact
 * in any order and grouping. The kernel keeps two int32 sums per element, lo = acc_0 + 2^7 acc_1
 * and hi = acc_2 + 2^7 acc_3 + 2^14 acc_4 (xte_gemm_digits_fold: |lo| < 2^28, |hi| < 2^29).
 * S = lo + 2^14 hi = sum_w acc_w 2^(7 w) = sum_k n_a n_b, |S| <= 128 *
 * 229376^2 < 2^42.7, is exact in int64 and in fp64 (< 2^53); S 2^-18 is an exact power-of-two
 * scaling (a nonzero |S| is at least 1, and 2^-18 <= |S 2^-18| < 2^25 lies inside the normal
 * range of fp64 and of fp32); one conversion rounds it to fp32 (RNE): the exact partial rounded
 * once, the contract's p. */
#ifndef XTE_GEMM_DIGITS_H
#define XTE_GEMM_DIGITS_H

#include <stdint.h>

#include "xte_numerics.h" /* (same folder: also for the tests, which include this by path) */

/* The digits of e4m3 code b (d[0] = d0, d[1] = d1, d[2] = d2, see above). Returns 1 for the NaN
 * codes 0x7F and 0xFF (digits 0), 0 otherwise. Integer arithmetic on the code's fields only. */
XTE_HD int xte_gemm_e4m3_digits(uint8_t b, int8_t d[3]) {
  const int32_t e = (b >> 3) & 15, m = b & 7;
  int32_t n, q, d0, d1;
  if (e == 15 && m == 7) {
    d[0] = d[1] = d[2] = 0;
    return 1;
  }
  n = e == 0 ? m : (8 + m) << (e - 1);
  if (b & 0x80u) n = -n;
  /* + 2^18 (+ 2^11 for q) keeps the % operand positive; both are multiples of 128 */
  d0 = (n + 64 + 262144) % 128 - 64;
  q = (n - d0) / 128; /* exact */
  d1 = (q + 64 + 2048) % 128 - 64;
  d[0] = (int8_t)d0;
  d[1] = (int8_t)d1;
  d[2] = (int8_t)((q - d1) / 128); /* exact */
  return 0;
}

/* A sum t of digit products of weight 2^(7 w) (w = i + j for d_i(a) d_j(b); one k step of at
 * most 32 k, |t| <= 32 * 8192 = 2^18) added to the block's int32 sum of its half: lo (w = 0, 1)
 * or hi (w = 2, 3, 4), as acc + t 2^(7 w) (lo) or acc + t 2^(7 (w - 2)) (hi). Over a K block
 * lo = acc_0 + 2^7 acc_1 and hi = acc_2 + 2^7 acc_3 + 2^14 acc_4 (acc_w: the block's weight
 * sums), |lo| <= 2^19 + 2^27 < 2^28, |hi| <= 2^19.6 + 2^24.8 + 2^28.6 < 2^29, and every partial
 * sum (any order of the steps and weights) is bounded alike: exact in int32. */
XTE_HD int32_t xte_gemm_digits_fold(int32_t acc, int32_t t, int w) {
  return acc + t * ((int32_t)1 << (7 * (w < 2 ? w : w - 2)));
}

/* The block partial from the folded sums: RNE_fp32(2^-18 (lo + 2^14 hi)) (S = lo + 2^14 hi exact
 * in int64, see above, until the one rounding); nan: the block holds a NaN code in the row or the
 * column: NaN. */
XTE_HD float xte_gemm_digits_partial(int32_t lo, int32_t hi, int nan) {
  const int64_t s = (int64_t)hi * 16384 + lo;
  if (nan) return xte_bits_f32(0x7FC00000u);
  return (float)((double)s * 3.814697265625e-06); /* 2^-18 */
}

#endif /* XTE_GEMM_DIGITS_H */
