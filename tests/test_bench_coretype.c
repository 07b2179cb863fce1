/* The OpenBLAS kernel target `xte bench` forces (bench/openblas_coretype.h): a generic core
 * (no AVX2 kernels) on an AVX2 / AVX-512 CPU gets Cooperlake (AVX-512 + BF16), SkylakeX
 * (AVX-512 F) or Haswell (AVX2); any core with AVX2 kernels, or a CPU without AVX2, is left
 * alone. The expected answers are written out by hand from OpenBLAS's target list. */
#include <criterion/criterion.h>
#include <string.h>

#include "../bench/openblas_coretype.h"

static const char *pick(const char *core, int avx2, int avx512f, int bf16) {
  return xte_bench_openblas_coretype_for(core, avx2, avx512f, bf16);
}

static void expect(const char *core, int avx2, int avx512f, int bf16, const char *want) {
  const char *got = pick(core, avx2, avx512f, bf16);
  if (!want)
    cr_expect_null(got, "core %s avx2 %d avx512f %d bf16 %d: got %s, want none",
                   core ? core : "(null)", avx2, avx512f, bf16, got ? got : "");
  else
    cr_expect(got && strcmp(got, want) == 0, "core %s avx2 %d avx512f %d bf16 %d: got %s, want %s",
              core ? core : "(null)", avx2, avx512f, bf16, got ? got : "none", want);
}

Test(bench_coretype, generic_cores_get_the_cpus_target) {
  /* the Debian 0.3.21 case: Prescott on a Sapphire Rapids / Cooper Lake class CPU */
  expect("Prescott", 1, 1, 1, "Cooperlake");
  expect("Prescott", 1, 1, 0, "SkylakeX");
  expect("Prescott", 1, 0, 0, "Haswell");
  /* every generic core, any case */
  expect("PRESCOTT", 1, 1, 1, "Cooperlake");
  expect("prescott", 1, 0, 0, "Haswell");
  expect("Core2", 1, 1, 0, "SkylakeX");
  expect("Nehalem", 1, 1, 1, "Cooperlake");
  expect("Atom", 1, 0, 0, "Haswell");
  expect("Katmai", 1, 0, 0, "Haswell");
  expect("Penryn", 1, 0, 0, "Haswell");
  expect("Dunnington", 1, 0, 0, "Haswell");
  expect("Sandybridge", 1, 0, 0, "Haswell"); /* AVX, no AVX2 kernels */
  expect("Barcelona", 1, 0, 0, "Haswell");
  expect("Opteron_SSE3", 1, 0, 0, "Haswell");
  expect("Bulldozer", 1, 0, 0, "Haswell");
  expect("Piledriver", 1, 0, 0, "Haswell");
  expect("Steamroller", 1, 0, 0, "Haswell");
  expect("Unknown", 1, 1, 1, "Cooperlake");
  expect("", 1, 1, 0, "SkylakeX");
  expect(NULL, 1, 0, 0, "Haswell");
}

Test(bench_coretype, good_cores_are_left_alone) {
  expect("Haswell", 1, 1, 1, NULL);
  expect("SkylakeX", 1, 1, 1, NULL);
  expect("Cooperlake", 1, 1, 1, NULL);
  expect("SapphireRapids", 1, 1, 1, NULL);
  expect("Zen", 1, 0, 0, NULL);
  expect("Excavator", 1, 0, 0, NULL);
  expect("HASWELL", 1, 0, 0, NULL); /* a non-DYNAMIC_ARCH build's name */
  /* whole names only: no prefix or suffix match */
  expect("Prescott2", 1, 1, 1, NULL);
  expect("Presc", 1, 1, 1, NULL);
  expect("Core", 1, 1, 1, NULL);
}

Test(bench_coretype, cpus_without_avx2_keep_the_generic_core) {
  expect("Prescott", 0, 0, 0, NULL);
  expect("Nehalem", 0, 0, 0, NULL);
  expect("Sandybridge", 0, 0, 0, NULL);
}

Test(bench_coretype, is_generic) {
  cr_expect(xte_bench_openblas_core_is_generic("Prescott"));
  cr_expect(xte_bench_openblas_core_is_generic("nehalem"));
  cr_expect(xte_bench_openblas_core_is_generic(NULL));
  cr_expect(xte_bench_openblas_core_is_generic(""));
  cr_expect(!xte_bench_openblas_core_is_generic("Cooperlake"));
  cr_expect(!xte_bench_openblas_core_is_generic("Zen"));
  cr_expect(!xte_bench_openblas_core_is_generic("Prescotts"));
}

/* xte held to AVX2 (--isa avx2) on an AVX-512 CPU: the anchor is held to OpenBLAS's AVX2 target */
static void expect_avx2(const char *core, int avx2, const char *want) {
  const char *got = xte_bench_openblas_coretype_for_avx2(core, avx2);
  if (!want)
    cr_expect_null(got, "held to avx2: core %s avx2 %d: got %s, want none", core ? core : "(null)",
                   avx2, got ? got : "");
  else
    cr_expect(got && strcmp(got, want) == 0, "held to avx2: core %s avx2 %d: got %s, want %s",
              core ? core : "(null)", avx2, got ? got : "none", want);
}

Test(bench_coretype, held_to_avx2) {
  expect_avx2("SkylakeX", 1, "Haswell");
  expect_avx2("COOPERLAKE", 1, "Haswell");
  expect_avx2("SapphireRapids", 1, "Haswell");
  expect_avx2("Prescott", 1, "Haswell");
  expect_avx2(NULL, 1, "Haswell");
  expect_avx2("Haswell", 1, NULL);
  expect_avx2("Zen", 1, NULL);
  expect_avx2("SkylakeX2", 1, NULL); /* whole names only */
  expect_avx2("SkylakeX", 0, NULL);
  cr_expect(xte_bench_openblas_core_has_avx512("skylakex"));
  cr_expect(!xte_bench_openblas_core_has_avx512("Haswell"));
  cr_expect(!xte_bench_openblas_core_has_avx512(NULL));
}
