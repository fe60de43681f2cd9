// 32 clients, each on its own connection, 100 requests each: every one is
// answered, correctly.
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/verify.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

TEST(ConcurrencyTest, ThirtyTwoClientsTimesOneHundredRequests) {
  constexpr int kClients = 32;
  constexpr int kRequests = 100;
  auto server = ServerProcess::Start({"--cpu_devices=4", "--device_weights=1,1,2,2"});
  ASSERT_TRUE(server.ok()) << server.status();

  // A few prepared requests, shared read-only by every thread.
  std::vector<v1::GemmRequest> gemms;
  std::vector<v1::ReduceRequest> reduces;
  std::vector<v1::TransposeRequest> transposes;
  std::vector<v1::EchoRequest> echoes;
  for (v1::DType dtype : kAllDTypes) {
    gemms.push_back(MakeGemm(dtype, {.m = 33, .n = 7, .k = 33}));
    reduces.push_back(MakeReduce(dtype, {7, 127}, v1::MEAN, 1));
    transposes.push_back(MakeTranspose(dtype, {7, 33, 5}, {1, 2, 0}));
    echoes.push_back(MakeEcho(dtype, {127}));
  }

  std::atomic<int> answered{0};
  std::atomic<int> correct{0};
  absl::Mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = (*server)->NewClient(absl::Seconds(60), /*own_connection=*/true);
      for (int i = 0; i < kRequests; ++i) {
        const size_t d = (c + i) % 3;
        absl::StatusOr<CheckResult> check;
        absl::Status status;
        switch (i % 4) {
          case 0: {
            auto r = client->Gemm(gemms[d]);
            status = r.status();
            if (r.ok()) check = CheckGemm(gemms[d], *r);
            break;
          }
          case 1: {
            auto r = client->Reduce(reduces[d]);
            status = r.status();
            if (r.ok()) check = CheckReduce(reduces[d], *r);
            break;
          }
          case 2: {
            auto r = client->Transpose(transposes[d]);
            status = r.status();
            if (r.ok()) check = CheckTranspose(transposes[d], *r);
            break;
          }
          default: {
            auto r = client->Echo(echoes[d]);
            status = r.status();
            if (r.ok()) check = CheckEcho(echoes[d], *r);
            break;
          }
        }
        answered.fetch_add(1);
        if (status.ok() && check.ok() && check->ok) {
          correct.fetch_add(1);
          continue;
        }
        absl::MutexLock lock(&mu);
        if (failures.size() < 10) {
          failures.push_back(
              absl::StrCat("client ", c, " request ", i, ": ",
                           status.ok() ? (check.ok() ? check->message : check.status().ToString())
                                       : status.ToString()));
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(answered.load(), kClients * kRequests);
  EXPECT_EQ(correct.load(), kClients * kRequests);
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace gpucompute::testing
