// Model weights to and from Hugging Face checkpoints (names, fused projections, dtypes), the bad
// checkpoints a user can bring, and the SFT loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "io/safetensors.h"
#include "model/hf_checkpoint.h"
#include "model/sft_loss.h"
#include "tests/io/io_test_helpers.h"
#include "tests/model/model_test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::random_parameters;
using testing::TempDir;
using testing::tiny_config;

void expect_same_values(const ModelParameters& a, const ModelParameters& b, bool bf16_rounded) {
  std::vector<Tensor> bt;
  b.for_each([&](const std::string&, const Tensor& t) { bt.push_back(t); });
  size_t i = 0;
  a.for_each([&](const std::string& name, const Tensor& t) {
    ASSERT_LT(i, bt.size());
    const Tensor& u = bt[i++];
    ASSERT_EQ(t.shape(), u.shape()) << name;
    for (int64_t k = 0; k < t.numel(); ++k) {
      const float want = bf16_rounded ? round_to_bf16(t.data_as<float>()[k]) : t.data_as<float>()[k];
      ASSERT_EQ(want, u.data_as<float>()[k]) << name << "[" << k << "]";
    }
  });
  EXPECT_EQ(i, bt.size());
}

class Checkpoint : public ::testing::TestWithParam<ModelFamily> {};

TEST_P(Checkpoint, SaveThenLoadGivesTheSameWeights) {
  const ModelConfig config = tiny_config(GetParam(), {.tied = GetParam() == ModelFamily::qwen3});
  const ModelParameters params = random_parameters(config, 7);
  TempDir dir;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const std::string folder = dir.file(std::string(dtype_name(dtype)));
    save_hf_checkpoint(folder, config, params, dtype);
    EXPECT_EQ(load_model_config(folder), [&] {
      ModelConfig c = config;
      c.torch_dtype = dtype == DType::f32 ? "float32" : "bfloat16";
      return c;
    }());
    expect_same_values(params, load_hf_parameters(config, folder), dtype == DType::bf16);
  }
  // Saving again replaces the folder; nothing temporary is left beside it.
  save_hf_checkpoint(dir.file("f32"), config, params, DType::f32);
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"bf16", "f32"}));
}

TEST_P(Checkpoint, UsesHuggingFaceNamesAndSplitsFusedProjections) {
  const ModelConfig config = tiny_config(GetParam());
  const ModelParameters params = random_parameters(config, 8);
  TempDir dir;
  save_hf_checkpoint(dir.file("m"), config, params, DType::f32);
  const SafetensorsCheckpoint ckpt(dir.file("m"));
  const int64_t q = config.num_attention_heads * config.head_dim;
  const Tensor k = ckpt.tensor("model.layers.1.self_attn.k_proj.weight");
  // k_proj is rows [q, q + kv) of the fused qkv.
  EXPECT_EQ(k.data_as<float>()[0], params.layers[1].qkv.data_as<float>()[q * config.hidden_size]);
  const Tensor up = ckpt.tensor("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(up.data_as<float>()[0],
            params.layers[0].gate_up.data_as<float>()[config.intermediate_size * config.hidden_size]);
  EXPECT_EQ(ckpt.contains("lm_head.weight"), !config.tie_word_embeddings);
  EXPECT_EQ(ckpt.contains("model.layers.0.self_attn.q_norm.weight"), config.qk_norm);
  EXPECT_EQ(ckpt.contains("model.layers.0.self_attn.q_proj.bias"), config.qkv_bias);
}

INSTANTIATE_TEST_SUITE_P(Families, Checkpoint,
                         ::testing::Values(ModelFamily::qwen3, ModelFamily::qwen2,
                                           ModelFamily::llama),
                         [](const auto& info) { return std::string(model_type_name(info.param)); });

// A checkpoint of `config` with one tensor changed by `edit` (renamed, reshaped, removed, added).
std::string edited_checkpoint(const TempDir& dir, const ModelConfig& config,
                              const std::function<void(NamedTensors&)>& edit) {
  save_hf_checkpoint(dir.file("good"), config, random_parameters(config, 9), DType::bf16);
  const SafetensorsCheckpoint good(dir.file("good"));
  NamedTensors tensors;
  for (const std::string& name : good.names()) tensors.emplace_back(name, good.tensor(name).to(Device::cpu));
  edit(tensors);
  write_safetensors(dir.file("bad.safetensors"), tensors);
  return dir.file("bad.safetensors");
}

TEST(CheckpointErrors, NameTheCheckpointAndTheTensor) {
  const ModelConfig config = tiny_config(ModelFamily::qwen3);
  TempDir dir;
  const std::string missing = edited_checkpoint(dir, config, [](NamedTensors& t) {
    std::erase_if(t, [](const auto& p) { return p.first == "model.layers.1.mlp.up_proj.weight"; });
  });
  expect_error([&] { load_hf_parameters(config, missing); },
               {missing, "missing tensor", "model.layers.1.mlp.up_proj.weight"});

  const std::string reshaped = edited_checkpoint(dir, config, [](NamedTensors& t) {
    for (auto& [name, tensor] : t)
      if (name == "model.norm.weight") tensor = Tensor::zeros({15}, DType::bf16);
  });
  expect_error([&] { load_hf_parameters(config, reshaped); },
               {reshaped, "model.norm.weight", "[15]", "[16]"});

  const std::string extra = edited_checkpoint(dir, config, [](NamedTensors& t) {
    t.emplace_back("model.layers.2.mlp.up_proj.weight", Tensor::zeros({24, 16}, DType::bf16));
  });
  expect_error([&] { load_hf_parameters(config, extra); },
               {extra, "unexpected tensor", "model.layers.2.mlp.up_proj.weight"});

  const std::string ints = edited_checkpoint(dir, config, [](NamedTensors& t) {
    for (auto& [name, tensor] : t)
      if (name == "model.norm.weight") tensor = Tensor::zeros({16}, DType::i32);
  });
  expect_error([&] { load_hf_parameters(config, ints); }, {ints, "model.norm.weight", "i32"});

  expect_error([&] { load_hf_parameters(config, dir.file("nowhere")); }, {dir.file("nowhere")});
}

// config.json ties the embeddings and the checkpoint also holds lm_head.weight. transformers
// (PreTrainedModel.tie_weights in modeling_utils.py) ties a stored head equal to the embeddings,
// silently; one that differs it does not tie: it warns and uses the stored head. Checked by the
// values the model ends up with, not only by loading without an error.
TEST(CheckpointErrors, TiedConfigWithAStoredHead) {
  namespace fs = std::filesystem;
  const ModelConfig config = tiny_config(ModelFamily::qwen3, {.tied = true});
  TempDir dir;
  save_hf_checkpoint(dir.file("good"), config, random_parameters(config, 9), DType::bf16);
  const SafetensorsCheckpoint good(dir.file("good"));
  auto owned = [](const Tensor& t) {
    Tensor copy = Tensor::empty(t.shape(), t.dtype());
    std::memcpy(copy.data(), t.data(), t.nbytes());
    return copy;
  };
  auto folder_with_head = [&](const std::string& name, const Tensor& head) {
    fs::create_directories(dir.file(name));
    NamedTensors tensors;
    for (const std::string& n : good.names()) tensors.emplace_back(n, owned(good.tensor(n)));
    tensors.emplace_back("lm_head.weight", head);
    tensors.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", Tensor::zeros({4}, DType::f32));
    write_safetensors(dir.file(name + "/model.safetensors"), tensors);
    fs::copy_file(dir.file("good/config.json"), dir.file(name + "/config.json"));
    return dir.file(name);
  };
  const Tensor embed = owned(good.tensor("model.embed_tokens.weight"));
  auto widened = [](const Tensor& t) {
    std::vector<float> v(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = bf16_to_float(t.data_as<bf16>()[i]);
    return v;
  };
  auto values = [](const Tensor& t) {
    return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
  };

  // A stored head equal to the embeddings: tied, no warning, the embeddings are the head.
  const std::string same = folder_with_head("same", owned(embed));
  ::testing::internal::CaptureStderr();
  const ModelConfig same_config = load_model_config(same);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_TRUE(same_config.tie_word_embeddings);
  const ModelParameters tied = load_hf_parameters(same_config, same);
  EXPECT_EQ(values(tied.embed), widened(embed));

  // A stored head that differs (one bit of one element): untied with a warning naming the folder,
  // and the stored head is the model's head.
  Tensor head = owned(embed);
  head.data_as<bf16>()[5].bits ^= 1;
  const std::string differs = folder_with_head("differs", head);
  ::testing::internal::CaptureStderr();
  const ModelConfig untied_config = load_model_config(differs);
  const std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find(differs), std::string::npos) << warning;
  EXPECT_NE(warning.find("NOT tied and the stored head is used"), std::string::npos) << warning;
  EXPECT_FALSE(untied_config.tie_word_embeddings);
  const ModelParameters untied = load_hf_parameters(untied_config, differs);
  EXPECT_EQ(values(untied.lm_head), widened(head));
  EXPECT_EQ(values(untied.embed), widened(embed));
  // A tied config made by hand for that checkpoint: an error, not a silently dropped head.
  expect_error([&] { load_hf_parameters(config, differs); },
               {differs, "lm_head.weight differs from model.embed_tokens.weight", "tie_word_embeddings"});
}

TEST(SftLoss, MaskedMeanOfNegativeLogprobs) {
  Tensor logprob = Tensor::empty({4}, DType::f32), mask = Tensor::empty({4}, DType::f32);
  const float lp[4] = {-1.5f, -0.25f, -3.0f, -2.0f}, m[4] = {0, 1, 1, 0.5f};
  std::copy(lp, lp + 4, logprob.data_as<float>());
  std::copy(m, m + 4, mask.data_as<float>());
  const SftLoss loss = sft_loss(logprob, mask);
  EXPECT_DOUBLE_EQ(loss.tokens, 2.5);
  EXPECT_NEAR(loss.loss, (0.25 + 3.0 + 1.0) / 2.5, 1e-12);
  for (int t = 0; t < 4; ++t) EXPECT_FLOAT_EQ(loss.dlogprob.data_as<float>()[t], -m[t] / 2.5f);
  mask.fill_bytes(0);
  expect_error([&] { sft_loss(logprob, mask); }, {"selects no token"});
}

}  // namespace
}  // namespace lockstep
