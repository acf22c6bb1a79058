#!/usr/bin/env python3
"""Compares lockstep with Hugging Face transformers on a real checkpoint folder (e.g. the one
scripts/get_model.sh writes): per-token logprobs of chat sequences, and greedy generation.

  cmake --build build --target lockstep_model_check lockstep_generate_tokens
  python3 scripts/dev/compare_greedy.py MODEL_DIR --gsm8k ../shared/data/gsm8k/test.jsonl \
      [--prompts 20] [--new 64] [--device cuda] [--recipes bf16,fp8] [--json out.json]

Prompts: the first --prompts GSM8K questions, rendered with the folder's own chat template
(transformers' apply_chat_template, add_generation_prompt=True).

1. Logprobs. Each prompt + transformers' greedy fp32 continuation is one sequence; the logprob of
   every next token is computed by transformers in fp32 (the reference), transformers in bf16, and
   lockstep (lockstep_model_check) in each recipe. Printed: max and mean |Δ logprob| against fp32,
   so lockstep bf16's distance sits beside transformers bf16's own (the yardstick: what bf16 costs).
2. Greedy generation, --new tokens with no stop token on either side: transformers bf16 against
   lockstep in each recipe (and transformers fp32 against transformers bf16, the yardstick). For
   each prompt: equal, or the first position where they part and the gap there between the two
   tokens' fp32 logits (a near-tie, gap ≪ bf16's logit noise, explains a split; a large gap does not).
Nothing here asserts: it prints a table and writes --json.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import torch
import transformers

REPO = pathlib.Path(__file__).resolve().parents[2]  # scripts/dev/ -> the repository root


def chat_prompts(tokenizer, gsm8k, count):
    prompts = []
    with open(gsm8k) as f:
        for line in f:
            if len(prompts) == count:
                break
            question = json.loads(line)["question"]
            text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                 add_generation_prompt=True)
            prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompts


def hf_greedy(model, prompts, new, device):
    # No end-of-sequence token: every continuation is `new` tokens long, as lockstep's without --stop
    # (min_new_tokens would instead mask the eos logit and change the argmax).
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    out = []
    for p in prompts:
        ids = torch.tensor([p], device=device)
        g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
        out.append(g[0, len(p):].tolist())
    return out


@torch.no_grad()
def hf_logprobs(model, seq, device):
    """Logprob of each next token of seq (len(seq) - 1 values), in fp32 from the model's logits."""
    ids = torch.tensor([seq], device=device)
    logits = model(ids).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0].cpu()


@torch.no_grad()
def fp32_gap(model, prefix, a, b, device):
    logits = model(torch.tensor([prefix], device=device)).logits[0, -1].float()
    return float(logits[a] - logits[b])


def run(cmd):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed: {proc.stderr.strip()}")


def lockstep_logprobs(binary, model_dir, seqs, recipe, device, work):
    tokens = work / "tokens.json"
    tokens.write_text(json.dumps({"sequences": seqs}))
    out = work / f"check_{recipe}"
    run([binary, model_dir, tokens, out, "--recipe", recipe, "--device", device, "--grads-dtype", "bf16"])
    from safetensors.torch import load_file
    lp = load_file(str(out / "outputs.safetensors"))["logprob"]
    result, start = [], 0
    for s in seqs:  # row i's logprob is of token i + 1; a sequence's last row targets nothing
        result.append(lp[start:start + len(s) - 1])
        start += len(s)
    return result


def lockstep_greedy(binary, model_dir, prompts, new, recipe, kv, device, work):
    path, out = work / "prompts.json", work / f"greedy_{recipe}_{kv}.json"
    path.write_text(json.dumps({"prompts": prompts}))
    run([binary, model_dir, path, out, "--recipe", recipe, "--device", device, "--kv-cache", kv,
         "--max-new", new])
    return json.loads(out.read_text())["tokens"]


def compare_greedy(name, ours, theirs, prompts, ref_model, device):
    rows = []
    for p, a, b in zip(prompts, ours, theirs):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if n is None:
            rows.append({"equal": True})
        else:
            gap = fp32_gap(ref_model, p + b[:n], b[n], a[n], device)
            rows.append({"equal": False, "first_difference": n, "fp32_logit_gap": gap})
    equal = sum(r["equal"] for r in rows)
    parts = [f"{r['first_difference']}:{r['fp32_logit_gap']:.3f}" for r in rows if not r["equal"]]
    print(f"greedy {name:28s} {equal:3d}/{len(rows)} equal; parted at (position:fp32 logit gap) "
          f"{' '.join(parts) or '-'}")
    return {"equal": equal, "prompts": len(rows), "rows": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--gsm8k", default=str(REPO.parent / "shared/data/gsm8k/test.jsonl"))
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--recipes", default="bf16,fp8")
    ap.add_argument("--bin", default=str(REPO / "build/tools"))
    ap.add_argument("--json")
    args = ap.parse_args()
    device, binaries = args.device, pathlib.Path(args.bin)

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir)
    prompts = chat_prompts(tokenizer, args.gsm8k, args.prompts)
    fp32 = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).to(device)
    bf16 = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.bfloat16).to(device)
    fp32.eval(), bf16.eval()
    results = {"model": args.model_dir, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               "prompts": len(prompts), "new_tokens": args.new}
    recipes = args.recipes.split(",")

    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        # 1. logprobs of prompt + fp32 greedy continuation
        hf32 = hf_greedy(fp32, prompts, args.new, device)
        seqs = [p + c for p, c in zip(prompts, hf32)]
        ref = [hf_logprobs(fp32, s, device) for s in seqs]
        candidates = {"transformers bf16": [hf_logprobs(bf16, s, device) for s in seqs]}
        for r in recipes:
            candidates[f"lockstep {r}"] = lockstep_logprobs(binaries / "lockstep_model_check", args.model_dir,
                                                            seqs, r, device, work)
        results["logprobs"] = {}
        tokens = sum(len(s) - 1 for s in seqs)
        print(f"logprobs of {len(seqs)} sequences ({tokens} tokens) against transformers fp32 ({device}):")
        for name, lps in candidates.items():
            d = torch.cat([(a.float() - b.float()).abs() for a, b in zip(lps, ref)])
            results["logprobs"][name] = {"max_abs": float(d.max()), "mean_abs": float(d.mean())}
            print(f"  {name:28s} max |Δ| {float(d.max()):.4f}  mean |Δ| {float(d.mean()):.5f}")

        # 2. greedy generation against transformers bf16
        hf16 = hf_greedy(bf16, prompts, args.new, device)
        results["greedy"] = {"transformers fp32 vs transformers bf16":
                             compare_greedy("transformers fp32", hf32, hf16, prompts, fp32, device)}
        for r in recipes:
            for kv in ["bf16", "fp8"]:
                ours = lockstep_greedy(binaries / "lockstep_generate_tokens", args.model_dir, prompts, args.new,
                                       r, kv, device, work)
                name = f"lockstep {r} (kv {kv})"
                results["greedy"][name + " vs transformers bf16"] = compare_greedy(name, ours, hf16, prompts,
                                                                                   fp32, device)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
