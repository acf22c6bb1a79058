#!/usr/bin/env bash
# The test command: installs what is missing, builds (CPU + CUDA when nvcc exists) and runs every
# test. GPU tests (label `gpu`) report as skipped on a machine without a GPU. Where nvcc exists it
# also builds and tests without CUDA (in $build-cpu-only), since a CPU-only build must keep working
# and its `#if !LOCKSTEP_HAS_CUDA` branches compile nowhere else.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# A real trained model for the `real_model` tests, fetched and converted once into .deps/models/
# (LOCKSTEP_REAL_MODEL=0 skips it; so does a machine without network, and the tests then skip).
if [[ ${LOCKSTEP_REAL_MODEL:-1} != 0 && ! -f .deps/models/smollm2-135m-instruct/config.json ]]; then
  bash scripts/get_model.sh smollm2-135m-instruct .deps/models/smollm2-135m-instruct ||
    echo "test.sh: could not get SmolLM2-135M-Instruct; the real_model tests will skip" >&2
fi
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="/usr/local/cuda/bin:$PATH"
build=${BUILD_DIR:-build}
# AUTO: CUDA whenever nvcc exists (train_default.sh may have left OFF in the cache).
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=AUTO
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
if command -v nvcc > /dev/null; then
  cmake -S . -B "$build-cpu-only" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=OFF
  cmake --build "$build-cpu-only" -j "$(nproc)"
  ctest --test-dir "$build-cpu-only" --output-on-failure -j "$(nproc)" "$@"
fi
