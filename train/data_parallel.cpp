// train/data_parallel.cpp
#include "train/data_parallel.h"

#include "core/error.h"
#include "train/sharded_optimizer.h"

namespace lockstep {

void sum_gradients_over_ranks(Communicator& comm, ModelParameters& grads) {
  if (comm.size() == 1) return;
  grads.for_each([&](const std::string&, Tensor& g) { comm.all_reduce_sum(g); });
}

OptimizerStep ReplicatedAdamW::step(ModelParameters& params, ModelParameters& grads,
                                    const AdamW::CopiesOf& copies) {
  sum_gradients_over_ranks(comm_, grads);
  return adamw_.step(params, grads, copies);
}

void ReplicatedAdamW::gather_masters(ModelParameters&) {
  LOCKSTEP_CHECK(false, "ReplicatedAdamW::gather_masters: this optimizer holds no masters (the "
                 "model's own are whole)");
}

std::unique_ptr<DataParallelOptimizer> make_data_parallel_optimizer(const ModelParameters& params,
                                                                    const OptimizerConfig& config,
                                                                    Communicator& comm,
                                                                    bool shard_state,
                                                                    bool expert_parallel) {
  if (shard_state && comm.size() > 1)
    return std::make_unique<ShardedAdamW>(params, config, comm, ShardedAdamW::kDefaultBucketNumel,
                                          expert_parallel);
  return std::make_unique<ReplicatedAdamW>(params, config, comm);
}

ExpertParallel expert_parallel_over(Communicator& comm) {
  return {comm.rank(), comm.size(),
          [&comm](const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                  std::span<const int64_t> recv_rows) { comm.all_to_all(send, send_rows, recv, recv_rows); }};
}

}  // namespace lockstep
