// ops/attention_backends.h — per-backend entry points for ops/attention.h; arguments (shapes,
// dtypes, cu_seqlens, block tables, slots) are checked by ops/attention.cpp. The CUDA backend takes
// bf16 tensors and head_dim 64 or 128 (and, paged, at most 16 q heads per kv head); it never
// reads index values on the host: ops/cuda/attention.cu says what bad values do there.
#pragma once

#include "core/tensor.h"
#include "numerics/quantize.h"
#include "ops/attention.h"
#include "ops/head_layout.h"

namespace lockstep::cpu {
void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& cu_seqlens,
                       const HeadLayout& layout);
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const Tensor& cu_seqlens, const HeadLayout& layout);
void kv_cache_write(const PagedKv& cache, const Tensor& qkv, const Tensor& slots, const HeadLayout& layout);
void attention_paged(Tensor& out, const Tensor& qkv, const PagedKv& cache, const Tensor& block_tables,
                     const Tensor& cu_seqlens_q, const Tensor& context_lens, const HeadLayout& layout);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& cu_seqlens,
                       const HeadLayout& layout);
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const Tensor& cu_seqlens, const HeadLayout& layout);
void kv_cache_write(const PagedKv& cache, const Tensor& qkv, const Tensor& slots, const HeadLayout& layout);
void attention_paged(Tensor& out, const Tensor& qkv, const PagedKv& cache, const Tensor& block_tables,
                     const Tensor& cu_seqlens_q, const Tensor& context_lens, const HeadLayout& layout,
                     bool one_row_each, bool decode_as_prefill);
// Whether attention_paged_fp8's decode kernel quantizes its output itself (decode steps, one_row_each)
// at this shape: group · head_dim a multiple of 256 and a grid that fits on the GPU at once
// (otherwise attention_paged then quantize_rows is as fast or faster).
bool decode_quantizes_output(int64_t sequences, const HeadLayout& layout, int64_t max_keys);
void attention_paged_fp8(Fp8Rows& out, const Tensor& qkv, const PagedKv& cache, const Tensor& block_tables, const Tensor& cu_seqlens_q, const Tensor& context_lens,
                         const HeadLayout& layout, bool pow2);
}  // namespace lockstep::cuda
