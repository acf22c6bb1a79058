// ops/cpu/block_copy.cpp — CPU reference for ops/block_copy.h: the pairs in order.
#include <cstring>

#include "ops/block_copy_backends.h"

namespace lockstep::cpu {

void copy_blocks(std::span<Tensor> tensors, const Tensor& pairs) {
  const int32_t* p = pairs.data_as<int32_t>();
  const size_t block_bytes = tensors[0].nbytes() / size_t(tensors[0].dim(0));
  for (int64_t i = 0; i < pairs.dim(0); ++i) {
    if (p[2 * i] == p[2 * i + 1]) continue;
    for (Tensor& t : tensors) {
      char* base = static_cast<char*>(t.data());
      std::memcpy(base + size_t(p[2 * i + 1]) * block_bytes, base + size_t(p[2 * i]) * block_bytes,
                  block_bytes);
    }
  }
}

}  // namespace lockstep::cpu
