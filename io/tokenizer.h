// io/tokenizer.h — Hugging Face BPE tokenizers (tokenizer.json): text to token ids and back, giving
// the ids and the text HF `tokenizers` 0.23 gives. Byte-level BPE (Qwen3, Qwen2.5, Llama-3,
// SmolLM2) and sentencepiece-style BPE (Llama-2, Mistral: Metaspace or Prepend + Replace, byte
// fallback).
//
// The pipeline, as in HF: added tokens are cut out of the raw text first (never split); each
// stretch between them is normalized (io/tokenizer_normalizer.h), pre-tokenized
// (io/tokenizer_pre_tokenizer.h) and BPE-encoded piece by piece (io/tokenizer_bpe.h); the
// post-processor may wrap the ids in special tokens (a BOS). decode() runs the decoder
// (io/tokenizer_decoder.h). A component outside those is refused at load with an error naming the
// file and the field, never silently ignored.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep {

class Tokenizer {
 public:
  // tokenizer.json, plus tokenizer_config.json for the special token names (eos/bos/pad) when a
  // path is given. Throws lockstep::Error naming the file and field on a missing file, bad JSON or
  // an unsupported component.
  static Tokenizer from_files(const std::filesystem::path& tokenizer_json,
                              const std::filesystem::path& tokenizer_config_json = {});
  // A model directory: dir/tokenizer.json, and dir/tokenizer_config.json when it exists.
  static Tokenizer from_dir(const std::filesystem::path& dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // UTF-8 text to ids. add_special_tokens applies the post-processor's template, as HF's
  // encode(text, add_special_tokens=True) does (Qwen3 adds nothing, Llama-3 a leading BOS); special
  // tokens written in the text (<|im_start|>) are recognised either way. Invalid UTF-8 throws.
  // Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  // Ids back to text, as HF's decode gives it (for byte-level BPE, the exact bytes encode() started
  // from). Ids the tokenizer does not know (e.g. embedding rows past the vocab, which a model can
  // sample) decode to nothing, as in HF. Unlike HF, a sequence cut inside a multi-byte character
  // gives the raw bytes, not U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // True when decoding a stream piece by piece and concatenating gives the same bytes as decoding it
  // whole (a ByteLevel decoder). Not so for sentencepiece-style decoders, whose first token loses
  // its leading space (Metaspace, Strip).
  bool decodes_piecewise() const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token's string as the vocab spells it (byte-level characters, e.g. "Ġthe"), or the
  // content of an added token.
  std::optional<std::string> id_to_token(int32_t id) const;
  // One past the largest id (vocab and added tokens): the range of ids encode() can produce.
  int32_t vocab_size() const;
  // True for added tokens marked special (what skip_special_tokens drops).
  bool is_special(int32_t id) const;

  // From tokenizer_config.json; empty when it was not given or names none.
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> pad_id() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep
