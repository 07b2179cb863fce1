/* The CPU ISA tables (src/cpu/isa.c, docs/architecture.md): every ISA that can run here hands out
 * its own folder's kernels in each family. A table pointing at another folder's kernels gives the
 * same bytes (every ISA does), so the byte tests cannot see it; the tables' ISA tags can. Also:
 * what is available agrees with xte_cpu_set_isa, and one that cannot run is refused with a
 * message. */
#include <criterion/criterion.h>
#include <string.h>

#include "xte/xte.h"

/* the test hook of src/cpu/xte_cpu.h (not on this test's include path) */
XTE_API xte_status xte_internal_cpu_isa_kernels(xte_cpu_isa isa, int out[6]);

Test(isa_tables, each_table_holds_its_own_kernels) {
  xte_backend_info info;
  const xte_cpu_isa saved = xte_cpu_get_isa();
  int i, f, ran = 0;
  cr_assert_eq(xte_get_backend_info(&info), XTE_SUCCESS);
  cr_assert(info.cpu_isa_available & (1u << XTE_CPU_ISA_SCALAR), "scalar is always available");
  for (i = 0; i < XTE_CPU_ISA_COUNT; i++) {
    int out[6] = {-1, -1, -1, -1, -1, -1};
    const int avail = (info.cpu_isa_available >> i) & 1;
    const xte_status st = xte_internal_cpu_isa_kernels((xte_cpu_isa)i, out);
    if (!avail) {
      cr_assert_eq(st, XTE_ERROR_UNSUPPORTED, "%s is not available but has a table",
                   xte_cpu_isa_name((xte_cpu_isa)i));
      cr_assert_eq(xte_cpu_set_isa((xte_cpu_isa)i), XTE_ERROR_UNSUPPORTED);
      cr_assert(strstr(xte_last_error(), "cannot run here") != NULL, "message: %s",
                xte_last_error());
      cr_log_info("%s: cannot run here (%s)", xte_cpu_isa_name((xte_cpu_isa)i), xte_last_error());
      continue;
    }
    cr_assert_eq(st, XTE_SUCCESS, "%s: %s", xte_cpu_isa_name((xte_cpu_isa)i), xte_last_error());
    for (f = 0; f < 4; f++)
      cr_assert_eq(out[f], i, "isa %s: kernel family %d (quant, gemm, attn, moe) is %s's",
                   xte_cpu_isa_name((xte_cpu_isa)i), f, xte_cpu_isa_name((xte_cpu_isa)out[f]));
    /* the extensions belong to the native avx512 table only */
    if (i != XTE_CPU_ISA_AVX512)
      cr_assert(!out[4] && !out[5], "%s has AVX-512 extensions", xte_cpu_isa_name((xte_cpu_isa)i));
    cr_assert_eq(xte_cpu_set_isa((xte_cpu_isa)i), XTE_SUCCESS);
    cr_assert_eq(xte_cpu_get_isa(), (xte_cpu_isa)i);
    ran++;
  }
  cr_assert_eq(xte_cpu_set_isa(saved), XTE_SUCCESS);
  cr_assert_eq(xte_cpu_set_isa(XTE_CPU_ISA_COUNT), XTE_ERROR_INVALID_ARGUMENT);
  cr_log_info("%d ISA tables checked", ran);
}
