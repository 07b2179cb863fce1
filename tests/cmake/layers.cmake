# check_layers: no entry file (src/*_api.c) uses another entry file's internals or includes a
# private header of another layer (scripts/check_layers.py, docs/architecture.md);
# check_layers_selftest plants one violation of each kind in a copy and fails unless both are seen;
# both also check that no module of python/xte imports another module's private name.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME check_layers COMMAND ${Python3_EXECUTABLE}
                                     ${PROJECT_SOURCE_DIR}/scripts/check_layers.py ${PROJECT_SOURCE_DIR})
  add_test(NAME check_layers_selftest
           COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/check_layers.py --self-test
                   ${PROJECT_SOURCE_DIR})
  set_tests_properties(check_layers check_layers_selftest PROPERTIES TIMEOUT 60)
endif()
