/* The emulator check of scripts/qemu_avx2.sh (an x86-64 baseline program; the instructions are
 * inline assembly, so no -m flag is needed).
 *   isa_probe cpuid     prints "avx2 A fma F f16c H avx512f E" from CPUID (1 = set)
 *   isa_probe avx2      runs AVX2, FMA and F16C instructions and checks their results (exit 0)
 *   isa_probe avx512    runs one AVX-512F instruction: must die of SIGILL where there is none
 *   isa_probe avx512vl  runs one EVEX-encoded ymm instruction (AVX-512VL): the same
 *   isa_probe exec      executes itself again as "isa_probe cpuid" through /proc/self/exe, the
 *                       way Criterion starts each test (the emulator must follow it) */
#include <cpuid.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
  unsigned a, b, c, d;
  const char *m = argc > 1 ? argv[1] : "";
  if (!strcmp(m, "avx512")) {
    __asm__ volatile("vpxord %%zmm0, %%zmm0, %%zmm0" ::: "xmm0");
    puts("isa_probe: an AVX-512F instruction ran");
    return 0;
  }
  if (!strcmp(m, "avx512vl")) {
    __asm__ volatile("vpternlogd $0x96, %%ymm1, %%ymm1, %%ymm1" ::: "xmm1");
    puts("isa_probe: an AVX-512VL instruction ran");
    return 0;
  }
  if (!strcmp(m, "avx2")) {
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
    int s[8];
    unsigned short h[8];
    /* y = x * x + x (FMA), s = 2x as int32 (AVX2), h = fp16 of y (F16C) */
    __asm__ volatile(
        "vmovups %3, %%ymm0\n\t"
        "vcvttps2dq %%ymm0, %%ymm1\n\t"
        "vpaddd %%ymm1, %%ymm1, %%ymm1\n\t"
        "vmovdqu %%ymm1, %1\n\t"
        "vfmadd231ps %%ymm0, %%ymm0, %%ymm0\n\t"
        "vcvtps2ph $0, %%ymm0, %2\n\t"
        "vmovups %%ymm0, %0\n\t"
        "vzeroupper"
        : "=m"(y), "=m"(s), "=m"(h)
        : "m"(x)
        : "xmm0", "xmm1");
    if (y[0] != 2.0f || y[7] != 72.0f || s[7] != 16 || h[7] != 0x5480) {
      printf("isa_probe: wrong AVX2 / FMA / F16C results: %g %g %d 0x%04x\n", y[0], y[7], s[7],
             h[7]);
      return 1;
    }
    puts("isa_probe: AVX2, FMA and F16C ran right");
    return 0;
  }
  if (!strcmp(m, "exec")) {
    char *const args[] = {argv[0], (char *)"cpuid", NULL};
    fflush(stdout);
    execv("/proc/self/exe", args);
    perror("isa_probe: execv /proc/self/exe");
    return 1;
  }
  __cpuid(1, a, b, c, d);
  {
    unsigned fma = (c >> 12) & 1, f16c = (c >> 29) & 1, avx2 = 0, avx512f = 0;
    if (__get_cpuid_max(0, NULL) >= 7) {
      __cpuid_count(7, 0, a, b, c, d);
      avx2 = (b >> 5) & 1;
      avx512f = (b >> 16) & 1;
    }
    printf("avx2 %u fma %u f16c %u avx512f %u\n", avx2, fma, f16c, avx512f);
  }
  return 0;
}
