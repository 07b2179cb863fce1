# Install test, run by ctest (tests/cmake/install.cmake) as cmake -P with:
#   BUILD_DIR, WORK_DIR, CONSUMER_DIR, GENERATOR, C_COMPILER, LIBDIR, PKG_CONFIG
# 1. cmake --install of the build tree into a fresh prefix;
# 2. configure, build and run tests/consumer against it with find_package(xte);
# 3. pkg-config --cflags --libs xte from the installed xte.pc, compile and run the same program.
cmake_minimum_required(VERSION 3.19)
foreach(v BUILD_DIR WORK_DIR CONSUMER_DIR GENERATOR C_COMPILER LIBDIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_install_test.cmake: ${v} is not set")
  endif()
endforeach()

set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix}
                COMMAND_ERROR_IS_FATAL ANY OUTPUT_QUIET)
foreach(f include/xte/xte.h include/xte/core.h include/xte/quantize.h include/xte/version.h
          ${LIBDIR}/cmake/xte/xteConfig.cmake ${LIBDIR}/pkgconfig/xte.pc)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install: ${f} is missing under ${prefix}")
  endif()
endforeach()
file(GLOB libs ${prefix}/${LIBDIR}/libxte.so*)
if(NOT libs)
  message(FATAL_ERROR "install: no libxte.so under ${prefix}/${LIBDIR}")
endif()

# the installed tree must not point back into the build or source tree
file(GLOB_RECURSE cmake_files ${prefix}/${LIBDIR}/cmake/xte/*.cmake)
foreach(f ${cmake_files})
  file(READ ${f} text)
  string(FIND "${text}" "${BUILD_DIR}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "install: ${f} refers to the build tree ${BUILD_DIR}")
  endif()
endforeach()

set(ENV{LD_LIBRARY_PATH} "${prefix}/${LIBDIR}:$ENV{LD_LIBRARY_PATH}")

# --- find_package(xte) + xte::xte
execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
                        -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_PREFIX_PATH=${prefix}
                        -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
                COMMAND_ERROR_IS_FATAL ANY)
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build COMMAND_ERROR_IS_FATAL ANY)
execute_process(COMMAND ${WORK_DIR}/build/xte_consumer COMMAND_ERROR_IS_FATAL ANY)

# --- pkg-config
if(NOT PKG_CONFIG)
  message(FATAL_ERROR "pkg-config was not found at configure time")
endif()
set(ENV{PKG_CONFIG_PATH} "${prefix}/${LIBDIR}/pkgconfig")
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs xte OUTPUT_VARIABLE plain
                OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
string(FIND "${plain}" "${prefix}" at)
set(define_prefix)
if(at EQUAL -1)
  # xte.pc names the configure-time CMAKE_INSTALL_PREFIX, not this --prefix: ask pkg-config to
  # derive the prefix from the .pc file's location instead.
  message(STATUS "xte.pc is not relocatable (\"${plain}\"): using pkg-config --define-prefix")
  set(define_prefix --define-prefix)
endif()
execute_process(COMMAND ${PKG_CONFIG} ${define_prefix} --cflags --libs xte OUTPUT_VARIABLE flags
                OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
message(STATUS "pkg-config --cflags --libs xte: ${flags}")
string(FIND "${flags}" "${prefix}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "pkg-config flags \"${flags}\" do not point into ${prefix}")
endif()
separate_arguments(flag_list UNIX_COMMAND "${flags}")
execute_process(COMMAND ${C_COMPILER} -std=c11 ${CONSUMER_DIR}/main.c ${flag_list}
                        -o ${WORK_DIR}/xte_consumer_pc
                COMMAND_ERROR_IS_FATAL ANY)
execute_process(COMMAND ${WORK_DIR}/xte_consumer_pc COMMAND_ERROR_IS_FATAL ANY)
file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "install test passed")
