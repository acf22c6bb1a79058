// train/shard_plan.h — which rows of which tensor each rank owns when the optimizer state is
// sharded over the ranks (train/sharded_optimizer.h).
//
// The tensors are laid end to end in ModelParameters::for_each order and cut into N contiguous
// stretches, one per rank, balanced by bytes. The cuts fall only between units:
//   - a tensor of 2 or more dimensions with at least kShardRowBlock rows: blocks of kShardRowBlock
//     rows (its last block may be shorter), so that a cut never splits one of the fp8 recipe's
//     128×128 weight blocks (numerics/quantize.h): a rank that owns a tensor's rows owns whole
//     blocks and can write their E4M3 bytes and scales alone;
//   - any other tensor (a norm weight, a bias, a matrix of fewer than 128 rows): one unit, owned
//     whole by one rank.
// Rank r's stretch ends at the unit boundary nearest to (r + 1)/N of the total bytes, so every
// rank's share is within one unit of the even share (and a rank may own nothing when there are
// fewer units than ranks).
//
// With expert parallelism (model/expert_parallel.h) each expert's tensors have an owner instead:
// rank r gets experts [r·E/N, (r+1)·E/N) of every sparse layer whole (their masters, moments and
// gradients: the gradient of an expert exists only on its owner), outside the stretches; the
// other tensors are cut by bytes as above among themselves.
//
// Each rank's rows are packed, in order, into a flat buffer of `shard_numel` elements (the
// largest rank's count; the smaller ranks' buffers end in padding): the layout of the gradient
// reduce-scatter and of the master all-gather. Every piece starts at a multiple of
// kShardPieceAlign elements (16 bytes of f32, the alignment the CUDA AdamW kernel reads with;
// the gaps are padding), and shard_numel is a multiple of it. A pure function of the shapes and N: every rank
// computes the same plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace lockstep {

inline constexpr int64_t kShardRowBlock = 128;
inline constexpr int64_t kShardPieceAlign = 4;

// One tensor as the plan sees it: its rows along the first dimension and the elements per row.
struct ShardedTensor {
  std::string name;
  Shape shape;
  int owner = -1;  // ≥ 0: owned whole by that rank (an expert's tensor); else cut by bytes
};

// Rows [row_begin, row_end) of tensor `tensor` (an index into the plan's tensors), at element
// `offset` of its owner's flat shard.
struct ShardPiece {
  int tensor = 0;
  int64_t row_begin = 0, row_end = 0;
  int64_t offset = 0;
};

struct ShardPlan {
  int ranks = 1;
  std::vector<ShardedTensor> tensors;
  std::vector<std::vector<ShardPiece>> pieces;  // [rank]: its pieces, in tensor and row order
  std::vector<int64_t> rank_numel;              // [rank]: its packed size (pieces and the gaps between)
  int64_t shard_numel = 0;                      // max of rank_numel rounded up to kShardPieceAlign

  // Elements per row of tensor i (the product of its dimensions after the first; 1 for 1-D).
  int64_t row_numel(int i) const;
  int64_t rows(int i) const;
  // Whether tensor i is owned whole by one rank (ShardedTensor::owner), its gradient summed nowhere.
  bool owned_whole(int i) const { return tensors.at(size_t(i)).owner >= 0; }
  bool has_owned_tensors() const;
};

// The plan for `tensors` (f32 elements each) over `ranks` ranks (≥ 1; an error otherwise, and for
// an owner outside [0, ranks)).
ShardPlan plan_shards(const std::vector<ShardedTensor>& tensors, int ranks);

// Gives the expert tensors (ModelParameters names "layers.<i>.experts.<e>.<…>") their owner under
// expert parallelism over `ranks` ranks: with E experts a layer (1 + the largest e named), e's is
// e / (E / ranks). An error without experts or unless they split evenly.
void assign_experts_to_owners(std::vector<ShardedTensor>& tensors, int ranks);

}  // namespace lockstep
