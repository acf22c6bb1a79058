// rollout/decode_graph.cpp
#include "rollout/decode_graph.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/device.h"
#include "core/early_start.h"
#include "core/error.h"

namespace lockstep {

namespace {

constexpr int64_t kSpecInts = int64_t(sizeof(SampleSpec) / sizeof(int32_t));

// Parts start 16-byte aligned (the specs need 8).
int64_t round_up4(int64_t words) { return (words + 3) / 4 * 4; }

}  // namespace

std::vector<int64_t> DecodeGraph::buckets(int64_t max_sequences) {
  LOCKSTEP_CHECK(max_sequences >= 1, "decode graph: max_sequences must be positive, got ",
                 max_sequences);
  std::vector<int64_t> out;
  // Powers of two up to 16, then alternately ×1.5 and ×4/3: 16, 24, 32, 48, 64, 96, ...
  for (int64_t b = 1; b < max_sequences; b = b < 16 ? 2 * b : (b & (b - 1)) == 0 ? b / 2 * 3 : b / 3 * 4)
    out.push_back(b);
  out.push_back(max_sequences);
  return out;
}

DecodeGraph::DecodeGraph(Transformer& model, KvCache& cache, int64_t max_sequences,
                         int64_t max_blocks, bool graphs, bool record_routing)
    : model_(model),
      cache_(cache),
      max_sequences_(max_sequences),
      width_(max_blocks),
      scratch_(cache.num_blocks - 1),
      record_routing_(record_routing),
      sparse_layers_(model.config().sparse_layers()),
      top_k_(model.config().moe ? model.config().moe->num_experts_per_tok : 0),
      buckets_(buckets(max_sequences)) {
  LOCKSTEP_CHECK(model.device() == Device::cuda, "decode graph: the model must be on the GPU");
  LOCKSTEP_CHECK(cache.num_blocks >= 2 && max_blocks >= 1 && max_blocks < cache.num_blocks,
                 "decode graph: expected a cache of a scratch block and at least max_blocks more, ",
                 "got ", cache.num_blocks, " blocks and max_blocks ", max_blocks);
  LOCKSTEP_CHECK(!graphs || model.decode_reads_nothing_back(), "decode graph: this sparse model's forward reads "
                 "its expert counts back (only the grouped fp8 experts do not): it cannot be captured");
  const int64_t n = max_sequences;
  const int64_t routing = sparse_layers_ * n * top_k_;
  const int64_t sizes[kParts] = {n, n, n, n + 1, n, n, n * kSpecInts, 2 * n, 2 * n, routing, n * width_};
  for (int p = 0; p < kParts; ++p) offsets_[p + 1] = offsets_[p] + round_up4(sizes[p]);
  host_ = Tensor::empty_pinned({offsets_[kParts]}, DType::i32);
  std::memset(host_.data(), 0, host_.nbytes());
  // Every sequence is one row: the same offsets and last rows in every bucket.
  for (int64_t i = 0; i <= n; ++i) host(kCu)[i] = int32_t(i);
  for (int64_t i = 0; i < n; ++i) host(kLastRows)[i] = int32_t(i);
  device_ = Tensor::empty({offsets_[kParts]}, DType::i32, Device::cuda);
  if (graphs) stream_.emplace();
}

void DecodeGraph::stage_padding(int64_t row) {
  const int32_t block_size = int32_t(cache_.block_size);
  host(kTokens)[row] = 0;
  host(kPositions)[row] = 0;
  host(kSlots)[row] = int32_t(scratch_) * block_size;
  host(kContextLens)[row] = 1;
  const SampleSpec greedy{.row = int32_t(row), .temperature = 0.0f};
  std::memcpy(host(kSpecs) + row * kSpecInts, &greedy, sizeof greedy);
  host(kTable)[row * width_] = int32_t(scratch_);
}

// The rows of `bucket` rows and the [bucket, width] corner of the block tables: what the step reads.
void DecodeGraph::upload(int64_t bucket, int64_t width) {
  device_copy_async(device(kTokens), Device::cuda, host(kTokens), Device::cpu,
                    size_t(offsets_[kOut]) * sizeof(int32_t));
  const size_t pitch = size_t(width_) * sizeof(int32_t);
  device_copy_2d_async(device(kTable), pitch, Device::cuda, host(kTable), pitch, Device::cpu,
                       size_t(width) * sizeof(int32_t), size_t(bucket));
}

void DecodeGraph::forward(int64_t bucket) {
  auto view = [&](Part p, Shape shape, DType dtype = DType::i32) {
    return Tensor::view_of(device(p), std::move(shape), dtype, Device::cuda);
  };
  const InferBatch batch{view(kTokens, {bucket}),      view(kPositions, {bucket}),
                         view(kSlots, {bucket}),       view(kCu, {bucket + 1}),
                         view(kContextLens, {bucket}), view(kTable, {bucket, width_}),
                         view(kLastRows, {bucket}),    /*one_row_each=*/true,
                         sparse_layers_ > 0 ? view(kRouting, {sparse_layers_, bucket, top_k_}) : Tensor()};
  const EarlyStartScope early;  // a decode step writes no weight, nor the inputs uploaded for it
  const Tensor hidden = model_.forward_infer(batch, cache_);
  Tensor tokens = view(kOut, {bucket});
  Tensor logprobs = Tensor::view_of(device(kOut) + max_sequences_, {bucket}, DType::f32,
                                    Device::cuda);
  sample_tokens(tokens, logprobs, model_.logits(hidden),
                view(kSpecs, {bucket, kSampleSpecWords}, DType::i64));
}

void DecodeGraph::capture() {
  for (int64_t row = 0; row < max_sequences_; ++row) stage_padding(row);
  device_synchronize();  // what the current stream queued (writes to the cache) comes first
  const CurrentStream on(*stream_);
  upload(max_sequences_, 1);
  for (int64_t b : buckets_) forward(b);
  // The temporaries from an arena, doubled until every bucket's capture fits in it.
  for (size_t bytes = size_t(32) << 20;; bytes *= 2) {
    arena_.emplace(bytes);
    try {
      for (int64_t b : buckets_)
        graphs_.push_back(CudaGraph::capture(*stream_, [&] {
          const ArenaScope scope(*arena_);
          forward(b);
        }));
      break;
    } catch (const GraphArena::Full&) {
      graphs_.clear();
      arena_.reset();
    } catch (...) {
      graphs_.clear();  // all buckets or none
      arena_.reset();
      throw;
    }
  }
  if (graph_diagnostics())
    std::fprintf(stderr, "decode graphs: %zu buckets, arena of %.1f MB (%.1f MB used at most)\n", graphs_.size(),
                 double(arena_->capacity()) / 1e6, double(arena_->high_water()) / 1e6);
  stream_->synchronize();  // the warm-up is done before the current stream goes on
}

DecodeGraph::Drawn DecodeGraph::run(std::span<const Row> rows, std::span<const int32_t> copies) {
  const int64_t count = int64_t(rows.size()), copy_count = int64_t(copies.size()) / 2;
  LOCKSTEP_CHECK(count >= 1 && count <= max_sequences_, "decode graph: ", count,
                 " rows, expected 1 to ", max_sequences_);
  LOCKSTEP_CHECK(copies.size() % 2 == 0 && copy_count <= count, "decode graph: ", copies.size(),
                 " copy-on-write values for ", count, " rows (at most a pair a row)");
  if (stream_ && graphs_.empty()) capture();
  const size_t k = size_t(std::lower_bound(buckets_.begin(), buckets_.end(), count) - buckets_.begin());
  const int64_t bucket = buckets_[k], block_size = cache_.block_size;

  // The previous step's uploads are done: its run() waited for its draws.
  int64_t width = 1;
  for (int64_t i = 0; i < count; ++i) {
    const Row& r = rows[size_t(i)];
    const int64_t blocks = int64_t(r.blocks.size());
    LOCKSTEP_CHECK(r.position >= 0 && r.position < blocks * block_size && blocks <= width_,
                   "decode graph: row ", i, " at position ", r.position, " holds ", blocks,
                   " blocks (expected the position's block, and at most ", width_, ")");
    host(kTokens)[i] = r.token;
    host(kPositions)[i] = r.position;
    host(kSlots)[i] = int32_t(r.blocks[size_t(r.position / block_size)] * block_size +
                              r.position % block_size);
    host(kContextLens)[i] = r.position + 1;
    SampleSpec spec = r.spec;
    spec.row = int32_t(i);
    std::memcpy(host(kSpecs) + i * kSpecInts, &spec, sizeof spec);
    std::copy(r.blocks.begin(), r.blocks.end(), host(kTable) + i * width_);
    width = std::max(width, blocks);
  }
  for (int64_t i = count; i < bucket; ++i) stage_padding(i);
  std::copy(copies.begin(), copies.end(), host(kCopies));
  const auto launch = std::chrono::steady_clock::now();
  if (done_) host_seconds_ += std::chrono::duration<double>(launch - *done_).count();
  upload(bucket, width);

  if (copy_count > 0)
    copy_cache_blocks(cache_, Tensor::view_of(device(kCopies), {copy_count, 2}, DType::i32,
                                              Device::cuda), copies);
  if (stream_) graphs_[k].launch();
  else forward(bucket);
  device_copy_async(host(kOut), Device::cpu, device(kOut), Device::cuda,
                    size_t(2 * max_sequences_) * sizeof(int32_t));
  const Shape routing{sparse_layers_, bucket, top_k_};
  const bool routing_back = record_routing_ && sparse_layers_ > 0;
  if (routing_back)
    device_copy_async(host(kRouting), Device::cpu, device(kRouting), Device::cuda,
                      size_t(sparse_layers_ * bucket * top_k_) * sizeof(int32_t));
  stream_synchronize();
  done_ = std::chrono::steady_clock::now();
  return {{host(kOut), size_t(count)},
          {reinterpret_cast<const float*>(host(kOut) + max_sequences_), size_t(count)},
          routing_back ? Tensor::view_of(host(kRouting), routing, DType::i32, Device::cpu) : Tensor()};
}

}  // namespace lockstep
