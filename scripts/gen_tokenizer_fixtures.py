#!/usr/bin/env python3
"""Writes the tokenizer test fixtures under tests/data/, using the real Hugging Face `tokenizers`
library as the oracle — never lockstep's own code. (The chat fixtures: scripts/gen_chat_fixtures.py.)

  pip install tokenizers
  python3 scripts/gen_tokenizer_fixtures.py [--shared-data ../shared/data]

Outputs (all small, committed):
  tests/data/tokenizer_llama3_style.json         a Llama-3-style tokenizer: ByteLevel BPE trained on
                                                 GSM8K with the Llama-3 split regex, ignore_merges,
                                                 TemplateProcessing adding <|begin_of_text|>
  tests/data/tokenizer_llama3_style_config.json  its tokenizer_config.json (bos/eos)
  tests/data/tokenizer_flags.json                a tiny tokenizer exercising what the two above do not:
                                                 added tokens with lstrip/rstrip/single_word/normalized,
                                                 a Sequence normalizer, a bare ByteLevel(use_regex=true)
                                                 pre-tokenizer, merges in the legacy "a b" form
  tests/data/tokenizer_cases.json                edge-case texts and the ids HF gives for each tokenizer,
                                                 plus decode cases
"""
import argparse
import json
import pathlib

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

REPO = pathlib.Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data"

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Meta-Llama-3-8B-Instruct's chat_template, as published in its tokenizer_config.json.
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
                   "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|reserved_special_token_4|>", "<|eot_id|>"]

# Whole words added to the Llama-3-style vocab without merges: with ignore_merges they come out as
# one token, without it BPE splits them — so the fixture proves ignore_merges is honoured.
WHOLE_WORDS = ["Ġsupercalifragilistic", "Ġantidisestablishment", "Ġxylophonist"]

# Hand-written edge cases. Texts must be valid Unicode (HF takes str).
EDGE_CASES = [
    "", " ", "  ", "   leading", "trailing   ", "a  b   c", "a \n b", "\t", "\t\tx", "a\tb\t\tc",
    "line1\nline2", "\n", "\n\n\n", "a\r\nb", "\r\n\r\n", " \n \n", "x \n\n y", "end\n", "  \n  x",
    "1234567", "12345678901234567890", "3.14159", "1,000,000", "$2,345.67", "-42", "x1y22z333",
    "<<16-3-4=9>>9", "#### 18", "((a+b)*c)^2", "http://example.com/path?q=1&r=2",
    "Hello, world!", "...!!!???", "Janet\u2019s ducks lay 16 eggs.",
    "你好，世界！", "日本語のテキストです。", "한국어 텍스트", "Ελληνικά", "русский текст", "العربية",
    "हिन्दी", "ไทย", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟙𝟚𝟛 digits", "Ⅻ and ½ and x²",
    "😀", "👨‍👩‍👧‍👦 family", "🇺🇸 flag", "I ❤️ NY", "🤖🤖🤖",
    "Cafe\u0301", "e\u0301\u0301", "\u212b ngstr\u00f6m", "\u1e9b\u0323", "n\u0303o", "x\u212a",
    "I'm", "I'M", "you'RE", "they'Ve", "we'll", "WE'LL", "it's", "IT'S", "don't", "DON'T",
    "she'd", "'s", "'ſ", "I'ſx", "isn\u2019t", "rock 'n' roll", "'twas", "O'Neil's",
    "<|im_start|>user\nhi<|im_end|>\n", "<|im_start|><|im_end|>", "<|im_start", "<|endoftext|>",
    "text<|endoftext|>text", "<think>\nreasoning\n</think>\n\nanswer", "<think></think>",
    "< think>", "<tool_call>x</tool_call>", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    "<|begin_of_text|>hi<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nhi",
    "a\u00a0b", "a\u3000b", "a\u180eb", "a!\u180e!", "a \u180eb", "a\u2028b", "a\u0085b", "a\u200b\u200bb",
    "a\u000bb", "a\u001cb", "\u0000", "\u0001\u0002", "\u007f",
    "a" * 300, " " * 100, "\n" * 40, "ab" * 100 + " " + "9" * 50,
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "What is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "supercalifragilistic antidisestablishment xylophonist",
    " supercalifragilistic! xylophonists",
]

# Cases aimed at the flags fixture's added tokens (they also run through the other tokenizers).
FLAG_CASES = [
    "a <mask> b", "a<mask>b", "x   <mask>   y", "<mask>", "\t<mask>\n", "<mask><mask>",
    "[SW]", "a [SW] b", "a[SW] b", "[SW]x", "(([SW]))", "é[SW]", "[SW]\u0301",
    "café", "cafe\u0301", "CAFÉ café", "cafe\u0301s",
    "<x>", "<x><y>", "<x><y><x>", "<x> <y>", "<x><<x><y>>",
]


def train_llama3_style(gsm8k_train):
    texts = []
    with open(gsm8k_train) as f:
        for i, line in enumerate(f):
            if i >= 3000:
                break
            row = json.loads(line)
            texts += [row["question"], row["answer"]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)

    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for word in WHOLE_WORDS:
        assert word not in vocab
        vocab[word] = len(vocab)
    spec["model"]["ignore_merges"] = True
    base = len(vocab)
    spec["added_tokens"] = [
        {"id": base + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for i, s in enumerate(LLAMA3_SPECIALS)]
    bos = LLAMA3_SPECIALS[0]
    spec["post_processor"] = json.loads(processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1",
                                      special_tokens=[(bos, base)])]).__getstate__())
    tok = Tokenizer.from_str(json.dumps(spec))
    assert tok.token_to_id(bos) == base

    # ignore_merges must change the ids of the whole-word cases, else the fixture proves nothing.
    spec_plain = json.loads(tok.to_str())
    spec_plain["model"]["ignore_merges"] = False
    plain = Tokenizer.from_str(json.dumps(spec_plain))
    probe = "supercalifragilistic antidisestablishment xylophonist"
    assert tok.encode(probe).ids != plain.encode(probe).ids, "ignore_merges has no effect"
    config = {"bos_token": bos, "eos_token": "<|eot_id|>", "add_bos_token": True,
              "chat_template": LLAMA3_CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"}
    return tok, config


def train_flags(texts):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFC()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False,
                                       special=True)])
    tok.add_tokens([
        AddedToken("[SW]", single_word=True, normalized=False, special=False),
        AddedToken("café", normalized=True, special=False),
        AddedToken("<x>", normalized=False, special=False),
        AddedToken("<x><y>", normalized=False, special=False),
    ])
    spec = json.loads(tok.to_str())
    # Legacy merges ("a b" strings), as older tokenizer.json files have them.
    spec["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                               for m in spec["model"]["merges"]]
    return Tokenizer.from_str(json.dumps(spec)), spec


def ids_for(tok, texts, add_special_tokens):
    return [tok.encode(t, add_special_tokens=add_special_tokens).ids for t in texts]


def decode_cases(tok, texts):
    cases = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=True).ids
        for skip in (False, True):
            cases.append({"ids": ids, "skip_special_tokens": skip,
                          "text": tok.decode(ids, skip_special_tokens=skip)})
    return cases


def write_json(path, obj, pretty=True):
    text = json.dumps(obj, ensure_ascii=False, indent=1 if pretty else None)
    path.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(REPO)} ({path.stat().st_size} bytes)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared-data", default=str(REPO.parent / "shared" / "data"))
    args = ap.parse_args()
    shared = pathlib.Path(args.shared_data)
    OUT.mkdir(parents=True, exist_ok=True)

    qwen3 = Tokenizer.from_file(str(shared / "qwen3-tokenizer" / "tokenizer.json"))
    llama, llama_config = train_llama3_style(shared / "gsm8k" / "train.jsonl")
    flags, flags_spec = train_flags(EDGE_CASES + FLAG_CASES)

    write_json(OUT / "tokenizer_llama3_style.json", json.loads(llama.to_str()), pretty=False)
    write_json(OUT / "tokenizer_llama3_style_config.json", llama_config)
    write_json(OUT / "tokenizer_flags.json", flags_spec, pretty=False)

    texts = EDGE_CASES + FLAG_CASES
    decode_texts = ["<|im_start|>user\nhi<|im_end|>\n", "<think>\nreasoning\n</think>\n\nanswer",
                    "<|begin_of_text|>hi<|eot_id|>", "a <mask> b [SW] <x><y>", "Cafe\u0301 😀"]
    cases = {
        "generator": "scripts/gen_tokenizer_fixtures.py",
        "texts": texts,
        "qwen3": {"ids": ids_for(qwen3, texts, True),
                  "decode": decode_cases(qwen3, decode_texts)},
        "llama3_style": {"ids": ids_for(llama, texts, True),
                         "ids_no_special": ids_for(llama, texts, False),
                         "decode": decode_cases(llama, decode_texts)},
        "flags": {"ids": ids_for(flags, texts, True), "decode": decode_cases(flags, decode_texts)},
    }
    write_json(OUT / "tokenizer_cases.json", cases, pretty=False)


if __name__ == "__main__":
    main()
