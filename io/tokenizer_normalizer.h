// io/tokenizer_normalizer.h — tokenizer.json's `normalizer`, run as HF `tokenizers` 0.23 runs it:
// NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, and Sequence of these. HF also
// normalizes the content of added tokens marked `normalized` with it before searching for them.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer_regex.h"

namespace lockstep {

class Normalizer {
 public:
  // The normalizer described at `path` of tokenizer.json (e.g. "normalizer"); throws
  // lockstep::Error naming the field of an unsupported or malformed one.
  static Normalizer from_json(const nlohmann::json& spec, const std::string& path);
  Normalizer() = default;

  bool empty() const { return steps_.empty(); }
  // Valid UTF-8 in, valid UTF-8 out. Thread-safe.
  std::string normalize(std::string_view text) const;

 private:
  enum class Kind { nfc, nfd, nfkc, nfkd, lowercase, strip, prepend, replace };
  struct Step {
    Kind kind = Kind::nfc;
    bool strip_left = false, strip_right = false;  // Strip
    std::string text;                              // Prepend's prefix, Replace's content
    std::shared_ptr<const SplitRegex> pattern;     // Replace
  };
  void add(const nlohmann::json& spec, const std::string& path);

  std::vector<Step> steps_;
};

}  // namespace lockstep
