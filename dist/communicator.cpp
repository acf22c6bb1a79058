// dist/communicator.cpp
#include "dist/communicator.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"

namespace lockstep {

namespace {

void check_defined(const Tensor& t, const char* collective, const char* what) {
  LOCKSTEP_CHECK(t.defined(), collective, ": ", what, " is undefined");
}

void check_summable(const Tensor& t, const char* collective, const char* what) {
  LOCKSTEP_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, collective, ": ", what,
                 " is ", t.describe(), "; sums take f32 or f64");
}

// `full` is `size` shards stacked along the first dimension.
void check_stacked(const Communicator& c, const Tensor& shard, const Tensor& full,
                   const char* collective) {
  LOCKSTEP_CHECK(shard.dtype() == full.dtype() && shard.device() == full.device(), collective,
                 ": shard ", shard.describe(), " and full ", full.describe(),
                 " differ in dtype or device");
  Shape expected = shard.shape();
  LOCKSTEP_CHECK(!expected.empty(), collective, ": shard ", shard.describe(),
                 " has no first dimension to stack along");
  expected[0] *= c.size();
  LOCKSTEP_CHECK(full.shape() == expected, collective, ": full is ", full.describe(), ", expected ",
                 shape_string(expected), " (", c.size(), " ranks × shard ",
                 shape_string(shard.shape()), ")");
}

}  // namespace

std::string Communicator::describe() const {
  return "rank " + std::to_string(rank()) + " of " + std::to_string(size());
}

void check_all_reduce(const Communicator&, const Tensor& t) {
  check_defined(t, "all_reduce_sum", "the tensor");
  check_summable(t, "all_reduce_sum", "the tensor");
}

void check_all_gather(const Communicator& c, const Tensor& shard, const Tensor& full) {
  check_defined(shard, "all_gather", "shard");
  check_defined(full, "all_gather", "full");
  check_stacked(c, shard, full, "all_gather");
}

void check_reduce_scatter(const Communicator& c, const Tensor& full, const Tensor& shard) {
  check_defined(full, "reduce_scatter_sum", "full");
  check_defined(shard, "reduce_scatter_sum", "shard");
  check_summable(full, "reduce_scatter_sum", "full");
  check_stacked(c, shard, full, "reduce_scatter_sum");
}

void check_broadcast(const Communicator& c, const Tensor& t, int root) {
  check_defined(t, "broadcast", "the tensor");
  LOCKSTEP_CHECK(root >= 0 && root < c.size(), "broadcast: root ", root, " is not a rank (",
                 c.size(), " ranks)");
}

void check_all_to_all(const Communicator& c, const Tensor& send, std::span<const int64_t> send_rows,
                      const Tensor& recv, std::span<const int64_t> recv_rows) {
  check_defined(send, "all_to_all", "send");
  check_defined(recv, "all_to_all", "recv");
  LOCKSTEP_CHECK(send.dtype() == recv.dtype() && send.device() == recv.device() &&
                     send.shape().size() == recv.shape().size() && !send.shape().empty() &&
                     std::equal(send.shape().begin() + 1, send.shape().end(), recv.shape().begin() + 1),
                 "all_to_all: send ", send.describe(), " and recv ", recv.describe(),
                 " differ in dtype, device or row shape");
  for (auto [counts, t, what] : {std::tuple{send_rows, &send, "send"}, std::tuple{recv_rows, &recv, "recv"}}) {
    LOCKSTEP_CHECK(counts.size() == size_t(c.size()), "all_to_all: ", what, "_rows has ", counts.size(),
                   " counts, expected one per rank (", c.size(), ")");
    int64_t total = 0;
    for (size_t q = 0; q < counts.size(); ++q) {
      LOCKSTEP_CHECK(counts[q] >= 0, "all_to_all: ", what, "_rows[", q, "] is ", counts[q]);
      total += counts[q];
    }
    LOCKSTEP_CHECK(total == t->dim(0), "all_to_all: ", what, "_rows sum to ", total, ", ", what,
                   " is ", t->describe());
  }
}

size_t row_bytes(const Tensor& t) {
  size_t n = dtype_size(t.dtype());
  for (size_t d = 1; d < t.shape().size(); ++d) n *= size_t(t.shape()[d]);
  return n;
}

std::vector<int64_t> exchange_row_counts(Communicator& c, std::span<const int64_t> send_rows) {
  LOCKSTEP_CHECK(send_rows.size() == size_t(c.size()), "exchange_row_counts: ", send_rows.size(),
                 " counts, expected one per rank (", c.size(), ")");
  Tensor send = Tensor::empty({c.size()}, DType::i64), recv = Tensor::empty({c.size()}, DType::i64);
  std::copy(send_rows.begin(), send_rows.end(), send.data_as<int64_t>());
  const std::vector<int64_t> ones(size_t(c.size()), 1);
  c.all_to_all(send, ones, recv, ones);
  return std::vector<int64_t>(recv.data_as<int64_t>(), recv.data_as<int64_t>() + c.size());
}

}  // namespace lockstep
