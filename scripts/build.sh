#!/usr/bin/env bash
# Configures and builds xte into ${XTE_BUILD_DIR:-build} (warnings are errors).
set -euo pipefail
cd "$(dirname "$0")/.."
bdir=${XTE_BUILD_DIR:-build}
cmake -S . -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DXTE_WERROR=ON "$@" >/dev/null
cmake --build "$bdir" -j"$(nproc)"
