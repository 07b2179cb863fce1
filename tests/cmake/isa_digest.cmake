# xte_isa_digest (tests/isa_digest/, main.c first): one line per case, the FNV-1a 64 of every output byte of a
# call of the CPU API on fixed inputs, and a TOTAL. Run it before and after a change of src/cpu/
# and diff the outputs: every line must stay the same.
# isa_digest_identity: the numerics contract (docs/numerics.md: the same bytes on every CPU ISA and
# thread count). tests/isa_digest_check.sh runs `xte_isa_digest --small` under every ISA that
# xte_isa_run can run here (the others are reported as skipped), with 1, 2 and 3 threads on the
# best ISA, on avx512 without AMX / VNNI, and with streaming stores forced on and off, and fails
# naming each case whose bytes differ from the scalar ISA's (with the first differing elements of
# the first such case). XTE_DIGEST_EMULATOR: a command the programs run under (set from
# CMAKE_CROSSCOMPILING_EMULATOR, e.g. qemu-x86_64).
file(GLOB XTE_ISA_DIGEST_SRC CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/isa_digest/*.c)
add_executable(xte_isa_digest ${XTE_ISA_DIGEST_SRC})
target_link_libraries(xte_isa_digest PRIVATE xte::xte m)
target_compile_options(xte_isa_digest PRIVATE ${XTE_C_FLAGS})
if(TARGET xte_isa_run)
  string(REPLACE ";" " " _xte_digest_emu "${CMAKE_CROSSCOMPILING_EMULATOR}")
  add_test(NAME isa_digest_identity
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/isa_digest_check.sh
                   $<TARGET_FILE:xte_isa_run> $<TARGET_FILE:xte_isa_digest> --small)
  set_tests_properties(isa_digest_identity PROPERTIES LABELS "isa" TIMEOUT 1800
                       ENVIRONMENT "XTE_DIGEST_EMULATOR=${_xte_digest_emu}")
endif()

# isa_digest_golden: the same --small run on the default ISA against the digest recorded in
# tests/data/isa_digest_small.txt, so a change that moves any output byte on every ISA at once (the
# shared numerics, a driver) is seen too. A deliberate change of bytes regenerates it:
#   build/tests/xte_isa_digest --small > tests/data/isa_digest_small.txt
# and says in its commit which cases changed and why (diff the two files).
add_test(NAME isa_digest_golden
         COMMAND sh -c "\"$1\" --small 2>/dev/null | diff -u \"$2\" - > /dev/null || { \"$1\" --small 2>/dev/null | diff -u \"$2\" - | head -40; exit 1; }"
                 sh $<TARGET_FILE:xte_isa_digest> ${CMAKE_CURRENT_SOURCE_DIR}/data/isa_digest_small.txt)
set_tests_properties(isa_digest_golden PROPERTIES LABELS "isa" TIMEOUT 600)
