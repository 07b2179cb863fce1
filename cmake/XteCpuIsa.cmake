# The CPU ISA folders of src/cpu/: one object library per ISA, each compiled with its own flags.
#
# Every ISA's code-generation flags are given here, once, to its own object library, and never as
# properties of the source files: a source file compiled by two targets (src/cpu/avx512/ natively
# and against SIMDe) must get each target's flags only. The SIMDe objects are built on the AVX2
# baseline (-mavx2 -mfma -mf16c) so that SIMDe emulates every AVX-512 intrinsic with AVX2 code;
# scripts/isa_gate.sh disassembles each library's objects and fails on any instruction above its
# ISA.
#
# Adding an ISA: its folder src/cpu/<isa>/ (whose table file defines xte_cpu_isa_table_<isa>), one
# function below, and src/cpu/isa.c.

# xte_cpu_isa_objects(<name> DIR <folder> FLAGS <flags...> [DEFINES <defs...>] [INCLUDES <dirs>])
# Builds src/cpu/<folder>/*.c into the object library xte_isa_<name>, adds its objects to the xte
# library and defines XTE_HAVE_ISA_<NAME> there. With tests, also xte_isa_<name>_O0 (the same
# sources at -O0, built by check_kernels_O0 only: an intrinsic's immediate taken from a loop
# variable compiles only where the loop is unrolled).
function(xte_cpu_isa_objects name)
  cmake_parse_arguments(I "" "DIR" "FLAGS;DEFINES;INCLUDES" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cpu/${I_DIR}/*.c)
  if(NOT srcs)
    return()
  endif()
  string(TOUPPER "${name}" up)
  set(targets xte_isa_${name})
  add_library(xte_isa_${name} OBJECT ${srcs})
  if(XTE_BUILD_TESTS)
    add_library(xte_isa_${name}_O0 OBJECT EXCLUDE_FROM_ALL ${srcs})
    target_compile_options(xte_isa_${name}_O0 PRIVATE -O0)
    list(APPEND targets xte_isa_${name}_O0)
    set_property(GLOBAL APPEND PROPERTY XTE_ISA_O0_TARGETS xte_isa_${name}_O0)
  endif()
  foreach(t ${targets})
    target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/include
                                            ${PROJECT_BINARY_DIR}/include ${PROJECT_SOURCE_DIR}/src)
    if(I_INCLUDES)
      target_include_directories(${t} SYSTEM PRIVATE ${I_INCLUDES})
    endif()
    target_compile_definitions(${t} PRIVATE ${I_DEFINES})
    # the library's flags first, then the ISA's (the last -m option of a kind wins)
    target_compile_options(${t} PRIVATE ${XTE_C_FLAGS} -fvisibility=hidden ${I_FLAGS})
    set_target_properties(${t} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  endforeach()
  if(XTE_FUZZ)
    # the arithmetic is built without libFuzzer's comparison tracing (see the top level)
    target_compile_options(xte_isa_${name} PRIVATE -fno-sanitize-coverage=trace-cmp)
  endif()
  target_sources(xte PRIVATE $<TARGET_OBJECTS:xte_isa_${name}>)
  target_compile_definitions(xte PRIVATE XTE_HAVE_ISA_${up})
  set_property(GLOBAL APPEND PROPERTY XTE_ISA_LIBRARIES xte_isa_${name})
  set_property(GLOBAL APPEND PROPERTY XTE_ISA_NAMES ${name})
  set(XTE_ISA_${up}_BUILT ON PARENT_SCOPE)
endfunction()

set(XTE_ISA_FLAGS_AVX2 -mavx2 -mfma -mf16c)
set(XTE_ISA_FLAGS_AVX512 ${XTE_ISA_FLAGS_AVX2} -mavx512f -mavx512bw -mavx512vl -mavx512dq)

# src/cpu/avx2/: AVX2 + FMA + F16C (Haswell and later, Zen 1 and later).
function(xte_cpu_isa_avx2)
  xte_cpu_isa_objects(avx2 DIR avx2 FLAGS ${XTE_ISA_FLAGS_AVX2})
  set(XTE_ISA_AVX2_BUILT ${XTE_ISA_AVX2_BUILT} PARENT_SCOPE)
endfunction()

# src/cpu/avx512/ natively: AVX-512 F, BW, VL, DQ (Skylake-SP and later, Zen 4 and later).
function(xte_cpu_isa_avx512)
  xte_cpu_isa_objects(avx512 DIR avx512 FLAGS ${XTE_ISA_FLAGS_AVX512})
  set(XTE_ISA_AVX512_BUILT ${XTE_ISA_AVX512_BUILT} PARENT_SCOPE)
endfunction()

# src/cpu/avx512/ against SIMDe (XTE_AVX512_SIMDE): every AVX-512 intrinsic emulated on the AVX2
# baseline, so the AVX-512 kernels' logic runs (and is byte-tested) on any AVX2 machine. No
# AVX-512 flag here, ever: SIMDe would then call the native instructions.
function(xte_cpu_isa_avx512_simde)
  # (-Wno-psabi: SIMDe's 64-byte vector types passed between this folder's own functions, never
  # across the library's ABI)
  find_path(SIMDE_INCLUDE_DIR simde/x86/avx512.h)
  if(NOT SIMDE_INCLUDE_DIR)
    message(FATAL_ERROR "xte: XTE_SIMDE=ON but SIMDe (libsimde-dev) was not found: install it "
                        "(scripts/deps.sh) or configure with -DXTE_SIMDE=OFF")
  endif()
  xte_cpu_isa_objects(avx512_simde DIR avx512 FLAGS ${XTE_ISA_FLAGS_AVX2} -Wno-unused-function -Wno-psabi
                      DEFINES XTE_AVX512_SIMDE INCLUDES ${SIMDE_INCLUDE_DIR})
  set(XTE_ISA_AVX512_SIMDE_BUILT ${XTE_ISA_AVX512_SIMDE_BUILT} PARENT_SCOPE)
  message(STATUS "xte: AVX-512 kernels also built against SIMDe on AVX2 (${SIMDE_INCLUDE_DIR})")
endfunction()

# src/cpu/amx/: the AMX-INT8 exact e4m3 GEMM kernels and the AMX-BF16 FAST GEMM ones, an extension of the avx512 ISA used where
# the CPU and the OS allow AMX (XTE_CPU_AMX=0 turns them off).
function(xte_cpu_isa_amx)
  include(CheckCCompilerFlag)
  check_c_compiler_flag("-mamx-tile -mamx-int8 -mavx512vbmi" XTE_CC_HAS_AMX)
  # with AMX-BF16 too where the compiler has it (the FAST GEMM's tiles, gemm_fast_amx.c)
  check_c_compiler_flag("-mamx-tile -mamx-bf16" XTE_CC_HAS_AMX_BF16)
  if(XTE_CC_HAS_AMX)
    set(bf16)
    if(XTE_CC_HAS_AMX_BF16)
      set(bf16 -mamx-bf16 -DXTE_AMX_BF16)
      target_compile_definitions(xte PRIVATE XTE_HAVE_AMX_BF16)
    endif()
    xte_cpu_isa_objects(amx DIR amx FLAGS ${XTE_ISA_FLAGS_AVX512} -mavx512vbmi -mamx-tile -mamx-int8
                        ${bf16})
  endif()
  set(XTE_ISA_AMX_BUILT ${XTE_ISA_AMX_BUILT} PARENT_SCOPE)
endfunction()

# src/cpu/vnni/: the AVX512-VNNI small-M exact e4m3 GEMM kernels, an extension of the avx512 ISA
# used where the CPU has AVX512-VNNI and -VBMI (XTE_CPU_VNNI=0 turns them off).
function(xte_cpu_isa_vnni)
  include(CheckCCompilerFlag)
  check_c_compiler_flag("-mavx512vnni -mavx512vbmi" XTE_CC_HAS_VNNI)
  if(XTE_CC_HAS_VNNI)
    xte_cpu_isa_objects(vnni DIR vnni FLAGS ${XTE_ISA_FLAGS_AVX512} -mavx512vbmi -mavx512vnni)
  endif()
  set(XTE_ISA_VNNI_BUILT ${XTE_ISA_VNNI_BUILT} PARENT_SCOPE)
endfunction()

# src/cpu/bf16/: XTE_ATTENTION_FAST's bf16 dot products, an extension of the avx512 ISA: on
# AVX512-BF16 (VDPBF16PS; XTE_CPU_AVX512_BF16=0 turns them off) and, where the compiler has
# AMX-BF16 too, on AMX-BF16 tiles (attention_amx_bf16.c; XTE_CPU_AMX=0 or XTE_CPU_AMX_BF16=0
# turns them off).
function(xte_cpu_isa_bf16)
  include(CheckCCompilerFlag)
  check_c_compiler_flag("-mavx512bf16" XTE_CC_HAS_AVX512_BF16)
  check_c_compiler_flag("-mavx512bf16 -mamx-tile -mamx-bf16" XTE_CC_HAS_ATTN_AMX)
  if(XTE_CC_HAS_AVX512_BF16)
    set(amx)
    if(XTE_CC_HAS_ATTN_AMX)
      set(amx -mamx-tile -mamx-bf16 -DXTE_ATTN_AMX)
      target_compile_definitions(xte PRIVATE XTE_HAVE_ATTN_AMX)
    endif()
    xte_cpu_isa_objects(bf16 DIR bf16 FLAGS ${XTE_ISA_FLAGS_AVX512} -mavx512bf16 ${amx})
  endif()
  set(XTE_ISA_BF16_BUILT ${XTE_ISA_BF16_BUILT} PARENT_SCOPE)
endfunction()
