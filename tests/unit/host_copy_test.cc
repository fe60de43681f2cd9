#include "server/device/host_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace gpucompute {
namespace {

// Every size to 300 bytes and a few large ones, from and to every
// alignment mod 16: exactly the source's bytes land, and none around them.
TEST(CopyStreamingTest, CopiesExactlyTheRangeAtEveryAlignment) {
  std::mt19937 rng(7);
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 300; ++n) sizes.push_back(n);
  for (size_t n : {size_t{4095}, size_t{4096}, size_t{65536 + 17}, (size_t{1} << 20) + 3}) {
    sizes.push_back(n);
  }
  for (size_t n : sizes) {
    for (size_t src_off : {0u, 1u, 7u, 15u}) {
      for (size_t dst_off : {0u, 3u, 8u, 13u}) {
        std::vector<uint8_t> src(n + 32), dst(n + 64, 0xA5);
        for (auto& b : src) b = uint8_t(rng());
        CopyStreaming(dst.data() + 16 + dst_off, src.data() + src_off, n);
        for (size_t i = 0; i < 16 + dst_off; ++i) ASSERT_EQ(dst[i], 0xA5) << n << " before " << i;
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(dst[16 + dst_off + i], src[src_off + i])
              << "n " << n << " src+" << src_off << " dst+" << dst_off << " byte " << i;
        }
        for (size_t i = 16 + dst_off + n; i < dst.size(); ++i) {
          ASSERT_EQ(dst[i], 0xA5) << n << " after " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gpucompute
