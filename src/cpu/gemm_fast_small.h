/* XTE_GEMM_FAST on the CPU for a few rows of A (the MoE decode case): src/cpu/gemm_fast_small.c. */
#ifndef XTE_CPU_GEMM_FAST_SMALL_H
#define XTE_CPU_GEMM_FAST_SMALL_H

#include <stddef.h>
#include <stdint.h>

#include "xte_gemm_ops.h"

/* 1 when this path takes a problem of m valid rows of the call g: g is XTE_GEMM_FAST, B's codes
 * run contiguously along K, 0 <= m <= XTE_GEMM_SK_MAXM, and the ISA in use has the kernel. */
int xte_cpu_gemm_fast_small_ok(const xte_gemm_args *g, int64_t m);
/* Workspace bytes (64-byte aligned) that xte_cpu_gemm_fast_small_run needs for any problem of g
 * with nt threads (xte_cpu_threads()). */
size_t xte_cpu_gemm_fast_small_ws(const xte_gemm_args *g, int nt);
/* Problem p of g with m valid rows (ok said yes), on the pool's threads (xte_cpu_threads()),
 * workspace ws of xte_cpu_gemm_fast_small_ws(g, xte_cpu_threads()) bytes. */
void xte_cpu_gemm_fast_small_run(const xte_gemm_args *g, const xte_gemm_problem *p, int64_t m,
                                 void *ws);

#endif /* XTE_CPU_GEMM_FAST_SMALL_H */
