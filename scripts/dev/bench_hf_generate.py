#!/usr/bin/env python3
"""The Hugging Face peer of bench/rollout: transformers' generate() on a Qwen3-shaped model with
random weights (bf16, SDPA attention, its default dynamic KV cache) on one GPU, B prompts of P
random tokens in one batch, temperature-1 sampling over the whole vocabulary (top_k 0, top_p 1) and
no EOS, so every sequence generates exactly N tokens (checked).

Per (B, N), as bench_rollout reports them: wall s of one generate(), output tokens/s = B·N / wall,
prefill s (the same call with max_new_tokens = 1) and ms/step = (wall - prefill) / (N - 1).
Each batch first runs a short generate untimed (CUDA and cuBLAS warm-up), then the prefill call and
the short call again, timed: their step time, scaled by the bytes a decode step reads (bf16
weights, and the KV cache at the mean context P + N/2), estimates each N's run, which is skipped
(saying so) when the estimate exceeds --max-seconds. A configuration that runs out of GPU memory
is reported as such.

  python3 scripts/dev/bench_hf_generate.py [--model qwen3-8b|qwen3-1.7b] [--layers N] [--prompt 512]
      [--new 1024,4096] [--batch 1,16,64,256] [--max-seconds 60] [--json FILE]
"""
import argparse
import json
import pathlib
import time

import torch
import transformers

from bench_torch_train import COMMON, MODELS

PROBE_NEW = 16


def build_model(args):
    config = transformers.Qwen3Config(**COMMON, **MODELS[args.model])
    if args.layers is not None:
        config.num_hidden_layers = args.layers
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    # Made on the GPU in bf16 directly: an 8B model initialized on the CPU in fp32 takes minutes.
    with torch.device("cuda"):
        model = transformers.Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16)
    return model.eval()


def generate(model, prompts, new_tokens):
    """Seconds of one generate() of exactly `new_tokens` tokens per prompt."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                         do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         eos_token_id=None, pad_token_id=0)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    expected = (prompts.shape[0], prompts.shape[1] + new_tokens)
    if tuple(out.shape) != expected:
        raise RuntimeError(f"generate returned {tuple(out.shape)}, expected {expected}")
    return seconds


def step_bytes(model, config, batch, context):
    """Bytes a decode step reads at the least: bf16 weights, and K and V of every context."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2
    return weights + batch * context * kv_per_token


def try_generate(model, prompts, new_tokens):
    """generate()'s seconds, or None when it ran out of GPU memory."""
    try:
        return generate(model, prompts, new_tokens)
    except torch.cuda.OutOfMemoryError:
        pass
    torch.cuda.empty_cache()  # here: inside the except block the failed call's tensors still live
    return None


def run_batch(args, model, batch):
    config = model.config
    prompts = torch.randint(0, config.vocab_size, (batch, args.prompt), device="cuda")
    probe = min(PROBE_NEW, min(args.new))
    warm = try_generate(model, prompts, probe)
    prefill = try_generate(model, prompts, 1) if warm is not None else None
    short = try_generate(model, prompts, probe) if prefill is not None else None
    probe_bytes = step_bytes(model, config, batch, args.prompt + probe / 2)
    rows = []
    for n in args.new:
        row = {"batch": batch, "new_tokens": n}
        if short is None:
            row["skipped"] = "out of GPU memory"
        else:
            step = max(0.0, short - prefill) / (probe - 1)
            estimate = prefill + (n - 1) * step * (
                step_bytes(model, config, batch, args.prompt + n / 2) / probe_bytes)
            if estimate > args.max_seconds:
                row["skipped"] = f"estimated {estimate:.1f} s > --max-seconds {args.max_seconds:g}"
            elif (wall := try_generate(model, prompts, n)) is None:
                row["skipped"] = "out of GPU memory"
            else:
                row.update(wall_s=wall, prefill_s=prefill, tokens_per_s=batch * n / wall,
                           decode_ms_per_step=1e3 * (wall - prefill) / (n - 1))
        if "skipped" in row:
            print(f"hf     {batch:5d} {n:5d}  skipped: {row['skipped']}", flush=True)
        else:
            print(f"hf     {batch:5d} {n:5d} {row['wall_s']:8.2f} {prefill:9.2f} "
                  f"{row['tokens_per_s']:9.0f} {row['decode_ms_per_step']:8.2f}", flush=True)
        rows.append(row)
    return rows


def int_list(text, least):
    values = [int(v) for v in text.split(",")]
    if not values or min(values) < least:
        raise argparse.ArgumentTypeError(f"expected integers of at least {least}, got '{text}'")
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3-8b", choices=MODELS)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=lambda t: int_list(t, 2), default=[1024, 4096])
    parser.add_argument("--batch", type=lambda t: int_list(t, 1), default=[1, 16, 64, 256])
    parser.add_argument("--max-seconds", type=float, default=60)
    parser.add_argument("--json")
    args = parser.parse_args()

    start = time.perf_counter()
    model = build_model(args)
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}: {args.model}, {model.config.num_hidden_layers} layers, "
          f"{model.num_parameters()} parameters (built in {time.perf_counter() - start:.1f} s); "
          f"torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    print(f"{'':6s} {'batch':>5s} {'new':>5s} {'wall s':>8s} {'prefill s':>9s} {'tokens/s':>9s} "
          f"{'ms/step':>8s}", flush=True)
    results = []
    with torch.inference_mode():
        for batch in args.batch:
            results += run_batch(args, model, batch)
    if args.json:
        info = {"device": gpu, "model": args.model, "layers": model.config.num_hidden_layers,
                "prompt_tokens": args.prompt, "torch": torch.__version__,
                "transformers": transformers.__version__, "results": results}
        path = pathlib.Path(args.json)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(info, indent=2))
        tmp.replace(path)


if __name__ == "__main__":
    main()
