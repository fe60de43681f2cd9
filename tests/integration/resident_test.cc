// Resident tensors against the real server: uploads and downloads bit-exact
// over one and several streams, every operation on handles with its result
// kept, chains that never download between steps, malformed upload streams,
// ownership by session, an 8 GiB tensor, and the CLI's resident commands.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/npy.h"
#include "client/verify.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;

// A tensor of `dtype` and `shape` whose bytes are random bits (NaN and
// infinity patterns included: a transfer must not look at them).
v1::Tensor RandomBits(v1::DType dtype, const std::vector<int64_t>& shape) {
  std::string data(TensorBytes(dtype, shape).value(), '\0');
  for (char& c : data) c = static_cast<char>(Rng()());
  return MakeTensor(dtype, shape, std::move(data));
}

// -1 when equal, otherwise the first byte that differs (or the shorter size).
int64_t FirstDifference(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

std::string Lower(absl::string_view s) { return absl::AsciiStrToLower(s); }

// One server for the suite. Every test uses sessions of its own, so that
// what one lists is what it made.
class ResidentTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto server = ServerProcess::Start({"--cpu_devices=2"});
    if (!server.ok()) {
      *start_error_ = server.status();
      return;
    }
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr) << start_error_->ToString(); }

  // "<test name>/<name>": a session no other test uses.
  static std::string Session(const std::string& name = "main") {
    return absl::StrCat(::testing::UnitTest::GetInstance()->current_test_info()->name(), "/", name);
  }

  // A client of the suite's server as `session`; parallel transfers from the
  // first byte, in small chunks, so that small tensors span several of both.
  static std::unique_ptr<Client> NewClient(const std::string& session, int streams = 4,
                                           int64_t chunk_bytes = 4 * kKiB) {
    ClientOptions options;
    options.target = server_->address();
    options.session = session;
    options.streams = streams;
    options.chunk_bytes = chunk_bytes;
    options.parallel_min_bytes = 0;
    return *Client::Create(std::move(options));
  }

  // A raw Upload stream as `session`, for streams the client would never send.
  struct RawUpload {
    RawUpload(const std::string& address, const std::string& session)
        : stub(v1::Compute::NewStub(
              grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
      ctx.AddMetadata(kSessionMetadataKey, session);
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      writer = stub->Upload(&ctx, &response);
    }
    // Sends one message; false once the stream is broken.
    bool Send(const std::optional<v1::UploadHeader>& header, int64_t offset, int64_t size) {
      v1::UploadRequest message;
      if (header) *message.mutable_header() = *header;
      message.set_offset(offset);
      message.set_data(std::string(size, 'x'));
      return writer->Write(message);
    }
    grpc::Status Finish() {
      writer->WritesDone();
      return writer->Finish();
    }
    std::unique_ptr<v1::Compute::Stub> stub;
    grpc::ClientContext ctx;
    v1::UploadResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer;
  };

  static v1::UploadHeader Header(v1::DType dtype, const std::vector<int64_t>& shape) {
    v1::UploadHeader header;
    header.set_dtype(dtype);
    for (int64_t d : shape) header.add_shape(d);
    return header;
  }

  // Waits up to 10 s for `session` to hold nothing: no tensor listed and no
  // bytes counted (the server may learn of a cancelled stream late).
  static ::testing::AssertionResult HoldsNothing(const Client& client) {
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (true) {
      auto list = client.ListTensors();
      if (!list.ok()) return ::testing::AssertionFailure() << list.status().ToString();
      if (list->tensors_size() == 0 && list->used_bytes() == 0) {
        return ::testing::AssertionSuccess();
      }
      if (absl::Now() > deadline) {
        return ::testing::AssertionFailure()
               << list->tensors_size() << " tensor(s), " << list->used_bytes()
               << " bytes still held: " << list->DebugString();
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  static inline ServerProcess* server_ = nullptr;
  static inline absl::Status* start_error_ = new absl::Status();
};

TEST_F(ResidentTest, RoundTripIsBitExact) {
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {3, 0, 5}, {1}, {7}, {1023}, {2048}, {33, 127}, {4097, 3}, {2, 3, 4, 5}, {100003}};
  for (int streams : {1, 4}) {
    auto client = NewClient(Session(absl::StrCat(streams)), streams);
    for (v1::DType dtype : kAllDTypes) {
      for (const std::vector<int64_t>& shape : shapes) {
        SCOPED_TRACE(
            absl::StrCat(DTypeName(dtype), ShapeString(shape), ", ", streams, " stream(s)"));
        v1::Tensor tensor = RandomBits(dtype, shape);
        auto info = client->Upload(tensor);
        ASSERT_TRUE(info.ok()) << info.status();
        EXPECT_FALSE(info->handle().empty());
        EXPECT_EQ(info->dtype(), dtype);
        EXPECT_EQ(std::vector<int64_t>(info->shape().begin(), info->shape().end()), shape);
        EXPECT_EQ(info->bytes(), PayloadBytes(tensor));

        std::string back(tensor.data().size(), '\0');
        ASSERT_TRUE(client->Download(info->handle(), back.data(), back.size()).ok());
        EXPECT_EQ(FirstDifference(back, tensor.data()), -1);
        auto inline_tensor = client->DownloadTensor(info->handle());
        ASSERT_TRUE(inline_tensor.ok()) << inline_tensor.status();
        EXPECT_EQ(inline_tensor->dtype(), dtype);
        EXPECT_EQ(ShapeOf(*inline_tensor), shape);
        EXPECT_EQ(FirstDifference(inline_tensor->data(), tensor.data()), -1);

        auto freed = client->Free({info->handle()});
        ASSERT_TRUE(freed.ok()) << freed.status();
        EXPECT_EQ(freed->freed_bytes(), info->bytes());
      }
    }
    EXPECT_TRUE(HoldsNothing(*client));
  }
}

TEST_F(ResidentTest, ChunkAndPartSizesThatDivideNothing) {
  // 5 MiB + 6 bytes of float16 in chunks of 1 MiB + 3 bytes (odd, so that
  // chunks split elements), over 1, 3 and 4 streams, downloaded in chunks of
  // the client's size and of 4093 bytes.
  auto client = NewClient(Session(), 4, kMiB + 3);
  v1::Tensor tensor = RandomBits(v1::FLOAT16, {(5 * kMiB + 6) / 2});
  for (int streams : {1, 3, 4}) {
    SCOPED_TRACE(absl::StrCat(streams, " stream(s)"));
    auto info = client->Upload(tensor, {.streams = streams});
    ASSERT_TRUE(info.ok()) << info.status();
    std::string back(tensor.data().size(), '\0');
    ASSERT_TRUE(
        client->Download(info->handle(), back.data(), back.size(), {.streams = streams}).ok());
    EXPECT_EQ(FirstDifference(back, tensor.data()), -1);
    std::string tiny(tensor.data().size(), '\0');
    absl::Status status = client->Download(info->handle(), tiny.data(), tiny.size(),
                                           {.streams = streams, .chunk_bytes = 4093},
                                           {.timeout = absl::Seconds(120)});
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(FirstDifference(tiny, tensor.data()), -1);
    ASSERT_TRUE(client->Free({info->handle()}).ok());
  }
  EXPECT_TRUE(HoldsNothing(*client));
}

TEST_F(ResidentTest, PartialDownloadRanges) {
  auto client = NewClient(Session());
  v1::Tensor tensor = RandomBits(v1::FLOAT32, {10000});
  auto info = client->Upload(tensor);
  ASSERT_TRUE(info.ok()) << info.status();
  auto stub = v1::Compute::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  for (auto [offset, length] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 1}, {1, 4095}, {12345, 0}, {39999, 1}, {4096, 20000}}) {
    SCOPED_TRACE(absl::StrCat("offset ", offset, " length ", length));
    grpc::ClientContext ctx;
    ctx.AddMetadata(kSessionMetadataKey, Session());
    v1::DownloadRequest request;
    request.set_handle(info->handle());
    request.set_offset(offset);
    request.set_length(length);
    request.set_chunk_bytes(1000);
    auto reader = stub->Download(&ctx, request);
    v1::DownloadResponse message;
    std::string got;
    bool first = true;
    while (reader->Read(&message)) {
      EXPECT_EQ(message.has_tensor(), first);
      if (first) {
        EXPECT_EQ(message.tensor().handle(), info->handle());
      }
      EXPECT_EQ(message.offset(), offset + static_cast<int64_t>(got.size()));
      EXPECT_LE(message.data().size(), 1000u);
      got += message.data();
      first = false;
    }
    grpc::Status status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
    const int64_t want = length == 0 ? 40000 - offset : length;
    EXPECT_EQ(FirstDifference(got, tensor.data().substr(offset, want)), -1);
  }
  ASSERT_TRUE(client->Free({info->handle()}).ok());
}

TEST_F(ResidentTest, ParallelPartsMeetUnderOneId) {
  // Three streams of one upload, begun and finished out of order: none is
  // answered before the last part is in; then all get the same tensor.
  auto client = NewClient(Session());
  v1::Tensor tensor = RandomBits(v1::FLOAT32, {5000});  // 20000 bytes
  const std::vector<ByteRange> parts = {{0, 4096}, {4096, 12288}, {12288, 20000}};
  v1::UploadHeader header = Header(v1::FLOAT32, {5000});
  header.set_upload_id("parts-meet");
  header.set_parts(3);
  auto send_part = [&](int i, v1::UploadResponse& response) -> grpc::Status {
    RawUpload stream(server_->address(), Session());
    v1::UploadHeader h = header;
    h.set_part_begin(parts[i].begin);
    h.set_part_end(parts[i].end);
    v1::UploadRequest message;
    *message.mutable_header() = h;
    for (int64_t offset = parts[i].begin; offset < parts[i].end; offset += 3000) {
      message.set_offset(offset);
      message.set_data(
          tensor.data().substr(offset, std::min<int64_t>(3000, parts[i].end - offset)));
      if (!stream.writer->Write(message)) break;
      message.clear_header();
    }
    grpc::Status status = stream.Finish();
    response = stream.response;
    return status;
  };
  v1::UploadResponse responses[3];
  grpc::Status statuses[3];
  std::atomic<int> answered{0};
  std::thread last_part([&] {
    statuses[2] = send_part(2, responses[2]);
    ++answered;
  });
  std::thread first_part([&] {
    statuses[0] = send_part(0, responses[0]);
    ++answered;
  });
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(answered.load(), 0) << "a part was answered before the tensor was whole";
  auto list = client->ListTensors();  // no ASSERT before the threads are joined
  EXPECT_TRUE(list.ok() && list->tensors_size() == 0)
      << "an incomplete upload is listed, or: " << list.status();
  statuses[1] = send_part(1, responses[1]);
  last_part.join();
  first_part.join();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].error_message();
    EXPECT_EQ(responses[i].tensor().handle(), responses[0].tensor().handle()) << i;
  }
  EXPECT_EQ(responses[0].tensor().bytes(), 20000);
  auto back = client->DownloadTensor(responses[0].tensor().handle());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(FirstDifference(back->data(), tensor.data()), -1);
  ASSERT_TRUE(client->Free({responses[0].tensor().handle()}).ok());
  EXPECT_TRUE(HoldsNothing(*client));
}

// Operations on handles.

// Uploads `t` and returns an operand naming it; with `keep_meta` the operand
// also carries the dtype and shape (the server checks them), otherwise only
// the handle.
v1::Tensor Resident(const Client& client, const v1::Tensor& t, std::vector<std::string>& made,
                    bool keep_meta) {
  auto info = client.Upload(t);
  EXPECT_TRUE(info.ok()) << info.status();
  if (!info.ok()) return t;
  made.push_back(info->handle());
  v1::Tensor operand = HandleTensor(info->handle());
  if (keep_meta) {
    operand.set_dtype(t.dtype());
    *operand.mutable_shape() = t.shape();
  }
  return operand;
}

// A kept result: a handle, a dtype and a shape, no bytes. Downloads it in
// place and remembers its handle.
::testing::AssertionResult FetchKept(const Client& client, v1::Tensor& result,
                                     std::vector<std::string>& made) {
  if (result.handle().empty()) return ::testing::AssertionFailure() << "no handle";
  if (!result.data().empty()) return ::testing::AssertionFailure() << "kept result has bytes";
  if (result.dtype() == v1::DTYPE_UNSPECIFIED) {
    return ::testing::AssertionFailure() << "kept result has no dtype";
  }
  made.push_back(result.handle());
  auto tensor = client.DownloadTensor(result.handle());
  if (!tensor.ok()) return ::testing::AssertionFailure() << tensor.status().ToString();
  if (tensor->dtype() != result.dtype() || ShapeOf(*tensor) != ShapeOf(result)) {
    return ::testing::AssertionFailure()
           << "the response says " << DTypeName(result.dtype()) << ShapeString(ShapeOf(result))
           << ", the download " << DTypeName(tensor->dtype()) << ShapeString(ShapeOf(*tensor));
  }
  result = *std::move(tensor);
  return ::testing::AssertionSuccess();
}

class ResidentOpsTest : public ResidentTest, public ::testing::WithParamInterface<v1::DType> {};

TEST_P(ResidentOpsTest, EveryOperationOnHandlesKeepsItsResult) {
  const v1::DType dtype = GetParam();
  auto client = NewClient(Session());
  std::vector<std::string> made;
  bool meta = false;  // alternate: operands with and without dtype and shape
  auto resident = [&](const v1::Tensor& t) {
    meta = !meta;
    return Resident(*client, t, made, meta);
  };

  for (const GemmCase& c :
       {GemmCase{.m = 33, .n = 7, .k = 127, .trans_b = true}, GemmCase{.batch = 3,
                                                              .m = 7,
                                                              .n = 33,
                                                              .k = 5,
                                                              .trans_a = true,
                                                              .b_batched = true,
                                                              .alpha = 0.5,
                                                              .beta = -1.5,
                                                              .c_batched = true}}) {
    v1::GemmRequest request = MakeGemm(dtype, c);
    v1::GemmRequest on_handles = request;
    *on_handles.mutable_a() = resident(request.a());
    *on_handles.mutable_b() = resident(request.b());
    if (request.has_c()) *on_handles.mutable_c() = resident(request.c());
    on_handles.mutable_options()->set_keep_output(true);
    auto response = client->Gemm(on_handles);
    ASSERT_TRUE(response.ok()) << response.status();
    v1::GemmResponse fetched = *response;
    ASSERT_TRUE(FetchKept(*client, *fetched.mutable_c(), made));
    EXPECT_TRUE(Passes(CheckGemm(request, fetched)));
  }
  {
    v1::GemvRequest request = MakeGemv(dtype, {.m = 127, .k = 33, .ncols = 3, .beta = 1});
    v1::GemvRequest on_handles = request;
    *on_handles.mutable_a() = resident(request.a());
    *on_handles.mutable_x() = resident(request.x());
    *on_handles.mutable_y() = resident(request.y());
    on_handles.mutable_options()->set_keep_output(true);
    auto response = client->Gemv(on_handles);
    ASSERT_TRUE(response.ok()) << response.status();
    v1::GemvResponse fetched = *response;
    ASSERT_TRUE(FetchKept(*client, *fetched.mutable_y(), made));
    EXPECT_TRUE(Passes(CheckGemv(request, fetched)));
  }
  for (std::optional<int> axis : {std::optional<int>(), std::optional<int>(-1)}) {
    v1::ReduceRequest request = MakeReduce(dtype, {33, 127}, v1::MEAN, axis);
    v1::ReduceRequest on_handles = request;
    *on_handles.mutable_input() = resident(request.input());
    on_handles.mutable_options()->set_keep_output(true);
    auto response = client->Reduce(on_handles);
    ASSERT_TRUE(response.ok()) << response.status();
    v1::ReduceResponse fetched = *response;
    ASSERT_TRUE(FetchKept(*client, *fetched.mutable_output(), made));
    EXPECT_TRUE(Passes(CheckReduce(request, fetched)));
  }
  {
    v1::TransposeRequest request = MakeTranspose(dtype, {7, 33, 5}, {2, 0, 1});
    v1::TransposeRequest on_handles = request;
    *on_handles.mutable_input() = resident(request.input());
    on_handles.mutable_options()->set_keep_output(true);
    auto response = client->Transpose(on_handles);
    ASSERT_TRUE(response.ok()) << response.status();
    v1::TransposeResponse fetched = *response;
    ASSERT_TRUE(FetchKept(*client, *fetched.mutable_output(), made));
    EXPECT_TRUE(Passes(CheckTranspose(request, fetched)));
  }
  {
    v1::AttentionRequest request = MakeAttention(dtype, {.batch = 2,
                                                         .heads_q = 4,
                                                         .heads_kv = 2,
                                                         .seq_q = 7,
                                                         .seq_kv = 33,
                                                         .causal = true,
                                                         .lse = true});
    v1::AttentionRequest on_handles = request;
    *on_handles.mutable_q() = resident(request.q());
    *on_handles.mutable_k() = resident(request.k());
    *on_handles.mutable_v() = resident(request.v());
    on_handles.mutable_options()->set_keep_output(true);
    auto response = client->Attention(on_handles);
    ASSERT_TRUE(response.ok()) << response.status();
    v1::AttentionResponse fetched = *response;
    ASSERT_TRUE(FetchKept(*client, *fetched.mutable_o(), made));
    ASSERT_TRUE(FetchKept(*client, *fetched.mutable_lse(), made));
    EXPECT_TRUE(Passes(CheckAttention(request, fetched)));
  }
  {
    // Handles and inline operands in one request; the result inline.
    v1::GemmRequest request = MakeGemm(dtype, {.m = 7, .n = 33, .k = 33});
    v1::GemmRequest mixed = request;
    *mixed.mutable_b() = resident(request.b());
    auto response = client->Gemm(mixed);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(response->c().handle().empty());
    EXPECT_TRUE(Passes(CheckGemm(request, *response)));
  }
  auto list = client->ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->tensors_size(), static_cast<int>(made.size()));
  ASSERT_TRUE(client->Free(made).ok());
  EXPECT_TRUE(HoldsNothing(*client));
}

TEST_P(ResidentOpsTest, ChainWithoutDownloadsBetweenSteps) {
  // attention -> reduce -> gemm -> reduce, every step on the previous step's
  // kept result. The reduce over the size-1 batch axis turns O [1, H, S, D]
  // into the [H, S, D] that a batched GEMM takes. Nothing is downloaded until
  // the chain is done; then every step is checked against the float64
  // reference of its own (downloaded) inputs.
  const v1::DType dtype = GetParam();
  auto client = NewClient(Session());
  std::vector<std::string> made;
  v1::AttentionRequest attention = MakeAttention(
      dtype, {.batch = 1, .heads_q = 4, .heads_kv = 2, .seq_q = 33, .seq_kv = 65, .head_dim = 64});
  v1::AttentionRequest attention_sent = attention;
  *attention_sent.mutable_q() = Resident(*client, attention.q(), made, false);
  *attention_sent.mutable_k() = Resident(*client, attention.k(), made, false);
  *attention_sent.mutable_v() = Resident(*client, attention.v(), made, false);
  attention_sent.mutable_options()->set_keep_output(true);
  auto o = client->Attention(attention_sent);
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_FALSE(o->o().handle().empty());
  EXPECT_TRUE(o->o().data().empty());

  v1::ReduceRequest squeeze;
  *squeeze.mutable_input() = HandleTensor(o->o().handle());
  squeeze.set_op(v1::SUM);
  squeeze.set_has_axis(true);
  squeeze.set_axis(0);
  squeeze.mutable_options()->set_keep_output(true);
  auto squeezed = client->Reduce(squeeze);
  ASSERT_TRUE(squeezed.ok()) << squeezed.status();
  EXPECT_EQ(ShapeOf(squeezed->output()), (std::vector<int64_t>{4, 33, 64}));
  EXPECT_TRUE(squeezed->output().data().empty());

  v1::Tensor w = RandomTensor(dtype, {64, 9}, Rng());
  v1::GemmRequest gemm;
  *gemm.mutable_a() = HandleTensor(squeezed->output().handle());
  *gemm.mutable_b() = Resident(*client, w, made, true);
  gemm.mutable_options()->set_keep_output(true);
  auto product = client->Gemm(gemm);
  ASSERT_TRUE(product.ok()) << product.status();
  EXPECT_EQ(ShapeOf(product->c()), (std::vector<int64_t>{4, 33, 9}));
  EXPECT_TRUE(product->c().data().empty());

  v1::ReduceRequest total;
  *total.mutable_input() = HandleTensor(product->c().handle());
  total.set_op(v1::SUM);
  total.mutable_options()->set_keep_output(true);
  auto sum = client->Reduce(total);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_TRUE(ShapeOf(sum->output()).empty());

  // Now the checks, step by step.
  v1::AttentionResponse o_fetched = *o;
  ASSERT_TRUE(FetchKept(*client, *o_fetched.mutable_o(), made));
  EXPECT_TRUE(Passes(CheckAttention(attention, o_fetched)));

  v1::ReduceRequest squeeze_inline = squeeze;
  *squeeze_inline.mutable_input() = o_fetched.o();
  v1::ReduceResponse squeezed_fetched = *squeezed;
  ASSERT_TRUE(FetchKept(*client, *squeezed_fetched.mutable_output(), made));
  EXPECT_TRUE(Passes(CheckReduce(squeeze_inline, squeezed_fetched)));

  v1::GemmRequest gemm_inline = gemm;
  *gemm_inline.mutable_a() = squeezed_fetched.output();
  *gemm_inline.mutable_b() = w;
  v1::GemmResponse product_fetched = *product;
  ASSERT_TRUE(FetchKept(*client, *product_fetched.mutable_c(), made));
  EXPECT_TRUE(Passes(CheckGemm(gemm_inline, product_fetched)));

  v1::ReduceRequest total_inline = total;
  *total_inline.mutable_input() = product_fetched.c();
  v1::ReduceResponse sum_fetched = *sum;
  ASSERT_TRUE(FetchKept(*client, *sum_fetched.mutable_output(), made));
  EXPECT_TRUE(Passes(CheckReduce(total_inline, sum_fetched)));

  ASSERT_TRUE(client->Free(made).ok());
  EXPECT_TRUE(HoldsNothing(*client));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, ResidentOpsTest, ::testing::ValuesIn(kAllDTypes),
                         [](const ::testing::TestParamInfo<v1::DType>& info) {
                           return DTypeName(info.param);
                         });

// Malformed upload streams: INVALID_ARGUMENT, and nothing held afterwards.

TEST_F(ResidentTest, MalformedUploadStreamsAreInvalidAndLeaveNothing) {
  auto client = NewClient(Session());
  const v1::UploadHeader header = Header(v1::FLOAT32, {3072});  // 12288 bytes
  struct Case {
    std::string name;
    std::vector<std::pair<int64_t, int64_t>> chunks;  // offset, size
    v1::UploadHeader header;
    bool first_has_header = true;
  };
  v1::UploadHeader part = header;
  part.set_upload_id("malformed-part-end");
  part.set_parts(2);
  part.set_part_begin(0);
  part.set_part_end(4096);
  const std::vector<Case> cases = {
      {"out of order", {{4096, 4096}, {0, 4096}, {8192, 4096}}, header},
      {"overlapping", {{0, 8192}, {4096, 8192}}, header},
      {"a gap", {{0, 4096}, {8192, 4096}}, header},
      {"past the declared size", {{0, 8192}, {8192, 8192}}, header},
      {"ending short", {{0, 8192}}, header},
      {"no header", {{0, 12288}}, header, false},
      {"past its part's end", {{0, 8192}}, part},
      {"before its part's begin",
       {{0, 4096}},
       [&] {
         v1::UploadHeader h = part;
         h.set_upload_id("malformed-part-begin");
         h.set_part_begin(4096);
         h.set_part_end(12288);
         return h;
       }()},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RawUpload stream(server_->address(), Session());
    bool first = true;
    for (auto [offset, size] : c.chunks) {
      if (!stream.Send(first && c.first_has_header ? std::optional(c.header) : std::nullopt, offset,
                       size)) {
        break;
      }
      first = false;
    }
    grpc::Status status = stream.Finish();
    EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT) << status.error_message();
    EXPECT_TRUE(HoldsNothing(*client));
  }
}

TEST_F(ResidentTest, CancelledUploadsLeaveNothing) {
  auto client = NewClient(Session());
  {
    RawUpload stream(server_->address(), Session());
    const v1::UploadHeader header = Header(v1::FLOAT32, {16 * kMiB});  // 64 MiB
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(stream.Send(i == 0 ? std::optional(header) : std::nullopt, i * kMiB, kMiB));
    }
    stream.ctx.TryCancel();
    EXPECT_EQ(stream.writer->Finish().error_code(), grpc::CANCELLED);
  }
  EXPECT_TRUE(HoldsNothing(*client));

  // Two parts of three: one whole and waiting, one cut off.
  {
    v1::UploadHeader header = Header(v1::FLOAT16, {3 * 8192});
    header.set_upload_id("cancelled-parts");
    header.set_parts(3);
    RawUpload whole(server_->address(), Session());
    v1::UploadHeader h0 = header;
    h0.set_part_begin(0);
    h0.set_part_end(16384);
    ASSERT_TRUE(whole.Send(h0, 0, 16384));
    whole.writer->WritesDone();
    RawUpload cut(server_->address(), Session());
    v1::UploadHeader h1 = header;
    h1.set_part_begin(16384);
    h1.set_part_end(32768);
    ASSERT_TRUE(cut.Send(h1, 16384, 4096));
    absl::SleepFor(absl::Milliseconds(200));
    cut.ctx.TryCancel();
    whole.ctx.TryCancel();
    EXPECT_FALSE(cut.writer->Finish().ok());
    EXPECT_FALSE(whole.writer->Finish().ok());
  }
  EXPECT_TRUE(HoldsNothing(*client));

  // The client library cancels every stream of a parallel upload whose
  // source fails.
  auto failed =
      client->UploadFrom(v1::FLOAT32, {kMiB}, [](int64_t offset, int64_t size, char* dst) {
        if (offset >= 3 * kMiB) return absl::DataLossError("source broke");
        std::memset(dst, 0, size);
        return absl::OkStatus();
      });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDataLoss) << failed.status();
  EXPECT_TRUE(HoldsNothing(*client));
}

// Ownership and lifetime: NOT_FOUND that says why, without naming the owner.

TEST_F(ResidentTest, UnknownFreedAndForeignHandlesAreNotFound) {
  const std::string owner = Session("owner-alice");
  auto alice = NewClient(owner);
  auto bob = NewClient(Session("bob"));
  v1::Tensor t = RandomTensor(v1::FLOAT32, {33, 7}, Rng());
  auto kept = alice->Upload(t);
  ASSERT_TRUE(kept.ok()) << kept.status();
  auto freed = alice->Upload(t);
  ASSERT_TRUE(freed.ok()) << freed.status();
  ASSERT_TRUE(alice->Free({freed->handle()}).ok());

  // Every way a handle is used, by `client`, with what the message must say.
  auto expect_not_found = [&](const Client& client, const std::string& handle,
                              const std::string& says) {
    SCOPED_TRACE(absl::StrCat("handle \"", handle, "\", expecting \"", says, "\""));
    std::vector<absl::Status> statuses;
    std::string dst(PayloadBytes(t), '\0');
    statuses.push_back(client.Download(handle, dst.data(), dst.size()));
    statuses.push_back(client.DownloadTensor(handle).status());
    statuses.push_back(client.Free({handle}).status());
    v1::TransposeRequest transpose;
    *transpose.mutable_input() = HandleTensor(handle);
    statuses.push_back(client.Transpose(transpose).status());
    v1::GemmRequest gemm;
    *gemm.mutable_a() = t;
    *gemm.mutable_b() = HandleTensor(handle);
    gemm.mutable_b()->set_dtype(v1::FLOAT32);
    gemm.mutable_b()->add_shape(7);
    gemm.mutable_b()->add_shape(33);
    statuses.push_back(client.Gemm(gemm).status());
    for (const absl::Status& status : statuses) {
      EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
      EXPECT_TRUE(absl::StrContains(Lower(status.message()), says)) << status;
      EXPECT_FALSE(absl::StrContains(status.message(), owner)) << "names the owner: " << status;
      EXPECT_FALSE(absl::StrContains(status.message(), "owner-alice")) << status;
    }
  };
  expect_not_found(*alice, "no-such-handle", "unknown");
  expect_not_found(*alice, freed->handle(), "freed");
  expect_not_found(*bob, kept->handle(), "another client");

  // Bob sees none of Alice's tensors, and his failed calls left hers alone.
  auto bob_list = bob->ListTensors();
  ASSERT_TRUE(bob_list.ok()) << bob_list.status();
  EXPECT_EQ(bob_list->tensors_size(), 0);
  EXPECT_EQ(bob_list->used_bytes(), 0);
  auto alice_list = alice->ListTensors();
  ASSERT_TRUE(alice_list.ok()) << alice_list.status();
  ASSERT_EQ(alice_list->tensors_size(), 1);
  EXPECT_EQ(alice_list->tensors(0).handle(), kept->handle());
  EXPECT_EQ(alice_list->used_bytes(), PayloadBytes(t));
  ASSERT_TRUE(alice->Free({kept->handle()}).ok());
  EXPECT_TRUE(HoldsNothing(*alice));
}

TEST_F(ResidentTest, FreeIsAllOrNoneAndOnce) {
  auto client = NewClient(Session());
  auto a = client->Upload(RandomTensor(v1::FLOAT16, {100}, Rng()));
  auto b = client->Upload(RandomTensor(v1::FLOAT16, {300}, Rng()));
  ASSERT_TRUE(a.ok() && b.ok());

  auto partly_unknown = client->Free({a->handle(), "no-such-handle", b->handle()});
  EXPECT_EQ(partly_unknown.status().code(), absl::StatusCode::kNotFound) << partly_unknown.status();
  EXPECT_TRUE(absl::StrContains(partly_unknown.status().message(), "no-such-handle"))
      << partly_unknown.status();
  auto list = client->ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->tensors_size(), 2) << "a failed Free freed something";
  EXPECT_EQ(list->used_bytes(), 800);

  auto both = client->Free({a->handle(), b->handle()});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->freed_bytes(), 800);
  auto again = client->Free({a->handle()});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << again.status();
  EXPECT_TRUE(HoldsNothing(*client));
}

// A result kept for a caller whose deadline passed while the operation ran
// is dropped, not published: the caller never learns its handle.
TEST_F(ResidentTest, AResultKeptForACallerThatLeftIsDropped) {
  auto client = NewClient(Session("left"));
  // The slowest GEMM variant, sized by timed probes to at least a quarter
  // second of work on this server's devices (whatever their number and
  // speed; the default's fp32 8192^3 takes an H200 some 20 ms); the caller
  // leaves after 50 ms.
  auto info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  std::string slowest;
  for (const v1::OperationVariants& op : info->operations()) {
    if (op.operation() == "gemm" && op.variants_size() > 0) slowest = *op.variants().rbegin();
  }
  ASSERT_FALSE(slowest.empty()) << "no GEMM variants in " << info->DebugString();
  // Small products use a GPU poorly (a naive 512^3 took an H200 3 ms, its
  // 3520^3 under 50 ms), so the probe grows until it takes a quarter second
  // or reaches 8192^3.
  int64_t size = 512;
  double probe_seconds = 0;
  for (int round = 0; round < 6; ++round) {
    v1::GemmRequest probe = MakeGemm(v1::FLOAT32, {.m = size, .n = size, .k = size});
    probe.mutable_options()->set_variant(slowest);
    absl::StatusOr<v1::GemmResponse> timed = client->Gemm(probe);
    ASSERT_TRUE(timed.ok()) << timed.status();
    probe_seconds = std::max(timed->timings().kernel_seconds(), 1e-4);
    if (probe_seconds >= 0.25 || size == 8192) break;
    size = std::clamp<int64_t>(int64_t(double(size) * std::cbrt(1.0 / probe_seconds)) / 64 * 64,
                               size + 64, 8192);
  }
  v1::GemmRequest gemm = MakeGemm(v1::FLOAT32, {.m = size, .n = size, .k = size});
  gemm.mutable_options()->set_variant(slowest);
  auto a = client->Upload(gemm.a());
  auto b = client->Upload(gemm.b());
  ASSERT_TRUE(a.ok() && b.ok());
  v1::GemmRequest on_handles = gemm;
  *on_handles.mutable_a() = HandleTensor(a->handle());
  *on_handles.mutable_b() = HandleTensor(b->handle());
  on_handles.mutable_options()->set_keep_output(true);
  auto left = client->Gemm(on_handles, {.timeout = absl::Milliseconds(50)});
  EXPECT_EQ(left.status().code(), absl::StatusCode::kDeadlineExceeded)
      << left.status() << " (GEMM " << size << "^3 fp32, " << slowest << "; its probe took "
      << probe_seconds << " s)";
  // Once the server holds no request (its work stopped or finished and was
  // dropped), the session holds only the operands.
  const absl::Time until = absl::Now() + absl::Seconds(30);
  double inflight = -1;
  while (absl::Now() < until) {
    absl::StatusOr<std::string> text = HttpGet(server_->metrics_port(), "/metrics");
    ASSERT_TRUE(text.ok()) << text.status();
    inflight = MetricSum(*text, "gpucompute_inflight_requests");
    if (inflight == 0) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(inflight, 0) << "the abandoned GEMM was still held 30 s later";
  auto list = client->ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->tensors_size(), 2)
      << "a result nobody can name was kept: " << list->DebugString();
  ASSERT_TRUE(client->Free({a->handle(), b->handle()}).ok());
  EXPECT_TRUE(HoldsNothing(*client));
}

TEST_F(ResidentTest, HandleOperandsMustMatchTheirTensor) {
  auto client = NewClient(Session());
  v1::Tensor t = RandomTensor(v1::FLOAT32, {33, 7}, Rng());
  auto info = client->Upload(t);
  ASSERT_TRUE(info.ok()) << info.status();
  v1::TransposeRequest wrong_shape;
  *wrong_shape.mutable_input() = HandleTensor(info->handle());
  wrong_shape.mutable_input()->set_dtype(v1::FLOAT32);
  wrong_shape.mutable_input()->add_shape(7);
  wrong_shape.mutable_input()->add_shape(33);
  EXPECT_EQ(client->Transpose(wrong_shape).status().code(), absl::StatusCode::kInvalidArgument);
  v1::TransposeRequest wrong_dtype;
  *wrong_dtype.mutable_input() = HandleTensor(info->handle());
  wrong_dtype.mutable_input()->set_dtype(v1::FLOAT16);
  wrong_dtype.mutable_input()->add_shape(33);
  wrong_dtype.mutable_input()->add_shape(7);
  EXPECT_EQ(client->Transpose(wrong_dtype).status().code(), absl::StatusCode::kInvalidArgument);
  v1::TransposeRequest both;
  *both.mutable_input() = t;
  both.mutable_input()->set_handle(info->handle());
  EXPECT_EQ(client->Transpose(both).status().code(), absl::StatusCode::kInvalidArgument)
      << "a handle with bytes";
  ASSERT_TRUE(client->Free({info->handle()}).ok());
  EXPECT_TRUE(HoldsNothing(*client));
}

// The CLI's resident commands.

TEST_F(ResidentTest, CliUploadDownloadListFree) {
  TempDir dir;
  const std::string session = Session();
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {CliPath()};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--server=" + server_->address());
    argv.push_back("--session=" + session);
    return RunCommand(argv, absl::Seconds(120));
  };
  // A bfloat16 file ('<u2' bits) goes up and comes back byte for byte.
  v1::Tensor t = RandomTensor(v1::BFLOAT16, {33, 7}, Rng());
  ASSERT_TRUE(WriteNpy(dir.File("x.npy"), {"<u2", ShapeOf(t), t.data()}).ok());
  CommandResult up = cli({"upload", "--in=" + dir.File("x.npy"), "--dtype=bfloat16"});
  ASSERT_EQ(up.exit_code, 0) << up.output;
  const std::string handle = up.output.substr(0, up.output.find(' '));
  ASSERT_FALSE(handle.empty()) << up.output;
  EXPECT_TRUE(absl::StrContains(up.output, "bfloat16[33,7]")) << up.output;
  EXPECT_TRUE(absl::StrContains(up.output, "upload ")) << up.output;

  CommandResult list = cli({"list"});
  ASSERT_EQ(list.exit_code, 0) << list.output;
  EXPECT_TRUE(absl::StartsWith(list.output, handle)) << list.output;
  EXPECT_TRUE(absl::StrContains(list.output, "1 tensor(s)")) << list.output;

  CommandResult down = cli({"download", "--handle=" + handle, "--out=" + dir.File("y.npy")});
  ASSERT_EQ(down.exit_code, 0) << down.output;
  auto y = ReadNpy(dir.File("y.npy"));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->descr, "<u2");
  EXPECT_EQ(y->shape, ShapeOf(t));
  EXPECT_EQ(FirstDifference(y->data, t.data()), -1);

  // Another session cannot see it.
  CommandResult foreign = RunCommand({CliPath(), "download", "--handle=" + handle,
                                      "--server=" + server_->address(), "--session=someone-else"});
  EXPECT_EQ(foreign.exit_code, 1) << foreign.output;
  EXPECT_TRUE(absl::StrContains(foreign.output, "NOT_FOUND")) << foreign.output;

  CommandResult random = cli({"upload", "--shape=1000,3", "--dtype=float16"});
  ASSERT_EQ(random.exit_code, 0) << random.output;
  const std::string second = random.output.substr(0, random.output.find(' '));
  CommandResult freed = cli({"free", "--handle=" + handle + "," + second});
  ASSERT_EQ(freed.exit_code, 0) << freed.output;
  EXPECT_TRUE(absl::StrContains(freed.output, absl::StrCat(PayloadBytes(t) + 6000, " bytes")))
      << freed.output;
  CommandResult twice = cli({"free", "--handle=" + handle});
  EXPECT_EQ(twice.exit_code, 1) << twice.output;
  EXPECT_TRUE(HoldsNothing(*NewClient(session)));

  EXPECT_EQ(cli({"upload"}).exit_code, 2);
  EXPECT_EQ(cli({"download"}).exit_code, 2);
  EXPECT_EQ(cli({"free"}).exit_code, 2);
}

TEST_F(ResidentTest, CliResidentOperationsCheckAndFreeEverything) {
  const std::string session = Session();
  const std::vector<std::vector<std::string>> ops = {
      {"gemm", "--m=33", "--n=7", "--k=127", "--beta=0.5"},
      {"gemv", "--m=127", "--k=33", "--n=3"},
      {"reduce", "--shape=33,127", "--op=max", "--axis=0"},
      {"transpose", "--shape=7,33,5", "--perm=2,0,1"},
      {"attention", "--heads_q=4", "--heads_kv=2", "--seq_q=7", "--seq_kv=33", "--lse"},
  };
  TempDir dir;
  for (std::vector<std::string> args : ops) {
    args.insert(args.begin(), CliPath());
    for (std::string a : {"--resident", "--check", "--repeat=3", "--dtype=bfloat16"}) {
      args.push_back(a);
    }
    args.push_back("--out=" + dir.File("out.npy"));
    args.push_back("--server=" + server_->address());
    args.push_back("--session=" + session);
    SCOPED_TRACE(absl::StrJoin(args, " "));
    CommandResult r = RunCommand(args, absl::Seconds(120));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "check: OK")) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "resident: upload ")) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, " download ")) << r.output;
    EXPECT_TRUE(ReadNpy(dir.File("out.npy")).ok());
    EXPECT_TRUE(HoldsNothing(*NewClient(session)));
  }

  CommandResult bench = RunCommand(
      {CliPath(), "bench", "gemm", "--resident", "--m=64", "--n=64", "--k=64", "--requests=20",
       "--concurrency=2", "--server=" + server_->address(), "--session=" + session},
      absl::Seconds(120));
  EXPECT_EQ(bench.exit_code, 0) << bench.output;
  EXPECT_TRUE(absl::StrContains(bench.output, "p50 ms")) << bench.output;
  EXPECT_TRUE(absl::StrContains(bench.output, "resident: operands uploaded once")) << bench.output;
  EXPECT_TRUE(HoldsNothing(*NewClient(session)));

  CommandResult batch =
      RunCommand({CliPath(), "bench", "reduce", "--resident", "--mode=batch", "--requests=20",
                  "--server=" + server_->address(), "--session=" + session},
                 absl::Seconds(120));
  EXPECT_EQ(batch.exit_code, 0) << batch.output;
  EXPECT_TRUE(HoldsNothing(*NewClient(session)));

  for (const char* op : {"upload", "download"}) {
    CommandResult transfer =
        RunCommand({CliPath(), "bench", op, "--bytes=3000000", "--requests=3", "--streams=2",
                    "--server=" + server_->address(), "--session=" + session},
                   absl::Seconds(120));
    EXPECT_EQ(transfer.exit_code, 0) << transfer.output;
    EXPECT_TRUE(absl::StrContains(transfer.output, "GB/s per transfer at p50")) << transfer.output;
    EXPECT_TRUE(HoldsNothing(*NewClient(session)));
  }
}

// A quota: a cancelled upload gives its room back.
// Large inline operands go through resident tensors (ClientOptions::
// offload_min_bytes): the caller sees the answer one message would have
// given, and the server keeps nothing afterwards.
TEST_F(ResidentTest, OffloadedOperationsAnswerAsOneMessageAndLeaveNothing) {
  ClientOptions options;
  options.target = server_->address();
  options.session = Session("offload");
  options.streams = 3;
  options.chunk_bytes = 4 * kKiB;
  options.parallel_min_bytes = 0;
  options.offload_min_bytes = 1;
  std::unique_ptr<Client> offload = *Client::Create(options);
  options.session = Session("plain");
  options.offload_min_bytes = 0;
  std::unique_ptr<Client> plain = *Client::Create(options);

  auto same = [](const v1::Tensor& got, const v1::Tensor& want, const std::string& what) {
    EXPECT_TRUE(got.handle().empty()) << what;
    EXPECT_EQ(got.dtype(), want.dtype()) << what;
    EXPECT_EQ(ShapeOf(got), ShapeOf(want)) << what;
    EXPECT_EQ(FirstDifference(got.data(), want.data()), -1) << what;
  };
  for (v1::DType dtype : kAllDTypes) {
    const std::string name = DTypeName(dtype);
    GemmCase g;
    g.m = 37, g.n = 29, g.k = 41, g.beta = 0.5;
    const v1::GemmRequest gemm = MakeGemm(dtype, g);
    auto a = offload->Gemm(gemm), b = plain->Gemm(gemm);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    same(a->c(), b->c(), "gemm " + name);
    EXPECT_GT(a->timings().shards_size(), 0);

    AttentionCase at;
    at.heads_q = 4, at.heads_kv = 2, at.seq_q = 19, at.seq_kv = 23, at.head_dim = 32, at.lse = true,
    at.causal = true;
    const v1::AttentionRequest attention = MakeAttention(dtype, at);
    auto c = offload->Attention(attention), d = plain->Attention(attention);
    ASSERT_TRUE(c.ok() && d.ok()) << c.status() << " " << d.status();
    same(c->o(), d->o(), "attention o " + name);
    same(c->lse(), d->lse(), "attention lse " + name);

    const v1::ReduceRequest reduce = MakeReduce(dtype, {7, 130}, v1::SUM, 1);
    auto e = offload->Reduce(reduce), f = plain->Reduce(reduce);
    ASSERT_TRUE(e.ok() && f.ok()) << e.status() << " " << f.status();
    same(e->output(), f->output(), "reduce " + name);

    const v1::TransposeRequest transpose = MakeTranspose(dtype, {5, 6, 7}, {2, 0, 1});
    auto h = offload->Transpose(transpose), i = plain->Transpose(transpose);
    ASSERT_TRUE(h.ok() && i.ok()) << h.status() << " " << i.status();
    same(h->output(), i->output(), "transpose " + name);

    GemvCase gv;
    gv.m = 33, gv.k = 17, gv.beta = 1;
    const v1::GemvRequest gemv = MakeGemv(dtype, gv);
    auto j = offload->Gemv(gemv), k = plain->Gemv(gemv);
    ASSERT_TRUE(j.ok() && k.ok()) << j.status() << " " << k.status();
    same(j->y(), k->y(), "gemv " + name);
  }
  EXPECT_TRUE(HoldsNothing(*offload));

  // Keeping the result keeps only the result.
  GemmCase g;
  g.m = 8, g.n = 8, g.k = 8;
  v1::GemmRequest keep = MakeGemm(v1::FLOAT32, g);
  keep.mutable_options()->set_keep_output(true);
  auto kept = offload->Gemm(keep);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_FALSE(kept->c().handle().empty());
  auto list = offload->ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->tensors_size(), 1);
  EXPECT_EQ(list->tensors(0).handle(), kept->c().handle());
  ASSERT_TRUE(offload->Free({kept->c().handle()}).ok());

  // A request the server refuses gets the same answer either way, and
  // leaves nothing behind.
  GemmCase bad;
  bad.m = 4, bad.n = 4, bad.k = 8;
  v1::GemmRequest mismatched = MakeGemm(v1::FLOAT32, bad);
  mismatched.mutable_b()->set_shape(0, 9);
  mismatched.mutable_b()->set_data(std::string(9 * 4 * 4, '\0'));
  auto refused = offload->Gemm(mismatched), refused_plain = plain->Gemm(mismatched);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_EQ(refused.status(), refused_plain.status());
  EXPECT_TRUE(HoldsNothing(*offload));
}

// Where uploads are refused (a full quota), the call goes as one message.
TEST(ResidentOffloadTest, FallsBackToOneMessageWhenUploadsAreRefused) {
  auto server = ServerProcess::Start({"--resident_quota_bytes=1024"});
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.target = (*server)->address();
  options.session = "small-quota";
  options.offload_min_bytes = 1;
  auto client = *Client::Create(options);
  const v1::TransposeRequest transpose = MakeTranspose(v1::FLOAT32, {64, 48}, {1, 0});
  auto result = client->Transpose(transpose);
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::Tensor& in = transpose.input();
  ASSERT_EQ(ShapeOf(result->output()), (std::vector<int64_t>{48, 64}));
  for (int i = 0; i < 64; ++i) {
    for (int j = 0; j < 48; ++j) {
      ASSERT_EQ(std::memcmp(result->output().data().data() + 4 * (j * 64 + i),
                            in.data().data() + 4 * (i * 48 + j), 4),
                0);
    }
  }
  auto list = client->ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->tensors_size(), 0);
}

TEST(ResidentQuotaTest, ACancelledUploadGivesItsRoomBack) {
  auto server = ServerProcess::Start({"--resident_quota_bytes=" + std::to_string(48 * kMiB)});
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.target = (*server)->address();
  options.session = "quota";
  auto client = *Client::Create(options);
  // 40 MiB fit, twice 40 MiB do not.
  grpc::ClientContext ctx;
  ctx.AddMetadata(kSessionMetadataKey, "quota");
  v1::UploadResponse response;
  auto stub = v1::Compute::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  auto writer = stub->Upload(&ctx, &response);
  v1::UploadRequest message;
  message.mutable_header()->set_dtype(v1::FLOAT32);
  message.mutable_header()->add_shape(10 * kMiB);  // 40 MiB
  message.set_data(std::string(kMiB, 'x'));
  for (int i = 0; i < 4; ++i) {
    message.set_offset(i * kMiB);
    ASSERT_TRUE(writer->Write(message));
    message.clear_header();
  }
  ctx.TryCancel();
  EXPECT_FALSE(writer->Finish().ok());

  std::string data(40 * kMiB, '\1');
  // The server may learn of the cancellation a little late.
  absl::StatusOr<v1::TensorInfo> info = client->Upload(v1::FLOAT32, {10 * kMiB}, data.data());
  for (absl::Time deadline = absl::Now() + absl::Seconds(10);
       absl::IsResourceExhausted(info.status()) && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(100));
    info = client->Upload(v1::FLOAT32, {10 * kMiB}, data.data());
  }
  ASSERT_TRUE(info.ok()) << info.status();
  auto over = client->Upload(v1::FLOAT32, {10 * kMiB}, data.data());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  auto list = client->ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->used_bytes(), 40 * kMiB);
  EXPECT_EQ(list->quota_bytes(), 48 * kMiB);
  ASSERT_TRUE(client->Free({info->handle()}).ok());
}

// Upload streams whose chunks wait for admission: a chunk's copy then runs
// on a worker while gRPC reads the next chunk or the stream's end on one of
// its threads, and the parts of one upload end on different streams at once.
// Every stream must be answered exactly once and live until both its last
// chunk's copy and gRPC are done with it: plain uploads, uploads in parts,
// and uploads in parts whose last part is cancelled while the others wait.
TEST(ResidentAdmissionTest, StreamsWhoseChunksWaitAreEachAnsweredOnce) {
  // Room for four 4 KiB chunks (and their messages' framing) in the whole
  // server: most chunks wait.
  auto server = ServerProcess::Start({"--max_inflight_bytes=17000"});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  constexpr int kThreads = 6, kRounds = 8;
  std::atomic<int> failures{0};
  absl::Mutex mu;
  std::vector<std::string> errors;
  auto fail = [&](const std::string& what) {
    ++failures;
    absl::MutexLock lock(&mu);
    if (errors.size() < 10) errors.push_back(what);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string session = absl::StrCat("admission-", t);
      ClientOptions options;
      options.target = address;
      options.session = session;
      options.streams = 1 + t % 4;  // one to four parts
      options.chunk_bytes = 4 * kKiB;
      options.parallel_min_bytes = 0;
      auto client = *Client::Create(std::move(options));
      auto stub =
          v1::Compute::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
      for (int round = 0; round < kRounds; ++round) {
        // 4 to 60 KB of random bits, most sizes not a whole number of chunks.
        const int64_t elements = 1000 + (t * 7919 + round * 104729) % 14000;
        const v1::Tensor tensor = RandomBits(v1::FLOAT32, {elements});
        auto info = client->Upload(tensor);
        if (!info.ok()) {
          fail(absl::StrCat(session, " upload ", round, ": ", info.status().ToString()));
          continue;
        }
        auto back = client->DownloadTensor(info->handle());
        if (!back.ok()) {
          fail(absl::StrCat(session, " download ", round, ": ", back.status().ToString()));
        } else if (int64_t at = FirstDifference(back->data(), tensor.data()); at != -1) {
          fail(absl::StrCat(session, " round ", round, ": byte ", at, " differs"));
        }
        if (!client->Free({info->handle()}).ok()) fail(absl::StrCat(session, " free ", round));

        // Uploads of one chunk: its copy and the stream's end come together.
        for (int i = 0; i < 4; ++i) {
          auto one = client->Upload(RandomBits(v1::FLOAT16, {1 + (round * 4 + i) % 2000}));
          if (!one.ok()) {
            fail(absl::StrCat(session, " one-chunk upload ", round, ": ", one.status().ToString()));
          } else if (!client->Free({one->handle()}).ok()) {
            fail(absl::StrCat(session, " free of one chunk ", round));
          }
        }

        // Two parts: the first whole and waiting for the second, which is
        // cancelled mid-way, and then the first as well (the second may be
        // cancelled before it joined). Both fail, and nothing is kept.
        v1::UploadHeader header;
        header.set_dtype(v1::FLOAT32);
        header.add_shape(16 * kKiB);  // 64 KiB
        header.set_upload_id(absl::StrCat("cut-", round));
        header.set_parts(2);
        auto stream = [&](grpc::ClientContext& ctx, v1::UploadResponse& response) {
          ctx.AddMetadata(kSessionMetadataKey, session);
          ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
          return stub->Upload(&ctx, &response);
        };
        grpc::ClientContext whole_ctx, cut_ctx;
        v1::UploadResponse whole_response, cut_response;
        auto whole = stream(whole_ctx, whole_response);
        auto cut = stream(cut_ctx, cut_response);
        v1::UploadRequest message;
        for (int64_t offset = 0; offset < 32 * kKiB; offset += 4 * kKiB) {
          if (offset == 0) {
            *message.mutable_header() = header;
            message.mutable_header()->set_part_begin(0);
            message.mutable_header()->set_part_end(32 * kKiB);
          }
          message.set_offset(offset);
          message.set_data(std::string(4 * kKiB, 'w'));
          if (!whole->Write(message)) break;
          message.clear_header();
        }
        whole->WritesDone();
        *message.mutable_header() = header;
        message.mutable_header()->set_part_begin(32 * kKiB);
        message.mutable_header()->set_part_end(64 * kKiB);
        message.set_offset(32 * kKiB);
        message.set_data(std::string(4 * kKiB, 'c'));
        cut->Write(message);
        absl::SleepFor(absl::Milliseconds(round % 3));
        cut_ctx.TryCancel();
        absl::SleepFor(absl::Milliseconds(round % 2));
        whole_ctx.TryCancel();
        const grpc::Status cut_status = cut->Finish();
        const grpc::Status whole_status = whole->Finish();
        if (cut_status.ok() || whole_status.ok()) {
          fail(absl::StrCat(session, " round ", round, ": a cut upload succeeded (",
                            cut_status.error_code(), ", ", whole_status.error_code(), ")"));
        }
      }
      auto list = client->ListTensors();
      if (!list.ok() || list->tensors_size() != 0) {
        fail(absl::StrCat(session, " holds tensors at the end, or: ", list.status().ToString()));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0) << absl::StrJoin(errors, "\n");
  // The server lived through it and still answers.
  ClientOptions options;
  options.target = address;
  options.session = "after";
  options.chunk_bytes = 4 * kKiB;
  auto client = *Client::Create(options);
  auto info = client->Upload(RandomBits(v1::FLOAT32, {4096}));
  ASSERT_TRUE(info.ok()) << info.status() << "\n" << (*server)->Log();
  EXPECT_TRUE(client->Free({info->handle()}).ok());
}

// 8 GiB through upload -> transpose -> download on the CPU backend. The
// client never holds the tensor: it generates the bytes chunk by chunk and
// checks the transposed download chunk by chunk.

// The input's element e: a float in [1, 2) whose mantissa is a hash of e.
inline uint32_t Element(int64_t e) {
  return 0x3f800000u |
         static_cast<uint32_t>((static_cast<uint64_t>(e) * 0x9e3779b97f4a7c15ull) >> 41);
}

int64_t MemAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (absl::StartsWith(line, "MemAvailable:")) {
      int64_t kb = 0;
      std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (words.size() >= 2 && absl::SimpleAtoi(words[1], &kb)) return kb * 1024;
    }
  }
  return 0;
}

// The server's devices: GPUCOMPUTE_TEST_LARGE_SERVER_ARGS (e.g. "--backend=cuda
// --devices=0" on a GPU machine), else one CPU device.
TEST(ResidentLargeTest, EightGiBRoundTripThroughTranspose) {
  const char* large_args = std::getenv("GPUCOMPUTE_TEST_LARGE_SERVER_ARGS");
  if (DevicesOverridden() && large_args == nullptr) {
    GTEST_SKIP() << "runs on one CPU device, or on GPUCOMPUTE_TEST_LARGE_SERVER_ARGS "
                    "(GPUCOMPUTE_TEST_SERVER_ARGS is set)";
  }
  const int64_t available = MemAvailableBytes();
  if (available < 20 * kGiB) {
    GTEST_SKIP() << "needs 20 GiB of available memory (the server holds the tensor and its "
                    "transpose); MemAvailable is "
                 << available / kMiB << " MiB";
  }
  // [R, C] with R * C > 2^31 elements (8 GiB + 7.8 MiB), both odd primes.
  constexpr int64_t kRows = 32771, kCols = 65537;
  constexpr int64_t kBytes = kRows * kCols * 4;
  // One device: with two, a shard on the second may copy the input there.
  std::vector<std::string> args = {"--max_inflight_bytes=0",
                                   "--resident_max_bytes_per_device=" + std::to_string(20 * kGiB),
                                   "--resident_quota_bytes=0"};
  if (large_args == nullptr) {
    args.push_back("--cpu_devices=1");
  } else {
    for (absl::string_view arg : absl::StrSplit(large_args, ' ', absl::SkipEmpty())) {
      args.emplace_back(arg);
    }
  }
  auto server = ServerProcess::Start(args, absl::Seconds(60));
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.target = (*server)->address();
  options.session = "large";
  options.default_timeout = absl::Minutes(15);
  // The client's keepalive (10 s, which gRPC also sets as TCP_USER_TIMEOUT)
  // stays as it is: the server creates the 8 GiB tensor (zeroed, 5-22 s on
  // the 2-core development machine) on a worker, and the gRPC thread that
  // read the first chunk goes on serving the connection. Done on that
  // thread, after a few hundred other tests the stall dropped the connection
  // 10.5 s in (UNAVAILABLE: recvmsg: Connection timed out).
  auto client = *Client::Create(options);
  auto seconds_since = [](absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); };

  absl::Time start = absl::Now();
  auto input =
      client->UploadFrom(v1::FLOAT32, {kRows, kCols}, [](int64_t offset, int64_t size, char* dst) {
        if (offset % 4 != 0 || size % 4 != 0) {
          return absl::InternalError(absl::StrCat("chunk [", offset, ", +", size, ") unaligned"));
        }
        uint32_t* out = reinterpret_cast<uint32_t*>(dst);
        const int64_t first = offset / 4;
        for (int64_t k = 0; k < size / 4; ++k) out[k] = Element(first + k);
        return absl::OkStatus();
      });
  ASSERT_TRUE(input.ok()) << input.status();
  ASSERT_EQ(input->bytes(), kBytes);
  const double upload_seconds = seconds_since(start);

  start = absl::Now();
  v1::TransposeRequest transpose;
  *transpose.mutable_input() = HandleTensor(input->handle());
  transpose.mutable_options()->set_keep_output(true);
  auto transposed = client->Transpose(transpose);
  ASSERT_TRUE(transposed.ok()) << transposed.status();
  const double transpose_seconds = seconds_since(start);
  ASSERT_EQ(ShapeOf(transposed->output()), (std::vector<int64_t>{kCols, kRows}));
  ASSERT_TRUE(client->Free({input->handle()}).ok());

  // Output element f = (i, j) of [C, R] is input element (j, i) = j * C + i.
  start = absl::Now();
  absl::Mutex mu;
  int64_t checked = 0;
  auto output = client->DownloadTo(
      transposed->output().handle(), [&](int64_t offset, const char* data, int64_t size) {
        // Pieces come as they arrived, not cut at elements: the bytes of a
        // split element are checked one by one.
        auto expected = [](int64_t element) {
          const int64_t i = element / kRows, j = element % kRows;
          return Element(j * kCols + i);
        };
        int64_t pos = offset;
        const char* p = data;
        const char* const end = data + size;
        auto check_byte = [&]() -> absl::Status {
          const auto want = static_cast<uint8_t>(expected(pos / 4) >> (8 * (pos % 4)));
          if (static_cast<uint8_t>(*p) != want) {
            return absl::DataLossError(absl::StrCat("output byte ", pos, " is ", int(uint8_t(*p)),
                                                    ", expected ", int(want)));
          }
          ++pos;
          ++p;
          return absl::OkStatus();
        };
        while (p < end && pos % 4 != 0) {
          if (absl::Status s = check_byte(); !s.ok()) return s;
        }
        int64_t element = pos / 4;
        int64_t i = element / kRows, j = element % kRows;
        for (; end - p >= 4; p += 4, pos += 4) {
          uint32_t got;
          std::memcpy(&got, p, 4);
          const uint32_t want = Element(j * kCols + i);
          if (got != want) {
            return absl::DataLossError(
                absl::StrCat("output element (", i, ", ", j, ") is ", got, ", expected ", want));
          }
          if (++j == kRows) {
            j = 0;
            ++i;
          }
        }
        while (p < end) {
          if (absl::Status s = check_byte(); !s.ok()) return s;
        }
        absl::MutexLock lock(&mu);
        checked += size;
        return absl::OkStatus();
      });
  ASSERT_TRUE(output.ok()) << output.status();
  const double download_seconds = seconds_since(start);
  EXPECT_EQ(checked, kBytes);
  EXPECT_EQ(output->bytes(), kBytes);
  ASSERT_TRUE(client->Free({transposed->output().handle()}).ok());
  EXPECT_EQ(client->ListTensors()->tensors_size(), 0);
  std::printf(
      "8 GiB: upload %.1f s (%.2f GB/s), transpose %.1f s, download + check %.1f s "
      "(%.2f GB/s)\n",
      upload_seconds, kBytes / upload_seconds / 1e9, transpose_seconds, download_seconds,
      kBytes / download_seconds / 1e9);
}

}  // namespace
}  // namespace gpucompute::testing
