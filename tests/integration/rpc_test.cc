// Every RPC through the client library against the real server, every dtype,
// odd sizes, checked against the float64 reference.
#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/verify.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

// One server (two virtual CPU devices, so that odd sizes split unevenly) for
// every test of the suite.
class RpcTest : public ::testing::TestWithParam<v1::DType> {
 protected:
  static void SetUpTestSuite() {
    auto server = ServerProcess::Start({"--cpu_devices=2"});
    if (!server.ok()) {
      *start_error_ = server.status();
      return;
    }
    server_ = server->release();
    client_ = server_->NewClient().release();
    // The device count comes from the server: GPUCOMPUTE_TEST_SERVER_ARGS
    // may run the suite over other devices.
    auto info = client_->GetServerInfo();
    num_devices_ = info.ok() ? info->devices_size() : 0;
  }
  static void TearDownTestSuite() {
    delete client_;
    delete server_;
    client_ = nullptr;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr) << start_error_->ToString(); }

  // Timings every successful response carries.
  static void ExpectTimings(const v1::Timings& t, bool empty_output) {
    EXPECT_GT(t.server_seconds(), 0);
    EXPECT_GE(t.queue_seconds(), 0);
    EXPECT_GE(t.receive_seconds(), 0);
    EXPECT_LE(t.queue_seconds() + t.receive_seconds() + t.decode_seconds() + t.encode_seconds(),
              t.server_seconds() + 1e-6);
    if (empty_output) return;
    EXPECT_FALSE(t.shards().empty());
    for (const v1::ShardTiming& s : t.shards()) {
      EXPECT_GE(s.device(), 0);
      EXPECT_LT(s.device(), num_devices_);
      EXPECT_FALSE(s.variant().empty());
      EXPECT_FALSE(s.axis().empty());
      EXPECT_LT(s.begin(), s.end());
      EXPECT_GE(s.kernel_seconds(), 0);
    }
  }

  static inline ServerProcess* server_ = nullptr;
  static inline Client* client_ = nullptr;
  static inline int num_devices_ = 0;
  static inline absl::Status* start_error_ = new absl::Status();
};

TEST_P(RpcTest, Gemm) {
  const GemmCase cases[] = {
      {.m = 1, .n = 1, .k = 1},
      {.m = 7, .n = 33, .k = 127},
      {.m = 127, .n = 7, .k = 33, .trans_a = true},
      {.m = 33, .n = 127, .k = 7, .trans_b = true, .alpha = 0.5, .beta = -1.5},
      {.m = 1000, .n = 7, .k = 33, .trans_a = true, .trans_b = true},
      {.m = 7, .n = 1000, .k = 1},
      {.batch = 3, .m = 7, .n = 33, .k = 33},
      {.batch = 2, .m = 33, .n = 7, .k = 127, .trans_a = true, .trans_b = true, .b_batched = true},
      {.batch = 2, .m = 7, .n = 7, .k = 7, .b_batched = true, .beta = 2, .c_batched = true},
      {.batch = 3, .m = 33, .n = 7, .k = 1, .beta = 1, .c_batched = false},
  };
  for (const GemmCase& c : cases) {
    SCOPED_TRACE(absl::StrCat("batch ", c.batch, " m ", c.m, " n ", c.n, " k ", c.k, " ta ",
                              c.trans_a, " tb ", c.trans_b, " beta ", c.beta));
    v1::GemmRequest request = MakeGemm(GetParam(), c);
    auto response = client_->Gemm(request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(Passes(CheckGemm(request, *response)));
    ExpectTimings(response->timings(), false);
  }
}

TEST_P(RpcTest, Gemv) {
  const GemvCase cases[] = {
      {.m = 1, .k = 1},
      {.m = 7, .k = 33},
      {.m = 127, .k = 1000},
      {.m = 1000, .k = 127, .trans_a = true},
      {.m = 33, .k = 7, .ncols = 3},
      {.m = 127, .k = 33, .ncols = 8, .trans_a = true, .alpha = -2, .beta = 0.5},
      {.m = 33, .k = 127, .ncols = 1, .beta = 1},
      {.m = 7, .k = 1, .alpha = 3, .beta = -1},
  };
  for (const GemvCase& c : cases) {
    SCOPED_TRACE(absl::StrCat("m ", c.m, " k ", c.k, " ncols ", c.ncols, " ta ", c.trans_a,
                              " beta ", c.beta));
    v1::GemvRequest request = MakeGemv(GetParam(), c);
    auto response = client_->Gemv(request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(Passes(CheckGemv(request, *response)));
    ExpectTimings(response->timings(), false);
  }
}

TEST_P(RpcTest, Reduce) {
  struct Case {
    std::vector<int64_t> shape;
    std::optional<int> axis;
    bool keepdims;
  };
  const Case cases[] = {
      {{1}, std::nullopt, false},
      {{7}, std::nullopt, true},
      {{1000}, std::nullopt, false},
      {{1000}, 0, false},
      {{33, 127}, std::nullopt, false},
      {{33, 127}, 0, false},
      {{33, 127}, -1, true},
      {{7, 33, 127}, 1, false},
      {{7, 33, 127}, -3, true},
      {{127, 1, 7}, 1, false},
      {{2, 3, 5, 7}, 2, true},
      {{1000, 33}, std::nullopt, true},
  };
  for (v1::ReduceOp op : {v1::SUM, v1::MAX, v1::MIN, v1::MEAN}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(v1::ReduceOp_Name(op), " ", ShapeString(c.shape), " axis ",
                                c.axis ? absl::StrCat(*c.axis) : "all", " keepdims ", c.keepdims));
      v1::ReduceRequest request = MakeReduce(GetParam(), c.shape, op, c.axis, c.keepdims);
      auto response = client_->Reduce(request);
      ASSERT_TRUE(response.ok()) << response.status();
      EXPECT_TRUE(Passes(CheckReduce(request, *response)));
      ExpectTimings(response->timings(), false);
    }
  }
}

TEST_P(RpcTest, Transpose) {
  struct Case {
    std::vector<int64_t> shape;
    std::vector<int> perm;
  };
  const Case cases[] = {
      {{1}, {}},
      {{7}, {0}},
      {{7, 33}, {}},
      {{127, 1000}, {1, 0}},
      {{33, 7}, {0, 1}},
      {{7, 33, 5}, {2, 0, 1}},
      {{1, 127, 7}, {}},
      {{3, 7, 5, 9}, {3, 1, 0, 2}},
      {{2, 3, 4, 5}, {0, 1, 3, 2}},
      {{33, 1, 7, 2}, {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(ShapeString(c.shape), " perm [", absl::StrJoin(c.perm, ","), "]"));
    v1::TransposeRequest request = MakeTranspose(GetParam(), c.shape, c.perm);
    auto response = client_->Transpose(request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(Passes(CheckTranspose(request, *response)));
    ExpectTimings(response->timings(), false);
  }
}

TEST_P(RpcTest, Attention) {
  const AttentionCase cases[] = {
      {},
      {.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 7, .seq_kv = 33, .causal = true},
      {.batch = 1,
       .heads_q = 2,
       .heads_kv = 1,
       .seq_q = 33,
       .seq_kv = 7,
       .causal = true,
       .lse = true},
      {.batch = 1,
       .heads_q = 3,
       .heads_kv = 3,
       .seq_q = 127,
       .seq_kv = 33,
       .head_dim = 128,
       .lse = true},
      {.batch = 3,
       .heads_q = 1,
       .heads_kv = 1,
       .seq_q = 1,
       .seq_kv = 127,
       .head_dim = 128,
       .causal = true,
       .scale = 0.3},
      {.batch = 1,
       .heads_q = 8,
       .heads_kv = 2,
       .seq_q = 33,
       .seq_kv = 33,
       .causal = true,
       .lse = true},
      // Head dims other than 64 and 128 (every multiple of 8 up to 256).
      {.heads_q = 2, .heads_kv = 1, .seq_q = 129, .seq_kv = 77, .head_dim = 8, .causal = true},
      {.heads_q = 2, .heads_kv = 2, .seq_q = 130, .seq_kv = 200, .head_dim = 40, .lse = true},
      {.batch = 2, .heads_q = 2, .heads_kv = 1, .seq_q = 5, .seq_kv = 300, .head_dim = 96},
      {.heads_q = 1, .heads_kv = 1, .seq_q = 140, .seq_kv = 140, .head_dim = 200, .causal = true},
      {.heads_q = 2, .heads_kv = 2, .seq_q = 17, .seq_kv = 65, .head_dim = 256, .lse = true},
  };
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(absl::StrCat("B ", c.batch, " Hq ", c.heads_q, " Hkv ", c.heads_kv, " Sq ",
                              c.seq_q, " Skv ", c.seq_kv, " D ", c.head_dim, " causal ", c.causal));
    v1::AttentionRequest request = MakeAttention(GetParam(), c);
    auto response = client_->Attention(request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(Passes(CheckAttention(request, *response)));
    EXPECT_EQ(response->has_lse(), c.lse);
    ExpectTimings(response->timings(), false);
  }
}

TEST_P(RpcTest, Echo) {
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{}, {0}, {1}, {7, 33}, {1000, 127}, {2, 3, 5, 7, 11}}) {
    SCOPED_TRACE(ShapeString(shape));
    v1::EchoRequest request = MakeEcho(GetParam(), shape);
    auto response = client_->Echo(request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(Passes(CheckEcho(request, *response)));
    EXPECT_GT(response->timings().server_seconds(), 0);
  }
}

TEST_P(RpcTest, OutputDTypeConverts) {
  for (v1::DType out : kAllDTypes) {
    SCOPED_TRACE(absl::StrCat("output ", DTypeName(out)));
    v1::GemmRequest gemm = MakeGemm(GetParam(), {.m = 33, .n = 7, .k = 127});
    gemm.mutable_options()->set_output_dtype(out);
    auto c = client_->Gemm(gemm);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(Passes(CheckGemm(gemm, *c)));

    // beta != 0: C is read at its own precision, whatever the output dtype.
    v1::GemmRequest gemm_c = MakeGemm(GetParam(), {.m = 33, .n = 7, .k = 127, .beta = 0.5});
    gemm_c.mutable_options()->set_output_dtype(out);
    auto cc = client_->Gemm(gemm_c);
    ASSERT_TRUE(cc.ok()) << cc.status();
    EXPECT_TRUE(Passes(CheckGemm(gemm_c, *cc)));

    // beta != 0: y is read at its own precision, whatever the output dtype.
    v1::GemvRequest gemv = MakeGemv(GetParam(), {.m = 33, .k = 127, .ncols = 3, .beta = 0.5});
    gemv.mutable_options()->set_output_dtype(out);
    auto g = client_->Gemv(gemv);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(Passes(CheckGemv(gemv, *g)));

    v1::TransposeRequest transpose = MakeTranspose(GetParam(), {7, 33, 5}, {1, 2, 0});
    transpose.mutable_options()->set_output_dtype(out);
    auto t = client_->Transpose(transpose);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(Passes(CheckTranspose(transpose, *t)));

    v1::ReduceRequest reduce = MakeReduce(GetParam(), {33, 127}, v1::MEAN, 1);
    reduce.mutable_options()->set_output_dtype(out);
    auto r = client_->Reduce(reduce);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(Passes(CheckReduce(reduce, *r)));

    v1::AttentionRequest attention = MakeAttention(GetParam(), {.seq_q = 7, .seq_kv = 33});
    attention.mutable_options()->set_output_dtype(out);
    auto a = client_->Attention(attention);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(Passes(CheckAttention(attention, *a)));
  }
}

// Every variant the server lists runs and is correct.
TEST_P(RpcTest, EveryVariant) {
  auto info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  // Every CPU variant runs every dtype and shape. A GPU rung named for an
  // input it cannot take (a tensor-core rung given fp32, say) is refused with
  // INVALID_ARGUMENT naming options.variant.
  auto refused = [&](const absl::Status& status) {
    return info->backend() != "cpu" && status.code() == absl::StatusCode::kInvalidArgument &&
           absl::StartsWith(status.message(), "options.variant:");
  };
  for (const v1::OperationVariants& op : info->operations()) {
    for (const std::string& variant : op.variants()) {
      SCOPED_TRACE(absl::StrCat(op.operation(), "/", variant));
      v1::OpOptions options;
      options.set_variant(variant);
      absl::StatusOr<CheckResult> check;
      std::set<std::string> ran;
      auto record = [&](const v1::Timings& t) {
        for (const auto& s : t.shards()) ran.insert(s.variant());
      };
      if (op.operation() == "gemm") {
        v1::GemmRequest r = MakeGemm(GetParam(), {.m = 33, .n = 7, .k = 127, .beta = 1});
        *r.mutable_options() = options;
        auto response = client_->Gemm(r);
        if (!response.ok() && refused(response.status())) continue;
        ASSERT_TRUE(response.ok()) << response.status();
        check = CheckGemm(r, *response);
        record(response->timings());
      } else if (op.operation() == "gemv") {
        v1::GemvRequest r = MakeGemv(GetParam(), {.m = 127, .k = 33, .ncols = 2});
        *r.mutable_options() = options;
        auto response = client_->Gemv(r);
        if (!response.ok() && refused(response.status())) continue;
        ASSERT_TRUE(response.ok()) << response.status();
        check = CheckGemv(r, *response);
        record(response->timings());
      } else if (op.operation() == "reduce") {
        v1::ReduceRequest r = MakeReduce(GetParam(), {33, 127}, v1::SUM, 0);
        *r.mutable_options() = options;
        auto response = client_->Reduce(r);
        if (!response.ok() && refused(response.status())) continue;
        ASSERT_TRUE(response.ok()) << response.status();
        check = CheckReduce(r, *response);
        record(response->timings());
      } else if (op.operation() == "transpose") {
        v1::TransposeRequest r = MakeTranspose(GetParam(), {33, 127});
        *r.mutable_options() = options;
        auto response = client_->Transpose(r);
        if (!response.ok() && refused(response.status())) continue;
        ASSERT_TRUE(response.ok()) << response.status();
        check = CheckTranspose(r, *response);
        record(response->timings());
      } else if (op.operation() == "attention") {
        v1::AttentionRequest r =
            MakeAttention(GetParam(), {.heads_q = 2, .seq_q = 33, .seq_kv = 7, .causal = true});
        *r.mutable_options() = options;
        auto response = client_->Attention(r);
        if (!response.ok() && refused(response.status())) continue;
        ASSERT_TRUE(response.ok()) << response.status();
        check = CheckAttention(r, *response);
        record(response->timings());
      } else {
        ADD_FAILURE() << "unknown operation " << op.operation();
        continue;
      }
      EXPECT_TRUE(Passes(check));
      EXPECT_EQ(ran, std::set<std::string>{variant});
    }
  }
}

// options.devices restricts the shards to the devices named.
TEST_P(RpcTest, DeviceSubset) {
  if (num_devices_ < 2) GTEST_SKIP() << "needs 2 devices; the server has " << num_devices_;
  for (int device : {0, 1}) {
    v1::GemmRequest r = MakeGemm(GetParam(), {.m = 127, .n = 33, .k = 7});
    r.mutable_options()->add_devices(device);
    auto response = client_->Gemm(r);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(Passes(CheckGemm(r, *response)));
    ASSERT_EQ(response->timings().shards_size(), 1);
    EXPECT_EQ(response->timings().shards(0).device(), device);
    EXPECT_EQ(response->timings().shards(0).begin(), 0);
    EXPECT_EQ(response->timings().shards(0).end(), 127);
  }
}

// The FLOPs a response reports (flops_per_second over each shard's kernel
// time) are the operation's, counted here from first principles, whichever
// backend and however many devices ran it: causal attention counts exactly
// the keys each query row sees.
TEST_P(RpcTest, ReportedFlopsAreTheOperations) {
  auto reported = [](const v1::Timings& t) {
    double flops = 0;
    for (const v1::ShardTiming& s : t.shards()) flops += s.flops_per_second() * s.kernel_seconds();
    return flops;
  };
  const AttentionCase c = {.batch = 2,
                           .heads_q = 4,
                           .heads_kv = 2,
                           .seq_q = 96,
                           .seq_kv = 160,
                           .head_dim = 64,
                           .causal = true};
  v1::AttentionRequest a = MakeAttention(GetParam(), c);
  auto attention = client_->Attention(a);
  ASSERT_TRUE(attention.ok()) << attention.status();
  double keys = 0;
  for (int64_t i = 0; i < c.seq_q; ++i)
    keys += double(std::min(c.seq_kv, i + c.seq_kv - c.seq_q + 1));
  const double want = 4.0 * c.batch * c.heads_q * keys * c.head_dim;
  EXPECT_NEAR(reported(attention->timings()), want, want * 1e-9);

  v1::GemmRequest g = MakeGemm(GetParam(), {.batch = 2, .m = 96, .n = 80, .k = 112});
  auto gemm = client_->Gemm(g);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const double gemm_flops = 2.0 * 2 * 96 * 80 * 112;
  EXPECT_NEAR(reported(gemm->timings()), gemm_flops, gemm_flops * 1e-9);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, RpcTest, ::testing::ValuesIn(kAllDTypes),
                         [](const auto& info) { return DTypeName(info.param); });

TEST(ServerInfoTest, DescribesTheCpuBackend) {
  GC_SKIP_IF_DEVICES_OVERRIDDEN();
  auto server = ServerProcess::Start({"--cpu_devices=3", "--device_weights=1,2,3"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = (*server)->NewClient();
  auto info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->version().empty());
  EXPECT_EQ(info->backend(), "cpu");
  ASSERT_EQ(info->devices_size(), 3);
  for (int i = 0; i < 3; ++i) {
    const v1::DeviceInfo& d = info->devices(i);
    EXPECT_EQ(d.index(), i);
    EXPECT_EQ(d.kind(), "cpu");
    EXPECT_FALSE(d.name().empty());
    EXPECT_GT(d.memory_bytes(), 0);
    EXPECT_GT(d.compute_units(), 0);
    EXPECT_DOUBLE_EQ(d.weight(), i + 1);
    EXPECT_TRUE(d.healthy());
    EXPECT_EQ(d.max_inflight_bytes(), 0);  // CPU devices: --max_inflight_bytes covers them
  }
  std::set<std::string> ops;
  for (const v1::OperationVariants& op : info->operations()) {
    ops.insert(op.operation());
    EXPECT_FALSE(op.variants().empty()) << op.operation();
  }
  EXPECT_EQ(ops, (std::set<std::string>{"gemm", "gemv", "reduce", "transpose", "attention"}));
  EXPECT_EQ(info->max_message_bytes(), int64_t{1} << 30);
  EXPECT_GT(info->max_inflight_bytes(), 0);
}

}  // namespace
}  // namespace gpucompute::testing
