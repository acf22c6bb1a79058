#!/usr/bin/env bash
# tests/cli/cli_end_to_end.sh LOCKSTEP WORK_DIR — the `lockstep` command as a user meets it: exit
# codes and messages of help and of bad input, tiny SFT/GRPO runs of the builtin model (seconds on
# the CPU), the model that eval/generate serve, resuming, the console's lines and the plots. Every
# check prints "ok: ..." or "FAIL ..." with the output; the script exits 1 when any check failed.
set -u
bin=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
failures=0
out=""

# check CODE PATTERN... -- COMMAND...: COMMAND's exit status is CODE and its output (stdout and
# stderr) holds every PATTERN (fixed strings). The output is left in $out.
check() {
  local code=$1
  shift
  local patterns=()
  while [[ $1 != -- ]]; do
    patterns+=("$1")
    shift
  done
  shift
  out=$("$@" 2>&1)
  local rc=$?
  local why=""
  [[ $rc == "$code" ]] || why="exit status $rc, expected $code"
  for p in "${patterns[@]}"; do
    [[ -n $why || $out == *"$p"* ]] || why="'$p' not in the output"
  done
  if [[ -n $why ]]; then
    echo "FAIL ($why): $*"
    echo "$out" | head -30 | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: $*"
  fi
}

# fact DESCRIPTION CONDITION...: a check of something else than a command's output.
fact() {
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}

# Every line of $out within 100 columns.
fits() { awk 'length($0) > 100 { bad = 1 } END { exit bad }' <<< "$out"; }

# --- help and usage ---
for h in --help -h help; do
  check 0 "subcommands:" "lockstep plot --compare RUN_DIR" -- "$bin" "$h"
done
check 2 "usage: lockstep" -- "$bin"
check 2 "unknown subcommand 'frobnicate'" "usage: lockstep" -- "$bin" frobnicate
check 0 "[sft]" "steps = 900" "[loss]" "[rollout]" -- "$bin" train --help
check 0 "[sft]" "[optim]" -- "$bin" help train
check 0 "--compare RUN_DIR..." "compare.png" -- "$bin" plot --help

# --- bad model folders and prompts ---
check 1 "model.path = $work/nope: no such folder" -- "$bin" eval --model.path="$work/nope" --run.out_dir="$work/x"
touch "$work/file"
check 1 "model.path = $work/file: a file, not a folder" -- "$bin" eval --model.path="$work/file" --run.out_dir="$work/x"
mkdir -p "$work/empty"
check 1 "model.path = $work/empty: the folder has no config.json" -- "$bin" generate --generate.prompt=1+1= \
  --model.path="$work/empty" --run.out_dir="$work/x"
check 1 "generate.prompt: the builtin model reads only the characters 0123456789+-*=" "'h' at position 0" -- \
  "$bin" generate --generate.prompt=hello --model.device=cpu --run.out_dir="$work/x"
check 1 'data.test = "word-problems" is English text, which model.path = "builtin" cannot read' \
  "give a Hugging Face model" -- "$bin" eval --data.test=word-problems --model.device=cpu --run.out_dir="$work/x"

# --- two tiny SFT runs of different seeds (different weights) ---
small=(--model.device=cpu --model.builtin_layers=1 --sft.steps=3 --sft.batch_size=8 --run.eval_problems=8
       --run.eval_every=0 --rollout.prompts_per_step=2 --rollout.samples_per_prompt=2 --rollout.max_new_tokens=4)
check 0 "lockstep sft | CPU (1 thread) | builtin (qwen3, " "sft  3/3" "elapsed" -- \
  "$bin" sft "${small[@]}" --run.out_dir="$work/a" --run.seed=1
starts_with() { [[ $1 == "$2"* ]]; }
fact "sft's first line says what runs" starts_with "$(head -1 <<< "$out")" "lockstep sft | CPU"
fact "sft's lines fit 100 columns" fits
check 0 "" -- "$bin" sft "${small[@]}" --run.out_dir="$work/b" --run.seed=2

# --- eval and generate serve model.path when given, else the checkpoint in run.out_dir ---
gen=(generate --generate.prompt=12+7= --generate.n=4 --generate.temperature=1 --generate.max_new_tokens=4
     --model.device=cpu)
check 0 "lockstep generate | CPU" "a/checkpoint/model (qwen3" -- "$bin" "${gen[@]}" --run.out_dir="$work/a"
samples_a=$(grep -v '^lockstep' <<< "$out")
check 0 "" -- "$bin" "${gen[@]}" --run.out_dir="$work/b"
samples_b=$(grep -v '^lockstep' <<< "$out")
check 0 "checkpoint/model (qwen3" -- "$bin" "${gen[@]}" --run.out_dir="$work/a" --model.path="$work/b/checkpoint/model"
samples_ab=$(grep -v '^lockstep' <<< "$out")
fact "the two runs generate differently" test "$samples_a" != "$samples_b"
fact "--model.path=B generates as B, not as the checkpoint in run.out_dir=A" test "$samples_ab" == "$samples_b"
check 0 "lockstep eval | CPU" "b/checkpoint/model (qwen3" "held-out accuracy on 8 problems" "eval" -- \
  "$bin" eval --model.device=cpu --run.eval_problems=8 --run.out_dir="$work/a" --model.path="$work/b/checkpoint/model"
fact "eval's lines fit 100 columns" fits

# --- export: the served model as a checkpoint to serve, which lockstep loads again ---
check 0 "lockstep export | CPU" "wrote $work/fp8: block-FP8" "6 of 7 projection weights hold the fp8 recipe's own E4M3" \
  "the other 1 (v_proj) start inside a 128-row block" -- \
  "$bin" export --run.out_dir="$work/a" --export.out="$work/fp8"
fact "the export holds the tokenizer" test -f "$work/fp8/tokenizer.json"
fact "the export's config.json names its quantization" grep -q '"quant_method": "fp8"' "$work/fp8/config.json"
check 0 "fp8 (qwen3" -- "$bin" "${gen[@]}" --run.out_dir="$work/b" --model.path="$work/fp8"
samples_fp8=$(grep -v '^lockstep' <<< "$out")
fact "the fp8 export generates as the run it came from" test "$samples_fp8" == "$samples_a"
check 0 "wrote $work/bf16: bf16 weights" -- "$bin" export --run.out_dir="$work/a" --export.out="$work/bf16" \
  --export.format=bf16
check 1 "export.format must be one of" "fp4" -- "$bin" export --run.out_dir="$work/a" --export.format=fp4

# --- resuming: where it resumes, and a complete run says so ---
check 0 "the run is already complete: nothing to do (a larger --sft.steps continues it)" -- "$bin" sft "${small[@]}" --run.out_dir="$work/a" --run.resume=true
check 0 "resuming from its checkpoint: SFT step 3 of 3, GRPO step 0 of 2" \
  "held-out accuracy (greedy) after 2 GRPO steps" -- \
  "$bin" train "${small[@]}" --run.steps=2 --run.out_dir="$work/a" --run.resume=true
fact "train's lines fit 100 columns" fits
check 0 "the run is already complete" "its last held-out accuracy (greedy): " -- \
  "$bin" train "${small[@]}" --run.steps=2 --run.out_dir="$work/a" --run.resume=true
fact "a complete run prints no NaN" test "${out/nan/}" == "$out"

# --- plots ---
check 0 "wrote $work/a/metrics.png" -- "$bin" plot "$work/a"
fact "metrics.png is a PNG" test "$(head -c 4 "$work/a/metrics.png" | tail -c 3)" == "PNG"
check 0 "wrote $work/cmp.png" -- "$bin" plot --compare "$work/a" "$work/b" --out="$work/cmp.png"
fact "cmp.png is a PNG" test "$(head -c 4 "$work/cmp.png" | tail -c 3)" == "PNG"
check 0 "wrote $work/compare.png" -- "$bin" plot --compare "$work/a" "$work/b"
check 1 "$work/none: no metrics.jsonl or sft_metrics.jsonl" -- "$bin" plot --compare "$work/a" "$work/none"
check 0 "wrote $work/labelled.png" -- "$bin" plot --compare "$work/a" "$work/b" --labels=first,second \
  --steps=1:2 --bin-tokens=4 --out="$work/labelled.png"
check 0 "wrote $work/a_window.png" -- "$bin" plot "$work/a" --steps=2: --out="$work/a_window.png"
check 1 "plot --compare --labels: 1 labels for 2 run folders" -- \
  "$bin" plot --compare "$work/a" "$work/b" --labels=one
check 1 "plot --compare --labels: label 2 is empty" -- "$bin" plot --compare "$work/a" "$work/b" --labels=one,
check 1 "plot --steps: '5' is not FIRST:LAST" -- "$bin" plot "$work/a" --steps=5
check 1 "plot --steps: '3:1' ends before it starts" -- "$bin" plot "$work/a" --steps=3:1
check 1 "plot --steps: 'x' is not a number" -- "$bin" plot "$work/a" --steps=x:4
check 1 "plot --bin-tokens: 0 is not a whole number >= 1" -- "$bin" plot "$work/a" --bin-tokens=0
check 1 "plot: unknown option '--colour=red'" -- "$bin" plot "$work/a" --colour=red
check 1 "plot takes one run folder" -- "$bin" plot "$work/a" "$work/b"
cp "$work/a/metrics.jsonl" "$work/a_metrics.jsonl"
check 0 "wrote $work/a_metrics.png" -- "$bin" plot "$work/a_metrics.jsonl"
check 0 "wrote $work/compare.png" -- "$bin" plot --compare "$work/a_metrics.jsonl" "$work/b"

echo "$failures failed"
[[ $failures == 0 ]]
