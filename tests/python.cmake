# External-oracle tests in Python (tests/python): xte_cast and the block recipes of the built
# libxte.so, through ctypes, against ml_dtypes and numpy. The test makes a virtual environment in
# the build tree and pip-installs numpy, ml_dtypes and pytest there when they are missing
# (skipped, exit 77, when that cannot be done).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME test_python_ml_dtypes
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/python/run_pytest.sh
                   ${CMAKE_CURRENT_BINARY_DIR}/pyvenv ${Python3_EXECUTABLE}
                   ${CMAKE_CURRENT_SOURCE_DIR}/python)
  set_tests_properties(test_python_ml_dtypes PROPERTIES
                       ENVIRONMENT "XTE_LIBRARY=$<TARGET_FILE:xte>"
                       SKIP_RETURN_CODE 77
                       TIMEOUT 1200
                       LABELS "python")
  # once per CPU ISA (xte_isa_run: tests/CMakeLists.txt), a missing ISA reported as skipped
  foreach(isa ${XTE_TEST_ISAS})
    add_test(NAME test_python_ml_dtypes@${isa}
             COMMAND xte_isa_run ${isa} sh ${CMAKE_CURRENT_SOURCE_DIR}/python/run_pytest.sh
                     ${CMAKE_CURRENT_BINARY_DIR}/pyvenv ${Python3_EXECUTABLE}
                     ${CMAKE_CURRENT_SOURCE_DIR}/python)
    set_tests_properties(test_python_ml_dtypes@${isa} PROPERTIES
                         ENVIRONMENT "XTE_LIBRARY=$<TARGET_FILE:xte>"
                         SKIP_RETURN_CODE 77
                         TIMEOUT 1200
                         DEPENDS test_python_ml_dtypes
                         LABELS "python;isa")
  endforeach()
else()
  message(STATUS "xte: no Python 3 interpreter, test_python_ml_dtypes not added")
endif()
