// train/sharded_optimizer.h — AdamW with its state sharded over the data-parallel ranks (as
// ZeRO-2): rank r keeps the first and second moments of the rows train/shard_plan.h gives it, and
// only those; each step
//
//   1. reduce-scatters the ranks' gradients: rank r receives the sum over the ranks of its own
//      rows (dist/communicator.h's reduce_scatter_sum over the plan's flat layout, in buckets of
//      at most `bucket_numel` elements per rank, so the send buffer stays small);
//   2. ‖g‖: each rank's Σ g² of the pieces it owns, per tensor, summed over the ranks (an f64
//      all-reduce of one number per tensor); then train/optimizer.h's rules: a non-finite ‖g‖
//      skips the step (naming the first tensor), clip = min(1, max_grad_norm / (‖g‖ + 1e-6));
//   3. runs ops/adamw.h's adamw_step on its rows of the fp32 masters (views of the tensors: the
//      update is elementwise, so a row's result does not depend on where the cut falls);
//   4. all-gathers the updated master rows (bucketed as in 1), so every rank holds the whole
//      updated fp32 masters, and rebuilds the weight copies `copies(name)` gives from them
//      (convert to bf16 / quantize_weight to fp8: ops/adamw.h's composition, the same bits as the
//      replicated optimizer's fused pass).
//
// What is sharded: the moments (8 of AdamW's 12 bytes per parameter), and the summed gradient
// during the step. What is not: every rank keeps the whole fp32 masters (the forward reads the
// norm weights and biases from them, the rollout model shares them, and the Hugging Face export
// writes them), the whole local gradient the backward accumulates into, and the bf16/fp8 copies.
// Per rank: 4 (masters) + 4 (gradients) + 12/N (moments and the gradient shard) bytes per
// parameter plus the copies, against 16 for the replicated optimizer.
//
// Against the replicated data-parallel optimizer (train/data_parallel.h): on the CPU both sum the
// gradients in rank order, so the summed gradient has the same bits; the update is elementwise;
// a tensor owned whole by one rank has the same Σ g² bits. The weights are then the same bits
// after every step whenever ‖g‖ is too (every tensor whole on one rank, or no clipping); a tensor
// cut between ranks adds its Σ g² in two parts, which can move ‖g‖ by a double's rounding.
#pragma once

#include <cstdint>

#include "dist/communicator.h"
#include "model/parameters.h"
#include "train/data_parallel.h"
#include "train/optimizer.h"
#include "train/shard_plan.h"

namespace lockstep {

class ShardedAdamW final : public DataParallelOptimizer {
 public:
  static constexpr int64_t kDefaultBucketNumel = int64_t(1) << 22;  // 16 MiB of f32 per rank

  // Zero moments of this rank's rows of `params` (f32, on their device).
  ShardedAdamW(const ModelParameters& params, const OptimizerConfig& config, Communicator& comm,
               int64_t bucket_numel = kDefaultBucketNumel);

  OptimizerStep step(ModelParameters& params, ModelParameters& grads,
                     const AdamW::CopiesOf& copies) override;
  int64_t steps() const override { return steps_; }
  Moments full_moments(const ModelParameters& params) override;
  void load_state(const ModelParameters& m, const ModelParameters& v, int64_t steps) override;

  const ShardPlan& plan() const { return plan_; }
  // This rank's moments: [plan().shard_numel] each, its pieces at their offsets.
  const Tensor& first_moment_shard() const { return m_; }
  const Tensor& second_moment_shard() const { return v_; }

 private:
  // Element range [lo, hi) of rank `rank`'s flat shard, as views: the piece's tensor elements and
  // its shard positions.
  struct Span {
    int tensor;
    Tensor tensor_elems;  // a 1-D view of the tensor's elements in [lo, hi)
    int64_t shard_begin;  // where they sit in the rank's shard
  };
  std::vector<Span> spans(const std::vector<Tensor*>& tensors, int rank, int64_t lo, int64_t hi) const;
  std::vector<Tensor*> checked(ModelParameters& p, const char* what) const;
  // `full` (whole tensors) gets every rank's rows of `shard` (a flat shard as m_), bucket by
  // bucket; with no shard, every other rank's rows of `full` itself (this rank's are in place).
  void gather_into(const Tensor* shard, const std::vector<Tensor*>& full);

  Communicator& comm_;
  OptimizerConfig config_;
  ShardPlan plan_;
  int64_t bucket_numel_;
  Device device_;
  Tensor m_, v_, grad_;  // [shard_numel]: this rank's moments and summed gradient
  int64_t steps_ = 0;
};

}  // namespace lockstep
