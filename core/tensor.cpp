// core/tensor.cpp
#include "core/tensor.h"

#include "core/error.h"

namespace lockstep {

std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (int64_t d : shape) LOCKSTEP_CHECK(d >= 0, "negative dimension in shape ", shape_string(shape));
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  void* p = device_alloc(device, t.nbytes());
  t.storage_ = std::shared_ptr<void>(p, [device](void* q) { device_free(device, q); });
  t.data_ = p;
  return t;
}

Tensor Tensor::empty_pinned(Shape shape, DType dtype) {
  for (int64_t d : shape) LOCKSTEP_CHECK(d >= 0, "negative dimension in shape ", shape_string(shape));
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  void* p = pinned_alloc(t.nbytes());
  t.storage_ = std::shared_ptr<void>(p, pinned_free);
  t.data_ = p;
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.fill_bytes(0);
  return t;
}

Tensor Tensor::view_of(void* data, Shape shape, DType dtype, Device device) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  device_copy(t.data_, device, data_, device_, nbytes());
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  LOCKSTEP_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "copy_from: cannot copy ",
                 src.describe(), " into ", describe());
  device_copy(data_, device_, src.data_, src.device_, nbytes());
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  LOCKSTEP_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "rows(", begin,
                 ", ", end, ") out of range for ", describe());
  Tensor t = *this;
  t.shape_[0] = end - begin;
  const size_t row_bytes = shape_[0] ? nbytes() / size_t(shape_[0]) : 0;
  t.data_ = static_cast<char*>(data_) + size_t(begin) * row_bytes;
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  LOCKSTEP_CHECK(t.numel() == numel(), "reshape: cannot view ", describe(), " as ",
                 shape_string(t.shape_));
  return t;
}

void Tensor::fill_bytes(unsigned char value) { device_fill_bytes(device_, data_, value, nbytes()); }

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_string(shape_) + " on " +
         std::string(device_name(device_));
}

void Tensor::check_dtype(DType expected) const {
  LOCKSTEP_CHECK(dtype_ == expected, "expected a ", dtype_name(expected), " tensor, got ",
                 describe());
}

void check_tensor(const Tensor& t, const char* what, DType dtype, Device device) {
  LOCKSTEP_CHECK(t.defined(), what, ": tensor is empty (not allocated)");
  LOCKSTEP_CHECK(t.dtype() == dtype, what, ": expected dtype ", dtype_name(dtype), ", got ",
                 t.describe());
  LOCKSTEP_CHECK(t.device() == device, what, ": expected a tensor on ", device_name(device),
                 ", got ", t.describe());
}

void check_shape(const Tensor& t, const char* what, const Shape& expected) {
  LOCKSTEP_CHECK(t.shape() == expected, what, ": expected shape ", shape_string(expected), ", got ",
                 t.describe());
}

}  // namespace lockstep
