// ops/attention.h — causal self-attention with grouped-query heads (ops/head_layout.h).
//
// Math for one query row (head h, kv head g = h / group, keys j = 0..n−1 of its context):
//   s_j = (q · k_j) / sqrt(head_dim)        fp32
//   p_j = exp(s_j − max_j s) / Σ_j exp(s_j − max_j s)
//   o   = Σ_j p_j · v_j                     fp32, rounded once to the output dtype
//   lse = max_j s + log Σ_j exp(s_j − max_j s)
// On the CPU every row is computed by the same function, keys in increasing position, so a row's
// result depends only on its query and its context's keys/values: the training forward and the
// paged inference path give identical bits for identical k/v values.
//
// Training (packed varlen): sequence s holds tokens [cu_seqlens[s], cu_seqlens[s+1]); a query
// attends the keys of its own sequence up to and including its own position.
//   qkv:  f32/bf16 [T, qkv_width] (after ops/qkv_rope.h)      cu_seqlens: i32 [S + 1], from 0 to T
//   out:  f32/bf16 [T, q_width]       lse: f32 [T, q_heads] (saved for backward)
//   dqkv: f32/bf16 [T, qkv_width]     (q, k and v parts all written)
//
// Inference over a paged KV cache (vLLM's layout), one layer of it a PagedKv:
//   k, v: [num_blocks, block_size, kv_heads, head_dim] in the activations' dtype (f32/bf16), or in
//   e4m3 with k_scale, v_scale f32 [num_blocks, block_size, kv_heads] (the fp8 KV cache,
//   ops/kv_fp8.h: one power-of-two scale per token and kv head; a cached key or value is
//   e4m3 · scale, which is the bf16 value round_kv_to_fp8 gives the training forward's k and v).
//   a token's slot is block · block_size + offset; kv_cache_write copies the k and v heads of each
//   row of qkv to slots[t] (i32 [T]) — into an fp8 cache quantized by ops/kv_fp8.h's rule.
//   attention_paged: sequence s owns query rows [cu_seqlens_q[s], cu_seqlens_q[s+1]) which are its
//   last n_s positions: row i of s sits at position context_lens[s] − n_s + i and attends cache
//   positions 0..that position (its own k/v must already be written). Position p of sequence s
//   lives in block block_tables[s, p / block_size] at offset p % block_size.
//   block_tables: i32 [S, max_blocks]; context_lens: i32 [S]; out: [T, q_width].
//   one_row_each: the caller's promise that every sequence has exactly one row (a decode step:
//   T = S, cu_seqlens_q = 0, 1, …, S; T = S is checked, and on the CPU the offsets). The result is
//   the same; on CUDA only the one-row kernels run, and a sequence s whose offsets are not (s, s+1)
//   makes row s NaN (instead of every row, as without the promise).
//
// CUDA (ops/cuda/attention.cu): bf16 tensors (caches bf16 or e4m3), head_dim 64 or 128, paged at most 16 q heads per
// kv head. Index values stay on the device and are not checked up front: a malformed cu_seqlens
// makes every output row NaN, a context length or block id out of range makes that sequence's
// rows NaN, and kv_cache_write skips rows whose slot is outside the cache (two rows with one slot
// race). dQ's last bits vary from run to run (atomic adds). Paged rows of multi-row sequences are
// bit-identical to the training forward's rows; one-row (decode) sequences take the split-context
// kernel and agree to rounding.
//
// attention_paged_fp8: attention_paged's output quantized rowwise (quantize_rows, `format`), the
// o projection's input in the fp8 recipe. On CUDA, under one_row_each, with group · head_dim a
// multiple of 256 (a kv head's q heads span whole 128-column groups, in whole warps: Qwen3 and
// Llama 3 at head_dim 128) and a decode grid that fits on the GPU at once (small batches:
// ops/cuda/attention.cu), the decode kernel writes the bytes and scales itself (the same bytes:
// the same values through the same quantization), sparing a bf16 output and a quantize launch in
// every layer of a decode step; otherwise, and on the CPU, it is attention_paged followed by
// quantize_rows.
#pragma once

#include "core/tensor.h"
#include "numerics/quantize.h"
#include "ops/head_layout.h"

namespace lockstep {

// One layer of a paged KV cache (above). The tensors are handles: a copy refers to the same memory.
struct PagedKv {
  Tensor k, v;
  Tensor k_scale = Tensor(), v_scale = Tensor();  // the fp8 cache's scales; undefined otherwise
  bool fp8() const { return k.dtype() == DType::e4m3; }
};

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& cu_seqlens,
                       const HeadLayout& layout);

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const Tensor& cu_seqlens, const HeadLayout& layout);

void kv_cache_write(const PagedKv& cache, const Tensor& qkv, const Tensor& slots, const HeadLayout& layout);

// kv_cache_write's argument checks alone (on the CPU with the slot values), for an op that writes
// the cache as kv_cache_write does (ops/qkv_rope.h's inference form).
void check_kv_cache_write(const PagedKv& cache, const Tensor& qkv, const Tensor& slots,
                          const HeadLayout& layout);

void attention_paged(Tensor& out, const Tensor& qkv, const PagedKv& cache, const Tensor& block_tables,
                     const Tensor& cu_seqlens_q, const Tensor& context_lens, const HeadLayout& layout,
                     bool one_row_each = false);

void attention_paged_fp8(Fp8Rows& out, const Tensor& qkv, const PagedKv& cache, const Tensor& block_tables,
                         const Tensor& cu_seqlens_q, const Tensor& context_lens, const HeadLayout& layout,
                         bool one_row_each = false, ScaleFormat format = ScaleFormat::fp32);

}  // namespace lockstep
