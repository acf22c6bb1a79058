// bench/gpu_timing.h — how the GPU benches time a call: the median of CUDA-event-timed repetitions
// after warm-ups (or the mean of back-to-back calls), and the device-to-device copy bandwidth they
// compare memory-bound kernels with.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "core/cuda_check.h"

namespace lockstep::bench {

// Median milliseconds of `reps` timed calls of fn after 3 warm-ups; `before_each` (untimed, e.g.
// an L2 flush) runs before every timed call.
inline double median_ms(const std::function<void()>& fn, int reps,
                        const std::function<void()>& before_each = {}) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t start, stop;
  LOCKSTEP_CUDA_CHECK(cudaEventCreate(&start));
  LOCKSTEP_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms(static_cast<size_t>(reps));
  for (float& m : ms) {
    if (before_each) before_each();
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(start));
    fn();
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(stop));
    LOCKSTEP_CUDA_CHECK(cudaEventSynchronize(stop));
    LOCKSTEP_CUDA_CHECK(cudaEventElapsedTime(&m, start, stop));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Mean milliseconds of a call when `reps` calls run back to back between two events, after 3
// warm-ups: the launch latency is hidden, as in a training step where kernels queue one after
// another (median_ms's single call also counts the host's launch after the start event, a few µs
// that matter for kernels of tens of µs).
inline double back_to_back_ms(const std::function<void()>& fn, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t start, stop;
  LOCKSTEP_CUDA_CHECK(cudaEventCreate(&start));
  LOCKSTEP_CUDA_CHECK(cudaEventCreate(&stop));
  LOCKSTEP_CUDA_CHECK(cudaEventRecord(start));
  for (int i = 0; i < reps; ++i) fn();
  LOCKSTEP_CUDA_CHECK(cudaEventRecord(stop));
  LOCKSTEP_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  LOCKSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / reps;
}

// A before_each for median_ms that evicts the L2 cache: a memset of a 512 MiB device buffer (far
// more than any GPU's L2), so the timed call reads its operands from HBM, as a decode step reads
// each layer's weights. Owns the buffer.
class L2Flush {
 public:
  L2Flush() { LOCKSTEP_CUDA_CHECK(cudaMalloc(&buffer_, kBytes)); }
  ~L2Flush() { cudaFree(buffer_); }
  L2Flush(const L2Flush&) = delete;
  L2Flush& operator=(const L2Flush&) = delete;
  std::function<void()> fn() const {
    return [buffer = buffer_] { LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(buffer, 0, kBytes)); };
  }

 private:
  static constexpr size_t kBytes = size_t(512) << 20;
  void* buffer_ = nullptr;
};

// GB/s of a 1 GiB device-to-device copy, bytes read + written (timed as median_ms does).
inline double copy_bandwidth_gbs(int reps, const std::function<void()>& before_each = {}) {
  const size_t bytes = size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&src, bytes));
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&dst, bytes));
  LOCKSTEP_CUDA_CHECK(cudaMemset(src, 1, bytes));
  const double ms = median_ms(
      [&] { LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, reps,
      before_each);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

}  // namespace lockstep::bench
