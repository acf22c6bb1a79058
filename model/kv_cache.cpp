// model/kv_cache.cpp
#include "model/kv_cache.h"

#include "core/error.h"
#include "ops/block_copy.h"

namespace lockstep {

KvCache::KvCache(const ModelConfig& c, DType dtype, int64_t blocks, int64_t size, Device device)
    : num_blocks(blocks), block_size(size) {
  LOCKSTEP_CHECK(blocks > 0 && size > 0, "KV cache: num_blocks and block_size must be positive, got ",
                 blocks, " and ", size);
  LOCKSTEP_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::e4m3,
                 "KV cache: dtype must be f32, bf16 or e4m3, got ", dtype_name(dtype));
  const int64_t heads = c.num_key_value_heads;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    PagedKv layer;
    layer.k = Tensor::empty({blocks, size, heads, c.head_dim}, dtype, device);
    layer.v = Tensor::empty({blocks, size, heads, c.head_dim}, dtype, device);
    if (dtype == DType::e4m3) {
      layer.k_scale = Tensor::empty({blocks, size, heads}, DType::f32, device);
      layer.v_scale = Tensor::empty({blocks, size, heads}, DType::f32, device);
    }
    layers.push_back(std::move(layer));
  }
}

int64_t KvCache::block_bytes(const ModelConfig& c, DType dtype, int64_t size) {
  const int64_t scale_bytes = dtype == DType::e4m3 ? int64_t(sizeof(float)) : 0;
  return 2 * c.num_hidden_layers * size * c.num_key_value_heads *
         (c.head_dim * int64_t(dtype_size(dtype)) + scale_bytes);
}

void copy_cache_blocks(KvCache& cache, const Tensor& pairs, std::span<const int32_t> host_pairs) {
  LOCKSTEP_CHECK(int64_t(host_pairs.size()) == 2 * pairs.dim(0), "copy_cache_blocks: ",
                 host_pairs.size(), " host values for ", pairs.dim(0), " pairs");
  std::vector<Tensor> values, scales;
  for (const PagedKv& layer : cache.layers) {
    values.push_back(layer.k);
    values.push_back(layer.v);
    if (layer.fp8()) {
      scales.push_back(layer.k_scale);
      scales.push_back(layer.v_scale);
    }
  }
  for (int64_t first = 0; first < pairs.dim(0);) {
    const int64_t count = independent_copies(host_pairs.subspan(size_t(2 * first)));
    const Tensor run = pairs.rows(first, first + count);
    copy_blocks(values, run);
    if (!scales.empty()) copy_blocks(scales, run);
    first += count;
  }
}

}  // namespace lockstep
