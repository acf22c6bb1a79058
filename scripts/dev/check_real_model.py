#!/usr/bin/env python3
"""Checks a Hugging Face folder written by scripts/get_model.sh (scripts/gguf_to_hf.py) against
transformers reading the GGUF file itself, and lockstep against transformers on that folder.

  bash scripts/get_model.sh smollm2-135m-instruct .deps/models/smollm2-135m-instruct
  cmake --build build --target lockstep_model_check lockstep_tokenize
  python3 scripts/dev/check_real_model.py .deps/models/smollm2-135m-instruct [--gguf FILE]
      [--gsm8k ../shared/data/gsm8k/test.jsonl] [--bin-dir build/tools]
      [--lockstep-recipe fp32 [bf16 fp8]] [--lockstep-device cpu|cuda] [--no-lockstep]

Needs torch, transformers (with accelerate, which its GGUF loading requires), tokenizers, jinja2,
safetensors and gguf. On a GPU machine, `--lockstep-recipe bf16 fp8 --lockstep-device cuda` runs
lockstep on the GPU (transformers stays on the CPU). Prints one row per check and exits 1 if any
fails. The checks, and why each tolerance is what it is:

tokenizer   The reference is HF `tokenizers` on the folder's tokenizer.json, whose pre-tokenizer is
            SmolLM2's own (Digits(individual_digits) then ByteLevel: llama.cpp's 'smollm' splits
            \\p{N} first too). On every GSM8K question and its chat-rendered prompt, these must give
            exactly its ids: transformers' AutoTokenizer on the folder, and lockstep_tokenize.
            transformers' AutoTokenizer on the GGUF has no 'smollm' pre-tokenizer (its table
            GGUF_PRE_TOKENIZER_SPLITS lacks the name), so it splits with GPT-2's regex alone,
            which differs next to numerals: "  4" (GPT-2: Ġ Ġ4 -> Ġ Ġ 4; digits first: ĠĠ 4), and
            " ¾". On all GSM8K questions and answers, 100 of 16265 texts differ. The check is exact
            against that variant (tokenizer.json without the Digits step), and the number of texts
            where the GGUF tokenizer and the real one differ is reported.
chat        The chat template rendered by jinja2 straight from the GGUF's tokenizer.chat_template,
            by AutoTokenizer on the GGUF and on the folder: identical strings.
weights     transformers' GGUF model (dequantized to fp32, q/k un-permuted by transformers itself)
            with its weights rounded to bf16 vs the folder loaded in fp32: every tensor identical.
logits      The same two models on chat sequences, fp32: identical weights and code, so the logits
            may differ only by fp32 rounding (max |Δ| ≤ 1e-5 · max |logit|; it is 0 in practice).
            The unrounded GGUF model is shown for scale (bf16 rounding of the weights), unchecked.
lockstep    lockstep_model_check vs transformers (fp32) on the folder: per-token logprob of the next
            token, max and mean |Δ|, and ‖Δ logits‖ / ‖logits‖. Tolerances per recipe in TOLERANCE.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF loader draws a progress bar
import torch
import transformers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = pathlib.Path(__file__).resolve().parents[2]  # scripts/dev/ -> the repository root
transformers.utils.logging.disable_progress_bar()

# lockstep vs transformers fp32 on the folder: max |Δ logprob|, mean |Δ logprob|,
# ‖Δ logits‖ / ‖logits‖.
# fp32: the two differ only in summation order and cos/sin evaluation [measured through the 30
# layers on the CPU: 4.6e-5, 8.1e-6, 1.5e-6]. bf16: bf16 weights, activations and LM-head input
# [0.48, 0.040, 2.2e-2 on the CPU]; the bound on the logits is scripts/dev/compare_hf.py's for its
# 28-layer model. fp8: E4M3 GEMM operands, compare_hf.py's small-model bounds widened as for bf16
# (not measured on this model yet: lockstep refuses its 576-wide layers in fp8).
TOLERANCE = {"fp32": {"max_dlogprob": 2e-4, "mean_dlogprob": 4e-5, "logits_rel": 1e-5},
             "bf16": {"max_dlogprob": 1.5, "mean_dlogprob": 0.1, "logits_rel": 5e-2},
             "fp8": {"max_dlogprob": 4.0, "mean_dlogprob": 0.5, "logits_rel": 3e-1}}

rows, failures = [], []


def report(check, detail, ok):
    rows.append((check, detail, "ok" if ok else "FAIL"))
    print(f"{check:34s} {detail:78s} {'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append(check)


def find_gguf():
    found = sorted((REPO / ".deps").glob("gguf/*.gguf"))
    if not found:
        sys.exit("no --gguf given and no .deps/gguf/*.gguf (scripts/get_model.sh keeps the file there)")
    return found[0]


def gguf_chat_template(gguf_path):
    import gguf
    field = gguf.GGUFReader(gguf_path).fields.get("tokenizer.chat_template")
    if field is None:
        sys.exit(f"{gguf_path}: no tokenizer.chat_template")
    return field.contents()


def render(template, messages, add_generation_prompt):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt)


def first_mismatch(name, texts, ours, theirs):
    bad = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    if len(ours) != len(theirs):
        bad.append(min(len(ours), len(theirs)))
    if bad:
        i = bad[0]
        print(f"    {name}: first mismatch, text #{i} {json.dumps(texts[i])[:100]}\n"
              f"      got      {ours[i][:30] if i < len(ours) else None}\n"
              f"      expected {theirs[i][:30] if i < len(theirs) else None}")
    return bad


def run_lockstep_tokenize(binary, tokenizer_dir, texts):
    proc = subprocess.run([str(binary), str(tokenizer_dir), "--no-special"],
                          input="".join(json.dumps(t) + "\n" for t in texts),
                          capture_output=True, text=True, encoding="utf-8")
    if proc.returncode != 0:
        return None, proc.stderr.strip()
    return [json.loads(line) for line in proc.stdout.split("\n") if line], ""


def check_tokenizers(args, model_dir, gguf_path, texts):
    reference = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]

    folder = AutoTokenizer.from_pretrained(model_dir)
    got = [folder.encode(t, add_special_tokens=False) for t in texts]
    bad = first_mismatch("AutoTokenizer(folder)", texts, got, ids)
    report("tokenizer: AutoTokenizer(folder)",
           f"{len(texts)} texts, {len(bad)} differ from tokenizers(tokenizer.json)", not bad)

    decoded = reference.decode_batch(ids, skip_special_tokens=False)
    bad = [i for i, (a, b) in enumerate(zip(decoded, texts)) if a != b]
    report("tokenizer: decode", f"{len(texts)} texts, {len(bad)} do not decode back to themselves", not bad)

    from_gguf = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    got_gguf = [from_gguf.encode(t, add_special_tokens=False) for t in texts]
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    steps = spec["pre_tokenizer"]["pretokenizers"] if spec["pre_tokenizer"]["type"] == "Sequence" else []
    if [s["type"] for s in steps] == ["Digits", "ByteLevel"]:
        spec["pre_tokenizer"] = steps[1]
        no_digits = Tokenizer.from_str(json.dumps(spec))
        expected = [e.ids for e in no_digits.encode_batch(texts, add_special_tokens=False)]
        bad = first_mismatch("AutoTokenizer(gguf)", texts, got_gguf, expected)
        differ = sum(a != b for a, b in zip(got_gguf, ids))
        report("tokenizer: AutoTokenizer(gguf)",
               f"{len(texts)} texts, {len(bad)} differ from tokenizer.json without Digits "
               f"({differ} from tokenizer.json)", not bad)
    else:
        bad = first_mismatch("AutoTokenizer(gguf)", texts, got_gguf, ids)
        report("tokenizer: AutoTokenizer(gguf)", f"{len(texts)} texts, {len(bad)} differ from tokenizer.json",
               not bad)

    if not args.no_lockstep:
        binary = pathlib.Path(args.bin_dir) / "lockstep_tokenize"
        ours, error = run_lockstep_tokenize(binary, model_dir, texts)
        if ours is None:
            report("tokenizer: lockstep_tokenize", "failed:", False)
            print(f"    {error}")
        else:
            bad = first_mismatch("lockstep_tokenize", texts, ours, ids)
            report("tokenizer: lockstep_tokenize",
                   f"{len(texts)} texts, {len(bad)} differ from tokenizer.json", not bad)
    return reference, folder, from_gguf


def check_chat_template(template, folder, from_gguf, conversations):
    bad = 0
    for messages, add_prompt in conversations:
        direct = render(template, messages, add_prompt)
        for tok in (folder, from_gguf):
            if tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_prompt) != direct:
                bad += 1
    report("chat template",
           f"{len(conversations)} conversations x 2 tokenizers, {bad} renders differ from jinja2", bad == 0)


def load_models(model_dir, gguf_path):
    folder = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    from_gguf = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                     dtype=torch.float32, attn_implementation="eager")
    return folder.eval(), from_gguf.eval()


def forward_logits(model, sequences):
    with torch.no_grad():
        return [model(input_ids=torch.tensor([s])).logits[0].float() for s in sequences]


def check_weights_and_logits(folder, from_gguf, sequences):
    theirs = dict(from_gguf.state_dict())
    ours = dict(folder.state_dict())
    names = sorted(set(ours) | set(theirs))
    bad, worst = [], 0.0
    for name in names:
        if name not in ours or name not in theirs or ours[name].shape != theirs[name].shape:
            bad.append(name)
            continue
        rounded = theirs[name].to(torch.bfloat16).float()
        diff = (ours[name] - rounded).abs().max().item()
        worst = max(worst, diff)
        if diff != 0:
            bad.append(name)
    if bad:
        print(f"    weights differ: {bad[:5]}")
    report("weights: folder vs bf16(GGUF)", f"{len(names)} tensors, {len(bad)} differ (max |Δ| {worst:.3g})",
           not bad)

    unrounded = forward_logits(from_gguf, sequences)
    with torch.no_grad():
        for p in from_gguf.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    reference = forward_logits(from_gguf, sequences)
    got = forward_logits(folder, sequences)
    diff = max((a - b).abs().max().item() for a, b in zip(got, reference))
    scale = max(b.abs().max().item() for b in reference)
    report("logits: folder vs bf16(GGUF), fp32", f"{sum(map(len, sequences))} tokens, max |Δ| {diff:.3g} "
           f"(max |logit| {scale:.3g}; allowed 1e-5 of it)", diff <= 1e-5 * scale)
    lp = [torch.log_softmax(x, -1) for x in got]
    lp_unrounded = [torch.log_softmax(x, -1) for x in unrounded]
    shift = max((a - b).abs().max().item() for a, b in zip(lp, lp_unrounded))
    agree = np.mean(np.concatenate([(a.argmax(-1) == b.argmax(-1)).numpy() for a, b in zip(got, unrounded)]))
    print(f"    for scale, the unrounded GGUF model: max |Δ logprob| {shift:.3g}, "
          f"same argmax on {agree:.1%} of the tokens (unchecked)")
    return got


def check_lockstep(args, model_dir, sequences, hf_logits, recipe):
    binary = pathlib.Path(args.bin_dir) / "lockstep_model_check"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "tokens.json").write_text(json.dumps({"sequences": sequences}))
        proc = subprocess.run([str(binary), str(model_dir), str(tmp / "tokens.json"), str(tmp / "out"),
                               "--recipe", recipe, "--device", args.lockstep_device],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            report(f"lockstep {recipe} ({args.lockstep_device}) vs transformers fp32", "failed:", False)
            print(f"    {proc.stderr.strip()}")
            return
        from safetensors.torch import load_file
        out = load_file(tmp / "out" / "outputs.safetensors")
    ours_logits = out["logits"].float()
    theirs_logits = torch.cat(hf_logits)
    # lockstep_model_check's logprob row i is that of token i+1 (of token 0 at a sequence's end).
    theirs_lp, keep = [], []
    for seq, z in zip(sequences, hf_logits):
        lsm = torch.log_softmax(z, -1)
        targets = torch.tensor(seq[1:] + [0])
        theirs_lp.append(lsm.gather(1, targets[:, None])[:, 0])
        keep.append(torch.tensor([True] * (len(seq) - 1) + [False]))
    theirs_lp, keep = torch.cat(theirs_lp), torch.cat(keep)
    dlp = (out["logprob"].float() - theirs_lp)[keep].abs()
    rel = ((ours_logits.double() - theirs_logits.double()).norm() / theirs_logits.double().norm()).item()
    tol = TOLERANCE[recipe]
    ok = dlp.max().item() <= tol["max_dlogprob"] and dlp.mean().item() <= tol["mean_dlogprob"] and \
        rel <= tol["logits_rel"]
    report(f"lockstep {recipe} ({args.lockstep_device}) vs transformers fp32",
           f"{int(keep.sum())} tokens, |Δ logprob| max {dlp.max().item():.3g} mean {dlp.mean().item():.3g}, "
           f"logits rel {rel:.3g}", ok)


def write_fixture(path, texts, sequences, logits):
    """The reference tests/model/test_real_model.cpp compares lockstep with."""
    logprob = []
    for seq, z in zip(sequences, logits):
        lsm = torch.log_softmax(z, -1)
        logprob.append(lsm[torch.arange(len(seq) - 1), torch.tensor(seq[1:])].tolist())
    path.write_text(json.dumps({
        "source": f"scripts/dev/check_real_model.py --write-fixture: ids from HF tokenizers "
                  f"{tokenizers_version()} on the folder's tokenizer.json, logprob[i][j] = "
                  f"log p(token j+1 | tokens 0..j) from transformers {transformers.__version__} "
                  f"(torch {torch.__version__}, fp32, CPU) on the folder written by "
                  "scripts/get_model.sh smollm2-135m-instruct",
        "texts": texts, "sequences": sequences, "logprob": logprob}, indent=1) + "\n")
    print(f"    wrote {path}")


def tokenizers_version():
    import tokenizers
    return tokenizers.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=pathlib.Path)
    ap.add_argument("--gguf", type=pathlib.Path, help="the GGUF file (default: .deps/gguf/*.gguf)")
    ap.add_argument("--gsm8k", type=pathlib.Path, default=REPO.parent / "shared/data/gsm8k/test.jsonl")
    ap.add_argument("--bin-dir", default=REPO / "build/tools", help="where lockstep_model_check and "
                    "lockstep_tokenize are")
    ap.add_argument("--lockstep-recipe", nargs="+", default=["fp32"], choices=sorted(TOLERANCE))
    ap.add_argument("--lockstep-device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--no-lockstep", action="store_true", help="check only the folder against the GGUF")
    ap.add_argument("--write-fixture", type=pathlib.Path,
                    help="also write the chat sequences' texts, ids (HF tokenizers) and transformers' fp32 "
                         "next-token logprobs as JSON (tests/data/smollm2_135m_reference.json)")
    args = ap.parse_args()
    gguf_path = (args.gguf or find_gguf()).resolve()
    model_dir = args.model_dir.resolve()
    torch.manual_seed(0)

    problems = [json.loads(line) for line in args.gsm8k.read_text().splitlines() if line.strip()]
    template = gguf_chat_template(gguf_path)
    conversations = [([{"role": "user", "content": p["question"]}], True) for p in problems]
    # Every role once, and a system prompt (which replaces the template's default one).
    conversations.append(([{"role": "system", "content": "Answer briefly."},
                           {"role": "user", "content": problems[0]["question"]},
                           {"role": "assistant", "content": problems[0]["answer"]}], False))
    texts = [p["question"] for p in problems] + [render(template, m, g) for m, g in conversations]

    print(f"{model_dir}\n{gguf_path}\n")
    reference, folder_tok, gguf_tok = check_tokenizers(args, model_dir, gguf_path, texts)
    check_chat_template(template, folder_tok, gguf_tok, conversations)

    # Chat sequences: a question with its worked answer (an SFT example), a bare prompt, a short one.
    chat_texts = [render(template, [{"role": "user", "content": problems[i]["question"]},
                                    {"role": "assistant", "content": problems[i]["answer"]}], False)
                  for i in (0, 1)]
    chat_texts.append(render(template, [{"role": "user", "content": "What is the capital of France?"}], True))
    sequences = [e.ids for e in reference.encode_batch(chat_texts, add_special_tokens=False)]
    folder, from_gguf = load_models(model_dir, gguf_path)
    hf_logits = check_weights_and_logits(folder, from_gguf, sequences)
    if args.write_fixture:
        write_fixture(args.write_fixture, chat_texts, sequences, hf_logits)
    del from_gguf
    if not args.no_lockstep:
        for recipe in args.lockstep_recipe:
            check_lockstep(args, model_dir, sequences, hf_logits, recipe)

    print(f"\ntorch {torch.__version__}, transformers {transformers.__version__}: "
          f"{len(rows) - len(failures)} of {len(rows)} checks ok")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
