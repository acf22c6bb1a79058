#!/usr/bin/env python3
"""Checks a block-FP8 checkpoint written by `lockstep export` as transformers serves it, on a GPU.

  build/lockstep export --model.path=SOURCE_DIR --export.out=FP8_DIR
  python3 scripts/dev/check_fp8_export.py SOURCE_DIR FP8_DIR [--bin-dir build/tools]
      [--gsm8k ../shared/data/gsm8k/test.jsonl] [--texts 32] [--kernel-source DIR] [--json OUT]

SOURCE_DIR is the checkpoint the export was made from (a Hugging Face folder of the masters).
Needs torch with a Hopper GPU, transformers (5.x, with accelerate), safetensors and triton.

layout      config.json's quantization_config is {quant_method fp8, fmt e4m3, activation_scheme
            dynamic, weight_block_size [128, 128]}; every *_proj.weight is F8_E4M3 [N, K] with an
            F32 *_proj.weight_scale_inv [ceil(N/128), ceil(K/128)] beside it; every other tensor
            is BF16.
loads       transformers loads FP8_DIR through its fine-grained FP8 path: every projection becomes
            an FP8Linear holding the checkpoint's E4M3 bytes (compared with the file), and its
            forward runs the Triton kernel of kernels-community/finegrained-fp8 (W8A8: activations
            quantized per token and 128-column group, amax / 448). transformers fetches that kernel
            from the Hugging Face Hub; on a machine without the Hub, --kernel-source names a copy of
            its source folder (finegrained-fp8/torch-ext of github.com/huggingface/kernels-community),
            which is registered in its place.
logprobs    next-token logprobs of GSM8K question + answer texts (SOURCE_DIR's tokenizer), mean and
            max |Δ logprob| between:
              transformers fp8 (FP8_DIR)  vs  lockstep fp8 of SOURCE_DIR (the policy exported)
              transformers fp8 (FP8_DIR)  vs  lockstep fp8 of FP8_DIR (lockstep loading the export)
              transformers fp8 (FP8_DIR)  vs  transformers bf16 of SOURCE_DIR
              lockstep bf16 of SOURCE_DIR vs  transformers bf16 of SOURCE_DIR (the implementation gap)
            The check passes when transformers serving the export is closer to lockstep's fp8
            forward than to its own bf16 forward of the same masters (mean |Δ logprob|): what it
            serves is the fp8 policy lockstep trained, within the two implementations' own gap,
            not merely another rounding of the weights.
"""
import argparse
import importlib
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import types

import torch
from safetensors import safe_open

REPO = pathlib.Path(__file__).resolve().parents[2]
BLOCK = 128


def report(check, detail, ok):
    print(f"{'ok  ' if ok else 'FAIL'} {check:10s} {detail}")
    return ok


def check_layout(fp8_dir):
    config = json.loads((fp8_dir / "config.json").read_text())
    q = config.get("quantization_config", {})
    want = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [BLOCK, BLOCK]}
    bad = [k for k, v in want.items() if q.get(k) != v]
    names, tensors = {}, 0
    for path in sorted(fp8_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                names[name] = f.get_slice(name)
    for name, sl in names.items():
        tensors += 1
        dtype, shape = sl.get_dtype(), sl.get_shape()
        if name.endswith("_proj.weight"):
            scale = names.get(name + "_scale_inv")
            want_scale = [math.ceil(shape[0] / BLOCK), math.ceil(shape[1] / BLOCK)]
            if dtype != "F8_E4M3" or scale is None or scale.get_dtype() != "F32" or \
                    scale.get_shape() != want_scale:
                bad.append(name)
        elif not name.endswith("_scale_inv") and dtype != "BF16":
            bad.append(name)
    projections = sum(n.endswith("_proj.weight") for n in names)
    return report("layout", f"{tensors} tensors, {projections} projections in F8_E4M3 with F32 block "
                  f"scales; quantization_config {q}" + (f"; wrong: {bad[:5]}" if bad else ""), not bad)


def use_local_kernel(source):
    """Registers the finegrained-fp8 kernel's source as the module transformers would fetch."""
    from transformers.integrations import finegrained_fp8 as fp8_integration
    from transformers.integrations import hub_kernels
    # The kernel builder generates _ops.py (the torch.library namespace of the build); this is it.
    ops = types.ModuleType("finegrained_fp8._ops")
    ops.ops = getattr(torch.ops, "_finegrained_fp8_local")
    ops.add_op_namespace_prefix = lambda name: f"_finegrained_fp8_local::{name}"
    sys.modules["finegrained_fp8._ops"] = ops
    sys.path.insert(0, str(source))
    kernel = importlib.import_module("finegrained_fp8")
    hub_kernels._KERNEL_MODULE_MAPPING["finegrained-fp8"] = kernel
    # Its version check is for the `kernels` package that fetches from the Hub, unused here.
    fp8_integration.is_kernels_available = lambda *a, **k: True


def load_texts(gsm8k, count, tokenizer):
    rows = [json.loads(line) for line in open(gsm8k)][:count]
    return [tokenizer(r["question"] + "\n" + r["answer"], add_special_tokens=False)["input_ids"]
            for r in rows]


@torch.no_grad()
def hf_logprobs(model, sequences):
    out = []
    for seq in sequences:
        ids = torch.tensor([seq], device=model.device)
        logits = model(ids).logits[0].float()
        lsm = torch.log_softmax(logits, dim=-1)
        out.append(lsm[torch.arange(len(seq) - 1), torch.tensor(seq[1:])].cpu())
    return torch.cat(out)


def lockstep_logprobs(bin_dir, model_dir, sequences, recipe):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "tokens.json").write_text(json.dumps({"sequences": sequences}))
        proc = subprocess.run([str(bin_dir / "lockstep_model_check"), str(model_dir), str(tmp / "tokens.json"),
                               str(tmp / "out"), "--recipe", recipe, "--device", "cuda"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"lockstep_model_check failed on {model_dir}: {proc.stderr.strip()}")
        with safe_open(str(tmp / "out" / "outputs.safetensors"), "pt") as f:
            logprob = f.get_tensor("logprob").float()
    # Row i is the logprob of token i + 1; a sequence's last row targets token 0: dropped.
    keep, start = [], 0
    for seq in sequences:
        keep.append(logprob[start:start + len(seq) - 1])
        start += len(seq)
    return torch.cat(keep)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=pathlib.Path)
    ap.add_argument("fp8", type=pathlib.Path)
    ap.add_argument("--bin-dir", type=pathlib.Path, default=REPO / "build/tools")
    ap.add_argument("--gsm8k", default=REPO.parent / "shared/data/gsm8k/test.jsonl")
    ap.add_argument("--texts", type=int, default=32)
    ap.add_argument("--kernel-source", type=pathlib.Path,
                    help="folder holding the finegrained_fp8 package (kernels-community/finegrained-fp8/torch-ext)")
    ap.add_argument("--json", type=pathlib.Path, help="write the numbers here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("check_fp8_export.py needs a GPU: transformers runs FP8 checkpoints there only")
    os.environ.setdefault("TRANSFORMERS_DISABLE_DEEPGEMM_LINEAR", "1")  # the Triton kernel, not DeepGEMM
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations.finegrained_fp8 import FP8Linear
    if args.kernel_source:
        use_local_kernel(args.kernel_source)

    ok = check_layout(args.fp8)
    fp8_model = AutoModelForCausalLM.from_pretrained(args.fp8, device_map="cuda", dtype=torch.bfloat16)
    fp8_linears = {n: m for n, m in fp8_model.named_modules() if isinstance(m, FP8Linear)}
    same_bytes = True
    for path in sorted(args.fp8.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                if name.endswith("_proj.weight"):
                    module = fp8_linears.get(name[: -len(".weight")])
                    same_bytes &= module is not None and torch.equal(
                        module.weight.detach().cpu().view(torch.uint8), f.get_tensor(name).view(torch.uint8))
    ok &= report("loads", f"transformers {__import__('transformers').__version__}: {len(fp8_linears)} FP8Linear "
                 f"modules holding the checkpoint's E4M3 bytes: {same_bytes}", same_bytes and len(fp8_linears) > 0)

    tokenizer = AutoTokenizer.from_pretrained(args.source)
    sequences = load_texts(args.gsm8k, args.texts, tokenizer)
    hf_fp8 = hf_logprobs(fp8_model, sequences)
    del fp8_model
    bf16_model = AutoModelForCausalLM.from_pretrained(args.source, device_map="cuda", dtype=torch.bfloat16)
    hf_bf16 = hf_logprobs(bf16_model, sequences)
    del bf16_model
    ls_fp8_source = lockstep_logprobs(args.bin_dir, args.source, sequences, "fp8")
    ls_fp8_export = lockstep_logprobs(args.bin_dir, args.fp8, sequences, "fp8")
    ls_bf16 = lockstep_logprobs(args.bin_dir, args.source, sequences, "bf16")

    def gap(a, b):
        d = (a - b).abs()
        return {"mean": d.mean().item(), "max": d.max().item()}
    gaps = {"hf_fp8_vs_lockstep_fp8_source": gap(hf_fp8, ls_fp8_source),
            "hf_fp8_vs_lockstep_fp8_export": gap(hf_fp8, ls_fp8_export),
            "hf_fp8_vs_hf_bf16": gap(hf_fp8, hf_bf16),
            "lockstep_bf16_vs_hf_bf16": gap(ls_bf16, hf_bf16),
            "lockstep_fp8_export_vs_source": gap(ls_fp8_export, ls_fp8_source)}
    for name, g in gaps.items():
        print(f"     {name:34s} mean |Δ logprob| {g['mean']:.4f}  max {g['max']:.3f}")
    closer = gaps["hf_fp8_vs_lockstep_fp8_source"]["mean"] < gaps["hf_fp8_vs_hf_bf16"]["mean"]
    ok &= report("logprobs", f"{hf_fp8.numel()} tokens of {len(sequences)} texts: transformers serving the export "
                 f"is closer to lockstep's fp8 forward ({gaps['hf_fp8_vs_lockstep_fp8_source']['mean']:.4f}) than to "
                 f"its own bf16 forward ({gaps['hf_fp8_vs_hf_bf16']['mean']:.4f})", closer)
    if args.json:
        args.json.write_text(json.dumps({"tokens": hf_fp8.numel(), "texts": len(sequences),
                                         "device": torch.cuda.get_device_name(), "gaps": gaps}, indent=1) + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
