#!/usr/bin/env python3
"""The PyTorch + transformers peer of bench/train_step: one optimizer step of a Qwen3-shaped model
with random weights in bf16 (SDPA attention, fused AdamW), over the same sequence lengths, eager and
torch.compile. Sequences of equal length run as one batch; the gradients of all of them accumulate
before the step; the loss is the mean next-token cross-entropy over all tokens.

  python3 scripts/dev/bench_torch_train.py [--model qwen3-8b|qwen3-4b|qwen3-1.7b] [--layers N]
      [--seqs 4096,2048,1024,1024] [--modes eager,compile] [--steps 3] [--json FILE]
"""
import argparse
import collections
import json
import pathlib
import time

import torch
import transformers

MODELS = {
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, tie_word_embeddings=False),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, tie_word_embeddings=True),
}
COMMON = dict(vocab_size=151936, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
              rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def run(args, mode):
    config = transformers.Qwen3Config(**COMMON, **MODELS[args.model])
    if args.layers is not None:
        config.num_hidden_layers = args.layers
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
    forward = torch.compile(model) if mode == "compile" else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    groups = collections.Counter(args.seqs)
    batches = [torch.randint(0, config.vocab_size, (count, length), device="cuda")
               for length, count in sorted(groups.items())]
    tokens = sum(args.seqs)

    def step():
        optimizer.zero_grad(set_to_none=True)
        for ids in batches:
            logits = forward(input_ids=ids).logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                reduction="sum") / tokens
            loss.backward()
        optimizer.step()

    for _ in range(2):  # warm-up (compilation, allocator growth)
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.steps
    return {"mode": mode, "step_ms": seconds * 1e3, "tokens_per_s": tokens / seconds,
            "peak_bytes": torch.cuda.max_memory_allocated()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3-8b", choices=MODELS)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--seqs", default="4096,2048,1024,1024")
    parser.add_argument("--modes", default="eager,compile")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    args.seqs = [int(s) for s in args.seqs.split(",")]
    results = []
    for mode in args.modes.split(","):
        r = run(args, mode)
        results.append(r)
        print(f"torch {mode:8s} step {r['step_ms']:8.1f} ms  {r['tokens_per_s']:9.0f} tokens/s  "
              f"peak {r['peak_bytes'] / 2**30:.2f} GiB", flush=True)
        torch.cuda.empty_cache()
    info = {"model": args.model, "layers": args.layers, "sequences": args.seqs,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name(), "results": results}
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {info['gpu']}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
