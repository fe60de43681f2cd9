// The Batch stream: every id answered, failures answered with their code
// while the stream goes on, results equal to the reference.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/verify.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

constexpr int kInvalidArgument = static_cast<int>(absl::StatusCode::kInvalidArgument);

// A request that must fail, and the field its error must name.
struct BadItem {
  v1::BatchRequest request;
  std::string field;
};

std::vector<BadItem> BadItems() {
  std::vector<BadItem> bad;
  {
    v1::BatchRequest r;  // no operation at all
    bad.push_back({r, ""});
  }
  {
    v1::BatchRequest r;
    *r.mutable_gemm() = MakeGemm(v1::FLOAT32, {.m = 7, .n = 7, .k = 7});
    r.mutable_gemm()->mutable_b()->set_shape(0, 8);  // inner dimensions differ
    r.mutable_gemm()->mutable_b()->set_data(std::string(8 * 7 * 4, '\0'));
    bad.push_back({r, "b.shape"});
  }
  {
    v1::BatchRequest r;
    *r.mutable_gemv() = MakeGemv(v1::FLOAT16, {.m = 7, .k = 33});
    r.mutable_gemv()->mutable_x()->set_dtype(v1::DTYPE_UNSPECIFIED);
    bad.push_back({r, "x.dtype"});
  }
  {
    v1::BatchRequest r;
    *r.mutable_reduce() = MakeReduce(v1::BFLOAT16, {7, 33}, v1::SUM, 2);
    bad.push_back({r, "axis"});
  }
  {
    v1::BatchRequest r;
    *r.mutable_transpose() = MakeTranspose(v1::FLOAT32, {7, 33}, {0, 0});
    bad.push_back({r, "perm"});
  }
  {
    v1::BatchRequest r;
    *r.mutable_attention() =
        MakeAttention(v1::FLOAT32, {.heads_q = 3, .heads_kv = 2, .seq_q = 7, .seq_kv = 7});
    bad.push_back({r, "q.shape[1]"});
  }
  {
    v1::BatchRequest r;
    *r.mutable_gemm() = MakeGemm(v1::FLOAT32, {.m = 7, .n = 7, .k = 7});
    r.mutable_gemm()->mutable_options()->set_variant("no-such-variant");
    bad.push_back({r, "options.variant"});
  }
  return bad;
}

std::vector<v1::BatchRequest> GoodItems(v1::DType dtype) {
  std::vector<v1::BatchRequest> good(6);
  *good[0].mutable_gemm() = MakeGemm(dtype, {.m = 33, .n = 7, .k = 127, .beta = 0.5});
  *good[1].mutable_gemm() = MakeGemm(dtype, {.batch = 2, .m = 7, .n = 33, .k = 7});
  *good[2].mutable_gemv() = MakeGemv(dtype, {.m = 127, .k = 33, .ncols = 3});
  *good[3].mutable_reduce() = MakeReduce(dtype, {33, 127}, v1::MAX, -1);
  *good[4].mutable_transpose() = MakeTranspose(dtype, {7, 33, 5}, {2, 0, 1});
  *good[5].mutable_attention() = MakeAttention(
      dtype, {.heads_q = 4, .heads_kv = 2, .seq_q = 7, .seq_kv = 33, .causal = true, .lse = true});
  return good;
}

class BatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = ServerProcess::Start({"--cpu_devices=2"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = server_->NewClient();
  }
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(BatchTest, FailuresMixedInEveryIdAnswered) {
  // Good items of every dtype with bad ones interleaved, a bad one first.
  std::vector<v1::BatchRequest> requests;
  std::map<std::string, std::string> bad_field;  // id -> field its error names
  std::vector<BadItem> bad = BadItems();
  size_t next_bad = 0;
  auto add_bad = [&] {
    BadItem item = bad[next_bad++ % bad.size()];
    item.request.set_id(absl::StrCat("bad-", requests.size()));
    bad_field[item.request.id()] = item.field;
    requests.push_back(item.request);
  };
  add_bad();
  for (v1::DType dtype : kAllDTypes) {
    for (v1::BatchRequest& r : GoodItems(dtype)) {
      r.set_id(absl::StrCat("good-", requests.size()));
      requests.push_back(std::move(r));
      if (requests.size() % 3 == 0) add_bad();
    }
  }
  while (next_bad < bad.size()) add_bad();

  auto items = client_->Batch(requests);
  ASSERT_TRUE(items.ok()) << items.status();
  ASSERT_EQ(items->size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const v1::BatchResponse& response = (*items)[i].response;
    SCOPED_TRACE(requests[i].id());
    EXPECT_EQ(response.id(), requests[i].id());
    auto field = bad_field.find(requests[i].id());
    if (field != bad_field.end()) {
      EXPECT_EQ(response.code(), kInvalidArgument) << response.message();
      EXPECT_NE(response.message().find(field->second), std::string::npos) << response.message();
      EXPECT_EQ(response.result_case(), v1::BatchResponse::RESULT_NOT_SET);
    } else {
      ASSERT_EQ(response.code(), 0) << response.message();
      EXPECT_TRUE(Passes(CheckBatchItem(requests[i], response)));
      EXPECT_GE((*items)[i].latency_seconds, 0);
    }
  }
}

TEST_F(BatchTest, ManyItemsWithABoundedWindow) {
  // 300 small items, at most 16 outstanding; one message reused for all.
  v1::BatchRequest request;
  *request.mutable_reduce() = MakeReduce(v1::FLOAT32, {7, 33}, v1::SUM, 1);
  const int64_t count = 300;
  auto items = client_->Batch(
      count,
      [&](int64_t i) -> const v1::BatchRequest& {
        request.set_id(absl::StrCat("item-", i));
        return request;
      },
      {}, 16);
  ASSERT_TRUE(items.ok()) << items.status();
  ASSERT_EQ(items->size(), count);
  for (int64_t i = 0; i < count; ++i) {
    const v1::BatchResponse& response = (*items)[i].response;
    EXPECT_EQ(response.id(), absl::StrCat("item-", i));
    ASSERT_EQ(response.code(), 0) << response.message();
    EXPECT_TRUE(Passes(CheckBatchItem(request, response)));
  }
}

TEST_F(BatchTest, SeveralStreamsAnswerEveryItemInRequestOrder) {
  // 301 items of different shapes over 3 streams (one on the client's
  // connection, two on connections of their own), at most 10 outstanding in
  // all; one message reused for all.
  v1::BatchRequest request;
  const int64_t count = 301;
  auto shape = [](int64_t i) { return std::vector<int64_t>{1 + i % 5, 3 + i % 7}; };
  auto items = client_->Batch(
      count,
      [&](int64_t i) -> const v1::BatchRequest& {
        *request.mutable_reduce() = MakeReduce(v1::FLOAT32, shape(i), v1::SUM, 1);
        request.set_id(absl::StrCat("item-", i));
        return request;
      },
      {}, 10, 3);
  ASSERT_TRUE(items.ok()) << items.status();
  ASSERT_EQ(items->size(), count);
  for (int64_t i = 0; i < count; ++i) {
    const v1::BatchResponse& response = (*items)[i].response;
    EXPECT_EQ(response.id(), absl::StrCat("item-", i));
    ASSERT_EQ(response.code(), 0) << response.message();
    const std::vector<int64_t> out = {shape(i)[0]};
    EXPECT_EQ(ShapeOf(response.reduce().output()), out);
  }
  // A repeated id is caught across streams too; a stream count outside
  // [1, 64] is refused.
  std::vector<v1::BatchRequest> repeated(4);
  for (v1::BatchRequest& r : repeated) {
    *r.mutable_reduce() = MakeReduce(v1::FLOAT32, {7}, v1::SUM);
    r.set_id(&r == &repeated[3] ? "0" : absl::StrCat(&r - repeated.data()));
  }
  EXPECT_EQ(client_->Batch(repeated, {}, 0, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Batch(repeated, {}, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  // More streams than items: every item still answered.
  repeated[3].set_id("3");
  auto few = client_->Batch(repeated, {}, 0, 8);
  ASSERT_TRUE(few.ok()) << few.status();
  for (const BatchItem& item : *few) EXPECT_EQ(item.response.code(), 0);
}

TEST_F(BatchTest, EmptyStream) {
  auto items = client_->Batch(std::vector<v1::BatchRequest>{});
  ASSERT_TRUE(items.ok()) << items.status();
  EXPECT_TRUE(items->empty());
}

TEST_F(BatchTest, OnlyFailures) {
  std::vector<v1::BatchRequest> requests;
  for (BadItem& item : BadItems()) {
    item.request.set_id(absl::StrCat(requests.size()));
    requests.push_back(item.request);
  }
  auto items = client_->Batch(requests);
  ASSERT_TRUE(items.ok()) << items.status();
  ASSERT_EQ(items->size(), requests.size());
  for (const BatchItem& item : *items) EXPECT_EQ(item.response.code(), kInvalidArgument);
  // The server still serves.
  auto echo = client_->Echo(MakeEcho(v1::FLOAT32, {7}));
  EXPECT_TRUE(echo.ok()) << echo.status();
}

TEST_F(BatchTest, RepeatedIdIsRejectedByTheClient) {
  std::vector<v1::BatchRequest> requests(2);
  for (v1::BatchRequest& r : requests) {
    *r.mutable_reduce() = MakeReduce(v1::FLOAT32, {7}, v1::SUM);
    r.set_id("same");
  }
  auto items = client_->Batch(requests);
  EXPECT_EQ(items.status().code(), absl::StatusCode::kInvalidArgument) << items.status();
}

}  // namespace
}  // namespace gpucompute::testing
