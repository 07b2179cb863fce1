# check_kernels_O0: every SIMD ISA folder's sources compile at -O0 (the object libraries
# xte_isa_<isa>_O0 of cmake/XteCpuIsa.cmake, with each ISA's own flags, not built by default); an
# intrinsic whose immediate operand comes from a loop variable compiles only where the optimizer
# unrolls the loop.
get_property(_xte_o0 GLOBAL PROPERTY XTE_ISA_O0_TARGETS)
if(_xte_o0)
  set(_xte_o0_args)
  foreach(t ${_xte_o0})
    list(APPEND _xte_o0_args --target ${t})
  endforeach()
  add_test(NAME check_kernels_O0 COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} ${_xte_o0_args})
  set_tests_properties(check_kernels_O0 PROPERTIES TIMEOUT 600)
endif()
