/* XTE_GEMM_FAST on the CPU for a few rows of A (at most XTE_GEMM_SK_MAXM: the MoE decode case),
 * B's codes contiguous along K (the weight [N, K]), A in any layout.
 * A's valid rows are decoded once per problem to fp32 (times 2^8 when B is e4m3: the kernels
 * decode B's codes to their fp16 images, value * 2^-8), zero past K; its scales once per block.
 * The threads split N into chunks of XTE_GEMM_FS_NC columns; per chunk the ISA's kernel
 * (xte_gemm_ukernel.fast_small, src/cpu/gemm_kernels.h) reads each of the chunk's B codes once,
 * from all the rows of A together (the weights are streamed once per problem), forms each block
 * partial as an fp32 sum of exact products, and updates the fp32 accumulators as the contract
 * does (acc = fmaf(p, RNE_fp32(sa * sb), acc), K order). The chunk's rows of D then go through
 * the exact path's epilogue (+ C, + bias, output rounding, canonical NaN: the shared numerics of
 * src/numerics/xte_gemm_numerics.h). The error of the partial against the exact one is that of an
 * fp32 sum of at most KB exact terms, within the FAST bound (docs/numerics.md, section 6). */
#include "cpu/gemm_fast_small.h"

#include <string.h>

#include "cpu/gemm_fast.h"
#include "cpu/gemm_kernels.h"
#include "cpu/xte_cpu.h"
#include "numerics/xte_gemm_numerics.h"

#define NC XTE_GEMM_FS_NC
#define MP_MAX ((XTE_GEMM_SK_MAXM + 7) / 8 * 8)

static size_t al64(size_t n) {
  return (n + 63) / 64 * 64;
}

static int64_t cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int xte_cpu_gemm_fast_small_ok(const xte_gemm_args *g, int64_t m) {
  return g->mode == XTE_GEMM_FAST && g->b.ks == 1 && m >= 0 && m <= XTE_GEMM_SK_MAXM &&
         xte_cpu_isa_table_get()->gemm->fast_small != NULL;
}

/* The most K blocks of any problem of g */
static int64_t max_blocks(const xte_gemm_args *g) {
  int64_t i, nb = 1;
  for (i = 0; i < g->num_problems; i++) {
    const int64_t b = cdiv(g->problems[i].k, g->kblock);
    if (b > nb) nb = b;
  }
  return nb;
}

/* The workspace: A [MP_MAX][lda] fp32, A's scales [nblk][MP_MAX] (+ 16), a row of zero codes for
 * the columns past N (lda bytes), then per thread B's scales [nblk][NC] (+ 16) and the
 * accumulators [MP_MAX][NC]. */
typedef struct fs_layout {
  int64_t nblk, lda;
  size_t a, sa, zero, sb, w, per_thread, total;
} fs_layout;

static fs_layout layout_of(const xte_gemm_args *g, int nt) {
  fs_layout L;
  L.nblk = max_blocks(g);
  L.lda = L.nblk * g->kblock;
  L.a = al64(sizeof(float) * (size_t)(MP_MAX * L.lda));
  L.sa = al64(sizeof(float) * (size_t)(L.nblk * MP_MAX + 16));
  L.zero = al64((size_t)L.lda);
  L.sb = al64(sizeof(float) * (size_t)(L.nblk * NC + 16));
  L.w = al64(sizeof(float) * (size_t)(MP_MAX * NC));
  L.per_thread = L.sb + L.w;
  L.total = L.a + L.sa + L.zero + (size_t)(nt > 0 ? nt : 1) * L.per_thread;
  return L;
}

size_t xte_cpu_gemm_fast_small_ws(const xte_gemm_args *g, int nt) {
  return layout_of(g, nt).total;
}

static float scale_at(const xte_gemm_operand *o, int64_t gi, int64_t gk) {
  return o->sswap ? xte_load_scale_inv(&o->s, gk, gi) : xte_load_scale_inv(&o->s, gi, gk);
}

typedef struct fs_ctx {
  const xte_gemm_args *g;
  const xte_gemm_problem *p;
  xte_gemm_fs_fn fn;
  fs_layout L;
  int m, mp, kl;
  int64_t nblk;
  const float *a, *sa;
  const uint8_t *zero;
  char *tws;
} fs_ctx;

/* Chunks [c0, c1) of NC columns */
static void fs_range(void *vctx, int64_t c0, int64_t c1, int tid) {
  const fs_ctx *c = (const fs_ctx *)vctx;
  const xte_gemm_args *g = c->g;
  const xte_gemm_problem *p = c->p;
  const xte_gemm_operand *B = &g->b;
  char *tw = c->tws + (size_t)tid * c->L.per_thread;
  float *sb = (float *)tw, *w = (float *)(tw + c->L.sb);
  int64_t ch, bl;
  for (ch = c0; ch < c1; ch++) {
    const int64_t n0 = ch * NC;
    const int nv = (int)(p->n - n0 < NC ? p->n - n0 : NC);
    const uint8_t *cols[NC];
    int64_t gi[NC];
    int j, r;
    for (j = 0; j < NC; j++) {
      cols[j] = j < nv ? B->data + (p->b_i0 + n0 + j) * B->rs + p->b_k0 : c->zero;
      gi[j] = j < nv ? (p->b_i0 + n0 + j) / B->bi : -1;
    }
    for (bl = 0; bl < c->nblk; bl++) {
      const int64_t gk = (p->b_k0 + bl * g->kblock) / B->bk;
      float *d = sb + bl * NC;
      for (j = 0; j < NC; j++)
        d[j] = j >= nv ? 0.0f : j > 0 && gi[j] == gi[j - 1] ? d[j - 1] : scale_at(B, gi[j], gk);
    }
    c->fn(c->m, c->mp, c->nblk, g->kblock, c->kl, c->a, c->L.lda, c->sa, cols, B->fmt, sb, w);
    for (r = 0; r < c->m; r++) xte_cpu_gemm_store_row(g, p->d_r0 + r, n0, w + r * NC, nv);
  }
}

/* K = 0: D = epilogue(0) */
static void empty_k(const xte_gemm_args *g, const xte_gemm_problem *p, int64_t m) {
  float t[NC];
  int64_t r, n0;
  int j;
  for (r = 0; r < m; r++)
    for (n0 = 0; n0 < p->n; n0 += NC) {
      for (j = 0; j < NC; j++) t[j] = 0.0f;
      xte_cpu_gemm_store_row(g, p->d_r0 + r, n0, t, p->n - n0 < NC ? p->n - n0 : NC);
    }
}

void xte_cpu_gemm_fast_small_run(const xte_gemm_args *g, const xte_gemm_problem *p, int64_t m,
                                 void *ws) {
  const xte_gemm_operand *A = &g->a;
  const int nt = xte_cpu_threads();
  const float fa = g->b.fmt == XTE_FP8_E4M3 ? 0x1p8f : 1.0f;
  float tab[256];
  fs_ctx c;
  float *a, *sa;
  int64_t r, k, bl;
  int i;
  if (m <= 0 || p->n <= 0) return;
  if (p->k <= 0) {
    empty_k(g, p, m);
    return;
  }
  memset(&c, 0, sizeof c);
  c.g = g;
  c.p = p;
  c.fn = xte_cpu_isa_table_get()->gemm->fast_small;
  c.L = layout_of(g, nt);
  c.m = (int)m;
  c.mp = (int)((m + 7) / 8 * 8);
  c.nblk = cdiv(p->k, g->kblock);
  c.kl = (int)(p->k - (c.nblk - 1) * g->kblock);
  a = (float *)ws;
  sa = (float *)((char *)ws + c.L.a);
  c.zero = (const uint8_t *)ws + c.L.a + c.L.sa;
  c.tws = (char *)ws + c.L.a + c.L.sa + c.L.zero;
  c.a = a;
  c.sa = sa;
  memset((void *)c.zero, 0, c.L.zero);
  for (i = 0; i < 256; i++) tab[i] = xte_fp8_to_f32((uint8_t)i, A->fmt) * fa;
  /* A: rows m .. mp - 1 and K .. nblk * kb are zero */
  for (r = 0; r < c.mp; r++) {
    float *d = a + r * c.L.lda;
    const uint8_t *src = A->data + (p->a_i0 + r) * A->rs + p->a_k0 * A->ks;
    if (r >= m) {
      memset(d, 0, sizeof(float) * (size_t)(c.nblk * g->kblock));
      continue;
    }
    if (A->ks == 1)
      for (k = 0; k < p->k; k++) d[k] = tab[src[k]];
    else
      for (k = 0; k < p->k; k++) d[k] = tab[src[k * A->ks]];
    for (; k < c.nblk * g->kblock; k++) d[k] = 0.0f;
  }
  for (bl = 0; bl < c.nblk; bl++)
    for (r = 0; r < c.mp; r++)
      sa[bl * c.mp + r] =
          r < m ? scale_at(A, (p->a_i0 + r) / A->bi, (p->a_k0 + bl * g->kblock) / A->bk) : 0.0f;
  for (i = 0; i < 16; i++) sa[c.nblk * c.mp + i] = 0.0f;
  xte_parallel_for_max(cdiv(p->n, NC), nt, fs_range, &c);
}
