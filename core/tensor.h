// core/tensor.h — a dense, row-major block of elements: shape, dtype, device, and either owned
// storage (shared, freed with the last owner) or a view into someone else's.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtypes.h"

namespace lockstep {

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<f16>() { return DType::f16; }
template <> constexpr DType dtype_of<e4m3>() { return DType::e4m3; }
template <> constexpr DType dtype_of<e8m0>() { return DType::e8m0; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }

using Shape = std::vector<int64_t>;

std::string shape_string(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // Uninitialized owned storage.
  static Tensor empty(Shape shape, DType dtype, Device device = Device::cpu);
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::cpu);
  // Uninitialized host storage in page-locked memory (core/device.h's pinned_alloc): a CPU tensor
  // that asynchronous copies to and from the GPU can use.
  static Tensor empty_pinned(Shape shape, DType dtype);
  // A non-owning view of memory the caller keeps alive.
  static Tensor view_of(void* data, Shape shape, DType dtype, Device device = Device::cpu);

  bool defined() const { return data_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return int(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(size_t(i < 0 ? i + rank() : i)); }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cuda() const { return device_ == Device::cuda; }

  void* data() const { return data_; }
  // Typed access; throws if T is not the tensor's dtype.
  template <class T> T* data_as() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(data_);
  }

  // A copy on `device` (a plain copy of the bytes).
  Tensor to(Device device) const;
  // Copies `src` (same shape and dtype, any device) into this tensor's memory.
  void copy_from(const Tensor& src);
  // A view of rows [begin, end) along the first dimension.
  Tensor rows(int64_t begin, int64_t end) const;
  // A view with another shape of the same element count.
  Tensor reshape(Shape shape) const;
  // Sets every byte (tests poison outputs with this before a kernel writes them).
  void fill_bytes(unsigned char value);

  // "bf16[128, 256] on cuda"
  std::string describe() const;

 private:
  void check_dtype(DType expected) const;

  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

// Argument checks shared by every op: `what` names the argument in the message.
void check_tensor(const Tensor& t, const char* what, DType dtype, Device device);
void check_shape(const Tensor& t, const char* what, const Shape& expected);

}  // namespace lockstep
