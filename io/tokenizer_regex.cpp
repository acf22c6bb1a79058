// io/tokenizer_regex.cpp — PCRE2 (UTF + UCP, JIT when available) behind SplitRegex.
#include "io/tokenizer_regex.h"

#include <pcre2.h>

#include <memory>

#include "core/error.h"

namespace lockstep {
namespace {

// Unicode White_Space as class items: the set Oniguruma's \s matches.
constexpr std::string_view kWhiteSpaceItems =
    R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof buffer) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buffer);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

// Room for the whole match only: the split needs no capture groups.
pcre2_match_data* thread_match_data() {
  thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(pcre2_match_data_create(1, nullptr));
  LOCKSTEP_CHECK(data != nullptr, "out of memory allocating PCRE2 match data");
  return data.get();
}

size_t utf8_length(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

}  // namespace

std::string oniguruma_to_pcre2(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += in_class ? std::string(kWhiteSpaceItems) : "[" + std::string(kWhiteSpaceItems) + "]";
      } else if (next == 'S') {
        LOCKSTEP_CHECK(!in_class, "\\S inside a character class is not supported: ", pattern);
        out += "[^" + std::string(kWhiteSpaceItems) + "]";
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      // A ']' right after '[' or '[^' is a literal, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
    } else if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // POSIX class such as [:alpha:]
      LOCKSTEP_CHECK(end != std::string_view::npos, "unterminated POSIX class in ", pattern);
      out.append(pattern.substr(i + 1, end + 2 - (i + 1)));
      i = end + 1;
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

SplitRegex::SplitRegex(std::string_view pattern, bool literal) {
  if (literal) literal_ = pattern;
  const std::string source = literal ? std::string(pattern) : oniguruma_to_pcre2(pattern);
  // PCRE2 refuses UCP beside LITERAL; a literal needs no character classes anyway.
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), options, &error, &offset,
                        nullptr);
  LOCKSTEP_CHECK(code_ != nullptr, "regex /", pattern, "/ does not compile: ", pcre2_message(error),
                 " (at offset ", offset, ")");
  // JIT is an optimization: where it is unavailable the interpreter gives the same matches.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

SplitRegex::~SplitRegex() { pcre2_code_free(code_); }

SplitRegex::SplitRegex(SplitRegex&& other) noexcept
    : code_(other.code_), literal_(std::move(other.literal_)) {
  other.code_ = nullptr;
}

bool SplitRegex::search(std::string_view text, size_t from, size_t& start, size_t& end) const {
  pcre2_match_data* data = thread_match_data();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = pcre2_match(code_, subject, text.size(), from, PCRE2_NO_UTF_CHECK, data, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
    rc = pcre2_match(code_, subject, text.size(), from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  LOCKSTEP_CHECK(rc >= 0, "tokenizer regex failed on a ", text.size(), "-byte text: ", pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  start = ovector[0];
  end = ovector[1];
  return true;
}

void SplitRegex::find_matches(std::string_view text, std::vector<Match>& out) const {
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  size_t previous = 0;  // end of what has been handed out
  if (!literal_.empty()) {  // leftmost non-overlapping occurrences, as the escaped regex finds them
    for (size_t at = text.find(literal_); at != std::string_view::npos; at = text.find(literal_, previous)) {
      if (previous != at) out.push_back({previous, at, false});
      out.push_back({at, at + literal_.size(), true});
      previous = at + literal_.size();
    }
    if (previous != text.size()) out.push_back({previous, text.size(), false});
    return;
  }
  size_t search_from = 0;  // Oniguruma's last_end
  bool matched_before = false;
  size_t last_match_end = 0;
  while (search_from <= text.size()) {
    size_t start = 0, end = 0;
    if (!search(text, search_from, start, end)) break;
    if (start == end && matched_before && last_match_end == end) {
      search_from +=
          search_from < text.size() ? utf8_length(static_cast<unsigned char>(text[search_from])) : 1;
      continue;
    }
    search_from = end;
    matched_before = true;
    last_match_end = end;
    if (previous != start) out.push_back({previous, start, false});
    out.push_back({start, end, true});
    previous = end;
  }
  if (previous != text.size()) out.push_back({previous, text.size(), false});
}

void SplitRegex::split_isolated(std::string_view text, std::vector<std::string_view>& out) const {
  pcre2_match_data* data = thread_match_data();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t previous_end = 0;
  size_t search_from = 0;
  while (search_from < text.size()) {
    // The caller validated the UTF-8 once for the whole text.
    int rc = pcre2_match(code_, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // the interpreter keeps its backtracking on the heap
      rc = pcre2_match(code_, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data,
                       nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    LOCKSTEP_CHECK(rc >= 0, "pre-tokenizer regex failed on a ", text.size(),
                   "-byte text: ", pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t start = ovector[0], end = ovector[1];
    if (start > previous_end) out.push_back(text.substr(previous_end, start - previous_end));
    if (end > start) {
      out.push_back(text.substr(start, end - start));
      search_from = end;
    } else {  // an empty match splits nothing off; step over one character
      if (end >= text.size()) break;
      search_from = end + utf8_length(static_cast<unsigned char>(text[end]));
    }
    previous_end = end;
  }
  if (previous_end < text.size()) out.push_back(text.substr(previous_end));
}

}  // namespace lockstep
