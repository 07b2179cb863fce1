/* The synthetic data of `xte moe` (tools/moe/) and of its expert-parallel run (tools/moe_ep.c):
 * one definition, so that both build the same weights from the same seed.
 *
 * Value i of a stream is uniform in [-1, 1) (24 bits, exact in fp32) times an fp32 magnitude:
 * a counter-based generator (splitmix64's mixer of key + i * golden), so any element can be
 * made on its own, by any thread, in any order, and every fill below gives the same bytes
 * whatever the threads or the vector width (integer arithmetic, one exact int -> float
 * conversion, one fp32 multiply). bf16 rounding: the library's xte_f32_to_bf16 (RNE). */
#ifndef XTE_TOOLS_MOE_SYNTH_H
#define XTE_TOOLS_MOE_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "../../src/numerics/xte_numerics.h" /* xte_f32_to_bf16, xte_bf16_to_f32 */
#include "xte/xte.h"

/* Streams of the synthetic tensors; expert e uses 16 + 2e (gate/up) and 17 + 2e (down).
 * S_LOGITS: moe_ep.c's router logits (the one-process layer computes them with a gate GEMM). */
enum { S_X = 1, S_WR, S_BIAS, S_DY, S_SGU, S_SD, S_LOGITS = 9, S_EXPERT0 = 16 };

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

/* The magnitude of a weight with this fan-in: uniform with std 1 / sqrt(fan_in). */
float moe_w_scale(int64_t fan_in);

/* Elements [0, n) of a stream into fp32, fp64 (the fp32 value, widened) or bf16 (RNE), on the
 * bench team's threads (xte's pool size) when n is large; vectorized where the CPU can. */
void moe_fill_f32(float *p, size_t n, uint64_t seed, uint64_t stream, float a);
void moe_fill_f64(double *p, size_t n, uint64_t seed, uint64_t stream, float a);
void moe_fill_bf16(uint16_t *p, size_t n, uint64_t seed, uint64_t stream, float a);

/* Floats of the stage moe_weight_expert needs for an [N, K] matrix: a strip of rows (a multiple
 * of 128, about 16 MiB of fp32, all N rows when fewer). */
size_t moe_weight_stage_floats(int64_t N, int64_t K);

/* One expert's weight matrix [N, K] (stream `stream`, magnitude moe_w_scale(K)) into slot g of
 * the 128x128-block weight stack W ([G * N, K], rowwise, COMPACT scales): strip by strip,
 * generated into stage (the team's threads) and quantized by xte_quantize (the library's
 * threaded call) while it is still in the cache. The 128x128 blocks are independent, so the
 * bytes are those of quantizing the whole matrix at once. */
xte_status moe_weight_expert(const xte_qtensor *W, int64_t g, int64_t N, int64_t K, float *stage,
                             uint64_t seed, uint64_t stream, xte_stream st);

#endif /* XTE_TOOLS_MOE_SYNTH_H */
