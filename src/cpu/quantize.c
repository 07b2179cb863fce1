/* CPU quantize / dequantize / cast driver. Every output byte is computed by the same arithmetic
 * whatever the thread count: work is cut into rows (rowwise-only 1 x B and per-tensor modes) or
 * into 128 x 128 tiles of the input (128 x 128 blocks and every columnwise copy), each owned by
 * one thread. The per-ISA fused kernels read the input directly (no fp32 copy): block amax, scale
 * (shared numerics), convert, store; the transposed columnwise copy goes through an L1 buffer and
 * a byte transpose (1 x 128 rows with it: both copies from one read of the tile, quant_rc, where
 * the ISA has it). Tiles are walked left to right within a 128-row panel, prefetching the rows of
 * the tile two ahead (128 x 128 blocks: runs of tiles, software-pipelined where the ISA has
 * quant_sq_run, see quant_range_pipe); large outputs are written with streaming stores (tile
 * walks from past the L2s on, see xte_cpu_quantize). */
#include <stdlib.h>
#include <string.h>

#include "cpu/xte_cpu.h"
#include "xte_internal.h"
#include "numerics/xte_numerics.h"

#define TILE 128
#define ROW_SCALES 256 /* block scales per quant_blocks call on the row path */
#define SLICE 16       /* rows per kernel call in a tile (prefetching the next tile between) */
/* the same in one-scale tiles: 2 KiB of input per call (bf16 8 rows, fp32 4), shorter prefetch
 * bursts */
#define SQ_SLICE ((int64_t)(2048 / (TILE * c->es)))
#define PF_TILES 2 /* tiles walked one by one prefetch the tile this far ahead */

typedef struct qctx {
  const xte_quant_args *a;
  const xte_quant_kernels *k;
  int64_t ntr, ntc;
  int per_tensor;
  int nt;             /* streaming stores for the fp8 copies */
  size_t es;          /* input element size */
  xte_block_scale ts; /* per-tensor scale */
  float partial[256]; /* per-thread amax */
} qctx;

static size_t in_size(int in_kind) {
  return in_kind == XTE_NUM_IN_F32 ? 4 : 2;
}

static const void *in_at(const qctx *c, int64_t r, int64_t col) {
  return (const char *)c->a->in + ((size_t)r * (size_t)c->a->ld_in + (size_t)col) * c->es;
}

/* Always inlined, as is prefetch_next: GCC finds a static function of nothing but prefetches free
 * of side effects and drops its calls. */
#if defined(__GNUC__)
#define XTE_INLINE static inline __attribute__((always_inline))
#else
#define XTE_INLINE static inline
#endif

XTE_INLINE void prefetch_l2(const void *p, size_t bytes) {
#if defined(__GNUC__)
  size_t o;
  for (o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 2);
#else
  (void)p;
  (void)bytes;
#endif
}

/* The scales of blocks (gi0 + j, gj0 + i), j < nr, i < nc, from s[j * nc + i]: linear fp32 maps
 * by strides, others one by one */
static void store_scale_grid(const xte_scale_map *m, int64_t gi0, int64_t gj0, int64_t nr,
                             int64_t nc, const xte_block_scale *s) {
  int64_t j, i;
  if (m->kind == XTE_SMAP_LINEAR && !m->e8m0) {
    float *d = (float *)m->data + xte_scale_offset(m, gi0, gj0);
    for (j = 0; j < nr; j++)
      for (i = 0; i < nc; i++) d[j * m->sr + i * m->sc] = s[j * nc + i].scale_inv;
  } else {
    for (j = 0; j < nr; j++)
      for (i = 0; i < nc; i++) xte_store_scale(m, gi0 + j, gj0 + i, s[j * nc + i]);
  }
}

/* ---------------------------------------------------------------- rows: rowwise only, 1 x B
 * blocks or one per-tensor scale. Each thread takes contiguous rows. */
static void quant_rows(void *vctx, int64_t b, int64_t e, int tid) {
  qctx *c = (qctx *)vctx;
  const xte_quant_args *a = c->a;
  const xte_quant_kernels *k = c->k;
  const int64_t bw = a->row_bw, nbr = (a->K + bw - 1) / bw;
  xte_block_scale sc[ROW_SCALES];
  float am = 0.0f;
  int64_t r, j, n;
  if (c->per_tensor) {
    am = k->load_quant(in_at(c, b, 0), a->ld_in, a->in_kind, e - b, a->K, c->ts.scale, a->fmt,
                       a->saturate, a->row_q + (size_t)b * (size_t)a->ld_row_q, a->ld_row_q, c->nt);
  } else if (nbr <= ROW_SCALES) { /* whole rows, several per call */
    const int64_t rpc = ROW_SCALES / nbr;
    for (r = b; r < e; r += n) {
      n = e - r < rpc ? e - r : rpc;
      am = xte_fmaxf(am, k->quant_blocks(in_at(c, r, 0), a->ld_in, a->in_kind, n, a->K, bw, a,
                                         a->row_q + (size_t)r * (size_t)a->ld_row_q, a->ld_row_q,
                                         sc, NULL, c->nt));
      store_scale_grid(&a->row_s, r, 0, n, nbr, sc);
    }
  } else { /* long rows in pieces of ROW_SCALES blocks */
    const int64_t chunk = bw * ROW_SCALES;
    for (r = b; r < e; r++)
      for (j = 0; j < a->K; j += chunk) {
        n = a->K - j < chunk ? a->K - j : chunk;
        am = xte_fmaxf(am, k->quant_blocks(in_at(c, r, j), a->ld_in, a->in_kind, 1, n, bw, a,
                                           a->row_q + (size_t)r * (size_t)a->ld_row_q + (size_t)j,
                                           a->ld_row_q, sc, NULL, c->nt));
        store_scale_grid(&a->row_s, r, j / bw, 1, (n + bw - 1) / bw, sc);
      }
  }
  if (c->nt) k->store_fence();
  c->partial[tid] = xte_fmaxf(c->partial[tid], am);
}

/* ---------------------------------------------------------------- tiles */

typedef struct qbuf {
  _Alignas(64) uint8_t Qt[TILE * TILE]; /* the tile's fp8 values, row major */
  _Alignas(64) uint8_t Tt[TILE * TILE]; /* transposed */
  _Alignas(64) float acc[TILE];
  _Alignas(64) float sv[TILE];
  xte_block_scale sc[TILE * 8]; /* rowwise block scales of a group of rows (bw >= 16) */
} qbuf;

/* The transposed columnwise copy of Qt (nr x nc): straight into the copy where the ISA has
 * transpose_nt, else through Tt and a (streaming) copy of its rows */
static void store_col_transposed(const qctx *c, int64_t r0, int64_t c0, int64_t nr, int64_t nc,
                                 const uint8_t *Qt, qbuf *B) {
  const xte_quant_args *a = c->a;
  int64_t j;
  if (c->k->transpose_nt) {
    c->k->transpose_nt(Qt, nr, nc, TILE, a->col_q + (size_t)c0 * (size_t)a->ld_col_q + (size_t)r0,
                       a->ld_col_q, c->nt);
    return;
  }
  c->k->transpose_u8(Qt, nr, nc, TILE, B->Tt, TILE);
  for (j = 0; j < nc; j++)
    c->k->copy_u8(a->col_q + (size_t)(c0 + j) * (size_t)a->ld_col_q + (size_t)r0, B->Tt + j * TILE,
                  nr, c->nt);
}

/* What a tile prefetches into L2 while it works: rows [rn, rn + nrn), columns [cn, cn + ncn) of
 * the input (ncn 0: nothing), spread over the tile's slices */
typedef struct qnext {
  int64_t rn, nrn, cn, ncn;
} qnext;

/* Part p of np of the rows of x */
XTE_INLINE void prefetch_next(const qctx *c, const qnext *x, int64_t p, int64_t np) {
  int64_t i;
  if (x->ncn)
    for (i = x->nrn * p / np; i < x->nrn * (p + 1) / np; i++)
      prefetch_l2(in_at(c, x->rn + i, x->cn), (size_t)x->ncn * c->es);
}

/* A full-width tile (bf16 or fp32) of 1 x 128 row blocks with its transposed 128 x 1 column copy,
 * both from one read by the kernel table's quant_rc when it has one; 0: the general path does the
 * tile. */
static int quant_tile_rc(const qctx *c, int64_t r0, int64_t c0, int64_t nr, int64_t nc,
                         const qnext *nx, qbuf *B, float *tamax) {
  const xte_quant_args *a = c->a;
  xte_block_scale rs[TILE], cs[TILE];
  float am;
  if (!c->k->quant_rc || !a->row_q || !a->col_transposed || a->in_kind == XTE_NUM_IN_F16 ||
      a->row_bw != TILE || a->col_bh != TILE || nc != TILE ||
      !c->k->quant_rc(in_at(c, r0, c0), a->ld_in, nr, a,
                      a->row_q + (size_t)r0 * (size_t)a->ld_row_q + (size_t)c0, a->ld_row_q, rs,
                      B->Qt, cs, &am, nx->ncn ? in_at(c, nx->rn, nx->cn) : NULL, nx->nrn, c->nt))
    return 0;
  store_scale_grid(&a->row_s, r0, c0 / TILE, nr, 1, rs);
  store_scale_grid(&a->col_s, c0, r0 / TILE, nc, 1, cs);
  store_col_transposed(c, r0, c0, nr, nc, B->Qt, B);
  *tamax = xte_fmaxf(*tamax, am);
  return 1;
}

/* pre >= 0: the tile's amax (square blocks), found by the caller */
static void quant_tile(qctx *c, int64_t tr, int64_t tc, const qnext *nx, float pre, qbuf *B,
                       float *tamax) {
  const xte_quant_args *a = c->a;
  const xte_quant_kernels *k = c->k;
  const int64_t r0 = tr * TILE, c0 = tc * TILE;
  const int64_t nr = a->M - r0 < TILE ? a->M - r0 : TILE;
  const int64_t nc = a->K - c0 < TILE ? a->K - c0 : TILE;
  const int64_t nsl = (nr + SLICE - 1) / SLICE;       /* slices */
  const int64_t nsq = (nr + SQ_SLICE - 1) / SQ_SLICE; /* one-scale slices */
  int64_t r, j, g, n;
  float tile_amax = 0.0f;

  if (c->per_tensor || a->square) {
    xte_block_scale sq = c->ts;
    int buffered = a->col_q != NULL;
    uint8_t *dst = buffered ? B->Qt : a->row_q + (size_t)r0 * (size_t)a->ld_row_q + (size_t)c0;
    int64_t ldd = buffered ? TILE : a->ld_row_q;
    /* both copies: the rowwise one written with the buffer (from one conversion where the ISA
     * has load_quant_dup, else copied from it) */
    const int dup = buffered && a->row_q != NULL;
    uint8_t *rq = dup ? a->row_q + (size_t)r0 * (size_t)a->ld_row_q + (size_t)c0 : NULL;
    if (a->square) {
      if (pre >= 0.0f) {
        tile_amax = pre;
      } else { /* the prefetch spread over both passes */
        for (r = 0; r < nr; r += n) {
          n = nr - r < SQ_SLICE ? nr - r : SQ_SLICE;
          prefetch_next(c, nx, r / SQ_SLICE, 2 * nsq);
          tile_amax = xte_fmaxf(
              tile_amax, k->load_amax(in_at(c, r0 + r, c0), a->ld_in, a->in_kind, n, nc, NULL));
        }
      }
      sq = xte_quant_block_scale(a, tile_amax);
    }
    for (r = 0; r < nr; r += n) {
      float am;
      n = nr - r < SQ_SLICE ? nr - r : SQ_SLICE;
      if (a->square && pre < 0.0f)
        prefetch_next(c, nx, nsq + r / SQ_SLICE, 2 * nsq);
      else
        prefetch_next(c, nx, r / SQ_SLICE, nsq);
      if (!dup || !k->load_quant_dup ||
          !k->load_quant_dup(in_at(c, r0 + r, c0), a->ld_in, a->in_kind, n, nc, sq.scale, a->fmt,
                             a->saturate, rq + r * a->ld_row_q, a->ld_row_q, c->nt, dst + r * ldd,
                             ldd, &am)) {
        int64_t j2;
        am = k->load_quant(in_at(c, r0 + r, c0), a->ld_in, a->in_kind, n, nc, sq.scale, a->fmt,
                           a->saturate, dst + r * ldd, ldd, buffered ? 0 : c->nt);
        if (dup) /* the rowwise copy of these rows from the buffer */
          for (j2 = r; j2 < r + n; j2++)
            k->copy_u8(rq + j2 * a->ld_row_q, B->Qt + j2 * TILE, nc, c->nt);
      }
      if (c->per_tensor) tile_amax = xte_fmaxf(tile_amax, am);
    }
    if (a->row_q && a->square) xte_store_scale(&a->row_s, tr, tc, sq);
    if (a->col_q) {
      if (a->col_transposed) {
        store_col_transposed(c, r0, c0, nr, nc, B->Qt, B);
        if (a->square) xte_store_scale(&a->col_s, tc, tr, sq);
      } else {
        for (r = 0; r < nr; r++)
          k->copy_u8(a->col_q + (size_t)(r0 + r) * (size_t)a->ld_col_q + (size_t)c0,
                     B->Qt + r * TILE, nc, c->nt);
        if (a->square) xte_store_scale(&a->col_s, tr, tc, sq);
      }
    }
  } else if (!quant_tile_rc(c, r0, c0, nr, nc, nx, B, &tile_amax)) {
    /* 1 x bw rowwise blocks and bh x 1 columnwise blocks (here the columnwise copy exists) */
    const int64_t bw = a->row_bw, bh = a->col_bh, nbr = (nc + bw - 1) / bw;
    for (g = 0; g < nr; g += bh) {
      int64_t gr = nr - g < bh ? nr - g : bh;
      int64_t gblk = (r0 + g) / bh;
      uint8_t *cdst = a->col_transposed
                          ? B->Qt + g * TILE
                          : a->col_q + (size_t)(r0 + g) * (size_t)a->ld_col_q + (size_t)c0;
      int64_t ldc = a->col_transposed ? TILE : a->ld_col_q;
      for (j = 0; j < nc; j++) B->acc[j] = 0.0f;
      for (r = g; r < g + gr; r += n) {
        n = g + gr - r < SLICE ? g + gr - r : SLICE;
        prefetch_next(c, nx, r / SLICE, nsl);
        if (a->row_q) {
          int64_t i, rr;
          float am = k->quant_blocks(in_at(c, r0 + r, c0), a->ld_in, a->in_kind, n, nc, bw, a,
                                     a->row_q + (size_t)(r0 + r) * (size_t)a->ld_row_q + (size_t)c0,
                                     a->ld_row_q, B->sc, B->acc, c->nt);
          tile_amax = xte_fmaxf(tile_amax, am);
          for (rr = 0; rr < n; rr++)
            for (i = 0; i < nbr; i++)
              xte_store_scale(&a->row_s, r0 + r + rr, c0 / bw + i, B->sc[rr * nbr + i]);
        } else {
          (void)k->load_amax(in_at(c, r0 + r, c0), a->ld_in, a->in_kind, n, nc, B->acc);
        }
      }
      k->block_scales(a, B->acc, nc, B->sc);
      for (j = 0; j < nc; j++) {
        xte_block_scale s = B->sc[j];
        tile_amax = xte_fmaxf(tile_amax, B->acc[j]);
        B->sv[j] = s.scale;
        if (a->col_transposed)
          xte_store_scale(&a->col_s, c0 + j, gblk, s);
        else
          xte_store_scale(&a->col_s, gblk, c0 + j, s);
      }
      k->load_quant_vs(in_at(c, r0 + g, c0), a->ld_in, a->in_kind, gr, nc, B->sv, a->fmt,
                       a->saturate, cdst, ldc, a->col_transposed ? 0 : c->nt);
    }
    if (a->col_transposed) store_col_transposed(c, r0, c0, nr, nc, B->Qt, B);
  }
  *tamax = xte_fmaxf(*tamax, tile_amax);
}

/* Tile t's rows and columns */
static void tile_region(const qctx *c, int64_t t, qnext *x) {
  const int64_t tr = t / c->ntc, tc = t % c->ntc;
  x->rn = tr * TILE;
  x->nrn = c->a->M - x->rn < TILE ? c->a->M - x->rn : TILE;
  x->cn = tc * TILE;
  x->ncn = c->a->K - x->cn < TILE ? c->a->K - x->cn : TILE;
}

/* Square blocks: WIDE-byte runs of tiles of a panel at a time (in L2): their amaxes row by row
 * (the run was prefetched into L2 while the previous one converted, in long contiguous rows), then
 * tile by tile the conversion, which prefetches the next run. */
#define WIDE (256 << 10)
static void quant_range_square(qctx *c, int64_t b, int64_t e, qbuf *B, float *am) {
  const xte_quant_args *a = c->a;
  const int64_t gmax = (int64_t)(WIDE / ((size_t)TILE * TILE * c->es)) > 0
                           ? (int64_t)(WIDE / ((size_t)TILE * TILE * c->es))
                           : 1;
  float pa[64];
  int64_t t, g, i, r;
  for (t = b; t < e; t += g) {
    const int64_t tc = t % c->ntc;
    qnext run, nx = {0, 0, 0, 0};
    g = c->ntc - tc < gmax ? c->ntc - tc : gmax;
    if (e - t < g) g = e - t;
    tile_region(c, t, &run);
    run.ncn = a->K - run.cn < g * TILE ? a->K - run.cn : g * TILE;
    if (t + g < e) { /* the next run */
      int64_t gn = c->ntc - (t + g) % c->ntc < gmax ? c->ntc - (t + g) % c->ntc : gmax;
      if (e - t - g < gn) gn = e - t - g;
      tile_region(c, t + g, &nx);
      nx.ncn = a->K - nx.cn < gn * TILE ? a->K - nx.cn : gn * TILE;
    }
    for (i = 0; i < g; i++) pa[i] = 0.0f;
    for (r = 0; r < run.nrn; r += SQ_SLICE)
      for (i = 0; i < g; i++) {
        const int64_t c0 = run.cn + i * TILE;
        const int64_t nc = a->K - c0 < TILE ? a->K - c0 : TILE;
        const int64_t n = run.nrn - r < SQ_SLICE ? run.nrn - r : SQ_SLICE;
        pa[i] = xte_fmaxf(
            pa[i], c->k->load_amax(in_at(c, run.rn + r, c0), a->ld_in, a->in_kind, n, nc, NULL));
      }
    for (i = 0; i < g; i++) {
      qnext part = nx; /* tile i prefetches its share of the next run's rows */
      part.rn = nx.rn + nx.nrn * i / g;
      part.nrn = nx.nrn * (i + 1) / g - nx.nrn * i / g;
      quant_tile(c, (t + i) / c->ntc, (t + i) % c->ntc, &part, pa[i], B, am);
    }
  }
}

/* Square blocks through the kernel table's quant_sq_run (full-width tiles, bf16 or fp32, the
 * rowwise copy, a transposed columnwise one or none), software-pipelined over runs of PIPE_WIDE
 * bytes of a panel's input: while a run converts (from L2, its amaxes known), the next run's rows
 * are read for their amaxes and the rows of the run after it are prefetched into L2, row by row
 * beside the conversion, so that the core keeps many misses in flight without bursts of
 * prefetches. The transposed copy is made from the run's codes (q2) after it. A run with a NaN or
 * a scale the kernel does not take goes tile by tile the general way (the same bytes). 0: not
 * taken (nothing written). The run widths below are the measured best (docs/performance.md,
 * quantize): wide enough to keep misses in flight, narrow enough for a run's input to stay in L2
 * and, with the transposed copy, its codes in L1. */
#define PIPE_WIDE (128 << 10)
#define PIPE_WIDE_COL (64 << 10) /* with the transposed copy: its codes (q2) stay in L1 */
static int quant_range_pipe(qctx *c, int64_t b, int64_t e, qbuf *B, float *am) {
  const xte_quant_args *a = c->a;
  const xte_quant_kernels *k = c->k;
  int64_t gmax = (int64_t)((a->col_q ? PIPE_WIDE_COL : PIPE_WIDE) / ((size_t)TILE * TILE * c->es)),
          t, g, i;
  const qnext none = {0, 0, 0, 0};
  float pa[16], na[16], s[16];
  xte_block_scale sc[16];
  uint8_t *q2 = NULL;
  qnext run;
  if (!k->quant_sq_run || !a->row_q || (a->col_q && !a->col_transposed) || a->K % TILE != 0 ||
      (a->in_kind != XTE_NUM_IN_BF16 && a->in_kind != XTE_NUM_IN_F32))
    return 0;
  if (gmax > 16) gmax = 16;
  if (gmax < 1) gmax = 1;
  if (a->col_q && !(q2 = (uint8_t *)xte_aligned_alloc((size_t)gmax * TILE * TILE))) return 0;
#define RUN_AT(T, G)                                                   \
  do {                                                                 \
    (G) = c->ntc - (T) % c->ntc < gmax ? c->ntc - (T) % c->ntc : gmax; \
    if (e - (T) < (G)) (G) = e - (T);                                  \
  } while (0)
  RUN_AT(b, g);
  tile_region(c, b, &run);
  if (!k->quant_sq_run(NULL, a->ld_in, a->in_kind, 0, 0, s, a->fmt, a->saturate, NULL, 0, 0, NULL,
                       in_at(c, run.rn, run.cn), run.nrn, g, pa, NULL, 0, 0)) {
    xte_aligned_free(q2);
    return 0;
  }
  for (t = b; t < e; t += g) {
    const int64_t tr = t / c->ntc, tc = t % c->ntc;
    qnext nx = {0, 0, 0, 0};
    const void *pfp = NULL;
    int64_t gn = 0, pfr = 0, pfb = 0;
    int ok = 1;
    RUN_AT(t, g);
    tile_region(c, t, &run);
    if (t + g < e) {
      RUN_AT(t + g, gn);
      tile_region(c, t + g, &nx);
      if (t + g + gn < e) { /* the run after it, prefetched row by row beside the conversion */
        qnext n2;
        int64_t g2;
        RUN_AT(t + g + gn, g2);
        tile_region(c, t + g + gn, &n2);
        pfp = in_at(c, n2.rn, n2.cn);
        pfr = n2.nrn;
        pfb = g2 * TILE * (int64_t)c->es;
      }
    }
    for (i = 0; i < g; i++) {
      ok &= pa[i] >= 0.0f;
      if (ok) {
        sc[i] = xte_quant_block_scale(a, pa[i]);
        s[i] = sc[i].scale;
      }
    }
    if (ok && k->quant_sq_run(in_at(c, run.rn, run.cn), a->ld_in, a->in_kind, run.nrn, g, s, a->fmt,
                              a->saturate,
                              a->row_q + (size_t)run.rn * (size_t)a->ld_row_q + (size_t)run.cn,
                              a->ld_row_q, c->nt, q2, gn ? in_at(c, nx.rn, nx.cn) : NULL, nx.nrn,
                              gn, na, pfp, pfr, pfb)) {
      for (i = 0; i < g; i++) {
        xte_store_scale(&a->row_s, tr, tc + i, sc[i]);
        *am = xte_fmaxf(*am, pa[i]);
        if (q2) {
          store_col_transposed(c, run.rn, run.cn + i * TILE, run.nrn, TILE, q2 + i * TILE * TILE,
                               B);
          xte_store_scale(&a->col_s, tc + i, tr, sc[i]);
        }
      }
    } else {
      for (i = 0; i < g; i++) quant_tile(c, tr, tc + i, &none, pa[i], B, am);
      if (gn)
        (void)k->quant_sq_run(NULL, a->ld_in, a->in_kind, 0, 0, s, a->fmt, a->saturate, NULL, 0, 0,
                              NULL, in_at(c, nx.rn, nx.cn), nx.nrn, gn, na, NULL, 0, 0);
    }
    for (i = 0; i < gn; i++) pa[i] = na[i];
  }
#undef RUN_AT
  xte_aligned_free(q2);
  return 1;
}

static void quant_range(void *vctx, int64_t b, int64_t e, int tid) {
  qctx *c = (qctx *)vctx;
  qbuf B;
  float am = 0.0f;
  int64_t t;
  if (c->a->square && !c->per_tensor) {
    if (!quant_range_pipe(c, b, e, &B, &am)) quant_range_square(c, b, e, &B, &am);
  } else {
    /* each tile prefetches the one two ahead (the first also the next): the fetches have a whole
     * tile's time to land */
    for (t = b; t < e; t++) {
      qnext nx = {0, 0, 0, 0};
      if (t == b && t + 1 < e) {
        tile_region(c, t + 1, &nx);
        prefetch_next(c, &nx, 0, 1);
        nx.ncn = 0;
      }
      if (t + PF_TILES < e) tile_region(c, t + PF_TILES, &nx);
      quant_tile(c, t / c->ntc, t % c->ntc, &nx, -1.0f, &B, &am);
    }
  }
  if (c->nt) c->k->store_fence();
  c->partial[tid] = xte_fmaxf(c->partial[tid], am);
}

/* Whole-tensor amax for per-tensor current scaling. */
static void amax_range(void *vctx, int64_t b, int64_t e, int tid) {
  qctx *c = (qctx *)vctx;
  float m = c->k->load_amax(in_at(c, b, 0), c->a->ld_in, c->a->in_kind, e - b, c->a->K, NULL);
  c->partial[tid] = xte_fmaxf(c->partial[tid], m);
}

/* Whether the copies are made tile by tile (quant_range) rather than row by row (quant_rows) */
static int tile_walk(const xte_quant_args *a) {
  return a->col_q != NULL || (a->row_q != NULL && a->square);
}

static void zero_scales(const xte_scale_map *m) {
  if (m->data) memset(m->data, 0, (size_t)m->total * (m->e8m0 ? 1u : 4u));
}

xte_status xte_cpu_quantize(const xte_quant_args *a, void *handle) {
  qctx c;
  int i;
  float am = 0.0f;
  size_t out_bytes, big;
  const int small = xte_threads_for(a->M * a->K); /* M * K <= 2^50 (checked by the API) */
  (void)handle;
  memset(&c, 0, sizeof c);
  c.a = a;
  c.k = xte_quant_kernels_get();
  c.es = in_size(a->in_kind);
  c.ntr = (a->M + TILE - 1) / TILE;
  c.ntc = (a->K + TILE - 1) / TILE;
  c.per_tensor = a->mode == XTE_SCALING_PER_TENSOR;
  /* streaming stores once what the call reads and writes is past what the caches would keep:
   * rows, past the last-level cache; tile walks (128 x 128 blocks, columnwise copies), already
   * past the L2s of the threads. A tile writes each copy as 128 pieces of 128 bytes a row stride
   * apart, and with ordinary stores (each line read for ownership first) such a walk is much
   * slower than with streaming stores once the input is past the L2s, inside the L3 too
   * (docs/performance.md, quantize). Rows lose little either way: they stream only past the
   * last-level cache (the next kernel may find them in L3). */
  out_bytes = (size_t)a->M * (size_t)a->K * ((a->row_q ? 1u : 0u) + (a->col_q ? 1u : 0u));
  if (tile_walk(a)) {
    big = xte_cpu_l2() * (size_t)(small ? 1 : xte_cpu_threads());
    if (big < ((size_t)1 << 20)) big = (size_t)1 << 20;
  } else {
    big = xte_cpu_l3();
    if (big < ((size_t)8 << 20)) big = (size_t)8 << 20;
  }
  c.nt = out_bytes + (size_t)a->M * (size_t)a->K * c.es >= big;
  {
    const char *e = getenv("XTE_STREAMING_STORES"); /* 0 / 1: never / always (the caller's cache) */
    if (e && (*e == '0' || *e == '1')) c.nt = *e == '1';
  }
  zero_scales(&a->row_s);
  zero_scales(&a->col_s);
  if (c.per_tensor) {
    if (a->recipe == XTE_RECIPE_TE_CURRENT) {
      if (a->M > 0 && a->K > 0) xte_parallel_for_max(a->M, small, amax_range, &c);
      for (i = 0; i < 256; i++) am = xte_fmaxf(am, c.partial[i]);
      memset(c.partial, 0, sizeof c.partial);
    }
    c.ts = xte_quant_block_scale(a, am);
    if (a->row_s.data) xte_store_scale(&a->row_s, 0, 0, c.ts);
    if (a->col_s.data) xte_store_scale(&a->col_s, 0, 0, c.ts);
    if (a->scale_out) *a->scale_out = c.ts.scale;
  }
  if (a->M > 0 && a->K > 0) {
    if (!a->row_q && !a->col_q)
      xte_parallel_for_max(a->M, small, amax_range, &c); /* no copy: the amax only */
    else if (!tile_walk(a))
      xte_parallel_for_max(a->M, small, quant_rows, &c);
    else
      xte_parallel_for_max(c.ntr * c.ntc, small, quant_range, &c);
  }
  if (a->amax_out) {
    am = 0.0f;
    for (i = 0; i < 256; i++) am = xte_fmaxf(am, c.partial[i]);
    *a->amax_out = am;
  }
  return XTE_SUCCESS;
}

/* ---------------------------------------------------------------- dequantize */

static void dequant_rows(void *vctx, int64_t b, int64_t e, int tid) {
  const xte_dequant_args *a = (const xte_dequant_args *)vctx;
  int64_t r, c;
  (void)tid;
  for (r = b; r < e; r++) {
    const uint8_t *q = a->q + (size_t)r * (size_t)a->ld_q;
    for (c = 0; c < a->C; c++) {
      float s = xte_load_scale_inv(&a->s, r / a->bh, c / a->bw);
      float v = xte_mul_nanprop(xte_fp8_to_f32(q[c], a->fmt), s); /* the NaN rule */
      size_t o = (size_t)r * (size_t)a->ld_out + (size_t)c;
      if (a->out_dtype == XTE_DTYPE_FP32)
        ((float *)a->out)[o] = v;
      else if (a->out_dtype == XTE_DTYPE_BF16)
        ((uint16_t *)a->out)[o] = xte_f32_to_bf16(v);
      else
        ((uint16_t *)a->out)[o] = xte_f32_to_fp16(v);
    }
  }
}

xte_status xte_cpu_dequantize(const xte_dequant_args *a, void *handle) {
  (void)handle;
  /* an empty [R, 0] copy has nothing to write, however many rows it claims */
  if (a->R > 0 && a->C > 0)
    xte_parallel_for_max(a->R, xte_threads_for(a->R * a->C), dequant_rows, (void *)a);
  return XTE_SUCCESS;
}

/* ---------------------------------------------------------------- cast */

static int in_kind_of(int dtype) {
  return dtype == XTE_DTYPE_BF16 ? XTE_NUM_IN_BF16
                                 : (dtype == XTE_DTYPE_FP16 ? XTE_NUM_IN_F16 : XTE_NUM_IN_F32);
}

static void cast_range(void *vctx, int64_t b, int64_t e, int tid) {
  const xte_cast_args *a = (const xte_cast_args *)vctx;
  const xte_quant_kernels *k = xte_quant_kernels_get();
  _Alignas(64) float buf[2048];
  int64_t i, j;
  (void)tid;
  for (i = b * 2048; i < e * 2048 && i < a->n; i += 2048) {
    int64_t n = a->n - i < 2048 ? a->n - i : 2048;
    if (a->in_dtype == XTE_DTYPE_E4M3 || a->in_dtype == XTE_DTYPE_E5M2) {
      const uint8_t *q = (const uint8_t *)a->in + i;
      int fmt = a->in_dtype == XTE_DTYPE_E4M3 ? XTE_FP8_E4M3 : XTE_FP8_E5M2;
      for (j = 0; j < n; j++) buf[j] = xte_fp8_to_f32(q[j], fmt);
    } else if (a->in_dtype == XTE_DTYPE_E8M0) {
      const uint8_t *q = (const uint8_t *)a->in + i;
      for (j = 0; j < n; j++) buf[j] = xte_e8m0_to_f32(q[j]);
    } else {
      size_t es = a->in_dtype == XTE_DTYPE_FP32 ? 4 : 2;
      k->load_f32((const char *)a->in + (size_t)i * es, in_kind_of(a->in_dtype), n, buf);
    }
    switch (a->out_dtype) {
      case XTE_DTYPE_FP32:
        memcpy((float *)a->out + i, buf, (size_t)n * 4);
        break;
      case XTE_DTYPE_BF16:
        k->cast_bf16(buf, n, (uint16_t *)a->out + i);
        break;
      case XTE_DTYPE_FP16:
        k->cast_fp16(buf, n, (uint16_t *)a->out + i);
        break;
      case XTE_DTYPE_E4M3:
        k->cast_fp8(buf, n, XTE_FP8_E4M3, a->saturate, (uint8_t *)a->out + i);
        break;
      case XTE_DTYPE_E8M0:
        for (j = 0; j < n; j++) ((uint8_t *)a->out)[i + j] = xte_f32_to_e8m0(buf[j], a->saturate);
        break;
      default:
        k->cast_fp8(buf, n, XTE_FP8_E5M2, a->saturate, (uint8_t *)a->out + i);
        break;
    }
  }
}

xte_status xte_cpu_cast(const xte_cast_args *a, void *handle) {
  (void)handle;
  xte_parallel_for_max((a->n + 2047) / 2048, xte_threads_for(a->n), cast_range, (void *)a);
  return XTE_SUCCESS;
}
