// io/chat.cpp — ChatML (Qwen) and Llama-3 header prompts.
#include "io/chat.h"

#include "core/error.h"
#include "io/tokenizer.h"
#include "io/tokenizer_unicode.h"

namespace lockstep {
namespace {

// Python's str.isspace(), which Jinja's `trim` filter strips: Unicode White_Space plus the
// information separators U+001C..U+001F.
bool is_python_space(char32_t c) { return unicode::is_white_space(c) || (c >= 0x1C && c <= 0x1F); }

// Jinja's `trim` (Python's str.strip()). Text that is not valid UTF-8 is left as it is.
std::string_view python_strip(std::string_view text) {
  if (unicode::find_invalid_utf8(text) != std::string_view::npos) return text;
  int length = 0;
  size_t begin = 0, end = text.size();
  while (begin < end && is_python_space(unicode::code_point_at(text, begin, &length)))
    begin += size_t(length);
  while (end > begin && is_python_space(unicode::code_point_before(text, end, &length)))
    end -= size_t(length);
  return text.substr(begin, end - begin);
}

std::string chatml(std::string_view user, std::optional<std::string_view> system) {
  std::string prompt;
  if (system) prompt.append("<|im_start|>system\n").append(*system).append("<|im_end|>\n");
  prompt.append("<|im_start|>user\n").append(user).append("<|im_end|>\n<|im_start|>assistant\n");
  return prompt;
}

std::string llama3(std::string_view user, std::optional<std::string_view> system) {
  std::string prompt = "<|begin_of_text|>";
  auto turn = [&](std::string_view role, std::string_view content) {
    prompt.append("<|start_header_id|>").append(role).append("<|end_header_id|>\n\n");
    prompt.append(python_strip(content)).append("<|eot_id|>");
  };
  if (system) turn("system", *system);
  turn("user", user);
  prompt.append("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return prompt;
}

}  // namespace

ChatFormat chat_format_for_model_type(std::string_view model_type, bool thinking) {
  if (model_type == "qwen2") return ChatFormat::chatml;
  if (model_type == "qwen3" || model_type == "qwen3_moe")
    return thinking ? ChatFormat::chatml : ChatFormat::chatml_qwen3_no_think;
  if (model_type == "llama") return ChatFormat::llama3;
  fail("no chat format known for model_type '" + std::string(model_type) +
       "' (known: qwen2, qwen3, qwen3_moe, llama)");
}

std::string_view chat_format_name(ChatFormat format) {
  switch (format) {
    case ChatFormat::chatml: return "chatml";
    case ChatFormat::chatml_qwen3_no_think: return "chatml_qwen3_no_think";
    case ChatFormat::llama3: return "llama3";
  }
  fail("invalid ChatFormat value " + std::to_string(int(format)));
}

std::string format_chat(ChatFormat format, std::string_view user, std::optional<std::string_view> system) {
  switch (format) {
    case ChatFormat::chatml: return chatml(user, system);
    // Qwen3's template, with enable_thinking=false, closes an empty thought for the model.
    case ChatFormat::chatml_qwen3_no_think: return chatml(user, system) + "<think>\n\n</think>\n\n";
    case ChatFormat::llama3: return llama3(user, system);
  }
  fail("invalid ChatFormat value " + std::to_string(int(format)));
}

std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, ChatFormat format, std::string_view user,
                                 std::optional<std::string_view> system) {
  return tokenizer.encode(format_chat(format, user, system), /*add_special_tokens=*/false);
}

}  // namespace lockstep
