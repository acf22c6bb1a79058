// train/shard_plan.h: the plan's invariants (every row owned once, cuts on 128-row blocks, small
// tensors whole, packed offsets, balance within one block) on odd shapes and SmolLM2-like widths
// over 1, 2 and 3 ranks, and one small plan worked out by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "core/error.h"
#include "train/shard_plan.h"

namespace lockstep {
namespace {

int64_t rows_of(const Shape& s) { return s.empty() ? 1 : s[0]; }
int64_t row_numel_of(const Shape& s) {
  int64_t n = 1;
  for (size_t d = 1; d < s.size(); ++d) n *= s[d];
  return n;
}
bool cut_in_blocks(const Shape& s) { return s.size() >= 2 && s[0] >= 128; }

// Checks every promise of train/shard_plan.h against `tensors` (computed here from the shapes,
// not from the plan).
void expect_valid(const ShardPlan& plan, const std::vector<ShardedTensor>& tensors, int ranks) {
  ASSERT_EQ(plan.ranks, ranks);
  ASSERT_EQ(plan.pieces.size(), size_t(ranks));
  ASSERT_EQ(plan.rank_numel.size(), size_t(ranks));
  int64_t total = 0, largest_unit = 0;
  for (const ShardedTensor& t : tensors) {
    const int64_t n = rows_of(t.shape) * row_numel_of(t.shape);
    total += n;
    largest_unit = std::max(largest_unit, cut_in_blocks(t.shape) ? 128 * row_numel_of(t.shape) : n);
  }
  // Each tensor's rows, as owned: (row_begin → row_end, rank).
  std::vector<std::map<int64_t, std::pair<int64_t, int>>> rows_owned(tensors.size());
  int64_t largest_share = 0, owned_total = 0;
  int last_tensor = -1;
  int64_t last_row = 0;
  for (int r = 0; r < ranks; ++r) {
    int64_t offset = 0, owned = 0;
    for (const ShardPiece& p : plan.pieces[size_t(r)]) {
      ASSERT_GE(p.tensor, 0);
      ASSERT_LT(p.tensor, int(tensors.size()));
      const Shape& s = tensors[size_t(p.tensor)].shape;
      EXPECT_EQ(p.offset, (offset + 3) / 4 * 4) << "rank " << r << ": pieces are packed in order, 16-byte aligned";
      offset = p.offset;
      EXPECT_LT(p.row_begin, p.row_end);
      EXPECT_LE(p.row_end, rows_of(s));
      // Rank order then piece order walks the tensors' rows from the first to the last.
      EXPECT_TRUE(p.tensor > last_tensor || (p.tensor == last_tensor && p.row_begin == last_row))
          << "rank " << r << " tensor " << p.tensor << " row " << p.row_begin;
      if (p.tensor > last_tensor) {
        EXPECT_EQ(p.row_begin, 0) << "tensor " << p.tensor;
      }
      last_tensor = p.tensor;
      last_row = p.row_end;
      if (cut_in_blocks(s)) {
        EXPECT_EQ(p.row_begin % 128, 0) << tensors[size_t(p.tensor)].name;
        EXPECT_TRUE(p.row_end % 128 == 0 || p.row_end == rows_of(s)) << tensors[size_t(p.tensor)].name;
      } else {
        EXPECT_EQ(p.row_begin, 0) << tensors[size_t(p.tensor)].name << " is kept whole";
        EXPECT_EQ(p.row_end, rows_of(s)) << tensors[size_t(p.tensor)].name << " is kept whole";
      }
      EXPECT_TRUE(rows_owned[size_t(p.tensor)].emplace(p.row_begin, std::pair{p.row_end, r}).second);
      offset += (p.row_end - p.row_begin) * row_numel_of(s);
      owned += (p.row_end - p.row_begin) * row_numel_of(s);
    }
    EXPECT_EQ(plan.rank_numel[size_t(r)], offset);
    largest_share = std::max(largest_share, offset);
    owned_total += owned;
    // Within one unit of the even share.
    EXPECT_LE(std::llabs(owned * ranks - total), largest_unit * ranks)
        << "rank " << r << " owns " << owned << " of " << total;
  }
  EXPECT_EQ(plan.shard_numel, (largest_share + 3) / 4 * 4);
  EXPECT_EQ(owned_total, total);
  // Every row of every tensor exactly once.
  for (size_t i = 0; i < tensors.size(); ++i) {
    int64_t row = 0;
    for (const auto& [begin, end_rank] : rows_owned[i]) {
      EXPECT_EQ(begin, row) << tensors[i].name << ": rows " << row << ".." << begin << " unowned or twice";
      row = end_rank.first;
    }
    EXPECT_EQ(row, rows_of(tensors[i].shape)) << tensors[i].name;
  }
}

// A model of hidden size h, intermediate i, vocabulary v and 64-wide heads (q = h, kv = h/3).
std::vector<ShardedTensor> model_like(int64_t h, int64_t i, int64_t v, int layers) {
  std::vector<ShardedTensor> t{{"embed", {v, h}}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    t.push_back({p + "input_norm", {h}});
    t.push_back({p + "qkv", {h + 2 * (h / 3), h}});
    t.push_back({p + "o", {h, h}});
    t.push_back({p + "post_norm", {h}});
    t.push_back({p + "gate_up", {2 * i, h}});
    t.push_back({p + "down", {h, i}});
  }
  t.push_back({"final_norm", {h}});
  return t;
}

class ShardPlanShapes : public ::testing::TestWithParam<int> {};

TEST_P(ShardPlanShapes, SmolLM2LikeWidths) {
  const int ranks = GetParam();
  // SmolLM2-135M's widths (576 / 1536), a 960-wide model and a 1536-wide one, small vocabularies
  // (the embedding is cut in blocks as any matrix).
  for (const auto& [h, i] : {std::pair<int64_t, int64_t>{576, 1536}, {960, 2560}, {1536, 4096}}) {
    SCOPED_TRACE("hidden " + std::to_string(h));
    const std::vector<ShardedTensor> t = model_like(h, i, 4099, 3);
    expect_valid(plan_shards(t, ranks), t, ranks);
  }
}

TEST_P(ShardPlanShapes, OddShapes) {
  const int ranks = GetParam();
  // 300 rows: blocks of 128, 128, 44; 127 and 1-row matrices, vectors and a 3-D tensor stay whole
  // (the 3-D one with 129 rows is cut in blocks of 128 rows of 2×3).
  const std::vector<ShardedTensor> t{{"a", {300, 7}}, {"b", {127, 5}}, {"c", {1, 9}},
                                     {"d", {11}},     {"e", {129, 2, 3}}, {"f", {128, 1}},
                                     {"g", {1000, 3}}};
  expect_valid(plan_shards(t, ranks), t, ranks);
}

TEST_P(ShardPlanShapes, FewerUnitsThanRanks) {
  const int ranks = GetParam();
  const std::vector<ShardedTensor> t{{"norm", {10}}};
  const ShardPlan plan = plan_shards(t, ranks);
  expect_valid(plan, t, ranks);
  EXPECT_EQ(plan.shard_numel, 12);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShardPlanShapes, ::testing::Values(1, 2, 3, 7));

TEST(ShardPlan, SmallPlanByHand) {
  // Units (elements): a = [256, 2] → two blocks of 256; b = [3] → 3; c = [128, 1] → 128; 643 in
  // all. Two ranks: the even share ends at 321.5; after a's first block (256) the next boundary is
  // 512, farther (190.5) than 256 (65.5): rank 0 owns a's rows 0..128, rank 1 the rest
  // (256 + 3 + 128 = 387 elements, c at 260: pieces start on multiples of 4).
  const ShardPlan plan = plan_shards({{"a", {256, 2}}, {"b", {3}}, {"c", {128, 1}}}, 2);
  ASSERT_EQ(plan.pieces.size(), 2u);
  ASSERT_EQ(plan.pieces[0].size(), 1u);
  EXPECT_EQ(plan.pieces[0][0].tensor, 0);
  EXPECT_EQ(plan.pieces[0][0].row_begin, 0);
  EXPECT_EQ(plan.pieces[0][0].row_end, 128);
  ASSERT_EQ(plan.pieces[1].size(), 3u);
  const int64_t expected[3][4] = {{0, 128, 256, 0}, {1, 0, 3, 256}, {2, 0, 128, 260}};
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(plan.pieces[1][k].tensor, expected[k][0]) << k;
    EXPECT_EQ(plan.pieces[1][k].row_begin, expected[k][1]) << k;
    EXPECT_EQ(plan.pieces[1][k].row_end, expected[k][2]) << k;
    EXPECT_EQ(plan.pieces[1][k].offset, expected[k][3]) << k;
  }
  EXPECT_EQ(plan.rank_numel, (std::vector<int64_t>{256, 388}));
  EXPECT_EQ(plan.shard_numel, 388);
  // Three ranks: the shares end at 214.33 and 428.67. Rank 0 ends after a's first block (256 is
  // 41.7 past, nearer than 0), rank 1 after a's second (512 is 83.3 past, nearer than 256, 172.7
  // short), rank 2 owns b and c.
  const ShardPlan three = plan_shards({{"a", {256, 2}}, {"b", {3}}, {"c", {128, 1}}}, 3);
  EXPECT_EQ(three.rank_numel, (std::vector<int64_t>{256, 256, 132}));
}

// Expert parallelism: a sparse layer's 8 experts over 2 ranks, 4 each, whole and in tensor order
// among the rank's stretch of the other tensors; those are cut as the plan of the other tensors
// alone cuts them (the experts are outside the byte balance).
TEST(ShardPlan, ExpertsOwnedWhole) {
  std::vector<ShardedTensor> t{{"embed", {300, 16}}, {"layers.0.router", {8, 16}}};
  for (int e = 0; e < 8; ++e) {
    t.push_back({"layers.0.experts." + std::to_string(e) + ".gate_up", {256, 16}});
    t.push_back({"layers.0.experts." + std::to_string(e) + ".down", {16, 128}});
  }
  t.push_back({"final_norm", {16}});
  std::vector<ShardedTensor> owned = t;
  assign_experts_to_owners(owned, 2);
  const ShardPlan plan = plan_shards(owned, 2);
  std::vector<ShardedTensor> rest;
  for (const ShardedTensor& x : t)
    if (x.name.find(".experts.") == std::string::npos) rest.push_back(x);
  const ShardPlan rest_plan = plan_shards(rest, 2);
  for (int r = 0; r < 2; ++r) {
    std::vector<ShardPiece> others;
    int last = -1;
    int64_t offset = 0;
    for (const ShardPiece& p : plan.pieces[size_t(r)]) {
      EXPECT_GT(p.tensor, last) << "rank " << r << ": pieces in tensor order, one per tensor here";
      last = p.tensor;
      EXPECT_EQ(p.offset, (offset + 3) / 4 * 4);
      offset = p.offset + (p.row_end - p.row_begin) * plan.row_numel(p.tensor);
      const std::string& name = plan.tensors[size_t(p.tensor)].name;
      if (name.find(".experts.") != std::string::npos) {
        const int e = std::stoi(name.substr(name.find(".experts.") + 9));
        EXPECT_EQ(e / 4, r) << name;
        EXPECT_TRUE(plan.owned_whole(p.tensor));
        EXPECT_EQ(p.row_begin, 0) << name;
        EXPECT_EQ(p.row_end, plan.rows(p.tensor)) << name;
      } else {
        EXPECT_FALSE(plan.owned_whole(p.tensor));
        others.push_back(p);
      }
    }
    EXPECT_EQ(plan.rank_numel[size_t(r)], offset);
    ASSERT_EQ(others.size(), rest_plan.pieces[size_t(r)].size());
    for (size_t k = 0; k < others.size(); ++k) {
      EXPECT_EQ(plan.tensors[size_t(others[k].tensor)].name, rest.at(size_t(rest_plan.pieces[size_t(r)][k].tensor)).name);
      EXPECT_EQ(others[k].row_begin, rest_plan.pieces[size_t(r)][k].row_begin);
      EXPECT_EQ(others[k].row_end, rest_plan.pieces[size_t(r)][k].row_end);
    }
  }
  EXPECT_TRUE(plan.has_owned_tensors());
  EXPECT_FALSE(rest_plan.has_owned_tensors());
  try {
    assign_experts_to_owners(owned, 3);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("8 experts do not split evenly over 3 ranks"), std::string::npos) << e.what();
  }
  std::vector<ShardedTensor> dense{{"embed", {300, 16}}, {"layers.0.o", {16, 16}}};
  try {
    assign_experts_to_owners(dense, 2);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the model has no experts"), std::string::npos) << e.what();
  }
}

TEST(ShardPlan, RanksMustBePositive) {
  try {
    plan_shards({{"a", {4}}}, 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan_shards: 0 ranks (must be at least 1)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lockstep
