// tests/fuzz/fuzz_chat.cpp — chat prompts of arbitrary text (io/chat.h): the real templates of
// tests/data/chat_templates (SmolLM2, Qwen2.5, Qwen3, Llama 3.2/3.3) and the built-in formats render
// a conversation whose messages are the input's parts (cut at 0 bytes; the first byte picks the
// template), and the prompt is encoded with the Llama-3-style tokenizer fixture. Only invalid UTF-8
// may be refused, and only by lockstep::Error.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/chat.h"
#include "io/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

const std::string kData = LOCKSTEP_TEST_DATA "/";

std::vector<lockstep::ChatTemplate> load_templates() {
  std::ifstream cases_file(kData + "chat_template_cases.json");
  const auto cases = nlohmann::ordered_json::parse(cases_file);
  std::vector<lockstep::ChatTemplate> templates;
  for (const auto& [name, entry] : cases.at("templates").items()) {
    std::ifstream source(kData + entry.at("file").get<std::string>());
    std::stringstream text;
    text << source.rdbuf();
    templates.emplace_back(text.str(), entry.at("variables"), name);
  }
  return templates;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<lockstep::ChatTemplate> templates = load_templates();
  static const lockstep::Tokenizer tokenizer = lockstep::Tokenizer::from_files(
      kData + "tokenizer_llama3_style.json", kData + "tokenizer_llama3_style_config.json");
  if (size == 0) return 0;
  const std::vector<std::string_view> parts = lockstep::fuzz::split(data + 1, size - 1, '\0');
  const unsigned pick = data[0];
  // System prompt (when the first bit says so), then user and assistant turns alternating.
  const bool has_system = pick & 1;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (size_t i = 0; i < parts.size(); ++i) {
    const char* role = has_system && i == 0 ? "system" : (i - has_system) % 2 == 0 ? "user" : "assistant";
    messages.push_back({{"role", role}, {"content", std::string(parts[i])}});
  }
  const std::string_view user = parts.back();
  const std::optional<std::string_view> system =
      has_system && parts.size() > 1 ? std::optional(parts[0]) : std::nullopt;
  try {
    const lockstep::ChatTemplate& chat = templates[(pick >> 1) % templates.size()];
    (void)chat.render(messages, /*add_generation_prompt=*/true, {{"enable_thinking", bool(pick & 64)}});
    (void)chat.encode(tokenizer, messages, /*add_generation_prompt=*/bool(pick & 128));
  } catch (const lockstep::Error&) {
  }
  using lockstep::ChatFormat;
  for (ChatFormat format : {ChatFormat::chatml, ChatFormat::chatml_qwen3_no_think, ChatFormat::llama3}) {
    (void)lockstep::format_chat(format, user, system);
    try {
      (void)lockstep::encode_chat(tokenizer, format, user, system);
    } catch (const lockstep::Error&) {
    }
  }
  return 0;
}
