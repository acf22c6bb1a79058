#!/usr/bin/env python3
"""TRL's GRPOTrainer on a Hugging Face model and a GSM8K JSONL file, timed per optimizer step: the
peer lockstep's GRPO step time is compared with (docs/experiments.md, "Time").

  python3 scripts/dev/bench_trl_grpo.py MODEL_DIR GSM8K.jsonl [--prompts 32] [--samples 8]
      [--new 128] [--temperature 0.7] [--lr 1e-5] [--steps 6] [--json FILE]

One step = one generation of prompts × samples completions (transformers' generate, no vLLM), the
rewards (1 when the last number of the completion equals the reference answer, as
lockstep's tasks/verifier.h), and one optimizer step over all of them (no gradient accumulation,
no KL term: beta 0), bf16. Prompts go through the model's chat template as a user message. The
step time is measured between on_step_begin and on_step_end with the GPU synchronized; the first
step is warm-up and left out of the mean.
"""
import argparse
import json
import re
import time

import pyarrow
import torch
import transformers
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

NUMBER = re.compile(r"-?[\d,]*\.?\d+")


def last_number(text):
    found = NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def reward_answer(completions, answer, **_):
    out = []
    for completion, reference in zip(completions, answer):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        got = last_number(text)
        out.append(1.0 if got is not None and abs(got - float(reference.replace(",", ""))) < 1e-9 else 0.0)
    return out


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepTimer(transformers.TrainerCallback):
    def __init__(self):
        self.times = []

    def on_step_begin(self, args, state, control, **_):
        sync()
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **_):
        sync()
        self.times.append(time.perf_counter() - self.start)


def device_name():
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("gsm8k")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json")
    args = parser.parse_args()

    rows = [json.loads(line) for line in open(args.gsm8k) if line.strip()]
    table = pyarrow.Table.from_pylist([{"prompt": [{"role": "user", "content": r["question"]}],
                                        "answer": r["answer"].split("####")[-1].strip()}
                                       for r in rows[: args.prompts * args.steps]])
    # An explicit fingerprint: datasets' own (a dill hash of the table's state) fails on some
    # pyarrow versions.
    data = Dataset(table, fingerprint=f"gsm8k-{args.prompts}x{args.steps}")
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    completions = args.prompts * args.samples
    config = GRPOConfig(output_dir="/tmp/trl_grpo", learning_rate=args.lr, max_steps=args.steps,
                        per_device_train_batch_size=completions, gradient_accumulation_steps=1,
                        num_generations=args.samples, max_completion_length=args.new,
                        temperature=args.temperature, beta=0.0, lr_scheduler_type="constant",
                        bf16=torch.cuda.is_available(), logging_steps=1,
                        save_strategy="no", report_to="none", shuffle_dataset=False, seed=1)
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward_answer,
                          args=config, train_dataset=data, callbacks=[timer])
    trainer.train()

    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    steps = []
    for i, (seconds, log) in enumerate(zip(timer.times, logs)):
        length = log["completions/mean_length"]
        steps.append({"step": i + 1, "time_step": seconds, "response_length": length,
                      "reward_mean": log.get("reward"), "tokens_per_s": completions * length / seconds})
        print(f"step {i + 1}: {seconds:.2f} s, mean completion {length:.1f} tokens, "
              f"{completions * length / seconds:.0f} generated tokens/s, reward {log.get('reward')}")
    timed = steps[1:]
    if timed:
        mean = sum(s["time_step"] for s in timed) / len(timed)
        rate = sum(s["tokens_per_s"] for s in timed) / len(timed)
        print(f"steps 2-{len(steps)}: {mean:.2f} s a step, {rate:.0f} generated tokens/s "
              f"(TRL {__import__('trl').__version__}, transformers {transformers.__version__}, "
              f"{device_name()})")
    if args.json:
        json.dump({"trl": __import__("trl").__version__, "device": device_name(),
                   "args": vars(args), "steps": steps}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
