#!/usr/bin/env python3
"""Writes a randomly initialized Hugging Face model of a Qwen3 shape (transformers' own init, bf16
safetensors) with a given tokenizer, for timing runs where no trained checkpoint can be
downloaded: python3 scripts/dev/make_random_model.py OUT_DIR --tokenizer DIR [--model qwen3-1.7b]
[--layers N] [--device cuda] (initializes on the GPU: an 8B model in seconds instead of minutes).
qwen3-30b-a3b is the Qwen3-MoE shape (128 experts, top 8; with --layers a reduced depth), saved
with one tensor per expert as Qwen3-MoE checkpoints are (compare_hf_moe.split_fused_experts)."""
import argparse
import pathlib
import shutil

import torch
import transformers

from bench_torch_train import COMMON, MODELS
from compare_hf_moe import split_fused_experts

# Qwen3-30B-A3B's config.json (48 layers, every one sparse).
MOE_MODELS = {
    "qwen3-30b-a3b": dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                          num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                          num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                          decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--tokenizer", required=True, help="folder with tokenizer.json")
    parser.add_argument("--model", default="qwen3-1.7b", choices=[*MODELS, *MOE_MODELS])
    parser.add_argument("--layers", type=int, help="fewer layers than the shape has")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    moe = args.model in MOE_MODELS
    if moe:
        config = transformers.Qwen3MoeConfig(**{**COMMON, **MOE_MODELS[args.model]})
    else:
        config = transformers.Qwen3Config(**COMMON, **MODELS[args.model])
    if args.layers is not None:
        config.num_hidden_layers = args.layers
    config.eos_token_id = 151645  # <|im_end|>, as the Qwen3 instruct models
    with torch.device(args.device):
        model = (transformers.Qwen3MoeForCausalLM if moe else transformers.Qwen3ForCausalLM)(config).to(torch.bfloat16)
    out = pathlib.Path(args.out)
    # One file: split_fused_experts rewrites model.safetensors.
    model.save_pretrained(out, safe_serialization=True, max_shard_size="1000GB" if moe else "5GB")
    if moe:
        split_fused_experts(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pathlib.Path(args.tokenizer) / name, out / name)
    print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters")


if __name__ == "__main__":
    main()
