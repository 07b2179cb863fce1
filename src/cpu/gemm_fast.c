/* CPU FAST GEMM driver (XTE_GEMM_FAST), BLIS-style, in fp32. For each problem (one per group):
 *   jc over N in panels of NC columns
 *     mc0 over M in chunks of MCH rows (the fp32 accumulators of a chunk x panel live in W)
 *       pc over K in panels of KC (a multiple of the 128 / 32 K block)
 *         pack B[pc panel, jc panel] to fp32 micro-panels [k][NR] (+ scales), all threads
 *         items (MC rows x a run of NR strips), spread statically over the threads:
 *           pack A[MC rows, pc panel] to fp32 micro-panels [k][MR] (+ scales), per thread
 *           for each NR strip, for each MR tile: the ISA's FAST kernel over the panel's K blocks
 *           into the tile's fp32 accumulators (row-major in W); on the last K panel the item's
 *           rows of D are written by the exact driver's epilogue (xte_cpu_gemm_store_row).
 * FP8 codes are decoded to fp32 through 256-entry tables while packing (exact: every FP8 value is
 * an fp32 value; NaN codes give NaN, e5m2 infinities inf). The kernel forms each block partial
 * with fp32 multiply-adds in a fixed order (the FAST partial: docs/numerics.md bounds its error);
 * the scale step and everything after it are the contract's. The partition of the work decides
 * nothing about any output's arithmetic, so results depend only on the ISA (its kernel), never on
 * the thread count. IEEE specials propagate as in the exact partial: a NaN code, inf * 0 or
 * +inf + -inf in a block make the fp32 partial NaN, an e5m2 infinity alone an infinite one (the
 * fp32 sums of finite products cannot overflow: |sum| < 128 * 57344 * 448); the epilogue writes
 * every NaN as the canonical one. */
#include <pthread.h>
#include <string.h>

#include "cpu/gemm_fast.h"
#include "cpu/gemm_kernels.h"
#include "cpu/xte_cpu.h"
#include "numerics/xte_gemm_numerics.h"
#include "xte_gemm_ops.h"
#include "xte_internal.h"

#define FKC 128 /* multiple of 128 and 32 */
#define FMAX_BLK (FKC / 32)
#define FMAX_W 64 /* widest micro-panel (MR or NR) */

/* The small-M path of FAST, where it is linked in (src/cpu/gemm_fast_small.c: streams the codes of
 * B once per problem instead of packing panels): problems of at most max_rows valid rows go to
 * run, with their part of the workspace sized by ws before anything is written. max_rows = 0:
 * every problem takes the panels below. */
typedef struct fast_small_path {
  int64_t max_rows;
  size_t (*ws)(const xte_gemm_args *g, int nt);
  void (*run)(const xte_gemm_args *g, const xte_gemm_problem *p, int64_t m, void *ws, int nt);
} fast_small_path;
static const fast_small_path fast_small = {0, NULL, NULL};

static float ftab[2][256];
static pthread_once_t ftab_once = PTHREAD_ONCE_INIT;

static void init_ftab(void) {
  int f, c;
  for (f = 0; f < 2; f++)
    for (c = 0; c < 256; c++) ftab[f][c] = xte_fp8_to_f32((uint8_t)c, f);
}

typedef struct fctx {
  const xte_gemm_args *g;
  int nt;
  const xte_gemm_fast_kernels *fk;
  int MR, NR;
  int64_t MC_max, MC, NC, MCH, ldw; /* MC: the current chunk's M block (<= MC_max) */
  /* current problem / panels */
  const xte_gemm_problem *p;
  int64_t m;
  int64_t jc, nc, nstrips;
  int64_t mc0, mch;
  int64_t pc, kc;
  int first_pc, last_pc, nblk;
  int kl[FMAX_BLK];
  int64_t n_ic, n_jch, spj;
  /* buffers: B panel + scales, accumulators W [MCH][ldw], per thread A block + scales */
  float *bp, *sbp, *W;
  float **ap, **sap;
} fctx;

/* A full micro-panel of W rows through the table, d[k * W + i] = t[rp[i][k]], unrolled for a
 * constant W (the tiles' MR and NR): the general loop costs several times the instructions. */
static inline __attribute__((always_inline)) void decode_rows(const int W, const uint8_t *const *rp,
                                                              int64_t kc, const float *t,
                                                              float *d) {
  const uint8_t *r[FMAX_W];
  int64_t kk;
  int i;
  for (i = 0; i < W; i++) r[i] = rp[i];
  for (kk = 0; kk < kc; kk++, d += W) {
#pragma GCC unroll 32
    for (i = 0; i < W; i++) d[i] = t[r[i][kk]];
  }
}

/* Packs rows [row0, row0 + npanels w) of operand o (rows >= nvalid are zero) over the K range
 * [k0, k0 + kc) into micro-panels [k][w] (fp32 values), and their scales [nblk][w]. */
static void fpack(const fctx *c, const xte_gemm_operand *o, int64_t row0, int64_t nvalid,
                  int64_t npanels, int w, int64_t k0, float *dst, float *sdst) {
  const float *t = ftab[o->fmt];
  const int64_t kc = c->kc;
  int64_t pnl, kk;
  int i;
  for (pnl = 0; pnl < npanels; pnl++) {
    float *d = dst + pnl * (int64_t)w * kc;
    int nv = (int)(nvalid - pnl * w < w ? nvalid - pnl * w : w);
    if (nv < 0) nv = 0;
    if (o->ks == 1) {
      /* rows contiguous along K, read side by side; the panel written contiguously */
      const uint8_t *rp[FMAX_W];
      for (i = 0; i < nv; i++) rp[i] = o->data + (row0 + pnl * w + i) * o->rs + k0;
      if (nv == w && w == 32)
        decode_rows(32, rp, kc, t, d);
      else if (nv == w && w == 16)
        decode_rows(16, rp, kc, t, d);
      else if (nv == w && w == 14)
        decode_rows(14, rp, kc, t, d);
      else if (nv == w && w == 8)
        decode_rows(8, rp, kc, t, d);
      else if (nv == w && w == 6)
        decode_rows(6, rp, kc, t, d);
      else if (nv == w && w == 4)
        decode_rows(4, rp, kc, t, d);
      else
        for (kk = 0; kk < kc; kk++)
          for (i = 0; i < nv; i++) d[kk * w + i] = t[rp[i][kk]];
    } else {
      for (kk = 0; kk < kc; kk++) {
        const uint8_t *src = o->data + (k0 + kk) * o->ks + (row0 + pnl * w) * o->rs;
        if (o->rs == 1)
          for (i = 0; i < nv; i++) d[kk * w + i] = t[src[i]];
        else
          for (i = 0; i < nv; i++) d[kk * w + i] = t[src[i * o->rs]];
      }
    }
    if (nv < w)
      for (kk = 0; kk < kc; kk++)
        for (i = nv; i < w; i++) d[kk * w + i] = 0.0f;
    xte_cpu_gemm_panel_scales(o, row0 + pnl * w, nv, w, k0, c->nblk, c->g->kblock,
                              sdst + pnl * (int64_t)w * c->nblk);
  }
}

static void pack_b_range(void *vctx, int64_t b, int64_t e, int tid) {
  fctx *c = (fctx *)vctx;
  (void)tid;
  fpack(c, &c->g->b, c->p->b_i0 + c->jc + b * c->NR, c->nc - b * c->NR, e - b, c->NR,
        c->p->b_k0 + c->pc, c->bp + b * c->NR * c->kc, c->sbp + b * c->NR * c->nblk);
}

/* Items [b, e): item it is M block it / n_jch (MC rows of the chunk) x strip run it % n_jch. */
static void compute_range(void *vctx, int64_t b, int64_t e, int tid) {
  fctx *c = (fctx *)vctx;
  const int MR = c->MR, NR = c->NR;
  const int64_t kc = c->kc, ldw = c->ldw;
  float *ap = c->ap[tid], *sap = c->sap[tid];
  int64_t it;
  for (it = b; it < e; it++) {
    const int64_t ic = it / c->n_jch, jch = it % c->n_jch;
    const int64_t r0 = ic * c->MC, rows = c->mch - r0 < c->MC ? c->mch - r0 : c->MC;
    const int64_t s0 = jch * c->spj, s1 = s0 + c->spj < c->nstrips ? s0 + c->spj : c->nstrips;
    const int64_t tiles = (rows + MR - 1) / MR;
    int64_t s, t, r;
    if (s0 >= s1 || rows <= 0) continue;
    if (c->first_pc)
      for (r = 0; r < tiles * MR; r++)
        memset(c->W + (r0 + r) * ldw + s0 * NR, 0, sizeof(float) * (size_t)((s1 - s0) * NR));
    fpack(c, &c->g->a, c->p->a_i0 + c->mc0 + r0, rows, tiles, MR, c->p->a_k0 + c->pc, ap, sap);
    for (s = s0; s < s1; s++) {
      const float *bs = c->bp + s * NR * kc, *sbs = c->sbp + s * NR * c->nblk;
      for (t = 0; t < tiles; t++)
        c->fk->tile(c->nblk, c->kl, ap + t * MR * kc, bs, sap + t * MR * c->nblk, sbs,
                    c->W + (r0 + t * MR) * ldw + s * NR, ldw);
    }
    if (c->last_pc) {
      const int64_t n0 = s0 * NR, len = (s1 * NR < c->nc ? s1 * NR : c->nc) - n0;
      for (r = 0; r < rows; r++)
        xte_cpu_gemm_store_row(c->g, c->p->d_r0 + c->mc0 + r0 + r, c->jc + n0,
                               c->W + (r0 + r) * ldw + n0, len);
    }
  }
}

/* K = 0: D = epilogue(0), rows [b, e). */
static void empty_k_rows(void *vctx, int64_t b, int64_t e, int tid) {
  fctx *c = (fctx *)vctx;
  float z[256];
  int64_t r, n0;
  (void)tid;
  for (r = b; r < e; r++)
    for (n0 = 0; n0 < c->p->n; n0 += 256) {
      const int64_t len = c->p->n - n0 < 256 ? c->p->n - n0 : 256;
      memset(z, 0, sizeof z);
      xte_cpu_gemm_store_row(c->g, c->p->d_r0 + r, n0, z, len);
    }
}

static void run_problem(fctx *c, const xte_gemm_problem *p, int64_t m) {
  const int64_t kb = c->g->kblock;
  const int nt = c->nt;
  c->p = p;
  c->m = m;
  if (m <= 0 || p->n <= 0) return;
  if (p->k <= 0) {
    xte_parallel_for_max(m, nt, empty_k_rows, c);
    return;
  }
  for (c->jc = 0; c->jc < p->n; c->jc += c->NC) {
    c->nc = p->n - c->jc < c->NC ? p->n - c->jc : c->NC;
    c->nstrips = (c->nc + c->NR - 1) / c->NR;
    for (c->mc0 = 0; c->mc0 < m; c->mc0 += c->MCH) {
      c->mch = m - c->mc0 < c->MCH ? m - c->mc0 : c->MCH;
      /* M blocks of at most MC_max rows, as many as a multiple of the threads where there are
       * enough rows (M = 512 on 2 threads: 2 x 266 rows, not 476 + 36) */
      c->n_ic = (c->mch + c->MC_max - 1) / c->MC_max;
      if (c->mch >= (int64_t)nt * c->MR * 4) c->n_ic = (c->n_ic + nt - 1) / nt * nt;
      c->MC = ((c->mch + c->n_ic - 1) / c->n_ic + c->MR - 1) / c->MR * c->MR;
      c->n_ic = (c->mch + c->MC - 1) / c->MC;
      /* enough items for every thread: fewer M blocks than threads split the strips too */
      c->n_jch = c->n_ic >= nt ? 1 : (nt + c->n_ic - 1) / c->n_ic;
      if (c->n_jch > c->nstrips) c->n_jch = c->nstrips;
      c->spj = (c->nstrips + c->n_jch - 1) / c->n_jch;
      c->n_jch = (c->nstrips + c->spj - 1) / c->spj;
      for (c->pc = 0; c->pc < p->k; c->pc += FKC) {
        int64_t k;
        c->kc = p->k - c->pc < FKC ? p->k - c->pc : FKC;
        c->first_pc = c->pc == 0;
        c->last_pc = c->pc + c->kc >= p->k;
        c->nblk = 0;
        for (k = 0; k < c->kc; k += kb) c->kl[c->nblk++] = (int)(c->kc - k < kb ? c->kc - k : kb);
        xte_parallel_for_max(c->nstrips, nt, pack_b_range, c);
        xte_parallel_for_max(c->n_ic * c->n_jch, nt, compute_range, c);
      }
    }
  }
}

/* 1 when FAST runs the exact driver: the exact partial is within FAST's bound (its error is 0),
 * and where the exact driver takes the AMX-INT8 path (the table has the extension; e4m3 x e4m3,
 * K block 128, operands along K or transposed: the test of cpu_gemm in src/cpu/gemm_driver.c) it
 * is faster than the fp32 multiply-adds (docs/performance.md). Calls with a problem for the
 * small-M path of FAST (fast_small) stay here. */
int xte_cpu_gemm_fast_runs_exact(const xte_gemm_args *g) {
  const xte_cpu_isa_table *T = xte_cpu_isa_table_get();
  int64_t i;
  if (!T->amx || g->a.fmt != XTE_FP8_E4M3 || g->b.fmt != XTE_FP8_E4M3 || g->kblock != 128 ||
      !(g->a.ks == 1 || g->a.rs == 1) || !(g->b.ks == 1 || g->b.rs == 1))
    return 0;
  if (fast_small.max_rows > 0)
    for (i = 0; i < g->num_problems; i++)
      if ((g->masked_m ? g->masked_m[i] : g->problems[i].m) <= fast_small.max_rows) return 0;
  return 1;
}

static size_t al(size_t n) {
  return (n + 63) / 64 * 64;
}

xte_status xte_cpu_gemm_fast(const xte_gemm_args *g) {
  fctx c;
  const xte_cpu_isa_table *T = xte_cpu_isa_table_get(); /* one ISA for the whole call */
  int64_t i, maxm = 0, maxn = 0;
  size_t l2, szb, szsb, szw, sza, szsa, szsmall = 0, total;
  char *w, *q;
  void **ptrs;
  int t;
  pthread_once(&ftab_once, init_ftab);
  memset(&c, 0, sizeof c);
  c.g = g;
  c.fk = T->gemm_fast;
  c.MR = c.fk->mr;
  c.NR = c.fk->nr;
  c.nt = xte_cpu_threads();
  l2 = xte_cpu_l2();
  /* MC rows of packed A fill about a quarter of L2 (B strips and W tiles stream beside it) */
  c.MC_max = (int64_t)(l2 / 4 / (FKC * sizeof(float))) / c.MR * c.MR;
  if (c.MC_max < c.MR) c.MC_max = c.MR;
  if (c.MC_max > 480) c.MC_max = 480 / c.MR * c.MR;
  c.NC = 2048 / c.NR * c.NR;
  c.MCH = 1024; /* B is packed once per chunk of MCH rows */
  for (i = 0; i < g->num_problems; i++) {
    const int64_t mi = g->masked_m ? g->masked_m[i] : g->problems[i].m;
    if (fast_small.max_rows > 0 && mi <= fast_small.max_rows) continue;
    if (mi > maxm) maxm = mi;
    if (g->problems[i].n > maxn) maxn = g->problems[i].n;
  }
  if (fast_small.max_rows > 0) szsmall = fast_small.ws(g, c.nt);
  if (maxm > c.MCH) maxm = c.MCH;
  if (maxn > c.NC) maxn = c.NC;
  maxm = (maxm + c.MR - 1) / c.MR * c.MR;
  maxn = (maxn + c.NR - 1) / c.NR * c.NR;
  /* W's row stride off a multiple of 4 KiB (no cache-set aliasing between a tile's rows) */
  c.ldw = maxn + 16;
  /* one workspace: B panel + scales, W, per thread A block + scales, the small-M path's */
  szb = sizeof(float) * (size_t)maxn * FKC;
  szsb = sizeof(float) * (size_t)maxn * FMAX_BLK;
  szw = sizeof(float) * (size_t)maxm * (size_t)c.ldw;
  sza = sizeof(float) * (size_t)c.MC_max * FKC;
  szsa = sizeof(float) * (size_t)c.MC_max * FMAX_BLK;
  total = al(szb) + al(szsb) + al(szw) + (size_t)c.nt * (al(sza) + al(szsa)) + al(szsmall);
  w = xte_cpu_gemm_ws_acquire(total);
  ptrs = (void **)xte_aligned_calloc((size_t)c.nt * 2, sizeof(void *));
  if (!w || !ptrs) {
    xte_aligned_free(ptrs);
    xte_cpu_gemm_ws_release(w);
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY,
                         "gemm (FAST): no memory for %zu bytes of packing buffers", total);
  }
  q = w;
  c.bp = (float *)q;
  q += al(szb);
  c.sbp = (float *)q;
  q += al(szsb);
  c.W = (float *)q;
  q += al(szw);
  c.ap = (float **)ptrs;
  c.sap = (float **)(ptrs + c.nt);
  for (t = 0; t < c.nt; t++) {
    c.ap[t] = (float *)q;
    q += al(sza);
    c.sap[t] = (float *)q;
    q += al(szsa);
  }
  for (i = 0; i < g->num_problems; i++) {
    const int64_t mi = g->masked_m ? g->masked_m[i] : g->problems[i].m;
    if (fast_small.max_rows > 0 && mi > 0 && mi <= fast_small.max_rows)
      fast_small.run(g, &g->problems[i], mi, q, c.nt);
    else
      run_problem(&c, &g->problems[i], mi);
  }
  xte_aligned_free(ptrs);
  xte_cpu_gemm_ws_release(w);
  return XTE_SUCCESS;
}
