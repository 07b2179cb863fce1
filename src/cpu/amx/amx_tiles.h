/* What both AMX kernels of this folder (gemm_amx.c: AMX-INT8, exact; gemm_fast_amx.c: AMX-BF16,
 * FAST) share: whether this CPU and OS let a process run tiles, and the one tile configuration
 * they load. Included by the amx/ objects only (built with the AMX flags). */
#ifndef XTE_CPU_AMX_TILES_H
#define XTE_CPU_AMX_TILES_H

#include <cpuid.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* 1 when CPUID leaf 7 has every bit of need_edx (AMX-TILE is EDX 24, AMX-BF16 EDX 22, AMX-INT8
 * EDX 25) and AVX512-VBMI (ECX 1), F and BW (EBX 16, 30), which the amx/ objects use beside the
 * tiles; the OS saves SSE, AVX, AVX-512 and both tile states (XCR0); and it grants this process
 * the tile data (arch_prctl). */
static inline int xte_amx_tiles_usable(unsigned need_edx) {
  unsigned a, b, c, d, lo, hi;
  if (__get_cpuid_max(0, NULL) < 7) return 0;
  __cpuid_count(7, 0, a, b, c, d);
  if ((d & need_edx) != need_edx || !((c >> 1) & 1) || !((b >> 16) & 1) || !((b >> 30) & 1))
    return 0;
  __cpuid(1, a, b, c, d);
  if (!((c >> 27) & 1)) return 0; /* OSXSAVE */
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  (void)hi;
  if ((lo & 0x600E6u) != 0x600E6u) return 0;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} xte_amx_tilecfg;

/* Palette 1, tiles 0-7 of 16 rows x 64 bytes. A constant in memory: GCC 12 does not see that
 * ldtilecfg reads its operand and dropped the stores to a local one. */
static const xte_amx_tilecfg xte_amx_cfg __attribute__((aligned(64))) = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

#endif /* XTE_CPU_AMX_TILES_H */
