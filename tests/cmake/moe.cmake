# MoE and deterministic-math tests (included by tests/CMakeLists.txt).
#  test_math_exhaustive  every fp32 input of xte_math.h's functions against fp64 libm; reads the
#                        header under src/ directly (static inline functions).
#  test_moe_*            router, token movement, fused SwiGLU, on every CPU ISA; hostile input
#                        and allocation failures (test_moe_hostile).
if(TARGET test_math_exhaustive)
  target_include_directories(test_math_exhaustive PRIVATE ${PROJECT_SOURCE_DIR}/src)
  set_tests_properties(test_math_exhaustive PROPERTIES LABELS "math" TIMEOUT 1800)
endif()
foreach(t test_moe_router test_moe_permute test_moe_swiglu test_moe_bad_input test_moe_hostile)
  if(TARGET ${t})
    target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/src)
    set_tests_properties(${t} PROPERTIES LABELS "moe" TIMEOUT 1800)
  endif()
endforeach()
