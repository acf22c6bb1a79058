#!/usr/bin/env python3
"""Compares lockstep's tokenizer with Hugging Face `tokenizers`, exactly: the ids of every question
and answer of GSM8K (test split by default) plus the hand-written edge cases of
tests/data/tokenizer_cases.json, and the text decoded back from HF's ids.

  pip install tokenizers
  cmake --build build --target lockstep_tokenize
  python3 scripts/dev/check_tokenizer.py [--bin build/tools/lockstep_tokenize] [--splits test train]
  python3 scripts/dev/check_tokenizer.py --tokenizer /models/SmolLM2-135M-Instruct [--tokenizer ...]

Checks the real Qwen3 tokenizer (shared data) and every committed tokenizer fixture
(tests/data/tokenizer_*.json), or only the tokenizers given with --tokenizer (a tokenizer.json, or a
model directory holding one), with and without the post-processor's special tokens.
Prints one line per tokenizer, `N texts, M mismatches`, and exits 1 if any text mismatches.
"""
import argparse
import json
import pathlib
import subprocess
import sys

from tokenizers import Tokenizer

REPO = pathlib.Path(__file__).resolve().parents[2]  # scripts/dev/ -> the repository root


def run_tool(binary, args, lines):
    """Feeds JSON lines to lockstep_tokenize; returns its parsed output lines and its timing line."""
    proc = subprocess.run([str(binary), *args], input="".join(json.dumps(x) + "\n" for x in lines),
                          capture_output=True, text=True, encoding="utf-8")
    if proc.returncode != 0:
        sys.exit(f"lockstep_tokenize failed: {proc.stderr.strip()}")
    # Split on "\n" only: str.splitlines() would also cut at U+2028, U+0085... inside the strings.
    return [json.loads(line) for line in proc.stdout.split("\n") if line], proc.stderr.strip()


def check(name, binary, tokenizer_json, hf, texts, add_special_tokens):
    args = [str(tokenizer_json)] + ([] if add_special_tokens else ["--no-special"])
    ours, timing = run_tool(binary, args, texts)
    theirs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=add_special_tokens)]
    mismatches = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    if len(ours) != len(texts):
        sys.exit(f"{name}: lockstep_tokenize returned {len(ours)} lines for {len(texts)} texts")
    # Decoding HF's ids must give what HF decodes (the texts themselves, for valid input).
    decoded, _ = run_tool(binary, [str(tokenizer_json), "--decode"], theirs)
    hf_decoded = [hf.decode(ids, skip_special_tokens=False) for ids in theirs]
    decode_mismatches = [i for i, (a, b) in enumerate(zip(decoded, hf_decoded)) if a != b]
    print(f"{name}: {len(texts)} texts, {len(mismatches)} mismatches "
          f"(decode: {len(decode_mismatches)} mismatches)   [{timing}]")
    for i in mismatches[:5]:
        print(f"  text #{i} {json.dumps(texts[i])[:120]}\n    lockstep {ours[i][:40]}\n    HF       {theirs[i][:40]}")
    for i in decode_mismatches[:5]:
        print(f"  decode #{i}\n    lockstep {json.dumps(decoded[i])[:120]}\n    HF       {json.dumps(hf_decoded[i])[:120]}")
    return len(mismatches) + len(decode_mismatches)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", help="lockstep_tokenize (default: build/ or build-tok/tools/lockstep_tokenize)")
    ap.add_argument("--shared-data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--splits", nargs="+", default=["test"], choices=["test", "train"])
    ap.add_argument("--tokenizer", action="append", default=[],
                    help="a tokenizer.json or a directory holding one (repeatable); "
                         "default: Qwen3 and the fixtures")
    args = ap.parse_args()

    candidates = [pathlib.Path(args.bin)] if args.bin else [
        REPO / d / "tools" / "lockstep_tokenize" for d in ("build", "build-tok")]
    binary = next((p for p in candidates if p.exists()), None)
    if binary is None:
        sys.exit(f"lockstep_tokenize not found (tried {', '.join(map(str, candidates))}); build it first")

    shared = pathlib.Path(args.shared_data)
    gsm8k = []
    for split in args.splits:
        with open(shared / "gsm8k" / f"{split}.jsonl", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                gsm8k += [row["question"], row["answer"]]
    edge_cases = json.loads((REPO / "tests" / "data" / "tokenizer_cases.json").read_text())["texts"]
    texts = gsm8k + edge_cases
    print(f"GSM8K {'+'.join(args.splits)}: {len(gsm8k)} questions and answers; {len(edge_cases)} edge cases",
          flush=True)

    data = REPO / "tests" / "data"
    if args.tokenizer:
        paths = [pathlib.Path(p) for p in args.tokenizer]
        paths = [p / "tokenizer.json" if p.is_dir() else p for p in paths]
    else:
        paths = [shared / "qwen3-tokenizer" / "tokenizer.json"] + sorted(
            p for p in data.glob("tokenizer_*.json")
            if p.name not in ("tokenizer_cases.json", "tokenizer_llama3_style_config.json"))
    failures = 0
    for path in paths:
        name = path.parent.name if path.name == "tokenizer.json" else path.stem.removeprefix("tokenizer_")
        hf = Tokenizer.from_file(str(path))
        for add_special in (True, False):
            label = name if add_special else name + " no special"
            failures += check(label, binary, path, hf, texts, add_special)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
