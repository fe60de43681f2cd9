// Malformed requests are answered INVALID_ARGUMENT naming the field; requests
// over the limits RESOURCE_EXHAUSTED; the server keeps serving.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

struct BadCase {
  std::string name;
  std::string field;  // the message must contain it
  std::function<absl::Status(const Client&)> call;
};

template <typename Request, typename Call>
std::function<absl::Status(const Client&)> Send(Request request, Call call) {
  return [request, call](const Client& client) { return (client.*call)(request, {}).status(); };
}

v1::GemmRequest Gemm() { return MakeGemm(v1::FLOAT32, {.m = 7, .n = 5, .k = 3}); }
v1::GemvRequest Gemv() { return MakeGemv(v1::FLOAT32, {.m = 7, .k = 5}); }
v1::AttentionRequest Attention() {
  return MakeAttention(v1::FLOAT16, {.heads_q = 2, .heads_kv = 1, .seq_q = 3, .seq_kv = 5});
}

std::vector<BadCase> Cases() {
  std::vector<BadCase> cases;
  auto gemm = [&](std::string name, std::string field, std::function<void(v1::GemmRequest&)> f) {
    v1::GemmRequest r = Gemm();
    f(r);
    cases.push_back({std::move(name), std::move(field), Send(r, &Client::Gemm)});
  };
  gemm("gemm_missing_a", "a", [](auto& r) { r.clear_a(); });
  gemm("gemm_unspecified_dtype", "a.dtype",
       [](auto& r) { r.mutable_a()->set_dtype(v1::DTYPE_UNSPECIFIED); });
  gemm("gemm_unknown_dtype_value", "a.dtype",
       [](auto& r) { r.mutable_a()->set_dtype(static_cast<v1::DType>(42)); });
  gemm("gemm_mismatched_dtype", "b.dtype", [](auto& r) {
    *r.mutable_b() = RandomTensor(v1::FLOAT16, {3, 5}, Rng());
  });
  gemm("gemm_rank_1", "a.shape",
       [](auto& r) { *r.mutable_a() = RandomTensor(v1::FLOAT32, {21}, Rng()); });
  gemm("gemm_rank_4", "a.shape", [](auto& r) {
    *r.mutable_a() = RandomTensor(v1::FLOAT32, {1, 1, 7, 3}, Rng());
  });
  gemm("gemm_negative_dim", "a.shape", [](auto& r) { r.mutable_a()->set_shape(0, -7); });
  gemm("gemm_shape_overflow", "a.shape", [](auto& r) {
    r.mutable_a()->set_shape(0, int64_t{1} << 40);
    r.mutable_a()->set_shape(1, int64_t{1} << 40);
  });
  gemm("gemm_short_data", "a.data", [](auto& r) { r.mutable_a()->mutable_data()->pop_back(); });
  gemm("gemm_inner_mismatch", "b.shape", [](auto& r) {
    *r.mutable_b() = RandomTensor(v1::FLOAT32, {4, 5}, Rng());
  });
  gemm("gemm_batch_mismatch", "b.shape", [](auto& r) {
    *r.mutable_a() = RandomTensor(v1::FLOAT32, {2, 7, 3}, Rng());
    *r.mutable_b() = RandomTensor(v1::FLOAT32, {3, 3, 5}, Rng());
  });
  gemm("gemm_beta_without_c", "c", [](auto& r) { r.set_beta(1); });
  gemm("gemm_c_wrong_shape", "c", [](auto& r) {
    r.set_beta(1);
    *r.mutable_c() = RandomTensor(v1::FLOAT32, {5, 7}, Rng());
  });
  gemm("gemm_unknown_variant", "options.variant",
       [](auto& r) { r.mutable_options()->set_variant("warp-drive"); });
  gemm("gemm_device_out_of_range", "options.devices",
       [](auto& r) { r.mutable_options()->add_devices(1000); });
  gemm("gemm_negative_device", "options.devices",
       [](auto& r) { r.mutable_options()->add_devices(-1); });
  gemm("gemm_bad_output_dtype", "options.output_dtype",
       [](auto& r) { r.mutable_options()->set_output_dtype(static_cast<v1::DType>(9)); });

  auto gemv = [&](std::string name, std::string field, std::function<void(v1::GemvRequest&)> f) {
    v1::GemvRequest r = Gemv();
    f(r);
    cases.push_back({std::move(name), std::move(field), Send(r, &Client::Gemv)});
  };
  gemv("gemv_missing_x", "x", [](auto& r) { r.clear_x(); });
  gemv("gemv_x_length", "x.shape",
       [](auto& r) { *r.mutable_x() = RandomTensor(v1::FLOAT32, {6}, Rng()); });
  gemv("gemv_too_many_columns", "x.shape", [](auto& r) {
    *r.mutable_x() = RandomTensor(v1::FLOAT32, {5, 9}, Rng());
  });
  gemv("gemv_a_rank_3", "a.shape", [](auto& r) {
    *r.mutable_a() = RandomTensor(v1::FLOAT32, {1, 7, 5}, Rng());
  });
  gemv("gemv_beta_without_y", "y", [](auto& r) { r.set_beta(2); });

  auto reduce = [&](std::string name, std::string field,
                    std::function<void(v1::ReduceRequest&)> f) {
    v1::ReduceRequest r = MakeReduce(v1::BFLOAT16, {7, 5}, v1::SUM);
    f(r);
    cases.push_back({std::move(name), std::move(field), Send(r, &Client::Reduce)});
  };
  reduce("reduce_missing_input", "input", [](auto& r) { r.clear_input(); });
  reduce("reduce_unspecified_op", "op", [](auto& r) { r.set_op(v1::REDUCE_OP_UNSPECIFIED); });
  reduce("reduce_axis_too_large", "axis", [](auto& r) {
    r.set_has_axis(true);
    r.set_axis(2);
  });
  reduce("reduce_axis_too_small", "axis", [](auto& r) {
    r.set_has_axis(true);
    r.set_axis(-3);
  });
  reduce("reduce_max_of_nothing", "input", [](auto& r) {
    *r.mutable_input() = RandomTensor(v1::BFLOAT16, {0, 5}, Rng());
    r.set_op(v1::MAX);
  });
  reduce("reduce_long_data", "input.data",
         [](auto& r) { r.mutable_input()->mutable_data()->append("xx"); });

  auto transpose = [&](std::string name, std::string field,
                       std::function<void(v1::TransposeRequest&)> f) {
    v1::TransposeRequest r = MakeTranspose(v1::FLOAT32, {2, 3, 4});
    f(r);
    cases.push_back({std::move(name), std::move(field), Send(r, &Client::Transpose)});
  };
  transpose("transpose_perm_repeats", "perm", [](auto& r) {
    for (int p : {0, 1, 1}) r.add_perm(p);
  });
  transpose("transpose_perm_out_of_range", "perm", [](auto& r) {
    for (int p : {0, 1, 3}) r.add_perm(p);
  });
  transpose("transpose_perm_size", "perm", [](auto& r) {
    for (int p : {1, 0}) r.add_perm(p);
  });
  transpose("transpose_rank_5", "input.shape", [](auto& r) {
    *r.mutable_input() = RandomTensor(v1::FLOAT32, {1, 2, 1, 2, 1}, Rng());
  });
  transpose("transpose_rank_0", "input.shape",
            [](auto& r) { *r.mutable_input() = RandomTensor(v1::FLOAT32, {}, Rng()); });

  auto attention = [&](std::string name, std::string field,
                       std::function<void(v1::AttentionRequest&)> f) {
    v1::AttentionRequest r = Attention();
    f(r);
    cases.push_back({std::move(name), std::move(field), Send(r, &Client::Attention)});
  };
  attention("attention_missing_v", "v", [](auto& r) { r.clear_v(); });
  attention("attention_rank_3", "q.shape", [](auto& r) {
    *r.mutable_q() = RandomTensor(v1::FLOAT16, {2, 3, 64}, Rng());
  });
  attention("attention_head_dim_60", "q.shape", [](auto& r) {  // not a multiple of 8
    *r.mutable_q() = RandomTensor(v1::FLOAT16, {1, 2, 3, 60}, Rng());
    *r.mutable_k() = RandomTensor(v1::FLOAT16, {1, 1, 5, 60}, Rng());
    *r.mutable_v() = RandomTensor(v1::FLOAT16, {1, 1, 5, 60}, Rng());
  });
  attention("attention_head_dim_264", "q.shape", [](auto& r) {  // past 256
    *r.mutable_q() = RandomTensor(v1::FLOAT16, {1, 2, 3, 264}, Rng());
    *r.mutable_k() = RandomTensor(v1::FLOAT16, {1, 1, 5, 264}, Rng());
    *r.mutable_v() = RandomTensor(v1::FLOAT16, {1, 1, 5, 264}, Rng());
  });
  attention("attention_hq_not_multiple", "q.shape", [](auto& r) {
    *r.mutable_q() = RandomTensor(v1::FLOAT16, {1, 3, 3, 64}, Rng());
    *r.mutable_k() = RandomTensor(v1::FLOAT16, {1, 2, 5, 64}, Rng());
    *r.mutable_v() = RandomTensor(v1::FLOAT16, {1, 2, 5, 64}, Rng());
  });
  attention("attention_v_shape", "v.shape", [](auto& r) {
    *r.mutable_v() = RandomTensor(v1::FLOAT16, {1, 1, 4, 64}, Rng());
  });
  attention("attention_k_dtype", "k.dtype", [](auto& r) {
    *r.mutable_k() = RandomTensor(v1::BFLOAT16, {1, 1, 5, 64}, Rng());
  });
  attention("attention_negative_scale", "scale", [](auto& r) { r.set_scale(-1); });

  {
    v1::EchoRequest r = MakeEcho(v1::FLOAT32, {3});
    r.mutable_input()->set_dtype(v1::DTYPE_UNSPECIFIED);
    cases.push_back({"echo_unspecified_dtype", "input.dtype", Send(r, &Client::Echo)});
    r = MakeEcho(v1::FLOAT32, {3});
    r.mutable_input()->set_data("abc");
    cases.push_back({"echo_bad_length", "input.data", Send(r, &Client::Echo)});
    r.clear_input();
    cases.push_back({"echo_missing_input", "input", Send(r, &Client::Echo)});
  }
  return cases;
}

TEST(ValidationTest, BadInputsNameTheField) {
  auto server = ServerProcess::Start({"--cpu_devices=2"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = (*server)->NewClient(absl::Seconds(20));
  for (const BadCase& c : Cases()) {
    SCOPED_TRACE(c.name);
    absl::Status status = c.call(*client);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), c.field))
        << "message does not name " << c.field << ": " << status.message();
  }
  // Nothing above broke the server.
  v1::GemmRequest good = Gemm();
  auto response = client->Gemm(good);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_TRUE(Passes(CheckGemm(good, *response)));
  EXPECT_EQ(client->Health().value_or(ServingStatus{}),
            grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST(ValidationTest, LongStringsAreCutInErrors) {
  auto server = ServerProcess::Start({"--cpu_devices=2"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = (*server)->NewClient(absl::Seconds(20));
  // A variant name past gRPC's 8 KiB metadata limit, and one of 1 MB: each
  // is quoted as its first 256 bytes and its length.
  for (size_t bytes : {size_t{8200}, size_t{1} << 20}) {
    SCOPED_TRACE(bytes);
    v1::GemmRequest gemm = Gemm();
    gemm.mutable_options()->set_variant(std::string(bytes, 'v'));
    absl::Status status = client->Gemm(gemm).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status.message().substr(0, 400);
    EXPECT_LT(status.message().size(), 1024u) << status.message().substr(0, 400);
    EXPECT_TRUE(absl::StrContains(status.message(), "options.variant")) << status.message();
    EXPECT_TRUE(absl::StrContains(status.message(),
                                  absl::StrCat(std::string(256, 'v'), "...\" (", bytes, " bytes)")))
        << status.message();
    EXPECT_FALSE(absl::StrContains(status.message(), std::string(257, 'v')));
  }
  // A handle: the same.
  v1::TransposeRequest transpose = MakeTranspose(v1::FLOAT32, {3, 4});
  *transpose.mutable_input() = HandleTensor(std::string(100000, 'h'));
  absl::Status status = client->Transpose(transpose).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status.message().substr(0, 400);
  EXPECT_LT(status.message().size(), 1024u);
  EXPECT_TRUE(absl::StrContains(status.message(), "(100000 bytes)")) << status.message();
}

TEST(ValidationTest, OversizeMessageIsResourceExhausted) {
  auto server = ServerProcess::Start({"--max_message_bytes=1048576"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = (*server)->NewClient(absl::Seconds(20));
  auto info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->max_message_bytes(), 1048576);

  auto big = client->Echo(MakeEcho(v1::FLOAT32, {300000}));  // 1.2 MB
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();
  // A small request still works.
  v1::EchoRequest small = MakeEcho(v1::FLOAT32, {1000});
  auto echo = client->Echo(small);
  ASSERT_TRUE(echo.ok()) << echo.status();
  EXPECT_TRUE(Passes(CheckEcho(small, *echo)));
  // A request that fits but whose result would not: a 600x600 output (1.4 MB)
  // from 600x1 and 1x600 inputs.
  auto gemm = client->Gemm(MakeGemm(v1::FLOAT32, {.m = 600, .n = 600, .k = 1}));
  EXPECT_EQ(gemm.status().code(), absl::StatusCode::kResourceExhausted) << gemm.status();
}

TEST(ValidationTest, OverTheInflightLimitIsResourceExhausted) {
  auto server = ServerProcess::Start({"--max_inflight_bytes=100000"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = (*server)->NewClient(absl::Seconds(20));
  // Inputs plus output of 200 KB can never be admitted under a 100 KB limit.
  auto gemm = client->Gemm(MakeGemm(v1::FLOAT32, {.m = 100, .n = 100, .k = 100}));
  EXPECT_EQ(gemm.status().code(), absl::StatusCode::kResourceExhausted) << gemm.status();
  v1::GemmRequest small = MakeGemm(v1::FLOAT32, {.m = 33, .n = 33, .k = 7});
  auto ok = client->Gemm(small);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(Passes(CheckGemm(small, *ok)));
}

// A call that waits for room until its deadline hears RESOURCE_EXHAUSTED
// (room may come later: retry) rather than its own DEADLINE_EXCEEDED: the
// server stops waiting a little before the client's deadline, whose clock
// runs a little ahead of the server's.
TEST(ValidationTest, RefusedAtTheAdmissionDeadlineIsResourceExhausted) {
  // 4000x4000x2000 fp32 GEMMs (128 MB in flight each; their 64 MB of operands
  // go inline, under the client's offload size), one after another, hold
  // most of a 140 MB limit; a 2000x2000x1 one (16 MB of output from a small
  // request, quick to receive) must wait while one runs. The big ones run
  // the "naive" variant: seconds each on a CPU backend however fast its
  // cores, far past the small call's 400 ms deadline (with OpenBLAS a fast
  // host finishes one in about that).
  auto server =
      ServerProcess::Start({"--max_inflight_bytes=140000000", "--max_message_bytes=300000000"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto holder = (*server)->NewClient(absl::Seconds(120));
  ASSERT_TRUE(holder->GetServerInfo().ok());
  v1::GemmRequest big = MakeGemm(v1::FLOAT32, {.m = 4000, .n = 4000, .k = 2000});
  big.mutable_options()->set_variant("naive");
  std::atomic<bool> held_done{false};
  std::thread hold([&] {
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(holder->Gemm(big).ok());
    held_done = true;
  });
  auto waiter = (*server)->NewClient(absl::Milliseconds(400));
  const v1::GemmRequest small = MakeGemm(v1::FLOAT32, {.m = 2000, .n = 2000, .k = 1});
  int refused = 0, expired = 0, calls = 0;
  while (!held_done) {
    ++calls;
    const absl::Status status = waiter->Gemm(small).status();
    if (status.code() == absl::StatusCode::kResourceExhausted) ++refused;
    if (status.code() == absl::StatusCode::kDeadlineExceeded) ++expired;
    EXPECT_TRUE(status.ok() || status.code() == absl::StatusCode::kResourceExhausted ||
                status.code() == absl::StatusCode::kDeadlineExceeded)
        << status;
  }
  hold.join();
  if (refused == 0 && DevicesOverridden()) {
    GTEST_SKIP() << "the devices of GPUCOMPUTE_TEST_SERVER_ARGS ran each big GEMM in less than "
                    "the small one's deadline: nothing to wait for ("
                 << calls << " calls)";
  }
  EXPECT_GT(refused, 0) << "the small GEMM never waited for a big one (" << calls << " calls)";
  // Almost all: on a machine whose cores the big GEMMs keep busy, an answer
  // can still come late now and then (before the server stopped waiting
  // early, 10 of 12 came as DEADLINE_EXCEEDED here; after, 1 of 13).
  EXPECT_LE(expired * 4, refused) << "refusals reached the client as DEADLINE_EXCEEDED: " << expired
                                  << ", as RESOURCE_EXHAUSTED: " << refused << " (" << calls
                                  << " calls)";
  std::printf("[ admission ] %d calls while the big GEMMs ran: %d RESOURCE_EXHAUSTED, %d late\n",
              calls, refused, expired);
}

TEST(ValidationTest, BadFlagsStopTheServerNamingTheFlag) {
  for (const char* flag : {"--retain_host_memory_bytes=-1", "--device_max_inflight_bytes=-2"}) {
    SCOPED_TRACE(flag);
    auto server = ServerProcess::Start({flag});
    ASSERT_FALSE(server.ok());
    const std::string name(flag, std::string_view(flag).find('='));
    EXPECT_TRUE(absl::StrContains(server.status().message(), name)) << server.status();
  }
}

TEST(ValidationTest, OverADeviceBoundIsResourceExhaustedNamingTheFlag) {
  auto server = ServerProcess::Start({"--device_max_inflight_bytes=100000"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = (*server)->NewClient(absl::Seconds(20));
  auto info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_GT(info->devices_size(), 0);
  for (const v1::DeviceInfo& device : info->devices()) {
    EXPECT_EQ(device.max_inflight_bytes(), 100000) << "device " << device.index();
  }
  // Every shard of a 200^3 fp32 GEMM holds all of B (160 KB): over the bound
  // on any number of devices, while the server-wide limit (4 GiB) admits it.
  auto gemm = client->Gemm(MakeGemm(v1::FLOAT32, {.m = 200, .n = 200, .k = 200}));
  EXPECT_EQ(gemm.status().code(), absl::StatusCode::kResourceExhausted) << gemm.status();
  EXPECT_TRUE(absl::StrContains(gemm.status().message(), "--device_max_inflight_bytes"))
      << gemm.status();
  v1::GemmRequest small = MakeGemm(v1::FLOAT32, {.m = 33, .n = 33, .k = 7});
  auto ok = client->Gemm(small);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(Passes(CheckGemm(small, *ok)));
}

}  // namespace
}  // namespace gpucompute::testing
