#!/usr/bin/env bash
# The main command: installs what is missing, builds, and runs the built-in default job — a tiny
# model learning synthetic arithmetic from scratch (SFT, then GRPO in the unified fp8 mode: emulated
# exactly on the CPU, real on a GPU) — then draws its curves. Outputs in runs/default/. Extra
# arguments go to `lockstep train` (e.g. --run.steps=20).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="/usr/local/cuda/bin:$PATH"
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)" --target lockstep_cli
"$build/lockstep" train "$@"
