// Chat prompts. The checkpoints' own templates (SmolLM2, Qwen2.5, Qwen3 with thinking on, off and
// unset, Llama 3.2 and 3.3) rendered by ChatTemplate equal transformers' renders of them
// (tests/data/chat_template_cases.json, scripts/dev/gen_chat_fixtures.py), and Qwen3's checkpoint folder
// gives apply_chat_template's text and ids. The written-out formats equal renders of the models'
// real Jinja templates, and their ids equal HF's.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "io/chat.h"
#include "io/tokenizer.h"
#include "io_test_helpers.h"
#include "tokenizer_test_data.h"

namespace lockstep {
namespace {

using json = nlohmann::json;

const json& chat_cases() {
  static const json data = testing::read_json_file(testing::kTestData / "chat_cases.json")["cases"];
  return data;
}

std::optional<std::string_view> system_of(const json& c) {
  if (c["system"].is_null()) return std::nullopt;
  return c["system"].get_ref<const std::string&>();
}

TEST(TokenizerChat, WrittenOutFormats) {
  EXPECT_EQ(
      format_chat(ChatFormat::chatml, "Hi?", "Be brief."),
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(format_chat(ChatFormat::chatml, "Hi?"),
            "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(format_chat(ChatFormat::chatml_qwen3_no_think, "Hi?"),
            "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(format_chat(ChatFormat::llama3, "Hi?", "Be brief."),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(TokenizerChat, MatchesTheJinjaTemplates) {
  ASSERT_GE(chat_cases().size(), 20u);
  for (const json& c : chat_cases()) {
    const std::string user = c["user"].get<std::string>();
    for (ChatFormat format : {ChatFormat::chatml, ChatFormat::chatml_qwen3_no_think, ChatFormat::llama3}) {
      const std::string name(chat_format_name(format));
      EXPECT_EQ(format_chat(format, user, system_of(c)), c[name].get<std::string>())
          << name << " user=" << json(user).dump() << " system=" << c["system"].dump();
    }
  }
}

TEST(TokenizerChat, Qwen3IdsMatchHuggingFace) {
  LOCKSTEP_REQUIRE_QWEN3();
  for (const json& c : chat_cases())
    EXPECT_EQ(encode_chat(*testing::qwen3_tokenizer(), ChatFormat::chatml_qwen3_no_think,
                          c["user"].get<std::string>(), system_of(c)),
              c["qwen3_ids_no_think"].get<std::vector<int32_t>>())
        << "user=" << c["user"].dump() << " system=" << c["system"].dump();
}

TEST(TokenizerChat, Llama3IdsMatchHuggingFaceWithOneBos) {
  const Tokenizer tokenizer = testing::llama3_style_tokenizer();
  for (const json& c : chat_cases()) {
    const std::vector<int32_t> ids =
        encode_chat(tokenizer, ChatFormat::llama3, c["user"].get<std::string>(), system_of(c));
    EXPECT_EQ(ids, c["llama3_style_ids"].get<std::vector<int32_t>>()) << "user=" << c["user"].dump();
    ASSERT_GE(ids.size(), 2u);
    EXPECT_EQ(ids[0], tokenizer.bos_id());
    EXPECT_NE(ids[1], tokenizer.bos_id());
  }
}

TEST(TokenizerChat, FormatForModelType) {
  EXPECT_EQ(chat_format_for_model_type("qwen2"), ChatFormat::chatml);
  EXPECT_EQ(chat_format_for_model_type("qwen3"), ChatFormat::chatml_qwen3_no_think);
  EXPECT_EQ(chat_format_for_model_type("qwen3", /*thinking=*/true), ChatFormat::chatml);
  EXPECT_EQ(chat_format_for_model_type("qwen3_moe"), ChatFormat::chatml_qwen3_no_think);
  EXPECT_EQ(chat_format_for_model_type("llama"), ChatFormat::llama3);
  testing::expect_error([] { chat_format_for_model_type("gpt2"); }, {"model_type 'gpt2'"});
}

using ojson = nlohmann::ordered_json;

const ojson& template_cases() {
  static const ojson data = testing::read_ordered_json_file(testing::kTestData / "chat_template_cases.json");
  return data;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot open " + path.string());
  return std::string(std::istreambuf_iterator<char>(file), {});
}

const ChatTemplate& fixture_template(const std::string& name) {
  static std::map<std::string, ChatTemplate> templates;
  auto found = templates.find(name);
  if (found == templates.end()) {
    const ojson& t = template_cases()["templates"][name];
    found = templates
                .emplace(name, ChatTemplate(read_text(testing::kTestData / t["file"].get<std::string>()),
                                            t["variables"], t["file"].get<std::string>()))
                .first;
  }
  return found->second;
}

TEST(ChatTemplate, RendersAsTransformers) {
  std::map<std::string, int> rendered, failed;
  for (const ojson& c : template_cases()["cases"]) {
    const std::string name = c["template"].get<std::string>();
    ojson extra = c["extra"];
    if (!c["tools"].is_null()) extra["tools"] = c["tools"];
    const auto run = [&] {
      return fixture_template(name).render(c["messages"], c["add_generation_prompt"].get<bool>(), extra,
                                           testing::fixture_clock());
    };
    const std::string where = name + " / " + c["conversation"].get<std::string>() + " / generation prompt " +
                              c["add_generation_prompt"].dump() + " / " + c["extra"].dump();
    if (c.contains("error")) {
      testing::expect_error(run, {c["error"].get<std::string>()});
      ++failed[name];
      continue;
    }
    try {
      EXPECT_EQ(run(), c["text"].get<std::string>()) << where;
    } catch (const Error& e) {
      ADD_FAILURE() << where << ": " << e.what();
    }
    ++rendered[name];
  }
  // Every template, with and without a generation prompt, over the conversations.
  for (const char* name : {"smollm2-135m-instruct", "qwen2.5-instruct", "qwen3", "llama-3.2-instruct",
                           "llama-3.3-instruct"})
    EXPECT_GE(rendered[name], 14) << name;
  EXPECT_EQ(failed["llama-3.2-instruct"], 1);
  EXPECT_EQ(failed["llama-3.3-instruct"], 1);
}

TEST(ChatTemplate, Qwen3CheckpointGivesApplyChatTemplatesTextAndIds) {
  LOCKSTEP_REQUIRE_QWEN3();
  const std::optional<ChatTemplate> chat = ChatTemplate::from_model_dir(testing::kQwen3Dir);
  ASSERT_TRUE(chat.has_value());
  const ojson& cases = template_cases()["qwen3_apply_chat_template"];
  ASSERT_GE(cases.size(), 8u);
  for (const ojson& c : cases) {
    EXPECT_EQ(chat->render(c["messages"], true, c["extra"]), c["text"].get<std::string>()) << c["extra"].dump();
    EXPECT_EQ(chat->encode(*testing::qwen3_tokenizer(), c["messages"], true, c["extra"]),
              c["ids"].get<std::vector<int32_t>>())
        << c["conversation"] << " " << c["extra"].dump();
  }
}

TEST(ChatTemplate, OneQuestionMessages) {
  EXPECT_EQ(chat_messages("Q?").dump(), R"([{"role":"user","content":"Q?"}])");
  EXPECT_EQ(chat_messages("Q?", "").dump(),
            R"([{"role":"system","content":""},{"role":"user","content":"Q?"}])");
}

TEST(ChatTemplate, FromModelDirFindsTheTemplateAsTransformersDoes) {
  testing::TempDir dir;
  const auto write = [&](const char* name, const std::string& text) { testing::write_bytes(dir.file(name), text); };
  // No template anywhere: none.
  write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_FALSE(ChatTemplate::from_model_dir(dir.path()).has_value());
  // A string template sees the special tokens, an AddedToken object's content included.
  write("tokenizer_config.json",
        R"({"bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>", "pad_token": null,
            "chat_template": "{{ bos_token }}|{{ eos_token }}|{{ pad_token is defined }}|{{ messages[0].content }}"})");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.path())->render(chat_messages("hi"), true), "<s>|</s>|False|hi");
  // A list of named templates: "default".
  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.path())->render(chat_messages("hi"), true), "D");
  // chat_template.jinja wins over tokenizer_config.json.
  write("chat_template.jinja", "J{{ add_generation_prompt }}\n");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.path())->render(chat_messages("hi"), false), "JFalse");
  std::filesystem::remove(dir.file("chat_template.jinja"));

  testing::expect_error(
      [&] {
        write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
        ChatTemplate::from_model_dir(dir.path());
      },
      {"tokenizer_config.json chat_template", "without one named \"default\""});
  testing::expect_error(
      [&] {
        write("tokenizer_config.json", R"({"chat_template": 7})");
        ChatTemplate::from_model_dir(dir.path());
      },
      {"tokenizer_config.json chat_template must be a string"});
  testing::expect_error(
      [&] {
        write("tokenizer_config.json", R"({"chat_template": "{% for m in messages %}{{ m.content | wordwrap }}"})");
        ChatTemplate::from_model_dir(dir.path());
      },
      {"tokenizer_config.json chat_template:1:", "unknown filter 'wordwrap'"});
}

}  // namespace
}  // namespace lockstep
