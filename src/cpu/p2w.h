/* Scalar parameters of the SIMD kernels' bf16 power-of-two word path (AVX2 and AVX-512 alike). */
#ifndef XTE_CPU_P2W_H
#define XTE_CPU_P2W_H

#include <stdint.h>

#include "numerics/xte_numerics.h"
#include "xte_kernel_args.h"

/* ---- bf16 words and a power-of-two scale 2^k (TE_BLOCK with force_pow_2, MX): for a word w of
 * |x| with x * 2^k a normal fp32 (w >= T, T the word of 2^(emin - k), emin the format's smallest
 * normal exponent), the product's bits are (w << 16) + (k << 23) exactly, and the header's integer
 * rounding of them (normal results) is, with sh = 7 - mbits and odd = (w >> sh) & 1,
 *   ((w + odd + 2^(sh-1) - 1 + (k << 7)) >> sh) - B      (B = 960 for E4M3, 448 for E5M2)
 *   = ((w + odd) -sat D) >> sh,  D = (B << sh) - (2^(sh-1) - 1) - (k << 7)
 * in uint16 lanes (w + odd <= 0x8000; D >= 0 for the k allowed, so a zero word gives 0). The value
 * only grows with w, so past the largest finite code (an overflowing product included) the min
 * with the largest code the rule allows does the overflow, as in cvt_mag. NaN words are the
 * callers' (they redo the row the general way). k in [-100, 109] keeps D in [0, 0xFFFF], T a normal
 * bf16 word, and codes 0 for bf16 subnormals.
 * Words w < T (subnormal results, zero and bf16 subnormals included): the header rounds |x| 2^k
 * to the subnormal quantum Q (2^-9 for E4M3, 2^-16 for E5M2) by an fp32 addition of 2^23 Q, whose
 * sum's low bits are the code; |x| 2^k is exact in fp32 for the k allowed or far below Q / 2, so
 * one fused multiply-add, fma(|x|, 2^k, 2^23 Q), gives that sum: code = bits(sum) - bits(2^23 Q).
 */
/* How the SIMD p2w_mag finds the subnormal lanes' codes (the fma above). P2W_SUB_RARE: only for a
 * vector that has such a lane (a branch): rows scaled by their own block's amax, where they are
 * rare and the branch predicts well. P2W_SUB_ALWAYS: for every vector, blended (no branch): tiles
 * under one scale and column scales, where whether a vector of a row has such a lane changes from
 * row to row with the row's magnitude; there the branch mispredicts, and each miss also stalls the
 * memory stream. */
enum { P2W_SUB_RARE = 0, P2W_SUB_ALWAYS = 1 };

/* The biased exponents of the scales 2^k the word sequence takes (k in [-100, 109]) */
#define P2W_EXP_MIN 27u
#define P2W_EXP_MAX 236u

static inline int p2w_ok(float s) {
  uint32_t u = xte_f32_bits(s);
  return (u & 0x7FFFFFu) == 0 && (u >> 23) >= P2W_EXP_MIN && (u >> 23) <= P2W_EXP_MAX;
}

/* D and T / 128 for k = 0: D = p2w_d0 - 128 k, T = (p2w_t0 - k) << 7 (the SIMD kernels compute
 * them lane by lane from these) */
static inline int p2w_d0(int fmt) {
  return fmt == XTE_FP8_E4M3 ? 15353 : 14321;
}

static inline int p2w_t0(int fmt) {
  return fmt == XTE_FP8_E4M3 ? 121 : 113;
}

static inline uint16_t p2w_d(float s, int fmt) {
  int k = (int)(xte_f32_bits(s) >> 23) - 127;
  return (uint16_t)(p2w_d0(fmt) - 128 * k);
}

static inline uint16_t p2w_t(float s, int fmt) { /* (unsigned: callers may ask of any scale) */
  int k = (int)(xte_f32_bits(s) >> 23) - 127;
  return (uint16_t)((uint32_t)(p2w_t0(fmt) - k) << 7);
}

/* bits of 2^23 Q */
static inline uint32_t p2w_magic(int fmt) {
  return fmt == XTE_FP8_E4M3 ? 0x46800000u : 0x43000000u;
}

/* the largest magnitude code the rule allows (overflow: saturated, or NaN / inf) */
static inline uint16_t p2w_cmax(int fmt, int sat) {
  return (uint16_t)(fmt == XTE_FP8_E4M3 ? (sat ? 0x7E : 0x7F) : (sat ? 0x7B : 0x7C));
}

/* fp32 input converted on bf16 words rounded to odd, two vectors of W / 2 floats packed (packus,
 * per 128-bit lane of 8 words: 4 of the first vector, then 4 of the second) into W words: the
 * column of word position i of a 128-column row */
static inline int p2w_rto_col(int i, int W) {
  const int v = i / W, L = (i % W) / 8, e = i % 8;
  return W * v + (e < 4 ? 4 * L + e : W / 2 + 4 * L + e - 4);
}

/* The quant_rc kernels' tile: 1 if every row scale (nr) and column scale (128) is a power of two
 * the word sequence takes; then pd / pt hold p2w_d / p2w_t of the column of each word position
 * (col: that column, NULL for the identity) and *amax the max of the row maxima ram. */
static inline int p2w_tile_params(const xte_quant_args *a, const xte_block_scale *rsc,
                                  const float *ram, int64_t nr, const xte_block_scale *csc,
                                  const int *col, uint16_t *pd, uint16_t *pt, float *amax) {
  float m = 0.0f;
  int64_t r;
  int i, ok = 1;
  for (r = 0; r < nr; r++) {
    ok &= p2w_ok(rsc[r].scale);
    m = xte_fmaxf(m, ram[r]);
  }
  for (i = 0; i < 128; i++) {
    const float s = csc[col ? col[i] : i].scale;
    ok &= p2w_ok(csc[i].scale);
    pd[i] = p2w_d(s, a->fmt);
    pt[i] = p2w_t(s, a->fmt);
  }
  *amax = m;
  return ok;
}

/* The quant_rc kernels' row parameters under power-of-two scales (p2w_tile_params passed): rs,
 * rd, rt the scale, p2w_d and p2w_t of each of the nr rows of scales rsc; returns 1 when some row's
 * max ram[r] times its scale passes fmax (exact for 2^k scales: the clamp is needed) */
static inline int p2w_row_params(const xte_block_scale *rsc, const float *ram, int64_t nr, int fmt,
                                 float fmax, float *rs, uint16_t *rd, uint16_t *rt) {
  int64_t r;
  int over = 0;
  for (r = 0; r < nr; r++) {
    rs[r] = rsc[r].scale;
    rd[r] = p2w_d(rs[r], fmt);
    rt[r] = p2w_t(rs[r], fmt);
    over |= !(ram[r] * rsc[r].scale <= fmax);
  }
  return over;
}

#endif /* XTE_CPU_P2W_H */
