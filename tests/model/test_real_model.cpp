// A real trained model: SmolLM2-135M-Instruct as `bash scripts/get_model.sh smollm2-135m-instruct
// .deps/models/smollm2-135m-instruct` writes it (or the folder LOCKSTEP_REAL_MODEL_DIR names).
// lockstep's tokenizer ids and fp32 next-token logprobs are compared with
// tests/data/smollm2_135m_reference.json: HF `tokenizers` and transformers (fp32) on the same folder,
// written by `scripts/dev/check_real_model.py --write-fixture`. Without the folder every test skips,
// saying how to get it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/config.h"
#include "io/file_io.h"
#include "io/tokenizer.h"
#include "model/hf_checkpoint.h"
#include "model/transformer.h"
#include "tests/model/model_test_util.h"

namespace lockstep {
namespace {

std::filesystem::path model_dir() {
  const char* env = std::getenv("LOCKSTEP_REAL_MODEL_DIR");
  return env && *env ? env : LOCKSTEP_SOURCE_DIR "/.deps/models/smollm2-135m-instruct";
}

nlohmann::json reference() {
  const std::string path = LOCKSTEP_TEST_DATA "/smollm2_135m_reference.json";
  return nlohmann::json::parse(read_file(path, "reference"));
}

#define SKIP_WITHOUT_MODEL()                                                                         \
  if (!std::filesystem::exists(model_dir() / "config.json"))                                        \
  GTEST_SKIP() << "no model at " << model_dir().string()                                            \
               << " (bash scripts/get_model.sh smollm2-135m-instruct .deps/models/smollm2-135m-instruct)"

TEST(RealModel, TokenizerIdsEqualHf) {
  SKIP_WITHOUT_MODEL();
  const nlohmann::json ref = reference();
  const Tokenizer tokenizer = Tokenizer::from_dir(model_dir());
  for (size_t i = 0; i < ref["texts"].size(); ++i) {
    const std::vector<int32_t> ids = tokenizer.encode(ref["texts"][i].get<std::string>(), false);
    EXPECT_EQ(ids, ref["sequences"][i].get<std::vector<int32_t>>()) << "text #" << i;
  }
}

// transformers and lockstep in fp32 differ in summation order and in how cos/sin are evaluated;
// through 30 layers that moved a logprob by at most 4.6e-5 (mean 8e-6) on these 300 tokens.
constexpr double kMaxLogprobError = 2e-4, kMeanLogprobError = 4e-5;

TEST(RealModel, Fp32LogprobsEqualTransformers) {
  SKIP_WITHOUT_MODEL();
  const nlohmann::json ref = reference();
  const ModelConfig config = load_model_config(model_dir().string());
  Transformer model(config, load_hf_parameters(config, model_dir().string()), Recipe::fp32,
                    {.trainable = false});
  const auto sequences = ref["sequences"].get<testing::Sequences>();
  const std::vector<float> logprob =
      testing::to_floats(model.forward(testing::pack(sequences), 1.0f, false).logprob);

  double worst = 0, sum = 0;
  size_t row = 0, compared = 0;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const auto expected = ref["logprob"][s].get<std::vector<double>>();
    ASSERT_EQ(expected.size() + 1, sequences[s].size()) << "sequence #" << s;
    for (size_t j = 0; j < expected.size(); ++j) {
      const double error = std::abs(double(logprob[row + j]) - expected[j]);
      EXPECT_LE(error, kMaxLogprobError) << "sequence #" << s << ", token " << j + 1;
      worst = std::max(worst, error);
      sum += error;
      ++compared;
    }
    row += sequences[s].size();  // the last row targets token 0 and has no reference
  }
  EXPECT_LE(sum / double(compared), kMeanLogprobError);
  std::cout << compared << " logprobs: max |error| " << worst << ", mean " << sum / double(compared)
            << "\n";
}

}  // namespace
}  // namespace lockstep
