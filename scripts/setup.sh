#!/usr/bin/env bash
# Installs what lockstep needs to build and test and is missing, from Debian packages only.
# The CUDA toolkit (nvcc, cuBLASLt) is optional: without it the CPU backend builds alone.
set -euo pipefail

packages=(cmake ninja-build g++ pkg-config libgtest-dev libomp-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev
  libtomlplusplus-dev zlib1g-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "setup: nvcc found at /usr/local/cuda/bin (add it to PATH to build the CUDA backend)"
fi
