/* xte_cast from and to E8M0 (docs/numerics.md, sections 2-3), against oracles written here:
 *  - decode: all 256 codes to fp32, bf16, fp16, e4m3, e5m2 (saturating and not) and back to E8M0;
 *    2^(e - 127) made in fp64 by repeated halving / doubling, the narrow formats' codes found by a
 *    search over every code's value (nearest, ties to the even code, the overflow rules of the
 *    format), not by bit arithmetic;
 *  - encode (fp32, bf16, fp16, e4m3, e5m2 -> E8M0): the nearest of the 255 powers of two
 *    2^-127 .. 2^127 by comparing fp64 distances, a tie going to the larger one (ml_dtypes'
 *    float8_e8m0fnu); zero, negatives, NaN -> 0xFF; past 2^127 (and +inf) -> 0xFE saturating,
 *    0xFF not. Inputs: every fp32 exponent with the significands around the ties, every 65537th
 *    fp32 bit pattern, every fp32 subnormal around 2^-127 and 1.5 * 2^-127, all bf16 / fp16 /
 *    e4m3 / e5m2 codes.
 * On every ISA this machine runs (or the one XTE_CPU_ISA names): the 16-bit inputs go through the
 * ISA's conversion kernels. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xte/xte.h>

/* ------------------------------------------------------------------ oracles */

static double pow2d(int k) {
  double v = 1.0;
  for (; k > 0; k--) v *= 2.0;
  for (; k < 0; k++) v *= 0.5;
  return v;
}

/* value of a code of a binary format with eb exponent and mb significand bits (bias 2^(eb-1) - 1,
 * no special codes: the caller keeps to the finite ones) */
static double code_value(uint32_t code, int eb, int mb) {
  int bias = (1 << (eb - 1)) - 1;
  uint32_t e = (code >> mb) & ((1u << eb) - 1u), f = code & ((1u << mb) - 1u);
  double v = e == 0 ? (double)f * pow2d(1 - bias - mb)
                    : (double)((1u << mb) + f) * pow2d((int)e - bias - mb);
  return (code >> (eb + mb)) & 1u ? -v : v;
}

typedef struct fmt {
  int eb, mb;
  uint32_t maxcode; /* largest finite positive code */
  int kind;         /* 0: IEEE (overflow -> inf = maxcode + 1), 1: e4m3fn, 2: e5m2 */
} fmt;

static const fmt F_BF16 = {8, 7, 0x7F7F, 0}, F_FP16 = {5, 10, 0x7BFF, 0}, F_E4M3 = {4, 3, 0x7E, 1},
                 F_E5M2 = {5, 2, 0x7B, 2};

/* nearest code to v >= 0 by binary search over the finite codes plus the one past the max (its
 * value: max + one ulp of the top binade), ties to the even code; -1: past the max */
static int64_t nearest_code(double v, const fmt *f) {
  uint32_t lo = 0, hi = f->maxcode + 1;
  double top = code_value(f->maxcode, f->eb, f->mb);
  double over = top + (top - code_value(f->maxcode - 1, f->eb, f->mb));
  double vlo, vhi;
  if (v >= over) return -1;
  while (hi - lo > 1) { /* value(lo) <= v < value(hi) */
    uint32_t mid = (lo + hi) / 2;
    if (code_value(mid, f->eb, f->mb) <= v)
      lo = mid;
    else
      hi = mid;
  }
  vlo = code_value(lo, f->eb, f->mb);
  vhi = hi > f->maxcode ? over : code_value(hi, f->eb, f->mb);
  if (v - vlo < vhi - v) return lo;
  if (v - vlo > vhi - v) return hi > f->maxcode ? -1 : (int64_t)hi;
  if (lo % 2 == 0) return lo;
  return hi > f->maxcode ? -1 : (int64_t)hi;
}

/* the code of +v (a positive power of two or NaN) in format f */
static uint32_t encode_pos(double v, const fmt *f, int sat) {
  int64_t c;
  if (isnan(v))
    return f->kind == 0 ? (f->eb == 8 ? 0x7FC0u : 0x7E00u) : (f->kind == 1 ? 0x7Fu : 0x7Eu);
  c = nearest_code(v, f);
  if (c >= 0) return (uint32_t)c;
  if (f->kind == 0) return f->maxcode + 1; /* inf */
  if (sat) return f->maxcode;
  return f->kind == 1 ? 0x7Fu : 0x7Cu;
}

static int is_nan_code(uint32_t c, const fmt *f) {
  uint32_t a = c & ~(1u << (f->eb + f->mb));
  if (f->kind == 1) return a == 0x7F;
  return a > ((((1u << f->eb) - 1u)) << f->mb);
}

/* E8M0 of the value v (fp64, exact), the rule stated in the header: the first power of two
 * above v and the one below it, compared by distance */
static uint8_t e8m0_of(double v, int sat) {
  static double p2[256];
  int c;
  if (p2[0] == 0.0)
    for (c = 0; c < 256; c++) p2[c] = pow2d(c - 127);
  if (isnan(v) || v <= 0.0 || signbit(v)) return 0xFF;
  if (isinf(v)) return sat ? 0xFE : 0xFF;
  if (v >= 1.5 * p2[254]) return sat ? 0xFE : 0xFF;
  for (c = 0; c < 254; c++) {
    double lo = p2[c], hi = p2[c + 1];
    if (v < hi) return (uint8_t)(v - lo < hi - v || v < lo ? c : c + 1);
  }
  return 0xFE;
}

/* ------------------------------------------------------------------ helpers */

static float bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t f_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static xte_status cast(void *in, xte_dtype di, void *out, xte_dtype dout, int64_t n, int sat) {
  xte_tensor x = xte_tensor_1d(in, di, n), y = xte_tensor_1d(out, dout, n);
  return xte_cast(&x, &y, sat, NULL);
}

/* Sweeps the ISAs (only XTE_CPU_ISA's when set); returns how many ran */
typedef void (*isa_body)(const char *isa);
static int for_each_isa(isa_body body) {
  const xte_cpu_isa saved = xte_cpu_get_isa();
  const char *env = getenv("XTE_CPU_ISA");
  int i, ran = 0;
  for (i = 0; i < XTE_CPU_ISA_COUNT; i++) {
    const char *name = xte_cpu_isa_name((xte_cpu_isa)i);
    if (env && *env && strcmp(env, name) != 0) continue;
    if (xte_cpu_set_isa((xte_cpu_isa)i) != XTE_SUCCESS) {
      printf("isa %s not available here: not swept\n", name);
      continue;
    }
    body(name);
    ran++;
  }
  xte_cpu_set_isa(saved);
  return ran;
}

/* ------------------------------------------------------------------ decode */

static void decode_all(const char *isa) {
  uint8_t codes[256], back[256], q[256];
  float f32[256];
  uint16_t h[256];
  int c, sat;
  for (c = 0; c < 256; c++) codes[c] = (uint8_t)c;
  cr_assert_eq(cast(codes, XTE_DTYPE_E8M0, f32, XTE_DTYPE_FP32, 256, 1), XTE_SUCCESS, "%s",
               xte_last_error());
  for (c = 0; c < 256; c++) {
    if (c == 255)
      cr_expect(isnan(f32[c]), "%s: e8m0 0xFF -> %a, want NaN", isa, (double)f32[c]);
    else
      cr_expect((double)f32[c] == pow2d(c - 127) && !signbit(f32[c]),
                "%s: e8m0 %d -> %a, want 2^%d", isa, c, (double)f32[c], c - 127);
  }
  /* 16-bit formats */
  {
    const fmt *fs[2] = {&F_BF16, &F_FP16};
    const xte_dtype ds[2] = {XTE_DTYPE_BF16, XTE_DTYPE_FP16};
    int k;
    for (k = 0; k < 2; k++) {
      cr_assert_eq(cast(codes, XTE_DTYPE_E8M0, h, ds[k], 256, 1), XTE_SUCCESS);
      for (c = 0; c < 256; c++) {
        double v = c == 255 ? NAN : pow2d(c - 127);
        uint32_t want = encode_pos(v, fs[k], 1);
        if (c == 255)
          cr_expect(is_nan_code(h[c], fs[k]), "%s: e8m0 0xFF -> %s 0x%04X, want NaN", isa,
                    xte_dtype_name(ds[k]), h[c]);
        else
          cr_expect_eq(h[c], want, "%s: e8m0 %d -> %s 0x%04X, want 0x%04X", isa, c,
                       xte_dtype_name(ds[k]), h[c], want);
      }
    }
  }
  /* fp8, saturating and not */
  for (sat = 0; sat < 2; sat++) {
    const fmt *fs[2] = {&F_E4M3, &F_E5M2};
    const xte_dtype ds[2] = {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2};
    int k;
    for (k = 0; k < 2; k++) {
      cr_assert_eq(cast(codes, XTE_DTYPE_E8M0, q, ds[k], 256, sat), XTE_SUCCESS);
      for (c = 0; c < 256; c++) {
        if (c == 255) {
          cr_expect(is_nan_code(q[c], fs[k]), "%s: e8m0 0xFF -> %s 0x%02X, want NaN", isa,
                    xte_dtype_name(ds[k]), q[c]);
        } else {
          uint32_t want = encode_pos(pow2d(c - 127), fs[k], sat);
          cr_expect_eq(q[c], want, "%s: e8m0 %d -> %s sat %d: 0x%02X, want 0x%02X", isa, c,
                       xte_dtype_name(ds[k]), sat, q[c], want);
        }
      }
    }
  }
  /* E8M0 -> E8M0 is the identity (both saturation rules) */
  for (sat = 0; sat < 2; sat++) {
    cr_assert_eq(cast(codes, XTE_DTYPE_E8M0, back, XTE_DTYPE_E8M0, 256, sat), XTE_SUCCESS);
    cr_expect_eq(memcmp(back, codes, 256), 0, "%s: e8m0 -> e8m0 sat %d changed a code", isa, sat);
  }
}

Test(cast_e8m0, decode_every_code) {
  cr_expect_gt(for_each_isa(decode_all), 0);
}

/* ------------------------------------------------------------------ encode */

static long enc_fail;

static void check_enc(const char *isa, const char *what, const float *x, const uint8_t *got,
                      int64_t n, int sat) {
  int64_t i;
  for (i = 0; i < n; i++) {
    uint8_t want = e8m0_of((double)x[i], sat);
    if (got[i] != want && enc_fail++ < 10)
      cr_log_error("%s: %s sat %d: %a (0x%08X) -> 0x%02X, want 0x%02X", isa, what, sat,
                   (double)x[i], f_bits(x[i]), got[i], want);
  }
}

static void encode_fp32(const char *isa) {
  static const uint32_t mants[] = {0,        1,        0x1FFFFF, 0x3FFFFF, 0x400000,
                                   0x400001, 0x5FFFFF, 0x600000, 0x600001, 0x7FFFFF};
  const int64_t nm = sizeof mants / sizeof mants[0];
  int64_t n = 512 * nm + 65536 + 8192 + 16, i = 0, j;
  uint32_t *u = malloc(sizeof(uint32_t) * (size_t)n), e, s;
  uint8_t *got = malloc((size_t)n);
  int sat;
  cr_assert(u && got);
  for (s = 0; s < 2; s++) /* every exponent (0: subnormals, 255: inf / NaN), both signs */
    for (e = 0; e < 256; e++)
      for (j = 0; j < nm; j++) u[i++] = s << 31 | e << 23 | mants[j];
  for (j = 0; j < 65536; j++) u[i++] = (uint32_t)(j * 65537u + 12345u); /* a stride */
  for (j = 0; j < 4096; j++) { /* subnormals around 2^-127 and 1.5 * 2^-127 */
    u[i++] = 0x400000u - 2048u + (uint32_t)j;
    u[i++] = 0x600000u - 2048u + (uint32_t)j;
  }
  for (j = 0; j < 16; j++) /* around 1.5 * 2^127 and FLT_MAX */
    u[i++] = (j < 8 ? 0x7F3FFFFCu : 0x7F7FFFF8u) + (uint32_t)(j % 8);
  cr_assert_eq(i, n);
  for (sat = 0; sat < 2; sat++) {
    cr_assert_eq(cast(u, XTE_DTYPE_FP32, got, XTE_DTYPE_E8M0, n, sat), XTE_SUCCESS, "%s",
                 xte_last_error());
    check_enc(isa, "fp32", (const float *)u, got, n, sat);
  }
  free(u);
  free(got);
}

static void encode_narrow(const char *isa) {
  uint16_t *h = malloc(2 * 65536);
  float *x = malloc(4 * 65536);
  uint8_t *q = malloc(256), *got = malloc(65536);
  int64_t j;
  int sat, k;
  xte_status st;
  cr_assert(h && x && q && got);
  for (j = 0; j < 65536; j++) h[j] = (uint16_t)j;
  for (j = 0; j < 256; j++) q[j] = (uint8_t)j;
  for (sat = 0; sat < 2; sat++) {
    /* bf16: its value is the fp32 of its bits << 16 */
    cr_assert_eq(cast(h, XTE_DTYPE_BF16, got, XTE_DTYPE_E8M0, 65536, sat), XTE_SUCCESS);
    for (j = 0; j < 65536; j++) x[j] = bits_f((uint32_t)j << 16);
    check_enc(isa, "bf16", x, got, 65536, sat);
    /* fp16: value from the format definition */
    cr_assert_eq(cast(h, XTE_DTYPE_FP16, got, XTE_DTYPE_E8M0, 65536, sat), XTE_SUCCESS);
    for (j = 0; j < 65536; j++) {
      uint32_t e = ((uint32_t)j >> 10) & 31u;
      double v = e == 31 ? ((j & 0x3FF) ? NAN : INFINITY) : code_value((uint32_t)j & 0x7FFF, 5, 10);
      x[j] = (float)((j & 0x8000) ? -v : v);
    }
    check_enc(isa, "fp16", x, got, 65536, sat);
    /* e4m3 and e5m2 */
    for (k = 0; k < 2; k++) {
      const fmt *f = k ? &F_E5M2 : &F_E4M3;
      st = cast(q, k ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3, got, XTE_DTYPE_E8M0, 256, sat);
      cr_assert_eq(st, XTE_SUCCESS);
      for (j = 0; j < 256; j++) {
        uint32_t a = (uint32_t)j & 0x7F;
        double v;
        if (k == 0)
          v = a == 0x7F ? NAN : code_value(a, 4, 3);
        else
          v = a > 0x7C ? NAN : (a == 0x7C ? INFINITY : code_value(a, 5, 2));
        x[j] = (float)((j & 0x80) ? -v : v);
      }
      (void)f;
      check_enc(isa, k ? "e5m2" : "e4m3", x, got, 256, sat);
    }
  }
  free(h);
  free(x);
  free(q);
  free(got);
}

Test(cast_e8m0, encode) {
  enc_fail = 0;
  cr_expect_gt(for_each_isa(encode_fp32), 0);
  cr_expect_gt(for_each_isa(encode_narrow), 0);
  cr_expect_eq(enc_fail, 0, "%ld codes differ", enc_fail);
}

/* The oracle's own anchors (values ml_dtypes gives for float8_e8m0fnu) */
Test(cast_e8m0, oracle_anchors) {
  cr_expect_eq(e8m0_of(1.0, 0), 0x7F);
  cr_expect_eq(e8m0_of(1.5, 0), 0x80);
  cr_expect_eq(e8m0_of(1.4999, 0), 0x7F);
  cr_expect_eq(e8m0_of(3.0, 0), 0x81);
  cr_expect_eq(e8m0_of(0.75, 0), 0x7F);
  cr_expect_eq(e8m0_of(0.0, 1), 0xFF);
  cr_expect_eq(e8m0_of(-0.0, 1), 0xFF);
  cr_expect_eq(e8m0_of(-2.0, 1), 0xFF);
  cr_expect_eq(e8m0_of(pow2d(-149), 0), 0x00);
  cr_expect_eq(e8m0_of(1.5 * pow2d(-127), 0), 0x01);
  cr_expect_eq(e8m0_of(1.2 * pow2d(-127), 0), 0x00);
  cr_expect_eq(e8m0_of(pow2d(127), 0), 0xFE);
  cr_expect_eq(e8m0_of(1.5 * pow2d(127), 0), 0xFF);
  cr_expect_eq(e8m0_of(1.5 * pow2d(127), 1), 0xFE);
  cr_expect_eq(e8m0_of(INFINITY, 0), 0xFF);
  cr_expect_eq(e8m0_of(INFINITY, 1), 0xFE);
  cr_expect_eq(encode_pos(pow2d(-10), &F_E4M3, 1), 0x00); /* half the smallest subnormal: even */
  cr_expect_eq(encode_pos(pow2d(9), &F_E4M3, 1), 0x7E);   /* 512 > 464 */
  cr_expect_eq(encode_pos(pow2d(16), &F_E5M2, 0), 0x7C);  /* 65536 >= 61440: inf */
  cr_expect_eq(encode_pos(pow2d(-25), &F_FP16, 1), 0x0000);
  cr_expect_eq(encode_pos(pow2d(16), &F_FP16, 1), 0x7C00);
  cr_expect_eq(encode_pos(pow2d(-127), &F_BF16, 1), 0x0040);
}
