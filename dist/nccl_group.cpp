// dist/nccl_group.cpp
#include "dist/nccl_group.h"

#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "core/error.h"
#include "dist/communicator.h"

namespace lockstep {

namespace {

using Clock = std::chrono::steady_clock;
static_assert(sizeof(ncclUniqueId) == sizeof(NcclGroup::Id::bytes));

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

ncclDataType_t sum_type(const Tensor& t) { return t.dtype() == DType::f32 ? ncclFloat32 : ncclFloat64; }

cudaStream_t stream_or_current(void* stream) {
  return stream ? static_cast<cudaStream_t>(stream) : current_stream();
}

}  // namespace

struct NcclGroup::State {
  ncclComm_t comm = nullptr;
  int rank = 0, device = 0;
  double timeout = 0;

  // The collectives queued and not yet seen finished, oldest first, between two events on their
  // stream (`start` recorded before the collective, `done` after).
  struct Pending {
    cudaEvent_t start, done;
    const char* what;
    Clock::time_point queued;
  };
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Pending> pending;
  double finished_seconds = 0;  // the GPU time of the collectives retired so far
  bool stop = false;
  std::thread watchdog;

  [[noreturn]] void fail_now(const std::string& why) {
    std::fflush(stdout);
    std::fprintf(stderr, "[rank %d] lockstep: %s\n", rank, why.c_str());
    std::fflush(stderr);
    ncclCommAbort(comm);  // frees this rank's side of every connection, so peers see it go
    _exit(1);
  }

  std::string nccl_error(ncclResult_t r) const {
    std::string s = ncclGetErrorString(r);
    if (const char* last = ncclGetLastError(comm); last && *last) s += std::string(": ") + last;
    return s;
  }

  // Waits for a non-blocking call's enqueue (or the setup) to finish, against the deadline.
  void settle(ncclResult_t r, const char* what) {
    const Clock::time_point t0 = Clock::now();
    while (r == ncclInProgress) {
      LOCKSTEP_CHECK(seconds_since(t0) <= timeout, "rank ", rank, ": NCCL ", what, " waited more than ",
                     timeout, " s for the other ranks (LOCKSTEP_DIST_TIMEOUT_S)");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      ncclCommGetAsyncError(comm, &r);
    }
    LOCKSTEP_CHECK(r == ncclSuccess, "rank ", rank, ": NCCL ", what, " failed: ", nccl_error(r));
  }

  // Queues `enqueue` (an NCCL call on `stream`) between two events, and follows it.
  template <class Enqueue>
  void run(const char* what, cudaStream_t stream, Enqueue enqueue) {
    Pending p{nullptr, nullptr, what, Clock::now()};
    LOCKSTEP_CUDA_CHECK(cudaEventCreate(&p.start));
    LOCKSTEP_CUDA_CHECK(cudaEventCreate(&p.done));
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(p.start, stream));
    settle(enqueue(), what);
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(p.done, stream));
    std::lock_guard<std::mutex> lock(mutex);
    pending.push_back(p);
  }

  // Drops the collectives that have finished, adding their GPU time (with `mutex` held).
  void retire_finished() {
    while (!pending.empty() && cudaEventQuery(pending.front().done) == cudaSuccess) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, pending.front().start, pending.front().done) == cudaSuccess)
        finished_seconds += double(ms) * 1e-3;
      cudaEventDestroy(pending.front().start);
      cudaEventDestroy(pending.front().done);
      pending.pop_front();
    }
  }

  void watch() {
    cudaSetDevice(device);
    std::unique_lock<std::mutex> lock(mutex);
    while (!wake.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop; })) {
      retire_finished();
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        fail_now("NCCL reported an error (a rank died or its connection broke): " + nccl_error(async));
      if (!pending.empty() && seconds_since(pending.front().queued) > timeout)
        fail_now(std::string("NCCL ") + pending.front().what + " has not finished " +
                 std::to_string(timeout) + " s after it was queued (LOCKSTEP_DIST_TIMEOUT_S): "
                 "another rank hangs or has died");
    }
  }
};

NcclGroup::Id NcclGroup::make_id() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  LOCKSTEP_CHECK(r == ncclSuccess, "ncclGetUniqueId failed: ", ncclGetErrorString(r));
  Id out;
  std::memcpy(out.bytes, &id, sizeof(id));
  return out;
}

NcclGroup::NcclGroup(const Id& id, int rank, int size, double timeout_seconds)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.rank = rank;
  s.timeout = timeout_seconds;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&s.device));
  ncclUniqueId unique;
  std::memcpy(&unique, id.bytes, sizeof(unique));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  s.settle(ncclCommInitRankConfig(&s.comm, size, unique, rank, &config), "setup (ncclCommInitRankConfig)");
  s.watchdog = std::thread([&s] { s.watch(); });
}

NcclGroup::~NcclGroup() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stop = true;
  }
  s.wake.notify_all();
  s.watchdog.join();
  for (const State::Pending& p : s.pending) {
    cudaEventSynchronize(p.done);
    cudaEventDestroy(p.start);
    cudaEventDestroy(p.done);
  }
  ncclCommDestroy(s.comm);
}

void NcclGroup::all_reduce_sum(Tensor& t, void* stream) {
  const cudaStream_t st = stream_or_current(stream);
  state_->run("all_reduce_sum", st, [&] {
    return ncclAllReduce(t.data(), t.data(), size_t(t.numel()), sum_type(t), ncclSum, state_->comm, st);
  });
}

void NcclGroup::all_gather(const Tensor& shard, Tensor& full, void* stream) {
  const cudaStream_t st = stream_or_current(stream);
  state_->run("all_gather", st, [&] {
    return ncclAllGather(shard.data(), full.data(), shard.nbytes(), ncclUint8, state_->comm, st);
  });
}

void NcclGroup::reduce_scatter_sum(const Tensor& full, Tensor& shard, void* stream) {
  const cudaStream_t st = stream_or_current(stream);
  state_->run("reduce_scatter_sum", st, [&] {
    return ncclReduceScatter(full.data(), shard.data(), size_t(shard.numel()), sum_type(full),
                             ncclSum, state_->comm, st);
  });
}

void NcclGroup::broadcast(Tensor& t, int root, void* stream) {
  const cudaStream_t st = stream_or_current(stream);
  state_->run("broadcast", st, [&] {
    return ncclBroadcast(t.data(), t.data(), t.nbytes(), ncclUint8, root, state_->comm, st);
  });
}

void NcclGroup::all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                           std::span<const int64_t> recv_rows, void* stream) {
  const cudaStream_t st = stream_or_current(stream);
  const size_t row = row_bytes(send);
  const char* src = static_cast<const char*>(send.data());
  char* dst = static_cast<char*>(recv.data());
  state_->run("all_to_all", st, [&] {
    // One group: NCCL runs the pairs' sends and receives together (none waits for another).
    ncclResult_t r = ncclGroupStart();
    size_t s = 0, d = 0;
    for (int q = 0; q < int(send_rows.size()) && (r == ncclSuccess || r == ncclInProgress); ++q) {
      const size_t out = size_t(send_rows[size_t(q)]) * row, in = size_t(recv_rows[size_t(q)]) * row;
      if (out > 0) r = ncclSend(src + s, out, ncclUint8, q, state_->comm, st);
      if (in > 0 && (r == ncclSuccess || r == ncclInProgress))
        r = ncclRecv(dst + d, in, ncclUint8, q, state_->comm, st);
      s += out;
      d += in;
    }
    const ncclResult_t end = ncclGroupEnd();
    return r == ncclSuccess || r == ncclInProgress ? end : r;
  });
}

double NcclGroup::finished_seconds() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->retire_finished();
  return state_->finished_seconds;
}

}  // namespace lockstep
