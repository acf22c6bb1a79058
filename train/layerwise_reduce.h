// train/layerwise_reduce.h — the gradients of a sharded data-parallel run reduce-scattered layer by
// layer during the backward: the trainer reports each group of gradients as soon as the backward
// has finished it (Transformer::report_gradients_per_layer) and the sharded optimizer adds the
// group's rows of the sum over the ranks to its gradient shard (ShardedAdamW::reduce_scatter_now),
// so no rank holds the whole summed gradient, nor its whole local one: only the embedding's, the
// LM head's and one layer's (f32), against every parameter's.
//
// Every rank must reduce the same groups in the same order: a rank with fewer micro-batches in a
// mini-batch than another, or with a micro-batch whose loss is not finite (not backpropagated),
// calls Transformer::skip_backward() for each backward it lacks (the zero gradients reduced group by
// group), so that the ranks' counts match (rl/grpo_update.h agrees on the count with one
// all-reduce a mini-batch).
//
// The sums over micro-batches then happen in the shard: Σ over micro-batches of (Σ over ranks),
// where the replicated path sums each rank's micro-batches first (Σ over ranks of Σ over
// micro-batches). The same terms in another order: the same bits where every term but one of each
// sum is zero (one micro-batch a mini-batch, or each mini-batch on one rank), else f32 rounding.
#pragma once

#include "model/transformer.h"
#include "train/sharded_optimizer.h"

namespace lockstep {

class LayerwiseReduce {
 public:
  // Installs the hook on `model` (until another replaces it): `optimizer` must outlive the model's
  // backward passes from now on.
  LayerwiseReduce(Transformer& model, ShardedAdamW& optimizer);
  // Drops the gradients summed since the last optimizer step (a skipped mini-batch).
  void discard();

 private:
  Transformer& model_;
  ShardedAdamW& optimizer_;
};

}  // namespace lockstep
