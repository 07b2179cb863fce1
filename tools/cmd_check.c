/* `xte check`: judge another library's FP8 outputs against a named recipe and xte's contract.
 *
 * The checks are Python (python/xte/check: they recompute with xte through the package's ctypes
 * bindings and compare with NumPy), so this command runs `python3 -m xte.check <args>` with the
 * arguments unchanged. It finds:
 *   - the interpreter: $XTE_PYTHON, else python3 on PATH;
 *   - the package: a PYTHONPATH entry holding xte/check/__main__.py, else next to this
 *     installation (<prefix>/share/xte/python, beside the library this program loaded or beside
 *     the program), else the source tree this program was built from (the build tree's case);
 *     the directory found is put first on PYTHONPATH;
 *   - the library: XTE_LIBRARY is set to the libxte this program loaded (dladdr), unless set,
 *     so that the checks use the same build.
 * A missing interpreter or package is a clear message and exit status 2. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xte/xte.h"

const char xte_cmd_check_summary[] =
    "judge another library's FP8 outputs (quantize, GEMM, attention, MoE) from files";

#ifndef XTE_PYTHON_SOURCE_DIR
#define XTE_PYTHON_SOURCE_DIR ""
#endif

/* 1 when dir/xte/check/__main__.py exists. */
static int has_package(const char *dir, size_t len) {
  char p[PATH_MAX];
  int n = snprintf(p, sizeof p, "%.*s/xte/check/__main__.py", (int)len, dir);
  return n > 0 && (size_t)n < sizeof p && access(p, R_OK) == 0;
}

/* dir of path (up to the last '/') + rel into out; 1 when the package is there. */
static int try_beside(const char *path, const char *rel, char *out, size_t cap) {
  const char *slash = strrchr(path, '/');
  int n;
  if (!slash) return 0;
  n = snprintf(out, cap, "%.*s/%s", (int)(slash - path), path, rel);
  return n > 0 && (size_t)n < cap && has_package(out, strlen(out));
}

static void usage(void) {
  printf(
      "usage: xte check FAMILY FILE [FILE ...] [options]\n"
      "  runs python3 -m xte.check (the xte Python package) with these arguments;\n"
      "  FAMILY: quantize, cast, gemm, grouped-gemm, attention, router, router-backward,\n"
      "  aux-loss, permute, unpermute.\n"
      "  `xte check --help` after the family (e.g. `xte check quantize --help`) lists the\n"
      "  options; docs/python.md, \"Validating another library's outputs\".\n"
      "  Environment: XTE_PYTHON (the interpreter), PYTHONPATH, XTE_LIBRARY.\n");
}

int xte_cmd_check(int argc, char **argv);
int xte_cmd_check(int argc, char **argv) {
  char dir[PATH_MAX], exe[PATH_MAX], lib[PATH_MAX] = "";
  const char *python = getenv("XTE_PYTHON");
  const char *pp = getenv("PYTHONPATH");
  int found = 0;
  Dl_info info;
  char **args;
  int i;

  if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  if (!python || !*python) python = "python3";

  /* the library this program runs on */
  if (dladdr((const void *)&xte_version, &info) && info.dli_fname && info.dli_fname[0] == '/') {
    snprintf(lib, sizeof lib, "%s", info.dli_fname);
  }
  /* the package: PYTHONPATH first */
  if (pp && *pp) {
    const char *s = pp;
    while (*s && !found) {
      const char *e = strchr(s, ':');
      size_t len = e ? (size_t)(e - s) : strlen(s);
      if (len && has_package(s, len)) found = 1;
      s = e ? e + 1 : s + len;
    }
  }
  if (!found && lib[0]) found = try_beside(lib, "../share/xte/python", dir, sizeof dir) ? 2 : 0;
  if (!found) {
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
      exe[n] = 0;
      found = try_beside(exe, "../share/xte/python", dir, sizeof dir) ? 2 : 0;
    }
  }
  if (!found && XTE_PYTHON_SOURCE_DIR[0] &&
      has_package(XTE_PYTHON_SOURCE_DIR, strlen(XTE_PYTHON_SOURCE_DIR))) {
    snprintf(dir, sizeof dir, "%s", XTE_PYTHON_SOURCE_DIR);
    found = 2;
  }
  if (!found) {
    fprintf(stderr,
            "xte check: the xte Python package (xte/check) is not on PYTHONPATH, not in "
            "<prefix>/share/xte/python next to %s, and not in the source tree '%s'; set "
            "PYTHONPATH to the directory that holds xte/\n",
            lib[0] ? lib : "the library", XTE_PYTHON_SOURCE_DIR);
    return 2;
  }
  if (found != 1) { /* put the directory found first on PYTHONPATH */
    char buf[2 * PATH_MAX + 2];
    if (pp && *pp)
      snprintf(buf, sizeof buf, "%s:%s", dir, pp);
    else
      snprintf(buf, sizeof buf, "%s", dir);
    setenv("PYTHONPATH", buf, 1);
  }
  if (lib[0] && !getenv("XTE_LIBRARY")) setenv("XTE_LIBRARY", lib, 1);

  args = calloc((size_t)argc + 4, sizeof *args);
  if (!args) {
    fprintf(stderr, "xte check: out of memory\n");
    return 1;
  }
  args[0] = (char *)python;
  args[1] = (char *)"-m";
  args[2] = (char *)"xte.check";
  for (i = 1; i < argc; i++) args[i + 2] = argv[i];
  args[argc + 2] = NULL;
  fflush(stdout);
  execvp(python, args);
  fprintf(stderr,
          "xte check: cannot run the Python interpreter '%s' (%s): install Python 3 with "
          "numpy and ml_dtypes, or set XTE_PYTHON to one\n",
          python, strerror(errno));
  free(args);
  return 2;
}
