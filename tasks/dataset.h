// tasks/dataset.h — problems with a verifiable numeric answer, loaded from JSONL files (one JSON
// object per line; blank lines are skipped, "\r\n" line ends and a leading UTF-8 byte order mark
// accepted, other fields ignored; lines may be of any length). Files must be UTF-8: a line holding
// invalid UTF-8 is a bad line, named with the column of its first bad byte.
//
// Formats:
//   gsm8k          {"question": "...", "answer": "...reasoning...\n#### 72"}: the prompt is the
//                  question, the reference answer the text after the last "####" (trimmed).
//   prompt_answer  {"prompt": "...", "answer": "72"}.
// Both fields must be non-empty strings, and the reference must be a number that tasks/verifier.h's
// parse_answer accepts ("72", "-3", "70,000", "3/4"), so that a reward can never be silently 0 for a
// problem. A bad line (invalid JSON, not an object, a field missing, mistyped or empty, no "####",
// an answer that is not a number) throws lockstep::Error "<file>:<line>: <what is wrong>", or with
// BadLines::skip is skipped and counted. A file without a single good problem is an error either way.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace lockstep {

struct Problem {
  Problem() = default;
  // {prompt, answer}: a problem without a worked solution, as datasets have.
  Problem(std::string prompt, std::string answer, std::string solution = {})
      : prompt(std::move(prompt)), answer(std::move(answer)), solution(std::move(solution)) {}

  std::string prompt;
  std::string answer;  // the reference final answer, as written ("70,000")
  // A worked answer ending in the final answer, where the task makes one (the word problems' SFT
  // target); empty for datasets, which keep only the final answer.
  std::string solution;
};

// detect: the layout of the first non-blank line ("question" → gsm8k, else "prompt" →
// prompt_answer; neither is an error naming the line).
enum class DatasetFormat { gsm8k, prompt_answer, detect };
enum class BadLines { fail, skip };

struct LoadedProblems {
  std::vector<Problem> problems;  // in file order
  size_t skipped_lines = 0;       // bad lines skipped (BadLines::skip only)
};

LoadedProblems load_problems(const std::filesystem::path& path, DatasetFormat format,
                             BadLines bad_lines = BadLines::fail);

}  // namespace lockstep
