/* GEMM test oracle, written independently of the library: FP8 codes are decoded from their bit
 * fields into integers in units of 2^-16, each K block's products are summed exactly in an int128
 * fixed point at 2^-32 (e5m2 x e5m2 products span 2^-32 .. 2^31.6, 128 of them stay below
 * 2^72), and the sum is rounded to fp32 by hand (round to nearest, ties to even). The rest of the
 * contract (include/xte/gemm.h) is written out step by step. Also: helpers that quantize random
 * data into qtensors with xte_quantize and read them back as logical [rows, K] operands. */
#ifndef TEST_GEMM_ORACLE_H
#define TEST_GEMM_ORACLE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xte/xte.h>

typedef __int128 i128;
typedef unsigned __int128 u128;

/* ---------------------------------------------------------------- decoding */
enum { OV_FIN = 0, OV_NAN = 1, OV_PINF = 2, OV_NINF = 3 };

/* code -> integer value in units of 2^-16 (kind OV_FIN), or a special kind */
static inline int64_t o_decode(uint8_t b, xte_dtype dt, int *kind) {
  int neg = b >> 7;
  int64_t v;
  *kind = OV_FIN;
  if (dt == XTE_DTYPE_E4M3) {
    int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) {
      *kind = OV_NAN;
      return 0;
    }
    v = e == 0 ? (int64_t)m << 7 : (int64_t)(8 + m) << (e + 6);
  } else {
    int e = (b >> 2) & 31, m = b & 3;
    if (e == 31) {
      *kind = m ? OV_NAN : (neg ? OV_NINF : OV_PINF);
      return 0;
    }
    v = e == 0 ? (int64_t)m : (int64_t)(4 + m) << (e - 1);
  }
  return neg ? -v : v;
}

static inline float o_e8m0(uint8_t e) {
  if (e == 255) return NAN;
  return ldexpf(1.0f, (int)e - 127);
}

/* |u| * 2^-32, rounded to nearest even fp32 (the value is never subnormal: >= 2^-32 or 0) */
static inline float o_round_i128(i128 s) {
  int neg = s < 0;
  u128 u = neg ? (u128)(-s) : (u128)s;
  int L = 127;
  float f;
  if (u == 0) return 0.0f;
  while (!((u >> L) & 1)) L--;
  if (L < 24) {
    f = (float)(uint64_t)u;
  } else {
    int sh = L - 23;
    u128 q = u >> sh, rem = u & (((u128)1 << sh) - 1), half = (u128)1 << (sh - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    f = ldexpf((float)(uint64_t)q, sh);
  }
  f = ldexpf(f, -32);
  return neg ? -f : f;
}

/* Exact block partial, rounded once: IEEE specials as the contract says. */
static inline float o_partial(const uint8_t *a, xte_dtype da, const uint8_t *b, xte_dtype db,
                              int64_t n) {
  i128 s = 0;
  int nan = 0, pinf = 0, ninf = 0;
  int64_t k;
  for (k = 0; k < n; k++) {
    int ka, kb;
    int64_t va = o_decode(a[k], da, &ka), vb = o_decode(b[k], db, &kb);
    if (ka == OV_NAN || kb == OV_NAN) {
      nan = 1;
    } else if (ka != OV_FIN || kb != OV_FIN) {
      int sa = ka == OV_FIN ? (va < 0) : (ka == OV_NINF);
      int sb = kb == OV_FIN ? (vb < 0) : (kb == OV_NINF);
      if ((ka == OV_FIN && va == 0) || (kb == OV_FIN && vb == 0))
        nan = 1;
      else if (sa ^ sb)
        ninf = 1;
      else
        pinf = 1;
    } else {
      s += (i128)va * (i128)vb;
    }
  }
  if (nan || (pinf && ninf)) return NAN;
  if (pinf) return INFINITY;
  if (ninf) return -INFINITY;
  return o_round_i128(s);
}

static inline uint32_t o_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float o_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t o_bf16(float f) {
  uint32_t u = o_bits(f);
  uint32_t lsb;
  if (isnan(f)) return 0x7FC0;
  lsb = (u >> 16) & 1;
  return (uint16_t)((u + 0x7FFF + lsb) >> 16);
}

/* A logical operand [rows, K]: codes row-major, scales [rows, nkb] (fp32 values). */
typedef struct lop {
  int64_t rows, K, nkb;
  uint8_t *codes;
  float *scales;
  xte_dtype dt;
} lop;

static inline void lop_free(lop *l) {
  free(l->codes);
  free(l->scales);
  memset(l, 0, sizeof *l);
}

/* The oracle: D (fp32 or bf16, [M, N], ld N) for rows [0, M); C optional (same dtype rules). */
typedef struct ocfg {
  int kblock;
  const void *c;
  xte_dtype c_dt;
  const float *bias;
  xte_dtype d_dt;
} ocfg;

static inline void o_gemm(const lop *A, const lop *B, const ocfg *cf, void *D) {
  int64_t m, n, kb;
  for (m = 0; m < A->rows; m++)
    for (n = 0; n < B->rows; n++) {
      float acc = 0.0f, t;
      for (kb = 0; kb * cf->kblock < A->K; kb++) {
        int64_t k0 = kb * cf->kblock;
        int64_t len = A->K - k0 < cf->kblock ? A->K - k0 : cf->kblock;
        volatile float p =
            o_partial(A->codes + m * A->K + k0, A->dt, B->codes + n * B->K + k0, B->dt, len);
        volatile float s = A->scales[m * A->nkb + kb] * B->scales[n * B->nkb + kb];
        acc = fmaf(p, s, acc);
      }
      t = acc;
      if (cf->c) {
        float cv = cf->c_dt == XTE_DTYPE_BF16
                       ? o_float((uint32_t)((const uint16_t *)cf->c)[m * B->rows + n] << 16)
                       : ((const float *)cf->c)[m * B->rows + n];
        volatile float tt = t + cv;
        t = tt;
      }
      if (cf->bias) {
        volatile float tt = t + cf->bias[n];
        t = tt;
      }
      if (cf->d_dt == XTE_DTYPE_BF16)
        ((uint16_t *)D)[m * B->rows + n] = o_bf16(t);
      else
        ((uint32_t *)D)[m * B->rows + n] = isnan(t) ? 0x7FC00000u : o_bits(t);
    }
}

/* ---------------------------------------------------------------- ISAs
 * Tests that sweep the ISAs themselves go through o_set_isa: every ISA this machine and build run,
 * or, when XTE_CPU_ISA names one (ctest's per-ISA runs), that one only; o_reset_isa returns to the
 * ISA the process started with (the environment's choice). */
static int o_isa0 = -1;

/* Records the ISA in use (first call only): call before any xte_cpu_set_isa */
static inline void o_isa_start(void) {
  if (o_isa0 < 0) o_isa0 = (int)xte_cpu_get_isa();
}

static inline xte_status o_set_isa(xte_cpu_isa isa) {
  const char *env = getenv("XTE_CPU_ISA");
  o_isa_start();
  if (env && *env && strcmp(env, xte_cpu_isa_name(isa)) != 0) return XTE_ERROR_UNSUPPORTED;
  return xte_cpu_set_isa(isa);
}

static inline void o_reset_isa(void) {
  if (o_isa0 >= 0) (void)xte_cpu_set_isa((xte_cpu_isa)o_isa0);
}

/* ---------------------------------------------------------------- quantized inputs */
static inline uint64_t o_rng(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}
static inline double o_unif(uint64_t *s) {
  return (double)(o_rng(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* random fp32 [R, C]: values in (-1, 1) times 2^e, e varying by row and by 64-column stripe */
static inline float *o_random(int64_t R, int64_t C, uint64_t seed) {
  float *x = (float *)malloc(sizeof(float) * (size_t)(R * C > 0 ? R * C : 1));
  uint64_t s = seed * 2654435761u + 12345;
  int64_t r, c;
  for (r = 0; r < R; r++) {
    int er = (int)(o_rng(&s) % 13) - 6;
    for (c = 0; c < C; c++) {
      int ec = (int)((c / 64 + r) % 5) - 2;
      x[r * C + c] = (float)ldexp(2.0 * o_unif(&s) - 1.0, er + ec);
    }
  }
  return x;
}

typedef struct tq {
  xte_qtensor q;
  int64_t R, C; /* the quantized tensor X */
} tq;

static inline void tq_free(tq *t) {
  free(t->q.rowwise.data);
  free(t->q.columnwise.data);
  free(t->q.rowwise_scale_inv.data);
  free(t->q.columnwise_scale_inv.data);
  memset(t, 0, sizeof *t);
}

static inline int o_is_mx(xte_recipe r) {
  return r == XTE_RECIPE_MX_TE || r == XTE_RECIPE_MX_OCP;
}
static inline int o_col_transposed(xte_recipe r) {
  return !(r == XTE_RECIPE_MTFP8 || o_is_mx(r));
}

/* Quantizes x [R, C] into both copies with the given layout. Returns the quantize status. */
static inline xte_status tq_make(tq *t, const float *x, int64_t R, int64_t C, xte_scaling_mode mode,
                                 xte_recipe recipe, xte_scale_layout layout, xte_dtype dt) {
  xte_tensor in = xte_tensor_2d((void *)x, XTE_DTYPE_FP32, R, C);
  int64_t sr, sc;
  size_t es = o_is_mx(recipe) ? 1 : 4;
  int c;
  memset(t, 0, sizeof *t);
  t->R = R;
  t->C = C;
  t->q.scaling_mode = mode;
  t->q.recipe = recipe;
  t->q.rowwise = xte_tensor_2d(malloc((size_t)(R * C + 1)), dt, R, C);
  if (o_col_transposed(recipe))
    t->q.columnwise = xte_tensor_2d(malloc((size_t)(R * C + 1)), dt, C, R);
  else
    t->q.columnwise = xte_tensor_2d(malloc((size_t)(R * C + 1)), dt, R, C);
  for (c = 0; c < 2; c++) {
    xte_scale_tensor *s = c ? &t->q.columnwise_scale_inv : &t->q.rowwise_scale_inv;
    xte_status st = xte_quantize_scale_shape(R, C, mode, recipe, layout, c, &sr, &sc);
    if (st != XTE_SUCCESS) return st;
    s->data = calloc((size_t)(sr * sc + 1), es);
    s->dtype = o_is_mx(recipe) ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
    s->rows = sr;
    s->cols = sc;
    s->layout = layout;
  }
  return xte_quantize(&in, &t->q, NULL, NULL);
}

static inline int64_t o_cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

/* The logical operand op(X) (trans = 0: X [rows, K]; 1: X^T) of a COMPACT-layout tq, read from
 * the copy whose blocks run along K. */
static inline void tq_logical(const tq *t, int trans, lop *l) {
  xte_scaling_mode mode = t->q.scaling_mode;
  xte_recipe rc = t->q.recipe;
  int B = mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  int mx = o_is_mx(rc);
  int64_t R = t->R, C = t->C, i, k;
  l->rows = trans ? C : R;
  l->K = trans ? R : C;
  l->nkb = o_cdiv(l->K, B);
  l->dt = t->q.rowwise.dtype;
  l->codes = (uint8_t *)malloc((size_t)(l->rows * l->K + 1));
  l->scales = (float *)malloc(sizeof(float) * (size_t)(l->rows * l->nkb + 1));
  for (i = 0; i < l->rows; i++)
    for (k = 0; k < l->K; k++) {
      /* copy coordinates (r, c), the copy's data / scales and block (bh, bw) */
      const uint8_t *data;
      const void *sc;
      int64_t r, c, ccols, bh, bw;
      if (mode == XTE_SCALING_PER_TENSOR || mode == XTE_SCALING_BLOCK_128x128 || !trans) {
        data = (const uint8_t *)t->q.rowwise.data;
        sc = t->q.rowwise_scale_inv.data;
        r = trans ? k : i;
        c = trans ? i : k;
        ccols = C;
        bh = mode == XTE_SCALING_PER_TENSOR ? (1 << 30)
                                            : (mode == XTE_SCALING_BLOCK_128x128 ? 128 : 1);
        bw = mode == XTE_SCALING_PER_TENSOR ? (1 << 30) : B;
      } else if (o_col_transposed(rc)) { /* copy X^T [C, R], 1xB along its rows */
        data = (const uint8_t *)t->q.columnwise.data;
        sc = t->q.columnwise_scale_inv.data;
        r = i;
        c = k;
        ccols = R;
        bh = 1;
        bw = B;
      } else { /* copy X [R, C] in Bx1 blocks */
        data = (const uint8_t *)t->q.columnwise.data;
        sc = t->q.columnwise_scale_inv.data;
        r = k;
        c = i;
        ccols = C;
        bh = B;
        bw = 1;
      }
      l->codes[i * l->K + k] = data[r * ccols + c];
      if (k % B == 0) {
        int64_t idx = (r / bh) * o_cdiv(ccols, bw) + c / bw;
        if (mode == XTE_SCALING_PER_TENSOR) idx = 0;
        l->scales[i * l->nkb + k / B] =
            mx ? o_e8m0(((const uint8_t *)sc)[idx]) : ((const float *)sc)[idx];
      }
    }
}

#endif /* TEST_GEMM_ORACLE_H */
