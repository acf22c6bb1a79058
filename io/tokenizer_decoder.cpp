// io/tokenizer_decoder.cpp — the decoders of io/tokenizer_decoder.h, each mapping the list of
// token strings to a new list as HF's Decoder::decode_chain does; the result is their concatenation.
#include "io/tokenizer_decoder.h"

#include "io/tokenizer_bpe.h"
#include "io/tokenizer_json.h"
#include "io/tokenizer_unicode.h"

namespace lockstep {

using namespace tokenizer_json;

std::string byte_level_decoded(const std::string& token) {
  std::string bytes;
  for (size_t pos = 0; pos < token.size();) {
    int length = 0;
    const int byte = byte_of_byte_level_char(unicode::code_point_at(token, pos, &length));
    if (byte < 0) return token;
    bytes += char(byte);
    pos += size_t(length);
  }
  return bytes;
}

Decoder Decoder::from_json(const json& spec, const std::string& path) {
  Decoder decoder;
  decoder.add(spec, path);
  return decoder;
}

void Decoder::add(const json& spec, const std::string& path) {
  const std::string type = type_of(spec, path);
  Step step;
  if (type == "Sequence") {
    const json& list = array_member(spec, path, "decoders");
    for (size_t i = 0; i < list.size(); ++i) add(list[i], field(field(path, "decoders"), i));
    return;
  } else if (type == "ByteLevel") {
    step.kind = Kind::byte_level;
  } else if (type == "Metaspace") {
    step.kind = Kind::metaspace;
    step.metaspace = metaspace_from_json(spec, path);
  } else if (type == "ByteFallback") {
    step.kind = Kind::byte_fallback;
  } else if (type == "Fuse") {
    step.kind = Kind::fuse;
  } else if (type == "Strip") {
    step.kind = Kind::strip;
    step.content = string_member(spec, path, "content");
    LOCKSTEP_CHECK(unicode::is_one_character(step.content), field(path, "content"),
                   " must be one character, not '", step.content, "'");
    step.start = count_member(spec, path, "start");
    step.stop = count_member(spec, path, "stop");
  } else if (type == "Replace") {
    step.kind = Kind::replace;
    bool literal = false;
    const std::string pattern = pattern_member(spec, path, literal);
    step.content = string_member(spec, path, "content");
    try {
      step.pattern = std::make_shared<const SplitRegex>(pattern, literal);
    } catch (const Error& e) {
      fail(field(path, "pattern") + ": " + e.what());
    }
  } else {
    unsupported(field(path, "type"), "'" + type + "'",
                "ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence");
  }
  steps_.push_back(std::move(step));
}

namespace {

std::string join(const std::vector<std::string>& tokens) {
  size_t size = 0;
  for (const std::string& t : tokens) size += t.size();
  std::string out;
  out.reserve(size);
  for (const std::string& t : tokens) out += t;
  return out;
}

// "<0x41>" -> 0x41; -1 for any other token.
int fallback_byte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = token[size_t(i)];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                     : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// ByteFallback: runs of <0xXX> tokens become the string of their bytes (raw bytes where they are not
// valid UTF-8; HF writes U+FFFD for each byte there).
std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string bytes;
  bool in_run = false;
  for (std::string& token : tokens) {
    const int byte = fallback_byte(token);
    if (byte >= 0) {
      bytes += char(byte);
      in_run = true;
      continue;
    }
    if (in_run) {
      out.push_back(std::move(bytes));
      bytes.clear();
      in_run = false;
    }
    out.push_back(std::move(token));
  }
  if (in_run) out.push_back(std::move(bytes));
  return out;
}

// Strip: removes up to `start` leading and `stop` trailing copies of `content` from each token.
std::string strip(const std::string& token, const std::string& content, size_t start, size_t stop) {
  size_t begin = 0, end = token.size();
  for (size_t i = 0; i < start && token.compare(begin, content.size(), content) == 0 &&
                     begin + content.size() <= end;
       ++i)
    begin += content.size();
  for (size_t i = 0; i < stop && end >= begin + content.size() &&
                     token.compare(end - content.size(), content.size(), content) == 0;
       ++i)
    end -= content.size();
  return token.substr(begin, end - begin);
}

std::string replace(const std::string& token, const SplitRegex& pattern, const std::string& content) {
  thread_local std::vector<SplitRegex::Match> matches;
  matches.clear();
  pattern.find_matches(token, matches);
  std::string out;
  for (const SplitRegex::Match& m : matches) {
    if (m.is_match) {
      out += content;
    } else {
      out.append(token, m.start, m.end - m.start);
    }
  }
  return out;
}

// Metaspace: the replacement character becomes a space, except in the first token (when a prefix
// may have been prepended), where it is dropped.
std::string metaspace(const std::string& token, const MetaspaceOptions& options, bool first) {
  const bool drop = first && options.prepend != MetaspaceOptions::Prepend::never;
  std::string out;
  out.reserve(token.size());
  for (size_t pos = 0; pos < token.size();) {
    if (token.compare(pos, options.replacement.size(), options.replacement) == 0) {
      if (!drop) out += ' ';
      pos += options.replacement.size();
    } else {
      out += token[pos++];
    }
  }
  return out;
}

}  // namespace

std::string Decoder::decode(std::vector<std::string> tokens) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::byte_level: {  // one string of all the tokens' bytes
        std::string bytes;
        for (const std::string& token : tokens) bytes += byte_level_decoded(token);
        tokens.assign(1, std::move(bytes));
        break;
      }
      case Kind::metaspace:
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = metaspace(tokens[i], step.metaspace, i == 0);
        break;
      case Kind::byte_fallback: tokens = byte_fallback(std::move(tokens)); break;
      case Kind::fuse: tokens.assign(1, join(tokens)); break;
      case Kind::strip:
        for (std::string& token : tokens) token = strip(token, step.content, step.start, step.stop);
        break;
      case Kind::replace:
        for (std::string& token : tokens) token = replace(token, *step.pattern, step.content);
        break;
    }
  }
  return join(tokens);
}

}  // namespace lockstep
