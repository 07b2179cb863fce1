/* CPU GEMM driver, BLIS-style. For each problem (one per group):
 *   jc over N in panels of NC columns
 *     mc0 over M in chunks of MCH rows (the fp32 accumulators of a chunk x panel live in W)
 *       pc over K in panels of KC (a multiple of the 128 / 32 K block)
 *         pack B[pc panel, jc panel] to fp64 micro-panels [k][NR] (+ scales), all threads
 *         items (MC rows x a run of NR strips), spread statically over the threads:
 *           pack A[MC rows, pc panel] to fp64 micro-panels [k][MR] (+ scales), per thread
 *           for each NR strip, for each MR tile: micro-kernel over the panel's K blocks into the
 *           tile's fp32 accumulators. The last K panel runs in chunks of EPI_SC strips, tile row
 *           by tile row (C / D lines prefetched first), and the epilogue then writes each of the
 *           band's rows of D left to right across the chunk (whole lines, plain loops).
 * FP8 codes are decoded to fp64 through 256-entry tables while packing (exact), so decoding is
 * amortised over the other operand's extent; on AVX-512 full 8-row strips of an e4m3 B decode
 * with SIMD (fp16 images, pack_b8). When each thread packs its own B strips (own_b), a strip is
 * packed on the run's first M block just before its kernels read it. AVX-512 tiles of 24 rows
 * with only 8 or 16 valid rows (the M tail) run 8- / 16-row kernels on the same packed data.
 * Problems of at most XTE_GEMM_SK_MAXM rows take the small-M path instead (sk_range): B is never
 * packed, its codes are decoded per K block into an L1 buffer and read once; threads split N. On
 * avx512 with AMX-INT8 the other e4m3 x e4m3 problems (K block 128) take the AMX path instead
 * (amx_problem: int8 digit products on the tile unit, src/cpu/amx/gemm_amx.c), and so do those
 * of AMX_SK_MINM to XTE_GEMM_SK_MAXM rows (amx_small_range: threads split N, no shared panel).
 * With AVX512-VNNI, e4m3 x e4m3 problems of at most VNNI_SK_MAXM_AMX rows (every small-M one
 * without AMX) take vnni_small_range instead: B's codes become int8 digits 16 rows x one K block
 * at a time, in the VNNI order, summed per output lane by VPDPBUSD (src/cpu/vnni/gemm_vnni.h).
 * Every output element goes through the contract's arithmetic in K order whatever the partition, so
 * results never depend on threads or ISA. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/gemm_fast.h"
#include "cpu/gemm_kernels.h"
#include "cpu/xte_cpu.h"
#include "numerics/xte_gemm_numerics.h"
#include "xte_gemm_ops.h"
#include "xte_internal.h"

#define KC 256 /* multiple of 128 and 32 */
#define MAX_BLK (KC / 32)
#define MAX_W 64 /* widest micro-panel (MR or NR) */

/* decode tables: full value of each code, and the two magnitude classes of e5m2 */
static double tab_full[2][256], tab_hi[256], tab_lo[256];
/* small-M path: an e4m3 B decodes to value * 2^-8 (the fp16 image of its code), A then packs as
 * value * 2^8; both exact */
static double tab_b_e4m3[256];
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;

static void init_tables(void) {
  int f, c;
  for (f = 0; f < 2; f++)
    for (c = 0; c < 256; c++) tab_full[f][c] = xte_fp8_to_f64((uint8_t)c, f);
  for (c = 0; c < 256; c++) tab_b_e4m3[c] = tab_full[XTE_FP8_E4M3][c] * 0x1p-8;
  for (c = 0; c < 256; c++) {
    tab_hi[c] = xte_gemm_class_hi(tab_full[XTE_FP8_E5M2][c]);
    tab_lo[c] = xte_gemm_class_lo(tab_full[XTE_FP8_E5M2][c]);
  }
}

typedef struct gctx {
  const xte_gemm_args *g;
  int nt; /* threads the per-thread buffers were sized for; every parallel loop uses at most this */
  const xte_gemm_ukernel *uk;         /* the ISA's kernels */
  xte_gemm_pack_b8_fn pack_b8;        /* NULL: tables only */
  xte_gemm_tile_fn tile_r8, tile_r16; /* 24-row tiles with 8 / 16 valid rows; NULL: none */
  const xte_gemm_amx_kernels *ax;     /* the ISA's extensions (NULL: none) */
  const xte_gemm_vnni_kernels *vx;
  int MR, NR;
  int64_t MC, NC, MCH;
  int split_a, split_b;
  /* current problem / panels */
  const xte_gemm_problem *p;
  int64_t m;             /* valid rows of the problem */
  int64_t jc, nc;        /* N panel */
  int64_t mc0, mch;      /* M chunk */
  int64_t pc, kc;        /* K panel */
  int first_pc, last_pc; /* of the chunk */
  int nblk;
  int kl[MAX_BLK];
  int64_t nstrips, mtiles, n_ic, n_jch, spj;
  int own_b; /* each thread packs the B strips it computes */
  /* buffers */
  double *bp, *bp_lo;
  float *sbp;
  float *W;
  double **ap, **ap_lo;
  float **sap;
  /* per thread: EPI_SC packed B strips (+ low class, scales) for runs over a single M block */
  double **bs, **bs_lo;
  float **sbs;
  /* small-M path: per thread A panel (+ low class), A scales, fp32 accumulators, decoded B */
  int64_t sk_kp; /* K panel of the current problem (a multiple of the K block) */
  double **sk_a, **sk_alo, **sk_bd, **sk_bdlo;
  float **sk_sa, **sk_w;
  /* AMX path (e4m3 x e4m3, K block 128): B panel digits, its NaN masks and scales, the fp32
   * accumulators W [AMX_MCH][amx_ldw], per thread A digits (+ NaN masks, scales) */
  int amx;
  int vnni; /* small M on the AVX512-VNNI digit kernels (e4m3 x e4m3, K block 128, B along K) */
  int64_t amx_ldw, amx_ntn, amx_mtiles, amx_nmg, amx_nch, amx_cs;
  int8_t *amx_b;
  uint16_t *amx_nanb;
  float *amx_sb, *amx_w;
  int8_t **amx_a;
  uint16_t **amx_nana;
  float **amx_sa;
} gctx;

/* AMX path sizes (also for the workspace arithmetic of builds without it, where amx_m = 0) */
#define AMX_NC_MAX 1536
#define AMX_MCH_MAX 1024
#define AMX_MG_MAX 8
#define AMX_PANEL_BLK 4 /* K blocks of 128 per panel */
#define AMX_PANEL_BYTES (AMX_PANEL_BLK * 6 * 1024)

#define SK_CH 32               /* strips of 8 columns per chunk of the small-M path */
#define SK_ABYTES (512 * 1024) /* the packed A panel of the small-M path, per thread */

/* The scale of scale-row gi (rows of o) and scale-column gk (K) */
static float scale_at(const xte_gemm_operand *o, int64_t gi, int64_t gk) {
  return o->sswap ? xte_load_scale_inv(&o->s, gk, gi) : xte_load_scale_inv(&o->s, gi, gk);
}

/* Operand B's (or A's) scales of one K block (index gk) for a strip of rows: sb[j] for j < width,
 * row j < nv of scale-row index gi[j] (rows of one 128x128 or per-tensor block share it: read
 * once), 0 past nv. */
static void strip_scales(const xte_gemm_operand *B, const int64_t *gi, int nv, int width,
                         int64_t gk, float *sb) {
  float s = 0.0f; /* a row of row j - 1's group repeats the scale from a register (read back from
                   * sb, each copy waited for the store before it) */
  int j;
  for (j = 0; j < width; j++) {
    if (j >= nv)
      s = 0.0f;
    else if (j == 0 || gi[j] != gi[j - 1])
      s = scale_at(B, gi[j], gk);
    sb[j] = s;
  }
}

/* The scales of rows i0 .. i0 + nv - 1 of operand o (0 for rows nv .. width - 1; width <= MAX_W)
 * in nblk K blocks of kstep codes from k0: out[b * width + j] = scale_at(o, row / bi, k / bk),
 * with one division per row and one per block, not two per value. */
static void panel_scales(const xte_gemm_operand *o, int64_t i0, int nv, int width, int64_t k0,
                         int nblk, int64_t kstep, float *out) {
  int64_t gi[MAX_W];
  const int whole = k0 % o->bk == 0 && kstep % o->bk == 0; /* gk without a division */
  int j, b;
  for (j = 0; j < nv; j++) gi[j] = (i0 + j) / o->bi;
  for (b = 0; b < nblk; b++) {
    const int64_t gk = whole ? k0 / o->bk + b * (kstep / o->bk) : (k0 + b * kstep) / o->bk;
    float *d = out + (int64_t)b * width;
    if (nv == width && nv > 0 && gi[0] == gi[nv - 1]) { /* one group (gi ascends): one read */
      const float v = scale_at(o, gi[0], gk);
      for (j = 0; j < width; j++) d[j] = v;
    } else {
      strip_scales(o, gi, nv, width, gk, d);
    }
  }
}

/* A full micro-panel of W rows through the table, unrolled (W = 8: the AVX-512 NR and the AVX2
 * MR; W = 6: the AVX2 NR; W = 24: the AVX-512 MR): the general case's loop over W rows costs
 * several times the instructions per value. */
static inline __attribute__((always_inline)) void decode_rows(const int W, const uint8_t *const *rp,
                                                              int64_t kc, const double *t,
                                                              double *d) {
  const uint8_t *r[24];
  int64_t kk;
  int i;
  for (i = 0; i < W; i++) r[i] = rp[i];
  for (kk = 0; kk < kc; kk++, d += W)
    for (i = 0; i < W; i++) d[i] = t[r[i][kk]];
}

static void decode_rows8(const uint8_t *const *rp, int64_t kc, const double *t, double *d) {
  decode_rows(8, rp, kc, t, d);
}

static void decode_rows6(const uint8_t *const *rp, int64_t kc, const double *t, double *d) {
  decode_rows(6, rp, kc, t, d);
}

static void decode_rows24(const uint8_t *const *rp, int64_t kc, const double *t, double *d) {
  decode_rows(24, rp, kc, t, d);
}

/* Packs rows [r0, r0 + R*w) (problem-relative row r0 of operand o, w rows per micro-panel, rows
 * >= nvalid are zero) of K range [k0, k0 + kc) into micro-panels [k][w]; scales per block. */
static void pack_panel(const gctx *c, const xte_gemm_operand *o, int split, int64_t row0,
                       int64_t nvalid, int64_t npanels, int w, int64_t k0, double *dst,
                       double *dst_lo, float *sdst) {
  const double *t0 = split ? tab_hi : tab_full[o->fmt];
  const double *t1 = tab_lo;
  const int64_t kc = c->kc;
  int64_t pnl, kk;
  int i;
  for (pnl = 0; pnl < npanels; pnl++) {
    double *d = dst + pnl * (int64_t)w * kc;
    double *dl = split ? dst_lo + pnl * (int64_t)w * kc : NULL;
    float *sd = sdst + pnl * (int64_t)w * c->nblk;
    int nv = (int)(nvalid - pnl * w < w ? nvalid - pnl * w : w);
    if (nv < 0) nv = 0;
    if (o->ks == 1) {
      /* rows read sequentially side by side, the panel written contiguously */
      const uint8_t *rp[MAX_W];
      for (i = 0; i < nv; i++) rp[i] = o->data + (row0 + pnl * w + i) * o->rs + k0;
      if (nv == 8 && w == 8 && c->pack_b8 && !split && o->fmt == XTE_FP8_E4M3)
        c->pack_b8(rp, kc, t0, d);
      else if (nv == 8 && w == 8)
        decode_rows8(rp, kc, t0, d);
      else if (nv == 6 && w == 6)
        decode_rows6(rp, kc, t0, d);
      else if (nv == 24 && w == 24)
        decode_rows24(rp, kc, t0, d);
      else
        for (kk = 0; kk < kc; kk++)
          for (i = 0; i < nv; i++) d[kk * w + i] = t0[rp[i][kk]];
      if (split)
        for (kk = 0; kk < kc; kk++)
          for (i = 0; i < nv; i++) dl[kk * w + i] = t1[rp[i][kk]];
    } else {
      for (kk = 0; kk < kc; kk++) {
        const uint8_t *src = o->data + (k0 + kk) * o->ks + (row0 + pnl * w) * o->rs;
        for (i = 0; i < nv; i++) d[kk * w + i] = t0[src[i * o->rs]];
        if (split)
          for (i = 0; i < nv; i++) dl[kk * w + i] = t1[src[i * o->rs]];
      }
    }
    for (i = nv; i < w; i++)
      for (kk = 0; kk < kc; kk++) {
        d[kk * w + i] = 0.0;
        if (split) dl[kk * w + i] = 0.0;
      }
    panel_scales(o, row0 + pnl * w, nv, w, k0, c->nblk, c->g->kblock, sd);
  }
}

/* Packs B strips [b, e) of the current panel to dst (+ dst_lo, scales sdst). */
static void pack_b_to(const gctx *c, int64_t b, int64_t e, double *dst, double *dst_lo,
                      float *sdst) {
  const xte_gemm_problem *p = c->p;
  pack_panel(c, &c->g->b, c->split_b, p->b_i0 + c->jc + b * c->NR, c->nc - b * c->NR, e - b, c->NR,
             p->b_k0 + c->pc, dst, c->split_b ? dst_lo : NULL, sdst);
}

static void pack_b_range(void *vctx, int64_t b, int64_t e, int tid) {
  gctx *c = (gctx *)vctx;
  const xte_gemm_problem *p = c->p;
  const int64_t kc = c->kc;
  (void)tid;
  pack_panel(c, &c->g->b, c->split_b, p->b_i0 + c->jc + b * c->NR, c->nc - b * c->NR, e - b, c->NR,
             p->b_k0 + c->pc, c->bp + b * c->NR * kc, c->split_b ? c->bp_lo + b * c->NR * kc : NULL,
             c->sbp + b * c->NR * c->nblk);
}

static float load_c(const xte_gemm_args *g, int64_t r, int64_t n) {
  if (g->c_dtype == XTE_DTYPE_BF16)
    return xte_bf16_to_f32(((const uint16_t *)g->c)[r * g->ld_c + n]);
  return ((const float *)g->c)[r * g->ld_c + n];
}

static void store_d(const xte_gemm_args *g, int64_t r, int64_t n, float acc) {
  float t = xte_gemm_epilogue(acc, g->c != NULL, g->c ? load_c(g, r, n) : 0.0f, g->bias != NULL,
                              g->bias ? g->bias[n] : 0.0f);
  if (g->d_dtype == XTE_DTYPE_BF16)
    ((uint16_t *)g->d)[r * g->ld_d + n] = xte_gemm_out_bf16(t);
  else
    ((float *)g->d)[r * g->ld_d + n] = xte_gemm_out_f32(t);
}

#define EPI_SC 16 /* strips per chunk of the last K panel (their accumulators fit in L1) */

/* D[r, n0 + n] for n < len from the accumulators t[n], as store_d does, one step of the
 * contract at a time over the row (C, then bias, then the output rounding), so each loop is
 * plain and vectorises; t is overwritten. */
static void store_row(const xte_gemm_args *g, int64_t r, int64_t n0, float *restrict t,
                      int64_t len) {
  int64_t n;
  if (g->c && g->c_dtype == XTE_DTYPE_BF16) {
    const uint16_t *cr = (const uint16_t *)g->c + r * g->ld_c + n0;
    for (n = 0; n < len; n++) t[n] = xte_gemm_epilogue(t[n], 1, xte_bf16_to_f32(cr[n]), 0, 0.0f);
  } else if (g->c) {
    const float *cr = (const float *)g->c + r * g->ld_c + n0;
    for (n = 0; n < len; n++) t[n] = xte_gemm_epilogue(t[n], 1, cr[n], 0, 0.0f);
  }
  if (g->bias)
    for (n = 0; n < len; n++) t[n] = xte_gemm_epilogue(t[n], 0, 0.0f, 1, g->bias[n0 + n]);
  if (g->d_dtype == XTE_DTYPE_BF16) {
    uint16_t *dr = (uint16_t *)g->d + r * g->ld_d + n0;
    for (n = 0; n < len; n++) dr[n] = xte_gemm_out_bf16(t[n]);
  } else {
    float *dr = (float *)g->d + r * g->ld_d + n0;
    for (n = 0; n < len; n++) dr[n] = xte_gemm_out_f32(t[n]);
  }
}

/* Epilogue of tile row t (chunk-relative rows t * MR..) over strips [s0, s1): each row of the
 * band is gathered from the column-major [NR][MR] tiles of W and written left to right. */
static void epilogue_band(const gctx *c, int64_t t, int64_t s0, int64_t s1) {
  const int MR = c->MR, NR = c->NR;
  const int64_t ri = t * MR, mr = c->mch - ri < MR ? c->mch - ri : MR;
  const int64_t n0 = s0 * NR, len = (s1 * NR < c->nc ? s1 * NR : c->nc) - n0;
  float row[EPI_SC * MAX_W];
  int64_t i, j, s;
  for (i = 0; i < mr; i++) {
    for (s = s0; s < s1; s++) {
      const float *acc = c->W + (s * c->mtiles + t) * (int64_t)(MR * NR) + i;
      for (j = 0; j < NR; j++) row[(s - s0) * NR + j] = acc[j * MR];
    }
    store_row(c->g, c->p->d_r0 + c->mc0 + ri + i, c->jc + n0, row, len);
  }
}

/* Where the packed B strips are: strip s at b + (s - s0) * NR * kc (scales sb + (s - s0) * NR *
 * nblk): the shared panel (s0 = 0) or a thread's strip buffer. */
typedef struct bsrc {
  const double *b, *b_lo;
  const float *sb;
  int64_t s0;
} bsrc;

/* The micro-kernel on tile t of strip s over the current K panel (A packed from tile t0). */
static inline void compute_tile(const gctx *c, const double *ap, const double *ap_lo,
                                const float *sap, const bsrc *bs, int64_t s, int64_t t,
                                int64_t t0) {
  const int MR = c->MR, NR = c->NR;
  const int64_t kc = c->kc;
  float *acc = c->W + (s * c->mtiles + t) * (int64_t)(MR * NR);
  const int64_t rows = c->mch - t * MR;
  xte_gemm_tile_fn tile = c->uk->tile;
  if (rows <= 16 && c->tile_r16 && !c->split_a && !c->split_b)
    tile = rows <= 8 ? c->tile_r8 : c->tile_r16;
  if (c->first_pc) memset(acc, 0, sizeof(float) * (size_t)(MR * NR));
  tile(c->nblk, c->kl, ap + (t - t0) * MR * kc, c->split_a ? ap_lo + (t - t0) * MR * kc : NULL,
       bs->b + (s - bs->s0) * NR * kc, c->split_b ? bs->b_lo + (s - bs->s0) * NR * kc : NULL,
       sap + (t - t0) * MR * c->nblk, bs->sb + (s - bs->s0) * NR * c->nblk, acc);
}

/* The last K panel on tile row t over strips [s0, s1): first prefetches (to L2) the lines of C
 * and D that the epilogue reads and writes (rows of D lie far apart and a band row spans only a
 * few lines, too few for the hardware prefetchers; the band's kernels hide the misses), then
 * runs the kernels and the epilogue. (The prefetches live here, beside the stores: GCC drops a
 * call to a function that only prefetches.) */
static void last_band(const gctx *c, const double *ap, const double *ap_lo, const float *sap,
                      const bsrc *bs, int64_t t, int64_t t0, int64_t s0, int64_t s1) {
  const xte_gemm_args *g = c->g;
  const int64_t ri = t * c->MR, mr = c->mch - ri < c->MR ? c->mch - ri : c->MR;
  const int64_t n0 = c->jc + s0 * c->NR, n1 = c->jc + (s1 * c->NR < c->nc ? s1 * c->NR : c->nc);
  const int64_t esd = g->d_dtype == XTE_DTYPE_BF16 ? 2 : 4,
                esc = g->c_dtype == XTE_DTYPE_BF16 ? 2 : 4;
  int64_t i, o, s;
  for (i = 0; i < mr; i++) {
    const int64_t r = c->p->d_r0 + c->mc0 + ri + i;
    const char *d = (const char *)g->d + (r * g->ld_d + n0) * esd;
    for (o = 0; o < (n1 - n0) * esd; o += 64) __builtin_prefetch(d + o, 1, 2);
    __builtin_prefetch(d + (n1 - n0) * esd - 1, 1, 2);
    if (g->c && g->c != g->d) {
      const char *cc = (const char *)g->c + (r * g->ld_c + n0) * esc;
      for (o = 0; o < (n1 - n0) * esc; o += 64) __builtin_prefetch(cc + o, 0, 2);
      __builtin_prefetch(cc + (n1 - n0) * esc - 1, 0, 2);
    }
  }
  for (s = s0; s < s1; s++) compute_tile(c, ap, ap_lo, sap, bs, s, t, t0);
  epilogue_band(c, t, s0, s1);
}

static void compute_range(void *vctx, int64_t b, int64_t e, int tid) {
  gctx *c = (gctx *)vctx;
  const xte_gemm_problem *p = c->p;
  const int MR = c->MR;
  const int64_t tiles_per_ic = c->MC / MR;
  int64_t it, last_ic = -1, last_jch = -1;
  double *ap = c->ap[tid], *ap_lo = c->ap_lo[tid];
  float *sap = c->sap[tid];
  /* own_b: items are runs of NR strips (jch); the thread packs their B and walks every M
   * block. Otherwise items are (jch, ic) pairs over a B packed beforehand. */
  if (c->own_b) {
    b *= c->n_ic;
    e *= c->n_ic;
  }
  for (it = b; it < e; it++) {
    int64_t jch = it / c->n_ic, ic = it % c->n_ic;
    int64_t t0 = ic * tiles_per_ic;
    int64_t t1 = t0 + tiles_per_ic < c->mtiles ? t0 + tiles_per_ic : c->mtiles;
    int64_t s0 = jch * c->spj, s1 = s0 + c->spj < c->nstrips ? s0 + c->spj : c->nstrips;
    int64_t s, t;
    /* own_b: B strips are packed on the first M block of the run, each just before its kernels
     * run (the strip is still in L1 / L2 when they read it; later M blocks reuse the panel) */
    const int pack_now = c->own_b && jch != last_jch;
    /* a run over a single M block packs its strips into the thread's strip buffer, which stays
     * in L1 / L2 (the panel's lines would be written back for nothing) */
    const int own_strips = pack_now && c->n_ic == 1;
    const bsrc panel = {c->bp, c->bp_lo, c->sbp, 0};
    last_jch = jch;
    if (ic != last_ic) {
      int64_t r0 = c->mc0 + t0 * MR;
      pack_panel(c, &c->g->a, c->split_a, p->a_i0 + r0, c->m - r0, t1 - t0, MR, p->a_k0 + c->pc, ap,
                 ap_lo, sap);
      last_ic = ic;
    }
    if (c->last_pc) {
      /* the last K panel walks chunks of EPI_SC strips tile by tile, so the epilogue writes each
       * tile row across the chunk's strips (whole lines of D) while the chunk's accumulators are
       * in L1 */
      int64_t sc;
      for (sc = s0; sc < s1; sc += EPI_SC) {
        const int64_t sc1 = sc + EPI_SC < s1 ? sc + EPI_SC : s1;
        bsrc bs = panel;
        if (own_strips) {
          bs.b = c->bs[tid];
          bs.b_lo = c->bs_lo[tid];
          bs.sb = c->sbs[tid];
          bs.s0 = sc;
          pack_b_to(c, sc, sc1, c->bs[tid], c->bs_lo[tid], c->sbs[tid]);
        } else if (pack_now) {
          pack_b_range(c, sc, sc1, tid);
        }
        for (t = t0; t < t1; t++) last_band(c, ap, ap_lo, sap, &bs, t, t0, sc, sc1);
      }
      continue;
    }
    for (s = s0; s < s1; s++) {
      bsrc bs = panel;
      if (own_strips) {
        bs.b = c->bs[tid];
        bs.b_lo = c->bs_lo[tid];
        bs.sb = c->sbs[tid];
        bs.s0 = s;
        pack_b_to(c, s, s + 1, c->bs[tid], c->bs_lo[tid], c->sbs[tid]);
      } else if (pack_now) {
        pack_b_range(c, s, s + 1, tid);
      }
      for (t = t0; t < t1; t++) compute_tile(c, ap, ap_lo, sap, &bs, s, t, t0);
    }
  }
}

/* ---------------------------------------------------------------- small M
 * For m <= XTE_GEMM_SK_MAXM rows B is never packed: each thread owns a run of 8-column strips of
 * N; per strip and K block the kernel decodes the 8 rows of B codes into an L1 buffer and forms
 * the m x 8 block partials as dot products along K (exact in any order), then the contract's
 * fp32 steps. A is packed once per K panel (sk_kp columns, value * 2^8 for an e4m3 B). */
static void sk_range(void *vctx, int64_t sb0, int64_t se, int tid) {
  gctx *c = (gctx *)vctx;
  const xte_gemm_args *g = c->g;
  const xte_gemm_problem *p = c->p;
  const xte_gemm_operand *A = &g->a, *B = &g->b;
  const int64_t m = c->m, kb = g->kblock, KP = c->sk_kp, ldw = SK_CH * 8;
  const int split_a = c->split_a, split_b = c->split_b;
  const double fa = B->fmt == XTE_FP8_E4M3 ? 256.0 : 1.0;
  const double *ta = split_a ? tab_hi : tab_full[A->fmt];
  const double *tbh = split_b ? tab_hi : tab_b_e4m3;
  double *ap = c->sk_a[tid], *ap_lo = c->sk_alo[tid], *bd = c->sk_bd[tid], *bd_lo = c->sk_bdlo[tid];
  float *sap = c->sk_sa[tid], *W = c->sk_w[tid];
  int64_t s0, kp, r, kk;
  int packed = 0;
  for (s0 = sb0; s0 < se; s0 += SK_CH) {
    const int64_t s1 = s0 + SK_CH < se ? s0 + SK_CH : se;
    int64_t s;
    for (r = 0; r < m; r++) memset(W + r * ldw, 0, sizeof(float) * (size_t)((s1 - s0) * 8));
    for (kp = 0; kp < p->k; kp += KP) {
      const int64_t kc = p->k - kp < KP ? p->k - kp : KP, nb = (kc + kb - 1) / kb;
      int64_t bl;
      if (!packed || KP < p->k) {
        for (r = 0; r < m; r++) {
          const uint8_t *src = A->data + (p->a_i0 + r) * A->rs + (p->a_k0 + kp) * A->ks;
          double *d = ap + r * KP, *dl = split_a ? ap_lo + r * KP : NULL;
          for (kk = 0; kk < nb * kb; kk++) {
            int in = kk < kc;
            uint8_t code = in ? src[kk * A->ks] : 0;
            d[kk] = in ? ta[code] * fa : 0.0;
            if (dl) dl[kk] = in ? tab_lo[code] * fa : 0.0;
          }
        }
        panel_scales(A, p->a_i0, (int)m, (int)m, p->a_k0 + kp, (int)nb, kb, sap);
        packed = 1;
      }
      for (s = s0; s < s1; s++) {
        const int64_t n0 = s * 8;
        const int nv = (int)(p->n - n0 < 8 ? p->n - n0 : 8);
        int64_t gi[8];
        int jj;
        for (jj = 0; jj < nv; jj++) gi[jj] = (p->b_i0 + n0 + jj) / B->bi;
        for (bl = 0; bl < nb; bl++) {
          const int64_t k0 = kp + bl * kb;
          const int kl = (int)(p->k - k0 < kb ? p->k - k0 : kb), kl8 = (kl + 7) & ~7;
          const uint8_t *rows[8];
          float sb[8];
          int j, k;
          strip_scales(B, gi, nv, 8, (p->b_k0 + k0) / B->bk, sb);
          for (j = 0; j < 8; j++)
            rows[j] = j < nv ? B->data + (p->b_i0 + n0 + j) * B->rs + (p->b_k0 + k0) * B->ks : NULL;
          if (B->ks == 1) {
            c->uk->sk_decode(rows, nv, kl, B->fmt, split_b, tbh, tab_lo, bd, bd_lo);
          } else {
            for (j = 0; j < 8; j++)
              for (k = 0; k < kl8; k++) {
                int in = j < nv && k < kl;
                uint8_t code = in ? rows[j][k * B->ks] : 0;
                bd[j * XTE_GEMM_SK_LDB + k] = in ? tbh[code] : 0.0;
                if (split_b) bd_lo[j * XTE_GEMM_SK_LDB + k] = in ? tab_lo[code] : 0.0;
              }
          }
          c->uk->sk_block((int)m, kl8, ap + bl * kb, split_a ? ap_lo + bl * kb : NULL, KP, bd,
                          split_b ? bd_lo : NULL, sap + bl * m, sb, W + (s - s0) * 8, ldw);
        }
      }
    }
    for (r = 0; r < m; r++) {
      int64_t n, n1 = s1 * 8 < p->n ? s1 * 8 : p->n;
      for (n = s0 * 8; n < n1; n++) store_d(g, p->d_r0 + r, n, W[r * ldw + (n - s0 * 8)]);
    }
  }
}

/* ---------------------------------------------------------------- small M on AVX512-VNNI
 * As sk_range (threads own runs of strips, 256-column chunks, A packed once per K panel), with
 * the digit kernels of src/cpu/vnni/gemm_vnni.h on strips of 16 columns: per thread, sk_a holds A's
 * digits [row][block] of the panel, then the corrections, scales and NaN flags of A; sk_alo the
 * strip's B scales [block][16] and, from VNNI_SK_BD on, its B digits. */
/* the most rows on these kernels with AMX (more rows take amx_small_range, whose cost per weight
 * code does not grow with the rows); without AMX every small-M problem (faster than the fp64
 * small-M kernels at every row count). The crossover is measured: docs/performance.md, small-M
 * GEMM. */
#define VNNI_SK_MAXM_AMX 8
#define VNNI_SK_MAXM XTE_GEMM_SK_MAXM
#define VNNI_SK_ROWBLK (XTE_VNNI_BLOCK_BYTES + 16) /* A bytes per row and block, all in sk_a */
#define VNNI_SK_CH (SK_CH / 2)                     /* 16-column strips per chunk (W: 256 columns) */
#define VNNI_SK_BD (SK_ABYTES / 2) /* offset of the B digits in sk_alo (the scales come first) */

static void vnni_small_range(void *vctx, int64_t sb0, int64_t se, int tid) {
  gctx *c = (gctx *)vctx;
  const xte_gemm_operand *A = &c->g->a, *B = &c->g->b;
  const xte_gemm_problem *p = c->p;
  const int64_t m = c->m, ldw = VNNI_SK_CH * 16, nbp = c->sk_kp / 128;
  int8_t *ap = (int8_t *)c->sk_a[tid], *bd = (int8_t *)c->sk_alo[tid] + VNNI_SK_BD;
  int32_t *corr = (int32_t *)(ap + m * nbp * XTE_VNNI_BLOCK_BYTES);
  float *sa = (float *)(corr + 2 * m * nbp), *sbv = (float *)c->sk_alo[tid], *W = c->sk_w[tid];
  uint8_t *nana = (uint8_t *)(sa + m * nbp);
  int64_t s0, kp, r;
  int packed = 0;
  for (s0 = sb0; s0 < se; s0 += VNNI_SK_CH) {
    const int64_t s1 = s0 + VNNI_SK_CH < se ? s0 + VNNI_SK_CH : se;
    int64_t s;
    for (r = 0; r < m; r++) memset(W + r * ldw, 0, sizeof(float) * (size_t)((s1 - s0) * 16));
    for (kp = 0; kp < p->k; kp += c->sk_kp) {
      const int64_t kc = p->k - kp < c->sk_kp ? p->k - kp : c->sk_kp, nb = (kc + 127) / 128;
      int64_t bl;
      if (!packed || c->sk_kp < p->k) {
        c->vx->pack_a(A->data + p->a_i0 * A->rs + (p->a_k0 + kp) * A->ks, A->rs, A->ks, (int)m, kc,
                      ap, corr, nana);
        { /* A's scales [row][block], one division per row and per block */
          int64_t gi[VNNI_SK_MAXM];
          for (r = 0; r < m; r++) gi[r] = (p->a_i0 + r) / A->bi;
          for (bl = 0; bl < nb; bl++) {
            const int64_t gk = (p->a_k0 + kp + bl * 128) / A->bk;
            for (r = 0; r < m; r++) sa[r * nb + bl] = scale_at(A, gi[r], gk);
          }
        }
        packed = 1;
      }
      for (s = s0; s < s1; s++) {
        const int64_t n0 = s * 16;
        const int nv = (int)(p->n - n0 < 16 ? p->n - n0 : 16);
        panel_scales(B, p->b_i0 + n0, nv, 16, p->b_k0 + kp, (int)nb, 128, sbv);
        c->vx->strip((int)m, (int)nb, kc, ap, corr, nana, sa,
                     B->data + (p->b_i0 + n0) * B->rs + p->b_k0 + kp, B->rs, nv, sbv, bd,
                     W + (s - s0) * 16, ldw);
      }
    }
    {
      const int64_t n0 = s0 * 16, n1 = s1 * 16 < p->n ? s1 * 16 : p->n;
      for (r = 0; r < m; r++) store_row(c->g, p->d_r0 + r, n0, W + r * ldw, n1 - n0);
    }
  }
}

/* ---------------------------------------------------------------- AMX-INT8 (e4m3 x e4m3)
 * jc over N in panels of AMX_NC columns, mc0 over M in chunks of AMX_MCH rows (their fp32
 * accumulators in W), pc over K in panels of AMX_KC: the B panel is packed to digits by all
 * threads, then items (a group of AMX_MG tiles of 16 rows x a chunk of 16-column tiles) spread
 * over the threads; each packs its rows of A and runs the 16 x 16 tile kernel, column tile by
 * column tile, over the panel's blocks. On the last panel the item writes its part of D from W
 * (store_row). Same bytes as the fp64 path: both round the exact block sums once. */
#define AMX_KC (AMX_PANEL_BLK * 128)
#define AMX_NBLK AMX_PANEL_BLK
#define AMX_NC AMX_NC_MAX
#define AMX_MCH AMX_MCH_MAX
#define AMX_MG AMX_MG_MAX /* 16-row tiles per item: 128 rows, 192 KiB of packed A */

static void amx_pack_b_range(void *vctx, int64_t b, int64_t e, int tid) {
  gctx *c = (gctx *)vctx;
  const xte_gemm_operand *B = &c->g->b;
  const xte_gemm_problem *p = c->p;
  int64_t t;
  (void)tid;
  for (t = b; t < e; t++) {
    const int64_t n0 = c->jc + t * 16;
    const int nv = (int)(c->nc - t * 16 < 16 ? c->nc - t * 16 : 16);
    float *sb = c->amx_sb + t * c->nblk * 16;
    if (B->ks == 1)
      c->ax->pack_b(B->data + (p->b_i0 + n0) * B->rs + p->b_k0 + c->pc, B->rs, nv, c->kc,
                    c->amx_b + t * c->nblk * XTE_AMX_BLOCK_BYTES, c->amx_nanb + t * c->nblk);
    else /* rs == 1: the columns are contiguous */
      c->ax->pack_b_kn(B->data + (p->b_i0 + n0) + (p->b_k0 + c->pc) * B->ks, B->ks, nv, c->kc,
                       c->amx_b + t * c->nblk * XTE_AMX_BLOCK_BYTES, c->amx_nanb + t * c->nblk);
    panel_scales(B, p->b_i0 + n0, nv, 16, p->b_k0 + c->pc, c->nblk, 128, sb);
  }
}

static void amx_compute_range(void *vctx, int64_t b, int64_t e, int tid) {
  gctx *c = (gctx *)vctx;
  const xte_gemm_operand *A = &c->g->a;
  const xte_gemm_problem *p = c->p;
  int8_t *ap = c->amx_a[tid];
  uint16_t *nana = c->amx_nana[tid];
  float *sa = c->amx_sa[tid];
  int64_t it, last_mg = -1;
  if (b >= e) return;
  c->ax->begin();
  for (it = b; it < e; it++) {
    const int64_t mg = it / c->amx_nch, nch = it % c->amx_nch;
    const int64_t t0 = mg * AMX_MG, t1 = t0 + AMX_MG < c->amx_mtiles ? t0 + AMX_MG : c->amx_mtiles;
    const int64_t u0 = nch * c->amx_cs,
                  u1 = u0 + c->amx_cs < c->amx_ntn ? u0 + c->amx_cs : c->amx_ntn;
    int64_t t, i;
    if (u0 >= u1) continue;
    if (mg != last_mg) {
      for (t = t0; t < t1; t++) {
        const int64_t r0 = c->mc0 + t * 16;
        const int nv = (int)(c->m - r0 < 16 ? c->m - r0 : 16);
        float *s = sa + (t - t0) * c->nblk * 16;
        if (A->ks == 1)
          c->ax->pack_a(A->data + (p->a_i0 + r0) * A->rs + p->a_k0 + c->pc, A->rs, nv, c->kc,
                        ap + (t - t0) * c->nblk * XTE_AMX_BLOCK_BYTES, nana + (t - t0) * c->nblk);
        else /* rs == 1: the rows are contiguous */
          c->ax->pack_a_kn(A->data + (p->a_i0 + r0) + (p->a_k0 + c->pc) * A->ks, A->ks, nv, c->kc,
                           ap + (t - t0) * c->nblk * XTE_AMX_BLOCK_BYTES,
                           nana + (t - t0) * c->nblk);
        panel_scales(A, p->a_i0 + r0, nv, 16, p->a_k0 + c->pc, c->nblk, 128, s);
      }
      last_mg = mg;
    }
    c->ax->tiles(c->nblk, ap, nana, sa, (int)(t1 - t0),
                 c->amx_b + u0 * c->nblk * XTE_AMX_BLOCK_BYTES, c->amx_nanb + u0 * c->nblk,
                 c->amx_sb + u0 * c->nblk * 16, (int)(u1 - u0),
                 c->amx_w + t0 * 16 * c->amx_ldw + u0 * 16, c->amx_ldw, c->first_pc);
    if (c->last_pc) {
      const int64_t n0 = u0 * 16, n1 = u1 * 16 < c->nc ? u1 * 16 : c->nc;
      const int64_t r1 = t1 * 16 < c->mch ? t1 * 16 : c->mch;
      for (i = t0 * 16; i < r1; i++)
        store_row(c->g, p->d_r0 + c->mc0 + i, c->jc + n0, c->amx_w + i * c->amx_ldw + n0, n1 - n0);
    }
  }
  c->ax->end();
}

/* Small M (at most XTE_GEMM_SK_MAXM rows: one or two 16-row tiles) on the tile unit: each thread
 * owns a run of 16-column tiles of N and, per chunk of AMX_SK_CH of them and K super-panel (as
 * many K panels of A digits as fit AMX_SK_ABYTES), packs the rows of A once; then each column tile
 * packs its B digits a K panel at a time (24 KiB, in L1; its rows of B read along K) and runs the
 * tile kernel on them, the fp32 accumulators in sk_w; no B panel shared between threads, no
 * barrier. Per thread, in sk_a: B digits [AMX_NBLK blocks], A digits [panel][row tile][blocks],
 * then the NaN masks and scales of both. */
#define AMX_SK_CH 16 /* column tiles per chunk: 32 rows x 256 columns of fp32 W (sk_w) */
/* fewer rows stay on the fp64 small-M kernels: the tile instructions cost the same for 1 or 16
 * rows, so the digit products pay only from about this many rows up (docs/performance.md,
 * small-M GEMM) */
#define AMX_SK_MINM 5
#define AMX_SK_ABYTES (448 * 1024) /* A digits (+ masks, scales) of a K super-panel, in sk_a */

static void amx_small_range(void *vctx, int64_t u0, int64_t ue, int tid) {
  gctx *c = (gctx *)vctx;
  const xte_gemm_operand *A = &c->g->a, *B = &c->g->b;
  const xte_gemm_problem *p = c->p;
  const int64_t m = c->m, ldw = AMX_SK_CH * 16;
  const int mt = (int)((m + 15) / 16);
  /* K super-panels of spb blocks (whole panels of AMX_NBLK) whose A digits fit sk_a */
  const int64_t spb = AMX_SK_ABYTES / (mt * (XTE_AMX_BLOCK_BYTES + 66)) / AMX_NBLK * AMX_NBLK;
  int8_t *bp = (int8_t *)c->sk_a[tid], *ap = bp + AMX_NBLK * XTE_AMX_BLOCK_BYTES;
  uint16_t *nanb = (uint16_t *)(ap + mt * spb * XTE_AMX_BLOCK_BYTES), *nana = nanb + AMX_NBLK;
  float *sb = (float *)(nana + mt * spb + 32), *sa = sb + AMX_NBLK * 16, *W = c->sk_w[tid];
  int64_t c0, kp, pc, u, i;
  if (u0 >= ue) return;
  c->ax->begin();
  for (c0 = u0; c0 < ue; c0 += AMX_SK_CH) {
    const int64_t c1 = c0 + AMX_SK_CH < ue ? c0 + AMX_SK_CH : ue;
    for (kp = 0; kp < p->k; kp += spb * 128) {
      const int64_t ke = p->k - kp < spb * 128 ? p->k : kp + spb * 128;
      /* A's tiles of every panel of the super-panel: panel q (kc codes, nblk blocks) at
       * [q][t][nblk] */
      for (pc = kp; pc < ke; pc += AMX_KC) {
        const int64_t kc = ke - pc < AMX_KC ? ke - pc : AMX_KC, q = (pc - kp) / AMX_KC;
        const int nblk = (int)((kc + 127) / 128);
        int t;
        for (t = 0; t < mt; t++) {
          const int64_t r0 = t * 16, o = q * mt * AMX_NBLK + (int64_t)t * nblk;
          const int nv = (int)(m - r0 < 16 ? m - r0 : 16);
          if (A->ks == 1)
            c->ax->pack_a(A->data + (p->a_i0 + r0) * A->rs + p->a_k0 + pc, A->rs, nv, kc,
                          ap + o * XTE_AMX_BLOCK_BYTES, nana + o);
          else /* rs == 1: the rows are contiguous */
            c->ax->pack_a_kn(A->data + (p->a_i0 + r0) + (p->a_k0 + pc) * A->ks, A->ks, nv, kc,
                             ap + o * XTE_AMX_BLOCK_BYTES, nana + o);
          panel_scales(A, p->a_i0 + r0, nv, 16, p->a_k0 + pc, nblk, 128, sa + o * 16);
        }
      }
      /* each column tile along the super-panel: its rows of B read in one sequential run */
      for (u = c0; u < c1; u++) {
        const int64_t n0 = u * 16;
        const int nv = (int)(p->n - n0 < 16 ? p->n - n0 : 16);
        for (pc = kp; pc < ke; pc += AMX_KC) {
          const int64_t kc = ke - pc < AMX_KC ? ke - pc : AMX_KC, q = (pc - kp) / AMX_KC;
          const int nblk = (int)((kc + 127) / 128);
          const int64_t o = q * mt * AMX_NBLK;
          if (B->ks == 1)
            c->ax->pack_b(B->data + (p->b_i0 + n0) * B->rs + p->b_k0 + pc, B->rs, nv, kc, bp, nanb);
          else /* rs == 1: the columns are contiguous */
            c->ax->pack_b_kn(B->data + (p->b_i0 + n0) + (p->b_k0 + pc) * B->ks, B->ks, nv, kc, bp,
                             nanb);
          panel_scales(B, p->b_i0 + n0, nv, 16, p->b_k0 + pc, nblk, 128, sb);
          c->ax->tiles(nblk, ap + o * XTE_AMX_BLOCK_BYTES, nana + o, sa + o * 16, mt, bp, nanb, sb,
                       1, W + (u - c0) * 16, ldw, pc == 0);
        }
      }
    }
    {
      const int64_t n0 = c0 * 16, n1 = c1 * 16 < p->n ? c1 * 16 : p->n;
      for (i = 0; i < m; i++) store_row(c->g, p->d_r0 + i, n0, W + i * ldw, n1 - n0);
    }
  }
  c->ax->end();
}

static void amx_problem(gctx *c, const xte_gemm_problem *p, int64_t m) {
  for (c->jc = 0; c->jc < p->n; c->jc += AMX_NC) {
    c->nc = p->n - c->jc < AMX_NC ? p->n - c->jc : AMX_NC;
    c->amx_ntn = (c->nc + 15) / 16;
    for (c->mc0 = 0; c->mc0 < m; c->mc0 += AMX_MCH) {
      c->mch = m - c->mc0 < AMX_MCH ? m - c->mc0 : AMX_MCH;
      c->amx_mtiles = (c->mch + 15) / 16;
      c->amx_nmg = (c->amx_mtiles + AMX_MG - 1) / AMX_MG;
      /* at least one item per thread: fewer row groups than threads split the columns too */
      c->amx_nch = (c->nt + c->amx_nmg - 1) / c->amx_nmg;
      if (c->amx_nch > c->amx_ntn) c->amx_nch = c->amx_ntn;
      c->amx_cs = (c->amx_ntn + c->amx_nch - 1) / c->amx_nch;
      for (c->pc = 0; c->pc < p->k; c->pc += AMX_KC) {
        c->kc = p->k - c->pc < AMX_KC ? p->k - c->pc : AMX_KC;
        c->first_pc = c->pc == 0;
        c->last_pc = c->pc + c->kc >= p->k;
        c->nblk = (int)((c->kc + 127) / 128);
        xte_parallel_for_max(c->amx_ntn, c->nt, amx_pack_b_range, c);
        xte_parallel_for_max(c->amx_nmg * c->amx_nch, c->nt, amx_compute_range, c);
      }
    }
  }
}

static int use_small_m(const gctx *c, int64_t m) {
  return m > 0 && m <= XTE_GEMM_SK_MAXM && c->uk->sk_block != NULL;
}

/* Which small-M path a problem of m rows takes (use_small_m said yes): run_problem's choice,
 * also what xte_cpu_gemm_exact_small_path reports to the FAST driver. */
static xte_cpu_sk_path small_path(int vnni, int amx, int64_t m) {
  if (vnni && m <= (amx ? VNNI_SK_MAXM_AMX : VNNI_SK_MAXM)) return XTE_CPU_SK_VNNI;
  if (amx && m >= AMX_SK_MINM) return XTE_CPU_SK_AMX;
  return XTE_CPU_SK_FP64;
}

/* The VNNI small-M kernels (e4m3 x e4m3, K block 128, B along K) and the AMX-INT8 path (also
 * operands transposed) take the call g on the table T */
static int vnni_fits(const xte_cpu_isa_table *T, const xte_gemm_args *g) {
  return T->vnni && g->a.fmt == XTE_FP8_E4M3 && g->b.fmt == XTE_FP8_E4M3 && g->kblock == 128 &&
         g->b.ks == 1;
}

static int amx_fits(const xte_cpu_isa_table *T, const xte_gemm_args *g) {
  return T->amx && g->a.fmt == XTE_FP8_E4M3 && g->b.fmt == XTE_FP8_E4M3 && g->kblock == 128 &&
         (g->a.ks == 1 || g->a.rs == 1) && (g->b.ks == 1 || g->b.rs == 1);
}

/* K = 0: D = epilogue(0). */
static void empty_k_rows(void *vctx, int64_t b, int64_t e, int tid) {
  gctx *c = (gctx *)vctx;
  int64_t r, n;
  (void)tid;
  for (r = b; r < e; r++)
    for (n = 0; n < c->p->n; n++) store_d(c->g, c->p->d_r0 + r, n, 0.0f);
}

static void run_problem(gctx *c, const xte_gemm_problem *p, int64_t m) {
  const int64_t kb = c->g->kblock;
  int nt = c->nt;
  c->p = p;
  c->m = m;
  if (m <= 0 || p->n <= 0) return;
  if (p->k <= 0) {
    xte_parallel_for_max(m, c->nt, empty_k_rows, c);
    return;
  }
  if (use_small_m(c, m)) {
    int64_t kp = (int64_t)(SK_ABYTES / sizeof(double)) / m / kb * kb;
    int64_t kall = (p->k + kb - 1) / kb * kb;
    c->sk_kp = kp < kb ? kb : kp > kall ? kall : kp;
    const xte_cpu_sk_path path = small_path(c->vnni, c->amx, m);
    if (path == XTE_CPU_SK_VNNI) {
      /* K panels of whole blocks whose A digits, corrections, flags and scales fit sk_a */
      kp = (int64_t)SK_ABYTES / (m * VNNI_SK_ROWBLK) * 128;
      c->sk_kp = kp < 128 ? 128 : kp > kall ? kall : kp;
      xte_parallel_for_max((p->n + 15) / 16, c->nt, vnni_small_range, c);
      return;
    }
    if (path == XTE_CPU_SK_AMX) {
      xte_parallel_for_max((p->n + 15) / 16, c->nt, amx_small_range, c);
      return;
    }
    xte_parallel_for_max((p->n + 7) / 8, c->nt, sk_range, c);
    return;
  }
  if (c->amx) {
    amx_problem(c, p, m);
    return;
  }
  for (c->jc = 0; c->jc < p->n; c->jc += c->NC) {
    c->nc = p->n - c->jc < c->NC ? p->n - c->jc : c->NC;
    c->nstrips = (c->nc + c->NR - 1) / c->NR;
    for (c->mc0 = 0; c->mc0 < m; c->mc0 += c->MCH) {
      c->mch = m - c->mc0 < c->MCH ? m - c->mc0 : c->MCH;
      c->mtiles = (c->mch + c->MR - 1) / c->MR;
      c->n_ic = (c->mch + c->MC - 1) / c->MC;
      /* one run of strips per thread (each packs its own part of B); narrow panels split the
       * M blocks too, with B packed by all threads first */
      c->n_jch = c->nstrips < nt ? c->nstrips : nt;
      c->spj = (c->nstrips + c->n_jch - 1) / c->n_jch;
      c->n_jch = (c->nstrips + c->spj - 1) / c->spj;
      c->own_b = c->n_jch >= nt || c->n_ic == 1;
      for (c->pc = 0; c->pc < p->k; c->pc += KC) {
        int64_t k;
        c->kc = p->k - c->pc < KC ? p->k - c->pc : KC;
        c->first_pc = c->pc == 0;
        c->last_pc = c->pc + c->kc >= p->k;
        c->nblk = 0;
        for (k = 0; k < c->kc; k += kb) c->kl[c->nblk++] = (int)(c->kc - k < kb ? c->kc - k : kb);
        if (!c->own_b) xte_parallel_for_max(c->nstrips, c->nt, pack_b_range, c);
        xte_parallel_for_max(c->own_b ? c->n_jch : c->n_ic * c->n_jch, c->nt, compute_range, c);
      }
    }
  }
}

/* A workspace kept between calls (pages already faulted in); a caller that finds it in use, or
 * too small while in use, gets a private one. */
static pthread_mutex_t ws_mu = PTHREAD_MUTEX_INITIALIZER;
static char *ws_buf;
static size_t ws_size;
static int ws_busy;

static size_t al(size_t n) {
  return (n + 63) / 64 * 64;
}

static char *ws_acquire(size_t bytes) {
  char *p = NULL;
  pthread_mutex_lock(&ws_mu);
  if (!ws_busy) {
    if (ws_size < bytes) {
      if (ws_buf) xte_aligned_free(ws_buf);
      ws_buf = (char *)xte_aligned_alloc(bytes);
      ws_size = ws_buf ? bytes : 0;
    }
    if (ws_buf) {
      ws_busy = 1;
      p = ws_buf;
    }
  }
  pthread_mutex_unlock(&ws_mu);
  return p ? p : (char *)xte_aligned_alloc(bytes);
}

/* Test hook (tests/calls/alloc_faults.c): drops the kept workspace when no call holds it. */
XTE_API void xte_internal_gemm_release_workspace(void);
void xte_internal_gemm_release_workspace(void) {
  pthread_mutex_lock(&ws_mu);
  if (!ws_busy && ws_buf) {
    xte_aligned_free(ws_buf);
    ws_buf = NULL;
    ws_size = 0;
  }
  pthread_mutex_unlock(&ws_mu);
}

static void ws_release(char *p) {
  if (!p) return;
  pthread_mutex_lock(&ws_mu);
  if (p == ws_buf) {
    ws_busy = 0;
    p = NULL;
  }
  pthread_mutex_unlock(&ws_mu);
  if (p) xte_aligned_free(p);
}

static xte_status cpu_gemm(const xte_gemm_args *g, void *handle) {
  gctx c;
  const xte_cpu_isa_table *T;
  int nt, t;
  int64_t i, maxm = 0, maxn = 0;
  int64_t amx_m = 0, amx_n = 0;
  int any_sk = 0;
  xte_status st = XTE_SUCCESS;
  size_t l2;
  (void)handle;
  /* masked_m lives in backend (host) memory: checked here, before anything is written */
  if (g->masked_m)
    for (i = 0; i < g->num_problems; i++)
      if (g->masked_m[i] < 0 || g->masked_m[i] > g->problems[i].m)
        return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                             "groups->masked_m[%lld] = %d is outside [0, m_max = %lld]",
                             (long long)i, (int)g->masked_m[i], (long long)g->problems[i].m);
  if (g->mode == XTE_GEMM_FAST && !xte_cpu_gemm_fast_runs_exact(g)) return xte_cpu_gemm_fast(g);
  pthread_once(&tab_once, init_tables);
  memset(&c, 0, sizeof c);
  c.g = g;
  T = xte_cpu_isa_table_get(); /* one ISA for the whole call */
  c.uk = T->gemm;
  c.pack_b8 = c.uk->pack_b8;
  c.tile_r8 = c.uk->tile_r8;
  c.tile_r16 = c.uk->tile_r16;
  c.ax = T->amx;
  c.vx = T->vnni;
  c.MR = c.uk->mr;
  c.NR = c.uk->nr;
  c.split_a = g->a.fmt == XTE_FP8_E5M2;
  c.split_b = !c.split_a && g->b.fmt == XTE_FP8_E5M2;
  l2 = xte_cpu_l2();
  /* MC rows of packed A fill about half of L2, rounded up to whole tiles (M = 512 is one block of
   * 22 tiles of 24 rows, not 21 tiles and a tile of 8 rows that reads all of B again) */
  c.MC = (int64_t)(l2 / 2 / (KC * sizeof(double) * (c.split_a ? 2 : 1)) + (size_t)c.MR - 1) / c.MR *
         c.MR;
  if (c.MC < c.MR) c.MC = c.MR;
  if (c.MC > 512) c.MC = (512 + c.MR - 1) / c.MR * c.MR;
  c.NC = 1536 / c.NR * c.NR;
  c.MCH = (1024 + c.MC - 1) / c.MC * c.MC;
  if (c.MCH < c.MC) c.MCH = c.MC;
  c.vnni = vnni_fits(T, g);
  c.amx = amx_fits(T, g);
  for (i = 0; i < g->num_problems; i++) {
    int64_t mi = g->masked_m ? g->masked_m[i] : g->problems[i].m;
    if (use_small_m(&c, mi)) {
      any_sk = 1;
      continue;
    }
    if (c.amx) {
      if (g->problems[i].m > amx_m) amx_m = g->problems[i].m;
      if (g->problems[i].n > amx_n) amx_n = g->problems[i].n;
      continue;
    }
    if (g->problems[i].m > maxm) maxm = g->problems[i].m;
    if (g->problems[i].n > maxn) maxn = g->problems[i].n;
  }
  if (maxm > c.MCH) maxm = c.MCH;
  if (maxn > c.NC) maxn = c.NC;
  maxm = (maxm + c.MC - 1) / c.MC * c.MC;
  maxn = (maxn + c.NR - 1) / c.NR * c.NR;
  nt = xte_cpu_threads();
  c.nt = nt;
  {
    /* one workspace: B panel (+ low class), B scales, W, then per thread A (+ low), A scales */
    size_t szb = sizeof(double) * (size_t)(maxn * KC),
           szsb = sizeof(float) * (size_t)(maxn * MAX_BLK);
    size_t szw = sizeof(float) * (size_t)(maxn * maxm), sza = sizeof(double) * (size_t)(c.MC * KC);
    size_t szsa = sizeof(float) * (size_t)(c.MC * MAX_BLK);
    size_t szbs = sizeof(double) * (size_t)(EPI_SC * c.NR * KC),
           szsbs = sizeof(float) * (size_t)(EPI_SC * c.NR * MAX_BLK);
    /* small-M path, per thread: A panel (+ low), A scales, W, decoded B (+ low) */
    size_t ska = any_sk ? SK_ABYTES : 0, sksa = any_sk ? sizeof(float) * SK_ABYTES / 8 / 32 : 0;
    size_t skw = any_sk ? sizeof(float) * XTE_GEMM_SK_MAXM * SK_CH * 8 : 0;
    size_t skb = any_sk ? sizeof(double) * 8 * XTE_GEMM_SK_LDB : 0;
    /* AMX path: B panel digits (+ NaN masks, scales), W, per thread A digits (+ masks, scales) */
    const int64_t amx_ntn = (amx_n < AMX_NC_MAX ? amx_n : AMX_NC_MAX) / 16 + 1;
    const int64_t amx_rows = amx_m < AMX_MCH_MAX ? (amx_m + 15) / 16 * 16 : AMX_MCH_MAX;
    size_t szab = amx_m ? (size_t)amx_ntn * AMX_PANEL_BYTES : 0,
           szanb = amx_m ? (size_t)amx_ntn * AMX_PANEL_BLK * 2 : 0,
           szasb = amx_m ? (size_t)amx_ntn * AMX_PANEL_BLK * 16 * 4 : 0,
           szaw = amx_m ? sizeof(float) * (size_t)amx_rows * (size_t)(amx_ntn * 16 + 16) : 0,
           szaa = amx_m ? (size_t)AMX_MG_MAX * AMX_PANEL_BYTES : 0,
           szana = amx_m ? (size_t)AMX_MG_MAX * AMX_PANEL_BLK * 2 : 0,
           szasa = amx_m ? (size_t)AMX_MG_MAX * AMX_PANEL_BLK * 16 * 4 : 0;
    size_t total = al(szb) * 2 + al(szsb) + al(szw) +
                   (size_t)nt * (al(sza) * 2 + al(szsa) + al(szbs) * 2 + al(szsbs)) +
                   (size_t)nt * (al(ska) * 2 + al(sksa) + al(skw) + al(skb) * 2) + al(szab) +
                   al(szanb) + al(szasb) + al(szaw) +
                   (size_t)nt * (al(szaa) + al(szana) + al(szasa));
    char *w = ws_acquire(total), *q;
    void **ptrs = (void **)xte_aligned_calloc((size_t)nt * 15, sizeof(void *));
    if (!w || !ptrs) {
      xte_aligned_free(ptrs);
      ws_release(w);
      return xte_set_error(XTE_ERROR_OUT_OF_MEMORY,
                           "gemm: no memory for %zu bytes of packing buffers", total);
    }
    q = w;
    c.bp = (double *)q;
    q += al(szb);
    c.bp_lo = c.split_b ? (double *)q : NULL;
    q += al(szb);
    c.sbp = (float *)q;
    q += al(szsb);
    c.W = (float *)q;
    q += al(szw);
    c.ap = (double **)ptrs;
    c.ap_lo = (double **)(ptrs + nt);
    c.sap = (float **)(ptrs + 2 * nt);
    for (t = 0; t < nt; t++) {
      c.ap[t] = (double *)q;
      q += al(sza);
      c.ap_lo[t] = c.split_a ? (double *)q : NULL;
      q += al(sza);
      c.sap[t] = (float *)q;
      q += al(szsa);
    }
    c.bs = (double **)(ptrs + 9 * nt);
    c.bs_lo = (double **)(ptrs + 10 * nt);
    c.sbs = (float **)(ptrs + 11 * nt);
    for (t = 0; t < nt; t++) {
      c.bs[t] = (double *)q;
      q += al(szbs);
      c.bs_lo[t] = c.split_b ? (double *)q : NULL;
      q += al(szbs);
      c.sbs[t] = (float *)q;
      q += al(szsbs);
    }
    c.sk_a = (double **)(ptrs + 3 * nt);
    c.sk_alo = (double **)(ptrs + 4 * nt);
    c.sk_bd = (double **)(ptrs + 5 * nt);
    c.sk_bdlo = (double **)(ptrs + 6 * nt);
    c.sk_sa = (float **)(ptrs + 7 * nt);
    c.sk_w = (float **)(ptrs + 8 * nt);
    for (t = 0; t < nt; t++) {
      c.sk_a[t] = (double *)q;
      q += al(ska);
      c.sk_alo[t] = (double *)q;
      q += al(ska);
      c.sk_sa[t] = (float *)q;
      q += al(sksa);
      c.sk_w[t] = (float *)q;
      q += al(skw);
      c.sk_bd[t] = (double *)q;
      q += al(skb);
      c.sk_bdlo[t] = (double *)q;
      q += al(skb);
    }
    c.amx_b = (int8_t *)q;
    q += al(szab);
    c.amx_nanb = (uint16_t *)q;
    q += al(szanb);
    c.amx_sb = (float *)q;
    q += al(szasb);
    c.amx_w = (float *)q;
    q += al(szaw);
    c.amx_ldw = amx_ntn * 16 + 16;
    c.amx_a = (int8_t **)(ptrs + 12 * nt);
    c.amx_nana = (uint16_t **)(ptrs + 13 * nt);
    c.amx_sa = (float **)(ptrs + 14 * nt);
    for (t = 0; t < nt; t++) {
      c.amx_a[t] = (int8_t *)q;
      q += al(szaa);
      c.amx_nana[t] = (uint16_t *)q;
      q += al(szana);
      c.amx_sa[t] = (float *)q;
      q += al(szasa);
    }
    for (i = 0; i < g->num_problems; i++)
      run_problem(&c, &g->problems[i], g->masked_m ? g->masked_m[i] : g->problems[i].m);
    xte_aligned_free(ptrs);
    ws_release(w);
  }
  return st;
}

/* What the FAST driver (src/cpu/gemm_fast.c) shares: src/cpu/gemm_fast.h */
void xte_cpu_gemm_panel_scales(const xte_gemm_operand *o, int64_t i0, int nv, int width, int64_t k0,
                               int nblk, int64_t kstep, float *out) {
  panel_scales(o, i0, nv, width, k0, nblk, kstep, out);
}

void xte_cpu_gemm_store_row(const xte_gemm_args *g, int64_t r, int64_t n0, float *t, int64_t len) {
  store_row(g, r, n0, t, len);
}

char *xte_cpu_gemm_ws_acquire(size_t bytes) {
  return ws_acquire(bytes);
}

void xte_cpu_gemm_ws_release(char *p) {
  ws_release(p);
}

int xte_cpu_gemm_amx(void) {
  return xte_cpu_isa_table_get()->amx != NULL;
}

int xte_cpu_gemm_vnni_rows(void) {
  const xte_cpu_isa_table *T = xte_cpu_isa_table_get();
  if (T->vnni) return T->amx ? VNNI_SK_MAXM_AMX : VNNI_SK_MAXM;
  return 0;
}

xte_cpu_sk_path xte_cpu_gemm_exact_small_path(const xte_gemm_args *g, int64_t m) {
  const xte_cpu_isa_table *T = xte_cpu_isa_table_get();
  if (m <= 0 || m > XTE_GEMM_SK_MAXM || T->gemm->sk_block == NULL) return XTE_CPU_SK_NONE;
  return small_path(vnni_fits(T, g), amx_fits(T, g), m);
}

static const struct xte_gemm_ops cpu_gemm_ops = {cpu_gemm};

const struct xte_gemm_ops *xte_cpu_gemm_ops(void) {
  return &cpu_gemm_ops;
}
