// dist/mpi_communicator.cpp
#include "dist/mpi_communicator.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#if LOCKSTEP_HAS_NCCL
#include "dist/nccl_group.h"
#endif

namespace lockstep {

namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, size_t(length));
}

void check_mpi(int code, int rank, const char* call) {
  LOCKSTEP_CHECK(code == MPI_SUCCESS, "rank ", rank, ": ", call, " failed: ", mpi_error(code));
}

// out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + …, parts `stride` elements apart.
template <class T>
void sum_in_rank_order(const T* parts, size_t stride, int ranks, T* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    T s = parts[i];
    for (int r = 1; r < ranks; ++r) s += parts[size_t(r) * stride + i];
    out[i] = s;
  }
}

void sum_parts(DType dtype, const char* parts, size_t stride, int ranks, void* out, size_t n) {
  if (dtype == DType::f32)
    sum_in_rank_order(reinterpret_cast<const float*>(parts), stride, ranks, static_cast<float*>(out), n);
  else
    sum_in_rank_order(reinterpret_cast<const double*>(parts), stride, ranks, static_cast<double*>(out), n);
}

}  // namespace

// Ends the process when one collective waits longer than the timeout (the header says why).
struct MpiCommunicator::Watchdog {
  Watchdog(int rank, double timeout_seconds) : rank_(rank), timeout_(timeout_seconds) {
    thread_ = std::thread([this] { watch(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  // Marks one collective's wait, from construction to destruction.
  class Wait {
   public:
    Wait(Watchdog& w, const char* what) : w_(w) {
      w_.what_.store(what);
      w_.since_ns_.store(Clock::now().time_since_epoch().count());
    }
    ~Wait() { w_.since_ns_.store(0); }

   private:
    Watchdog& w_;
  };

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; })) {
      const int64_t since = since_ns_.load();
      if (since == 0) continue;
      const double waited =
          std::chrono::duration<double>(Clock::now().time_since_epoch() - Clock::duration(since)).count();
      if (waited <= timeout_) continue;
      std::fflush(stdout);
      std::fprintf(stderr,
                   "[rank %d] lockstep: %s waited more than %g s for the other ranks "
                   "(LOCKSTEP_DIST_TIMEOUT_S): another rank hangs or has died\n",
                   rank_, what_.load(), timeout_);
      std::fflush(stderr);
      // Not MPI_Abort: MPI is called from the main thread only. mpirun sees this rank exit without
      // finalizing and ends the others.
      _exit(1);
    }
  }

  int rank_;
  double timeout_;
  std::atomic<int64_t> since_ns_{0};
  std::atomic<const char*> what_{""};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

namespace {

// Adds the wall time of its scope to `total`.
class HostTimer {
 public:
  explicit HostTimer(double& total) : total_(total), t0_(std::chrono::steady_clock::now()) {}
  ~HostTimer() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  double& total_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

// The path of CUDA tensors.
struct MpiCommunicator::Device {
#if LOCKSTEP_HAS_NCCL
  std::unique_ptr<NcclGroup> nccl;
#endif
};

MpiCommunicator::MpiCommunicator(double timeout_seconds) : timeout_seconds_(timeout_seconds) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // The watchdog thread makes no MPI calls: only the main thread does.
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), -1, "MPI_Init_thread");
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm host;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host),
            rank_, "MPI_Comm_split_type");
  MPI_Comm_rank(host, &local_rank_);
  MPI_Comm_free(&host);
  watchdog_ = std::make_unique<Watchdog>(rank_, timeout_seconds_);
  device_ = std::make_unique<Device>();
}

MpiCommunicator::~MpiCommunicator() {
  device_.reset();
  watchdog_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void MpiCommunicator::host_all_reduce(Tensor& t) {
  const size_t element = dtype_size(t.dtype()), n = size_t(t.numel());
  const size_t piece = std::max<size_t>(1, kPieceBytes / element);
  std::vector<char> parts(size_t(size_) * std::min(piece, n) * element);
  char* data = static_cast<char*>(t.data());
  Watchdog::Wait wait(*watchdog_, "all_reduce_sum");
  const HostTimer timer(host_seconds_);
  for (size_t first = 0; first < n; first += piece) {
    const size_t count = std::min(piece, n - first);
    check_mpi(MPI_Allgather(data + first * element, int(count * element), MPI_BYTE, parts.data(),
                            int(count * element), MPI_BYTE, MPI_COMM_WORLD),
              rank_, "MPI_Allgather (all_reduce_sum)");
    sum_parts(t.dtype(), parts.data(), count, size_, data + first * element, count);
  }
}

void MpiCommunicator::host_all_gather(const Tensor& shard, Tensor& full) {
  const size_t bytes = shard.nbytes();
  const size_t piece = std::min(kPieceBytes, bytes);
  std::vector<char> parts(size_t(size_) * piece);
  const char* src = static_cast<const char*>(shard.data());
  char* dst = static_cast<char*>(full.data());
  Watchdog::Wait wait(*watchdog_, "all_gather");
  const HostTimer timer(host_seconds_);
  for (size_t first = 0; first < bytes; first += piece) {
    const size_t count = std::min(piece, bytes - first);
    check_mpi(MPI_Allgather(src + first, int(count), MPI_BYTE, parts.data(), int(count), MPI_BYTE,
                            MPI_COMM_WORLD),
              rank_, "MPI_Allgather (all_gather)");
    for (int r = 0; r < size_; ++r)
      std::memcpy(dst + size_t(r) * bytes + first, parts.data() + size_t(r) * count, count);
  }
}

void MpiCommunicator::host_reduce_scatter(const Tensor& full, Tensor& shard) {
  const size_t element = dtype_size(full.dtype()), n = size_t(shard.numel());
  const size_t piece = std::max<size_t>(1, std::min(kPieceBytes / element, n));
  std::vector<char> send(size_t(size_) * piece * element), parts(send.size());
  const char* src = static_cast<const char*>(full.data());
  char* dst = static_cast<char*>(shard.data());
  Watchdog::Wait wait(*watchdog_, "reduce_scatter_sum");
  const HostTimer timer(host_seconds_);
  for (size_t first = 0; first < n; first += piece) {
    const size_t count = std::min(piece, n - first);
    // Rank j gets this piece of shard j from every rank.
    for (int j = 0; j < size_; ++j)
      std::memcpy(send.data() + size_t(j) * count * element, src + (size_t(j) * n + first) * element,
                  count * element);
    check_mpi(MPI_Alltoall(send.data(), int(count * element), MPI_BYTE, parts.data(),
                           int(count * element), MPI_BYTE, MPI_COMM_WORLD),
              rank_, "MPI_Alltoall (reduce_scatter_sum)");
    sum_parts(full.dtype(), parts.data(), count, size_, dst + first * element, count);
  }
}

void MpiCommunicator::host_broadcast(Tensor& t, int root) {
  const size_t bytes = t.nbytes();
  char* data = static_cast<char*>(t.data());
  Watchdog::Wait wait(*watchdog_, "broadcast");
  const HostTimer timer(host_seconds_);
  for (size_t first = 0; first < bytes; first += kPieceBytes) {
    const size_t count = std::min(kPieceBytes, bytes - first);
    check_mpi(MPI_Bcast(data + first, int(count), MPI_BYTE, root, MPI_COMM_WORLD), rank_, "MPI_Bcast");
  }
}

void MpiCommunicator::host_all_to_all(const Tensor& send, std::span<const int64_t> send_rows,
                                      Tensor& recv, std::span<const int64_t> recv_rows) {
  // Counts and displacements in rows (MPI's are ints): one contiguous datatype of a row's bytes.
  // Every rank calls MPI_Alltoallv, also one that sends and receives nothing.
  const size_t row = row_bytes(send);
  LOCKSTEP_CHECK(row <= size_t(INT_MAX) && send.dim(0) <= INT_MAX && recv.dim(0) <= INT_MAX,
                 "rank ", rank_, ": all_to_all of ", send.describe(), " and ", recv.describe(),
                 " is too large for MPI's int counts");
  if (row == 0) return;  // (rows of no bytes on every rank: the row shape is the same everywhere)
  const size_t n = static_cast<size_t>(size_);
  std::vector<int> send_counts(n), send_displs(n), recv_counts(n), recv_displs(n);
  for (int q = 0, s = 0, r = 0; q < size_; ++q) {
    send_counts[size_t(q)] = int(send_rows[size_t(q)]);
    recv_counts[size_t(q)] = int(recv_rows[size_t(q)]);
    send_displs[size_t(q)] = s;
    recv_displs[size_t(q)] = r;
    s += send_counts[size_t(q)];
    r += recv_counts[size_t(q)];
  }
  MPI_Datatype type;
  check_mpi(MPI_Type_contiguous(int(row), MPI_BYTE, &type), rank_, "MPI_Type_contiguous (all_to_all)");
  MPI_Type_commit(&type);
  Watchdog::Wait wait(*watchdog_, "all_to_all");
  const HostTimer timer(host_seconds_);
  const int code = MPI_Alltoallv(send.data(), send_counts.data(), send_displs.data(), type, recv.data(),
                                 recv_counts.data(), recv_displs.data(), type, MPI_COMM_WORLD);
  MPI_Type_free(&type);
  check_mpi(code, rank_, "MPI_Alltoallv (all_to_all)");
}

MpiCommunicator::Device& MpiCommunicator::device() {
#if LOCKSTEP_HAS_NCCL
  // Made at the first collective on CUDA tensors, which every rank reaches together.
  if (!device_->nccl) {
    NcclGroup::Id id{};
    if (rank_ == 0) id = NcclGroup::make_id();
    Watchdog::Wait wait(*watchdog_, "NCCL's setup (the unique id from rank 0)");
    check_mpi(MPI_Bcast(id.bytes, int(sizeof(id.bytes)), MPI_BYTE, 0, MPI_COMM_WORLD), rank_,
              "MPI_Bcast (NCCL unique id)");
    device_->nccl = std::make_unique<NcclGroup>(id, rank_, size_, timeout_seconds_);
  }
#endif
  return *device_;
}

// Without NCCL a CUDA tensor goes through the host: the device's queued work first (the tensor's
// producers on any stream), then the host collective, then the result back. Slow, but the same
// sums as the CPU's.
#if !LOCKSTEP_HAS_NCCL
namespace {
Tensor to_host(const Tensor& t) {
  device_synchronize();
  return t.to(Device::cpu);
}
}  // namespace
#endif

void MpiCommunicator::all_reduce_sum(Tensor& t, CommStream stream) {
  check_all_reduce(*this, t);
  if (!t.is_cuda()) return host_all_reduce(t);
#if LOCKSTEP_HAS_NCCL
  device().nccl->all_reduce_sum(t, stream.cuda);
#else
  (void)stream;
  Tensor h = to_host(t);
  host_all_reduce(h);
  t.copy_from(h);
#endif
}

void MpiCommunicator::all_gather(const Tensor& shard, Tensor& full, CommStream stream) {
  check_all_gather(*this, shard, full);
  if (!full.is_cuda()) return host_all_gather(shard, full);
#if LOCKSTEP_HAS_NCCL
  device().nccl->all_gather(shard, full, stream.cuda);
#else
  (void)stream;
  Tensor h = Tensor::empty(full.shape(), full.dtype());
  host_all_gather(to_host(shard), h);
  full.copy_from(h);
#endif
}

void MpiCommunicator::reduce_scatter_sum(const Tensor& full, Tensor& shard, CommStream stream) {
  check_reduce_scatter(*this, full, shard);
  if (!full.is_cuda()) return host_reduce_scatter(full, shard);
#if LOCKSTEP_HAS_NCCL
  device().nccl->reduce_scatter_sum(full, shard, stream.cuda);
#else
  (void)stream;
  Tensor h = Tensor::empty(shard.shape(), shard.dtype());
  host_reduce_scatter(to_host(full), h);
  shard.copy_from(h);
#endif
}

void MpiCommunicator::broadcast(Tensor& t, int root, CommStream stream) {
  check_broadcast(*this, t, root);
  if (!t.is_cuda()) return host_broadcast(t, root);
#if LOCKSTEP_HAS_NCCL
  device().nccl->broadcast(t, root, stream.cuda);
#else
  (void)stream;
  Tensor h = to_host(t);
  host_broadcast(h, root);
  t.copy_from(h);
#endif
}

void MpiCommunicator::all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                                 std::span<const int64_t> recv_rows, CommStream stream) {
  check_all_to_all(*this, send, send_rows, recv, recv_rows);
  if (!recv.is_cuda()) return host_all_to_all(send, send_rows, recv, recv_rows);
#if LOCKSTEP_HAS_NCCL
  device().nccl->all_to_all(send, send_rows, recv, recv_rows, stream.cuda);
#else
  (void)stream;
  Tensor h = Tensor::empty(recv.shape(), recv.dtype());
  host_all_to_all(to_host(send), send_rows, h, recv_rows);
  recv.copy_from(h);
#endif
}

void MpiCommunicator::barrier() {
  Watchdog::Wait wait(*watchdog_, "barrier");
  check_mpi(MPI_Barrier(MPI_COMM_WORLD), rank_, "MPI_Barrier");
}

double MpiCommunicator::collective_seconds() {
#if LOCKSTEP_HAS_NCCL
  if (device_->nccl) return host_seconds_ + device_->nccl->finished_seconds();
#endif
  return host_seconds_;
}

void MpiCommunicator::abort(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace lockstep
