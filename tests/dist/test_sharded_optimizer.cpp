// tests/dist/test_sharded_optimizer.cpp — train/sharded_optimizer.h against the replicated
// data-parallel optimizer (train/data_parallel.h) on N ranks and against AdamW on one rank fed the
// rank-order sum of every rank's gradients: the same weights, bf16 and fp8 copies and moments bit
// for bit, on every rank; a non-finite gradient on one rank skips the step everywhere; moments
// saved by N ranks continue on one, and those of one rank on N. Run under `mpirun -np 2` and `-np 3`
// (tests/CMakeLists.txt); alone, one rank, where the sharded optimizer is AdamW over one shard.
//
// The model is synthetic (the optimizer only sees names and shapes): an embedding of 300 rows
// (cut in 128-row blocks), vectors and small matrices (kept whole), and a [256, 128] matrix with an
// fp8 copy (two 128-row blocks of scales).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "core/error.h"
#include "dist/host_values.h"
#include "dist/single_rank.h"
#include "tests/dist/test_world.h"
#include "train/data_parallel.h"
#include "train/sharded_optimizer.h"

namespace lockstep {
namespace {

using testing::world;

ModelParameters model_shapes() {
  ModelParameters p;
  p.embed = Tensor::empty({300, 32}, DType::f32);
  p.layers.resize(1);
  LayerParameters& l = p.layers[0];
  l.input_norm = Tensor::empty({32}, DType::f32);
  l.qkv = Tensor::empty({96, 32}, DType::f32);
  l.o = Tensor::empty({32, 32}, DType::f32);
  l.post_norm = Tensor::empty({32}, DType::f32);
  l.gate_up = Tensor::empty({256, 128}, DType::f32);
  l.down = Tensor::empty({32, 128}, DType::f32);
  p.final_norm = Tensor::empty({32}, DType::f32);
  p.lm_head = Tensor::empty({130, 32}, DType::f32);
  return p;
}

// Values in [-scale, scale) from a hash of (seed, tensor, element): each rank's gradients of each
// step differ.
ModelParameters filled(uint64_t seed, float scale) {
  ModelParameters p = model_shapes();
  uint64_t tensor = 0;
  p.for_each([&](const std::string&, Tensor& t) {
    float* v = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint64_t h = (seed * 0x9E3779B97F4A7C15ull) ^ (++tensor * 0xBF58476D1CE4E5B9ull) ^ uint64_t(i);
      h ^= h >> 31;
      h *= 0x94D049BB133111EBull;
      h ^= h >> 29;
      v[i] = scale * (float(h >> 40) / float(1 << 24) * 2 - 1);
    }
  });
  return p;
}

ModelParameters gradient_of(int rank, int64_t step, float scale) {
  return filled(1000 + uint64_t(step) * 16 + uint64_t(rank), scale);
}

// The sum over `ranks` ranks of their gradients, in rank order, in f32 (as the CPU collectives).
ModelParameters summed_gradient(int ranks, int64_t step, float scale) {
  ModelParameters sum = gradient_of(0, step, scale);
  for (int r = 1; r < ranks; ++r) {
    ModelParameters g = gradient_of(r, step, scale);
    std::vector<Tensor*> gs;
    g.for_each([&](const std::string&, Tensor& t) { gs.push_back(&t); });
    size_t i = 0;
    sum.for_each([&](const std::string&, Tensor& t) {
      float* s = t.data_as<float>();
      const float* x = gs[i++]->data_as<float>();
      for (int64_t e = 0; e < t.numel(); ++e) s[e] += x[e];
    });
  }
  return sum;
}

OptimizerConfig config(float max_grad_norm) {
  return {.beta1 = 0.9f,
          .beta2 = 0.99f,
          .eps = 1e-8f,
          .weight_decay = 0.1f,
          .max_grad_norm = max_grad_norm,
          .schedule = {.peak_lr = 0.01f}};
}

// The weights with their bf16 copies (every matrix) and the fp8 copy of gate_up.
struct Model {
  ModelParameters params = filled(7, 0.5f);
  std::map<std::string, Tensor> bf16;
  Fp8Weight fp8 = Fp8Weight::empty(256, 128, Device::cpu);
  Model() {
    params.for_each([&](const std::string& name, Tensor& t) {
      if (t.rank() == 2) bf16[name] = Tensor::zeros(t.shape(), DType::bf16);
    });
  }
  AdamW::CopiesOf copies() {
    return [this](const std::string& name) {
      WeightCopies c;
      if (auto it = bf16.find(name); it != bf16.end()) c.bf16 = &it->second;
      if (name == "layers.0.gate_up") c.fp8 = &fp8;
      return c;
    };
  }
};

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const auto* b = static_cast<const unsigned char*>(t.data());
  return std::vector<unsigned char>(b, b + t.nbytes());
}

std::vector<unsigned char> bytes_of(const ModelParameters& p) {
  std::vector<unsigned char> out;
  p.for_each([&](const std::string&, const Tensor& t) {
    const std::vector<unsigned char> b = bytes_of(t);
    out.insert(out.end(), b.begin(), b.end());
  });
  return out;
}

// Every byte of the weights and their copies.
std::vector<unsigned char> bytes_of(const Model& m) {
  std::vector<unsigned char> out = bytes_of(m.params);
  for (const auto& [name, t] : m.bf16) {
    const std::vector<unsigned char> b = bytes_of(t);
    out.insert(out.end(), b.begin(), b.end());
  }
  for (const Tensor* t : {&m.fp8.w.data, &m.fp8.w.scales, &m.fp8.wt.data, &m.fp8.wt.scales}) {
    const std::vector<unsigned char> b = bytes_of(*t);
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

// The first differing byte, or "" (a failure that says where).
std::string first_difference(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b) {
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return "byte " + std::to_string(i) + " of " + std::to_string(a.size());
  return "";
}

// Every rank's bytes equal rank 0's (compared through a hash, gathered over the ranks).
void expect_identical_on_every_rank(Communicator& comm, const std::vector<unsigned char>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char b : bytes) h = (h ^ b) * 1099511628211ull;
  const double halves[2] = {double(h >> 32), double(h & 0xffffffffu)};
  const std::vector<double> all = gather_over_ranks(comm, std::span<const double>(halves, 2));
  for (int r = 1; r < comm.size(); ++r)
    EXPECT_TRUE(all[2 * size_t(r)] == all[0] && all[2 * size_t(r) + 1] == all[1])
        << "rank " << r << " holds other weights than rank 0";
}

// `steps` steps of `opt` on this rank's gradients; the results.
std::vector<OptimizerStep> run_steps(DataParallelOptimizer& opt, Model& model, Communicator& comm,
                                     int64_t first, int64_t steps, float grad_scale) {
  std::vector<OptimizerStep> out;
  for (int64_t s = first; s < first + steps; ++s) {
    ModelParameters g = gradient_of(comm.rank(), s, grad_scale);
    out.push_back(opt.step(model.params, g, model.copies()));
    double left = 0;
    g.for_each([&](const std::string&, const Tensor& t) {
      for (int64_t i = 0; i < t.numel(); ++i) left += std::fabs(t.data_as<float>()[i]);
    });
    EXPECT_EQ(left, 0) << "the gradients are not zeroed after step " << s;
  }
  return out;
}

// (max_grad_norm, gradient scale, bucket elements): no clipping, clipping that never acts, clipping
// that acts (‖g‖ ≫ 0.05), and buckets smaller than one piece, so the collectives run in parts.
struct Case {
  float max_grad_norm, grad_scale;
  int64_t bucket;
  const char* name;
};

class ShardedAdamWCase : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedAdamWCase, EqualsReplicatedBitForBit) {
  // ‖g‖ is the one value whose sums run in another order (a tensor cut between ranks adds its
  // Σ g² in parts): it agrees to a double's rounding; the clip factor, an f32 computed from it,
  // then has the same bits unless ‖g‖ sits on an f32 rounding boundary, which these fixed inputs do
  // not. Everything else is the same sums and the same elementwise update.
  Communicator& comm = world();
  const Case c = GetParam();
  Model sharded_model, replicated_model;
  ShardedAdamW sharded(sharded_model.params, config(c.max_grad_norm), comm, c.bucket);
  ReplicatedAdamW replicated(replicated_model.params, config(c.max_grad_norm), comm);
  const int64_t steps = 3;
  const std::vector<OptimizerStep> a = run_steps(sharded, sharded_model, comm, 0, steps, c.grad_scale);
  const std::vector<OptimizerStep> b = run_steps(replicated, replicated_model, comm, 0, steps, c.grad_scale);
  for (int64_t s = 0; s < steps; ++s) {
    ASSERT_TRUE(a[size_t(s)].applied && b[size_t(s)].applied);
    EXPECT_EQ(a[size_t(s)].step, b[size_t(s)].step);
    EXPECT_EQ(a[size_t(s)].lr, b[size_t(s)].lr);
    EXPECT_NEAR(a[size_t(s)].grad_norm, b[size_t(s)].grad_norm, 1e-14 * b[size_t(s)].grad_norm);
    EXPECT_EQ(a[size_t(s)].clip_scale, b[size_t(s)].clip_scale) << "step " << s + 1;
  }
  if (c.max_grad_norm == 0.05f) {
    EXPECT_LT(a.back().clip_scale, 0.5f) << "the clipping case never clipped";
  }
  EXPECT_EQ(sharded.steps(), steps);
  const std::vector<unsigned char> bytes = bytes_of(sharded_model);
  EXPECT_EQ(first_difference(bytes, bytes_of(replicated_model)), "");
  EXPECT_NE(first_difference(bytes_of(sharded_model.params), bytes_of(filled(7, 0.5f))), "")
      << "the weights never changed: nothing was tested";
  expect_identical_on_every_rank(comm, bytes);
  // The gathered moments are the replicated optimizer's.
  const DataParallelOptimizer::Moments ms = sharded.full_moments(sharded_model.params),
                                       mr = replicated.full_moments(replicated_model.params);
  EXPECT_EQ(first_difference(bytes_of(ms.m), bytes_of(mr.m)), "");
  EXPECT_EQ(first_difference(bytes_of(ms.v), bytes_of(mr.v)), "");
}

INSTANTIATE_TEST_SUITE_P(Cases, ShardedAdamWCase,
                         ::testing::Values(Case{0, 0.01f, ShardedAdamW::kDefaultBucketNumel, "no_clip"},
                                           Case{1e6f, 0.01f, 1000, "clip_inactive_small_buckets"},
                                           Case{0.05f, 1.0f, 776, "clipping_small_buckets"}),
                         [](const auto& info) { return std::string(info.param.name); });

// The model keeps its norms only (Transformer::release_masters): the optimizer holds its rows of
// the matrices' masters and hands over their copies (bf16 rows, fp8 W blocks + scales, Wᵀ remade
// on every rank). The copies, the kept norms and the gathered masters are the replicated
// optimizer's bits on every rank, with buckets of any size.
TEST(ShardedAdamW, ReleasedMastersHandOverTheCopiesBitForBit) {
  Communicator& comm = world();
  for (int64_t bucket : {ShardedAdamW::kDefaultBucketNumel, int64_t(776), int64_t(100)}) {
    Model sharded_model, replicated_model;
    ShardedAdamW sharded(sharded_model.params, config(0.05f), comm, bucket);
    ReplicatedAdamW replicated(replicated_model.params, config(0.05f), comm);
    sharded_model.params.for_each([](const std::string&, Tensor& t) {
      if (t.rank() == 2) t = Tensor();  // released: every matrix has a copy
    });
    ASSERT_TRUE(sharded.holds_masters());
    for (int64_t s = 0; s < 3; ++s) {
      ModelParameters g = gradient_of(comm.rank(), s, 1.0f), g2 = gradient_of(comm.rank(), s, 1.0f);
      const OptimizerStep a = sharded.step(sharded_model.params, g, sharded_model.copies());
      const OptimizerStep b = replicated.step(replicated_model.params, g2, replicated_model.copies());
      ASSERT_TRUE(a.applied && b.applied);
      EXPECT_EQ(a.clip_scale, b.clip_scale) << "step " << s + 1;
      EXPECT_GE(a.handover_seconds, 0.0);
    }
    ModelParameters kept = replicated_model.params;
    kept.for_each([](const std::string&, Tensor& t) {
      if (t.rank() == 2) t = Tensor();
    });
    Model expected_copies = replicated_model;
    expected_copies.params = kept;
    const std::vector<unsigned char> bytes = bytes_of(sharded_model);
    EXPECT_EQ(first_difference(bytes, bytes_of(expected_copies)), "") << "bucket " << bucket;
    ModelParameters full = model_shapes();
    full.for_each([](const std::string&, Tensor& t) { t.fill_bytes(0xff); });
    sharded.gather_masters(full);
    EXPECT_EQ(first_difference(bytes_of(full), bytes_of(replicated_model.params)), "") << "bucket " << bucket;
    EXPECT_NE(first_difference(bytes_of(full), bytes_of(filled(7, 0.5f))), "") << "nothing was updated";
    expect_identical_on_every_rank(comm, bytes);
  }
}

TEST(ShardedAdamW, EqualsOneRankAdamWOnTheSummedGradient) {
  // One rank's AdamW fed the rank-order f32 sum of every rank's gradients: the run that the N
  // ranks split.
  Communicator& comm = world();
  Model sharded_model, one_model;
  ShardedAdamW sharded(sharded_model.params, config(0), comm);
  AdamW one(one_model.params, config(0));
  for (int64_t s = 0; s < 3; ++s) {
    ModelParameters g = gradient_of(comm.rank(), s, 0.01f);
    ModelParameters sum = summed_gradient(comm.size(), s, 0.01f);
    sharded.step(sharded_model.params, g, sharded_model.copies());
    one.step(one_model.params, sum, one_model.copies());
  }
  EXPECT_EQ(first_difference(bytes_of(sharded_model), bytes_of(one_model)), "");
}

TEST(ShardedAdamW, GradientsReducedGroupByGroupSumInTheShard) {
  // Two micro-batches a step, each reduce-scattered in three groups of tensors as a backward
  // reports them (reduce_scatter_now, small buckets): the shard holds (Σ_r g1_r) + (Σ_r g2_r), so
  // one AdamW fed that sum, in that order, ends with the same bits; each group's gradients are
  // zeroed once reduced.
  Communicator& comm = world();
  const int n = comm.size();
  Model sharded_model, one_model;
  ShardedAdamW sharded(sharded_model.params, config(0), comm, 776);
  AdamW one(one_model.params, config(0));
  ModelParameters zeros = model_shapes();
  zeros.zero();
  std::vector<std::vector<std::string>> groups(3);
  size_t k = 0;
  model_shapes().for_each([&](const std::string& name, const Tensor&) { groups[k++ % 3].push_back(name); });
  for (int64_t s = 0; s < 3; ++s) {
    for (int64_t micro = 0; micro < 2; ++micro) {
      ModelParameters g = gradient_of(comm.rank(), 2 * s + micro, 0.01f);
      for (const std::vector<std::string>& group : groups) sharded.reduce_scatter_now(g, group);
      EXPECT_EQ(first_difference(bytes_of(g), bytes_of(zeros)), "")
          << "the reduced gradients are zeroed";
    }
    ModelParameters none = zeros.copy_to(Device::cpu);
    ASSERT_TRUE(sharded.step(sharded_model.params, none, sharded_model.copies()).applied);
    ModelParameters sum = summed_gradient(n, 2 * s, 0.01f), second = summed_gradient(n, 2 * s + 1, 0.01f);
    std::vector<Tensor*> seconds;
    second.for_each([&](const std::string&, Tensor& t) { seconds.push_back(&t); });
    size_t i = 0;
    sum.for_each([&](const std::string&, Tensor& t) {
      for (int64_t e = 0; e < t.numel(); ++e) t.data_as<float>()[e] += seconds[i]->data_as<float>()[e];
      ++i;
    });
    one.step(one_model.params, sum, one_model.copies());
  }
  EXPECT_EQ(first_difference(bytes_of(sharded_model), bytes_of(one_model)), "");
  EXPECT_NE(first_difference(bytes_of(sharded_model.params), bytes_of(filled(7, 0.5f))), "");
}

TEST(ShardedAdamW, MomentsContinueAcrossRankCounts) {
  // N → 1: the moments gathered from N sharded ranks after two steps, loaded into one rank's
  // AdamW, take the third step as the N ranks do. 1 → N: a one-rank AdamW's moments after two
  // steps, loaded into N sharded ranks, take the third as the one rank does.
  Communicator& comm = world();
  const int n = comm.size();
  Model sharded_model, one_model;
  ShardedAdamW sharded(sharded_model.params, config(0), comm);
  AdamW one(one_model.params, config(0));
  for (int64_t s = 0; s < 2; ++s) {
    ModelParameters g = gradient_of(comm.rank(), s, 0.01f), sum = summed_gradient(n, s, 0.01f);
    sharded.step(sharded_model.params, g, sharded_model.copies());
    one.step(one_model.params, sum, one_model.copies());
  }
  const DataParallelOptimizer::Moments saved_by_n = sharded.full_moments(sharded_model.params);

  // N → 1, then the N ranks' own third step.
  Model resumed_one;
  resumed_one.params = sharded_model.params.copy_to(Device::cpu);
  ReplicatedAdamW alone(resumed_one.params, config(0), single_rank());
  alone.load_state(saved_by_n.m, saved_by_n.v, sharded.steps());
  ModelParameters sum = summed_gradient(n, 2, 0.01f);
  alone.step(resumed_one.params, sum, resumed_one.copies());
  ModelParameters g = gradient_of(comm.rank(), 2, 0.01f);
  sharded.step(sharded_model.params, g, sharded_model.copies());
  EXPECT_EQ(first_difference(bytes_of(resumed_one), bytes_of(sharded_model)), "") << "N → 1";

  // 1 → N, then the one rank's own third step.
  Model resumed_n;
  resumed_n.params = one_model.params.copy_to(Device::cpu);
  ShardedAdamW continued(resumed_n.params, config(0), comm, 500);
  continued.load_state(one.first_moment(), one.second_moment(), one.steps());
  ModelParameters g2 = gradient_of(comm.rank(), 2, 0.01f), sum2 = summed_gradient(n, 2, 0.01f);
  continued.step(resumed_n.params, g2, resumed_n.copies());
  one.step(one_model.params, sum2, one_model.copies());
  EXPECT_EQ(first_difference(bytes_of(resumed_n), bytes_of(one_model)), "") << "1 → N";
  EXPECT_EQ(continued.steps(), 3);
}

TEST(ShardedAdamW, NonFiniteGradientOnOneRankSkipsEverywhere) {
  Communicator& comm = world();
  Model model;
  const std::vector<unsigned char> before = bytes_of(model.params);
  ShardedAdamW opt(model.params, config(1), comm);
  ModelParameters g = gradient_of(comm.rank(), 0, 0.01f);
  if (comm.rank() == comm.size() - 1) g.layers[0].o.data_as<float>()[5] = NAN;
  const OptimizerStep s = opt.step(model.params, g, model.copies());
  EXPECT_FALSE(s.applied);
  EXPECT_EQ(s.nonfinite_grad, "layers.0.o");
  EXPECT_FALSE(std::isfinite(s.grad_norm));
  EXPECT_EQ(opt.steps(), 0);
  EXPECT_EQ(first_difference(bytes_of(model.params), before), "");
  EXPECT_EQ(g.layers[0].o.data_as<float>()[5], 0.0f) << "the gradients are zeroed after a skip";
}

TEST(ShardedAdamW, MismatchedTensorsAreClearErrors) {
  Communicator& comm = world();
  Model model;
  ShardedAdamW opt(model.params, config(1), comm);
  ModelParameters g = gradient_of(comm.rank(), 0, 0.01f);
  g.layers[0].o = Tensor::zeros({32, 31}, DType::f32);
  try {
    opt.step(model.params, g, model.copies());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ShardedAdamW: grads tensor 3 is layers.0.o f32[32, 31] on cpu, expected layers.0.o f32[32, 32]"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep
