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

  // Appends prompt + response; `response_logprob` (one per response token, or empty) are the
  // rollout's logprobs of the response tokens.
  void add(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response,
           const std::vector<float>& response_logprob);
  size_t sequences() const { return lengths.size(); }
};

// Sequences [first, last) of `rows` as a batch on `device`; `offset` gets the first row.
TrainBatch slice_batch(const PackedRows& rows, size_t first, size_t last, int64_t vocab,
                       Device device, size_t& offset);

// The values of an f32 tensor, on the host.
std::vector<float> host_floats(const Tensor& t);

// Logprobs of every row under `model` at `temperature`, micro-batch by micro-batch of at most
// `budget` tokens, nothing kept for a backward.
std::vector<float> forward_logprobs(Transformer& model, const PackedRows& rows, int64_t budget,
                                    float temperature);

}  // namespace lockstep
