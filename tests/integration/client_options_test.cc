// The client's target lists and retry policy, without a server.
#include <string>

#include "absl/strings/match.h"
#include "client/client.h"
#include "gtest/gtest.h"

namespace gpucompute {
namespace {

TEST(ChannelTargetTest, ListsBecomeAddressUris) {
  EXPECT_EQ(*ChannelTarget("127.0.0.1:1,127.0.0.2:2"), "ipv4:127.0.0.1:1,127.0.0.2:2");
  EXPECT_EQ(*ChannelTarget("localhost:5, 10.1.2.3:50051"), "ipv4:127.0.0.1:5,10.1.2.3:50051");
  EXPECT_EQ(*ChannelTarget("[::1]:1,[fe80::1]:2"), "ipv6:[::1]:1,[fe80::1]:2");
}

TEST(ChannelTargetTest, OtherTargetsAreKept) {
  for (const char* target : {"localhost:50051", "gpucompute:50051", "dns:///svc.ns:50051",
                             "ipv4:127.0.0.1:1,127.0.0.1:2", "unix:/tmp/s", "[::1]:50051"}) {
    EXPECT_EQ(*ChannelTarget(target), target);
  }
}

TEST(ChannelTargetTest, ListsOfNamesOrMixedFamiliesAreRefused) {
  auto named = ChannelTarget("gpu-a:50051,gpu-b:50051");
  EXPECT_EQ(named.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(named.status().message(), "dns:///")) << named.status();
  EXPECT_EQ(ChannelTarget("127.0.0.1:1,[::1]:2").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChannelTarget("127.0.0.1,127.0.0.2:2").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChannelTarget("127.0.0.1:0,127.0.0.2:2").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RetryServiceConfigTest, RetriesIdempotentMethodsOnly) {
  EXPECT_EQ(RetryServiceConfig(1), "{}");
  const std::string config = RetryServiceConfig(4);
  EXPECT_TRUE(absl::StrContains(config, R"("maxAttempts": 4)")) << config;
  EXPECT_TRUE(absl::StrContains(config, R"("retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"])"));
  for (const char* method : {"Gemm", "Attention", "Echo", "Download", "Check"}) {
    EXPECT_TRUE(absl::StrContains(config, absl::StrCat("\"method\": \"", method, "\""))) << method;
  }
  for (const char* method : {"Upload", "Free", "Batch"}) {
    EXPECT_FALSE(absl::StrContains(config, absl::StrCat("\"method\": \"", method, "\""))) << method;
  }
}

TEST(ClientOptionsTest, BadBalancingOptionsAreRefused) {
  ClientOptions options;
  options.lb_policy = "least_request";
  EXPECT_EQ(Client::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.max_attempts = 0;
  EXPECT_EQ(Client::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.target = "a:1,b:2";
  EXPECT_EQ(Client::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.target = "127.0.0.1:1,127.0.0.1:2";
  EXPECT_TRUE(Client::Create(options).ok());
}

TEST(ClientOptionsTest, BadTokenOptionsAreRefused) {
  ClientOptions options;
  options.token = "a-token-0123456789";
  options.token_file = "/dev/null";
  EXPECT_EQ(Client::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.token = "with space-0123456789";
  EXPECT_EQ(Client::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.token_file = "/nonexistent/token";
  EXPECT_EQ(Client::Create(options).status().code(), absl::StatusCode::kNotFound);
  options.token_file = "/dev/null";  // empty
  EXPECT_EQ(Client::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.token = "a-token-0123456789";
  EXPECT_TRUE(Client::Create(options).ok());
}

}  // namespace
}  // namespace gpucompute
