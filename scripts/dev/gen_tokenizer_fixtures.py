#!/usr/bin/env python3
"""Writes the tokenizer test fixtures under tests/data/, using the real Hugging Face `tokenizers`
library as the oracle — never lockstep's own code. (The chat fixtures: scripts/dev/gen_chat_fixtures.py.)

  pip install tokenizers
  python3 scripts/dev/gen_tokenizer_fixtures.py [--shared-data ../shared/data]

Outputs (all small, committed):
  tests/data/tokenizer_llama3_style.json         a Llama-3-style tokenizer: ByteLevel BPE trained on
                                                 GSM8K with the Llama-3 split regex, ignore_merges,
                                                 TemplateProcessing adding <|begin_of_text|>
  tests/data/tokenizer_llama3_style_config.json  its tokenizer_config.json (bos/eos)
  tests/data/tokenizer_flags.json                a tiny tokenizer exercising what the two above do not:
                                                 added tokens with lstrip/rstrip/single_word/normalized,
                                                 a Sequence normalizer, a bare ByteLevel(use_regex=true)
                                                 pre-tokenizer, merges in the legacy "a b" form
  tests/data/tokenizer_<style>.json              one small tokenizer per style of COMPONENT_FIXTURES
                                                 (SmolLM2, Llama-2, Mistral, ...), together covering every
                                                 normalizer, pre-tokenizer, decoder and BPE option that
                                                 lockstep supports
  tests/data/tokenizer_cases.json                edge-case texts and the ids HF gives for each tokenizer,
                                                 plus decode cases
"""
import argparse
import collections
import json
import pathlib

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

REPO = pathlib.Path(__file__).resolve().parents[2]  # scripts/dev/ -> the repository root
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


# Texts aimed at the normalizers and the sentencepiece-style pieces (compatibility forms, case,
# metaspace characters, delimiters of the Split behaviors).
COMPONENT_CASES = [
    "Hello World HELLO", "ÀÉÎÕÜ àéîõü", "\u0130stanbul \u0130I", "ΣΑΣ σας", "Straße STRASSE",
    "\ufb01nance \u2460\u2461\u2462 \uff46\uff55\uff4c\uff4c", "x\u00b2 + y\u00b3 = \u00bd",
    "\u2581already \u2581\u2581metaspace\u2581", "_under_score_", "a-b--c---d", "the-final--countdown",
    "  leading and trailing  ", "don't-stop 12-34 5.6", "<s>", "</s>", "<s>hi</s>", "a<s>b", " <s> x",
    "<unk>", "[UNK]", "<0x41>", "12\u00a034", "\u0663\u0664 \u0968", "word\u3000word", "tab\there",
]

# The special tokens of SmolLM2 (ids 0..16 of its vocab, in this order).
SMOLLM2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>",
                    "<file_sep>", "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>",
                    "<issue_closed>", "<jupyter_start>", "<jupyter_text>", "<jupyter_code>",
                    "<jupyter_output>", "<jupyter_script>", "<empty_output>"]
# Bytes whose byte-level token the SmolLM2-style vocab lacks (SmolLM2's real vocab lacks 21 such,
# 0x04 among them): ASCII controls and bytes that valid UTF-8 never holds. HF drops such bytes.
SMOLLM2_MISSING_BYTES = (list(range(0x00, 0x09)) + [0x0E, 0x0F, 0x10, 0x7F, 0xC0, 0xC1] +
                         list(range(0xF5, 0xFB)))

SENTENCEPIECE_SPECIALS = ["<unk>", "<s>", "</s>"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def gsm8k_texts(gsm8k_train, rows):
    texts = []
    with open(gsm8k_train) as f:
        for i, line in enumerate(f):
            if i >= rows:
                break
            row = json.loads(line)
            texts += [row["question"], row["answer"]]
    return texts


def without_controls(texts):
    """Texts free of the control characters whose byte tokens the SmolLM2-style vocab drops, so that
    no merge needs them."""
    return [t for t in texts if not any(ord(c) < 0x20 and c not in "\t\n\r" or c == "\x7f" for c in t)]


def added(content, id, special=True, normalized=False, lstrip=False, rstrip=False):
    return {"id": id, "content": content, "single_word": False, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def to_spec(tok):
    return json.loads(tok.to_str())


def component(obj):
    """A component (normalizer, pre-tokenizer, decoder, post-processor) as tokenizer.json spells it."""
    return json.loads(obj.__getstate__())


def tie_free_alphabet_limit(tok, corpus, wanted):
    """The trainer keeps the `limit` most frequent characters, breaking ties in no fixed order; a
    limit (at most `wanted`) that falls between two different counts makes the fixture the same on
    every run. Counts characters as the trainer does: over the normalized, pre-tokenized words."""
    counts = collections.Counter()
    for text in corpus:
        if tok.normalizer is not None:
            text = tok.normalizer.normalize_str(text)
        for word, _ in tok.pre_tokenizer.pre_tokenize_str(text):
            counts.update(word)
    ranked = sorted(counts.values(), reverse=True)
    limit = min(wanted, len(ranked))
    while 0 < limit < len(ranked) and ranked[limit - 1] == ranked[limit]:
        limit -= 1
    return limit


def train_bpe(corpus, vocab_size, pre_tokenizer, normalizer=None, specials=(), limit_alphabet=None,
              byte_level=False, **model_options):
    tok = Tokenizer(models.BPE(**model_options))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    options = dict(vocab_size=vocab_size, show_progress=False, special_tokens=list(specials))
    if byte_level:
        options["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    if limit_alphabet is not None:
        options["limit_alphabet"] = tie_free_alphabet_limit(tok, corpus, limit_alphabet)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(**options))
    return to_spec(tok)


def smollm2_style(corpus):
    """SmolLM2-135M's pipeline: Digits(individual) + ByteLevel, no normalizer, 17 special tokens at
    ids 0..16, and a vocab without some byte tokens."""
    spec = train_bpe(without_controls(corpus), 1000,
                     pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                              pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                       trim_offsets=True, use_regex=True)]),
                     specials=SMOLLM2_SPECIALS, byte_level=True)
    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: c)
    # GPT-2's bytes_to_unicode, to name the byte tokens to delete.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    char_of_byte, extra = {}, 0
    for b in range(256):
        if b in printable:
            char_of_byte[b] = chr(b)
        else:
            char_of_byte[b] = chr(256 + extra)
            extra += 1
    assert set(char_of_byte.values()) == set(byte_chars)
    missing = {char_of_byte[b] for b in SMOLLM2_MISSING_BYTES}
    model = spec["model"]
    for left, right in model["merges"]:
        assert left not in missing and right not in missing, "a merge needs a deleted byte token"
    tokens = sorted((i, t) for t, i in model["vocab"].items() if t not in missing)
    model["vocab"] = {t: new_id for new_id, (_, t) in enumerate(tokens)}
    assert all(model["vocab"][s] == i for i, s in enumerate(SMOLLM2_SPECIALS))
    add_merges(model, [("1", "2"), ("2", "4"), ("0", "0")], first=False)
    spec["added_tokens"] = [added(s, i) for i, s in enumerate(SMOLLM2_SPECIALS)]
    spec["decoder"] = component(decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True))
    spec["post_processor"] = component(processors.ByteLevel(add_prefix_space=True, trim_offsets=False,
                                                            use_regex=True))
    return spec


def add_merges(model, pairs, first):
    """Adds hand-made merges (and their tokens) before or after the trained ones: merges the trainer
    never learns but that make a component's effect visible in the ids (a multi-digit token shows
    whether Digits splits digits one by one)."""
    for left, right in pairs:
        assert left in model["vocab"] and right in model["vocab"]
        assert left + right not in model["vocab"], left + right
        model["vocab"][left + right] = len(model["vocab"])
    merges = [list(p) for p in pairs]
    model["merges"] = merges + model["merges"] if first else model["merges"] + merges


def sentencepiece_vocab(corpus, vocab_size, limit_alphabet, pre_tokenizer=None, normalizer=None, **model):
    """A sentencepiece-style BPE (▁ for spaces; <unk> <s> </s> at ids 0..2, then the 256 byte tokens as
    Llama-2 has them), trained with Metaspace so that no merge spans two words."""
    return train_bpe(corpus, vocab_size,
                     pre_tokenizer or pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always"),
                     normalizer=normalizer, specials=SENTENCEPIECE_SPECIALS + BYTE_TOKENS,
                     limit_alphabet=limit_alphabet, **model)


def llama2_style(corpus):
    """Llama-2 as transformers converts it (legacy): Prepend("▁") + Replace(" ", "▁") normalizer, no
    pre-tokenizer, byte fallback with <unk>, decoder Replace/ByteFallback/Fuse/Strip, a BOS."""
    spec = sentencepiece_vocab(corpus, 700, 80, byte_fallback=True, unk_token="<unk>", fuse_unk=True)
    spec["normalizer"] = component(normalizers.Sequence([normalizers.Prepend("\u2581"),
                                                         normalizers.Replace(" ", "\u2581")]))
    spec["pre_tokenizer"] = None
    spec["decoder"] = component(decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                                   decoders.Fuse(), decoders.Strip(" ", 1, 0)]))
    spec["added_tokens"] = [added(s, i) for i, s in enumerate(SENTENCEPIECE_SPECIALS)]
    spec["post_processor"] = component(processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]))
    return spec


def mistral_style(corpus):
    """Metaspace(prepend_scheme first, no split) as transformers writes Llama/Mistral with legacy=False,
    byte fallback, decoder Metaspace/ByteFallback/Fuse, BOS and EOS, chat tokens added mid-text."""
    spec = sentencepiece_vocab(corpus, 700, 80, byte_fallback=True, unk_token="<unk>", fuse_unk=True)
    spec["pre_tokenizer"] = component(pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                               split=False))
    spec["decoder"] = component(decoders.Sequence([decoders.Metaspace(replacement="\u2581",
                                                                      prepend_scheme="first"),
                                                   decoders.ByteFallback(), decoders.Fuse()]))
    base = len(spec["model"]["vocab"])
    spec["added_tokens"] = ([added(s, i) for i, s in enumerate(SENTENCEPIECE_SPECIALS)] +
                            [added("<|im_start|>", base), added("<|im_end|>", base + 1)])
    spec["post_processor"] = component(processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1", special_tokens=[("<s>", 1), ("</s>", 2)]))
    return spec


def metaspace_unk(corpus):
    """Metaspace(always, split) over NFKC + Strip text, a small alphabet and no byte fallback:
    characters outside it become <unk>, one each (fuse_unk false); decoder Metaspace. A first-rank
    merge "▁▁", which only unsplit text can use, shows that the split happens."""
    normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Strip(left=True, right=True)])
    spec = sentencepiece_vocab(corpus, 500, 60, normalizer=normalizer, unk_token="<unk>", fuse_unk=False)
    add_merges(spec["model"], [("\u2581", "\u2581")], first=True)
    spec["pre_tokenizer"] = component(pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                               split=True))
    spec["decoder"] = component(decoders.Metaspace(replacement="\u2581", prepend_scheme="always"))
    spec["added_tokens"] = [added(s, i) for i, s in enumerate(SENTENCEPIECE_SPECIALS)]
    spec["post_processor"] = None
    return spec


def words_style(corpus):
    """BERT-like pre-tokenization for a BPE: NFD + Lowercase + Strip, then Whitespace, Punctuation and
    Digits (runs); fused <unk> for characters outside a small alphabet; decoder Fuse."""
    normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(),
                                       normalizers.Strip(left=True, right=True)])
    pre = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation(),
                                   pre_tokenizers.Digits(individual_digits=False)])
    spec = train_bpe(corpus, 500, pre, normalizer=normalizer, specials=["[UNK]", "[CLS]", "[SEP]"],
                     limit_alphabet=70, unk_token="[UNK]", fuse_unk=True)
    spec["decoder"] = component(decoders.Fuse())
    spec["added_tokens"] = [added(s, i) for i, s in enumerate(["[UNK]", "[CLS]", "[SEP]"])]
    spec["post_processor"] = component(processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)]))
    return spec


def split_style(corpus):
    """Split with every behavior and invert, WhitespaceSplit, Punctuation(MergedWithPrevious); NFKD,
    Replace (regex and string), left Strip; byte fallback with <unk>; decoder
    ByteFallback/Replace/Strip/Fuse. Two first-rank merges ("e-", "0%") show where a split keeps a
    delimiter."""
    normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.Replace(Regex(r"[!?]+"), "!"),
                                       normalizers.Replace("'", "\u2019"),
                                       normalizers.Strip(left=True, right=False)])
    # Each split acts on characters of its own, so that none undoes another.
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Split(Regex(r"\d"), behavior="merged_with_next"),
        pre_tokenizers.Split("-", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[^,]+"), behavior="removed", invert=True),
        pre_tokenizers.Split(Regex(r"[.]"), behavior="isolated"),
        pre_tokenizers.Split(Regex(r"o"), behavior="contiguous"),
        pre_tokenizers.Punctuation(behavior="merged_with_previous"),
    ])
    spec = train_bpe(corpus, 500, pre, normalizer=normalizer, specials=SENTENCEPIECE_SPECIALS + BYTE_TOKENS,
                     limit_alphabet=70, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    add_merges(spec["model"], [("e", "-"), ("0", "%")], first=True)
    # Drop two byte tokens so that some characters fall back to <unk> instead of bytes.
    model = spec["model"]
    for gone in ["<0xE4>", "<0xF0>"]:
        del model["vocab"][gone]
    spec["decoder"] = component(decoders.Sequence([decoders.ByteFallback(), decoders.Replace("\u2019", "'"),
                                                   decoders.Strip("o", 0, 1), decoders.Fuse()]))
    spec["added_tokens"] = [added(s, i) for i, s in enumerate(SENTENCEPIECE_SPECIALS)]
    spec["post_processor"] = None
    return spec


def gpt2_style(corpus):
    """ByteLevel(add_prefix_space) as GPT-2 and RoBERTa have it, behind NFKC + Lowercase; EOS after the
    text; a normalized added token."""
    normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    spec = train_bpe(corpus, 600, pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
                     normalizer=normalizer, specials=["<|endoftext|>"], byte_level=True)
    spec["decoder"] = component(decoders.ByteLevel())
    base = len(spec["model"]["vocab"])
    spec["added_tokens"] = [added("<|endoftext|>", 0), added("Hello", base, special=False, normalized=True)]
    spec["post_processor"] = component(processors.Sequence([
        processors.ByteLevel(trim_offsets=True),
        processors.TemplateProcessing(single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", 0)])]))
    return spec


# name -> builder; each writes tests/data/tokenizer_<name>.json.
COMPONENT_FIXTURES = {
    "smollm2_style": smollm2_style,
    "llama2_style": llama2_style,
    "mistral_style": mistral_style,
    "metaspace_unk": metaspace_unk,
    "words_style": words_style,
    "split_style": split_style,
    "gpt2_style": gpt2_style,
}


# Proof that the fixtures can fail: changing any of these settings changes HF's ids or decoded text
# for some text of the corpus, so a component lockstep ignored or got wrong would show in the tests.
# (fixture, path in tokenizer.json, other value)
SENSITIVITY = [
    ("smollm2_style", "pre_tokenizer.pretokenizers.0.individual_digits", False),
    ("llama2_style", "normalizer.normalizers.0.prepend", "x"),
    ("llama2_style", "normalizer.normalizers.1.content", "_"),
    ("llama2_style", "decoder.decoders.3.start", 0),
    ("mistral_style", "pre_tokenizer.prepend_scheme", "always"),
    ("mistral_style", "decoder.decoders.0.prepend_scheme", "never"),
    ("mistral_style", "model.byte_fallback", False),
    ("metaspace_unk", "pre_tokenizer.split", False),
    ("metaspace_unk", "model.fuse_unk", True),
    ("metaspace_unk", "normalizer.normalizers.1.strip_left", False),
    ("metaspace_unk", "normalizer.normalizers.1.strip_right", False),
    ("metaspace_unk", "normalizer.normalizers.0", {"type": "NFC"}),
    ("words_style", "pre_tokenizer.pretokenizers.1.behavior", "Removed"),
    ("words_style", "pre_tokenizer.pretokenizers.2.individual_digits", True),
    ("words_style", "normalizer.normalizers.0", {"type": "NFC"}),
    ("words_style", "normalizer.normalizers.1", {"type": "NFC"}),
    ("split_style", "pre_tokenizer.pretokenizers.1.behavior", "MergedWithPrevious"),
    ("split_style", "pre_tokenizer.pretokenizers.2.behavior", "Isolated"),
    ("split_style", "pre_tokenizer.pretokenizers.3.invert", False),
    ("split_style", "pre_tokenizer.pretokenizers.4.behavior", "Removed"),
    ("split_style", "pre_tokenizer.pretokenizers.5.behavior", "Isolated"),
    ("split_style", "pre_tokenizer.pretokenizers.6.behavior", "Contiguous"),
    ("split_style", "normalizer.normalizers.0", {"type": "NFC"}),
    ("split_style", "normalizer.normalizers.1.content", "?"),
    ("split_style", "decoder.decoders.1.content", "x"),
    ("split_style", "decoder.decoders.2.stop", 0),
    ("gpt2_style", "pre_tokenizer.add_prefix_space", False),
    ("gpt2_style", "normalizer.normalizers.0", {"type": "NFC"}),
    ("gpt2_style", "normalizer.normalizers.1", {"type": "NFC"}),
]


def check_sensitivity(specs, texts):
    def outputs(spec):
        tok = Tokenizer.from_str(json.dumps(spec))
        ids = [tok.encode(t).ids for t in texts]
        return ids, [tok.decode(i) for i in ids]
    base = {name: outputs(spec) for name, spec in specs.items()}
    for name, path, value in SENSITIVITY:
        spec = json.loads(json.dumps(specs[name]))
        *parents, last = path.split(".")
        node = spec
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value
        assert outputs(spec) != base[name], \
            f"{name}: {path} = {value!r} changes nothing: the fixture cannot fail"


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

    texts = EDGE_CASES + FLAG_CASES + COMPONENT_CASES
    corpus = gsm8k_texts(shared / "gsm8k" / "train.jsonl", 1500) + texts
    fixtures = {}
    for name, build in COMPONENT_FIXTURES.items():
        spec = build(corpus)
        tok = Tokenizer.from_str(json.dumps(spec))  # HF loads what lockstep will load
        write_json(OUT / f"tokenizer_{name}.json", spec, pretty=False)
        with_special = ids_for(tok, texts, True)
        fixtures[name] = {
            "ids": with_special,
            "ids_no_special": ids_for(tok, texts, False),
            "decoded": [tok.decode(ids, skip_special_tokens=False) for ids in with_special],
            "decoded_skip_special": [tok.decode(ids, skip_special_tokens=True) for ids in with_special],
        }

    check_sensitivity({name: json.loads((OUT / f"tokenizer_{name}.json").read_text())
                       for name in COMPONENT_FIXTURES}, texts)

    decode_texts = ["<|im_start|>user\nhi<|im_end|>\n", "<think>\nreasoning\n</think>\n\nanswer",
                    "<|begin_of_text|>hi<|eot_id|>", "a <mask> b [SW] <x><y>", "Cafe\u0301 😀"]
    cases = {
        "generator": "scripts/dev/gen_tokenizer_fixtures.py",
        "texts": texts,
        "qwen3": {"ids": ids_for(qwen3, texts, True),
                  "decode": decode_cases(qwen3, decode_texts)},
        "llama3_style": {"ids": ids_for(llama, texts, True),
                         "ids_no_special": ids_for(llama, texts, False),
                         "decode": decode_cases(llama, decode_texts)},
        "flags": {"ids": ids_for(flags, texts, True), "decode": decode_cases(flags, decode_texts)},
        "fixtures": fixtures,
    }
    write_json(OUT / "tokenizer_cases.json", cases, pretty=False)


if __name__ == "__main__":
    main()
