// The `gpucompute` CLI against the real server: every subcommand, every
// dtype, --check, .npy in and out, exit codes, bench.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/npy.h"
#include "client/verify.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "client/reference.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

constexpr int kExitOk = 0, kExitCallFailed = 1, kExitUsage = 2, kExitMismatch = 3;

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto server = ServerProcess::Start({"--cpu_devices=2", "--device_weights=1,3"});
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

  // Runs the CLI with --server pointing at the test server.
  static CommandResult Cli(std::vector<std::string> args, bool with_server = true) {
    std::vector<std::string> argv = {CliPath()};
    argv.insert(argv.end(), args.begin(), args.end());
    if (with_server) argv.push_back("--server=" + server_->address());
    return RunCommand(argv, absl::Seconds(120));
  }

  static inline ServerProcess* server_ = nullptr;
  static inline absl::Status* start_error_ = new absl::Status();
};

TEST_F(CliTest, EveryOperationEveryDTypeChecks) {
  const std::vector<std::vector<std::string>> ops = {
      {"gemm", "--m=33", "--n=7", "--k=127", "--transpose_b", "--beta=0.5"},
      {"gemm", "--batch=3", "--batch_b", "--m=7", "--n=33", "--k=7", "--alpha=2"},
      {"gemv", "--m=127", "--k=33", "--n=3", "--transpose_a"},
      {"gemv", "--m=1000", "--k=7", "--beta=1"},
      {"reduce", "--shape=33,127", "--op=mean", "--axis=-1", "--keepdims"},
      {"reduce", "--shape=1000", "--op=max"},
      {"transpose", "--shape=7,33,5", "--perm=2,0,1"},
      {"transpose", "--shape=127,33"},
      {"attention", "--batch=2", "--heads_q=4", "--heads_kv=2", "--seq_q=7", "--seq_kv=33",
       "--causal", "--lse"},
      {"attention", "--heads_q=2", "--seq_q=33", "--seq_kv=7", "--head_dim=128"},
  };
  for (const char* dtype : {"float32", "float16", "bfloat16"}) {
    for (std::vector<std::string> args : ops) {
      args.push_back(absl::StrCat("--dtype=", dtype));
      args.push_back("--check");
      SCOPED_TRACE(absl::StrJoin(args, " "));
      CommandResult r = Cli(args);
      EXPECT_EQ(r.exit_code, kExitOk) << r.output;
      EXPECT_TRUE(absl::StrContains(r.output, "check: OK")) << r.output;
      EXPECT_TRUE(absl::StrContains(r.output, "latency ")) << r.output;
      EXPECT_TRUE(absl::StrContains(r.output, "GB/s")) << r.output;
      EXPECT_TRUE(absl::StrContains(r.output, "kernel ms")) << r.output;  // the shard table
    }
  }
}

TEST_F(CliTest, EchoAndInfo) {
  for (const char* dtype : {"float32", "float16", "bfloat16"}) {
    CommandResult r = Cli({"echo", "--shape=1000,7", absl::StrCat("--dtype=", dtype), "--check"});
    EXPECT_EQ(r.exit_code, kExitOk) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "check: OK")) << r.output;
  }
  CommandResult info = Cli({"info"});
  EXPECT_EQ(info.exit_code, kExitOk) << info.output;
  const bool own = !DevicesOverridden();
  for (const std::string& want : {std::string(own ? "backend cpu" : "backend "),
                                  std::string("health SERVING"),
                                  std::string(own ? "devices 2" : "devices "), std::string("gemm"),
                                  std::string("attention")}) {
    EXPECT_TRUE(absl::StrContains(info.output, want)) << want << " missing in\n" << info.output;
  }
  CommandResult health = Cli({"health"});
  EXPECT_EQ(health.exit_code, kExitOk) << health.output;
  EXPECT_EQ(health.output, "SERVING\n");
}

TEST_F(CliTest, VariantAndDeviceOptions) {
  GC_SKIP_IF_DEVICES_OVERRIDDEN();
  CommandResult r =
      Cli({"gemm", "--m=33", "--n=7", "--k=7", "--variant=naive", "--devices=1", "--check"});
  EXPECT_EQ(r.exit_code, kExitOk) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "naive")) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "[0,33)")) << r.output;

  // Weights 1:3 over 40 rows: [0,10) and [10,40).
  CommandResult split = Cli({"gemm", "--m=40", "--n=7", "--k=7", "--check"});
  EXPECT_EQ(split.exit_code, kExitOk) << split.output;
  EXPECT_TRUE(absl::StrContains(split.output, "[0,10)")) << split.output;
  EXPECT_TRUE(absl::StrContains(split.output, "[10,40)")) << split.output;

  CommandResult unknown = Cli({"gemm", "--m=3", "--n=3", "--k=3", "--variant=nope"});
  EXPECT_EQ(unknown.exit_code, kExitCallFailed) << unknown.output;
  EXPECT_TRUE(absl::StrContains(unknown.output, "INVALID_ARGUMENT")) << unknown.output;
  EXPECT_TRUE(absl::StrContains(unknown.output, "options.variant")) << unknown.output;
}

// Inputs from .npy files (each supported file dtype), result to .npy,
// compared here with the reference.
TEST_F(CliTest, NpyInputsAndOutput) {
  TempDir dir;
  const int64_t m = 7, k = 33, n = 5;
  std::vector<float> a(m * k), b(k * n);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (float& v : a) v = dist(Rng());
  for (float& v : b) v = dist(Rng());
  // A as float64, B as float32.
  std::vector<double> a64(a.begin(), a.end());
  NpyArray a_file{
      "<f8", {m, k}, std::string(reinterpret_cast<const char*>(a64.data()), a64.size() * 8)};
  NpyArray b_file{
      "<f4", {k, n}, std::string(reinterpret_cast<const char*>(b.data()), b.size() * 4)};
  ASSERT_TRUE(WriteNpy(dir.File("a.npy"), a_file).ok());
  ASSERT_TRUE(WriteNpy(dir.File("b.npy"), b_file).ok());

  for (const char* dtype : {"float32", "float16", "bfloat16"}) {
    SCOPED_TRACE(dtype);
    const std::string out = dir.File(absl::StrCat("c_", dtype, ".npy"));
    CommandResult r = Cli({"gemm", "--a=" + dir.File("a.npy"), "--b=" + dir.File("b.npy"),
                           absl::StrCat("--dtype=", dtype), "--check", "--out=" + out});
    ASSERT_EQ(r.exit_code, kExitOk) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "check: OK")) << r.output;

    auto c = ReadNpy(out);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->shape, (std::vector<int64_t>{m, n}));
    v1::DType d = *ParseDType(dtype);
    EXPECT_EQ(c->descr, d == v1::FLOAT32 ? "<f4" : d == v1::FLOAT16 ? "<f2" : "<u2");
    // The reference on the inputs as the server saw them (rounded to dtype).
    v1::Tensor a_t = TensorFromFloats(d, {m, k}, a), b_t = TensorFromFloats(d, {k, n}, b);
    std::vector<double> want =
        reference::Gemm(*TensorToDoubles(a_t, "a"), *TensorToDoubles(b_t, "b"), nullptr, 1, m, n, k,
                        false, false, false, false, false, 1, 0);
    auto got = TensorToDoubles(MakeTensor(d, c->shape, c->data), "c");
    ASSERT_TRUE(got.ok());
    double rtol = reference::Rtol(ToHostDType(d), k);
    EXPECT_EQ(reference::CompareClose(*got, want, rtol * 6, rtol), "");
  }

  // bfloat16 bits in a '<u2' file go through unchanged: echo them back.
  std::vector<float> values = {1.5f, -2.25f, 3.0f, 0.0078125f};
  v1::Tensor bf16 = TensorFromFloats(v1::BFLOAT16, {2, 2}, values);
  ASSERT_TRUE(WriteNpy(dir.File("x.npy"), NpyArray{"<u2", {2, 2}, bf16.data()}).ok());
  CommandResult echo = Cli({"echo", "--input=" + dir.File("x.npy"), "--dtype=bfloat16", "--check",
                            "--out=" + dir.File("y.npy")});
  ASSERT_EQ(echo.exit_code, kExitOk) << echo.output;
  auto y = ReadNpy(dir.File("y.npy"));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->descr, "<u2");
  EXPECT_EQ(y->data, bf16.data());

  // Attention's LSE to its own file.
  CommandResult lse = Cli({"attention", "--seq_q=7", "--seq_kv=7", "--heads_q=2", "--lse",
                           "--out=" + dir.File("o.npy"), "--lse_out=" + dir.File("lse.npy")});
  ASSERT_EQ(lse.exit_code, kExitOk) << lse.output;
  auto lse_file = ReadNpy(dir.File("lse.npy"));
  ASSERT_TRUE(lse_file.ok()) << lse_file.status();
  EXPECT_EQ(lse_file->shape, (std::vector<int64_t>{1, 2, 7}));
  EXPECT_EQ(lse_file->descr, "<f4");
}

TEST_F(CliTest, ExitCodes) {
  EXPECT_EQ(Cli({}, false).exit_code, kExitUsage);
  EXPECT_EQ(Cli({"help"}, false).exit_code, kExitOk);
  EXPECT_EQ(Cli({"frobnicate"}).exit_code, kExitUsage);
  EXPECT_EQ(Cli({"gemm", "--dtype=int8"}).exit_code, kExitUsage);
  EXPECT_EQ(Cli({"reduce", "--op=median"}).exit_code, kExitUsage);
  EXPECT_EQ(Cli({"transpose", "--shape=2,x"}).exit_code, kExitUsage);
  EXPECT_EQ(Cli({"gemm", "--a=/nonexistent/a.npy"}).exit_code, kExitUsage);
  EXPECT_EQ(Cli({"bench"}).exit_code, kExitUsage);

  // Rejected by the server: exit 1 with the code and the field.
  CommandResult bad = Cli({"transpose", "--shape=2,3", "--perm=0,0"});
  EXPECT_EQ(bad.exit_code, kExitCallFailed) << bad.output;
  EXPECT_TRUE(absl::StrContains(bad.output, "INVALID_ARGUMENT")) << bad.output;
  EXPECT_TRUE(absl::StrContains(bad.output, "perm")) << bad.output;

  // Nobody listening: exit 1, UNAVAILABLE.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  CommandResult down =
      RunCommand({CliPath(), "info", absl::StrCat("--server=127.0.0.1:", ntohs(addr.sin_port)),
                  "--timeout=5s"});
  EXPECT_EQ(down.exit_code, kExitCallFailed) << down.output;
  EXPECT_TRUE(absl::StrContains(down.output, "UNAVAILABLE")) << down.output;
}

TEST_F(CliTest, Bench) {
  for (const char* mode : {"unary", "batch"}) {
    SCOPED_TRACE(mode);
    CommandResult r = Cli({"bench", "gemm", "--m=33", "--n=33", "--k=33", "--requests=40",
                           "--concurrency=4", "--warmup=2", absl::StrCat("--mode=", mode)});
    EXPECT_EQ(r.exit_code, kExitOk) << r.output;
    for (const char* want :
         {"requests/s", "p50 ms", "p90 ms", "p99 ms", "payload GB/s", "echo", "gemm over echo"}) {
      EXPECT_TRUE(absl::StrContains(r.output, want)) << want << " missing in\n" << r.output;
    }
    // Not a terminal: no progress bar.
    EXPECT_FALSE(absl::StrContains(r.output, "\r")) << r.output;
  }
  CommandResult echo = Cli({"bench", "echo", "--shape=1000", "--requests=20", "--concurrency=2"});
  EXPECT_EQ(echo.exit_code, kExitOk) << echo.output;
  CommandResult reduce = Cli({"bench", "reduce", "--shape=1000,7", "--axis=0", "--requests=20",
                              "--dtype=bfloat16", "--mode=batch"});
  EXPECT_EQ(reduce.exit_code, kExitOk) << reduce.output;
}

// A Compute service that answers GEMM with zeros: --check must catch it.
class WrongComputeService final : public v1::Compute::Service {
  grpc::Status Gemm(grpc::ServerContext*, const v1::GemmRequest* request,
                    v1::GemmResponse* response) override {
    const int64_t m = request->a().shape(0), n = request->b().shape(1);
    *response->mutable_c() = MakeTensor(
        request->a().dtype(), {m, n}, std::string(m * n * ElementSize(request->a().dtype()), '\0'));
    return grpc::Status::OK;
  }
};

TEST(CliCheckTest, MismatchExitsThree) {
  WrongComputeService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  CommandResult r = RunCommand({CliPath(), "gemm", "--m=7", "--n=5", "--k=3", "--check",
                                absl::StrCat("--server=127.0.0.1:", port)});
  EXPECT_EQ(r.exit_code, kExitMismatch) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "check: MISMATCH")) << r.output;
  server->Shutdown();
}

}  // namespace
}  // namespace gpucompute::testing
