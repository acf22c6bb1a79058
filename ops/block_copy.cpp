// ops/block_copy.cpp — argument checks and backend dispatch for ops/block_copy.h.
#include "ops/block_copy.h"

#include <string>
#include <unordered_set>

#include "ops/act_check.h"
#include "ops/block_copy_backends.h"

namespace lockstep {

int64_t independent_copies(std::span<const int32_t> pairs) {
  std::unordered_set<int32_t> read, written;
  const int64_t count = int64_t(pairs.size() / 2);
  for (int64_t i = 0; i < count; ++i) {
    const int32_t src = pairs[size_t(2 * i)], dst = pairs[size_t(2 * i + 1)];
    if (read.contains(dst) || written.contains(dst) || written.contains(src)) return i;
    read.insert(src);
    written.insert(dst);
  }
  return count;
}

void copy_blocks(std::span<Tensor> tensors, const Tensor& pairs) {
  LOCKSTEP_CHECK(!tensors.empty(), "copy_blocks: no tensors given");
  const Tensor& first = tensors[0];
  LOCKSTEP_CHECK(first.defined() && first.rank() >= 1, "copy_blocks: tensors[0]: expected a ",
                 "tensor of blocks [N, ...], got ", first.defined() ? first.describe() : "none");
  for (size_t i = 1; i < tensors.size(); ++i) {
    const std::string what = "copy_blocks: tensors[" + std::to_string(i) + "]";
    check_tensor(tensors[i], what.c_str(), first.dtype(), first.device());
    check_shape(tensors[i], what.c_str(), first.shape());
  }
  check_tensor(pairs, "copy_blocks: pairs", DType::i32, first.device());
  LOCKSTEP_CHECK(pairs.rank() == 2 && pairs.dim(1) == 2,
                 "copy_blocks: pairs: expected [C, 2] (src, dst), got ", pairs.describe());
  if (pairs.dim(0) == 0) return;
  if (first.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    return cuda::copy_blocks(tensors, pairs);
#else
    LOCKSTEP_NO_CUDA_OP("copy_blocks");
#endif
  }
  const std::span<const int32_t> p(pairs.data_as<int32_t>(), size_t(pairs.numel()));
  const int64_t blocks = first.dim(0);
  for (size_t i = 0; i < p.size(); ++i)
    LOCKSTEP_CHECK(p[i] >= 0 && p[i] < blocks, "copy_blocks: pairs[", i / 2, "].",
                   i % 2 ? "dst" : "src", " = ", p[i], " is outside the blocks [0, ", blocks, ")");
  const int64_t together = independent_copies(p);
  LOCKSTEP_CHECK(together == pairs.dim(0), "copy_blocks: pairs[", together,
                 "] touches a block that an earlier pair writes, or writes one it reads: ",
                 "dependent copies go in separate calls");
  cpu::copy_blocks(tensors, pairs);
}

}  // namespace lockstep
