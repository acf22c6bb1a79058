// io/tokenizer_regex.h — the regexes of tokenizer.json (HF `Split` and `Replace` patterns, and
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

  // A stretch [start, end) of the text, and whether the regex matched it.
  struct Match {
    size_t start, end;
    bool is_match;
  };
  // HF's Pattern::find_matches: `text` cut into contiguous stretches, matches and the text between
  // them, in order ([(0, 0, false)] for an empty text). Empty matches are kept, except one right at
  // the end of the previous match (Oniguruma's find_iter skips those). A non-empty literal pattern
  // is searched bytewise, so `text` may then hold invalid UTF-8 (a decoder's raw bytes); a regex
  // needs valid UTF-8. Thread-safe.
  void find_matches(std::string_view text, std::vector<Match>& out) const;

 private:
  // The first match at or after `from`, as [start, end); false when there is none.
  bool search(std::string_view text, size_t from, size_t& start, size_t& end) const;

  pcre2_code_8* code_ = nullptr;
  std::string literal_;  // the pattern when it is a non-empty literal string
};

}  // namespace lockstep
