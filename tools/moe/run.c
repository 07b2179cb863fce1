/* `xte moe` in one process (tools/moe/moe.h): the phases in order. Routing first (small: it
 * gives the permuted rows), then the memory estimate (forward only where the backward would not
 * fit and was not asked for), the buffers, the weights, the timed runs, the fp64 check (after
 * the FP8 weights and the activations are freed) and the report. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "synth.h"

int moe_run(const moe_opts *opts) {
  moe_opts o = *opts;
  layer *L;
  double avail, need, t_start = now_s(), c0 = cpu_s();
  int it, ret = 1;
  check ck;
  int have_check = 0;
  xte_status st;

  progress_init(t_start, !o.quiet);

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
    moe_fill_bf16(L->x, (size_t)(L->T * L->H), o.seed, S_X, 1.0f);
    for (i = 0; i < L->T * L->H; i++) L->xf[i] = xte_bf16_to_f32(L->x[i]);
    moe_fill_f32(L->Wr, (size_t)(L->E * L->H), o.seed, S_WR, moe_w_scale(L->H));
    moe_fill_f32(L->bias, (size_t)L->E, o.seed, S_BIAS, 0.1f);
    if (L->bwd) moe_fill_bf16(L->dy, (size_t)(L->T * L->H), o.seed, S_DY, 1.0f);
    router_gate(L);
    if ((st = router_fwd(L)) != XTE_SUCCESS) {
      fprintf(stderr, "xte moe: router: %s: %s\n", xte_status_string(st), xte_last_error());
      goto out;
    }
    L->t_routing = now_s() - t0;
  }
  /* rows of the permuted activations, for the padding the backward needs (128) or none */
  {
    xte_tensor mapt = xte_tensor_2d(L->map, XTE_DTYPE_UINT8, L->T, L->E);
    xte_moe_routing rt;
    xte_permute_config pc;
    int64_t e, i, r1 = 0, r128 = 0;
    memset(&rt, 0, sizeof rt);
    rt.routing_map = &mapt;
    rt.num_experts = L->E;
    pc = xte_permute_config_default();
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
    L->mb.thp = o.huge_pages;
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
    if (generate_weights(L)) goto out;
    L->t_weights = now_s() - t0;
    L->t_setup = L->t_weights + L->t_routing;
    L->c_setup = cpu_s() - c0;
  }
  define_steps(L);
  /* ---------------------------------------------------------------- the layer */
  for (it = 0; it < o.warmup; it++)
    if (run_layer(L, 0)) goto out;
  c0 = cpu_s();
  for (it = 0; it < o.iters; it++)
    if (run_layer(L, 1)) goto out;
  L->c_layer = (cpu_s() - c0) / o.iters;
  if (o.checksum) layer_checksum(L, &L->sum_weights, &L->sum_outputs);
  /* ---------------------------------------------------------------- fp64 check */
  if (o.check_tokens > 0) {
    mem_free_cat(&L->mb, CAT_WEIGHT); /* the check makes each expert's weights again */
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
