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

}  // namespace
}  // namespace gpucompute
