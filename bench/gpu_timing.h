// bench/gpu_timing.h — how the GPU benches time a call: the median of CUDA-event-timed repetitions
// after warm-ups, and the device-to-device copy bandwidth they compare memory-bound kernels with.
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
