/* The exact GEMM's AMX-INT8 kernels (src/cpu/amx/gemm_amx.c; built when the compiler takes
 * -mamx-int8; attached to the avx512 ISA table by src/cpu/isa.c as xte_gemm_amx_table). e4m3 x e4m3
 * only, K block 128: every code is split into its three int8 digits
 * (src/numerics/xte_gemm_digits.h), the nine digit products of a K block are summed by TDPBSSD
 * (exact int32 sums per weight, any order), and the block partial is the exact sum rounded once to
 * fp32: the same bytes as the fp64 kernels (docs/numerics.md section 6).
 *
 * Packed layouts, per K panel of nblk blocks (the last may be ragged; missing codes are zeros):
 *   A, one tile of 16 rows: [blk][half][digit][16 rows][64 k]       (6 KiB per block)
 *   B, one tile of 16 columns: [blk][half][digit][16 k/4][16 n][4]  (6 KiB per block, the VNNI
 *     order TDPBSSD reads)
 * NaN codes (0x7F, 0xFF) have zero digits; nan[blk] is the bit mask of the tile's rows (A) or
 * columns (B) holding one in that block, whose partials are then NaN. */
#ifndef XTE_GEMM_AMX_H
#define XTE_GEMM_AMX_H

#include <stdint.h>

#include "cpu/gemm_kernels.h" /* XTE_AMX_BLOCK_BYTES, the extension's table type */

/* 1 when the CPU has AMX-TILE, AMX-INT8 and AVX512-VBMI, the OS enables the tile state and lets
 * this process use it, and XTE_CPU_AMX is not "0". Decided once per process. */
int xte_gemm_amx_usable(void);

/* Packs rows r < nvalid (row r at src + r * ld, codes contiguous along K) of one 16-row (A) or
 * 16-column (B) tile over kc codes (nblk = ceil(kc / 128) blocks); rows >= nvalid are zeros. */
void xte_gemm_amx_pack_a(const uint8_t *src, int64_t ld, int nvalid, int64_t kc, int8_t *dst,
                         uint16_t *nan);
void xte_gemm_amx_pack_b(const uint8_t *src, int64_t ld, int nvalid, int64_t kc, int8_t *dst,
                         uint16_t *nan);

/* pack_a for an A whose 16 rows are contiguous and whose K steps are ldk bytes apart (op(A) read
 * transposed: the wgrad gradient dY^T): row r of K step k at src[k * ldk + r]. */
void xte_gemm_amx_pack_a_kn(const uint8_t *src, int64_t ldk, int nvalid, int64_t kc, int8_t *dst,
                            uint16_t *nan);

/* pack_b for a B whose 16 columns are contiguous and whose K steps are ldk bytes apart (an op(B)
 * read transposed: the dgrad weight W^T from W's rowwise copy): column n of K step k at
 * src[k * ldk + n]. Same output as pack_b of the transposed data. */
void xte_gemm_amx_pack_b_kn(const uint8_t *src, int64_t ldk, int nvalid, int64_t kc, int8_t *dst,
                            uint16_t *nan);

/* Loads the tile configuration (8 tiles of 16 x 64 bytes) on the calling thread / releases it. */
void xte_gemm_amx_begin(void);
void xte_gemm_amx_end(void);

/* Output tiles of 16 x 16 for mt tiles of packed A (tile t at ap + t * nblk * 6 KiB, nana + t *
 * nblk, sa + t * nblk * 16) and nt tiles of packed B (alike), over nblk K blocks: tile (t, u) is
 * w + t * 16 * ldw + u * 16. sa[blk * 16 + r], sb[blk * 16 + n]: the blocks' scale_inv of row r /
 * column n. For each block in order:
 *   p = RNE_fp32(exact block sum) (NaN where the row or the column holds a NaN code),
 *   w[r * ldw + n] = xte_gemm_block_update(w[r * ldw + n], p, sa, sb),
 * starting from 0 when init. Between xte_gemm_amx_begin and _end. */
void xte_gemm_amx_tiles(int nblk, const int8_t *ap, const uint16_t *nana, const float *sa, int mt,
                        const int8_t *bp, const uint16_t *nanb, const float *sb, int nt, float *w,
                        int64_t ldw, int init);

#endif /* XTE_GEMM_AMX_H */
