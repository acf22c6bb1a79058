// rollout/engine.h — the generation engine: requests of n samples each, generated with continuous
// batching over a paged KV cache, on the device the Transformer is on.
//
// generate() returns, for sample j of request r, the generated tokens, the logprob of each and why
// generation stopped.
//
// Logprobs: the log-probability of each token under π = softmax(logits / τ) over the whole
// vocabulary, τ the request's temperature: after temperature, before top-k/top-p truncation (as
// VeRL, OpenRLHF and slime report it), not under the truncated distribution the token was drawn
// from. It is ops/lm_head.h's logits_logprob of the step's logits row, so on the CPU it equals
// Transformer::forward(batch, τ)'s logprob of that token in the same context bit for bit: the
// trainer must use the same τ. Greedy (τ = 0) reports the logprob under softmax(logits), τ = 1.
//
// Randomness: sample j of a request draws the token at position p (its index in prompt +
// generated tokens) with Philox at (request seed, j, p) (ops/sample.h). A sample therefore does
// not depend on the other requests, on the batch, on preemption or on prompt sharing; two
// requests with the same prompt and seed give the same samples, so give each request its own seed.
//
// Sampling runs on the model's device (ops/sample.h's sample_tokens over the step's [S, V]
// logits); only the drawn tokens and their logprobs come back to the host. On CUDA they are the
// CPU's up to rounding (ops/sample.h), and the logprobs are the CUDA logits_logprob's. A logits row
// with a NaN or no finite maximum (a diverged model) throws, naming the request, sample and
// position.
//
// Stop rules, checked after each generated token in this order:
//   - the token is one of stop_token_ids: finish `stop`, the token returned (with its logprob: the
//     policy learns to emit it);
//   - the generated text (Tokenizer::decode of the generated tokens, special tokens written out,
//     the prompt not included) now contains one of stop_strings: finish `stop`; the tokens end with
//     the one that completed the string, whose text may run past the string's end (nothing is cut);
//   - max_new_tokens tokens generated: finish `length`.
//
// Scheduling (rollout/scheduler.h): each step runs the next token (or prompt chunk) of every
// running sequence and starts waiting ones, within max_step_tokens and max_step_sequences;
// finished sequences leave at once. The KV cache holds num_blocks blocks of block_size tokens —
// or, with num_blocks = 0 on CUDA, as many as memory_fraction of the GPU memory free when the
// engine is made holds (core/device.h's device_memory_stats().free; at most what i32 slot indices
// reach); when it is full the newest sequences are preempted and recomputed later, never dropped.
// Every request must fit the cache on its own: prompt + max_new_tokens − 1 tokens.
//
// Decode steps on the GPU (every sequence computes its one newest token and draws the next, none
// forks, none is longer than the model's max_position_embeddings) run through
// rollout/decode_graph.h: padded to a bucket of sequences, from static buffers, with no host
// synchronization but the readback of their draws, and with cuda_graphs replayed from a CUDA
// graph per bucket (captured at the first decode step). The tokens and logprobs are the same
// bit for bit with graphs on or off. The graphs hold the model's weight pointers: update weights
// in place (refresh_weights and the optimizer do). The cache holds one block more than num_blocks:
// the padding rows' scratch. Other steps (prompts; every step of a CPU model) run op by op and
// upload their indices, copy-on-write pairs and sample specs in one copy.
//
// Prompt sharing (share_prompts): the n samples of a request prefill the prompt once, then share
// its blocks; the partially filled last block is copied on a sample's first write (copy-on-write:
// all of a step's copies in one ops/block_copy.h call, unless some depend on others).
// Without it every sample prefills the prompt itself: the same tokens and logprobs, more work.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "io/tokenizer.h"
#include "model/kv_cache.h"
#include "model/transformer.h"
#include "rollout/sampler.h"

namespace lockstep {

class DecodeGraph;

struct EngineOptions {
  int64_t num_blocks = 0;        // the KV cache budget, in blocks; or 0 and memory_fraction
  double memory_fraction = 0;    // (0, 1]: the budget as this fraction of free GPU memory
  int64_t block_size = 16;
  int64_t max_step_tokens = 2048;    // per step: prompt chunks + decoded tokens
  int64_t max_step_sequences = 256;  // per step
  bool share_prompts = true;
  // Decode steps replayed from CUDA graphs (a model on the GPU whose forward reads nothing back:
  // a dense one, or a sparse one with grouped fp8 experts; Transformer::decode_reads_nothing_back).
  bool cuda_graphs = true;
  // A sparse model's routing of every token, kept with the samples (GeneratedSample::expert_ids):
  // for the routing-disagreement metric and routing replay.
  bool record_routing = false;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
};

enum class FinishReason { stop, length };
std::string_view finish_reason_name(FinishReason reason);

struct GeneratedSample {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // one per token
  FinishReason finish_reason = FinishReason::length;
  // With EngineOptions::record_routing: the experts each sparse layer chose for each token of
  // prompt + tokens but the last (drawn, never run through the model), i32 [position][sparse
  // layer][k] row-major, as the computation that produced the sample's next token saw them (a
  // preempted sequence's recomputation overwrites its first).
  std::vector<int32_t> expert_ids = {};
};

// Totals over every generate() call.
struct EngineStats {
  int64_t steps = 0;
  int64_t tokens_computed = 0;  // rows through the model: prompts, recomputations, decodes
  int64_t preemptions = 0;
  int64_t block_copies = 0;  // copy-on-write
  int64_t decode_steps = 0;  // of the steps: those run by the decode graph
  // Host time between consecutive decode-graph steps, when the GPU has nothing queued (rollout/
  // decode_graph.h's host_seconds).
  double decode_host_seconds = 0;
};

class Engine {
 public:
  // The KV cache is allocated here, on the model's device. `tokenizer` is needed only by requests
  // with stop strings; model and tokenizer must outlive the engine.
  Engine(Transformer& model, const EngineOptions& options, const Tokenizer* tokenizer = nullptr);
  ~Engine();

  // result[r][j]: sample j of requests[r]. Bad requests throw before anything runs, naming the
  // request and the field.
  std::vector<std::vector<GeneratedSample>> generate(
      const std::vector<GenerationRequest>& requests);

  // One sequence's rows in a step: positions [begin, end) of sample `sample` of request `request`.
  struct StepChunk {
    size_t request = 0;
    int64_t sample = 0;
    int64_t begin = 0, end = 0;
  };
  // From now on generate() calls `observer` before each step's forward (Transformer::
  // forward_infer) with the step's chunks, in row order (rows back to back; a decode-graph step
  // pads rows after them, rollout/decode_graph.h): with the model's activation tap it says which
  // rows are which (rollout/forward_comparison.h). With CUDA graphs on, a decode step's forward
  // runs from a graph (the tap is not called) and the first also runs every bucket's padding-only
  // forward: tap with cuda_graphs off. An empty observer turns it off.
  using StepObserver = std::function<void(std::span<const StepChunk>)>;
  void observe_steps(StepObserver observer) { observer_ = std::move(observer); }

  // The model's weight copies were reallocated (train/sharded_weights.h frees them after each
  // rollout and gathers them afresh before the next): the decode graphs, which hold the old
  // pointers, are dropped and captured again at the next decode step.
  void weights_moved();

  const EngineStats& stats() const { return stats_; }
  // The KV cache's blocks (options.num_blocks, or what memory_fraction made).
  int64_t num_blocks() const { return options_.num_blocks; }

 private:
  void check_request(const GenerationRequest& request, size_t index) const;
  void make_decode_graph();

  Transformer& model_;
  EngineOptions options_;
  const Tokenizer* tokenizer_;
  KvCache cache_;
  std::unique_ptr<DecodeGraph> decode_;  // a model on the GPU
  EngineStats stats_;
  StepObserver observer_;
};

}  // namespace lockstep
