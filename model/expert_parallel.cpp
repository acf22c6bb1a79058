// model/expert_parallel.cpp
#include "model/expert_parallel.h"

#include "core/error.h"
#include "ops/embedding.h"

namespace lockstep {

namespace {

// out[i] = rows[index[i]] (the embedding lookup with rows as the table); none when empty.
Tensor reorder(const Tensor& rows, const Tensor& index) {
  Tensor out = Tensor::empty({index.dim(0), rows.dim(1)}, rows.dtype(), rows.device());
  if (index.dim(0) > 0) embedding_forward(out, index, rows);
  return out;
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

}  // namespace

void check_expert_parallel(int64_t num_experts, int ranks) {
  LOCKSTEP_CHECK(ranks >= 1 && num_experts % ranks == 0, "expert parallelism (optim.expert_parallel): ",
                 num_experts, " experts do not split evenly over ", ranks,
                 " ranks (each rank owns E / ranks whole experts: use a rank count that divides ",
                 num_experts, ")");
}

ExpertParallelRoute route_to_owners(const ExpertParallel& ep, const std::vector<int64_t>& dispatch_offsets,
                                    Device device) {
  const int64_t E = int64_t(dispatch_offsets.size()) - 1, n = ep.ranks;
  check_expert_parallel(E, ep.ranks);
  const int64_t m = ep.experts_per_rank(E), first = ep.first_expert(E);
  // Rows this rank sends to each expert, and so to each owner; the owner gets its experts' counts.
  Tensor sent = Tensor::empty({E}, DType::i64), got = Tensor::empty({E}, DType::i64);
  ExpertParallelRoute route;
  route.send_rows.assign(size_t(n), 0);
  for (int64_t e = 0; e < E; ++e) {
    sent.data_as<int64_t>()[e] = dispatch_offsets[size_t(e + 1)] - dispatch_offsets[size_t(e)];
    route.send_rows[size_t(e / m)] += sent.data_as<int64_t>()[e];
  }
  const std::vector<int64_t> per_rank(size_t(n), m);
  ep.all_to_all(sent, per_rank, got, per_rank);
  // got[q·m + j]: rows rank q sends to expert first + j.
  const int64_t* from = got.data_as<int64_t>();
  route.recv_rows.assign(size_t(n), 0);
  for (int64_t q = 0; q < n; ++q)
    for (int64_t j = 0; j < m; ++j) route.recv_rows[size_t(q)] += from[q * m + j];
  const int64_t received = sum(route.recv_rows);

  // Where each (source q, expert j) block starts in the received (source-major) rows.
  std::vector<int64_t> source_start(size_t(n * m));
  for (int64_t q = 0, at = 0; q < n; ++q)
    for (int64_t j = 0; j < m; ++j) {
      source_start[size_t(q * m + j)] = at;
      at += from[q * m + j];
    }
  route.offsets.assign(size_t(E + 1), 0);
  Tensor expert_major = Tensor::empty({received}, DType::i32), source_major = Tensor::empty({received}, DType::i32);
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    route.offsets[size_t(e)] = row;
    if (e >= first && e < first + m)
      for (int64_t q = 0; q < n; ++q)
        for (int64_t i = 0; i < from[q * m + (e - first)]; ++i, ++row) {
          const int64_t src = source_start[size_t(q * m + (e - first))] + i;
          expert_major.data_as<int32_t>()[row] = int32_t(src);
          source_major.data_as<int32_t>()[src] = int32_t(row);
        }
  }
  route.offsets[size_t(E)] = row;
  route.expert_major = device == Device::cpu ? expert_major : expert_major.to(device);
  route.source_major = device == Device::cpu ? source_major : source_major.to(device);
  return route;
}

Tensor send_to_owners(const ExpertParallel& ep, const ExpertParallelRoute& route, const Tensor& rows) {
  Tensor received = Tensor::empty({sum(route.recv_rows), rows.dim(1)}, rows.dtype(), rows.device());
  ep.all_to_all(rows, route.send_rows, received, route.recv_rows);
  return reorder(received, route.expert_major);
}

Tensor return_from_owners(const ExpertParallel& ep, const ExpertParallelRoute& route, const Tensor& rows) {
  const Tensor by_source = reorder(rows, route.source_major);
  Tensor back = Tensor::empty({sum(route.send_rows), rows.dim(1)}, rows.dtype(), rows.device());
  ep.all_to_all(by_source, route.recv_rows, back, route.send_rows);
  return back;
}

}  // namespace lockstep
