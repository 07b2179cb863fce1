/* The C face of the benchmark shim: benchmarks are written in C against this header; the shim
 * (bench/shim.cc, the only C++ in xte) runs them through Google Benchmark.
 *
 * A suite (quantize, gemm, attention, moe, ...) is a C file bench/bench_<suite>.c that defines
 *     void xte_bench_suite_<suite>(void);
 * which registers its cases with xte_bench_register(). Each case names its anchor (the
 * strongest reference on the same machine: a streaming copy, OpenBLAS, ...) so the runner can
 * print kernel / anchor ratios from the same run. Suites are listed in bench/suites.h. */
#ifndef XTE_BENCH_H
#define XTE_BENCH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct xte_bench_state xte_bench_state;
typedef void (*xte_bench_fn)(xte_bench_state *st, void *arg);

/* The timing loop: while (xte_bench_keep_running(st)) { ...one iteration... } */
int xte_bench_keep_running(xte_bench_state *st);
/* Exclude set-up work inside the loop from the timing. */
void xte_bench_pause(xte_bench_state *st);
void xte_bench_resume(xte_bench_state *st);
/* Work per iteration: bytes moved (reported as GB/s) and flops (reported as GFLOP/s). */
void xte_bench_set_bytes(xte_bench_state *st, double bytes_per_iter);
void xte_bench_set_flops(xte_bench_state *st, double flops_per_iter);
/* Marks the case failed (for example a wrong result); the runner exits non-zero. */
void xte_bench_fail(xte_bench_state *st, const char *why);

/* Registers a case. name: "quantize/1x128/bf16/64MiB"; anchor: the name of the case it is
 * compared with (NULL for an anchor itself); metric: "GB/s" or "GFLOP/s", the rate the ratio
 * compares. arg is passed to fn and owned by the suite (may be NULL). */
void xte_bench_register(const char *name, const char *anchor, const char *metric, xte_bench_fn fn,
                        void *arg);

/* Marks the registered case `name` as timing `library` (e.g. "openblas"): when that library is
 * distrusted, no ratio involving the case (as the case or as the anchor) is printed. */
void xte_bench_uses(const char *name, const char *library);
/* Distrusts `library` for this run: ratios involving its cases print "refused" and `why`
 * instead of a number (JSON: "ratio": null, "refused": why). */
void xte_bench_distrust(const char *library, const char *why);

/* Runs the registered cases whose name contains filter (NULL: all), Google Benchmark's
 * console output plus, when json_path is not NULL, its JSON report in that file; then prints
 * a table "case, rate, anchor, anchor rate, ratio". rounds (>= 1): the selected cases run that
 * many times in turn, anchors among them; each case's rate is its median round and its ratio the
 * median of the rounds' ratios (the case against the same round's anchor); the JSON report holds
 * the last round's runs and those ratios. Returns 0 on success. */
int xte_bench_run(const char *filter, const char *json_path, double min_time_s, int rounds);

#ifdef __cplusplus
}
#endif

#endif /* XTE_BENCH_H */
