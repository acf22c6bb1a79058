// core/cuda_launch.h — two launch chores every kernel with large shared memory or thread-block
// clusters repeats: raising its dynamic shared memory limit (once per kernel), and a launch
// configuration with a cluster shape. Include only from CUDA sources.
#pragma once

#include <cuda_runtime.h>

#include <optional>
#include <utility>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"

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

// A cudaLaunchKernelEx configuration on current_stream(): `grid` CTAs of `block` threads with
// `smem` bytes of dynamic shared memory, in clusters of `cluster` CTAs when given (a kernel that
// uses cluster barriers gets one even of a single CTA). Not copyable: the configuration points at
// its own attribute.
struct LaunchConfig {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute cluster_attr{};

  LaunchConfig(dim3 grid, dim3 block, size_t smem, std::optional<dim3> cluster = std::nullopt) {
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = current_stream();
    if (cluster) {
      cluster_attr.id = cudaLaunchAttributeClusterDimension;
      cluster_attr.val.clusterDim.x = cluster->x;
      cluster_attr.val.clusterDim.y = cluster->y;
      cluster_attr.val.clusterDim.z = cluster->z;
      config.attrs = &cluster_attr;
      config.numAttrs = 1;
    }
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;

  // Launches kernel(args...) with this configuration, checked.
  template <class... Params, class... Args>
  void run(void (*kernel)(Params...), Args&&... args) const {
    LOCKSTEP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  }
};

}  // namespace lockstep
