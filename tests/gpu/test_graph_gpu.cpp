// Early starts (core/early_start.h) and graph arenas (core/graph_arena.h) on the GPU: two fp8 linear
// layers in a row, h = q(x)·W1ᵀ and y = q(h)·W2ᵀ — quantize → small-T GEMM → quantize → small-T
// GEMM, the decode step's pattern — in an EarlyStartScope, eagerly and as a CUDA graph whose
// temporaries come from an arena, each layer against the CPU's on the same input. Each run
// overwrites the input in place: a kernel that read its input before the kernel that writes it had
// ended would see the previous run's values (or uninitialized memory on the first), off by ~100%.
#include <gtest/gtest.h>

#include <optional>

#include "core/cuda_graph.h"
#include "core/early_start.h"
#include "core/graph_arena.h"
#include "ops/gemm.h"
#include "tests/gpu/small_t_settings.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::random_tensor;
using testing::SmallTSettings;
using testing::to_double;
using testing::worst_row_error;

constexpr int64_t T = 16, K = 512, N1 = 768, N2 = 384;

Fp8Weight random_weight(int64_t rows, int64_t cols, uint64_t seed) {
  Fp8Weight w = Fp8Weight::empty(rows, cols, Device::cpu);
  quantize_weight(w, random_tensor({rows, cols}, DType::f32, seed));
  return w;
}

Fp8Weight to_device(const Fp8Weight& w) {
  auto blocks = [](const Fp8Blocks& b) { return Fp8Blocks{b.data.to(Device::cuda), b.scales.to(Device::cuda)}; };
  return {blocks(w.w), blocks(w.wt)};
}

// One fp8 linear layer on any device, out = q(in)·Wᵀ; the quantized input is a temporary allocated
// here, as the model's are.
void layer(Tensor& out, const Tensor& in, const Fp8Weight& w) {
  Fp8Rows q = Fp8Rows::empty(in.dim(0), in.dim(1), in.device());
  quantize_rows(q, in);
  gemm_fprop(out, q, w);
}

// Each layer against the CPU's on the GPU's input of that layer (the quantizations are bit-exact,
// the GEMMs within bf16 output rounding, as in tests/gpu/test_gemm_gpu.cpp): a stale input is off
// by ~100%.
constexpr double kTol = 2e-3;

class EarlyStartGpu : public ::testing::TestWithParam<bool> {};

TEST_P(EarlyStartGpu, KernelsSeeWhatTheKernelBeforeWrote) {
  LOCKSTEP_REQUIRE_GPU();
  const bool graphs = GetParam();
  const SmallTSettings small_t;  // the small-T kernel at every token count: the GEMM that starts early
  const Fp8Weight w1 = random_weight(N1, K, 1), w2 = random_weight(N2, N1, 2);
  const Fp8Weight g1 = to_device(w1), g2 = to_device(w2);
  const SideStream stream;
  const CurrentStream on(stream);
  Tensor x = Tensor::empty({T, K}, DType::bf16, Device::cuda), h = Tensor::empty({T, N1}, DType::bf16, Device::cuda);
  Tensor y = Tensor::empty({T, N2}, DType::bf16, Device::cuda);
  auto work = [&] {
    const EarlyStartScope early;
    layer(h, x, g1);
    layer(y, h, g2);
  };
  std::optional<GraphArena> arena;
  std::optional<CudaGraph> graph;
  if (graphs) {
    arena.emplace(size_t(1) << 20);
    graph = CudaGraph::capture(stream, [&] {
      const ArenaScope scope(*arena);
      work();
    });
    const CudaGraph::Summary s = graph->summary();
    EXPECT_EQ(s.kernels, 4u);
    EXPECT_EQ(s.memory_nodes, 0u);        // the temporaries came from the arena ...
    EXPECT_EQ(s.programmatic_edges, 3u);  // ... so every kernel after the first starts early
  }
  for (uint64_t run = 0; run < 6; ++run) {
    const Tensor xh = random_tensor({T, K}, DType::bf16, 10 + run, true);
    device_copy(x.data(), Device::cuda, xh.data(), Device::cpu, x.nbytes());  // the last run has ended
    if (graph) graph->launch();
    else work();
    stream.synchronize();
    const Tensor hg = h.to(Device::cpu);
    Tensor h_ref = Tensor::empty({T, N1}, DType::bf16, Device::cpu), y_ref = Tensor::empty({T, N2}, DType::bf16, Device::cpu);
    layer(h_ref, xh, w1);
    layer(y_ref, hg, w2);
    EXPECT_LE(worst_row_error(to_double(hg), to_double(h_ref), N1), kTol) << "h, run " << run;
    EXPECT_LE(worst_row_error(to_double(y), to_double(y_ref), N2), kTol) << "y, run " << run;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, EarlyStartGpu, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Graph" : "Eager");
                         });

// A capture that does not fit its arena throws GraphArena::Full and leaves the stream usable; a
// capture of the same work with room succeeds.
TEST(GraphArenaGpu, FullArenaFailsTheCaptureCleanly) {
  LOCKSTEP_REQUIRE_GPU();
  const SideStream stream;
  const CurrentStream on(stream);
  auto work = [] { Tensor t = Tensor::zeros({1024}, DType::f32, Device::cuda); };
  GraphArena small(1024);
  EXPECT_THROW(CudaGraph::capture(stream, [&] {
                 const ArenaScope scope(small);
                 work();
               }),
               GraphArena::Full);
  GraphArena room(size_t(1) << 16);
  const CudaGraph graph = CudaGraph::capture(stream, [&] {
    const ArenaScope scope(room);
    work();
  });
  graph.launch();
  stream.synchronize();
  EXPECT_EQ(graph.summary().memory_nodes, 0u);
  EXPECT_EQ(room.high_water(), 4096u);
}

}  // namespace
}  // namespace lockstep
