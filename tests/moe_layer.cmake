# `xte moe` (tools/cmd_moe.c), included by tests/CMakeLists.txt: one small MoE layer forward +
# backward through the library (router, permute, quantize, grouped / k-grouped GEMMs, SwiGLU,
# unpermute, shared expert, router backward) checked against its fp64 execution. The command
# exits 1 when a relative error or DeepGEMM's diff is outside its bounds, 0 with "numerics: PASS".
#  moe_layer_small       hidden 256, FFN 128, 8 experts, top-2, 64 tokens, every token checked
#  moe_layer_small_json  the same with --json, another recipe and the scalar kernels
#  moe_layer_fwd_only    --forward-only (no columnwise copies, no padding), MTFP8
# Each takes well under a second.
if(TARGET xte_cli)
  set(XTE_MOE_SMALL --hidden 256 --ffn 128 --experts 8 --topk 2 --tokens 64 --check-tokens 64
                    --quiet)
  add_test(NAME moe_layer_small COMMAND xte_cli moe ${XTE_MOE_SMALL})
  set_tests_properties(moe_layer_small PROPERTIES
    LABELS "moe" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "numerics: PASS"
    FAIL_REGULAR_EXPRESSION "FAIL|NON-FINITE")
  add_test(NAME moe_layer_small_json
           COMMAND xte_cli moe ${XTE_MOE_SMALL} --recipe deepgemm --isa scalar --json)
  set_tests_properties(moe_layer_small_json PROPERTIES
    LABELS "moe" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "\"pass\": true"
    FAIL_REGULAR_EXPRESSION "\"pass\": false")
  add_test(NAME moe_layer_fwd_only
           COMMAND xte_cli moe ${XTE_MOE_SMALL} --forward-only --recipe mtfp8 --shared 0)
  set_tests_properties(moe_layer_fwd_only PROPERTIES
    LABELS "moe" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "numerics: PASS"
    FAIL_REGULAR_EXPRESSION "FAIL|NON-FINITE")
endif()
