/* `xte moe` (tools/cmd_moe.c is its entry): the private header of its parts in tools/moe/.
 *   opts.c    options, presets, usage
 *   mem.c     the memory book (estimate, allocation, parallel first touch), clock, progress line
 *   synth.c   the synthetic data: seeded fills, the FP8 expert weights made directly (synth.h;
 *             shared with tools/moe/ep.c)
 *   layer.c   the layer: buffers, weights, kernel steps, one forward (+ backward) through xte
 *   ref.c     the fp64 check: the same layer in fp64 from the bf16 inputs and the FP8 weights
 *   report.c  the kernel table / JSON and the numerics report
 *   run.c     moe_run: the phases in order (routing, memory estimate, allocation, weights,
 *             timed runs, check, report)
 *   ep.c      moe_ep_main (`--ep N`): the routed experts over N MPI ranks, checked byte for byte
 *             against the same layer in one process (qtensors by layer.c's moe_qalloc) */
#ifndef XTE_TOOLS_MOE_H
#define XTE_TOOLS_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "bench_common.h" /* xte_bench_mem_available, the team */
#include "xte/xte.h"

/* ================================================================== options (opts.c) */

typedef struct moe_opts {
  int64_t tokens, experts, hidden, ffn, topk, shared;
  float scaling;
  xte_recipe recipe;
  int backend; /* -1 auto */
  int threads, isa;
  int backward; /* 1 on, 0 forward only, -1 auto (on unless memory is short) */
  int64_t check_tokens;
  uint64_t seed;
  int iters, warmup, json, quiet;
  int checksum;       /* --checksum: print FNV-1a hashes of the FP8 weights and of the outputs */
  int huge_pages;     /* --huge-pages 0|1: MADV_HUGEPAGE on the FP8 weight stacks (default 1) */
  int64_t ep;         /* --ep N: experts over N MPI ranks (tools/moe/ep.c); 0: one process */
  xte_gemm_mode mode; /* --mode exact|fast: the mode of every FP8 GEMM of the layer */
  const char *preset;
} moe_opts;

extern const char *const moe_recipe_names[8];

/* 0 ok, 1 --help printed, 2 usage error. */
int moe_parse_opts(int argc, char **argv, moe_opts *o);

/* ================================================================== memory, clock (mem.c) */

#define GiB(x) ((x) / 1073741824.0)

enum { CAT_INPUT, CAT_WEIGHT, CAT_WGRAD, CAT_ACT, CAT_CHECK, CAT_COUNT };
extern const char *const moe_cat_names[CAT_COUNT];

#define MAX_BUFS 256
typedef struct membook {
  int dry;
  double bytes[CAT_COUNT];
  void *bufs[MAX_BUFS];
  int bcat[MAX_BUFS];
  size_t bsize[MAX_BUFS];
  int nbufs;
  int failed;
  double done; /* bytes allocated */
  int thp;     /* MADV_HUGEPAGE on the CAT_WEIGHT buffers */
} membook;

/* Page-aligned and zeroed; every page present before any kernel runs (CAT_WEIGHT: written in
 * full by the weight generation, which faults its pages in, on transparent huge pages when
 * m->thp; the others touched here, in parallel). In dry mode only counts. NULL (and failed set)
 * when the allocation fails. */
void *mem(membook *m, size_t bytes, int cat);
void mem_free_all(membook *m);
void mem_free_cat(membook *m, int cat); /* frees one category (its bytes stay in the book) */
double mem_peak(const membook *m);
/* MemAvailable: bench_common.h's xte_bench_mem_available (bytes, or -1). */

double now_s(void);
double cpu_s(void); /* CPU time of the process (all threads, user + system) */
void progress_init(double t0, int on);
void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void progress_done(void);

/* ================================================================== the layer (layer.c) */

enum { K_GEMM8, K_GEMM32, K_MEM };

enum {
  F_RGATE,
  F_ROUTER,
  F_PERMUTE,
  F_QX,
  F_GU,
  F_SWIGLU,
  F_DOWN,
  F_UNPERM,
  F_S_QX,
  F_S_GU,
  F_S_SWIGLU,
  F_S_DOWN,
  B_UNPERM,
  B_QDY,
  B_DOWN_DG,
  B_DOWN_WG,
  B_DSWIGLU,
  B_GU_DG,
  B_GU_WG,
  B_PERM,
  B_S_QDY,
  B_S_DOWN_DG,
  B_S_DOWN_WG,
  B_S_DSWIGLU,
  B_S_GU_DG,
  B_S_GU_WG,
  B_ROUTER,
  B_RGATE_DG,
  B_RGATE_WG,
  NSTEPS
};

typedef struct step {
  const char *name;
  int bwd, kind, shared;
  double flops, bytes, t;
  double xflops; /* k-grouped wgrad: the flops run on the padded K (0: as flops) */
} step;

typedef struct layer {
  moe_opts o;
  int64_t T, H, F, E, k, R, Nr, align;
  int bwd, shared;
  xte_stream st;
  membook mb;
  xte_router_config rcfg;
  /* inputs and router */
  uint16_t *x, *dy;
  float *xf, *Wr, *bias, *logits, *probs, *saved;
  uint8_t *map;
  int32_t *row_map;
  int64_t *offs, *tpe, *m, *kpad;
  /* forward */
  uint16_t *xp, *h, *y, *out, *hs;
  xte_qtensor qx, qa, Wgu, Wd, qxs, qas, Wsgu, Wsd;
  /* backward */
  uint16_t *dyp, *da, *dxp, *das;
  float *gprobs, *dx, *dWd, *dWgu, *dWsd, *dWsgu, *dlogits, *dWr;
  xte_qtensor qdy, qdyp, qdh, qdhs;
  step steps[NSTEPS];
  double t_setup, t_routing, t_alloc, t_weights;
  double c_setup, c_layer; /* CPU seconds (all threads) of the setup and of the timed runs */
  uint64_t sum_weights, sum_outputs; /* --checksum */
  char why_fwd[200]; /* why the backward was left out ("" when it ran or was not asked for) */
} layer;

/* Where moe_qalloc takes its buffers: bytes of category cat (mem()'s categories), zeroed. */
typedef void *(*moe_alloc_fn)(void *ctx, size_t bytes, int cat);
/* e4m3 codes and COMPACT fp32 scales of an [M, K] input for mode / recipe; row / col: which
 * copies (the columnwise one transposed where moe_col_transposed(recipe)). The status of the
 * scale-shape query (the buffers are taken either way). */
xte_status moe_qalloc(xte_qtensor *q, int64_t M, int64_t K, xte_scaling_mode mode,
                      xte_recipe recipe, int row, int col, moe_alloc_fn alloc, void *ctx, int cat);
int moe_col_transposed(xte_recipe r);

void alloc_inputs(layer *L); /* phase A: inputs, router outputs */
void alloc_layer(layer *L);  /* phase B: weights, activations, gradients (R known) */
int generate_weights(layer *L);
void define_steps(layer *L);
void router_gate(layer *L);
xte_status router_fwd(layer *L);
int run_layer(layer *L, int timed); /* one forward (+ backward); timed: add to the steps */
/* FNV-1a (64-bit) of the FP8 weight stacks with their scales (routed, then shared), and of the
 * layer's outputs (out as bf16 bytes; with the backward dx, then the routed and shared weight
 * gradients as fp32 bytes): the bytes a change of the synthetic data, of the weight setup or
 * of a kernel would move (tests/cmake/moe_layer.cmake pins them). */
void layer_checksum(const layer *L, uint64_t *weights, uint64_t *outputs);

/* ================================================================== fp64 check (ref.c) */

typedef struct cmp {
  double sxx, syy, sxy, sdd, maxd, maxr;
  int64_t n;
  int nonfinite;
} cmp;

double cmp_rel(const cmp *c);
double cmp_diff(const cmp *c); /* DeepGEMM's calc_diff */
double cmp_maxrel(const cmp *c);

enum { C_OUT, C_DX, C_DWD, C_DWGU, C_COUNT };
extern const char *const moe_cmp_names[C_COUNT];
extern const double moe_bound_rel, moe_bound_diff;
/* The bounds the check applies in this mode (XTE_GEMM_FAST: widened by the FAST bound of
 * docs/numerics.md section 6, ref.c). */
double moe_bound_rel_for(xte_gemm_mode mode);
double moe_bound_diff_for(xte_gemm_mode mode);

typedef struct check {
  int64_t n;       /* checked tokens */
  int64_t *slot;   /* [T]: index in the checked subset, or -1 */
  int64_t *toks;   /* [n] */
  int64_t agree;   /* tokens whose fp64 top-k set equals xte's */
  int64_t wexpert; /* expert whose weight gradients are checked (-1: none) */
  cmp c[C_COUNT];
  int have[C_COUNT];
  double bound_rel, bound_diff; /* the bounds of this run's GEMM mode (moe_bound_*_for) */
  double t;
} check;

double check_bytes(const layer *L); /* memory of the check (allocated after the layer ran) */
int run_check(layer *L, check *ck);
int check_pass(const check *ck);

/* ================================================================== report (report.c) */

void print_json(const layer *L, const check *ck, double avail, double t_total);
void print_table(const layer *L, const check *ck, double avail, double t_total);

/* ================================================================== the run (run.c) */

int moe_run(const moe_opts *o); /* the exit status of `xte moe` (one process) */

/* ================================================================== --ep N (ep.c) */

/* Runs the check on every rank of MPI_COMM_WORLD (MPI_Init when MPI is not initialised yet,
 * MPI_Finalize then). Returns the exit status: 0 when every rank matched the one-process layer,
 * 1 on a mismatch or a failure, 2 on a usage error (N not the communicator's size, experts not
 * divisible by N; or the program was built without MPI). Reads o's shape, recipe, scaling,
 * seed, threads, isa, backward (0: forward only), iters, warmup, quiet, shared (a note only). */
int moe_ep_main(const moe_opts *o);

#endif /* XTE_TOOLS_MOE_H */
