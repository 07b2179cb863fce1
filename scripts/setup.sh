#!/usr/bin/env bash
# New machine: installs what is missing, builds xte, and runs the main job: `xte info`, then
# the Kimi-K2-style MoE layer (`xte moe`) when that command is built, else the quantize bench.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
bdir=${XTE_BUILD_DIR:-build}
"$bdir/xte" info
if grep -q '^  moe ' <<<"$("$bdir/xte" help)"; then
  "$bdir/xte" moe "$@"
else
  "$bdir/xte" bench quantize --filter 64MiB --min-time 0.2
fi
