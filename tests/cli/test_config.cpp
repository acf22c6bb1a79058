// cli/config: defaults, the file and command-line precedence, every kind of error with the content
// of its message, the exact to_toml round trip, and the help listing every key.
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "cli/config.h"
#include "tests/io/io_test_helpers.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::TempDir;
using testing::write_bytes;

using Args = std::vector<std::string>;

Config load(const Args& args) { return load_config(nullptr, args); }

// A config file holding `text` in a fresh folder, loaded with `args`.
Config load_text(const std::string& text, const Args& args = {}) {
  TempDir dir;
  const std::filesystem::path file = dir.file("run.toml");
  write_bytes(file.string(), text);
  return load_config(&file, args);
}

TEST(RunConfig, DefaultsWithoutFileOrOptions) {
  const Config c = load({});
  EXPECT_EQ(c, Config{});
  EXPECT_EQ(c.model.path, "builtin");
  EXPECT_EQ(c.model.precision, "fp8");
  EXPECT_EQ(c.data.train, "synthetic");
  EXPECT_EQ(c.rollout.samples_per_prompt, 8);
  EXPECT_TRUE(c.rollout.stop.empty());
  EXPECT_EQ(c.loss.aggregation, "token-mean");
  EXPECT_EQ(c.optim.lr, 2e-4);
}

TEST(RunConfig, OptionsOverrideFileOverridesDefaults) {
  const std::string file =
      "# a run\n"
      "[model]\n"
      "precision = \"bf16\"\n"
      "[rollout]\n"
      "temperature = 0.7\n"
      "top_k = 20\n"
      "stop = [\"\\n\\n\"]\n"
      "[optim]\n"
      "lr = 1          # an integer is a float too\n"
      "schedule = 'cosine'\n";
  const Config c = load_text(file, {"--rollout.temperature=0.5", "--data.train", "data/x y.jsonl",
                                    "--rollout.stop=[\"</s>\", \"\\n\"]", "--model.path=/ckpt/q",
                                    "--data.system_prompt=\"say \\\"hi\\\"\"", "--run.steps", "7",
                                    "--run.steps=9", "--model.recompute=true", "--model.kv_cache=fp8"});
  EXPECT_EQ(c.model.precision, "bf16");            // file
  EXPECT_EQ(c.rollout.top_k, 20);                  // file
  EXPECT_EQ(c.optim.lr, 1.0);                      // file, integer read as float
  EXPECT_EQ(c.optim.schedule, "cosine");           // file, literal string
  EXPECT_EQ(c.rollout.temperature, 0.5);           // option over file
  EXPECT_EQ(c.data.train, "data/x y.jsonl");       // option, two-argument form, bare string
  EXPECT_EQ(c.rollout.stop, (std::vector<std::string>{"</s>", "\n"}));  // option over file
  EXPECT_EQ(c.model.path, "/ckpt/q");              // bare string
  EXPECT_EQ(c.data.system_prompt, "say \"hi\"");  // quoted: a TOML string
  EXPECT_EQ(c.run.steps, 9);                       // the later option wins
  EXPECT_TRUE(c.model.recompute);
  EXPECT_EQ(c.model.kv_cache, "fp8");
  EXPECT_EQ(c.rollout.top_p, Config{}.rollout.top_p);  // default
  EXPECT_EQ(c.sft, Config{}.sft);
}

TEST(RunConfig, DottedKeysAtTheTopLevel) {
  const Config c = load_text("rollout.temperature = 0.25\nrun = { steps = 3 }\n");
  EXPECT_EQ(c.rollout.temperature, 0.25);
  EXPECT_EQ(c.run.steps, 3);
}

TEST(RunConfig, UnknownKeysNameTheirPlaceAndSuggest) {
  expect_error([] { load_text("[rollout]\ntop_p = 0.9\ntemprature = 1.0\n"); },
               {"run.toml:3:", "unknown key rollout.temprature",
                "(did you mean rollout.temperature?)"});
  // The right key in the wrong section: every section that has it.
  expect_error([] { load_text("[optim]\ntemperature = 1.0\n"); },
               {"run.toml:2:", "unknown key optim.temperature",
                "did you mean rollout.temperature or generate.temperature?"});
  expect_error([] { load_text("steps = 3\n"); },
               {"run.toml:1:", "unknown key steps", "did you mean sft.steps or run.steps?"});
  expect_error([] { load_text("[rolout]\ntemperature = 1.0\n"); },
               {"run.toml:2:", "unknown key rolout.temperature",
                "did you mean rollout.temperature?"});
  expect_error([] { load_text("[run]\n[rolout]\n"); },
               {"run.toml:2:", "unknown section [rolout]", "did you mean [rollout]?"});
  expect_error([] { load({"--rollout.max_new_token=5"}); },
               {"option --rollout.max_new_token", "unknown key rollout.max_new_token",
                "did you mean rollout.max_new_tokens?"});
  // Nothing close: no suggestion.
  for (const auto& [text, key] :
       {std::pair{"[model.sub]\nx = 1\n", "model.sub"}, {"zzzz.qqqq = 1\n", "zzzz.qqqq"}}) {
    try {
      load_text(text);
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(std::string("unknown key ") + key), std::string::npos) << message;
      EXPECT_EQ(message.find("did you mean"), std::string::npos) << message;
    }
  }
}

TEST(RunConfig, WrongTypes) {
  expect_error([] { load_text("[rollout]\n\ntemperature = \"hot\"\n"); },
               {"run.toml:3:", "rollout.temperature must be a float, got string \"hot\""});
  expect_error([] { load({"--run.steps=2.5"}); },
               {"option --run.steps", "run.steps must be an integer, got float 2.5"});
  expect_error([] { load({"--model.recompute=yes"}); },
               {"option --model.recompute", "model.recompute expects boolean, got 'yes'",
                "not a TOML value"});
  expect_error([] { load({"--rollout.stop=[1, \"a\"]"}); },
               {"rollout.stop must be an array of strings, got array [integer 1, string \"a\"]"});
  expect_error([] { load_text("[rollout]\nstop = \"x\"\n"); },
               {"run.toml:2:", "rollout.stop must be an array of strings, got string \"x\""});
  expect_error([] { load_text("model = 3\n"); },
               {"run.toml:1:", "[model] must be a table of keys, got integer 3"});
  expect_error([] { load_text("[rollout]\ntemperature.x = 1\n"); },
               {"run.toml:2:", "rollout.temperature must be a float, got table"});
}

TEST(RunConfig, OutOfRangeValues) {
  expect_error([] { load_text("[rollout]\ntemperature = 0\n"); },
               {"run.toml:2:", "rollout.temperature must be > 0, got 0.0"});
  expect_error([] { load({"--rollout.top_p=1.5"}); }, {"rollout.top_p must be in (0, 1], got 1.5"});
  expect_error([] { load({"--rollout.samples_per_prompt", "1"}); },
               {"option --rollout.samples_per_prompt",
                "rollout.samples_per_prompt must be ≥ 2, got 1"});
  expect_error([] { load({"--loss.tis_cap=0.5"}); },
               {"loss.tis_cap must be 0 (off) or ≥ 1, got 0.5"});
  expect_error([] { load({"--loss.router_aux_loss_coef=-0.5"}); },
               {"loss.router_aux_loss_coef must be -1 (the model's) or ≥ 0, got -0.5"});
  EXPECT_EQ(load({"--loss.router_aux_loss_coef=0.02"}).loss.router_aux_loss_coef, 0.02);
  expect_error([] { load({"--optim.beta2=1"}); }, {"optim.beta2 must be in [0, 1), got 1.0"});
  expect_error([] { load({"--optim.lr=inf"}); }, {"optim.lr must be finite, got inf"});
  expect_error([] { load({"--rollout.stop=[\"\"]"}); },
               {"rollout.stop must be non-empty strings, got [\"\"]"});
  expect_error([] { load({"--run.out_dir="}); }, {"run.out_dir must be non-empty, got \"\""});
  expect_error([] { load({"--data.word_problem_steps=4"}); }, {"data.word_problem_steps must be in [1, 3], got 4"});
  expect_error([] { load_text("[data]\nword_problem_steps = 0\n"); },
               {"run.toml:2:", "data.word_problem_steps must be in [1, 3], got 0"});
  expect_error([] { load({"--run.mismatch_bin_tokens=0"}); }, {"run.mismatch_bin_tokens must be ≥ 1, got 0"});
}

TEST(RunConfig, BadChoicesListTheAllowedValues) {
  expect_error([] { load({"--model.precision=fp16"}); },
               {"option --model.precision",
                "model.precision must be one of \"fp8\", \"bf16\", \"fp8-rollout\", got \"fp16\""});
  expect_error([] { load({"--model.kv_cache=e4m3"}); },
               {"option --model.kv_cache", "model.kv_cache must be one of \"bf16\", \"fp8\", got \"e4m3\""});
  expect_error([] { load_text("[data]\nchat_template = \"qwen3\"\n"); },
               {"run.toml:2:", "data.chat_template must be one of \"auto\", \"model\", \"none\", "
                               "\"chatml\", \"qwen3-no-think\", \"llama3\", got \"qwen3\""});
}

TEST(RunConfig, SyntaxErrorsAndBadFiles) {
  expect_error([] { load_text("[rollout]\ntop_k = 3\ntemperature = \n"); },
               {"run.toml:3:", "TOML syntax error"});
  expect_error([] { load_text("[rollout]\ntop_k = 3\ntop_k = 4\n"); },
               {"run.toml:3:", "TOML syntax error"});
  const std::filesystem::path missing = "/nonexistent/lockstep/run.toml";
  expect_error([&] { load_config(&missing, {}); },
               {"cannot read config /nonexistent/lockstep/run.toml"});
}

// Non-ASCII characters where TOML has no place for them. toml++ 3.3 reached undefined behaviour on
// some of them (é, U+FEBF; found by tests/fuzz/fuzz_cli_config.cpp): they are refused with their
// line and column before it parses. In strings and comments they are ordinary text.
TEST(RunConfig, NonAsciiOutsideStringsIsASyntaxError) {
  expect_error([] { load_text("[model]\npath = \xc3\xa9\n"); },
               {"run.toml:2:8: TOML syntax error: a non-ASCII character outside a string or comment"});
  expect_error([] { load_text("[rollout]\nmax_new_tokens = \xef\xba\xbf\n"); }, {"run.toml:2:18:", "outside a string"});
  expect_error([] { load_text("[mod\xc3\xa9l]\n"); }, {"run.toml:1:5:", "outside a string"});
  expect_error([] { load_text("[model]\npath = \"\"\"a\\\n  \xc3\xa9\"\"\"\n"); },
               {"run.toml:3:3:", "right after a line-ending backslash"});
  expect_error([] { load({"--run.steps=\xc3\xa9"}); }, {"option --run.steps:1:", "outside a string"});
  // A quote inside a bare value opens no string (toml++ scans it as part of the value): U+0313 after
  // it reached the same toml++ UB (found by fuzz_cli_config on a 16-core machine).
  expect_error([] { load_text("[model]\npath = -\"a\xcc\x93\"\n"); }, {"run.toml:2:11:", "outside a string"});
  expect_error([] { load({"--run.steps=1'\xcc\x93'"}); }, {"option --run.steps:1:7:", "outside a string"});
  expect_error([] { load({"--run.steps=-[\"\xcc\x93\"]"}); }, {"option --run.steps:1:8:", "outside a string"});
  expect_error([] { load({"--run.steps=1.=\"\xcc\x93\""}); }, {"option --run.steps:1:9:", "outside a string"});
  const Config c = load_text("# caf\xc3\xa9 \xef\xba\xbf\n[model]\npath = \"caf\xc3\xa9\"  # \xc3\xa9\n"
                             "[run]\nout_dir = '''\xc3\xa9\n\xef\xba\xbf'''\n",
                             {"--data.train=d\xc3\xa9.jsonl"});
  EXPECT_EQ(c.model.path, "caf\xc3\xa9");
  EXPECT_EQ(c.run.out_dir, "\xc3\xa9\n\xef\xba\xbf");
  EXPECT_EQ(c.data.train, "d\xc3\xa9.jsonl");
}

TEST(RunConfig, BadCommandLines) {
  expect_error([] { load({"train"}); }, {"unexpected argument 'train'", "--section.key=value"});
  expect_error([] { load({"--"}); }, {"unexpected argument '--'"});
  expect_error([] { load({"--run.steps"}); }, {"option --run.steps", "needs a value"});
  expect_error([] { load({"--run.steps=3\nx = 4"}); }, {"run.steps must be one TOML value"});
}

TEST(RunConfig, KeysThatConstrainEachOther) {
  expect_error([] { load({"--optim.min_lr=0.01", "--optim.lr=0.001"}); },
               {"optim.min_lr (0.01) must be ≤ optim.lr (0.001)"});
  expect_error([] { load({"--loss.adaptive_clip=true"}); },
               {"loss.adaptive_clip = true needs", "loss.tis_cap ≥ 1"});
  EXPECT_TRUE(load({"--loss.adaptive_clip=true", "--loss.tis_cap=2"}).loss.adaptive_clip);
  // TIS cannot act when the old logprobs are the rollout's own.
  expect_error([] { load({"--loss.tis_cap=2", "--loss.reuse_rollout_logprobs=true"}); },
               {"loss.tis_cap = 2.0 cannot act with loss.reuse_rollout_logprobs = true"});
  expect_error([] { load({"--loss.overlong_buffer=7", "--rollout.max_new_tokens=6"}); },
               {"loss.overlong_buffer (7) must be ≤ rollout.max_new_tokens (6)"});
  expect_error([] { load({"--loss.clip_ratio_c=1"}); },
               {"loss.clip_ratio_c must be 0 (off) or > 1, got 1.0"});
}

TEST(RunConfig, ExactRolloutReusesItsLogprobsUnlessToldNot) {
  EXPECT_FALSE(load({}).rollout.exact);
  EXPECT_FALSE(load({}).loss.reuse_rollout_logprobs);
  EXPECT_EQ(load({}).rollout.exact_check_every, 10);
  const Config exact = load({"--rollout.exact=true", "--rollout.exact_check_every=1"});
  EXPECT_TRUE(exact.rollout.exact);
  EXPECT_TRUE(exact.loss.reuse_rollout_logprobs);  // implied
  EXPECT_EQ(exact.rollout.exact_check_every, 1);
  EXPECT_TRUE(load_text("[rollout]\nexact = true\n").loss.reuse_rollout_logprobs);
  // Given by a source, in either order, it stays as given.
  EXPECT_FALSE(load({"--loss.reuse_rollout_logprobs=false", "--rollout.exact=true"}).loss.reuse_rollout_logprobs);
  EXPECT_FALSE(load_text("[loss]\nreuse_rollout_logprobs = false\n", {"--rollout.exact=true"})
                   .loss.reuse_rollout_logprobs);
  EXPECT_FALSE(load({"--rollout.exact=false"}).loss.reuse_rollout_logprobs);

  expect_error([] { load({"--rollout.exact=yes"}); },
               {"option --rollout.exact", "rollout.exact expects boolean, got 'yes'"});
  expect_error([] { load_text("[rollout]\nexact = 1\n"); },
               {"run.toml:2:", "rollout.exact must be a boolean, got integer 1"});
  expect_error([] { load({"--rollout.exact_check_every=-1"}); },
               {"rollout.exact_check_every must be ≥ 0, got -1"});
  // fp8-rollout's rollout and training forward run different recipes: never exact.
  expect_error([] { load({"--rollout.exact=true", "--model.precision=fp8-rollout"}); },
               {"rollout.exact = true cannot hold with model.precision = \"fp8-rollout\"",
                "choose model.precision = \"bf16\" or \"fp8\"", "or rollout.exact = false"});
  EXPECT_TRUE(load({"--rollout.exact=true", "--model.precision=bf16"}).rollout.exact);
  // TIS against logprobs that are the rollout's by exact's default: the message says where from.
  expect_error([] { load({"--rollout.exact=true", "--loss.tis_cap=2"}); },
               {"loss.tis_cap = 2.0 cannot act with loss.reuse_rollout_logprobs = true (rollout.exact's default)"});
  EXPECT_EQ(load({"--rollout.exact=true", "--loss.tis_cap=2", "--loss.reuse_rollout_logprobs=false"}).loss.tis_cap, 2.0);
}

// Every member differs from its default, with values whose text is easy to get wrong.
Config every_key_changed() {
  Config c;
  // precision bf16: rollout.exact = true cannot hold with fp8-rollout (tested above).
  c.model = {"/models/Qwen3-1.7B", "bf16", "cuda", "fp8", true, true, true, 256, 4};
  c.data = {"train \"q\".jsonl", "C:\\data\\test.jsonl", "gsm8k", true, 3, 1, "qwen3-no-think",
            "You are\ta tutor.\nBe brief. é ✓ \x01"};
  c.rollout = {32, 8, 0.1, 0.95, 50, 1024, {"\n\n", "</s>", "'"}, 1.0 / 3.0, 32, true, 3};
  // reuse_rollout_logprobs stays false: with tis_cap > 0 the config rejects it (tested above); the
  // file says so, so rollout.exact does not turn it on.
  c.loss = {"none", 0.25, 0.28, 2.5, "token-sum-norm", 1.0 / 3000, "k1", 2.5, true, true, 7, 512,
            0.5, false, 1e-3, 2e-3};
  c.optim = {1e-6, 1e-7, "cosine", 20, 0.1, 0.8, 0.95, 1e-12, 0.5, 2, 4, 16384};
  c.sft = {1000, 2e-5, 64, 100};
  c.run = {1000, 1234567890123, "out/run 1", 25, 0, 100, true, 0, 10, 512};
  c.generate = {"What is 2+2?", 17, 0.6, 3};
  c.export_ = {"out/served", "bf16"};
  return c;
}

TEST(RunConfig, ToTomlRoundTripsExactly) {
  const Config changed = every_key_changed();
  // Each section compared on its own, so a section left at its defaults by mistake shows by name.
  EXPECT_NE(changed.model, Config{}.model);
  EXPECT_NE(changed.generate, Config{}.generate);
  EXPECT_NE(changed.export_, Config{}.export_);
  for (const Config& c : {Config{}, changed}) {
    const std::string text = to_toml(c);
    const Config back = load_text(text);
    EXPECT_EQ(back.model, c.model);
    EXPECT_EQ(back.data, c.data);
    EXPECT_EQ(back.rollout, c.rollout);
    EXPECT_EQ(back.loss, c.loss);
    EXPECT_EQ(back.optim, c.optim);
    EXPECT_EQ(back.sft, c.sft);
    EXPECT_EQ(back.run, c.run);
    EXPECT_EQ(back.generate, c.generate);
    EXPECT_EQ(back.export_, c.export_);
    EXPECT_EQ(to_toml(back), text);
  }
  // Floats in their shortest form, not toml++'s 17 digits.
  const std::string text = to_toml(changed);
  EXPECT_NE(text.find("lr = 1e-06"), std::string::npos) << text;
  EXPECT_NE(text.find("temperature = 0.1 "), std::string::npos) << text;
}

// "section.key" of every `key = value` line under a `[section]` line; `indent` precedes keys.
std::set<std::string> listed_keys(const std::string& text, const std::string& indent) {
  std::set<std::string> keys;
  std::istringstream lines(text);
  std::string line, section;
  while (std::getline(lines, line)) {
    if (line.starts_with("[")) {
      section = line.substr(1, line.find(']') - 1);
    } else if (!section.empty() && line.starts_with(indent) && line.size() > indent.size() &&
               line[indent.size()] != ' ' && line[indent.size()] != '#' &&
               line.find(" = ") != std::string::npos) {
      keys.insert(section + "." + line.substr(indent.size(), line.find(" = ") - indent.size()));
    }
  }
  return keys;
}

TEST(RunConfig, HelpListsEveryKeyWithTypeDefaultAndDescription) {
  const std::set<std::string> all = listed_keys(to_toml(Config{}), "");
  EXPECT_EQ(all.size(), 81u);  // the keys of config.h
  EXPECT_EQ(listed_keys(config_help(""), "  "), all);

  const std::string help = config_help("");
  EXPECT_NE(help.find("  temperature = 1.0 "), std::string::npos) << help;
  EXPECT_NE(help.find("float, > 0\n      sampling temperature\n"), std::string::npos) << help;
  EXPECT_NE(help.find("string, one of \"fp8\", \"bf16\", \"fp8-rollout\""), std::string::npos);
  EXPECT_NE(help.find("--section.key=value"), std::string::npos);
  // Descriptions are wrapped to 100 columns (key lines may overflow with a long type).
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("      ")) continue;
    const size_t cols = size_t(std::count_if(line.begin(), line.end(),
                                             [](char ch) { return (ch & 0xC0) != 0x80; }));
    EXPECT_LE(cols, 100u) << line;
  }
  EXPECT_NE(help.find("      advantage A = (r - group mean)"), std::string::npos);
}

TEST(RunConfig, HelpOfASubcommandListsItsSections) {
  const std::string train = config_help("train");
  // `train` runs sft.steps of SFT first: its keys are train's too.
  for (const char* s : {"[model]", "[data]", "[rollout]", "[loss]", "[optim]", "[sft]", "[run]"})
    EXPECT_NE(train.find(s), std::string::npos) << s;
  EXPECT_EQ(train.find("[generate]"), std::string::npos);
  EXPECT_NE(train.find("lockstep train"), std::string::npos);

  const std::string plot = config_help("plot");
  EXPECT_NE(plot.find("[run]"), std::string::npos);
  EXPECT_EQ(plot.find("[model]"), std::string::npos);

  expect_error([] { config_help("serve"); },
               {"unknown subcommand 'serve'", "train, sft, eval, generate, export, plot"});
}

}  // namespace
}  // namespace lockstep
