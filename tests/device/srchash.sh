#!/usr/bin/env bash
# Prints one hash of the sources a device build is made of (C / C++ / CUDA sources and headers,
# CMake files, the plugin's version script), from the repository root. tests/device/build.sh
# records it with the carried build; tests/device/run.sh compares it with the working tree it
# runs in, so that a build older than the sources is never used (it builds again instead).
set -euo pipefail
cd "$(dirname "$0")/../.."
find CMakeLists.txt cmake include src tests bench tools -type f \
  \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.cc' \
  -o -name '*.cmake' -o -name 'CMakeLists.txt' -o -name '*.map' -o -name '*.inc' \) \
  -not -path '*/__pycache__/*' -print0 2>/dev/null | LC_ALL=C sort -z | xargs -0 sha256sum |
  sha256sum | cut -c1-16
