// tests/io/tokenizer_test_data.h — where the tokenizer and chat tests find their data: the shared
// Qwen3 tokenizer and GSM8K (LOCKSTEP_SHARED_DATA, which may be absent: tests then skip visibly)
// and the fixtures written by scripts/dev/gen_tokenizer_fixtures.py (LOCKSTEP_TEST_DATA, committed).
#pragma once

#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "io/jinja.h"
#include "io/tokenizer.h"

namespace lockstep::testing {

inline const std::filesystem::path kSharedData = LOCKSTEP_SHARED_DATA;
inline const std::filesystem::path kTestData = LOCKSTEP_TEST_DATA;
inline const std::filesystem::path kQwen3Dir = kSharedData / "qwen3-tokenizer";

inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot open " + path.string());
  return nlohmann::json::parse(file);
}

// The same, keeping each object's key order (the chat fixtures' variables render in it).
inline nlohmann::ordered_json read_ordered_json_file(const std::filesystem::path& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot open " + path.string());
  return nlohmann::ordered_json::parse(file);
}

// The chat fixtures' strftime_now clock (scripts/dev/gen_chat_fixtures.py): 2025-03-07 09:30:00 local time.
inline JinjaRenderOptions fixture_clock() {
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 2;
  tm.tm_mday = 7;
  tm.tm_hour = 9;
  tm.tm_min = 30;
  tm.tm_wday = 5;  // a Friday
  tm.tm_yday = 65;
  return {tm};
}

// The Qwen3 tokenizer, loaded once per process (its tokenizer.json is 11 MB); nullptr when the
// shared data is absent.
inline const Tokenizer* qwen3_tokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer =
      std::filesystem::exists(kQwen3Dir / "tokenizer.json")
          ? std::make_unique<Tokenizer>(Tokenizer::from_dir(kQwen3Dir))
          : nullptr;
  return tokenizer.get();
}

inline Tokenizer llama3_style_tokenizer() {
  return Tokenizer::from_files(kTestData / "tokenizer_llama3_style.json",
                               kTestData / "tokenizer_llama3_style_config.json");
}

}  // namespace lockstep::testing

// Skips the test, saying why, when the shared Qwen3 tokenizer is not there.
#define LOCKSTEP_REQUIRE_QWEN3()                         \
  if (::lockstep::testing::qwen3_tokenizer() == nullptr) \
  GTEST_SKIP() << "shared data absent: " << ::lockstep::testing::kQwen3Dir / "tokenizer.json"
