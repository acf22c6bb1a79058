// model/micro_batch.cpp
#include "model/micro_batch.h"

#include <algorithm>

#include "core/error.h"

namespace lockstep {

std::vector<SequenceRange> plan_micro_batches(std::span<const int64_t> lengths,
                                              int64_t token_budget) {
  LOCKSTEP_CHECK(token_budget > 0, "micro-batch token budget must be positive, got ", token_budget);
  std::vector<SequenceRange> ranges;
  int64_t tokens = 0;
  for (size_t s = 0; s < lengths.size(); ++s) {
    LOCKSTEP_CHECK(lengths[s] > 0, "micro-batches: sequence ", s, " is empty");
    if (ranges.empty() || tokens + lengths[s] > token_budget) {
      ranges.push_back({s, s});
      tokens = 0;
    }
    ranges.back().last = s + 1;
    tokens += lengths[s];
  }
  return ranges;
}

TrainBatch make_train_batch(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                            std::span<const int32_t> cu_seqlens, int64_t vocab_size, Device device) {
  auto upload = [&](std::span<const int32_t> v) {
    Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
    std::copy(v.begin(), v.end(), t.data_as<int32_t>());
    return device == Device::cpu ? t : t.to(device);
  };
  LOCKSTEP_CHECK(tokens.size() == targets.size(), "batch: ", tokens.size(), " tokens but ",
                 targets.size(), " targets");
  for (size_t t = 0; t < tokens.size(); ++t) {
    LOCKSTEP_CHECK(tokens[t] >= 0 && tokens[t] < vocab_size, "batch: token ", tokens[t],
                   " at row ", t, " is outside the vocabulary [0, ", vocab_size, ")");
    LOCKSTEP_CHECK(targets[t] >= 0 && targets[t] < vocab_size, "batch: target ", targets[t],
                   " at row ", t, " is outside the vocabulary [0, ", vocab_size, ")");
  }
  LOCKSTEP_CHECK(!cu_seqlens.empty() && cu_seqlens.front() == 0 &&
                     cu_seqlens.back() == int64_t(tokens.size()) &&
                     std::is_sorted(cu_seqlens.begin(), cu_seqlens.end()),
                 "batch: cu_seqlens must rise from 0 to the row count ", tokens.size());
  return {upload(tokens), upload(targets), upload(cu_seqlens)};
}

}  // namespace lockstep
