// model/kv_cache.cpp
#include "model/kv_cache.h"

#include "core/error.h"
#include "ops/block_copy.h"

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

void copy_cache_blocks(KvCache& cache, const Tensor& pairs, std::span<const int32_t> host_pairs) {
  LOCKSTEP_CHECK(int64_t(host_pairs.size()) == 2 * pairs.dim(0), "copy_cache_blocks: ",
                 host_pairs.size(), " host values for ", pairs.dim(0), " pairs");
  std::vector<Tensor> tensors = cache.k;
  tensors.insert(tensors.end(), cache.v.begin(), cache.v.end());
  for (int64_t first = 0; first < pairs.dim(0);) {
    const int64_t count = independent_copies(host_pairs.subspan(size_t(2 * first)));
    copy_blocks(tensors, pairs.rows(first, first + count));
    first += count;
  }
}

}  // namespace lockstep
