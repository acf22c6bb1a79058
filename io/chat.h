// io/chat.h — the chat prompt an instruct model was tuned on, for one user message and an optional
// system prompt, ending with the assistant turn opener so that generation continues as the
// assistant. Two sources:
//   - ChatTemplate: the checkpoint's own `chat_template` (chat_template.jinja, or tokenizer_config.json),
//     rendered by io/jinja.h exactly as transformers' apply_chat_template renders it;
//   - ChatFormat: three written-out formats (ChatML, Qwen3 without thinking, Llama 3), for checkpoints
//     without a template or to override one.
// tests/io/test_chat.cpp checks both against jinja2's renders of the real templates.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/jinja.h"

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

// The messages of a one-question prompt: [{"role": "system", …}] when a system prompt is given (even
// empty), then {"role": "user", "content": user}.
nlohmann::ordered_json chat_messages(std::string_view user, std::optional<std::string_view> system = std::nullopt);

class ChatTemplate {
 public:
  // `source` is the Jinja text; `variables` are passed to every render (transformers passes the
  // tokenizer's special tokens: bos_token, eos_token, …); `name` says where it came from in errors.
  ChatTemplate(std::string_view source, nlohmann::ordered_json variables, std::string name);

  // A checkpoint folder's template, as transformers loads it: `chat_template.jinja` when present,
  // else tokenizer_config.json's "chat_template" (a string, or a list of {name, template} of which
  // "default" is taken). The variables are tokenizer_config.json's special tokens that are set
  // (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token as strings — an
  // AddedToken object gives its "content" — and additional_special_tokens). nullopt: no template.
  static std::optional<ChatTemplate> from_model_dir(const std::filesystem::path& dir);

  // apply_chat_template(messages, tokenize=False, add_generation_prompt, **extra): the template
  // rendered with messages, tools=None, documents=None, add_generation_prompt, the special tokens,
  // then `extra` (e.g. {"enable_thinking": false}).
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
                     const JinjaRenderOptions& options = {}) const;

  // The prompt's ids: the rendered text encoded with add_special_tokens=false, as
  // apply_chat_template(tokenize=True) does (the template writes any BOS itself).
  std::vector<int32_t> encode(const Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                              bool add_generation_prompt,
                              const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& name() const { return template_.name(); }

 private:
  JinjaTemplate template_;
  nlohmann::ordered_json variables_;
};

}  // namespace lockstep
