// rl/eval.h — held-out evaluation: pass@1 of the rollout model on the first problems of the test
// set, greedy (temperature 0) and sampled (the rollout temperature, one sample, a fixed seed), as
// the fraction of problems whose final answer is correct (tasks/verifier.h).
#pragma once

#include <cstdint>

#include "rl/setup.h"
#include "rollout/engine.h"

namespace lockstep {

struct EvalResult {
  double greedy = 0, sampled = 0;
  int64_t problems = 0;
};

class Evaluator {
 public:
  Evaluator(const Setup& setup, Engine& engine) : setup_(setup), engine_(engine) {}
  // The first `problems` of the test set (0 or more than there are: all).
  EvalResult evaluate(int64_t problems);

 private:
  double accuracy(const std::vector<Problem>& problems, float temperature);
  const Setup& setup_;
  Engine& engine_;
};

}  // namespace lockstep
