/* A plain-C stand-in for the part of Criterion the GPU tests use, for machines without Criterion
 * (the offline GPU machine): tests/CMakeLists.txt builds the GPU tests against it, with
 * XTE_TEST_CR_SHIM defined, when Criterion is missing or XTE_NO_CRITERION=ON.
 *
 *   Test(suite, name, .timeout = seconds) { ... }      registered before main runs
 *   cr_assert*(...)  a failure ends the test; cr_expect*(...) a failure is counted, the test goes
 * on cr_skip_test(fmt, ...)                              ends the test as skipped cr_log_info /
 * cr_log_warn / cr_log_error(fmt, ...)
 *
 * main (defined here, as Criterion defines it): runs every registered test in the order of
 * registration, each in a child process (a crash or an exhausted .timeout fails that test only, and
 * every test starts from the program's initial state, as under Criterion). Options:
 *   --filter GLOB   only the tests whose "suite/name" matches GLOB (fnmatch), as Criterion's
 *   --jobs N, -jN   accepted and ignored (tests run one at a time)
 *   --no-fork       run the tests in this process (for debuggers and compute-sanitizer)
 *   --list          print the tests' names and exit
 * Output: "[PASS] / [FAIL] / [SKIP] suite::name" per test and Criterion's closing line,
 * "[====] Synthesis: Tested: N | Passing: P | Failing: F | Crashing: C". Exit status 0 when no
 * test failed or crashed (skipped tests do not fail), else 1; 2 for a bad option. */
#ifndef XTE_CR_SHIM_H
#define XTE_CR_SHIM_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fork, waitpid, alarm, fnmatch under -std=c11 */
#endif
#include <fnmatch.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct cr_shim_test {
  const char *suite, *name;
  void (*fn)(void);
  double timeout; /* seconds, 0: none */
} cr_shim_test;

/* The fields of Criterion's Test(..., .field = value) that the tests use. */
struct cr_shim_opts {
  int cr_shim_first_; /* so that an empty option list still initializes something */
  double timeout;
  int disabled;
  const char *description;
};

#define CR_SHIM_MAX_TESTS 256
static cr_shim_test cr_shim_tests[CR_SHIM_MAX_TESTS];
static int cr_shim_ntests;
static int cr_shim_failed;    /* the running test's failed checks */
static int cr_shim_inprocess; /* --no-fork: a failed assert longjmps back to the runner */
static jmp_buf cr_shim_jmp;   /* 1: failed, 2: skipped */
static const cr_shim_test *cr_shim_current;

__attribute__((unused)) static void cr_shim_register(const char *suite, const char *name,
                                                     void (*fn)(void), struct cr_shim_opts o) {
  if (o.disabled) return;
  if (cr_shim_ntests == CR_SHIM_MAX_TESTS) {
    fprintf(stderr, "cr_shim: more than %d tests\n", CR_SHIM_MAX_TESTS);
    abort();
  }
  cr_shim_tests[cr_shim_ntests].suite = suite;
  cr_shim_tests[cr_shim_ntests].name = name;
  cr_shim_tests[cr_shim_ntests].fn = fn;
  cr_shim_tests[cr_shim_ntests].timeout = o.timeout;
  cr_shim_ntests++;
}

#define Test(suite, name, ...)                                                  \
  static void cr_shim_fn_##suite##_##name(void);                                \
  __attribute__((constructor)) static void cr_shim_reg_##suite##_##name(void) { \
    cr_shim_register(#suite, #name, cr_shim_fn_##suite##_##name,                \
                     (struct cr_shim_opts){.cr_shim_first_ = 0, __VA_ARGS__});  \
  }                                                                             \
  static void cr_shim_fn_##suite##_##name(void)

/* Ends the running test: status 1 failed, 2 skipped. */
__attribute__((unused, noreturn)) static void cr_shim_end(int status) {
  if (cr_shim_inprocess) longjmp(cr_shim_jmp, status);
  fflush(stdout);
  fflush(stderr);
  _exit(status);
}

/* msg is " " followed by the caller's optional format (the space keeps an absent one from being
 * an empty format string, which -Wformat-zero-length rejects). */
__attribute__((unused, format(printf, 5, 6))) static void cr_shim_report(int fatal,
                                                                         const char *file, int line,
                                                                         const char *expr,
                                                                         const char *msg, ...) {
  va_list ap;
  cr_shim_failed++;
  fprintf(stderr, "[----] %s:%d: %s: ", file, line,
          fatal ? "Assertion failed" : "Expectation failed");
  if (msg[0] == ' ' && msg[1] != '\0') {
    va_start(ap, msg);
    vfprintf(stderr, msg + 1, ap);
    va_end(ap);
  } else {
    fprintf(stderr, "%s", expr);
  }
  fputc('\n', stderr);
  if (fatal) cr_shim_end(1);
}

__attribute__((unused, format(printf, 2, 3))) static void cr_shim_log(const char *level,
                                                                      const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "[%s] ", level);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

__attribute__((unused, noreturn, format(printf, 1, 2))) static void cr_shim_skip(const char *fmt,
                                                                                 ...) {
  va_list ap;
  fprintf(stderr, "[SKIP] %s::%s: ", cr_shim_current ? cr_shim_current->suite : "?",
          cr_shim_current ? cr_shim_current->name : "?");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  cr_shim_end(2);
}

#define CR_SHIM_CHECK(fatal, cond, expr, ...)                                      \
  do {                                                                             \
    if (!(cond)) cr_shim_report(fatal, __FILE__, __LINE__, expr, " " __VA_ARGS__); \
  } while (0)

#define cr_assert(cond, ...) CR_SHIM_CHECK(1, cond, #cond, __VA_ARGS__)
#define cr_expect(cond, ...) CR_SHIM_CHECK(0, cond, #cond, __VA_ARGS__)
#define cr_assert_not(cond, ...) CR_SHIM_CHECK(1, !(cond), "!(" #cond ")", __VA_ARGS__)
#define cr_expect_not(cond, ...) CR_SHIM_CHECK(0, !(cond), "!(" #cond ")", __VA_ARGS__)
#define cr_assert_fail(...) CR_SHIM_CHECK(1, 0, "cr_assert_fail", __VA_ARGS__)
#define cr_expect_fail(...) CR_SHIM_CHECK(0, 0, "cr_expect_fail", __VA_ARGS__)
#define CR_SHIM_CMP(fatal, a, op, b, ...) \
  CR_SHIM_CHECK(fatal, (a)op(b), #a " " #op " " #b, __VA_ARGS__)
#define cr_assert_eq(a, b, ...) CR_SHIM_CMP(1, a, ==, b, __VA_ARGS__)
#define cr_expect_eq(a, b, ...) CR_SHIM_CMP(0, a, ==, b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...) CR_SHIM_CMP(1, a, !=, b, __VA_ARGS__)
#define cr_expect_neq(a, b, ...) CR_SHIM_CMP(0, a, !=, b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...) CR_SHIM_CMP(1, a, <, b, __VA_ARGS__)
#define cr_expect_lt(a, b, ...) CR_SHIM_CMP(0, a, <, b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...) CR_SHIM_CMP(1, a, <=, b, __VA_ARGS__)
#define cr_expect_leq(a, b, ...) CR_SHIM_CMP(0, a, <=, b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...) CR_SHIM_CMP(1, a, >, b, __VA_ARGS__)
#define cr_expect_gt(a, b, ...) CR_SHIM_CMP(0, a, >, b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...) CR_SHIM_CMP(1, a, >=, b, __VA_ARGS__)
#define cr_expect_geq(a, b, ...) CR_SHIM_CMP(0, a, >=, b, __VA_ARGS__)
#define cr_assert_null(p, ...) CR_SHIM_CHECK(1, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_expect_null(p, ...) CR_SHIM_CHECK(0, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_assert_not_null(p, ...) CR_SHIM_CHECK(1, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_expect_not_null(p, ...) CR_SHIM_CHECK(0, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_assert_arr_eq(a, b, n, ...) \
  CR_SHIM_CHECK(1, memcmp((a), (b), (n)) == 0, "memcmp(" #a ", " #b ", " #n ") == 0", __VA_ARGS__)
#define cr_expect_arr_eq(a, b, n, ...) \
  CR_SHIM_CHECK(0, memcmp((a), (b), (n)) == 0, "memcmp(" #a ", " #b ", " #n ") == 0", __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) \
  CR_SHIM_CHECK(1, strcmp((a), (b)) == 0, "strcmp(" #a ", " #b ") == 0", __VA_ARGS__)
#define cr_expect_str_eq(a, b, ...) \
  CR_SHIM_CHECK(0, strcmp((a), (b)) == 0, "strcmp(" #a ", " #b ") == 0", __VA_ARGS__)
#define cr_skip_test(...) cr_shim_skip(__VA_ARGS__)
#define cr_log_info(...) cr_shim_log("----", __VA_ARGS__)
#define cr_log_warn(...) cr_shim_log("WARN", __VA_ARGS__)
#define cr_log_error(...) cr_shim_log("ERR ", __VA_ARGS__)

/* 0 passed, 1 failed, 2 skipped, 3 crashed (signal, timeout) */
static int cr_shim_run_one(const cr_shim_test *t) {
  pid_t pid;
  int st;
  cr_shim_current = t;
  cr_shim_failed = 0;
  if (cr_shim_inprocess) {
    int r = setjmp(cr_shim_jmp);
    if (r == 0) {
      t->fn();
      return cr_shim_failed ? 1 : 0;
    }
    return r;
  }
  fflush(stdout);
  fflush(stderr);
  pid = fork();
  if (pid < 0) {
    perror("cr_shim: fork");
    return 3;
  }
  if (pid == 0) {
    if (t->timeout > 0) alarm((unsigned)(t->timeout + 0.999));
    t->fn();
    cr_shim_end(cr_shim_failed ? 1 : 0);
  }
  while (waitpid(pid, &st, 0) < 0) continue;
  if (WIFEXITED(st) && WEXITSTATUS(st) <= 2) return WEXITSTATUS(st);
  if (WIFSIGNALED(st))
    fprintf(stderr, "[----] %s::%s: %s (signal %d)\n", t->suite, t->name,
            WTERMSIG(st) == SIGALRM ? "timed out" : "crashed", WTERMSIG(st));
  return 3;
}

int main(int argc, char **argv) {
  const char *filter = NULL;
  int i, list = 0, tested = 0, passing = 0, failing = 0, crashing = 0, skipped = 0;
  char full[256];
  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--filter") == 0 && i + 1 < argc) {
      filter = argv[++i];
    } else if (strncmp(a, "--filter=", 9) == 0) {
      filter = a + 9;
    } else if (strcmp(a, "--jobs") == 0 && i + 1 < argc) {
      i++;
    } else if (strncmp(a, "--jobs=", 7) == 0 || strncmp(a, "-j", 2) == 0) {
      continue;
    } else if (strcmp(a, "--no-fork") == 0) {
      cr_shim_inprocess = 1;
    } else if (strcmp(a, "--list") == 0) {
      list = 1;
    } else {
      fprintf(stderr,
              "usage: %s [--filter SUITE/NAME-GLOB] [--jobs N] [--no-fork] [--list]\n"
              "unknown option: %s\n",
              argv[0], a);
      return 2;
    }
  }
  for (i = 0; i < cr_shim_ntests; i++) {
    const cr_shim_test *t = &cr_shim_tests[i];
    int r;
    snprintf(full, sizeof full, "%s/%s", t->suite, t->name);
    if (filter && fnmatch(filter, full, 0) != 0) continue;
    if (list) {
      printf("%s\n", full);
      continue;
    }
    tested++;
    r = cr_shim_run_one(t);
    if (r == 2) {
      skipped++;
      continue; /* the skip message is printed by cr_skip_test */
    }
    fprintf(stderr, "[%s] %s::%s\n",
            r == 0   ? "PASS"
            : r == 1 ? "FAIL"
                     : "CRASH",
            t->suite, t->name);
    passing += r == 0;
    failing += r == 1;
    crashing += r == 3;
  }
  if (list) return 0;
  fprintf(stderr,
          "[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Crashing: %d | Skipped: %d\n",
          tested - skipped, passing, failing, crashing, skipped);
  return failing || crashing ? 1 : 0;
}

#endif /* XTE_CR_SHIM_H */
