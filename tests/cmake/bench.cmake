# `xte bench`, included by tests/CMakeLists.txt when the program is built (XTE_BUILD_BENCH=ON):
# the machine record of every benchmark (bench/bench_common.h) on tiny cases, so that the record,
# the JSON report and the OpenBLAS honesty rule cannot rot. tests/bench/check_json.cmake runs
# quantize (1x128 bf16 rows + columns, 1 MiB, one thread) and sgemm vs dgemm at M = 128 with
# --json, and checks the report's context (CPU model, family/model, ISA, threads, caches, huge
# pages, load, OpenBLAS core, threads, config), that a generic OpenBLAS core on an AVX2 / AVX-512
# CPU or OpenBLAS threads other than xte's come with refused ratios (a null ratio, a reason, and
# "refused" in the table), and a positive ratio otherwise.
#  bench_machine_json              the environment as it is
#  bench_machine_user_coretype     OPENBLAS_CORETYPE=Prescott set by the user: kept (no re-exec)
#                                  and recorded as the user's
#  bench_machine_after_reexec      as after a re-exec whose target did not take (the marker set,
#                                  OpenBLAS still on Prescott): recorded as xte bench's, refused
#  bench_machine_held_avx2         XTE_CPU_ISA=avx2: on an AVX-512 CPU OpenBLAS must not run an
#                                  AVX-512 target unless the user chose it (check_json's rule)
# Each takes a few seconds (more on a loaded machine).
if(TARGET xte_cli AND NOT XTE_BENCH_GPU_ONLY) # (the GPU-only xte has no CPU suites, no `moe`)
  set(XTE_BENCH_MACHINE_VARIANTS json user_coretype after_reexec held_avx2)
  foreach(variant ${XTE_BENCH_MACHINE_VARIANTS})
    set(env "")
    set(want "")
    if(variant STREQUAL "user_coretype")
      set(env "OPENBLAS_CORETYPE=Prescott")
      set(want "Prescott (set by the user)")
    elseif(variant STREQUAL "after_reexec")
      set(env "OPENBLAS_CORETYPE=Prescott;XTE_BENCH_OPENBLAS_REEXEC=Prescott")
      set(want "Prescott (set by xte bench: OpenBLAS had picked Prescott)")
    elseif(variant STREQUAL "held_avx2")
      set(env "XTE_CPU_ISA=avx2")
    endif()
    set(name bench_machine_${variant})
    add_test(NAME ${name}
             COMMAND ${CMAKE_COMMAND} -DXTE=$<TARGET_FILE:xte_cli>
                     -DOUT=${CMAKE_CURRENT_BINARY_DIR}/${name} "-DEXPECT_CORETYPE=${want}"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/bench/check_json.cmake)
    set_tests_properties(${name} PROPERTIES LABELS "bench" TIMEOUT 300 ENVIRONMENT "${env}"
                         PASS_REGULAR_EXPRESSION "bench json: PASS"
                         FAIL_REGULAR_EXPRESSION "bench json: FAIL")
  endforeach()
endif()
