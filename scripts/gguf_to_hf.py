#!/usr/bin/env python3
"""Converts a Llama-architecture GGUF file with a GPT-2-style (byte-level BPE) vocabulary into a
Hugging Face model folder that transformers and lockstep load: model.safetensors (bf16, Hugging
Face tensor names), config.json, generation_config.json, tokenizer.json, tokenizer_config.json.

  python3 scripts/gguf_to_hf.py MODEL.gguf OUT_DIR

Needs only numpy and the `gguf` package (which reads and dequantizes GGUF); scripts/get_model.sh
installs both. OUT_DIR must not exist yet or be empty; get_model.sh writes into a temporary folder
and renames it, so that a failed conversion leaves nothing behind.

What the conversion undoes or rebuilds, as transformers' own GGUF loader does
(transformers/integrations/ggml.py, transformers/modeling_gguf_pytorch_utils.py):
- Quantized tensors (Q4_1, Q8_0, ...) are dequantized to fp32 by `gguf`, then rounded to bf16 to
  nearest even. GGUF's numpy shape is already Hugging Face's [out_features, in_features].
- llama.cpp's converter permutes the rows of q_proj and k_proj within each head from Hugging Face's
  rotate-half RoPE layout (first half of the head dim, then the second) to the interleaved layout
  (pairs of adjacent rows); the inverse permutation is applied here.
- No output.weight means the LM head is tied to the token embedding (tie_word_embeddings).
- tokenizer.json is rebuilt from tokenizer.ggml.tokens / merges / token_type; the pre-tokenizer is
  not stored in GGUF, only named (tokenizer.ggml.pre), so each supported name maps to the
  Hugging Face pre-tokenizer of the model it came from (PRE_TOKENIZERS below).
"""
import argparse
import json
import pathlib
import sys

import numpy as np
import gguf


class ConversionError(Exception):
    pass


# tokenizer.ggml.pre -> the pre-tokenizer of the original Hugging Face tokenizer.json. "smollm"
# (SmolLM / SmolLM2, HuggingFaceTB): every digit its own piece, then GPT-2's byte-level split.
PRE_TOKENIZERS = {
    "smollm": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ],
    },
}

# GGUF block tensor names -> Hugging Face LlamaForCausalLM names (model.layers.N.<name>).
LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# llama.cpp's token types (gguf.TokenType): NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4,
# UNUSED 5, BYTE 6. CONTROL tokens are Hugging Face's special added tokens; USER_DEFINED ones are
# added tokens that are not special.
CONTROL, USER_DEFINED = int(gguf.TokenType.CONTROL), int(gguf.TokenType.USER_DEFINED)


class Metadata:
    """Typed access to the GGUF key-value fields, with errors naming the file and key."""

    def __init__(self, reader, path):
        self.reader, self.path = reader, path

    def has(self, key):
        return key in self.reader.fields

    def get(self, key, default=None, required=True):
        field = self.reader.fields.get(key)
        if field is None:
            if required and default is None:
                raise ConversionError(f"{self.path}: metadata key '{key}' is missing (required)")
            return default
        return field.contents()

    def positive_int(self, key):
        value = self.get(key)
        if not isinstance(value, int) or value <= 0:
            raise ConversionError(f"{self.path}: metadata key '{key}' must be a positive integer, "
                                  f"got {value!r}")
        return value


def shortest_float(value):
    """The shortest decimal that reads back as the same float32 (GGUF stores 1e-5 as float32, which
    would print as 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def reverse_rope_permute(weight, heads):
    """Undoes llama.cpp's `permute` (convert_hf_to_gguf.py, LlamaModel): it reshapes the rows of a
    q/k projection as [heads, 2, head_dim/2] and swaps the last two axes, turning rotate-half RoPE
    pairs (i, i + head_dim/2) into adjacent rows (2i, 2i+1). Swapping back as
    [heads, head_dim/2, 2] restores Hugging Face's order."""
    rows = weight.shape[0]
    if rows % (2 * heads):
        raise ConversionError(f"a q/k projection of {rows} rows does not split into {heads} heads of "
                              "even size")
    paired = weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
    return paired.swapaxes(1, 2).reshape(weight.shape)


def to_bf16_bits(values):
    """float32 -> bf16 (as uint16 bit patterns), rounded to nearest, ties to even."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if not np.isfinite(values).all():
        raise ConversionError("a dequantized tensor holds a non-finite value")
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def write_safetensors(tensors, path):
    """Writes {name: (shape, uint16 bf16 bits)} as one safetensors file: an 8-byte little-endian
    header length, the JSON header (padded with spaces to 8 bytes), then the tensors' bytes in
    header order."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (shape, bits) in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + bits.nbytes]}
        offset += bits.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for _, bits in tensors.values():
            f.write(bits.astype("<u2", copy=False).tobytes())


def convert_config(meta):
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ConversionError(f"{meta.path}: general.architecture is '{arch}'; this converter reads 'llama'")
    heads = meta.positive_int("llama.attention.head_count")
    kv_heads = meta.get("llama.attention.head_count_kv", heads)
    hidden = meta.positive_int("llama.embedding_length")
    head_dim = meta.get("llama.attention.key_length", hidden // heads)
    rope_dim = meta.get("llama.rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise ConversionError(f"{meta.path}: llama.rope.dimension_count ({rope_dim}) differs from the head "
                              f"dimension ({head_dim}); partial RoPE is not supported")
    for key in meta.reader.fields:
        if key.startswith("llama.rope.scaling."):
            raise ConversionError(f"{meta.path}: '{key}' is set; RoPE scaling is not supported by this "
                                  "converter")
    vocab = len(meta.get("tokenizer.ggml.tokens"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id", required=False),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id", required=False),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": meta.positive_int("llama.feed_forward_length"),
        "max_position_embeddings": meta.positive_int("llama.context_length"),
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": heads,
        "num_hidden_layers": meta.positive_int("llama.block_count"),
        "num_key_value_heads": kv_heads,
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id", required=False),
        "rms_norm_eps": shortest_float(meta.get("llama.attention.layer_norm_rms_epsilon")),
        "rope_scaling": None,
        "rope_theta": shortest_float(meta.get("llama.rope.freq_base", 10000.0)),
        "tie_word_embeddings": True,  # set from the tensors in convert_weights
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": vocab,
    }


def hf_tensor_name(gguf_name):
    parts = gguf_name.split(".")
    if parts[-1] != "weight":
        return None
    if len(parts) == 2 and parts[0] in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[parts[0]] + ".weight"
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}.weight"
    return None


def convert_weights(reader, path, config):
    """{hf name: (shape, bf16 bits)} in a stable order (embedding, layers, norm, head)."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    out = {}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        if name is None:
            if tensor.name == "rope_freqs.weight":
                raise ConversionError(f"{path}: tensor 'rope_freqs.weight' (scaled RoPE) is not supported")
            raise ConversionError(f"{path}: tensor '{tensor.name}' has no Hugging Face Llama counterpart")
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        expected = tuple(int(d) for d in reversed(tensor.shape))
        if weight.shape != expected:
            raise ConversionError(f"{path}: tensor '{tensor.name}' dequantized to shape {weight.shape}, "
                                  f"expected {expected}")
        if name.endswith("q_proj.weight"):
            weight = reverse_rope_permute(weight, heads)
        elif name.endswith("k_proj.weight"):
            weight = reverse_rope_permute(weight, kv_heads)
        out[name] = (weight.shape, to_bf16_bits(weight))
    config["tie_word_embeddings"] = "lm_head.weight" not in out

    head_dim = config["head_dim"]
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    per_layer = {"input_layernorm": (hidden,), "post_attention_layernorm": (hidden,),
                 "self_attn.q_proj": (heads * head_dim, hidden),
                 "self_attn.k_proj": (kv_heads * head_dim, hidden),
                 "self_attn.v_proj": (kv_heads * head_dim, hidden),
                 "self_attn.o_proj": (hidden, heads * head_dim),
                 "mlp.gate_proj": (config["intermediate_size"], hidden),
                 "mlp.up_proj": (config["intermediate_size"], hidden),
                 "mlp.down_proj": (hidden, config["intermediate_size"])}
    for i in range(layers):
        for short, shape in per_layer.items():
            shapes[f"model.layers.{i}.{short}.weight"] = shape
    for name, shape in shapes.items():
        if name not in out:
            raise ConversionError(f"{path}: no tensor for '{name}'")
        if tuple(out[name][0]) != shape:
            raise ConversionError(f"{path}: '{name}' has shape {tuple(out[name][0])}, the config implies "
                                  f"{shape}")
    return {name: out[name] for name in shapes}


def convert_tokenizer(meta):
    """tokenizer.json and tokenizer_config.json as Python objects."""
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ConversionError(f"{meta.path}: tokenizer.ggml.model is '{model}'; this converter reads 'gpt2' "
                              "(byte-level BPE)")
    pre = meta.get("tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        raise ConversionError(f"{meta.path}: tokenizer.ggml.pre is '{pre}'; this converter knows the "
                              f"pre-tokenizers of {', '.join(sorted(PRE_TOKENIZERS))}")
    if meta.get("tokenizer.ggml.add_bos_token", False, required=False) or \
            meta.get("tokenizer.ggml.add_eos_token", False, required=False):
        raise ConversionError(f"{meta.path}: tokenizer.ggml.add_bos_token/add_eos_token is true; this "
                              "converter writes tokenizers that add no special tokens")
    tokens = meta.get("tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type")
    merges = meta.get("tokenizer.ggml.merges")
    if len(types) != len(tokens):
        raise ConversionError(f"{meta.path}: tokenizer.ggml.token_type has {len(types)} entries for "
                              f"{len(tokens)} tokens")
    vocab = {}
    for i, token in enumerate(tokens):
        if token in vocab:
            raise ConversionError(f"{meta.path}: tokenizer.ggml.tokens[{i}] '{token}' repeats token "
                                  f"{vocab[token]}")
        vocab[token] = i
    pairs = []
    for i, merge in enumerate(merges):
        parts = merge.split(" ")
        if len(parts) != 2 or any(p not in vocab for p in (parts[0], parts[1], parts[0] + parts[1])):
            raise ConversionError(f"{meta.path}: tokenizer.ggml.merges[{i}] '{merge}' is not a merge of two "
                                  "tokens into a token of the vocabulary")
        pairs.append(parts)

    added = [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": types[i] != CONTROL, "special": types[i] == CONTROL}
             for i in range(len(tokens)) if types[i] in (CONTROL, USER_DEFINED)]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False,
                  "vocab": vocab, "merges": pairs},
    }

    def token_name(key):
        token_id = meta.get(key, required=False)
        if token_id is None:
            return None
        if not 0 <= token_id < len(tokens):
            raise ConversionError(f"{meta.path}: {key} ({token_id}) is not a token id (vocabulary of "
                                  f"{len(tokens)})")
        return tokens[token_id]

    tokenizer_config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word",
                                             "special")}
            for t in added},
        "bos_token": token_name("tokenizer.ggml.bos_token_id"),
        "clean_up_tokenization_spaces": False,
        "eos_token": token_name("tokenizer.ggml.eos_token_id"),
        "model_max_length": meta.positive_int("llama.context_length"),
        "pad_token": token_name("tokenizer.ggml.padding_token_id"),
        # Not GPT2Tokenizer (SmolLM2's own choice): transformers 5 rebuilds that class's pipeline
        # from the class (plain ByteLevel), dropping the Digits step; this one reads tokenizer.json.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": token_name("tokenizer.ggml.unknown_token_id"),
    }
    template = meta.get("tokenizer.chat_template", required=False)
    if template is not None:
        tokenizer_config["chat_template"] = template
    return tokenizer, tokenizer_config


def convert(gguf_path, out_dir):
    """Writes the Hugging Face folder; returns {file name: size in bytes}."""
    out_dir = pathlib.Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConversionError(f"{out_dir}: the output folder exists and is not an empty folder")
    try:
        reader = gguf.GGUFReader(gguf_path)
    except (OSError, ValueError) as e:
        raise ConversionError(f"{gguf_path}: not a readable GGUF file ({e})")
    meta = Metadata(reader, gguf_path)
    config = convert_config(meta)
    tokenizer, tokenizer_config = convert_tokenizer(meta)
    if config["vocab_size"] != meta.get("llama.vocab_size", config["vocab_size"], required=False):
        raise ConversionError(f"{gguf_path}: llama.vocab_size ({meta.get('llama.vocab_size')}) differs from "
                              f"the {config['vocab_size']} tokens of tokenizer.ggml.tokens")
    tensors = convert_weights(reader, gguf_path, config)
    generation_config = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                         if config[k] is not None}

    out_dir.mkdir(parents=True, exist_ok=True)
    write_safetensors(tensors, out_dir / "model.safetensors")
    for name, obj in (("config.json", config), ("generation_config.json", generation_config),
                      ("tokenizer_config.json", tokenizer_config)):
        (out_dir / name).write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer, indent=2, ensure_ascii=False) + "\n")
    return {p.name: p.stat().st_size for p in sorted(out_dir.iterdir())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf", help="the GGUF file")
    parser.add_argument("out_dir", help="the Hugging Face folder to write (absent or empty)")
    args = parser.parse_args()
    try:
        files = convert(args.gguf, args.out_dir)
    except ConversionError as e:
        sys.exit(f"gguf_to_hf: {e}")
    for name, size in files.items():
        print(f"  {name:24s} {size:>12,d} bytes")


if __name__ == "__main__":
    main()
