// tests/gpu/rank_gpu.h — the GPU of this rank for the tests run under mpirun (test_dist_gpu): one
// GPU per rank, the rank's local rank; the tests skip where the host has fewer GPUs than ranks.
#pragma once

#include <gtest/gtest.h>

#include "core/device.h"
#include "tests/dist/test_world.h"

namespace lockstep::testing {

// Selects this rank's GPU once; false without one for every rank.
inline bool gpu_for_this_rank() {
  static const bool ok = [] {
    Communicator& c = world();
    if (!cuda_device_available() || cuda_device_count() < c.size()) return false;
    select_cuda_device(c.local_rank());
    return true;
  }();
  return ok;
}

}  // namespace lockstep::testing

#define REQUIRE_RANK_GPU()                                                                              \
  if (!::lockstep::testing::gpu_for_this_rank())                                                        \
  GTEST_SKIP() << "needs one GPU per rank (" << ::lockstep::testing::world().size() << " ranks, "       \
               << ::lockstep::cuda_device_count() << " GPUs)"
