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

# The cuDNN frontend (header-only C++; cuDNN's fused attention in ops/cuda/attention_cudnn.cpp) comes
# from its PyPI wheel, of which only include/ is kept, in .deps/ (git-ignored). The headers are the
# same in every wheel of a version, so any one wheel will do. Without them the build has no cuDNN path.
frontend_version=1.32.0
frontend_dir="$(cd "$(dirname "$0")/.." && pwd)/.deps/cudnn-frontend"
if [[ "$(cat "$frontend_dir/VERSION" 2>/dev/null)" != "$frontend_version" ]]; then
  echo "setup: installing the cuDNN frontend $frontend_version headers into $frontend_dir"
  wheel_dir=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
       --platform manylinux_2_28_x86_64 -d "$wheel_dir" "nvidia-cudnn-frontend==$frontend_version" &&
     rm -rf "$frontend_dir" &&
     python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])' \
       "$wheel_dir"/*.whl "$frontend_dir"; then
    echo "$frontend_version" > "$frontend_dir/VERSION"
  else
    echo "setup: could not install the cuDNN frontend; building without cuDNN attention" >&2
  fi
  rm -rf "$wheel_dir"
fi
