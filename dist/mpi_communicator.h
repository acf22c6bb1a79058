// dist/mpi_communicator.h — the communicator of a run launched by mpirun (dist/world.h): MPI's
// world for CPU tensors; CUDA tensors through NCCL (dist/nccl_group.h) when the build has it, else
// copied through the host and MPI.
//
// CPU collectives move bytes with MPI (MPI_Allgather, MPI_Alltoall(v), MPI_Bcast) and sum here, in
// rank order, so that every rank gets the same bits every run (MPI_Allreduce promises neither).
// They are meant for gradients and metrics of CPU runs, moved in pieces of at most kPieceBytes
// per rank (a sum holds size × piece bytes at once).
//
// Bounded waits: a watchdog thread ends the process when one collective has waited longer than
// `timeout_seconds` (LOCKSTEP_DIST_TIMEOUT_S) for the other ranks, with an error naming this rank
// and the collective; mpirun then ends the other ranks and says which one exited. A rank that dies
// or calls abort() is reported by mpirun, which ends the others at once.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace lockstep {

class MpiCommunicator final : public Communicator {
 public:
  // Initializes MPI; the process must have been started by mpirun (dist/world.h checks).
  explicit MpiCommunicator(double timeout_seconds);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  void all_reduce_sum(Tensor& t, CommStream stream = {}) override;
  void all_gather(const Tensor& shard, Tensor& full, CommStream stream = {}) override;
  void reduce_scatter_sum(const Tensor& full, Tensor& shard, CommStream stream = {}) override;
  void broadcast(Tensor& t, int root, CommStream stream = {}) override;
  void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                  std::span<const int64_t> recv_rows, CommStream stream = {}) override;
  void barrier() override;
  double collective_seconds() override;
  [[noreturn]] void abort(int exit_code) override;

  static constexpr size_t kPieceBytes = size_t(64) << 20;

 private:
  struct Watchdog;
  struct Device;
  void host_all_reduce(Tensor& t);
  void host_all_gather(const Tensor& shard, Tensor& full);
  void host_reduce_scatter(const Tensor& full, Tensor& shard);
  void host_broadcast(Tensor& t, int root);
  void host_all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                       std::span<const int64_t> recv_rows);
  // A CUDA tensor's collective: NCCL, or through the host.
  Device& device();

  int rank_ = 0, size_ = 1, local_rank_ = 0;
  double timeout_seconds_ = 0;
  double host_seconds_ = 0;  // in collectives on CPU tensors
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<Device> device_;
};

}  // namespace lockstep
