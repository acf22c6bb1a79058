// train/data_parallel.h — the gradient sum of data-parallel training with replicated weights (as
// PyTorch's DDP): every rank holds the whole model, computes the gradient of its own rows of a
// mini-batch (each normalized by the whole mini-batch's count, train/policy_loss.h), and the ranks'
// gradients are summed before every rank applies the same optimizer step to the same weights.
#pragma once

#include "dist/communicator.h"
#include "model/parameters.h"

namespace lockstep {

// Every gradient tensor becomes the sum over the ranks (dist/communicator.h's all_reduce_sum, one
// tensor at a time, on the tensors' device). One rank: nothing happens.
void sum_gradients_over_ranks(Communicator& comm, ModelParameters& grads);

}  // namespace lockstep
