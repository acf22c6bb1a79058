// train/data_parallel.h — the optimizer step of data-parallel training: every rank computes the
// gradient of its own rows of a mini-batch (each normalized by the whole mini-batch's count,
// train/policy_loss.h), and the optimizer step sums the ranks' gradients and leaves every rank
// with the same updated weights. Two implementations:
//
//   ReplicatedAdamW   (optim.shard_state = false; as PyTorch's DDP) every rank holds the whole
//                     AdamW state; the gradients are all-reduced and every rank takes the same step.
//   ShardedAdamW      (optim.shard_state = true; train/sharded_optimizer.h; ZeRO-2 and the
//                     masters) each rank holds the masters and moments of its own rows only;
//                     reduce-scatter, a step on its rows, all-gather of the updated weight copies
//                     (the model releases the masters it does not read: holds_masters()).
//
// With one rank both are train/optimizer.h's AdamW.
#pragma once

#include <memory>

#include "dist/communicator.h"
#include "model/expert_parallel.h"
#include "model/parameters.h"
#include "train/optimizer.h"

namespace lockstep {

// Every gradient tensor becomes the sum over the ranks (dist/communicator.h's all_reduce_sum, one
// tensor at a time, on the tensors' device). One rank: nothing happens.
void sum_gradients_over_ranks(Communicator& comm, ModelParameters& grads);

class DataParallelOptimizer {
 public:
  virtual ~DataParallelOptimizer() = default;
  // `grads`: this rank's gradients (summed over the ranks here); zeroed on return, as AdamW::step
  // does. The result (grad_norm, skip, lr) is the same on every rank.
  virtual OptimizerStep step(ModelParameters& params, ModelParameters& grads,
                             const AdamW::CopiesOf& copies) = 0;
  virtual int64_t steps() const = 0;
  // Whether the optimizer holds the fp32 masters (its rows of them), so that the model can
  // release its own (Transformer::release_masters) and gather_masters() makes them whole.
  virtual bool holds_masters() const = 0;
  // `full` (every tensor of the masters' shapes, f32, on their device) gets the whole masters, on
  // every rank: a collective. Only for an optimizer that holds_masters().
  virtual void gather_masters(ModelParameters& full) = 0;
  // The whole moments (as AdamW::first_moment / second_moment), of the tensors of `params`, on
  // every rank: a collective, for a whole checkpoint (rl/checkpoint.h) or a test. (ShardedAdamW
  // all-gathers them; a sharded run writes its shards instead, rl/sharded_checkpoint.h.)
  struct Moments {
    ModelParameters m, v;
  };
  virtual Moments full_moments(const ModelParameters& params) = 0;
  // Continues from whole saved moments (a checkpoint written with any number of ranks).
  virtual void load_state(const ModelParameters& m, const ModelParameters& v, int64_t steps) = 0;
};

class ReplicatedAdamW final : public DataParallelOptimizer {
 public:
  ReplicatedAdamW(const ModelParameters& params, const OptimizerConfig& config, Communicator& comm)
      : comm_(comm), adamw_(params, config) {}
  OptimizerStep step(ModelParameters& params, ModelParameters& grads,
                     const AdamW::CopiesOf& copies) override;
  int64_t steps() const override { return adamw_.steps(); }
  bool holds_masters() const override { return false; }
  void gather_masters(ModelParameters&) override;
  Moments full_moments(const ModelParameters&) override { return {adamw_.first_moment(), adamw_.second_moment()}; }
  void load_state(const ModelParameters& m, const ModelParameters& v, int64_t steps) override {
    adamw_.load_state(m, v, steps);
  }

 private:
  Communicator& comm_;
  AdamW adamw_;
};

// model/expert_parallel.h's setting for `comm`'s ranks: its all_to_all is comm's.
ExpertParallel expert_parallel_over(Communicator& comm);

// ShardedAdamW when `shard_state` and comm has several ranks, else ReplicatedAdamW.
// `expert_parallel` (several ranks, shard_state): the experts' tensors owned whole by their ranks
// (ShardedAdamW's experts_owned).
std::unique_ptr<DataParallelOptimizer> make_data_parallel_optimizer(const ModelParameters& params,
                                                                    const OptimizerConfig& config,
                                                                    Communicator& comm,
                                                                    bool shard_state,
                                                                    bool expert_parallel = false);

}  // namespace lockstep
