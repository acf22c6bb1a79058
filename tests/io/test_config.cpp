// config.json: the published configs of Qwen3-1.7B, Qwen2.5-1.5B and Llama-3.2-1B(-Instruct) parse
// to the values (and parameter counts) of those models, survive a to_json round trip, and every
// invalid or unsupported config fails with a message naming the file and the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/config.h"
#include "io/file_io.h"
#include "io_test_helpers.h"

namespace lockstep {
namespace {

using json = nlohmann::json;
using testing::expect_error;
using testing::TempDir;

std::string fixture(const std::string& name) {
  return std::string(LOCKSTEP_SOURCE_DIR) + "/tests/data/configs/" + name;
}

json fixture_json(const std::string& name) { return json::parse(read_file(fixture(name), "fixture")); }

TEST(ModelConfig, Qwen3_1_7B) {
  const ModelConfig c = load_model_config(fixture("qwen3-1.7b.json"));
  EXPECT_EQ(c.family, ModelFamily::qwen3);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 6144);
  EXPECT_EQ(c.num_hidden_layers, 28);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.rope_scaling);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  // "1.7B parameters, 1.4B non-embedding" (the model card): 1.41e9 + 151936 * 2048.
  EXPECT_EQ(parameter_count(c), 1'720'574'976);
}

TEST(ModelConfig, Qwen2_5_1_5B) {
  const ModelConfig c = load_model_config(fixture("qwen2.5-1.5b.json"));
  EXPECT_EQ(c.family, ModelFamily::qwen2);
  EXPECT_EQ(c.hidden_size, 1536);
  EXPECT_EQ(c.intermediate_size, 8960);
  EXPECT_EQ(c.num_hidden_layers, 28);
  EXPECT_EQ(c.num_attention_heads, 12);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 128);  // 1536 / 12
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.rope_scaling);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151643});
  // The model card's "1.54B parameters, 1.31B non-embedding".
  EXPECT_EQ(parameter_count(c), 1'543'714'304);
}

TEST(ModelConfig, Llama_3_2_1B) {
  const ModelConfig c = load_model_config(fixture("llama-3.2-1b.json"));
  EXPECT_EQ(c.family, ModelFamily::llama);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_hidden_layers, 16);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 500000.0);
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(*c.rope_scaling, (Llama3RopeScaling{32.0, 1.0, 4.0, 8192}));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias || c.qk_norm);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{128001});
  EXPECT_EQ(parameter_count(c), 1'235'814'400);  // the published 1.24B

  const ModelConfig instruct = load_model_config(fixture("llama-3.2-1b-instruct.json"));
  EXPECT_EQ(instruct.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
}

// The same configs as transformers 5.23 writes them (AutoConfig.from_pretrained, then
// save_pretrained, output kept verbatim): rope_parameters, dtype and layer_types replace the old
// spellings, and the model must come out the same.
TEST(ModelConfig, Transformers5SpellingsReadTheSame) {
  EXPECT_EQ(load_model_config(fixture("llama-3.2-1b-instruct.transformers5.json")),
            load_model_config(fixture("llama-3.2-1b-instruct.json")));
  EXPECT_EQ(load_model_config(fixture("qwen3-1.7b.transformers5.json")),
            load_model_config(fixture("qwen3-1.7b.json")));
}

TEST(ModelConfig, ToJsonRoundTripsThroughAFile) {
  TempDir dir;
  for (const char* name : {"qwen3-1.7b.json", "qwen2.5-1.5b.json", "llama-3.2-1b.json",
                           "llama-3.2-1b-instruct.json"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = load_model_config(fixture(name));
    save_model_config(c, dir.file("config.json"));
    EXPECT_EQ(load_model_config(dir.path().string()), c);  // a folder holding config.json works too
    // The fields HF reads are present under their HF names.
    const json j = json::parse(c.to_json());
    const json original = fixture_json(name);
    for (const char* field : {"architectures", "model_type", "hidden_size", "intermediate_size",
                              "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                              "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta",
                              "tie_word_embeddings", "bos_token_id", "eos_token_id", "torch_dtype"})
      EXPECT_EQ(j.at(field), original.at(field)) << field;
    EXPECT_EQ(j.at("rope_scaling"), original.value("rope_scaling", json()));
  }
  EXPECT_EQ(dir.list(), std::vector<std::string>{"config.json"});
}

TEST(ModelConfig, DefaultsAndAlternativeSpellings) {
  json j = fixture_json("llama-3.2-1b.json");
  j.erase("num_key_value_heads");
  j.erase("head_dim");
  j.erase("max_position_embeddings");
  j.erase("tie_word_embeddings");
  j.erase("eos_token_id");
  j["bos_token_id"] = nullptr;
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "llama3";  // the older spelling
  ModelConfig c = parse_model_config(j.dump(), "d.json");
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.bos_token_id);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_TRUE(c.rope_scaling);
  EXPECT_EQ(parameter_count(c), 1'235'814'400 + 128256 * 2048 + 16 * 2 * 2048 * (2048 - 512));

  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_FALSE(parse_model_config(j.dump(), "d.json").rope_scaling);
  j.erase("architectures");  // model_type alone names the family
  EXPECT_EQ(parse_model_config(j.dump(), "d.json").family, ModelFamily::llama);

  // transformers 5 spelling: rope_parameters holds rope_theta, `dtype` replaces torch_dtype.
  json q = fixture_json("qwen3-1.7b.json");
  q.erase("rope_theta");
  q.erase("rope_scaling");
  q.erase("torch_dtype");
  q["rope_parameters"] = {{"rope_theta", 5e6}, {"rope_type", "default"}};
  q["dtype"] = "float32";
  c = parse_model_config(q.dump(), "q.json");
  EXPECT_EQ(c.rope_theta, 5e6);
  EXPECT_FALSE(c.rope_scaling);
  EXPECT_EQ(c.torch_dtype, "float32");

  // Llama and Qwen3 `attention_bias` puts a bias on q, k, v and o.
  q["attention_bias"] = true;
  c = parse_model_config(q.dump(), "q.json");
  EXPECT_TRUE(c.qkv_bias && c.o_bias);
  EXPECT_EQ(parse_model_config(c.to_json(), "again"), c);
}

// Parses `j` as "bad.json" and expects an error naming the file and each of `parts`.
void expect_config_error(const json& j, std::initializer_list<std::string_view> parts) {
  SCOPED_TRACE(j.dump());
  expect_error([&] { parse_model_config(j.dump(), "bad.json"); }, {"bad.json"});
  expect_error([&] { parse_model_config(j.dump(), "bad.json"); }, parts);
}

TEST(ModelConfig, ClearErrors) {
  const json llama = fixture_json("llama-3.2-1b.json"), qwen3 = fixture_json("qwen3-1.7b.json");
  auto with = [](json j, const std::string& field, json value) {
    if (value.is_discarded()) j.erase(field); else j[field] = std::move(value);
    return j;
  };
  const json erase = json(json::value_t::discarded);

  expect_config_error(with(llama, "architectures", {"MistralForCausalLM"}),
                      {"'architectures'", "unsupported architecture 'MistralForCausalLM'", "Qwen3ForCausalLM"});
  expect_config_error(with(llama, "architectures", "LlamaForCausalLM"), {"'architectures'", "list"});
  expect_config_error(with(with(llama, "architectures", erase), "model_type", erase), {"'architectures'", "missing"});
  expect_config_error(with(llama, "model_type", "qwen2"), {"'model_type'", "LlamaForCausalLM"});
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "vocab_size", "rms_norm_eps", "rope_theta"}) {
    expect_config_error(with(llama, field, erase), {field, "missing"});
    expect_config_error(with(llama, field, nullptr), {field, "missing"});
    expect_config_error(with(llama, field, "2048"), {field, "\"2048\" (string)"});
    expect_config_error(with(llama, field, 0), {field, "positive"});
    expect_config_error(with(llama, field, -4), {field, "positive"});
  }
  expect_config_error(with(llama, "num_hidden_layers", 16.5), {"'num_hidden_layers' must be an integer"});
  expect_config_error(with(llama, "num_key_value_heads", 0), {"'num_key_value_heads'", "positive"});
  expect_config_error(with(llama, "head_dim", -64), {"'head_dim'", "positive"});
  expect_config_error(with(llama, "tie_word_embeddings", 1), {"'tie_word_embeddings' must be true or false"});
  expect_config_error(with(with(llama, "head_dim", erase), "num_attention_heads", 30),
                      {"'hidden_size'", "(2048) is not divisible by num_attention_heads (30)"});
  expect_config_error(with(llama, "num_key_value_heads", 5),
                      {"'num_key_value_heads'", "(5) does not divide num_attention_heads (32)"});
  expect_config_error(with(qwen3, "head_dim", erase), {"'head_dim'", "required for Qwen3"});
  expect_config_error(with(llama, "eos_token_id", {128001, "x"}), {"'eos_token_id'", "token id"});
  expect_config_error(with(llama, "bos_token_id", -1), {"'bos_token_id'", "token id"});
  expect_config_error(with(llama, "hidden_act", "gelu"), {"'hidden_act'", "'gelu'"});
  expect_config_error(with(qwen3, "use_sliding_window", true), {"'use_sliding_window'", "not supported"});
  expect_config_error(with(qwen3, "layer_types", {"full_attention", "sliding_attention"}),
                      {"'layer_types'", "\"sliding_attention\""});

  json rope = llama;
  rope["rope_scaling"]["rope_type"] = "yarn";
  expect_config_error(rope, {"'rope_scaling'", "'yarn'", "unsupported"});
  expect_config_error(with(llama, "rope_scaling", 4.0), {"'rope_scaling' must be an object"});
  rope = llama;
  rope["rope_scaling"].erase("rope_type");
  expect_config_error(rope, {"'rope_scaling' has no 'rope_type'"});
  rope = llama;
  rope["rope_scaling"].erase("factor");
  expect_config_error(rope, {"'rope_scaling.factor'", "missing"});
  rope = llama;
  rope["rope_scaling"]["original_max_position_embeddings"] = 8192.5;
  expect_config_error(rope, {"'rope_scaling.original_max_position_embeddings' must be an integer"});
  rope = llama;
  rope["rope_scaling"]["low_freq_factor"] = 4.0;
  expect_config_error(rope, {"'rope_scaling.low_freq_factor'", "below high_freq_factor"});

  expect_error([] { parse_model_config("{\"hidden_size\": ", "bad.json"); }, {"bad.json", "not valid JSON"});
  expect_error([] { parse_model_config("[]", "bad.json"); }, {"bad.json", "not a JSON object"});
  expect_error([] { load_model_config("/nonexistent/config.json"); },
               {"model config /nonexistent/config.json: no such file or folder"});

  // A ModelConfig whose flags no config.json can express is refused rather than written wrongly.
  ModelConfig c = load_model_config(fixture("qwen2.5-1.5b.json"));
  c.qkv_bias = false;
  expect_error([&] { (void)c.to_json(); }, {"Qwen2ForCausalLM", "cannot express"});
}

// Every size is bounded so that the products lockstep forms from them (parameter_count, tensor
// element counts) fit an int64_t and a garbled size fails at once. The fuzzers found the unbounded
// values overflowing parameter_count (vocab_size 333333333333151936, intermediate_size
// 8192333333333333) and a num_hidden_layers of 2333333333011 looping in it past libFuzzer's 30 s.
TEST(ModelConfig, SizesAboveLockstepsLimitsFailNamingFieldAndLimit) {
  const json llama = fixture_json("llama-3.2-1b.json");
  const std::pair<const char*, int64_t> limits[] = {
      {"hidden_size", 1 << 17},       {"intermediate_size", 1 << 17}, {"num_attention_heads", 1 << 10},
      {"num_key_value_heads", 1 << 10}, {"head_dim", 1 << 12},        {"num_hidden_layers", 1 << 12},
      {"vocab_size", 1 << 24},        {"max_position_embeddings", 1 << 24}};
  for (const auto& [field, limit] : limits) {
    json j = llama;
    j[field] = limit + 1;
    expect_config_error(j, {detail::concat("'", field, "' is ", limit + 1, ", above lockstep's limit of ",
                                           limit)});
    j[field] = uint64_t(18446744073709551615u);
    expect_config_error(j, {field, "above lockstep's limit"});
  }
  for (const auto& [field, value] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"vocab_size", 333333333333151936}, {"intermediate_size", 8192333333333333},
           {"num_hidden_layers", 2333333333011}}) {
    json j = llama;
    j[field] = value;
    expect_config_error(j, {field, "above lockstep's limit"});
  }
  json rope = llama;
  rope["rope_scaling"]["original_max_position_embeddings"] = (1 << 24) + 1;
  expect_config_error(rope, {"'rope_scaling.original_max_position_embeddings'", "above lockstep's limit"});

  // At the limits the config parses and its parameter count is exact: per layer the attention
  // (q, o: 2^17 x 2^10 x 2^12; k, v the same with 2^10 key/value heads), the MLP (3 x 2^17 x 2^17)
  // and two norms; then the embeddings, an untied head and the final norm.
  json widest = llama;
  for (const auto& [field, limit] : limits) widest[field] = limit;
  widest["tie_word_embeddings"] = false;
  const ModelConfig c = parse_model_config(widest.dump(), "widest.json");
  const int64_t h = 1 << 17, q = int64_t(1) << 22, layer = 4 * h * q + 3 * h * h + 2 * h;
  EXPECT_EQ(parameter_count(c), 4096 * layer + 2 * (int64_t(1) << 24) * h + h);
}

}  // namespace
}  // namespace lockstep
