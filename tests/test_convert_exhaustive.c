/* Exhaustive conversion test: every one of the 2^32 fp32 bit patterns through xte_cast to e4m3
 * and e5m2 (saturating and not), bf16 and fp16, on every CPU ISA this machine runs, compared with
 * an oracle written here from the format definitions: exact integer round-to-nearest-even on the
 * significand (decompose, shift, compare the remainder with the half), then the overflow and NaN
 * rules of the contract. The oracle knows nothing of the library's bit tricks.
 *
 * Also exhaustive over the small input types: every bf16 / fp16 pattern and every fp8 byte cast
 * to every other type. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xte/xte.h>

/* ------------------------------------------------------------------ the oracle */

/* A binary floating-point format: m stored mantissa bits, minimum normal exponent emin, bias. */
typedef struct ofmt {
  int m, emin, bias;
} ofmt;

static const ofmt F_E4M3 = {3, -6, 7};
static const ofmt F_E5M2 = {2, -14, 15};
static const ofmt F_BF16 = {7, -126, 127};
static const ofmt F_FP16 = {10, -14, 15};

/* a: the bits of a finite, non-negative fp32. Returns the magnitude code (exponent field << m |
 * mantissa field) of RNE(a) in format f, as an integer that may lie past the format's largest
 * finite code: the caller applies the overflow rule. */
static uint32_t oracle_round(uint32_t a, ofmt f) {
  uint32_t E = a >> 23, frac = a & 0x7FFFFFu;
  uint64_t sig, n;
  int exp, fl, qexp;
  if (a == 0) return 0;
  if (E == 0) {
    sig = frac;
    exp = -149;
  } else {
    sig = frac | 0x800000u;
    exp = (int)E - 150;
  }
  /* |x| = sig * 2^exp; floor(log2 |x|) */
  fl = exp + 63 - __builtin_clzll(sig);
  /* the quantum (ulp) of the target format at |x| */
  qexp = (fl > f.emin ? fl : f.emin) - f.m;
  if (qexp <= exp) {
    n = sig << (exp - qexp);
  } else {
    int sh = qexp - exp;
    if (sh > 40) {
      n = 0; /* sig < 2^24 is below half a quantum */
    } else {
      uint64_t rem = sig & ((1ull << sh) - 1), half = 1ull << (sh - 1);
      n = sig >> sh;
      if (rem > half || (rem == half && (n & 1u))) n++;
    }
  }
  if (n == 0) return 0;
  if (n == (1ull << (f.m + 1))) { /* rounding carried into the next binade */
    n >>= 1;
    qexp++;
  }
  if (n < (1ull << f.m)) return (uint32_t)n; /* subnormal: exponent field 0 */
  return ((uint32_t)(qexp + f.m + f.bias) << f.m) | (uint32_t)(n - (1ull << f.m));
}

/* fp32 -> fp8 under the contract: RNE, then a result past max (or an inf input) saturates to
 * max or becomes NaN (e4m3) / inf (e5m2); NaN -> e4m3 0x7F / e5m2 0x7E with the sign kept. */
static uint8_t oracle_e4m3(uint32_t u, int sat) {
  uint32_t s = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu, c;
  if (a > 0x7F800000u) return (uint8_t)(s | 0x7Fu);
  c = a == 0x7F800000u ? 0x100u : oracle_round(a, F_E4M3);
  if (c > 0x7Eu) c = sat ? 0x7Eu : 0x7Fu;
  return (uint8_t)(s | c);
}

static uint8_t oracle_e5m2(uint32_t u, int sat) {
  uint32_t s = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu, c;
  if (a > 0x7F800000u) return (uint8_t)(s | 0x7Eu);
  c = a == 0x7F800000u ? 0x100u : oracle_round(a, F_E5M2);
  if (c > 0x7Bu) c = sat ? 0x7Bu : 0x7Cu;
  return (uint8_t)(s | c);
}

/* fp32 -> bf16: RNE, overflow to inf, NaN -> (bits >> 16) | 0x40. */
static uint16_t oracle_bf16(uint32_t u) {
  uint32_t s = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu, c;
  if (a > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
  c = a == 0x7F800000u ? 0x7F80u : oracle_round(a, F_BF16);
  if (c > 0x7F7Fu) c = 0x7F80u;
  return (uint16_t)(s | c);
}

/* fp32 -> fp16: RNE, overflow to inf, NaN -> quiet NaN keeping the top 10 payload bits. */
static uint16_t oracle_fp16(uint32_t u) {
  uint32_t s = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu, c;
  if (a > 0x7F800000u) return (uint16_t)(s | 0x7E00u | ((a >> 13) & 0x3FFu));
  c = a == 0x7F800000u ? 0x7C00u : oracle_round(a, F_FP16);
  if (c > 0x7BFFu) c = 0x7C00u;
  return (uint16_t)(s | c);
}

/* Decodes a code of a format with m mantissa bits, ebits exponent bits and the given bias to
 * fp32 bits (exact: every value of these formats is an fp32), from the definition
 * (-1)^s * 2^(e - bias) * 1.f, subnormals 2^(1 - bias) * 0.f. e4m3fn has no inf: only its
 * all-ones code is NaN. *nan is set for NaN codes (whose payload the contract leaves open). */
static uint32_t oracle_decode(uint32_t code, int m, int ebits, int bias, int e4m3fn, int *nan) {
  uint32_t sgn = (code >> (m + ebits)) & 1u, e = (code >> m) & ((1u << ebits) - 1u),
           f = code & ((1u << m) - 1u), emax = (1u << ebits) - 1u;
  float v;
  uint32_t bits;
  *nan = 0;
  if (e4m3fn ? (e == emax && f == (1u << m) - 1u) : (e == emax && f != 0)) {
    *nan = 1;
    return (sgn << 31) | 0x7FC00000u;
  }
  if (!e4m3fn && e == emax) return (sgn << 31) | 0x7F800000u;
  if (e == 0)
    v = (float)ldexp((double)f, 1 - bias - m);
  else
    v = (float)ldexp((double)((1u << m) | f), (int)e - bias - m);
  memcpy(&bits, &v, 4);
  return (sgn << 31) | bits;
}

/* ------------------------------------------------------------------ sweep state */

#define CHUNK (1u << 22)
#define NCHUNKS_POS (1u << 9) /* 2^31 / CHUNK: the non-negative half */

enum { O_E4M3_SAT, O_E4M3_RAW, O_E5M2_SAT, O_E5M2_RAW, O_BF16, O_FP16, NOUT };
static const char *out_name[NOUT] = {"e4m3 sat",    "e4m3 nonsat", "e5m2 sat",
                                     "e5m2 nonsat", "bf16",        "fp16"};

typedef struct oracle_job {
  const uint32_t *in;
  uint8_t *o8[4];
  uint16_t *o16[2];
  size_t b, e;
} oracle_job;

static void *oracle_worker(void *p) {
  oracle_job *j = (oracle_job *)p;
  size_t i;
  for (i = j->b; i < j->e; i++) {
    uint32_t u = j->in[i];
    j->o8[0][i] = oracle_e4m3(u, 1);
    j->o8[1][i] = oracle_e4m3(u, 0);
    j->o8[2][i] = oracle_e5m2(u, 1);
    j->o8[3][i] = oracle_e5m2(u, 0);
    j->o16[0][i] = oracle_bf16(u);
    j->o16[1][i] = oracle_fp16(u);
  }
  return NULL;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static size_t out_size(int o) {
  return o >= O_BF16 ? 2 : 1;
}

static xte_dtype out_dtype(int o) {
  static const xte_dtype d[NOUT] = {XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, XTE_DTYPE_E5M2,
                                    XTE_DTYPE_E5M2, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  return d[o];
}

/* Reports up to a few mismatches of one output; returns the number of mismatching elements. */
static uint64_t report(const char *isa, int o, const uint32_t *in, const void *got,
                       const void *want, size_t n) {
  uint64_t bad = 0;
  size_t i;
  for (i = 0; i < n; i++) {
    uint32_t g = out_size(o) == 1 ? ((const uint8_t *)got)[i] : ((const uint16_t *)got)[i];
    uint32_t w = out_size(o) == 1 ? ((const uint8_t *)want)[i] : ((const uint16_t *)want)[i];
    if (g != w) {
      if (bad < 5)
        cr_log_error("%s %s: fp32 0x%08X -> 0x%X, want 0x%X", isa, out_name[o], in[i], g, w);
      bad++;
    }
  }
  return bad;
}

Test(convert, fp32_all_bit_patterns, .timeout = 3000) {
  uint32_t *in = malloc((size_t)CHUNK * 4);
  void *want[NOUT], *got[NOUT];
  uint64_t bad[XTE_CPU_ISA_COUNT][NOUT];
  int isa_ok[XTE_CPU_ISA_COUNT];
  double t0 = now_s(), t_oracle = 0.0, t_lib[XTE_CPU_ISA_COUNT];
  xte_cpu_isa saved = xte_cpu_get_isa();
  uint32_t c;
  int o, isa, sign;
  uint64_t total_bad = 0;
  cr_assert_not_null(in);
  memset(bad, 0, sizeof bad);
  for (o = 0; o < NOUT; o++) {
    want[o] = malloc((size_t)CHUNK * out_size(o));
    got[o] = malloc((size_t)CHUNK * out_size(o));
    cr_assert(want[o] && got[o]);
  }
  for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
    t_lib[isa] = 0.0;
    isa_ok[isa] = xte_cpu_set_isa((xte_cpu_isa)isa) == XTE_SUCCESS;
    if (!isa_ok[isa])
      printf("isa %s is not available here: skipped (%s)\n", xte_cpu_isa_name((xte_cpu_isa)isa),
             xte_last_error());
  }
  cr_assert(isa_ok[XTE_CPU_ISA_SCALAR]);

  for (c = 0; c < NCHUNKS_POS; c++) {
    size_t i;
    double t = now_s();
    { /* oracle for the non-negative chunk, two threads */
      pthread_t th;
      oracle_job j[2];
      for (i = 0; i < CHUNK; i++) in[i] = c * CHUNK + (uint32_t)i;
      for (o = 0; o < 2; o++) {
        j[o].in = in;
        j[o].o8[0] = want[O_E4M3_SAT];
        j[o].o8[1] = want[O_E4M3_RAW];
        j[o].o8[2] = want[O_E5M2_SAT];
        j[o].o8[3] = want[O_E5M2_RAW];
        j[o].o16[0] = want[O_BF16];
        j[o].o16[1] = want[O_FP16];
        j[o].b = o == 0 ? 0 : CHUNK / 2;
        j[o].e = o == 0 ? CHUNK / 2 : CHUNK;
      }
      cr_assert_eq(pthread_create(&th, NULL, oracle_worker, &j[1]), 0);
      oracle_worker(&j[0]);
      pthread_join(th, NULL);
    }
    t_oracle += now_s() - t;
    for (sign = 0; sign < 2; sign++) {
      if (sign) { /* the negative chunk: the same magnitudes, every result gets its sign bit */
        for (i = 0; i < CHUNK; i++) in[i] |= 0x80000000u;
        for (o = 0; o < NOUT; o++) {
          if (out_size(o) == 1)
            for (i = 0; i < CHUNK; i++) ((uint8_t *)want[o])[i] |= 0x80u;
          else
            for (i = 0; i < CHUNK; i++) ((uint16_t *)want[o])[i] |= 0x8000u;
        }
      }
      for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
        xte_tensor x = xte_tensor_1d(in, XTE_DTYPE_FP32, CHUNK);
        if (!isa_ok[isa]) continue;
        cr_assert_eq(xte_cpu_set_isa((xte_cpu_isa)isa), XTE_SUCCESS);
        t = now_s();
        for (o = 0; o < NOUT; o++) {
          xte_tensor y = xte_tensor_1d(got[o], out_dtype(o), CHUNK);
          int sat = o == O_E4M3_SAT || o == O_E5M2_SAT;
          xte_status st = xte_cast(&x, &y, sat, NULL);
          cr_assert_eq(st, XTE_SUCCESS, "xte_cast: %s", xte_last_error());
        }
        t_lib[isa] += now_s() - t;
        for (o = 0; o < NOUT; o++)
          if (memcmp(got[o], want[o], (size_t)CHUNK * out_size(o)) != 0)
            bad[isa][o] +=
                report(xte_cpu_isa_name((xte_cpu_isa)isa), o, in, got[o], want[o], CHUNK);
      }
    }
  }
  xte_cpu_set_isa(saved);

  for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
    if (!isa_ok[isa]) continue;
    for (o = 0; o < NOUT; o++) {
      if (bad[isa][o])
        cr_log_error("%s %s: %llu of 2^32 patterns differ", xte_cpu_isa_name((xte_cpu_isa)isa),
                     out_name[o], (unsigned long long)bad[isa][o]);
      total_bad += bad[isa][o];
    }
    printf("exhaustive fp32 sweep: isa %-12s %7.1f s for 6 x 2^32 conversions\n",
           xte_cpu_isa_name((xte_cpu_isa)isa), t_lib[isa]);
  }
  printf("exhaustive fp32 sweep: oracle %.1f s, total %.1f s\n", t_oracle, now_s() - t0);
  fflush(stdout);
  cr_expect_eq(total_bad, 0, "%llu mismatches", (unsigned long long)total_bad);
  for (o = 0; o < NOUT; o++) {
    free(want[o]);
    free(got[o]);
  }
  free(in);
}

/* ------------------------------------------------------------------ narrow input types */

typedef struct narrow {
  xte_dtype dtype;
  int m, ebits, bias, e4m3fn;
  uint32_t count; /* number of codes */
} narrow;

static const narrow NARROW[] = {
    {XTE_DTYPE_BF16, 7, 8, 127, 0, 65536},
    {XTE_DTYPE_FP16, 10, 5, 15, 0, 65536},
    {XTE_DTYPE_E4M3, 3, 4, 7, 1, 256},
    {XTE_DTYPE_E5M2, 2, 5, 15, 0, 256},
};

/* The expected result of casting fp32 bits u (exact image of the input) to dtype d. */
static uint32_t expect_from_f32(uint32_t u, xte_dtype d, int sat) {
  switch (d) {
    case XTE_DTYPE_FP32:
      return u;
    case XTE_DTYPE_BF16:
      return oracle_bf16(u);
    case XTE_DTYPE_FP16:
      return oracle_fp16(u);
    case XTE_DTYPE_E4M3:
      return oracle_e4m3(u, sat);
    default:
      return oracle_e5m2(u, sat);
  }
}

/* NaN test and sign on an output code of dtype d. */
static int out_is_nan(uint32_t v, xte_dtype d, int *sign) {
  switch (d) {
    case XTE_DTYPE_FP32:
      *sign = (int)(v >> 31);
      return (v & 0x7FFFFFFFu) > 0x7F800000u;
    case XTE_DTYPE_BF16:
      *sign = (int)(v >> 15);
      return (v & 0x7FFFu) > 0x7F80u;
    case XTE_DTYPE_FP16:
      *sign = (int)(v >> 15);
      return (v & 0x7FFFu) > 0x7C00u;
    case XTE_DTYPE_E4M3:
      *sign = (int)(v >> 7);
      return (v & 0x7Fu) == 0x7Fu;
    default:
      *sign = (int)(v >> 7);
      return (v & 0x7Fu) > 0x7Cu;
  }
}

static uint32_t get_code(const void *p, size_t es, size_t i) {
  if (es == 1) return ((const uint8_t *)p)[i];
  if (es == 2) return ((const uint16_t *)p)[i];
  return ((const uint32_t *)p)[i];
}

/* Every bf16 / fp16 / e4m3 / e5m2 code cast to fp32, bf16, fp16, e4m3 and e5m2 (saturating and
 * not), on every ISA. A NaN input must give a NaN of the same sign; to fp8 the NaN code is fixed
 * (0x7F / 0x7E with the sign), to wider types the payload is left open by the contract. */
Test(convert, narrow_inputs_all_codes) {
  static const xte_dtype outs[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16, XTE_DTYPE_E4M3,
                                   XTE_DTYPE_E5M2};
  xte_cpu_isa saved = xte_cpu_get_isa();
  uint8_t *in = malloc(65536 * 2), *out = malloc(65536 * 4);
  uint8_t *scalar_out = malloc(65536 * 4 * 5 * 2); /* per output type and saturation */
  uint32_t *img = malloc(65536 * 4);
  int *nan = malloc(65536 * sizeof(int));
  size_t k, oi, i;
  int isa, sat;
  uint64_t bad = 0;
  cr_assert(in && out && img && nan && scalar_out);
  for (k = 0; k < sizeof NARROW / sizeof NARROW[0]; k++) {
    const narrow *nt = &NARROW[k];
    size_t ies = xte_dtype_size(nt->dtype);
    for (i = 0; i < nt->count; i++) {
      if (ies == 1)
        in[i] = (uint8_t)i;
      else
        ((uint16_t *)in)[i] = (uint16_t)i;
      img[i] = oracle_decode((uint32_t)i, nt->m, nt->ebits, nt->bias, nt->e4m3fn, &nan[i]);
    }
    for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
      if (xte_cpu_set_isa((xte_cpu_isa)isa) != XTE_SUCCESS) continue;
      for (oi = 0; oi < sizeof outs / sizeof outs[0]; oi++) {
        for (sat = 0; sat < 2; sat++) {
          xte_tensor x = xte_tensor_1d(in, nt->dtype, nt->count);
          xte_tensor y = xte_tensor_1d(out, outs[oi], nt->count);
          size_t oes = xte_dtype_size(outs[oi]);
          uint8_t *sref = scalar_out + (oi * 2 + (size_t)sat) * 65536 * 4;
          cr_assert_eq(xte_cast(&x, &y, sat, NULL), XTE_SUCCESS, "%s", xte_last_error());
          /* every ISA: the scalar path's bytes, NaN payloads included */
          if (isa == XTE_CPU_ISA_SCALAR)
            memcpy(sref, out, nt->count * oes);
          else if (memcmp(sref, out, nt->count * oes) != 0 && bad++ < 10)
            cr_log_error("isa %s: %s -> %s (sat %d) differs from scalar",
                         xte_cpu_isa_name((xte_cpu_isa)isa), xte_dtype_name(nt->dtype),
                         xte_dtype_name(outs[oi]), sat);
          for (i = 0; i < nt->count; i++) {
            uint32_t g = get_code(out, oes, i), w;
            int gs, ok;
            if (nan[i] && oes >= 2) {
              ok = out_is_nan(g, outs[oi], &gs) && gs == (int)(img[i] >> 31);
              w = 0;
            } else {
              w = expect_from_f32(img[i], outs[oi], sat);
              ok = g == w;
            }
            if (!ok && bad++ < 10)
              cr_log_error("isa %s: %s 0x%zX -> %s (sat %d) gave 0x%X, want 0x%X%s",
                           xte_cpu_isa_name((xte_cpu_isa)isa), xte_dtype_name(nt->dtype), i,
                           xte_dtype_name(outs[oi]), sat, g, w, nan[i] ? " (a NaN)" : "");
          }
        }
      }
    }
  }
  xte_cpu_set_isa(saved);
  cr_expect_eq(bad, 0, "%llu mismatches", (unsigned long long)bad);
  free(in);
  free(out);
  free(img);
  free(nan);
  free(scalar_out);
}

/* The oracle itself, on hand-picked values whose results the format definitions give directly:
 * it guards against a test that could not fail because its oracle shares a mistake. */
Test(convert, oracle_anchors) {
  struct {
    float x;
    uint8_t e4sat, e4raw, e5sat, e5raw;
  } v[] = {
      {0.0f, 0x00, 0x00, 0x00, 0x00},           /* zero */
      {-0.0f, 0x80, 0x80, 0x80, 0x80},          /* signed zero */
      {1.0f, 0x38, 0x38, 0x3C, 0x3C},           /* one */
      {448.0f, 0x7E, 0x7E, 0x5F, 0x5F},         /* e4m3 max */
      {464.0f, 0x7E, 0x7E, 0x5F, 0x5F},         /* e4m3 tie 448 | 480: even 448 */
      {465.0f, 0x7E, 0x7F, 0x5F, 0x5F},         /* e4m3 overflow */
      {-480.0f, 0xFE, 0xFF, 0xE0, 0xE0},        /* e5m2 tie 448 | 512: even 512 */
      {57344.0f, 0x7E, 0x7F, 0x7B, 0x7B},       /* e5m2 max */
      {61439.0f, 0x7E, 0x7F, 0x7B, 0x7B},       /* below the e5m2 tie */
      {61440.0f, 0x7E, 0x7F, 0x7B, 0x7C},       /* e5m2 tie 57344 | 65536: overflow */
      {0.001953125f, 0x01, 0x01, 0x18, 0x18},   /* 2^-9: e4m3 min subnormal */
      {0.0009765625f, 0x00, 0x00, 0x14, 0x14},  /* 2^-10: e4m3 tie 0 | 2^-9: 0 */
      {0.0029296875f, 0x02, 0x02, 0x1A, 0x1A},  /* 1.5 * 2^-9: e4m3 tie to even 2 */
      {0.015625f, 0x08, 0x08, 0x24, 0x24},      /* 2^-6: e4m3 min normal */
      {1.5258789e-05f, 0x00, 0x00, 0x01, 0x01}, /* 2^-16: e5m2 min subnormal */
      {INFINITY, 0x7E, 0x7F, 0x7B, 0x7C},       /* inf */
      {-INFINITY, 0xFE, 0xFF, 0xFB, 0xFC},      /* -inf */
      {NAN, 0x7F, 0x7F, 0x7E, 0x7E},            /* NaN */
  };
  size_t i;
  for (i = 0; i < sizeof v / sizeof v[0]; i++) {
    uint32_t u;
    memcpy(&u, &v[i].x, 4);
    cr_expect_eq(oracle_e4m3(u, 1), v[i].e4sat, "e4m3 sat %g", (double)v[i].x);
    cr_expect_eq(oracle_e4m3(u, 0), v[i].e4raw, "e4m3 %g", (double)v[i].x);
    cr_expect_eq(oracle_e5m2(u, 1), v[i].e5sat, "e5m2 sat %g", (double)v[i].x);
    cr_expect_eq(oracle_e5m2(u, 0), v[i].e5raw, "e5m2 %g", (double)v[i].x);
  }
  cr_expect_eq(oracle_bf16(0x3F808000u), 0x3F80); /* tie to even */
  cr_expect_eq(oracle_bf16(0x3F818000u), 0x3F82);
  cr_expect_eq(oracle_bf16(0x7F7FFFFFu), 0x7F80); /* FLT_MAX rounds to inf */
  cr_expect_eq(oracle_bf16(0xFF800001u), 0xFFC0);
  cr_expect_eq(oracle_fp16(0x477FF000u), 0x7C00); /* 65520 -> inf */
  cr_expect_eq(oracle_fp16(0x477FEFFFu), 0x7BFF);
  cr_expect_eq(oracle_fp16(0x33000000u), 0x0000); /* 2^-25: tie to 0 */
  cr_expect_eq(oracle_fp16(0x33000001u), 0x0001);
}
