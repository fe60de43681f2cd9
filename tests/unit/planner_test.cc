// The shard planner: plain arithmetic, no device.
#include "server/core/planner.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace gpucompute {
namespace {

// Every index of [0, extent) is covered exactly once, shards in device order,
// none empty.
void ExpectExactCover(const std::vector<Shard>& shards, int64_t extent, int devices) {
  int64_t next = 0;
  int last_device = -1;
  for (const Shard& s : shards) {
    EXPECT_EQ(s.range.begin, next);
    EXPECT_GT(s.range.size(), 0);
    EXPECT_GT(s.device, last_device);
    EXPECT_LT(s.device, devices);
    last_device = s.device;
    next = s.range.end;
  }
  EXPECT_EQ(next, extent);
}

TEST(SplitByWeight, WeightsOneOneTwoTwoGiveThatRatio) {
  const std::vector<double> w = {1, 1, 2, 2};
  const std::vector<Shard> shards = SplitByWeight(600, w);
  ASSERT_EQ(shards.size(), 4u);
  EXPECT_EQ(shards[0], (Shard{0, {0, 100}}));
  EXPECT_EQ(shards[1], (Shard{1, {100, 200}}));
  EXPECT_EQ(shards[2], (Shard{2, {200, 400}}));
  EXPECT_EQ(shards[3], (Shard{3, {400, 600}}));
}

TEST(SplitByWeight, RemaindersGoToTheLargestFractions) {
  // 601 * {1,1,2,2}/6 = 100.17, 100.17, 200.33, 200.33: floors sum to 600; the
  // extra unit goes to the largest fraction (device 2; ties to the lower index).
  const std::vector<Shard> s = SplitByWeight(601, std::vector<double>{1, 1, 2, 2});
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].range.size(), 100);
  EXPECT_EQ(s[1].range.size(), 100);
  EXPECT_EQ(s[2].range.size(), 201);
  EXPECT_EQ(s[3].range.size(), 200);
  // 10 over three equal weights: 3.33 each, one extra to device 0.
  const std::vector<Shard> t = SplitByWeight(10, std::vector<double>{1, 1, 1});
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].range.size(), 4);
  EXPECT_EQ(t[1].range.size(), 3);
  EXPECT_EQ(t[2].range.size(), 3);
}

TEST(SplitByWeight, ExactForEveryExtent) {
  const std::vector<std::vector<double>> weight_sets = {
      {1}, {1, 1}, {1, 1, 2, 2}, {3, 1, 0.5}, {1e-3, 1, 1e3}, {7, 7, 7, 7, 7, 7, 7, 7}};
  for (const auto& w : weight_sets) {
    for (int64_t extent = 0; extent < 300; ++extent) {
      ExpectExactCover(SplitByWeight(extent, w), extent, int(w.size()));
    }
    ExpectExactCover(SplitByWeight(int64_t{1} << 40, w), int64_t{1} << 40, int(w.size()));
  }
}

TEST(SplitByWeight, SizesStayWithinOneOfTheQuota) {
  const std::vector<double> w = {1, 3, 2, 5, 0.25};
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  for (int64_t extent : {1, 7, 33, 127, 1000, 123457}) {
    for (const Shard& s : SplitByWeight(extent, w)) {
      EXPECT_NEAR(double(s.range.size()), double(extent) * w[s.device] / total, 1.0);
    }
  }
}

TEST(SplitByWeight, ExtentSmallerThanDeviceCountSkipsEmptyShards) {
  const std::vector<Shard> s = SplitByWeight(2, std::vector<double>{1, 1, 2, 2});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0], (Shard{2, {0, 1}}));
  EXPECT_EQ(s[1], (Shard{3, {1, 2}}));
  EXPECT_TRUE(SplitByWeight(0, std::vector<double>{1, 1}).empty());
  const std::vector<Shard> one = SplitByWeight(1, std::vector<double>{1, 1, 1, 1});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0], (Shard{0, {0, 1}}));
}

TEST(SplitByWeight, OneDeviceTakesEverything) {
  const std::vector<Shard> s = SplitByWeight(1000, std::vector<double>{2.5});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0], (Shard{0, {0, 1000}}));
}

TEST(SplitByWeight, GranularityKeepsMultiplesExceptTheLast) {
  const std::vector<Shard> s = SplitByWeight(1000, std::vector<double>{1, 1, 2, 2}, 64);
  ExpectExactCover(s, 1000, 4);
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    EXPECT_EQ(s[i].range.begin % 64, 0);
    EXPECT_EQ(s[i].range.size() % 64, 0);
  }
  // 16 units of 64 (the last short): 16 * {1,1,2,2}/6 = 2.67, 2.67, 5.33, 5.33.
  EXPECT_EQ(s[0].range.size(), 3 * 64);
  EXPECT_EQ(s[1].range.size(), 3 * 64);
  EXPECT_EQ(s[2].range.size(), 5 * 64);
  EXPECT_EQ(s[3].range.end, 1000);
}

const std::vector<double> kFour = {1, 1, 2, 2};

TEST(Plans, GemmAndGemvSplitRowsOfTheOutput) {
  GemmSpec g;
  g.batch = 3;
  g.m = 127;
  g.n = 5;
  g.k = 9;
  ShardPlan p = PlanGemm(g, kFour);
  EXPECT_EQ(p.axis, SplitAxis::kRows);
  ExpectExactCover(p.shards, 127, 4);

  GemvSpec v;
  v.m = 3;
  v.k = 1000;
  p = PlanGemv(v, kFour);
  EXPECT_EQ(p.axis, SplitAxis::kRows);
  ExpectExactCover(p.shards, 3, 4);
  EXPECT_EQ(p.shards.size(), 3u);
}

TEST(Plans, GemmAndGemvShardsBeginAtTheRowGranularity) {
  GemmSpec g;
  g.m = 1000;
  g.n = g.k = 7;
  GemvSpec v;
  v.m = 1001;
  v.k = 7;
  for (const auto& [p, m] :
       {std::pair{PlanGemm(g, kFour, 8), g.m}, std::pair{PlanGemv(v, kFour, 8), v.m}}) {
    ExpectExactCover(p.shards, m, 4);
    ASSERT_EQ(p.shards.size(), 4u);
    for (const Shard& s : p.shards) EXPECT_EQ(s.range.begin % 8, 0) << s.range.begin;
    // Still about 1:1:2:2 (within one unit of 8 rows).
    EXPECT_NEAR(double(p.shards[0].range.size()), m / 6.0, 8);
    EXPECT_NEAR(double(p.shards[3].range.size()), m / 3.0, 8);
  }
  // Fewer rows than one unit per device: one shard holds them all.
  g.m = 7;
  ShardPlan p = PlanGemm(g, kFour, 8);
  ASSERT_EQ(p.shards.size(), 1u);
  EXPECT_EQ(p.shards[0].range, (Range{0, 7}));
}

TEST(Plans, ReduceSplitsOuterRowsOrTheAxisInWholeChunks) {
  ReduceSpec r;
  r.outer = 33;
  r.axis_len = 1000;
  r.inner = 7;
  ShardPlan p = PlanReduce(r, kFour);
  EXPECT_EQ(p.axis, SplitAxis::kOuter);
  ExpectExactCover(p.shards, 33, 4);

  // A full reduction of 10 chunks: the axis, in whole chunks.
  r.outer = 1;
  r.inner = 1;
  r.axis_len = 10 * kReduceChunk - 5;
  p = PlanReduce(r, kFour);
  EXPECT_EQ(p.axis, SplitAxis::kAxis);
  ExpectExactCover(p.shards, r.axis_len, 4);
  for (size_t i = 0; i + 1 < p.shards.size(); ++i) {
    EXPECT_EQ(p.shards[i].range.size() % kReduceChunk, 0);
  }

  // Fewer chunks than outer rows: outer rows, even below the device count.
  r.outer = 2;
  r.axis_len = kReduceChunk;
  p = PlanReduce(r, kFour);
  EXPECT_EQ(p.axis, SplitAxis::kOuter);
  ExpectExactCover(p.shards, 2, 4);

  // One device: always outer.
  r.outer = 1;
  r.axis_len = 100 * kReduceChunk;
  p = PlanReduce(r, std::vector<double>{1});
  EXPECT_EQ(p.axis, SplitAxis::kOuter);
  ExpectExactCover(p.shards, 1, 1);

  // Empty output: nothing to run.
  r.outer = 0;
  p = PlanReduce(r, kFour);
  EXPECT_TRUE(p.shards.empty());
}

TEST(Plans, TransposeSplitsTheFewestLeadingOutputAxes) {
  TransposeSpec t;
  t.rank = 3;
  t.in_shape = {2, 3, 50, 0};
  t.perm = {0, 1, 2, 0};  // out [2, 3, 50]
  ShardPlan p = PlanTranspose(t, kFour);
  EXPECT_EQ(p.axis, SplitAxis::kOutBlocks);
  EXPECT_EQ(p.prefix_axes, 2);  // 2 < 4 devices, 2*3 = 6 >= 4
  ExpectExactCover(p.shards, 6, 4);

  t.perm = {2, 0, 1, 0};  // out [50, 2, 3]
  p = PlanTranspose(t, kFour);
  EXPECT_EQ(p.prefix_axes, 1);
  ExpectExactCover(p.shards, 50, 4);

  // Never the last axis: [2, 3] keeps prefix 1 although 2 < 4.
  t.rank = 2;
  t.in_shape = {3, 2, 0, 0};
  t.perm = {1, 0, 0, 0};
  p = PlanTranspose(t, kFour);
  EXPECT_EQ(p.prefix_axes, 1);
  ExpectExactCover(p.shards, 2, 4);

  // Rank 1: the whole tensor is one block.
  t.rank = 1;
  t.in_shape = {1000, 0, 0, 0};
  t.perm = {0, 0, 0, 0};
  p = PlanTranspose(t, kFour);
  EXPECT_EQ(p.prefix_axes, 0);
  ExpectExactCover(p.shards, 1, 4);
}

TEST(Plans, AttentionSplitsHeadsThenQueryRows) {
  AttentionSpec a;
  a.batch = 2;
  a.heads_q = 6;
  a.heads_kv = 2;
  a.seq_q = 100;
  a.seq_kv = 100;
  a.head_dim = 64;
  ShardPlan p = PlanAttention(a, kFour);
  EXPECT_EQ(p.axis, SplitAxis::kHeads);
  ExpectExactCover(p.shards, 12, 4);
  EXPECT_EQ(p.shards[0].range.size(), 2);
  EXPECT_EQ(p.shards[3].range.size(), 4);

  a.batch = 1;
  a.heads_q = 2;
  a.heads_kv = 1;
  p = PlanAttention(a, kFour);
  EXPECT_EQ(p.axis, SplitAxis::kQueryRows);
  ExpectExactCover(p.shards, 100, 4);
}

}  // namespace
}  // namespace gpucompute
