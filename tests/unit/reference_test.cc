// The float64 oracle against small cases worked out by hand.
#include "client/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace gpucompute::reference {
namespace {

using V = std::vector<double>;
constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNan = std::nan("");

TEST(ReferenceGemm, PlainTransposedBatchedAndBeta) {
  const V a = {1, 2, 3, 4, 5, 6};     // [2, 3]
  const V b = {7, 8, 9, 10, 11, 12};  // [3, 2]
  EXPECT_EQ(Gemm(a, b, nullptr, 1, 2, 2, 3, false, false, false, false, false, 1, 0),
            (V{58, 64, 139, 154}));
  // op(A) = A^T with A stored [3, 2] = the same numbers read as [K, M].
  const V at = {1, 4, 2, 5, 3, 6};
  const V bt = {7, 9, 11, 8, 10, 12};  // B^T stored [N, K]
  EXPECT_EQ(Gemm(at, bt, nullptr, 1, 2, 2, 3, false, false, false, true, true, 1, 0),
            (V{58, 64, 139, 154}));
  // alpha and beta.
  const V c = {1, 1, 1, 1};
  EXPECT_EQ(Gemm(a, b, &c, 1, 2, 2, 3, false, false, false, false, false, 2, -1),
            (V{115, 127, 277, 307}));
  // Batch of two with B shared and C batched.
  const V a2 = {1, 0, 0, 1, 2, 0, 0, 2};  // [2, 2, 2]: I and 2I
  const V b2 = {1, 2, 3, 4};              // [2, 2]
  const V c2 = {0, 0, 0, 0, 1, 1, 1, 1};
  EXPECT_EQ(Gemm(a2, b2, &c2, 2, 2, 2, 2, true, false, true, false, false, 1, 1),
            (V{1, 2, 3, 4, 3, 5, 7, 9}));
}

TEST(ReferenceGemv, ColumnsTransposeAndBeta) {
  const V a = {1, 2, 3, 4, 5, 6};  // [2, 3]
  EXPECT_EQ(Gemv(a, V{1, 1, 1}, nullptr, 2, 3, 1, false, 1, 0), (V{6, 15}));
  // x [3, 2]: columns (1,0,0) and (0,0,1).
  EXPECT_EQ(Gemv(a, V{1, 0, 0, 0, 0, 1}, nullptr, 2, 3, 2, false, 1, 0), (V{1, 3, 4, 6}));
  // A stored [K=2, M=3], op(A) = A^T: op(A) x = (1-4, 2-5, 3-6) = -3 each.
  const V y = {10, 20, 30};
  EXPECT_EQ(Gemv(a, V{1, -1}, &y, 3, 2, 1, true, 2, 0.5), (V{-1, 4, 9}));
}

TEST(ReferenceReduce, KindsAxesAndNan) {
  const V x = {1, 2, 3, 4, 5, 6};  // [2, 3]
  EXPECT_EQ(Reduce(x, 1, 6, 1, ReduceOp::kSum), (V{21}));
  EXPECT_EQ(Reduce(x, 1, 6, 1, ReduceOp::kMean), (V{3.5}));
  EXPECT_EQ(Reduce(x, 1, 2, 3, ReduceOp::kSum), (V{5, 7, 9}));  // axis 0
  EXPECT_EQ(Reduce(x, 2, 3, 1, ReduceOp::kMax), (V{3, 6}));     // axis 1
  EXPECT_EQ(Reduce(x, 2, 3, 1, ReduceOp::kMin), (V{1, 4}));
  const V y = {1, kNan, 3, 4, 5, -kInf};
  const V max = Reduce(y, 2, 3, 1, ReduceOp::kMax);
  EXPECT_TRUE(std::isnan(max[0]));
  EXPECT_EQ(max[1], 5);
  const V min = Reduce(y, 2, 3, 1, ReduceOp::kMin);
  EXPECT_TRUE(std::isnan(min[0]));
  EXPECT_EQ(min[1], -kInf);
  EXPECT_TRUE(std::isnan(Reduce(V{}, 1, 0, 1, ReduceOp::kMean)[0]));
  EXPECT_EQ(Reduce(V{}, 1, 0, 1, ReduceOp::kSum), (V{0}));
}

TEST(ReferenceTranspose, MatrixAndThreeAxes) {
  EXPECT_EQ(Transpose(V{1, 2, 3, 4, 5, 6}, {2, 3}, {1, 0}), (V{1, 4, 2, 5, 3, 6}));
  // [2, 2, 2] with values = 4i + 2j + k, perm (2, 0, 1): out[k][i][j].
  V x(8);
  for (int i = 0; i < 8; ++i) x[i] = i;
  EXPECT_EQ(Transpose(x, {2, 2, 2}, {2, 0, 1}), (V{0, 2, 4, 6, 1, 3, 5, 7}));
  EXPECT_EQ(Transpose(x, {2, 2, 2}, {0, 1, 2}), x);
}

TEST(ReferenceAttention, UniformKeysAverageValues) {
  // Equal logits (q = 0): O is the mean of the visible V rows; LSE = log(n).
  const V q(2 * 1, 0.0);  // [1, 1, Sq=2, D=1]
  const V k = {1, 2, 3};  // [1, 1, Skv=3, 1]
  const V v = {3, 6, 9};
  AttentionResult r = Attention(q, k, v, 1, 1, 1, 2, 3, 1, false, 1.0);
  EXPECT_DOUBLE_EQ(r.o[0], 6);
  EXPECT_DOUBLE_EQ(r.o[1], 6);
  EXPECT_DOUBLE_EQ(r.lse[0], std::log(3.0));
  // Causal, bottom-right: query 0 sees keys 0..1, query 1 sees 0..2.
  r = Attention(q, k, v, 1, 1, 1, 2, 3, 1, true, 1.0);
  EXPECT_DOUBLE_EQ(r.o[0], 4.5);
  EXPECT_DOUBLE_EQ(r.o[1], 6);
  EXPECT_DOUBLE_EQ(r.lse[0], std::log(2.0));
}

TEST(ReferenceAttention, SoftmaxWeightsScaleAndEmptyRows) {
  // One query q = 1, keys 0 and 1, scale 2: logits 0 and 2.
  AttentionResult r = Attention(V{1}, V{0, 1}, V{10, 20}, 1, 1, 1, 1, 2, 1, false, 2.0);
  const double w1 = std::exp(2.0) / (1 + std::exp(2.0));
  EXPECT_NEAR(r.o[0], 10 * (1 - w1) + 20 * w1, 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(1 + std::exp(2.0)), 1e-12);
  // Causal with Sq = 3 > Skv = 1: rows 0 and 1 see nothing.
  r = Attention(V{1, 1, 1}, V{1}, V{5}, 1, 1, 1, 3, 1, 1, true, 1.0);
  EXPECT_EQ(r.o, (V{0, 0, 5}));
  EXPECT_EQ(r.lse[0], -kInf);
  EXPECT_EQ(r.lse[1], -kInf);
  EXPECT_DOUBLE_EQ(r.lse[2], 1.0);
}

TEST(ReferenceAttention, GroupedQueryHeadsShareKv) {
  // Hq = 4, Hkv = 2: heads 0,1 read kv head 0; heads 2,3 read kv head 1.
  const V q(4, 0.0);   // [1, 4, 1, 1]
  const V k = {0, 0};  // [1, 2, 1, 1]
  const V v = {7, -7};
  AttentionResult r = Attention(q, k, v, 1, 4, 2, 1, 1, 1, false, 1.0);
  EXPECT_EQ(r.o, (V{7, 7, -7, -7}));
}

TEST(ReferenceHelpers, ToDoublesRtolAndCompare) {
  const float f[] = {1.5f, -2.0f};
  EXPECT_EQ(ToDoubles(DType::kFloat32, f, 2), (V{1.5, -2.0}));
  EXPECT_LT(Rtol(DType::kFloat32), Rtol(DType::kFloat16));
  EXPECT_LT(Rtol(DType::kFloat16), Rtol(DType::kBFloat16));
  EXPECT_LT(Rtol(DType::kFloat32, 10), Rtol(DType::kFloat32, 10000));
  EXPECT_EQ(CompareClose(V{1, kNan, kInf}, V{1.0000001, kNan, kInf}, 0, 1e-6), "");
  EXPECT_NE(CompareClose(V{1, 2}, V{1, 2.1}, 0.01, 0.01), "");
  EXPECT_NE(CompareClose(V{kNan}, V{1}, 1, 1), "");
  EXPECT_NE(CompareClose(V{kInf}, V{-kInf}, 1, 1), "");
  EXPECT_NE(CompareClose(V{1}, V{1, 2}, 1, 1), "");
}

}  // namespace
}  // namespace gpucompute::reference
