// Chat formats: the prompts equal renders of the models' real Jinja templates (Qwen3's from its
// tokenizer_config.json, Llama-3-Instruct's), rendered by jinja2 in scripts/gen_tokenizer_fixtures.py,
// and their ids equal HF's.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace lockstep
