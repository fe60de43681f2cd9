// Weighted sharding over virtual CPU devices: shard extents in the ratio of
// --device_weights, and the same results as one device.
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/verify.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

struct Topology {
  std::string name;
  std::vector<int> weights;
};

// Test names show the topology's name.
void PrintTo(const Topology& t, std::ostream* os) { *os << t.name; }

// Shards as (device, begin, end), in device order.
std::vector<std::array<int64_t, 3>> Extents(const v1::Timings& t) {
  std::vector<std::array<int64_t, 3>> out;
  for (const v1::ShardTiming& s : t.shards()) out.push_back({s.device(), s.begin(), s.end()});
  std::sort(out.begin(), out.end());
  return out;
}

// The shards a weighted split of `extent` must give when extent is a
// multiple of (sum of weights) * unit: device i gets extent * w_i / sum.
std::vector<std::array<int64_t, 3>> Proportional(const std::vector<int>& weights, int64_t extent) {
  const int64_t total = std::accumulate(weights.begin(), weights.end(), int64_t{0});
  std::vector<std::array<int64_t, 3>> out;
  int64_t begin = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    int64_t size = extent * weights[i] / total;
    out.push_back({static_cast<int64_t>(i), begin, begin + size});
    begin += size;
  }
  return out;
}

// The shards cover [0, extent) exactly, without empty shards.
void ExpectCovers(const v1::Timings& t, int64_t extent) {
  auto shards = Extents(t);
  int64_t next = 0;
  std::sort(shards.begin(), shards.end(), [](const auto& a, const auto& b) { return a[1] < b[1]; });
  for (const auto& s : shards) {
    EXPECT_EQ(s[1], next);
    EXPECT_LT(s[1], s[2]) << "empty shard on device " << s[0];
    next = s[2];
  }
  EXPECT_EQ(next, extent);
}

class ShardingTest : public ::testing::TestWithParam<Topology> {
 protected:
  void SetUp() override {
    GC_SKIP_IF_DEVICES_OVERRIDDEN();
    const std::vector<int>& w = GetParam().weights;
    auto many = ServerProcess::Start({absl::StrCat("--cpu_devices=", w.size()),
                                      absl::StrCat("--device_weights=", absl::StrJoin(w, ","))});
    ASSERT_TRUE(many.ok()) << many.status();
    auto one = ServerProcess::Start({"--cpu_devices=1"});
    ASSERT_TRUE(one.ok()) << one.status();
    many_server_ = *std::move(many);
    one_server_ = *std::move(one);
    many_ = many_server_->NewClient();
    one_ = one_server_->NewClient();
    unit_ = std::accumulate(w.begin(), w.end(), 0);
  }

  std::unique_ptr<ServerProcess> many_server_, one_server_;
  std::unique_ptr<Client> many_, one_;
  int unit_ = 1;  // sum of the weights
};

TEST_P(ShardingTest, GemmRowsInRatio) {
  const int64_t m = 100 * unit_;
  for (v1::DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    v1::GemmRequest request = MakeGemm(dtype, {.m = m, .n = 33, .k = 7, .beta = 1});
    auto sharded = many_->Gemm(request);
    auto single = one_->Gemm(request);
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    ASSERT_TRUE(single.ok()) << single.status();
    EXPECT_EQ(Extents(sharded->timings()), Proportional(GetParam().weights, m));
    for (const auto& s : sharded->timings().shards()) EXPECT_EQ(s.axis(), "rows");
    EXPECT_TRUE(Passes(CheckGemm(request, *sharded)));
    EXPECT_TRUE(Passes(CheckGemm(request, *single)));
    ASSERT_EQ(single->timings().shards_size(), 1);
    // Not compared bit for bit with one device's result: the CPU backend's
    // BLAS (OpenBLAS) picks its kernels by the size of each call, and on
    // AVX-512 hosts a row computed in a shard may round otherwise than in
    // one call over every row. Both are checked against float64 above.
  }
}

TEST_P(ShardingTest, GemvRowsInRatio) {
  const int64_t m = 50 * unit_;
  for (v1::DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    v1::GemvRequest request = MakeGemv(dtype, {.m = m, .k = 127, .ncols = 2});
    auto sharded = many_->Gemv(request);
    auto single = one_->Gemv(request);
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    ASSERT_TRUE(single.ok()) << single.status();
    EXPECT_EQ(Extents(sharded->timings()), Proportional(GetParam().weights, m));
    EXPECT_TRUE(Passes(CheckGemv(request, *sharded)));
    EXPECT_TRUE(Passes(CheckGemv(request, *single)));
    ASSERT_EQ(single->timings().shards_size(), 1);
    // Not bit for bit with one device, as GemmRowsInRatio says (OpenBLAS).
  }
}

TEST_P(ShardingTest, ReduceRowsAndChunksInRatio) {
  for (v1::DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    // Independent rows: the outer axis is split.
    const int64_t rows = 20 * unit_;
    v1::ReduceRequest by_rows = MakeReduce(dtype, {rows, 33}, v1::SUM, 1);
    auto sharded = many_->Reduce(by_rows);
    auto single = one_->Reduce(by_rows);
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    ASSERT_TRUE(single.ok()) << single.status();
    EXPECT_EQ(Extents(sharded->timings()), Proportional(GetParam().weights, rows));
    EXPECT_TRUE(Passes(CheckReduce(by_rows, *sharded)));
    EXPECT_EQ(sharded->output().data(), single->output().data());

    // One output: the reduced axis is split in whole 32768-element chunks.
    const int64_t n = int64_t{32768} * unit_;
    for (v1::ReduceOp op : {v1::SUM, v1::MAX, v1::MEAN}) {
      SCOPED_TRACE(v1::ReduceOp_Name(op));
      v1::ReduceRequest whole = MakeReduce(dtype, {n}, op);
      auto sharded_whole = many_->Reduce(whole);
      auto single_whole = one_->Reduce(whole);
      ASSERT_TRUE(sharded_whole.ok()) << sharded_whole.status();
      ASSERT_TRUE(single_whole.ok()) << single_whole.status();
      EXPECT_EQ(Extents(sharded_whole->timings()), Proportional(GetParam().weights, n));
      EXPECT_TRUE(Passes(CheckReduce(whole, *sharded_whole)));
      EXPECT_EQ(sharded_whole->output().data(), single_whole->output().data());
    }
  }
}

TEST_P(ShardingTest, TransposeBlocksInRatio) {
  const int64_t rows = 30 * unit_;
  for (v1::DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    v1::TransposeRequest request = MakeTranspose(dtype, {33, rows});  // out [rows, 33]
    auto sharded = many_->Transpose(request);
    auto single = one_->Transpose(request);
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    ASSERT_TRUE(single.ok()) << single.status();
    EXPECT_EQ(Extents(sharded->timings()), Proportional(GetParam().weights, rows));
    EXPECT_TRUE(Passes(CheckTranspose(request, *sharded)));
    EXPECT_EQ(sharded->output().data(), single->output().data());
  }
}

TEST_P(ShardingTest, AttentionHeadsAndQueryRowsInRatio) {
  for (v1::DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    // batch x heads_q = unit_ pairs: split by heads.
    v1::AttentionRequest by_heads = MakeAttention(dtype, {.batch = 1,
                                                          .heads_q = unit_,
                                                          .heads_kv = 1,
                                                          .seq_q = 7,
                                                          .seq_kv = 33,
                                                          .causal = true,
                                                          .lse = true});
    auto sharded = many_->Attention(by_heads);
    auto single = one_->Attention(by_heads);
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    ASSERT_TRUE(single.ok()) << single.status();
    EXPECT_EQ(Extents(sharded->timings()), Proportional(GetParam().weights, unit_));
    EXPECT_TRUE(Passes(CheckAttention(by_heads, *sharded)));
    EXPECT_EQ(sharded->o().data(), single->o().data());
    EXPECT_EQ(sharded->lse().data(), single->lse().data());

    // One head: split by query rows.
    const int64_t seq_q = 5 * unit_;
    v1::AttentionRequest by_rows = MakeAttention(
        dtype, {.seq_q = seq_q, .seq_kv = 33, .head_dim = 128, .causal = true, .lse = true});
    auto sharded_rows = many_->Attention(by_rows);
    auto single_rows = one_->Attention(by_rows);
    ASSERT_TRUE(sharded_rows.ok()) << sharded_rows.status();
    ASSERT_TRUE(single_rows.ok()) << single_rows.status();
    EXPECT_EQ(Extents(sharded_rows->timings()), Proportional(GetParam().weights, seq_q));
    for (const auto& s : sharded_rows->timings().shards()) EXPECT_EQ(s.axis(), "query_rows");
    EXPECT_TRUE(Passes(CheckAttention(by_rows, *sharded_rows)));
    EXPECT_EQ(sharded_rows->o().data(), single_rows->o().data());
  }
}

// Sizes that do not divide, and sizes below the device count: exact
// coverage, no empty shards, correct results.
TEST_P(ShardingTest, RemaindersAndTinySizes) {
  for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{7}, int64_t{33}, int64_t{127}}) {
    SCOPED_TRACE(absl::StrCat("m ", m));
    v1::GemmRequest gemm = MakeGemm(v1::BFLOAT16, {.m = m, .n = 7, .k = 33});
    auto response = many_->Gemm(gemm);
    ASSERT_TRUE(response.ok()) << response.status();
    ExpectCovers(response->timings(), m);
    EXPECT_LE(response->timings().shards_size(), std::min<int64_t>(m, GetParam().weights.size()));
    EXPECT_TRUE(Passes(CheckGemm(gemm, *response)));

    v1::TransposeRequest transpose = MakeTranspose(v1::FLOAT16, {7, m});
    auto t = many_->Transpose(transpose);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(Passes(CheckTranspose(transpose, *t)));

    v1::ReduceRequest reduce = MakeReduce(v1::FLOAT32, {m, 7}, v1::MIN, 0);
    auto r = many_->Reduce(reduce);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(Passes(CheckReduce(reduce, *r)));
  }
}

INSTANTIATE_TEST_SUITE_P(Weighted, ShardingTest,
                         ::testing::Values(Topology{"four_1_1_2_2", {1, 1, 2, 2}},
                                           Topology{"eight_1_1_1_1_2_2_2_2",
                                                    {1, 1, 1, 1, 2, 2, 2, 2}}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace gpucompute::testing
