/* xte_isa_run ISA COMMAND [ARGS...]: runs COMMAND with the CPU kernels capped to ISA
 * (XTE_CPU_ISA=ISA), after checking that this machine and build can run ISA. When it cannot,
 * prints "SKIPPED: ..." and exits 77, which ctest reports as a skipped test (SKIP_RETURN_CODE),
 * never as a pass. The per-ISA variants of the numerics tests (tests/CMakeLists.txt) use it. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xte/xte.h"

int main(int argc, char **argv) {
  int i;
  if (argc < 3) {
    fprintf(stderr, "usage: xte_isa_run ISA COMMAND [ARGS...]\n");
    return 2;
  }
  for (i = 0; i < XTE_CPU_ISA_COUNT; i++)
    if (!strcmp(argv[1], xte_cpu_isa_name((xte_cpu_isa)i))) break;
  if (i == XTE_CPU_ISA_COUNT) {
    fprintf(stderr, "xte_isa_run: unknown ISA '%s'\n", argv[1]);
    return 2;
  }
  if (xte_cpu_set_isa((xte_cpu_isa)i) != XTE_SUCCESS) {
    printf("SKIPPED: the %s kernels cannot run here: %s\n", argv[1], xte_last_error());
    return 77;
  }
  if (setenv("XTE_CPU_ISA", argv[1], 1) != 0) {
    perror("xte_isa_run: setenv");
    return 2;
  }
  printf("xte_isa_run: XTE_CPU_ISA=%s\n", argv[1]);
  fflush(stdout);
  execvp(argv[2], argv + 2);
  perror("xte_isa_run: exec");
  return 2;
}
