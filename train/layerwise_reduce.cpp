// train/layerwise_reduce.cpp
#include "train/layerwise_reduce.h"

namespace lockstep {

LayerwiseReduce::LayerwiseReduce(Transformer& model, ShardedAdamW& optimizer)
    : model_(model), optimizer_(optimizer) {
  model_.report_gradients_per_layer([&model, &optimizer](const std::vector<std::string>& names) {
    optimizer.reduce_scatter_now(model.grads(), names);
  });
}

void LayerwiseReduce::discard() {
  model_.grads().zero();
  optimizer_.discard_gradients();
}

}  // namespace lockstep
