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

/* gpu_device_check.c: the modes that compare the device's bytes with the CPU's */
int gdev_attn_main(int argc, char **argv);
int gdev_fast_main(int argc, char **argv);
int gdev_gemm_main(int argc, char **argv);

#endif /* XTE_BENCH_GPU_DEVICE_H */
