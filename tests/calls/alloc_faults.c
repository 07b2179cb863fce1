/* Allocation-failure injection over every entry point (tests/calls/calls.c), with 1 and with 3
 * pool threads, on every CPU ISA the machine and build can run (only XTE_CPU_ISA's when that is
 * set). For each case: a reference run (no failure) records the output bytes; then for
 * n = 0, 1, 2, ...: the outputs are filled with a sentinel, allocation n is made to fail
 * (src/alloc.c's test hook), and the call runs. When fewer than n + 1 allocations were attempted
 * the failure never triggered: the call must succeed with the reference bytes, and the case ends.
 * Otherwise the call must return XTE_ERROR_OUT_OF_MEMORY with a message and every output byte
 * still the sentinel, or (a fallback that recovered) XTE_SUCCESS with exactly the reference
 * bytes. Anything else is a failure naming the case, n and the first changed byte.
 *
 * Usage: test_alloc_faults [case-name substring]. Exit 0: all passed; 1: a failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calls.h"

/* Test hooks of src/alloc.c (exported, declared in src/xte_internal.h, not installed). */
XTE_API void xte_internal_fail_alloc(int64_t nth);
XTE_API int64_t xte_internal_alloc_count(void);
/* src/cpu/gemm_driver.c: frees the GEMM packing workspace it keeps between calls, so the next
 * call allocates it again (and that allocation can be failed too). */
XTE_API void xte_internal_gemm_release_workspace(void);

#define MAX_REPORTS 4 /* failure messages printed per case and thread count */
#define MAX_N 100000  /* no case makes this many allocations */

static int report(int *nrep, const char *fmt, const char *name, int threads, long long n) {
  if ((*nrep)++ < MAX_REPORTS) printf(fmt, name, threads, n);
  return 1;
}

static void describe_byte(const calls_ctx *c, const uint8_t *ref, int o, size_t off) {
  const uint8_t *p = (const uint8_t *)c->out[o].p;
  size_t base = 0;
  int i;
  for (i = 0; i < o; i++) base += c->out[i].bytes;
  printf("    first changed byte: output '%s' byte %zu of %zu: 0x%02x, sentinel 0x%02x",
         c->out[o].name, off, c->out[o].bytes, p[off], calls_sentinel(o, off));
  if (ref) printf(", reference 0x%02x", ref[base + off]);
  printf("\n");
}

/* One case at one thread count (and the current ISA); returns the number of failures. */
static int run_case(int ci, int threads) {
  const calls_case *k = &calls_table[ci];
  calls_ctx c;
  uint8_t *ref;
  xte_status st;
  int64_t allocs, max_allocs, n, oom = 0, recovered = 0;
  int bad = 0, nrep = 0, o;
  size_t off;
  if (calls_setup(ci, &c)) {
    printf("FAIL %-28s threads %d: setup failed\n", k->name, threads);
    return 1;
  }
  ref = (uint8_t *)malloc(calls_out_bytes(&c) + 1);
  calls_fill_sentinel(&c);
  xte_internal_gemm_release_workspace();
  xte_internal_fail_alloc(-1);
  st = k->run(&c);
  allocs = xte_internal_alloc_count();
  if (st != XTE_SUCCESS) {
    printf("FAIL %-28s threads %d: the reference run returned %s (%s)\n", k->name, threads,
           xte_status_string(st), xte_last_error());
    free(ref);
    calls_free(&c);
    return 1;
  }
  calls_snapshot(&c, ref);
  max_allocs = allocs;
  for (n = 0; n < MAX_N; n++) {
    int64_t cnt;
    const char *msg;
    calls_fill_sentinel(&c);
    xte_internal_gemm_release_workspace();
    xte_internal_fail_alloc(n);
    st = k->run(&c);
    msg = xte_last_error();
    cnt = xte_internal_alloc_count();
    xte_internal_fail_alloc(-1);
    if (cnt > max_allocs) max_allocs = cnt;
    if (cnt <= n) { /* allocation n was never reached: a plain successful call */
      if (st != XTE_SUCCESS) {
        bad += report(&nrep, "FAIL %-28s threads %d n %lld: no allocation failed, yet ", k->name,
                      threads, (long long)n);
        if (nrep <= MAX_REPORTS) printf("%s (%s)\n", xte_status_string(st), msg);
      } else if (calls_compare(&c, ref, &o, &off) >= 0) {
        bad += report(&nrep,
                      "FAIL %-28s threads %d n %lld: no allocation failed, yet the bytes "
                      "differ from the reference run\n",
                      k->name, threads, (long long)n);
        if (nrep <= MAX_REPORTS) describe_byte(&c, ref, o, off);
      }
      break;
    }
    if (st == XTE_ERROR_OUT_OF_MEMORY) {
      oom++;
      if (!msg || !*msg)
        bad += report(&nrep,
                      "FAIL %-28s threads %d n %lld: XTE_ERROR_OUT_OF_MEMORY with an empty "
                      "xte_last_error()\n",
                      k->name, threads, (long long)n);
      if (calls_check_sentinel(&c, &o, &off) >= 0) {
        bad += report(&nrep,
                      "FAIL %-28s threads %d n %lld: XTE_ERROR_OUT_OF_MEMORY after an "
                      "output was written\n",
                      k->name, threads, (long long)n);
        if (nrep <= MAX_REPORTS) describe_byte(&c, ref, o, off);
      }
    } else if (st == XTE_SUCCESS) {
      recovered++;
      if (calls_compare(&c, ref, &o, &off) >= 0) {
        bad += report(&nrep,
                      "FAIL %-28s threads %d n %lld: XTE_SUCCESS with a failed "
                      "allocation, and the bytes differ from the reference run\n",
                      k->name, threads, (long long)n);
        if (nrep <= MAX_REPORTS) describe_byte(&c, ref, o, off);
      }
    } else {
      bad += report(&nrep, "FAIL %-28s threads %d n %lld: a failed allocation gave ", k->name,
                    threads, (long long)n);
      if (nrep <= MAX_REPORTS) printf("%s (%s)\n", xte_status_string(st), msg);
    }
  }
  if (n == MAX_N)
    bad += report(&nrep, "FAIL %-28s threads %d n %lld: too many allocations\n", k->name, threads,
                  (long long)n);
  /* with several threads the count may vary from run to run (per-thread workspaces) */
  printf(
      "%-4s %-28s threads %d: %lld allocations (up to %lld), %lld out-of-memory, %lld "
      "recovered, %d failures\n",
      bad ? "FAIL" : "ok", k->name, threads, (long long)allocs, (long long)max_allocs,
      (long long)oom, (long long)recovered, bad);
  fflush(stdout);
  free(ref);
  calls_free(&c);
  return bad;
}

int main(int argc, char **argv) {
  static const int threads[2] = {1, 3};
  const char *filter = calls_filter(argc, argv);
  const char *env_isa = getenv("XTE_CPU_ISA");
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT], def = xte_cpu_get_isa();
  xte_backend_info info;
  int i, t, ii, nisa = 0, failed_cases = 0, ran = 0;
  /* every ISA this machine and build can run (their allocation paths differ: the MoE and
   * attention drivers are compiled once per ISA), or only XTE_CPU_ISA's when it is set */
  if (env_isa && *env_isa) {
    isas[nisa++] = def;
  } else {
    xte_get_backend_info(&info);
    for (i = 0; i < XTE_CPU_ISA_COUNT; i++)
      if (info.cpu_isa_available & (1u << i)) isas[nisa++] = (xte_cpu_isa)i;
  }
  for (ii = 0; ii < nisa; ii++) {
    if (xte_cpu_set_isa(isas[ii]) != XTE_SUCCESS) {
      printf("FAIL: xte_cpu_set_isa(%s): %s\n", xte_cpu_isa_name(isas[ii]), xte_last_error());
      return 1;
    }
    printf("-- isa %s\n", xte_cpu_isa_name(isas[ii]));
    for (t = 0; t < 2; t++) {
      if (xte_cpu_set_num_threads(threads[t]) != XTE_SUCCESS) {
        printf("FAIL: xte_cpu_set_num_threads(%d): %s\n", threads[t], xte_last_error());
        return 1;
      }
      for (i = 0; i < calls_count; i++) {
        if (!calls_match(calls_table[i].name, filter)) continue;
        ran++;
        failed_cases += run_case(i, threads[t]) != 0;
      }
    }
  }
  xte_cpu_set_num_threads(0);
  xte_cpu_set_isa(def);
  if (!ran) {
    printf("FAIL: no case matches '%s'\n", filter ? filter : "");
    return 1;
  }
  printf("%s: %d of %d case runs failed (isa", failed_cases ? "FAIL" : "PASS", failed_cases, ran);
  for (ii = 0; ii < nisa; ii++) printf(" %s", xte_cpu_isa_name(isas[ii]));
  printf(")\n");
  return failed_cases ? 1 : 0;
}
