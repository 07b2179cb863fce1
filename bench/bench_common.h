/* Helpers shared by the benchmark suites: buffers, random data, a thread team of the same size
 * as xte's CPU pool, and the streaming-copy anchor. */
#ifndef XTE_BENCH_COMMON_H
#define XTE_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "xte/xte.h"
#include "xte_bench.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XTE_BENCH_MiB ((size_t)1 << 20)

/* Page-aligned (4 KiB; 2 MiB for buffers of 4 MiB and more, with transparent huge pages
 * advised) host memory, every page touched so no page fault lands in a timed loop. Aborts when
 * out of memory. */
void *xte_bench_alloc(size_t bytes);
void xte_bench_free(void *p);

/* Deterministic random data (splitmix64 from seed). Values are uniform in [-1, 1) times a
 * magnitude that changes every 128 elements (2^-8 .. 2^8), so block scales differ. */
void xte_bench_fill_f32(float *x, size_t n, uint64_t seed);
/* The same values as xte_bench_fill_f32, converted to dtype (fp32 / bf16 / fp16) by xte_cast. */
void xte_bench_fill(void *x, xte_dtype dtype, size_t n, uint64_t seed);

/* Threads the bench uses for its own parallel anchors: xte's pool size
 * (xte_cpu_get_num_threads()), so anchors and kernels use the same cores. */
int xte_bench_threads(void);

/* Runs fn(ctx, t, nt) on nt = xte_bench_threads() threads (the caller is t = 0; the others are
 * persistent workers pinned to CPU t, woken per call like xte's pool) and waits for all. */
typedef void (*xte_bench_team_fn)(void *ctx, int t, int nt);
void xte_bench_team_run(xte_bench_team_fn fn, void *ctx);

/* The streaming-copy anchor: memcpy of src into dst split in nt contiguous parts, one per team
 * thread (glibc's memcpy streams large copies with non-temporal stores). */
void xte_bench_parallel_copy(void *dst, const void *src, size_t bytes);

/* A ready-made anchor case: registers "copy/<label>" copying `bytes` from a buffer into another
 * (both allocated on first run, kept). Rate: 2 x bytes per iteration (read + write).
 * Returns the case name (static storage) for use as the anchor of other cases. */
const char *xte_bench_register_copy(const char *label, size_t bytes);

/* ---------------------------------------------------------------- the machine record
 * Every benchmark states the machine it ran on: CPU model (name, family / model / stepping,
 * SIMD flags), the ISA xte's kernels use, cores and threads, cache sizes, the transparent huge
 * page mode, the load average, and each anchor library's own configuration (OpenBLAS's core
 * name, threads, build config, and where its OPENBLAS_CORETYPE came from). `xte bench` prints it
 * first and records it in the JSON report's "context" (keys below).
 *
 * xte_bench_machine_setup, once, before any case is registered or timed:
 *  - OpenBLAS: when openblas_get_corename() reports a generic core (no AVX2 kernels: see
 *    bench/openblas_coretype.h) on a CPU with AVX2 / AVX-512 and OPENBLAS_CORETYPE is not set,
 *    sets OPENBLAS_CORETYPE (Cooperlake / SkylakeX / Haswell) and re-executes the program
 *    (main_argv, via /proc/self/exe; once: the marker XTE_BENCH_OPENBLAS_REEXEC holds the core
 *    OpenBLAS had picked). A user's OPENBLAS_CORETYPE is left alone and recorded. Sets
 *    OpenBLAS's threads to xte_bench_threads(). When OpenBLAS still runs a generic core on
 *    such a CPU, or its threads differ from xte's, every ratio to or from a case timing
 *    OpenBLAS is refused (xte_bench_distrust) and the record says why.
 *    main_argv NULL: no re-exec (xte bench ep, whose anchor is MPI, not OpenBLAS).
 *  - prints the record to f (NULL: not printed).
 * Does not return when it re-executes. */
void xte_bench_machine_setup(char **main_argv, FILE *f);
/* The record as key / value pairs (collected on first use): i in [0, count). */
int xte_bench_machine_count(void);
const char *xte_bench_machine_key(int i);
const char *xte_bench_machine_value(int i);
/* The value of a key, or NULL. */
const char *xte_bench_machine_get(const char *key);
/* Adds (or replaces) a key of the record: the GPU's keys of `xte bench --backend cuda`
 * (bench/bench_gpu.c: gpu_name, gpu_sm_count, gpu_l2_bytes, gpu_clock_khz, cuda_runtime, ...).
 * Builds without OpenBLAS (the GPU-only xte of bench/CMakeLists.txt, XTE_BENCH_NO_OPENBLAS)
 * record no openblas_* keys. */
void xte_bench_machine_add(const char *key, const char *value);
/* The last-level cache size in bytes (L3, else L2; 32 MiB when unknown), and the size a
 * memory-bound case uses to measure DRAM: 4 x that, at least 64 MiB, at most an eighth of the
 * available memory (MemAvailable), rounded down to a MiB. */
size_t xte_bench_llc_bytes(void);
size_t xte_bench_dram_bytes(void);
/* MemAvailable of /proc/meminfo in bytes, or -1 where it cannot be read. */
double xte_bench_mem_available(void);

#ifdef __cplusplus
}
#endif

#endif /* XTE_BENCH_COMMON_H */
