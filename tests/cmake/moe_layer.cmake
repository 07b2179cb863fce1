# `xte moe` (tools/cmd_moe.c + tools/moe/), included by tests/CMakeLists.txt: one small MoE layer
# forward + backward through the library (router, permute, quantize, grouped / k-grouped GEMMs,
# SwiGLU, unpermute, shared expert, router backward) checked against its fp64 execution. The command
# exits 1 when a relative error or DeepGEMM's diff is outside its bounds, 0 with "numerics: PASS".
#  moe_layer_small       hidden 256, FFN 128, 8 experts, top-2, 64 tokens, every token checked
#  moe_layer_small_json  the same with --json, another recipe and the scalar kernels
#  moe_layer_fwd_only    --forward-only (no columnwise copies, no padding), MTFP8
#  moe_layer_small_fast  --mode fast: XTE_GEMM_FAST in every FP8 GEMM of the layer, the fp64 check
#                        under the FAST bounds (docs/numerics.md section 6; tools/moe/ref.c)
#  moe_layer_mode_bad    --mode other than exact / fast: a usage error that names the choices
#  moe_layer_weights_checksum, _avx2, _scalar1
#                        --checksum: the FNV-1a hash of the FP8 weights and their scales (4 experts,
#                        hidden 4096, FFN 1024; codes and block scales made directly from the
#                        seed, tools/moe/synth.h) is the pinned one; on the default ISA and
#                        threads (the AVX-512 VBMI generator where the CPU has it), on the AVX2
#                        kernels (the AVX2 vpshufb generator), and on the scalar kernels with
#                        one thread (the plain-C generator), no fp64 check
#                        (the data may not depend on either). The pin changed from
#                        ee814c837b0882e0 when the weights stopped being fp32 values quantized by
#                        xte_quantize (issue 16: the Kimi-K2 preset's setup)
# Each takes about a second (the checksum ones: a few).
if(TARGET xte_cli AND NOT XTE_BENCH_GPU_ONLY) # (the GPU-only xte has no CPU suites, no `moe`)
  set(XTE_MOE_SMALL --hidden 256 --ffn 128 --experts 8 --topk 2 --tokens 64 --check-tokens 64
                    --quiet)
  add_test(NAME moe_layer_small COMMAND xte_cli moe ${XTE_MOE_SMALL})
  set_tests_properties(moe_layer_small PROPERTIES
    LABELS "moe" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "numerics: PASS"
    FAIL_REGULAR_EXPRESSION "FAIL|NON-FINITE")
  add_test(NAME moe_layer_small_json
           COMMAND xte_cli moe ${XTE_MOE_SMALL} --recipe deepgemm --isa scalar --json)
  set_tests_properties(moe_layer_small_json PROPERTIES
    LABELS "moe" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "\"pass\": true"
    FAIL_REGULAR_EXPRESSION "\"pass\": false")
  add_test(NAME moe_layer_fwd_only
           COMMAND xte_cli moe ${XTE_MOE_SMALL} --forward-only --recipe mtfp8 --shared 0)
  set_tests_properties(moe_layer_fwd_only PROPERTIES
    LABELS "moe" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "numerics: PASS"
    FAIL_REGULAR_EXPRESSION "FAIL|NON-FINITE")
  add_test(NAME moe_layer_small_fast COMMAND xte_cli moe ${XTE_MOE_SMALL} --mode fast --json)
  set_tests_properties(moe_layer_small_fast PROPERTIES
    LABELS "moe" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "\"mode\": \"fast\".*\"bound_rel\": 0.13125.*\"pass\": true"
    FAIL_REGULAR_EXPRESSION "\"pass\": false")
  add_test(NAME moe_layer_mode_bad COMMAND xte_cli moe ${XTE_MOE_SMALL} --mode fastest)
  set_tests_properties(moe_layer_mode_bad PROPERTIES
    LABELS "moe" TIMEOUT 60 WILL_FAIL TRUE)
  add_test(NAME moe_layer_mode_bad_msg COMMAND xte_cli moe ${XTE_MOE_SMALL} --mode fastest)
  set_tests_properties(moe_layer_mode_bad_msg PROPERTIES
    LABELS "moe" TIMEOUT 60 PASS_REGULAR_EXPRESSION "--mode 'fastest': want exact or fast")
  set(XTE_MOE_SUM --hidden 4096 --ffn 1024 --experts 4 --topk 2 --tokens 32 --shared 0
                  --forward-only --checksum --quiet)
  add_test(NAME moe_layer_weights_checksum COMMAND xte_cli moe ${XTE_MOE_SUM} --check-tokens 8)
  set_tests_properties(moe_layer_weights_checksum PROPERTIES
    LABELS "moe" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "FP8 weights \\+ scales 15d93382d65e3ab1;.*numerics: PASS"
    FAIL_REGULAR_EXPRESSION "FAIL|NON-FINITE")
  add_test(NAME moe_layer_weights_checksum_avx2
           COMMAND xte_cli moe ${XTE_MOE_SUM} --check-tokens 0 --isa avx2)
  set_tests_properties(moe_layer_weights_checksum_avx2 PROPERTIES
    LABELS "moe" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "FP8 weights \\+ scales 15d93382d65e3ab1;"
    FAIL_REGULAR_EXPRESSION "FAIL|NON-FINITE")
  add_test(NAME moe_layer_weights_checksum_scalar1
           COMMAND xte_cli moe ${XTE_MOE_SUM} --check-tokens 0 --isa scalar --threads 1)
  set_tests_properties(moe_layer_weights_checksum_scalar1 PROPERTIES
    LABELS "moe" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "FP8 weights \\+ scales 15d93382d65e3ab1;"
    FAIL_REGULAR_EXPRESSION "FAIL|NON-FINITE")
endif()

# `xte moe --ep N` (tools/moe/ep.c) under mpiexec, when MPI is found (cmake/XteEp.cmake): the
# routed experts split over N ranks (xte_ep_dispatch, the local experts' grouped GEMMs,
# xte_ep_combine; forward and backward), output and every gradient compared byte for byte with
# the one-process layer (exit 1 and "ep check: FAIL" on any difference).
#  moe_layer_ep_np1..4     1 to 4 ranks (--oversubscribe: CI has 2 cores; runs as root), 50
#                          tokens (uneven splits: 16/17/17, 12/13/12/13), two steps each
#  moe_layer_ep_np4_empty  3 tokens over 4 ranks: rank 0 has no token and receives no row
#  moe_layer_ep_fault_*    a planted bug (XTE_MOE_EP_FAULT: combine without the top-k weights;
#                          each rank holding the next experts' weights): the check must say FAIL
# Each takes about a second.
if(TARGET xte_cli AND XTE_HAVE_MPI AND NOT XTE_BENCH_GPU_ONLY)
  set(XTE_MOE_EP_SMALL --hidden 256 --ffn 256 --experts 12 --topk 3 --tokens 50 --quiet)
  set(XTE_MOE_EP_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  foreach(n 1 2 3 4)
    add_test(NAME moe_layer_ep_np${n}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} --oversubscribe
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:xte_cli> ${MPIEXEC_POSTFLAGS}
                     moe --ep ${n} ${XTE_MOE_EP_SMALL} --iters 2)
    set_tests_properties(moe_layer_ep_np${n} PROPERTIES
      LABELS "moe;ep;mpi" TIMEOUT 120 ENVIRONMENT "${XTE_MOE_EP_ENV}"
      PASS_REGULAR_EXPRESSION "ep check: PASS"
      FAIL_REGULAR_EXPRESSION "FAIL")
  endforeach()
  add_test(NAME moe_layer_ep_np4_empty
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:xte_cli> ${MPIEXEC_POSTFLAGS}
                   moe --ep 4 --hidden 256 --ffn 128 --experts 8 --topk 2 --tokens 3
                   --recipe deepgemm --quiet)
  set_tests_properties(moe_layer_ep_np4_empty PROPERTIES
    LABELS "moe;ep;mpi" TIMEOUT 120 ENVIRONMENT "${XTE_MOE_EP_ENV}"
    PASS_REGULAR_EXPRESSION "per rank: 0/0 .*ep check: PASS"
    FAIL_REGULAR_EXPRESSION "FAIL")
  foreach(fault weights offset)
    add_test(NAME moe_layer_ep_fault_${fault}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 --oversubscribe
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:xte_cli> ${MPIEXEC_POSTFLAGS}
                     moe --ep 3 ${XTE_MOE_EP_SMALL})
    set_tests_properties(moe_layer_ep_fault_${fault} PROPERTIES
      LABELS "moe;ep;mpi" TIMEOUT 120
      ENVIRONMENT "${XTE_MOE_EP_ENV};XTE_MOE_EP_FAULT=${fault}"
      PASS_REGULAR_EXPRESSION "ep check: FAIL")
  endforeach()
  # `xte bench ep` on a small shape: it runs, every call succeeds, and both rows print; its
  # --json report (rank 0) is what scripts/perf_tables.py renders (bench_ep_json_render)
  add_test(NAME bench_ep_smoke
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:xte_cli> ${MPIEXEC_POSTFLAGS}
                   bench ep --tokens 40 --hidden 300 --experts 6 --topk 4 --iters 2
                   --json ${CMAKE_CURRENT_BINARY_DIR}/bench_ep_smoke.json)
  set_tests_properties(bench_ep_smoke PROPERTIES
    LABELS "ep;mpi" TIMEOUT 120 ENVIRONMENT "${XTE_MOE_EP_ENV}"
    PASS_REGULAR_EXPRESSION "dispatch .*combine "
    FAIL_REGULAR_EXPRESSION "rank [0-9]+: |usage: "
    FIXTURES_SETUP bench_ep_json)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    add_test(NAME bench_ep_json_render
             COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/perf_tables.py show
                     ${CMAKE_CURRENT_BINARY_DIR}/bench_ep_smoke.json)
    set_tests_properties(bench_ep_json_render PROPERTIES
      LABELS "ep;mpi" TIMEOUT 60 FIXTURES_REQUIRED bench_ep_json
      PASS_REGULAR_EXPRESSION "\\| 3 \\| expert-major \\| dispatch \\| 40 \\| [0-9.]+ \\| [0-9.]+ \\|.*\\| 3 \\| expert-major \\| combine \\|")
  endif()
endif()
