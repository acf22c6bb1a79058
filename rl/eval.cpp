// rl/eval.cpp
#include "rl/eval.h"

#include <algorithm>

#include "tasks/verifier.h"

namespace lockstep {

double Evaluator::accuracy(const std::vector<Problem>& problems, float temperature, int64_t done_before,
                           const EvalProgress& on_progress) {
  const RolloutOptions& ro = setup_.config.rollout;
  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < problems.size(); ++i) {
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
      correct += answer_reward(setup_.tokenizer->decode(samples[i][0].tokens, true), problems[first + i].answer);
    if (on_progress) on_progress(done_before + int64_t(last), 2 * int64_t(problems.size()));
  }
  return correct / double(problems.size());
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
