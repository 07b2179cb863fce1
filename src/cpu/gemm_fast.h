/* The CPU FAST GEMM driver (src/cpu/gemm_fast.c) and what it shares with the exact driver
 * (src/cpu/gemm_driver.c): the scale reads, the epilogue and the kept workspace. */
#ifndef XTE_CPU_GEMM_FAST_H
#define XTE_CPU_GEMM_FAST_H

#include <stddef.h>
#include <stdint.h>

#include "xte_gemm_ops.h"

/* XTE_GEMM_FAST on the CPU: each block partial in fp32 multiply-adds (the ISA's FAST kernels,
 * src/cpu/gemm_kernels.h), then the contract's steps. g->masked_m already checked. */
xte_status xte_cpu_gemm_fast(const xte_gemm_args *g);
/* 1 when a FAST call runs wholly on the exact driver (it is faster there: AMX-INT8, and for
 * some row counts of few rows VNNI; gemm_fast.c). xte_cpu_gemm_fast runs the other calls, and
 * hands those of their problems to the exact driver itself. */
int xte_cpu_gemm_fast_runs_exact(const xte_gemm_args *g);

/* The exact driver's path for a problem of few rows (gemm_driver.c, run_problem) */
typedef enum xte_cpu_sk_path {
  XTE_CPU_SK_NONE, /* not a small-M problem (0 rows, more than XTE_GEMM_SK_MAXM, no kernel) */
  XTE_CPU_SK_FP64, /* the fp64 small-M kernels */
  XTE_CPU_SK_VNNI, /* AVX512-VNNI digit products */
  XTE_CPU_SK_AMX   /* AMX-INT8 digit products */
} xte_cpu_sk_path;
/* gemm_driver.c: the path the exact driver takes for a problem of m valid rows of g */
xte_cpu_sk_path xte_cpu_gemm_exact_small_path(const xte_gemm_args *g, int64_t m);

/* gemm_driver.c: the scales of rows i0 .. i0 + nv - 1 of operand o (0 for rows nv .. width - 1;
 * width <= 64) for nblk K blocks of kstep codes from k0: out[b * width + j]. */
void xte_cpu_gemm_panel_scales(const xte_gemm_operand *o, int64_t i0, int nv, int width, int64_t k0,
                               int nblk, int64_t kstep, float *out);
/* gemm_driver.c: D[r, n0 + n] for n < len from the accumulators t[n] (overwritten): + C, + bias,
 * the output rounding, as the contract says (the exact driver's epilogue). */
void xte_cpu_gemm_store_row(const xte_gemm_args *g, int64_t r, int64_t n0, float *t, int64_t len);
/* gemm_driver.c: the kept 64-byte aligned workspace (or a private one), and its release. */
char *xte_cpu_gemm_ws_acquire(size_t bytes);
void xte_cpu_gemm_ws_release(char *p);

#endif /* XTE_CPU_GEMM_FAST_H */
