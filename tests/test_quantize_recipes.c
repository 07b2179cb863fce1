/* Quantization recipes: every recipe x scaling mode, e4m3 / e5m2, fp32 / bf16 / fp16 inputs,
 * saturating and not, compared byte for byte (data, scales, amax, output scale) with an oracle
 * written here from the formulas of docs/numerics.md (sections 3-4):
 *  - block amax: max |x| skipping NaN;
 *  - scales in fp32 arithmetic exactly as each recipe states, powers of two found with
 *    frexpf / ilogbf / ldexpf (not by masking bits as the library does);
 *  - element conversion by a search over the fp8 code values for the nearest one, ties to the
 *    even code, with the overflow thresholds of the formats (e4m3 > 464, e5m2 >= 61440).
 * Inputs hold zeros, signed zeros, subnormals, +-inf, NaN, 448 / 464 / 465, huge and tiny blocks,
 * all-zero and all-NaN blocks. Every ISA the machine runs goes through the sweep. A few literal
 * anchors check the oracle itself. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xte/xte.h>

/* ------------------------------------------------------------------ fp8 oracle by search */

static double fp8_tab[2][128]; /* magnitudes of codes 0..127 (NaN / inf slots unused) */
static const int fp8_maxcode[2] = {0x7E, 0x7B};

static double fp8_value_def(int fmt, int code) {
  int m = fmt == 0 ? 3 : 2, bias = fmt == 0 ? 7 : 15;
  int e = code >> m, f = code & ((1 << m) - 1);
  if (e == 0) return ldexp((double)f, 1 - bias - m);
  return ldexp((double)((1 << m) + f), e - bias - m);
}

static void fp8_tables(void) {
  int f, c;
  for (f = 0; f < 2; f++)
    for (c = 0; c <= fp8_maxcode[f]; c++) fp8_tab[f][c] = fp8_value_def(f, c);
}

/* fmt 0: e4m3, 1: e5m2. */
static uint8_t fp8_encode(float y, int fmt, int sat) {
  uint8_t s = signbit(y) ? 0x80 : 0x00;
  double a = fabs((double)y);
  int lo = 0, hi = fp8_maxcode[fmt], k;
  if (isnan(y)) return (uint8_t)(s | (fmt == 0 ? 0x7F : 0x7E));
  if (fmt == 0 ? a > 464.0 : a >= 61440.0) /* past the max after rounding (inf included) */
    return (uint8_t)(s | (sat ? fp8_maxcode[fmt] : (fmt == 0 ? 0x7F : 0x7C)));
  if (a >= fp8_tab[fmt][hi]) return (uint8_t)(s | hi);
  while (hi - lo > 1) { /* fp8_tab[lo] <= a < fp8_tab[hi] */
    int mid = (lo + hi) / 2;
    if (fp8_tab[fmt][mid] <= a)
      lo = mid;
    else
      hi = mid;
  }
  /* nearest of lo / hi: compare 2a with lo + hi (both exact in fp64) */
  if (2.0 * a < fp8_tab[fmt][lo] + fp8_tab[fmt][hi])
    k = lo;
  else if (2.0 * a > fp8_tab[fmt][lo] + fp8_tab[fmt][hi])
    k = hi;
  else
    k = (lo & 1) ? hi : lo; /* tie: the even code */
  return (uint8_t)(s | k);
}

static float fp8_decode(uint8_t b, int fmt) {
  double v;
  if ((b & 0x7F) > fp8_maxcode[fmt]) return NAN; /* NaN, or e5m2 inf (not produced here) */
  v = fp8_tab[fmt][b & 0x7F];
  return (float)((b & 0x80) ? -v : v);
}

/* ------------------------------------------------------------------ input dtypes */

typedef struct dtinfo {
  int eb, mb, bias;
  size_t es;
} dtinfo;

static dtinfo dt_info(xte_dtype d) {
  dtinfo t;
  if (d == XTE_DTYPE_FP32) {
    t.eb = 8, t.mb = 23, t.bias = 127, t.es = 4;
  } else if (d == XTE_DTYPE_BF16) {
    t.eb = 8, t.mb = 7, t.bias = 127, t.es = 2;
  } else {
    t.eb = 5, t.mb = 10, t.bias = 15, t.es = 2;
  }
  return t;
}

/* Exact decode of input bits to fp32, from the format definition. */
static float in_decode(uint32_t bits, xte_dtype d) {
  dtinfo t = dt_info(d);
  uint32_t s = (bits >> (t.eb + t.mb)) & 1u, e = (bits >> t.mb) & ((1u << t.eb) - 1u),
           f = bits & ((1u << t.mb) - 1u);
  double v;
  if (e == (1u << t.eb) - 1u)
    v = f ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp((double)f, 1 - t.bias - t.mb);
  else
    v = ldexp((double)((1u << t.mb) | f), (int)e - t.bias - t.mb);
  return (float)(s ? -v : v);
}

/* fp32 value -> input bits, truncating extra mantissa bits (used to place special values). */
static uint32_t in_encode(float v, xte_dtype d) {
  dtinfo t = dt_info(d);
  uint32_t s = signbit(v) ? 1u : 0u, e, f;
  double a = fabs((double)v);
  int ex;
  if (d == XTE_DTYPE_FP32) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
  }
  if (isnan(v)) {
    e = (1u << t.eb) - 1u;
    f = 1u << (t.mb - 1);
  } else if (a == 0.0) {
    e = f = 0;
  } else {
    frexp(a, &ex); /* a = g * 2^ex, g in [0.5, 1) */
    ex -= 1;       /* a = 1.x * 2^ex */
    if (isinf(v) || ex + t.bias >= (int)(1u << t.eb) - 1) {
      e = (1u << t.eb) - 1u;
      f = 0;
    } else if (ex + t.bias <= 0) {
      e = 0;
      f = (uint32_t)ldexp(a, t.bias - 1 + t.mb);
    } else {
      e = (uint32_t)(ex + t.bias);
      f = (uint32_t)(ldexp(a, t.mb - ex) - ldexp(1.0, t.mb));
    }
  }
  return (s << (t.eb + t.mb)) | (e << t.mb) | f;
}

/* ------------------------------------------------------------------ input patterns */

static uint64_t rng_state;
static uint32_t rnd(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (uint32_t)((z ^ (z >> 31)) >> 32);
}

enum {
  K_NORMAL,  /* magnitudes 2^[-12, 12] */
  K_ZERO,    /* +0 */
  K_SZERO,   /* +-0 */
  K_TINY,    /* subnormals of the input dtype */
  K_HUGE,    /* the top binade of the input dtype */
  K_WIDE,    /* any finite exponent */
  K_SPECIAL, /* small values with inf, NaN, 448, 464, 465, -480, 57344, ... sprinkled */
  K_NANZERO, /* NaN and zeros only: amax 0 */
  K_MAXES,   /* |x| <= 1 with one of 448 / 464 / 465 / 480 / 57344 / 61440 here and there */
  K_MIXED,   /* (tile kind only) 32x32 regions of the kinds above */
  NKINDS
};

static const float special_vals[] = {INFINITY, -INFINITY, NAN,     -NAN,     448.0f,
                                     464.0f,   465.0f,    -480.0f, 57344.0f, 61440.0f,
                                     65504.0f, -0.0f,     1e-40f,  -3e-45f,  0.0f};
static const float maxes_vals[] = {448.0f, 464.0f, -465.0f, 480.0f, 57344.0f, -61440.0f};

static uint32_t gen_bits(int kind, xte_dtype d) {
  dtinfo t = dt_info(d);
  uint32_t s = rnd() & 1u, top = (1u << t.eb) - 2u, f = rnd() & ((1u << t.mb) - 1u), e;
  int lo, hi;
  switch (kind) {
    case K_ZERO:
      return 0;
    case K_SZERO:
      return s << (t.eb + t.mb);
    case K_TINY:
      return (s << (t.eb + t.mb)) | (f ? f : 1u);
    case K_HUGE:
      return (s << (t.eb + t.mb)) | (top << t.mb) | f;
    case K_WIDE:
      return (s << (t.eb + t.mb)) | ((1u + rnd() % top) << t.mb) | f;
    case K_SPECIAL:
      if (rnd() % 8 == 0)
        return in_encode(special_vals[rnd() % (sizeof special_vals / sizeof special_vals[0])], d);
      lo = -8, hi = 0;
      break;
    case K_NANZERO:
      if (rnd() & 1u) return (s << (t.eb + t.mb)) | ((top + 1u) << t.mb) | (f ? f : 1u);
      return s << (t.eb + t.mb);
    case K_MAXES:
      if (rnd() % 32 == 0)
        return in_encode(maxes_vals[rnd() % (sizeof maxes_vals / sizeof maxes_vals[0])], d);
      lo = -10, hi = -1;
      break;
    default:
      lo = -12, hi = 12;
      break;
  }
  e = (uint32_t)(lo + (int)(rnd() % (uint32_t)(hi - lo + 1)) + t.bias);
  return (s << (t.eb + t.mb)) | (e << t.mb) | f;
}

/* Fills bits[M*K] (dtype d): tile (128x128) kinds cycle from seed; K_MIXED tiles use 32x32
 * regions. */
static void gen_input(void *buf, xte_dtype d, int64_t M, int64_t K, unsigned seed) {
  int64_t r, c, ntc = (K + 127) / 128;
  dtinfo t = dt_info(d);
  rng_state = seed * 7919ull + 17;
  for (r = 0; r < M; r++)
    for (c = 0; c < K; c++) {
      int kind = (int)(((r / 128) * ntc + c / 128 + seed) % NKINDS);
      uint32_t b;
      if (kind == K_MIXED) kind = (int)(((r / 32) * 5 + (c / 32) * 3 + seed) % K_MIXED);
      b = gen_bits(kind, d);
      if (t.es == 4)
        ((uint32_t *)buf)[r * K + c] = b;
      else
        ((uint16_t *)buf)[r * K + c] = (uint16_t)b;
    }
}

/* ------------------------------------------------------------------ recipe oracle */

typedef struct ocfg {
  float eps;
  int pow2, sat; /* pow2 -1: the recipe's default (TE_BLOCK 1, TE_CURRENT 0) */
  float delayed;
} ocfg;

typedef struct oscale {
  float scale, scale_inv;
  uint8_t e8m0;
} oscale;

static float in_dtype_max(xte_dtype d) {
  if (d == XTE_DTYPE_BF16) return (float)ldexp(255.0, 120); /* 0x1.FEp127 */
  if (d == XTE_DTYPE_FP16) return 65504.0f;
  return FLT_MAX;
}

static float pow2_floor(float v) { /* largest power of two <= v (v > 0, finite) */
  return ldexpf(1.0f, ilogbf(v));
}

static float pow2_ceil(float v) { /* smallest power of two >= v (v > 0, finite) */
  float p = ldexpf(1.0f, ilogbf(v));
  return p == v ? p : 2.0f * p;
}

static oscale oracle_scale(xte_recipe r, float amax, int fmt, const ocfg *c, xte_dtype in) {
  const float fmax = fmt == 0 ? 448.0f : 57344.0f;
  oscale o;
  o.e8m0 = 0;
  switch (r) {
    case XTE_RECIPE_TE_BLOCK:
    case XTE_RECIPE_TE_CURRENT: {
      /* TE: current scaling falls back to FLT_MAX for every input dtype, the block kernels to
       * the input dtype's max; both round down to a power of two when asked (by default only the
       * block recipe) */
      int pow2 = c->pow2 < 0 ? r == XTE_RECIPE_TE_BLOCK : c->pow2;
      if (amax < c->eps) amax = c->eps;
      if (isinf(amax) || amax == 0.0f || isnan(amax)) {
        o.scale = 1.0f;
      } else {
        o.scale = fmax / amax;
        if (isinf(o.scale)) o.scale = r == XTE_RECIPE_TE_CURRENT ? FLT_MAX : in_dtype_max(in);
        if (pow2) o.scale = pow2_floor(o.scale);
      }
      o.scale_inv = 1.0f / o.scale;
      return o;
    }
    case XTE_RECIPE_TE_DELAYED:
      o.scale = c->delayed;
      o.scale_inv = 1.0f / c->delayed;
      return o;
    case XTE_RECIPE_DEEPGEMM:
    case XTE_RECIPE_DEEPGEMM_UE8M0: {
      float sf = (amax > 1e-4f ? amax : 1e-4f) / fmax;
      if (r == XTE_RECIPE_DEEPGEMM_UE8M0 && isfinite(sf)) sf = pow2_ceil(sf);
      o.scale_inv = sf;
      o.scale = 1.0f / sf;
      return o;
    }
    case XTE_RECIPE_MTFP8:
      o.scale_inv = (amax > 1e-30f ? amax : 1e-30f) * (1.0f / fmax);
      o.scale = 1.0f / o.scale_inv;
      return o;
    case XTE_RECIPE_MX_TE: {
      float v = amax * (1.0f / fmax);
      int e;
      if (isinf(v)) {
        e = 254;
      } else if (v == 0.0f) {
        e = 0;
      } else {
        e = ilogbf(v) + 127;
        if (ldexpf(1.0f, ilogbf(v)) != v) e++; /* round up */
        if (e < 0) e = 0;
        if (e > 254) e = 254;
      }
      o.e8m0 = (uint8_t)e;
      o.scale_inv = ldexpf(1.0f, e - 127);
      o.scale = ldexpf(1.0f, 127 - e);
      return o;
    }
    default: { /* MX_OCP */
      int se;
      if (isinf(amax))
        se = 127;
      else if (amax == 0.0f)
        se = -127;
      else
        se = ilogbf(amax) - (fmt == 0 ? 8 : 15);
      if (se < -127) se = -127;
      if (se > 127) se = 127;
      o.e8m0 = (uint8_t)(se + 127);
      o.scale_inv = ldexpf(1.0f, se);
      o.scale = ldexpf(1.0f, -se);
      return o;
    }
  }
}

/* Quantizes X [R, C] in blocks bh x bw: q [R, C], grid [ceil(R/bh), ceil(C/bw)] row-major.
 * Returns the amax over X. */
static float oracle_quant(const float *X, int64_t R, int64_t C, int64_t bh, int64_t bw,
                          xte_recipe r, int fmt, const ocfg *c, xte_dtype in, uint8_t *q,
                          oscale *grid) {
  int64_t GR = (R + bh - 1) / bh, GC = (C + bw - 1) / bw, gi, gj, i, j;
  float total = 0.0f;
  for (gi = 0; gi < GR; gi++)
    for (gj = 0; gj < GC; gj++) {
      float amax = 0.0f;
      oscale s;
      for (i = gi * bh; i < R && i < (gi + 1) * bh; i++)
        for (j = gj * bw; j < C && j < (gj + 1) * bw; j++) {
          float a = fabsf(X[i * C + j]);
          if (!isnan(a) && a > amax) amax = a;
        }
      if (amax > total) total = amax;
      s = oracle_scale(r, amax, fmt, c, in);
      grid[gi * GC + gj] = s;
      for (i = gi * bh; i < R && i < (gi + 1) * bh; i++)
        for (j = gj * bw; j < C && j < (gj + 1) * bw; j++)
          q[i * C + j] = fp8_encode(X[i * C + j] * s.scale, fmt, c->sat);
    }
  return total;
}

/* ------------------------------------------------------------------ one case */

typedef struct combo {
  xte_recipe recipe;
  xte_scaling_mode mode;
} combo;

static const combo COMBOS[] = {
    {XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128},
    {XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_128x128},
    {XTE_RECIPE_DEEPGEMM, XTE_SCALING_BLOCK_1x128},
    {XTE_RECIPE_DEEPGEMM, XTE_SCALING_BLOCK_128x128},
    {XTE_RECIPE_DEEPGEMM_UE8M0, XTE_SCALING_BLOCK_1x128},
    {XTE_RECIPE_DEEPGEMM_UE8M0, XTE_SCALING_BLOCK_128x128},
    {XTE_RECIPE_MTFP8, XTE_SCALING_BLOCK_1x128},
    {XTE_RECIPE_MTFP8, XTE_SCALING_BLOCK_128x128},
    {XTE_RECIPE_MX_TE, XTE_SCALING_MXFP8_1x32},
    {XTE_RECIPE_MX_OCP, XTE_SCALING_MXFP8_1x32},
    {XTE_RECIPE_TE_CURRENT, XTE_SCALING_PER_TENSOR},
    {XTE_RECIPE_TE_DELAYED, XTE_SCALING_PER_TENSOR},
};
#define NCOMBOS (sizeof COMBOS / sizeof COMBOS[0])

static const char *recipe_name(xte_recipe r) {
  static const char *n[] = {"TE_CURRENT",     "TE_DELAYED", "TE_BLOCK", "DEEPGEMM",
                            "DEEPGEMM_UE8M0", "MTFP8",      "MX_TE",    "MX_OCP"};
  return n[r];
}

static int is_mx(xte_recipe r) {
  return r == XTE_RECIPE_MX_TE || r == XTE_RECIPE_MX_OCP;
}
static int transposes(xte_recipe r) {
  return !(r == XTE_RECIPE_MTFP8 || is_mx(r));
}

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static long n_fail;

/* Compares one copy's bytes and compact scales with the oracle. */
static void check_copy(const char *what, const char *tag, const uint8_t *got_q,
                       const uint8_t *want_q, int64_t R, int64_t C, const float *X, int xT,
                       const void *got_s, const oscale *want_s, int64_t GR, int64_t GC, int mx) {
  int64_t i, bad = 0;
  for (i = 0; i < R * C; i++)
    if (got_q[i] != want_q[i]) {
      if (bad++ < 3) {
        int64_t r = i / C, c = i % C;
        float x = xT ? X[c * R + r] : X[r * C + c];
        cr_log_error("%s %s: q[%lld, %lld] = 0x%02X, want 0x%02X (x = %a)", tag, what, (long long)r,
                     (long long)c, got_q[i], want_q[i], (double)x);
      }
    }
  for (i = 0; i < GR * GC; i++) {
    int ok = mx ? ((const uint8_t *)got_s)[i] == want_s[i].e8m0
                : fbits(((const float *)got_s)[i]) == fbits(want_s[i].scale_inv);
    if (!ok && bad++ < 6) {
      if (mx)
        cr_log_error("%s %s: scale[%lld] = %u, want %u", tag, what, (long long)i,
                     ((const uint8_t *)got_s)[i], want_s[i].e8m0);
      else
        cr_log_error("%s %s: scale_inv[%lld] = %a, want %a", tag, what, (long long)i,
                     (double)((const float *)got_s)[i], (double)want_s[i].scale_inv);
    }
  }
  if (bad) n_fail++;
}

/* Runs xte_quantize (both copies, COMPACT scales) on one input and checks it. */
static void run_case(const combo *cb, int fmt, xte_dtype in_dt, int64_t M, int64_t K, unsigned seed,
                     const ocfg *cfg) {
  const xte_recipe r = cb->recipe;
  const int mx = is_mx(r), tr = transposes(r);
  const int64_t B = cb->mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  const xte_dtype qdt = fmt == 0 ? XTE_DTYPE_E4M3 : XTE_DTYPE_E5M2;
  const size_t ses = mx ? 1 : 4;
  dtinfo t = dt_info(in_dt);
  void *in = malloc((size_t)(M * K) * t.es);
  float *X = malloc((size_t)(M * K) * 4), *XT = malloc((size_t)(M * K) * 4);
  uint8_t *rq = malloc((size_t)(M * K)), *cq = malloc((size_t)(M * K));
  uint8_t *wr = malloc((size_t)(M * K)), *wc = malloc((size_t)(M * K));
  int64_t rbh, rbw, cbh, cbw, rGR, rGC, cGR, cGC, cR, cC, sr, sc, i, j;
  oscale *wrs, *wcs;
  void *rs, *cs;
  float amax = -1.0f, scale_out = -1.0f, delayed = cfg->delayed, want_amax, want_amax2;
  xte_quant_config qc = xte_quant_config_default();
  xte_qtensor q;
  xte_tensor x;
  xte_status st;
  char tag[200];
  snprintf(tag, sizeof tag, "[%s: %s %s %s<-%s sat %d pow2 %d eps %g %lldx%lld seed %u]",
           xte_cpu_isa_name(xte_cpu_get_isa()), recipe_name(r),
           cb->mode == XTE_SCALING_PER_TENSOR
               ? "tensor"
               : (cb->mode == XTE_SCALING_BLOCK_128x128 ? "128x128" : (B == 32 ? "1x32" : "1x128")),
           fmt == 0 ? "e4m3" : "e5m2", xte_dtype_name(in_dt), cfg->sat, cfg->pow2, (double)cfg->eps,
           (long long)M, (long long)K, seed);
  cr_assert(in && X && XT && rq && cq && wr && wc);
  gen_input(in, in_dt, M, K, seed);
  for (i = 0; i < M; i++)
    for (j = 0; j < K; j++) {
      uint32_t b = t.es == 4 ? ((uint32_t *)in)[i * K + j] : ((uint16_t *)in)[i * K + j];
      X[i * K + j] = in_decode(b, in_dt);
      XT[j * M + i] = X[i * K + j];
    }

  /* the block geometry of each copy, from the recipe definitions */
  if (cb->mode == XTE_SCALING_PER_TENSOR) {
    rbh = cbh = M;
    rbw = K;
    cbw = tr ? M : K;
    if (tr) cbh = K;
  } else if (cb->mode == XTE_SCALING_BLOCK_128x128) {
    rbh = rbw = cbh = cbw = 128;
  } else {
    rbh = 1;
    rbw = B;
    cbh = tr ? 1 : B;
    cbw = tr ? B : 1;
  }
  cR = tr ? K : M;
  cC = tr ? M : K;
  rGR = (M + rbh - 1) / rbh;
  rGC = (K + rbw - 1) / rbw;
  cGR = (cR + cbh - 1) / cbh;
  cGC = (cC + cbw - 1) / cbw;
  cr_assert_eq(xte_quantize_scale_shape(M, K, cb->mode, r, XTE_SCALE_LAYOUT_COMPACT, 0, &sr, &sc),
               XTE_SUCCESS, "%s", xte_last_error());
  cr_assert(sr == rGR && sc == rGC, "%s rowwise compact scales [%lld, %lld], want [%lld, %lld]",
            tag, (long long)sr, (long long)sc, (long long)rGR, (long long)rGC);
  cr_assert_eq(xte_quantize_scale_shape(M, K, cb->mode, r, XTE_SCALE_LAYOUT_COMPACT, 1, &sr, &sc),
               XTE_SUCCESS, "%s", xte_last_error());
  cr_assert(sr == cGR && sc == cGC, "%s columnwise compact scales [%lld, %lld], want [%lld, %lld]",
            tag, (long long)sr, (long long)sc, (long long)cGR, (long long)cGC);
  wrs = malloc(sizeof(oscale) * (size_t)(rGR * rGC));
  wcs = malloc(sizeof(oscale) * (size_t)(cGR * cGC));
  rs = malloc((size_t)(rGR * rGC) * ses);
  cs = malloc((size_t)(cGR * cGC) * ses);
  cr_assert(wrs && wcs && rs && cs);

  /* oracle */
  want_amax = oracle_quant(X, M, K, rbh, rbw, r, fmt, cfg, in_dt, wr, wrs);
  want_amax2 = oracle_quant(tr ? XT : X, cR, cC, cbh, cbw, r, fmt, cfg, in_dt, wc, wcs);
  cr_assert_eq(fbits(want_amax), fbits(want_amax2));

  /* library */
  memset(&q, 0, sizeof q);
  q.rowwise = xte_tensor_2d(rq, qdt, M, K);
  q.rowwise_scale_inv.data = rs;
  q.rowwise_scale_inv.dtype = mx ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
  q.rowwise_scale_inv.rows = rGR;
  q.rowwise_scale_inv.cols = rGC;
  q.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  q.columnwise = xte_tensor_2d(cq, qdt, cR, cC);
  q.columnwise_scale_inv = q.rowwise_scale_inv;
  q.columnwise_scale_inv.data = cs;
  q.columnwise_scale_inv.rows = cGR;
  q.columnwise_scale_inv.cols = cGC;
  q.scaling_mode = cb->mode;
  q.recipe = r;
  q.amax = &amax;
  q.scale = r == XTE_RECIPE_TE_DELAYED ? &delayed : &scale_out;
  qc.amax_epsilon = cfg->eps;
  qc.force_pow_2 = cfg->pow2;
  qc.saturate = cfg->sat;
  x = xte_tensor_2d(in, in_dt, M, K);
  st = xte_quantize(&x, &q, &qc, NULL);
  cr_assert_eq(st, XTE_SUCCESS, "%s xte_quantize: %s", tag, xte_last_error());

  check_copy("rowwise", tag, rq, wr, M, K, X, 0, rs, wrs, rGR, rGC, mx);
  check_copy("columnwise", tag, cq, wc, cR, cC, X, tr, cs, wcs, cGR, cGC, mx);
  if (fbits(amax) != fbits(want_amax)) {
    cr_log_error("%s amax %a, want %a", tag, (double)amax, (double)want_amax);
    n_fail++;
  }
  if (r == XTE_RECIPE_TE_CURRENT && fbits(scale_out) != fbits(wrs[0].scale)) {
    cr_log_error("%s output scale %a, want %a", tag, (double)scale_out, (double)wrs[0].scale);
    n_fail++;
  }
  if (r == XTE_RECIPE_TE_DELAYED) cr_expect_eq(fbits(delayed), fbits(cfg->delayed));
  free(in);
  free(X);
  free(XT);
  free(rq);
  free(cq);
  free(wr);
  free(wc);
  free(wrs);
  free(wcs);
  free(rs);
  free(cs);
}

static const int64_t SHAPES[][2] = {{1, 1}, {3, 300}, {130, 257}, {256, 384}, {129, 33}};
static const xte_dtype IN_DT[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};

/* Every case on every ISA this machine runs (the oracle, not the scalar path, is the reference:
 * the SIMD kernels' own scale lanes meet the tiny, huge and special blocks here) */
static void sweep(xte_recipe only, const ocfg *base, int sats) {
  const xte_cpu_isa saved = xte_cpu_get_isa();
  size_t ci, si, di;
  int fmt, sat, isa;
  fp8_tables();
  n_fail = 0;
  for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
    unsigned seed = 1;
    if (xte_cpu_set_isa((xte_cpu_isa)isa) != XTE_SUCCESS) {
      printf("isa %s not available here: not swept\n", xte_cpu_isa_name((xte_cpu_isa)isa));
      continue;
    }
    for (ci = 0; ci < NCOMBOS; ci++) {
      if ((int)only >= 0 && COMBOS[ci].recipe != only) continue;
      for (fmt = 0; fmt < 2; fmt++)
        for (di = 0; di < 3; di++)
          for (sat = 0; sat < 2; sat++) {
            ocfg c = *base;
            if (!(sats & (1 << sat))) continue;
            c.sat = sat;
            for (si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++)
              run_case(&COMBOS[ci], fmt, IN_DT[di], SHAPES[si][0], SHAPES[si][1], seed++, &c);
          }
    }
  }
  xte_cpu_set_isa(saved);
  cr_expect_eq(n_fail, 0, "%ld failing checks", n_fail);
}

static const ocfg DEFAULT_CFG = {0.0f, 1, 1, 1.0f};

Test(recipes, te_block) {
  sweep(XTE_RECIPE_TE_BLOCK, &DEFAULT_CFG, 3);
}
Test(recipes, te_block_no_pow2) {
  ocfg c = DEFAULT_CFG;
  c.pow2 = 0;
  sweep(XTE_RECIPE_TE_BLOCK, &c, 3);
}
Test(recipes, te_block_eps) {
  ocfg c = DEFAULT_CFG;
  c.eps = 1e-3f;
  sweep(XTE_RECIPE_TE_BLOCK, &c, 1);
  c.pow2 = 0;
  c.eps = 3e-38f;
  sweep(XTE_RECIPE_TE_BLOCK, &c, 2);
}
Test(recipes, deepgemm) {
  sweep(XTE_RECIPE_DEEPGEMM, &DEFAULT_CFG, 3);
}
Test(recipes, deepgemm_ue8m0) {
  sweep(XTE_RECIPE_DEEPGEMM_UE8M0, &DEFAULT_CFG, 3);
}
Test(recipes, mtfp8) {
  sweep(XTE_RECIPE_MTFP8, &DEFAULT_CFG, 3);
}
Test(recipes, mx_te) {
  sweep(XTE_RECIPE_MX_TE, &DEFAULT_CFG, 3);
}
Test(recipes, mx_ocp) {
  sweep(XTE_RECIPE_MX_OCP, &DEFAULT_CFG, 3);
}
Test(recipes, te_current) {
  ocfg c = DEFAULT_CFG;
  c.pow2 = -1; /* the default: no power-of-two rounding (TE's Float8CurrentScaling) */
  sweep(XTE_RECIPE_TE_CURRENT, &c, 3);
  c.eps = 1e3f; /* raises small tensors' amax */
  sweep(XTE_RECIPE_TE_CURRENT, &c, 1);
}
Test(recipes, te_current_pow2) {
  ocfg c = DEFAULT_CFG; /* force_pow_2 = 1 */
  sweep(XTE_RECIPE_TE_CURRENT, &c, 3);
  c.pow2 = 0;
  sweep(XTE_RECIPE_TE_CURRENT, &c, 2);
}
Test(recipes, te_block_default_pow2) {
  ocfg c = DEFAULT_CFG;
  c.pow2 = -1; /* the default: power-of-two scales (TE's Float8BlockScaling) */
  sweep(XTE_RECIPE_TE_BLOCK, &c, 1);
}
Test(recipes, te_delayed) {
  ocfg c = DEFAULT_CFG;
  sweep(XTE_RECIPE_TE_DELAYED, &c, 3);
  c.delayed = 3.0f;
  sweep(XTE_RECIPE_TE_DELAYED, &c, 3);
  c.delayed = 1e-3f;
  sweep(XTE_RECIPE_TE_DELAYED, &c, 1);
}

/* ------------------------------------------------------------------ literal anchors */

/* Quantizes a 1 x n fp32 row with one recipe; returns the bytes in q and the first scale. */
static void quant_row(const float *x, int n, xte_recipe r, xte_scaling_mode m, int fmt, int sat,
                      int pow2, float delayed, uint8_t *q, float *sinv, uint8_t *e8) {
  float sbuf[8];
  uint8_t ebuf[8];
  int64_t sr, sc;
  xte_qtensor qt;
  xte_quant_config c = xte_quant_config_default();
  xte_tensor in = xte_tensor_2d((void *)x, XTE_DTYPE_FP32, 1, n);
  memset(&qt, 0, sizeof qt);
  cr_assert_eq(xte_quantize_scale_shape(1, n, m, r, XTE_SCALE_LAYOUT_COMPACT, 0, &sr, &sc),
               XTE_SUCCESS);
  cr_assert(sr * sc <= 8);
  qt.rowwise = xte_tensor_2d(q, fmt == 0 ? XTE_DTYPE_E4M3 : XTE_DTYPE_E5M2, 1, n);
  qt.rowwise_scale_inv.data = is_mx(r) ? (void *)ebuf : (void *)sbuf;
  qt.rowwise_scale_inv.dtype = is_mx(r) ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
  qt.rowwise_scale_inv.rows = sr;
  qt.rowwise_scale_inv.cols = sc;
  qt.scaling_mode = m;
  qt.recipe = r;
  qt.scale = &delayed;
  c.saturate = sat;
  c.force_pow_2 = pow2;
  cr_assert_eq(xte_quantize(&in, &qt, &c, NULL), XTE_SUCCESS, "%s", xte_last_error());
  if (sinv) *sinv = sbuf[0];
  if (e8) *e8 = ebuf[0];
}

Test(recipes, anchors_special_values) {
  /* delayed scaling with scale 1: the bare conversion rules */
  const float x[] = {0.0f,     -0.0f,    1.0f,      448.0f, 464.0f,       465.0f,
                     -480.0f,  INFINITY, -INFINITY, NAN,    0.001953125f, 0.0009765625f,
                     57344.0f, 61440.0f, 1e-40f,    -448.0f};
  const uint8_t e4sat[] = {0x00, 0x80, 0x38, 0x7E, 0x7E, 0x7E, 0xFE, 0x7E,
                           0xFE, 0x7F, 0x01, 0x00, 0x7E, 0x7E, 0x00, 0xFE};
  const uint8_t e4raw[] = {0x00, 0x80, 0x38, 0x7E, 0x7E, 0x7F, 0xFF, 0x7F,
                           0xFF, 0x7F, 0x01, 0x00, 0x7F, 0x7F, 0x00, 0xFE};
  const uint8_t e5raw[] = {0x00, 0x80, 0x3C, 0x5F, 0x5F, 0x5F, 0xE0, 0x7C,
                           0xFC, 0x7E, 0x18, 0x14, 0x7B, 0x7C, 0x00, 0xDF};
  uint8_t q[16];
  float sinv;
  int i;
  quant_row(x, 16, XTE_RECIPE_TE_DELAYED, XTE_SCALING_PER_TENSOR, 0, 1, 1, 1.0f, q, &sinv, NULL);
  for (i = 0; i < 16; i++) cr_expect_eq(q[i], e4sat[i], "e4m3 sat x = %g", (double)x[i]);
  cr_expect_eq(sinv, 1.0f);
  quant_row(x, 16, XTE_RECIPE_TE_DELAYED, XTE_SCALING_PER_TENSOR, 0, 0, 1, 1.0f, q, &sinv, NULL);
  for (i = 0; i < 16; i++) cr_expect_eq(q[i], e4raw[i], "e4m3 x = %g", (double)x[i]);
  quant_row(x, 16, XTE_RECIPE_TE_DELAYED, XTE_SCALING_PER_TENSOR, 1, 0, 1, 1.0f, q, &sinv, NULL);
  for (i = 0; i < 16; i++) cr_expect_eq(q[i], e5raw[i], "e5m2 x = %g", (double)x[i]);
  /* the oracle agrees with the anchors */
  fp8_tables();
  for (i = 0; i < 16; i++) {
    cr_expect_eq(fp8_encode(x[i], 0, 1), e4sat[i]);
    cr_expect_eq(fp8_encode(x[i], 0, 0), e4raw[i]);
    cr_expect_eq(fp8_encode(x[i], 1, 0), e5raw[i]);
  }
  cr_expect_eq(fp8_decode(0x7E, 0), 448.0f);
  cr_expect_eq(fp8_decode(0xFB, 1), -57344.0f);
}

Test(recipes, anchors_scales) {
  float x[128], sinv;
  uint8_t q[128], e8;
  int i;
  for (i = 0; i < 128; i++) x[i] = (i % 2 ? -1.0f : 1.0f) * (float)(i + 1) / 128.0f; /* amax 1 */
  /* TE: 448 / 1 -> pow2 256 */
  quant_row(x, 128, XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128, 0, 1, 1, 1.0f, q, &sinv, NULL);
  cr_expect_eq(sinv, 1.0f / 256.0f);
  cr_expect_eq(q[127], 0xF8); /* -1 * 256 = -256 = -1.0 * 2^8 */
  quant_row(x, 128, XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128, 0, 1, 0, 1.0f, q, &sinv, NULL);
  cr_expect_eq(sinv, 1.0f / 448.0f);
  cr_expect_eq(q[127], 0xFE); /* -448 */
  /* DeepGEMM: sf = 1 / 448 */
  quant_row(x, 128, XTE_RECIPE_DEEPGEMM, XTE_SCALING_BLOCK_1x128, 0, 1, 1, 1.0f, q, &sinv, NULL);
  cr_expect_eq(sinv, 1.0f / 448.0f);
  quant_row(x, 128, XTE_RECIPE_DEEPGEMM_UE8M0, XTE_SCALING_BLOCK_1x128, 0, 1, 1, 1.0f, q, &sinv,
            NULL);
  cr_expect_eq(sinv, 1.0f / 256.0f); /* 1/448 rounded up to 2^-8 */
  /* MX (both), amax of the first 32 = 0.25: 0.25 / 448 lies in (2^-11, 2^-10): TE rounds up to
   * 2^-10 (e8m0 117); OCP: 2^(floor(log2 0.25) - 8) = 2^-10 */
  quant_row(x, 32, XTE_RECIPE_MX_TE, XTE_SCALING_MXFP8_1x32, 0, 1, 1, 1.0f, q, NULL, &e8);
  cr_expect_eq(e8, 117);
  cr_expect_eq(q[31], 0xF8); /* -0.25 * 2^10 = -256 */
  quant_row(x, 32, XTE_RECIPE_MX_OCP, XTE_SCALING_MXFP8_1x32, 0, 1, 1, 1.0f, q, NULL, &e8);
  cr_expect_eq(e8, 117);
  /* all-zero block */
  memset(x, 0, sizeof x);
  quant_row(x, 128, XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128, 0, 1, 1, 1.0f, q, &sinv, NULL);
  cr_expect_eq(sinv, 1.0f);
  quant_row(x, 128, XTE_RECIPE_DEEPGEMM, XTE_SCALING_BLOCK_1x128, 0, 1, 1, 1.0f, q, &sinv, NULL);
  cr_expect_eq(sinv, 1e-4f / 448.0f);
  quant_row(x, 128, XTE_RECIPE_MTFP8, XTE_SCALING_BLOCK_1x128, 0, 1, 1, 1.0f, q, &sinv, NULL);
  cr_expect_eq(sinv, 1e-30f * (1.0f / 448.0f));
  quant_row(x, 32, XTE_RECIPE_MX_TE, XTE_SCALING_MXFP8_1x32, 0, 1, 1, 1.0f, q, NULL, &e8);
  cr_expect_eq(e8, 0);
  quant_row(x, 32, XTE_RECIPE_MX_OCP, XTE_SCALING_MXFP8_1x32, 0, 1, 1, 1.0f, q, NULL, &e8);
  cr_expect_eq(e8, 0);
  for (i = 0; i < 32; i++) cr_expect_eq(q[i], 0);
  /* OCP: amax 500 -> shared exponent 0, 500 saturates to 448 or is NaN */
  x[5] = 500.0f;
  quant_row(x, 32, XTE_RECIPE_MX_OCP, XTE_SCALING_MXFP8_1x32, 0, 1, 1, 1.0f, q, NULL, &e8);
  cr_expect_eq(e8, 127);
  cr_expect_eq(q[5], 0x7E);
  quant_row(x, 32, XTE_RECIPE_MX_OCP, XTE_SCALING_MXFP8_1x32, 0, 0, 1, 1.0f, q, NULL, &e8);
  cr_expect_eq(q[5], 0x7F);
  /* TE with an inf in the block: scale 1 */
  x[5] = -INFINITY;
  quant_row(x, 128, XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128, 0, 1, 1, 1.0f, q, &sinv, NULL);
  cr_expect_eq(sinv, 1.0f);
  cr_expect_eq(q[5], 0xFE);
  /* TE with a tiny amax: 448 / 1e-45 overflows -> FLT_MAX -> pow2 2^127 */
  x[5] = 1e-45f;
  quant_row(x, 128, XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128, 0, 1, 1, 1.0f, q, &sinv, NULL);
  cr_expect_eq(sinv, ldexpf(1.0f, -127));
  quant_row(x, 128, XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128, 0, 1, 0, 1.0f, q, &sinv, NULL);
  cr_expect_eq(sinv, 1.0f / FLT_MAX);
}

/* ------------------------------------------------------------------ TE_CURRENT against fp64 */

/* largest power of two <= v (v > 0, finite), by repeated doubling / halving */
static double p2_floor_d(double v) {
  double p = 1.0;
  while (p * 2.0 <= v) p *= 2.0;
  while (p > v) p *= 0.5;
  return p;
}

/* TE's per-tensor current scaling (nvte_compute_scale_from_amax) restated in fp64: amax raised
 * to eps; 0 or inf -> 1; fp8_max / amax rounded once to fp32 (the fp64 quotient of two fp32
 * values rounds to the same fp32), FLT_MAX when that rounding passes FLT_MAX (at or past
 * 2^128 - 2^103), whatever the input dtype; then optionally the power of two at or below. */
static float current_scale_d(double amax, double fmax, double eps, int pow2) {
  double q;
  if (amax < eps) amax = eps;
  if (amax == 0.0 || isinf(amax)) return 1.0f;
  q = fmax / amax;
  if (q >= ldexp(1.0, 128) - ldexp(1.0, 103)) q = (double)FLT_MAX;
  q = (double)(float)q;
  if (pow2) q = p2_floor_d(q);
  return (float)q;
}

/* Per-tensor TE_CURRENT of small tensors whose amax is tiny (fp8_max / amax overflows fp32 for
 * fp32 and bf16 inputs), at the overflow edge, zero, inf, all-NaN (amax 0: NaN never wins) and
 * ordinary, with force_pow_2 -1 (default: off), 0 and 1: scale output, stored scale_inv, amax and
 * the codes, against the fp64 restatement (on every ISA). */
Test(recipes, te_current_edges_fp64) {
  enum { NC = 40 };
  const float tiny[3] = {ldexpf(1.0f, -149), ldexpf(1.0f, -133), ldexpf(1.0f, -24)};
  const xte_cpu_isa saved = xte_cpu_get_isa();
  float vals[NC], X[NC], sinv, scale_out, amax;
  uint16_t in16[NC];
  uint32_t in32[NC];
  uint8_t q[NC], want[NC];
  int di, fmt, pc, cs, i, isa;
  long fails = 0;
  fp8_tables();
  for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
    if (xte_cpu_set_isa((xte_cpu_isa)isa) != XTE_SUCCESS) continue;
    for (di = 0; di < 3; di++)
      for (fmt = 0; fmt < 2; fmt++)
        for (pc = -1; pc <= 1; pc++)
          for (cs = 0; cs < 9; cs++) {
            const xte_dtype dt = IN_DT[di];
            const double fmax = fmt == 0 ? 448.0 : 57344.0;
            double am = 0.0;
            float want_scale, want_sinv;
            xte_qtensor qt;
            xte_quant_config cfg = xte_quant_config_default();
            xte_tensor x;
            for (i = 0; i < NC; i++) {
              float v;
              switch (cs) {
                case 0: /* the dtype's smallest subnormal */
                  v = (i & 1 ? -1.0f : 1.0f) * tiny[di];
                  break;
                case 1: /* a few times it, and zeros */
                  v = (float)(i % 4) * tiny[di];
                  break;
                case 2: /* fp8_max / amax just past FLT_MAX (fp32 / bf16: 2^-120 * 1.75) */
                  v = i == 7 ? ldexpf(1.75f, -120) : 0.0f;
                  break;
                case 3: /* just inside */
                  v = i == 7 ? ldexpf(1.0f, -118) : -0.0f;
                  break;
                case 4: /* all zeros, signed */
                  v = i & 1 ? -0.0f : 0.0f;
                  break;
                case 5: /* an inf */
                  v = i == 3 ? -INFINITY : 1.5f;
                  break;
                case 6: /* all NaN: amax 0 */
                  v = NAN;
                  break;
                case 7: /* NaN and tiny values */
                  v = i % 3 ? NAN : 3.0f * tiny[di];
                  break;
                default: /* ordinary */
                  v = (float)(i - 17) * 0.37f;
                  break;
              }
              vals[i] = v;
            }
            for (i = 0; i < NC; i++) {
              uint32_t b = in_encode(vals[i], dt);
              X[i] = in_decode(b, dt);
              if (dt == XTE_DTYPE_FP32)
                in32[i] = b;
              else
                in16[i] = (uint16_t)b;
              if (!isnan(X[i]) && fabs((double)X[i]) > am) am = fabs((double)X[i]);
            }
            want_scale = current_scale_d(am, fmax, 0.0, pc == 1);
            want_sinv = (float)(1.0 / (double)want_scale);
            for (i = 0; i < NC; i++)
              want[i] = fp8_encode((float)((double)X[i] * (double)want_scale), fmt, 1);
            memset(&qt, 0, sizeof qt);
            qt.rowwise = xte_tensor_2d(q, fmt == 0 ? XTE_DTYPE_E4M3 : XTE_DTYPE_E5M2, 1, NC);
            qt.rowwise_scale_inv.data = &sinv;
            qt.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
            qt.rowwise_scale_inv.rows = qt.rowwise_scale_inv.cols = 1;
            qt.scaling_mode = XTE_SCALING_PER_TENSOR;
            qt.recipe = XTE_RECIPE_TE_CURRENT;
            qt.amax = &amax;
            qt.scale = &scale_out;
            cfg.force_pow_2 = pc;
            x = xte_tensor_2d(dt == XTE_DTYPE_FP32 ? (void *)in32 : (void *)in16, dt, 1, NC);
            cr_assert_eq(xte_quantize(&x, &qt, &cfg, NULL), XTE_SUCCESS, "%s", xte_last_error());
            if (fbits(scale_out) != fbits(want_scale) || fbits(sinv) != fbits(want_sinv) ||
                (double)amax != am || memcmp(q, want, NC) != 0) {
              if (fails++ < 8)
                cr_log_error(
                    "%s %s<-%s pow2 %d case %d: scale %a (want %a) scale_inv %a (want "
                    "%a) amax %a (want %a) codes %s",
                    xte_cpu_isa_name((xte_cpu_isa)isa), fmt ? "e5m2" : "e4m3", xte_dtype_name(dt),
                    pc, cs, (double)scale_out, (double)want_scale, (double)sinv, (double)want_sinv,
                    (double)amax, am, memcmp(q, want, NC) ? "differ" : "match");
            }
          }
  }
  xte_cpu_set_isa(saved);
  /* the restatement's own anchors: bf16's tiny amax gives FLT_MAX (not bf16's 0x1.FEp127) */
  cr_expect_eq(current_scale_d(ldexp(1.0, -133), 448.0, 0.0, 0), FLT_MAX);
  cr_expect_eq(current_scale_d(ldexp(1.0, -133), 448.0, 0.0, 1), ldexpf(1.0f, 127));
  cr_expect_eq(current_scale_d(3.0, 448.0, 0.0, 1), 128.0f);
  cr_expect_eq(fails, 0, "%ld failing cases", fails);
}
