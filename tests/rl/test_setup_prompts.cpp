// tests/rl/test_setup_prompts.cpp — how a problem becomes prompt ids (rl/setup.h): by default the
// checkpoint's own chat template, giving the ids HF gives for apply_chat_template(tokenize=True)
// (tests/data/chat_cases.json, rendered by jinja2 and encoded by `tokenizers`); the plain text when
// the checkpoint has none; the written-out formats when named; an error for data.chat_template =
// "model" without a template. The builtin model keeps its plain-text prompts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "rl/setup.h"
#include "tasks/verifier.h"
#include "tasks/word_problems.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
const fs::path kTestData = LOCKSTEP_TEST_DATA;

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  return nlohmann::json::parse(in);
}

// A Llama-3.2-1B-Instruct config.json with the Llama-3-style test tokenizer, whose
// tokenizer_config.json carries Llama-3-Instruct's chat template (or, `with_template` false, none).
fs::path llama_checkpoint(const std::string& name, bool with_template) {
  const fs::path dir = fs::temp_directory_path() / ("lockstep_test_setup_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kTestData / "configs" / "llama-3.2-1b-instruct.json", dir / "config.json");
  fs::copy_file(kTestData / "tokenizer_llama3_style.json", dir / "tokenizer.json");
  nlohmann::json config = read_json(kTestData / "tokenizer_llama3_style_config.json");
  if (!with_template) config.erase("chat_template");
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  return dir;
}

Config config_for(const fs::path& model, const std::string& chat_template, const std::string& system = "") {
  Config c;
  c.model.path = model.string();
  c.model.device = "cpu";
  c.data.chat_template = chat_template;
  c.data.system_prompt = system;
  return c;
}

// The chat_cases.json case of this user message and system prompt (null: none).
const nlohmann::json& chat_case(const std::string& user, const nlohmann::json& system) {
  static const nlohmann::json cases = read_json(kTestData / "chat_cases.json")["cases"];
  for (const auto& c : cases)
    if (c["user"] == user && c["system"] == system) return c;
  throw std::runtime_error("no chat case for " + user);
}

TEST(SetupPrompts, TheCheckpointsTemplateByDefault) {
  const fs::path dir = llama_checkpoint("template", true);
  EXPECT_EQ(Config{}.data.chat_template, "auto");
  for (const std::string system : {"", "You are a helpful assistant."}) {
    const lockstep::Setup s = make_setup(config_for(dir, "auto", system), /*need_data=*/false);
    ASSERT_NE(s.chat_template, nullptr);
    const nlohmann::json& expected =
        chat_case("What is 2+2?", system.empty() ? nlohmann::json(nullptr) : nlohmann::json(system));
    EXPECT_EQ(s.prompt_tokens({"What is 2+2?", ""}), expected["llama3_style_ids"].get<std::vector<int32_t>>());
    // "model" renders the same; the written-out llama3 format agrees with the template.
    EXPECT_EQ(make_setup(config_for(dir, "model", system), false).prompt_tokens({"What is 2+2?", ""}),
              expected["llama3_style_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(make_setup(config_for(dir, "llama3", system), false).prompt_tokens({"What is 2+2?", ""}),
              expected["llama3_style_ids"].get<std::vector<int32_t>>());
  }
  fs::remove_all(dir);
}

TEST(SetupPrompts, PlainTextWithoutATemplateOrWithNone) {
  const fs::path with = llama_checkpoint("none", true), without = llama_checkpoint("no_template", false);
  const lockstep::Setup none = make_setup(config_for(with, "none"), false);
  EXPECT_EQ(none.chat_template, nullptr);
  const std::vector<int32_t> plain = none.tokenizer->encode("What is 2+2?", /*add_special_tokens=*/true);
  EXPECT_EQ(plain.front(), none.tokenizer->bos_id().value());
  EXPECT_EQ(none.prompt_tokens({"What is 2+2?", ""}), plain);
  const lockstep::Setup fallback = make_setup(config_for(without, "auto"), false);
  EXPECT_EQ(fallback.chat_template, nullptr);
  EXPECT_EQ(fallback.prompt_tokens({"What is 2+2?", ""}), plain);
  testing::expect_error([&] { make_setup(config_for(without, "model"), false); },
                        {"data.chat_template = \"model\"", "has no chat template"});
  fs::remove_all(with);
  fs::remove_all(without);
}

TEST(SetupPrompts, BuiltinModelKeepsPlainPrompts) {
  const fs::path dir = fs::temp_directory_path() / "lockstep_test_setup_builtin";
  fs::remove_all(dir);
  Config c;
  c.model.device = "cpu";
  c.run.out_dir = dir.string();
  const lockstep::Setup s = make_setup(c, /*need_data=*/false);
  EXPECT_EQ(s.chat_template, nullptr);
  EXPECT_EQ(s.prompt_tokens({"12+7=", ""}), s.tokenizer->encode("12+7=", /*add_special_tokens=*/false));
  fs::remove_all(dir);
}

// data.train / data.test = "word-problems": the generated problems of the run's seed and
// data.word_problem_steps, train and held-out splits, prompted through the checkpoint's template as
// a dataset's question is (equal to the written-out llama3 format), the worked solution as the SFT
// target; the builtin model cannot read them.
TEST(SetupPrompts, WordProblemsThroughTheChatTemplate) {
  const fs::path dir = llama_checkpoint("word_problems", true);
  Config c = config_for(dir, "auto");
  c.data.train = c.data.test = "word-problems";
  c.data.word_problem_steps = 3;
  c.run.seed = 5;
  const lockstep::Setup s = make_setup(c, /*need_data=*/true);
  ASSERT_TRUE(s.train.endless());
  ASSERT_TRUE(s.test.endless());
  const Problem p = s.train.draw(5, 7);
  EXPECT_EQ(p.prompt, word_problem(5, 3, SyntheticSplit::train, 7).prompt);
  EXPECT_EQ(s.test.head(3).at(2).prompt, word_problem(5, 3, SyntheticSplit::held_out, 2).prompt);
  c.data.chat_template = "llama3";
  const std::vector<int32_t> prompt = s.prompt_tokens(p);
  EXPECT_EQ(prompt, make_setup(c, true).prompt_tokens(p));
  EXPECT_NE(s.tokenizer->decode(prompt).find(p.prompt), std::string::npos);
  const std::string target = s.sft_target(p);
  const std::string eos = s.tokenizer->id_to_token(s.tokenizer->eos_id().value()).value();
  EXPECT_EQ(target, p.solution + eos);
  EXPECT_EQ(answer_reward(target, p.answer), 1.0);
  fs::remove_all(dir);

  Config builtin;
  builtin.model.device = "cpu";
  builtin.run.out_dir = (fs::temp_directory_path() / "lockstep_test_setup_builtin_words").string();
  for (const char* key : {"data.train", "data.test"}) {
    builtin.data.train = key == std::string("data.train") ? "word-problems" : "synthetic";
    builtin.data.test = key == std::string("data.test") ? "word-problems" : "synthetic";
    testing::expect_error([&] { make_setup(builtin, true); },
                          {std::string(key) + " = \"word-problems\" is English text",
                           "model.path = \"builtin\" cannot read", "give a Hugging Face model"});
  }
  fs::remove_all(builtin.run.out_dir);
}

}  // namespace
}  // namespace lockstep
