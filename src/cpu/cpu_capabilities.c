/* Weak fallbacks for the CPU capability tables: a capability whose driver is not linked
 * reports NULL, which the core turns into XTE_ERROR_UNSUPPORTED. The drivers' own (strong)
 * definitions replace these. */
#include "cpu/xte_cpu.h"

__attribute__((weak)) const struct xte_gemm_ops *xte_cpu_gemm_ops(void) {
  return NULL;
}
__attribute__((weak)) const struct xte_attention_ops *xte_cpu_attention_ops(void) {
  return NULL;
}
__attribute__((weak)) const struct xte_moe_ops *xte_cpu_moe_ops(void) {
  return NULL;
}
