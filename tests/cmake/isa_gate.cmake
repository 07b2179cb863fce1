# check_isa_purity: scripts/isa_gate.sh disassembles every object of each CPU ISA object library
# (cmake/XteCpuIsa.cmake) and of the baseline target xte, and fails on an instruction above that
# library's ISA (an AVX-512 instruction in the SIMDe or AVX2 objects is a SIGILL on an AVX2-only
# CPU, which no run on an AVX-512 machine sees). The ISA libraries this configuration defines are
# passed on, so one that was not built fails rather than passing unchecked.
get_property(_xte_isa_libs GLOBAL PROPERTY XTE_ISA_LIBRARIES)
string(REPLACE ";" "," _xte_isa_libs "${_xte_isa_libs}")
add_test(NAME check_isa_purity
         COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/isa_gate.sh ${PROJECT_BINARY_DIR})
set_tests_properties(check_isa_purity PROPERTIES LABELS "isa" TIMEOUT 120
                     ENVIRONMENT "XTE_ISA_LIBRARIES=${_xte_isa_libs}")
