// The token file's format, and what the authenticator reports.
#include "server/service/auth.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace gpucompute {
namespace {

TEST(TokenSetTest, TokensWithAndWithoutIdentities) {
  auto tokens = TokenSet::Parse(
      "# a comment\n"
      "\n"
      "  alice-0123456789abcdef   alice  \n"
      "bob-0123456789abcdef\tbob\r\n"
      "bare-0123456789abcdef\n");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->size(), 3u);
  EXPECT_EQ(tokens->IdentityOf("alice-0123456789abcdef"), "alice");
  EXPECT_EQ(tokens->IdentityOf("bob-0123456789abcdef"), "bob");
  // "token-" and 12 hex digits of the token's SHA-256, the same every time.
  std::optional<std::string> bare = tokens->IdentityOf("bare-0123456789abcdef");
  ASSERT_TRUE(bare.has_value());
  EXPECT_TRUE(absl::StartsWith(*bare, "token-")) << *bare;
  EXPECT_EQ(bare->size(), 18u) << *bare;
  EXPECT_EQ(bare->find_first_not_of("0123456789abcdef", 6), std::string::npos) << *bare;
  EXPECT_EQ(TokenSet::Parse("bare-0123456789abcdef")->IdentityOf("bare-0123456789abcdef"), bare);
  EXPECT_EQ(tokens->IdentityOf("alice-0123456789abcde"), std::nullopt);
  EXPECT_EQ(tokens->IdentityOf(""), std::nullopt);
  EXPECT_EQ(tokens->IdentityOf("alice"), std::nullopt);
}

TEST(TokenSetTest, MalformedFilesNameTheLine) {
  struct Case {
    const char* contents;
    const char* message;
  };
  for (const Case& c : {
           Case{"alice-0123456789abcdef alice\nshort bob\n", "line 2: a token is 16 to 4096"},
           Case{"alice-0123456789abcdef alice extra\n", "line 1: expected a token"},
           Case{"alice-0123456789abcdef a\nalice-0123456789abcdef b\n", "line 2: the token is"},
           Case{"tok\x01-0123456789abcdef\n", "line 1: a token"},
           Case{"# nothing\n\n", "no token"},
           Case{"", "no token"},
       }) {
    auto tokens = TokenSet::Parse(c.contents);
    ASSERT_FALSE(tokens.ok()) << c.contents;
    EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(tokens.status().message(), c.message)) << tokens.status();
  }
  EXPECT_FALSE(
      TokenSet::Parse(std::string("alice-0123456789abcdef ") + std::string(129, 'x')).ok());
  EXPECT_TRUE(TokenSet::Parse(std::string("alice-0123456789abcdef ") + std::string(128, 'x')).ok());
}

// Every refusal reports its reason, every reading after the first its result
// and the tokens then in force.
TEST(TokenAuthenticatorTest, EventsReportRefusalsAndReloads) {
  const std::string path = ::testing::TempDir() + "auth_test_tokens";
  auto write = [&](const std::string& contents) {
    std::ofstream(path, std::ios::trunc) << contents;
  };
  write("alice-0123456789abcdef alice\n");
  std::vector<std::string> reasons;
  std::vector<std::pair<bool, size_t>> reloads;
  TokenAuthenticator::Events events;
  events.refused = [&](absl::string_view reason) { reasons.emplace_back(reason); };
  events.reloaded = [&](bool ok, size_t tokens) { reloads.emplace_back(ok, tokens); };
  auto authenticator = TokenAuthenticator::Create(path, /*exempt_health=*/true, events);
  ASSERT_TRUE(authenticator.ok()) << authenticator.status();
  EXPECT_TRUE(reloads.empty());  // the first reading is not a reload

  auto process = [&](std::vector<std::pair<std::string, std::string>> metadata) {
    TokenAuthenticator::InputMetadata input;
    for (const auto& [key, value] : metadata) input.emplace(key, value);
    TokenAuthenticator::OutputMetadata consumed, response;
    return (*authenticator)->Process(input, nullptr, &consumed, &response);
  };
  const std::string gemm = "/gpucompute.v1.Compute/Gemm";
  EXPECT_EQ(process({{":path", gemm}}).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(process({{":path", gemm}, {"authorization", "Basic xyz"}}).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(
      process({{":path", gemm}, {"authorization", "Bearer bob-0123456789abcdef"}}).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  // Health is exempt: not refused, not counted.
  EXPECT_TRUE(process({{":path", "/grpc.health.v1.Health/Check"}}).ok());
  EXPECT_EQ(reasons, (std::vector<std::string>{"missing", "malformed", "invalid"}));

  write("alice-0123456789abcdef alice\nbob-0123456789abcdef bob\n");
  ASSERT_TRUE((*authenticator)->Reload().ok());
  write("short\n");
  EXPECT_FALSE((*authenticator)->Reload().ok());
  EXPECT_EQ(reloads, (std::vector<std::pair<bool, size_t>>{{true, 2}, {false, 2}}));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace gpucompute
