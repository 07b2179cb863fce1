/* The 16 x 16 byte-transpose network shared by the SIMD CPU kernels (AVX2 with 128-bit SSE
 * registers, AVX-512 with 128-bit or per-lane 512-bit registers). P is the intrinsic prefix
 * (_mm, _mm512): r[16] holds 16 source rows on entry; on exit r[i] holds source column i (per
 * 128-bit lane). t[16] is scratch of the same type. Only unpacks: the same network at any width. */
#ifndef XTE_TRANSPOSE_U8_NET_H
#define XTE_TRANSPOSE_U8_NET_H

#define XTE_TR16_NETWORK(P, r, t)                                         \
  do {                                                                    \
    int i_;                                                               \
    for (i_ = 0; i_ < 8; i_++) {                                          \
      t[i_] = P##_unpacklo_epi8(r[2 * i_], r[2 * i_ + 1]);                \
      t[i_ + 8] = P##_unpackhi_epi8(r[2 * i_], r[2 * i_ + 1]);            \
    }                                                                     \
    for (i_ = 0; i_ < 4; i_++) {                                          \
      r[i_] = P##_unpacklo_epi16(t[2 * i_], t[2 * i_ + 1]);               \
      r[i_ + 4] = P##_unpackhi_epi16(t[2 * i_], t[2 * i_ + 1]);           \
      r[i_ + 8] = P##_unpacklo_epi16(t[8 + 2 * i_], t[8 + 2 * i_ + 1]);   \
      r[i_ + 12] = P##_unpackhi_epi16(t[8 + 2 * i_], t[8 + 2 * i_ + 1]);  \
    }                                                                     \
    for (i_ = 0; i_ < 16; i_ += 4) {                                      \
      t[i_ + 0] = P##_unpacklo_epi32(r[i_ + 0], r[i_ + 1]);               \
      t[i_ + 1] = P##_unpackhi_epi32(r[i_ + 0], r[i_ + 1]);               \
      t[i_ + 2] = P##_unpacklo_epi32(r[i_ + 2], r[i_ + 3]);               \
      t[i_ + 3] = P##_unpackhi_epi32(r[i_ + 2], r[i_ + 3]);               \
    }                                                                     \
    for (i_ = 0; i_ < 16; i_ += 4) {                                      \
      r[i_ + 0] = P##_unpacklo_epi64(t[i_ + 0], t[i_ + 2]);               \
      r[i_ + 1] = P##_unpackhi_epi64(t[i_ + 0], t[i_ + 2]);               \
      r[i_ + 2] = P##_unpacklo_epi64(t[i_ + 1], t[i_ + 3]);               \
      r[i_ + 3] = P##_unpackhi_epi64(t[i_ + 1], t[i_ + 3]);               \
    }                                                                     \
  } while (0)

#endif /* XTE_TRANSPOSE_U8_NET_H */
