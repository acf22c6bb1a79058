// rollout/forward_comparison.h — where the rollout's forward and the training forward part, op by
// op: the instrument behind tools/compare_rollout_forward.cpp.
//
// compare_rollout_forward generates with the rollout engine (rollout/engine.h: prefill in chunks of
// the step token budget, then decode steps of every sequence together, through the decode graph on
// the GPU), then runs the training forward (Transformer::forward, micro-batches of whole sequences
// as a trainer packs them) over the same full sequences: prompt + generated tokens. Both forwards
// tap every op's output rows (Transformer::set_activation_tap; Engine::observe_steps says which
// rollout rows are which), and each rollout row is compared with the training row of the same
// (sequence, position), per layer and op, split into prompt rows (the chunked prefill) and the rows
// of generated tokens (the decode steps):
//   rows equal:   every byte of the row equal (the activation; for an fp8 GEMM input its E4M3
//                 codes and its scales);
//   max |Δ|:      the largest difference of an activation element (of a dequantized E4M3 code
//                 where the op's output is fp8 only);
//   codes differ: for an fp8 GEMM input, the fraction of its E4M3 codes that differ.
// Then each generated token's logprob as the engine reported it against the training forward's:
// the mean and max |Δlogp| and the count of tokens whose logprobs are not bit-equal; and the same
// over the tokens whose LM-head input rows were equal (the head's own share).
//
// With a small cache (cache_blocks) the engine preempts sequences and recomputes them later, their
// generated tokens so far as prefill rows: the recomputation's rows replace the first's.
//
// On the CPU every row and logprob is equal (the CPU's guarantee: rollout and training compute
// the same function). The taps run on the host, so the tapped generation runs its decode steps
// without CUDA graphs (the decode graph promises the same bits with graphs on or off); with
// `cuda_graphs` a second generation with graphs, untapped, is compared by its logprobs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/transformer.h"

namespace lockstep {

struct ForwardComparisonOptions {
  int64_t new_tokens = 16;
  int64_t step_tokens = 2048;  // the engine's max_step_tokens: prefill chunks, and ≥ the batch
  float temperature = 0;       // 0: greedy (logprobs at τ = 1, as the engine reports them)
  uint64_t seed = 0;           // request r samples with seed + r
  int64_t tapped_sequences = 4;  // per-op rows are compared for the first this many sequences
  int64_t train_tokens = 16384;  // the training forward's micro-batch token budget
  bool cuda_graphs = false;      // also generate with CUDA graphs (a model on the GPU)
  int64_t block_size = 16;
  // The KV cache's blocks; 0: enough for every sequence at once (as the RL loop sizes it: no
  // preemption). Fewer preempt the newest sequences, which are recomputed later (rollout/engine.h).
  int64_t cache_blocks = 0;
};

// One op of one layer (layer = num_hidden_layers: the final norm), over the rows of one phase.
struct OpComparison {
  int64_t layer = 0;
  std::string op;
  bool decode = false;  // rows of generated tokens; else prompt rows
  int64_t rows = 0, rows_equal = 0;
  double max_abs_diff = 0;
  int64_t codes = 0, codes_differ = 0;  // fp8 GEMM inputs: E4M3 codes compared, differing
  bool forms_differ = false;  // one side has an fp8 input where the other has an activation
};

struct LogprobComparison {
  int64_t tokens = 0, not_equal = 0;
  double mean_abs_diff = 0, max_abs_diff = 0;
};

struct ForwardComparison {
  std::vector<OpComparison> ops;  // in forward order, prompt rows then generated rows per op
  LogprobComparison logprobs;     // every generated token of every sequence
  // The tapped sequences' generated tokens whose final-norm rows (the LM head's input) are
  // bit-identical: what the LM head and the logprob alone part.
  LogprobComparison head_logprobs;
  // With cuda_graphs: the graph generation's logprobs against the training forward's, and its
  // tokens and logprobs against the tapped generation's (tokens compared up to a sequence's first
  // differing token; graph_tokens_differ counts the sequences that have one).
  int64_t preemptions = 0;  // of the tapped generation (rollout/engine.h EngineStats)
  bool graphs_run = false;
  LogprobComparison graph_logprobs;
  int64_t graph_tokens_differ = 0, graph_logprobs_not_equal_to_eager = 0;
};

// Generates new_tokens tokens after each prompt with `rollout` (all prompts one batch), then runs
// `training`'s forward over the results. The two are normally the same model; a different one
// (another recipe, KV-cache format or weights) shows where it parts. They must share the config.
ForwardComparison compare_rollout_forward(Transformer& rollout, Transformer& training,
                                          const std::vector<std::vector<int32_t>>& prompts,
                                          const ForwardComparisonOptions& options);

}  // namespace lockstep
