// The cost model: shard work, shard seconds, and how many devices an
// operation is worth. Plain data, no device.
#include "server/core/cost.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "server/core/planner.h"

namespace gpucompute {
namespace {

// A GPU as the CUDA backend describes an H200 (server/device/cuda/cuda_device.cc).
constexpr DeviceCost kGpu = {150e-6, 8e9, 4000e9, 700e12};

// GPUs of the given weights, with device indices 0, 1, ...
std::vector<CostedDevice> Gpus(std::vector<double> weights) {
  std::vector<CostedDevice> devices;
  for (double w : weights) devices.push_back({int(devices.size()), w, kGpu});
  return devices;
}

// The devices a plan runs on, in shard order.
std::vector<int> Devices(const ShardPlan& plan) {
  std::vector<int> devices;
  for (const Shard& shard : plan.shards) devices.push_back(shard.device);
  return devices;
}

GemmSpec Gemm(int64_t m, int64_t n, int64_t k, DType dtype = DType::kBFloat16) {
  GemmSpec s;
  s.m = m;
  s.n = n;
  s.k = k;
  s.dtype = dtype;
  s.options.output_dtype = dtype;
  return s;
}

// Places `spec` on `devices` as the engine does.
ShardPlan PlaceGemm(const GemmSpec& spec, const std::vector<CostedDevice>& devices) {
  return PlaceByCost(
      devices, [&](absl::Span<const double> w) { return PlanGemm(spec, w); },
      [&](const ShardPlan&, const Shard& shard) { return GemmWork(spec, shard.range); });
}

ShardPlan PlaceReduce(const ReduceSpec& spec, const std::vector<CostedDevice>& devices) {
  return PlaceByCost(
      devices, [&](absl::Span<const double> w) { return PlanReduce(spec, w); },
      [&](const ShardPlan& plan, const Shard& shard) {
        return plan.axis == SplitAxis::kOuter
                   ? ReduceWork(spec, shard.range, {0, spec.axis_len}, false)
                   : ReduceWork(spec, {0, spec.outer}, shard.range, true);
      });
}

ReduceSpec FullSum(int64_t elements) {
  ReduceSpec s;
  s.input.dtype = DType::kFloat32;
  s.axis_len = elements;
  s.options.output_dtype = DType::kFloat32;
  return s;
}

TEST(ShardSeconds, AddsEveryModelledTerm) {
  const WorkCost work{8e9, 7e12, 8e9};
  EXPECT_DOUBLE_EQ(ShardSeconds(kGpu, work), 150e-6 + 1.0 + 2e-3 + 1e-2);
  EXPECT_DOUBLE_EQ(ShardSeconds(DeviceCost{}, work), 0.0);
  EXPECT_DOUBLE_EQ(ShardSeconds(DeviceCost{0.5, 0, 2.0, 0}, work), 0.5 + 4e9);
  // Only the bytes between host and device pay for staging.
  const WorkCost resident{8e9, 7e12, 2e9};
  EXPECT_DOUBLE_EQ(ShardSeconds(kGpu, resident), 150e-6 + 0.25 + 2e-3 + 1e-2);
}

TEST(WorkCost, ResidentOperandsAndKeptResultsStayOffTheHost) {
  GemmSpec s = Gemm(100, 50, 20, DType::kFloat32);
  EXPECT_DOUBLE_EQ(GemmWork(s, {0, 100}).host_bytes, GemmWork(s, {0, 100}).bytes);
  s.b.device = 1;  // B resident on device 1
  s.options.keep_output = true;
  const WorkCost w = GemmWork(s, {0, 100});
  EXPECT_DOUBLE_EQ(w.bytes, 4.0 * (100 * 20 + 20 * 50 + 100 * 50));
  EXPECT_DOUBLE_EQ(w.host_bytes, 4.0 * 100 * 20);  // A only
  // Admission holds host memory only.
  EXPECT_EQ(FootprintBytes(s), 4 * 100 * 20);
}

TEST(PlaceByCost, ABusyDeviceGivesTheNextOperationToAnIdleOne) {
  const GemmSpec small = Gemm(64, 64, 64);
  std::vector<CostedDevice> gpus = Gpus({1, 1});
  EXPECT_EQ(Devices(PlaceGemm(small, gpus)), (std::vector<int>{0}));
  gpus[0].busy_seconds = 1e-3;
  EXPECT_EQ(Devices(PlaceGemm(small, gpus)), (std::vector<int>{1}));
  gpus[1].busy_seconds = 2e-3;
  EXPECT_EQ(Devices(PlaceGemm(small, gpus)), (std::vector<int>{0}));
}

TEST(GemmWork, BytesAndFlopsOfTheShardRows) {
  GemmSpec s = Gemm(100, 50, 20, DType::kFloat32);
  s.options.output_dtype = DType::kFloat16;
  WorkCost w = GemmWork(s, {0, 100});
  EXPECT_DOUBLE_EQ(w.flops, 2.0 * 100 * 50 * 20);
  EXPECT_DOUBLE_EQ(w.bytes, 4.0 * 100 * 20 + 4.0 * 20 * 50 + 2.0 * 100 * 50);
  // Every shard reads all of B: two halves move B once more than the whole.
  const WorkCost top = GemmWork(s, {0, 50}), bottom = GemmWork(s, {50, 100});
  EXPECT_DOUBLE_EQ(top.bytes + bottom.bytes, w.bytes + 4.0 * 20 * 50);
  EXPECT_DOUBLE_EQ(top.flops + bottom.flops, w.flops);

  // Batched A and C, shared B, C read (beta != 0).
  s.batch = 3;
  s.a_batched = s.c_batched = true;
  s.c = TensorView{};
  w = GemmWork(s, {10, 20});
  EXPECT_DOUBLE_EQ(w.flops, 2.0 * 3 * 10 * 50 * 20);
  EXPECT_DOUBLE_EQ(w.bytes,
                   4.0 * 3 * 10 * 20 + 4.0 * 20 * 50 + 4.0 * 3 * 10 * 50 + 2.0 * 3 * 10 * 50);
  EXPECT_DOUBLE_EQ(GemmWork(s, {5, 5}).flops, 0.0);
}

TEST(GemvWork, BytesAndFlopsOfTheShardRows) {
  GemvSpec s;
  s.m = 10;
  s.k = 8;
  s.ncols = 2;
  s.dtype = DType::kBFloat16;
  s.y = TensorView{};
  s.options.output_dtype = DType::kFloat32;
  const WorkCost w = GemvWork(s, {0, 10});
  EXPECT_DOUBLE_EQ(w.flops, 2.0 * 10 * 8 * 2);
  EXPECT_DOUBLE_EQ(w.bytes, 2.0 * (10 * 8 + 8 * 2) + 2.0 * 10 * 2 + 4.0 * 10 * 2);
  // x is read by every shard.
  EXPECT_DOUBLE_EQ(GemvWork(s, {0, 4}).bytes + GemvWork(s, {4, 10}).bytes, w.bytes + 2.0 * 8 * 2);
}

TEST(ReduceWork, FinalValuesOrOnePartialPerChunk) {
  ReduceSpec s;
  s.input.dtype = DType::kFloat16;
  s.outer = 4;
  s.axis_len = 3 * kReduceChunk;
  s.inner = 3;
  s.options.output_dtype = DType::kFloat32;
  const double elements = 4.0 * 3 * kReduceChunk * 3;
  WorkCost w = ReduceWork(s, {0, 4}, {0, s.axis_len}, false);
  EXPECT_DOUBLE_EQ(w.flops, elements);
  EXPECT_DOUBLE_EQ(w.bytes, 2.0 * elements + 4.0 * 12);
  // Two whole chunks and a short third: three partials of every output.
  w = ReduceWork(s, {0, 4}, {0, 2 * kReduceChunk + 5}, true);
  EXPECT_DOUBLE_EQ(w.flops, 4.0 * (2 * kReduceChunk + 5) * 3);
  EXPECT_DOUBLE_EQ(w.bytes, 2.0 * w.flops + 4.0 * 12 * 3);
}

TEST(TransposeWork, ElementsUnderThePrefixRange) {
  TransposeSpec s;
  s.input.dtype = DType::kBFloat16;
  s.rank = 3;
  s.in_shape = {7, 600, 33};
  s.perm = {1, 2, 0};  // out [600, 33, 7]
  s.options.output_dtype = DType::kFloat32;
  EXPECT_DOUBLE_EQ(TransposeWork(s, 0, {0, 1}).bytes, 7.0 * 600 * 33 * (2 + 4));
  EXPECT_DOUBLE_EQ(TransposeWork(s, 1, {100, 200}).bytes, 100.0 * 33 * 7 * (2 + 4));
  EXPECT_DOUBLE_EQ(TransposeWork(s, 2, {0, 66}).bytes, 66.0 * 7 * (2 + 4));
  EXPECT_DOUBLE_EQ(TransposeWork(s, 1, {0, 600}).flops, 0.0);
}

AttentionSpec Attention(int64_t batch, int64_t hq, int64_t hkv, int64_t sq, int64_t skv,
                        bool causal) {
  AttentionSpec s;
  s.batch = batch;
  s.heads_q = hq;
  s.heads_kv = hkv;
  s.seq_q = sq;
  s.seq_kv = skv;
  s.head_dim = 64;
  s.causal = causal;
  s.dtype = DType::kBFloat16;
  s.options.output_dtype = DType::kBFloat16;
  return s;
}

TEST(AttentionWork, CausalFlopsCountTheKeysEachRowSees) {
  for (const auto& [sq, skv] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {7, 7}, {17, 4097}, {40, 33}, {100, 5}, {5, 0}}) {
    const AttentionSpec s = Attention(1, 1, 1, sq, skv, true);
    for (int64_t begin = 0; begin <= sq; begin += 3) {
      for (int64_t end = begin; end <= sq; end += 2) {
        double keys = 0;
        for (int64_t i = begin; i < end; ++i) {
          keys += double(std::clamp<int64_t>(i + skv - sq + 1, 0, skv));
        }
        EXPECT_DOUBLE_EQ(AttentionWork(s, {0, 1}, {begin, end}).flops, 4.0 * keys * 64)
            << "sq " << sq << " skv " << skv << " rows [" << begin << ", " << end << ")";
      }
    }
  }
  // Without the mask every row sees every key.
  EXPECT_DOUBLE_EQ(AttentionWork(Attention(1, 2, 2, 10, 30, false), {0, 2}, {0, 10}).flops,
                   4.0 * 2 * 10 * 30 * 64);
  // Far more rows than a loop could visit: only the last 8 see keys (1 + ... + 8).
  const AttentionSpec huge = Attention(1, 1, 1, int64_t{1} << 50, 8, true);
  EXPECT_DOUBLE_EQ(AttentionWork(huge, {0, 1}, {0, huge.seq_q}).flops, 4.0 * 36 * 64);
}

TEST(AttentionWork, KeysAndValuesOfEveryKvHeadTheShardReads) {
  // 2 x 8 query heads over 2 kv heads (groups of 4): K and V per kv head.
  const AttentionSpec s = Attention(2, 8, 2, 16, 32, false);
  const double q_head = 16.0 * 64 * 2, kv_head = 2.0 * 32 * 64 * 2;  // Q + O; K + V
  EXPECT_DOUBLE_EQ(AttentionWork(s, {0, 16}, {0, 16}).bytes, 16 * 2 * q_head + 4 * kv_head);
  EXPECT_DOUBLE_EQ(AttentionWork(s, {3, 5}, {0, 16}).bytes, 2 * 2 * q_head + 2 * kv_head);
  EXPECT_DOUBLE_EQ(AttentionWork(s, {6, 10}, {0, 16}).bytes, 4 * 2 * q_head + 2 * kv_head);
  // Split by query rows, every shard reads all of K and V.
  EXPECT_DOUBLE_EQ(AttentionWork(s, {0, 16}, {0, 8}).bytes, 16 * q_head + 4 * kv_head);
  AttentionSpec lse = s;
  lse.return_lse = true;
  EXPECT_DOUBLE_EQ(AttentionWork(lse, {0, 1}, {0, 16}).bytes, 2 * q_head + kv_head + 16 * 4);
}

TEST(PlaceByCost, NoFixedCostSplitsOverEveryCandidate) {
  const GemmSpec tiny = Gemm(6, 1, 1);
  for (const DeviceCost& cost : {DeviceCost{}, DeviceCost{0, 8e9, 4000e9, 700e12}}) {
    const std::vector<CostedDevice> devices = {
        {0, 1, cost}, {1, 1, cost}, {2, 2, cost}, {3, 2, cost}};
    int estimated = 0;
    const ShardPlan p = PlaceByCost(
        devices, [&](absl::Span<const double> w) { return PlanGemm(tiny, w); },
        [&](const ShardPlan&, const Shard& shard) {
          ++estimated;
          return GemmWork(tiny, shard.range);
        });
    EXPECT_EQ(Devices(p), (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(p.shards, PlanGemm(tiny, std::vector<double>{1, 1, 2, 2}).shards);
    EXPECT_EQ(estimated, 0);
  }
}

TEST(PlaceByCost, TinyOperationStaysOnTheHeaviestDevice) {
  const GemmSpec tiny = Gemm(64, 64, 64);
  ShardPlan p = PlaceGemm(tiny, Gpus({1, 2, 2, 1}));
  // The heavier; of equals, the earlier.
  EXPECT_EQ(p.shards, (std::vector<Shard>{{1, {0, 64}}}));
  // 8 rows of 1000: enough rows to split, too few bytes to be worth it.
  ReduceSpec rows = FullSum(1000);
  rows.outer = 8;
  p = PlaceReduce(rows, Gpus({1, 1}));
  EXPECT_EQ(p.shards, (std::vector<Shard>{{0, {0, 8}}}));
}

TEST(PlaceByCost, HugeOperationUsesEveryDevice) {
  const GemmSpec huge = Gemm(16384, 16384, 16384);
  ShardPlan p = PlaceGemm(huge, Gpus({1, 1, 1, 1}));
  EXPECT_EQ(p.shards, PlanGemm(huge, std::vector<double>{1, 1, 1, 1}).shards);
  // A 1 GiB sum splits the reduced axis in whole chunks.
  p = PlaceReduce(FullSum(int64_t{1} << 28), Gpus({1, 1}));
  EXPECT_EQ(Devices(p), (std::vector<int>{0, 1}));
  EXPECT_EQ(p.axis, SplitAxis::kAxis);
}

TEST(PlaceByCost, OperandsEveryShardReadsCanMakeSplittingNotPay) {
  // M = 64 rows against a 128 MiB B: each shard would upload B in full.
  EXPECT_EQ(Devices(PlaceGemm(Gemm(64, 8192, 8192), Gpus({1, 1}))), (std::vector<int>{0}));
  // With as many rows as columns, the rows are worth splitting.
  EXPECT_EQ(Devices(PlaceGemm(Gemm(8192, 8192, 8192), Gpus({1, 1}))), (std::vector<int>{0, 1}));
}

TEST(PlaceByCost, DevicesGrowWithTheOperation) {
  int last = 1;
  for (int shift = 8; shift <= 30; ++shift) {
    const int count =
        int(PlaceReduce(FullSum(int64_t{1} << shift), Gpus({1, 1, 1, 1})).shards.size());
    EXPECT_GE(count, last) << "2^" << shift << " elements";
    last = count;
  }
  EXPECT_EQ(last, 4);
}

TEST(PlaceByCost, SmallestCountWithinToleranceAndWeightsDivideIt) {
  // Seconds: 30 per shard plus one per 100 rows. Heaviest first: device 7
  // (weight 3) alone 40; with device 9 (weight 2) 600 rows, 36; all three
  // (1:3:2) 500 rows, 35. Two are within 5% of three. The plan names the
  // candidates' device indices.
  const DeviceCost slow{30, 1, 0, 0};
  const std::vector<CostedDevice> devices = {{5, 1, slow}, {7, 3, slow}, {9, 2, slow}};
  const ShardPlan p = PlaceByCost(
      devices,
      [](absl::Span<const double> w) {
        ShardPlan plan;
        plan.axis = SplitAxis::kRows;
        plan.shards = SplitByWeight(1000, w);
        return plan;
      },
      [](const ShardPlan&, const Shard& shard) {
        const double bytes = double(shard.range.size()) / 100;
        return WorkCost{bytes, 0, bytes};
      });
  // In candidate order.
  EXPECT_EQ(p.shards, (std::vector<Shard>{{7, {0, 600}}, {9, {600, 1000}}}));
}

TEST(PlaceByCost, UnderLoadASplitMustSaveMoreThanItAdds) {
  // Operands resident on device 0 and the result kept: no host bytes. Idle,
  // a 2048^3 GEMM is estimated faster in two halves.
  auto resident = [](GemmSpec s) {
    s.a.device = s.b.device = 0;
    s.options.keep_output = true;
    return s;
  };
  const GemmSpec mid = resident(Gemm(2048, 2048, 2048));
  std::vector<CostedDevice> gpus = Gpus({1, 1});
  EXPECT_EQ(Devices(PlaceGemm(mid, gpus)), (std::vector<int>{0, 1}));
  // Both devices busy (a stream of such requests): the second shard's fixed
  // cost is more than the half of the kernel it saves, so it runs whole, on
  // the less busy device.
  gpus[0].busy_seconds = 400e-6;
  gpus[1].busy_seconds = 300e-6;
  EXPECT_EQ(Devices(PlaceGemm(mid, gpus)), (std::vector<int>{1}));
  // One idle device takes it whole.
  gpus[0].busy_seconds = 0;
  EXPECT_EQ(Devices(PlaceGemm(mid, gpus)), (std::vector<int>{0}));
  // A split that saves milliseconds is still taken under the same load.
  gpus[0].busy_seconds = 400e-6;
  EXPECT_EQ(Devices(PlaceGemm(resident(Gemm(8192, 8192, 8192)), gpus)), (std::vector<int>{0, 1}));
}

TEST(PlaceByCost, OneCandidateIsTheAnswer) {
  const ShardPlan p = PlaceGemm(Gemm(16384, 16384, 16384), Gpus({1}));
  EXPECT_EQ(Devices(p), (std::vector<int>{0}));
}

}  // namespace
}  // namespace gpucompute
