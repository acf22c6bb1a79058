#!/usr/bin/env bash
# Installs what lockstep needs to build and test and is missing, from Debian packages only.
# The CUDA toolkit (nvcc, cuBLASLt) is optional: without it the CPU backend builds alone.
# OpenMPI (libopenmpi-dev, openmpi-bin's mpirun) runs several ranks: `lockstep train --gpus N`,
# the CPU collectives and the tests under `mpirun -np 2/3` (dist/); with nvcc, NCCL (from its
# PyPI wheel, below) moves CUDA tensors between the ranks.
set -euo pipefail

packages=(cmake ninja-build g++ pkg-config libgtest-dev libomp-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev
  libtomlplusplus-dev zlib1g-dev libopenmpi-dev openmpi-bin
  ccache  # scripts/test.sh: its CPU-only build reuses the CUDA build's objects where they are the same
  clang libclang-rt-14-dev)  # the sanitized build and the libFuzzer harnesses (scripts/test.sh)

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

# NVIDIA's libraries that lockstep builds against come from their PyPI wheels (nothing else is
# downloaded), unpacked into .deps/NAME (git-ignored). Without them the build goes on without the
# paths that use them.
#   install_wheel NAME VERSION PACKAGE WHEEL_PREFIX:DIR...   e.g. "nvidia/nccl/lib/:lib" unpacks the
#   wheel's nvidia/nccl/lib/ into .deps/NAME/lib
install_wheel() {
  local name=$1 version=$2 package=$3
  shift 3
  local dir
  dir="$(cd "$(dirname "$0")/.." && pwd)/.deps/$name"
  [[ "$(cat "$dir/VERSION" 2>/dev/null)" == "$version" ]] && return 0
  echo "setup: installing $package $version into $dir"
  local wheel_dir
  wheel_dir=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
       --platform manylinux_2_28_x86_64 --platform manylinux_2_18_x86_64 -d "$wheel_dir" \
       "$package==$version" &&
     rm -rf "$dir" &&
     python3 -c 'import os, sys, zipfile
z, out = zipfile.ZipFile(sys.argv[1]), sys.argv[2]
for spec in sys.argv[3:]:
    prefix, sub = spec.rsplit(":", 1)
    for n in z.namelist():
        if n.startswith(prefix) and not n.endswith("/"):
            path = os.path.join(out, sub, n[len(prefix):])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f: f.write(z.read(n))' \
       "$wheel_dir"/*.whl "$dir" "$@"; then
    echo "$version" > "$dir/VERSION"
  else
    echo "setup: could not install $package; building without it" >&2
  fi
  rm -rf "$wheel_dir"
}
# Header-only libraries: headers are the same in every wheel of a version, so any one will do.
#   install_headers NAME VERSION WHEEL_PREFIX PACKAGE   e.g. "include/" keeps include/ of the wheel
install_headers() {
  install_wheel "$1" "$2" "$4" "$3:include"
}
# The cuDNN frontend: cuDNN's fused attention in ops/cuda/attention_cudnn.cpp.
install_headers cudnn-frontend 1.32.0 include/ nvidia-cudnn-frontend
# NCCL (headers and libnccl.so.2): the collectives of CUDA tensors between ranks
# (dist/nccl_group.cpp), only where the CUDA backend can be built. Without it (or on a GPU machine
# without network, where CMake also finds PyTorch's nvidia-nccl wheel) CUDA tensors go through the
# host and MPI.
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  install_wheel nccl 2.28.9 nvidia-nccl-cu13 nvidia/nccl/include/:include nvidia/nccl/lib/:lib
fi
