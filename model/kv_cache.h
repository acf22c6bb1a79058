// model/kv_cache.h — the storage of a paged key/value cache (ops/attention.h): for every layer, a
// PagedKv: K and V blocks [num_blocks, block_size, kv_heads, head_dim] in the recipe's activation
// dtype, or in e4m3 with one scale per token and kv head (the fp8 KV cache, ops/kv_fp8.h).
// Which blocks a sequence owns (its block table) is decided by the caller (the rollout engine).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "io/config.h"
#include "ops/attention.h"

namespace lockstep {

struct KvCache {
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  std::vector<PagedKv> layers;

  KvCache() = default;
  // dtype: the activations' (f32, bf16) or e4m3.
  KvCache(const ModelConfig& config, DType dtype, int64_t num_blocks, int64_t block_size,
          Device device = Device::cpu);
  // Bytes of one block across all layers, K and V (and their scales).
  static int64_t block_bytes(const ModelConfig& config, DType dtype, int64_t block_size);
};

// Copy-on-write: block src to block dst of every layer's K and V (and scales) for each pair of
// `pairs` (i32 [C, 2] on the cache's device), in order; `host_pairs` holds the same values on the
// host, to split them into runs of copies that do not depend on each other (normally one run),
// one ops/block_copy.h call each (two with scales).
void copy_cache_blocks(KvCache& cache, const Tensor& pairs, std::span<const int32_t> host_pairs);

}  // namespace lockstep
