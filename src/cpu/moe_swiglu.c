/* CPU SwiGLU: forward, backward, and both fused with 1x128 quantization in one pass. The fused
 * kernels compute the activation values (rounded to act_dtype) of chunks of 128-row bands of the
 * output [M, K] into a buffer that stays in L2, then quantize its 128 x 128 tiles with the same
 * ISA kernels and the same per-block steps as xte_quantize's tiles (src/cpu/quantize.c), so the
 * bytes equal quantize(swiglu(x)) composed from the separate calls. The backward computes d_gate
 * and d_up of an element together, from one exp.
 *
 * The ISA builds (XTE_MOE_VW, src/cpu/avx2/moe_avx2.c, src/cpu/avx512/moe_avx512.c) compute the
 * activation XTE_MOE_VW elements at a time: the per-element formulas of
 * src/numerics/xte_moe_numerics.h transcribed lane by lane (the exp and sigmoid of
 * src/cpu/moe_lanes.h, the branches as selects, the NaN rule of xte_mul_nanprop as a select), so
 * every lane gives the scalar function's bits; the tails of a row run the scalar functions. */
#include <stdlib.h>
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
 * xv_ld_bf16(p) (XTE_MOE_VW bf16 values at p as fp32) and xv_st_bf16(p, v) (xte_f32_to_bf16 of
 * each lane stored to p). */

/* xte_mul_nanprop(a, b): x86's product gives b's NaN quieted when only b is NaN and 0xFFC00000
 * (XTE_NAN_INVALID) for a NaN it creates; a NaN a is taken explicitly (the compiler may swap the
 * operands of a product, which matters when both are NaN). */
static inline xv mul_nanprop_v(xv a, xv b) {
  return xv_sel(xv_nan(a), xv_add(a, a), xv_mul(a, b));
}

/* xte_siluf from e = e^-|x| (pos: x >= 0) and den = 1 + e: x / den for x >= 0, (x e) / den
 * below, -inf -> -0, NaN quieted. */
static inline xv silu_e(xv x, xm pos, xv e, xv den) {
  xv r = xv_div(xv_sel(pos, x, xv_mul(x, e)), den);
  r = xv_sel(xv_eq(x, xv_1(xte_bits_f32(0xFF800000u))), xv_1(-0.0f), r);
  return xv_sel(xv_nan(x), xv_add(x, x), r);
}

/* xte_dsilu from the same e and den: s fmaf(g, 1 - s, 1) with s = sigmoid(g) = 1 / den for
 * g >= 0, e / den below (xte_sigmoidf's); NaN quieted. An infinite g needs no select: s is 1 or 0
 * and the product inf * 0 (in the fma or after it) gives 0xFFC00000. */
static inline xv dsilu_e(xv g, xm pos, xv e, xv den) {
  const xv s = xv_div(xv_sel(pos, xv_1(1.0f), e), den);
  const xv d = xv_mul(s, xv_fma(g, xv_sub(xv_1(1.0f), s), xv_1(1.0f)));
  return xv_sel(xv_nan(g), xv_add(g, g), d);
}

/* pos = x >= 0 and e = e^-|x| (x NaN: x), the one exp of silu and dsilu (xte_expf of -x for
 * x >= 0, of x below, as xte_siluf and xte_sigmoidf take it). For x >= 0, e enters only through
 * den = 1 + e, which is 1 exactly once e < 2^-24 (x > 16.7): the exp of such an x is taken at
 * -min(x, 86) instead, the same den and the same bits, so that a large positive x makes no
 * subnormal e (e^-x < 2^-126 from x > 87.3), whose operations cost a microcode assist each (about
 * 100 cycles), and keeps the avx2 exp on its fast path (every lane in [-86, 88]). A negative x
 * keeps its exact exp: its subnormal e and products are the result's bits. */
#define SILU_EXP(x, pos, e)              \
  const xm pos = xv_ge((x), xv_1(0.0f)); \
  const xv e = xv_expf_neg(xv_sel(pos, xv_max(xv_neg(x), xv_1(-86.0f)), (x)))

#if defined(__GNUC__)
#define XTE_SWIGLU_AI static inline __attribute__((always_inline))
#else
#define XTE_SWIGLU_AI static inline
#endif

/* XTE_MOE_VW elements at p of a row of bf16 (b) or fp32 values, as fp32 */
XTE_SWIGLU_AI xv ld_v(const void *p, int b, int64_t j) {
  return b ? xv_ld_bf16((const uint16_t *)p + j) : xv_ld((const float *)p + j);
}

/* Stores v (fp32 lanes) to element j of a row of dtype bf16 (rounded) or fp32. */
XTE_SWIGLU_AI void st_v(void *row, int bf, int64_t j, xv v) {
  if (bf)
    xv_st_bf16((uint16_t *)row + j, v);
  else
    xv_st((float *)row + j, v);
}

/* act_row's vector part over the whole vectors of n: g, u, dy rows of bf16 (xb, db) or fp32,
 * the outputs bf16 (ob) or fp32; always inlined with constant flags, so that each combination is
 * a loop of its own with no dtype tests. Returns the elements done. */
XTE_SWIGLU_AI int64_t act_vec(const void *gp, const void *up, const void *dp, int64_t n, void *o0,
                              void *o1, int bwd, int xb, int db, int ob) {
  int64_t j = 0;
  if (!bwd) {
    for (; j + XTE_MOE_VW <= n; j += XTE_MOE_VW) {
      const xv g = ld_v(gp, xb, j);
      SILU_EXP(g, pos, e);
      /* mul_nanprop(silu(g), u) with one NaN select: silu of a non-NaN g is not NaN (-inf gives
       * -0), and a NaN g gives g quieted either way */
      xv y = xv_div(xv_sel(pos, g, xv_mul(g, e)), xv_add(xv_1(1.0f), e));
      y = xv_sel(xv_eq(g, xv_1(xte_bits_f32(0xFF800000u))), xv_1(-0.0f), y);
      y = xv_sel(xv_nan(g), xv_add(g, g), xv_mul(y, ld_v(up, xb, j)));
      st_v(o0, ob, j, y);
    }
  } else {
    for (; j + XTE_MOE_VW <= n; j += XTE_MOE_VW) {
      const xv g = ld_v(gp, xb, j), d = ld_v(dp, db, j);
      SILU_EXP(g, pos, e);
      const xv den = xv_add(xv_1(1.0f), e);
      st_v(o0, ob, j, mul_nanprop_v(mul_nanprop_v(d, ld_v(up, xb, j)), dsilu_e(g, pos, e, den)));
      st_v(o1, ob, j, mul_nanprop_v(d, silu_e(g, pos, e, den)));
    }
  }
  return j;
}
#endif

static inline void st_1(void *row, int bf, int64_t j, float v) {
  if (bf)
    ((uint16_t *)row)[j] = xte_f32_to_bf16(v);
  else
    ((float *)row)[j] = v;
}

/* Row r, columns f .. f + n - 1 of the activation, stored rounded to bf16 (bf) or as fp32:
 * forward, y[r, f + j] to o0[j]; backward, d_gate[r, f + j] to o0[j] and d_up[r, f + j] (output
 * column F + f + j) to o1[j], both from one exp per element. */
static void act_row(const xte_swiglu_args *a, int64_t r, int64_t f, int64_t n, int bf, void *o0,
                    void *o1) {
  int64_t j = 0;
#ifdef XTE_MOE_VW
  {
    const int xb = a->x.dtype != XTE_DTYPE_FP32, db = a->dy.dtype != XTE_DTYPE_FP32;
    const size_t ex = xb ? 2u : 4u, ed = db ? 2u : 4u;
    const char *gp = (const char *)a->x.data + (size_t)(r * a->x.ld + f) * ex;
    const char *up = gp + (size_t)a->F * ex;
    const char *dp =
        a->backward ? (const char *)a->dy.data + (size_t)(r * a->dy.ld + f) * ed : NULL;
#define ACT_VEC(bwd, xb, db, ob) act_vec(gp, up, dp, n, o0, o1, bwd, xb, db, ob)
    if (!a->backward)
      j = xb ? (bf ? ACT_VEC(0, 1, 0, 1) : ACT_VEC(0, 1, 0, 0))
             : (bf ? ACT_VEC(0, 0, 0, 1) : ACT_VEC(0, 0, 0, 0));
    else if (xb)
      j = db ? (bf ? ACT_VEC(1, 1, 1, 1) : ACT_VEC(1, 1, 1, 0))
             : (bf ? ACT_VEC(1, 1, 0, 1) : ACT_VEC(1, 1, 0, 0));
    else
      j = db ? (bf ? ACT_VEC(1, 0, 1, 1) : ACT_VEC(1, 0, 1, 0))
             : (bf ? ACT_VEC(1, 0, 0, 1) : ACT_VEC(1, 0, 0, 0));
#undef ACT_VEC
  }
#endif
  for (; j < n; j++) {
    st_1(o0, bf, j, act_value(a, r, f + j, 0));
    if (a->backward) st_1(o1, bf, j, act_value(a, r, a->F + f + j, 0));
  }
}

/* The activation values of row r, output columns c .. c + n - 1, into o (bf16 or fp32): the
 * backward's output columns [0, F) are d_gate, [F, 2F) d_up. */
static void act_span(const xte_swiglu_args *a, int64_t r, int64_t c, int64_t n, int bf, void *o) {
  const size_t es = bf ? 2u : 4u;
  int64_t n1;
  if (!a->backward) {
    act_row(a, r, c, n, bf, o, NULL);
    return;
  }
  {
    /* a scratch row for the half of each pair that this span does not want */
    _Alignas(64) float junk[TILE];
    int64_t j, m;
    n1 = c < a->F ? (a->F - c < n ? a->F - c : n) : 0; /* the d_gate columns */
    for (j = 0; j < n1; j += m) {
      m = n1 - j < TILE ? n1 - j : TILE;
      act_row(a, r, c + j, m, bf, (char *)o + (size_t)j * es, junk);
    }
    for (j = n1; j < n; j += m) {
      m = n - j < TILE ? n - j : TILE;
      act_row(a, r, c + j - a->F, m, bf, junk, (char *)o + (size_t)j * es);
    }
  }
}

static void plain_rows(void *vctx, int64_t b, int64_t e, int tid) {
  const xte_swiglu_args *a = (const xte_swiglu_args *)vctx;
  const int bf = a->out.dtype != XTE_DTYPE_FP32;
  const size_t es = bf ? 2u : 4u;
  int64_t r;
  (void)tid;
  for (r = b; r < e; r++) {
    char *row = (char *)a->out.data + (size_t)(r * a->out.ld) * es;
    act_row(a, r, 0, a->F, bf, row, a->backward ? row + (size_t)a->F * es : NULL);
  }
}

/* ---------------------------------------------------------------- fused
 * A work item is a chunk of a 128-row band of the output: rows r0 .. r0 + 127, W activation
 * columns (W a multiple of 128; with the backward when F is a multiple of 128, W d_gate columns
 * and their W d_up columns, from one exp per element), computed row by row into a buffer in
 * act_dtype (the bytes the separate quantize would read) that stays in L2, then quantized there
 * tile by tile by the kernels and the steps of src/cpu/quantize.c's tiles: quant_rc (both copies
 * from one read) where the ISA has it and the tile takes it, else quant_blocks / load_amax /
 * block_scales / load_quant_vs; the transposed copy by transpose_nt, streaming past the L2s as
 * xte_quantize does. The input is read in runs of W elements per row, which the hardware
 * prefetchers follow (128-column tiles read 128 separate runs of 256 or 512 bytes, which they do
 * not, and the activation waited on memory). */
#define SLICE 16
/* the activation buffers of an item: at most half the L2, at most CHUNK_BYTES */
#define CHUNK_BYTES ((size_t)512 << 10)

typedef struct fbuf {
  _Alignas(64) float T[TILE * TILE]; /* one tile, where the chunk buffers cannot be had */
  _Alignas(64) uint8_t Qt[TILE * TILE];
  _Alignas(64) float acc[TILE];
  _Alignas(64) float sv[TILE];
  xte_block_scale sc[TILE * 8];
  xte_block_scale rs[TILE], cs[TILE];
} fbuf;

typedef struct fctx {
  const xte_swiglu_args *a;
  const xte_quant_kernels *k;
  int64_t kact; /* activation columns an item's chunks cover: F with pairs, else the output's K */
  int64_t W;    /* activation columns per item (a multiple of TILE) */
  int64_t nic;  /* items per band */
  int pair;     /* backward, F % TILE == 0: an item makes its d_gate columns and their d_up ones */
  int nt;       /* streaming stores for the fp8 copies */
  float partial[256];
} fctx;

/* Quantizes the nr x nc tile at output (r0, c0) from src (kind q->in_kind, row stride lds). */
static void quant_buf_tile(const fctx *fc, int64_t r0, int64_t c0, int64_t nr, int64_t nc,
                           const void *src, int64_t lds, fbuf *B, float *tamax) {
  const xte_quant_args *a = &fc->a->q;
  const xte_quant_kernels *k = fc->k;
  const size_t es = a->in_kind == XTE_NUM_IN_F32 ? 4u : 2u;
  const int nt = fc->nt;
  int64_t r, j, g, n;
  float tile_amax = 0.0f, am;
#define SRC(r) ((const char *)src + (size_t)(r) * (size_t)lds * es)
  if (k->quant_rc && a->row_q && a->col_q && a->col_transposed && a->row_bw == TILE &&
      a->col_bh == TILE && nc == TILE &&
      k->quant_rc(src, lds, nr, a, a->row_q + (size_t)r0 * (size_t)a->ld_row_q + (size_t)c0,
                  a->ld_row_q, B->rs, B->Qt, B->cs, &am, NULL, 0, nt)) {
    for (r = 0; r < nr; r++) xte_store_scale(&a->row_s, r0 + r, c0 / TILE, B->rs[r]);
    for (j = 0; j < nc; j++) xte_store_scale(&a->col_s, c0 + j, r0 / TILE, B->cs[j]);
    tile_amax = am;
  } else {
    const int64_t bw = a->row_bw, bh = a->col_bh, nbr = (nc + bw - 1) / bw;
    for (g = 0; g < nr; g += bh) {
      const int64_t gr = nr - g < bh ? nr - g : bh, gblk = (r0 + g) / bh;
      if (a->col_q)
        for (j = 0; j < nc; j++) B->acc[j] = 0.0f;
      for (r = g; r < g + gr; r += n) {
        n = g + gr - r < SLICE ? g + gr - r : SLICE;
        if (a->row_q) {
          int64_t i, rr;
          am = k->quant_blocks(SRC(r), lds, a->in_kind, n, nc, bw, a,
                               a->row_q + (size_t)(r0 + r) * (size_t)a->ld_row_q + (size_t)c0,
                               a->ld_row_q, B->sc, a->col_q ? B->acc : NULL, nt);
          tile_amax = xte_fmaxf(tile_amax, am);
          for (rr = 0; rr < n; rr++)
            for (i = 0; i < nbr; i++)
              xte_store_scale(&a->row_s, r0 + r + rr, c0 / bw + i, B->sc[rr * nbr + i]);
        } else {
          (void)k->load_amax(SRC(r), lds, a->in_kind, n, nc, B->acc);
        }
      }
      if (!a->col_q) continue;
      k->block_scales(a, B->acc, nc, B->sc);
      for (j = 0; j < nc; j++) {
        tile_amax = xte_fmaxf(tile_amax, B->acc[j]);
        B->sv[j] = B->sc[j].scale;
        if (a->col_transposed)
          xte_store_scale(&a->col_s, c0 + j, gblk, B->sc[j]);
        else
          xte_store_scale(&a->col_s, gblk, c0 + j, B->sc[j]);
      }
      k->load_quant_vs(SRC(g), lds, a->in_kind, gr, nc, B->sv, a->fmt, a->saturate,
                       a->col_transposed
                           ? B->Qt + g * TILE
                           : a->col_q + (size_t)(r0 + g) * (size_t)a->ld_col_q + (size_t)c0,
                       a->col_transposed ? TILE : a->ld_col_q, a->col_transposed ? 0 : nt);
    }
  }
#undef SRC
  if (a->col_q && a->col_transposed) {
    uint8_t *dst = a->col_q + (size_t)c0 * (size_t)a->ld_col_q + (size_t)r0;
    if (k->transpose_nt) /* whole 64-byte rows where the ISA has it */
      k->transpose_nt(B->Qt, nr, nc, TILE, dst, a->ld_col_q, nt);
    else
      k->transpose_u8(B->Qt, nr, nc, TILE, dst, a->ld_col_q);
  }
  *tamax = xte_fmaxf(*tamax, tile_amax);
}

/* Item t: rows r0 .. r0 + nr - 1, activation columns c0 .. c0 + nc - 1 (pairs: d_gate columns,
 * whose d_up columns are F + c0 ...) */
typedef struct fitem {
  int64_t r0, nr, c0, nc;
} fitem;

static fitem item_at(const fctx *fc, int64_t t) {
  fitem it;
  it.r0 = t / fc->nic * TILE;
  it.c0 = t % fc->nic * fc->W;
  it.nr = fc->a->q.M - it.r0 < TILE ? fc->a->q.M - it.r0 : TILE;
  it.nc = fc->kact - it.c0 < fc->W ? fc->kact - it.c0 : fc->W;
  return it;
}

static void fused_range(void *vctx, int64_t b, int64_t e, int tid) {
  fctx *fc = (fctx *)vctx;
  const xte_swiglu_args *a = fc->a;
  const int bf = a->act_dtype == XTE_DTYPE_BF16;
  const size_t es = bf ? 2u : 4u;
  const int np = fc->pair ? 2 : 1;
  fbuf B;
  int64_t W = fc->W, t, i, j, h;
  int p;
  float am = 0.0f;
  /* the chunk's buffers (pairs: d_gate, then d_up); without them, tile by tile through B.T */
  char *chunk = (char *)xte_aligned_alloc((size_t)TILE * (size_t)W * es * (size_t)np);
  if (!chunk) W = TILE;
  for (t = b; t < e; t++) {
    const fitem ch = item_at(fc, t);
    for (j = 0; j < ch.nc; j += W) {
      const int64_t c0 = ch.c0 + j, nc = ch.nc - j < W ? ch.nc - j : W;
      if (!chunk) { /* one tile (nc <= TILE), the d_up tile of a pair after its d_gate tile */
        for (p = 0; p < np; p++) {
          const int64_t oc = c0 + (p ? a->F : 0);
          for (i = 0; i < ch.nr; i++)
            act_span(a, ch.r0 + i, oc, nc, bf, (char *)B.T + (size_t)i * TILE * es);
          quant_buf_tile(fc, ch.r0, oc, ch.nr, nc, B.T, TILE, &B, &am);
        }
        continue;
      }
      for (i = 0; i < ch.nr; i++) {
        char *o0 = chunk + (size_t)i * (size_t)W * es;
        if (fc->pair)
          act_row(a, ch.r0 + i, c0, nc, bf, o0, o0 + (size_t)TILE * (size_t)W * es);
        else
          act_span(a, ch.r0 + i, c0, nc, bf, o0);
      }
      for (h = 0; h < nc; h += TILE)
        for (p = 0; p < np; p++)
          quant_buf_tile(fc, ch.r0, c0 + h + (p ? a->F : 0), ch.nr, nc - h < TILE ? nc - h : TILE,
                         chunk + ((size_t)p * TILE * (size_t)W + (size_t)h) * es, W, &B, &am);
    }
  }
  if (fc->nt) fc->k->store_fence();
  xte_aligned_free(chunk);
  fc->partial[tid] = xte_fmaxf(fc->partial[tid], am);
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
    const xte_quant_args *q = &a->q;
    fctx c;
    int i;
    size_t out_bytes, big;
    const int small = xte_threads_for(q->M * q->K);
    memset(&c, 0, sizeof c);
    c.a = a;
    c.k = xte_quant_kernels_get();
    c.pair = a->backward && a->F % TILE == 0;
    c.kact = c.pair ? a->F : q->K;
    {
      /* W: the widest multiple of TILE whose buffers fit cb, narrowed until there are
       * two items per thread (the partition depends on the shape, the thread count and the L2;
       * the bytes on none of them) */
      const size_t es = a->act_dtype == XTE_DTYPE_BF16 ? 2u : 4u;
      const int64_t nth = small ? 1 : xte_cpu_threads();
      const int64_t bands = q->M > TILE ? (q->M + TILE - 1) / TILE : 1,
                    tiles = (c.kact + TILE - 1) / TILE;
      size_t cb = xte_cpu_l2() / 2;
      int64_t wt, per;
      if (cb > CHUNK_BYTES) cb = CHUNK_BYTES;
      wt = (int64_t)(cb / ((size_t)TILE * TILE * es * (c.pair ? 2u : 1u)));
      per = (2 * nth + bands - 1) / bands; /* items wanted per band */
      if (per > 1 && (tiles + per - 1) / per < wt) wt = (tiles + per - 1) / per;
      if (wt < 1) wt = 1;
      c.W = wt * TILE;
      c.nic = (c.kact + c.W - 1) / c.W;
    }
    /* streaming stores as xte_quantize's tile walks take them: once what the call reads and
     * writes is past the L2s of the threads (src/cpu/quantize.c, xte_cpu_quantize) */
    out_bytes = (size_t)q->M * (size_t)q->K * ((q->row_q ? 1u : 0u) + (q->col_q ? 1u : 0u));
    big = xte_cpu_l2() * (size_t)(small ? 1 : xte_cpu_threads());
    if (big < ((size_t)1 << 20)) big = (size_t)1 << 20;
    c.nt = out_bytes + (size_t)a->T * (size_t)a->F * (a->backward ? 6u : 4u) >= big;
    {
      const char *e = getenv("XTE_STREAMING_STORES"); /* 0 / 1: never / always */
      if (e && (*e == '0' || *e == '1')) c.nt = *e == '1';
    }
    zero_scales(&q->row_s);
    zero_scales(&q->col_s);
    if (q->M > 0 && q->K > 0)
      xte_parallel_for_max((q->M + TILE - 1) / TILE * c.nic, small, fused_range, &c);
    if (q->amax_out) {
      float am = 0.0f;
      for (i = 0; i < 256; i++) am = xte_fmaxf(am, c.partial[i]);
      *q->amax_out = am;
    }
  }
  return XTE_SUCCESS;
}
