// io/tokenizer_regex.h — the pre-tokenizer's regex split (HF `Split` with behavior Isolated, and
// ByteLevel's GPT-2 regex), on PCRE2 with the semantics HF gets from Oniguruma.
#pragma once

#include <string>
#include <string_view>
#include <vector>

typedef struct pcre2_real_code_8 pcre2_code_8;

namespace lockstep {

// GPT-2's pre-tokenization pattern, which ByteLevel applies when use_regex is true.
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Rewrites an HF (Oniguruma) pattern for PCRE2: \s and \S become explicit Unicode White_Space
// classes, because PCRE2's \s also matches U+180E where Oniguruma's does not.
std::string oniguruma_to_pcre2(std::string_view pattern);

class SplitRegex {
 public:
  // A regex pattern (HF `pattern.Regex`), or with literal=true a plain string (`pattern.String`).
  // Throws lockstep::Error with PCRE2's message if it does not compile.
  SplitRegex(std::string_view pattern, bool literal);
  ~SplitRegex();
  SplitRegex(SplitRegex&& other) noexcept;
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;
  SplitRegex& operator=(SplitRegex&&) = delete;

  // Appends to `out` the pieces of `text` (valid UTF-8): each match, and each non-empty stretch
  // between matches, in order. Thread-safe.
  void split_isolated(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  pcre2_code_8* code_ = nullptr;
};

}  // namespace lockstep
