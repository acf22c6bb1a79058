// tests/gpu/test_collectives_gpu.cpp — the communicator's collectives on CUDA tensors (NCCL under
// mpirun: dist/nccl_group.h) against the CPU's: the same values through MPI on CPU tensors, or sums
// written out by hand. Run by CTest under `mpirun -np 2` and `-np 4` (tests/CMakeLists.txt), one GPU
// per rank (the rank's local rank); skipped without a GPU for every rank.
//
// NCCL sums in an order of its own, so the exact comparisons use values whose sums are exact in
// f32 in any order (small integers); random values are checked for the same bits on every rank and
// against a double-precision sum.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/device.h"
#include "tests/gpu/rank_gpu.h"

using namespace lockstep;

namespace {

using lockstep::testing::world;

// Rank r's element i: an integer below 2^11, so that a sum over ≤ 2^12 ranks is exact in f32.
float small_integer(int r, int64_t i) { return float((int64_t(r) * 7919 + i * 31) % 2048); }

Tensor host_f32(int64_t n, int r) {
  Tensor t = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) t.data_as<float>()[i] = small_integer(r, i);
  return t;
}

std::vector<float> floats(const Tensor& t) {
  const Tensor h = t.to(Device::cpu);
  return std::vector<float>(h.data_as<float>(), h.data_as<float>() + h.numel());
}

// 7 elements (less than a rank's share of anything), a few MB, and 48M elements (192 MB: NCCL
// splits it into many chunks and channels).
class CollectivesGpu : public ::testing::TestWithParam<int64_t> {};

TEST_P(CollectivesGpu, AllReduceSumEqualsTheCpuSum) {
  REQUIRE_RANK_GPU();
  Communicator& c = world();
  const int64_t n = GetParam();
  Tensor cpu = host_f32(n, c.rank());
  Tensor gpu = cpu.to(Device::cuda);
  c.all_reduce_sum(cpu);
  c.all_reduce_sum(gpu);
  const std::vector<float> got = floats(gpu);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[size_t(i)], cpu.data_as<float>()[i]) << "element " << i;
}

TEST_P(CollectivesGpu, ReduceScatterGivesEachRankItsRowsOfTheSum) {
  REQUIRE_RANK_GPU();
  Communicator& c = world();
  const int64_t n = GetParam();  // per rank
  const Tensor full = host_f32(n * c.size(), c.rank());
  Tensor shard = Tensor::empty({n}, DType::f32, Device::cuda);
  c.reduce_scatter_sum(full.to(Device::cuda), shard);
  const std::vector<float> got = floats(shard);
  for (int64_t i = 0; i < n; ++i) {
    float expected = 0;
    for (int r = 0; r < c.size(); ++r) expected += small_integer(r, c.rank() * n + i);
    ASSERT_EQ(got[size_t(i)], expected) << "element " << i;
  }
}

TEST_P(CollectivesGpu, AllGatherStacksTheRanksBytesAsTheCpuDoes) {
  REQUIRE_RANK_GPU();
  Communicator& c = world();
  const int64_t n = GetParam();
  // E4M3 bytes (the fp8 hand-over moves them), every byte value.
  Tensor shard = Tensor::empty({n}, DType::e4m3);
  for (int64_t i = 0; i < n; ++i)
    static_cast<uint8_t*>(shard.data())[i] = uint8_t((c.rank() * 101 + i * 13) & 0xff);
  Tensor cpu = Tensor::empty({n * c.size()}, DType::e4m3);
  Tensor gpu = Tensor::empty({n * c.size()}, DType::e4m3, Device::cuda);
  c.all_gather(shard, cpu);
  c.all_gather(shard.to(Device::cuda), gpu);
  const Tensor back = gpu.to(Device::cpu);
  ASSERT_EQ(std::memcmp(back.data(), cpu.data(), size_t(cpu.nbytes())), 0);
}

INSTANTIATE_TEST_SUITE_P(Sizes, CollectivesGpu, ::testing::Values(7, 1 << 20, 48 << 20));

TEST(CollectivesGpuOnce, RandomSumsHaveTheSameBitsOnEveryRank) {
  REQUIRE_RANK_GPU();
  Communicator& c = world();
  const int64_t n = 1 << 22;
  std::mt19937 rng(1234 + c.rank());
  std::normal_distribution<float> normal;
  Tensor t = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) t.data_as<float>()[i] = normal(rng);
  Tensor gpu = t.to(Device::cuda);
  c.all_reduce_sum(gpu);
  // Every rank's result, gathered on the CPU, bit for bit the same; and near the double sum.
  const Tensor mine = gpu.to(Device::cpu);
  Tensor all = Tensor::empty({n * c.size()}, DType::f32);
  c.all_gather(mine, all);
  for (int r = 1; r < c.size(); ++r)
    ASSERT_EQ(std::memcmp(all.data_as<float>() + r * n, all.data(), size_t(n) * 4), 0) << "rank " << r;
  std::vector<std::mt19937> rngs;
  std::vector<std::normal_distribution<float>> normals(size_t(c.size()));
  for (int r = 0; r < c.size(); ++r) rngs.emplace_back(1234 + r);
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0, magnitude = 0;
    for (int r = 0; r < c.size(); ++r) {
      const float v = normals[size_t(r)](rngs[size_t(r)]);
      sum += v;
      magnitude += std::fabs(v);
    }
    // f32 rounding of at most size − 1 additions: (size − 1) · 2⁻²⁴ of the magnitudes' sum.
    ASSERT_LE(std::fabs(mine.data_as<float>()[i] - sum), magnitude * (c.size() - 1) * 0x1p-24 + 1e-30)
        << "element " << i;
  }
}

TEST(CollectivesGpuOnce, BroadcastAndF64SumOnAStreamOfTheirOwn) {
  REQUIRE_RANK_GPU();
  Communicator& c = world();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const int root = c.size() - 1;
  Tensor b = Tensor::zeros({1000}, DType::f32);
  if (c.rank() == root)
    for (int64_t i = 0; i < 1000; ++i) b.data_as<float>()[i] = float(i) * 0.25f;
  Tensor b_gpu = b.to(Device::cuda);
  Tensor d = Tensor::empty({333}, DType::f64);
  for (int64_t i = 0; i < 333; ++i) d.data_as<double>()[i] = double(c.rank() + 1) * double(i);
  Tensor d_gpu = d.to(Device::cuda);
  device_synchronize();  // the uploads, queued on the legacy stream, before the side stream's work
  c.broadcast(b_gpu, root, CommStream{stream});
  c.all_reduce_sum(d_gpu, CommStream{stream});
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const std::vector<float> got = floats(b_gpu);
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(got[size_t(i)], float(i) * 0.25f);
  const Tensor sums = d_gpu.to(Device::cpu);
  const double ranks = c.size();
  for (int64_t i = 0; i < 333; ++i)
    ASSERT_EQ(sums.data_as<double>()[i], ranks * (ranks + 1) / 2 * double(i)) << "element " << i;
  cudaStreamDestroy(stream);
}

// The expert-parallel dispatch's shape: rows of 2048 bf16 (4 KB), from r to q a count that differs
// per pair (none for some, thousands for others), on a stream of their own; the same bytes as the
// CPU's all_to_all (MPI_Alltoallv) of the same rows.
TEST(CollectivesGpuOnce, AllToAllMovesTheSameRowsAsTheCpu) {
  REQUIRE_RANK_GPU();
  Communicator& c = world();
  const int me = c.rank(), n = c.size();
  const int64_t width = 2048;
  std::vector<int64_t> send_rows;
  int64_t total = 0;
  for (int q = 0; q < n; ++q) {
    send_rows.push_back((me * 3 + q) % 4 == 0 ? 0 : 1000 * ((me + 2 * q) % 5) + 17 * q + 1);
    total += send_rows.back();
  }
  const std::vector<int64_t> recv_rows = exchange_row_counts(c, send_rows);
  int64_t total_recv = 0;
  for (int64_t r : recv_rows) total_recv += r;
  Tensor send = Tensor::empty({total, width}, DType::bf16);
  for (int64_t i = 0; i < send.numel(); ++i)
    send.data_as<bf16>()[i] = bf16{uint16_t((me * 40503 + i * 7) & 0xffff)};
  Tensor cpu = Tensor::empty({total_recv, width}, DType::bf16);
  c.all_to_all(send, send_rows, cpu, recv_rows);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Tensor send_gpu = send.to(Device::cuda);
  Tensor gpu = Tensor::empty({total_recv, width}, DType::bf16, Device::cuda);
  gpu.fill_bytes(0xff);
  device_synchronize();  // the upload and the poison, queued on the legacy stream
  c.all_to_all(send_gpu, send_rows, gpu, recv_rows, CommStream{stream});
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const Tensor back = gpu.to(Device::cpu);
  ASSERT_EQ(std::memcmp(back.data(), cpu.data(), size_t(cpu.nbytes())), 0);
  cudaStreamDestroy(stream);
}

TEST(CollectivesGpuOnce, CollectiveSecondsCountTheGpuTimeOfFinishedCollectives) {
  REQUIRE_RANK_GPU();
  Communicator& c = world();
  if (c.size() == 1) GTEST_SKIP() << "one rank runs no collectives";
  Tensor t = Tensor::zeros({64 << 20}, DType::f32, Device::cuda);  // 256 MB
  device_synchronize();
  const double before = c.collective_seconds();
  for (int i = 0; i < 4; ++i) c.all_reduce_sum(t);
  device_synchronize();
  const double spent = c.collective_seconds() - before;
  // Four all-reduces of 256 MB take at least the time to read it once at 10 TB/s, and not the
  // seconds of a stuck counter.
  EXPECT_GT(spent, 4 * 256e6 / 10e12);
  EXPECT_LT(spent, 30.0);
  std::printf("rank %d: 4 all-reduces of 256 MB in %.2f ms of GPU time\n", c.rank(), spent * 1e3);
}

}  // namespace
