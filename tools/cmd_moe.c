/* `xte moe`: one MoE layer forward and backward through the library, with Kimi-K2's per-expert
 * shapes (hidden 7168, expert FFN 2048, SwiGLU, top-8 sigmoid router with expert bias, routed
 * scaling 2.827, one shared expert) and fewer experts by default, so that it fits a small machine;
 * the kernel table, and a numerics report against the same layer in fp64.
 *
 * This file is the command's entry (bench/CMakeLists.txt lists tools/cmd_*.c as the commands of
 * the xte program); its parts live in tools/moe/ (moe.h says which file does what), and
 * `--ep N` hands over to tools/moe/ep.c (the same layer over N MPI ranks). */
#include "moe/moe.h"

const char xte_cmd_moe_summary[] =
    "run one MoE layer (Kimi-K2 expert shapes) forward + backward: kernel table, fp64 check";

int xte_cmd_moe(int argc, char **argv);
int xte_cmd_moe(int argc, char **argv) {
  moe_opts o;
  int rc;

  rc = moe_parse_opts(argc, argv, &o);
  if (rc == 1) return 0;
  if (rc) return 2;
  if (o.ep > 0) return moe_ep_main(&o); /* tools/moe/ep.c: over N MPI ranks */
  return moe_run(&o);
}
