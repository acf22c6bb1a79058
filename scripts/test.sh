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
# The C++ compiles go through ccache where it is installed (scripts/setup.sh installs it), with the
# cache in $build: the CPU-only build below then compiles only the sources whose preprocessed text
# differs without CUDA, and takes the CUDA build's object for every other source (ccache's
# preprocessor mode hashes that text and the flags other than -D and -I, so a hit is the object the
# compiler would make).
export CCACHE_DIR="$(realpath -m "$build")/ccache"
launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=$(command -v ccache || true)"
# AUTO: CUDA whenever nvcc exists (train_default.sh may have left OFF in the cache).
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=AUTO "$launcher"
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
if command -v nvcc > /dev/null; then
  cmake -S . -B "$build-cpu-only" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=OFF "$launcher"
  cmake --build "$build-cpu-only" -j "$(nproc)"
  # Only the tests labelled without_cuda (tests/CMakeLists.txt: the binaries whose sources name the
  # CUDA switch or a CUDA device; the GPU tests among them skip here as above). Every other test
  # runs the same CPU code in both builds and ran above.
  ctest --test-dir "$build-cpu-only" --output-on-failure -j "$(nproc)" -L without_cuda "$@"
fi
# Sanitizers and fuzzing (docs/reliability.md), where clang is installed (scripts/setup.sh installs
# it): one clang build, CPU only, with AddressSanitizer + UndefinedBehaviorSanitizer in every target
# (any report fails) and the libFuzzer harnesses of tests/fuzz/ (-DLOCKSTEP_FUZZ=ON). It runs each
# harness for 2000 inputs from its seeds (ctest label fuzz), then, sanitized, the test binaries in
# $sanitized: everything that reads outside input (io, tasks, the run config), checkpoints
# (writing, loading, fault injection; test_model's *Checkpoint* tests only), core and numerics,
# about 1 min on 2 cores. Left out: test_core's two every-float conversion tests (2^32 inputs each,
# about 3 min of CPU sanitized; the first build runs them), and the ops, model, rollout
# and training-loop tests, for CI's time (their cost is model arithmetic, which ASan slows
# several-fold, and they read no outside input). All of them, sanitized:
#   ctest --test-dir build-sanitize -L cpu   (after building them there)
sanitized=(test_io_files test_tokenizer test_cli_config test_tasks test_checkpoint_faults
  "test_model '--gtest_filter=*Checkpoint*'" "test_core '--gtest_filter=-*OnEveryFloat'" test_numerics)
if command -v clang++ > /dev/null; then
  # -O1 -gline-tables-only: a cheaper compile and link than RelWithDebInfo's -O2 -g, and the
  # sanitizers' reports still name file and line.
  cmake -S . -B "$build-sanitize" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOCKSTEP_CUDA=OFF \
    -DLOCKSTEP_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG"
  fuzzers=(safetensors model_config tokenizer_load tokenizer_encode jinja chat cli_config dataset verifier)
  cmake --build "$build-sanitize" -j "$(nproc)" --target "${sanitized[@]%% *}" "${fuzzers[@]/#/fuzz_}"
  ctest --test-dir "$build-sanitize" --output-on-failure -j "$(nproc)" -L fuzz
  # One binary per job, its output shown only when it fails.
  run_sanitized() {
    local log="${1%% *}.log"
    (cd "$sanitize_tests" && eval "OMP_NUM_THREADS=1 ./$1" > "$log" 2>&1) ||
      { cat "$sanitize_tests/$log"; echo "sanitized: $1 failed" >&2; return 1; }
  }
  export -f run_sanitized
  export sanitize_tests="$PWD/$build-sanitize/tests"
  printf '%s\n' "${sanitized[@]}" | xargs -P "$(nproc)" -I{} bash -c 'run_sanitized "$1"' _ {}
fi
