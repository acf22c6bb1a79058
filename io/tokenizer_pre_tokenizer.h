// io/tokenizer_pre_tokenizer.h — tokenizer.json's `pre_tokenizer`, run as HF `tokenizers` 0.23 runs
// it: Sequence, Split (every behavior, invert), ByteLevel, Digits, Metaspace, Whitespace,
// WhitespaceSplit and Punctuation. It cuts a stretch of normalized text into the pieces the model
// encodes one by one.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer_regex.h"

namespace lockstep {

// What a split does with the delimiters it finds (HF's SplitDelimiterBehavior), on "the-final--countdown"
// split at '-': Removed [the, final, countdown]; Isolated [the, -, final, -, -, countdown];
// MergedWithPrevious [the-, final-, -, countdown]; MergedWithNext [the, -final, -, -countdown];
// Contiguous [the, -, final, --, countdown].
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// Metaspace's settings, shared by the pre-tokenizer and the decoder of that name. prepend_scheme:
// always (each piece), first (only the piece that begins the text) or never.
struct MetaspaceOptions {
  enum class Prepend { always, first, never };
  std::string replacement = "\xE2\x96\x81";  // U+2581 '▁', as UTF-8
  Prepend prepend = Prepend::always;
  bool split = true;
};
// Reads a Metaspace object (pre-tokenizer or decoder), with the legacy add_prefix_space field.
MetaspaceOptions metaspace_from_json(const nlohmann::json& spec, const std::string& path);

class PreTokenizer {
 public:
  // The pre-tokenizer described at `path` of tokenizer.json (e.g. "pre_tokenizer"), or none when
  // spec is null. Throws lockstep::Error naming the field of an unsupported or malformed one.
  static PreTokenizer from_json(const nlohmann::json* spec, const std::string& path);
  PreTokenizer() = default;

  // True when it ends with ByteLevel: the model then reads the pieces' bytes (each as GPT-2's
  // byte-level character), not their characters.
  bool byte_level() const { return byte_level_; }

  // Appends the pieces of `text` (valid UTF-8, normalized, holding no added token). at_text_start:
  // the stretch begins the encoded text, for Metaspace's prepend_scheme "first", which HF applies to
  // a piece whose offset in the original text is 0; a piece split off at the stretch's first byte
  // counts as such. (HF, tracking offsets through the normalizer, would not count it when a Strip
  // normalizer removed leading whitespace and a splitting pre-tokenizer runs before Metaspace: no
  // published tokenizer.json combines these.) A piece points into `text` or into storage of this
  // thread that the next call reuses. Thread-safe.
  void split(std::string_view text, bool at_text_start, std::vector<std::string_view>& pieces) const;

 private:
  enum class Kind { regex, byte_level, digits, metaspace, whitespace, whitespace_split, punctuation };
  struct Step {
    Kind kind = Kind::regex;
    SplitBehavior behavior = SplitBehavior::isolated;  // regex, punctuation
    bool invert = false;                               // regex
    bool add_prefix_space = false;                     // byte_level
    bool individual_digits = false;                    // digits
    MetaspaceOptions metaspace;                        // metaspace
    std::shared_ptr<const SplitRegex> regex;           // regex, byte_level with use_regex
  };
  void add(const nlohmann::json& spec, const std::string& path);

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace lockstep
