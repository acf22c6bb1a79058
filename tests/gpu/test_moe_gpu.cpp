// The sparse layer's ops on the GPU against their CPU references (ops/moe_route.h,
// ops/moe_combine.h): the router's softmax, top-k and renormalized weights with their backward
// (with the router z-loss's term), its logsumexp, the weights of replayed experts, and the
// weighted combine of expert rows with its backward. The CUDA kernels make the CPU's
// operations in the CPU's order, but with expf and (possibly) fused multiply-adds: values within a
// few fp32 roundings, the same experts chosen (random logits have no near-ties).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "ops/moe_combine.h"
#include "ops/moe_dispatch.h"
#include "ops/moe_route.h"
#include "tests/test_util.h"

namespace lockstep::testing {
namespace {

struct Route {
  Tensor probs, ids, weights, dlogits, lse, replay_weights;
};

// The backward adds the z-loss's term (z_scale 0.3); replay_weights are those of each token's
// experts shifted by one (id + 1 mod E: not the router's own choice).
Route route(Device d, const Tensor& logits, const Tensor& dweights, const Tensor& dprobs, int64_t k,
            bool normalize) {
  const int64_t T = logits.dim(0), E = logits.dim(1);
  Route r{Tensor::empty({T, E}, DType::f32, d), Tensor::empty({T, k}, DType::i32, d),
          Tensor::empty({T, k}, DType::f32, d), Tensor::empty({T, E}, logits.dtype(), d),
          Tensor::empty({T}, DType::f32, d),    Tensor::empty({T, k}, DType::f32, d)};
  moe_route_forward(r.probs, r.ids, r.weights, logits.to(d), normalize, &r.lse);
  moe_route_backward(r.dlogits, dweights.to(d), dprobs.to(d), r.probs, r.ids, r.weights, normalize, r.lse, 0.3f);
  Tensor shifted = r.ids.to(Device::cpu);
  for (int64_t i = 0; i < shifted.numel(); ++i)
    shifted.data_as<int32_t>()[i] = int32_t((shifted.data_as<int32_t>()[i] + 1) % E);
  moe_route_weights(r.replay_weights, r.probs, shifted.to(d), normalize);
  for (Tensor* t : {&r.probs, &r.ids, &r.weights, &r.dlogits, &r.lse, &r.replay_weights}) *t = t->to(Device::cpu);
  return r;
}

TEST(MoeGpu, RouteMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16})
    for (auto [E, k] : {std::pair<int64_t, int64_t>{8, 2}, {128, 8}, {8, 8}})
      for (bool normalize : {true, false}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " E " << E << " k " << k
                                        << " normalize " << normalize);
        const int64_t T = 333;
        const Tensor logits = random_tensor({T, E}, dtype, 1);
        const Tensor dweights = random_tensor({T, k}, DType::f32, 2);
        const Tensor dprobs = random_tensor({T, E}, DType::f32, 3);
        const Route cpu = route(Device::cpu, logits, dweights, dprobs, k, normalize);
        const Route gpu = route(Device::cuda, logits, dweights, dprobs, k, normalize);
        EXPECT_EQ(0, std::memcmp(cpu.ids.data(), gpu.ids.data(), cpu.ids.nbytes()));
        EXPECT_LE(rel_error(to_double(gpu.probs), to_double(cpu.probs)), 1e-6);
        EXPECT_LE(rel_error(to_double(gpu.weights), to_double(cpu.weights)), 1e-6);
        EXPECT_LE(rel_error(to_double(gpu.replay_weights), to_double(cpu.replay_weights)), 1e-6);
        EXPECT_LE(rel_error(to_double(gpu.lse), to_double(cpu.lse)), 1e-6);
        // bf16 dlogits: one rounding of values within fp32 noise of each other.
        EXPECT_LE(rel_error(to_double(gpu.dlogits), to_double(cpu.dlogits)),
                  dtype == DType::f32 ? 1e-5 : 4e-3);
      }
}

// Each token's k distinct experts of E; with `skewed`, most tokens pick from the first 2k experts.
Tensor random_routing(int64_t T, int64_t E, int64_t k, bool skewed, uint64_t seed) {
  std::mt19937 rng{uint32_t(seed)};
  Tensor ids = Tensor::empty({T, k}, DType::i32);
  std::vector<int32_t> experts(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    const int64_t pool = skewed && rng() % 4 != 0 ? std::min(E, 2 * k) : E;
    std::shuffle(experts.begin(), experts.begin() + pool, rng);
    std::copy_n(experts.begin(), k, ids.data_as<int32_t>() + t * k);
  }
  return ids;
}

TEST(MoeGpu, DispatchMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  // Decode sizes (one pass of the kernel's 1,024 rows, or a few), a prefill chunk, no tokens.
  for (auto [T, E, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 128, 8}, {3, 8, 2}, {256, 128, 8},
                         {1500, 128, 8}, {700, 8, 8}, {0, 16, 2}})
    for (bool skewed : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "T " << T << " E " << E << " k " << k << " skewed " << skewed);
      const Tensor ids = random_routing(T, E, k, skewed, uint64_t(T + E + k + skewed));
      std::vector<Tensor> outs;
      for (Device d : {Device::cpu, Device::cuda}) {
        Tensor offsets = Tensor::empty({E + 1}, DType::i64, d), token_of_row = Tensor::empty({T * k}, DType::i32, d);
        Tensor slots = Tensor::empty({T, k}, DType::i32, d);
        if (d == Device::cuda) {
          token_of_row.fill_bytes(0xff);
          slots.fill_bytes(0xff);
        }
        moe_dispatch(offsets, token_of_row, slots, ids.to(d));
        for (const Tensor* t : {&offsets, &token_of_row, &slots}) outs.push_back(t->to(Device::cpu));
      }
      EXPECT_TRUE(same_bytes(outs[3], outs[0])) << "offsets";
      EXPECT_TRUE(same_bytes(outs[4], outs[1])) << "token_of_row";
      EXPECT_TRUE(same_bytes(outs[5], outs[2])) << "slots";
    }
}

TEST(MoeGpu, CombineMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const int64_t T = 257, k = 4, H = 136, R = T * k;
  std::vector<int32_t> perm(static_cast<size_t>(R));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  Tensor slots = Tensor::empty({T, k}, DType::i32);
  std::copy(perm.begin(), perm.end(), slots.data_as<int32_t>());
  const Tensor rows = random_tensor({R, H}, DType::bf16, 4);
  const Tensor dout = random_tensor({T, H}, DType::bf16, 5);
  const Tensor weights = random_tensor({T, k}, DType::f32, 6);
  for (bool weighted : {true, false}) {
    SCOPED_TRACE(weighted ? "weighted" : "plain sum");
    std::vector<Tensor> outs;
    for (Device d : {Device::cpu, Device::cuda}) {
      const Tensor w = weighted ? weights.to(d) : Tensor();
      Tensor out = Tensor::empty({T, H}, DType::bf16, d);
      Tensor drows = Tensor::empty({R, H}, DType::bf16, d);
      Tensor dweights = weighted ? Tensor::empty({T, k}, DType::f32, d) : Tensor();
      moe_combine_forward(out, rows.to(d), slots.to(d), w);
      moe_combine_backward(drows, dweights, dout.to(d), rows.to(d), slots.to(d), w);
      outs.push_back(out.to(Device::cpu));
      outs.push_back(drows.to(Device::cpu));
      if (weighted) outs.push_back(dweights.to(Device::cpu));
    }
    const size_t n = outs.size() / 2;
    // bf16 outputs: the same fp32 sum up to FMA contraction, then one bf16 rounding.
    EXPECT_LE(rel_error(to_double(outs[n]), to_double(outs[0])), 4e-3) << "out";
    EXPECT_LE(rel_error(to_double(outs[n + 1]), to_double(outs[1])), 4e-3) << "drows";
    if (weighted) {
      EXPECT_LE(rel_error(to_double(outs[n + 2]), to_double(outs[2])), 1e-5) << "dweights";
    }
  }
}

}  // namespace
}  // namespace lockstep::testing
