// Block-FP8 Hugging Face checkpoints (model/hf_checkpoint.h): the layout transformers and vLLM read
// (Qwen3-8B-FP8, DeepSeek-V3), the E4M3 bytes against the fp8 recipe's own weights and against a
// scalar reference of the block format, loading one back, and the errors a bad one gets.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "io/file_io.h"
#include "io/safetensors.h"
#include "model/hf_checkpoint.h"
#include "model/linear.h"
#include "tests/io/io_test_helpers.h"
#include "tests/model/model_test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::gpu_tiny_config;
using testing::partial_blocks_config;
using testing::random_parameters;
using testing::TempDir;

constexpr int64_t kBlock = 128;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One projection as Hugging Face names it: rows [row_begin, row_begin + rows) of a fused master.
struct Projection {
  std::string name;
  const Tensor* master;  // f32 [N, K]
  int64_t row_begin, rows;
};

std::vector<Projection> projections(const ModelConfig& c, const ModelParameters& p) {
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim,
                ff = c.intermediate_size;
  std::vector<Projection> out;
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const std::string pre = "model.layers." + std::to_string(i) + ".";
    const LayerParameters& l = p.layers[i];
    out.push_back({pre + "self_attn.q_proj.weight", &l.qkv, 0, q});
    out.push_back({pre + "self_attn.k_proj.weight", &l.qkv, q, kv});
    out.push_back({pre + "self_attn.v_proj.weight", &l.qkv, q + kv, kv});
    out.push_back({pre + "self_attn.o_proj.weight", &l.o, 0, c.hidden_size});
    out.push_back({pre + "mlp.gate_proj.weight", &l.gate_up, 0, ff});
    out.push_back({pre + "mlp.up_proj.weight", &l.gate_up, ff, ff});
    out.push_back({pre + "mlp.down_proj.weight", &l.down, 0, c.hidden_size});
  }
  return out;
}

// The block format written out by hand: a block's scale is amax / 448 over the master elements it
// covers (rows [r0, r1) of the master, columns [c0, c1)); each element is e4m3(x · (1 / scale)).
float reference_scale(const Tensor& master, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  float amax = 0;
  const int64_t k = master.dim(1);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(master.data_as<float>()[r * k + c]));
  return amax == 0 ? 1.0f : amax / 448.0f;  // random weights: never below the smallest normal
}

// Checks the exported tensors of `p` against the reference. The fp8 recipe quantizes the fused
// master on its own 128-row grid: a projection starting on that grid ("exact") gets the scales of
// the fused blocks, which may cover the next projection's rows too; one starting inside a block is
// quantized on its own grid.
void expect_reference_blocks(const SafetensorsCheckpoint& ckpt, const Projection& p, bool exact) {
  const Tensor data = ckpt.tensor(p.name), scales = ckpt.tensor(p.name + "_scale_inv");
  const int64_t n = p.rows, k = p.master->dim(1), fused_rows = p.master->dim(0);
  ASSERT_EQ(data.dtype(), DType::e4m3) << p.name;
  ASSERT_EQ(data.shape(), (Shape{n, k})) << p.name;
  ASSERT_EQ(scales.dtype(), DType::f32) << p.name;
  ASSERT_EQ(scales.shape(), (Shape{ceil_div(n, kBlock), ceil_div(k, kBlock)})) << p.name;
  for (int64_t bi = 0; bi < scales.dim(0); ++bi) {
    for (int64_t bj = 0; bj < scales.dim(1); ++bj) {
      const int64_t first = p.row_begin + bi * kBlock;  // the block's first row in the master
      const int64_t r0 = exact ? first / kBlock * kBlock : first;
      const int64_t r1 = exact ? std::min(r0 + kBlock, fused_rows) : std::min(first + kBlock, p.row_begin + n);
      const int64_t c0 = bj * kBlock, c1 = std::min(c0 + kBlock, k);
      const float s = reference_scale(*p.master, r0, r1, c0, c1);
      ASSERT_EQ(scales.data_as<float>()[bi * scales.dim(1) + bj], s) << p.name << " block " << bi << "," << bj;
      const float inv = 1.0f / s;
      for (int64_t r = first; r < std::min(first + kBlock, p.row_begin + n); ++r)
        for (int64_t c = c0; c < c1; ++c)
          ASSERT_EQ(data.data_as<e4m3>()[(r - p.row_begin) * k + c].bits,
                    float_to_e4m3(p.master->data_as<float>()[r * k + c] * inv).bits)
              << p.name << "[" << r - p.row_begin << "," << c << "]";
    }
  }
}

TEST(Fp8Checkpoint, WritesTheBlockFp8Format) {
  for (const ModelConfig& config : {gpu_tiny_config(), partial_blocks_config(ModelFamily::llama)}) {
    SCOPED_TRACE(config.hidden_size);
    const ModelParameters params = random_parameters(config, 11);
    TempDir dir;
    const std::string folder = dir.file("fp8");
    const Fp8Export report = save_fp8_hf_checkpoint(folder, config, params);

    const auto j = nlohmann::json::parse(read_file(folder + "/config.json", "config"));
    EXPECT_EQ(j["quantization_config"]["quant_method"], "fp8");
    EXPECT_EQ(j["quantization_config"]["fmt"], "e4m3");
    EXPECT_EQ(j["quantization_config"]["activation_scheme"], "dynamic");
    EXPECT_EQ(j["quantization_config"]["weight_block_size"], nlohmann::json({128, 128}));
    EXPECT_EQ(j["quantization_config"]["modules_to_not_convert"], nlohmann::json({"lm_head"}));
    EXPECT_EQ(j["torch_dtype"], "bfloat16");

    const SafetensorsCheckpoint ckpt(folder);
    const std::vector<Projection> projs = projections(config, params);
    // Every tensor but the projections' stays bf16; each projection has its scales beside it.
    EXPECT_EQ(ckpt.size(), [&] {
      size_t unquantized = 0;
      ModelParameters zeros = ModelParameters::zeros(config);
      const TempDir plain;
      save_hf_checkpoint(plain.file("bf16"), config, zeros);
      for (const std::string& name : SafetensorsCheckpoint(plain.file("bf16")).names()) {
        if (!name.ends_with("_proj.weight")) {
          EXPECT_EQ(ckpt.tensor(name).dtype(), DType::bf16) << name;
          ++unquantized;
        }
      }
      return unquantized + 2 * projs.size();
    }());

    // Which projections start on the fused masters' 128-row grid decides which are exact.
    std::vector<std::string> exact, requantized;
    for (const Projection& p : projs) (p.row_begin % kBlock == 0 ? exact : requantized).push_back(p.name);
    EXPECT_EQ(report.exact, exact);
    EXPECT_EQ(report.requantized, requantized);
    if (config.hidden_size == 192) {
      // q 192 rows, k 64, v 64; gate and up 320 each: k_proj and up_proj start inside a block.
      EXPECT_EQ(requantized.size(), 2 * config.num_hidden_layers);
    } else {
      EXPECT_TRUE(requantized.empty());
    }
    for (const Projection& p : projs) {
      SCOPED_TRACE(p.name);
      expect_reference_blocks(ckpt, p, p.row_begin % kBlock == 0);
    }
  }
}

// The exact projections hold the bytes and scales of the weight the fp8 recipe's GEMMs read
// (LinearWeight, refreshed from the master as after every optimizer step): the rollout's weights.
TEST(Fp8Checkpoint, ExactProjectionsHoldTheRecipesOwnWeight) {
  const ModelConfig config = partial_blocks_config(ModelFamily::qwen3);
  const ModelParameters params = random_parameters(config, 12);
  TempDir dir;
  save_fp8_hf_checkpoint(dir.file("fp8"), config, params);
  const SafetensorsCheckpoint ckpt(dir.file("fp8"));
  for (const Projection& p : projections(config, params)) {
    if (p.row_begin % kBlock != 0) continue;
    SCOPED_TRACE(p.name);
    const LinearWeight w(Recipe::fp8, *p.master);
    const Tensor data = ckpt.tensor(p.name), scales = ckpt.tensor(p.name + "_scale_inv");
    const int64_t k = data.dim(1), stored = w.fp8.w.data.dim(1), table = w.fp8.w.scales.dim(1);
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t c = 0; c < k; ++c)
        ASSERT_EQ(data.data_as<e4m3>()[r * k + c].bits,
                  w.fp8.w.data.data_as<e4m3>()[(p.row_begin + r) * stored + c].bits);
    for (int64_t bi = 0; bi < scales.dim(0); ++bi)
      for (int64_t bj = 0; bj < scales.dim(1); ++bj)
        ASSERT_EQ(scales.data_as<float>()[bi * scales.dim(1) + bj],
                  w.fp8.w.scales.data_as<float>()[(p.row_begin / kBlock + bi) * table + bj]);
  }
}

// Loading: the masters are e4m3 · scale_inv in fp32, as transformers dequantizes; the unquantized
// tensors are the bf16 values.
TEST(Fp8Checkpoint, LoadsAsDequantizedMasters) {
  for (const ModelConfig& config : {gpu_tiny_config(), partial_blocks_config(ModelFamily::llama)}) {
    const ModelParameters params = random_parameters(config, 13);
    TempDir dir;
    save_fp8_hf_checkpoint(dir.file("fp8"), config, params);
    const ModelConfig loaded_config = load_model_config(dir.file("fp8"));
    ASSERT_TRUE(loaded_config.fp8_quantization);
    EXPECT_EQ(*loaded_config.fp8_quantization, (Fp8Quantization{128, 128, {"lm_head"}}));
    const ModelParameters loaded = load_hf_parameters(loaded_config, dir.file("fp8"));
    const SafetensorsCheckpoint ckpt(dir.file("fp8"));
    for (const Projection& p : projections(config, loaded)) {
      const Tensor data = ckpt.tensor(p.name), scales = ckpt.tensor(p.name + "_scale_inv");
      const int64_t k = data.dim(1);
      for (int64_t r = 0; r < p.rows; ++r)
        for (int64_t c = 0; c < k; ++c)
          ASSERT_EQ(p.master->data_as<float>()[(p.row_begin + r) * k + c],
                    e4m3_to_float(data.data_as<e4m3>()[r * k + c]) *
                        scales.data_as<float>()[(r / kBlock) * scales.dim(1) + c / kBlock])
              << p.name << "[" << r << "," << c << "]";
    }
    const Tensor embed = ckpt.tensor("model.embed_tokens.weight");
    for (int64_t i = 0; i < embed.numel(); ++i)
      ASSERT_EQ(loaded.embed.data_as<float>()[i], bf16_to_float(embed.data_as<bf16>()[i]));
  }
}

// Exported again after loading, a checkpoint whose projections are all exact has the same E4M3
// bytes. The scales may move by one unit in the last place: a block's largest element dequantizes
// to fl(448 · s), and fl(fl(448 · s) / 448) is s or a neighbour; every element's x · (1 / s') then
// lies within 2^-22 of its E4M3 value and rounds back to it. (Where a projection was quantized on
// its own grid, the fused block it shares with its neighbour has other values after loading, and
// the neighbour's scale in that block can move further.)
TEST(Fp8Checkpoint, ExportsTheSameBytesAgainAfterLoading) {
  const ModelConfig config = gpu_tiny_config();
  TempDir dir;
  save_fp8_hf_checkpoint(dir.file("a"), config, random_parameters(config, 15));
  const ModelConfig loaded_config = load_model_config(dir.file("a"));
  const ModelParameters loaded = load_hf_parameters(loaded_config, dir.file("a"));
  save_fp8_hf_checkpoint(dir.file("b"), loaded_config, loaded);
  const SafetensorsCheckpoint a(dir.file("a")), b(dir.file("b"));
  for (const Projection& p : projections(config, loaded)) {
    const Tensor da = a.tensor(p.name), db = b.tensor(p.name);
    for (int64_t i = 0; i < da.numel(); ++i)
      ASSERT_EQ(da.data_as<e4m3>()[i].bits, db.data_as<e4m3>()[i].bits) << p.name << "[" << i << "]";
    const Tensor sa = a.tensor(p.name + "_scale_inv"), sb = b.tensor(p.name + "_scale_inv");
    for (int64_t i = 0; i < sa.numel(); ++i) {
      const float x = sa.data_as<float>()[i], y = sb.data_as<float>()[i];
      ASSERT_LE(std::fabs(x - y), x * std::ldexp(1.0f, -23)) << p.name << " scale " << i;
    }
  }
}

TEST(Fp8Checkpoint, BadCheckpointsNameTheTensor) {
  const ModelConfig config = gpu_tiny_config();
  const ModelParameters params = random_parameters(config, 14);
  TempDir dir;
  save_fp8_hf_checkpoint(dir.file("fp8"), config, params);
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  const SafetensorsCheckpoint good(dir.file("fp8"));
  auto write_without = [&](const std::string& folder, const std::string& drop, const Tensor* replace) {
    std::filesystem::create_directories(folder);
    NamedTensors tensors;
    for (const std::string& name : good.names()) {
      if (name == drop && !replace) continue;
      tensors.emplace_back(name, name == drop ? *replace : good.tensor(name).to(Device::cpu));
    }
    write_safetensors(folder + "/model.safetensors", tensors);
  };
  ModelConfig fp8_config = load_model_config(dir.file("fp8"));

  write_without(dir.file("no_scale"), q + "_scale_inv", nullptr);
  expect_error([&] { load_hf_parameters(fp8_config, dir.file("no_scale")); },
               {"no_scale", q, "block scales", q + "_scale_inv", "missing"});

  const Tensor wrong = Tensor::zeros({3, 2}, DType::f32);
  write_without(dir.file("bad_scale"), q + "_scale_inv", &wrong);
  expect_error([&] { load_hf_parameters(fp8_config, dir.file("bad_scale")); },
               {"bad_scale", q + "_scale_inv", "[3, 2]", "must be f32 [4, 2]", "128×128"});

  ModelConfig plain = fp8_config;
  plain.fp8_quantization.reset();
  expect_error([&] { load_hf_parameters(plain, dir.file("fp8")); },
               {"F8_E4M3", "no quantization_config"});
}

TEST(Fp8Checkpoint, QuantizationConfigErrorsNameTheField) {
  const std::string base = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "quantization_config": )";
  auto parse = [&](const std::string& q) { return parse_model_config(base + q + "}", "c.json"); };
  EXPECT_EQ(parse(R"({"quant_method": "fp8", "weight_block_size": [128, 64]})").fp8_quantization,
            (Fp8Quantization{128, 64, {}}));
  EXPECT_EQ(parse(R"({"quant_method": "fp8", "weight_block_size": [128, 128],
                      "modules_to_not_convert": ["lm_head"]})").fp8_quantization,
            (Fp8Quantization{128, 128, {"lm_head"}}));
  expect_error([&] { parse(R"({"quant_method": "awq"})"); },
               {"c.json", "quantization_config.quant_method", "'awq'", "block-FP8"});
  expect_error([&] { parse(R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})"); },
               {"quantization_config.fmt", "e5m2"});
  expect_error([&] { parse(R"({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]})"); },
               {"quantization_config.activation_scheme", "static"});
  expect_error([&] { parse(R"({"quant_method": "fp8"})"); },
               {"quantization_config.weight_block_size", "missing", "one scale per tensor"});
  expect_error([&] { parse(R"({"quant_method": "fp8", "weight_block_size": [128, 0]})"); },
               {"weight_block_size.columns", "positive"});
  expect_error([&] { parse(R"({"quant_method": "fp8", "weight_block_size": 128})"); },
               {"weight_block_size", "[rows, columns]"});
}

}  // namespace
}  // namespace lockstep
