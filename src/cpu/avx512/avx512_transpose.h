/* In-register transposes for the AVX-512 kernels built with their own flags (src/cpu/amx,
 * src/cpu/vnni, src/cpu/avx512). Include only from files compiled with -mavx512f, or after SIMDe's
 * AVX-512 header with its native aliases (XTE_AVX512_SIMDE: the SIMDe build of
 * src/cpu/avx512/attention_avx512.c). */
#ifndef XTE_AVX512_TRANSPOSE_H
#define XTE_AVX512_TRANSPOSE_H

#ifndef XTE_AVX512_SIMDE
#include <immintrin.h>
#endif

/* x[c] = column c of the 16 x 16 dword matrix whose row r is x[r] (in registers: 64 shuffles). */
static inline void xte_transpose16x16_epi32(__m512i x[16]) {
  __m512i t[16], u[16];
  int i, j;
  for (i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
  }
  /* u[4 g + j], lane L: rows 4g .. 4g + 3 of column 4 L + j */
  for (i = 0; i < 4; i++) {
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (j = 0; j < 4; j++) {
    const __m512i va = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88); /* lanes 0, 2 */
    const __m512i vb = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    const __m512i wa = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD); /* lanes 1, 3 */
    const __m512i wb = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
    x[j] = _mm512_shuffle_i32x4(va, vb, 0x88);
    x[8 + j] = _mm512_shuffle_i32x4(va, vb, 0xDD);
    x[4 + j] = _mm512_shuffle_i32x4(wa, wb, 0x88);
    x[12 + j] = _mm512_shuffle_i32x4(wa, wb, 0xDD);
  }
}

#endif /* XTE_AVX512_TRANSPOSE_H */
