/* AMX-BF16 kernels of the FAST GEMM (XTE_GEMM_FAST, src/cpu/gemm_fast.c), an extension of the
 * avx512 ISA: src/cpu/gemm_kernels.h (xte_gemm_fast_amx_kernels) says what each function does.
 * Built with the amx/ folder's flags; run only where xte_gemm_fast_amx_usable().
 *
 * FP8 codes decode exactly to bf16 (every e4m3 / e5m2 value is a bf16 value, normal or zero:
 * the smallest, 2^-16, is far above bf16's normal range's floor; NaN codes give NaN, e5m2
 * infinities inf): the high half of the code's fp32 value, whose low 16 bits are zero. A 32 x 32
 * tile of the output is four 16 x 16 fp32 tiles; per K block its partials start at zero and take
 * one TDPBF16PS per 32 K steps and per tile (products of two FP8 values are exact in fp32; the
 * tile unit sums them in fp32, its inputs' subnormals read as zero and its subnormal results
 * flushed: none occur, every partial sum being a multiple of 2^-32), then are stored and folded
 * into the fp32 accumulators by the contract's step, s = RNE_fp32(sa sb), acc = fmaf(p, s, acc). */
#ifdef XTE_AMX_BF16 /* built with -mamx-bf16 (cmake/XteCpuIsa.cmake) */
#define _GNU_SOURCE
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu/amx/amx_tiles.h"
#include "cpu/avx512/avx512_transpose.h"
#include "cpu/gemm_kernels.h"
#include "numerics/xte_numerics.h"

/* bf16 images of the magnitudes 0..127 of each format (the sign is the code's bit 7, moved to
 * bit 15) */
static uint16_t mag_tab[2][128] __attribute__((aligned(64)));
/* the same images split into their high bytes [0..127] and low bytes [128..255] */
static uint8_t byte_tab[2][256] __attribute__((aligned(64)));
static int fast_amx_ok;
static pthread_once_t fast_amx_once = PTHREAD_ONCE_INIT;

static void fast_amx_init(void) {
  const char *env = getenv("XTE_CPU_AMX"), *env2 = getenv("XTE_CPU_AMX_BF16");
  int f, i;
  for (f = 0; f < 2; f++)
    for (i = 0; i < 128; i++) {
      const float v = xte_fp8_to_f32((uint8_t)i, f);
      uint32_t u;
      memcpy(&u, &v, 4);
      if (u & 0xFFFFu) return; /* not a bf16 value: never (every FP8 value is one) */
      mag_tab[f][i] = (uint16_t)(u >> 16);
      byte_tab[f][i] = (uint8_t)(u >> 24);
      byte_tab[f][128 + i] = (uint8_t)(u >> 16);
    }
  if ((env && !strcmp(env, "0")) || (env2 && !strcmp(env2, "0"))) return;
  fast_amx_ok = xte_amx_tiles_usable((1u << 22) | (1u << 24)); /* AMX-TILE and AMX-BF16 */
}

int xte_gemm_fast_amx_usable(void) {
  pthread_once(&fast_amx_once, fast_amx_init);
  return fast_amx_ok;
}

static void fast_amx_begin(void) {
  _tile_loadconfig(&xte_amx_cfg);
}

static void fast_amx_end(void) {
  _tile_release();
}

/* 32 codes (16-bit lanes) to their bf16 images: the magnitude table's four quarters t[0..3]
 * (VPERMI2W reads 6 index bits: quarters 0-1 or 2-3, bit 6 picks the pair), the sign moved to bit
 * 15 */
static inline __m512i dec32(__m256i codes, const __m512i *t) {
  const __m512i cw = _mm512_cvtepu8_epi16(codes);
  const __mmask32 hi = _mm512_test_epi16_mask(cw, _mm512_set1_epi16(0x40));
  __m512i v = _mm512_permutex2var_epi16(t[0], cw, t[1]);
  v = _mm512_mask_mov_epi16(v, hi, _mm512_permutex2var_epi16(t[2], cw, t[3]));
  return _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(cw, _mm512_set1_epi16(0x80)), 8));
}

/* 64 codes to their bf16 images, codes 0-31 in *lo, 32-63 in *hi: the high and the low bytes
 * looked up in the byte tables t[0..1] (high) and t[2..3] (low) by VPERMI2B (7 index bits; bit 7
 * of the code, the sign, ORed into the high byte), then interleaved by VPUNPCK{L,H}BW. Those
 * interleave within 128-bit lanes, so the codes' quadwords are first put in the order 0, 4, 1, 5,
 * 2, 6, 3, 7: lane j then holds codes 8j..8j+7 and 32+8j..32+8j+7. */
static inline void dec64(__m512i c, const __m512i *t, __m512i *lo, __m512i *hi) {
  const __m512i q = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7), c);
  const __m512i h = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t[0], q, t[1]), q,
                                              _mm512_set1_epi8((char)0x80), 0xF8); /* a|(b&c) */
  const __m512i l = _mm512_permutex2var_epi8(t[2], q, t[3]);
  *lo = _mm512_unpacklo_epi8(l, h);
  *hi = _mm512_unpackhi_epi8(l, h);
}

/* Codes [k, k + 64) of a row of codes contiguous along K holding kc codes from its start (zeros
 * past kc; nothing read there) */
static inline __m512i codes64(const uint8_t *row, int64_t k, int64_t kc) {
  const int64_t rem = kc - k;
  if (rem >= 64) return _mm512_loadu_si512((const void *)(row + k));
  if (rem <= 0) return _mm512_setzero_si512();
  return _mm512_maskz_loadu_epi8((__mmask64)((1ull << rem) - 1u), row + k);
}

/* The code of element (row r, K step k) of a 32-wide panel of operand o (rows >= nv and K steps
 * >= kc read as zero) */
static inline uint8_t code_at(const uint8_t *base, int64_t rs, int64_t ks, int r, int nv, int64_t k,
                              int64_t kc) {
  return r < nv && k < kc ? base[r * rs + k * ks] : 0;
}

/* Packs 32 rows (A: lane = row) or columns (B: lane = column) of operand codes from base (row r,
 * K step k at base + r rs + k ks; rows >= nv zero) over kc K steps into bf16 tiles, zero-padded
 * to a multiple of 32 K steps: per chunk of 32 K steps, two tiles of 512 bf16 (lanes 0-15, 16-31).
 * vnni 0 (A): tile row i = lane i's 32 K steps; vnni 1 (B): tile row q = K steps 2q, 2q + 1 of
 * each of the 16 lanes, side by side (the pair layout TDPBF16PS reads). */
static void fast_amx_pack(const uint8_t *base, int64_t rs, int64_t ks, int nv, int64_t kc, int fmt,
                          int vnni, uint16_t *dst) {
  const uint16_t *tab = mag_tab[fmt ? 1 : 0];
  __m512i t[4];
  const int64_t nch = (kc + 31) / 32;
  int64_t ch;
  int h, i;
  pthread_once(&fast_amx_once, fast_amx_init);
  if (ks == 1) {
    /* rows along K: 64 K steps (two chunks) of a lane per load and dec64, stored lane by lane;
     * for the pair layout each 16 x 16 dword block then transposed in place */
    for (i = 0; i < 4; i++)
      t[i] = _mm512_load_si512((const void *)(byte_tab[fmt ? 1 : 0] + 64 * i));
    for (ch = 0; ch < nch; ch += 2) {
      const int two = ch + 1 < nch;
      for (h = 0; h < 2; h++) {
        uint16_t *d0 = dst + (ch * 2 + h) * 512, *d1 = d0 + 1024;
        for (i = 0; i < 16; i++) {
          const int r = h * 16 + i;
          __m512i lo, hi;
          /* the next 32 lanes' codes (the caller's next panel, packed next): the rows are read
           * 512 codes at a time, too short for the prefetchers to follow (a prefetch does not
           * fault where there is none) */
          _mm_prefetch((const char *)(base + (r + 32) * rs + ch * 32), _MM_HINT_T0);
          dec64(r < nv ? codes64(base + r * rs, ch * 32, kc) : _mm512_setzero_si512(), t, &lo, &hi);
          _mm512_store_si512((void *)(d0 + i * 32), lo);
          if (two) _mm512_store_si512((void *)(d1 + i * 32), hi);
        }
        if (vnni) {
          int c2;
          for (c2 = 0; c2 < 1 + two; c2++) {
            uint16_t *d = c2 ? d1 : d0;
            __m512i x[16];
            for (i = 0; i < 16; i++) x[i] = _mm512_load_si512((const void *)(d + i * 32));
            xte_transpose16x16_epi32(x);
            for (i = 0; i < 16; i++) _mm512_store_si512((void *)(d + i * 32), x[i]);
          }
        }
      }
    }
    return;
  }
  for (i = 0; i < 4; i++) t[i] = _mm512_load_si512((const void *)(tab + 32 * i));
  for (ch = 0; ch < nch; ch++)
    for (h = 0; h < 2; h++) {
      uint16_t *d = dst + (ch * 2 + h) * 512;
      __m512i x[16];
      for (i = 0; i < 16; i++) {
        const int r = h * 16 + i;
        uint8_t cb[32] __attribute__((aligned(32)));
        int kk;
        for (kk = 0; kk < 32; kk++) cb[kk] = code_at(base, rs, ks, r, nv, ch * 32 + kk, kc);
        x[i] = dec32(_mm256_load_si256((const __m256i *)cb), t);
      }
      if (vnni) xte_transpose16x16_epi32(x);
      for (i = 0; i < 16; i++) _mm512_store_si512((void *)(d + i * 32), x[i]);
    }
}

/* Row i of a finished block's fold: acc[i ldc + j] = fmaf(p, RNE_fp32(sa[i] sb[j]), acc[...]) for
 * the 32 columns; p: the block's four stored 16 x 16 tiles. */
static inline void fold_row(const float (*p)[256], const float *sa, __m512 sb0, __m512 sb1,
                            float *acc, int64_t ldc, int i) {
  const __m512 s = _mm512_set1_ps(sa[i]);
  const float *pr = p[(i >> 4) * 2] + (i & 15) * 16;
  float *o = acc + i * ldc;
  _mm512_storeu_ps(o,
                   _mm512_fmadd_ps(_mm512_load_ps(pr), _mm512_mul_ps(s, sb0), _mm512_loadu_ps(o)));
  _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(_mm512_load_ps(pr + 256), _mm512_mul_ps(s, sb1),
                                           _mm512_loadu_ps(o + 16)));
}

/* 32 x 32 outputs over nblk K blocks (kl[bl] K steps each, the packed chunks of 32 K steps in
 * order): per block the four partial tiles from zero, one TDPBF16PS each per chunk, stored; then
 * acc[i ldc + j] = fmaf(p, RNE_fp32(sa[bl][i] sb[bl][j]), acc[i ldc + j]). Software-pipelined:
 * block bl - 1's fold runs, 8 rows after each TDPBF16PS of block bl's first chunk, while the tile
 * unit works (the folds touch disjoint buffers; each block's fold comes after the previous one's,
 * in K order). */
static void fast_amx_tile(int nblk, const int *kl, const uint16_t *a, const uint16_t *b,
                          const float *sa, const float *sb, float *acc, int64_t ldc) {
  float p[2][4][256] __attribute__((aligned(64)));
  __m512 sb0 = _mm512_setzero_ps(), sb1 = _mm512_setzero_ps();
  int bl, i;
  for (bl = 0; bl < nblk; bl++) {
    const int nch = (kl[bl] + 31) / 32;
    const float(*q)[256] = (const float(*)[256])p[(bl + 1) & 1]; /* block bl - 1's tiles */
    const float *sq = sa + (bl - 1) * 32;
    int ch;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (ch = 0; ch < nch; ch++) {
      _tile_loadd(4, a, 64);
      _tile_loadd(6, b, 64);
      _tile_loadd(5, a + 512, 64);
      _tile_loadd(7, b + 512, 64);
      _tile_dpbf16ps(0, 4, 6);
      if (ch == 0 && bl > 0)
        for (i = 0; i < 8; i++) fold_row(q, sq, sb0, sb1, acc, ldc, i);
      _tile_dpbf16ps(1, 4, 7);
      if (ch == 0 && bl > 0)
        for (i = 8; i < 16; i++) fold_row(q, sq, sb0, sb1, acc, ldc, i);
      _tile_dpbf16ps(2, 5, 6);
      if (ch == 0 && bl > 0)
        for (i = 16; i < 24; i++) fold_row(q, sq, sb0, sb1, acc, ldc, i);
      _tile_dpbf16ps(3, 5, 7);
      if (ch == 0 && bl > 0)
        for (i = 24; i < 32; i++) fold_row(q, sq, sb0, sb1, acc, ldc, i);
      if (bl == 0 && ch < 4) /* the accumulators (left in L3 by the previous K panel), 8 rows
                                per chunk, ahead of the first fold */
        for (i = ch * 8; i < ch * 8 + 8; i++) {
          _mm_prefetch((const char *)(acc + i * ldc), _MM_HINT_T0);
          _mm_prefetch((const char *)(acc + i * ldc + 16), _MM_HINT_T0);
        }
      a += 1024;
      b += 1024;
    }
    _tile_stored(0, p[bl & 1][0], 64);
    _tile_stored(1, p[bl & 1][1], 64);
    _tile_stored(2, p[bl & 1][2], 64);
    _tile_stored(3, p[bl & 1][3], 64);
    sb0 = _mm512_loadu_ps(sb + bl * 32);
    sb1 = _mm512_loadu_ps(sb + bl * 32 + 16);
  }
  if (nblk > 0) {
    const float(*q)[256] = (const float(*)[256])p[(nblk - 1) & 1];
    for (i = 0; i < 32; i++) fold_row(q, sa + (nblk - 1) * 32, sb0, sb1, acc, ldc, i);
  }
}

/* The output conversions of xte_gemm_out_bf16 / xte_gemm_out_f32, 16 lanes at a time: NaN to the
 * canonical NaN, else (bf16) u + 0x7FFF + bit 16 of u, shifted down (RNE, as xte_f32_to_bf16). */
static void fast_amx_out(const float *t, void *d, int bf16, int64_t len) {
  int64_t n;
  for (n = 0; n < len; n += 16) {
    const __mmask16 m = len - n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (len - n)) - 1u);
    const __m512 v = _mm512_maskz_loadu_ps(m, t + n);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (bf16) {
      const __m512i u = _mm512_castps_si512(v);
      __m512i r = _mm512_add_epi32(
          u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                              _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
      r = _mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), nan, _mm512_set1_epi32(0x7FC0));
      _mm256_mask_storeu_epi16((uint16_t *)d + n, m, _mm512_cvtepi32_epi16(r));
    } else {
      _mm512_mask_storeu_ps(
          (float *)d + n, m,
          _mm512_mask_mov_ps(v, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000))));
    }
  }
}

const xte_gemm_fast_amx_kernels xte_gemm_fast_amx_table = {
    .mr = 32,
    .nr = 32,
    .pack = fast_amx_pack,
    .begin = fast_amx_begin,
    .end = fast_amx_end,
    .tile = fast_amx_tile,
    .out = fast_amx_out,
};
#else
typedef int xte_gemm_fast_amx_none; /* not built: the compiler lacks -mamx-bf16 */
#endif /* XTE_AMX_BF16 */
