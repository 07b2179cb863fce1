# GEMM tests: the OpenBLAS agreement test links OpenBLAS (cblas_dgemm on the dequantized inputs).
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
target_link_libraries(test_gemm_blas PRIVATE PkgConfig::OPENBLAS)
set_tests_properties(test_gemm_exact test_gemm_grouped test_gemm_blas PROPERTIES LABELS gemm)
