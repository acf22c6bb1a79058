// io/tokenizer_impl.h — the parts of a loaded Tokenizer (private to io/tokenizer*.cpp): added
// tokens and their matcher, normalizer, pre-tokenizer, BPE model, post-processor template, decoder,
// and the per-id tables decode() reads.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/tokenizer.h"
#include "io/tokenizer_bpe.h"
#include "io/tokenizer_decoder.h"
#include "io/tokenizer_normalizer.h"
#include "io/tokenizer_pre_tokenizer.h"

namespace lockstep {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// A stretch of text, or an added token found in it (id >= 0).
struct TextPiece {
  std::string_view text;
  int32_t id = -1;
};

// Finds added tokens as HF's AddedVocabulary::find_matches does: leftmost-longest, non-overlapping
// matches (HF runs an Aho-Corasick automaton; tokenizers add a few hundred tokens at most, so a
// first-byte index does as well), then its single_word / lstrip / rstrip rules.
class AddedTokenMatcher {
 public:
  // `pattern` is what is searched for: the content, normalized for normalized tokens.
  void add(std::string pattern, const AddedToken* token);
  bool empty() const { return entries_.empty(); }
  // Appends the pieces of `text` (valid UTF-8): added tokens and the stretches between them.
  void split(std::string_view text, std::vector<TextPiece>& out) const;

 private:
  struct Entry {
    std::string pattern;
    const AddedToken* token;
  };
  const Entry* longest_match_at(std::string_view text, size_t pos) const;

  std::vector<Entry> entries_;
  std::array<std::vector<uint32_t>, 256> by_first_byte_;  // indices into entries_, longest first
};

struct Tokenizer::Impl {
  std::vector<AddedToken> added_tokens;  // stable: the matchers point into it
  AddedTokenMatcher raw_matcher;         // tokens with normalized=false, found in the raw text
  AddedTokenMatcher normalized_matcher;  // tokens with normalized=true, found after normalization

  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::unique_ptr<BpeModel> bpe;
  std::unique_ptr<Decoder> decoder;

  std::vector<int32_t> prefix_ids, suffix_ids;  // post-processor template around the text's ids

  // Indexed by id, over [0, vocab_size).
  std::vector<std::string> token_of_id;  // vocab spelling or added content
  std::vector<std::string> bytes_of_id;  // what a lone ByteLevel decoder makes of it
  std::vector<uint8_t> known_id;         // 0 where no token has this id
  std::vector<uint8_t> special_id;
  std::unordered_map<std::string, int32_t> added_ids;
  // What decode() hands the decoder for an added token marked normalized: its normalized content,
  // as HF does (other tokens: token_of_id).
  std::unordered_map<int32_t, std::string> normalized_added;

  const std::string& decoder_input(int32_t id) const {
    const auto it = normalized_added.find(id);
    return it == normalized_added.end() ? token_of_id[size_t(id)] : it->second;
  }

  std::optional<int32_t> eos, bos, pad;

  // Pre-tokenizes one stretch of normalized text (no added tokens in it) and BPE-encodes each piece.
  void encode_stretch(std::string_view text, bool at_text_start, std::vector<int32_t>& ids) const;
};

}  // namespace lockstep
