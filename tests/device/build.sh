#!/usr/bin/env bash
# The carried device build, made on the CPU machine (nvcc compiles and links there; nothing runs):
#   bash tests/device/build.sh [BUILD_DIR]      (default build-device, git-ignored)
# Configures BUILD_DIR for the GPU machine exactly as tests/device/run.sh would (CUDA plugin for
# sm_80, sm_89 and sm_90a: XTE_CUDA_ARCH; no SIMDe, no Criterion, no Google Benchmark; the
# GPU-only xte program), builds only what run.sh runs, and writes BUILD_DIR/xte_carried.txt: the
# hash of the sources (tests/device/srchash.sh), the nvcc and its CUDA runtime version (the plugin
# links it statically: the driver must support it), the architectures. run.sh uses the build as
# it is when the hash matches the tree it runs in, else it builds on the device (the fallback).
# The `run` tool carries BUILD_DIR with the working tree (see tests/device/README.md: it must
# stay under 64 MiB; this prints its size). XTE_DEVICE_JOBS: build jobs (default 2).
set -euo pipefail
cd "$(dirname "$0")/../.."
bdir=${1:-build-device}
arch=${XTE_CUDA_ARCH:-80;89;90a}
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || {
  echo "build.sh: no nvcc (PATH, /usr/local/cuda/bin)" >&2
  exit 1
}
gen=()
command -v ninja >/dev/null && [ ! -f "$bdir/CMakeCache.txt" ] && gen=(-G Ninja)
cmake -S . -B "$bdir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DXTE_CUDA=ON -DXTE_MUSA=OFF -DXTE_WERROR=OFF -DXTE_SIMDE=OFF \
  -DXTE_BUILD_TESTS=ON -DXTE_NO_CRITERION=ON -DXTE_BUILD_BENCH=ON -DXTE_BENCH_GPU_ONLY=ON >/dev/null
# shellcheck disable=SC2046
cmake --build "$bdir" -j"${XTE_DEVICE_JOBS:-2}" --target $(bash tests/device/run.sh --targets)
rt=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' | head -1)
{
  echo "srchash $(bash tests/device/srchash.sh)"
  echo "cuda_runtime $rt"
  echo "nvcc $("$nvcc" --version | tail -1)"
  echo "arch $arch"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
} >"$bdir/xte_carried.txt"
cat "$bdir/xte_carried.txt"
echo "size: $(du -sm "$bdir" | cut -f1) MiB (the run tool carries at most 64 MiB)"
