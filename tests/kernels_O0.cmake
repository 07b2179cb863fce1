# check_kernels_O0: the SIMD kernel sources compile at -O0 (the target xte_kernels_O0, defined next
# to the library and not built by default); an intrinsic whose immediate operand comes from a loop
# variable compiles only where the optimizer unrolls the loop.
if(TARGET xte_kernels_O0)
  add_test(NAME check_kernels_O0
           COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target xte_kernels_O0)
  set_tests_properties(check_kernels_O0 PROPERTIES TIMEOUT 600)
endif()
