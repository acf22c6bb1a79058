// io/tokenizer_bpe.h — the byte-level BPE model: GPT-2's byte <-> character map, and the merge
// loop that turns one pre-tokenized piece into token ids, as HF `tokenizers`' BPE does it.
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

class BpeModel {
 public:
  // vocab: token (byte-level characters) -> id. merges: token pairs in rank order, best first.
  // With ignore_merges, a piece that is itself in the vocab is one token, whatever the merges say.
  // Throws lockstep::Error naming the `model.vocab` / `model.merges[i]` entry that is wrong.
  BpeModel(std::unordered_map<std::string, int32_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges);

  // Appends the ids of one pre-tokenized piece, given as raw bytes. Thread-safe.
  void encode_piece(std::string_view bytes, std::vector<int32_t>& out) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return uint64_t(uint32_t(left)) << 32 | uint32_t(right);
  }
  void merge(std::string_view bytes, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank and merged id
  std::array<int32_t, 256> byte_ids_{};
  bool ignore_merges_;

  // Pieces repeat a lot (words, numbers, whitespace runs): remember their ids.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace lockstep
