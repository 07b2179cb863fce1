/* FP8 codes to their fp16 images with AVX2 integer steps, for the FAST small-M kernels'
 * decoders (src/cpu/gemm_fast_small_template.h): e4m3 to value * 2^-8 (sign and the 7 low bits
 * moved into place; the NaN codes made the fp16 NaN 0x7E00), e5m2 to its value (the code is the
 * fp16's top byte). vcvtph2ps then gives the fp32 values, exactly. */
#ifndef XTE_CPU_FP8_F16_IMAGE_H
#define XTE_CPU_FP8_F16_IMAGE_H

#include <immintrin.h>
#include <stdint.h>

/* 16 codes at p to their fp16 images */
static inline __attribute__((always_inline)) __m256i xte_fp8_f16_image16(const uint8_t *p, int e4) {
  const __m128i x = _mm_loadu_si128((const __m128i *)p);
  __m256i h;
  if (e4) {
    h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(x), 7),
                         _mm256_set1_epi16((short)0xBF80));
    h = _mm256_blendv_epi8(h, _mm256_set1_epi16(0x7E00),
                           _mm256_cmpeq_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)),
                                              _mm256_set1_epi16(0x3F80)));
  } else {
    h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(x), 8);
  }
  return h;
}

#endif /* XTE_CPU_FP8_F16_IMAGE_H */
