/* CPU FAST GEMM driver (XTE_GEMM_FAST), BLIS-style, in fp32. For each problem (one per group):
 *   jc over N in panels of NC columns
 *     mc0 over M in chunks of MCH rows (the fp32 accumulators of a chunk x panel live in W)
 *       items (a run of NR strips x a part of the rows), one per thread, each over every K panel
 *       of FKC (a multiple of the 128 / 32 K block):
 *         pack its B strips [K panel] to fp32 micro-panels [k][NR] (+ scales)
 *         per M block of at most MC_max rows: pack A to fp32 micro-panels [k][MR] (+ scales);
 *           for each NR strip, for each MR tile: the ISA's FAST kernel over the panel's K blocks
 *           into the tile's fp32 accumulators (row-major in W); on the last K panel the rows of
 *           D are written by the exact driver's epilogue (xte_cpu_gemm_store_row).
 * With the AMX-BF16 tiles (c->fa, run_problem_amx) the loops are the same except: mc0 is the
 * outer loop, the chunk's A is packed once (bf16 tiles) for all threads before its panels, the
 * items are smaller runs of strips claimed one at a time by the threads, and rows without C and
 * bias are written by fa->out (the exact epilogue's conversion, vectorised: the same bytes).
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
#include <stdatomic.h>
#include <string.h>

#include "cpu/gemm_fast.h"
#include "cpu/gemm_fast_small.h"
#include "cpu/gemm_kernels.h"
#include "cpu/xte_cpu.h"
#include "numerics/xte_gemm_numerics.h"
#include "xte_gemm_ops.h"
#include "xte_internal.h"

#define FKC 128 /* multiple of 128 and 32 */
/* The AMX-BF16 tiles' K panel: a tile call folds 4x more blocks into its accumulators while
 * they are in L1 (the tile unit is fast enough that the fold's traffic to W otherwise bounds it) */
#define FKC_AMX 512
#define FMAX_BLK (FKC_AMX / 32)
#define AMX_SPJ 16 /* the most NR strips of an item of the AMX-BF16 path */
#define FMAX_W 64  /* widest micro-panel (MR or NR) */

/* The small-M path of FAST (src/cpu/gemm_fast_small.c: streams the codes of B once per problem
 * instead of packing panels): the problems it takes (xte_cpu_gemm_fast_small_ok: a few rows, B
 * along K) go to it, with its part of the workspace sized before anything is written; the others
 * take the panels below. */
static int64_t rows_of(const xte_gemm_args *g, int64_t i) {
  return g->masked_m ? g->masked_m[i] : g->problems[i].m;
}

static int small_m(const xte_gemm_args *g, int64_t i) {
  return xte_cpu_gemm_fast_small_ok(g, rows_of(g, i));
}

/* Small-M problems that FAST hands to the exact driver (its result, error 0, is inside FAST's
 * bound): where the exact driver runs a digit path (xte_cpu_gemm_exact_small_path) that streams
 * the weight codes faster than the fp32 kernel of gemm_fast_small.c, so that FAST is never
 * slower than EXACT on the same problem:
 * - AVX512-VNNI, at most FS_VNNI_MAXM rows: one VPDPBUSD takes 64 int8 codes of B (4 products
 *   per lane) for the row, where the fp32 kernel decodes the codes to fp16 and fp32 first; the
 *   fp32 kernel wins as soon as the decode is shared by a second row.
 * - AMX-INT8, from FS_AMX_MINM rows on (the exact driver takes AMX there when it has VNNI): a
 *   tile instruction costs the same for 1 or 16 rows, while the fp32 kernel's FMAs grow with the
 *   rows (m / 16 per code) and past 8 rows its codes go through L1 (several row tiles).
 * The crossovers are measured (docs/performance.md, "Small-M GEMM", FAST). */
#define FS_VNNI_MAXM 1
#define FS_AMX_MINM 9

static int small_exact(const xte_gemm_args *g, int64_t m) {
  switch (xte_cpu_gemm_exact_small_path(g, m)) {
    case XTE_CPU_SK_VNNI:
      return m <= FS_VNNI_MAXM;
    case XTE_CPU_SK_AMX:
      return m >= FS_AMX_MINM;
    default:
      return 0;
  }
}

/* 1 when the problems past the small-M path run the exact driver: the exact partial is within
 * FAST's bound (its error is 0), and where the exact driver takes the AMX-INT8 path (the table
 * has the extension; e4m3 x e4m3, K block 128, operands along K or transposed: the test of
 * cpu_gemm in src/cpu/gemm_driver.c) it is faster than the fp32 multiply-adds. Where the AMX-BF16
 * tiles (fast_amx) are attached they are faster still (docs/performance.md), so FAST keeps them. */
static int large_exact(const xte_gemm_args *g) {
  const xte_cpu_isa_table *T = xte_cpu_isa_table_get();
  return T->amx && !T->fast_amx && g->a.fmt == XTE_FP8_E4M3 && g->b.fmt == XTE_FP8_E4M3 &&
         g->kblock == 128 && (g->a.ks == 1 || g->a.rs == 1) && (g->b.ks == 1 || g->b.rs == 1);
}

/* 1 when problem i of g runs on the exact driver (lg: large_exact(g)) */
static int to_exact(const xte_gemm_args *g, int64_t i, int lg) {
  return small_m(g, i) ? small_exact(g, rows_of(g, i)) : lg;
}

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
  const xte_gemm_fast_amx_kernels *fa; /* the AMX-BF16 tiles (NULL: fk's fp32 ones) */
  int MR, NR;
  int64_t fkc; /* the K panel: FKC, or FKC_AMX with fa */
  int64_t MC_max, NC, MCH, ldw;
  /* current problem / panels */
  const xte_gemm_problem *p;
  int64_t m;
  int64_t jc, nc, nstrips;
  int64_t mc0, mch;
  int64_t pc, kc;
  int first_pc, last_pc, nblk;
  int kl[FMAX_BLK];
  int64_t n_jch, spj, n_im; /* strip runs, strips per run, row parts */
  /* buffers: accumulators W [MCH][ldw], per thread B strips + scales, A block + scales */
  float *W;
  float **bp, **sbp, **ap, **sap;
  /* the AMX-BF16 path (amx_*): A of the chunk packed once for all threads, slot (tile, K panel)
   * at ash + slot MR fkc (scales sash + slot MR FMAX_BLK), slot = tile npc + panel; the items,
   * claimed one at a time by the threads */
  uint16_t *ash;
  float *sash;
  int64_t npc;
  atomic_llong *next;
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

/* fpack for the AMX-BF16 tiles (c->fa): each micro-panel of w = 32 rows in bf16 tiles, kc K steps
 * padded to a multiple of 32 (c->fa->pack's layout; B in the pair layout), and the scales. */
static void fpack_amx(const fctx *c, const xte_gemm_operand *o, int64_t row0, int64_t nvalid,
                      int64_t npanels, int w, int64_t k0, int vnni, uint16_t *dst, float *sdst) {
  const int64_t kcp = (c->kc + 31) / 32 * 32;
  int64_t pnl;
  for (pnl = 0; pnl < npanels; pnl++) {
    int nv = (int)(nvalid - pnl * w < w ? nvalid - pnl * w : w);
    if (nv < 0) nv = 0;
    c->fa->pack(nv ? o->data + (row0 + pnl * w) * o->rs + k0 * o->ks : o->data, o->rs, o->ks, nv,
                c->kc, o->fmt, vnni, dst + pnl * (int64_t)w * kcp);
    xte_cpu_gemm_panel_scales(o, row0 + pnl * w, nv, w, k0, c->nblk, c->g->kblock,
                              sdst + pnl * (int64_t)w * c->nblk);
  }
}

/* Items [b, e) of the current chunk (rows [mc0, mc0 + mch), panel [jc, jc + nc)): item it is
 * strip run it % n_jch x row part it / n_jch. An item runs every K panel itself: it packs its own
 * B strips (kept in L2 while it sweeps its rows), then per M block of at most MC_max rows packs A
 * and runs the tiles, strip by strip (a strip stays in L1); after the last K panel it writes its
 * rows of D. One parallel call per chunk: no barrier per K panel. */
static void item_range(void *vctx, int64_t b, int64_t e, int tid) {
  fctx c = *(const fctx *)vctx; /* the K panel fields are this thread's */
  const int MR = c.MR, NR = c.NR;
  const int64_t ldw = c.ldw, kb = c.g->kblock;
  const xte_gemm_problem *p = c.p;
  float *ap = c.ap[tid], *sap = c.sap[tid], *bp = c.bp[tid], *sbp = c.sbp[tid];
  const int64_t rpi = ((c.mch + c.n_im - 1) / c.n_im + MR - 1) / MR * MR;
  int64_t it;
  for (it = b; it < e; it++) {
    const int64_t jch = it % c.n_jch, im = it / c.n_jch;
    const int64_t s0 = jch * c.spj, s1 = s0 + c.spj < c.nstrips ? s0 + c.spj : c.nstrips;
    const int64_t r0 = im * rpi, r1 = r0 + rpi < c.mch ? r0 + rpi : c.mch;
    const int64_t n0 = s0 * NR, len = (s1 * NR < c.nc ? s1 * NR : c.nc) - n0;
    if (s0 >= s1 || r0 >= r1) continue;
    for (c.pc = 0; c.pc < p->k; c.pc += c.fkc) {
      int64_t k, rb;
      c.kc = p->k - c.pc < c.fkc ? p->k - c.pc : c.fkc;
      c.first_pc = c.pc == 0;
      c.last_pc = c.pc + c.kc >= p->k;
      c.nblk = 0;
      for (k = 0; k < c.kc; k += kb) c.kl[c.nblk++] = (int)(c.kc - k < kb ? c.kc - k : kb);
      fpack(&c, &c.g->b, p->b_i0 + c.jc + n0, c.nc - n0, s1 - s0, NR, p->b_k0 + c.pc, bp, sbp);
      for (rb = r0; rb < r1; rb += c.MC_max) {
        const int64_t rows = r1 - rb < c.MC_max ? r1 - rb : c.MC_max;
        const int64_t tiles = (rows + MR - 1) / MR;
        int64_t s, t, r;
        if (c.first_pc)
          for (r = 0; r < tiles * MR; r++)
            memset(c.W + (rb + r) * ldw + n0, 0, sizeof(float) * (size_t)((s1 - s0) * NR));
        fpack(&c, &c.g->a, p->a_i0 + c.mc0 + rb, rows, tiles, MR, p->a_k0 + c.pc, ap, sap);
        for (s = s0; s < s1; s++) {
          const float *bs = bp + (s - s0) * NR * c.kc, *sbs = sbp + (s - s0) * NR * c.nblk;
          for (t = 0; t < tiles; t++)
            c.fk->tile(c.nblk, c.kl, ap + t * MR * c.kc, bs, sap + t * MR * c.nblk, sbs,
                       c.W + (rb + t * MR) * ldw + s * NR, ldw);
        }
        if (c.last_pc)
          for (r = 0; r < rows; r++)
            xte_cpu_gemm_store_row(c.g, p->d_r0 + c.mc0 + rb + r, c.jc + n0,
                                   c.W + (rb + r) * ldw + n0, len);
      }
    }
  }
}

/* The AMX-BF16 path, step 1: jobs [b, e) of packing the chunk's A, job j = tile j / npc of 32
 * rows over K panel j % npc, into its slot. */
static void amx_pack_a(void *vctx, int64_t b, int64_t e, int tid) {
  fctx c = *(const fctx *)vctx;
  const int64_t kb = c.g->kblock;
  int64_t j, k;
  (void)tid;
  for (j = b; j < e; j++) {
    const int64_t t = j / c.npc, pci = j % c.npc;
    c.pc = pci * c.fkc;
    c.kc = c.p->k - c.pc < c.fkc ? c.p->k - c.pc : c.fkc;
    c.nblk = 0;
    for (k = 0; k < c.kc; k += kb) c.nblk++;
    fpack_amx(&c, &c.g->a, c.p->a_i0 + c.mc0 + t * c.MR, c.mch - t * c.MR, 1, c.MR,
              c.p->a_k0 + c.pc, 0, c.ash + j * c.MR * c.fkc, c.sash + j * c.MR * FMAX_BLK);
  }
}

/* Step 2, one call per thread: items (a run of at most spj strips x a part of the rows), claimed
 * one at a time (the threads need not run at the same speed). An item runs every K panel: packs
 * its B strips (kept in L2 while it sweeps its rows), then per M block of at most MC_max rows
 * runs the tiles strip by strip (a strip stays in L1) on the shared A; after the last K panel
 * it writes its rows of D. Which thread runs an item decides nothing in its bytes. */
static void amx_items(void *vctx, int64_t b, int64_t e, int tid) {
  fctx c = *(const fctx *)vctx;
  atomic_llong *next = c.next;
  const int MR = c.MR, NR = c.NR;
  const int64_t ldw = c.ldw, kb = c.g->kblock, n_items = c.n_jch * c.n_im;
  const xte_gemm_problem *p = c.p;
  uint16_t *bp = (uint16_t *)c.bp[tid];
  float *sbp = c.sbp[tid];
  const int64_t rpi = ((c.mch + c.n_im - 1) / c.n_im + MR - 1) / MR * MR;
  (void)b;
  (void)e;
  c.fa->begin();
  for (;;) {
    const int64_t it = atomic_fetch_add(next, 1);
    const int64_t jch = it % c.n_jch, im = it / c.n_jch;
    const int64_t s0 = jch * c.spj, s1 = s0 + c.spj < c.nstrips ? s0 + c.spj : c.nstrips;
    const int64_t r0 = im * rpi, r1 = r0 + rpi < c.mch ? r0 + rpi : c.mch;
    const int64_t n0 = s0 * NR, len = (s1 * NR < c.nc ? s1 * NR : c.nc) - n0;
    int64_t pci;
    if (it >= n_items) break;
    if (s0 >= s1 || r0 >= r1) continue;
    for (pci = 0, c.pc = 0; c.pc < p->k; c.pc += c.fkc, pci++) {
      int64_t k, rb, kcp;
      c.kc = p->k - c.pc < c.fkc ? p->k - c.pc : c.fkc;
      kcp = (c.kc + 31) / 32 * 32;
      c.first_pc = c.pc == 0;
      c.last_pc = c.pc + c.kc >= p->k;
      c.nblk = 0;
      for (k = 0; k < c.kc; k += kb) c.kl[c.nblk++] = (int)(c.kc - k < kb ? c.kc - k : kb);
      fpack_amx(&c, &c.g->b, p->b_i0 + c.jc + n0, c.nc - n0, s1 - s0, NR, p->b_k0 + c.pc, 1, bp,
                sbp);
      for (rb = r0; rb < r1; rb += c.MC_max) {
        const int64_t rows = r1 - rb < c.MC_max ? r1 - rb : c.MC_max;
        const int64_t tiles = (rows + MR - 1) / MR;
        int64_t s, t, r;
        if (c.first_pc)
          for (r = 0; r < tiles * MR; r++)
            memset(c.W + (rb + r) * ldw + n0, 0, sizeof(float) * (size_t)((s1 - s0) * NR));
        for (s = s0; s < s1; s++)
          for (t = 0; t < tiles; t++) {
            const int64_t slot = (rb / MR + t) * c.npc + pci;
            c.fa->tile(c.nblk, c.kl, c.ash + slot * MR * c.fkc, bp + (s - s0) * NR * kcp,
                       c.sash + slot * MR * FMAX_BLK, sbp + (s - s0) * NR * c.nblk,
                       c.W + (rb + t * MR) * ldw + s * NR, ldw);
          }
        if (c.last_pc)
          for (r = 0; r < rows; r++) {
            const int64_t dr = p->d_r0 + c.mc0 + rb + r;
            if (!c.g->c && !c.g->bias) /* the output conversion alone, vectorised */
              c.fa->out(c.W + (rb + r) * ldw + n0,
                        (char *)c.g->d + (size_t)(dr * c.g->ld_d + c.jc + n0) *
                                             (c.g->d_dtype == XTE_DTYPE_BF16 ? 2 : 4),
                        c.g->d_dtype == XTE_DTYPE_BF16, len);
            else
              xte_cpu_gemm_store_row(c.g, dr, c.jc + n0, c.W + (rb + r) * ldw + n0, len);
          }
      }
    }
  }
  c.fa->end();
}

/* The AMX-BF16 path of run_problem (m, n, k > 0): per chunk of MCH rows A packed once (step 1),
 * then per panel of NC columns the items (step 2): runs of about a quarter of a thread's share
 * of the strips (at most AMX_SPJ), so a slower thread takes fewer; fewer strips than threads
 * split the rows too. */
static void run_problem_amx(fctx *c) {
  const int nt = c->nt;
  const xte_gemm_problem *p = c->p;
  atomic_llong next;
  c->next = &next;
  c->npc = (p->k + c->fkc - 1) / c->fkc;
  for (c->mc0 = 0; c->mc0 < c->m; c->mc0 += c->MCH) {
    int64_t tiles;
    c->mch = c->m - c->mc0 < c->MCH ? c->m - c->mc0 : c->MCH;
    tiles = (c->mch + c->MR - 1) / c->MR;
    xte_parallel_for_max(tiles * c->npc, nt, amx_pack_a, c);
    for (c->jc = 0; c->jc < p->n; c->jc += c->NC) {
      c->nc = p->n - c->jc < c->NC ? p->n - c->jc : c->NC;
      c->nstrips = (c->nc + c->NR - 1) / c->NR;
      c->spj = c->nstrips / (4 * (int64_t)nt);
      if (c->spj > AMX_SPJ) c->spj = AMX_SPJ;
      if (c->spj < 1) c->spj = 1;
      c->n_jch = (c->nstrips + c->spj - 1) / c->spj;
      c->n_im = c->n_jch >= nt ? 1 : nt / c->n_jch;
      if (c->n_im > tiles) c->n_im = tiles;
      if (c->n_im < 1) c->n_im = 1;
      atomic_store(&next, 0);
      xte_parallel_for_max(nt, nt, amx_items, c);
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
  const int nt = c->nt;
  c->p = p;
  c->m = m;
  if (m <= 0 || p->n <= 0) return;
  if (p->k <= 0) {
    xte_parallel_for_max(m, nt, empty_k_rows, c);
    return;
  }
  if (c->fa) {
    run_problem_amx(c);
    return;
  }
  for (c->jc = 0; c->jc < p->n; c->jc += c->NC) {
    c->nc = p->n - c->jc < c->NC ? p->n - c->jc : c->NC;
    c->nstrips = (c->nc + c->NR - 1) / c->NR;
    for (c->mc0 = 0; c->mc0 < m; c->mc0 += c->MCH) {
      c->mch = m - c->mc0 < c->MCH ? m - c->mc0 : c->MCH;
      /* one strip run per thread; fewer strips than threads split the rows too */
      c->n_jch = c->nstrips < nt ? c->nstrips : nt;
      c->spj = (c->nstrips + c->n_jch - 1) / c->n_jch;
      c->n_jch = (c->nstrips + c->spj - 1) / c->spj;
      c->n_im = nt / c->n_jch;
      if (c->n_im > (c->mch + c->MR - 1) / c->MR) c->n_im = (c->mch + c->MR - 1) / c->MR;
      if (c->n_im < 1) c->n_im = 1;
      xte_parallel_for_max(c->n_jch * c->n_im, nt, item_range, c);
    }
  }
}

/* 1 when every problem of g runs on the exact driver (to_exact) */
int xte_cpu_gemm_fast_runs_exact(const xte_gemm_args *g) {
  const int lg = large_exact(g);
  int64_t i;
  for (i = 0; i < g->num_problems; i++)
    if (!to_exact(g, i, lg)) return 0;
  return 1;
}

/* The problems of g that to_exact gives the exact driver, as one call of theirs (before FAST
 * takes its workspace, which the exact driver's is) */
static xte_status run_exact_part(const xte_gemm_args *g, int lg) {
  xte_gemm_args e = *g;
  xte_gemm_problem *pr;
  int32_t *mm = NULL;
  int64_t i, n = 0;
  xte_status st;
  for (i = 0; i < g->num_problems; i++) n += to_exact(g, i, lg);
  if (n == 0) return XTE_SUCCESS;
  pr = (xte_gemm_problem *)xte_aligned_calloc((size_t)n, sizeof *pr);
  if (g->masked_m) mm = (int32_t *)xte_aligned_calloc((size_t)n, sizeof *mm);
  if (!pr || (g->masked_m && !mm)) {
    xte_aligned_free(pr);
    xte_aligned_free(mm);
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "gemm (FAST): no memory for %lld problems",
                         (long long)n);
  }
  for (i = 0, n = 0; i < g->num_problems; i++)
    if (to_exact(g, i, lg)) {
      pr[n] = g->problems[i];
      if (mm) mm[n] = g->masked_m[i];
      n++;
    }
  e.mode = XTE_GEMM_EXACT;
  e.num_problems = n;
  e.problems = pr;
  e.masked_m = mm;
  st = xte_cpu_gemm_ops()->gemm(&e, NULL);
  xte_aligned_free(mm);
  xte_aligned_free(pr);
  return st;
}

int xte_cpu_gemm_fast_small_exact(int64_t m) {
  xte_gemm_args g;
  memset(&g, 0, sizeof g);
  g.mode = XTE_GEMM_FAST;
  g.kblock = 128;
  g.a.fmt = g.b.fmt = XTE_FP8_E4M3;
  g.a.ks = g.b.ks = 1;
  return xte_cpu_gemm_fast_small_ok(&g, m) && small_exact(&g, m);
}

/* Test hook (tests/test_gemm_fast_small.c): xte_cpu_gemm_fast_small_exact */
XTE_API int xte_internal_gemm_fast_small_exact(int64_t m);
int xte_internal_gemm_fast_small_exact(int64_t m) {
  return xte_cpu_gemm_fast_small_exact(m);
}

int xte_cpu_gemm_fast_amx(void) {
  return xte_cpu_isa_table_get()->fast_amx != NULL;
}

static size_t al(size_t n) {
  return (n + 63) / 64 * 64;
}

xte_status xte_cpu_gemm_fast(const xte_gemm_args *g) {
  fctx c;
  const xte_cpu_isa_table *T = xte_cpu_isa_table_get(); /* one ISA for the whole call */
  int64_t i, maxm = 0, maxn = 0, maxk = 0;
  size_t l2, esz, szb, szsb, szw, sza, szsa, szash = 0, szsash = 0, szsmall = 0, total;
  char *w, *q;
  void **ptrs;
  int t, any_small = 0;
  const int lg = large_exact(g);
  xte_status st;
  pthread_once(&ftab_once, init_ftab);
  st = run_exact_part(g, lg);
  if (st != XTE_SUCCESS) return st;
  memset(&c, 0, sizeof c);
  c.g = g;
  c.fk = T->gemm_fast;
  c.fa = T->fast_amx;
  c.MR = c.fa ? c.fa->mr : c.fk->mr;
  c.NR = c.fa ? c.fa->nr : c.fk->nr;
  c.nt = xte_cpu_threads();
  l2 = xte_cpu_l2();
  /* MC rows of packed A fill about a quarter of L2 (B strips and W tiles stream beside it) */
  c.fkc = c.fa ? FKC_AMX : FKC;
  esz = c.fa ? sizeof(uint16_t) : sizeof(float); /* a packed element: bf16 or fp32 */
  c.MC_max = (int64_t)(l2 / 4 / ((size_t)c.fkc * esz)) / c.MR * c.MR;
  if (c.MC_max < c.MR) c.MC_max = c.MR;
  if (c.MC_max > 480) c.MC_max = 480 / c.MR * c.MR;
  c.NC = 2048 / c.NR * c.NR;
  c.MCH = 1024; /* B is packed once per chunk of MCH rows */
  for (i = 0; i < g->num_problems; i++) {
    const int64_t mi = rows_of(g, i);
    if (to_exact(g, i, lg)) continue;
    if (small_m(g, i)) {
      any_small = 1;
      continue;
    }
    if (mi > maxm) maxm = mi;
    if (g->problems[i].n > maxn) maxn = g->problems[i].n;
    if (g->problems[i].k > maxk) maxk = g->problems[i].k;
  }
  if (any_small) szsmall = xte_cpu_gemm_fast_small_ws(g, c.nt);
  if (maxm > c.MCH) maxm = c.MCH;
  if (maxn > c.NC) maxn = c.NC;
  maxm = (maxm + c.MR - 1) / c.MR * c.MR;
  maxn = (maxn + c.NR - 1) / c.NR * c.NR;
  /* W's row stride off a multiple of 4 KiB (no cache-set aliasing between a tile's rows) */
  c.ldw = maxn + 16;
  /* one workspace: W, per thread B strips (up to a panel) + scales and an A block + scales, the
   * small-M path's */
  szb = esz * (size_t)maxn * (size_t)c.fkc;
  szsb = sizeof(float) * (size_t)maxn * (size_t)(c.fkc / 32);
  szw = sizeof(float) * (size_t)maxm * (size_t)c.ldw;
  sza = esz * (size_t)c.MC_max * (size_t)c.fkc;
  szsa = sizeof(float) * (size_t)c.MC_max * (size_t)(c.fkc / 32);
  if (c.fa) {
    /* the AMX-BF16 path: per thread the B strips of an item (at most AMX_SPJ), the chunk's A
     * shared (every K panel of maxm rows, run_problem_amx) */
    const size_t slots = (size_t)(maxm / c.MR) * (size_t)((maxk + c.fkc - 1) / c.fkc);
    szb = esz * (size_t)(AMX_SPJ * c.NR) * (size_t)c.fkc;
    szsb = sizeof(float) * (size_t)(AMX_SPJ * c.NR) * FMAX_BLK;
    sza = szsa = 0;
    szash = esz * slots * (size_t)c.MR * (size_t)c.fkc;
    szsash = sizeof(float) * slots * (size_t)c.MR * FMAX_BLK;
  }
  total = al(szw) + al(szash) + al(szsash) +
          (size_t)c.nt * (al(szb) + al(szsb) + al(sza) + al(szsa)) + al(szsmall);
  w = xte_cpu_gemm_ws_acquire(total);
  ptrs = (void **)xte_aligned_calloc((size_t)c.nt * 4, sizeof(void *));
  if (!w || !ptrs) {
    xte_aligned_free(ptrs);
    xte_cpu_gemm_ws_release(w);
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY,
                         "gemm (FAST): no memory for %zu bytes of packing buffers", total);
  }
  q = w;
  c.W = (float *)q;
  q += al(szw);
  c.ash = (uint16_t *)q;
  q += al(szash);
  c.sash = (float *)q;
  q += al(szsash);
  c.ap = (float **)ptrs;
  c.sap = (float **)(ptrs + c.nt);
  c.bp = (float **)(ptrs + 2 * c.nt);
  c.sbp = (float **)(ptrs + 3 * c.nt);
  for (t = 0; t < c.nt; t++) {
    c.bp[t] = (float *)q;
    q += al(szb);
    c.sbp[t] = (float *)q;
    q += al(szsb);
    c.ap[t] = (float *)q;
    q += al(sza);
    c.sap[t] = (float *)q;
    q += al(szsa);
  }
  for (i = 0; i < g->num_problems; i++) {
    const int64_t mi = rows_of(g, i);
    if (to_exact(g, i, lg)) continue;
    if (small_m(g, i))
      xte_cpu_gemm_fast_small_run(g, &g->problems[i], mi, q);
    else
      run_problem(&c, &g->problems[i], mi);
  }
  xte_aligned_free(ptrs);
  xte_cpu_gemm_ws_release(w);
  return XTE_SUCCESS;
}
