# GPU tests (included by tests/CMakeLists.txt after every tests/test_*.c became a ctest test).
#
#  test_gpu_quantize        the CUDA backend against the CPU backend, byte for byte. Without a
#                           usable device its tests print "SKIPPED: <reason>" and ctest reports
#                           the test as skipped (SKIP_REGULAR_EXPRESSION).
#  test_gpu_plugin_info     the one case of it that runs everywhere: when libxte_cuda.so is built,
#                           libxte must load it and say why it has no device. A separate entry,
#                           so the skip above cannot hide its failure.
#  check_gpu_musa_compat    every CUDA name used under src/cuda/ is mapped for MUSA in
#                           src/musa/xte_musa_compat.h (tests/check_musa_compat.py).
# All carry the label "gpu"; their names contain "gpu" (ctest -R gpu).
# Without Criterion (XTE_NO_CRITERION=ON, or not installed) tests/CMakeLists.txt builds only the
# test_gpu_*.c programs, on tests/cr_shim.h (same --filter / --jobs options, same output lines),
# and includes this file alone.
if(TARGET test_gpu_quantize)
  set_tests_properties(test_gpu_quantize PROPERTIES LABELS "gpu" TIMEOUT 1800
                       SKIP_REGULAR_EXPRESSION "SKIPPED: ")
  add_test(NAME test_gpu_plugin_info
           COMMAND test_gpu_quantize --jobs 1 --filter "gpu_quantize/plugin_reports_itself")
  set_tests_properties(test_gpu_plugin_info PROPERTIES LABELS "gpu" TIMEOUT 120)
  if(TARGET xte_cuda)
    add_dependencies(test_gpu_quantize xte_cuda)
    target_compile_definitions(test_gpu_quantize PRIVATE XTE_TEST_HAVE_CUDA_PLUGIN=1)
  endif()
endif()

find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME check_gpu_musa_compat
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/check_musa_compat.py
                   --cuda-dir ${PROJECT_SOURCE_DIR}/src/cuda
                   --compat ${PROJECT_SOURCE_DIR}/src/musa/xte_musa_compat.h)
  set_tests_properties(check_gpu_musa_compat PROPERTIES LABELS "gpu" TIMEOUT 60)
else()
  message(STATUS "xte: no Python 3, check_gpu_musa_compat is not run")
endif()

# `xte info` for machines where the xte program is not built (it needs the benchmark
# dependencies): tests/device/run.sh runs xte_device_info instead.
add_executable(xte_device_info ${CMAKE_CURRENT_SOURCE_DIR}/device/xte_info.c)
target_link_libraries(xte_device_info PRIVATE xte::xte)
target_compile_options(xte_device_info PRIVATE ${XTE_C_FLAGS})

# The CUDA backend's byte checks and timings of tests/device/run.sh: `xte bench device`
# (bench/gpu_device.c, in the xte program).

# test_gpu_fast_lt: the cuBLASLt FAST path's loader, applicability table and ABI values
# (tests/test_gpu_fast_lt.c, host only). The cases that can skip (no libcublasLt installed, no
# cublasLt.h at build time) run as separate entries with the SKIPPED rule, so that a skip never
# hides a failure of the others.
if(TARGET test_gpu_fast_lt)
  target_include_directories(test_gpu_fast_lt PRIVATE ${PROJECT_SOURCE_DIR}/src
                             ${PROJECT_SOURCE_DIR}/include ${PROJECT_BINARY_DIR}/include)
  target_link_libraries(test_gpu_fast_lt PRIVATE ${CMAKE_DL_LIBS})
  if(CMAKE_CUDA_COMPILER)
    get_filename_component(XTE_FAST_LT_CUDA_BIN ${CMAKE_CUDA_COMPILER} DIRECTORY)
    if(EXISTS ${XTE_FAST_LT_CUDA_BIN}/../include/cublasLt.h)
      target_include_directories(test_gpu_fast_lt SYSTEM PRIVATE ${XTE_FAST_LT_CUDA_BIN}/../include)
    endif()
  endif()
  if(TARGET xte_cuda)
    add_dependencies(test_gpu_fast_lt xte_cuda)
    target_compile_definitions(test_gpu_fast_lt PRIVATE XTE_TEST_HAVE_CUDA_PLUGIN=1)
  endif()
  set_tests_properties(test_gpu_fast_lt PROPERTIES LABELS "gpu" TIMEOUT 120)
  foreach(c loader_real abi)
    add_test(NAME test_gpu_fast_lt_${c} COMMAND test_gpu_fast_lt --jobs 1 --filter "fast_lt/${c}")
    set_tests_properties(test_gpu_fast_lt_${c} PROPERTIES LABELS "gpu" TIMEOUT 120
                         SKIP_REGULAR_EXPRESSION "SKIPPED: ")
  endforeach()
endif()

# test_ep_nccl_device: tests/simt/test_simt_ep.c on a real GPU (the build's CUDA plugin and the real
# libnccl.so.2 or $XTE_NCCL_LIBRARY), one rank on GPU 0; tests/device/run.sh step ep_nccl, not a
# ctest test. Here rather than in tests/simt/, so that the device build (no Criterion) has it.
if(TARGET xte_cuda)
  add_executable(test_ep_nccl_device ${CMAKE_CURRENT_SOURCE_DIR}/simt/test_simt_ep.c)
  target_link_libraries(test_ep_nccl_device PRIVATE xte::xte Threads::Threads ${CMAKE_DL_LIBS})
  target_compile_options(test_ep_nccl_device PRIVATE -ffp-contract=off -Wall -Wextra
    -Wno-unused-function $<$<BOOL:${XTE_WERROR}>:-Werror>)
  target_compile_definitions(test_ep_nccl_device PRIVATE XTE_EP_TEST_REAL_ONLY SIMT_PLUGIN_DIR=""
    FAKE_NCCL_PATH="")
  set_target_properties(test_ep_nccl_device PROPERTIES C_STANDARD 11)
  add_dependencies(test_ep_nccl_device xte_cuda)
endif()

# test_device_moe, test_device_router: tests/simt/test_simt_moe.cpp and test_simt_router.cpp in
# device mode (SIMT_DEVICE_MODE, see tests/simt/simt_test_common.h): the same cases, byte for byte
# against the CPU backend, on the real CUDA plugin with managed memory: permute / unpermute and
# their backwards, sort chunks, the dispatch layout; the router, aux scores / loss, SwiGLU and the
# fused quantize. tests/device/run.sh runs them (not ctest tests: they need a GPU; the device
# script's dry run runs them on the host SIMT runner's plugin with SIMT_DEVICE_MEMORY=host).
# Host C++20 only, like tests/simt.
find_package(Threads REQUIRED)
foreach(what moe router)
  add_executable(test_device_${what} ${CMAKE_CURRENT_SOURCE_DIR}/simt/test_simt_${what}.cpp)
  target_link_libraries(test_device_${what} PRIVATE xte::xte Threads::Threads ${CMAKE_DL_LIBS})
  target_compile_options(test_device_${what} PRIVATE -ffp-contract=off -fno-fast-math
    -fno-strict-aliasing -Wall -Wextra -Wno-unknown-pragmas $<$<BOOL:${XTE_WERROR}>:-Werror>)
  target_compile_definitions(test_device_${what} PRIVATE SIMT_DEVICE_MODE SIMT_PLUGIN_DIR="")
  target_include_directories(test_device_${what} PRIVATE ${PROJECT_SOURCE_DIR}/tests/simt
                             ${PROJECT_SOURCE_DIR}/src)
  set_target_properties(test_device_${what} PROPERTIES CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON
                        CXX_EXTENSIONS OFF)
endforeach()
