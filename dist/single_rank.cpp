// dist/single_rank.cpp
#include "dist/single_rank.h"

#include <cstdio>
#include <cstdlib>

namespace lockstep {

void SingleRankCommunicator::all_reduce_sum(Tensor& t, CommStream) { check_all_reduce(*this, t); }

void SingleRankCommunicator::all_gather(const Tensor& shard, Tensor& full, CommStream) {
  check_all_gather(*this, shard, full);
  full.copy_from(shard);
}

void SingleRankCommunicator::reduce_scatter_sum(const Tensor& full, Tensor& shard, CommStream) {
  check_reduce_scatter(*this, full, shard);
  shard.copy_from(full);
}

void SingleRankCommunicator::broadcast(Tensor& t, int root, CommStream) { check_broadcast(*this, t, root); }

void SingleRankCommunicator::all_to_all(const Tensor& send, std::span<const int64_t> send_rows,
                                        Tensor& recv, std::span<const int64_t> recv_rows, CommStream) {
  check_all_to_all(*this, send, send_rows, recv, recv_rows);
  recv.copy_from(send);
}

void SingleRankCommunicator::abort(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::exit(exit_code);
}

Communicator& single_rank() {
  static SingleRankCommunicator communicator;
  return communicator;
}

}  // namespace lockstep
