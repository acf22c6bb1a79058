// train/shard_plan.cpp
#include "train/shard_plan.h"

#include <algorithm>

#include "core/error.h"

namespace lockstep {

namespace {

int64_t dims_after_first(const Shape& s) {
  int64_t n = 1;
  for (size_t d = 1; d < s.size(); ++d) n *= s[d];
  return n;
}

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

bool cut_in_blocks(const Shape& s) { return s.size() >= 2 && s[0] >= kShardRowBlock; }

// A unit the plan never cuts: rows [row_begin, row_end) of one tensor.
struct Unit {
  int tensor;
  int64_t row_begin, row_end, numel;
};

}  // namespace

int64_t ShardPlan::row_numel(int i) const { return dims_after_first(tensors.at(size_t(i)).shape); }

int64_t ShardPlan::rows(int i) const {
  const Shape& s = tensors.at(size_t(i)).shape;
  return s.empty() ? 1 : s[0];
}

ShardPlan plan_shards(const std::vector<ShardedTensor>& tensors, int ranks) {
  LOCKSTEP_CHECK(ranks >= 1, "plan_shards: ", ranks, " ranks (must be at least 1)");
  ShardPlan plan;
  plan.ranks = ranks;
  plan.tensors = tensors;
  std::vector<Unit> units;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Shape& s = tensors[i].shape;
    const int64_t rows = plan.rows(int(i)), row = plan.row_numel(int(i));
    if (cut_in_blocks(s)) {
      for (int64_t r = 0; r < rows; r += kShardRowBlock) {
        const int64_t end = std::min(rows, r + kShardRowBlock);
        units.push_back({int(i), r, end, (end - r) * row});
      }
    } else {
      units.push_back({int(i), 0, rows, rows * row});
    }
  }
  int64_t total = 0;
  for (const Unit& u : units) total += u.numel;

  // Unit index where each rank's stretch ends: the boundary whose prefix sum is nearest to the
  // even share's end (the earlier boundary on a tie), never before the previous rank's end.
  std::vector<size_t> end_of(size_t(ranks), units.size());
  {
    size_t u = 0;
    int64_t prefix = 0;
    for (int r = 0; r + 1 < ranks; ++r) {
      // target = total·(r+1)/N, compared as prefix·N against total·(r+1) (no rounding).
      const __int128 target = __int128(total) * (r + 1);
      while (u < units.size()) {
        const __int128 here = __int128(prefix) * ranks, next = __int128(prefix + units[u].numel) * ranks;
        if (next > target && (next - target) >= (target - here)) break;
        prefix += units[u].numel;
        ++u;
      }
      end_of[size_t(r)] = u;
    }
  }
  plan.pieces.assign(size_t(ranks), {});
  plan.rank_numel.assign(size_t(ranks), 0);
  size_t u = 0;
  for (int r = 0; r < ranks; ++r) {
    std::vector<ShardPiece>& pieces = plan.pieces[size_t(r)];
    int64_t offset = 0;
    for (; u < end_of[size_t(r)]; ++u) {
      const Unit& unit = units[u];
      // Adjacent units of one tensor merge into one piece.
      if (!pieces.empty() && pieces.back().tensor == unit.tensor && pieces.back().row_end == unit.row_begin)
        pieces.back().row_end = unit.row_end;
      else {
        offset = round_up(offset, kShardPieceAlign);
        pieces.push_back({unit.tensor, unit.row_begin, unit.row_end, offset});
      }
      offset += unit.numel;
    }
    plan.rank_numel[size_t(r)] = offset;
    plan.shard_numel = std::max(plan.shard_numel, round_up(offset, kShardPieceAlign));
  }
  return plan;
}

}  // namespace lockstep
