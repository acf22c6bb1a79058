#!/usr/bin/env python3
"""Writes a randomly initialized Hugging Face model of a Qwen3 shape (transformers' own init, bf16
safetensors) with a given tokenizer, for timing runs where no trained checkpoint can be
downloaded: python3 scripts/dev/make_random_model.py OUT_DIR --tokenizer DIR [--model qwen3-1.7b]
[--device cuda] (initializes on the GPU: an 8B model in seconds instead of minutes)."""
import argparse
import pathlib
import shutil

import torch
import transformers

from bench_torch_train import COMMON, MODELS


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--tokenizer", required=True, help="folder with tokenizer.json")
    parser.add_argument("--model", default="qwen3-1.7b", choices=MODELS)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = transformers.Qwen3Config(**COMMON, **MODELS[args.model])
    config.eos_token_id = 151645  # <|im_end|>, as the Qwen3 instruct models
    with torch.device(args.device):
        model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16)
    out = pathlib.Path(args.out)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pathlib.Path(args.tokenizer) / name, out / name)
    print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters")


if __name__ == "__main__":
    main()
