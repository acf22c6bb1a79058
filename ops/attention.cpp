// ops/attention.cpp — argument checks and backend dispatch for ops/attention.h. The index tensors
// (cu_seqlens, slots, block tables, context lengths) are checked value by value on the CPU path:
// an out-of-range index would read or write outside a tensor. On CUDA their values stay on the
// device (reading them here would synchronize): the kernels guard every access instead.
#include "ops/attention.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/act_check.h"
#include "ops/attention_backends.h"
#include "ops/forward_kernels.h"
#if LOCKSTEP_HAS_CUDNN
#include "ops/cuda/attention_cudnn.h"
#endif

namespace lockstep {

namespace {

// The packed rows [T, qkv_width]; returns T.
int64_t check_qkv(const std::string& op, const Tensor& qkv, const HeadLayout& layout) {
  check_head_layout(layout);
  LOCKSTEP_CHECK(qkv.defined(), op, ": qkv: tensor is empty (not allocated)");
  LOCKSTEP_CHECK(qkv.rank() == 2, op, ": qkv: expected [T, ", layout.qkv_width(), "] rows, got ",
                 qkv.describe());
  check_act(qkv, (op + ": qkv").c_str(), qkv.device(), {qkv.dim(0), layout.qkv_width()});
  return qkv.dim(0);
}

// An i32 vector on `device`; returns its length.
int64_t check_index_vector(const Tensor& t, const std::string& what, Device device) {
  check_tensor(t, what.c_str(), DType::i32, device);
  LOCKSTEP_CHECK(t.rank() == 1, what, ": expected a 1-D tensor, got ", t.describe());
  return t.dim(0);
}

// i32 [S + 1] offsets into T rows; returns S.
int64_t check_cu_seqlens_shape(const Tensor& cu, const std::string& what, Device device) {
  const int64_t n = check_index_vector(cu, what, device);
  LOCKSTEP_CHECK(n >= 1, what, ": expected [S + 1] offsets, got ", cu.describe());
  return n - 1;
}

void check_cu_seqlens_values(const Tensor& cu, const std::string& what, int64_t T) {
  const int32_t* c = cu.data_as<int32_t>();
  const int64_t S = cu.dim(0) - 1;
  LOCKSTEP_CHECK(c[0] == 0, what, ": must start at 0, got ", c[0]);
  for (int64_t s = 0; s < S; ++s)
    LOCKSTEP_CHECK(c[s + 1] >= c[s], what, ": must not decrease, got ", c[s], " then ", c[s + 1],
                   " at index ", s + 1);
  LOCKSTEP_CHECK(c[S] == T, what, ": must end at the number of rows T = ", T, ", got ", c[S]);
}

// A PagedKv of the layout (ops/attention.h) on `device`; returns the slot count.
int64_t check_caches(const std::string& op, const PagedKv& cache, const HeadLayout& layout, Device device) {
  LOCKSTEP_CHECK(cache.k.defined(), op, ": k_cache: tensor is empty (not allocated)");
  LOCKSTEP_CHECK(cache.k.rank() == 4, op, ": k_cache: expected [num_blocks, block_size, ", layout.kv_heads, ", ",
                 layout.head_dim, "], got ", cache.k.describe());
  const Shape shape{cache.k.dim(0), cache.k.dim(1), layout.kv_heads, layout.head_dim};
  if (!cache.fp8()) {
    check_act(cache.k, (op + ": k_cache").c_str(), device, shape);
    check_act(cache.v, (op + ": v_cache").c_str(), device, shape);
    return shape[0] * shape[1];
  }
  check_tensor(cache.k, (op + ": k_cache").c_str(), DType::e4m3, device);
  check_shape(cache.k, (op + ": k_cache").c_str(), shape);
  check_tensor(cache.v, (op + ": v_cache").c_str(), DType::e4m3, device);
  check_shape(cache.v, (op + ": v_cache").c_str(), shape);
  const Shape scales{shape[0], shape[1], shape[2]};
  check_tensor(cache.k_scale, (op + ": k_scale (an e4m3 cache's scales)").c_str(), DType::f32, device);
  check_shape(cache.k_scale, (op + ": k_scale").c_str(), scales);
  check_tensor(cache.v_scale, (op + ": v_scale (an e4m3 cache's scales)").c_str(), DType::f32, device);
  check_shape(cache.v_scale, (op + ": v_scale").c_str(), scales);
  return shape[0] * shape[1];
}

// What the CUDA kernels take: bf16 activations (16-byte aligned), head_dim 64 or 128.
[[maybe_unused]] void check_cuda(const std::string& op, const HeadLayout& layout,
                                 std::initializer_list<std::pair<const char*, const Tensor*>> acts) {
  LOCKSTEP_CHECK(layout.head_dim == 64 || layout.head_dim == 128, op,
                 ": the CUDA backend supports head_dim 64 and 128, got ", layout.head_dim);
  for (const auto& [name, t] : acts) {
    LOCKSTEP_CHECK(t->dtype() == DType::bf16, op, ": ", name,
                   ": the CUDA backend takes bf16 tensors, got ", t->describe());
    LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(t->data()) % 16 == 0, op, ": ", name,
                   ": CUDA tensors must be 16-byte aligned (a view that starts mid-row?)");
  }
}

// check_cuda with the cache: bf16 (checked as an activation) or e4m3 (16-byte aligned).
[[maybe_unused]] void check_cuda_cache(const std::string& op, const PagedKv& cache, const HeadLayout& layout,
                                       std::initializer_list<std::pair<const char*, const Tensor*>> acts) {
  check_cuda(op, layout, acts);
  if (!cache.fp8()) return check_cuda(op, layout, {{"k_cache", &cache.k}, {"v_cache", &cache.v}});
  for (const Tensor* t : {&cache.k, &cache.v})
    LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(t->data()) % 16 == 0, op,
                   ": CUDA cache tensors must be 16-byte aligned (a view that starts mid-row?)");
}

}  // namespace

#if LOCKSTEP_HAS_CUDNN
namespace {
// Training attention on bf16 CUDA tensors goes through cuDNN's SDPA where it can run, except
// under the exact forward kernels (ops/forward_kernels.h).
bool use_cudnn(const Tensor& qkv) {
  return qkv.device() == Device::cuda && qkv.dtype() == DType::bf16 && !exact_forward() &&
         cudnn::sdpa_available();
}
}  // namespace
#endif

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& cu_seqlens,
                       const HeadLayout& layout) {
  const std::string op = "attention_forward";
  const int64_t T = check_qkv(op, qkv, layout);
  const Device device = qkv.device();
  check_cu_seqlens_shape(cu_seqlens, op + ": cu_seqlens", device);
  check_act(out, "attention_forward: out", device, {T, layout.q_width()});
  check_tensor(lse, "attention_forward: lse", DType::f32, device);
  check_shape(lse, "attention_forward: lse", {T, layout.q_heads});
  if (device == Device::cuda) {
#if LOCKSTEP_HAS_CUDA
    check_cuda(op, layout, {{"qkv", &qkv}, {"out", &out}});
#if LOCKSTEP_HAS_CUDNN
    if (use_cudnn(qkv)) return cudnn::attention_forward(out, lse, qkv, cu_seqlens, layout);
#endif
    return cuda::attention_forward(out, lse, qkv, cu_seqlens, layout);
#else
    LOCKSTEP_NO_CUDA_OP("attention_forward");
#endif
  }
  check_cu_seqlens_values(cu_seqlens, op + ": cu_seqlens", T);
  cpu::attention_forward(out, lse, qkv, cu_seqlens, layout);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const Tensor& cu_seqlens, const HeadLayout& layout) {
  const std::string op = "attention_backward";
  const int64_t T = check_qkv(op, qkv, layout);
  const Device device = qkv.device();
  check_cu_seqlens_shape(cu_seqlens, op + ": cu_seqlens", device);
  check_act(dout, "attention_backward: dout", device, {T, layout.q_width()});
  check_act(out, "attention_backward: out", device, {T, layout.q_width()});
  check_tensor(lse, "attention_backward: lse", DType::f32, device);
  check_shape(lse, "attention_backward: lse", {T, layout.q_heads});
  check_act(dqkv, "attention_backward: dqkv", device, {T, layout.qkv_width()});
  if (device == Device::cuda) {
#if LOCKSTEP_HAS_CUDA
    check_cuda(op, layout, {{"dqkv", &dqkv}, {"dout", &dout}, {"qkv", &qkv}, {"out", &out}});
#if LOCKSTEP_HAS_CUDNN
    if (use_cudnn(qkv))
      return cudnn::attention_backward(dqkv, dout, qkv, out, lse, cu_seqlens, layout);
#endif
    return cuda::attention_backward(dqkv, dout, qkv, out, lse, cu_seqlens, layout);
#else
    LOCKSTEP_NO_CUDA_OP("attention_backward");
#endif
  }
  check_cu_seqlens_values(cu_seqlens, op + ": cu_seqlens", T);
  cpu::attention_backward(dqkv, dout, qkv, out, lse, cu_seqlens, layout);
}

void check_kv_cache_write(const PagedKv& cache, const Tensor& qkv, const Tensor& slots,
                          const HeadLayout& layout) {
  const std::string op = "kv_cache_write";
  const int64_t T = check_qkv(op, qkv, layout);
  const Device device = qkv.device();
  const int64_t capacity = check_caches(op, cache, layout, device);
  check_tensor(slots, "kv_cache_write: slots", DType::i32, device);
  check_shape(slots, "kv_cache_write: slots", {T});
  if (device == Device::cuda) {
    // Slot values are not checked here: a slot outside the cache is skipped, and two rows with
    // one slot race (the rollout's allocator hands out distinct slots).
    check_cuda_cache(op, cache, layout, {{"qkv", &qkv}});
    return;
  }
  // Two rows writing one slot would race: the cache would depend on the thread schedule.
  std::vector<std::pair<int32_t, int64_t>> by_slot(static_cast<size_t>(T));
  const int32_t* s = slots.data_as<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    LOCKSTEP_CHECK(s[t] >= 0 && s[t] < capacity, "kv_cache_write: slots: row ", t, " has slot ",
                   s[t], ", outside the cache's ", capacity, " slots (num_blocks · block_size)");
    by_slot[size_t(t)] = {s[t], t};
  }
  std::sort(by_slot.begin(), by_slot.end());
  for (size_t i = 1; i < by_slot.size(); ++i)
    LOCKSTEP_CHECK(by_slot[i].first != by_slot[i - 1].first, "kv_cache_write: slots: rows ",
                   by_slot[i - 1].second, " and ", by_slot[i].second, " both write slot ",
                   by_slot[i].first);
}

void kv_cache_write(const PagedKv& cache, const Tensor& qkv, const Tensor& slots, const HeadLayout& layout) {
  check_kv_cache_write(cache, qkv, slots, layout);
  if (qkv.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    return cuda::kv_cache_write(cache, qkv, slots, layout);
#else
    LOCKSTEP_NO_CUDA_OP("kv_cache_write");
#endif
  }
  cpu::kv_cache_write(cache, qkv, slots, layout);
}

namespace {

// attention_paged's arguments but the output; returns T.
int64_t check_paged(const std::string& op, const Tensor& qkv, const PagedKv& cache, const Tensor& block_tables,
                    const Tensor& cu_seqlens_q, const Tensor& context_lens, const HeadLayout& layout,
                    bool one_row_each) {
  const int64_t T = check_qkv(op, qkv, layout);
  const Device device = qkv.device();
  check_caches(op, cache, layout, device);
  const int64_t S = check_index_vector(context_lens, op + ": context_lens", device);
  LOCKSTEP_CHECK(check_cu_seqlens_shape(cu_seqlens_q, op + ": cu_seqlens_q", device) == S, op,
                 ": cu_seqlens_q: expected [S + 1] = [", S + 1,
                 "] offsets (S from context_lens), got ", cu_seqlens_q.describe());
  check_tensor(block_tables, (op + ": block_tables").c_str(), DType::i32, device);
  LOCKSTEP_CHECK(block_tables.rank() == 2 && block_tables.dim(0) == S, op,
                 ": block_tables: expected [S = ", S, ", max_blocks], got ", block_tables.describe());
  LOCKSTEP_CHECK(!one_row_each || T == S, op, ": one_row_each: expected one row per sequence, got ", T,
                 " rows for ", S, " sequences");
  return T;
}

#if LOCKSTEP_HAS_CUDA
// check_cuda, and the paged CUDA kernels' limit: the decode kernel puts a kv head's q heads into
// the 16 rows of one MMA tile.
void check_paged_cuda(const std::string& op, const PagedKv& cache, const HeadLayout& layout,
                      std::initializer_list<std::pair<const char*, const Tensor*>> acts) {
  check_cuda_cache(op, cache, layout, acts);
  LOCKSTEP_CHECK(layout.group() <= 16, op, ": the CUDA backend takes at most 16 q heads per kv head, got ",
                 layout.q_heads, " q heads over ", layout.kv_heads, " kv heads");
}
#endif

}  // namespace

void attention_paged(Tensor& out, const Tensor& qkv, const PagedKv& cache, const Tensor& block_tables,
                     const Tensor& cu_seqlens_q, const Tensor& context_lens, const HeadLayout& layout,
                     bool one_row_each) {
  const std::string op = "attention_paged";
  const int64_t T = check_paged(op, qkv, cache, block_tables, cu_seqlens_q, context_lens, layout,
                                one_row_each);
  const Device device = qkv.device();
  const int64_t S = context_lens.dim(0);
  check_act(out, "attention_paged: out", device, {T, layout.q_width()});
  if (device == Device::cuda) {
#if LOCKSTEP_HAS_CUDA
    check_paged_cuda(op, cache, layout, {{"out", &out}, {"qkv", &qkv}});
    return cuda::attention_paged(out, qkv, cache, block_tables, cu_seqlens_q, context_lens,
                                 layout, one_row_each, exact_forward());
#else
    LOCKSTEP_NO_CUDA_OP("attention_paged");
#endif
  }

  check_cu_seqlens_values(cu_seqlens_q, op + ": cu_seqlens_q", T);
  const int32_t* cu = cu_seqlens_q.data_as<int32_t>();
  const int32_t* lens = context_lens.data_as<int32_t>();
  const int32_t* tables = block_tables.data_as<int32_t>();
  const int64_t num_blocks = cache.k.dim(0), block_size = cache.k.dim(1);
  const int64_t max_blocks = block_tables.dim(1);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t n_q = cu[s + 1] - cu[s], len = lens[s];
    LOCKSTEP_CHECK(!one_row_each || n_q == 1, "attention_paged: one_row_each: sequence ", s,
                   " has ", n_q, " rows in cu_seqlens_q");
    LOCKSTEP_CHECK(len >= n_q, "attention_paged: context_lens: sequence ", s, " has ", n_q,
                   " query rows but a context of ", len,
                   " positions (its queries are its last positions)");
    const int64_t blocks = (len + block_size - 1) / block_size;
    LOCKSTEP_CHECK(blocks <= max_blocks, "attention_paged: context_lens: sequence ", s, " has ",
                   len, " positions, more than block_tables' ", max_blocks, " blocks of ",
                   block_size, " hold");
    for (int64_t b = 0; b < blocks; ++b) {
      const int32_t block = tables[s * max_blocks + b];
      LOCKSTEP_CHECK(block >= 0 && block < num_blocks, "attention_paged: block_tables: entry [", s,
                     ", ", b, "] is ", block,
                     ", not a block of the cache (num_blocks = ", num_blocks, ")");
    }
  }
  cpu::attention_paged(out, qkv, cache, block_tables, cu_seqlens_q, context_lens, layout);
}

void attention_paged_fp8(Fp8Rows& out, const Tensor& qkv, const PagedKv& cache, const Tensor& block_tables,
                         const Tensor& cu_seqlens_q, const Tensor& context_lens, const HeadLayout& layout,
                         bool one_row_each, ScaleFormat format) {
  const std::string op = "attention_paged_fp8";
  const int64_t T = check_paged(op, qkv, cache, block_tables, cu_seqlens_q, context_lens, layout,
                                one_row_each);
  check_fp8_rows(out, "attention_paged_fp8: out", T, layout.q_width(), qkv.device());
#if LOCKSTEP_HAS_CUDA
  if (qkv.device() == Device::cuda && one_row_each && !exact_forward() &&
      cuda::decode_quantizes_output(T, layout, block_tables.dim(1) * cache.k.dim(1))) {
    check_paged_cuda(op, cache, layout, {{"qkv", &qkv}});
    return cuda::attention_paged_fp8(out, qkv, cache, block_tables, cu_seqlens_q, context_lens,
                                     layout, format == ScaleFormat::pow2);
  }
#endif
  Tensor attn = Tensor::empty({T, layout.q_width()}, qkv.dtype(), qkv.device());
  attention_paged(attn, qkv, cache, block_tables, cu_seqlens_q, context_lens, layout, one_row_each);
  quantize_rows(out, attn, format);
}

}  // namespace lockstep
