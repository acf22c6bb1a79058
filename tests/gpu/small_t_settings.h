// The fp8 GEMM's small-T dispatch setting (ops/gemm_backends.h) for GPU tests, callable in builds
// without CUDA (where the tests skip).
#pragma once

#include "core/device.h"
#include "ops/gemm_backends.h"

namespace lockstep::testing {

constexpr int kSmallTMax = 64;  // the small-T kernel's limit

// cuda::gemm_set_fp8_small_t; returns the previous setting (0 without CUDA).
inline int set_fp8_small_t(int tokens) {
#if LOCKSTEP_HAS_CUDA
  return cuda::gemm_set_fp8_small_t(tokens);
#else
  (void)tokens;
  return 0;
#endif
}

// gemm_set_fp8_small_t(tokens) (default: the small-T kernel for 1 .. 64 tokens) for the scope.
class SmallTSettings {
 public:
  explicit SmallTSettings(int tokens = kSmallTMax) {
    if (cuda_device_available()) tokens_ = set_fp8_small_t(tokens);
  }
  ~SmallTSettings() {
    if (cuda_device_available()) set_fp8_small_t(tokens_);
  }
  SmallTSettings(const SmallTSettings&) = delete;
  SmallTSettings& operator=(const SmallTSettings&) = delete;

 private:
  int tokens_ = 0;
};

}  // namespace lockstep::testing
