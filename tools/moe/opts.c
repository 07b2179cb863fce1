/* `xte moe`: its options, presets and usage text (tools/moe/moe.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"

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
  o->huge_pages = 1;
  o->mode = XTE_GEMM_EXACT;
}

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: xte moe [--preset default|kimi-k2] [--tokens N] [--experts N] [--hidden N]\n"
      "               [--ffn N] [--topk N] [--shared 0|1] [--scaling X] [--recipe R]\n"
      "               [--backend B] [--threads N] [--isa ISA] [--forward-only | --backward]\n"
      "               [--check-tokens N] [--seed N] [--iters N] [--warmup N] [--json] [--quiet]\n"
      "               [--checksum] [--huge-pages 0|1] [--mode exact|fast]\n"
      "       mpirun -np N xte moe --ep N [shape options]\n"
      "\n"
      "One MoE layer forward and backward through xte: Kimi-K2's expert shapes (hidden 7168,\n"
      "expert FFN 2048, SwiGLU, top-8 sigmoid router with expert bias, routed scaling 2.827,\n"
      "one shared expert) with synthetic seeded weights; prints the time and rate of every\n"
      "kernel, the GEMMs' share of the layer's time and a numerics report against an fp64\n"
      "execution of the same layer from the unquantized inputs and the same FP8 weights\n"
      "(random e4m3 codes and block scales made directly from the seed: tools/moe/synth.h).\n"
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
      "  --mode M          exact (default) or fast: the mode of every FP8 GEMM of the layer\n"
      "                    (XTE_GEMM_EXACT / XTE_GEMM_FAST); fast widens the fp64 check's bounds\n"
      "                    by the FAST bound (docs/numerics.md section 6)\n"
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
      "                    checked byte for byte against the one-process layer (tools/moe/ep.c)\n"
      "  --quiet           no progress line\n"
      "  --huge-pages 0|1  transparent huge pages for the FP8 weights (default 1: their first\n"
      "                    touch, most of the setup, costs less)\n"
      "  --checksum        print FNV-1a hashes of the FP8 weights (with their scales) and of the\n"
      "                    layer's outputs and gradients: the bytes, for regression tests\n");
}

const char *const moe_recipe_names[8] = {"te_current",     "te_delayed", "te_block", "deepgemm",
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

int moe_parse_opts(int argc, char **argv, moe_opts *o) {
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
    INTOPT("--huge-pages", 0, 1, huge_pages)
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
      for (k = 0; k < (int)(sizeof moe_recipe_names / sizeof *moe_recipe_names); k++)
        if (strcmp(s, moe_recipe_names[k]) == 0) found = k;
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
    } else if (is_opt(a, "--mode")) {
      if (!(s = opt_value(argc, argv, &i, "--mode"))) return 2;
      if (strcmp(s, "exact") == 0)
        o->mode = XTE_GEMM_EXACT;
      else if (strcmp(s, "fast") == 0)
        o->mode = XTE_GEMM_FAST;
      else {
        fprintf(stderr, "xte moe: --mode '%s': want exact or fast\n", s);
        return 2;
      }
    } else if (strcmp(a, "--forward-only") == 0) {
      o->backward = 0;
    } else if (strcmp(a, "--backward") == 0) {
      o->backward = 1;
    } else if (strcmp(a, "--json") == 0) {
      o->json = 1;
    } else if (strcmp(a, "--checksum") == 0) {
      o->checksum = 1;
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
