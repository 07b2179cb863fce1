/* The C face of the benchmark shim (bench/xte_bench.h) without Google Benchmark: the GPU-only
 * xte of bench/CMakeLists.txt (XTE_BENCH_GPU_ONLY, for tests/device/run.sh) links this instead of
 * bench/shim.cc. The CPU cases register into nothing; tools/xte_main.c never runs them there. */
#include <stdio.h>

#include "xte_bench.h"

int xte_bench_keep_running(xte_bench_state *st) {
  (void)st;
  return 0;
}
void xte_bench_pause(xte_bench_state *st) {
  (void)st;
}
void xte_bench_resume(xte_bench_state *st) {
  (void)st;
}
void xte_bench_set_bytes(xte_bench_state *st, double bytes_per_iter) {
  (void)st;
  (void)bytes_per_iter;
}
void xte_bench_set_flops(xte_bench_state *st, double flops_per_iter) {
  (void)st;
  (void)flops_per_iter;
}
void xte_bench_fail(xte_bench_state *st, const char *why) {
  (void)st;
  (void)why;
}
void xte_bench_register(const char *name, const char *anchor, const char *metric, xte_bench_fn fn,
                        void *arg) {
  (void)name;
  (void)anchor;
  (void)metric;
  (void)fn;
  (void)arg;
}
void xte_bench_uses(const char *name, const char *library) {
  (void)name;
  (void)library;
}
void xte_bench_distrust(const char *library, const char *why) {
  (void)library;
  (void)why;
}
int xte_bench_run(const char *filter, const char *json_path, double min_time_s, int rounds) {
  (void)filter;
  (void)json_path;
  (void)min_time_s;
  (void)rounds;
  fprintf(stderr, "xte bench: the CPU suites need Google Benchmark (a full build)\n");
  return 2;
}
