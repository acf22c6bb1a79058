#!/usr/bin/env bash
# tests/dist/ranks_end_to_end.sh LOCKSTEP PROBE WORK_DIR — several ranks as a user meets them:
# `lockstep train --gpus N` on CPU ranks (rank 0 alone prints and writes), the errors of bad
# --gpus values and of launcher variables that disagree with the world, and a failing rank
# (tests/dist/rank_failure_probe.cpp: an error, a killed process, a hang) ending every rank within
# a bound, with an error naming it. Every check prints "ok: ..." or "FAIL ..." with the output; the
# script exits 1 when any check failed. Without mpirun it prints "skipped: ..." and exits 0.
set -u
bin=$1
probe=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
if ! command -v mpirun >/dev/null; then
  echo "skipped: no mpirun on PATH (scripts/setup.sh installs openmpi-bin)"
  exit 0
fi
# OpenMPI 4's shared-memory copies use process_vm_readv, which containers often forbid.
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
mpi=(mpirun --oversubscribe --bind-to none)
[[ $(id -u) == 0 ]] && mpi+=(--allow-run-as-root)
failures=0
out=""

# check CODE SECONDS PATTERN... -- COMMAND...: COMMAND ends within SECONDS (else it is killed)
# with exit status CODE ("nonzero": any but 0 and timeout's 124) and output holding every PATTERN.
check() {
  local code=$1 seconds=$2
  shift 2
  local patterns=()
  while [[ $1 != -- ]]; do
    patterns+=("$1")
    shift
  done
  shift
  out=$(timeout "$seconds" "$@" 2>&1)
  local rc=$?
  local why=""
  if [[ $rc == 124 ]]; then
    why="still running after $seconds s"
  elif [[ $code == nonzero ]]; then
    [[ $rc != 0 ]] || why="exit status 0, expected an error"
  else
    [[ $rc == "$code" ]] || why="exit status $rc, expected $code"
  fi
  for p in "${patterns[@]}"; do
    [[ -n $why || $out == *"$p"* ]] || why="'$p' not in the output"
  done
  if [[ -n $why ]]; then
    echo "FAIL ($why): $*"
    echo "$out" | tail -30 | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: $*"
  fi
}

tiny=(--model.device=cpu --model.builtin_layers=1 --sft.steps=2 --sft.batch_size=4 --run.steps=2
      --run.eval_every=0 --run.eval_problems=4 --rollout.prompts_per_step=4
      --rollout.samples_per_prompt=2 --rollout.max_new_tokens=3)

# --gpus N with CPU ranks: one header, one result line, the run's files written once.
check 0 120 "held-out accuracy (greedy) after 2 GRPO steps" -- \
  "$bin" train --gpus 2 "${tiny[@]}" --run.out_dir="$work/two"
heads=$(grep -c "^lockstep train" <<<"$out")
[[ $heads == 1 ]] && echo "ok: one console header from 2 ranks" ||
  { echo "FAIL: $heads console headers from 2 ranks"; failures=$((failures + 1)); }
lines=$(wc -l <"$work/two/metrics.jsonl" 2>/dev/null || echo 0)
[[ $lines == 2 && -f $work/two/checkpoint/state.json && -f $work/two/metrics.png ]] &&
  echo "ok: metrics (2 steps), checkpoint and plot written" ||
  { echo "FAIL: metrics lines $lines, or no checkpoint / plot in $work/two"; failures=$((failures + 1)); }
# The 2 ranks' checkpoint is sharded (each rank wrote its rows); export puts the masters together
# into one ordinary Hugging Face folder.
[[ -f $work/two/checkpoint/shards/rank-1-of-2.safetensors && ! -f $work/two/checkpoint/model/model.safetensors ]] &&
  echo "ok: each rank wrote its own shard of the checkpoint" ||
  { echo "FAIL: no sharded checkpoint in $work/two/checkpoint"; failures=$((failures + 1)); }
check 0 60 "wrote $work/two_export: bf16 weights, config.json and the tokenizer" -- \
  "$bin" export "${tiny[@]}" --run.out_dir="$work/two" --export.format=bf16 --export.out="$work/two_export"
[[ -f $work/two_export/model.safetensors && -f $work/two_export/tokenizer.json ]] &&
  echo "ok: the export is one folder" ||
  { echo "FAIL: no model.safetensors or tokenizer.json in $work/two_export"; failures=$((failures + 1)); }
# --gpus before the config file, as any option.
printf '[rollout]\nprompts_per_step = 4\n' >"$work/two.toml"
check 0 20 "prompts_per_step = 4" -- "$bin" train --gpus 2 "$work/two.toml" --check
# The 2-rank run resumes on one rank (the whole masters and moments put together from the shards).
check 0 120 "resuming from its checkpoint: SFT step 2 of 2, GRPO step 2 of 3" -- \
  "$bin" train "${tiny[@]}" --run.steps=3 --run.resume=true --run.out_dir="$work/two"
lines=$(wc -l <"$work/two/metrics.jsonl" 2>/dev/null || echo 0)
[[ $lines == 3 ]] && echo "ok: the resumed run logged step 3" ||
  { echo "FAIL: $lines metrics lines after resuming, expected 3"; failures=$((failures + 1)); }
# The same by hand under mpirun, with the launcher variables of each rank agreeing.
check 0 120 "held-out accuracy (greedy) after SFT" -- \
  "${mpi[@]}" -np 2 -x WORLD_SIZE=2 "$bin" sft "${tiny[@]}" --run.out_dir="$work/by_hand"

# Bad --gpus values and what does not divide.
for bad in 0 -1 abc 2x 99999; do
  check 1 20 "--gpus '$bad': expected a whole number of ranks from 1 to 1024" -- "$bin" train --gpus "$bad"
done
check 1 20 "--gpus needs a value" -- "$bin" train --gpus
check 1 20 "--gpus applies to train and sft, not eval" -- "$bin" eval --gpus=2
check 1 20 "rollout.prompts_per_step = 4 does not divide among 3 ranks" -- \
  "$bin" train --gpus 3 "${tiny[@]}" --run.out_dir="$work/indivisible"
check 1 20 "loss.dynamic_sampling is not supported with several ranks" -- \
  "$bin" train --gpus 2 "${tiny[@]}" --loss.dynamic_sampling=true --run.out_dir="$work/dynamic"
check 1 60 "[rank 0] lockstep: --gpus 3, but this process is rank 0 of 2" -- \
  "${mpi[@]}" -np 2 "$bin" train --gpus 3 "${tiny[@]}" --run.out_dir="$work/mismatch"

# Launcher variables that disagree with the world.
check 1 20 "environment variable WORLD_SIZE=2, but this process was not started by mpirun" "--gpus 2" -- \
  env WORLD_SIZE=2 "$bin" train "${tiny[@]}" --run.out_dir="$work/env"
check 1 20 "environment variable RANK='x': expected a whole number" -- \
  env RANK=x "$bin" train "${tiny[@]}" --run.out_dir="$work/env"
check nonzero 60 "lockstep: environment variable WORLD_SIZE=3, but mpirun started 2 ranks" -- \
  "${mpi[@]}" -np 2 -x WORLD_SIZE=3 "$bin" train "${tiny[@]}" --run.out_dir="$work/env"
check nonzero 60 "[rank 1] lockstep: environment variable LOCAL_RANK=0, but this process is local rank 1" -- \
  "${mpi[@]}" -np 2 -x LOCAL_RANK=0 "$bin" train "${tiny[@]}" --run.out_dir="$work/env"
check 1 20 "LOCKSTEP_DIST_TIMEOUT_S='soon': expected a number of seconds > 0" -- \
  env LOCKSTEP_DIST_TIMEOUT_S=soon "$bin" train "${tiny[@]}" --run.out_dir="$work/env"
check 1 20 "lockstep eval runs as one process, not as 2 ranks under mpirun" -- \
  env OMPI_COMM_WORLD_SIZE=2 "$bin" eval "${tiny[@]}" --run.out_dir="$work/env"

# A failing rank ends every rank, within a bound, with its rank named.
check 0 60 "rank 0: sum 3" "rank 2: sum 3" -- "${mpi[@]}" -np 3 "$probe" none 0
check nonzero 60 "[rank 1] lockstep: a planted failure on rank 1" "rank 1" -- "${mpi[@]}" -np 3 "$probe" error 1
check nonzero 60 "rank 2" "signal 9" -- "${mpi[@]}" -np 3 "$probe" die 2
check nonzero 60 "lockstep: all_reduce_sum waited more than 2 s for the other ranks" -- \
  "${mpi[@]}" -np 2 -x LOCKSTEP_DIST_TIMEOUT_S=2 "$probe" hang 1

if ((failures)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
