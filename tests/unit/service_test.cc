// The service layer: admission, the worker pool, conversions, and an
// in-process server on a loopback port (results, errors, limits, the batch
// stream, deadlines, health and the drain).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/reference.h"
#include "gpucompute/v1/compute.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/host_memory.h"
#include "server/backends.h"
#include "server/engine/admission.h"
#include "server/server.h"
#include "server/service/convert.h"
#include "server/service/worker_pool.h"
#include "tests/unit/forwarding_device.h"

namespace gpucompute {
namespace {

// --- admission ---------------------------------------------------------------

bool Never() { return false; }

TEST(AdmissionTest, RefusesARequestLargerThanTheLimitAtOnce) {
  Admission admission(100);
  const absl::Time start = absl::Now();
  absl::StatusOr<Admission::Ticket> ticket = admission.Admit(101, absl::InfiniteFuture(), Never);
  EXPECT_EQ(ticket.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(ticket.status().message(), "--max_inflight_bytes"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST(AdmissionTest, HoldsBytesUntilTheTicketGoes) {
  Admission admission(100);
  absl::StatusOr<Admission::Ticket> a = admission.Admit(60, absl::InfiniteFuture(), Never);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(admission.inflight_bytes(), 60);
  std::atomic<bool> admitted{false};
  std::thread waiter([&] {
    absl::StatusOr<Admission::Ticket> b = admission.Admit(50, absl::InfiniteFuture(), Never);
    ASSERT_TRUE(b.ok());
    EXPECT_GT(b->wait_seconds(), 0.0);
    admitted = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(admitted);
  EXPECT_EQ(admission.waiting(), 1);
  *a = Admission::Ticket();  // releases 60
  waiter.join();
  EXPECT_TRUE(admitted);
  EXPECT_EQ(admission.inflight_bytes(), 0);
  EXPECT_EQ(admission.waiting(), 0);
}

TEST(AdmissionTest, DeadlineAndCancellationEndTheWait) {
  Admission admission(100);
  absl::StatusOr<Admission::Ticket> held = admission.Admit(100, absl::InfiniteFuture(), Never);
  ASSERT_TRUE(held.ok());
  absl::StatusOr<Admission::Ticket> late =
      admission.Admit(1, absl::Now() + absl::Milliseconds(30), Never);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(late.status().message(), "100 bytes")) << late.status();
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(30));
    cancel = true;
  });
  absl::StatusOr<Admission::Ticket> cancelled =
      admission.Admit(1, absl::InfiniteFuture(), [&] { return cancel.load(); });
  canceller.join();
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(admission.waiting(), 0);
  EXPECT_EQ(admission.inflight_bytes(), 100);
}

TEST(AdmissionTest, AdmitsInArrivalOrder) {
  Admission admission(100);
  auto big =
      std::make_unique<Admission::Ticket>(*admission.Admit(100, absl::InfiniteFuture(), Never));
  std::vector<int> order;
  absl::Mutex mu;
  std::thread first([&] {
    absl::StatusOr<Admission::Ticket> t = admission.Admit(80, absl::InfiniteFuture(), Never);
    absl::MutexLock lock(&mu);
    order.push_back(1);
  });
  while (admission.waiting() < 1) absl::SleepFor(absl::Milliseconds(1));
  std::thread second([&] {
    absl::StatusOr<Admission::Ticket> t = admission.Admit(30, absl::InfiniteFuture(), Never);
    absl::MutexLock lock(&mu);
    order.push_back(2);
  });
  while (admission.waiting() < 2) absl::SleepFor(absl::Milliseconds(1));
  big.reset();
  first.join();
  second.join();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(AdmissionTest, ZeroMeansNoLimit) {
  Admission admission(0);
  absl::StatusOr<Admission::Ticket> t =
      admission.Admit(int64_t{1} << 50, absl::InfiniteFuture(), Never);
  EXPECT_TRUE(t.ok());
}

// What AdmitAsync handed to its callback, and when.
struct AsyncResult {
  bool called = false;
  absl::StatusOr<Admission::Ticket> ticket = absl::UnknownError("not called");
};

Admission::Done Into(AsyncResult* result) {
  return [result](absl::StatusOr<Admission::Ticket> ticket) {
    result->called = true;
    result->ticket = std::move(ticket);
  };
}

TEST(AdmissionTest, AsyncWaitersTakeTheirTurnWithBlockedOnesAndShrinkingMakesRoom) {
  std::vector<int64_t> changes;
  Admission admission(100, "--max_inflight_bytes",
                      [&changes](int64_t delta) { changes.push_back(delta); });
  AsyncResult at_once, refused, second, third;
  admission.AdmitAsync(70, absl::InfiniteFuture(), nullptr, Into(&at_once));
  ASSERT_TRUE(at_once.called);  // decided before AdmitAsync returned
  ASSERT_TRUE(at_once.ticket.ok());
  admission.AdmitAsync(101, absl::InfiniteFuture(), nullptr, Into(&refused));
  ASSERT_TRUE(refused.called);
  EXPECT_EQ(refused.ticket.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(refused.ticket.status().message(), "--max_inflight_bytes"));

  admission.AdmitAsync(50, absl::InfiniteFuture(), nullptr, Into(&second));
  EXPECT_FALSE(second.called);
  // TryAdmit does not pass a waiter, even for bytes that fit.
  EXPECT_FALSE(admission.TryAdmit(10).has_value());
  admission.AdmitAsync(10, absl::InfiniteFuture(), nullptr, Into(&third));
  EXPECT_EQ(admission.waiting(), 2);

  at_once.ticket->ShrinkTo(40);  // 40 + 50 fit, and then 10 more
  ASSERT_TRUE(second.called);
  ASSERT_TRUE(third.called);
  EXPECT_TRUE(second.ticket.ok());
  EXPECT_TRUE(third.ticket.ok());
  EXPECT_EQ(admission.inflight_bytes(), 100);
  EXPECT_EQ(admission.waiting(), 0);
  second.ticket = Admission::Ticket();
  third.ticket = Admission::Ticket();
  at_once.ticket = Admission::Ticket();
  EXPECT_EQ(admission.inflight_bytes(), 0);
  int64_t sum = 0;
  for (int64_t delta : changes) sum += delta;
  EXPECT_EQ(sum, 0);
  EXPECT_EQ(changes, (std::vector<int64_t>{70, -30, 50, 10, -50, -10, -40}));
}

TEST(AdmissionTest, ExpireEndsAsyncWaitsPastTheirDeadlineOrCancelled) {
  Admission admission(100);
  absl::StatusOr<Admission::Ticket> held = admission.Admit(100, absl::InfiniteFuture(), Never);
  ASSERT_TRUE(held.ok());
  AsyncResult late, cancelled, patient;
  std::atomic<bool> cancel{false};
  admission.AdmitAsync(1, absl::Now() + absl::Milliseconds(20), nullptr, Into(&late));
  admission.AdmitAsync(
      1, absl::InfiniteFuture(), [&cancel] { return cancel.load(); }, Into(&cancelled));
  admission.AdmitAsync(1, absl::InfiniteFuture(), nullptr, Into(&patient));
  admission.Expire();
  EXPECT_FALSE(late.called);
  absl::SleepFor(absl::Milliseconds(30));
  cancel = true;
  admission.Expire();
  ASSERT_TRUE(late.called);
  EXPECT_EQ(late.ticket.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(cancelled.called);
  EXPECT_EQ(cancelled.ticket.status().code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(patient.called);
  EXPECT_EQ(admission.waiting(), 1);
  *held = Admission::Ticket();
  ASSERT_TRUE(patient.called);
  EXPECT_TRUE(patient.ticket.ok());
}

// --- worker pool -------------------------------------------------------------

TEST(WorkerPoolTest, RunsEveryTaskIncludingThoseScheduledWhileStopping) {
  std::atomic<int> ran{0};
  {
    WorkerPool pool(3);
    for (int i = 0; i < 100; ++i) {
      pool.Schedule([&pool, &ran, i] {
        if (i % 10 == 0) pool.Schedule([&ran] { ++ran; });
        ++ran;
      });
    }
    pool.Stop();
    EXPECT_EQ(ran, 110);
  }
  EXPECT_EQ(ran, 110);
}

// --- conversions -------------------------------------------------------------

TEST(ConvertTest, EveryStatusCodeCarriesOver) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code), "why");
    const grpc::Status grpc_status = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(grpc_status.error_code()), code);
    if (code != 0) {
      EXPECT_EQ(grpc_status.error_message(), "why");
    }
  }
  EXPECT_EQ(ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(99), "x")).error_code(),
            grpc::StatusCode::UNKNOWN);
}

TEST(ConvertTest, MoveToProtoSwapsTheBytesIn) {
  HostTensor tensor = HostTensor::Allocate(DType::kFloat16, {3, 1000});
  const char* bytes = tensor.data.data();
  v1::Tensor out;
  MoveToProto(tensor, &out);
  EXPECT_EQ(out.dtype(), v1::FLOAT16);
  EXPECT_EQ(out.shape_size(), 2);
  EXPECT_EQ(out.shape(1), 1000);
  EXPECT_EQ(out.data().size(), 6000u);
  EXPECT_EQ(out.data().data(), bytes);  // no copy
}

TEST(ConvertTest, RecycleTensorBytesGivesTheTensorsBuffersToTheCache) {
  LargeStringCache& cache = LargeStringCache::Default();
  cache.SetCapacity(int64_t{1} << 30);
  v1::BatchRequest item;  // a Tensor two messages down
  v1::Tensor* a = item.mutable_gemm()->mutable_a();
  a->mutable_data()->resize(LargeStringCache::kMinBytes + 1, 'a');
  item.mutable_gemm()->mutable_b()->set_data("small");
  const char* bytes = a->data().data();
  const int64_t before = cache.kept_bytes();
  RecycleTensorBytes(&item);
  EXPECT_TRUE(a->data().empty());
  EXPECT_TRUE(item.gemm().b().data().empty());
  EXPECT_GT(cache.kept_bytes(), before);
  EXPECT_EQ(cache.Take(LargeStringCache::kMinBytes).data(), bytes);
  cache.SetCapacity(0);
}

TEST(ConvertTest, EncodeAnswerSendsTensorBytesFromTheirBufferAndGivesItBack) {
  LargeStringCache& cache = LargeStringCache::Default();
  cache.SetCapacity(int64_t{1} << 30);
  v1::BatchResponse answer;  // the result three fields down
  answer.set_id("x");
  v1::GemmResponse* gemm = answer.mutable_gemm();
  gemm->mutable_c()->set_dtype(v1::FLOAT32);
  gemm->mutable_c()->add_shape(int64_t{LargeStringCache::kMinBytes / 4 + 1});
  std::string& data = *gemm->mutable_c()->mutable_data();
  data.resize(LargeStringCache::kMinBytes + 4);
  for (size_t i = 0; i < data.size(); i += 4096) data[i] = static_cast<char>(i / 4096);
  gemm->mutable_timings()->add_shards()->set_variant("reg8x8");
  const v1::BatchResponse expected = answer;
  const char* bytes = data.data();
  const int64_t before = cache.kept_bytes();
  {
    absl::StatusOr<grpc::ByteBuffer> encoded = EncodeAnswer(&answer);
    ASSERT_TRUE(encoded.ok()) << encoded.status();
    EXPECT_TRUE(answer.gemm().c().data().empty());  // moved out, not copied
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(encoded->Dump(&slices).ok());
    bool sent_in_place = false;
    std::string flat;
    for (const grpc::Slice& slice : slices) {
      sent_in_place |= reinterpret_cast<const char*>(slice.begin()) == bytes;
      flat.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    EXPECT_TRUE(sent_in_place);
    v1::BatchResponse got;
    ASSERT_TRUE(got.ParseFromString(flat));
    EXPECT_EQ(got.SerializeAsString(), expected.SerializeAsString());
    EXPECT_EQ(cache.kept_bytes(), before);  // still being sent
  }
  EXPECT_GT(cache.kept_bytes(), before);  // sent: the buffer is kept for reuse
  EXPECT_EQ(cache.Take(LargeStringCache::kMinBytes).data(), bytes);
  // A small answer is encoded as protobuf would.
  v1::GemmResponse small;
  small.mutable_c()->set_data("abc");
  absl::StatusOr<grpc::ByteBuffer> encoded = EncodeAnswer(&small);
  ASSERT_TRUE(encoded.ok());
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(encoded->Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(slices[0].begin()), slices[0].size()),
            small.SerializeAsString());
  cache.SetCapacity(0);
}

TEST(ConvertTest, TimingsGiveRatesOverKernelTime) {
  ShardTiming shard;
  shard.device = 2;
  shard.axis = SplitAxis::kRows;
  shard.range = {10, 20};
  shard.run.variant = "openblas";
  shard.run.kernel_seconds = 0.5;
  shard.run.h2d_seconds = 0.125;
  shard.run.d2h_seconds = 0.125;
  shard.work = {100, 1000};
  ShardTiming other = shard;
  other.device = 3;
  other.run.kernel_seconds = 0.75;
  other.run.h2d_seconds = 0;
  other.run.peer_seconds = 0.0625;
  v1::Timings timings;
  FillTimings({shard, other}, &timings);
  ASSERT_EQ(timings.shards_size(), 2);
  // The device stages are the longest shard's.
  EXPECT_EQ(timings.host_to_device_seconds(), 0.125);
  EXPECT_EQ(timings.kernel_seconds(), 0.75);
  EXPECT_EQ(timings.device_to_host_seconds(), 0.125);
  EXPECT_EQ(timings.shards(1).peer_seconds(), 0.0625);
  EXPECT_EQ(timings.shards(1).transfer_seconds(), 0.1875);
  const v1::ShardTiming& t = timings.shards(0);
  EXPECT_EQ(t.device(), 2);
  EXPECT_EQ(t.variant(), "openblas");
  EXPECT_EQ(t.axis(), "rows");
  EXPECT_EQ(t.begin(), 10);
  EXPECT_EQ(t.end(), 20);
  EXPECT_EQ(t.transfer_seconds(), 0.25);
  EXPECT_EQ(t.bytes_per_second(), 200);
  EXPECT_EQ(t.flops_per_second(), 2000);
}

// --- server ------------------------------------------------------------------

TEST(ServerCreateTest, RejectsBadOptionsNamingTheFlag) {
  struct Case {
    ServerOptions options;
    absl::StatusCode code;
    std::string flag;
  };
  std::vector<Case> cases;
  auto add = [&](auto edit, absl::StatusCode code, std::string flag) {
    ServerOptions options;
    options.backend = "cpu";
    edit(options);
    cases.push_back({options, code, flag});
  };
  add([](ServerOptions& o) { o.backend = "tpu"; }, absl::StatusCode::kInvalidArgument, "--backend");
  add([](ServerOptions& o) { o.cpu_devices = 0; }, absl::StatusCode::kInvalidArgument,
      "--cpu_devices");
  add(
      [](ServerOptions& o) {
        o.device_weights = {1, 2};
      },
      absl::StatusCode::kInvalidArgument, "--device_weights");
  add(
      [](ServerOptions& o) {
        o.cpu_devices = 2;
        o.device_weights = {1, -2};
      },
      absl::StatusCode::kInvalidArgument, "--device_weights");
  add([](ServerOptions& o) { o.devices = {0}; }, absl::StatusCode::kInvalidArgument, "--devices");
  add([](ServerOptions& o) { o.max_message_bytes = int64_t{1} << 31; },
      absl::StatusCode::kInvalidArgument, "--max_message_bytes");
  add([](ServerOptions& o) { o.max_inflight_bytes = -1; }, absl::StatusCode::kInvalidArgument,
      "--max_inflight_bytes");
  add([](ServerOptions& o) { o.gpu_lanes = 0; }, absl::StatusCode::kInvalidArgument, "--gpu_lanes");
  add([](ServerOptions& o) { o.gpu_lanes = 65; }, absl::StatusCode::kInvalidArgument,
      "--gpu_lanes");
  add([](ServerOptions& o) { o.staging_copy_threads = -1; }, absl::StatusCode::kInvalidArgument,
      "--staging_copy_threads");
  add([](ServerOptions& o) { o.staging_copy_threads = 65; }, absl::StatusCode::kInvalidArgument,
      "--staging_copy_threads");
  add([](ServerOptions& o) { o.device_max_inflight_bytes = -2; },
      absl::StatusCode::kInvalidArgument, "--device_max_inflight_bytes");
  add([](ServerOptions& o) { o.listen = ""; }, absl::StatusCode::kInvalidArgument, "--listen");
  add([](ServerOptions& o) { o.request_staging_bytes = -2; }, absl::StatusCode::kInvalidArgument,
      "--request_staging_bytes");
  // Without a GPU (or without CUDA in the build) the CUDA backend is refused.
  if (!CudaAvailable()) {
    add([](ServerOptions& o) { o.backend = "cuda"; }, absl::StatusCode::kFailedPrecondition,
        "--backend=cuda");
  }
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(c.options);
    ASSERT_FALSE(server.ok()) << c.flag;
    EXPECT_EQ(server.status().code(), c.code) << server.status();
    EXPECT_TRUE(absl::StartsWith(server.status().message(), c.flag)) << server.status();
  }
}

v1::Tensor RandomTensor(std::vector<int64_t> shape, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  int64_t n = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    n *= d;
  }
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  t.set_data(values.data(), values.size() * sizeof(float));
  return t;
}

std::vector<double> Doubles(const v1::Tensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape()) n *= d;
  return reference::ToDoubles(DType::kFloat32, t.data().data(), n);
}

class ServerTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions options) {
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.backend = "cpu";
    options.ready_file = ::testing::TempDir() + "service_test_ready.json";
    options.shutdown_timeout = absl::Seconds(20);
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_TRUE(server_->Start().ok());
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    channel_ = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Compute::NewStub(channel_);
  }

  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(30)) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return context;
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Compute::Stub> stub_;
  std::mt19937 rng_{std::random_device{}()};
};

TEST_F(ServerTest, ReadyFileInfoAndAGemmEqualToTheReference) {
  ServerOptions options;
  options.cpu_devices = 4;
  options.device_weights = {1, 1, 2, 2};
  StartServer(options);

  std::ifstream ready(::testing::TempDir() + "service_test_ready.json");
  std::stringstream ready_text;
  ready_text << ready.rdbuf();
  EXPECT_EQ(ready_text.str(), absl::StrCat("{\"grpc_port\": ", server_->port(),
                                           ", \"metrics_port\": ", server_->metrics_port(), "}\n"));

  v1::ServerInfoResponse info;
  ASSERT_TRUE(stub_->GetServerInfo(Context().get(), {}, &info).ok());
  EXPECT_EQ(info.backend(), "cpu");
  ASSERT_EQ(info.devices_size(), 4);
  EXPECT_EQ(info.devices(3).weight(), 2);
  EXPECT_TRUE(info.devices(3).healthy());
  EXPECT_EQ(info.operations_size(), 5);
  EXPECT_EQ(info.max_message_bytes(), int64_t{1} << 30);

  v1::GemmRequest request;
  *request.mutable_a() = RandomTensor({127, 33}, rng_);
  *request.mutable_b() = RandomTensor({33, 7}, rng_);
  v1::GemmResponse response;
  grpc::Status status = stub_->Gemm(Context().get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.c().shape_size(), 2);
  const std::vector<double> want =
      reference::Gemm(Doubles(request.a()), Doubles(request.b()), nullptr, 1, 127, 7, 33, false,
                      false, false, false, false, 1, 0);
  EXPECT_EQ(reference::CompareClose(Doubles(response.c()), want, 1e-5,
                                    reference::Rtol(DType::kFloat32, 33)),
            "");
  // Shards in the 1:1:2:2 ratio over the 127 rows, covering them exactly.
  ASSERT_EQ(response.timings().shards_size(), 4);
  int64_t next = 0;
  for (const v1::ShardTiming& shard : response.timings().shards()) {
    EXPECT_EQ(shard.axis(), "rows");
    EXPECT_EQ(shard.begin(), next);
    next = shard.end();
  }
  EXPECT_EQ(next, 127);
  EXPECT_GT(response.timings().server_seconds(), 0);

  v1::EchoRequest echo;
  *echo.mutable_input() = request.a();
  v1::EchoResponse echoed;
  ASSERT_TRUE(stub_->Echo(Context().get(), echo, &echoed).ok());
  EXPECT_EQ(echoed.output().SerializeAsString(), request.a().SerializeAsString());
}

// A request's large operands, as decoded, and its large result (sent from
// its buffer) are kept for the next request (LargeStringCache), not
// allocated and page-faulted in anew each time; the next request's result is
// still its own.
TEST_F(ServerTest, LargeOperandAndResultBuffersAreReused) {
  LargeStringCache& cache = LargeStringCache::Default();
  cache.SetCapacity(int64_t{1} << 30);
  StartServer(ServerOptions());
  constexpr int64_t kRows = 1024;
  constexpr int64_t kCols = 2304;  // 9 MiB of fp32, over LargeStringCache::kMinBytes
  std::vector<int64_t> kept;
  for (int call = 0; call < 3; ++call) {
    v1::TransposeRequest request;
    *request.mutable_input() = RandomTensor({kRows, kCols}, rng_);
    v1::TransposeResponse response;
    grpc::Status status = stub_->Transpose(Context().get(), request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.output().shape_size(), 2);
    EXPECT_EQ(response.output().shape(0), kCols);
    const std::vector<double> in = Doubles(request.input());
    const std::vector<double> out = Doubles(response.output());
    ASSERT_EQ(out.size(), in.size());
    int64_t wrong = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kCols; ++c) wrong += out[c * kRows + r] != in[r * kCols + c];
    }
    EXPECT_EQ(wrong, 0) << "call " << call;
    // The result's buffer goes back once gRPC has sent it, which may be just
    // after the answer arrived.
    const int64_t want = call == 0 ? 2 * kRows * kCols * 4 : kept[0];
    for (absl::Time until = absl::Now() + absl::Seconds(10);
         cache.kept_bytes() < want && absl::Now() < until;) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    kept.push_back(cache.kept_bytes());
  }
  // The operand's and the result's buffers, given back by the first call and
  // taken again (not added to) by the others.
  EXPECT_GE(kept[0], 2 * kRows * kCols * 4);
  EXPECT_EQ(kept[1], kept[0]);
  EXPECT_EQ(kept[2], kept[0]);
  server_.reset();
  cache.SetCapacity(0);
}

TEST_F(ServerTest, ErrorsAndLimits) {
  ServerOptions options;
  options.max_message_bytes = 1 << 20;
  options.max_inflight_bytes = 100000;
  StartServer(options);

  v1::TransposeRequest bad;
  *bad.mutable_input() = RandomTensor({2, 3}, rng_);
  bad.add_perm(0);
  v1::TransposeResponse out;
  grpc::Status status = stub_->Transpose(Context().get(), bad, &out);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(status.error_message(), "perm:")) << status.error_message();

  // A request over max_message_bytes is refused by gRPC itself.
  v1::EchoRequest big;
  *big.mutable_input() = RandomTensor({300000}, rng_);
  v1::EchoResponse echoed;
  status = stub_->Echo(Context().get(), big, &echoed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  // A result that would not fit in a response.
  v1::GemmRequest wide;
  *wide.mutable_a() = RandomTensor({1000, 0}, rng_);
  *wide.mutable_b() = RandomTensor({0, 1000}, rng_);
  v1::GemmResponse c;
  status = stub_->Gemm(Context().get(), wide, &c);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StartsWith(status.error_message(), "c:")) << status.error_message();

  // Alone larger than the in-flight limit (inputs plus output).
  v1::ReduceRequest reduce;
  *reduce.mutable_input() = RandomTensor({30000}, rng_);
  reduce.set_op(v1::SUM);
  v1::ReduceResponse sum;
  status = stub_->Reduce(Context().get(), reduce, &sum);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "--max_inflight_bytes"));

  // Unknown variant and device index, named by the engine.
  v1::ReduceRequest small;
  *small.mutable_input() = RandomTensor({10}, rng_);
  small.set_op(v1::MAX);
  small.mutable_options()->set_variant("warp_shuffle_v9");
  status = stub_->Reduce(Context().get(), small, &sum);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "options.variant"))
      << status.error_message();
  small.mutable_options()->clear_variant();
  small.mutable_options()->add_devices(7);
  status = stub_->Reduce(Context().get(), small, &sum);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "options.devices"))
      << status.error_message();

  const std::string metrics = server_->metrics().Scrape();
  EXPECT_TRUE(absl::StrContains(
      metrics, R"(gpucompute_requests_total{code="INVALID_ARGUMENT",method="Transpose"} 1)"));
  EXPECT_TRUE(absl::StrContains(
      metrics, R"(gpucompute_requests_total{code="RESOURCE_EXHAUSTED",method="Reduce"} 1)"));
}

TEST_F(ServerTest, BatchAnswersEveryItemWithItsOwnStatus) {
  StartServer(ServerOptions());
  auto context = Context();
  std::unique_ptr<grpc::ClientReaderWriter<v1::BatchRequest, v1::BatchResponse>> stream =
      stub_->Batch(context.get());
  constexpr int kItems = 40;
  std::map<std::string, std::vector<double>> want;
  for (int i = 0; i < kItems; ++i) {
    v1::BatchRequest item;
    item.set_id(absl::StrCat("item-", i));
    if (i % 4 == 3) {
      item.mutable_reduce()->set_op(v1::SUM);  // no input: INVALID_ARGUMENT
    } else {
      v1::ReduceRequest* reduce = item.mutable_reduce();
      *reduce->mutable_input() = RandomTensor({7, 33}, rng_);
      reduce->set_op(v1::MAX);
      reduce->set_has_axis(true);
      reduce->set_axis(1);
      want[item.id()] =
          reference::Reduce(Doubles(reduce->input()), 7, 33, 1, reference::ReduceOp::kMax);
    }
    ASSERT_TRUE(stream->Write(item));
  }
  stream->WritesDone();
  std::set<std::string> seen;
  v1::BatchResponse response;
  while (stream->Read(&response)) {
    EXPECT_TRUE(seen.insert(response.id()).second) << "answered twice: " << response.id();
    auto it = want.find(response.id());
    if (it == want.end()) {
      EXPECT_EQ(response.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      EXPECT_TRUE(absl::StartsWith(response.message(), "input:")) << response.message();
      EXPECT_FALSE(response.has_reduce());
    } else {
      EXPECT_EQ(response.code(), 0) << response.message();
      ASSERT_TRUE(response.has_reduce());
      EXPECT_EQ(Doubles(response.reduce().output()), it->second);
    }
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(seen.size(), static_cast<size_t>(kItems));
}

TEST_F(ServerTest, BatchReadAheadIsBoundedByBytesAndEveryItemIsAnswered) {
  ServerOptions options;
  options.max_inflight_bytes = 100 * 1024;  // about two items at a time
  StartServer(options);
  auto context = Context();
  auto stream = stub_->Batch(context.get());
  constexpr int kItems = 50;
  std::map<std::string, std::vector<double>> want;
  for (int i = 0; i < kItems; ++i) {
    v1::BatchRequest item;
    item.set_id(absl::StrCat("item-", i));
    v1::ReduceRequest* reduce = item.mutable_reduce();
    *reduce->mutable_input() = RandomTensor({10000}, rng_);  // 40 KB
    reduce->set_op(v1::SUM);
    want[item.id()] =
        reference::Reduce(Doubles(reduce->input()), 1, 10000, 1, reference::ReduceOp::kSum);
    ASSERT_TRUE(stream->Write(item));
  }
  stream->WritesDone();
  int answered = 0;
  v1::BatchResponse response;
  while (stream->Read(&response)) {
    ++answered;
    ASSERT_EQ(response.code(), 0) << response.message();
    const std::vector<double> got = Doubles(response.reduce().output());
    ASSERT_EQ(got.size(), 1u);
    EXPECT_NEAR(got[0], want.at(response.id())[0],
                1e-3 * (1 + std::abs(want.at(response.id())[0])));
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(answered, kItems);
}

TEST_F(ServerTest, BatchRefusesAnOverlongIdAndGoesOn) {
  StartServer(ServerOptions());
  auto context = Context();
  auto stream = stub_->Batch(context.get());
  v1::BatchRequest bad;
  bad.set_id(std::string(5000, 'x'));
  *bad.mutable_reduce()->mutable_input() = RandomTensor({3}, rng_);
  bad.mutable_reduce()->set_op(v1::SUM);
  v1::BatchRequest good = bad;
  good.set_id("good");
  ASSERT_TRUE(stream->Write(bad));
  ASSERT_TRUE(stream->Write(good));
  stream->WritesDone();
  std::map<std::string, v1::BatchResponse> answers;
  v1::BatchResponse response;
  while (stream->Read(&response)) answers[response.id()] = response;
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_EQ(answers.size(), 2u);
  const v1::BatchResponse& refused = answers.at(std::string(1024, 'x'));
  EXPECT_EQ(refused.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_TRUE(absl::StartsWith(refused.message(), "id:")) << refused.message();
  EXPECT_EQ(answers.at("good").code(), 0) << answers.at("good").message();
}

TEST_F(ServerTest, ExpiredDeadline) {
  StartServer(ServerOptions());
  v1::GemmRequest request;
  *request.mutable_a() = RandomTensor({400, 400}, rng_);
  *request.mutable_b() = RandomTensor({400, 400}, rng_);
  v1::GemmResponse response;
  grpc::Status status = stub_->Gemm(Context(absl::Microseconds(1)).get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server keeps serving.
  status = stub_->Gemm(Context().get(), request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// A call of `path` whose client sends its headers, waits `delay`, then sends
// its one request message and half-closes (the server starts reading when the
// headers arrive).
class LateRequest final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  LateRequest(grpc::GenericStub& stub, const std::string& path, const std::string& request,
              absl::Duration delay) {
    grpc::Slice slice(request);
    request_ = grpc::ByteBuffer(&slice, 1);
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    stub.PrepareBidiStreamingCall(&context_, path, grpc::StubOptions(), this);
    StartRead(&response_);
    StartCall();
    absl::SleepFor(delay);
    StartWriteLast(&request_, grpc::WriteOptions());
  }

  // The call's status, and its one answer's bytes into `*response`.
  grpc::Status Await(std::string* response) {
    done_.WaitForNotification();
    std::vector<grpc::Slice> slices;
    if (status_.ok() && response_.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        response->append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    return status_;
  }

  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer request_, response_;
  grpc::Status status_;
  absl::Notification done_;
};

// The value of the metric line that starts with `name` ("name{labels}"), or
// -1 when there is none.
double MetricValue(const std::string& text, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, name + " ")) {
      double value = -1;
      if (absl::SimpleAtod(line.substr(name.size() + 1), &value)) return value;
    }
  }
  return -1;
}

// Large operands of unary operations are decoded into the request arena
// (--request_staging_bytes) and read from there: the results are right, the
// blocks go back after each call, a tensor the arena has no room for is
// decoded as usual, and Echo (whose tensor goes back in its message) never
// uses it. Several calls at once share the arena, and so do Batch items.
TEST_F(ServerTest, LargeOperandsAreDecodedIntoTheRequestArena) {
  ServerOptions options;
  options.cpu_devices = 3;
  options.request_staging_bytes = 12 << 20;
  StartServer(options);
  ASSERT_NE(server_->request_arena(), nullptr);
  EXPECT_EQ(server_->request_arena()->capacity(), size_t{12} << 20);
  const std::string staged = "gpucompute_request_arena_bytes_total{result=\"staged\"}";
  const std::string missed = "gpucompute_request_arena_bytes_total{result=\"missed\"}";
  auto value = [&](const std::string& name) {
    return std::max(0.0, MetricValue(server_->metrics().Scrape(), name));
  };

  // a: 1025 x 700 fp32 (2.7 MiB, staged); b: 700 x 97 (265 KiB, a string);
  // c: 1025 x 97 (388 KiB) with beta.
  auto gemm = [&](int64_t m, int64_t k, int64_t n) {
    v1::GemmRequest request;
    *request.mutable_a() = RandomTensor({m, k}, rng_);
    *request.mutable_b() = RandomTensor({k, n}, rng_);
    *request.mutable_c() = RandomTensor({m, n}, rng_);
    request.set_alpha(0.5);
    request.set_beta(-2);
    v1::GemmResponse response;
    grpc::Status status = stub_->Gemm(Context().get(), request, &response);
    if (!status.ok()) return absl::StrCat("status: ", status.error_message());
    const std::vector<double> c = Doubles(request.c());
    const std::vector<double> want =
        reference::Gemm(Doubles(request.a()), Doubles(request.b()), &c, 1, m, n, k, false, false,
                        false, false, false, 0.5, -2);
    // Products near zero (alpha * AB cancelling beta * C) are held to the
    // terms' scale, as the CLI's tests are.
    const double rtol = reference::Rtol(DType::kFloat32, k);
    return reference::CompareClose(Doubles(response.c()), want, 6 * rtol, rtol);
  };
  EXPECT_EQ(gemm(1025, 700, 97), "");
  EXPECT_EQ(value(staged), 1025 * 700 * 4);
  EXPECT_EQ(value(missed), 0);
  EXPECT_EQ(server_->request_arena()->used_bytes(), 0u);

  // A transpose of 16 MiB: more than the arena holds, decoded as usual.
  {
    v1::TransposeRequest request;
    *request.mutable_input() = RandomTensor({2048, 2048}, rng_);
    v1::TransposeResponse response;
    ASSERT_TRUE(stub_->Transpose(Context().get(), request, &response).ok());
    const std::vector<double> in = Doubles(request.input()), out = Doubles(response.output());
    ASSERT_EQ(out.size(), in.size());
    int64_t wrong = 0;
    for (int64_t r = 0; r < 2048; ++r) {
      for (int64_t c = 0; c < 2048; ++c) wrong += out[c * 2048 + r] != in[r * 2048 + c];
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(value(missed), 2048 * 2048 * 4);
  }

  // Echo keeps its tensor in the message.
  {
    v1::EchoRequest echo;
    *echo.mutable_input() = RandomTensor({1024, 512}, rng_);
    v1::EchoResponse echoed;
    ASSERT_TRUE(stub_->Echo(Context().get(), echo, &echoed).ok());
    EXPECT_EQ(echoed.output().data(), echo.input().data());
  }

  // Eight callers at once, each with 2 x 2 MiB operands: the arena (12 MiB)
  // holds some at a time, the others decode as usual; every result is right.
  const double staged_before = value(staged), missed_before = value(missed);
  std::vector<std::string> errors(8);
  std::vector<std::thread> callers;
  for (int i = 0; i < 8; ++i) {
    callers.emplace_back([&, i] {
      for (int round = 0; round < 3 && errors[i].empty(); ++round) errors[i] = gemm(512, 1024, 512);
    });
  }
  for (std::thread& t : callers) t.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  // Every large operand went one way or the other: 8 x 3 calls, a and b of
  // 2 MiB each and c of 1 MiB.
  EXPECT_EQ(value(staged) - staged_before + value(missed) - missed_before,
            8 * 3 * (2 * (512 * 1024 * 4) + 512 * 512 * 4));
  EXPECT_GT(value(staged), staged_before);
  EXPECT_EQ(server_->request_arena()->used_bytes(), 0u);

  // Batch items too: 12 reductions of 1024 x 512 (2 MiB each), answered
  // right, every input through the arena or counted as missed.
  {
    const double staged_at = value(staged), missed_at = value(missed);
    auto context = Context();
    auto stream = stub_->Batch(context.get());
    std::map<std::string, std::vector<double>> want;
    for (int i = 0; i < 12; ++i) {
      v1::BatchRequest item;
      item.set_id(absl::StrCat("item-", i));
      v1::ReduceRequest* reduce = item.mutable_reduce();
      *reduce->mutable_input() = RandomTensor({1024, 512}, rng_);
      reduce->set_op(v1::MAX);
      reduce->set_has_axis(true);
      reduce->set_axis(1);
      want[item.id()] =
          reference::Reduce(Doubles(reduce->input()), 1024, 512, 1, reference::ReduceOp::kMax);
      ASSERT_TRUE(stream->Write(item));
    }
    stream->WritesDone();
    v1::BatchResponse response;
    int answered = 0;
    while (stream->Read(&response)) {
      ++answered;
      EXPECT_EQ(response.code(), 0) << response.message();
      EXPECT_EQ(Doubles(response.reduce().output()), want[response.id()]) << response.id();
    }
    EXPECT_TRUE(stream->Finish().ok());
    EXPECT_EQ(answered, 12);
    EXPECT_EQ(value(staged) - staged_at + value(missed) - missed_at, 12 * (1024 * 512 * 4));
    EXPECT_GT(value(staged), staged_at);
    EXPECT_EQ(server_->request_arena()->used_bytes(), 0u);
  }

  // A handle with bytes beside it is refused whether or not they were staged.
  v1::GemmRequest both;
  *both.mutable_a() = RandomTensor({512, 1024}, rng_);
  both.mutable_a()->set_handle("t-none");
  *both.mutable_b() = RandomTensor({1024, 4}, rng_);
  v1::GemmResponse refused;
  grpc::Status status = stub_->Gemm(Context().get(), both, &refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "a.data")) << status.error_message();
  EXPECT_EQ(server_->request_arena()->used_bytes(), 0u);
}

// The CPU backend has no request arena unless asked for one.
TEST_F(ServerTest, TheCpuBackendHasNoRequestArenaByDefault) {
  StartServer(ServerOptions());
  EXPECT_EQ(server_->request_arena(), nullptr);
}

// A request whose bytes come late: the wait is its receive stage, in its
// timings and the stage histogram, not its queue (it was admitted at once).
TEST_F(ServerTest, TimingsTellReceivingTheRequestFromQueueing) {
  StartServer(ServerOptions());
  const std::string count = R"(gpucompute_stage_duration_seconds_count{stage="receive"})";
  const std::string sum = R"(gpucompute_stage_duration_seconds_sum{stage="receive"})";
  const std::string before = server_->metrics().Scrape();
  v1::GemmRequest request;
  *request.mutable_a() = RandomTensor({64, 48}, rng_);
  *request.mutable_b() = RandomTensor({48, 32}, rng_);
  grpc::GenericStub stub(channel_);
  LateRequest call(stub, "/gpucompute.v1.Compute/Gemm", request.SerializeAsString(),
                   absl::Milliseconds(400));
  std::string bytes;
  grpc::Status status = call.Await(&bytes);
  ASSERT_TRUE(status.ok()) << status.error_message();
  v1::GemmResponse response;
  ASSERT_TRUE(response.ParseFromString(bytes));
  ASSERT_EQ(response.c().shape_size(), 2);
  const v1::Timings& t = response.timings();
  EXPECT_GE(t.receive_seconds(), 0.35) << t.DebugString();
  EXPECT_LT(t.queue_seconds(), 0.2) << t.DebugString();
  EXPECT_LE(t.queue_seconds() + t.receive_seconds() + t.decode_seconds() +
                t.host_to_device_seconds() + t.kernel_seconds() + t.device_to_host_seconds() +
                t.encode_seconds(),
            t.server_seconds() + 1e-6)
      << t.DebugString();
  const std::string after = server_->metrics().Scrape();
  EXPECT_EQ(MetricValue(after, count) - std::max(0.0, MetricValue(before, count)), 1) << after;
  EXPECT_GE(MetricValue(after, sum) - std::max(0.0, MetricValue(before, sum)), 0.35) << after;

  // Sent at once, the same request's receive is short and counted too.
  v1::GemmResponse prompt;
  ASSERT_TRUE(stub_->Gemm(Context().get(), request, &prompt).ok());
  EXPECT_GE(prompt.timings().receive_seconds(), 0);
  EXPECT_LT(prompt.timings().receive_seconds(), 0.35);
  EXPECT_EQ(MetricValue(server_->metrics().Scrape(), count) - MetricValue(after, count), 1);
}

// Health Check over a generic stub (no generated health stubs needed).
grpc::Status HealthCheck(grpc::Channel* channel, const std::string& service,
                         std::string* response_bytes) {
  grpc::GenericStub stub(channel->shared_from_this());
  std::string request;
  if (!service.empty()) {
    request.push_back('\x0a');
    request.push_back(static_cast<char>(service.size()));
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &in, &out,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  std::vector<grpc::Slice> slices;
  if (status.ok() && out.Dump(&slices).ok()) {
    response_bytes->clear();
    for (const grpc::Slice& s : slices) {
      response_bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return status;
}

TEST_F(ServerTest, HealthServingAndDrainAnswersInFlightAndRefusesNew) {
  StartServer(ServerOptions());
  std::string health;
  ASSERT_TRUE(HealthCheck(channel_.get(), "", &health).ok());
  EXPECT_EQ(health, std::string("\x08\x01", 2));  // SERVING
  ASSERT_TRUE(HealthCheck(channel_.get(), "gpucompute.v1.Compute", &health).ok());
  EXPECT_EQ(health, std::string("\x08\x01", 2));

  // A slow request (the naive GEMM, 0.1 to 1 s) in flight when the
  // drain starts: the window in which new calls must be refused.
  v1::GemmRequest slow;
  *slow.mutable_a() = RandomTensor({1600, 1600}, rng_);
  *slow.mutable_b() = RandomTensor({1600, 1600}, rng_);
  slow.mutable_options()->set_variant("naive");
  grpc::Status slow_status;
  v1::GemmResponse slow_response;
  std::thread client([&] { slow_status = stub_->Gemm(Context().get(), slow, &slow_response); });
  while (!absl::StrContains(server_->metrics().Scrape(), "gpucompute_inflight_requests 1")) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  std::thread stopper([&] { server_->Shutdown(); });
  // New calls are answered UNAVAILABLE while the slow one finishes.
  grpc::Status refused;
  for (int i = 0; i < 1000; ++i) {
    v1::EchoRequest echo;
    *echo.mutable_input() = RandomTensor({4}, rng_);
    v1::EchoResponse echoed;
    refused = stub_->Echo(Context().get(), echo, &echoed);
    if (!refused.ok()) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "shutting down"))
      << refused.error_message();
  // EXPECT, not ASSERT: the threads below must be joined either way.
  EXPECT_TRUE(HealthCheck(channel_.get(), "gpucompute.v1.Compute", &health).ok());
  EXPECT_EQ(health, std::string("\x08\x02", 2));  // NOT_SERVING
  client.join();
  stopper.join();
  EXPECT_TRUE(slow_status.ok()) << slow_status.error_message();
  EXPECT_EQ(slow_response.c().shape_size(), 2);
  server_->Wait();  // returns at once after Shutdown
}

// A CPU device that fails its GEMMs for good, as a GPU with a sticky error:
// the first failure marks it unhealthy.
class DyingDevice : public testing::ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  bool healthy() const override { return healthy_.load(); }
  absl::StatusOr<ShardRun> Gemm(const GemmSpec& spec, Range rows, OutputView out) override {
    healthy_ = false;
    return absl::InternalError("device lost");
  }

 private:
  std::atomic<bool> healthy_{true};
};

// Two CPU devices; the first `dying` of them are DyingDevices.
DeviceSet DevicesWithDying(int dying) {
  BackendOptions backend;
  backend.backend = "cpu";
  backend.cpu_devices = 2;
  absl::StatusOr<DeviceSet> set = CreateDevices(backend);
  EXPECT_TRUE(set.ok()) << set.status();
  for (int i = 0; i < dying; ++i) {
    set->devices[i] = std::make_unique<DyingDevice>(std::move(set->devices[i]));
  }
  return *std::move(set);
}

// Devices are numbered by their position, one index space for the engine,
// the timings and the metrics.
TEST(ServerCreateTest, DevicesOutOfTheirPositionsAreRefused) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  DeviceSet swapped = DevicesWithDying(0);
  std::swap(swapped.devices[0], swapped.devices[1]);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options, std::move(swapped));
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(server.status().message(), "expected its position"))
      << server.status();
  EXPECT_TRUE(Server::Create(options, DevicesWithDying(0)).ok());
}

class DeviceFailureTest : public ServerTest {
 protected:
  void StartOver(DeviceSet devices) {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "";
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options, std::move(devices));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_TRUE(server_->Start().ok());
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Compute::NewStub(channel_);
  }

  grpc::Status Gemm(v1::GemmResponse* response) {
    v1::GemmRequest request;
    *request.mutable_a() = RandomTensor({64, 9}, rng_);
    *request.mutable_b() = RandomTensor({9, 5}, rng_);
    return stub_->Gemm(Context().get(), request, response);
  }

  std::string Health() {
    std::string health;
    EXPECT_TRUE(HealthCheck(channel_.get(), "gpucompute.v1.Compute", &health).ok());
    return health;
  }
};

TEST_F(DeviceFailureTest, AFailedDeviceSendsWorkToTheOthersAndHealthStaysServing) {
  StartOver(DevicesWithDying(1));
  v1::GemmResponse response;
  grpc::Status status = Gemm(&response);  // split over both: device 0 fails for good
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL) << status.error_message();
  EXPECT_EQ(status.error_message(), "device lost");
  EXPECT_EQ(Health(), std::string("\x08\x01", 2));  // SERVING: device 1 is left

  status = Gemm(&response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.timings().shards_size(), 1);
  EXPECT_EQ(response.timings().shards(0).device(), 1);
  v1::ServerInfoResponse info;
  ASSERT_TRUE(stub_->GetServerInfo(Context().get(), v1::ServerInfoRequest(), &info).ok());
  ASSERT_EQ(info.devices_size(), 2);
  EXPECT_FALSE(info.devices(0).healthy());
  EXPECT_TRUE(info.devices(1).healthy());
}

TEST_F(DeviceFailureTest, HealthTurnsNotServingWhenNoDeviceIsLeft) {
  StartOver(DevicesWithDying(2));
  EXPECT_EQ(Health(), std::string("\x08\x01", 2));  // SERVING
  v1::GemmResponse response;
  grpc::Status status = Gemm(&response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL) << status.error_message();
  EXPECT_EQ(Health(), std::string("\x08\x02", 2));  // NOT_SERVING
  status = Gemm(&response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "no healthy device"))
      << status.error_message();
}

}  // namespace
}  // namespace gpucompute
