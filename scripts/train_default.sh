#!/usr/bin/env bash
# The main command: installs what is missing, builds, and runs the built-in default job — a tiny
# model learning synthetic arithmetic from scratch (SFT, then GRPO in the unified fp8 mode: emulated
# exactly on the CPU, real on a GPU) — then draws its curves. Outputs in runs/default/. Extra
# arguments go to `lockstep train` (e.g. --run.steps=20).
#
# The CUDA backend is built only where it can run: when nvcc is present and a GPU is visible
# (`nvidia-smi -L` lists one, or /dev/nvidia0 exists). LOCKSTEP_CUDA=ON builds it anyway (e.g. to
# carry the build to a GPU machine), LOCKSTEP_CUDA=OFF never; compiling it takes minutes on a small
# machine. scripts/test.sh (CI) always builds both.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="/usr/local/cuda/bin:$PATH"
gpu_visible() { { command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; } || [[ -e /dev/nvidia0 ]]; }
cuda=${LOCKSTEP_CUDA:-}
if [[ -z "$cuda" ]]; then
  if command -v nvcc > /dev/null && gpu_visible; then cuda=ON; else cuda=OFF; fi
fi
[[ "$cuda" == ON || "$cuda" == OFF ]] || { echo "LOCKSTEP_CUDA must be ON or OFF, not '$cuda'" >&2; exit 2; }
build=${BUILD_DIR:-build}
echo "train_default.sh: CUDA backend $cuda"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA="$cuda"
cmake --build "$build" -j "$(nproc)" --target lockstep_cli
"$build/lockstep" train "$@"
