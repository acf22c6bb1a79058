// model/expert_parallel.h — expert parallelism of the sparse layers' training forward and backward:
// rank r of N owns experts [r·E/N, (r+1)·E/N) of every sparse layer (E a multiple of N) and runs
// them on every rank's rows of them, so that no rank needs the other experts' weights.
//
// A sparse layer with expert parallelism (model/transformer_moe.cpp), T local tokens, top k:
//   route and gather locally (model/moe.h): rows [T·k, H] sorted by expert, so each owner's rows
//     are one stretch;
//   counts: each rank tells each owner how many rows it sends to each of the owner's experts (an
//     all-to-all of E/N counts per pair of ranks);
//   rows: an all-to-all sends each stretch to its owner; the owner reorders what it received from
//     source-major (rank q's rows of its experts, by expert) to expert-major (expert e's rows from
//     rank 0, then rank 1, …) and runs each of its experts on its rows;
//   results: the reverse reorder and all-to-all bring each row's result back to its rank, in the
//     local dispatch order, for the combine.
// The backward sends the combine's row gradients along the same route and brings the gathered
// rows' gradients back the same way; the experts' WGrad on the owner then sums every rank's rows
// of them at once (in the expert-major order), so an expert's gradient is complete on its owner
// and exists nowhere else. The router stays replicated: each rank routes its own tokens.
//
// A row's expert GEMMs do not depend on the other rows (ops/gemm.h): the forward gives the same bits
// as each rank running every expert on its own rows; the WGrad sums the same products in another
// order (one sum over every rank's rows instead of one per rank, then over the ranks).
//
// model/ knows no ranks: the trainer gives the all-to-all (dist/communicator.h's) as a function.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace lockstep {

struct ExpertParallel {
  int rank = 0, ranks = 1;
  // dist/communicator.h's all_to_all (on CUDA tensors, queued on the current stream).
  std::function<void(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                     std::span<const int64_t> recv_rows)>
      all_to_all;

  bool on() const { return bool(all_to_all); }
  // The experts this rank owns out of `num_experts`: [first, first + count).
  int64_t first_expert(int64_t num_experts) const { return rank * (num_experts / ranks); }
  int64_t experts_per_rank(int64_t num_experts) const { return num_experts / ranks; }
};

// An error naming the config unless E is a multiple of the ranks (≥ 1).
void check_expert_parallel(int64_t num_experts, int ranks);

// Where one sparse layer's rows go and come from (what the backward reuses).
struct ExpertParallelRoute {
  std::vector<int64_t> send_rows, recv_rows;  // [N]: rows to and from each rank
  // E + 1: expert e's rows of the received rows in expert-major order (empty for the experts of
  // other ranks).
  std::vector<int64_t> offsets;
  Tensor expert_major;  // i32 [received]: the received (source-major) row of each expert-major row
  Tensor source_major;  // i32 [received]: the expert-major row of each received row
};

// The route of rows sorted by expert, expert e's at [dispatch_offsets[e], dispatch_offsets[e + 1])
// (model/moe.h's MoeDispatch::offsets; E + 1 values). A collective: the counts' all-to-all.
// The index tensors are made on `device`.
ExpertParallelRoute route_to_owners(const ExpertParallel& ep, const std::vector<int64_t>& dispatch_offsets,
                                    Device device);
// rows [Σ send_rows, H] (local dispatch order) to the owners: [Σ recv_rows, H] in expert-major
// order. A collective.
Tensor send_to_owners(const ExpertParallel& ep, const ExpertParallelRoute& route, const Tensor& rows);
// The reverse: the owner's rows [Σ recv_rows, H] in expert-major order back to their ranks, in
// the local dispatch order [Σ send_rows, H]. A collective.
Tensor return_from_owners(const ExpertParallel& ep, const ExpertParallelRoute& route, const Tensor& rows);

}  // namespace lockstep
