# GEMM tests: the OpenBLAS agreement test links OpenBLAS (cblas_dgemm on the dequantized inputs).
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
target_link_libraries(test_gemm_blas PRIVATE PkgConfig::OPENBLAS)
set_tests_properties(test_gemm_exact test_gemm_grouped test_gemm_blas PROPERTIES LABELS gemm)
# XTE_GEMM_FAST (src/cpu/gemm_fast.c): every ISA the machine runs (the test sweeps them), the fp64
# bound and EXACT's bytes where the partials are exact. With AMX-BF16 in use, FAST's panel path on
# avx512 runs on its tiles; test_gemm_fast@nobf16 (below) runs the fp32 kernels beside AMX-INT8
# (e4m3 x e4m3 K-block-128 calls on the exact AMX-INT8 path), and test_gemm_fast@noamx the fp32
# kernels alone.
set_tests_properties(test_gemm_fast PROPERTIES LABELS gemm)
if(XTE_AVX512 AND XTE_AMX AND XTE_CC_HAS_AMX AND XTE_CC_HAS_AMX_BF16)
  target_compile_definitions(test_gemm_fast PRIVATE XTE_TEST_AMX_BF16)
  add_test(NAME test_gemm_fast@nobf16 COMMAND test_gemm_fast)
  set_tests_properties(test_gemm_fast@nobf16 PROPERTIES ENVIRONMENT "XTE_CPU_AMX_BF16=0" LABELS gemm)
endif()
# FAST for few rows of A (src/cpu/gemm_fast_small.c): the test sweeps every ISA the machine and
# build have itself (xte_cpu_set_isa: scalar, avx2, avx512, avx512_simde), so it runs once.
set_tests_properties(test_gemm_fast_small PROPERTIES LABELS gemm)
# Where the AMX-INT8 kernels are built, the GEMM tests run the exact GEMM a second time with them
# turned off (XTE_CPU_AMX=0): on a machine with AMX the plain runs take the AMX path for e4m3 x
# e4m3 on avx512, these the fp64 kernels. (gemm_exact::amx_in_use_where_the_cpu_has_it checks
# that the plain runs do use AMX where /proc/cpuinfo lists amx_int8.)
if(XTE_AVX512 AND XTE_AMX AND XTE_CC_HAS_AMX)
  foreach(t test_gemm_exact test_gemm_grouped test_gemm_fast)
    add_test(NAME ${t}@noamx COMMAND ${t})
    set_tests_properties(${t}@noamx PROPERTIES ENVIRONMENT "XTE_CPU_AMX=0" LABELS gemm)
  endforeach()
endif()
# Where the AVX512-VNNI small-M kernels are built (used on avx512 for e4m3 x e4m3 with few rows:
# up to 8 on an AMX machine, up to 32 without AMX or in the @noamx runs), test_gemm_exact
# runs once more with neither (XTE_CPU_AMX=0, XTE_CPU_VNNI=0): the fp64 small-M kernels.
if(XTE_AVX512 AND XTE_VNNI AND XTE_CC_HAS_VNNI)
  add_test(NAME test_gemm_exact@novnni COMMAND test_gemm_exact)
  set_tests_properties(test_gemm_exact@novnni PROPERTIES
                       ENVIRONMENT "XTE_CPU_AMX=0;XTE_CPU_VNNI=0" LABELS gemm)
endif()
