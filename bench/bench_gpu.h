/* `xte bench <suite> --backend cuda`: the suites' cases on a CUDA xte_stream, timed with CUDA
 * events, the L2 flushed between iterations, beside the anchor of the same run (a device-to-device
 * copy of the same bytes, or a vendor library's kernel of the same shape).
 *
 * No CUDA at build time: the few runtime calls the timing needs (streams, events, memset, memcpy,
 * device attributes) are resolved with dlopen("libcudart.so.13", then .so.12, then libcudart.so,
 * then /usr/local/cuda/lib64/...) when the CUDA backend is asked for, so the xte program runs on
 * machines without CUDA and says "SKIPPED: <why>" there (exit status XTE_GPU_BENCH_SKIP). The
 * kernels run through xte's own CUDA plugin (libxte_cuda.so) on an xte_stream made on the bench's
 * cudaStream_t; inputs are made on the host and copied to the device once.
 *
 * Timing of a case: setup() once (device buffers, inputs copied, one checked call), one warm-up
 * call, then iterations until min_time seconds of timed GPU time (at least 3; 2 with --smoke):
 * each iteration is [memset of a flush buffer of 2 x the L2 size] [event] run() [event], the
 * memset outside the two events. A round's time is the median of its iterations; with rounds > 1
 * a case's rate is its median round and its ratio the median of the rounds' ratios (as the CPU
 * runner, bench/shim.cc). The table has the CPU runner's columns; --json writes a report with
 * "context" (the machine record with the GPU's keys), "benchmarks" and "xte_ratios".
 *
 * Tests: XTE_BENCH_CUDART=<path> loads that library instead of the list above (a missing path:
 * the clean skip); bench/cudart_stub.c is such a library that runs on the host, for the ctest
 * tests with the host SIMT runner's plugin (tests/simt) standing in for libxte_cuda.so. */
#ifndef XTE_BENCH_GPU_H
#define XTE_BENCH_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "xte/xte.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The exit status of a run that could not use a CUDA device (tests/device/run.sh: skipped). */
#define XTE_GPU_BENCH_SKIP 77

/* Loads the CUDA runtime, checks for device `device`, makes the bench's cudaStream_t and the
 * xte_stream on it, reads the device's attributes into the machine record (bench_common.h).
 * 0: ready. XTE_GPU_BENCH_SKIP: no runtime, no device, or no xte CUDA backend; `why` says which.
 * 1: a CUDA call failed on a device that is there (`why`). smoke: tiny shapes (xte_gpu_smoke). */
int xte_gpu_bench_open(int device, int smoke, char *why, size_t why_size);

/* The bench's stream (CUDA backend), valid after xte_gpu_bench_open returned 0. */
xte_stream xte_gpu_stream(void);
/* 1 with --smoke: suites register tiny shapes (a check of the path, not of the speed). */
int xte_gpu_smoke(void);
/* The device's L2 size in bytes (0 unknown), SM count. */
size_t xte_gpu_l2_bytes(void);
int xte_gpu_sm_count(void);

/* Device memory on the bench's stream (kept to the end of the process); NULL when out of memory
 * (xte_last_error() says why). */
void *xte_gpu_alloc(size_t bytes);
/* Host to device (waits); 0 ok, else -1 (xte_last_error()). */
int xte_gpu_upload(void *dev, const void *host, size_t bytes);
/* Device-to-device copy on the bench's stream, enqueued only; 0 ok. */
int xte_gpu_copy_d2d(void *dst, const void *src, size_t bytes);
/* Waits for the bench's stream; 0 ok. */
int xte_gpu_sync(void);

/* The anchor of the GEMMs: cuBLAS's bf16 GEMM (cublasGemmEx, bf16 in and out, fp32 compute,
 * the default algorithm) on the bench's stream, libcublas.so.13 / .12 / .so loaded at run time
 * (XTE_BENCH_CUBLAS=<path>: that one). xte_gpu_cublas_open: 0 ready, else -1 with why.
 * xte_gpu_cublas_bf16_gemm: row-major D [M, N] = X [M, K] * W [N, K]^T, enqueued only. */
int xte_gpu_cublas_open(char *why, size_t why_size);
xte_status xte_gpu_cublas_bf16_gemm(int64_t M, int64_t N, int64_t K, const void *x, const void *w,
                                    void *d);

/* A case. setup(arg, why, n): once, before its first timing (0 ok, else the case FAILED with why).
 * run(arg): enqueues one iteration on xte_gpu_stream(); a status other than XTE_SUCCESS fails the
 * case with xte_last_error(). work: bytes (metric "GB/s") or flops ("TFLOP/s") per iteration.
 * anchor: the case compared with (NULL for an anchor). name and anchor are copied. */
typedef int (*xte_gpu_setup_fn)(void *arg, char *why, size_t why_size);
typedef xte_status (*xte_gpu_run_fn)(void *arg);
void xte_gpu_register(const char *name, const char *anchor, const char *metric, double work,
                      xte_gpu_setup_fn setup, xte_gpu_run_fn run, void *arg);
/* The copy anchor of a case moving `bytes` (read + written): a device-to-device cudaMemcpyAsync
 * of bytes / 2 (rounded up to 256), metric GB/s, named "copy/<bytes>B" and shared by the cases of
 * the same bytes. Returns its name (static storage). */
const char *xte_gpu_register_copy(double bytes);
/* As xte_bench_uses / xte_bench_distrust (bench/xte_bench.h) for the GPU cases. */
void xte_gpu_uses(const char *name, const char *library);
void xte_gpu_distrust(const char *library, const char *why);

/* Runs the registered cases whose name contains filter (NULL: all) and the anchors they name;
 * prints the table; writes the JSON report to json_path (NULL: none). min_time_s <= 0: 0.2 s.
 * Returns 0, or 1 when a case failed, 2 when no case matches. */
int xte_gpu_bench_run(const char *filter, const char *json_path, double min_time_s, int rounds);

/* The GPU suites: a file bench/bench_<suite>.c with GPU cases defines
 *     void xte_bench_gpu_suite_<suite>(void);
 * (registering them with xte_gpu_register, after xte_gpu_bench_open); bench/CMakeLists.txt
 * lists them in "xte_bench_gpu_suites.inc" as XTE_BENCH_GPU_SUITE(<suite>) lines (the table is
 * in tools/xte_main.c). */
#define XTE_BENCH_GPU_SUITE(name) void xte_bench_gpu_suite_##name(void);
#include "xte_bench_gpu_suites.inc"
#undef XTE_BENCH_GPU_SUITE

#ifdef __cplusplus
}
#endif

#endif /* XTE_BENCH_GPU_H */
