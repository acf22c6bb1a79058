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

# NVIDIA's header-only C++ libraries come from their PyPI wheels (nothing else is downloaded): only
# the headers are kept, in .deps/ (git-ignored). Headers are the same in every wheel of a version,
# so any one wheel will do. Without them the build goes on without the paths that use them.
#   install_headers NAME VERSION WHEEL_PREFIX   e.g. "include/" keeps include/ of the wheel
install_headers() {
  local name=$1 version=$2 prefix=$3
  local dir
  dir="$(cd "$(dirname "$0")/.." && pwd)/.deps/$name"
  [[ "$(cat "$dir/VERSION" 2>/dev/null)" == "$version" ]] && return 0
  echo "setup: installing the $name $version headers into $dir"
  local wheel_dir
  wheel_dir=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
       --platform manylinux_2_28_x86_64 -d "$wheel_dir" "$4==$version" &&
     rm -rf "$dir" &&
     python3 -c 'import os, sys, zipfile
z, prefix, out = zipfile.ZipFile(sys.argv[1]), sys.argv[2], sys.argv[3]
for n in z.namelist():
    if n.startswith(prefix) and not n.endswith("/"):
        path = os.path.join(out, "include", n[len(prefix):])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f: f.write(z.read(n))' \
       "$wheel_dir"/*.whl "$prefix" "$dir"; then
    echo "$version" > "$dir/VERSION"
  else
    echo "setup: could not install the $name headers; building without them" >&2
  fi
  rm -rf "$wheel_dir"
}
# The cuDNN frontend: cuDNN's fused attention in ops/cuda/attention_cudnn.cpp.
install_headers cudnn-frontend 1.32.0 include/ nvidia-cudnn-frontend
