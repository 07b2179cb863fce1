# Attention tests: labels and time limits.
foreach(t test_attention_fwd test_attention_bwd test_attention_bitident test_attention_bad_input
         test_attention_fp8)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "attention" TIMEOUT 600)
  endif()
endforeach()
