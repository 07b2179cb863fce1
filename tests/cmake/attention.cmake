# Attention tests: labels and time limits.
foreach(t test_attention_fwd test_attention_bwd test_attention_bitident test_attention_bad_input
         test_attention_fp8 test_attention_lanes test_attention_accuracy test_attention_order
         test_attention_fast)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "attention" TIMEOUT 600)
  endif()
endforeach()
# test_attention_lanes reads xte_math.h and the internal test hook's declaration under src/;
# test_attention_order restates the documented order with xte_math.h's functions.
foreach(t test_attention_lanes test_attention_order)
  if(TARGET ${t})
    target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  endif()
endforeach()
