// tests/fuzz/fuzz_dataset.cpp — a JSONL dataset of arbitrary bytes (tasks/dataset.h), in every
// format, failing on the first bad line and skipping bad lines. Every problem loaded must have a
// reference answer that tasks/verifier.h reads as a number, as the loader promises.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "tasks/dataset.h"
#include "tasks/verifier.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static lockstep::fuzz::InputFile input;
  const std::string& path = input.path({reinterpret_cast<const char*>(data), size});
  using lockstep::BadLines;
  using lockstep::DatasetFormat;
  for (DatasetFormat format : {DatasetFormat::detect, DatasetFormat::gsm8k, DatasetFormat::prompt_answer}) {
    for (BadLines bad_lines : {BadLines::fail, BadLines::skip}) {
      try {
        const lockstep::LoadedProblems loaded = lockstep::load_problems(path, format, bad_lines);
        for (const lockstep::Problem& problem : loaded.problems)
          if (problem.prompt.empty() || !lockstep::parse_answer(problem.answer))
            lockstep::fuzz::property_failed("a loaded problem without a prompt or a numeric answer");
      } catch (const lockstep::Error&) {
      }
    }
  }
  return 0;
}
