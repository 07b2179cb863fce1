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

/* --isa, --threads, --backend; the layer with its CPU stream and shape. NULL (*ret: the exit
 * status) on a failure. */
static layer *run_open(const moe_opts *o, int *ret) {
  layer *L;
  xte_status st;
  *ret = 2;
  if (o->isa >= 0 && (st = xte_cpu_set_isa((xte_cpu_isa)o->isa)) != XTE_SUCCESS) {
    fprintf(stderr, "xte moe: --isa %s: %s: %s\n", xte_cpu_isa_name((xte_cpu_isa)o->isa),
            xte_status_string(st), xte_last_error());
    return NULL;
  }
  if (o->threads > 0 && (st = xte_cpu_set_num_threads(o->threads)) != XTE_SUCCESS) {
    fprintf(stderr, "xte moe: --threads %d: %s: %s\n", o->threads, xte_status_string(st),
            xte_last_error());
    return NULL;
  }
  openblas_set_num_threads(xte_cpu_get_num_threads());

  *ret = 1;
  L = (layer *)calloc(1, sizeof *L);
  if (!L) return NULL;
  L->o = *o;
  if (o->backend == XTE_BACKEND_CUDA || o->backend == XTE_BACKEND_MUSA) {
    xte_stream s = NULL;
    st = xte_stream_create((xte_backend)o->backend, 0, NULL, &s);
    if (st != XTE_SUCCESS) {
      fprintf(stderr, "xte moe: --backend %s: %s: %s\n", xte_backend_name((xte_backend)o->backend),
              xte_status_string(st), xte_last_error());
    } else {
      fprintf(stderr,
              "xte moe: --backend %s: not supported yet: this command stages the synthetic data, "
              "the group sizes and the fp64 check in host memory, and the router / permute / "
              "SwiGLU kernels are CPU-only in this build; use --backend cpu\n",
              xte_backend_name((xte_backend)o->backend));
      xte_stream_destroy(s);
    }
    free(L);
    *ret = 2;
    return NULL;
  }
  /* auto and cpu: the CPU backend (the only one with the MoE kernels in this build) */
  if ((st = xte_stream_create(XTE_BACKEND_CPU, 0, NULL, &L->st)) != XTE_SUCCESS) {
    fprintf(stderr, "xte moe: CPU stream: %s: %s\n", xte_status_string(st), xte_last_error());
    free(L);
    return NULL;
  }
  L->T = o->tokens;
  L->H = o->hidden;
  L->F = o->ffn;
  L->E = o->experts;
  L->k = o->topk;
  L->shared = (int)o->shared;
  L->Nr = L->T * L->k;
  L->bwd = o->backward != 0;
  L->rcfg = xte_router_config_default();
  L->rcfg.topk = (int)L->k;
  L->rcfg.score_function = XTE_ROUTER_SIGMOID;
  L->rcfg.scaling_factor = o->scaling;
  return L;
}

/* Phase A: the inputs (allocated and filled) and the routing. 0 ok. */
static int run_routing(layer *L, double *avail) {
  const moe_opts *o = &L->o;
  double need, t0;
  int64_t i;
  xte_status st;
  L->mb.dry = 1;
  alloc_inputs(L);
  need = mem_peak(&L->mb);
  *avail = xte_bench_mem_available();
  if (*avail > 0 && need > *avail) {
    fprintf(stderr,
            "xte moe: the inputs alone need %.2f GiB, MemAvailable is %.2f GiB: lower --tokens\n",
            GiB(need), GiB(*avail));
    return -1;
  }
  memset(&L->mb, 0, sizeof L->mb);
  alloc_inputs(L);
  if (L->mb.failed) {
    fprintf(stderr, "xte moe: out of memory for the inputs: lower --tokens\n");
    return -1;
  }
  t0 = now_s();
  moe_fill_bf16(L->x, (size_t)(L->T * L->H), o->seed, S_X, 1.0f);
  for (i = 0; i < L->T * L->H; i++) L->xf[i] = xte_bf16_to_f32(L->x[i]);
  moe_fill_f32(L->Wr, (size_t)(L->E * L->H), o->seed, S_WR, moe_w_scale(L->H));
  moe_fill_f32(L->bias, (size_t)L->E, o->seed, S_BIAS, 0.1f);
  if (L->bwd) moe_fill_bf16(L->dy, (size_t)(L->T * L->H), o->seed, S_DY, 1.0f);
  router_gate(L);
  if ((st = router_fwd(L)) != XTE_SUCCESS) {
    fprintf(stderr, "xte moe: router: %s: %s\n", xte_status_string(st), xte_last_error());
    return -1;
  }
  L->t_routing = now_s() - t0;
  return 0;
}

/* Peak memory of L's run with the backward on or off and R permuted rows (dry). */
static double run_need(const layer *L, int bwd, int64_t R, int64_t align, double *wgrad) {
  layer D = *L;
  memset(&D.mb, 0, sizeof D.mb);
  D.mb.dry = 1;
  D.bwd = bwd;
  D.R = R;
  D.align = align;
  alloc_inputs(&D);
  alloc_layer(&D);
  D.mb.bytes[CAT_CHECK] += check_bytes(&D);
  if (wgrad) *wgrad = D.mb.bytes[CAT_WGRAD];
  return mem_peak(&D.mb);
}

/* The permuted rows (padded to 128 with the backward, none without); forward only where the
 * backward would not fit and was not asked for. 0 ok. */
static int run_rows(layer *L, double *avail) {
  xte_tensor mapt = xte_tensor_2d(L->map, XTE_DTYPE_UINT8, L->T, L->E);
  xte_moe_routing rt;
  xte_permute_config pc;
  int64_t e, i, r1 = 0, r128 = 0;
  double fwd_need, full_need, wgrad;
  xte_status st;
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
    return -1;
  }
  fwd_need = run_need(L, 0, r1, 1, NULL);
  full_need = run_need(L, 1, r128, 128, &wgrad);
  *avail = xte_bench_mem_available();
  if (L->o.backward < 0 && *avail > 0 && full_need > 0.92 * *avail && fwd_need <= 0.92 * *avail) {
    L->bwd = 0; /* auto: forward only where memory is short */
    snprintf(L->why_fwd, sizeof L->why_fwd,
             "the backward needs %.2f GiB (its fp32 weight gradients alone %.2f GiB), "
             "MemAvailable is %.2f GiB (--experts lowers it)",
             GiB(full_need), GiB(wgrad), GiB(*avail));
    if (!L->o.json) fprintf(stderr, "xte moe: forward only: %s\n", L->why_fwd);
  }
  L->R = L->bwd ? r128 : r1;
  L->align = L->bwd ? 128 : 1;
  return 0;
}

/* The run's estimate (phase A allocated + phase B + the check) against MemAvailable, then phase
 * B's buffers. 0 ok; otherwise the exit status. */
static int run_alloc(layer *L, double *avail) {
  layer D = *L;
  double need, t0;
  memset(&D.mb, 0, sizeof D.mb);
  D.mb.dry = 1;
  alloc_inputs(&D);
  alloc_layer(&D);
  D.mb.bytes[CAT_CHECK] += check_bytes(&D);
  need = mem_peak(&D.mb);
  *avail = xte_bench_mem_available();
  if (*avail > 0 && need > 0.92 * *avail) {
    double per_e = 3.0 * (double)L->H * (double)L->F * (L->bwd ? 13.0 : 1.0);
    fprintf(stderr,
            "xte moe: not enough memory: this run needs about %.2f GiB (FP8 weights %.2f, fp32 "
            "weight grads %.2f, activations %.2f, fp64 check %.2f), MemAvailable is %.2f GiB.\n"
            "  Each routed expert costs %.3f GiB%s: lower --experts (now %lld)%s, or --tokens "
            "(now %lld)%s.\n",
            GiB(need), GiB(D.mb.bytes[CAT_WEIGHT]), GiB(D.mb.bytes[CAT_WGRAD]),
            GiB(D.mb.bytes[CAT_ACT]), GiB(D.mb.bytes[CAT_CHECK]), GiB(*avail), GiB(per_e),
            L->bwd ? " with the backward (FP8 weights + fp32 weight gradients)" : "",
            (long long)L->E, L->bwd ? ", or add --forward-only" : "", (long long)L->T,
            L->o.check_tokens ? ", or --check-tokens 0" : "");
    return 2;
  }
  t0 = now_s();
  L->mb.thp = L->o.huge_pages;
  alloc_layer(L);
  L->t_alloc = now_s() - t0;
  L->mb.bytes[CAT_CHECK] += check_bytes(L);
  if (L->mb.failed) {
    fprintf(stderr, "xte moe: out of memory allocating %.2f GiB: lower --experts or --tokens%s\n",
            GiB(mem_peak(&L->mb)), L->bwd ? " or add --forward-only" : "");
    return 2;
  }
  return 0;
}

/* The warmup and the timed runs (CPU time per layer in c_layer). 0 ok. */
static int run_timed(layer *L) {
  int it;
  double c0;
  for (it = 0; it < L->o.warmup; it++)
    if (run_layer(L, 0)) return -1;
  c0 = cpu_s();
  for (it = 0; it < L->o.iters; it++)
    if (run_layer(L, 1)) return -1;
  L->c_layer = (cpu_s() - c0) / L->o.iters;
  return 0;
}

int moe_run(const moe_opts *o) {
  layer *L;
  double avail = -1, t_start = now_s(), c0 = cpu_s(), t0;
  int ret = 1, rc, have_check = 0;
  check ck;

  progress_init(t_start, !o->quiet);
  L = run_open(o, &ret);
  if (!L) return ret;
  if (run_routing(L, &avail) || run_rows(L, &avail)) goto out;
  if ((rc = run_alloc(L, &avail)) != 0) {
    ret = rc;
    goto out;
  }
  t0 = now_s();
  if (generate_weights(L)) goto out;
  L->t_weights = now_s() - t0;
  L->t_setup = L->t_weights + L->t_routing;
  L->c_setup = cpu_s() - c0;
  define_steps(L);
  if (run_timed(L)) goto out;
  if (o->checksum) layer_checksum(L, &L->sum_weights, &L->sum_outputs);
  if (o->check_tokens > 0) {          /* the fp64 check */
    mem_free_cat(&L->mb, CAT_WEIGHT); /* the check makes each expert's weights again */
    mem_free_cat(&L->mb, CAT_ACT);
    if (run_check(L, &ck)) goto out;
    have_check = 1;
  }
  progress_done();
  if (o->json)
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
