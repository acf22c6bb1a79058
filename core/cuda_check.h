// core/cuda_check.h — every CUDA runtime call and kernel launch is checked; a failure throws with
// the call, the file and the line. Include only from CUDA-enabled sources.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define LOCKSTEP_CUDA_CHECK(call)                                                             \
  do {                                                                                        \
    cudaError_t lockstep_err_ = (call);                                                       \
    if (lockstep_err_ != cudaSuccess)                                                         \
      throw ::lockstep::Error(::lockstep::detail::concat("CUDA error ",                       \
                                                         cudaGetErrorString(lockstep_err_),   \
                                                         " in ", #call, " at ", __FILE__, ":", \
                                                         __LINE__));                          \
  } while (0)

// After a <<<...>>> launch: configuration errors surface here, execution errors at the next sync.
#define LOCKSTEP_CUDA_CHECK_LAUNCH() LOCKSTEP_CUDA_CHECK(cudaGetLastError())
