/* The synthetic data of `xte moe` (tools/moe/) and of its expert-parallel run (tools/moe/ep.c):
 * one definition, so that both build the same weights from the same seed.
 *
 * Value i of a stream is uniform in [-1, 1) (24 bits, exact in fp32) times an fp32 magnitude:
 * a counter-based generator (splitmix64's mixer of key + i * golden), so any element can be
 * made on its own, by any thread, in any order, and every fill below gives the same bytes
 * whatever the threads or the vector width (integer arithmetic, one exact int -> float
 * conversion, one fp32 multiply). bf16 rounding: the library's xte_f32_to_bf16 (RNE).
 * The fill kernels follow the library's CPU ISA (xte_cpu_get_isa(): scalar -> plain C), so
 * `--isa scalar` also runs the plain-C generators here (the same bytes). */
#ifndef XTE_TOOLS_MOE_SYNTH_H
#define XTE_TOOLS_MOE_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "../../src/numerics/xte_numerics.h" /* bf16 and e4m3 conversions */
#include "xte/xte.h"

/* Streams of the synthetic tensors; expert e uses 16 + 2e (gate/up) and 17 + 2e (down).
 * S_LOGITS: ep.c's router logits (the one-process layer computes them with a gate GEMM). */
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

/* The expert weights are made in FP8 directly: no fp32 master weights exist. An expert's matrix
 * [N, K] (N, K multiples of 128; stream `stream`, key k = moe_stream_key(seed, stream)) is
 *   codes:  byte i = r * K + c is byte (i % 8) (little-endian: the low byte first) of
 *           u64 = moe_mix64(k + (i / 8) * golden); with u that byte, the e4m3 code is
 *           moe_e4m3_level(u & 127) | (u & 128): the sign uniform, the magnitude uniform over the
 *           128 levels (j + 0.5) * 3.5, j = 0..127 (1.75 .. 446.25, rounded to e4m3 by the
 *           library's RNE xte_f32_to_e4m3: never NaN, at most 448);
 *   scales: block (bi, bj) of the [N / 128, K / 128] grid takes level
 *           L = moe_mix64(moe_mix64(~k) + (bi * K / 128 + bj) * golden) >> 61 (0..7), and its
 *           scale_inv is the one xte_quantize (the weight's recipe, 128x128, default config)
 *           stores for a block of amax a_L = fp32(fp32(moe_w_scale(K) * (16 - L)) / 16), i.e.
 *           a_L = (1 .. 9/16) x moe_w_scale(K).
 * So a weight is v * scale_inv with |v| about uniform in [0, 448] and scale_inv about a_L / 448
 * (up to 2x that where the recipe rounds scales to powers of two): uniform in about
 * [-a_L, a_L], std about moe_w_scale(K) / sqrt(3) = 1 / sqrt(K) as the fp32 weights were, with
 * block scales that differ from block to block (a wrong scale index in a kernel shows). One
 * 64-bit hash per 8 weights; the same bytes on every ISA and thread count (integer arithmetic). */
uint8_t moe_e4m3_level(unsigned j); /* the code of level j (0..127), positive */

/* Kept for tools/moe/ep.c: the generation needs no fp32 stage any more (returns 16). */
size_t moe_weight_stage_floats(int64_t N, int64_t K);

/* One expert's weight matrix [N, K] (stream `stream`, as above) into slot g of the 128x128-block
 * weight stack W ([G * N, K], rowwise e4m3, COMPACT fp32 scales; W->recipe picks the scales),
 * on the bench team's threads (xte's pool size), each writing (and first touching) whole
 * 128-row blocks. stage is not used (may be NULL). */
xte_status moe_weight_expert(const xte_qtensor *W, int64_t g, int64_t N, int64_t K, float *stage,
                             uint64_t seed, uint64_t stream, xte_stream st);

/* The exact values of an [N, K] 128x128-block FP8 matrix (codes q, COMPACT scales s): out[i] =
 * (double)xte_e4m3_to_f32(q[i]) * (double)s[block] (exact in fp64: 4 x 24 significant bits). */
void moe_dequant_128(double *out, const uint8_t *q, const float *s, int64_t N, int64_t K);

#endif /* XTE_TOOLS_MOE_SYNTH_H */
