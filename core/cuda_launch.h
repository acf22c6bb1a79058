// core/cuda_launch.h — launch chores that kernels with large shared memory, persistent grids or
// thread-block clusters repeat: raising a kernel's dynamic shared memory limit (once per kernel),
// its resident CTA count, and a launch configuration with a cluster shape or an early start.
// Include only from CUDA sources.
#pragma once

#include <cuda_runtime.h>

#include <optional>
#include <utility>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "core/device.h"
#include "core/early_start.h"

namespace lockstep {

// Raises kKernel's dynamic shared memory limit to `smem` bytes (a kernel gets 48 KB without
// asking), the first time it is called for kKernel; `smem` must be the same at every call.
template <auto kKernel>
void allow_dynamic_smem(size_t smem) {
  static const bool raised = [smem] {
    LOCKSTEP_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)raised;
}

// How many CTAs of kKernel (`threads` threads, `smem` bytes of dynamic shared memory, its limit
// raised) the device holds at once: SMs × occupancy, at least one an SM; queried once per kernel
// (one device per process, as everywhere in lockstep), so threads and smem must be the same at
// every call. The grid of a persistent kernel.
template <auto kKernel>
int resident_blocks(int threads, size_t smem) {
  static const int resident = [threads, smem] {
    allow_dynamic_smem<kKernel>(smem);
    int per_sm = 0;
    LOCKSTEP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, threads, smem));
    return device_sm_count() * (per_sm > 0 ? per_sm : 1);
  }();
  return resident;
}

// A cudaLaunchKernelEx configuration on current_stream(): `grid` CTAs of `block` threads with
// `smem` bytes of dynamic shared memory, in clusters of `cluster` CTAs when given (a kernel that
// uses cluster barriers gets one even of a single CTA). Not copyable: the configuration points at
// its own attributes.
struct LaunchConfig {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attrs[2]{};

  LaunchConfig(dim3 grid, dim3 block, size_t smem, std::optional<dim3> cluster = std::nullopt) {
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = current_stream();
    config.attrs = attrs;
    if (cluster) {
      cudaLaunchAttribute& a = attrs[config.numAttrs++];
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = cluster->x;
      a.val.clusterDim.y = cluster->y;
      a.val.clusterDim.z = cluster->z;
    }
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;

  // Inside an EarlyStartScope (core/early_start.h), a programmatic dependent launch: the kernel may
  // start before the one queued before it has ended. For kernels that follow
  // core/dependent_launch.cuh's rule only.
  LaunchConfig& early_start_in_scope() {
    if (early_start_enabled()) {
      cudaLaunchAttribute& a = attrs[config.numAttrs++];
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
    return *this;
  }

  // Launches kernel(args...) with this configuration, checked.
  template <class... Params, class... Args>
  void run(void (*kernel)(Params...), Args&&... args) const {
    LOCKSTEP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  }
};

}  // namespace lockstep
