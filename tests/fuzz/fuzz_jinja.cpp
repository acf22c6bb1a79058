// tests/fuzz/fuzz_jinja.cpp — a chat template of arbitrary bytes (io/jinja.h), parsed and rendered
// with a conversation and the variables transformers passes. Syntax errors, unsupported constructs
// and raise_exception are lockstep::Error; nothing else may escape, and rendering must stay within
// libFuzzer's time and memory limits however the template loops or multiplies.
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json variables = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "What is 2+2?"},
      {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
      {"role": "tool", "content": "4"},
      {"role": "user", "content": [{"type": "text", "text": "And 3+3?"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "add", "description": "a + b",
      "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}],
    "documents": null, "add_generation_prompt": true, "enable_thinking": false,
    "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"
  })");
  lockstep::JinjaRenderOptions options;
  options.now = std::tm{};
  options.now->tm_year = 125;
  options.now->tm_mday = 7;
  try {
    const lockstep::JinjaTemplate jinja({reinterpret_cast<const char*>(data), size}, "fuzz.jinja");
    (void)jinja.render(variables, options);
  } catch (const lockstep::Error&) {
  }
  return 0;
}
