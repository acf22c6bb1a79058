// rollout/decode_graph.h — the rollout engine's decode steps on the GPU: padded to a bucket of
// sequences, run from static device buffers, and replayed from CUDA graphs.
//
// A decode step: S sequences that each compute their newest token (at their last position) and
// draw the next one. It runs padded to B = the smallest of buckets(max_sequences) ≥ S: 1, 2, 4, 8,
// 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, ... below max_sequences, then max_sequences. Rows
// [S, B) are padding and inert: token 0 at position 0, writing its k/v to slot 0 of the scratch
// block (the cache's last block, which the engine's scheduler never hands out; all padding rows
// write that slot with the same inputs, and only padding rows read it) and attending to it alone,
// drawing greedily; their draws are dropped.
//
// Every input lives at a fixed device address, sized for max_sequences rows: token ids, positions,
// slots, context lengths, sample specs, copy-on-write pairs, and block tables [max_sequences, W]
// (W = max_blocks, the most blocks a row may hold: the engine takes the blocks of the model's
// max_position_embeddings, and runs longer sequences' steps without this). A step of bucket B
// therefore has the same shapes every time — cuBLASLt's algorithm for B rows, the attention's
// split count (from B and W) — and nothing is read back but its results. It uploads its inputs in
// two asynchronous copies from pinned memory (the rows, and the [B, w] corner of the tables that
// its sequences use, w = the most blocks one holds), makes its copy-on-write copies
// (model/kv_cache.h), runs the forward, the LM head and the sampler, and copies the B drawn tokens
// and logprobs back (with record_routing also each sparse layer's experts for the B rows): its one
// host synchronization. A sparse model's decode step can be captured where its forward reads
// nothing back (Transformer::decode_reads_nothing_back: the grouped fp8 experts).
//
// With graphs on, the forward + head + sampler of each bucket is captured once into a CUDA graph
// (core/cuda_graph.h), at the first step, and each step replays its bucket's graph on the current
// stream. With graphs off the same work runs eagerly from the same buffers: the same kernels on
// the same shapes and values, so the tokens and logprobs are the same bit for bit.
//
// Capture, on a side stream, after a device synchronize: every bucket first runs once eagerly (on
// padding only), so that each of its GEMM shapes has its autotuned cuBLASLt plan and the side
// stream's cuBLASLt workspace and scratch have their final sizes before any capture (ops/cuda/
// gemm.cu: a plan first made during capture is not tuned, and a workspace that grew after a capture
// would free memory that graph points to); then each bucket is captured. A step's temporaries
// (activations, logits) are allocated by the captured work and freed before it ends, in a graph
// arena that all the buckets' graphs share (core/graph_arena.h; they are launched into one stream),
// doubled from 32 MB until every capture fits: the graphs hold kernel nodes only, so that the
// step's kernels that start early (core/early_start.h: every decode step runs in an
// EarlyStartScope) get programmatic edges. Nothing allocated outside a graph is freed inside it,
// and nothing a graph allocates outlives it.
// The graphs hold the model's weight and the cache's pointers: weights must be updated in place
// (as refresh_weights and the optimizer do), and the model and the cache must outlive this.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/cuda_graph.h"
#include "core/graph_arena.h"
#include "core/tensor.h"
#include "model/kv_cache.h"
#include "model/transformer.h"
#include "ops/sample.h"

namespace lockstep {

class DecodeGraph {
 public:
  // One sequence of a step: its newest token at `position`, its block table (blocks[position /
  // block_size] holds the position), and its draw (whose `row` this sets).
  struct Row {
    int32_t token = 0, position = 0;
    std::span<const int32_t> blocks;
    SampleSpec spec;
  };
  // The draws of a step's rows, in row order; valid until the next run().
  struct Drawn {
    std::span<const int32_t> tokens;
    std::span<const float> logprobs;
    // With record_routing: host i32 [sparse layers, B, k], the experts of each row (rows [0, count)
    // the step's, in row order; InferBatch::routing's layout). Else undefined.
    Tensor routing{};
  };

  // `model` and `cache` on the GPU; the cache's last block is the scratch. Allocates the buffers;
  // captures nothing yet. `graphs` needs model.decode_reads_nothing_back().
  DecodeGraph(Transformer& model, KvCache& cache, int64_t max_sequences, int64_t max_blocks,
              bool graphs, bool record_routing);

  static std::vector<int64_t> buckets(int64_t max_sequences);
  int64_t max_blocks() const { return width_; }

  // The step of 1 ≤ rows.size() ≤ max_sequences sequences, after the copy-on-write `copies`
  // (src, dst, src, dst, ...; at most one a row).
  Drawn run(std::span<const Row> rows, std::span<const int32_t> copies);

  // Host time between consecutive decode steps, summed: from a step's draws reaching the host to
  // the next step's launch (staging its inputs, and whatever the caller did in between), while the
  // GPU has nothing queued. pause() says the next run() does not follow a decode step directly.
  double host_seconds() const { return host_seconds_; }
  void pause() { done_.reset(); }

 private:
  enum Part { kTokens, kPositions, kSlots, kCu, kContextLens, kLastRows, kSpecs, kCopies, kOut,
              kRouting, kTable, kParts };

  int32_t* host(Part p) const { return host_.data_as<int32_t>() + offsets_[p]; }
  int32_t* device(Part p) const { return device_.data_as<int32_t>() + offsets_[p]; }
  void stage_padding(int64_t row);
  void upload(int64_t bucket, int64_t width);
  void forward(int64_t bucket);  // the captured work
  void capture();

  Transformer& model_;
  KvCache& cache_;
  const int64_t max_sequences_, width_, scratch_;
  const bool record_routing_;
  const int64_t sparse_layers_, top_k_;  // the routing's [sparse_layers_, B, top_k_] (0: dense)
  const std::vector<int64_t> buckets_;
  int64_t offsets_[kParts + 1] = {};  // i32 words
  Tensor host_;    // pinned: what each step uploads, then its draws
  Tensor device_;  // the static inputs and outputs
  std::optional<SideStream> stream_;  // with graphs: where they are captured
  std::optional<GraphArena> arena_;   // the graphs' temporaries; outlives them
  std::vector<CudaGraph> graphs_;     // by bucket, once captured
  std::optional<std::chrono::steady_clock::time_point> done_;  // the previous step's draws read back
  double host_seconds_ = 0;
};

}  // namespace lockstep
