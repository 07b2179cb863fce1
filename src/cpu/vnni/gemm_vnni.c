/* AVX512-VNNI kernels of the exact GEMM for a few rows of A, e4m3 x e4m3
 * (src/cpu/vnni/gemm_vnni.h). Built with -mavx512vnni -mavx512vbmi on top of the AVX-512 flags; run
 * only where xte_gemm_vnni_usable().
 *
 * Bytes: the digits are those of xte_gemm_e4m3_digits (tables made from it; B's negative codes
 * take their magnitude's negated, with the offsets of gemm_vnni.h); per K block and output the
 * six Karatsuba products give the five weight sums (int32, modulo 2^32, exact: gemm_vnni.h),
 * folded as xte_gemm_digits_fold folds them, corrected for B's offsets, and the partial is
 * xte_gemm_digits_partial's ((double)(hi 2^14 + lo) * 2^-18, one RNE to fp32), the update
 * xte_gemm_block_update's (RNE fp32 scale product, one fused multiply-add): the bytes of the fp64
 * and AMX kernels. */
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/avx512/avx512_transpose.h"
#include "cpu/vnni/gemm_vnni.h"
#include "numerics/xte_gemm_digits.h"
#include "numerics/xte_gemm_numerics.h"

/* B's digit offsets (u_j = d_j + o_j >= 0) */
#define O0 64
#define O1 64
#define O2 14

static int8_t tab_a[3][256] __attribute__((aligned(64))); /* d_i of each code */
/* u_j = d_j + o_j of the codes 0..127; a negative code's digits are its magnitude's negated
 * (2 o_j - u_j); the NaN magnitude 0x7F has the marker 0xFF as u_2 (its digits are never used) */
static uint8_t tab_b[3][128] __attribute__((aligned(64)));
static int vnni_ok;
static pthread_once_t vnni_once = PTHREAD_ONCE_INIT;

static void vnni_init(void) {
  static const int off[3] = {O0, O1, O2};
  unsigned a, b, c, d;
  const char *env = getenv("XTE_CPU_VNNI");
  int i, j;
  for (i = 0; i < 256; i++) {
    int8_t dg[3];
    const int nan = xte_gemm_e4m3_digits((uint8_t)i, dg);
    for (j = 0; j < 3; j++) {
      tab_a[j][i] = dg[j];
      if (i < 128) tab_b[j][i] = (uint8_t)(nan && j == 2 ? 0xFF : dg[j] + off[j]);
    }
  }
  /* the pair sums of B's digits fit a byte for every non-NaN code (u_0 + u_1 <= 255: no code has
   * the magnitude digits d_0 = d_1 = -64), and d_0 = 0 for magnitudes >= 64, d_2 = 0 below (the
   * half tables of btabs); checked here, else these kernels stay off */
  for (i = 0; i < 256; i++) {
    const int t = i & 127, ng = i >> 7;
    int u[3];
    if (t == 127) continue;
    for (j = 0; j < 3; j++) u[j] = ng ? 2 * off[j] - tab_b[j][t] : tab_b[j][t];
    if (u[0] + u[1] > 255 || u[0] + u[2] > 255 || u[1] + u[2] > 255) return;
    if ((t >= 64 && tab_b[0][t] != O0) || (t < 64 && tab_b[2][t] != O2)) return;
  }
  if (env && !strcmp(env, "0")) return;
  if (__get_cpuid_max(0, NULL) < 7) return;
  __cpuid_count(7, 0, a, b, c, d);
  (void)a;
  (void)d;
  /* AVX512-VBMI (ECX 1), AVX512-VNNI (ECX 11), F (EBX 16), BW (EBX 30) */
  if (!((c >> 1) & 1) || !((c >> 11) & 1) || !((b >> 16) & 1) || !((b >> 30) & 1)) return;
  vnni_ok = 1;
}

int xte_gemm_vnni_usable(void) {
  pthread_once(&vnni_once, vnni_init);
  return vnni_ok;
}

/* A 256-entry byte table as 4 x 64 bytes (codes 0-63, 64-127, 128-191, 192-255) */
typedef struct {
  __m512i t[3][4];
} tabs;

static inline void load_tabs(tabs *T, const void *tab) {
  const char *p = (const char *)tab;
  int i, j;
  for (i = 0; i < 3; i++)
    for (j = 0; j < 4; j++) T->t[i][j] = _mm512_load_si512((const void *)(p + 256 * i + 64 * j));
}

/* The table entry of each of 64 codes, digit i (A: signed digits) */
static inline __m512i lookup(const tabs *T, int i, __m512i cd, __mmask64 neg) {
  const __m512i lo = _mm512_permutex2var_epi8(T->t[i][0], cd, T->t[i][1]);
  const __m512i hi = _mm512_permutex2var_epi8(T->t[i][2], cd, T->t[i][3]);
  return _mm512_mask_blend_epi8(neg, lo, hi);
}

static inline __mmask64 nan_codes(__m512i cd) {
  return _mm512_cmpeq_epi8_mask(_mm512_or_si512(cd, _mm512_set1_epi8((char)0x80)),
                                _mm512_set1_epi8((char)0xFF));
}

/* Codes [k0, k0 + 64) of a row holding kc codes along K, step 1 (zeros past kc) */
static inline __m512i load_codes(const uint8_t *row, int64_t k0, int64_t kc) {
  const int64_t rem = kc - k0;
  if (rem >= 64) return _mm512_loadu_si512((const void *)(row + k0));
  if (rem <= 0) return _mm512_setzero_si512();
  return _mm512_maskz_loadu_epi8((__mmask64)((1ull << rem) - 1), row + k0);
}

/* The six digit vectors of the dot products (gemm_vnni.h): x0, x1, x2, x0 + x1, x0 + x2, x1 + x2
 * (bytes, wrapping: only a NaN code's B digits can wrap, and those are never used) */
static inline void store6(int8_t *d, __m512i x0, __m512i x1, __m512i x2) {
  _mm512_store_si512((void *)d, x0);
  _mm512_store_si512((void *)(d + 128), x1);
  _mm512_store_si512((void *)(d + 256), x2);
  _mm512_store_si512((void *)(d + 384), _mm512_add_epi8(x0, x1));
  _mm512_store_si512((void *)(d + 512), _mm512_add_epi8(x0, x2));
  _mm512_store_si512((void *)(d + 640), _mm512_add_epi8(x1, x2));
}

/* ---------------------------------------------------------------- A */
static int32_t hsum_digits(__m512i d) {
  /* sum of 64 signed bytes: VPDPBUSD with unsigned ones */
  return _mm512_reduce_add_epi32(
      _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), d));
}

/* The offsets' share of lo and hi (gemm_vnni.h) from the block's digit sums D_i */
static void corrections(const int32_t D[3], int32_t *corr) {
  corr[0] = O0 * D[0] + 128 * (O1 * D[0] + O0 * D[1]);
  corr[1] =
      (O2 * D[0] + O1 * D[1] + O0 * D[2]) + 128 * (O2 * D[1] + O1 * D[2]) + 16384 * (O2 * D[2]);
}

void xte_gemm_vnni_pack_a(const uint8_t *src, int64_t rs, int64_t ks, int m, int64_t kc, int8_t *ap,
                          int32_t *corr, uint8_t *nan) {
  const int nblk = (int)((kc + 127) / 128);
  tabs T;
  int r, bl, i, h;
  pthread_once(&vnni_once, vnni_init);
  load_tabs(&T, tab_a);
  for (r = 0; r < m; r++) {
    const uint8_t *row = src + r * rs;
    for (bl = 0; bl < nblk; bl++) {
      int8_t *d = ap + ((int64_t)r * nblk + bl) * XTE_VNNI_BLOCK_BYTES;
      const int64_t k0 = (int64_t)bl * 128;
      int32_t D[3] = {0, 0, 0};
      int isnan = 0;
      for (h = 0; h < 2; h++) {
        __m512i cd;
        __mmask64 neg;
        if (ks == 1) {
          cd = load_codes(row, k0 + 64 * h, kc);
        } else {
          uint8_t tmp[64];
          int k;
          for (k = 0; k < 64; k++) {
            const int64_t kk = k0 + 64 * h + k;
            tmp[k] = kk < kc ? row[kk * ks] : 0;
          }
          cd = _mm512_loadu_si512((const void *)tmp);
        }
        neg = _mm512_movepi8_mask(cd);
        isnan |= nan_codes(cd) != 0;
        {
          __m512i v[3];
          for (i = 0; i < 3; i++) {
            v[i] = lookup(&T, i, cd, neg);
            D[i] += hsum_digits(v[i]);
          }
          /* d0, d1, d2, then the pair sums (|d0 + d1| <= 128: int8) */
          store6(d + 64 * h, v[0], v[1], v[2]);
        }
      }
      corrections(D, corr + 2 * ((int64_t)r * nblk + bl));
      nan[(int64_t)r * nblk + bl] = (uint8_t)isnan;
    }
  }
}

/* ---------------------------------------------------------------- strips of B */
/* B's tables and 2 o_j: u_0 of magnitudes 0..63 (u_0 = o_0 from 64 on: d_0 = 0), u_1 of 0..127
 * (2 x 64 bytes), u_2 of 64..127 (u_2 = o_2 below 64: d_2 = 0); both checked by vnni_init */
typedef struct {
  __m512i t0, t1[2], t2, o[3], two_o[3];
} btabs;

/* u_0, u_1, u_2 of 64 B codes; mark = max(mark, the magnitudes' u_2) (0xFF: a NaN code) */
static inline __attribute__((always_inline)) void b_digits(const btabs *T, __m512i cd, __m512i u[3],
                                                           __m512i *mark) {
  const __mmask64 neg = _mm512_movepi8_mask(cd), big = _mm512_movepi8_mask(_mm512_add_epi8(cd, cd));
  int i;
  /* the magnitude's u (VPERMB reads the index's low 6 bits, VPERMI2B 7; bit 6 picks the half) */
  u[0] = _mm512_mask_permutexvar_epi8(T->o[0], _knot_mask64(big), cd, T->t0);
  u[1] = _mm512_permutex2var_epi8(T->t1[0], cd, T->t1[1]);
  u[2] = _mm512_mask_permutexvar_epi8(T->o[2], big, cd, T->t2);
  *mark = _mm512_max_epu8(*mark, u[2]);
  /* 2 o - u if negative */
  for (i = 0; i < 3; i++) u[i] = _mm512_mask_sub_epi8(u[i], neg, T->two_o[i], u[i]);
}

/* lo = acc_0 + 2^7 acc_1, hi = acc_2 + 2^7 acc_3 + 2^14 acc_4 (xte_gemm_digits_fold) from the six
 * product sums P_00, P_11, P_22, P_01, P_02, P_12 (see rows_block) */
static inline void fold6(const __m512i p[6], __m512i *lo, __m512i *hi) {
  const __m512i acc1 = _mm512_sub_epi32(_mm512_sub_epi32(p[3], p[0]), p[1]);
  const __m512i acc2 = _mm512_add_epi32(_mm512_sub_epi32(_mm512_sub_epi32(p[4], p[0]), p[2]), p[1]);
  const __m512i acc3 = _mm512_sub_epi32(_mm512_sub_epi32(p[5], p[1]), p[2]);
  *lo = _mm512_add_epi32(p[0], _mm512_slli_epi32(acc1, 7));
  *hi = _mm512_add_epi32(_mm512_add_epi32(acc2, _mm512_slli_epi32(acc3, 7)),
                         _mm512_slli_epi32(p[2], 14));
}

/* The block update of one row of A over the strip's 16 columns from its folded sums (lane j:
 * column j): S = lo + 2^14 hi after the corrections, exact in int64; the partial as
 * xte_gemm_digits_partial ((float)((double)S * 2^-18), NaN where marked), then
 * xte_gemm_block_update (fmaf(p, RNE_fp32(sa * sb), w)). */
static inline void update16(__m512i lo, __m512i hi, const int32_t *corr, int nan_row,
                            __mmask16 nanb, float sa, const float *sb, float *w) {
  const __m512d sc = _mm512_set1_pd(0x1p-18);
  __m512i s0, s1;
  __m512 p;
  lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(corr[0]));
  hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(corr[1]));
  s0 = _mm512_add_epi64(_mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(hi)), 14),
                        _mm512_cvtepi32_epi64(_mm512_castsi512_si256(lo)));
  s1 = _mm512_add_epi64(
      _mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(hi, 1)), 14),
      _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(lo, 1)));
  p = _mm512_insertf32x8(
      _mm512_castps256_ps512(_mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtepi64_pd(s0), sc))),
      _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtepi64_pd(s1), sc)), 1);
  p = _mm512_mask_blend_ps(nan_row ? (__mmask16)0xFFFF : nanb, p,
                           _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
  _mm512_storeu_ps(w, _mm512_fmadd_ps(p, _mm512_mul_ps(_mm512_set1_ps(sa), _mm512_loadu_ps(sb)),
                                      _mm512_loadu_ps(w)));
}

/* R rows of A (row rr's block digits at a[rr]) against the strip's 16 columns over ng groups of
 * 4 k: lane j of P[6 rr + q] = the sum of the products of B digit vector q (bd, VNNI order:
 * [q][g][16][4] for u_0, u_1, u_2; the pair sums formed per group) and row rr's digit vector q
 * at those k (one dword, broadcast), for the six
 * products P_00 = d_0(a) u_0(b), P_11, P_22, P_01 = (d_0 + d_1)(a) (u_0 + u_1)(b), P_02, P_12
 * (Karatsuba): acc_0 = P_00, acc_1 = P_01 - P_00 - P_11, acc_2 = P_02 - P_00 - P_22 + P_11,
 * acc_3 = P_12 - P_11 - P_22, acc_4 = P_22, the sums of d_i(a) u_j(b) with i + j = w, modulo
 * 2^32 (gemm_vnni.h says why they are exact). Named accumulators (GCC spills arrays of them),
 * out of line (inlined, GCC stored them every iteration).
 *
 * VN_ROW: c<s>q += the VPDPBUSD products of v<q> (unsigned) and row r's dword of digit vector q
 * at group g broadcast (signed), the broadcast embedded in the instruction ({1to16}): GCC emits a
 * separate VPBROADCASTD for the intrinsic, an extra instruction per product; the six in one asm
 * statement (one per product: GCC copied each accumulator through another
 * register around it in the one-row kernel with the lookups, fused1). */
typedef int32_t vn_dword __attribute__((may_alias)); /* 4 digit bytes read as one operand */
#define VN_BC(r, q, g) (a[r] + 128 * q + 4 * (g))
/* B's digit vectors of group g: u_0, u_1, u_2 stored, the pair sums formed here (bytes; only a
 * NaN code's can wrap, and those are never used) */
#define VN_V(g)                                                               \
  const __m512i v0 = _mm512_load_si512((const void *)(bd + (g)*64)),          \
                v1 = _mm512_load_si512((const void *)(bd + (32 + (g)) * 64)), \
                v2 = _mm512_load_si512((const void *)(bd + (64 + (g)) * 64)), \
                v3 = _mm512_add_epi8(v0, v1), v4 = _mm512_add_epi8(v0, v2),   \
                v5 = _mm512_add_epi8(v1, v2)
/* the six products of group g for row r into the accumulators c<s>0..5 */
#define VN_ROW(s, r, g)                                                                     \
  __asm__(                                                                                  \
      "vpdpbusd %[m0]%{1to16%}, %[x0], %[a0]\n\t"                                           \
      "vpdpbusd %[m1]%{1to16%}, %[x1], %[a1]\n\t"                                           \
      "vpdpbusd %[m2]%{1to16%}, %[x2], %[a2]\n\t"                                           \
      "vpdpbusd %[m3]%{1to16%}, %[x3], %[a3]\n\t"                                           \
      "vpdpbusd %[m4]%{1to16%}, %[x4], %[a4]\n\t"                                           \
      "vpdpbusd %[m5]%{1to16%}, %[x5], %[a5]"                                               \
      : [a0] "+v"(c##s##0), [a1] "+v"(c##s##1), [a2] "+v"(c##s##2), [a3] "+v"(c##s##3),     \
        [a4] "+v"(c##s##4), [a5] "+v"(c##s##5)                                              \
      : [x0] "v"(v0), [x1] "v"(v1), [x2] "v"(v2), [x3] "v"(v3), [x4] "v"(v4), [x5] "v"(v5), \
        [m0] "m"(*(const vn_dword *)(const void *)VN_BC(r, 0, g)),                          \
        [m1] "m"(*(const vn_dword *)(const void *)VN_BC(r, 1, g)),                          \
        [m2] "m"(*(const vn_dword *)(const void *)VN_BC(r, 2, g)),                          \
        [m3] "m"(*(const vn_dword *)(const void *)VN_BC(r, 3, g)),                          \
        [m4] "m"(*(const vn_dword *)(const void *)VN_BC(r, 4, g)),                          \
        [m5] "m"(*(const vn_dword *)(const void *)VN_BC(r, 5, g)))
#define VN_DECL(r) \
  __m512i c##r##0 = z, c##r##1 = z, c##r##2 = z, c##r##3 = z, c##r##4 = z, c##r##5 = z
#define VN_OUT(r)                                                                             \
  P[6 * r] = c##r##0, P[6 * r + 1] = c##r##1, P[6 * r + 2] = c##r##2, P[6 * r + 3] = c##r##3, \
        P[6 * r + 4] = c##r##4, P[6 * r + 5] = c##r##5

static __attribute__((noinline)) void rows1(int ng, const int8_t *const *a, const int8_t *bd,
                                            __m512i *P) {
  const __m512i z = _mm512_setzero_si512();
  int g;
  VN_DECL(0);
  for (g = 0; g < ng; g++) {
    VN_V(g);
    VN_ROW(0, 0, g);
  }
  VN_OUT(0);
}

static __attribute__((noinline)) void rows2(int ng, const int8_t *const *a, const int8_t *bd,
                                            __m512i *P) {
  const __m512i z = _mm512_setzero_si512();
  int g;
  VN_DECL(0);
  VN_DECL(1);
  for (g = 0; g < ng; g++) {
    VN_V(g);
    VN_ROW(0, 0, g);
    VN_ROW(1, 1, g);
  }
  VN_OUT(0);
  VN_OUT(1);
}

/* One row of A with B's digits made on the way: per group, b_digits' lookups of the codes in
 * VNNI order (xt, vector g: k 4 g .. 4 g + 3 of every column) beside the six products, no digit
 * stored. One loop keeps the lookups' shuffles beside the VPDPBUSD chains (a pass storing the
 * digits, then rows1, runs them one after the other), which pays for one row only: with two rows
 * the chains already overlap, and more rows would remake the digits per pair. The tables as
 * locals (a btabs copy spilled). */
static __attribute__((noinline)) void fused1(int ng, const int8_t *const *a, const uint8_t *xt,
                                             const btabs *Tp, __m512i *P, __m512i *markp) {
  const __m512i z = _mm512_setzero_si512();
  const __m512i t0 = Tp->t0, t1a = Tp->t1[0], t1b = Tp->t1[1], t2 = Tp->t2, o0 = Tp->o[0],
                o2 = Tp->o[2], w0 = Tp->two_o[0], w1 = Tp->two_o[1], w2 = Tp->two_o[2];
  __m512i mark = *markp;
  int g;
  VN_DECL(0);
  for (g = 0; g < ng; g++) {
    /* b_digits, spelled out on the locals */
    const __m512i cd = _mm512_load_si512((const void *)(xt + g * 64));
    const __mmask64 neg = _mm512_movepi8_mask(cd),
                    big = _mm512_movepi8_mask(_mm512_add_epi8(cd, cd));
    __m512i v0 = _mm512_mask_permutexvar_epi8(o0, _knot_mask64(big), cd, t0),
            v1 = _mm512_permutex2var_epi8(t1a, cd, t1b),
            v2 = _mm512_mask_permutexvar_epi8(o2, big, cd, t2), v3, v4, v5;
    mark = _mm512_max_epu8(mark, v2);
    v0 = _mm512_mask_sub_epi8(v0, neg, w0, v0);
    v1 = _mm512_mask_sub_epi8(v1, neg, w1, v1);
    v2 = _mm512_mask_sub_epi8(v2, neg, w2, v2);
    v3 = _mm512_add_epi8(v0, v1);
    v4 = _mm512_add_epi8(v0, v2);
    v5 = _mm512_add_epi8(v1, v2);
    VN_ROW(0, 0, g);
  }
  VN_OUT(0);
  *markp = mark;
}

/* The block update of rows r0 .. r0 + R - 1 from their six product sums each (P) */
static void rows_fold(int R, int r0, int nblk, int bl, const int32_t *corr, const uint8_t *nana,
                      const float *sa, const __m512i *P, __mmask16 nanb, const float *sb, float *w,
                      int64_t ldw) {
  int rr;
  for (rr = 0; rr < R; rr++) {
    const int64_t rb = (int64_t)(r0 + rr) * nblk + bl;
    __m512i lo, hi;
    fold6(P + 6 * rr, &lo, &hi);
    update16(lo, hi, corr + 2 * rb, nana[rb], nanb, sa[rb], sb, w + (r0 + rr) * ldw);
  }
}

/* Rows r0 .. r0 + R - 1 (R = 1, 2) of the strip's block update, B's digits from bd */
static void rows_update(int R, int r0, int nblk, int bl, int ng, const int8_t *ap,
                        const int32_t *corr, const uint8_t *nana, const float *sa, const int8_t *bd,
                        __mmask16 nanb, const float *sb, float *w, int64_t ldw) {
  const int8_t *a[2];
  __m512i P[12];
  int rr;
  for (rr = 0; rr < R; rr++) a[rr] = ap + ((int64_t)(r0 + rr) * nblk + bl) * XTE_VNNI_BLOCK_BYTES;
  if (R == 2)
    rows2(ng, a, bd, P);
  else
    rows1(ng, a, bd, P);
  rows_fold(R, r0, nblk, bl, corr, nana, sa, P, nanb, sb, w, ldw);
}

/* column j holds a NaN code in the block: a byte of lane j of the marks is the marker */
static inline __mmask16 nan_columns(__m512i mark) {
  const __m512i hit = _mm512_movm_epi8(_mm512_cmpeq_epi8_mask(mark, _mm512_set1_epi8(-1)));
  return _mm512_test_epi32_mask(hit, hit);
}

void xte_gemm_vnni_strip(int m, int nblk, int64_t kc, const int8_t *ap, const int32_t *corr,
                         const uint8_t *nana, const float *sa, const uint8_t *b, int64_t ldb,
                         int nv, const float *sb, int8_t *bd, float *w, int64_t ldw) {
  btabs T;
  int bl, r, n, h, g;
  pthread_once(&vnni_once, vnni_init);
  T.t0 = _mm512_load_si512((const void *)tab_b[0]);
  T.t1[0] = _mm512_load_si512((const void *)tab_b[1]);
  T.t1[1] = _mm512_load_si512((const void *)(tab_b[1] + 64));
  T.t2 = _mm512_load_si512((const void *)(tab_b[2] + 64));
  T.o[0] = _mm512_set1_epi8(O0);
  T.o[1] = _mm512_set1_epi8(O1);
  T.o[2] = _mm512_set1_epi8(O2);
  T.two_o[0] = _mm512_set1_epi8(2 * O0);
  T.two_o[1] = _mm512_set1_epi8(2 * O1);
  T.two_o[2] = _mm512_set1_epi8(2 * O2);
  for (bl = 0; bl < nblk; bl++) {
    const int64_t k0 = (int64_t)bl * 128;
    const int kl = (int)(kc - k0 < 128 ? kc - k0 : 128), ng = (kl + 3) / 4;
    __m512i mark = _mm512_setzero_si512();
    __mmask16 nanb;
    /* B's digits in VNNI order: rows n < nv of 64 k, transposed as 16 x 16 dwords (vector g:
     * k 4 g .. 4 g + 3 of every column), then the digit vectors (one row of A: the codes, made
     * into digits by fused1); missing rows are zero codes */
    for (h = 0; h < (kl + 63) / 64; h++) {
      __m512i x[16];
      for (n = 0; n < 16; n++) {
        const uint8_t *row = b + n * ldb;
        if (n >= nv) {
          x[n] = _mm512_setzero_si512();
          continue;
        }
#ifndef XTE_VNNI_NO_PREFETCH
        _mm_prefetch((const char *)(row + k0 + 64 * h + 512), _MM_HINT_T0);
#endif
        x[n] = load_codes(row, k0 + 64 * h, kc);
      }
      xte_transpose16x16_epi32(x);
      for (g = 0; g < 16; g++) {
        __m512i u[3];
        int8_t *d = bd + (16 * h + g) * 64;
        if (m == 1) { /* the codes, for fused1 */
          _mm512_store_si512((void *)d, x[g]);
          continue;
        }
        b_digits(&T, x[g], u, &mark);
        _mm512_store_si512((void *)d, u[0]);
        _mm512_store_si512((void *)(d + 32 * 64), u[1]);
        _mm512_store_si512((void *)(d + 64 * 64), u[2]);
      }
    }
    if (m == 1) {
      const int8_t *a0 = ap + (int64_t)bl * XTE_VNNI_BLOCK_BYTES;
      __m512i P[6];
      fused1(ng, &a0, (const uint8_t *)bd, &T, P, &mark);
      nanb = nan_columns(mark);
      rows_fold(1, 0, nblk, bl, corr, nana, sa, P, nanb, sb + bl * 16, w, ldw);
      continue;
    }
    nanb = nan_columns(mark);
    /* rows in pairs (a four-row kernel issues more loads per product: docs/performance.md) */
    for (r = 0; r + 2 <= m; r += 2)
      rows_update(2, r, nblk, bl, ng, ap, corr, nana, sa, bd, nanb, sb + bl * 16, w, ldw);
    if (r < m) rows_update(1, r, nblk, bl, ng, ap, corr, nana, sa, bd, nanb, sb + bl * 16, w, ldw);
  }
}

/* The extension's table, attached to the avx512 ISA table by src/cpu/isa.c where
 * xte_gemm_vnni_usable(). */
const xte_gemm_vnni_kernels xte_gemm_vnni_table = {
    .pack_a = xte_gemm_vnni_pack_a,
    .strip = xte_gemm_vnni_strip,
};
