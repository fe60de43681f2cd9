// How the client cuts an upload or download into the parts of its streams
// (SplitTransfer), and the tensor helpers of resident tensors.
#include <cstdint>
#include <vector>

#include "client/client.h"
#include "gtest/gtest.h"

namespace gpucompute {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// The properties every split has: non-empty (but for a 0-byte transfer)
// ranges that cover [0, bytes) in order, each beginning at a multiple of
// kTransferAlignment.
void ExpectCovers(const std::vector<ByteRange>& parts, int64_t bytes) {
  ASSERT_FALSE(parts.empty());
  EXPECT_EQ(parts.front().begin, 0);
  EXPECT_EQ(parts.back().end, bytes);
  for (size_t i = 0; i < parts.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(parts[i].begin % kTransferAlignment, 0);
    if (bytes > 0) {
      EXPECT_GT(parts[i].size(), 0);
    }
    if (i > 0) {
      EXPECT_EQ(parts[i].begin, parts[i - 1].end);
    }
  }
}

TEST(SplitTransferTest, OneStreamBelowTheParallelMinimum) {
  EXPECT_EQ(SplitTransfer(0, 4, 64 * kMiB), (std::vector<ByteRange>{{0, 0}}));
  EXPECT_EQ(SplitTransfer(0, 4, 0), (std::vector<ByteRange>{{0, 0}}));
  EXPECT_EQ(SplitTransfer(64 * kMiB - 1, 4, 64 * kMiB),
            (std::vector<ByteRange>{{0, 64 * kMiB - 1}}));
  EXPECT_EQ(SplitTransfer(64 * kMiB, 4, 64 * kMiB).size(), 4u);
}

TEST(SplitTransferTest, OneStreamWhenOneIsAsked) {
  EXPECT_EQ(SplitTransfer(100 * kMiB, 1, 0), (std::vector<ByteRange>{{0, 100 * kMiB}}));
  EXPECT_EQ(SplitTransfer(100 * kMiB, 0, 0), (std::vector<ByteRange>{{0, 100 * kMiB}}));
}

TEST(SplitTransferTest, EvenPartsOfAnEvenSize) {
  EXPECT_EQ(
      SplitTransfer(64 * kMiB, 4, 0),
      (std::vector<ByteRange>{
          {0, 16 * kMiB}, {16 * kMiB, 32 * kMiB}, {32 * kMiB, 48 * kMiB}, {48 * kMiB, 64 * kMiB}}));
}

TEST(SplitTransferTest, PartsBeginAlignedAndDifferByAtMostOneUnit) {
  for (int64_t bytes :
       {int64_t{1}, int64_t{2}, int64_t{4095}, int64_t{4096}, int64_t{4097}, int64_t{3 * 4096 + 2},
        int64_t{12345678}, 64 * kMiB + 6, int64_t{1} << 33, (int64_t{1} << 33) + 17}) {
    for (int streams : {2, 3, 4, 7, 8, 64}) {
      SCOPED_TRACE(testing::Message() << bytes << " bytes over " << streams << " streams");
      std::vector<ByteRange> parts = SplitTransfer(bytes, streams, 0);
      ExpectCovers(parts, bytes);
      const int64_t units = (bytes + kTransferAlignment - 1) / kTransferAlignment;
      EXPECT_EQ(static_cast<int64_t>(parts.size()), std::min<int64_t>(streams, units));
      // Every part but the last is a whole number of units; those numbers
      // differ by at most one.
      int64_t smallest = INT64_MAX, largest = 0;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        EXPECT_EQ(parts[i].size() % kTransferAlignment, 0);
        smallest = std::min(smallest, parts[i].size());
        largest = std::max(largest, parts[i].size());
      }
      if (parts.size() > 1) {
        EXPECT_LE(largest - smallest, kTransferAlignment);
        EXPECT_LE(parts.back().size(), largest + kTransferAlignment);
      }
    }
  }
}

TEST(SplitTransferTest, FewerPartsThanStreamsForSmallTransfers) {
  // Three units of alignment: at most three streams.
  EXPECT_EQ(SplitTransfer(2 * 4096 + 1, 8, 0),
            (std::vector<ByteRange>{{0, 4096}, {4096, 8192}, {8192, 8193}}));
  EXPECT_EQ(SplitTransfer(10, 4, 0), (std::vector<ByteRange>{{0, 10}}));
}

TEST(SplitTransferTest, AlignmentIsAWholeNumberOfEveryElement) {
  for (v1::DType dtype : {v1::FLOAT32, v1::FLOAT16, v1::BFLOAT16}) {
    EXPECT_EQ(kTransferAlignment % ElementSize(dtype), 0) << DTypeName(dtype);
  }
}

TEST(ResidentHelpersTest, HandleTensorNamesOnlyTheHandle) {
  v1::Tensor t = HandleTensor("h-1");
  EXPECT_EQ(t.handle(), "h-1");
  EXPECT_EQ(t.dtype(), v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(t.shape_size(), 0);
  EXPECT_TRUE(t.data().empty());
}

TEST(ResidentHelpersTest, TensorBytes) {
  EXPECT_EQ(TensorBytes(v1::FLOAT32, {}).value(), 4);
  EXPECT_EQ(TensorBytes(v1::BFLOAT16, {3, 0, 5}).value(), 0);
  EXPECT_EQ(TensorBytes(v1::FLOAT16, {7, 3}).value(), 42);
  EXPECT_EQ(TensorBytes(v1::DTYPE_UNSPECIFIED, {2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TensorBytes(v1::FLOAT32, {-1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TensorBytes(v1::FLOAT32, {int64_t{1} << 62}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpucompute
