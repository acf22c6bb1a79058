// train/data_parallel.cpp
#include "train/data_parallel.h"

namespace lockstep {

void sum_gradients_over_ranks(Communicator& comm, ModelParameters& grads) {
  if (comm.size() == 1) return;
  grads.for_each([&](const std::string&, Tensor& g) { comm.all_reduce_sum(g); });
}

}  // namespace lockstep
