#!/usr/bin/env bash
# Installs what xte's build and tests need on a Debian machine, skipping what is present.
set -euo pipefail
pkgs=(cmake ninja-build pkg-config gcc g++ libhwloc-dev libopenblas-dev libcriterion-dev
      openmpi-bin libopenmpi-dev
      libbenchmark-dev libsimde-dev python3 python3-venv clang libclang-rt-14-dev
      qemu-user)
missing=()
for p in "${pkgs[@]}"; do
  grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
