#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"

namespace lockstep {
namespace {

TEST(Tensor, OwnsAndViews) {
  Tensor t = Tensor::zeros({4, 3}, DType::f32);
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.nbytes(), 48u);
  float* p = t.data_as<float>();
  for (int i = 0; i < 12; ++i) p[i] = float(i);
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  EXPECT_EQ(r.data_as<float>()[0], 3.0f);
  Tensor c = r.to(Device::cpu);
  c.data_as<float>()[0] = -1;
  EXPECT_EQ(p[3], 3.0f);  // a copy, not a view
  EXPECT_EQ(t.reshape({12}).data_as<float>()[11], 11.0f);
}

TEST(Tensor, ClearErrors) {
  Tensor t = Tensor::empty({2, 2}, DType::bf16);
  EXPECT_THROW(t.data_as<float>(), Error);
  EXPECT_THROW(t.rows(1, 3), Error);
  EXPECT_THROW(t.reshape({5}), Error);
  try {
    check_shape(t, "weight", {2, 3});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "weight: expected shape [2, 3], got bf16[2, 2] on cpu");
  }
}

}  // namespace
}  // namespace lockstep
