// GPU memory pressure: an allocation larger than the GPU fails with core/device.h's message (the
// purpose, free and total memory, the remedy), and the process can go on allocating.
#include <gtest/gtest.h>

#include "core/device.h"
#include "core/tensor.h"
#include "core/error.h"

namespace lockstep {
namespace {

TEST(GpuMemory, TooLargeAnAllocationNamesItsPurposeFreeMemoryAndRemedy) {
  if (!cuda_device_available()) GTEST_SKIP() << "no GPU";
  const DeviceMemoryStats before = device_memory_stats();
  const MemoryPurpose purpose("the test's tensor", "ask for less");
  const int64_t floats = int64_t(before.total / 4) * 2;  // twice the GPU's memory
  try {
    Tensor t = Tensor::empty({floats}, DType::f32, Device::cuda);
    FAIL() << "allocating " << floats * 4 << " bytes did not fail";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("GPU out of memory: "), std::string::npos) << m;
    EXPECT_NE(m.find(" asked for the test's tensor; "), std::string::npos) << m;
    EXPECT_NE(m.find(" free of "), std::string::npos) << m;
    EXPECT_NE(m.find(" held by its memory pool); ask for less"), std::string::npos) << m;
    std::printf("the message: %s\n", m.c_str());
  }
  // Not sticky: the next allocation and kernel work.
  Tensor ok = Tensor::zeros({1024}, DType::f32, Device::cuda);
  const Tensor back = ok.to(Device::cpu);
  EXPECT_EQ(back.data_as<float>()[1023], 0.0f);
}

}  // namespace
}  // namespace lockstep
