# XTE_NAN_SIM: the NaN-simulating build (docs/numerics.md, "NaN bits"; scripts/nansim.sh).
#
# The shared numerics (src/numerics/*.h) then model a GPU: every NaN an operation there produces,
# from NaN inputs or created (inf * 0, inf - inf, 0 / 0, ...), comes out as 0x7FFFFFFF (xte_hwnan).
# Only the sources that run the shared numerics as plain C get the definition: the library's
# core, drivers and the scalar ISA (src/*.c, src/core/*.c, src/cpu/*.c, src/cpu/scalar/*.c). The AVX2 / AVX-512 (and
# SIMDe) kernels are real x86 hardware and stay as they are, so a byte test comparing the scalar
# ISA with an oracle or with a SIMD ISA fails wherever a NaN whose bits were left to the hardware
# reaches an output byte.
#
# Use: include(cmake/XteNanSim.cmake) in CMakeLists.txt after the xte target is defined, or,
# without that line, -DCMAKE_PROJECT_INCLUDE=<repo>/cmake/XteNanSim.cmake (this file then defers
# itself to the end of the top-level CMakeLists.txt, when the target exists).
option(XTE_NAN_SIM "Model the GPU's NaN bits in the shared numerics (tests only)" OFF)

if(NOT TARGET xte)
  get_property(_xte_nan_sim_deferred GLOBAL PROPERTY XTE_NAN_SIM_DEFERRED)
  if(NOT _xte_nan_sim_deferred)
    set_property(GLOBAL PROPERTY XTE_NAN_SIM_DEFERRED TRUE)
    # (EVAL: the path is expanded now; a deferred call's own arguments are expanded when it runs)
    cmake_language(EVAL CODE "cmake_language(DEFER DIRECTORY \"${CMAKE_SOURCE_DIR}\" CALL include \"${CMAKE_CURRENT_LIST_FILE}\")")
  endif()
  return()
endif()

get_property(_xte_nan_sim_done GLOBAL PROPERTY XTE_NAN_SIM_DONE)
if(XTE_NAN_SIM AND NOT _xte_nan_sim_done)
  set_property(GLOBAL PROPERTY XTE_NAN_SIM_DONE TRUE)
  get_filename_component(_xte_root ${CMAKE_CURRENT_LIST_DIR} DIRECTORY)
  file(GLOB _xte_nan_sim_src ${_xte_root}/src/*.c ${_xte_root}/src/core/*.c ${_xte_root}/src/cpu/*.c
       ${_xte_root}/src/cpu/scalar/*.c)
  # the source properties of the directory that defines the xte target (the top level)
  set_property(SOURCE ${_xte_nan_sim_src} DIRECTORY ${_xte_root}
               APPEND PROPERTY COMPILE_DEFINITIONS XTE_NAN_SIM=1)
  message(STATUS "xte: XTE_NAN_SIM: the shared numerics give the GPU's NaN (0x7FFFFFFF)")
endif()
