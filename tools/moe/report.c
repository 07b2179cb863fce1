/* `xte moe`: the report (tools/moe/moe.h): the kernel table or one JSON object, with the
 * layer's shape, memory, setup, GEMM share and the numerics against fp64. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "moe.h"

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
    else if ((unsigned char)*s < 0x20)
      printf("\\u%04x", (unsigned)(unsigned char)*s);
    else
      putchar(*s);
  }
  putchar('"');
}

void print_json(const layer *L, const check *ck, double avail, double t_total) {
  int i, first = 1;
  totals t = sum_steps(L, L->o.iters);
  printf("{\"command\": \"moe\", \"preset\": ");
  json_str(L->o.preset);
  /* the machine record every benchmark writes (bench/bench_common.h), under the key `xte bench
   * --json` gives it: scripts/perf_tables.py renders this report beside the benches' */
  printf(",\n \"context\": {");
  for (i = 0; i < xte_bench_machine_count(); i++) {
    printf("%s\n  ", i ? "," : "");
    json_str(xte_bench_machine_key(i));
    printf(": ");
    json_str(xte_bench_machine_value(i));
  }
  {
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S+00:00", gmtime(&now));
    printf(",\n  \"date\": \"%s\"}", date); /* when the report was written, UTC */
  }
  printf(
      ",\n \"config\": {\"tokens\": %lld, \"experts\": %lld, \"hidden\": %lld, \"ffn\": %lld, "
      "\"topk\": %lld, \"shared\": %d, \"scaling\": %.6g, \"recipe\": \"%s\", "
      "\"backend\": \"%s\", \"isa\": \"%s\", \"threads\": %d, \"backward\": %d, "
      "\"routed_rows\": %lld, \"permuted_rows\": %lld, \"align\": %lld, \"iters\": %d, "
      "\"seed\": %llu, \"mode\": \"%s\"},\n",
      (long long)L->T, (long long)L->E, (long long)L->H, (long long)L->F, (long long)L->k,
      L->shared, (double)L->o.scaling, moe_recipe_names[L->o.recipe],
      xte_backend_name(XTE_BACKEND_CPU), xte_cpu_isa_name(xte_cpu_get_isa()),
      xte_cpu_get_num_threads(), L->bwd, (long long)L->Nr, (long long)L->R, (long long)L->align,
      L->o.iters, (unsigned long long)L->o.seed, L->o.mode == XTE_GEMM_FAST ? "fast" : "exact");
  printf(" \"forward_only_reason\": ");
  json_str(L->why_fwd);
  printf(",\n \"memory\": {\"estimate_bytes\": %.0f, \"mem_available_bytes\": %.0f",
         mem_peak(&L->mb), avail);
  for (i = 0; i < CAT_COUNT; i++) {
    printf(", ");
    json_str(moe_cat_names[i]);
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
      "\"gemm_all_share\": %.6f, \"setup_s\": %.6e, \"alloc_s\": %.6e, \"weights_s\": %.6e, "
      "\"check_s\": %.6e, \"run_s\": %.6e, \"setup_cpu_s\": %.6e, \"layer_cpu_s\": %.6e},\n",
      t.fwd, t.bwd, t.all, t.gemm8, t.all > 0 ? t.gemm8 / t.all : 0,
      t.gemm8 > 0 ? t.gemm8_flops / t.gemm8 * 1e-9 : 0,
      t.all > 0 ? (t.gemm8 + t.gemm32) / t.all : 0, L->t_setup, L->t_alloc, L->t_weights,
      ck ? ck->t : 0, t_total, L->c_setup, L->c_layer);
  if (L->o.checksum)
    printf(" \"checksum\": {\"weights\": \"%016llx\", \"outputs\": \"%016llx\"},\n",
           (unsigned long long)L->sum_weights, (unsigned long long)L->sum_outputs);
  printf(" \"numerics\": ");
  if (!ck) {
    printf("null\n}\n");
    return;
  }
  printf(
      "{\"checked_tokens\": %lld, \"topk_agree_tokens\": %lld, \"wgrad_expert\": %lld, "
      "\"bound_rel\": %g, \"bound_diff\": %g, \"pass\": %s, \"tensors\": [",
      (long long)ck->n, (long long)ck->agree, (long long)ck->wexpert, ck->bound_rel, ck->bound_diff,
      check_pass(ck) ? "true" : "false");
  first = 1;
  for (i = 0; i < C_COUNT; i++) {
    const cmp *c = &ck->c[i];
    if (!ck->have[i]) continue;
    printf("%s\n  {\"name\": ", first ? "" : ",");
    json_str(moe_cmp_names[i]);
    printf(
        ", \"elements\": %lld, \"rel_err\": %.6e, \"max_err_over_max_ref\": %.6e, "
        "\"diff\": %.6e, \"nonfinite\": %d}",
        (long long)c->n, cmp_rel(c), cmp_maxrel(c), cmp_diff(c), c->nonfinite);
    first = 0;
  }
  printf("\n ]}\n}\n");
}

void print_table(const layer *L, const check *ck, double avail, double t_total) {
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
      "activations, fp32 weight grads; GEMM mode %s\n",
      moe_recipe_names[L->o.recipe], L->o.mode == XTE_GEMM_FAST ? "fast" : "exact");
  printf("  backend   cpu (%s, %d threads; %s), %d timed run%s%s\n",
         xte_cpu_isa_name(xte_cpu_get_isa()), xte_cpu_get_num_threads(), bi.cpu_name, L->o.iters,
         L->o.iters > 1 ? "s (mean)" : "", L->o.warmup ? " after warm-up" : "");
  printf("  memory    peak estimate %.2f GiB (", GiB(mem_peak(&L->mb)));
  for (i = 0; i < CAT_COUNT; i++)
    printf("%s%s %.2f", i ? ", " : "", moe_cat_names[i], GiB(L->mb.bytes[i]));
  printf("), MemAvailable %.2f GiB\n", GiB(avail));
  printf(
      "  setup     %.2f s before the layer, none of it timed: buffers allocated in %.2f s (the FP8 "
      "weights' pages faulted in by their generation), inputs + routing %.2f s, synthetic "
      "FP8 weights (codes + block scales) made in %.2f s; CPU time (all threads) %.2f s in the "
      "setup, %.2f s in the layer\n",
      L->t_alloc + L->t_setup, L->t_alloc, L->t_routing, L->t_weights, L->c_setup, L->c_layer);
  if (L->o.checksum)
    printf(
        "  checksum  FP8 weights + scales %016llx; outputs%s %016llx (FNV-1a; the outputs also "
        "depend on OpenBLAS's sgemm: the router logits)\n",
        (unsigned long long)L->sum_weights, L->bwd ? " + gradients" : "",
        (unsigned long long)L->sum_outputs);
  printf("\n");
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
        "\n  numerics against fp64 (the same layer from the unquantized inputs, bf16 x and "
        "grad, and the FP8 weights dequantized exactly; OpenBLAS dgemm + libm):\n");
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
      printf("    %-12s %12lld %12.3e %18.3e %14.3e%s\n", moe_cmp_names[i], (long long)c->n,
             cmp_rel(c), cmp_maxrel(c), cmp_diff(c), c->nonfinite ? "  NON-FINITE" : "");
    }
    printf(
        "    rel err = ||xte - ref|| / ||ref||; diff = 1 - 2 sum(xte ref) / sum(xte^2 + "
        "ref^2) (DeepGEMM)\n");
    printf("  numerics: %s (bounds: rel err <= %g, diff <= %g); fp64 check took %.2f s\n",
           check_pass(ck) ? "PASS" : "FAIL", ck->bound_rel, ck->bound_diff, ck->t);
  }
  printf("  run: %.2f s in all\n", t_total);
}
