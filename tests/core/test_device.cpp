// core/device.h's out-of-memory message: the size asked for, the innermost MemoryPurpose (or "a
// tensor"), the GPU's free and total memory, what the process holds, and the remedy. (The GPU test
// tests/gpu/test_memory_gpu.cpp makes a real allocation fail.) And parse_device.
#include <gtest/gtest.h>

#include "core/device.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

constexpr size_t GiB = size_t(1) << 30;

TEST(OutOfMemoryMessage, NamesSizeFreeTotalHeldAndTheInnermostPurpose) {
  const DeviceMemoryStats stats{.in_use = 70 * GiB, .peak = 75 * GiB, .free = GiB / 2, .total = 80 * GiB};
  EXPECT_EQ(out_of_memory_message(2 * GiB, stats, 72 * GiB),
            "GPU out of memory: 2.00 GiB asked for a tensor; 0.50 GiB free of 80.00 GiB (this "
            "process: 70.00 GiB in live tensors, 72.00 GiB held by its memory pool); a smaller "
            "batch, KV cache or model needs less");
  {
    const MemoryPurpose outer("the KV cache", "lower rollout.kv_cache_fraction");
    {
      const MemoryPurpose inner("a micro-batch", "lower optim.micro_batch_tokens");
      const std::string m = out_of_memory_message(3 * GiB / 2, stats, 72 * GiB);
      EXPECT_NE(m.find("1.50 GiB asked for a micro-batch;"), std::string::npos) << m;
      EXPECT_TRUE(m.ends_with("; lower optim.micro_batch_tokens")) << m;
    }
    const std::string m = out_of_memory_message(GiB, stats, 72 * GiB);
    EXPECT_NE(m.find("1.00 GiB asked for the KV cache;"), std::string::npos) << m;
    EXPECT_TRUE(m.ends_with("; lower rollout.kv_cache_fraction")) << m;
  }
  EXPECT_EQ(MemoryPurpose::current(), nullptr);
}

TEST(ParseDevice, TakesCpuAndCudaAndNamesTheFlagOtherwise) {
  EXPECT_EQ(parse_device("cpu", "--device"), Device::cpu);
  EXPECT_EQ(parse_device("cuda", "--device"), Device::cuda);
  testing::expect_error([] { parse_device("gpu", "--device"); }, {"--device: expected cpu or cuda, got 'gpu'"});
}

}  // namespace
}  // namespace lockstep
