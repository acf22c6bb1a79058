// model/kv_cache.cpp
#include "model/kv_cache.h"

#include "core/error.h"

namespace lockstep {

KvCache::KvCache(const ModelConfig& c, DType dtype, int64_t blocks, int64_t size, Device device)
    : num_blocks(blocks), block_size(size) {
  LOCKSTEP_CHECK(blocks > 0 && size > 0, "KV cache: num_blocks and block_size must be positive, got ",
                 blocks, " and ", size);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    k.push_back(Tensor::empty({blocks, size, c.num_key_value_heads, c.head_dim}, dtype, device));
    v.push_back(Tensor::empty({blocks, size, c.num_key_value_heads, c.head_dim}, dtype, device));
  }
}

int64_t KvCache::block_bytes(const ModelConfig& c, DType dtype, int64_t size) {
  return 2 * c.num_hidden_layers * size * c.num_key_value_heads * c.head_dim *
         int64_t(dtype_size(dtype));
}

}  // namespace lockstep
