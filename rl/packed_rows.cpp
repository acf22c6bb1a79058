// rl/packed_rows.cpp
#include "rl/packed_rows.h"

#include <span>

namespace lockstep {

void PackedRows::add(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response,
                     const std::vector<float>& response_logprob) {
  const size_t start = tokens.size();
  tokens.insert(tokens.end(), prompt.begin(), prompt.end());
  tokens.insert(tokens.end(), response.begin(), response.end());
  const size_t n = tokens.size() - start;
  for (size_t i = 0; i < n; ++i) {
    const bool predicts_response = i + 1 >= prompt.size() && i + 1 < n;
    targets.push_back(i + 1 < n ? tokens[start + i + 1] : 0);
    mask.push_back(predicts_response ? 1.0f : 0.0f);
    response_position.push_back(predicts_response ? int64_t(i + 1 - prompt.size()) : -1);
    rollout_logprob.push_back(predicts_response && !response_logprob.empty()
                                  ? response_logprob[i + 1 - prompt.size()]
                                  : 0.0f);
  }
  cu.push_back(int32_t(tokens.size()));
  lengths.push_back(int64_t(n));
}

TrainBatch slice_batch(const PackedRows& rows, size_t first, size_t last, int64_t vocab,
                       Device device, size_t& offset) {
  const size_t begin = size_t(rows.cu[first]), end = size_t(rows.cu[last]);
  std::vector<int32_t> cu;
  for (size_t s = first; s <= last; ++s) cu.push_back(rows.cu[s] - int32_t(begin));
  offset = begin;
  return make_train_batch(std::span(rows.tokens).subspan(begin, end - begin),
                          std::span(rows.targets).subspan(begin, end - begin), cu, vocab, device);
}

std::vector<float> host_floats(const Tensor& t) {
  const Tensor c = t.device() == Device::cpu ? t : t.to(Device::cpu);
  return {c.data_as<float>(), c.data_as<float>() + c.numel()};
}

std::vector<float> forward_logprobs(Transformer& model, const PackedRows& rows, int64_t budget,
                                    float temperature) {
  std::vector<float> out;
  for (const SequenceRange& r : plan_micro_batches(rows.lengths, budget)) {
    size_t offset = 0;
    const TrainBatch b = slice_batch(rows, r.first, r.last, model.config().vocab_size,
                                     model.device(), offset);
    const std::vector<float> lp = host_floats(model.forward(b, temperature, false).logprob);
    out.insert(out.end(), lp.begin(), lp.end());
  }
  return out;
}

}  // namespace lockstep
