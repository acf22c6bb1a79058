// io/tokenizer_decoder.h — tokenizer.json's `decoder`, run as HF `tokenizers` 0.23 runs it:
// ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, and Sequence of these. It turns the
// tokens' strings (vocab spellings and added tokens' contents) into text.
//
// One difference from HF, by design: where bytes do not form valid UTF-8 (a sequence cut inside a
// character), the text keeps the raw bytes instead of HF's U+FFFD, so that with a ByteLevel decoder
// the pieces of a stream decoded one by one concatenate to the whole.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/tokenizer_pre_tokenizer.h"
#include "io/tokenizer_regex.h"

namespace lockstep {

class Decoder {
 public:
  // The decoder described at `path` of tokenizer.json (e.g. "decoder"); throws lockstep::Error
  // naming the field of an unsupported or malformed one.
  static Decoder from_json(const nlohmann::json& spec, const std::string& path);

  // True for a lone ByteLevel decoder: each token then decodes on its own, to its bytes.
  bool byte_level_only() const { return steps_.size() == 1 && steps_[0].kind == Kind::byte_level; }

  std::string decode(std::vector<std::string> tokens) const;

 private:
  enum class Kind { byte_level, metaspace, byte_fallback, fuse, strip, replace };
  struct Step {
    Kind kind = Kind::byte_level;
    MetaspaceOptions metaspace;                 // metaspace
    std::string content;                        // strip: the character; replace: the replacement
    size_t start = 0, stop = 0;                 // strip
    std::shared_ptr<const SplitRegex> pattern;  // replace
  };
  void add(const nlohmann::json& spec, const std::string& path);

  std::vector<Step> steps_;
};

// What the ByteLevel decoder makes of one token: its bytes when every character is a byte-level
// character, else the token's own UTF-8 (HF does the same, token by token).
std::string byte_level_decoded(const std::string& token);

}  // namespace lockstep
