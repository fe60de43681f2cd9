// Connections: --max_connection_age sends clients away so that they
// reconnect (and re-resolve: new replicas are found), without failing
// calls; the keepalive and age flags are checked.
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/integration/requests.h"
#include "tests/integration/server_process.h"

namespace gpucompute::testing {
namespace {

// Whether the channel leaves READY (its connection closed, however briefly)
// within `wait`.
bool LeavesReady(const Client& client, absl::Duration wait) {
  if (client.channel()->GetState(false) != GRPC_CHANNEL_READY) return true;
  return client.channel()->WaitForStateChange(
      GRPC_CHANNEL_READY, std::chrono::system_clock::now() + absl::ToChronoNanoseconds(wait));
}

TEST(ConnectionTest, OldConnectionsAreSentAwayAndCallsGoOn) {
  GC_SKIP_IF_DEVICES_OVERRIDDEN();
  auto server = ServerProcess::Start({"--max_connection_age=300ms"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = (*server)->NewClient(absl::Seconds(20), /*own_connection=*/true);
  const v1::GemmRequest request = MakeGemm(v1::FLOAT32, {.m = 8, .n = 8, .k = 8});
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(client->Gemm(request).ok()) << "round " << round;
    ASSERT_EQ(client->channel()->GetState(false), GRPC_CHANNEL_READY);
    EXPECT_TRUE(LeavesReady(*client, absl::Seconds(5))) << "round " << round;
  }
  // Calls across the ages all succeed.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int calls = 0;
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(client->Gemm(request).ok()) << "call " << calls;
    ++calls;
  }
  EXPECT_GT(calls, 10);
}

TEST(ConnectionTest, YoungConnectionsStay) {
  GC_SKIP_IF_DEVICES_OVERRIDDEN();
  auto server = ServerProcess::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = (*server)->NewClient(absl::Seconds(20), /*own_connection=*/true);
  ASSERT_TRUE(client->Gemm(MakeGemm(v1::FLOAT32, {.m = 8, .n = 8, .k = 8})).ok());
  EXPECT_FALSE(LeavesReady(*client, absl::Seconds(1.5)));
}

TEST(ConnectionTest, BadDurationsAreRefused) {
  for (const char* flag :
       {"--max_connection_age=0s", "--keepalive_time=-1s", "--keepalive_timeout=0s",
        "--max_connection_age_grace=0s", "--stalled_stream_timeout=0s"}) {
    CommandResult r = RunCommand({ServerPath(), "--listen=127.0.0.1:0", "--metrics_listen=", flag},
                                 absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 1) << flag << ": " << r.output;
    const std::string name = std::string(flag).substr(2, std::string(flag).find('=') - 2);
    EXPECT_TRUE(absl::StrContains(r.output, "--" + name + ": expected > 0")) << r.output;
  }
}

}  // namespace
}  // namespace gpucompute::testing
