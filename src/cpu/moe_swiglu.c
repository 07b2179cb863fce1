/* CPU SwiGLU: forward, backward, and both fused with 1x128 quantization in one pass. The fused
 * kernels cut the output [M, K] into the 128 x 128 tiles of src/cpu/quantize.c, compute the
 * tile's activation values (rounded to act_dtype) into a tile buffer, then quantize the tile
 * with the same ISA kernels and the same per-block steps as xte_quantize, so the bytes equal
 * quantize(swiglu(x)) composed from the separate calls. */
#include <string.h>

#include "cpu/moe_cpu.h"
#include "numerics/xte_moe_numerics.h"

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

static void plain_rows(void *vctx, int64_t b, int64_t e, int tid) {
  const xte_swiglu_args *a = (const xte_swiglu_args *)vctx;
  int64_t r, c, n = a->out.cols;
  (void)tid;
  for (r = b; r < e; r++) {
    if (a->out.dtype == XTE_DTYPE_FP32) {
      float *d = (float *)a->out.data + r * a->out.ld;
      for (c = 0; c < n; c++) d[c] = act_value(a, r, c, 0);
    } else {
      uint16_t *d = (uint16_t *)a->out.data + r * a->out.ld;
      for (c = 0; c < n; c++) d[c] = xte_f32_to_bf16(act_value(a, r, c, 0));
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

  for (r = 0; r < nr; r++)
    for (j = 0; j < nc; j++) T[r * TILE + j] = act_value(sa, r0 + r, c0 + j, bf);

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
