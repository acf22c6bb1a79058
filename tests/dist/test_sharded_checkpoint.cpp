// tests/dist/test_sharded_checkpoint.cpp — rl/sharded_checkpoint.h: a checkpoint written by M
// ranks (each its own shard file; M = 1: the whole format of rl/checkpoint.h) and read by N ranks
// continues exactly: after the resumed step the masters are, bit for bit, those of one AdamW that
// took every step, on every rank. M and N differ from the mpirun world's, so the ranks are threads
// of this process (tests/dist/thread_ranks.h); the tests run in the one-rank run of test_dist only.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "model/hf_checkpoint.h"
#include "rl/checkpoint.h"
#include "rl/sharded_checkpoint.h"
#include "tests/dist/test_world.h"
#include "tests/dist/thread_ranks.h"
#include "tests/model/model_test_util.h"
#include "train/data_parallel.h"
#include "train/sharded_optimizer.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using testing::ThreadRanks;

// Tensors of 300 and 160 rows (cut in 128-row blocks between ranks), matrices and vectors kept whole.
ModelConfig config() {
  return testing::tiny_config(ModelFamily::qwen3, {.intermediate = 80, .layers = 2, .vocab = 300});
}

OptimizerConfig optimizer_config() {
  return {.beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f, .max_grad_norm = 0,
          .schedule = {.peak_lr = 0.01f}};
}

// A sparse model for expert parallelism: 6 experts a layer (they split over 1, 2 and 3 ranks).
ModelConfig moe_config() {
  ModelConfig c = testing::tiny_config(ModelFamily::qwen3_moe, {.intermediate = 80, .layers = 2, .vocab = 300});
  c.moe->num_experts = 6;
  return c;
}

// Step s's gradient: values in [-0.01, 0.01) from a hash of (s, element).
ModelParameters gradient(int64_t step, const ModelConfig& mc = config()) {
  ModelParameters g = ModelParameters::zeros(mc);
  uint64_t n = 0;
  g.for_each([&](const std::string&, Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint64_t h = (uint64_t(step + 1) * 0x9E3779B97F4A7C15ull) ^ (++n * 0xBF58476D1CE4E5B9ull);
      h ^= h >> 31;
      h *= 0x94D049BB133111EBull;
      h ^= h >> 29;
      t.data_as<float>()[i] = 0.01f * (float(h >> 40) / float(1 << 24) * 2 - 1);
    }
  });
  return g;
}

// Rank 0 carries the whole gradient, the others zeros: the sum over any number of ranks is the
// gradient itself, bit for bit. With `experts_owned` an expert's gradient is on its owner instead
// (the only rank where the backward leaves one: model/expert_parallel.h).
ModelParameters gradient_on(const Communicator& comm, int64_t step, const ModelConfig& mc = config(),
                            bool experts_owned = false) {
  ModelParameters g = gradient(step, mc);
  const int64_t per_rank = mc.moe ? mc.moe->num_experts / comm.size() : 1;
  g.for_each([&](const std::string& name, Tensor& t) {
    const size_t at = name.find(".experts.");
    const int owner = experts_owned && at != std::string::npos ? int(std::stoll(name.substr(at + 9)) / per_rank) : 0;
    if (owner != comm.rank()) t.fill_bytes(0);
  });
  return g;
}

std::vector<unsigned char> bytes_of(const ModelParameters& p) {
  std::vector<unsigned char> out;
  p.for_each([&](const std::string&, const Tensor& t) {
    const auto* b = static_cast<const unsigned char*>(t.data());
    out.insert(out.end(), b, b + t.nbytes());
  });
  return out;
}

fs::path scratch(const std::string& name) {
  return fs::temp_directory_path() / ("lockstep_sharded_ckpt_" + name + "_" + std::to_string(getpid()));
}

// `from` ranks take steps 1-2 and write a checkpoint into `dir` (with `experts_owned`: under
// expert parallelism, each expert's state on its rank).
void write_after_two_steps(int from, const fs::path& dir, const ModelConfig& mc = config(),
                           bool experts_owned = false) {
  const ModelParameters initial = ModelParameters::initialized(mc, 5);
  ThreadRanks::run(from, [&](Communicator& comm) {
    ModelParameters p = initial.copy_to(Device::cpu);
    auto opt = make_data_parallel_optimizer(p, optimizer_config(), comm, /*shard_state=*/true, experts_owned);
    const bool owned = experts_owned && comm.size() > 1;
    for (int64_t s = 0; s < 2; ++s) {
      ModelParameters g = gradient_on(comm, s, mc, owned);
      opt->step(p, g, {});
    }
    const RunState state{.sft_step = 0, .step = 2, .optimizer_steps = 2, .consecutive_skips = 0};
    if (const auto* sharded = dynamic_cast<const ShardedAdamW*>(opt.get()); sharded && comm.size() > 1)
      save_sharded_checkpoint(dir, mc, comm, *sharded, state, fs::path());
    else
      save_checkpoint(dir, mc, p, opt->full_moments(p), state, fs::path());
  });
}

// `to` ranks resume from `dir` and take step 3; every rank's masters afterwards.
std::vector<std::vector<unsigned char>> resume_one_step(int to, const fs::path& dir, const ModelConfig& mc = config(),
                                                        bool experts_owned = false) {
  std::vector<std::vector<unsigned char>> out(static_cast<size_t>(to));
  ThreadRanks::run(to, [&](Communicator& comm) {
    const std::optional<SavedRun> saved = find_checkpoint(dir);
    if (!saved) return;  // (every rank alike)
    ModelParameters p = is_sharded_checkpoint(saved->model)
                            ? load_sharded_masters(mc, saved->model)
                            : load_hf_parameters(mc, saved->model.string());
    auto opt = make_data_parallel_optimizer(p, optimizer_config(), comm, /*shard_state=*/true, experts_owned);
    if (is_sharded_checkpoint(saved->model))
      load_sharded_optimizer(saved->model, p, *opt, saved->state.optimizer_steps);
    else
      load_optimizer(dir, p, *opt, saved->state.optimizer_steps);
    ModelParameters g = gradient_on(comm, 2, mc, experts_owned && comm.size() > 1);
    opt->step(p, g, {});
    out[size_t(comm.rank())] = bytes_of(p);
  });
  return out;
}

class ShardedCheckpointAcross : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(ShardedCheckpointAcross, ResumesExactly) {
  if (testing::world().size() > 1) GTEST_SKIP() << "runs in the one-rank run of test_dist";
  const auto [from, to] = GetParam();
  ModelParameters reference = ModelParameters::initialized(config(), 5);
  AdamW one(reference, optimizer_config());
  for (int64_t s = 0; s < 3; ++s) {
    ModelParameters g = gradient(s);
    one.step(reference, g);
  }
  const fs::path dir = scratch(std::to_string(from) + "_to_" + std::to_string(to));
  fs::remove_all(dir);
  write_after_two_steps(from, dir);
  ASSERT_EQ(is_sharded_checkpoint(dir / "checkpoint" / "model"), from > 1);
  if (from > 1) {
    EXPECT_FALSE(fs::exists(dir / "checkpoint" / "model" / "model.safetensors"))
        << "a sharded checkpoint holds no whole copy of the masters";
    for (int r = 0; r < from; ++r)
      EXPECT_TRUE(fs::exists(dir / "checkpoint" / "shards" /
                             ("rank-" + std::to_string(r) + "-of-" + std::to_string(from) + ".safetensors")));
  }
  const std::vector<std::vector<unsigned char>> after = resume_one_step(to, dir);
  const std::vector<unsigned char> expected = bytes_of(reference);
  for (int r = 0; r < to; ++r)
    EXPECT_TRUE(after[size_t(r)] == expected) << from << " ranks -> " << to << ": rank " << r
                                              << " differs from one AdamW's three steps";
  EXPECT_FALSE(after[0] == bytes_of(ModelParameters::initialized(config(), 5))) << "nothing was updated";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(RankCounts, ShardedCheckpointAcross,
                         ::testing::Values(std::pair{2, 3}, std::pair{3, 1}, std::pair{1, 2}, std::pair{3, 3},
                                           std::pair{2, 2}),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "_to_" + std::to_string(info.param.second);
                         });

// Written and read with and without expert parallelism (each expert's state in its owner's file,
// state.json's "experts_owned"), across rank counts: the same bits as one AdamW's three steps.
class ShardedCheckpointExperts : public ::testing::TestWithParam<std::tuple<int, bool, int, bool>> {};

TEST_P(ShardedCheckpointExperts, ResumesExactly) {
  if (testing::world().size() > 1) GTEST_SKIP() << "runs in the one-rank run of test_dist";
  const auto [from, owned_from, to, owned_to] = GetParam();
  ModelParameters reference = ModelParameters::initialized(moe_config(), 5);
  AdamW one(reference, optimizer_config());
  for (int64_t s = 0; s < 3; ++s) {
    ModelParameters g = gradient(s, moe_config());
    one.step(reference, g);
  }
  const fs::path dir = scratch("experts_" + std::to_string(from) + "_to_" + std::to_string(to));
  fs::remove_all(dir);
  write_after_two_steps(from, dir, moe_config(), owned_from);
  const std::vector<std::vector<unsigned char>> after = resume_one_step(to, dir, moe_config(), owned_to);
  const std::vector<unsigned char> expected = bytes_of(reference);
  for (int r = 0; r < to; ++r)
    EXPECT_TRUE(after[size_t(r)] == expected) << from << " ranks -> " << to << ": rank " << r
                                              << " differs from one AdamW's three steps";
  EXPECT_FALSE(after[0] == bytes_of(ModelParameters::initialized(moe_config(), 5))) << "nothing was updated";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(RankCounts, ShardedCheckpointExperts,
                         ::testing::Values(std::tuple{2, true, 3, true}, std::tuple{3, true, 2, false},
                                           std::tuple{2, false, 3, true}, std::tuple{3, true, 1, false}),
                         [](const auto& info) {
                           const auto& p = info.param;
                           return std::to_string(std::get<0>(p)) + (std::get<1>(p) ? "_owned" : "") + "_to_" +
                                  std::to_string(std::get<2>(p)) + (std::get<3>(p) ? "_owned" : "");
                         });

TEST(ShardedCheckpoint, AMissingShardIsAClearError) {
  if (testing::world().size() > 1) GTEST_SKIP() << "runs in the one-rank run of test_dist";
  const fs::path dir = scratch("missing");
  fs::remove_all(dir);
  write_after_two_steps(2, dir);
  fs::remove(dir / "checkpoint" / "shards" / "rank-1-of-2.safetensors");
  try {
    load_sharded_masters(config(), dir / "checkpoint" / "model");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("written by 2 ranks and has no rank-1-of-2.safetensors"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lockstep
