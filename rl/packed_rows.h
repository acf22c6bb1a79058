// rl/packed_rows.h — sequences packed row by row for the training forward (SFT and GRPO): row t of
// a sequence predicts its token t + 1; the mask selects the rows that predict response tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "model/micro_batch.h"
#include "model/transformer.h"

namespace lockstep {

struct PackedRows {
  std::vector<int32_t> tokens, targets, cu{0};
  std::vector<float> mask, rollout_logprob;  // per row; rollout_logprob 0 where not given
  std::vector<int64_t> response_position;    // per row: of the predicted token in its response; -1 off it
  std::vector<int64_t> lengths;              // per sequence
  // A sparse model's rollout routing (GeneratedSample::expert_ids), when the samples carry it:
  // per row, the experts of each sparse layer (routing_width = sparse layers · k ids), -1 for the
  // last row of each sequence (the rollout never ran its token).
  int64_t routing_width = 0;
  std::vector<int32_t> rollout_experts;

  // Appends prompt + response; `response_logprob` (one per response token, or empty) are the
  // rollout's logprobs of the response tokens; `expert_ids` (empty, or for every sequence) the
  // rollout's routing of prompt + response but the last token.
  void add(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response,
           const std::vector<float>& response_logprob, const std::vector<int32_t>& expert_ids = {});
  size_t sequences() const { return lengths.size(); }
};

// Sequences [first, last) of `rows` as a batch on `device`; `offset` gets the first row. With
// `replay_k` > 0 (the model's experts per token) the batch replays the rollout's routing
// (TrainBatch::replay_experts).
TrainBatch slice_batch(const PackedRows& rows, size_t first, size_t last, int64_t vocab,
                       Device device, size_t& offset, int64_t replay_k = 0);

// Appends a forward's routing (TrainForward::routing: each sparse layer's [T, k] choices) to `out`
// row by row, in PackedRows::rollout_experts' layout.
void append_router_experts(std::vector<int32_t>& out, const std::vector<RouterStats>& routing);

// The values of an f32 tensor, on the host.
std::vector<float> host_floats(const Tensor& t);

// Logprobs of every row under `model` at `temperature`, micro-batch by micro-batch of at most
// `budget` tokens, nothing kept for a backward; `replay_k` as slice_batch's. `router_experts`
// (sparse models; null: not wanted) gets the router's own choices (append_router_experts).
std::vector<float> forward_logprobs(Transformer& model, const PackedRows& rows, int64_t budget,
                                    float temperature, int64_t replay_k = 0,
                                    std::vector<int32_t>* router_experts = nullptr);

}  // namespace lockstep
