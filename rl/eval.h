// rl/eval.h — held-out evaluation: pass@1 of the rollout model on the first problems of the test
// set, greedy (temperature 0) and sampled (the rollout temperature, one sample, a fixed seed), as
// the fraction of problems whose final answer is correct (tasks/verifier.h). With several ranks
// each generates a contiguous share of the problems (each problem's seed is that of its place in
// the whole list, so the answers are those of one rank) and the correct counts are summed.
#pragma once

#include <cstdint>
#include <functional>

#include "dist/single_rank.h"
#include "rl/setup.h"
#include "rollout/engine.h"

namespace lockstep {

struct EvalResult {
  double greedy = 0, sampled = 0;
  int64_t problems = 0;
};

// Called with the generations done and the total (2 per problem: greedy and sampled).
using EvalProgress = std::function<void(int64_t done, int64_t total)>;

class Evaluator {
 public:
  Evaluator(const Setup& setup, Engine& engine, Communicator& comm = single_rank())
      : setup_(setup), engine_(engine), comm_(comm) {}
  // The first `problems` of the test set (0 or more than there are: all). With `on_progress`, the
  // problems go to the engine kProgressChunk at a time, with a call after each chunk (each
  // request's samples depend on its own seed only, so the answers are the same as in one batch).
  EvalResult evaluate(int64_t problems, const EvalProgress& on_progress = {});
  // How many problems evaluate(problems) evaluates.
  int64_t count(int64_t problems) const;

  static constexpr int64_t kProgressChunk = 256;

 private:
  double accuracy(const std::vector<Problem>& problems, float temperature, int64_t done_before,
                  const EvalProgress& on_progress);
  const Setup& setup_;
  Engine& engine_;
  Communicator& comm_;
};

}  // namespace lockstep
