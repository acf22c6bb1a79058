// io/chat.h — the chat prompt an instruct model was tuned on, for one user message and an optional
// system prompt, ending with the assistant turn opener so that generation continues as the
// assistant. The strings reproduce the models' own Jinja chat templates (add_generation_prompt=True);
// tests/io/test_chat.cpp checks them against renders of those templates.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep {

class Tokenizer;

enum class ChatFormat {
  // <|im_start|>system\n{sys}<|im_end|>\n<|im_start|>user\n{msg}<|im_end|>\n<|im_start|>assistant\n
  // Qwen2.5, and Qwen3 with thinking on. (Qwen2.5-Instruct's own template inserts the system prompt
  // "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." when none is given; pass
  // it explicitly to reproduce that.)
  chatml,
  // ChatML followed by an empty thought, "<think>\n\n</think>\n\n": Qwen3 with enable_thinking=False.
  chatml_qwen3_no_think,
  // <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{sys}<|eot_id|>
  // <|start_header_id|>user<|end_header_id|>\n\n{msg}<|eot_id|>
  // <|start_header_id|>assistant<|end_header_id|>\n\n   (one line, no breaks between turns)
  // Llama-3 Instruct; as its template does (`| trim`), messages are stripped of surrounding whitespace.
  llama3,
};

// The format for a config.json `model_type`: qwen2 -> chatml; qwen3, qwen3_moe -> chatml when
// `thinking`, else chatml_qwen3_no_think; llama -> llama3 (Llama-3 and later). Throws otherwise.
ChatFormat chat_format_for_model_type(std::string_view model_type, bool thinking = false);

std::string_view chat_format_name(ChatFormat format);

// The prompt text. A system prompt that is given, even empty, gets its turn (as in the templates).
std::string format_chat(ChatFormat format, std::string_view user,
                        std::optional<std::string_view> system = std::nullopt);

// The prompt's ids. The text already holds every special token (Llama-3's BOS included), so it is
// encoded with add_special_tokens=false, as HF's apply_chat_template(tokenize=True) does.
std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, ChatFormat format, std::string_view user,
                                 std::optional<std::string_view> system = std::nullopt);

}  // namespace lockstep
