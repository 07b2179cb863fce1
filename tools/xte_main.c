/* The xte program: `xte <command> [args]`.
 *
 * Commands are one table, commands[] below. Built in: info, bench, help. Adding a command
 * <name> is adding one file tools/cmd_<name>.c that defines
 *     int xte_cmd_<name>(int argc, char **argv);   argv[0] is "<name>"; returns the exit code
 *                                                 (0 ok, 1 failure, 2 usage error)
 *     const char xte_cmd_<name>_summary[];          one line for `xte help`
 * tools/CMakeLists.txt globs tools/cmd_*.c and generates "xte_commands.inc", one line
 * XTE_COMMAND(<name>) per file, which the table includes: nothing else is edited.
 * Benchmark suites are listed the same way (bench/suites.h); `xte bench <suite> --backend cuda`
 * runs a suite's CUDA cases (bench/bench_gpu.h), listed in "xte_bench_gpu_suites.inc".
 *
 * The GPU-only build (tools/CMakeLists.txt, XTE_BENCH_GPU_ONLY: no Google Benchmark, no OpenBLAS,
 * for tests/device/run.sh) defines XTE_BENCH_GPU_ONLY: info, help, `bench --backend cuda` and
 * `bench device`. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "bench_gpu.h"
#include "suites.h"
#include "xte/xte.h"
#include "xte_bench.h"

typedef int (*xte_cmd_fn)(int argc, char **argv);

#define XTE_COMMAND(name)                    \
  int xte_cmd_##name(int argc, char **argv); \
  extern const char xte_cmd_##name##_summary[];
#include "xte_commands.inc"
#undef XTE_COMMAND

static int cmd_info(int argc, char **argv);
static int cmd_bench(int argc, char **argv);
int xte_bench_ep(int argc, char **argv); /* bench/ep_bench.c */
#include "gpu_device.h"                  /* xte_bench_device: `xte bench device` */
static int cmd_help(int argc, char **argv);

/* main's argv, for `xte bench` to re-execute itself with OPENBLAS_CORETYPE set */
static char **main_argv;

typedef struct command {
  const char *name;
  xte_cmd_fn fn;
  const char *summary;
} command;

/* The suites with CUDA cases (bench/bench_gpu.h), then a { NULL, NULL } terminator. */
typedef struct gpu_suite {
  const char *name;
  void (*fn)(void);
} gpu_suite;
static const gpu_suite gpu_suites[] = {
#define XTE_BENCH_GPU_SUITE(name) {#name, xte_bench_gpu_suite_##name},
#include "xte_bench_gpu_suites.inc"
#undef XTE_BENCH_GPU_SUITE
    {0, 0}};

static const command commands[] = {
    {"info", cmd_info, "print the backends, CPU ISA, threads, caches and GPUs xte sees"},
    {"bench", cmd_bench, "run a benchmark suite (xte bench help)"},
    {"help", cmd_help, "this list"},
#define XTE_COMMAND(name) {#name, xte_cmd_##name, xte_cmd_##name##_summary},
#include "xte_commands.inc"
#undef XTE_COMMAND
    {NULL, NULL, NULL}};

/* ---------------------------------------------------------------- help, info */

static int cmd_help(int argc, char **argv) {
  const command *c;
  (void)argc;
  (void)argv;
  printf("usage: xte <command> [args]\n\ncommands:\n");
  for (c = commands; c->name; c++) printf("  %-10s %s\n", c->name, c->summary);
  printf("\n`xte <command> --help` for a command's own options.\n");
  return 0;
}

static int cmd_info(int argc, char **argv) {
  char buf[8192];
  xte_status rc;
  if (argc > 1) {
    fprintf(stderr, "xte info: unexpected argument '%s'\n", argv[1]);
    return 2;
  }
  rc = xte_backend_info_string(buf, sizeof buf);
  if (rc != XTE_SUCCESS) {
    fprintf(stderr, "xte info: %s: %s\n", xte_status_string(rc), xte_last_error());
    return 1;
  }
  fputs(buf, stdout);
  if (buf[0] && buf[strlen(buf) - 1] != '\n') putchar('\n');
  return 0;
}

/* ---------------------------------------------------------------- bench */

static void bench_usage(FILE *f) {
  const xte_bench_suite_entry *s;
  const gpu_suite *g;
  fprintf(f,
          "usage: xte bench <suite|all> [--filter S] [--json FILE] [--min-time SECONDS]\n"
          "                 [--rounds N] [--threads N] [--isa ISA]\n"
          "                 [--backend cpu|cuda] [--device N] [--smoke]\n"
          "       xte bench list\n"
          "       mpirun -np R xte bench ep [--tokens T] [--hidden H] [--experts E] [--topk K]\n"
          "                 [--dtype e4m3|bf16] [--iters N]   (expert-parallel dispatch /\n"
          "                 combine against MPI_Alltoallv of the same bytes)\n"
          "       xte bench device [gemm|fast|attention|anchors] [shape] [iterations]\n"
          "                 (the CUDA backend's byte checks and timings of tests/device/run.sh:\n"
          "                 bench/gpu_device.c)\n\n"
          "  --filter S          run the cases whose name contains S (and their anchors)\n"
          "  --json FILE         also write Google Benchmark's JSON report, with the ratios\n"
          "  --min-time SECONDS  minimum timed time per case (default: Google Benchmark's)\n"
          "  --rounds N          run the selected cases N times in turn, anchors among them; a\n"
          "                      case's ratio is the median of the rounds' ratios (default 1):\n"
          "                      steadier ratios on a noisy machine\n"
          "  --threads N         threads of xte's CPU pool and of the anchors (default: cores)\n"
          "  --isa ISA           CPU kernels: scalar, avx2, avx512, avx512_simde\n"
          "  --backend B         cpu (default) or cuda (default: XTE_BACKEND when it is cpu or\n"
          "                      cuda): the suite's CUDA cases on device --device N (default 0),\n"
          "                      timed with CUDA events, the L2 flushed before every iteration,\n"
          "                      each beside a device-to-device copy of the same bytes (or the\n"
          "                      vendor library's kernel) of the same run; the CUDA runtime is\n"
          "                      loaded at run time. No runtime, device or xte CUDA backend:\n"
          "                      one line \"SKIPPED: <why>\" and exit status 77\n"
          "  --smoke             (cuda) tiny shapes, two iterations: checks the path, not speed\n\n"
          "Every run first prints the machine: CPU model, family/model/stepping, SIMD flags, the\n"
          "ISA xte uses, cores and threads, L1d/L2/L3 sizes, the transparent huge page mode, the\n"
          "load, OpenBLAS's core name, threads and config; --json records the same keys in the\n"
          "report's \"context\". When OpenBLAS picked a generic core (Prescott, Nehalem, ...) on\n"
          "an AVX2 / AVX-512 CPU and OPENBLAS_CORETYPE is not set, the bench runs itself again\n"
          "with OPENBLAS_CORETYPE=Cooperlake|SkylakeX|Haswell; with xte held to AVX2 (--isa avx2)\n"
          "on an AVX-512 CPU it runs itself again with OPENBLAS_CORETYPE=Haswell when OpenBLAS\n"
          "picked AVX-512 kernels (an AVX2 machine's anchor); a user's OPENBLAS_CORETYPE is\n"
          "kept. If OpenBLAS still runs a generic core, or not xte's thread count, ratios to it\n"
          "print \"refused\" with the reason. Memory-bound cases also run at a size past the\n"
          "last-level cache (\"dram\": 4 x L3, at most 1/8 of the free memory) beside a copy of\n"
          "the same size.\n\n"
          "suites:");
  for (s = xte_bench_suites; s->name; s++) fprintf(f, " %s", s->name);
  fprintf(f, "\n");
  fprintf(f, "suites with CUDA cases (--backend cuda):");
  for (g = gpu_suites; g->name; g++) fprintf(f, " %s", g->name);
  fprintf(f, "\n");
}

static const xte_bench_suite_entry *find_suite(const char *name) {
  const xte_bench_suite_entry *s;
  for (s = xte_bench_suites; s->name; s++)
    if (strcmp(s->name, name) == 0) return s;
  return NULL;
}

/* The value of option argv[*i] (as "--opt V" or "--opt=V"), or NULL after a message. */
static const char *opt_value(int argc, char **argv, int *i, const char *opt) {
  size_t n = strlen(opt);
  if (strncmp(argv[*i], opt, n) == 0 && argv[*i][n] == '=') return argv[*i] + n + 1;
  if (*i + 1 < argc) return argv[++*i];
  fprintf(stderr, "xte bench: %s needs a value\n", opt);
  return NULL;
}

static int is_opt(const char *arg, const char *opt) {
  size_t n = strlen(opt);
  return strncmp(arg, opt, n) == 0 && (arg[n] == 0 || arg[n] == '=');
}

/* The integer value of option argv[*i] in [lo, hi] into *out: 1, else 0 after a message. */
static int int_opt(int argc, char **argv, int *i, const char *opt, long lo, long hi, int *out) {
  const char *v = opt_value(argc, argv, i, opt);
  char *end;
  long t;
  if (!v) return 0;
  errno = 0;
  t = strtol(v, &end, 10);
  if (errno || end == v || *end || t < lo || t > hi) {
    fprintf(stderr, "xte bench: %s '%s': want an integer in [%ld, %ld]\n", opt, v, lo, hi);
    return 0;
  }
  *out = (int)t;
  return 1;
}

static const gpu_suite *find_gpu_suite(const char *name) {
  const gpu_suite *g;
  for (g = gpu_suites; g->name; g++)
    if (strcmp(g->name, name) == 0) return g;
  return NULL;
}

/* `xte bench <suite> --backend cuda` (bench/bench_gpu.h); suite NULL: every suite with CUDA
 * cases. */
static int bench_cuda(const char *suite, const char *filter, const char *json, double min_time,
                      int rounds, int device, int smoke) {
  const gpu_suite *g = NULL;
  char why[1024];
  int rc;
  if (suite && !(g = find_gpu_suite(suite))) {
    fprintf(stderr, "xte bench: suite '%s' has no CUDA cases; with --backend cuda:", suite);
    for (g = gpu_suites; g->name; g++) fprintf(stderr, " %s", g->name);
    fprintf(stderr, "\n");
    return 2;
  }
  /* the host-side helpers (random inputs: xte_cast on a NULL stream) run on the CPU backend */
  if (setenv("XTE_BACKEND", "cpu", 1) != 0) return 1;
  rc = xte_gpu_bench_open(device, smoke, why, sizeof why);
  if (rc == XTE_GPU_BENCH_SKIP) {
    printf("SKIPPED: %s\n", why);
    fflush(stdout);
    return XTE_GPU_BENCH_SKIP;
  }
  if (rc != 0) {
    fprintf(stderr, "xte bench: %s\n", why);
    return 1;
  }
  xte_bench_machine_setup(NULL, stdout);
  if (g) {
    g->fn();
  } else {
    for (g = gpu_suites; g->name; g++) g->fn();
  }
  return xte_gpu_bench_run(filter, json, min_time, rounds);
}

static int cmd_bench(int argc, char **argv) {
  const char *suite = NULL, *filter = NULL, *json = NULL, *backend = NULL;
  double min_time = 0;
  int threads = -1, isa = -1, rounds = 1, device = 0, smoke = 0, i;
  const xte_bench_suite_entry *s;
  xte_status rc;

  if (argc > 1 && strcmp(argv[1], "ep") == 0) return xte_bench_ep(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "device") == 0) return xte_bench_device(argc - 1, argv + 1);
  for (i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    char *end;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0 || strcmp(a, "help") == 0) {
      bench_usage(stdout);
      return 0;
    } else if (is_opt(a, "--filter")) {
      if (!(filter = opt_value(argc, argv, &i, "--filter"))) return 2;
    } else if (is_opt(a, "--json")) {
      if (!(json = opt_value(argc, argv, &i, "--json"))) return 2;
    } else if (is_opt(a, "--min-time")) {
      if (!(v = opt_value(argc, argv, &i, "--min-time"))) return 2;
      errno = 0;
      min_time = strtod(v, &end);
      if (errno || end == v || *end || !(min_time > 0)) {
        fprintf(stderr, "xte bench: --min-time '%s': want seconds > 0\n", v);
        return 2;
      }
    } else if (is_opt(a, "--rounds")) {
      if (!int_opt(argc, argv, &i, "--rounds", 1, 100, &rounds)) return 2;
    } else if (is_opt(a, "--backend")) {
      if (!(backend = opt_value(argc, argv, &i, "--backend"))) return 2;
      if (strcmp(backend, "cpu") != 0 && strcmp(backend, "cuda") != 0) {
        fprintf(stderr, "xte bench: --backend '%s': want cpu or cuda\n", backend);
        return 2;
      }
    } else if (is_opt(a, "--device")) {
      if (!int_opt(argc, argv, &i, "--device", 0, 1023, &device)) return 2;
    } else if (strcmp(a, "--smoke") == 0) {
      smoke = 1;
    } else if (is_opt(a, "--threads")) {
      if (!int_opt(argc, argv, &i, "--threads", 1, 256, &threads)) return 2;
    } else if (is_opt(a, "--isa")) {
      int k;
      if (!(v = opt_value(argc, argv, &i, "--isa"))) return 2;
      for (k = 0; k < XTE_CPU_ISA_COUNT; k++)
        if (strcmp(v, xte_cpu_isa_name((xte_cpu_isa)k)) == 0) isa = k;
      if (isa < 0) {
        fprintf(stderr, "xte bench: --isa '%s': want one of", v);
        for (k = 0; k < XTE_CPU_ISA_COUNT; k++)
          fprintf(stderr, " %s", xte_cpu_isa_name((xte_cpu_isa)k));
        fprintf(stderr, "\n");
        return 2;
      }
    } else if (a[0] == '-') {
      fprintf(stderr, "xte bench: unknown option '%s'\n", a);
      bench_usage(stderr);
      return 2;
    } else if (!suite) {
      suite = a;
    } else {
      fprintf(stderr, "xte bench: unexpected argument '%s' (one suite at a time)\n", a);
      return 2;
    }
  }

  if (!suite) {
    bench_usage(stderr);
    return 2;
  }
  if (!backend) { /* the library's default backend, when the bench has it */
    const char *e = getenv("XTE_BACKEND");
    if (e && *e && strcmp(e, "cpu") != 0 && strcmp(e, "cuda") != 0) {
      fprintf(stderr, "xte bench: XTE_BACKEND=%s: the benchmarks run on cpu or cuda (--backend)\n",
              e);
      return 2;
    }
    backend = e && *e ? e : "cpu";
  }
#ifdef XTE_BENCH_GPU_ONLY
  if (strcmp(backend, "cuda") != 0 && strcmp(suite, "list") != 0) {
    fprintf(stderr,
            "xte bench: this xte is the GPU-only build (no Google Benchmark, no OpenBLAS): "
            "only --backend cuda\n");
    return 2;
  }
#endif
  if (strcmp(suite, "list") == 0 && strcmp(backend, "cuda") == 0) {
    const gpu_suite *g;
    for (g = gpu_suites; g->name; g++) printf("%s\n", g->name);
    return 0;
  }
  if (strcmp(suite, "list") == 0) {
    for (s = xte_bench_suites; s->name; s++) printf("%s\n", s->name);
    return 0;
  }
  if (strcmp(suite, "all") == 0) {
    s = NULL;
  } else if (!(s = find_suite(suite))) {
    fprintf(stderr, "xte bench: unknown suite '%s'; suites:", suite);
    for (s = xte_bench_suites; s->name; s++) fprintf(stderr, " %s", s->name);
    fprintf(stderr, "\n");
    return 2;
  }

  if (strcmp(backend, "cuda") == 0) {
    if (isa >= 0 && (rc = xte_cpu_set_isa((xte_cpu_isa)isa)) != XTE_SUCCESS) {
      fprintf(stderr, "xte bench: --isa: %s\n", xte_last_error());
      return 2;
    }
    if (threads > 0 && (rc = xte_cpu_set_num_threads(threads)) != XTE_SUCCESS) {
      fprintf(stderr, "xte bench: --threads: %s\n", xte_last_error());
      return 2;
    }
    return bench_cuda(s ? s->name : NULL, filter, json, min_time, rounds, device, smoke);
  }
  if (smoke || device != 0) {
    fprintf(stderr, "xte bench: --smoke and --device are for --backend cuda\n");
    return 2;
  }
  /* the CPU cases pass host memory on the NULL stream: the CPU backend, whatever XTE_BACKEND */
  if (setenv("XTE_BACKEND", "cpu", 1) != 0) return 1;
  if (isa >= 0 && (rc = xte_cpu_set_isa((xte_cpu_isa)isa)) != XTE_SUCCESS) {
    fprintf(stderr, "xte bench: --isa %s: %s: %s\n", xte_cpu_isa_name((xte_cpu_isa)isa),
            xte_status_string(rc), xte_last_error());
    return 2;
  }
  if (threads > 0 && (rc = xte_cpu_set_num_threads(threads)) != XTE_SUCCESS) {
    fprintf(stderr, "xte bench: --threads %d: %s: %s\n", threads, xte_status_string(rc),
            xte_last_error());
    return 2;
  }

  /* before any case is registered: may re-execute the program (OpenBLAS's kernel target) */
  xte_bench_machine_setup(main_argv, stdout);
  if (s) {
    s->fn();
  } else {
    for (s = xte_bench_suites; s->name; s++) s->fn();
  }
  return xte_bench_run(filter, json, min_time, rounds);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
  const command *c;
  main_argv = argv;
  if (argc < 2) {
    cmd_help(0, NULL);
    return 2;
  }
  if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) return cmd_help(0, NULL);
  for (c = commands; c->name; c++)
    if (strcmp(c->name, argv[1]) == 0) return c->fn(argc - 1, argv + 1);
  fprintf(stderr, "xte: unknown command '%s' (xte help lists them)\n", argv[1]);
  return 2;
}
