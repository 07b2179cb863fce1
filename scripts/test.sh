#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
cd "${XTE_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 3000 "$@"
