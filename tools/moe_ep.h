/* `xte moe --ep N` (tools/moe_ep.c): the MoE layer of `xte moe` with its routed experts split
 * over the N ranks of MPI_COMM_WORLD (xte_ep_dispatch / combine and their backwards around the
 * local experts' grouped GEMMs), checked byte for byte against the one-process layer. */
#ifndef XTE_TOOLS_MOE_EP_H
#define XTE_TOOLS_MOE_EP_H

#include <stdint.h>

/* The options `xte moe` parsed (tools/moe/opts.c checks their ranges; moe_ep.c checks what EP
 * adds). */
typedef struct xte_moe_ep_opts {
  int ep;                                     /* ranks asked for (--ep N) */
  int64_t tokens, experts, hidden, ffn, topk; /* the layer's shape (all tokens, all experts) */
  int shared;                                 /* --shared (not part of the EP run: a note) */
  float scaling;                              /* the router's routed scaling factor */
  int recipe;                                 /* xte_recipe: te_block, deepgemm, ... */
  int threads;                                /* --threads (0: cores / ranks per rank) */
  int isa;                                    /* xte_cpu_isa, -1 auto */
  int backward;                               /* 0: --forward-only */
  uint64_t seed;
  int iters, warmup, quiet;
} xte_moe_ep_opts;

/* Runs the check on every rank (MPI_Init when MPI is not initialised yet, MPI_Finalize then).
 * Returns the exit status: 0 when every rank matched the one-process layer, 1 on a mismatch or
 * a failure, 2 on a usage error (N not the communicator's size, experts not divisible by N; or
 * the program was built without MPI). */
int xte_moe_ep_main(const xte_moe_ep_opts *o);

#endif /* XTE_TOOLS_MOE_EP_H */
