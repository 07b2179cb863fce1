/* xte_isa_digest: a fingerprint of the bytes every CPU operator of the public API writes.
 *
 * Each case calls one entry point on deterministic inputs (its own xorshift generator seeded from
 * the case's name, so adding a case never changes another; the quantize sweep shares its inputs,
 * seeded from their shape and dtype) and prints
 *     <case-name> <FNV-1a 64 of the status code and of every output byte, padding included>
 * or, for a combination the API refuses (enumerated on purpose, so that the set is visible),
 *     <case-name> UNSUPPORTED <status>
 * and last `TOTAL <FNV-1a 64 of every line above>`. Output buffers are filled with a fixed
 * pattern before each call, so bytes a call leaves alone (padding rows, scale padding) count too.
 * Covered: quantize (every scaling mode x recipe x scale layout, each copy, e4m3 / e5m2, from fp32
 * / bf16 / fp16, config variants), dequantize, cast, the exact GEMM (dense: every scaling pair,
 * dtype pair, transpose, epilogue, scale layout, small and large M; grouped: contiguous, masked,
 * K), attention forward / backward (BSHD / SBHD / THD, masks, windows, softcap, ALiBi, GQA, fp32 /
 * bf16 / fp16, e4m3 forward), the MoE router, aux scores and loss, token movement, SwiGLU (+
 * quantize), one-rank expert parallelism, and through two test hooks of src/ (weak: absent ones
 * are listed UNSUPPORTED) the attention past its cache limits and the vector exp.
 *
 * The numerics contract (docs/numerics.md) says the output is the same on every CPU ISA and thread
 * count: tests/isa_digest_check.sh (ctest isa_digest_identity) runs this program under each ISA
 * (xte_isa_run), with 1, 2 and 3 threads and on the other kernel paths, and diffs the lines. Run
 * before and after a change of src/cpu/, it shows every case whose bytes changed.
 * The ISA and the thread count come from the environment (XTE_CPU_ISA, XTE_NUM_THREADS), as for
 * any caller; they are reported on stderr only (with each group's time), so that stdout is the
 * same everywhere.
 *
 * Usage: xte_isa_digest [--small] [--dump CASE] [--filter SUBSTR] [--time]
 *   --small         fewer and smaller cases (the ctest run)
 *   --dump CASE     after CASE's line, print its outputs element by element
 *                   ("<buffer>[<index>] <hex> <value>"): diff two ISAs' dumps to find the first
 *                   differing element
 *   --filter SUBSTR print only the cases whose name contains SUBSTR (all cases still run; the TOTAL
 *                   line then covers the printed lines only)
 *   --time          each case's seconds on stderr
 * Exit status: 0; 1 when a call that must succeed failed (printed as "<case> FAILED ...") or a
 * case name repeats.
 */
#define _POSIX_C_SOURCE 200809L
#include "digest.h"

/* ================================================================== main */

int main(int argc, char **argv) {
  int i;
  double t0, t;
  char tot[64];
  static const struct {
    const char *name;
    void (*fn)(void);
  } groups[] = {
      {"quantize", quantize_cases},    {"cast", cast_cases},           {"gemm", gemm_cases},
      {"gemm_grouped", grouped_cases}, {"attention", attention_cases}, {"router", router_cases},
      {"permute", permute_cases},      {"swiglu", swiglu_cases},       {"ep", ep_cases},
      {"internal", internal_cases}};
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--small"))
      g_small = 1;
    else if (!strcmp(argv[i], "--time"))
      g_time = 1;
    else if (!strcmp(argv[i], "--dump") && i + 1 < argc)
      g_dump = argv[++i];
    else if (!strcmp(argv[i], "--filter") && i + 1 < argc)
      g_filter = argv[++i];
    else {
      fprintf(stderr,
              "usage: xte_isa_digest [--small] [--dump CASE] [--filter SUBSTR] [--time]\n"
              "  prints '<case> <FNV-1a 64 of its outputs>' per case and 'TOTAL <hash>'\n");
      return 2;
    }
  }
  fprintf(stderr, "xte_isa_digest: isa %s, %d threads, %s set\n",
          xte_cpu_isa_name(xte_cpu_get_isa()), xte_cpu_get_num_threads(),
          g_small ? "small" : "default");
  t0 = now_s();
  for (i = 0; i < (int)(sizeof groups / sizeof groups[0]); i++) {
    double ts = now_s();
    groups[i].fn();
    fflush(stdout);
    fprintf(stderr, "xte_isa_digest: %-13s %7.3f s\n", groups[i].name, now_s() - ts);
  }
  t = now_s() - t0;
  snprintf(tot, sizeof tot, "%016llx", (unsigned long long)g_total);
  printf("TOTAL %s\n", tot);
  fprintf(stderr, "xte_isa_digest: %d cases (%d unsupported), %.3f s, isa %s%s\n", g_lines,
          g_unsupported, t, xte_cpu_isa_name(xte_cpu_get_isa()), g_failed ? ", FAILURES" : "");
  return g_failed ? 1 : 0;
}
