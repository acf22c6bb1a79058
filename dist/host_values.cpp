// dist/host_values.cpp
#include "dist/host_values.h"

#include <algorithm>
#include <cstring>

namespace lockstep {

namespace {

// One value from each rank, in rank order.
std::vector<double> one_per_rank(Communicator& comm, double value) {
  Tensor mine = Tensor::empty({1}, DType::f64), all = Tensor::empty({comm.size()}, DType::f64);
  *mine.data_as<double>() = value;
  comm.all_gather(mine, all);
  return std::vector<double>(all.data_as<double>(), all.data_as<double>() + comm.size());
}

template <class T>
std::vector<T> gather(Communicator& comm, std::span<const T> values) {
  if (comm.size() == 1) return std::vector<T>(values.begin(), values.end());
  const std::vector<double> counts = one_per_rank(comm, double(values.size()));
  const int64_t longest = int64_t(*std::max_element(counts.begin(), counts.end()));
  if (longest == 0) return {};
  // Every rank sends `longest` values (its own, then padding), as all_gather's equal shards.
  Tensor mine = Tensor::zeros({longest}, dtype_of<T>());
  Tensor all = Tensor::empty({comm.size() * longest}, dtype_of<T>());
  if (!values.empty()) std::memcpy(mine.data(), values.data(), values.size_bytes());
  comm.all_gather(mine, all);
  std::vector<T> out;
  for (int r = 0; r < comm.size(); ++r) {
    const T* part = all.data_as<T>() + r * longest;
    out.insert(out.end(), part, part + int64_t(counts[size_t(r)]));
  }
  return out;
}

}  // namespace

std::vector<double> sum_over_ranks(Communicator& comm, std::vector<double> values) {
  if (comm.size() == 1 || values.empty()) return values;
  Tensor t = Tensor::view_of(values.data(), {int64_t(values.size())}, DType::f64);
  comm.all_reduce_sum(t);
  return values;
}

double sum_over_ranks(Communicator& comm, double value) { return sum_over_ranks(comm, std::vector{value})[0]; }

double max_over_ranks(Communicator& comm, double value) {
  if (comm.size() == 1) return value;
  const std::vector<double> all = one_per_rank(comm, value);
  return *std::max_element(all.begin(), all.end());
}

bool any_rank(Communicator& comm, bool value) { return sum_over_ranks(comm, value ? 1.0 : 0.0) > 0; }

std::vector<double> gather_over_ranks(Communicator& comm, std::span<const double> values) {
  return gather(comm, values);
}

std::vector<float> gather_over_ranks(Communicator& comm, std::span<const float> values) {
  return gather(comm, values);
}

}  // namespace lockstep
