# Install test: cmake --install of this build into a temporary prefix, then tests/consumer (a tiny
# C program) built against it with find_package(xte) / xte::xte and with pkg-config, and run.
add_test(NAME test_install
         COMMAND ${CMAKE_COMMAND}
                 -DBUILD_DIR=${CMAKE_BINARY_DIR}
                 -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/install_test
                 -DCONSUMER_DIR=${CMAKE_CURRENT_SOURCE_DIR}/consumer
                 -DGENERATOR=${CMAKE_GENERATOR}
                 -DC_COMPILER=${CMAKE_C_COMPILER}
                 -DLIBDIR=${CMAKE_INSTALL_LIBDIR}
                 -DPKG_CONFIG=${PKG_CONFIG_EXECUTABLE}
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run_install_test.cmake)
set_tests_properties(test_install PROPERTIES TIMEOUT 600 LABELS "install")
