#!/usr/bin/env bash
# Runs every libFuzzer harness (tests/fuzz/) for SECONDS each, one after the other (one job: the
# machine's cores are shared), and prints per harness the executions, the time and what it found.
#   bash scripts/fuzz.sh SECONDS [BUILD_DIR] [HARNESS...]
# BUILD_DIR (default build-fuzz) is configured and built here when it does not hold the harnesses:
#   cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOCKSTEP_CUDA=OFF \
#     -DLOCKSTEP_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++
# Each harness keeps what it finds in BUILD_DIR/tests/fuzz/corpus/NAME (reused by the next run), and
# writes a crashing input to BUILD_DIR/tests/fuzz/artifacts/NAME-crash-*; its log is
# BUILD_DIR/tests/fuzz/logs/NAME.log.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:?usage: scripts/fuzz.sh SECONDS [BUILD_DIR] [HARNESS...]}
build=${2:-build-fuzz}
shift $(($# < 2 ? $# : 2))
harnesses=("$@")
if ((${#harnesses[@]} == 0)); then
  harnesses=(safetensors model_config tokenizer_load tokenizer_encode jinja chat cli_config dataset verifier)
fi
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOCKSTEP_CUDA=OFF \
    -DLOCKSTEP_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++
fi
cmake --build "$build" -j 2 --target "${harnesses[@]/#/fuzz_}"
dir=$build/tests/fuzz
mkdir -p "$dir/logs"
printf '%-18s %12s %8s %s\n' harness executions seconds result
status=0
for h in "${harnesses[@]}"; do
  result=ok
  OMP_NUM_THREADS=1 "$dir/fuzz_$h" -max_total_time="$seconds" -print_final_stats=1 -timeout=30 \
    -rss_limit_mb=2048 -artifact_prefix="$dir/artifacts/$h-" "$dir/corpus/$h" "$dir/seeds/$h" \
    > "$dir/logs/$h.log" 2>&1 || { result="FOUND (see $dir/logs/$h.log)"; status=1; }
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/logs/$h.log" | tail -1)
  time=$(sed -n 's/.*Done \([0-9]*\) runs in \([0-9]*\) second.*/\2/p' "$dir/logs/$h.log" | tail -1)
  printf '%-18s %12s %8s %s\n' "$h" "${runs:-?}" "${time:-$seconds}" "$result"
done
exit $status
