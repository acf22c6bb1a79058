// rl/eval.cpp
#include "rl/eval.h"

#include "tasks/verifier.h"

namespace lockstep {

double Evaluator::accuracy(const std::vector<Problem>& problems, float temperature) {
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
  double correct = 0;
  const auto samples = engine_.generate(requests);
  for (size_t i = 0; i < samples.size(); ++i)
    correct += answer_reward(setup_.tokenizer->decode(samples[i][0].tokens, true), problems[i].answer);
  return correct / double(problems.size());
}

EvalResult Evaluator::evaluate(int64_t problems) {
  const std::vector<Problem> set = setup_.test.head(problems);
  return {accuracy(set, 0.0f), accuracy(set, float(setup_.config.rollout.temperature)),
          int64_t(set.size())};
}

}  // namespace lockstep
