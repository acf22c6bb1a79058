// tests/dist/test_collectives.cpp — the communicator's collectives against sums written out by
// hand, run by CTest under `mpirun -np 2` and `-np 3` (tests/CMakeLists.txt), and alone (one rank).
// Every rank runs every test; the values depend on the rank, and each rank checks its own result.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "dist/host_values.h"
#include "dist/world.h"
#include "tests/dist/test_world.h"
#include "tests/test_util.h"

using namespace lockstep;

namespace {

using lockstep::testing::world;

// Rank r's element i of the test tensors.
float value_f32(int r, int64_t i) { return float(r + 1) * 0.1f + float(i) * 1.5f; }
double value_f64(int r, int64_t i) { return double(r + 1) / 3.0 + double(i) * 1e-3; }

template <class T>
std::vector<T> values(const Tensor& t) {
  return std::vector<T>(t.data_as<T>(), t.data_as<T>() + t.numel());
}

TEST(Collectives, RankAndSize) {
  Communicator& c = world();
  EXPECT_GE(c.size(), 1);
  EXPECT_GE(c.rank(), 0);
  EXPECT_LT(c.rank(), c.size());
  EXPECT_GE(c.local_rank(), 0);
  EXPECT_LE(c.local_rank(), c.rank());  // one host: local rank = rank
  if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(c.size(), std::atoi(n));
  }
}

TEST(Collectives, AllReduceSumF32InRankOrder) {
  Communicator& c = world();
  const int64_t n = 1000;
  Tensor t = Tensor::empty({10, n / 10}, DType::f32);
  for (int64_t i = 0; i < n; ++i) t.data_as<float>()[i] = value_f32(c.rank(), i);
  c.all_reduce_sum(t);
  for (int64_t i = 0; i < n; ++i) {
    float expected = value_f32(0, i);  // ((t₀ + t₁) + t₂): the order the contract promises
    for (int r = 1; r < c.size(); ++r) expected += value_f32(r, i);
    ASSERT_EQ(t.data_as<float>()[i], expected) << "element " << i;
  }
}

TEST(Collectives, AllReduceOrderIsRankOrder) {
  // Values whose f32 sum depends on the order: (1e8 + 1) − 1e8 = 0 in rank order (1e8 + 1 rounds
  // to 1e8), 1 in another.
  Communicator& c = world();
  if (c.size() < 3) GTEST_SKIP() << "needs 3 ranks";
  Tensor t = Tensor::empty({1}, DType::f32);
  const float mine[] = {1e8f, 1.0f, -1e8f};
  *t.data_as<float>() = c.rank() < 3 ? mine[c.rank()] : 0.0f;
  c.all_reduce_sum(t);
  EXPECT_EQ(*t.data_as<float>(), 0.0f);
}

TEST(Collectives, AllReduceSumF64) {
  Communicator& c = world();
  Tensor t = Tensor::empty({37}, DType::f64);
  for (int64_t i = 0; i < 37; ++i) t.data_as<double>()[i] = value_f64(c.rank(), i);
  c.all_reduce_sum(t);
  for (int64_t i = 0; i < 37; ++i) {
    double expected = value_f64(0, i);
    for (int r = 1; r < c.size(); ++r) expected += value_f64(r, i);
    ASSERT_EQ(t.data_as<double>()[i], expected) << "element " << i;
  }
}

TEST(Collectives, AllGatherStacksShardsInRankOrder) {
  Communicator& c = world();
  Tensor shard = Tensor::empty({2, 3}, DType::i32);
  for (int i = 0; i < 6; ++i) shard.data_as<int32_t>()[i] = 100 * c.rank() + i;
  Tensor full = Tensor::empty({2 * c.size(), 3}, DType::i32);
  c.all_gather(shard, full);
  for (int r = 0; r < c.size(); ++r)
    for (int i = 0; i < 6; ++i) ASSERT_EQ(full.data_as<int32_t>()[6 * r + i], 100 * r + i) << r << " " << i;
}

TEST(Collectives, ReduceScatterSumKeepsThisRanksRows) {
  Communicator& c = world();
  const int64_t n = 5;  // rows per shard
  Tensor full = Tensor::empty({n * c.size(), 2}, DType::f32);
  for (int64_t i = 0; i < full.numel(); ++i) full.data_as<float>()[i] = value_f32(c.rank(), i);
  Tensor shard = Tensor::empty({n, 2}, DType::f32);
  c.reduce_scatter_sum(full, shard);
  for (int64_t i = 0; i < shard.numel(); ++i) {
    const int64_t at = c.rank() * n * 2 + i;  // this rank's rows of the full tensor
    float expected = value_f32(0, at);
    for (int r = 1; r < c.size(); ++r) expected += value_f32(r, at);
    ASSERT_EQ(shard.data_as<float>()[i], expected) << "element " << i;
  }
}

TEST(Collectives, BroadcastFromTheLastRank) {
  Communicator& c = world();
  const int root = c.size() - 1;
  Tensor t = Tensor::empty({3, 7}, DType::bf16);
  for (int i = 0; i < 21; ++i) t.data_as<bf16>()[i] = bf16{uint16_t(1000 * c.rank() + i)};
  c.broadcast(t, root);
  for (int i = 0; i < 21; ++i) ASSERT_EQ(t.data_as<bf16>()[i].bits, uint16_t(1000 * root + i));
}

// Rows from r to q: (2r + q) mod 3 of them (some pairs none, r → q ≠ q → r), element (i, c) of
// the j-th row 1000·r + 100·q + 10·j + c.
int64_t rows_between(int r, int q) { return (2 * r + q) % 3; }
int32_t row_value(int r, int q, int64_t j, int c) { return 1000 * r + 100 * q + 10 * int32_t(j) + c; }

TEST(Collectives, AllToAllSendsEachRanksRowsToIt) {
  Communicator& c = world();
  const int me = c.rank(), n = c.size();
  std::vector<int64_t> send_rows, expected_recv;
  for (int q = 0; q < n; ++q) {
    send_rows.push_back(rows_between(me, q));
    expected_recv.push_back(rows_between(q, me));
  }
  const std::vector<int64_t> recv_rows = exchange_row_counts(c, send_rows);
  ASSERT_EQ(recv_rows, expected_recv);
  int64_t total_send = 0, total_recv = 0;
  for (int q = 0; q < n; ++q) total_send += send_rows[size_t(q)], total_recv += recv_rows[size_t(q)];
  Tensor send = Tensor::empty({total_send, 3}, DType::i32), recv = Tensor::empty({total_recv, 3}, DType::i32);
  recv.fill_bytes(0xFF);
  int32_t* out = send.data_as<int32_t>();
  for (int q = 0; q < n; ++q)
    for (int64_t j = 0; j < send_rows[size_t(q)]; ++j)
      for (int col = 0; col < 3; ++col) *out++ = row_value(me, q, j, col);
  c.all_to_all(send, send_rows, recv, recv_rows);
  const int32_t* in = recv.data_as<int32_t>();
  for (int q = 0; q < n; ++q)
    for (int64_t j = 0; j < recv_rows[size_t(q)]; ++j)
      for (int col = 0; col < 3; ++col)
        ASSERT_EQ(*in++, row_value(q, me, j, col)) << "from rank " << q << " row " << j << " col " << col;
}

TEST(Collectives, AllToAllWithARankThatSendsAndReceivesNothing) {
  // The last rank takes part in the collective with no rows either way; the others exchange.
  Communicator& c = world();
  const int me = c.rank(), last = c.size() - 1;
  std::vector<int64_t> send_rows;
  int64_t total = 0;
  for (int q = 0; q < c.size(); ++q) {
    send_rows.push_back(me != last && q != last ? me + q + 1 : 0);
    total += send_rows.back();
  }
  const std::vector<int64_t> recv_rows = exchange_row_counts(c, send_rows);
  int64_t total_recv = 0;
  for (int64_t r : recv_rows) total_recv += r;
  Tensor send = Tensor::empty({total, 2}, DType::f32), recv = Tensor::empty({total_recv, 2}, DType::f32);
  for (int64_t i = 0; i < send.numel(); ++i) send.data_as<float>()[i] = float(100 * me) + float(i);
  c.all_to_all(send, send_rows, recv, recv_rows);
  const float* in = recv.data_as<float>();
  for (int q = 0; q < c.size(); ++q) {
    ASSERT_EQ(recv_rows[size_t(q)], me != last && q != last ? me + q + 1 : 0);
    int64_t from = 0;  // where q's rows for this rank start in q's send
    for (int p = 0; p < me; ++p) from += p != last && q != last ? q + p + 1 : 0;
    for (int64_t j = 0; j < 2 * recv_rows[size_t(q)]; ++j)
      ASSERT_EQ(*in++, float(100 * q) + float(2 * from + j)) << "from rank " << q;
  }
}

TEST(Collectives, AllToAllWithNoRows) {
  Communicator& c = world();
  const std::vector<int64_t> none(size_t(c.size()), 0);
  EXPECT_EQ(exchange_row_counts(c, none), none);
  Tensor send = Tensor::empty({0, 4}, DType::bf16), recv = Tensor::empty({0, 4}, DType::bf16);
  c.all_to_all(send, none, recv, none);
  SUCCEED();
}

TEST(Collectives, BarrierReturns) {
  world().barrier();
  SUCCEED();
}

TEST(Collectives, HostValues) {
  Communicator& c = world();
  // Rank r holds r + 1 values r·10, r·10 + 1, ...: concatenated in rank order.
  std::vector<double> mine;
  for (int i = 0; i <= c.rank(); ++i) mine.push_back(10.0 * c.rank() + i);
  std::vector<double> expected;
  for (int r = 0; r < c.size(); ++r)
    for (int i = 0; i <= r; ++i) expected.push_back(10.0 * r + i);
  EXPECT_EQ(gather_over_ranks(c, std::span<const double>(mine)), expected);
  EXPECT_EQ(gather_over_ranks(c, std::span<const float>()), std::vector<float>());
  EXPECT_EQ(sum_over_ranks(c, double(c.rank() + 1)), double(c.size() * (c.size() + 1) / 2));
  EXPECT_EQ(max_over_ranks(c, double(c.rank())), double(c.size() - 1));
  EXPECT_EQ(any_rank(c, c.rank() == c.size() - 1), true);
  EXPECT_EQ(any_rank(c, false), false);
}

using lockstep::testing::expect_error;

// Checked before any rank communicates: every rank throws the same error.
TEST(Collectives, BadArgumentsAreClearErrors) {
  Communicator& c = world();
  Tensor ints = Tensor::empty({4}, DType::i32);
  expect_error([&] { c.all_reduce_sum(ints); }, "all_reduce_sum: the tensor is i32[4] on cpu; sums take f32 or f64");
  Tensor shard = Tensor::empty({2, 3}, DType::f32), wrong = Tensor::empty({2, 3 * c.size() + 1}, DType::f32);
  expect_error([&] { c.all_gather(shard, wrong); }, "all_gather: full is f32[2, " + std::to_string(3 * c.size() + 1));
  expect_error([&] { c.reduce_scatter_sum(wrong, shard); }, "reduce_scatter_sum: full is");
  expect_error([&] { c.broadcast(shard, c.size()); }, "broadcast: root " + std::to_string(c.size()) + " is not a rank");
  std::vector<int64_t> rows(size_t(c.size()), 0);
  rows[0] = 2;
  Tensor wide = Tensor::empty({2, 4}, DType::f32);
  expect_error([&] { c.all_to_all(shard, rows, wide, rows); }, "all_to_all: send f32[2, 3] on cpu and recv f32[2, 4] on cpu differ");
  expect_error([&] { c.all_to_all(shard, std::vector<int64_t>{2}, shard, std::vector<int64_t>(size_t(c.size() + 1), 0)); },
               c.size() == 1 ? "all_to_all: recv_rows has 2 counts, expected one per rank (1)" : "all_to_all: send_rows has 1 counts");
  rows[0] = 3;
  expect_error([&] { c.all_to_all(shard, rows, shard, rows); }, "all_to_all: send_rows sum to 3, send is f32[2, 3] on cpu");
  rows[0] = -1;
  expect_error([&] { c.all_to_all(shard, rows, shard, rows); }, "all_to_all: send_rows[0] is -1");
}

}  // namespace
