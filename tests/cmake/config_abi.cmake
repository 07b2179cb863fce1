# test_config_abi compiles the config reader (src/core/config.c) into itself to run the ABI rule
# on a config with two versions (docs/api.md).
if(TARGET test_config_abi)
  target_include_directories(test_config_abi PRIVATE ${PROJECT_SOURCE_DIR}/src)
endif()
