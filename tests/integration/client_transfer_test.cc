// The client's resident-tensor calls against an in-process stand-in server:
// how uploads and downloads are cut into parts and streams, on which
// connections, with which session, and what the client makes of a server
// that breaks the protocol. (resident_test.cc runs them against the real
// server.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"

namespace gpucompute::testing {
namespace {

std::string SessionOf(const grpc::ServerContext& ctx) {
  auto it = ctx.client_metadata().find(kSessionMetadataKey);
  if (it == ctx.client_metadata().end()) return "<none>";
  return std::string(it->second.data(), it->second.size());
}

// Resident tensors in a map, one owner per session; every call records its
// session. Parts of one upload meet under their upload_id and are answered
// together.
class ResidentStandIn final : public v1::Compute::Service {
 public:
  // One upload or download stream as the stand-in saw it.
  struct Stream {
    std::string session{};
    std::string peer{};  // the client's address and port: one per connection
    v1::UploadHeader header{};
    v1::DownloadRequest download{};
    std::vector<int64_t> chunk_sizes{};
  };

  // Download answers in chunks of this size whatever the request asks (0:
  // as asked), and skips `download_gap` bytes after the first chunk.
  int64_t download_chunk_bytes = 0;
  int64_t download_gap = 0;

  std::vector<Stream> uploads() {
    absl::MutexLock lock(&mu_);
    return uploads_;
  }
  std::vector<Stream> downloads() {
    absl::MutexLock lock(&mu_);
    return downloads_;
  }
  std::vector<std::string> sessions() {
    absl::MutexLock lock(&mu_);
    return sessions_;
  }
  void ClearRecords() {
    absl::MutexLock lock(&mu_);
    uploads_.clear();
    downloads_.clear();
    sessions_.clear();
  }

  grpc::Status Upload(grpc::ServerContext* ctx, grpc::ServerReader<v1::UploadRequest>* reader,
                      v1::UploadResponse* response) override {
    Stream seen{SessionOf(*ctx), ctx->peer()};
    v1::UploadRequest message;
    if (!reader->Read(&message) || !message.has_header()) {
      return grpc::Status(grpc::INVALID_ARGUMENT, "no header");
    }
    seen.header = message.header();
    const v1::UploadHeader& h = seen.header;
    auto bytes = TensorBytes(h.dtype(), std::vector<int64_t>(h.shape().begin(), h.shape().end()));
    if (!bytes.ok()) return grpc::Status(grpc::INVALID_ARGUMENT, "bad header");
    const bool parts = h.parts() > 1;
    const int64_t begin = parts ? h.part_begin() : 0;
    const int64_t end = parts ? h.part_end() : *bytes;
    const std::string key = parts ? seen.session + "/" + h.upload_id() : "";
    std::string single;
    std::string* data = &single;
    if (parts) {
      absl::MutexLock lock(&mu_);
      Pending& p = pending_[key];
      if (p.data.empty()) p.data.resize(*bytes);
      data = &p.data;
    } else {
      single.resize(*bytes);
    }
    int64_t next = begin;
    do {
      if (message.offset() != next || next + static_cast<int64_t>(message.data().size()) > end) {
        return grpc::Status(grpc::INVALID_ARGUMENT, "chunk out of place");
      }
      std::memcpy(data->data() + next, message.data().data(), message.data().size());
      next += message.data().size();
      seen.chunk_sizes.push_back(message.data().size());
    } while (reader->Read(&message));
    if (next != end) return grpc::Status(grpc::INVALID_ARGUMENT, "short");

    absl::MutexLock lock(&mu_);
    sessions_.push_back(seen.session);
    uploads_.push_back(seen);
    if (!parts) {
      *response->mutable_tensor() = Store(seen.session, h, std::move(single));
      return grpc::Status::OK;
    }
    Pending& p = pending_[key];
    if (++p.done == h.parts()) {
      p.info = Store(seen.session, h, std::move(p.data));
      p.complete = true;
    }
    auto complete = [&p] { return p.complete; };
    while (!mu_.AwaitWithTimeout(absl::Condition(&complete), absl::Milliseconds(50))) {
      if (ctx->IsCancelled()) return grpc::Status(grpc::CANCELLED, "cancelled");
    }
    *response->mutable_tensor() = p.info;
    return grpc::Status::OK;
  }

  grpc::Status Download(grpc::ServerContext* ctx, const v1::DownloadRequest* request,
                        grpc::ServerWriter<v1::DownloadResponse>* writer) override {
    Stream seen{SessionOf(*ctx), ctx->peer()};
    seen.download = *request;
    std::string data;
    v1::TensorInfo info;
    {
      absl::MutexLock lock(&mu_);
      sessions_.push_back(seen.session);
      downloads_.push_back(seen);
      auto it = tensors_.find(seen.session + "/" + request->handle());
      if (it == tensors_.end()) return grpc::Status(grpc::NOT_FOUND, "unknown handle");
      info = it->second.first;
      data = it->second.second;
    }
    const int64_t begin = request->offset();
    const int64_t end = request->length() == 0 ? info.bytes() : begin + request->length();
    if (begin < 0 || end > info.bytes()) return grpc::Status(grpc::OUT_OF_RANGE, "range");
    const int64_t chunk = download_chunk_bytes > 0     ? download_chunk_bytes
                          : request->chunk_bytes() > 0 ? request->chunk_bytes()
                                                       : int64_t{4} << 20;
    v1::DownloadResponse message;
    *message.mutable_tensor() = info;
    int64_t offset = begin;
    bool first = true;
    do {
      const int64_t n = std::min(chunk, end - offset);
      message.set_offset(offset);
      message.set_data(data.data() + offset, n);
      if (!writer->Write(message)) return grpc::Status(grpc::CANCELLED, "gone");
      message.clear_tensor();
      offset += n;
      if (first) offset += download_gap;
      first = false;
    } while (offset < end);
    return grpc::Status::OK;
  }

  grpc::Status Free(grpc::ServerContext* ctx, const v1::FreeRequest* request,
                    v1::FreeResponse* response) override {
    absl::MutexLock lock(&mu_);
    sessions_.push_back(SessionOf(*ctx));
    for (const std::string& handle : request->handles()) {
      auto it = tensors_.find(SessionOf(*ctx) + "/" + handle);
      if (it == tensors_.end()) return grpc::Status(grpc::NOT_FOUND, "unknown handle");
      response->set_freed_bytes(response->freed_bytes() + it->second.first.bytes());
      tensors_.erase(it);
    }
    return grpc::Status::OK;
  }

  grpc::Status ListTensors(grpc::ServerContext* ctx, const v1::ListTensorsRequest*,
                           v1::ListTensorsResponse* response) override {
    absl::MutexLock lock(&mu_);
    const std::string session = SessionOf(*ctx);
    sessions_.push_back(session);
    for (const auto& [key, tensor] : tensors_) {
      if (absl::StartsWith(key, session + "/")) *response->add_tensors() = tensor.first;
    }
    return grpc::Status::OK;
  }

  // The other calls only record their session.
  grpc::Status Gemm(grpc::ServerContext* ctx, const v1::GemmRequest*, v1::GemmResponse*) override {
    return Record(*ctx);
  }
  grpc::Status Gemv(grpc::ServerContext* ctx, const v1::GemvRequest*, v1::GemvResponse*) override {
    return Record(*ctx);
  }
  grpc::Status Reduce(grpc::ServerContext* ctx, const v1::ReduceRequest*,
                      v1::ReduceResponse*) override {
    return Record(*ctx);
  }
  grpc::Status Transpose(grpc::ServerContext* ctx, const v1::TransposeRequest*,
                         v1::TransposeResponse*) override {
    return Record(*ctx);
  }
  grpc::Status Attention(grpc::ServerContext* ctx, const v1::AttentionRequest*,
                         v1::AttentionResponse*) override {
    return Record(*ctx);
  }
  grpc::Status Echo(grpc::ServerContext* ctx, const v1::EchoRequest*, v1::EchoResponse*) override {
    return Record(*ctx);
  }
  grpc::Status GetServerInfo(grpc::ServerContext* ctx, const v1::ServerInfoRequest*,
                             v1::ServerInfoResponse*) override {
    return Record(*ctx);
  }
  grpc::Status Batch(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::BatchResponse, v1::BatchRequest>* stream) override {
    v1::BatchRequest request;
    while (stream->Read(&request)) {
      v1::BatchResponse response;
      response.set_id(request.id());
      stream->Write(response);
    }
    return Record(*ctx);
  }

 private:
  struct Pending {
    std::string data;
    int done = 0;
    bool complete = false;
    v1::TensorInfo info;
  };

  grpc::Status Record(const grpc::ServerContext& ctx) {
    absl::MutexLock lock(&mu_);
    sessions_.push_back(SessionOf(ctx));
    return grpc::Status::OK;
  }

  v1::TensorInfo Store(const std::string& session, const v1::UploadHeader& h, std::string data)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::TensorInfo info;
    info.set_handle(absl::StrCat("h", ++next_handle_));
    info.set_dtype(h.dtype());
    *info.mutable_shape() = h.shape();
    info.set_bytes(static_cast<int64_t>(data.size()));
    tensors_[session + "/" + info.handle()] = {info, std::move(data)};
    return info;
  }

  absl::Mutex mu_;
  std::map<std::string, std::pair<v1::TensorInfo, std::string>> tensors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<Stream> uploads_ ABSL_GUARDED_BY(mu_);
  std::vector<Stream> downloads_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> sessions_ ABSL_GUARDED_BY(mu_);
  int next_handle_ ABSL_GUARDED_BY(mu_) = 0;
};

class ClientTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(std::chrono::system_clock::now()); }

  std::unique_ptr<Client> Connect(ClientOptions options) {
    options.target = absl::StrCat("127.0.0.1:", port_);
    auto client = Client::Create(std::move(options));
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static std::string Pattern(int64_t bytes) {
    std::string data(bytes, '\0');
    for (int64_t i = 0; i < bytes; ++i) data[i] = static_cast<char>((i * 131) ^ (i >> 9));
    return data;
  }

  ResidentStandIn service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(ClientTransferTest, ParallelStreamsOnConnectionsOfTheirOwn) {
  auto client =
      Connect({.session = "alice", .streams = 4, .chunk_bytes = 3000, .parallel_min_bytes = 0});
  const std::vector<int64_t> shape = {500001};  // float16: 1000002 bytes
  const std::string data = Pattern(1000002);
  auto info = client->Upload(v1::FLOAT16, shape, data.data());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->bytes(), 1000002);

  const std::vector<ByteRange> parts = SplitTransfer(1000002, 4, 0);
  ASSERT_EQ(parts.size(), 4u);
  std::vector<ResidentStandIn::Stream> uploads = service_.uploads();
  ASSERT_EQ(uploads.size(), 4u);
  std::set<std::string> peers, ids;
  std::set<std::pair<int64_t, int64_t>> ranges;
  for (const auto& s : uploads) {
    EXPECT_EQ(s.session, "alice");
    EXPECT_EQ(s.header.parts(), 4);
    EXPECT_EQ(s.header.dtype(), v1::FLOAT16);
    EXPECT_FALSE(s.header.has_device());
    peers.insert(s.peer);
    ids.insert(s.header.upload_id());
    ranges.insert({s.header.part_begin(), s.header.part_end()});
    for (int64_t c : s.chunk_sizes) EXPECT_LE(c, 3000);
  }
  EXPECT_EQ(peers.size(), 4u) << "the parts shared connections";
  EXPECT_EQ(ids.size(), 1u);
  EXPECT_FALSE(ids.begin()->empty());
  for (const ByteRange& r : parts) EXPECT_EQ(ranges.count({r.begin, r.end}), 1u);

  std::string back(data.size(), '\0');
  ASSERT_TRUE(client->Download(info->handle(), back.data(), back.size()).ok());
  EXPECT_TRUE(back == data) << "downloaded bytes differ";
  std::vector<ResidentStandIn::Stream> downloads = service_.downloads();
  ASSERT_EQ(downloads.size(), 4u);
  peers.clear();
  for (const auto& s : downloads) {
    EXPECT_EQ(s.session, "alice");
    EXPECT_EQ(s.download.chunk_bytes(), 3000);
    peers.insert(s.peer);
  }
  EXPECT_EQ(peers.size(), 4u) << "the download streams shared connections";
  // The first asks for everything; the others for their parts.
  std::set<std::pair<int64_t, int64_t>> asked;
  for (const auto& s : downloads) asked.insert({s.download.offset(), s.download.length()});
  EXPECT_EQ(asked.count({0, 0}), 1u);
  for (size_t i = 1; i < parts.size(); ++i) {
    EXPECT_EQ(asked.count({parts[i].begin, parts[i].size()}), 1u) << i;
  }

  // A second upload has an id of its own.
  service_.ClearRecords();
  ASSERT_TRUE(client->Upload(v1::FLOAT16, shape, data.data()).ok());
  uploads = service_.uploads();
  ASSERT_FALSE(uploads.empty());
  EXPECT_NE(uploads[0].header.upload_id(), *ids.begin());
}

TEST_F(ClientTransferTest, SmallTransfersUseOneStreamWithoutParts) {
  auto client = Connect({.streams = 4});  // parallel_min_bytes 64 MiB
  const std::string data = Pattern(40000);
  auto info = client->Upload(v1::FLOAT32, {100, 100}, data.data(), {.device = 1});
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<ResidentStandIn::Stream> uploads = service_.uploads();
  ASSERT_EQ(uploads.size(), 1u);
  EXPECT_EQ(uploads[0].header.parts(), 0);
  EXPECT_TRUE(uploads[0].header.upload_id().empty());
  EXPECT_EQ(uploads[0].header.device(), 1);
  EXPECT_EQ(uploads[0].chunk_sizes, std::vector<int64_t>{40000});
  EXPECT_EQ(uploads[0].session, "<none>") << "no session: no metadata";

  auto tensor = client->DownloadTensor(info->handle());
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->dtype(), v1::FLOAT32);
  EXPECT_EQ(ShapeOf(*tensor), (std::vector<int64_t>{100, 100}));
  EXPECT_TRUE(tensor->data() == data);
  EXPECT_EQ(service_.downloads().size(), 1u);
}

TEST_F(ClientTransferTest, EmptyTensorsAndPerCallOverrides) {
  auto client = Connect({.streams = 2, .parallel_min_bytes = 0});
  auto empty = client->Upload(v1::BFLOAT16, {3, 0}, nullptr);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->bytes(), 0);
  auto tensor = client->DownloadTensor(empty->handle());
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(ShapeOf(*tensor), (std::vector<int64_t>{3, 0}));
  EXPECT_TRUE(tensor->data().empty());

  service_.ClearRecords();
  const std::string data = Pattern(3 * 4096 + 2);
  auto info =
      client->Upload(v1::FLOAT16, {3 * 2048 + 1}, data.data(), {.streams = 3, .chunk_bytes = 1000});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(service_.uploads().size(), 3u);
  std::string back(data.size(), '\0');
  ASSERT_TRUE(client->Download(info->handle(), back.data(), back.size(), {.streams = 1}).ok());
  EXPECT_TRUE(back == data);
  EXPECT_EQ(service_.downloads().size(), 1u);
}

TEST_F(ClientTransferTest, ChunksFitTheMessageLimit) {
  auto client = Connect({.max_message_bytes = 64 << 10});  // chunk_bytes 4 MiB
  const std::string data = Pattern(200000);
  auto info = client->Upload(v1::FLOAT32, {50000}, data.data());
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<ResidentStandIn::Stream> uploads = service_.uploads();
  ASSERT_EQ(uploads.size(), 1u);
  EXPECT_EQ(uploads[0].chunk_sizes.size(), 4u);
  for (int64_t c : uploads[0].chunk_sizes) EXPECT_LE(c, (64 << 10) - 1024);
  auto tensor = client->DownloadTensor(info->handle());
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_TRUE(tensor->data() == data);
  EXPECT_EQ(service_.downloads()[0].download.chunk_bytes(), (64 << 10) - 1024);
}

TEST_F(ClientTransferTest, SessionOnEveryCall) {
  auto client = Connect({.session = "bob"});
  EXPECT_TRUE(client->Gemm({}).ok());
  EXPECT_TRUE(client->Gemv({}).ok());
  EXPECT_TRUE(client->Reduce({}).ok());
  EXPECT_TRUE(client->Transpose({}).ok());
  EXPECT_TRUE(client->Attention({}).ok());
  EXPECT_TRUE(client->Echo({}).ok());
  EXPECT_TRUE(client->GetServerInfo().ok());
  std::vector<v1::BatchRequest> batch(2);
  batch[1].set_id("1");
  EXPECT_TRUE(client->Batch(batch).ok());
  EXPECT_TRUE(client->ListTensors().ok());
  auto info = client->Upload(v1::FLOAT32, {2}, "12345678");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(client->DownloadTensor(info->handle()).ok());
  EXPECT_TRUE(client->Free({info->handle()}).ok());
  std::vector<std::string> sessions = service_.sessions();
  EXPECT_EQ(sessions.size(), 12u);
  for (const std::string& s : sessions) EXPECT_EQ(s, "bob");
}

TEST_F(ClientTransferTest, SessionsDoNotSeeEachOthersTensors) {
  auto alice = Connect({.session = "alice"});
  auto bob = Connect({.session = "bob"});
  auto info = alice->Upload(v1::FLOAT32, {2}, "12345678");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(bob->DownloadTensor(info->handle()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bob->ListTensors()->tensors_size(), 0);
  EXPECT_EQ(alice->ListTensors()->tensors_size(), 1);
}

TEST_F(ClientTransferTest, DownloadChecksTheDestinationSize) {
  auto client = Connect({});
  auto info = client->Upload(v1::FLOAT32, {4}, Pattern(16).data());
  ASSERT_TRUE(info.ok()) << info.status();
  std::string dst(20, 'x');
  absl::Status status = client->Download(info->handle(), dst.data(), 20);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "16 bytes")) << status;
  EXPECT_EQ(dst, std::string(20, 'x')) << "dst was written";
  EXPECT_EQ(client->Download(info->handle(), dst.data(), 12).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Download("nope", dst.data(), 16).code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientTransferTest, DownloadSinkSeesEveryByteOnceInOrderPerPart) {
  // The server's chunks (7 bytes) do not divide the parts: the first stream
  // overshoots its part and is cut there.
  service_.download_chunk_bytes = 7;
  auto client = Connect({.streams = 3, .parallel_min_bytes = 0});
  const std::string data = Pattern(5 * 4096 + 4);
  auto info = client->Upload(v1::FLOAT16, {(5 * 4096 + 4) / 2}, data.data());
  ASSERT_TRUE(info.ok()) << info.status();

  absl::Mutex mu;
  std::vector<int> seen(info->bytes(), 0);
  std::map<int64_t, int64_t> next_of_part;  // part begin -> next offset
  const std::vector<ByteRange> parts = SplitTransfer(info->bytes(), 3, 0);
  bool in_order = true;
  auto result =
      client->DownloadTo(info->handle(), [&](int64_t offset, const char* bytes, int64_t size) {
        absl::MutexLock lock(&mu);
        const ByteRange* part = nullptr;
        for (const ByteRange& p : parts) {
          if (offset >= p.begin && offset < p.end) part = &p;
        }
        if (part == nullptr || offset + size > part->end) {
          return absl::InternalError(absl::StrCat("bytes [", offset, ", +", size, ") cross parts"));
        }
        auto [it, fresh] = next_of_part.emplace(part->begin, part->begin);
        if (it->second != offset) in_order = false;
        it->second = offset + size;
        for (int64_t i = 0; i < size; ++i) {
          ++seen[offset + i];
          if (bytes[i] != data[offset + i]) return absl::InternalError("wrong byte");
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->handle(), info->handle());
  EXPECT_TRUE(in_order);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<int64_t>(seen.size()));
}

// Chunks of 1 MiB and more over two streams: the sink sees each part's
// bytes once, in order, one call at a time per stream; and an error from the
// sink stops the download and is what it returns.
TEST_F(ClientTransferTest, LargeChunksAreDeliveredOnceInOrderAndASinkErrorStops) {
  service_.download_chunk_bytes = (1 << 20) + 4;
  // Uploaded in chunks within this test server's 4 MiB messages.
  auto client = Connect({.streams = 2, .chunk_bytes = 1 << 20, .parallel_min_bytes = 0});
  const int64_t bytes = 9 * (1 << 20) + 6;
  const std::string data = Pattern(bytes);
  auto info = client->Upload(v1::FLOAT16, {bytes / 2}, data.data());
  ASSERT_TRUE(info.ok()) << info.status();
  const std::vector<ByteRange> parts = SplitTransfer(bytes, 2, 0);

  absl::Mutex mu;
  std::vector<int> seen(bytes, 0);
  std::map<int64_t, int64_t> next_of_part;
  std::map<int64_t, int> calls_in_part;  // calls running now, per part
  bool in_order = true, overlapped = false;
  int64_t wrong = 0;
  auto sink = [&](int64_t offset, const char* got, int64_t size) {
    const ByteRange* part = nullptr;
    for (const ByteRange& p : parts) {
      if (offset >= p.begin && offset < p.end) part = &p;
    }
    if (part == nullptr) return absl::InternalError("bytes outside every part");
    {
      absl::MutexLock lock(&mu);
      if (calls_in_part[part->begin]++ > 0) overlapped = true;
      auto [it, fresh] = next_of_part.emplace(part->begin, part->begin);
      if (it->second != offset) in_order = false;
      it->second = offset + size;
    }
    int64_t bad = 0;
    for (int64_t i = 0; i < size; ++i) bad += got[i] != data[offset + i];
    absl::MutexLock lock(&mu);
    for (int64_t i = 0; i < size; ++i) ++seen[offset + i];
    wrong += bad;
    --calls_in_part[part->begin];
    return absl::OkStatus();
  };
  auto result = client->DownloadTo(info->handle(), sink);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(in_order);
  EXPECT_FALSE(overlapped);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), bytes);

  std::vector<char> dst(bytes);
  ASSERT_TRUE(client->Download(info->handle(), dst.data(), bytes).ok());
  EXPECT_EQ(std::string(dst.data(), dst.size()), data);

  // The sink fails on its third call: that error comes back, and no call
  // comes after it on that stream.
  std::atomic<int> calls{0};
  auto failing = client->DownloadTo(
      info->handle(),
      [&](int64_t, const char*, int64_t) {
        return ++calls == 3 ? absl::DataLossError("the sink's own error") : absl::OkStatus();
      },
      {.streams = 1});
  EXPECT_EQ(failing.status().code(), absl::StatusCode::kDataLoss) << failing.status();
  EXPECT_EQ(failing.status().message(), "the sink's own error");
  EXPECT_EQ(calls.load(), 3);
}

TEST_F(ClientTransferTest, ABrokenDownloadStreamIsInternal) {
  service_.download_chunk_bytes = 100;
  service_.download_gap = 4;  // a hole after the first chunk
  auto client = Connect({});
  auto info = client->Upload(v1::FLOAT32, {1000}, Pattern(4000).data());
  ASSERT_TRUE(info.ok()) << info.status();
  auto tensor = client->DownloadTensor(info->handle());
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInternal) << tensor.status();
}

TEST_F(ClientTransferTest, ASourceErrorStopsEveryStream) {
  auto client = Connect({.streams = 4, .chunk_bytes = 4096, .parallel_min_bytes = 0});
  std::atomic<int> calls{0};
  auto info =
      client->UploadFrom(v1::FLOAT32, {1 << 18}, [&](int64_t offset, int64_t size, char* dst) {
        ++calls;
        if (offset >= (1 << 19)) return absl::DataLossError("the source broke");
        std::memset(dst, 1, size);
        return absl::OkStatus();
      });
  EXPECT_EQ(info.status().code(), absl::StatusCode::kDataLoss) << info.status();
  EXPECT_EQ(client->ListTensors()->tensors_size(), 0);
  EXPECT_LT(calls.load(), 256) << "streams went on after the failure";
}

TEST_F(ClientTransferTest, UploadRejectsWhatItCannotSend) {
  auto client = Connect({});
  EXPECT_EQ(client->Upload(v1::DTYPE_UNSPECIFIED, {2}, "12345678").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Upload(v1::FLOAT32, {-2}, "12345678").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Upload(HandleTensor("h1")).status().code(), absl::StatusCode::kInvalidArgument);
  v1::Tensor short_data = MakeFloat32Tensor({2}, {1, 2});
  short_data.mutable_data()->pop_back();
  EXPECT_EQ(client->Upload(short_data).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Upload(v1::FLOAT32, {2}, "12345678", {.streams = 65}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(service_.uploads().empty());
}

TEST_F(ClientTransferTest, CreateRejectsBadTransferOptions) {
  auto code = [](ClientOptions options) { return Client::Create(options).status().code(); };
  EXPECT_EQ(code({.streams = 0}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.streams = 65}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.chunk_bytes = 0}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.parallel_min_bytes = -1}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.session = "line\nbreak"}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.session = "alice-1"}), absl::StatusCode::kOk);
}

// A loopback port that nobody listens on (unless someone takes it meanwhile).
int UnusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// Calls made while the server is not yet listening: with connect_timeout
// they wait out the refused connection attempts and reach the server once it
// is up; without it they fail at once. Upload (over parallel streams, each on
// a connection of its own) and Free are never retried, so the wait is all
// that saves them.
TEST(ClientConnectTest, CallsWaitForAServerThatComesUpLate) {
  const int port = UnusedPort();
  ASSERT_NE(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);

  ClientOptions impatient{.target = address, .connect_timeout = absl::ZeroDuration()};
  auto early = Client::Create(impatient);
  ASSERT_TRUE(early.ok()) << early.status();
  const std::string data(3 * kTransferAlignment, 'x');
  const std::vector<int64_t> shape = {3 * kTransferAlignment / 4};
  EXPECT_EQ((*early)->Upload(v1::FLOAT32, shape, data.data()).status().code(),
            absl::StatusCode::kUnavailable);

  ResidentStandIn service;
  std::unique_ptr<grpc::Server> server;
  std::thread starter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials());
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  });
  ClientOptions patient{.target = address,
                        .connect_timeout = absl::Seconds(20),
                        .session = "alice",
                        .streams = 3,
                        .chunk_bytes = 1000,
                        .parallel_min_bytes = 0};
  auto client = Client::Create(patient);
  ASSERT_TRUE(client.ok()) << client.status();
  auto free_client = Client::Create(patient);
  ASSERT_TRUE(free_client.ok()) << free_client.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::TensorInfo> info;
  absl::Status freed;
  std::thread free_thread([&] { freed = (*free_client)->Free({"nothing"}).status(); });
  info = (*client)->Upload(v1::FLOAT32, shape, data.data());
  free_thread.join();
  starter.join();
  ASSERT_NE(server, nullptr) << "could not listen on " << address;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->bytes(), 3 * kTransferAlignment);
  EXPECT_EQ(service.uploads().size(), 3u);  // one per stream
  // The stand-in answers NOT_FOUND for a handle it does not hold: the call
  // reached it.
  EXPECT_EQ(freed.code(), absl::StatusCode::kNotFound) << freed;
  server->Shutdown(std::chrono::system_clock::now());
}

// Nobody listening: a call fails with UNAVAILABLE once connect_timeout has
// passed, long before its deadline; and never waits more than half its
// timeout, so that what it reports is the connection, not the deadline.
TEST(ClientConnectTest, NobodyListeningIsUnavailableAfterTheConnectTimeout) {
  const int port = UnusedPort();
  ASSERT_NE(port, 0);
  auto client = Client::Create({.target = absl::StrCat("127.0.0.1:", port),
                                .default_timeout = absl::Seconds(30),
                                .max_attempts = 1,
                                .connect_timeout = absl::Milliseconds(400)});
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Time start = absl::Now();
  EXPECT_EQ((*client)->GetServerInfo().status().code(), absl::StatusCode::kUnavailable);
  absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(350));
  EXPECT_LT(took, absl::Seconds(10));

  start = absl::Now();
  const std::string data(400, 'x');
  EXPECT_EQ((*client)->Upload(v1::FLOAT32, {100}, data.data()).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));

  auto halved = Client::Create({.target = absl::StrCat("127.0.0.1:", port),
                                .max_attempts = 1,
                                .connect_timeout = absl::Seconds(30)});
  ASSERT_TRUE(halved.ok()) << halved.status();
  start = absl::Now();
  EXPECT_EQ((*halved)->GetServerInfo({.timeout = absl::Seconds(2)}).status().code(),
            absl::StatusCode::kUnavailable);
  took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_LT(took, absl::Seconds(2));
}

TEST(ClientConnectTest, CreateRejectsANegativeConnectTimeout) {
  EXPECT_EQ(Client::Create({.connect_timeout = absl::Seconds(-1)}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpucompute::testing
