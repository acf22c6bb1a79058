// io/tokenizer_normalizer.cpp — the normalizers of io/tokenizer_normalizer.h.
#include "io/tokenizer_normalizer.h"

#include "io/tokenizer_json.h"
#include "io/tokenizer_unicode.h"

namespace lockstep {

using namespace tokenizer_json;

Normalizer Normalizer::from_json(const json& spec, const std::string& path) {
  Normalizer normalizer;
  normalizer.add(spec, path);
  return normalizer;
}

void Normalizer::add(const json& spec, const std::string& path) {
  const std::string type = type_of(spec, path);
  auto add_simple = [&](Kind kind) {
    Step step;
    step.kind = kind;
    steps_.push_back(std::move(step));
  };
  if (type == "Sequence") {
    const json& list = array_member(spec, path, "normalizers");
    for (size_t i = 0; i < list.size(); ++i) add(list[i], field(field(path, "normalizers"), i));
  } else if (type == "NFC") {
    add_simple(Kind::nfc);
  } else if (type == "NFD") {
    add_simple(Kind::nfd);
  } else if (type == "NFKC") {
    add_simple(Kind::nfkc);
  } else if (type == "NFKD") {
    add_simple(Kind::nfkd);
  } else if (type == "Lowercase") {
    add_simple(Kind::lowercase);
  } else if (type == "Strip") {
    Step step;
    step.kind = Kind::strip;
    step.strip_left = bool_member(spec, path, "strip_left", false);
    step.strip_right = bool_member(spec, path, "strip_right", false);
    steps_.push_back(std::move(step));
  } else if (type == "Prepend") {
    Step step;
    step.kind = Kind::prepend;
    step.text = string_member(spec, path, "prepend");
    steps_.push_back(std::move(step));
  } else if (type == "Replace") {
    Step step;
    step.kind = Kind::replace;
    bool literal = false;
    const std::string pattern = pattern_member(spec, path, literal);
    step.text = string_member(spec, path, "content");
    try {
      step.pattern = std::make_shared<const SplitRegex>(pattern, literal);
    } catch (const Error& e) {
      fail(field(path, "pattern") + ": " + e.what());
    }
    steps_.push_back(std::move(step));
  } else {
    unsupported(field(path, "type"), "'" + type + "'",
                "NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, Sequence, null");
  }
}

namespace {

// Removes leading and/or trailing Unicode White_Space (Rust's char::is_whitespace).
std::string strip(std::string_view text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  int length = 0;
  if (left)
    while (begin < end && unicode::is_white_space(unicode::code_point_at(text, begin, &length)))
      begin += size_t(length);
  if (right)
    while (end > begin && unicode::is_white_space(unicode::code_point_before(text, end, &length)))
      end -= size_t(length);
  return std::string(text.substr(begin, end - begin));
}

std::string replace(std::string_view text, const SplitRegex& pattern, const std::string& content) {
  thread_local std::vector<SplitRegex::Match> matches;
  matches.clear();
  pattern.find_matches(text, matches);
  std::string out;
  out.reserve(text.size());
  for (const SplitRegex::Match& m : matches) {
    if (m.is_match) {
      out += content;
    } else {
      out.append(text.substr(m.start, m.end - m.start));
    }
  }
  return out;
}

}  // namespace

std::string Normalizer::normalize(std::string_view text) const {
  std::string current(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::nfc: current = unicode::normalize(current, unicode::NormalForm::nfc); break;
      case Kind::nfd: current = unicode::normalize(current, unicode::NormalForm::nfd); break;
      case Kind::nfkc: current = unicode::normalize(current, unicode::NormalForm::nfkc); break;
      case Kind::nfkd: current = unicode::normalize(current, unicode::NormalForm::nfkd); break;
      case Kind::lowercase: current = unicode::lowercase(current); break;
      case Kind::strip: current = strip(current, step.strip_left, step.strip_right); break;
      case Kind::prepend:  // HF prepends to non-empty text only
        if (!current.empty()) current.insert(0, step.text);
        break;
      case Kind::replace: current = replace(current, *step.pattern, step.text); break;
    }
  }
  return current;
}

}  // namespace lockstep
