// model/kv_cache.h — the storage of a paged key/value cache (ops/attention.h): for every layer,
// K and V blocks [num_blocks, block_size, kv_heads, head_dim] in the recipe's activation dtype.
// Which blocks a sequence owns (its block table) is decided by the caller (the rollout engine).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "io/config.h"

namespace lockstep {

struct KvCache {
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  std::vector<Tensor> k, v;  // one per layer

  KvCache() = default;
  KvCache(const ModelConfig& config, DType dtype, int64_t num_blocks, int64_t block_size,
          Device device = Device::cpu);
  // Bytes of one block across all layers, K and V.
  static int64_t block_bytes(const ModelConfig& config, DType dtype, int64_t block_size);
};

// Copy-on-write: block src to block dst of every layer's K and V for each pair of `pairs` (i32
// [C, 2] on the cache's device), in order; `host_pairs` holds the same values on the host, to
// split them into runs of copies that do not depend on each other (normally one run), one
// ops/block_copy.h call each.
void copy_cache_blocks(KvCache& cache, const Tensor& pairs, std::span<const int32_t> host_pairs);

}  // namespace lockstep
