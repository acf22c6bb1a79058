// rl/eval.cpp
#include "rl/eval.h"

#include <algorithm>

#include "dist/host_values.h"
#include "tasks/verifier.h"

namespace lockstep {

double Evaluator::accuracy(const std::vector<Problem>& problems, float temperature, int64_t done_before,
                           const EvalProgress& on_progress) {
  const RolloutOptions& ro = setup_.config.rollout;
  // This rank's problems: [mine_first, mine_last) of the list.
  const size_t n = problems.size(), ranks = size_t(comm_.size()), rank = size_t(comm_.rank());
  const size_t mine_first = n * rank / ranks, mine_last = n * (rank + 1) / ranks;
  std::vector<GenerationRequest> requests;
  for (size_t i = mine_first; i < mine_last; ++i) {
    GenerationRequest r;
    r.prompt = setup_.prompt_tokens(problems[i]);
    r.sampling.temperature = temperature;
    r.sampling.top_p = float(ro.top_p);
    r.sampling.top_k = ro.top_k;
    r.sampling.max_new_tokens = ro.max_new_tokens;
    r.sampling.stop_token_ids = setup_.stop_token_ids;
    r.sampling.stop_strings = ro.stop;
    r.sampling.seed = 7919u * uint64_t(i) + 17u;  // the same draws at every evaluation
    requests.push_back(std::move(r));
  }
  const size_t chunk = on_progress ? size_t(kProgressChunk) : requests.size();
  double correct = 0;
  for (size_t first = 0; first < requests.size(); first += chunk) {
    const size_t last = std::min(requests.size(), first + chunk);
    const auto samples = engine_.generate({requests.begin() + ptrdiff_t(first), requests.begin() + ptrdiff_t(last)});
    for (size_t i = 0; i < samples.size(); ++i)
      correct += answer_reward(setup_.tokenizer->decode(samples[i][0].tokens, true),
                               problems[mine_first + first + i].answer);
    // This rank's share done, as a share of the whole list (the ranks run alike).
    if (on_progress)
      on_progress(done_before + int64_t(n * last / std::max<size_t>(1, requests.size())), 2 * int64_t(n));
  }
  return sum_over_ranks(comm_, correct) / double(n);
}

EvalResult Evaluator::evaluate(int64_t problems, const EvalProgress& on_progress) {
  const std::vector<Problem> set = setup_.test.head(problems);
  const int64_t n = int64_t(set.size());
  return {accuracy(set, 0.0f, 0, on_progress),
          accuracy(set, float(setup_.config.rollout.temperature), n, on_progress), n};
}

int64_t Evaluator::count(int64_t problems) const {
  const Problems& test = setup_.test;
  if (test.endless()) return problems;
  return problems <= 0 ? test.size() : std::min(problems, test.size());
}

}  // namespace lockstep
