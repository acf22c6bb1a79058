#!/usr/bin/env python3
"""Compares lockstep's model with Hugging Face transformers (PyTorch, fp32) on small random-weight
Qwen3, Qwen2.5 and Llama-3 models: logits, per-token logprobs and entropies, and the gradient of the
SFT loss for every weight tensor.

  cmake --build build --target lockstep_model_check
  python3 scripts/dev/compare_hf.py [--bin build/tools/lockstep_model_check] [--json results.json]
  python3 scripts/dev/compare_hf.py --large [...]    # on a GPU machine

--large instead compares a randomly initialized Qwen3-1.7B-shaped model (all 28 layers, full
vocabulary; weights rounded to bf16 and saved as bf16) on the GPU: transformers in fp32 (SDPA) vs
lockstep's bf16 recipe on CUDA (gradients written as bf16).

For each family the script builds the model with transformers (weights ~ N(0, 1/fan_in), norms
near 1, biases small, so activations are of order one), saves it with save_pretrained (fp32
safetensors), packs three random token sequences into one lockstep batch (transformers runs each
sequence alone, eager attention), and runs lockstep in the fp32, bf16 and fp8 recipes. It prints
‖ours − theirs‖ / ‖theirs‖ per quantity (the worst tensor for gradients) and exits 1 if a recipe
exceeds its tolerance (TOLERANCE below).
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file

REPO = pathlib.Path(__file__).resolve().parents[2]  # scripts/dev/ -> the repository root

COMMON = dict(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
              rms_norm_eps=1e-6)
FAMILIES = {
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(head_dim=64, tie_word_embeddings=True,
                   rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                   rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 64})),
}
LENGTHS = [37, 5, 90]
# Relative L2 errors allowed against transformers in fp32 (measured on 2026-11-21, torch 2.15 CPU,
# in brackets). fp32: only summation order and cos/sin evaluation differ [logits 1e-6, gradients
# 2.3e-6]. bf16: bf16 activations, weights and gradients between ops [logits 1.2e-2, gradients
# 2.7e-2]. fp8: E4M3 operands (3 mantissa bits) in every linear layer, forward and backward
# [logits 1.3e-1, logprobs 1.7e-2, gradients 2.9e-1].
TOLERANCE = {"fp32": {"logits": 1e-5, "logprob": 1e-5, "grads": 2e-5},
             "bf16": {"logits": 2e-2, "logprob": 5e-3, "grads": 5e-2},
             "fp8": {"logits": 2e-1, "logprob": 5e-2, "grads": 4e-1}}


QWEN3_1_7B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                  num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                  max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e6})
LARGE_LENGTHS = [300, 129, 57]
# bf16 through 28 layers: the same sources of error as the small bf16 models, compounded by depth.
LARGE_TOLERANCE = {"logits": 5e-2, "logprob": 1e-2, "grads": 1e-1}


def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)


def reference(model, sequences):
    """transformers' logits, logprobs, entropies and SFT-loss gradients (each sequence alone)."""
    model.zero_grad()
    device = next(model.parameters()).device
    logits, logprob, entropy, nll = [], [], [], []
    for seq in sequences:
        ids = torch.tensor([seq], device=device)
        z = model(input_ids=ids).logits[0].float()
        lsm = torch.log_softmax(z, dim=-1)
        targets = torch.tensor(seq[1:] + [0], device=device)
        lp = lsm.gather(1, targets[:, None])[:, 0]
        logits.append(z.detach())
        logprob.append(lp.detach())
        entropy.append(-(lsm.exp() * lsm).sum(-1).detach())
        nll.append(-lp[:-1])
    loss = torch.cat(nll).mean()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return torch.cat(logits), torch.cat(logprob), torch.cat(entropy), loss.item(), grads


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


def run_lockstep(args, model_dir, tokens, out, recipe, extra=()):
    proc = subprocess.run([str(args.bin), str(model_dir), str(tokens), str(out), "--recipe", recipe,
                           *extra], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{model_dir.name} {recipe}: lockstep_model_check failed: {proc.stderr}")
    return load_file(out / "outputs.safetensors"), load_file(out / "grads" / "model.safetensors")


def compare(ours, our_grads, ref_logits, ref_lp, ref_ent, ref_loss, ref_grads, label):
    grad_errors = {}
    for name, g in ref_grads.items():
        if name not in our_grads:
            sys.exit(f"{label}: lockstep wrote no gradient for {name}")
        grad_errors[name] = rel(our_grads[name], g)
    worst = max(grad_errors, key=grad_errors.get)
    return {"logits": rel(ours["logits"], ref_logits), "logprob": rel(ours["logprob"], ref_lp),
            "entropy": rel(ours["entropy"], ref_ent),
            "loss": abs(ours["loss"].item() - ref_loss) / abs(ref_loss),
            "grads": grad_errors[worst], "worst_grad": worst}


def print_row(name, recipe, row):
    print(f"{name:6s} {recipe:5s} logits {row['logits']:.2e}  logprob {row['logprob']:.2e}  "
          f"entropy {row['entropy']:.2e}  loss {row['loss']:.2e}  grads {row['grads']:.2e} "
          f"({row['worst_grad']})  {'ok' if row['ok'] else 'FAIL'}")


def main_large(args):
    """Qwen3-1.7B shape on the GPU: transformers fp32 vs lockstep bf16."""
    torch.manual_seed(0)
    config = transformers.Qwen3Config(**QWEN3_1_7B)
    model = transformers.Qwen3ForCausalLM(config).float()
    randomize(model, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        model_dir = tmp / "qwen3-1.7b"
        model.to(torch.bfloat16).save_pretrained(model_dir, safe_serialization=True)
        model = model.float().cuda()  # the reference sees exactly the saved (bf16) weights
        model.config._attn_implementation = "sdpa"
        gen = torch.Generator().manual_seed(1)
        sequences = [torch.randint(0, config.vocab_size, (n,), generator=gen).tolist()
                     for n in LARGE_LENGTHS]
        (tmp / "tokens.json").write_text(json.dumps({"sequences": sequences}))
        ref = reference(model, sequences)
        del model
        torch.cuda.empty_cache()
        ours, our_grads = run_lockstep(args, model_dir, tmp / "tokens.json", tmp / "out", "bf16",
                                       ("--device", "cuda", "--grads-dtype", "bf16"))
        row = compare(ours, our_grads, *ref, "qwen3-1.7b bf16")
    row.update(family="qwen3-1.7b", recipe="bf16", device="cuda",
               gpu=torch.cuda.get_device_name())
    row["ok"] = all(row[k] <= LARGE_TOLERANCE[k] for k in LARGE_TOLERANCE)
    print_row("qwen3-1.7b", "bf16", row)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {row['gpu']}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"torch": torch.__version__, "transformers": transformers.__version__,
             "tolerance": LARGE_TOLERANCE, "results": [row]}, indent=2))
    sys.exit(0 if row["ok"] else 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default=REPO / "build/tools/lockstep_model_check")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--large", action="store_true",
                        help="Qwen3-1.7B shape on the GPU, bf16 (see above)")
    args = parser.parse_args()
    if args.large:
        main_large(args)
    torch.manual_seed(0)
    results, failed = [], False
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for family, (config_class, model_class, extra) in FAMILIES.items():
            config = config_class(**COMMON, **extra)
            model = model_class(config).float()
            model.config._attn_implementation = "eager"
            randomize(model, seed=len(results))
            model_dir = tmp / family
            model.save_pretrained(model_dir, safe_serialization=True)
            gen = torch.Generator().manual_seed(1)
            sequences = [torch.randint(0, config.vocab_size, (n,), generator=gen).tolist()
                         for n in LENGTHS]
            (tmp / "tokens.json").write_text(json.dumps({"sequences": sequences}))
            ref_logits, ref_lp, ref_ent, ref_loss, ref_grads = reference(model, sequences)
            for recipe in ("fp32", "bf16", "fp8"):
                ours, our_grads = run_lockstep(args, model_dir, tmp / "tokens.json",
                                               tmp / f"{family}-{recipe}", recipe)
                row = {"family": family, "recipe": recipe,
                       **compare(ours, our_grads, ref_logits, ref_lp, ref_ent, ref_loss, ref_grads,
                                 f"{family} {recipe}")}
                row["ok"] = all(row[k] <= TOLERANCE[recipe][k] for k in TOLERANCE[recipe])
                failed |= not row["ok"]
                results.append(row)
                print_row(family, recipe, row)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"torch": torch.__version__, "transformers": transformers.__version__,
             "tolerance": TOLERANCE, "results": results}, indent=2))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
