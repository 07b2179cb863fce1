/* `xte moe`: one MoE layer forward and backward through the library, with Kimi-K2's per-expert
 * shapes (hidden 7168, expert FFN 2048, SwiGLU, top-8 sigmoid router with expert bias, routed
 * scaling 2.827, one shared expert) and fewer experts by default, so that it fits a small machine.
 *
 * Forward:  router gate (fp32 GEMM, OpenBLAS) -> xte_router_forward -> xte_moe_permute (bf16,
 *           each expert padded to 128 rows) -> xte_quantize 1x128 (rowwise + columnwise) ->
 *           grouped GEMM gate/up (128x128 weights) -> xte_swiglu_quantize -> grouped GEMM down ->
 *           xte_moe_unpermute with the probs; the shared expert: quantize -> GEMM -> SwiGLU +
 *           quantize -> GEMM accumulating into the routed output.
 * Backward: unpermute backward (grad rows + grad probs) -> quantize -> grouped down dgrad and
 *           k-grouped down wgrad -> dSwiGLU + quantize -> grouped gate/up dgrad and k-grouped
 *           gate/up wgrad -> permute backward; the shared expert's dgrad / wgrad GEMMs; the router
 *           backward and its gate GEMMs (fp32, OpenBLAS).
 * Numerics: the same layer in fp64 (OpenBLAS dgemm, libm) from the unquantized inputs (bf16 x,
 *           fp32 master weights), streamed one expert at a time, on a deterministic subset of the
 *           tokens; plus the weight gradients of the busiest expert (all its tokens).
 *
 * Everything lives in this one file: bench/CMakeLists.txt compiles tools/xte_main.c and
 * tools/cmd_*.c into the xte program (and links xte_bench: OpenBLAS, libm, bench_common). */
#define _GNU_SOURCE /* clock_gettime, posix_memalign, MAP_POPULATE */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "moe_synth.h"
#include "moe_ep.h"
#include "xte/xte.h"

const char xte_cmd_moe_summary[] =
    "run one MoE layer (Kimi-K2 expert shapes) forward + backward: kernel table, fp64 check";

/* ================================================================== options */

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
  int64_t ep; /* --ep N: experts over N MPI ranks (tools/moe_ep.c); 0: one process */
  const char *preset;
} moe_opts;

static void opts_default(moe_opts *o) {
  memset(o, 0, sizeof *o);
  o->tokens = 128;
  o->experts = 16;
  o->hidden = 7168;
  o->ffn = 2048;
  o->topk = 8;
  o->shared = 1;
  o->scaling = 2.827f;
  o->recipe = XTE_RECIPE_TE_BLOCK;
  o->backend = -1;
  o->threads = 0;
  o->isa = -1;
  o->backward = -1;
  o->check_tokens = 64;
  o->seed = 1;
  o->iters = 1;
  o->warmup = 0;
  o->preset = "default";
}

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: xte moe [--preset default|kimi-k2] [--tokens N] [--experts N] [--hidden N]\n"
      "               [--ffn N] [--topk N] [--shared 0|1] [--scaling X] [--recipe R]\n"
      "               [--backend B] [--threads N] [--isa ISA] [--forward-only | --backward]\n"
      "               [--check-tokens N] [--seed N] [--iters N] [--warmup N] [--json] [--quiet]\n"
      "       mpirun -np N xte moe --ep N [shape options]\n"
      "\n"
      "One MoE layer forward and backward through xte: Kimi-K2's expert shapes (hidden 7168,\n"
      "expert FFN 2048, SwiGLU, top-8 sigmoid router with expert bias, routed scaling 2.827,\n"
      "one shared expert) with synthetic seeded weights; prints the time and rate of every\n"
      "kernel, the GEMMs' share of the layer's time and a numerics report against an fp64\n"
      "execution of the same layer from the unquantized inputs.\n"
      "\n"
      "  --preset P        default: 16 experts, 128 tokens (64 per expert), 64 checked tokens:\n"
      "                    about 3.8 GiB and under a minute on 2 cores with the backward;\n"
      "                    kimi-k2: all 384 experts (about 17 GB of FP8 weights), 256 tokens,\n"
      "                    16 checked tokens, forward only unless the fp32 weight gradients fit\n"
      "  --tokens N        tokens of the batch\n"
      "  --experts N       routed experts (each: 3 x hidden x FFN FP8 weights, 4x that in\n"
      "                    fp32 weight gradients for the backward)\n"
      "  --hidden N        model width (multiple of 128; default 7168)\n"
      "  --ffn N           expert FFN width (multiple of 128; default 2048)\n"
      "  --topk N          experts per token (default 8)\n"
      "  --shared N        shared experts, 0 or 1 (default 1)\n"
      "  --scaling X       routed scaling factor (default 2.827)\n"
      "  --recipe R        te_block (default), deepgemm, deepgemm_ue8m0, mtfp8\n"
      "  --backend B       auto (default), cpu, cuda, musa\n"
      "  --threads N       threads of xte's CPU pool and of OpenBLAS (default: cores)\n"
      "  --isa ISA         CPU kernels: scalar, avx2, avx512, avx512_simde\n"
      "  --forward-only    skip the backward (no weight gradients: far less memory)\n"
      "  --backward        run the backward even where the preset would not\n"
      "  --check-tokens N  tokens checked against fp64, evenly spaced (0: no check;\n"
      "                    default 64; the fp64 layer is the slowest part of a run)\n"
      "  --seed N          seed of the synthetic inputs and weights (default 1)\n"
      "  --iters N         timed runs of the layer (the table shows their mean; default 1)\n"
      "  --warmup N        untimed runs before them (default 0)\n"
      "  --json            print one JSON object instead of the table\n"
      "  --ep N            expert parallelism: the routed experts split over the N ranks of an\n"
      "                    MPI job (dispatch, grouped GEMMs, combine; forward and backward),\n"
      "                    checked byte for byte against the one-process layer (tools/moe_ep.c)\n"
      "  --quiet           no progress line\n");
}

static const char *recipe_names[] = {"te_current",     "te_delayed", "te_block", "deepgemm",
                                     "deepgemm_ue8m0", "mtfp8",      "mx_te",    "mx_ocp"};

static int is_opt(const char *arg, const char *opt) {
  size_t n = strlen(opt);
  return strncmp(arg, opt, n) == 0 && (arg[n] == 0 || arg[n] == '=');
}

static const char *opt_value(int argc, char **argv, int *i, const char *opt) {
  size_t n = strlen(opt);
  if (strncmp(argv[*i], opt, n) == 0 && argv[*i][n] == '=') return argv[*i] + n + 1;
  if (*i + 1 < argc) return argv[++*i];
  fprintf(stderr, "xte moe: %s needs a value\n", opt);
  return NULL;
}

static int parse_int(const char *opt, const char *v, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  long long x;
  errno = 0;
  x = strtoll(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi) {
    fprintf(stderr, "xte moe: %s '%s': want an integer in [%lld, %lld]\n", opt, v, (long long)lo,
            (long long)hi);
    return -1;
  }
  *out = x;
  return 0;
}

static void apply_preset(moe_opts *o, const char *p) {
  o->preset = p;
  if (strcmp(p, "kimi-k2") == 0) {
    o->experts = 384;
    o->tokens = 256;
    o->check_tokens = 16;
  }
}

/* 0 ok, 1 --help printed, 2 usage error. */
static int parse_opts(int argc, char **argv, moe_opts *o) {
  int i;
  int64_t v;
  opts_default(o);
  for (i = 1; i < argc; i++) /* the preset first: explicit flags override it */
    if (is_opt(argv[i], "--preset")) {
      const char *p = opt_value(argc, argv, &i, "--preset");
      if (!p) return 2;
      if (strcmp(p, "default") != 0 && strcmp(p, "kimi-k2") != 0) {
        fprintf(stderr, "xte moe: --preset '%s': want default or kimi-k2\n", p);
        return 2;
      }
      apply_preset(o, p);
    }
  for (i = 1; i < argc; i++) {
    const char *a = argv[i], *s;
#define INTOPT(name, lo, hi, field)                       \
  if (is_opt(a, name)) {                                  \
    if (!(s = opt_value(argc, argv, &i, name))) return 2; \
    if (parse_int(name, s, lo, hi, &v)) return 2;         \
    o->field = v;                                         \
    continue;                                             \
  }
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0 || strcmp(a, "help") == 0) {
      usage(stdout);
      return 1;
    }
    if (is_opt(a, "--preset")) {
      (void)opt_value(argc, argv, &i, "--preset");
      continue;
    }
    INTOPT("--tokens", 1, (int64_t)1 << 24, tokens)
    INTOPT("--experts", 1, 512, experts)
    INTOPT("--hidden", 128, 65536, hidden)
    INTOPT("--ffn", 128, 65536, ffn)
    INTOPT("--topk", 1, 16, topk)
    INTOPT("--shared", 0, 1, shared)
    INTOPT("--check-tokens", 0, (int64_t)1 << 24, check_tokens)
    INTOPT("--iters", 1, 1000, iters)
    INTOPT("--warmup", 0, 1000, warmup)
    INTOPT("--threads", 1, 256, threads)
    INTOPT("--ep", 1, 4096, ep)
#undef INTOPT
    if (is_opt(a, "--seed")) {
      if (!(s = opt_value(argc, argv, &i, "--seed"))) return 2;
      if (parse_int("--seed", s, 0, INT64_MAX, &v)) return 2;
      o->seed = (uint64_t)v;
    } else if (is_opt(a, "--scaling")) {
      char *end;
      double d;
      if (!(s = opt_value(argc, argv, &i, "--scaling"))) return 2;
      errno = 0;
      d = strtod(s, &end);
      if (errno || end == s || *end || !(d > 0) || d > 1e6) {
        fprintf(stderr, "xte moe: --scaling '%s': want a number > 0\n", s);
        return 2;
      }
      o->scaling = (float)d;
    } else if (is_opt(a, "--recipe")) {
      int k, found = -1;
      if (!(s = opt_value(argc, argv, &i, "--recipe"))) return 2;
      for (k = 0; k < (int)(sizeof recipe_names / sizeof *recipe_names); k++)
        if (strcmp(s, recipe_names[k]) == 0) found = k;
      if (found != XTE_RECIPE_TE_BLOCK && found != XTE_RECIPE_DEEPGEMM &&
          found != XTE_RECIPE_DEEPGEMM_UE8M0 && found != XTE_RECIPE_MTFP8) {
        fprintf(stderr,
                "xte moe: --recipe '%s': want te_block, deepgemm, deepgemm_ue8m0 or mtfp8 (the "
                "1x128 / 128x128 block recipes)\n",
                s);
        return 2;
      }
      o->recipe = (xte_recipe)found;
    } else if (is_opt(a, "--backend")) {
      if (!(s = opt_value(argc, argv, &i, "--backend"))) return 2;
      if (strcmp(s, "auto") == 0)
        o->backend = -1;
      else if (strcmp(s, "cpu") == 0)
        o->backend = XTE_BACKEND_CPU;
      else if (strcmp(s, "cuda") == 0)
        o->backend = XTE_BACKEND_CUDA;
      else if (strcmp(s, "musa") == 0)
        o->backend = XTE_BACKEND_MUSA;
      else {
        fprintf(stderr, "xte moe: --backend '%s': want auto, cpu, cuda or musa\n", s);
        return 2;
      }
    } else if (is_opt(a, "--isa")) {
      int k;
      if (!(s = opt_value(argc, argv, &i, "--isa"))) return 2;
      o->isa = -1;
      for (k = 0; k < XTE_CPU_ISA_COUNT; k++)
        if (strcmp(s, xte_cpu_isa_name((xte_cpu_isa)k)) == 0) o->isa = k;
      if (o->isa < 0) {
        fprintf(stderr, "xte moe: --isa '%s': want one of", s);
        for (k = 0; k < XTE_CPU_ISA_COUNT; k++)
          fprintf(stderr, " %s", xte_cpu_isa_name((xte_cpu_isa)k));
        fprintf(stderr, "\n");
        return 2;
      }
    } else if (strcmp(a, "--forward-only") == 0) {
      o->backward = 0;
    } else if (strcmp(a, "--backward") == 0) {
      o->backward = 1;
    } else if (strcmp(a, "--json") == 0) {
      o->json = 1;
    } else if (strcmp(a, "--quiet") == 0) {
      o->quiet = 1;
    } else {
      fprintf(stderr, "xte moe: unknown argument '%s' (xte moe --help)\n", a);
      return 2;
    }
  }
  if (o->hidden % 128 || o->ffn % 128) {
    fprintf(stderr,
            "xte moe: --hidden %lld / --ffn %lld: both must be multiples of 128 (the 128x128 "
            "weight blocks and the grouped GEMMs' K blocks)\n",
            (long long)o->hidden, (long long)o->ffn);
    return 2;
  }
  if (o->topk > o->experts) {
    fprintf(stderr, "xte moe: --topk %lld is more than --experts %lld\n", (long long)o->topk,
            (long long)o->experts);
    return 2;
  }
  if (o->check_tokens > o->tokens) o->check_tokens = o->tokens;
  return 0;
}

/* ================================================================== small helpers */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct fill_job {
  float *f;
  double *d;
  uint16_t *b;
  size_t n;
  uint64_t key;
  float a;
} fill_job;

static void fill_part(void *ctx, int t, int nt) {
  const fill_job *j = (const fill_job *)ctx;
  size_t lo = j->n * (size_t)t / (size_t)nt, hi = j->n * (size_t)(t + 1) / (size_t)nt, i;
  if (j->f)
    for (i = lo; i < hi; i++) j->f[i] = moe_synth(j->key, i, j->a);
  else if (j->d)
    for (i = lo; i < hi; i++) j->d[i] = (double)moe_synth(j->key, i, j->a);
  else
    for (i = lo; i < hi; i++) j->b[i] = moe_f32_to_bf16(moe_synth(j->key, i, j->a));
}

static void fill(float *f, double *d, uint16_t *b, size_t n, uint64_t seed, uint64_t stream,
                 float a) {
  fill_job j;
  j.f = f;
  j.d = d;
  j.b = b;
  j.n = n;
  j.key = moe_stream_key(seed, stream);
  j.a = a;
  if (n < ((size_t)1 << 16))
    fill_part(&j, 0, 1);
  else
    xte_bench_team_run(fill_part, &j);
}

/* ================================================================== progress line */

static struct {
  double t0, last;
  int on, tty, shown;
} prog;

static void progress(const char *fmt, ...) {
  char line[200];
  va_list ap;
  double t = now_s();
  if (!prog.on || t - prog.t0 < 2.0) return;
  if (!prog.tty && t - prog.last < 5.0) return;
  prog.last = t;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (prog.tty)
    fprintf(stderr, "\r\033[Kxte moe [%6.1f s] %s", t - prog.t0, line);
  else
    fprintf(stderr, "xte moe [%6.1f s] %s\n", t - prog.t0, line);
  prog.shown = 1;
}

static void progress_done(void) {
  if (prog.on && prog.tty && prog.shown) fprintf(stderr, "\r\033[K");
  prog.shown = 0;
}

/* ================================================================== memory */

#define GiB(x) ((x) / 1073741824.0)

enum { CAT_INPUT, CAT_WEIGHT, CAT_WGRAD, CAT_ACT, CAT_CHECK, CAT_COUNT };
static const char *cat_names[CAT_COUNT] = {"inputs, router, outputs", "FP8 weights",
                                           "fp32 weight grads", "activations", "fp64 check"};

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
} membook;

/* Page-aligned, zeroed, every page present before any kernel runs (no page fault inside a timed
 * kernel). Large buffers are mmap(MAP_POPULATE)ed: in this VM the kernel faults pages in about
 * 2.4x faster that way than a memset does page by page (6 GB: 5.2 s against 12.8 s), and no
 * MADV_HUGEPAGE (with THP defrag = madvise the faults compact memory synchronously: tens of
 * seconds for 8 GiB on a busy machine). In dry mode only counts. NULL (and failed set) when the
 * allocation fails. */
#define MMAP_MIN ((size_t)16 << 20)
static void *mem(membook *m, size_t bytes, int cat) {
  size_t rounded = (bytes + 4095) / 4096 * 4096;
  void *p = NULL;
  if (bytes == 0) return NULL;
  m->bytes[cat] += (double)bytes;
  if (m->dry || m->failed) return NULL;
  if (m->nbufs >= MAX_BUFS) {
    m->failed = 1;
    return NULL;
  }
  if (rounded >= MMAP_MIN) {
    p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1,
             0);
    if (p == MAP_FAILED) p = NULL;
  } else if (posix_memalign(&p, 4096, rounded) == 0 && p) {
    memset(p, 0, rounded);
  } else {
    p = NULL;
  }
  if (!p) {
    m->failed = 1;
    return NULL;
  }
  m->done += (double)rounded;
  if (rounded >= MMAP_MIN) progress("setup: allocating buffers, %.2f GiB so far", GiB(m->done));
  m->bcat[m->nbufs] = cat;
  m->bsize[m->nbufs] = rounded;
  m->bufs[m->nbufs++] = p;
  return p;
}

static void mem_release(void *p, size_t rounded) {
  if (rounded >= MMAP_MIN)
    munmap(p, rounded);
  else
    free(p);
}

static void mem_free_all(membook *m) {
  int i;
  for (i = 0; i < m->nbufs; i++) mem_release(m->bufs[i], m->bsize[i]);
  m->nbufs = 0;
}

/* Frees the buffers of one category (their bytes stay in the book). */
static void mem_free_cat(membook *m, int cat) {
  int i, n = 0;
  for (i = 0; i < m->nbufs; i++) {
    if (m->bcat[i] == cat) {
      mem_release(m->bufs[i], m->bsize[i]);
    } else {
      m->bufs[n] = m->bufs[i];
      m->bsize[n] = m->bsize[i];
      m->bcat[n++] = m->bcat[i];
    }
  }
  m->nbufs = n;
}

/* Peak: the layer holds everything but the check; the fp64 check runs after the FP8 weights and
 * the activations are freed. */
static double mem_peak(const membook *m) {
  const double *b = m->bytes;
  double layer = b[CAT_WEIGHT] + b[CAT_ACT];
  return b[CAT_INPUT] + b[CAT_WGRAD] + (layer > b[CAT_CHECK] ? layer : b[CAT_CHECK]);
}

/* MemAvailable from /proc/meminfo in bytes, or -1. */
static double mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  double v = -1;
  if (!f) return -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long long kb;
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
      v = (double)kb * 1024.0;
      break;
    }
  }
  fclose(f);
  return v;
}

/* ================================================================== the layer */

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
  float *stage; /* one expert's fp32 weights while they are quantized */
  step steps[NSTEPS];
  double t_setup, t_routing, t_alloc;
  char why_fwd[200]; /* why the backward was left out ("" when it ran or was not asked for) */
} layer;

static int col_transposed(xte_recipe r) {
  return r != XTE_RECIPE_MTFP8 && r != XTE_RECIPE_MX_TE && r != XTE_RECIPE_MX_OCP;
}

/* A qtensor for an [M, K] input, e4m3, COMPACT scales; row / col: which copies. */
static void qalloc(layer *L, xte_qtensor *q, int64_t M, int64_t K, xte_scaling_mode mode, int row,
                   int col, int cat) {
  int64_t sr = 0, sc = 0;
  memset(q, 0, sizeof *q);
  q->scaling_mode = mode;
  q->recipe = L->o.recipe;
  if (row) {
    (void)xte_quantize_scale_shape(M, K, mode, q->recipe, XTE_SCALE_LAYOUT_COMPACT, 0, &sr, &sc);
    q->rowwise = xte_tensor_2d(mem(&L->mb, (size_t)(M * K), cat), XTE_DTYPE_E4M3, M, K);
    q->rowwise_scale_inv.data = mem(&L->mb, (size_t)(sr * sc) * 4, cat);
    q->rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
    q->rowwise_scale_inv.rows = sr;
    q->rowwise_scale_inv.cols = sc;
    q->rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  }
  if (col) {
    int tr = col_transposed(q->recipe);
    (void)xte_quantize_scale_shape(M, K, mode, q->recipe, XTE_SCALE_LAYOUT_COMPACT, 1, &sr, &sc);
    q->columnwise =
        xte_tensor_2d(mem(&L->mb, (size_t)(M * K), cat), XTE_DTYPE_E4M3, tr ? K : M, tr ? M : K);
    q->columnwise_scale_inv.data = mem(&L->mb, (size_t)(sr * sc) * 4, cat);
    q->columnwise_scale_inv.dtype = XTE_DTYPE_FP32;
    q->columnwise_scale_inv.rows = sr;
    q->columnwise_scale_inv.cols = sc;
    q->columnwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  }
}

/* Phase A: inputs, router outputs (small; needed to know the permuted rows R). */
static void alloc_inputs(layer *L) {
  membook *m = &L->mb;
  int64_t T = L->T, H = L->H, E = L->E, k = L->k;
  L->x = (uint16_t *)mem(m, (size_t)(T * H) * 2, CAT_INPUT);
  L->xf = (float *)mem(m, (size_t)(T * H) * 4, CAT_INPUT);
  L->Wr = (float *)mem(m, (size_t)(E * H) * 4, CAT_INPUT);
  L->bias = (float *)mem(m, (size_t)E * 4, CAT_INPUT);
  L->logits = (float *)mem(m, (size_t)(T * E) * 4, CAT_INPUT);
  L->probs = (float *)mem(m, (size_t)(T * E) * 4, CAT_INPUT);
  L->saved = (float *)mem(m, (size_t)(T * E) * 4, CAT_INPUT);
  L->map = (uint8_t *)mem(m, (size_t)(T * E), CAT_INPUT);
  L->row_map = (int32_t *)mem(m, (size_t)(T * k) * 4, CAT_INPUT);
  L->offs = (int64_t *)mem(m, (size_t)(E + 1) * 8, CAT_INPUT);
  L->tpe = (int64_t *)mem(m, (size_t)E * 8, CAT_INPUT);
  L->m = (int64_t *)mem(m, (size_t)E * 8, CAT_INPUT);
  L->kpad = (int64_t *)mem(m, (size_t)E * 8, CAT_INPUT);
  if (L->bwd) {
    L->dy = (uint16_t *)mem(m, (size_t)(T * H) * 2, CAT_INPUT);
    L->gprobs = (float *)mem(m, (size_t)(T * E) * 4, CAT_INPUT);
    L->dlogits = (float *)mem(m, (size_t)(T * E) * 4, CAT_INPUT);
    L->dWr = (float *)mem(m, (size_t)(E * H) * 4, CAT_WGRAD);
  }
}

/* Phase B: weights, activations, gradients (R known). */
static void alloc_layer(layer *L) {
  membook *m = &L->mb;
  int64_t T = L->T, H = L->H, F = L->F, E = L->E, R = L->R;
  int b = L->bwd, s = L->shared;
  L->stage = (float *)mem(m, (size_t)(2 * F * H) * 4, CAT_WEIGHT);
  qalloc(L, &L->Wgu, E * 2 * F, H, XTE_SCALING_BLOCK_128x128, 1, 0, CAT_WEIGHT);
  qalloc(L, &L->Wd, E * H, F, XTE_SCALING_BLOCK_128x128, 1, 0, CAT_WEIGHT);
  L->xp = (uint16_t *)mem(m, (size_t)(R * H) * 2, CAT_ACT);
  qalloc(L, &L->qx, R, H, XTE_SCALING_BLOCK_1x128, 1, b, CAT_ACT);
  L->h = (uint16_t *)mem(m, (size_t)(R * 2 * F) * 2, CAT_ACT);
  qalloc(L, &L->qa, R, F, XTE_SCALING_BLOCK_1x128, 1, b, CAT_ACT);
  L->y = (uint16_t *)mem(m, (size_t)(R * H) * 2, CAT_ACT);
  L->out = (uint16_t *)mem(m, (size_t)(T * H) * 2, CAT_INPUT);
  if (s) {
    qalloc(L, &L->Wsgu, 2 * F, H, XTE_SCALING_BLOCK_128x128, 1, 0, CAT_WEIGHT);
    qalloc(L, &L->Wsd, H, F, XTE_SCALING_BLOCK_128x128, 1, 0, CAT_WEIGHT);
    qalloc(L, &L->qxs, T, H, XTE_SCALING_BLOCK_1x128, 1, b, CAT_ACT);
    L->hs = (uint16_t *)mem(m, (size_t)(T * 2 * F) * 2, CAT_ACT);
    qalloc(L, &L->qas, T, F, XTE_SCALING_BLOCK_1x128, 1, b, CAT_ACT);
  }
  if (!b) return;
  L->dyp = (uint16_t *)mem(m, (size_t)(R * H) * 2, CAT_ACT);
  qalloc(L, &L->qdyp, R, H, XTE_SCALING_BLOCK_1x128, 1, 1, CAT_ACT);
  L->da = (uint16_t *)mem(m, (size_t)(R * F) * 2, CAT_ACT);
  qalloc(L, &L->qdh, R, 2 * F, XTE_SCALING_BLOCK_1x128, 1, 1, CAT_ACT);
  L->dxp = (uint16_t *)mem(m, (size_t)(R * H) * 2, CAT_ACT);
  L->dx = (float *)mem(m, (size_t)(T * H) * 4, CAT_INPUT);
  L->dWd = (float *)mem(m, (size_t)(E * H * F) * 4, CAT_WGRAD);
  L->dWgu = (float *)mem(m, (size_t)(E * 2 * F * H) * 4, CAT_WGRAD);
  if (s) {
    qalloc(L, &L->qdy, T, H, XTE_SCALING_BLOCK_1x128, 1, 1, CAT_ACT);
    L->das = (uint16_t *)mem(m, (size_t)(T * F) * 2, CAT_ACT);
    qalloc(L, &L->qdhs, T, 2 * F, XTE_SCALING_BLOCK_1x128, 1, 1, CAT_ACT);
    L->dWsd = (float *)mem(m, (size_t)(H * F) * 4, CAT_WGRAD);
    L->dWsgu = (float *)mem(m, (size_t)(2 * F * H) * 4, CAT_WGRAD);
  }
}

#define DW_CHUNK 256 /* rows of a weight gradient the check forms at a time */

/* Memory of the fp64 check (added to the estimate; allocated after the layer ran). */
static double check_bytes(const layer *L) {
  double H = (double)L->H, F = (double)L->F, n = (double)L->T; /* an expert's token list: <= T */
  double b;
  if (L->o.check_tokens == 0) return 0;
  b = 8.0 * (3 * F * H);                        /* one expert's weights */
  b += 8.0 * n * (H + 2 * F + F + H);           /* X, Hh, A, Y */
  b += 8.0 * (double)L->T * (double)L->E * 3;   /* logits, scores, grad probs */
  b += 8.0 * (double)L->o.check_tokens * H * 2; /* out, dx references */
  b += 8.0 * (double)L->E * H;                  /* Wr */
  if (L->bwd) b += 8.0 * n * (H + F + 2 * F + H) + 8.0 * DW_CHUNK * (F + H); /* dW chunks */
  return b;
}

/* ---------------------------------------------------------------- weights */

static int quantize_experts(layer *L, xte_qtensor *W, int64_t G, int64_t N, int64_t K, int stream0,
                            int stride, float a, const char *what) {
  int64_t g, sr = N / 128, sc = K / 128;
  for (g = 0; g < G; g++) {
    xte_qtensor s = *W;
    xte_tensor in = xte_tensor_2d(L->stage, XTE_DTYPE_FP32, N, K);
    xte_status rc;
    fill(L->stage, NULL, NULL, (size_t)(N * K), L->o.seed, (uint64_t)(stream0 + stride * g), a);
    s.rowwise = xte_tensor_2d((uint8_t *)W->rowwise.data + g * N * K, XTE_DTYPE_E4M3, N, K);
    s.rowwise_scale_inv.data = (float *)W->rowwise_scale_inv.data + g * sr * sc;
    s.rowwise_scale_inv.rows = sr;
    s.rowwise_scale_inv.cols = sc;
    rc = xte_quantize(&in, &s, NULL, L->st);
    if (rc != XTE_SUCCESS) {
      fprintf(stderr, "xte moe: quantizing %s %lld: %s: %s\n", what, (long long)g,
              xte_status_string(rc), xte_last_error());
      return -1;
    }
    progress("setup: weights %s %lld / %lld", what, (long long)(g + 1), (long long)G);
  }
  return 0;
}

static float w_scale(int64_t fan_in) {
  return (float)sqrt(3.0 / (double)fan_in); /* uniform: std 1 / sqrt(fan_in) */
}

/* ---------------------------------------------------------------- steps */

static void def_step(layer *L, int id, const char *name, int bwd, int kind, int shared,
                     double flops, double bytes) {
  step *s = &L->steps[id];
  s->name = name;
  s->bwd = bwd;
  s->kind = kind;
  s->shared = shared;
  s->flops = flops;
  s->bytes = bytes;
  s->t = 0;
}

static void define_steps(layer *L) {
  double T = (double)L->T, H = (double)L->H, F = (double)L->F, E = (double)L->E, k = (double)L->k,
         R = (double)L->R, N = (double)L->Nr;
  double q = 1.0 + 4.0 / 128; /* fp8 byte + its fp32 scale per 128 */
  int c = L->bwd;             /* columnwise copies too */
  memset(L->steps, 0, sizeof L->steps);
  def_step(L, F_RGATE, "router gate GEMM (fp32, OpenBLAS)", 0, K_GEMM32, 0, 2 * T * H * E,
           4 * (T * H + E * H + T * E));
  def_step(L, F_ROUTER, "router: sigmoid, bias, top-k", 0, K_MEM, 0, 0, 4 * T * E + 13 * T * E);
  def_step(L, F_PERMUTE, "permute (bf16)", 0, K_MEM, 0, 0, 2 * T * H + 2 * R * H + 4 * T * k);
  def_step(L, F_QX, c ? "quantize 1x128 (row + col)" : "quantize 1x128", 0, K_MEM, 0, 0,
           2 * R * H + (1 + c) * q * R * H);
  def_step(L, F_GU, "grouped GEMM gate/up", 0, K_GEMM8, 0, 2 * N * 2 * F * H, 0);
  def_step(L, F_SWIGLU, "SwiGLU + quantize", 0, K_MEM, 0, 0, 2 * R * 2 * F + (1 + c) * q * R * F);
  def_step(L, F_DOWN, "grouped GEMM down", 0, K_GEMM8, 0, 2 * N * H * F, 0);
  def_step(L, F_UNPERM, "unpermute with probs", 0, K_MEM, 0, 0, 2 * N * H + 2 * T * H + 4 * T * E);
  if (L->shared) {
    def_step(L, F_S_QX, c ? "shared: quantize x (row + col)" : "shared: quantize x", 0, K_MEM, 1, 0,
             2 * T * H + (1 + c) * q * T * H);
    def_step(L, F_S_GU, "shared: GEMM gate/up", 0, K_GEMM8, 1, 2 * T * 2 * F * H, 0);
    def_step(L, F_S_SWIGLU, "shared: SwiGLU + quantize", 0, K_MEM, 1, 0,
             2 * T * 2 * F + (1 + c) * q * T * F);
    def_step(L, F_S_DOWN, "shared: GEMM down (+= routed)", 0, K_GEMM8, 1, 2 * T * H * F, 0);
  }
  if (!L->bwd) return;
  def_step(L, B_UNPERM, "unpermute backward (+ grad probs)", 1, K_MEM, 0, 0,
           2 * T * H + 2 * N * H + 2 * R * H + 8 * T * E);
  def_step(L, B_QDY, "quantize grad (row + col)", 1, K_MEM, 0, 0, 2 * R * H + 2 * q * R * H);
  def_step(L, B_DOWN_DG, "grouped GEMM down dgrad", 1, K_GEMM8, 0, 2 * N * H * F, 0);
  def_step(L, B_DOWN_WG, "k-grouped GEMM down wgrad", 1, K_GEMM8, 0, 2 * N * H * F, 0);
  L->steps[B_DOWN_WG].xflops = 2 * R * H * F;
  def_step(L, B_DSWIGLU, "dSwiGLU + quantize", 1, K_MEM, 0, 0,
           2 * R * F + 2 * R * 2 * F + 2 * q * R * 2 * F);
  def_step(L, B_GU_DG, "grouped GEMM gate/up dgrad", 1, K_GEMM8, 0, 2 * N * 2 * F * H, 0);
  def_step(L, B_GU_WG, "k-grouped GEMM gate/up wgrad", 1, K_GEMM8, 0, 2 * N * 2 * F * H, 0);
  L->steps[B_GU_WG].xflops = 2 * R * 2 * F * H;
  def_step(L, B_PERM, "permute backward (fp32 dx)", 1, K_MEM, 0, 0, 2 * N * H + 4 * T * H);
  if (L->shared) {
    def_step(L, B_S_QDY, "shared: quantize grad (row + col)", 1, K_MEM, 1, 0,
             2 * T * H + 2 * q * T * H);
    def_step(L, B_S_DOWN_DG, "shared: GEMM down dgrad", 1, K_GEMM8, 1, 2 * T * H * F, 0);
    def_step(L, B_S_DOWN_WG, "shared: GEMM down wgrad", 1, K_GEMM8, 1, 2 * T * H * F, 0);
    def_step(L, B_S_DSWIGLU, "shared: dSwiGLU + quantize", 1, K_MEM, 1, 0,
             2 * T * F + 2 * T * 2 * F + 2 * q * T * 2 * F);
    def_step(L, B_S_GU_DG, "shared: GEMM gate/up dgrad (+= dx)", 1, K_GEMM8, 1, 2 * T * 2 * F * H,
             0);
    def_step(L, B_S_GU_WG, "shared: GEMM gate/up wgrad", 1, K_GEMM8, 1, 2 * T * 2 * F * H, 0);
  }
  def_step(L, B_ROUTER, "router backward", 1, K_MEM, 0, 0, 4 * T * E * 3 + T * E);
  def_step(L, B_RGATE_DG, "router gate dgrad (fp32, OpenBLAS, += dx)", 1, K_GEMM32, 0,
           2 * T * H * E, 4 * (2 * T * H + E * H + T * E));
  def_step(L, B_RGATE_WG, "router gate wgrad (fp32, OpenBLAS)", 1, K_GEMM32, 0, 2 * T * H * E,
           4 * (T * H + 2 * E * H + T * E));
}

static int step_fail(const layer *L, int id, xte_status rc) {
  progress_done();
  fprintf(stderr, "xte moe: %s: %s: %s\n", L->steps[id].name, xte_status_string(rc),
          xte_last_error());
  return -1;
}

#define RUN(id, call)                                                                 \
  do {                                                                                \
    double t0_ = now_s();                                                             \
    xte_status rc_ = (call);                                                          \
    if (rc_ == XTE_SUCCESS && L->st) rc_ = xte_stream_synchronize(L->st);             \
    if (timed) L->steps[id].t += now_s() - t0_;                                       \
    if (rc_ != XTE_SUCCESS) return step_fail(L, id, rc_);                             \
    progress("%s: %s", L->steps[id].bwd ? "backward" : "forward", L->steps[id].name); \
  } while (0)

#define RUN_BLAS(id, call)                      \
  do {                                          \
    double t0_ = now_s();                       \
    call;                                       \
    if (timed) L->steps[id].t += now_s() - t0_; \
  } while (0)

static xte_tensor T2(void *p, xte_dtype dt, int64_t r, int64_t c) {
  return xte_tensor_2d(p, dt, r, c);
}

static xte_status router_fwd(layer *L) {
  xte_tensor lt = T2(L->logits, XTE_DTYPE_FP32, L->T, L->E);
  xte_tensor bt = xte_tensor_1d(L->bias, XTE_DTYPE_FP32, L->E);
  xte_router_outputs ro;
  memset(&ro, 0, sizeof ro);
  ro.probs = T2(L->probs, XTE_DTYPE_FP32, L->T, L->E);
  ro.routing_map = T2(L->map, XTE_DTYPE_UINT8, L->T, L->E);
  ro.saved = T2(L->saved, XTE_DTYPE_FP32, L->T, L->E);
  return xte_router_forward(&lt, &bt, &L->rcfg, &ro, L->st);
}

static void router_gate(layer *L) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)L->T, (int)L->E, (int)L->H, 1.0f, L->xf,
              (int)L->H, L->Wr, (int)L->H, 0.0f, L->logits, (int)L->E);
}

/* One forward (+ backward) of the layer; timed: add the kernel times to the steps. */
static int run_layer(layer *L, int timed) {
  int64_t T = L->T, H = L->H, F = L->F, E = L->E, k = L->k, R = L->R;
  xte_moe_routing rt;
  xte_tensor mapt = T2(L->map, XTE_DTYPE_UINT8, T, E);
  xte_tensor rowm = T2(L->row_map, XTE_DTYPE_INT32, T, k);
  xte_tensor probs = T2(L->probs, XTE_DTYPE_FP32, T, E);
  xte_tensor xt = T2(L->x, XTE_DTYPE_BF16, T, H), xpt = T2(L->xp, XTE_DTYPE_BF16, R, H);
  xte_tensor ht = T2(L->h, XTE_DTYPE_BF16, R, 2 * F), yt = T2(L->y, XTE_DTYPE_BF16, R, H);
  xte_tensor outt = T2(L->out, XTE_DTYPE_BF16, T, H);
  xte_permute_config pc;
  xte_permute_outputs po;
  xte_gemm_groups gc, gk;

  memset(&rt, 0, sizeof rt);
  rt.routing_map = &mapt;
  rt.num_experts = E;
  pc.num_out_tokens = -1;
  pc.align = L->align;
  memset(&po, 0, sizeof po);
  po.expert_offsets = xte_tensor_1d(L->offs, XTE_DTYPE_INT64, E + 1);
  po.tokens_per_expert = xte_tensor_1d(L->tpe, XTE_DTYPE_INT64, E);
  memset(&gc, 0, sizeof gc);
  gc.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
  gc.num_groups = (int)E;
  gc.group_sizes = L->m;
  gc.alignment = L->align;
  memset(&gk, 0, sizeof gk);
  gk.kind = XTE_GEMM_GROUPED_K;
  gk.num_groups = (int)E;
  gk.group_sizes = L->kpad;

  /* ---------------------------------------------------------------- forward */
  RUN_BLAS(F_RGATE, router_gate(L));
  RUN(F_ROUTER, router_fwd(L));
  RUN(F_PERMUTE, xte_moe_permute(&xt, NULL, &rt, &pc, &xpt, NULL, &rowm, &po, L->st));
  /* group sizes: host arrays (the CPU backend's outputs are host memory) */
  {
    int64_t e;
    for (e = 0; e < E; e++) {
      L->m[e] = L->tpe[e];
      L->kpad[e] = L->offs[e + 1] - L->offs[e];
    }
  }
  RUN(F_QX, xte_quantize(&xpt, &L->qx, NULL, L->st));
  RUN(F_GU, xte_gemm_grouped(&L->qx, &L->Wgu, NULL, &ht, &gc, NULL, L->st));
  RUN(F_SWIGLU, xte_swiglu_quantize(&ht, XTE_DTYPE_BF16, &L->qa, NULL, L->st));
  RUN(F_DOWN, xte_gemm_grouped(&L->qa, &L->Wd, NULL, &yt, &gc, NULL, L->st));
  RUN(F_UNPERM, xte_moe_unpermute(&yt, &rt, &rowm, &probs, &outt, L->st));
  if (L->shared) {
    xte_tensor hst = T2(L->hs, XTE_DTYPE_BF16, T, 2 * F);
    xte_gemm_config acc = xte_gemm_config_default();
    acc.accumulate = 1;
    RUN(F_S_QX, xte_quantize(&xt, &L->qxs, NULL, L->st));
    RUN(F_S_GU, xte_gemm(&L->qxs, &L->Wsgu, NULL, &hst, NULL, L->st));
    RUN(F_S_SWIGLU, xte_swiglu_quantize(&hst, XTE_DTYPE_BF16, &L->qas, NULL, L->st));
    RUN(F_S_DOWN, xte_gemm(&L->qas, &L->Wsd, &outt, &outt, &acc, L->st));
  }
  if (!L->bwd) return 0;

  /* ---------------------------------------------------------------- backward */
  {
    xte_tensor dyt = T2(L->dy, XTE_DTYPE_BF16, T, H), dypt = T2(L->dyp, XTE_DTYPE_BF16, R, H);
    xte_tensor gpt = T2(L->gprobs, XTE_DTYPE_FP32, T, E), dat = T2(L->da, XTE_DTYPE_BF16, R, F);
    xte_tensor dxpt = T2(L->dxp, XTE_DTYPE_BF16, R, H), dxt = T2(L->dx, XTE_DTYPE_FP32, T, H);
    xte_tensor dWdt = T2(L->dWd, XTE_DTYPE_FP32, E * H, F);
    xte_tensor dWgut = T2(L->dWgu, XTE_DTYPE_FP32, E * 2 * F, H);
    xte_tensor dlt = T2(L->dlogits, XTE_DTYPE_FP32, T, E);
    xte_tensor savedt = T2(L->saved, XTE_DTYPE_FP32, T, E);
    xte_gemm_config dg = xte_gemm_config_default(), wg = xte_gemm_config_default();
    dg.trans_b = 1; /* dgrad: op(B) = W^T */
    wg.trans_a = 1; /* wgrad: op(A) = grad^T, op(B) = act^T (token axis = K) */
    wg.trans_b = 1;

    RUN(B_UNPERM, xte_moe_unpermute_backward(&dyt, &yt, &rt, &rowm, &probs, &dypt, &gpt, L->st));
    RUN(B_QDY, xte_quantize(&dypt, &L->qdyp, NULL, L->st));
    RUN(B_DOWN_DG, xte_gemm_grouped(&L->qdyp, &L->Wd, NULL, &dat, &gc, &dg, L->st));
    RUN(B_DOWN_WG, xte_gemm_grouped(&L->qdyp, &L->qa, NULL, &dWdt, &gk, &wg, L->st));
    RUN(B_DSWIGLU, xte_dswiglu_quantize(&dat, &ht, XTE_DTYPE_BF16, &L->qdh, NULL, L->st));
    RUN(B_GU_DG, xte_gemm_grouped(&L->qdh, &L->Wgu, NULL, &dxpt, &gc, &dg, L->st));
    RUN(B_GU_WG, xte_gemm_grouped(&L->qdh, &L->qx, NULL, &dWgut, &gk, &wg, L->st));
    RUN(B_PERM, xte_moe_permute_backward(&dxpt, &rt, &rowm, &dxt, L->st));
    if (L->shared) {
      xte_tensor hst = T2(L->hs, XTE_DTYPE_BF16, T, 2 * F);
      xte_tensor dast = T2(L->das, XTE_DTYPE_BF16, T, F);
      xte_tensor dWsdt = T2(L->dWsd, XTE_DTYPE_FP32, H, F);
      xte_tensor dWsgut = T2(L->dWsgu, XTE_DTYPE_FP32, 2 * F, H);
      xte_gemm_config dga = dg;
      dga.accumulate = 1;
      RUN(B_S_QDY, xte_quantize(&dyt, &L->qdy, NULL, L->st));
      RUN(B_S_DOWN_DG, xte_gemm(&L->qdy, &L->Wsd, NULL, &dast, &dg, L->st));
      RUN(B_S_DOWN_WG, xte_gemm(&L->qdy, &L->qas, NULL, &dWsdt, &wg, L->st));
      RUN(B_S_DSWIGLU, xte_dswiglu_quantize(&dast, &hst, XTE_DTYPE_BF16, &L->qdhs, NULL, L->st));
      RUN(B_S_GU_DG, xte_gemm(&L->qdhs, &L->Wsgu, &dxt, &dxt, &dga, L->st));
      RUN(B_S_GU_WG, xte_gemm(&L->qdhs, &L->qxs, NULL, &dWsgut, &wg, L->st));
    }
    RUN(B_ROUTER, xte_router_backward(&gpt, &mapt, &savedt, NULL, &L->rcfg, &dlt, L->st));
    RUN_BLAS(B_RGATE_DG,
             cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)H, (int)E, 1.0f,
                         L->dlogits, (int)E, L->Wr, (int)H, 1.0f, L->dx, (int)H));
    RUN_BLAS(B_RGATE_WG,
             cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)E, (int)H, (int)T, 1.0f,
                         L->dlogits, (int)E, L->xf, (int)H, 0.0f, L->dWr, (int)H));
  }
  return 0;
}

/* ================================================================== fp64 check */

typedef struct cmp {
  double sxx, syy, sxy, sdd, maxd, maxr;
  int64_t n;
  int nonfinite;
} cmp;

static void cmp_add(cmp *c, double x, double r) {
  double d = x - r;
  if (!isfinite(x)) {
    c->nonfinite = 1;
    return;
  }
  c->sxx += x * x;
  c->syy += r * r;
  c->sxy += x * r;
  c->sdd += d * d;
  if (fabs(d) > c->maxd) c->maxd = fabs(d);
  if (fabs(r) > c->maxr) c->maxr = fabs(r);
  c->n++;
}

static double cmp_rel(const cmp *c) {
  return c->syy > 0 ? sqrt(c->sdd / c->syy) : sqrt(c->sdd);
}
static double cmp_diff(const cmp *c) { /* DeepGEMM's calc_diff */
  double den = c->sxx + c->syy;
  return den > 0 ? 1.0 - 2.0 * c->sxy / den : 0.0;
}
static double cmp_maxrel(const cmp *c) {
  return c->maxr > 0 ? c->maxd / c->maxr : c->maxd;
}

enum { C_OUT, C_DX, C_DWD, C_DWGU, C_COUNT };
static const char *cmp_names[C_COUNT] = {"out", "dx", "dW down", "dW gate/up"};
/* Bounds the run must meet (FP8 e4m3 1x128 / 128x128 with bf16 activations: the measured relative
 * error is about 6-7% after the two chained GEMMs and the SwiGLU, DeepGEMM's diff about 2e-3;
 * a wrong kernel gives errors of order 1). */
static const double bound_rel = 0.10, bound_diff = 0.006;

typedef struct check {
  int64_t n;       /* checked tokens */
  int64_t *slot;   /* [T]: index in the checked subset, or -1 */
  int64_t *toks;   /* [n] */
  int64_t agree;   /* tokens whose fp64 top-k set equals xte's */
  int64_t wexpert; /* expert whose weight gradients are checked (-1: none) */
  cmp c[C_COUNT];
  int have[C_COUNT];
  double t;
} check;

static int64_t busiest_expert(const layer *L) {
  int64_t e, best = 0;
  for (e = 1; e < L->E; e++)
    if (L->tpe[e] > L->tpe[best]) best = e;
  return best;
}

typedef struct refctx {
  const layer *L;
  check *ck;
  double *Wgu, *Wd, *X, *Hh, *A, *Y, *dYp, *dA, *dH, *dX, *dWr, *dWg;
  double *out, *dx; /* [n, H] references */
  double *gp;       /* [T, E] fp64 grad probs */
  double *p64;      /* [T, E] fp64 probs */
  double *s64;      /* [T, E] fp64 sigmoid scores */
  double *Wr;       /* [E, H] */
} refctx;

static double silu_d(double g) {
  return g / (1.0 + exp(-g));
}

/* The fp64 expert on the token list tok[0..n): forward into out (subset tokens, times p), and
 * with the backward: grad probs (routed), dx (subset), and the weight gradients when wexp. */
static void ref_expert(refctx *c, int64_t n, const int64_t *tok, int64_t e, int shared, int wexp) {
  const layer *L = c->L;
  int64_t H = L->H, F = L->F, E = L->E, i, j;
  for (i = 0; i < n; i++)
    for (j = 0; j < H; j++) c->X[i * H + j] = (double)moe_bf16_to_f32(L->x[tok[i] * H + j]);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)(2 * F), (int)H, 1.0, c->X,
              (int)H, c->Wgu, (int)H, 0.0, c->Hh, (int)(2 * F));
  for (i = 0; i < n; i++)
    for (j = 0; j < F; j++)
      c->A[i * F + j] = silu_d(c->Hh[i * 2 * F + j]) * c->Hh[i * 2 * F + F + j];
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)H, (int)F, 1.0, c->A, (int)F,
              c->Wd, (int)F, 0.0, c->Y, (int)H);
  for (i = 0; i < n; i++) {
    int64_t s = c->ck->slot[tok[i]];
    double p = shared ? 1.0 : c->p64[tok[i] * E + e];
    if (s >= 0)
      for (j = 0; j < H; j++) c->out[s * H + j] += p * c->Y[i * H + j];
  }
  if (!L->bwd) return;
  for (i = 0; i < n; i++) {
    int64_t t = tok[i];
    double p = shared ? 1.0 : c->p64[t * E + e], g = 0;
    for (j = 0; j < H; j++) {
      double d = (double)moe_bf16_to_f32(L->dy[t * H + j]);
      g += d * c->Y[i * H + j];
      c->dYp[i * H + j] = p * d;
    }
    if (!shared) c->gp[t * E + e] = g;
  }
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)F, (int)H, 1.0, c->dYp,
              (int)H, c->Wd, (int)F, 0.0, c->dA, (int)F);
  for (i = 0; i < n; i++)
    for (j = 0; j < F; j++) {
      double g = c->Hh[i * 2 * F + j], u = c->Hh[i * 2 * F + F + j], da = c->dA[i * F + j];
      double sg = 1.0 / (1.0 + exp(-g));
      c->dH[i * 2 * F + j] = da * u * sg * (1.0 + g * (1.0 - sg));
      c->dH[i * 2 * F + F + j] = da * g * sg;
    }
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)H, (int)(2 * F), 1.0, c->dH,
              (int)(2 * F), c->Wgu, (int)H, 0.0, c->dX, (int)H);
  for (i = 0; i < n; i++) {
    int64_t s = c->ck->slot[tok[i]];
    if (s >= 0)
      for (j = 0; j < H; j++) c->dx[s * H + j] += c->dX[i * H + j];
  }
  if (wexp) {
    const float *lwd = L->dWd + e * H * F, *lwg = L->dWgu + e * 2 * F * H;
    int64_t r0, nr;
    for (r0 = 0; r0 < H; r0 += DW_CHUNK) { /* dW down rows r0.. = dYp[:, r0..]^T A */
      nr = H - r0 < DW_CHUNK ? H - r0 : DW_CHUNK;
      cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nr, (int)F, (int)n, 1.0,
                  c->dYp + r0, (int)H, c->A, (int)F, 0.0, c->dWr, (int)F);
      for (i = 0; i < nr * F; i++) cmp_add(&c->ck->c[C_DWD], (double)lwd[r0 * F + i], c->dWr[i]);
    }
    for (r0 = 0; r0 < 2 * F; r0 += DW_CHUNK) { /* dW gate/up rows r0.. = dH[:, r0..]^T X */
      nr = 2 * F - r0 < DW_CHUNK ? 2 * F - r0 : DW_CHUNK;
      cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nr, (int)H, (int)n, 1.0, c->dH + r0,
                  (int)(2 * F), c->X, (int)H, 0.0, c->dWg, (int)H);
      for (i = 0; i < nr * H; i++) cmp_add(&c->ck->c[C_DWGU], (double)lwg[r0 * H + i], c->dWg[i]);
    }
    c->ck->have[C_DWD] = c->ck->have[C_DWGU] = 1;
  }
}

static int run_check(layer *L, check *ck) {
  int64_t T = L->T, H = L->H, F = L->F, E = L->E, k = L->k, n = L->o.check_tokens, i, j, e;
  int64_t nmax = T; /* an expert's token list (the busiest: all its tokens) */
  membook mb;
  refctx c;
  int64_t *list;
  double t0 = now_s();
  memset(ck, 0, sizeof *ck);
  memset(&mb, 0, sizeof mb);
  memset(&c, 0, sizeof c);
  c.L = L;
  c.ck = ck;
  ck->n = n;
  ck->wexpert = L->bwd ? busiest_expert(L) : -1;
  ck->slot = (int64_t *)mem(&mb, (size_t)T * 8, CAT_CHECK);
  ck->toks = (int64_t *)mem(&mb, (size_t)n * 8, CAT_CHECK);
  list = (int64_t *)mem(&mb, (size_t)T * 8, CAT_CHECK);
  c.Wgu = (double *)mem(&mb, (size_t)(2 * F * H) * 8, CAT_CHECK);
  c.Wd = (double *)mem(&mb, (size_t)(H * F) * 8, CAT_CHECK);
  c.X = (double *)mem(&mb, (size_t)(nmax * H) * 8, CAT_CHECK);
  c.Hh = (double *)mem(&mb, (size_t)(nmax * 2 * F) * 8, CAT_CHECK);
  c.A = (double *)mem(&mb, (size_t)(nmax * F) * 8, CAT_CHECK);
  c.Y = (double *)mem(&mb, (size_t)(nmax * H) * 8, CAT_CHECK);
  c.out = (double *)mem(&mb, (size_t)(n * H) * 8, CAT_CHECK);
  c.p64 = (double *)mem(&mb, (size_t)(T * E) * 8, CAT_CHECK);
  c.s64 = (double *)mem(&mb, (size_t)(T * E) * 8, CAT_CHECK);
  c.Wr = (double *)mem(&mb, (size_t)(E * H) * 8, CAT_CHECK);
  if (L->bwd) {
    c.dYp = (double *)mem(&mb, (size_t)(nmax * H) * 8, CAT_CHECK);
    c.dA = (double *)mem(&mb, (size_t)(nmax * F) * 8, CAT_CHECK);
    c.dH = (double *)mem(&mb, (size_t)(nmax * 2 * F) * 8, CAT_CHECK);
    c.dX = (double *)mem(&mb, (size_t)(nmax * H) * 8, CAT_CHECK);
    c.dx = (double *)mem(&mb, (size_t)(n * H) * 8, CAT_CHECK);
    c.gp = (double *)mem(&mb, (size_t)(T * E) * 8, CAT_CHECK);
    c.dWr = (double *)mem(&mb, (size_t)(DW_CHUNK * F) * 8, CAT_CHECK);
    c.dWg = (double *)mem(&mb, (size_t)(DW_CHUNK * H) * 8, CAT_CHECK);
  }
  if (mb.failed) {
    mem_free_all(&mb);
    fprintf(stderr, "xte moe: out of memory for the fp64 check (--check-tokens 0 skips it)\n");
    return -1;
  }
  for (i = 0; i < T; i++) ck->slot[i] = -1;
  for (i = 0; i < n; i++) {
    ck->toks[i] = i * T / n;
    ck->slot[ck->toks[i]] = i;
  }
  /* Router in fp64 on every token (the weight-gradient check needs all tokens of an expert):
   * the selection is xte's (the routing map); the fp64 top-k is compared with it. */
  fill(NULL, c.Wr, NULL, (size_t)(E * H), L->o.seed, S_WR, w_scale(H));
  for (i = 0; i < T; i++) {
    double D = 0;
    int64_t sel = 0, agree = 1;
    for (e = 0; e < E; e++) {
      double l = 0;
      const uint16_t *xr = L->x + i * H;
      const double *wr = c.Wr + e * H;
      for (j = 0; j < H; j++) l += (double)moe_bf16_to_f32(xr[j]) * wr[j];
      c.s64[i * E + e] = 1.0 / (1.0 + exp(-l));
      if (L->map[i * E + e]) D += c.s64[i * E + e];
    }
    for (e = 0; e < E; e++) /* normalised over the top-k when k > 1 */
      c.p64[i * E + e] = !L->map[i * E + e] ? 0.0
                         : k > 1            ? (double)L->o.scaling * c.s64[i * E + e] / (D + 1e-20)
                                            : (double)L->o.scaling * c.s64[i * E + e];
    /* fp64 top-k by score + bias: the same set iff every selected expert beats every other */
    for (e = 0; e < E; e++) {
      int64_t f;
      if (!L->map[i * E + e]) continue;
      sel++;
      for (f = 0; f < E; f++)
        if (!L->map[i * E + f] &&
            c.s64[i * E + f] + (double)L->bias[f] > c.s64[i * E + e] + (double)L->bias[e])
          agree = 0;
    }
    if (sel != k) agree = 0;
    ck->agree += agree;
  }
  /* shared expert */
  if (L->shared) {
    fill(NULL, c.Wgu, NULL, (size_t)(2 * F * H), L->o.seed, S_SGU, w_scale(H));
    fill(NULL, c.Wd, NULL, (size_t)(H * F), L->o.seed, S_SD, w_scale(F));
    ref_expert(&c, n, ck->toks, -1, 1, 0);
  }
  /* routed experts, one at a time */
  for (e = 0; e < E; e++) {
    int64_t m = 0, wexp = e == ck->wexpert;
    for (i = 0; i < T; i++)
      if (L->map[i * E + e] && (wexp || ck->slot[i] >= 0)) list[m++] = i;
    if (m == 0) continue;
    fill(NULL, c.Wgu, NULL, (size_t)(2 * F * H), L->o.seed, (uint64_t)(S_EXPERT0 + 2 * e),
         w_scale(H));
    fill(NULL, c.Wd, NULL, (size_t)(H * F), L->o.seed, (uint64_t)(S_EXPERT0 + 2 * e + 1),
         w_scale(F));
    ref_expert(&c, m, list, e, 0, (int)wexp);
    progress("fp64 check: expert %lld / %lld", (long long)(e + 1), (long long)E);
  }
  /* router backward (subset tokens) and the gate's dgrad */
  if (L->bwd) {
    for (i = 0; i < n; i++) {
      int64_t t = ck->toks[i];
      double D = 0, dot = 0;
      double sc = (double)L->o.scaling;
      for (e = 0; e < E; e++)
        if (L->map[t * E + e]) {
          D += c.s64[t * E + e];
          dot += sc * c.gp[t * E + e] * c.s64[t * E + e];
        }
      D += 1e-20;
      for (e = 0; e < E; e++) {
        double s, gs, dl;
        if (!L->map[t * E + e]) continue;
        s = c.s64[t * E + e];
        gs = k > 1 ? (sc * c.gp[t * E + e] - dot / D) / D : sc * c.gp[t * E + e];
        dl = gs * s * (1.0 - s);
        for (j = 0; j < H; j++) c.dx[i * H + j] += dl * c.Wr[e * H + j];
      }
    }
  }
  for (i = 0; i < n; i++) {
    int64_t t = ck->toks[i];
    for (j = 0; j < H; j++)
      cmp_add(&ck->c[C_OUT], (double)moe_bf16_to_f32(L->out[t * H + j]), c.out[i * H + j]);
    if (L->bwd)
      for (j = 0; j < H; j++) cmp_add(&ck->c[C_DX], (double)L->dx[t * H + j], c.dx[i * H + j]);
  }
  ck->have[C_OUT] = 1;
  ck->have[C_DX] = L->bwd;
  ck->t = now_s() - t0;
  mem_free_all(&mb);
  return 0;
}

static int check_pass(const check *ck) {
  int i;
  for (i = 0; i < C_COUNT; i++)
    if (ck->have[i] && (ck->c[i].nonfinite || !(cmp_rel(&ck->c[i]) <= bound_rel) ||
                        !(cmp_diff(&ck->c[i]) <= bound_diff)))
      return 0;
  return 1;
}

/* ================================================================== report */

static double step_rate(const step *s, double t, const char **unit) {
  if (s->kind == K_MEM) {
    *unit = "GB/s";
    return t > 0 ? s->bytes / t * 1e-9 : 0;
  }
  *unit = "GFLOP/s";
  return t > 0 ? s->flops / t * 1e-9 : 0;
}

typedef struct totals {
  double fwd, bwd, all, gemm8, gemm32, gemm8_flops;
} totals;

static totals sum_steps(const layer *L, int iters) {
  totals t;
  int i;
  memset(&t, 0, sizeof t);
  for (i = 0; i < NSTEPS; i++) {
    const step *s = &L->steps[i];
    double ts = s->t / iters;
    if (!s->name) continue;
    if (s->bwd)
      t.bwd += ts;
    else
      t.fwd += ts;
    if (s->kind == K_GEMM8) {
      t.gemm8 += ts;
      t.gemm8_flops += s->flops;
    }
    if (s->kind == K_GEMM32) t.gemm32 += ts;
  }
  t.all = t.fwd + t.bwd;
  return t;
}

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else
      putchar(*s);
  }
  putchar('"');
}

static void print_json(const layer *L, const check *ck, double avail, double t_total) {
  int i, first = 1;
  totals t = sum_steps(L, L->o.iters);
  printf("{\"command\": \"moe\", \"preset\": ");
  json_str(L->o.preset);
  printf(
      ",\n \"config\": {\"tokens\": %lld, \"experts\": %lld, \"hidden\": %lld, \"ffn\": %lld, "
      "\"topk\": %lld, \"shared\": %d, \"scaling\": %.6g, \"recipe\": \"%s\", "
      "\"backend\": \"%s\", \"isa\": \"%s\", \"threads\": %d, \"backward\": %d, "
      "\"routed_rows\": %lld, \"permuted_rows\": %lld, \"align\": %lld, \"iters\": %d, "
      "\"seed\": %llu},\n",
      (long long)L->T, (long long)L->E, (long long)L->H, (long long)L->F, (long long)L->k,
      L->shared, (double)L->o.scaling, recipe_names[L->o.recipe], xte_backend_name(XTE_BACKEND_CPU),
      xte_cpu_isa_name(xte_cpu_get_isa()), xte_cpu_get_num_threads(), L->bwd, (long long)L->Nr,
      (long long)L->R, (long long)L->align, L->o.iters, (unsigned long long)L->o.seed);
  printf(" \"forward_only_reason\": ");
  json_str(L->why_fwd);
  printf(",\n \"memory\": {\"estimate_bytes\": %.0f, \"mem_available_bytes\": %.0f",
         mem_peak(&L->mb), avail);
  for (i = 0; i < CAT_COUNT; i++) {
    printf(", ");
    json_str(cat_names[i]);
    printf(": %.0f", L->mb.bytes[i]);
  }
  printf("},\n \"kernels\": [");
  for (i = 0; i < NSTEPS; i++) {
    const step *s = &L->steps[i];
    const char *unit;
    double ts = s->t / L->o.iters, r;
    if (!s->name) continue;
    r = step_rate(s, ts, &unit);
    printf("%s\n  {\"name\": ", first ? "" : ",");
    json_str(s->name);
    printf(
        ", \"phase\": \"%s\", \"kind\": \"%s\", \"time_s\": %.6e, \"share\": %.6f, "
        "\"flops\": %.6e, \"executed_flops\": %.6e, \"bytes\": %.6e, \"rate\": %.6g, "
        "\"unit\": \"%s\"}",
        s->bwd ? "backward" : "forward",
        s->kind == K_GEMM8    ? "gemm_fp8"
        : s->kind == K_GEMM32 ? "gemm_fp32"
                              : "memory",
        ts, t.all > 0 ? ts / t.all : 0, s->flops, s->xflops > 0 ? s->xflops : s->flops, s->bytes, r,
        unit);
    first = 0;
  }
  printf(
      "\n ],\n \"totals\": {\"forward_s\": %.6e, \"backward_s\": %.6e, \"layer_s\": %.6e, "
      "\"gemm_fp8_s\": %.6e, \"gemm_fp8_share\": %.6f, \"gemm_fp8_gflops\": %.6g, "
      "\"gemm_all_share\": %.6f, \"setup_s\": %.6e, \"check_s\": %.6e, \"run_s\": %.6e},\n",
      t.fwd, t.bwd, t.all, t.gemm8, t.all > 0 ? t.gemm8 / t.all : 0,
      t.gemm8 > 0 ? t.gemm8_flops / t.gemm8 * 1e-9 : 0,
      t.all > 0 ? (t.gemm8 + t.gemm32) / t.all : 0, L->t_setup, ck ? ck->t : 0, t_total);
  printf(" \"numerics\": ");
  if (!ck) {
    printf("null\n}\n");
    return;
  }
  printf(
      "{\"checked_tokens\": %lld, \"topk_agree_tokens\": %lld, \"wgrad_expert\": %lld, "
      "\"bound_rel\": %g, \"bound_diff\": %g, \"pass\": %s, \"tensors\": [",
      (long long)ck->n, (long long)ck->agree, (long long)ck->wexpert, bound_rel, bound_diff,
      check_pass(ck) ? "true" : "false");
  first = 1;
  for (i = 0; i < C_COUNT; i++) {
    const cmp *c = &ck->c[i];
    if (!ck->have[i]) continue;
    printf("%s\n  {\"name\": ", first ? "" : ",");
    json_str(cmp_names[i]);
    printf(
        ", \"elements\": %lld, \"rel_err\": %.6e, \"max_err_over_max_ref\": %.6e, "
        "\"diff\": %.6e, \"nonfinite\": %d}",
        (long long)c->n, cmp_rel(c), cmp_maxrel(c), cmp_diff(c), c->nonfinite);
    first = 0;
  }
  printf("\n ]}\n}\n");
}

static void print_table(const layer *L, const check *ck, double avail, double t_total) {
  int i, ph;
  totals t = sum_steps(L, L->o.iters);
  xte_backend_info bi;
  memset(&bi, 0, sizeof bi);
  (void)xte_get_backend_info(&bi);
  printf("xte moe: one MoE layer %s, preset %s\n", L->bwd ? "forward + backward" : "forward only",
         L->o.preset);
  if (L->why_fwd[0]) printf("  (forward only: %s)\n", L->why_fwd);
  printf(
      "  shapes    hidden %lld, expert FFN %lld (SwiGLU), %lld routed experts%s, top-%lld "
      "sigmoid router + expert bias, scaling %.4g, %lld shared expert\n",
      (long long)L->H, (long long)L->F, (long long)L->E,
      L->E == 384 && L->H == 7168 && L->F == 2048 ? " (all of Kimi-K2's)"
                                                  : (L->E < 384 ? " (Kimi-K2 has 384)" : ""),
      (long long)L->k, (double)L->o.scaling, (long long)L->shared);
  printf(
      "  tokens    %lld; routed rows %lld (%.1f per expert), permuted rows %lld (each expert "
      "padded to %lld%s)\n",
      (long long)L->T, (long long)L->Nr, (double)L->Nr / (double)L->E, (long long)L->R,
      (long long)L->align, L->bwd ? ": the k-grouped wgrad runs on the padded rows" : "");
  printf(
      "  recipe    %s: e4m3, 1x128 activations / grads, 128x128 weights, COMPACT scales, bf16 "
      "activations, fp32 weight grads\n",
      recipe_names[L->o.recipe]);
  printf("  backend   cpu (%s, %d threads; %s), %d timed run%s%s\n",
         xte_cpu_isa_name(xte_cpu_get_isa()), xte_cpu_get_num_threads(), bi.cpu_name, L->o.iters,
         L->o.iters > 1 ? "s (mean)" : "", L->o.warmup ? " after warm-up" : "");
  printf("  memory    peak estimate %.2f GiB (", GiB(mem_peak(&L->mb)));
  for (i = 0; i < CAT_COUNT; i++)
    printf("%s%s %.2f", i ? ", " : "", cat_names[i], GiB(L->mb.bytes[i]));
  printf("), MemAvailable %.2f GiB\n", GiB(avail));
  printf(
      "  setup     buffers allocated and touched in %.2f s; synthetic weights generated and "
      "quantized in %.2f s (neither is part of the layer)\n\n",
      L->t_alloc, L->t_setup);
  printf("  %-9s %-42s %10s %7s %10s\n", "phase", "kernel", "time ms", "share", "rate");
  for (ph = 0; ph < 2; ph++) {
    for (i = 0; i < NSTEPS; i++) {
      const step *s = &L->steps[i];
      const char *unit;
      double ts = s->t / L->o.iters, r;
      if (!s->name || s->bwd != ph) continue;
      r = step_rate(s, ts, &unit);
      printf("  %-9s %-42s %10.2f %6.1f%% %10.2f %s", ph ? "backward" : "forward", s->name,
             ts * 1e3, t.all > 0 ? 100 * ts / t.all : 0, r, unit);
      if (s->xflops > s->flops && ts > 0) printf("  (%.2f on the padded K)", s->xflops / ts * 1e-9);
      printf("\n");
    }
    printf("  %-9s %-42s %10.2f %6.1f%%\n", ph ? "backward" : "forward", "total",
           (ph ? t.bwd : t.fwd) * 1e3, t.all > 0 ? 100 * (ph ? t.bwd : t.fwd) / t.all : 0);
  }
  printf("  %-9s %-42s %10.2f %6.1f%%\n\n", "layer", "total", t.all * 1e3, 100.0);
  printf(
      "  GEMMs: FP8 GEMMs (xte) %.1f%% of the layer's time (target >= 85%%), %.2f GFLOP/s "
      "over them; with the fp32 router GEMMs %.1f%%\n",
      t.all > 0 ? 100 * t.gemm8 / t.all : 0, t.gemm8 > 0 ? t.gemm8_flops / t.gemm8 * 1e-9 : 0,
      t.all > 0 ? 100 * (t.gemm8 + t.gemm32) / t.all : 0);
  if (!ck) {
    printf("\n  numerics: not checked (--check-tokens 0)\n");
  } else {
    printf(
        "\n  numerics against fp64 (the same layer from the unquantized inputs: bf16 x and "
        "grad, fp32 master weights; OpenBLAS dgemm + libm):\n");
    printf(
        "    checked %lld of %lld tokens (evenly spaced: token i * %lld / %lld)%s; routing: "
        "xte's top-%lld (the fp64 top-%lld set agrees on %lld of %lld tokens)\n",
        (long long)ck->n, (long long)L->T, (long long)L->T, (long long)ck->n,
        ck->n < L->T ? " to keep the check fast" : "", (long long)L->k, (long long)L->k,
        (long long)ck->agree, (long long)L->T);
    if (ck->wexpert >= 0)
      printf("    weight gradients: expert %lld, the busiest (%lld tokens, all of them)\n",
             (long long)ck->wexpert, (long long)L->tpe[ck->wexpert]);
    printf("    %-12s %12s %12s %18s %14s\n", "tensor", "elements", "rel err", "max err/max|ref|",
           "diff");
    for (i = 0; i < C_COUNT; i++) {
      const cmp *c = &ck->c[i];
      if (!ck->have[i]) continue;
      printf("    %-12s %12lld %12.3e %18.3e %14.3e%s\n", cmp_names[i], (long long)c->n, cmp_rel(c),
             cmp_maxrel(c), cmp_diff(c), c->nonfinite ? "  NON-FINITE" : "");
    }
    printf(
        "    rel err = ||xte - ref|| / ||ref||; diff = 1 - 2 sum(xte ref) / sum(xte^2 + "
        "ref^2) (DeepGEMM)\n");
    printf("  numerics: %s (bounds: rel err <= %g, diff <= %g); fp64 check took %.2f s\n",
           check_pass(ck) ? "PASS" : "FAIL", bound_rel, bound_diff, ck->t);
  }
  printf("  run: %.2f s in all\n", t_total);
}

/* ================================================================== main */

int xte_cmd_moe(int argc, char **argv);
int xte_cmd_moe(int argc, char **argv) {
  moe_opts o;
  layer *L;
  double avail, need, t_start = now_s();
  int rc, it, ret = 1;
  check ck;
  int have_check = 0;
  xte_status st;

  rc = parse_opts(argc, argv, &o);
  if (rc == 1) return 0;
  if (rc) return 2;
  if (o.ep > 0) { /* hand over to tools/moe_ep.c */
    xte_moe_ep_opts e = {.ep = (int)o.ep,
                         .tokens = o.tokens,
                         .experts = o.experts,
                         .hidden = o.hidden,
                         .ffn = o.ffn,
                         .topk = o.topk,
                         .shared = (int)o.shared,
                         .scaling = o.scaling,
                         .recipe = (int)o.recipe,
                         .threads = o.threads,
                         .isa = o.isa,
                         .backward = o.backward != 0,
                         .seed = o.seed,
                         .iters = o.iters,
                         .warmup = o.warmup,
                         .quiet = o.quiet};
    return xte_moe_ep_main(&e);
  }

  prog.t0 = t_start;
  prog.last = 0;
  prog.tty = isatty(2);
  prog.on = !o.quiet;

  if (o.isa >= 0 && (st = xte_cpu_set_isa((xte_cpu_isa)o.isa)) != XTE_SUCCESS) {
    fprintf(stderr, "xte moe: --isa %s: %s: %s\n", xte_cpu_isa_name((xte_cpu_isa)o.isa),
            xte_status_string(st), xte_last_error());
    return 2;
  }
  if (o.threads > 0 && (st = xte_cpu_set_num_threads(o.threads)) != XTE_SUCCESS) {
    fprintf(stderr, "xte moe: --threads %d: %s: %s\n", o.threads, xte_status_string(st),
            xte_last_error());
    return 2;
  }
  openblas_set_num_threads(xte_cpu_get_num_threads());

  L = (layer *)calloc(1, sizeof *L);
  if (!L) return 1;
  L->o = o;
  if (o.backend == XTE_BACKEND_CUDA || o.backend == XTE_BACKEND_MUSA) {
    xte_stream s = NULL;
    st = xte_stream_create((xte_backend)o.backend, 0, NULL, &s);
    if (st != XTE_SUCCESS) {
      fprintf(stderr, "xte moe: --backend %s: %s: %s\n", xte_backend_name((xte_backend)o.backend),
              xte_status_string(st), xte_last_error());
    } else {
      fprintf(stderr,
              "xte moe: --backend %s: not supported yet: this command stages the synthetic data, "
              "the group sizes and the fp64 check in host memory, and the router / permute / "
              "SwiGLU kernels are CPU-only in this build; use --backend cpu\n",
              xte_backend_name((xte_backend)o.backend));
      xte_stream_destroy(s);
    }
    free(L);
    return 2;
  }
  /* auto and cpu: the CPU backend (the only one with the MoE kernels in this build) */
  if ((st = xte_stream_create(XTE_BACKEND_CPU, 0, NULL, &L->st)) != XTE_SUCCESS) {
    fprintf(stderr, "xte moe: CPU stream: %s: %s\n", xte_status_string(st), xte_last_error());
    free(L);
    return 1;
  }
  L->T = o.tokens;
  L->H = o.hidden;
  L->F = o.ffn;
  L->E = o.experts;
  L->k = o.topk;
  L->shared = (int)o.shared;
  L->Nr = L->T * L->k;
  L->bwd = o.backward != 0;
  L->rcfg = xte_router_config_default();
  L->rcfg.topk = (int)L->k;
  L->rcfg.score_function = XTE_ROUTER_SIGMOID;
  L->rcfg.scaling_factor = o.scaling;

  /* ---------------------------------------------------------------- phase A: routing */
  L->mb.dry = 1;
  alloc_inputs(L);
  need = mem_peak(&L->mb);
  avail = mem_available();
  if (avail > 0 && need > avail) {
    fprintf(stderr,
            "xte moe: the inputs alone need %.2f GiB, MemAvailable is %.2f GiB: lower --tokens\n",
            GiB(need), GiB(avail));
    goto out;
  }
  memset(&L->mb, 0, sizeof L->mb);
  alloc_inputs(L);
  if (L->mb.failed) {
    fprintf(stderr, "xte moe: out of memory for the inputs: lower --tokens\n");
    goto out;
  }
  {
    double t0 = now_s();
    int64_t i;
    fill(NULL, NULL, L->x, (size_t)(L->T * L->H), o.seed, S_X, 1.0f);
    for (i = 0; i < L->T * L->H; i++) L->xf[i] = moe_bf16_to_f32(L->x[i]);
    fill(L->Wr, NULL, NULL, (size_t)(L->E * L->H), o.seed, S_WR, w_scale(L->H));
    fill(L->bias, NULL, NULL, (size_t)L->E, o.seed, S_BIAS, 0.1f);
    if (L->bwd) fill(NULL, NULL, L->dy, (size_t)(L->T * L->H), o.seed, S_DY, 1.0f);
    router_gate(L);
    if ((st = router_fwd(L)) != XTE_SUCCESS) {
      fprintf(stderr, "xte moe: router: %s: %s\n", xte_status_string(st), xte_last_error());
      goto out;
    }
    L->t_routing = now_s() - t0;
  }
  /* rows of the permuted activations, for the padding the backward needs (128) or none */
  {
    xte_tensor mapt = T2(L->map, XTE_DTYPE_UINT8, L->T, L->E);
    xte_moe_routing rt;
    xte_permute_config pc;
    int64_t e, i, r1 = 0, r128 = 0;
    memset(&rt, 0, sizeof rt);
    rt.routing_map = &mapt;
    rt.num_experts = L->E;
    pc.num_out_tokens = -1;
    for (e = 0; e < L->E; e++) L->tpe[e] = 0;
    for (i = 0; i < L->T * L->E; i++)
      if (L->map[i]) L->tpe[i % L->E]++;
    pc.align = 1;
    if ((st = xte_moe_permute_rows(&rt, &pc, &r1, L->st)) != XTE_SUCCESS ||
        (pc.align = 128, st = xte_moe_permute_rows(&rt, &pc, &r128, L->st)) != XTE_SUCCESS) {
      fprintf(stderr, "xte moe: permute rows: %s: %s\n", xte_status_string(st), xte_last_error());
      goto out;
    }
    /* ---------------------------------------------------------------- memory estimate */
    {
      layer D = *L;
      double fwd_need, full_need;
      memset(&D.mb, 0, sizeof D.mb);
      D.mb.dry = 1;
      D.bwd = 0;
      D.R = r1;
      D.align = 1;
      alloc_inputs(&D);
      alloc_layer(&D);
      D.mb.bytes[CAT_CHECK] += check_bytes(&D);
      fwd_need = mem_peak(&D.mb);
      memset(&D.mb, 0, sizeof D.mb);
      D.mb.dry = 1;
      D.bwd = 1;
      D.R = r128;
      D.align = 128;
      alloc_inputs(&D);
      alloc_layer(&D);
      D.mb.bytes[CAT_CHECK] += check_bytes(&D);
      full_need = mem_peak(&D.mb);
      avail = mem_available();
      if (o.backward < 0 && avail > 0 && full_need > 0.92 * avail && fwd_need <= 0.92 * avail) {
        L->bwd = 0; /* auto: forward only where memory is short */
        snprintf(L->why_fwd, sizeof L->why_fwd,
                 "the backward needs %.2f GiB (its fp32 weight gradients alone %.2f GiB), "
                 "MemAvailable is %.2f GiB (--experts lowers it)",
                 GiB(full_need), GiB(D.mb.bytes[CAT_WGRAD]), GiB(avail));
        if (!o.json) fprintf(stderr, "xte moe: forward only: %s\n", L->why_fwd);
      }
      if (!L->bwd) {
        L->R = r1;
        L->align = 1;
      } else {
        L->R = r128;
        L->align = 128;
      }
    }
  }
  /* the run's estimate: phase A (allocated) + phase B + the check */
  {
    layer D = *L;
    memset(&D.mb, 0, sizeof D.mb);
    D.mb.dry = 1;
    alloc_inputs(&D);
    alloc_layer(&D);
    D.mb.bytes[CAT_CHECK] += check_bytes(&D);
    need = mem_peak(&D.mb);
    avail = mem_available();
    if (avail > 0 && need > 0.92 * avail) {
      double per_e = 3.0 * (double)L->H * (double)L->F * (L->bwd ? 13.0 : 1.0);
      fprintf(stderr,
              "xte moe: not enough memory: this run needs about %.2f GiB (FP8 weights %.2f, fp32 "
              "weight grads %.2f, activations %.2f, fp64 check %.2f), MemAvailable is %.2f GiB.\n"
              "  Each routed expert costs %.3f GiB%s: lower --experts (now %lld)%s, or --tokens "
              "(now %lld)%s.\n",
              GiB(need), GiB(D.mb.bytes[CAT_WEIGHT]), GiB(D.mb.bytes[CAT_WGRAD]),
              GiB(D.mb.bytes[CAT_ACT]), GiB(D.mb.bytes[CAT_CHECK]), GiB(avail), GiB(per_e),
              L->bwd ? " with the backward (FP8 weights + fp32 weight gradients)" : "",
              (long long)L->E, L->bwd ? ", or add --forward-only" : "", (long long)L->T,
              L->o.check_tokens ? ", or --check-tokens 0" : "");
      ret = 2;
      goto out;
    }
  }
  {
    double t0 = now_s();
    alloc_layer(L);
    L->t_alloc = now_s() - t0;
  }
  L->mb.bytes[CAT_CHECK] += check_bytes(L);
  if (L->mb.failed) {
    fprintf(stderr, "xte moe: out of memory allocating %.2f GiB: lower --experts or --tokens%s\n",
            GiB(mem_peak(&L->mb)), L->bwd ? " or add --forward-only" : "");
    ret = 2;
    goto out;
  }
  /* ---------------------------------------------------------------- weights */
  {
    double t0 = now_s();
    if (quantize_experts(L, &L->Wgu, L->E, 2 * L->F, L->H, S_EXPERT0, 2, w_scale(L->H),
                         "gate/up") ||
        quantize_experts(L, &L->Wd, L->E, L->H, L->F, S_EXPERT0 + 1, 2, w_scale(L->F), "down"))
      goto out;
    if (L->shared &&
        (quantize_experts(L, &L->Wsgu, 1, 2 * L->F, L->H, S_SGU, 0, w_scale(L->H),
                          "shared gate/up") ||
         quantize_experts(L, &L->Wsd, 1, L->H, L->F, S_SD, 0, w_scale(L->F), "shared down")))
      goto out;
    L->t_setup = now_s() - t0 + L->t_routing;
  }
  define_steps(L);
  /* ---------------------------------------------------------------- the layer */
  for (it = 0; it < o.warmup; it++)
    if (run_layer(L, 0)) goto out;
  for (it = 0; it < o.iters; it++)
    if (run_layer(L, 1)) goto out;
  /* ---------------------------------------------------------------- fp64 check */
  if (o.check_tokens > 0) {
    mem_free_cat(&L->mb, CAT_WEIGHT); /* the check regenerates the weights in fp64 */
    mem_free_cat(&L->mb, CAT_ACT);
    if (run_check(L, &ck)) goto out;
    have_check = 1;
  }
  progress_done();
  if (o.json)
    print_json(L, have_check ? &ck : NULL, avail, now_s() - t_start);
  else
    print_table(L, have_check ? &ck : NULL, avail, now_s() - t_start);
  ret = have_check && !check_pass(&ck) ? 1 : 0;
out:
  progress_done();
  mem_free_all(&L->mb);
  if (L->st) xte_stream_destroy(L->st);
  free(L);
  return ret;
}
