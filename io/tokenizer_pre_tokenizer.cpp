// io/tokenizer_pre_tokenizer.cpp — the pre-tokenizers of io/tokenizer_pre_tokenizer.h. Each step maps
// the list of pieces to a new one, as HF's PreTokenizedString::split does; empty pieces are dropped.
#include "io/tokenizer_pre_tokenizer.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "io/tokenizer_json.h"
#include "io/tokenizer_unicode.h"

namespace lockstep {

using namespace tokenizer_json;

namespace {

SplitBehavior behavior_from_json(const json& spec, const std::string& path, std::string_view key) {
  const std::string name = string_member(spec, path, key);
  if (name == "Removed") return SplitBehavior::removed;
  if (name == "Isolated") return SplitBehavior::isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (name == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (name == "Contiguous") return SplitBehavior::contiguous;
  unsupported(field(path, key), "'" + name + "'",
              "Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

struct Piece {
  std::string_view text;
  bool at_start;  // begins the encoded text
};
using Match = SplitRegex::Match;

// HF's Pattern for a char predicate: each character it accepts is a match of its own.
template <class Predicate>
void char_matches(std::string_view text, Predicate is_delimiter, std::vector<Match>& out) {
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  size_t last = 0;
  for (size_t pos = 0; pos < text.size();) {
    int length = 0;
    const char32_t c = unicode::code_point_at(text, pos, &length);
    if (is_delimiter(c)) {
      if (last < pos) out.push_back({last, pos, false});
      out.push_back({pos, pos + size_t(length), true});
      last = pos + size_t(length);
    }
    pos += size_t(length);
  }
  if (last < text.size()) out.push_back({last, text.size(), false});
}

// HF's NormalizedString::split: what `behavior` keeps of the matches, as pieces of `piece`.
void split_by_behavior(const Piece& piece, const std::vector<Match>& matches, SplitBehavior behavior,
                       std::vector<Piece>& out) {
  thread_local std::vector<std::pair<size_t, size_t>> ranges;
  ranges.clear();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::isolated:
      for (const Match& m : matches) ranges.emplace_back(m.start, m.end);
      break;
    case SplitBehavior::removed:
      for (const Match& m : matches)
        if (!m.is_match) ranges.emplace_back(m.start, m.end);
      break;
    case SplitBehavior::contiguous:
      for (const Match& m : matches) {
        if (m.is_match == previous_match && !ranges.empty()) {
          ranges.back().second = m.end;
        } else {
          ranges.emplace_back(m.start, m.end);
        }
        previous_match = m.is_match;
      }
      break;
    case SplitBehavior::merged_with_previous:
      for (const Match& m : matches) {
        if (m.is_match && !previous_match && !ranges.empty()) {
          ranges.back().second = m.end;
        } else {
          ranges.emplace_back(m.start, m.end);
        }
        previous_match = m.is_match;
      }
      break;
    case SplitBehavior::merged_with_next:  // HF folds from the end
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->is_match && !previous_match && !ranges.empty()) {
          ranges.back().first = it->start;
        } else {
          ranges.emplace_back(it->start, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(ranges.begin(), ranges.end());
      break;
  }
  for (const auto& [start, end] : ranges)
    if (end > start) out.push_back({piece.text.substr(start, end - start), piece.at_start && start == 0});
}

// Whitespace: the matches of \w+|[^\w\s]+ (Rust regex classes), the rest removed. A run of word
// characters or a run of other non-space characters is one piece.
void split_whitespace(const Piece& piece, std::vector<Piece>& out) {
  enum Class { space, word, other };
  const std::string_view text = piece.text;
  size_t run_start = 0;
  Class run = space;
  for (size_t pos = 0; pos <= text.size();) {
    Class c = space;
    int length = 1;
    if (pos < text.size()) {
      const char32_t ch = unicode::code_point_at(text, pos, &length);
      c = unicode::is_word_char(ch) ? word : unicode::is_white_space(ch) ? space : other;
    }
    if (pos == text.size() || c != run) {
      if (run != space)
        out.push_back({text.substr(run_start, pos - run_start), piece.at_start && run_start == 0});
      run = c;
      run_start = pos;
    }
    pos += size_t(length);
  }
}

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

MetaspaceOptions metaspace_from_json(const json& spec, const std::string& path) {
  MetaspaceOptions options;
  options.replacement = string_member(spec, path, "replacement");
  LOCKSTEP_CHECK(unicode::is_one_character(options.replacement), field(path, "replacement"),
                 " must be one character, not '", options.replacement, "'");
  if (const json* scheme = optional_member(spec, path, "prepend_scheme")) {
    const std::string name = as_string(*scheme, field(path, "prepend_scheme"));
    if (name == "always") {
      options.prepend = MetaspaceOptions::Prepend::always;
    } else if (name == "first") {
      options.prepend = MetaspaceOptions::Prepend::first;
    } else if (name == "never") {
      options.prepend = MetaspaceOptions::Prepend::never;
    } else {
      unsupported(field(path, "prepend_scheme"), "'" + name + "'", "always, first, never");
    }
  }
  // Older files say add_prefix_space instead; false must agree with the scheme (as HF checks).
  if (const json* legacy = optional_member(spec, path, "add_prefix_space")) {
    LOCKSTEP_CHECK(legacy->is_boolean(), field(path, "add_prefix_space"), " must be true or false");
    if (!legacy->get<bool>()) {
      LOCKSTEP_CHECK(optional_member(spec, path, "prepend_scheme") == nullptr ||
                         options.prepend == MetaspaceOptions::Prepend::never,
                     field(path, "add_prefix_space"), " = false does not match prepend_scheme");
      options.prepend = MetaspaceOptions::Prepend::never;
    }
  }
  options.split = bool_member(spec, path, "split", true);
  return options;
}

PreTokenizer PreTokenizer::from_json(const json* spec, const std::string& path) {
  PreTokenizer pre;
  if (spec != nullptr) pre.add(*spec, path);
  return pre;
}

void PreTokenizer::add(const json& spec, const std::string& path) {
  const std::string type = type_of(spec, path);
  LOCKSTEP_CHECK(!byte_level_, path,
                 ": a pre-tokenizer after ByteLevel is not supported (ByteLevel must come last)");
  Step step;
  if (type == "Sequence") {
    const json& list = array_member(spec, path, "pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) add(list[i], field(field(path, "pretokenizers"), i));
    return;
  } else if (type == "Split") {
    step.behavior = behavior_from_json(spec, path, "behavior");
    step.invert = bool_member(spec, path, "invert", false);
    bool literal = false;
    const std::string pattern = pattern_member(spec, path, literal);
    try {
      step.regex = std::make_shared<const SplitRegex>(pattern, literal);
    } catch (const Error& e) {
      fail(field(field(path, "pattern"), literal ? "String" : "Regex") + ": " + e.what());
    }
  } else if (type == "ByteLevel") {
    step.kind = Kind::byte_level;
    step.add_prefix_space = bool_member(spec, path, "add_prefix_space", true);
    if (bool_member(spec, path, "use_regex", true))
      step.regex = std::make_shared<const SplitRegex>(kGpt2SplitPattern, false);
    byte_level_ = true;
  } else if (type == "Digits") {
    step.kind = Kind::digits;
    step.individual_digits = bool_member(spec, path, "individual_digits", false);
  } else if (type == "Metaspace") {
    step.kind = Kind::metaspace;
    step.metaspace = metaspace_from_json(spec, path);
  } else if (type == "Whitespace") {
    step.kind = Kind::whitespace;
  } else if (type == "WhitespaceSplit") {
    step.kind = Kind::whitespace_split;
  } else if (type == "Punctuation") {
    step.kind = Kind::punctuation;
    step.behavior = optional_member(spec, path, "behavior") != nullptr
                        ? behavior_from_json(spec, path, "behavior")
                        : SplitBehavior::isolated;
  } else {
    unsupported(
        field(path, "type"), "'" + type + "'",
        "Sequence, Split, ByteLevel, Digits, Metaspace, Whitespace, WhitespaceSplit, Punctuation, null");
  }
  steps_.push_back(std::move(step));
}

void PreTokenizer::split(std::string_view text, bool at_text_start,
                         std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  thread_local std::vector<Piece> pieces, next;
  thread_local std::vector<Match> matches;
  thread_local std::vector<std::string_view> views;
  thread_local std::deque<std::string> storage;  // pieces a step rewrote (stable addresses)
  storage.clear();
  auto keep = [&](std::string s) -> std::string_view { return storage.emplace_back(std::move(s)); };

  pieces.assign(1, Piece{text, at_text_start});
  for (const Step& step : steps_) {
    next.clear();
    for (const Piece& piece : pieces) {
      matches.clear();
      switch (step.kind) {
        case Kind::regex:
          if (step.behavior == SplitBehavior::isolated) {  // the common case: no flags needed
            views.clear();
            step.regex->split_isolated(piece.text, views);
            for (std::string_view v : views)
              next.push_back({v, piece.at_start && v.data() == piece.text.data()});
            break;
          }
          step.regex->find_matches(piece.text, matches);
          if (step.invert)
            for (Match& m : matches) m.is_match = !m.is_match;
          split_by_behavior(piece, matches, step.behavior, next);
          break;
        case Kind::byte_level: {
          Piece current = piece;
          if (step.add_prefix_space && current.text[0] != ' ') {
            std::string prefixed(1, ' ');
            prefixed += current.text;
            current.text = keep(std::move(prefixed));
          }
          if (step.regex == nullptr) {
            next.push_back(current);
            break;
          }
          views.clear();
          step.regex->split_isolated(current.text, views);
          for (std::string_view v : views)
            next.push_back({v, current.at_start && v.data() == current.text.data()});
          break;
        }
        case Kind::digits:
          char_matches(piece.text, unicode::is_numeric, matches);
          split_by_behavior(piece, matches,
                            step.individual_digits ? SplitBehavior::isolated : SplitBehavior::contiguous,
                            next);
          break;
        case Kind::metaspace: {
          const MetaspaceOptions& m = step.metaspace;
          std::string replaced;
          replaced.reserve(piece.text.size() + 8);
          for (char c : piece.text) {
            if (c == ' ') {
              replaced += m.replacement;
            } else {
              replaced += c;
            }
          }
          const bool prepend = !starts_with(replaced, m.replacement) &&
                               (m.prepend == MetaspaceOptions::Prepend::always ||
                                (m.prepend == MetaspaceOptions::Prepend::first && piece.at_start));
          if (prepend) replaced.insert(0, m.replacement);
          const Piece current{keep(std::move(replaced)), piece.at_start};
          if (!m.split) {
            next.push_back(current);
            break;
          }
          int length = 0;
          const char32_t replacement = unicode::code_point_at(m.replacement, 0, &length);
          char_matches(current.text, [&](char32_t c) { return c == replacement; }, matches);
          split_by_behavior(current, matches, SplitBehavior::merged_with_next, next);
          break;
        }
        case Kind::whitespace: split_whitespace(piece, next); break;
        case Kind::whitespace_split:
          char_matches(piece.text, unicode::is_white_space, matches);
          split_by_behavior(piece, matches, SplitBehavior::removed, next);
          break;
        case Kind::punctuation:
          char_matches(piece.text, unicode::is_punctuation, matches);
          split_by_behavior(piece, matches, step.behavior, next);
          break;
      }
    }
    std::swap(pieces, next);
  }
  for (const Piece& piece : pieces) out.push_back(piece.text);
}

}  // namespace lockstep
