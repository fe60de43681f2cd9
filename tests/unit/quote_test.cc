// Client strings quoted in errors: whole when short, cut when long.
#include "server/common/quote.h"

#include <string>

#include "gtest/gtest.h"

namespace gpucompute {
namespace {

TEST(QuoteTest, ShortStringsWholeLongOnesCut) {
  EXPECT_EQ(Quote("gemm_tc"), "\"gemm_tc\"");
  EXPECT_EQ(Quote(""), "\"\"");
  EXPECT_EQ(Quote("a\"b\n"), "\"a\\\"b\\n\"");
  EXPECT_EQ(Quote(std::string(256, 'x')), "\"" + std::string(256, 'x') + "\"");
  EXPECT_EQ(Quote(std::string(257, 'x')), "\"" + std::string(256, 'x') + "...\" (257 bytes)");
  EXPECT_EQ(Quote(std::string(1 << 20, 'x')).size(), 256u + 21u);
}

// Escapes count against the bound: 400 bytes of \x07 once quoted 256 of
// them as 1024 characters, past the 1 KiB a refusal's message may take
// (found by fuzz_request).
TEST(QuoteTest, TheBoundCountsTheEscapedCharacters) {
  std::string escaped64;  // 64 bytes of \x07 escaped: 256 characters
  for (int i = 0; i < 64; ++i) escaped64 += "\\x07";
  EXPECT_EQ(Quote(std::string(64, '\x07')), "\"" + escaped64 + "\"");
  EXPECT_EQ(Quote(std::string(65, '\x07')), "\"" + escaped64 + "...\" (65 bytes)");
  EXPECT_EQ(Quote(std::string(400, '\x07')), "\"" + escaped64 + "...\" (400 bytes)");
  // Mixed: a plain byte takes one character, \n two, and a cut
  // never splits an escape.
  const std::string mixed = std::string(250, 'a') + std::string(10, '\n');
  EXPECT_EQ(Quote(mixed), "\"" + std::string(250, 'a') + "\\n\\n\\n...\" (260 bytes)");
  for (size_t n : {0u, 1u, 63u, 64u, 65u, 255u, 256u, 257u, 1024u}) {
    const std::string q = Quote(std::string(n, '\xff'));
    EXPECT_LE(q.size(), kMaxQuotedBytes + 32) << n;
  }
}

}  // namespace
}  // namespace gpucompute
