/* The synthetic data of `xte moe` (tools/cmd_moe.c) and of its expert-parallel run
 * (tools/moe_ep.c): one definition, so that both build the same weights from the same seed.
 * Value i of a stream is uniform in [-1, 1) (24 bits, exact in fp32) times an fp32 magnitude.
 * Header-only (static inline): the xte program's command files include it. */
#ifndef XTE_TOOLS_MOE_SYNTH_H
#define XTE_TOOLS_MOE_SYNTH_H

#include <stdint.h>
#include <string.h>

/* Streams of the synthetic tensors; expert e uses 16 + 2e and 17 + 2e. S_LOGITS: moe_ep.c's
 * router logits (cmd_moe.c computes them with a gate GEMM instead). */
enum { S_X = 1, S_WR, S_BIAS, S_DY, S_SGU, S_SD, S_LOGITS = 9, S_EXPERT0 = 16 };

static inline float moe_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t moe_f32_to_bf16(float f) { /* RNE; the values here are finite */
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline uint64_t moe_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The synthetic value i of the stream with this key, times a. */
static inline float moe_synth(uint64_t key, uint64_t i, float a) {
  uint64_t z = moe_mix64(key + i * 0x9E3779B97F4A7C15ull);
  float u = (float)((int32_t)(z >> 40) - (1 << 23)) * 0x1p-23f;
  return u * a;
}

static inline uint64_t moe_stream_key(uint64_t seed, uint64_t stream) {
  return moe_mix64(seed * 0xD1B54A32D192ED03ull + stream * 0x8CB92BA72F3D8DD7ull + 1);
}

#endif /* XTE_TOOLS_MOE_SYNTH_H */
