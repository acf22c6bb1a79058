// tasks/dataset.cpp — JSONL problem files.
#include "tasks/dataset.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "io/file_io.h"
#include "io/tokenizer_unicode.h"
#include "tasks/verifier.h"

namespace lockstep {
namespace {

using json = nlohmann::json;

std::string string_field(const json& object, const char* key) {
  const auto it = object.find(key);
  LOCKSTEP_CHECK(it != object.end(), "field \"", key, "\" is missing");
  LOCKSTEP_CHECK(it->is_string(), "field \"", key, "\" must be a string, not ", it->type_name());
  std::string value = it->get<std::string>();
  LOCKSTEP_CHECK(!trimmed(value).empty(), "field \"", key, "\" is empty");
  return value;
}

// A parser message quotes the token it last read, which on a long line can be megabytes.
constexpr size_t kMaxMessageBytes = 300;

// Throws naming the first byte of `line` that starts no UTF-8 character.
void check_utf8(std::string_view line) {
  const size_t bad = unicode::find_invalid_utf8(line);
  if (bad == std::string_view::npos) return;
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02X", unsigned(static_cast<unsigned char>(line[bad])));
  fail(detail::concat("invalid UTF-8: byte ", byte, " at column ", bad + 1,
                      " starts no UTF-8 character (the file must be UTF-8)"));
}

// One non-blank line to a problem; throws lockstep::Error saying what is wrong with it.
Problem parse_line(std::string_view line, DatasetFormat format) {
  check_utf8(line);
  json object;
  try {
    object = json::parse(line);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e400
    std::string message = e.what();
    if (message.size() > kMaxMessageBytes) {
      size_t cut = kMaxMessageBytes;
      while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;  // whole characters
      message = message.substr(0, cut) + "...";
    }
    fail(std::string("invalid JSON: ") + message);
  }
  LOCKSTEP_CHECK(object.is_object(), "expected a JSON object, not ", object.type_name());
  if (format == DatasetFormat::prompt_answer) {
    Problem problem{string_field(object, "prompt"), std::string(trimmed(string_field(object, "answer")))};
    LOCKSTEP_CHECK(parse_answer(problem.answer).has_value(), "field \"answer\" must be a number (e.g. 72, -3, ",
                   "1,234.5, 3/4), not \"", problem.answer, "\"");
    return problem;
  }
  std::string question = string_field(object, "question");
  const std::string solution = string_field(object, "answer");
  const size_t marker = solution.rfind("####");
  LOCKSTEP_CHECK(marker != std::string::npos, "field \"answer\" has no \"#### <number>\" final answer");
  Problem problem{std::move(question), std::string(trimmed(solution.substr(marker + 4)))};
  LOCKSTEP_CHECK(parse_answer(problem.answer).has_value(), "the final answer after \"####\" must be a number, not \"",
                 problem.answer, "\"");
  return problem;
}

// The layout of the first non-blank line (DatasetFormat::detect).
DatasetFormat detect_format(const std::string& text, const std::string& path) {
  DatasetFormat format = DatasetFormat::detect;
  for_each_nonblank_line(text, [&](std::string_view line, size_t number) {
    if (format != DatasetFormat::detect) return;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    try {
      check_utf8(line);
    } catch (const Error& e) {
      fail(where + e.what());
    }
    const json object = json::parse(line, nullptr, false);
    LOCKSTEP_CHECK(object.is_object(), where, "cannot tell the layout from the first line: it is not a ",
                   "JSON object (set data.format)");
    LOCKSTEP_CHECK(object.contains("question") || object.contains("prompt"), where,
                   "cannot tell the layout from the first line: it has neither \"question\" (gsm8k) ",
                   "nor \"prompt\" (jsonl)");
    format = object.contains("question") ? DatasetFormat::gsm8k : DatasetFormat::prompt_answer;
  });
  return format;  // still detect for an empty file: load_problems says it is empty
}

}  // namespace

LoadedProblems load_problems(const std::filesystem::path& path, DatasetFormat format, BadLines bad_lines) {
  std::string text = read_file(path.string(), "dataset");
  // A UTF-8 byte order mark (some Windows editors write one) is not part of the first line.
  if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);
  if (format == DatasetFormat::detect) format = detect_format(text, path.string());
  LoadedProblems loaded;
  for_each_nonblank_line(text, [&](std::string_view line, size_t number) {
    try {
      loaded.problems.push_back(parse_line(line, format));
    } catch (const Error& e) {
      if (bad_lines == BadLines::fail) fail(path.string() + ":" + std::to_string(number) + ": " + e.what());
      ++loaded.skipped_lines;
    }
  });
  LOCKSTEP_CHECK(!loaded.problems.empty(), path.string(), ": no problems: ",
                 loaded.skipped_lines > 0 ? "every line is bad (" + std::to_string(loaded.skipped_lines) + " skipped)"
                                          : std::string("the file is empty (blank lines aside)"));
  return loaded;
}

}  // namespace lockstep
