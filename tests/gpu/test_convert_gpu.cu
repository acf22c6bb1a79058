// The device's own conversions (cvt.rn.satfinite.e4m3x2.f32, cvt.rn.bf16.f32) against lockstep's
// integer conversions, over all 2^32 fp32 bit patterns, on the GPU.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include "core/cuda_check.h"
#include "core/dtypes.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

__global__ void count_mismatches(unsigned long long* e4m3_bad, unsigned long long* bf16_bad,
                                 uint32_t* first_e4m3_bad) {
  unsigned long long e = 0, b = 0;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32); i += stride) {
    const float f = __uint_as_float(uint32_t(i));
    const uint8_t hw = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
    if (hw != float_to_e4m3(f).bits) {
      ++e;
      atomicMin(first_e4m3_bad, uint32_t(i));
    }
    const __nv_bfloat16 hb = __float2bfloat16_rn(f);
    b += *reinterpret_cast<const uint16_t*>(&hb) != float_to_bf16(f).bits;
  }
  atomicAdd(e4m3_bad, e);
  atomicAdd(bf16_bad, b);
}

TEST(ConvertGpu, DeviceInstructionsMatchOnEveryFloat) {
  LOCKSTEP_REQUIRE_GPU();
  unsigned long long* counts;
  uint32_t* first;
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&counts, 16));
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&first, 4));
  LOCKSTEP_CUDA_CHECK(cudaMemset(counts, 0, 16));
  LOCKSTEP_CUDA_CHECK(cudaMemset(first, 0xff, 4));
  count_mismatches<<<1024, 256>>>(counts, counts + 1, first);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  unsigned long long host[2];
  uint32_t host_first;
  LOCKSTEP_CUDA_CHECK(cudaMemcpy(host, counts, 16, cudaMemcpyDeviceToHost));
  LOCKSTEP_CUDA_CHECK(cudaMemcpy(&host_first, first, 4, cudaMemcpyDeviceToHost));
  cudaFree(counts);
  cudaFree(first);
  EXPECT_EQ(host[0], 0u) << "first e4m3 mismatch at bits 0x" << std::hex << host_first;
  EXPECT_EQ(host[1], 0u);
}

}  // namespace
}  // namespace lockstep
