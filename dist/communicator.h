// dist/communicator.h — the ranks of a data-parallel run and the collectives between them.
//
// A run on N GPUs (or N CPU ranks) is N processes, each driving one device; every rank runs the
// same program and calls the same collectives in the same order, with tensors of the same shapes
// and dtypes. A collective on CPU tensors returns when it is done; one on CUDA tensors is queued on
// `stream` (CommStream) and its result is there for the work queued after it on that stream, so
// that a later sharded trainer can run the per-layer all-gathers and reduce-scatters on streams of
// their own beside the compute.
//
// Sums are elementwise, in fp32 for f32 tensors and fp64 for f64 ones. On the CPU they run in rank
// order, ((t₀ + t₁) + t₂) + …, on every rank: every rank gets the same bits, every run. (On CUDA
// tensors NCCL chooses the order; each rank still gets the same bits.)
//
// Implementations: dist/single_rank.h (one process, no MPI: every collective is a copy or
// nothing), dist/mpi_communicator.h (MPI for CPU tensors, NCCL for CUDA tensors). dist/world.h
// picks one for this process.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace lockstep {

// The CUDA stream a collective on CUDA tensors is queued on: a cudaStream_t, nullptr for the
// current stream (core/cuda_stream.h). Collectives on CPU tensors ignore it.
struct CommStream {
  void* cuda = nullptr;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This rank's index among the ranks on its host: the GPU it drives.
  virtual int local_rank() const = 0;
  bool is_main() const { return rank() == 0; }
  // "rank 2 of 4" (for messages).
  std::string describe() const;

  // t (f32 or f64, the same shape on every rank) becomes, on every rank, the elementwise sum of
  // every rank's t.
  virtual void all_reduce_sum(Tensor& t, CommStream stream = {}) = 0;
  // full [size·n, ...] gets every rank's shard [n, ...] (any dtype), rank r's at rows r·n.. .
  virtual void all_gather(const Tensor& shard, Tensor& full, CommStream stream = {}) = 0;
  // shard [n, ...] gets rows rank·n.. of the elementwise sum of every rank's full [size·n, ...]
  // (f32 or f64): the gradient shard a rank keeps.
  virtual void reduce_scatter_sum(const Tensor& full, Tensor& shard, CommStream stream = {}) = 0;
  // t gets rank `root`'s bytes on every rank (any dtype).
  virtual void broadcast(Tensor& t, int root, CommStream stream = {}) = 0;
  // Rows to and from every rank (any dtype; send and recv [rows, ...] with the same row shape):
  // rank r sends send's rows [Σ_{p<q} send_rows[p], +send_rows[q]) to rank q, and recv's rows
  // [Σ_{p<q} recv_rows[p], +recv_rows[q]) get rank q's rows for r. send_rows and recv_rows have
  // size() counts summing to send's and recv's rows; recv_rows[q] on rank r must be send_rows[r] on
  // rank q (exchange_row_counts gives it). The expert-parallel token dispatch (rows to the rank
  // that owns their expert, and the results back).
  virtual void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                          std::span<const int64_t> recv_rows, CommStream stream = {}) = 0;
  // Returns when every rank has called it.
  virtual void barrier() = 0;
  // Seconds this rank has spent in collectives so far: the GPU time of those on CUDA tensors
  // (between CUDA events around each, counted once finished: after a device synchronization, all),
  // the wall time of those on CPU tensors. Waiting for the other ranks counts. 0 on one rank.
  virtual double collective_seconds() { return 0; }
  // Ends every rank's process with `exit_code` (after this rank's error was printed); the launcher
  // reports which rank did it. One rank: exits this process.
  [[noreturn]] virtual void abort(int exit_code) = 0;
};

// The argument checks every implementation makes (one error naming the collective, the tensor and
// what was expected).
void check_all_reduce(const Communicator& c, const Tensor& t);
void check_all_gather(const Communicator& c, const Tensor& shard, const Tensor& full);
void check_reduce_scatter(const Communicator& c, const Tensor& full, const Tensor& shard);
void check_broadcast(const Communicator& c, const Tensor& t, int root);
void check_all_to_all(const Communicator& c, const Tensor& send, std::span<const int64_t> send_rows,
                      const Tensor& recv, std::span<const int64_t> recv_rows);
// Bytes of one row of t [rows, ...] (from its shape: also when it has no rows).
size_t row_bytes(const Tensor& t);

// recv_rows of all_to_all from this rank's send_rows (size() counts): element q becomes rank q's
// send_rows[rank()]. A collective on host values (an all_to_all of one i64 per pair of ranks).
std::vector<int64_t> exchange_row_counts(Communicator& c, std::span<const int64_t> send_rows);

}  // namespace lockstep
