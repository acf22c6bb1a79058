// dist/nccl_group.h — NCCL's collectives on CUDA tensors, for MpiCommunicator (built when CUDA and
// NCCL are found: the nvidia-nccl-cu13 wheel that scripts/setup.sh installs into .deps/, or a
// system NCCL). The unique id comes from rank 0 through MPI (dist/mpi_communicator.cpp).
//
// Bounded waits: the communicator is made non-blocking (ncclConfig_t::blocking = 0), so its setup
// and every enqueue return at once and are polled (ncclCommGetAsyncError) against a deadline; a
// watchdog thread then follows each collective on the GPU (a CUDA event recorded after it) and,
// when one has not finished `timeout_seconds` after it was queued or NCCL reports an error (a peer
// that died: NCCL sees its connection close), prints an error naming this rank and the collective,
// aborts the NCCL communicator and ends the process; mpirun ends the others.
//
// Sums of f32 and f64; all-gather, broadcast and all-to-all (ncclSend/ncclRecv pairs in one group)
// move bytes of any dtype. Collectives are queued on
// the given stream (nullptr: the current stream, core/cuda_stream.h) and return without waiting.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/tensor.h"

namespace lockstep {

class NcclGroup {
 public:
  struct Id {
    char bytes[128];  // ncclUniqueId (NCCL_UNIQUE_ID_BYTES)
  };
  // Made by one rank (rank 0) and given to every rank.
  static Id make_id();

  // Joins the group of `size` ranks on the current CUDA device; an error naming this rank when the
  // others do not join within `timeout_seconds`.
  NcclGroup(const Id& id, int rank, int size, double timeout_seconds);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  void all_reduce_sum(Tensor& t, void* stream);
  void all_gather(const Tensor& shard, Tensor& full, void* stream);
  void reduce_scatter_sum(const Tensor& full, Tensor& shard, void* stream);
  void broadcast(Tensor& t, int root, void* stream);
  // dist/communicator.h's all_to_all (its checks made).
  void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                  std::span<const int64_t> recv_rows, void* stream);
  // The GPU time of the collectives finished so far (between CUDA events recorded around each on
  // its stream: the time the stream spent in them, waiting for the other ranks included).
  double finished_seconds();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep
