/* `xte bench device` (bench/gpu_device.c, bench/gpu_device_check.c): the CUDA backend's checks
 * and timings for tests/device/run.sh, through the public API only (no benchmark library, no CUDA
 * runtime of its own: the plugin's streams and memory). What its two files share. */
#ifndef XTE_BENCH_GPU_DEVICE_H
#define XTE_BENCH_GPU_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xte/xte.h>

/* argv[0] is "device"; the exit status (0 the table was printed, 77 "SKIPPED: ..." without a
 * CUDA device, 1 an op failed, 2 usage). */
int xte_bench_device(int argc, char **argv);

#define CHECK(call)                                                                    \
  do {                                                                                 \
    xte_status st_ = (call);                                                           \
    if (st_ != XTE_SUCCESS) {                                                          \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, xte_last_error()); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

/* gpu_device.c: the clock, the plugin's report, XTE_DEVICE_BENCH_SMALL */
double gdev_now(void);
const char *gdev_rep_take(void);
void gdev_rep_values(const char *rep, const char *key, char *out, size_t size);
extern int gdev_small;

/* A stream on CUDA device 0 into *gpu: 0, or 77 after printing "SKIPPED: no usable CUDA device"
 * when there is none (any other failure exits 1, as CHECK does) */
int gdev_open(xte_stream *gpu);

/* Frees the ndev device buffers dev on gpu (NULL ones skipped) and the nhost host buffers host */
void gdev_release(xte_stream gpu, void *const *dev, int ndev, void *const *host, int nhost);
#define GDEV_N(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The timed GEMM's device operands: A [M, K] in 1x128 blocks and B [N, K] in 128x128 blocks,
 * e4m3 codes (a, b) with TE_BLOCK fp32 scales (sa, sb) in one layout, D [M, N] bf16 (d) */
typedef struct gdev_gemm_ops {
  void *a, *sa, *b, *sb, *d;
  xte_qtensor qa, qb;
  xte_tensor D;
} gdev_gemm_ops;
/* allocates the buffers of o on gpu and describes them in o->qa, o->qb, o->D */
void gdev_gemm_ops_make(xte_stream gpu, int64_t M, int64_t N, int64_t K, xte_scale_layout layout,
                        gdev_gemm_ops *o);
void gdev_gemm_ops_free(xte_stream gpu, gdev_gemm_ops *o);

/* gpu_device_check.c: the modes that compare the device's bytes with the CPU's */
int gdev_attn_main(int argc, char **argv);
int gdev_fast_main(int argc, char **argv);
int gdev_gemm_main(int argc, char **argv);

#endif /* XTE_BENCH_GPU_DEVICE_H */
