// The bookkeeping of core/graph_arena.h (RangeAllocator): first fit, alignment, merging of freed
// neighbours, and the errors. The arena's device memory is tested on the GPU (tests/gpu/test_graph_gpu.cpp).
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/graph_arena.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

TEST(RangeAllocator, FirstFitAligned) {
  RangeAllocator r(1000, 100);  // 10 units
  EXPECT_EQ(r.size(), 1000u);
  EXPECT_EQ(r.allocate(1), 0u);      // 1 unit
  EXPECT_EQ(r.allocate(101), 100u);  // 2 units
  EXPECT_EQ(r.allocate(0), 300u);    // still a unit: every tensor has its own address
  EXPECT_EQ(r.high_water(), 400u);
  EXPECT_EQ(r.allocate(700), std::nullopt);  // 6 units left
  EXPECT_EQ(r.allocate(600), 400u);
  EXPECT_EQ(r.allocate(1), std::nullopt);
}

TEST(RangeAllocator, ReusesAndMergesFreedRanges) {
  RangeAllocator r(1000, 100);
  const size_t a = *r.allocate(200), b = *r.allocate(200), c = *r.allocate(200);
  EXPECT_EQ(c, 400u);
  r.release(a);
  EXPECT_EQ(r.allocate(100), 0u);    // the first range that fits, not the largest
  EXPECT_EQ(r.allocate(300), 600u);  // [100, 200) is too small
  r.release(b);                      // [200, 400) free, [100, 200) free: merged into [100, 400)
  EXPECT_EQ(r.allocate(300), 100u);
  r.release(c);
  r.release(600);
  r.release(0);
  r.release(100);                    // everything back, merged on both sides
  EXPECT_EQ(r.allocate(1000), 0u);
  EXPECT_EQ(r.high_water(), 1000u);
}

TEST(RangeAllocator, ClearErrors) {
  EXPECT_THROW(RangeAllocator(50, 100), Error);  // not one unit
  RangeAllocator r(1000, 100);
  const size_t a = *r.allocate(100);
  r.release(a);
  testing::expect_error([&] { r.release(a); }, "offset 0 was not handed out, or was released twice");
  EXPECT_THROW(r.release(300), Error);
}

}  // namespace
}  // namespace lockstep
