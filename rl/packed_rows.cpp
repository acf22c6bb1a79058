// rl/packed_rows.cpp
#include "rl/packed_rows.h"

#include <span>

#include "core/error.h"

namespace lockstep {

void PackedRows::add(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response,
                     const std::vector<float>& response_logprob, const std::vector<int32_t>& expert_ids) {
  const size_t start = tokens.size();
  const size_t computed = prompt.size() + response.size() - 1;  // the rows the rollout ran
  if (lengths.empty() && !expert_ids.empty()) routing_width = int64_t(expert_ids.size() / computed);
  LOCKSTEP_CHECK(expert_ids.size() == computed * size_t(routing_width),
                 "packed rows: sequence ", lengths.size(), " has ", expert_ids.size(),
                 " routing ids for ", computed, " computed tokens, expected ", routing_width,
                 " per token (as the first sequence)");
  rollout_experts.insert(rollout_experts.end(), expert_ids.begin(), expert_ids.end());
  rollout_experts.insert(rollout_experts.end(), size_t(routing_width), -1);
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
                       Device device, size_t& offset, int64_t replay_k) {
  const size_t begin = size_t(rows.cu[first]), end = size_t(rows.cu[last]);
  std::vector<int32_t> cu;
  for (size_t s = first; s <= last; ++s) cu.push_back(rows.cu[s] - int32_t(begin));
  offset = begin;
  TrainBatch batch = make_train_batch(std::span(rows.tokens).subspan(begin, end - begin),
                                      std::span(rows.targets).subspan(begin, end - begin), cu, vocab, device);
  if (replay_k > 0) {
    LOCKSTEP_CHECK(rows.routing_width > 0 && rows.routing_width % replay_k == 0,
                   "routing replay: the samples carry ", rows.routing_width,
                   " routing ids per token, not a multiple of the model's ", replay_k,
                   " experts per token (was the rollout's routing recorded?)");
    // [row][layer][k] → [layer][row][k]
    const int64_t T = int64_t(end - begin), layers = rows.routing_width / replay_k;
    batch.replay_experts = Tensor::empty({layers, T, replay_k}, DType::i32);
    int32_t* out = batch.replay_experts.data_as<int32_t>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t l = 0; l < layers; ++l)
        std::copy_n(rows.rollout_experts.begin() + ptrdiff_t((int64_t(begin) + t) * rows.routing_width + l * replay_k),
                    replay_k, out + (l * T + t) * replay_k);
  }
  return batch;
}

void append_router_experts(std::vector<int32_t>& out, const std::vector<RouterStats>& routing) {
  if (routing.empty()) return;
  const int64_t T = routing[0].expert_ids.dim(0), k = routing[0].expert_ids.dim(1);
  for (int64_t t = 0; t < T; ++t)
    for (const RouterStats& layer : routing)
      out.insert(out.end(), layer.expert_ids.data_as<int32_t>() + t * k,
                 layer.expert_ids.data_as<int32_t>() + (t + 1) * k);
}

std::vector<float> host_floats(const Tensor& t) {
  const Tensor c = t.device() == Device::cpu ? t : t.to(Device::cpu);
  return {c.data_as<float>(), c.data_as<float>() + c.numel()};
}

std::vector<float> forward_logprobs(Transformer& model, const PackedRows& rows, int64_t budget,
                                    float temperature, int64_t replay_k,
                                    std::vector<int32_t>* router_experts) {
  std::vector<float> out;
  for (const SequenceRange& r : plan_micro_batches(rows.lengths, budget)) {
    size_t offset = 0;
    const TrainBatch b = slice_batch(rows, r.first, r.last, model.config().vocab_size,
                                     model.device(), offset, replay_k);
    const TrainForward f = model.forward(b, temperature, false);
    if (router_experts) append_router_experts(*router_experts, f.routing);
    const std::vector<float> lp = host_floats(f.logprob);
    out.insert(out.end(), lp.begin(), lp.end());
  }
  return out;
}

}  // namespace lockstep
