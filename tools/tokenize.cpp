// tools/tokenize.cpp — lockstep_tokenize: encodes (or decodes) JSON lines with lockstep's Tokenizer,
// so scripts can compare its ids with other implementations (scripts/dev/check_tokenizer.py).
//
//   lockstep_tokenize TOKENIZER [--no-special] [--field NAME] < texts.jsonl > ids.jsonl
//   lockstep_tokenize TOKENIZER --decode [--skip-special] < ids.jsonl > texts.jsonl
//
// TOKENIZER is a tokenizer.json or a directory holding one. Each input line is a JSON string, or an
// object whose field NAME (default "text") is the string; each output line is the JSON array of its
// ids. With --decode, each input line is a JSON array of ids and each output line the JSON string.
// The time spent encoding/decoding (not loading) goes to stderr.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/tokenizer.h"

namespace {

int usage() {
  std::cerr << "usage: lockstep_tokenize TOKENIZER [--no-special] [--field NAME] < texts.jsonl\n"
               "       lockstep_tokenize TOKENIZER --decode [--skip-special] < ids.jsonl\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::filesystem::path source = argv[1];
  bool add_special = true, decode = false, skip_special = false;
  std::string field_name = "text";
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--no-special")
      add_special = false;
    else if (arg == "--decode")
      decode = true;
    else if (arg == "--skip-special")
      skip_special = true;
    else if (arg == "--field" && i + 1 < argc)
      field_name = argv[++i];
    else
      return usage();
  }
  try {
    const lockstep::Tokenizer tokenizer = std::filesystem::is_directory(source)
                                              ? lockstep::Tokenizer::from_dir(source)
                                              : lockstep::Tokenizer::from_files(source);
    std::string line;
    double seconds = 0;
    size_t lines = 0, tokens = 0;
    for (; std::getline(std::cin, line); ++lines) {
      const nlohmann::json input = nlohmann::json::parse(line);
      const auto start = std::chrono::steady_clock::now();
      nlohmann::json output;
      if (decode) {
        const auto ids = input.get<std::vector<int32_t>>();
        tokens += ids.size();
        output = tokenizer.decode(ids, skip_special);
      } else {
        const std::string text =
            input.is_object() ? input.at(field_name).get<std::string>() : input.get<std::string>();
        const std::vector<int32_t> ids = tokenizer.encode(text, add_special);
        tokens += ids.size();
        output = ids;
      }
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // Invalid UTF-8 from a partial decode is written as U+FFFD, the only way JSON can hold it.
      std::cout << output.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    }
    std::fprintf(stderr, "lockstep_tokenize: %zu lines, %zu tokens, %.1f ms %s\n", lines, tokens,
                 seconds * 1e3, decode ? "decoding" : "encoding");
  } catch (const std::exception& e) {
    std::cerr << "lockstep_tokenize: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
