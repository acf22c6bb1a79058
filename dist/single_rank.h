// dist/single_rank.h — the communicator of a run in one process (no MPI, no NCCL): rank 0 of 1.
// all_reduce_sum and broadcast leave the tensor as it is; all_gather, reduce_scatter_sum and
// all_to_all copy (the sum over one rank is its own tensor; its rows go to itself). Every single-process path runs on it unchanged.
#pragma once

#include "dist/communicator.h"

namespace lockstep {

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  void all_reduce_sum(Tensor& t, CommStream stream = {}) override;
  void all_gather(const Tensor& shard, Tensor& full, CommStream stream = {}) override;
  void reduce_scatter_sum(const Tensor& full, Tensor& shard, CommStream stream = {}) override;
  void broadcast(Tensor& t, int root, CommStream stream = {}) override;
  void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                  std::span<const int64_t> recv_rows, CommStream stream = {}) override;
  void barrier() override {}
  [[noreturn]] void abort(int exit_code) override;
};

// A process-wide one-rank communicator: the default of every function that takes one.
Communicator& single_rank();

}  // namespace lockstep
