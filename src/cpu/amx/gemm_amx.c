/* AMX-INT8 kernels of the exact GEMM, e4m3 x e4m3 (src/cpu/amx/gemm_amx.h). Built with -mamx-tile
 * -mamx-int8 -mavx512vbmi on top of the AVX-512 flags; run only where xte_gemm_amx_usable().
 *
 * Bytes: the digits of a code are those of its magnitude by xte_gemm_e4m3_digits (tables made from
 * it), negated for a negative code (an exact split as well, digits in [-64, 64], |d2| <= 14: the
 * same bounds); a K block
 * adds its nine digit products per weight w = i + j in five int32 tiles (exact in any order,
 * xte_gemm_digits.h); lo / hi are xte_gemm_digits_fold's sums and the partial is
 * xte_gemm_digits_partial's, lane by lane ((double)(hi 2^14 + lo) * 2^-18, one RNE to fp32);
 * the update is xte_gemm_block_update's (RNE fp32 scale product, one fused multiply-add). So the
 * fp64 kernels' bytes: both round the same exact block sum once. */
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
#include "cpu/amx/gemm_amx.h"
#include "numerics/xte_gemm_digits.h"
#include "numerics/xte_gemm_numerics.h"

static int8_t dig_tab[3][256] __attribute__((aligned(64)));
static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_init(void) {
  const char *env = getenv("XTE_CPU_AMX");
  int i;
  for (i = 0; i < 256; i++) {
    int8_t dg[3];
    (void)xte_gemm_e4m3_digits((uint8_t)i, dg);
    dig_tab[0][i] = dg[0];
    dig_tab[1][i] = dg[1];
    dig_tab[2][i] = dg[2];
  }
  /* digits64's half tables: d0 = 0 for magnitudes from 64 on, d2 = 0 below */
  for (i = 0; i < 128; i++)
    if ((i >= 64 && dig_tab[0][i] != 0) || (i < 64 && dig_tab[2][i] != 0)) return;
  if (env && !strcmp(env, "0")) return;
  amx_ok = xte_amx_tiles_usable((1u << 24) | (1u << 25)); /* AMX-TILE and AMX-INT8 */
}

int xte_gemm_amx_usable(void) {
  pthread_once(&amx_once, amx_init);
  return amx_ok;
}

void xte_gemm_amx_begin(void) {
  _tile_loadconfig(&xte_amx_cfg);
}

void xte_gemm_amx_end(void) {
  _tile_release();
}

/* The magnitudes' digit tables: d0 of 0..63 (0 from 64 on), d1 of 0..127, d2 of 64..127 (0 below;
 * both checked by amx_init). */
typedef struct {
  __m512i t0, t1[2], t2;
} digtabs;

static inline void load_tabs(digtabs *T) {
  pthread_once(&amx_once, amx_init);
  T->t0 = _mm512_load_si512((const void *)dig_tab[0]);
  T->t1[0] = _mm512_load_si512((const void *)dig_tab[1]);
  T->t1[1] = _mm512_load_si512((const void *)(dig_tab[1] + 64));
  T->t2 = _mm512_load_si512((const void *)(dig_tab[2] + 64));
}

/* The three digit vectors of 64 codes, stored to d, d + 1024, d + 2048; returns the NaN mask. The
 * magnitude's digits (VPERMB reads the index's low 6 bits, VPERMI2B 7; bit 6 picks the half
 * table), negated where the code is negative. */
static inline __mmask64 digits64(const digtabs *T, __m512i cd, int8_t *d) {
  const __mmask64 neg = _mm512_movepi8_mask(cd), big = _mm512_movepi8_mask(_mm512_add_epi8(cd, cd));
  const __m512i z = _mm512_setzero_si512();
  __m512i v[3];
  int i;
  v[0] = _mm512_maskz_permutexvar_epi8(_knot_mask64(big), cd, T->t0);
  v[1] = _mm512_permutex2var_epi8(T->t1[0], cd, T->t1[1]);
  v[2] = _mm512_maskz_permutexvar_epi8(big, cd, T->t2);
  for (i = 0; i < 3; i++)
    _mm512_store_si512((void *)(d + i * XTE_AMX_TILE_BYTES),
                       _mm512_mask_sub_epi8(v[i], neg, z, v[i]));
  return _mm512_cmpeq_epi8_mask(_mm512_and_si512(cd, _mm512_set1_epi8(0x7F)),
                                _mm512_set1_epi8(0x7F));
}

/* Codes [k0, k0 + 64) of a row holding kc codes (zeros past kc). */
static inline __m512i load_codes(const uint8_t *row, int64_t k0, int64_t kc) {
  const int64_t rem = kc - k0;
  if (rem >= 64) return _mm512_loadu_si512((const void *)(row + k0));
  if (rem <= 0) return _mm512_setzero_si512();
  return _mm512_maskz_loadu_epi8((__mmask64)((1ull << rem) - 1), row + k0);
}

/* One half block (64 K steps from k0; zeros past kc) of one 16-wide tile, packed to its three
 * digit tiles at d: returns the NaN bit mask of its rows (A) or columns (B). */
typedef unsigned (*half_fn)(const digtabs *T, const uint8_t *src, int64_t ld, int nvalid,
                            int64_t k0, int64_t kc, int8_t *d);

/* A, codes contiguous along K: row r at src + r * ld */
static unsigned half_a(const digtabs *T, const uint8_t *src, int64_t ld, int nvalid, int64_t k0,
                       int64_t kc, int8_t *d) {
  unsigned m = 0;
  int r;
  for (r = 0; r < 16; r++) {
    __m512i cd = r < nvalid ? load_codes(src + r * ld, k0, kc) : _mm512_setzero_si512();
    if (digits64(T, cd, d + r * 64)) m |= 1u << r;
  }
  return m;
}

/* B, codes contiguous along K: column n at src + n * ld. The VNNI order (row q holds codes 4q ..
 * 4q + 3 of each of the 16 columns, i.e. dword q of every source row) is a 16 x 16 dword
 * transpose. */
static unsigned half_b(const digtabs *T, const uint8_t *src, int64_t ld, int nvalid, int64_t k0,
                       int64_t kc, int8_t *d) {
  __m512i x[16];
  unsigned m = 0;
  int n, q;
  for (n = 0; n < 16; n++) {
    x[n] = n < nvalid ? load_codes(src + n * ld, k0, kc) : _mm512_setzero_si512();
    if (_mm512_cmpeq_epi8_mask(_mm512_and_si512(x[n], _mm512_set1_epi8(0x7F)),
                               _mm512_set1_epi8(0x7F)))
      m |= 1u << n;
  }
  xte_transpose16x16_epi32(x);
  for (q = 0; q < 16; q++) (void)digits64(T, x[q], d + q * 64);
  return m;
}

/* A with its 16 rows contiguous, K steps ld apart: a 64 x 16 byte transpose. */
static unsigned half_a_kn(const digtabs *T, const uint8_t *src, int64_t ld, int nvalid, int64_t k0,
                          int64_t kc, int8_t *d) {
  const __mmask16 nm = (__mmask16)(nvalid >= 16 ? 0xFFFF : (1u << nvalid) - 1u);
  uint8_t tmp[64][16] __attribute__((aligned(64)));
  uint8_t tr[16][64] __attribute__((aligned(64)));
  unsigned m = 0;
  int r, kk;
  for (kk = 0; kk < 64; kk++)
    _mm_store_si128((__m128i *)tmp[kk], k0 + kk < kc
                                            ? _mm_maskz_loadu_epi8(nm, src + (k0 + kk) * ld)
                                            : _mm_setzero_si128());
  for (r = 0; r < 16; r++)
    for (kk = 0; kk < 64; kk++) tr[r][kk] = tmp[kk][r];
  for (r = 0; r < 16; r++)
    if (digits64(T, _mm512_load_si512((const void *)tr[r]), d + r * 64)) m |= 1u << r;
  return m;
}

/* B with its 16 columns contiguous, K steps ld apart: row q of the VNNI tile interleaves K steps
 * k0 + 4q .. + 3 column by column. */
static unsigned half_b_kn(const digtabs *T, const uint8_t *src, int64_t ld, int nvalid, int64_t k0,
                          int64_t kc, int8_t *d) {
  const __mmask16 nm = (__mmask16)(nvalid >= 16 ? 0xFFFF : (1u << nvalid) - 1u);
  unsigned m = 0;
  int q, t;
  for (q = 0; q < 16; q++) {
    __m128i r[4], lo01, hi01, lo23, hi23;
    __m512i cd;
    __mmask64 nn;
    for (t = 0; t < 4; t++) {
      const int64_t k = k0 + 4 * q + t;
      r[t] = k < kc ? _mm_maskz_loadu_epi8(nm, src + k * ld) : _mm_setzero_si128();
    }
    lo01 = _mm_unpacklo_epi8(r[0], r[1]);
    hi01 = _mm_unpackhi_epi8(r[0], r[1]);
    lo23 = _mm_unpacklo_epi8(r[2], r[3]);
    hi23 = _mm_unpackhi_epi8(r[2], r[3]);
    cd = _mm512_inserti32x4(
        _mm512_inserti32x4(
            _mm512_inserti32x4(_mm512_castsi128_si512(_mm_unpacklo_epi16(lo01, lo23)),
                               _mm_unpackhi_epi16(lo01, lo23), 1),
            _mm_unpacklo_epi16(hi01, hi23), 2),
        _mm_unpackhi_epi16(hi01, hi23), 3);
    nn = digits64(T, cd, d + q * 64);
    if (nn)
      for (t = 0; t < 16; t++)
        if ((nn >> (4 * t)) & 0xF) m |= 1u << t;
  }
  return m;
}

/* Every block of a tile: the two halves, the block's NaN mask. */
static inline void pack_tile(half_fn f, const uint8_t *src, int64_t ld, int nvalid, int64_t kc,
                             int8_t *dst, uint16_t *nan) {
  const int nblk = (int)((kc + 127) / 128);
  digtabs T;
  int b, h;
  load_tabs(&T);
  for (b = 0; b < nblk; b++) {
    unsigned m = 0;
    for (h = 0; h < 2; h++)
      m |= f(&T, src, ld, nvalid, (int64_t)b * 128 + h * 64, kc,
             dst + ((int64_t)b * 2 + h) * 3 * XTE_AMX_TILE_BYTES);
    nan[b] = (uint16_t)m;
  }
}

void xte_gemm_amx_pack_a(const uint8_t *src, int64_t ld, int nvalid, int64_t kc, int8_t *dst,
                         uint16_t *nan) {
  pack_tile(half_a, src, ld, nvalid, kc, dst, nan);
}

void xte_gemm_amx_pack_b(const uint8_t *src, int64_t ld, int nvalid, int64_t kc, int8_t *dst,
                         uint16_t *nan) {
  pack_tile(half_b, src, ld, nvalid, kc, dst, nan);
}

void xte_gemm_amx_pack_a_kn(const uint8_t *src, int64_t ldk, int nvalid, int64_t kc, int8_t *dst,
                            uint16_t *nan) {
  pack_tile(half_a_kn, src, ldk, nvalid, kc, dst, nan);
}

void xte_gemm_amx_pack_b_kn(const uint8_t *src, int64_t ldk, int nvalid, int64_t kc, int8_t *dst,
                            uint16_t *nan) {
  pack_tile(half_b_kn, src, ldk, nvalid, kc, dst, nan);
}

/* The fold of one finished block (weight sums cb) into a 16 x 16 tile of w, one row at a time. */
typedef struct {
  float *w;
  const float *sa, *sb;
  unsigned na, nb;
  int zero;
} fold_step;

static inline void fold_row(const fold_step *f, int32_t (*cb)[256], int64_t ldw, int r) {
  const __m512d two_m18 = _mm512_set1_pd(0x1p-18);
  const __m512 qnan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000));
  const __m512i v0 = _mm512_load_si512((const void *)(cb[0] + r * 16));
  const __m512i v1 = _mm512_load_si512((const void *)(cb[1] + r * 16));
  const __m512i v2 = _mm512_load_si512((const void *)(cb[2] + r * 16));
  const __m512i v3 = _mm512_load_si512((const void *)(cb[3] + r * 16));
  const __m512i v4 = _mm512_load_si512((const void *)(cb[4] + r * 16));
  /* xte_gemm_digits_fold: lo = acc_0 + 2^7 acc_1, hi = acc_2 + 2^7 acc_3 + 2^14 acc_4 */
  const __m512i lo = _mm512_add_epi32(v0, _mm512_slli_epi32(v1, 7));
  const __m512i hi =
      _mm512_add_epi32(_mm512_add_epi32(v2, _mm512_slli_epi32(v3, 7)), _mm512_slli_epi32(v4, 14));
  /* xte_gemm_digits_partial: (double)(hi 2^14 + lo) * 2^-18, rounded once to fp32 */
  const __m512i s0 =
      _mm512_add_epi64(_mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(hi)), 14),
                       _mm512_cvtepi32_epi64(_mm512_castsi512_si256(lo)));
  const __m512i s1 = _mm512_add_epi64(
      _mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(hi, 1)), 14),
      _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(lo, 1)));
  const __m256 p0 = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtepi64_pd(s0), two_m18));
  const __m256 p1 = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtepi64_pd(s1), two_m18));
  __m512 p = _mm512_insertf32x8(_mm512_castps256_ps512(p0), p1, 1);
  const __mmask16 nm = ((f->na >> r) & 1u) ? (__mmask16)0xFFFF : (__mmask16)f->nb;
  /* xte_gemm_block_update: s = RNE_fp32(sa sb), acc = fmaf(p, s, acc) */
  const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(f->sa[r]), _mm512_loadu_ps(f->sb));
  float *wr = f->w + r * ldw;
  const __m512 acc = f->zero ? _mm512_setzero_ps() : _mm512_loadu_ps(wr);
  p = _mm512_mask_mov_ps(p, nm, qnan);
  _mm512_storeu_ps(wr, _mm512_fmadd_ps(p, sc, acc));
}

/* One K block half: the nine digit products into the weight tiles 0..4 (tile 5: an A digit,
 * tiles 6 and 7: B digits), with rows r0 .. r0 + 7 of the previous block's fold (F) placed
 * between them: the tile unit works through its queue while the vector units fold (the fold
 * after the tile instructions, in one piece, did not overlap them). */
#define AMX_HALF(a, b, F, r0)          \
  do {                                 \
    _tile_loadd(5, (a), 64);           \
    _tile_loadd(6, (b), 64);           \
    _tile_loadd(7, (b) + 1024, 64);    \
    _tile_dpbssd(0, 5, 6); /* a0 b0 */ \
    F(r0);                             \
    _tile_dpbssd(1, 5, 7); /* a0 b1 */ \
    F(r0 + 1);                         \
    _tile_loadd(6, (b) + 2048, 64);    \
    _tile_dpbssd(2, 5, 6); /* a0 b2 */ \
    F(r0 + 2);                         \
    _tile_loadd(5, (a) + 1024, 64);    \
    _tile_dpbssd(3, 5, 6); /* a1 b2 */ \
    F(r0 + 3);                         \
    _tile_dpbssd(2, 5, 7); /* a1 b1 */ \
    F(r0 + 4);                         \
    _tile_loadd(7, (b), 64);           \
    _tile_dpbssd(1, 5, 7); /* a1 b0 */ \
    F(r0 + 5);                         \
    _tile_loadd(5, (a) + 2048, 64);    \
    _tile_dpbssd(2, 5, 7); /* a2 b0 */ \
    F(r0 + 6);                         \
    _tile_dpbssd(4, 5, 6); /* a2 b2 */ \
    F(r0 + 7);                         \
    _tile_loadd(7, (b) + 1024, 64);    \
    _tile_dpbssd(3, 5, 7); /* a2 b1 */ \
  } while (0)

void xte_gemm_amx_tiles(int nblk, const int8_t *ap, const uint16_t *nana, const float *sa, int mt,
                        const int8_t *bp, const uint16_t *nanb, const float *sb, int nt, float *w,
                        int64_t ldw, int init) {
  /* software-pipelined: the tile unit runs block s while the vector units fold block s - 1 (a
   * fold right after its tile store waits for the store) */
  int32_t cb[2][5][256] __attribute__((aligned(64)));
  fold_step prev = {0};
  int u, t, b, s = 0;
  for (u = 0; u < nt; u++)
    for (t = 0; t < mt; t++)
      for (b = 0; b < nblk; b++, s++) {
        const int8_t *a = ap + ((int64_t)t * nblk + b) * XTE_AMX_BLOCK_BYTES;
        const int8_t *bb = bp + ((int64_t)u * nblk + b) * XTE_AMX_BLOCK_BYTES;
        int32_t(*c)[256] = cb[s & 1];
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        _tile_zero(4);
#define FOLD_ROW(r) \
  if (s > 0) fold_row(&prev, cb[(s - 1) & 1], ldw, (r))
        AMX_HALF(a, bb, FOLD_ROW, 0);
        AMX_HALF(a + 3 * XTE_AMX_TILE_BYTES, bb + 3 * XTE_AMX_TILE_BYTES, FOLD_ROW, 8);
#undef FOLD_ROW
        if (b == 0 && !init) {
          /* the next tile's accumulators (rows far apart, often past L2), wanted nblk steps on */
          const int nu = t + 1 < mt ? u : u + 1, ntl = t + 1 < mt ? t + 1 : 0;
          if (nu < nt) {
            const float *pw = w + (int64_t)ntl * 16 * ldw + nu * 16;
            int r;
            for (r = 0; r < 16; r++) __builtin_prefetch(pw + r * ldw, 1, 3);
          }
        }
        {
          /* the next step's A block into L1 (it comes from L2; a tile load waits on its lines) */
          const int8_t *na = b + 1 < nblk ? a + XTE_AMX_BLOCK_BYTES
                             : t + 1 < mt ? ap + (int64_t)(t + 1) * nblk * XTE_AMX_BLOCK_BYTES
                                          : ap;
          int o;
          for (o = 0; o < XTE_AMX_BLOCK_BYTES; o += 64)
            _mm_prefetch((const char *)na + o, _MM_HINT_T0);
          /* and the next column tile's B blocks, one per step of the second-last row tile */
          if (u + 1 < nt && t == (mt > 1 ? mt - 2 : 0)) {
            const int8_t *nb = bp + ((int64_t)(u + 1) * nblk + b) * XTE_AMX_BLOCK_BYTES;
            for (o = 0; o < XTE_AMX_BLOCK_BYTES; o += 64)
              _mm_prefetch((const char *)nb + o, _MM_HINT_T0);
          }
        }
        _tile_stored(0, c[0], 64);
        _tile_stored(1, c[1], 64);
        _tile_stored(2, c[2], 64);
        _tile_stored(3, c[3], 64);
        _tile_stored(4, c[4], 64);
        prev.w = w + (int64_t)t * 16 * ldw + u * 16;
        prev.sa = sa + ((int64_t)t * nblk + b) * 16;
        prev.sb = sb + ((int64_t)u * nblk + b) * 16;
        prev.na = nana[t * nblk + b];
        prev.nb = nanb[u * nblk + b];
        prev.zero = init && b == 0;
      }
  if (s > 0) {
    int r;
    for (r = 0; r < 16; r++) fold_row(&prev, cb[(s - 1) & 1], ldw, r);
  }
}

/* The extension's table, attached to the avx512 ISA table by src/cpu/isa.c where
 * xte_gemm_amx_usable(). */
const xte_gemm_amx_kernels xte_gemm_amx_table = {
    .pack_a = xte_gemm_amx_pack_a,
    .pack_b = xte_gemm_amx_pack_b,
    .pack_a_kn = xte_gemm_amx_pack_a_kn,
    .pack_b_kn = xte_gemm_amx_pack_b_kn,
    .begin = xte_gemm_amx_begin,
    .end = xte_gemm_amx_end,
    .tiles = xte_gemm_amx_tiles,
};
