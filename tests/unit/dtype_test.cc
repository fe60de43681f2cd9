// fp16 / bf16 conversions: round to nearest even, NaN and Inf kept, overflow
// to Inf, subnormals exact.
#include "proto/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "server/common/tensor.h"

namespace gpucompute {
namespace {

float Bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(DTypeName(DType::kFloat32), "float32");
  EXPECT_EQ(DTypeName(DType::kFloat16), "float16");
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
}

TEST(Half, KnownValues) {
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);          // largest finite
  EXPECT_EQ(FloatToHalf(6.103515625e-05f), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToHalf(5.9604645e-08f), 0x0001);    // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
}

TEST(Half, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even (1).
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 0x3c01 and 0x3c02: ties to 0x3c02.
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Just above halfway rounds up.
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  // Subnormal halfway: 2^-25 (half the smallest subnormal) ties to 0; 3 * 2^-25 to 2 * 2^-24.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToHalf(3 * std::ldexp(1.0f, -25)), 0x0002);
  EXPECT_EQ(FloatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
}

TEST(Half, OverflowInfAndNan) {
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // halfway: ties to even (Inf)
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(kInf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-kInf), 0xfc00);
  EXPECT_EQ(HalfToFloat(0x7c00), kInf);
  EXPECT_EQ(HalfToFloat(0xfc00), -kInf);
  const uint16_t nan = FloatToHalf(std::nanf(""));
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_TRUE(std::isnan(HalfToFloat(nan)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7c01)));  // signalling NaN stays NaN
  EXPECT_TRUE(std::isnan(HalfToFloat(0xfe00)));
  // A NaN whose payload lies only in the low bits stays NaN (not Inf).
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(Bits(0x7f800001)))));
}

TEST(Half, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << h;
    } else {
      ASSERT_EQ(FloatToHalf(f), h) << h;
    }
  }
}

// The nearest half by search over every finite half, ties to an even
// mantissa: an independent oracle for random floats.
uint16_t NearestHalf(float f, const std::vector<std::pair<double, uint16_t>>& sorted) {
  const double x = std::abs(double(f));
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  // Beyond the largest finite plus half an ulp (65520): Inf.
  if (x >= 65520.0) return sign | 0x7c00;
  auto it = std::lower_bound(sorted.begin(), sorted.end(), std::make_pair(x, uint16_t(0)));
  if (it == sorted.end()) return sign | 0x7bff;  // (65504, 65520): the largest finite
  if (it != sorted.end() && it->first == x) return sign | it->second;
  const auto hi = *it, lo = *(it - 1);
  const double dl = x - lo.first, dh = hi.first - x;
  if (dl < dh) return sign | lo.second;
  if (dh < dl) return sign | hi.second;
  return sign | ((lo.second & 1) == 0 ? lo.second : hi.second);
}

TEST(Half, RandomFloatsRoundLikeTheOracle) {
  std::vector<std::pair<double, uint16_t>> sorted;
  for (uint32_t h = 0; h < 0x7c00; ++h) sorted.push_back({HalfToFloat(uint16_t(h)), uint16_t(h)});
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<uint32_t> exponent(100, 143), mantissa(0, (1u << 23) - 1);
  std::uniform_int_distribution<uint32_t> sign(0, 1);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = (sign(rng) << 31) | (exponent(rng) << 23) | mantissa(rng);
    const float f = Bits(bits);
    ASSERT_EQ(FloatToHalf(f), NearestHalf(f, sorted)) << f;
  }
}

TEST(BFloat16, KnownValuesAndRounding) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(-2.0f), 0xc000);
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8: halfway between 0x3f81 and 0x3f82: to 0x3f82.
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(FloatToBFloat16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  // The largest float rounds up to Inf; Inf and NaN are kept.
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(kInf), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-kInf), 0xff80);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(Bits(0x7f800001)))));  // low payload
  // Subnormals round like any other value.
  EXPECT_EQ(FloatToBFloat16(Bits(0x00008000)), 0x0000);  // tie to even
  EXPECT_EQ(FloatToBFloat16(Bits(0x00018000)), 0x0002);
}

TEST(BFloat16, EveryValueRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = BFloat16ToFloat(uint16_t(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBFloat16(f), b) << b;
  }
}

TEST(BFloat16, RandomFloatsRoundToTheNearest) {
  std::mt19937 rng(std::random_device{}());
  // Up to the largest float that still rounds to a finite bfloat16.
  std::uniform_int_distribution<uint32_t> bits_dist(0, 0x7f7f7fff);
  for (int i = 0; i < 200000; ++i) {
    const float f = Bits(bits_dist(rng));
    const uint16_t b = FloatToBFloat16(f);
    const double got = BFloat16ToFloat(b);
    const double below = BFloat16ToFloat(uint16_t(b - (b > 0 ? 1 : 0)));
    const double above = BFloat16ToFloat(uint16_t(b + 1));
    // No neighbour is strictly closer.
    EXPECT_LE(std::abs(got - f), std::abs(below - f)) << f;
    if (std::isfinite(above)) {
      EXPECT_LE(std::abs(got - f), std::abs(above - f)) << f;
    }
  }
}

TEST(Conversions, BulkMatchesScalar) {
  std::vector<float> src = {0.0f, -1.5f, 3.14159f, 1e-6f, -65504.0f, 1e9f, kInf, std::nanf("")};
  const int64_t n = int64_t(src.size());
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    std::vector<char> buf(src.size() * DTypeSize(t));
    FromFloat(t, src.data(), buf.data(), n);
    std::vector<float> back(src.size());
    ToFloat(t, buf.data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      float want = src[i];
      if (t == DType::kFloat16) want = HalfToFloat(FloatToHalf(src[i]));
      if (t == DType::kBFloat16) want = BFloat16ToFloat(FloatToBFloat16(src[i]));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(back[i]));
        EXPECT_TRUE(std::isnan(LoadAsDouble(t, buf.data(), i)));
      } else {
        EXPECT_EQ(back[i], want) << DTypeName(t) << " " << i;
        EXPECT_EQ(LoadAsDouble(t, buf.data(), i), double(want));
      }
    }
  }
}

TEST(Tensor, AllocateAndView) {
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({3, 0, 5}), 0);
  EXPECT_EQ(NumElements({2, 3, 4}), 24);
  HostTensor t = HostTensor::Allocate(DType::kBFloat16, {3, 5});
  EXPECT_EQ(t.data.size(), 30u);
  EXPECT_EQ(t.num_elements(), 15);
  const TensorView v = t.view();
  EXPECT_EQ(v.data, t.data.data());
  EXPECT_EQ(v.num_bytes(), 30u);
  EXPECT_EQ(v.shape, t.shape);
}

}  // namespace
}  // namespace gpucompute
