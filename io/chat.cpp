// io/chat.cpp — the checkpoint's chat template, and the written-out ChatML (Qwen) and Llama-3 prompts.
#include "io/chat.h"

#include <fstream>
#include <sstream>

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

nlohmann::ordered_json chat_messages(std::string_view user, std::optional<std::string_view> system) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (system) messages.push_back({{"role", "system"}, {"content", std::string(*system)}});
  messages.push_back({{"role", "user"}, {"content", std::string(user)}});
  return messages;
}

ChatTemplate::ChatTemplate(std::string_view source, nlohmann::ordered_json variables, std::string name)
    : template_(source, std::move(name)), variables_(std::move(variables)) {
  LOCKSTEP_CHECK(variables_.is_object(), template_.name(), ": chat template variables must be a JSON object");
}

namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  LOCKSTEP_CHECK(in, path.string(), ": cannot open");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A special token of tokenizer_config.json: a string, or an AddedToken object's "content".
std::optional<std::string> token_text(const nlohmann::ordered_json& j, const std::string& where) {
  if (j.is_null()) return std::nullopt;
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  fail(where + " must be a string or an object with a \"content\" string, got " + j.dump());
}

}  // namespace

std::optional<ChatTemplate> ChatTemplate::from_model_dir(const std::filesystem::path& dir) {
  const std::filesystem::path config_path = dir / "tokenizer_config.json", jinja_path = dir / "chat_template.jinja";
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (std::filesystem::exists(config_path)) {
    try {
      config = nlohmann::ordered_json::parse(read_text(config_path));
    } catch (const nlohmann::json::exception& e) {
      fail(config_path.string() + ": " + e.what());
    }
    LOCKSTEP_CHECK(config.is_object(), config_path.string(), ": must be a JSON object");
  }
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"})
    if (config.contains(key))
      if (auto text = token_text(config[key], config_path.string() + ": \"" + key + "\"")) variables[key] = *text;
  if (config.contains("additional_special_tokens") && !config["additional_special_tokens"].is_null()) {
    const auto& list = config["additional_special_tokens"];
    const std::string where = config_path.string() + ": \"additional_special_tokens\"";
    LOCKSTEP_CHECK(list.is_array(), where, " must be a list");
    nlohmann::ordered_json texts = nlohmann::ordered_json::array();
    for (const auto& t : list) texts.push_back(*token_text(t, where));
    variables["additional_special_tokens"] = texts;
  }

  if (std::filesystem::exists(jinja_path))
    return ChatTemplate(read_text(jinja_path), std::move(variables), jinja_path.string());
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return std::nullopt;
  const auto& t = config["chat_template"];
  const std::string name = config_path.string() + " chat_template";
  if (t.is_string()) return ChatTemplate(t.get<std::string>(), std::move(variables), name);
  LOCKSTEP_CHECK(t.is_array(), name, " must be a string or a list of {\"name\", \"template\"} objects");
  for (const auto& named : t) {
    LOCKSTEP_CHECK(named.is_object() && named.contains("name") && named.contains("template") &&
                       named["template"].is_string(),
                   name, ": each entry must be an object with \"name\" and \"template\" strings");
    if (named["name"] == "default")
      return ChatTemplate(named["template"].get<std::string>(), std::move(variables), name + " 'default'");
  }
  fail(name + ": a list of named templates without one named \"default\"");
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra, const JinjaRenderOptions& options) const {
  LOCKSTEP_CHECK(messages.is_array(), template_.name(), ": messages must be a list");
  LOCKSTEP_CHECK(extra.is_object(), template_.name(), ": extra template variables must be an object");
  // The variables in the order transformers passes them; later ones override earlier ones.
  nlohmann::ordered_json vars = {{"messages", messages},
                                 {"tools", nullptr},
                                 {"documents", nullptr},
                                 {"add_generation_prompt", add_generation_prompt}};
  for (const auto& [k, v] : variables_.items()) vars[k] = v;
  for (const auto& [k, v] : extra.items()) vars[k] = v;
  return template_.render(vars, options);
}

std::vector<int32_t> ChatTemplate::encode(const Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                                          bool add_generation_prompt, const nlohmann::ordered_json& extra) const {
  return tokenizer.encode(render(messages, add_generation_prompt, extra), /*add_special_tokens=*/false);
}

}  // namespace lockstep
