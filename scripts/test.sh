#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test through ctest, as
# many tests at a time as the machine has CPUs (XTE_CTEST_JOBS overrides; most tests run on one
# thread, the ordering ones are ctest fixtures / DEPENDS).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
cd "${XTE_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 3000 -j"${XTE_CTEST_JOBS:-$(nproc)}" "$@"
