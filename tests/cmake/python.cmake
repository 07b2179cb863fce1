# The Python tests (tests/python/test_*.py, pytest): the xte package of python/ over the built
# libxte.so (XTE_LIBRARY; PYTHONPATH=<repo>/python), against NumPy / ml_dtypes / torch oracles.
# test_python_env makes a virtual environment in the build tree once (a ctest fixture) and
# pip-installs numpy, ml_dtypes, pytest and torch there when they are missing; each test file is
# then its own test, test_python_<name> for test_<name>.py (skipped, exit 77, when the environment
# cannot be made; a failure under XTE_REQUIRE_PYTHON_TESTS=1, as in CI: run_pytest.sh).
# Each file also runs once per CPU ISA (test_python_<name>@<isa>) unless it has a line that
# says "# ctest: no-isa-variants" (for tests whose results cannot depend on the ISA).
# test_python_wheel (label "wheel") builds the wheel with pip from the source tree, installs it
# into a fresh environment and imports it there (tests/python/test_wheel.sh).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  set(XTE_PYTEST sh ${CMAKE_CURRENT_SOURCE_DIR}/python/run_pytest.sh
                 ${CMAKE_CURRENT_BINARY_DIR}/pyvenv ${Python3_EXECUTABLE})
  set(XTE_PYTEST_ENV "XTE_LIBRARY=$<TARGET_FILE:xte>" "PYTHONPATH=${PROJECT_SOURCE_DIR}/python")
  if(TARGET xte_cli) # the xte program, for test_check.py's `xte check` runs
    list(APPEND XTE_PYTEST_ENV "XTE_BIN=$<TARGET_FILE:xte_cli>")
  endif()

  add_test(NAME test_python_env COMMAND ${XTE_PYTEST} --setup)
  set_tests_properties(test_python_env PROPERTIES
                       ENVIRONMENT "${XTE_PYTEST_ENV}"
                       SKIP_RETURN_CODE 77
                       TIMEOUT 1800
                       FIXTURES_SETUP xte_pyvenv
                       LABELS "python")

  file(GLOB XTE_PYTHON_TEST_FILES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/python/test_*.py)
  foreach(f ${XTE_PYTHON_TEST_FILES})
    get_filename_component(stem ${f} NAME_WE)
    string(REGEX REPLACE "^test_" "" stem ${stem})
    set(t test_python_${stem})
    add_test(NAME ${t} COMMAND ${XTE_PYTEST} ${f})
    set_tests_properties(${t} PROPERTIES
                         ENVIRONMENT "${XTE_PYTEST_ENV}"
                         SKIP_RETURN_CODE 77
                         TIMEOUT 1200
                         FIXTURES_REQUIRED xte_pyvenv
                         LABELS "python")
    file(STRINGS ${f} no_isa LIMIT_COUNT 1 REGEX "^# ctest: no-isa-variants")
    if(no_isa)
      continue()
    endif()
    # once per CPU ISA (xte_isa_run: tests/CMakeLists.txt), a missing ISA reported as skipped
    foreach(isa ${XTE_TEST_ISAS})
      add_test(NAME ${t}@${isa} COMMAND xte_isa_run ${isa} ${XTE_PYTEST} ${f})
      set_tests_properties(${t}@${isa} PROPERTIES
                           ENVIRONMENT "${XTE_PYTEST_ENV}"
                           SKIP_RETURN_CODE 77
                           TIMEOUT 1200
                           FIXTURES_REQUIRED xte_pyvenv
                           DEPENDS ${t}
                           LABELS "python;isa")
    endforeach()
  endforeach()

  add_test(NAME test_python_wheel
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/python/test_wheel.sh ${PROJECT_SOURCE_DIR}
                   ${CMAKE_CURRENT_BINARY_DIR}/wheel ${Python3_EXECUTABLE})
  set_tests_properties(test_python_wheel PROPERTIES
                       SKIP_RETURN_CODE 77
                       TIMEOUT 1800
                       LABELS "python;wheel")
else()
  message(STATUS "xte: no Python 3 interpreter, the Python tests are not added")
endif()
