#!/usr/bin/env bash
# tests/cli/moe_train.sh LOCKSTEP TINY_MOE_MODEL WORK_DIR — `lockstep train` on a mixture-of-experts
# checkpoint on the CPU: a tiny Qwen3-MoE (tests/cli/tiny_moe_model.cpp, with the builtin model's
# tokenizer) trains two GRPO steps in each precision mode, logs the router metrics (the routing
# disagreement 0 where rollout and training compute the same function), trains with routing replay
# and the router z-loss, and its checkpoint loads again. Every check prints "ok: ..." or "FAIL ..."; the script exits 1 when any failed.
set -u
bin=$1
make_moe=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
failures=0

# run DESCRIPTION COMMAND...: COMMAND exits 0 (its output is shown when it does not).
run() {
  local what=$1
  shift
  if out=$("$@" 2>&1); then echo "ok: $what"; else echo "FAIL: $what: $*"; echo "$out" | tail -30 | sed 's/^/    /'; failures=$((failures + 1)); fi
}
fact() {
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}

# The builtin model's tokenizer, from a one-step SFT run's checkpoint.
run "a builtin checkpoint for its tokenizer" "$bin" sft --model.device=cpu --model.builtin_layers=2 --sft.steps=1 \
  --sft.batch_size=2 --run.eval_every=0 --run.eval_problems=2 --run.out_dir="$work/base"
run "a tiny Qwen3-MoE checkpoint" "$make_moe" "$work/base/checkpoint/model" "$work/moe"
fact "its config.json is a Qwen3MoeForCausalLM" grep -q '"Qwen3MoeForCausalLM"' "$work/moe/config.json"

tiny=(--model.device=cpu --model.path="$work/moe" --sft.steps=0 --run.steps=2 --run.eval_every=0 --run.eval_problems=4
      --rollout.prompts_per_step=2 --rollout.samples_per_prompt=2 --rollout.max_new_tokens=4)
for precision in fp8 bf16 fp8-rollout; do
  run "2 GRPO steps of the MoE model in $precision" "$bin" train "${tiny[@]}" --model.precision=$precision \
    --run.out_dir="$work/$precision"
  fact "$precision: metrics.jsonl has 2 steps" test "$(wc -l < "$work/$precision/metrics.jsonl")" -eq 2
  fact "$precision: the load-balancing loss is logged" grep -q '"router_aux_loss":[0-9]' "$work/$precision/metrics.jsonl"
  fact "$precision: the expert load is logged" grep -q '"expert_tokens_max":\[[0-9]' "$work/$precision/metrics.jsonl"
  fact "$precision: the routing disagreement is logged" grep -q '"routing_disagreement":[0-9]' "$work/$precision/metrics.jsonl"
done
for precision in fp8 bf16; do
  fact "$precision: no token routes differently in rollout and training" \
    test "$(grep -cE '"routing_disagreement":0(\.0)?[,}]' "$work/$precision/metrics.jsonl")" -eq 2
done
run "2 GRPO steps with routing replay and the router z-loss" "$bin" train "${tiny[@]}" --model.routing_replay=true \
  --loss.router_z_coef=0.001 --run.out_dir="$work/replay"
fact "replay: the router z-loss is logged" grep -q '"router_z_loss":[0-9]' "$work/replay/metrics.jsonl"
fact "replay: no token routes differently" test "$(grep -cE '"routing_disagreement":0(\.0)?[,}]' "$work/replay/metrics.jsonl")" -eq 2
# The run's own checkpoint is a Qwen3-MoE again, which the command serves.
fact "the trained checkpoint is a Qwen3MoeForCausalLM" grep -q '"Qwen3MoeForCausalLM"' "$work/fp8/checkpoint/model/config.json"
run "generate from the trained MoE checkpoint" "$bin" generate --model.device=cpu --run.out_dir="$work/fp8" \
  --generate.prompt=1+1= --generate.n=2 --generate.max_new_tokens=4

echo "$failures failed"
[[ $failures == 0 ]]
