/* Exhaustive accuracy test of the deterministic math in src/numerics/xte_math.h: every fp32 input
 * in each function's relevant range (listed in RANGES below) is evaluated and compared with an
 * fp64 libm reference; the error is measured in ulps of the correctly rounded fp32 result
 * (ulp(ref) = 2^(floor(log2|ref|) - 23), never below 2^-149). A result that overflows to inf is
 * exact when the reference rounds to inf in fp32.
 *
 * The maximum error per function is printed ("xte_math <fn>: max ulp ... at x = ...") and
 * asserted against the bound docs/numerics.md section 8 states. exp and log must be within 1 ulp.
 *
 * Outside the swept ranges the functions are constant or trivially exact (exp -> 0 / inf,
 * tanh -> +-1, softplus -> x, ...); those regions are checked on a stride of 2^12 bit patterns.
 *
 * The sweep runs on XTE_TEST_THREADS threads (default 2). */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/xte_math.h"

/* ------------------------------------------------------------------ references (fp64 libm) */

static double ref_exp(double x) {
  return exp(x);
}
static double ref_exp2(double x) {
  return exp2(x);
}
static double ref_expm1(double x) {
  return expm1(x);
}
static double ref_log(double x) {
  return log(x);
}
static double ref_log1p(double x) {
  return log1p(x);
}
static double ref_tanh(double x) {
  return tanh(x);
}
static double ref_sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}
static double ref_softplus(double x) {
  return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}
static double ref_sqrtsoftplus(double x) {
  return sqrt(ref_softplus(x));
}
static double ref_silu(double x) {
  if (isinf(x)) return x > 0 ? x : -0.0;
  return x * ref_sigmoid(x);
}

/* ------------------------------------------------------------------ functions under test */

static float f_exp(float x) {
  return xte_expf(x);
}
static float f_exp2(float x) {
  return xte_exp2f(x);
}
static float f_expm1(float x) {
  return xte_expm1f(x);
}
static float f_log(float x) {
  return xte_logf(x);
}
static float f_log1p(float x) {
  return xte_log1pf(x);
}
static float f_tanh(float x) {
  return xte_tanhf(x);
}
static float f_sigmoid(float x) {
  return xte_sigmoidf(x);
}
static float f_softplus(float x) {
  return xte_softplusf(x);
}
static float f_sqrtsoftplus(float x) {
  return xte_sqrtsoftplusf(x);
}
static float f_silu(float x) {
  return xte_siluf(x);
}

typedef struct mfn {
  const char *name;
  float (*f)(float);
  double (*ref)(double);
  float lo, hi; /* the exhaustive range [lo, hi] ... */
  float tiny;   /* ... less the magnitudes below tiny (trivial there: 1, x, x/2, ln 2) */
  double floor; /* the ulp is never taken below this (silu: absolute error near 0) */
  double bound; /* asserted max ulp error (all inputs) */
} mfn;

static double g_floor; /* set per function before a sweep (one function at a time) */

/* ulps of error of y against the exact value r. */
static double ulp_err(float y, double r) {
  int e;
  double ulp, d;
  if (!isnan(r) && y == (float)r && fabs(r) <= 3.4028234663852886e38) { /* correctly rounded */
    if (r == 0.0) return 0.0;
    frexp(r, &e);
    ulp = ldexp(1.0, (e - 1 - 23) < -149 ? -149 : (e - 1 - 23));
    if (ulp < g_floor) ulp = g_floor;
    return fabs((double)y - r) / ulp;
  }
  if (isnan(r)) return isnan(y) ? 0.0 : INFINITY;
  if (isnan(y)) return INFINITY;
  if (isinf(y) || isinf(r) || fabs(r) > 3.4028235677973366e38) {
    float rf = (float)r; /* RNE to fp32: +-inf when r is past the rounding threshold */
    return (isinf(rf) && y == rf) ? 0.0 : (y == rf ? 0.0 : INFINITY);
  }
  if (r == 0.0) return y == 0.0f ? 0.0 : fabs((double)y) / fmax(ldexp(1.0, -149), g_floor);
  frexp(r, &e); /* |r| in [2^(e-1), 2^e) */
  ulp = ldexp(1.0, (e - 1 - 23) < -149 ? -149 : (e - 1 - 23));
  if (ulp < g_floor) ulp = g_floor;
  d = fabs((double)y - r);
  return d / ulp;
}

typedef struct sweep {
  const mfn *fn;
  uint32_t b0, b1; /* bit patterns [b0, b1) of one sign, ascending magnitude */
  uint32_t stride;
  int neg;
  double max_err;
  float worst;
} sweep;

static void *sweep_run(void *v) {
  sweep *s = (sweep *)v;
  uint64_t b;
  for (b = s->b0; b < s->b1; b += s->stride) {
    float x = xte_bits_f32((uint32_t)b | (s->neg ? 0x80000000u : 0u));
    float y = s->fn->f(x);
    double r = s->fn->ref((double)x), e;
    /* a correctly rounded result is within 0.5 ulp: it cannot raise a max already >= 0.5 */
    if (s->max_err >= 0.5 && y == (float)r && !isnan(r)) continue;
    e = ulp_err(y, r);
    if (e > s->max_err || isnan(e)) {
      s->max_err = isnan(e) ? INFINITY : e;
      s->worst = x;
    }
  }
  return NULL;
}

static int nthreads(void) {
  const char *e = getenv("XTE_TEST_THREADS");
  int n = e ? atoi(e) : 2;
  return n < 1 ? 1 : (n > 64 ? 64 : n);
}

/* Sweeps the magnitudes with bit patterns in [b0, b1) of the given sign on the thread pool;
 * returns the max ulp error and its input. */
static void sweep_bits(const mfn *fn, uint32_t b0, uint32_t b1, uint32_t stride, int neg,
                       double *max_err, float *worst) {
  int nt = nthreads(), i;
  pthread_t th[64];
  sweep sw[64];
  uint64_t n = ((uint64_t)b1 - b0 + stride - 1) / stride;
  for (i = 0; i < nt; i++) {
    uint64_t s0 = n * (uint64_t)i / (uint64_t)nt, s1 = n * (uint64_t)(i + 1) / (uint64_t)nt;
    sw[i].fn = fn;
    sw[i].b0 = (uint32_t)(b0 + s0 * stride);
    sw[i].b1 = (uint32_t)((uint64_t)b0 + s1 * stride < b1 ? (uint64_t)b0 + s1 * stride : b1);
    sw[i].stride = stride;
    sw[i].neg = neg;
    sw[i].max_err = 0.0;
    sw[i].worst = 0.0f;
    pthread_create(&th[i], NULL, sweep_run, &sw[i]);
  }
  for (i = 0; i < nt; i++) {
    pthread_join(th[i], NULL);
    if (sw[i].max_err > *max_err) {
      *max_err = sw[i].max_err;
      *worst = sw[i].worst;
    }
  }
}

/* bit pattern of the magnitude |v| */
static uint32_t mag_bits(float v) {
  return xte_f32_bits(v) & 0x7FFFFFFFu;
}

static void check_fn(const mfn *fn) {
  double exh = 0.0, str = 0.0;
  float wx = 0.0f, ws = 0.0f;
  int sgn;
  g_floor = fn->floor;
  /* exhaustive part: [lo, hi] split at 0 into its two signs */
  for (sgn = 0; sgn < 2; sgn++) {
    float a = sgn ? (fn->hi < 0 ? -fn->hi : 0.0f) : (fn->lo > 0 ? fn->lo : 0.0f);
    float b = sgn ? (fn->lo < 0 ? -fn->lo : -1.0f) : (fn->hi >= 0 ? fn->hi : -1.0f);
    if (b < 0) continue;
    if (a < fn->tiny) a = fn->tiny;
    if (b < a) continue;
    sweep_bits(fn, mag_bits(a), mag_bits(b) + 1, 1, sgn, &exh, &wx);
  }
  /* the rest of the fp32 line, NaNs and infinities included, on a stride */
  for (sgn = 0; sgn < 2; sgn++) sweep_bits(fn, 0, 0x7FFFFFFFu, 4096, sgn, &str, &ws);
  {
    const float sp[] = {INFINITY, -INFINITY, 0.0f, -0.0f, NAN};
    size_t i;
    for (i = 0; i < sizeof sp / sizeof sp[0]; i++) {
      double e = ulp_err(fn->f(sp[i]), fn->ref((double)sp[i]));
      if (e > str) {
        str = e;
        ws = sp[i];
      }
    }
  }
  printf(
      "xte_math %-13s max ulp %.4f at x = %.9g (0x%08X) over [%g, %g] (|x| >= %g) "
      "exhaustively; %.4f at x = %.9g on the whole line (stride 2^12); bound %.2f\n",
      fn->name, exh, (double)wx, (unsigned)xte_f32_bits(wx), (double)fn->lo, (double)fn->hi,
      (double)fn->tiny, str, (double)ws, fn->bound);
  fflush(stdout);
  cr_expect(exh <= fn->bound, "%s: %.4f ulp at x = %.9g exceeds the bound %.2f", fn->name, exh,
            (double)wx, fn->bound);
  cr_expect(str <= fn->bound, "%s: %.4f ulp at x = %.9g exceeds the bound %.2f", fn->name, str,
            (double)ws, fn->bound);
}

/* The ranges: every fp32 where the function is neither constant nor the identity up to
 * rounding, and the bounds stated in docs/numerics.md section 8. */
#define T26 1.490116119384765625e-8f    /* 2^-26 */
#define T30 9.31322574615478515625e-10f /* 2^-30 */
static const mfn FN_EXP = {"exp", f_exp, ref_exp, -104.0f, 89.0f, T26, 0.0, 1.0};
static const mfn FN_EXP2 = {"exp2", f_exp2, ref_exp2, -150.0f, 128.0f, T26, 0.0, 1.0};
static const mfn FN_EXPM1 = {"expm1", f_expm1, ref_expm1, -18.0f, 89.0f, T30, 0.0, 1.5};
static const mfn FN_LOG = {"log", f_log, ref_log, 0.0f, INFINITY, 0.0f, 0.0, 1.0};
static const mfn FN_LOG1P = {"log1p", f_log1p, ref_log1p, -1.0f, 33554432.0f, T30, 0.0, 1.5};
static const mfn FN_TANH = {"tanh", f_tanh, ref_tanh, -10.0f, 10.0f, T30, 0.0, 2.5};
static const mfn FN_SIGMOID = {"sigmoid", f_sigmoid, ref_sigmoid, -105.0f, 18.0f, T30, 0.0, 2.5};
static const mfn FN_SOFTPLUS = {"softplus", f_softplus, ref_softplus, -105.0f,
                                21.0f,      T30,        0.0,          2.0};
static const mfn FN_SQRTSP = {
    "sqrtsoftplus", f_sqrtsoftplus, ref_sqrtsoftplus, -105.0f, 21.0f, T30, 0.0, 2.0};
static const mfn FN_SILU = {"silu", f_silu, ref_silu, -105.0f, 18.0f, T30, 1.1754943508222875e-38,
                            3.5};

Test(math_exhaustive, exp, .timeout = 900) {
  check_fn(&FN_EXP);
}
Test(math_exhaustive, exp2, .timeout = 900) {
  check_fn(&FN_EXP2);
}
Test(math_exhaustive, expm1, .timeout = 900) {
  check_fn(&FN_EXPM1);
}
Test(math_exhaustive, log, .timeout = 900) {
  check_fn(&FN_LOG);
}
Test(math_exhaustive, log1p, .timeout = 900) {
  check_fn(&FN_LOG1P);
}
Test(math_exhaustive, tanh, .timeout = 900) {
  check_fn(&FN_TANH);
}
Test(math_exhaustive, sigmoid, .timeout = 900) {
  check_fn(&FN_SIGMOID);
}
Test(math_exhaustive, softplus, .timeout = 900) {
  check_fn(&FN_SOFTPLUS);
}
Test(math_exhaustive, sqrtsoftplus, .timeout = 900) {
  check_fn(&FN_SQRTSP);
}
Test(math_exhaustive, silu, .timeout = 900) {
  check_fn(&FN_SILU);
}

/* Odd / even symmetries and the special values the contract names. */
Test(math_exhaustive, special_values) {
  cr_expect(xte_f32_bits(xte_expf(-INFINITY)) == 0u);
  cr_expect(xte_expf(INFINITY) == INFINITY);
  cr_expect(xte_logf(0.0f) == -INFINITY);
  cr_expect(xte_logf(-0.0f) == -INFINITY);
  cr_expect(isnan(xte_logf(-1.0f)));
  cr_expect(xte_logf(1.0f) == 0.0f);
  cr_expect(xte_expf(0.0f) == 1.0f);
  cr_expect(xte_log1pf(-1.0f) == -INFINITY);
  cr_expect(xte_sigmoidf(0.0f) == 0.5f);
  cr_expect(xte_siluf(-INFINITY) == 0.0f);
  cr_expect(xte_siluf(INFINITY) == INFINITY);
  cr_expect(xte_tanhf(INFINITY) == 1.0f && xte_tanhf(-INFINITY) == -1.0f);
  cr_expect(xte_softplusf(INFINITY) == INFINITY);
  cr_expect(xte_softplusf(-INFINITY) == 0.0f);
}
