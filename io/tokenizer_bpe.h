// io/tokenizer_bpe.h — the BPE model: GPT-2's byte <-> character map, and the merge loop that turns
// one pre-tokenized piece into token ids, as HF `tokenizers`' BPE does it — over the piece's bytes
// (byte-level BPE: Qwen, Llama-3, SmolLM2) or its characters (sentencepiece-style BPE: Llama-2,
// Mistral), with byte_fallback, unk_token and ignore_merges.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lockstep {

// GPT-2's bytes_to_unicode: the printable character (as UTF-8) that stands for byte b in the vocab.
const std::string& byte_level_char(uint8_t b);
// The byte that code point c stands for, or -1 if c stands for none.
int byte_of_byte_level_char(char32_t c);

struct BpeOptions {
  // The piece's units are its bytes, each spelled as its byte-level character; else its characters.
  bool byte_level = true;
  // A piece that is itself in the vocab is one token, whatever the merges say.
  bool ignore_merges = false;
  // A unit missing from the vocab becomes the tokens <0xXX> of its UTF-8 bytes, when all exist.
  bool byte_fallback = false;
  // Else it becomes this token (consecutive ones fused into one with fuse_unk); with no unk_token
  // it is dropped, as HF drops it (e.g. a byte-level vocab without some byte's token).
  std::string unk_token;
  bool fuse_unk = false;
};

class BpeModel {
 public:
  // vocab: token -> id. merges: token pairs in rank order, best first. Throws lockstep::Error naming
  // the `model.merges[i]` entry that is wrong.
  BpeModel(std::unordered_map<std::string, int32_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);

  // Appends the ids of one pre-tokenized piece (raw bytes for byte-level BPE, UTF-8 text else).
  // Thread-safe.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return uint64_t(uint32_t(left)) << 32 | uint32_t(right);
  }
  // HF's BPE::merge_word: the units' ids (with fallback and unknown handling), then the merges.
  void merge_word(std::string_view piece, std::vector<int32_t>& out) const;
  void merge(std::vector<int32_t>& symbols) const;
  // The unit's spelling in the vocab: its byte-level character, or the character itself.
  int32_t unit_id(std::string_view unit) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank and merged id
  std::array<int32_t, 256> byte_ids_{};          // byte-level: the byte's token, or -1
  std::array<int32_t, 256> fallback_ids_{};      // <0xXX> tokens, or -1
  int32_t unk_id_ = -1;
  BpeOptions options_;

  // Pieces repeat a lot (words, numbers, whitespace runs): remember their ids.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace lockstep
