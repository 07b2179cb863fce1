/* The benchmark suites, as an X-macro list.
 *
 * Convention: a suite <name> is one file bench/bench_<name>.c (any C identifier but "common",
 * which holds the shared helpers of bench/bench_common.h) that defines
 *     void xte_bench_suite_<name>(void);
 * registering its cases with xte_bench_register() (bench/xte_bench.h). Nothing else is edited:
 * bench/CMakeLists.txt globs bench/bench_*.c and generates "xte_bench_suites.inc" in the build
 * tree, one line per suite, sorted by name:
 *     XTE_BENCH_SUITE(gemm)
 *     XTE_BENCH_SUITE(quantize)
 * A file that does not define its entry point yet is left out of the list (with a CMake
 * warning) instead of breaking the build.
 *
 * Use: define XTE_BENCH_SUITE(name), include "xte_bench_suites.inc", undefine it. This header
 * does so once to declare every entry point, and offers xte_bench_suites[] built the same way:
 *     #define XTE_BENCH_SUITE(name) { #name, xte_bench_suite_##name },
 *     #include "xte_bench_suites.inc"
 *     #undef XTE_BENCH_SUITE
 */
#ifndef XTE_BENCH_SUITES_H
#define XTE_BENCH_SUITES_H

#ifdef __cplusplus
extern "C" {
#endif

#define XTE_BENCH_SUITE(name) void xte_bench_suite_##name(void);
#include "xte_bench_suites.inc"
#undef XTE_BENCH_SUITE

typedef struct xte_bench_suite_entry {
  const char *name;
  void (*fn)(void);
} xte_bench_suite_entry;

/* Every suite, then a { NULL, NULL } terminator. */
static const xte_bench_suite_entry xte_bench_suites[] = {
#define XTE_BENCH_SUITE(name) {#name, xte_bench_suite_##name},
#include "xte_bench_suites.inc"
#undef XTE_BENCH_SUITE
    {0, 0}};

#ifdef __cplusplus
}
#endif

#endif /* XTE_BENCH_SUITES_H */
