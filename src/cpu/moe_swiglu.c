/* CPU SwiGLU: forward, backward, and both fused with 1x128 quantization in one pass. The fused
 * kernels cut the output [M, K] into the 128 x 128 tiles of src/cpu/quantize.c, compute the
 * tile's activation values (rounded to act_dtype) into a tile buffer, then quantize the tile
 * with the same ISA kernels and the same per-block steps as xte_quantize, so the bytes equal
 * quantize(swiglu(x)) composed from the separate calls.
 *
 * The ISA builds (XTE_MOE_VW, src/cpu/avx2/moe_avx2.c, src/cpu/avx512/moe_avx512.c) compute the
 * activation XTE_MOE_VW elements at a time: the per-element formulas of
 * src/numerics/xte_moe_numerics.h transcribed lane by lane (the exp and sigmoid of
 * src/cpu/moe_lanes.h, the branches as selects, the NaN rule of xte_mul_nanprop as a select), so
 * every lane gives the scalar function's bits; the tails of a row run the scalar functions. */
#include <string.h>

#include "cpu/moe_cpu.h"
#include "numerics/xte_moe_numerics.h"
#include "cpu/moe_lanes.h"

#ifndef XTE_MOE_NAME
/* the generic build: the scalar ISA's kernels (see src/cpu/moe_router.c) */
#define XTE_MOE_NAME(x) x##_scalar
#define XTE_MOE_GENERIC 1
#endif

#define TILE 128

static float ld_elem(const xte_moe_view *v, int64_t r, int64_t c) {
  if (v->dtype == XTE_DTYPE_FP32) return ((const float *)v->data)[r * v->ld + c];
  return xte_bf16_to_f32(((const uint16_t *)v->data)[r * v->ld + c]);
}

/* The activation value of output element (r, c), rounded to the output / act dtype. */
static float act_value(const xte_swiglu_args *a, int64_t r, int64_t c, int round_bf16) {
  float v;
  if (!a->backward) {
    v = xte_swiglu_fwd(ld_elem(&a->x, r, c), ld_elem(&a->x, r, c + a->F));
  } else if (c < a->F) {
    v = xte_dswiglu_gate(ld_elem(&a->dy, r, c), ld_elem(&a->x, r, c), ld_elem(&a->x, r, c + a->F));
  } else {
    v = xte_dswiglu_up(ld_elem(&a->dy, r, c - a->F), ld_elem(&a->x, r, c - a->F));
  }
  return round_bf16 ? xte_bf16_to_f32(xte_f32_to_bf16(v)) : v;
}

#ifdef XTE_MOE_VW
/* ---------------------------------------------------------------- lanes
 * Besides the layer of src/cpu/moe_lanes.h, the including file defines the bf16 steps:
 * xv_ld_bf16(p) (XTE_MOE_VW bf16 values at p as fp32), xv_bf16(v) (xte_f32_to_bf16's value of
 * each lane, as fp32: the rounded bf16 widened back) and xv_st_bf16(p, v) (xte_f32_to_bf16 of
 * each lane stored to p). */

/* xte_mul_nanprop(a, b): x86's product gives b's NaN quieted when only b is NaN and 0xFFC00000
 * (XTE_NAN_INVALID) for a NaN it creates; a NaN a is taken explicitly (the compiler may swap the
 * operands of a product, which matters when both are NaN). */
static inline xv mul_nanprop_v(xv a, xv b) {
  return xv_sel(xv_nan(a), xv_add(a, a), xv_mul(a, b));
}

/* xte_siluf: x / (1 + e^-x) for x >= 0, (x e^x) / (1 + e^x) below, -inf -> -0, NaN quieted. */
static inline xv silu_v(xv x) {
  const xm pos = xv_ge(x, xv_1(0.0f));
  const xv e = xv_expf_neg(xv_negif(pos, x));
  xv r = xv_div(xv_sel(pos, x, xv_mul(x, e)), xv_add(xv_1(1.0f), e));
  r = xv_sel(xv_eq(x, xv_1(xte_bits_f32(0xFF800000u))), xv_1(-0.0f), r);
  return xv_sel(xv_nan(x), xv_add(x, x), r);
}

/* xte_dsilu: s fmaf(g, 1 - s, 1) with s = sigmoid(g); NaN quieted. An infinite g needs no
 * select: s is 1 or 0 and the product inf * 0 (in the fma or after it) gives 0xFFC00000. */
static inline xv dsilu_v(xv g) {
  const xv s = xv_sigmoidf(g);
  const xv d = xv_mul(s, xv_fma(g, xv_sub(xv_1(1.0f), s), xv_1(1.0f)));
  return xv_sel(xv_nan(g), xv_add(g, g), d);
}

static inline xv ld_v(const xte_moe_view *v, int64_t r, int64_t c) {
  if (v->dtype == XTE_DTYPE_FP32) return xv_ld((const float *)v->data + r * v->ld + c);
  return xv_ld_bf16((const uint16_t *)v->data + r * v->ld + c);
}
#endif

/* o[j] = the activation value, rounded to bf16 when bf, for j < n of one kind of element:
 * kind 0 the forward's y[r, f + j]; kind 1 the backward's d_gate[r, f + j]; kind 2 its
 * d_up[r, f + j] (output column F + f + j). */
static void act_run(const xte_swiglu_args *a, int kind, int64_t r, int64_t f, int64_t n, int bf,
                    float *o) {
  int64_t j = 0;
#ifdef XTE_MOE_VW
  for (; j + XTE_MOE_VW <= n; j += XTE_MOE_VW) {
    const xv g = ld_v(&a->x, r, f + j);
    xv y;
    if (kind == 0) {
      y = mul_nanprop_v(silu_v(g), ld_v(&a->x, r, f + j + a->F));
    } else if (kind == 1) {
      y = mul_nanprop_v(mul_nanprop_v(ld_v(&a->dy, r, f + j), ld_v(&a->x, r, f + j + a->F)),
                        dsilu_v(g));
    } else {
      y = mul_nanprop_v(ld_v(&a->dy, r, f + j), silu_v(g));
    }
    xv_st(o + j, bf ? xv_bf16(y) : y);
  }
#endif
  for (; j < n; j++) o[j] = act_value(a, r, (kind == 2 ? a->F : 0) + f + j, bf);
}

/* o[j] = act_value(a, r, c + j, bf) for j < n. */
static void act_span(const xte_swiglu_args *a, int64_t r, int64_t c, int64_t n, int bf, float *o) {
  int64_t n1;
  if (!a->backward) {
    act_run(a, 0, r, c, n, bf, o);
    return;
  }
  n1 = c < a->F ? (a->F - c < n ? a->F - c : n) : 0; /* the d_gate columns */
  if (n1 > 0) act_run(a, 1, r, c, n1, bf, o);
  if (n > n1) act_run(a, 2, r, c + n1 - a->F, n - n1, bf, o + n1);
}

#define SPAN 512

static void plain_rows(void *vctx, int64_t b, int64_t e, int tid) {
  const xte_swiglu_args *a = (const xte_swiglu_args *)vctx;
  int64_t r, c, j, n = a->out.cols;
  _Alignas(64) float buf[SPAN];
  (void)tid;
  for (r = b; r < e; r++) {
    if (a->out.dtype == XTE_DTYPE_FP32) {
      act_span(a, r, 0, n, 0, (float *)a->out.data + r * a->out.ld);
      continue;
    }
    for (c = 0; c < n; c += SPAN) {
      uint16_t *d = (uint16_t *)a->out.data + r * a->out.ld + c;
      const int64_t m = n - c < SPAN ? n - c : SPAN;
      act_span(a, r, c, m, 0, buf);
      j = 0;
#ifdef XTE_MOE_VW
      for (; j + XTE_MOE_VW <= m; j += XTE_MOE_VW) xv_st_bf16(d + j, xv_ld(buf + j));
#endif
      for (; j < m; j++) d[j] = xte_f32_to_bf16(buf[j]);
    }
  }
}

typedef struct fctx {
  const xte_swiglu_args *a;
  const xte_quant_kernels *k;
  int64_t ntc;
  float partial[256];
} fctx;

static void fused_tile(fctx *fc, int64_t tr, int64_t tc, float *T, uint8_t *Qt, float *acc,
                       float *sv, float *tamax) {
  const xte_swiglu_args *sa = fc->a;
  const xte_quant_args *a = &sa->q;
  const xte_quant_kernels *k = fc->k;
  const int64_t r0 = tr * TILE, c0 = tc * TILE;
  const int64_t nr = a->M - r0 < TILE ? a->M - r0 : TILE;
  const int64_t nc = a->K - c0 < TILE ? a->K - c0 : TILE;
  const int bf = sa->act_dtype == XTE_DTYPE_BF16;
  int64_t r, j, g;
  float tile_amax = 0.0f;

  for (r = 0; r < nr; r++) act_span(sa, r0 + r, c0, nc, bf, T + r * TILE);

  if (a->row_q) {
    uint8_t *dst = a->row_q + (size_t)r0 * (size_t)a->ld_row_q + (size_t)c0;
    for (r = 0; r < nr; r++) {
      for (j = 0; j < nc; j += a->row_bw) {
        int64_t n = nc - j < a->row_bw ? nc - j : a->row_bw;
        float am = k->amax(T + r * TILE + j, n);
        xte_block_scale s = xte_quant_block_scale(a, am);
        tile_amax = xte_fmaxf(tile_amax, am);
        xte_store_scale(&a->row_s, r0 + r, (c0 + j) / a->row_bw, s);
        k->quant(T + r * TILE + j, n, s.scale, a->fmt, a->saturate, dst + r * a->ld_row_q + j);
      }
    }
  }
  if (a->col_q) {
    const int64_t bh = a->col_bh;
    for (g = 0; g < nr; g += bh) {
      int64_t gr = nr - g < bh ? nr - g : bh;
      int64_t gblk = (r0 + g) / bh;
      for (j = 0; j < nc; j++) acc[j] = 0.0f;
      k->amax_cols(T + g * TILE, gr, nc, TILE, acc);
      for (j = 0; j < nc; j++) {
        xte_block_scale s = xte_quant_block_scale(a, acc[j]);
        tile_amax = xte_fmaxf(tile_amax, acc[j]);
        sv[j] = s.scale;
        if (a->col_transposed)
          xte_store_scale(&a->col_s, c0 + j, gblk, s);
        else
          xte_store_scale(&a->col_s, gblk, c0 + j, s);
      }
      for (r = g; r < g + gr; r++) {
        uint8_t *dst = a->col_transposed
                           ? Qt + r * TILE
                           : a->col_q + (size_t)(r0 + r) * (size_t)a->ld_col_q + (size_t)c0;
        k->quant_vs(T + r * TILE, nc, sv, a->fmt, a->saturate, dst);
      }
    }
    if (a->col_transposed && k->transpose_nt) /* whole 64-byte rows where the ISA has it */
      k->transpose_nt(Qt, nr, nc, TILE, a->col_q + (size_t)c0 * (size_t)a->ld_col_q + (size_t)r0,
                      a->ld_col_q, 0);
    else if (a->col_transposed)
      k->transpose_u8(Qt, nr, nc, TILE, a->col_q + (size_t)c0 * (size_t)a->ld_col_q + (size_t)r0,
                      a->ld_col_q);
  }
  *tamax = xte_fmaxf(*tamax, tile_amax);
}

static void fused_range(void *vctx, int64_t b, int64_t e, int tid) {
  fctx *c = (fctx *)vctx;
  _Alignas(64) float T[TILE * TILE];
  _Alignas(64) uint8_t Qt[TILE * TILE];
  _Alignas(64) float acc[TILE], sv[TILE];
  float am = 0.0f;
  int64_t t;
  for (t = b; t < e; t++) fused_tile(c, t / c->ntc, t % c->ntc, T, Qt, acc, sv, &am);
  c->partial[tid] = xte_fmaxf(c->partial[tid], am);
}

static void zero_scales(const xte_scale_map *m) {
  if (m->data) memset(m->data, 0, (size_t)m->total * 4u);
}

xte_status XTE_MOE_NAME(xte_cpu_moe_swiglu)(const xte_swiglu_args *a, void *handle) {
  (void)handle;
  if (!a->fused) {
    /* an empty [T, 0] tensor has nothing to write, however many rows it claims */
    if (a->T > 0 && a->F > 0) xte_parallel_for(a->T, plain_rows, (void *)a);
    return XTE_SUCCESS;
  }
  {
    fctx c;
    int i;
    int64_t ntr = (a->q.M + TILE - 1) / TILE;
    memset(&c, 0, sizeof c);
    c.a = a;
    c.k = xte_quant_kernels_get();
    c.ntc = (a->q.K + TILE - 1) / TILE;
    zero_scales(&a->q.row_s);
    zero_scales(&a->q.col_s);
    if (a->q.M > 0 && a->q.K > 0) xte_parallel_for(ntr * c.ntc, fused_range, &c);
    if (a->q.amax_out) {
      float am = 0.0f;
      for (i = 0; i < 256; i++) am = xte_fmaxf(am, c.partial[i]);
      *a->q.amax_out = am;
    }
  }
  return XTE_SUCCESS;
}
