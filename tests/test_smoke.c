#include <criterion/criterion.h>
#include <xte/xte.h>
Test(smoke, version) { cr_expect_eq(xte_version(), XTE_VERSION); }
