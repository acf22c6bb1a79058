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

bool ShardPlan::has_owned_tensors() const {
  for (const ShardedTensor& t : tensors)
    if (t.owner >= 0) return true;
  return false;
}

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
  std::vector<std::vector<Unit>> owned(static_cast<size_t>(ranks));  // [rank]: the tensors it owns whole
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Shape& s = tensors[i].shape;
    const int64_t rows = plan.rows(int(i)), row = plan.row_numel(int(i));
    const int owner = tensors[i].owner;
    if (owner >= 0) {
      LOCKSTEP_CHECK(owner < ranks, "plan_shards: ", tensors[i].name, "'s owner is rank ", owner, " of ", ranks);
      owned[size_t(owner)].push_back({int(i), 0, rows, rows * row});
    } else if (cut_in_blocks(s)) {
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
    // Its stretch and the tensors it owns, in tensor order.
    std::vector<Unit> mine(units.begin() + ptrdiff_t(u), units.begin() + ptrdiff_t(end_of[size_t(r)]));
    u = end_of[size_t(r)];
    mine.insert(mine.end(), owned[size_t(r)].begin(), owned[size_t(r)].end());
    std::stable_sort(mine.begin(), mine.end(), [](const Unit& a, const Unit& b) { return a.tensor < b.tensor; });
    std::vector<ShardPiece>& pieces = plan.pieces[size_t(r)];
    int64_t offset = 0;
    for (const Unit& unit : mine) {
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

void assign_experts_to_owners(std::vector<ShardedTensor>& tensors, int ranks) {
  // The expert each tensor belongs to (-1: none).
  std::vector<int64_t> expert(tensors.size(), -1);
  int64_t experts = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].name;
    const size_t at = name.find(".experts.");
    if (!name.starts_with("layers.") || at == std::string::npos) continue;
    expert[i] = std::stoll(name.substr(at + 9));
    experts = std::max(experts, expert[i] + 1);
  }
  LOCKSTEP_CHECK(experts > 0, "expert parallelism (optim.expert_parallel): the model has no experts");
  LOCKSTEP_CHECK(ranks >= 1 && experts % ranks == 0, "expert parallelism (optim.expert_parallel): ",
                 experts, " experts do not split evenly over ", ranks, " ranks");
  for (size_t i = 0; i < tensors.size(); ++i)
    if (expert[i] >= 0) tensors[i].owner = int(expert[i] / (experts / ranks));
}

}  // namespace lockstep
