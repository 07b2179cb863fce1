/* The CPU GEMM kernels of an ISA (the gemm entry of src/cpu/xte_cpu.h's xte_cpu_isa_table) and
 * of the AMX / VNNI extensions: what the driver, src/cpu/gemm_driver.c, calls. */
#ifndef XTE_CPU_GEMM_KERNELS_H
#define XTE_CPU_GEMM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "xte/core.h"

/* ---------------------------------------------------------------- CPU micro-kernels
 * A register tile of MR rows (of A) x NR columns (of B). Packed operands are fp64 (exact FP8
 * values): A micro-panel [k][MR], B micro-panel [k][NR], over the blocks of one K panel.
 * For each block bl (kl[bl] elements, in order):
 *   P[i][j] = sum_k A[k][i] * B[k][j] in fp64 (exact for the classes the driver forms);
 *   when a split operand is given (a_lo or b_lo non-NULL: that operand's magnitudes < 1, the
 *   first panel holding those >= 1 and NaN), P = P_hi + P_lo is rounded exactly once;
 *   p = RNE_fp32(P); s = RNE_fp32(sa[bl][i] * sb[bl][j]); acc[j][i] = fmaf(p, s, acc[j][i]).
 * acc is the fp32 tile, column-major [NR][MR]. */
typedef void (*xte_gemm_tile_fn)(int64_t nblk, const int *kl, const double *a, const double *a_lo,
                                 const double *b, const double *b_lo, const float *sa,
                                 const float *sb, float *acc);

/* ---------------------------------------------------------------- small-M ("skinny") path
 * For a few rows of A (<= XTE_GEMM_SK_MAXM) B is not packed: per K block the driver (or the
 * kernel's sk_decode) decodes 8 rows of B codes into an L1 buffer bd [8][XTE_GEMM_SK_LDB] fp64
 * (value * 2^-8 for e4m3, whose fp16 image is shifted by 2^8; e5m2 as is; zero past the block's
 * length, up to its length rounded up to 8); A is packed once per K panel as value * (2^8 for an
 * e4m3 B, else 1), so every product is the exact product of the two codes' values.
 * sk_decode(rows, nrows, kl, fmt, split, t_hi, t_lo, bd, bd_lo): rows[j] points at the block's
 *   first code of B row j (codes contiguous along K), j < nrows (rows >= nrows are zero); fmt is
 *   B's format; split: bd gets the class |v| >= 1 (and NaN, inf), bd_lo the class |v| < 1; t_hi /
 *   t_lo are the driver's 256-entry tables of the same values (for tails).
 * sk_block(rows, kl8, a, a_lo, lda, bd, bd_lo, sa, sb, w, ldw): for r < rows, j < 8:
 *   P = sum_{k < kl8} a[r * lda + k] * bd[j * LDB + k] (exact in any order), with a split operand
 *   (a_lo or bd_lo non-NULL) also Q from the low class and p = RNE_fp32(P + Q) exactly, else
 *   p = RNE_fp32(P); w[r * ldw + j] = fmaf(p, RNE_fp32(sa[r] * sb[j]), w[r * ldw + j]). */
#define XTE_GEMM_SK_MAXM 32
#define XTE_GEMM_SK_LDB 128
typedef void (*xte_gemm_sk_decode_fn)(const uint8_t *const *rows, int nrows, int kl, int fmt,
                                      int split, const double *t_hi, const double *t_lo, double *bd,
                                      double *bd_lo);
typedef void (*xte_gemm_sk_block_fn)(int rows, int kl8, const double *a, const double *a_lo,
                                     int64_t lda, const double *bd, const double *bd_lo,
                                     const float *sa, const float *sb, float *w, int64_t ldw);

/* 8 rows of e4m3 B codes packed to fp64 [k][8] with SIMD decoding (the values of the driver's
 * tables): d[k * 8 + j] = value of rows[j][k], k < kc; the tail through tab. */
typedef void (*xte_gemm_pack_b8_fn)(const uint8_t *const *rows, int64_t kc, const double *tab,
                                    double *d);

/* ---------------------------------------------------------------- FAST small M
 * XTE_GEMM_FAST for a few rows of A (src/cpu/gemm_fast_small.c): XTE_GEMM_FS_NC columns of B
 * (codes contiguous along K) against the m <= XTE_GEMM_SK_MAXM rows of A over nblk K blocks of kb
 * codes (the last one kl codes).
 * a: fp32 [mp][lda] (mp: m rounded up to 8), A's values times 2^8 when B is e4m3 (whose codes
 *   the kernel decodes through their fp16 images, value * 2^-8), else as they are; zero past K
 *   (up to nblk * kb) and in rows m .. mp - 1.
 * sa: [nblk][mp] A's scales (zero rows past m), readable 16 floats past the end.
 * cols[j], j < FS_NC: column j's first code; fmt: B's format (XTE_FP8_*); the kernel reads
 *   codes [0, (nblk - 1) * kb + kl) of each column and no further.
 * sb: [nblk][FS_NC] B's scales, readable 16 floats past the end.
 * w: [mp][FS_NC] out: for each (row, column), from acc = +0, per block in K order
 *   p = the fp32 sum of the block's products in an order of the kernel's choosing (each product
 *   of two FP8 values exact in fp32; IEEE specials: a NaN code, inf * 0, +inf + -inf give NaN),
 *   acc = fmaf(p, RNE_fp32(sa * sb), acc). */
#define XTE_GEMM_FS_NC 16
typedef void (*xte_gemm_fs_fn)(int m, int mp, int64_t nblk, int kb, int kl, const float *a,
                               int64_t lda, const float *sa, const uint8_t *const *cols, int fmt,
                               const float *sb, float *w);

/* The GEMM kernels of one ISA. */
typedef struct xte_gemm_ukernel {
  int isa; /* xte_cpu_isa */
  int mr, nr;
  xte_gemm_tile_fn tile;
  xte_gemm_sk_decode_fn sk_decode;
  xte_gemm_sk_block_fn sk_block;
  /* Optional (NULL: none). Tiles whose valid rows are only the first 8 or 16 of mr (the M tail):
   * the same packed operands and accumulator layout as tile, no split operand. */
  xte_gemm_tile_fn tile_r8, tile_r16;
  /* Optional (NULL: the driver's tables). e4m3 B strips of 8 rows (nr = 8). */
  xte_gemm_pack_b8_fn pack_b8;
  /* Optional (NULL: the exact kernels run FAST too). XTE_GEMM_FAST for a few rows of A. */
  xte_gemm_fs_fn fast_small;
} xte_gemm_ukernel;

/* ---------------------------------------------------------------- FAST mode (XTE_GEMM_FAST)
 * A register tile of MR rows (of A) x NR columns (of B) in fp32 (src/cpu/gemm_fast.c drives it).
 * Packed operands are fp32 (exact FP8 values): A micro-panel [k][MR], B micro-panel [k][NR], over
 * the blocks of one K panel; scales sa [nblk][MR], sb [nblk][NR]. For each block bl (kl[bl]
 * elements, in order):
 *   P[i][j] = sum_k A[k][i] * B[k][j] in fp32 multiplies and adds (fused or not, in the kernel's
 *   fixed order: the FAST partial, within the bound of docs/numerics.md);
 *   s = RNE_fp32(sa[bl][i] * sb[bl][j]); acc[i * ldc + j] = fmaf(P, s, acc[i * ldc + j]).
 * acc is the fp32 tile, row-major with row stride ldc. */
typedef void (*xte_gemm_fast_tile_fn)(int nblk, const int *kl, const float *a, const float *b,
                                      const float *sa, const float *sb, float *acc, int64_t ldc);

/* The FAST GEMM kernels of one ISA. */
typedef struct xte_gemm_fast_kernels {
  int isa; /* xte_cpu_isa */
  int mr, nr;
  xte_gemm_fast_tile_fn tile;
} xte_gemm_fast_kernels;

/* ---------------------------------------------------------------- extension: AMX-BF16 (FAST)
 * XTE_GEMM_FAST's block partials on the AMX-BF16 tile unit (src/cpu/amx/gemm_fast_amx.c), for the
 * problems of the FAST driver's panel path. A tile is mr = 32 rows of A x nr = 32 columns of B.
 * pack: 32 lanes (rows of A or columns of B; lane r, K step k at base + r rs + k ks, codes of
 *   format fmt, lanes >= nv zero) over kc K steps to bf16 (exact; NaN codes NaN, e5m2 infinities
 *   inf), zero-padded to a multiple of 32 K steps: per chunk of 32 K steps two 16-lane tiles of
 *   512 bf16; vnni 0 (A): tile row i = lane i's 32 K steps; vnni 1 (B): tile row q = K steps 2q,
 *   2q + 1 of each lane, lane by lane.
 * begin / end: the calling thread's tile configuration, set / released around its tiles.
 * tile: as xte_gemm_fast_tile_fn over such packed A and B (a block's K steps start at a chunk);
 *   P = the fp32 sum of the block's products by TDPBF16PS, then the contract's fold. */
typedef struct xte_gemm_fast_amx_kernels {
  int mr, nr;
  void (*pack)(const uint8_t *base, int64_t rs, int64_t ks, int nv, int64_t kc, int fmt, int vnni,
               uint16_t *dst);
  void (*begin)(void);
  void (*end)(void);
  void (*tile)(int nblk, const int *kl, const uint16_t *a, const uint16_t *b, const float *sa,
               const float *sb, float *acc, int64_t ldc);
  /* out: d[n] = the exact driver's output conversion of t[n] (bf16: RNE, NaN canonical 0x7FC0;
   *   fp32: NaN canonical) for n < len, d bf16 where bf16 else fp32: the epilogue of a row
   *   without C and bias (xte_gemm_out_bf16 / xte_gemm_out_f32 element by element). */
  void (*out)(const float *t, void *d, int bf16, int64_t len);
} xte_gemm_fast_amx_kernels;

/* ---------------------------------------------------------------- extension: AMX-INT8
 * The exact e4m3 x e4m3 GEMM (K block 128) as int8 digit products on the tile unit
 * (src/cpu/amx/gemm_amx.h says what each function does). A packed 16-wide tile of one K block
 * takes XTE_AMX_BLOCK_BYTES. */
#define XTE_AMX_TILE_BYTES 1024
#define XTE_AMX_BLOCK_BYTES (6 * XTE_AMX_TILE_BYTES) /* one 16-wide tile, one K block of 128 */
typedef struct xte_gemm_amx_kernels {
  void (*pack_a)(const uint8_t *src, int64_t ld, int nvalid, int64_t kc, int8_t *dst,
                 uint16_t *nan);
  void (*pack_b)(const uint8_t *src, int64_t ld, int nvalid, int64_t kc, int8_t *dst,
                 uint16_t *nan);
  void (*pack_a_kn)(const uint8_t *src, int64_t ldk, int nvalid, int64_t kc, int8_t *dst,
                    uint16_t *nan);
  void (*pack_b_kn)(const uint8_t *src, int64_t ldk, int nvalid, int64_t kc, int8_t *dst,
                    uint16_t *nan);
  void (*begin)(void);
  void (*end)(void);
  void (*tiles)(int nblk, const int8_t *ap, const uint16_t *nana, const float *sa, int mt,
                const int8_t *bp, const uint16_t *nanb, const float *sb, int nt, float *w,
                int64_t ldw, int init);
} xte_gemm_amx_kernels;

/* ---------------------------------------------------------------- extension: AVX512-VNNI
 * The exact e4m3 x e4m3 GEMM (K block 128, B read along K) for a few rows of A, as int8 digit
 * products summed by VPDPBUSD (src/cpu/vnni/gemm_vnni.h says what each function does). */
#define XTE_VNNI_BLOCK_BYTES 768 /* A, per row and K block: d0, d1, d2, d0+d1, d0+d2, d1+d2 */
#define XTE_VNNI_BD_BYTES (3 * 32 * 64) /* B digits u0, u1, u2 of a 16-column strip, K block */
typedef struct xte_gemm_vnni_kernels {
  void (*pack_a)(const uint8_t *src, int64_t rs, int64_t ks, int m, int64_t kc, int8_t *ap,
                 int32_t *corr, uint8_t *nan);
  void (*strip)(int m, int nblk, int64_t kc, const int8_t *ap, const int32_t *corr,
                const uint8_t *nana, const float *sa, const uint8_t *b, int64_t ldb, int nv,
                const float *sb, int8_t *bd, float *w, int64_t ldw);
} xte_gemm_vnni_kernels;

#endif /* XTE_CPU_GEMM_KERNELS_H */
