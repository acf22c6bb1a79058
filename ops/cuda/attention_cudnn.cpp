// ops/cuda/attention_cudnn.cpp — see ops/cuda/attention_cudnn.h. The only file that includes the
// cuDNN frontend. It is compiled by the host compiler rather than nvcc, and without the frontend's
// JSON serialization (CUDNN_FRONTEND_SKIP_JSON_LIB, set in ops/CMakeLists.txt; nothing here
// serializes plans), at -O1: ~40 s of CPU, where nvcc took ~250 s for the bare include. Its two
// small kernels are in attention_cudnn_index.cu.
//
// Graph layout (W = qkv_width, s = the bucket's length bound, b = its sequence count):
//   q, k, v and dq, dk, dv: [b, heads, s, d], strides [s·W, d, W, 1], base pointers at the head
//     group's first column in the qkv / dqkv rows (ops/head_layout.h): nothing is copied
//   out, dout:              [b, q_heads, s, d], strides [s·q_width, d, q_width, 1]
//   lse (cuDNN's Stats):    [b, q_heads, s, 1], strides [s·q_heads, 1, q_heads, 1]
// All are ragged: sequence b starts at element offsets[b] of its tensor (row cu[b]) and is
// seq_len[b] long (padding mask), so the batch strides are never used. Causal masking is top-left
// within each sequence (diagonal band, right bound 0): ops/attention.h's mask.
//
// Shape buckets: s must bound every sequence's length, and without reading cu_seqlens on the host
// (a sync) the only bound is T, as in Transformer Engine's THD path. T is rounded up to a quarter
// of its power of two (at most 25% over, four plans per doubling of T) and the sequence count to a
// power of two (the extra sequences are empty). The backward also gets s as max_total_seq_len,
// which sizes its fp32 accumulators by tokens (ragged, like dq) instead of by b·s.
#include "ops/cuda/attention_cudnn.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <compare>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "core/error.h"
#include "ops/cuda/attention_cudnn_index.h"

namespace lockstep::cudnn {

namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// 9.6: grouped-query attention with ragged offsets, ragged (token-major) Stats in the backward,
// max_total_seq_len; the ragged offsets are int64 from then on.
constexpr size_t kMinCudnnVersion = 90600;
constexpr int64_t kMinLengthGranule = 256;
constexpr int64_t kAlign = 16;

// Tensor ids of the variant pack. The index tensors are the same in both directions.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV,
  kSeqLenQ, kSeqLenKV, kOffsetQ, kOffsetK, kOffsetV, kOffsetO, kOffsetStats,
};

struct Key {
  bool backward;
  int64_t q_heads, kv_heads, head_dim;
  int64_t batch;       // sequences, a power of two
  int64_t max_length;  // s: bounds every sequence's length (and T)
  auto operator<=>(const Key&) const = default;
};

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

struct Context {
  std::mutex mutex;  // one handle: its stream is set, and plans run, under the lock
  cudnnHandle_t handle = nullptr;
  std::map<Key, Plan> plans;
};

// nullptr where cuDNN SDPA cannot run. SM 8.x and 12.x are left out: their backward rejects ragged
// Stats.
Context* context() {
  static Context* ctx = []() -> Context* {
    if (cudnnGetVersion() < kMinCudnnVersion) return nullptr;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      (void)cudaGetLastError();  // no device: not sticky, clear it
      return nullptr;
    }
    cudnnHandle_t handle = nullptr;
    if ((major != 9 && major != 10) || cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) return nullptr;
    auto* c = new Context;  // never freed, like ops/cuda/gemm.cu's: outlives every static user
    c->handle = handle;
    return c;
  }();
  return ctx;
}

Context& checked_context(const char* op) {
  Context* ctx = context();
  LOCKSTEP_CHECK(ctx, op, ": cuDNN SDPA cannot run here: it needs cuDNN >= 9.6 (found ",
                 cudnnGetVersion(), ") and a GPU of compute capability 9.x or 10.x");
  return *ctx;
}

std::string describe(const Key& key) {
  return detail::concat("cuDNN SDPA ", key.backward ? "backward" : "forward", " (q_heads ",
                        key.q_heads, ", kv_heads ", key.kv_heads, ", head_dim ", key.head_dim,
                        ", ", key.batch, " sequences of at most ", key.max_length, " tokens)");
}

void check(fe::error_t status, const char* step, const Key& key) {
  if (status.is_bad()) fail(detail::concat(describe(key), ": ", step, ": ", status.get_message()));
}

Key key_for(bool backward, const Tensor& qkv, const Tensor& cu_seqlens, const HeadLayout& layout) {
  const int64_t T = qkv.dim(0), S = cu_seqlens.dim(0) - 1;
  const int64_t granule =
      std::max(int64_t(std::bit_floor(uint64_t(T))) / 4, kMinLengthGranule);
  return {backward, layout.q_heads, layout.kv_heads, layout.head_dim,
          int64_t(std::bit_ceil(uint64_t(std::max<int64_t>(S, 1)))),
          (T + granule - 1) / granule * granule};
}

// [n, 1, 1, 1] per-sequence tensor (lengths i32, ragged offsets i64).
TensorPtr index_tensor(fe::graph::Graph& g, const char* name, Uid uid, int64_t n,
                       fe::DataType_t type) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({n, 1, 1, 1})
                      .set_stride({1, 1, 1, 1}).set_data_type(type));
}

// Describes `t` as `heads` heads of d columns in packed rows of `row` elements (layout above).
void set_rows(fe::graph::Tensor_attributes& t, const char* name, Uid uid, const Key& key,
              int64_t heads, int64_t row, const TensorPtr& offsets) {
  const int64_t s = key.max_length, d = key.head_dim;
  t.set_name(name).set_uid(uid).set_data_type(fe::DataType_t::BFLOAT16)
      .set_dim({key.batch, heads, s, d}).set_stride({s * row, d, row, 1})
      .set_ragged_offset(offsets);
}

TensorPtr rows_input(fe::graph::Graph& g, const char* name, Uid uid, const Key& key, int64_t heads,
                     int64_t row, const TensorPtr& offsets) {
  auto t = g.tensor(fe::graph::Tensor_attributes());
  set_rows(*t, name, uid, key, heads, row, offsets);
  return t;
}

// The tensors both directions share: q, k, v, the lengths and the ragged offsets.
struct Inputs {
  TensorPtr q, k, v, seq_len_q, seq_len_kv, offsets_q, offsets_k, offsets_v, offsets_o,
      offsets_stats;
};

Inputs make_inputs(fe::graph::Graph& g, const Key& key) {
  const int64_t b = key.batch, row = (key.q_heads + 2 * key.kv_heads) * key.head_dim;
  Inputs in;
  in.offsets_q = index_tensor(g, "offsets_q", kOffsetQ, b + 1, fe::DataType_t::INT64);
  in.offsets_k = index_tensor(g, "offsets_k", kOffsetK, b + 1, fe::DataType_t::INT64);
  in.offsets_v = index_tensor(g, "offsets_v", kOffsetV, b + 1, fe::DataType_t::INT64);
  in.offsets_o = index_tensor(g, "offsets_o", kOffsetO, b + 1, fe::DataType_t::INT64);
  in.offsets_stats = index_tensor(g, "offsets_stats", kOffsetStats, b + 1, fe::DataType_t::INT64);
  in.seq_len_q = index_tensor(g, "seq_len_q", kSeqLenQ, b, fe::DataType_t::INT32);
  in.seq_len_kv = index_tensor(g, "seq_len_kv", kSeqLenKV, b, fe::DataType_t::INT32);
  in.q = rows_input(g, "q", kQ, key, key.q_heads, row, in.offsets_q);
  in.k = rows_input(g, "k", kK, key, key.kv_heads, row, in.offsets_k);
  in.v = rows_input(g, "v", kV, key, key.kv_heads, row, in.offsets_v);
  return in;
}

void set_stats(fe::graph::Tensor_attributes& stats, const Key& key, const TensorPtr& offsets) {
  const int64_t s = key.max_length, h = key.q_heads;
  stats.set_name("stats").set_uid(kStats).set_data_type(fe::DataType_t::FLOAT)
      .set_dim({key.batch, h, s, 1}).set_stride({s * h, 1, h, 1}).set_ragged_offset(offsets);
}

float softmax_scale(const Key& key) { return float(1.0 / std::sqrt(double(key.head_dim))); }

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Graph> forward_graph(const Key& key,
                                                fe::AttentionImplementation_t implementation) {
  auto g = new_graph();
  const Inputs in = make_inputs(*g, key);
  auto options = fe::graph::SDPA_attributes()
                     .set_name("attention_forward")
                     .set_implementation(implementation)
                     .set_generate_stats(true)
                     .set_attn_scale(softmax_scale(key))
                     .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                     .set_diagonal_band_right_bound(0)
                     .set_padding_mask(true)
                     .set_seq_len_q(in.seq_len_q)
                     .set_seq_len_kv(in.seq_len_kv);
  auto [o, stats] = g->sdpa(in.q, in.k, in.v, options);
  o->set_output(true);
  set_rows(*o, "o", kO, key, key.q_heads, key.q_heads * key.head_dim, in.offsets_o);
  stats->set_output(true);
  set_stats(*stats, key, in.offsets_stats);
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const Key& key) {
  auto g = new_graph();
  const Inputs in = make_inputs(*g, key);
  const int64_t q_width = key.q_heads * key.head_dim;
  const int64_t row = q_width + 2 * key.kv_heads * key.head_dim;
  auto o = rows_input(*g, "o", kO, key, key.q_heads, q_width, in.offsets_o);
  auto dout = rows_input(*g, "dout", kDO, key, key.q_heads, q_width, in.offsets_o);
  auto stats = g->tensor(fe::graph::Tensor_attributes());
  set_stats(*stats, key, in.offsets_stats);
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward")
                     .set_attn_scale(softmax_scale(key))
                     .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                     .set_diagonal_band_right_bound(0)
                     .set_padding_mask(true)
                     .set_seq_len_q(in.seq_len_q)
                     .set_seq_len_kv(in.seq_len_kv)
                     .set_max_total_seq_len_q(key.max_length)
                     .set_max_total_seq_len_kv(key.max_length);
  auto [dq, dk, dv] = g->sdpa_backward(in.q, in.k, in.v, o, dout, stats, options);
  for (auto& t : {dq, dk, dv}) t->set_output(true);
  set_rows(*dq, "dq", kDQ, key, key.q_heads, row, in.offsets_q);
  set_rows(*dk, "dk", kDK, key, key.kv_heads, row, in.offsets_k);
  set_rows(*dv, "dv", kDV, key, key.kv_heads, row, in.offsets_v);
  return g;
}

// Validates `graph`, picks and compiles its plan. LOCKSTEP_SDPA_VERBOSE=1 prints one line per plan
// (build time, workspace) on stderr.
Plan build(Context& ctx, const Key& key, std::shared_ptr<fe::graph::Graph> graph) {
  static const bool verbose = [] {
    const char* env = std::getenv("LOCKSTEP_SDPA_VERBOSE");
    return env && std::string_view(env) == "1";
  }();
  try {
    const auto start = std::chrono::steady_clock::now();
    Plan plan{std::move(graph)};
    fe::graph::Graph& g = *plan.graph;
    check(g.validate(), "validate", key);
    check(g.build_operation_graph(ctx.handle), "build_operation_graph", key);
    check(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
          "create_execution_plans", key);
    check(g.check_support(), "not supported (check_support)", key);
    check(g.build_plans(), "build_plans", key);
    check(g.get_workspace_size(plan.workspace_bytes), "get_workspace_size", key);
    if (verbose) {
      const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
      std::fprintf(stderr, "%s: plan built in %.2f s, workspace %.1f MiB\n", describe(key).c_str(),
                   seconds.count(), double(plan.workspace_bytes) / (1 << 20));
    }
    return plan;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // parts of the frontend throw rather than return errors
    fail(detail::concat(describe(key), ": ", e.what()));
  }
}

// The forward lets the frontend pick its implementation (the newer UNIFIED one where its support
// surface allows); the long-standing COMPOSITE one, the backward's, is the fallback when the
// pick cannot be built with the cuDNN at hand.
Plan build(Context& ctx, const Key& key) {
  if (key.backward) return build(ctx, key, backward_graph(key));
  try {
    return build(ctx, key, forward_graph(key, fe::AttentionImplementation_t::AUTO));
  } catch (const Error& automatic) {
    try {
      return build(ctx, key, forward_graph(key, fe::AttentionImplementation_t::COMPOSITE));
    } catch (const Error& composite) {
      fail(detail::concat(automatic.what(), "; with the COMPOSITE implementation: ",
                          composite.what()));
    }
  }
}

int64_t align(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Makes the per-sequence tensors from cu_seqlens in scratch memory, runs key's plan with the tensor
// pointers in `pack`, then fills `outputs` with NaN if cu_seqlens was invalid.
void run(const char* op, const Key& key, const Tensor& qkv, const Tensor& cu_seqlens,
         std::unordered_map<int64_t, void*> pack, const FillRanges& outputs) {
  Context& ctx = checked_context(op);
  std::lock_guard lock(ctx.mutex);
  auto it = ctx.plans.find(key);
  if (it == ctx.plans.end()) it = ctx.plans.emplace(key, build(ctx, key)).first;
  const Plan& plan = it->second;

  // One allocation: cuDNN's workspace, the three offset arrays, the lengths, the invalid flag.
  const int64_t b = key.batch, offsets_bytes = align((b + 1) * 8);
  const int64_t index_at = align(plan.workspace_bytes);
  const int64_t bytes = index_at + 3 * offsets_bytes + align(b * 4) + kAlign;
  Tensor scratch = Tensor::empty({(bytes + 7) / 8}, DType::i64, Device::cuda);
  char* base = static_cast<char*>(scratch.data());
  SdpaIndex index;
  for (int k = 0; k < 3; ++k)
    index.offsets[k] = reinterpret_cast<int64_t*>(base + index_at + k * offsets_bytes);
  index.seq_len = reinterpret_cast<int32_t*>(base + index_at + 3 * offsets_bytes);
  index.invalid = reinterpret_cast<int32_t*>(base + index_at + 3 * offsets_bytes + align(b * 4));

  const int64_t q_width = key.q_heads * key.head_dim;
  const int64_t row_elements[3] = {qkv.dim(1), q_width, key.q_heads};
  make_sdpa_index(index, cu_seqlens.data_as<int32_t>(), cu_seqlens.dim(0) - 1, b, qkv.dim(0),
                  row_elements);
  pack[kSeqLenQ] = pack[kSeqLenKV] = index.seq_len;
  pack[kOffsetQ] = pack[kOffsetK] = pack[kOffsetV] = index.offsets[0];
  pack[kOffsetO] = index.offsets[1];
  pack[kOffsetStats] = index.offsets[2];

  const cudnnStatus_t status = cudnnSetStream(ctx.handle, current_stream());
  LOCKSTEP_CHECK(status == CUDNN_STATUS_SUCCESS, op, ": cudnnSetStream: ",
                 cudnnGetErrorString(status));
  check(plan.graph->execute(ctx.handle, pack, base), "execute", key);
  fill_if_invalid(index.invalid, outputs);
}

// cuDNN assumes 16-byte aligned tensors when it picks its kernels.
void check_aligned(const Tensor& t, const char* what) {
  LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(t.data()) % kAlign == 0, what,
                 ": cuDNN SDPA needs 16-byte aligned data, got address ", t.data());
}

void check_bf16(const Tensor& t, const char* what) {
  LOCKSTEP_CHECK(t.dtype() == DType::bf16, what, ": cuDNN SDPA takes bf16, got ", t.describe());
  check_aligned(t, what);
}

void check_lse(const Tensor& lse, const char* what) {
  check_tensor(lse, what, DType::f32, Device::cuda);
  check_aligned(lse, what);
}

void check_head_dim(const char* op, const HeadLayout& layout) {
  LOCKSTEP_CHECK(layout.head_dim % 8 == 0, op,
                 ": cuDNN SDPA needs head_dim to be a multiple of 8, got ", layout.head_dim);
}

// 4-byte words of a tensor (its bytes are a multiple of 4: head_dim is even, lse is f32).
int64_t words(const Tensor& t) { return int64_t(t.nbytes() / 4); }

// Byte address of column `column` of a bf16 tensor's first row.
void* at_column(const Tensor& t, int64_t column) {
  return static_cast<char*>(t.data()) + column * int64_t(sizeof(bf16));
}

}  // namespace

bool sdpa_available() { return context() != nullptr; }

size_t sdpa_plan_count() {
  Context* ctx = context();
  if (!ctx) return 0;
  std::lock_guard lock(ctx->mutex);
  return ctx->plans.size();
}

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& cu_seqlens,
                       const HeadLayout& layout) {
  const char* op = "attention_forward (cuDNN)";
  check_head_dim(op, layout);
  check_bf16(qkv, "attention_forward (cuDNN): qkv");
  check_bf16(out, "attention_forward (cuDNN): out");
  check_lse(lse, "attention_forward (cuDNN): lse");
  if (qkv.dim(0) == 0) return;
  const Key key = key_for(false, qkv, cu_seqlens, layout);
  run(op, key, qkv, cu_seqlens,
      {{kQ, qkv.data()},
       {kK, at_column(qkv, layout.k_offset())},
       {kV, at_column(qkv, layout.v_offset())},
       {kO, out.data()},
       {kStats, lse.data()}},
      {{out.data(), lse.data()}, {words(out), words(lse)}});
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const Tensor& cu_seqlens, const HeadLayout& layout) {
  const char* op = "attention_backward (cuDNN)";
  check_head_dim(op, layout);
  check_bf16(qkv, "attention_backward (cuDNN): qkv");
  check_bf16(out, "attention_backward (cuDNN): out");
  check_bf16(dout, "attention_backward (cuDNN): dout");
  check_bf16(dqkv, "attention_backward (cuDNN): dqkv");
  check_lse(lse, "attention_backward (cuDNN): lse");
  if (qkv.dim(0) == 0) return;
  const Key key = key_for(true, qkv, cu_seqlens, layout);
  run(op, key, qkv, cu_seqlens,
      {{kQ, qkv.data()},
       {kK, at_column(qkv, layout.k_offset())},
       {kV, at_column(qkv, layout.v_offset())},
       {kO, out.data()},
       {kDO, dout.data()},
       {kStats, lse.data()},
       {kDQ, dqkv.data()},
       {kDK, at_column(dqkv, layout.k_offset())},
       {kDV, at_column(dqkv, layout.v_offset())}},
      {{dqkv.data(), nullptr}, {words(dqkv), 0}});
}

}  // namespace lockstep::cudnn
