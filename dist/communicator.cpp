// dist/communicator.cpp
#include "dist/communicator.h"

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

}  // namespace lockstep
