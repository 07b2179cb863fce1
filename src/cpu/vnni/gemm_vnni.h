/* The exact GEMM's AVX512-VNNI kernels for a few rows of A (src/cpu/vnni/gemm_vnni.c; built when
 * the compiler takes -mavx512vnni -mavx512vbmi; attached to the avx512 ISA table by src/cpu/isa.c
 * as xte_gemm_vnni_table). e4m3 x e4m3 only, K block 128, B read along K. Every code is split into
 * its three int8 digits (src/numerics/xte_gemm_digits.h; B's negative codes take their magnitude's
 * digits negated, an equally exact split) and the digit products of a K block are summed by
 * VPDPBUSD into int32 lanes, one lane per output column (16 columns of B a strip, 4 k per
 * instruction, A's digits broadcast): six products per k instead of nine (Karatsuba: d_0 u_0, d_1
 * u_1, d_2 u_2 and the products of the pair sums give the five weight sums acc_w, w = i + j), exact
 * int32 sums in any order; they fold to lo / hi (xte_gemm_digits_fold) and the partial is the exact
 * block sum rounded once (xte_gemm_digits_partial), then the block update (xte_gemm_block_update):
 * the bytes of the fp64 and AMX kernels (docs/numerics.md section 6). No B packing: B's codes
 * become digits in an L1 buffer, 16 rows x one K block at a time, and are read once.
 *
 * VPDPBUSD multiplies unsigned by signed bytes: A keeps its signed digits d_i, B's are stored
 * with an offset, u_j = d_j + o_j (o = 64, 64, 14: u in [0, 127], [0, 127], [0, 28]). Then
 * sum_k d_i(a) u_j(b) = sum_k d_i(a) d_j(b) + o_j D_i with D_i = sum_k d_i(a) over the block, so
 * per A row and block two constants (corr: the offsets' share of lo and of hi) are subtracted
 * from the folded sums. With B's digits d_j in [-64, 64] (a negative code's are its magnitude's
 * negated: u -> 2 o - u), u_0, u_1 lie in [0, 128] and u_2 in [0, 28]; the pair sums u_0 + u_1 <=
 * 255 (no e4m3 magnitude has d_0 = d_1 = -64; checked at start-up, else these kernels stay off),
 * u_0 + u_2, u_1 + u_2 <= 156 fit a byte, and A's pair sums lie in [-128, 126]. Every product term
 * is below 2^15 in magnitude, so the six int32 sums of a K block stay below 2^22; the weight sums
 * and lo / hi formed from them modulo 2^32 are exact because the true corrected lo / hi (below
 * 2^28 / 2^29) fit int32.
 *
 * Packed A, per K panel of nblk blocks (the last may be ragged; codes past kc are zeros): row r,
 * block b at ap + (r * nblk + b) * XTE_VNNI_BLOCK_BYTES: digits d0, d1, d2 and the pair sums
 * d0 + d1, d0 + d2, d1 + d2 of k = 0..127 (128 bytes each, k order); corr[2 (r nblk + b)] / [+1]:
 * the lo / hi corrections; nan[r nblk + b]: 1 when the block holds a NaN code (0x7F, 0xFF; digits
 * 0), whose partials are then NaN. */
#ifndef XTE_GEMM_VNNI_H
#define XTE_GEMM_VNNI_H

#include <stdint.h>

#include "cpu/gemm_kernels.h" /* XTE_VNNI_BLOCK_BYTES, XTE_VNNI_BD_BYTES, the table type */

/* 1 when the CPU has AVX512-F / BW / VNNI / VBMI and XTE_CPU_VNNI is not "0" (the caller runs
 * the avx512 ISA, so the OS state is known to be on). Decided once per process. */
int xte_gemm_vnni_usable(void);

/* Packs m rows of A (row r, K step k at src[r * rs + k * ks]) over kc codes, see above. */
void xte_gemm_vnni_pack_a(const uint8_t *src, int64_t rs, int64_t ks, int m, int64_t kc, int8_t *ap,
                          int32_t *corr, uint8_t *nan);

/* One strip of 16 columns over a K panel: B row j (j < nv; the others are zero codes, their
 * outputs are not to be read) at b + j * ldb, kc codes along K; sb[bl * 16 + j] its scale_inv in
 * block bl, sa[r * nblk + bl] A's. For each block in order, r < m, j < 16:
 *   p = RNE_fp32(exact block sum) (NaN where row r or column j holds a NaN code in the block),
 *   w[r * ldw + j] = xte_gemm_block_update(w[r * ldw + j], p, sa, sb).
 * bd: XTE_VNNI_BD_BYTES of 64-byte aligned scratch. */
void xte_gemm_vnni_strip(int m, int nblk, int64_t kc, const int8_t *ap, const int32_t *corr,
                         const uint8_t *nana, const float *sa, const uint8_t *b, int64_t ldb,
                         int nv, const float *sb, int8_t *bd, float *w, int64_t ldw);

#endif /* XTE_GEMM_VNNI_H */
