// Every CPU operation x dtype x odd sizes against the float64 reference, on one
// CPU device computing the whole operation (or a shard of it).
#include "server/device/cpu/cpu_device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/reference.h"
#include "proto/host_memory.h"
#include "server/core/planner.h"
#include "tests/unit/core_test_util.h"

namespace gpucompute {
namespace {

using testing::DTypeTag;
using testing::kAllDTypes;

std::unique_ptr<Device> OneDevice() { return std::move(CreateCpuDevices(1, {})[0]); }

Device& SharedDevice() {
  static Device* device = OneDevice().release();
  return *device;
}

// A device of one thread: one task per shard, cut into blocks the same way
// on any machine.
std::unique_ptr<Device> OneThreadDevice() {
  return std::make_unique<CpuDevice>(DeviceDescription{}, 1);
}

// ---------------------------------------------------------------------------
// GEMM
// ---------------------------------------------------------------------------
struct GemmShape {
  int64_t batch, m, n, k;
  bool trans_a, trans_b;
  double alpha, beta;
  bool b_batched = true;
};

const GemmShape kGemmShapes[] = {
    {1, 1, 1, 1, false, false, 1, 0},        {1, 7, 33, 127, false, false, 1, 0},
    {1, 33, 127, 7, true, false, 1, 0},      {1, 127, 7, 33, false, true, 1.5, 0},
    {1, 1000, 33, 7, true, true, 1, 0},      {1, 7, 1000, 33, false, false, 1, -0.5},
    {1, 33, 7, 1000, false, false, -2, 0.5}, {3, 127, 33, 127, true, false, 1, 1, false},
    {2, 33, 127, 7, false, true, 0.5, 2},    {1, 1000, 1000, 1, false, false, 1, 0},
    {1, 5, 3, 0, false, false, 1, 0.5},
};

using GemmParam = std::tuple<GemmShape, DType, std::string>;

class CpuGemmTest : public ::testing::TestWithParam<GemmParam> {};

TEST_P(CpuGemmTest, MatchesReference) {
  const auto& [shape, dtype, variant] = GetParam();
  testing::GemmCase g =
      testing::MakeGemm(dtype, shape.batch, shape.m, shape.n, shape.k, shape.trans_a, shape.trans_b,
                        shape.alpha, shape.beta, shape.b_batched);
  g.spec.options.variant = variant;
  HostTensor out = testing::FilledTensor(dtype, g.spec.out_shape, 0xff);
  absl::StatusOr<ShardRun> run = SharedDevice().Gemm(g.spec, {0, shape.m}, out.mutable_data());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->variant, variant);
  const double rtol = reference::Rtol(dtype, shape.k);
  const double atol = rtol * (std::abs(shape.alpha) * std::sqrt(double(shape.k)) + 1.0);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(out), g.Reference(), atol, rtol), "");
}

std::string GemmName(const ::testing::TestParamInfo<GemmParam>& info) {
  const auto& [s, dtype, variant] = info.param;
  return absl::StrCat(variant, "_b", s.batch, "_M", s.m, "_N", s.n, "_K", s.k,
                      s.trans_a ? "_ta" : "", s.trans_b ? "_tb" : "", s.beta != 0 ? "_beta" : "",
                      s.b_batched ? "" : "_sharedB", "_", DTypeTag(dtype));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuGemmTest,
                         ::testing::Combine(::testing::ValuesIn(kGemmShapes),
                                            ::testing::ValuesIn(kAllDTypes),
                                            ::testing::Values("openblas", "naive")),
                         GemmName);

// A large resident buffer goes back to LargeStringCache when freed and
// serves the next one of its size; what it held is written over, never read.
TEST(CpuDeviceMemory, LargeBuffersAreKeptForTheNextAllocation) {
  LargeStringCache& cache = LargeStringCache::Default();
  cache.SetCapacity(int64_t{1} << 30);
  std::unique_ptr<Device> device = OneThreadDevice();
  const int64_t bytes = int64_t{LargeStringCache::kMinBytes} + 300;
  std::string ones(static_cast<size_t>(bytes), '\1');
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> first = device->Allocate(bytes);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(device->Write(**first, 0, ones.data(), bytes).ok());
  const void* data = (*first)->data();
  first->reset();
  EXPECT_GE(cache.kept_bytes(), bytes);
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> second = device->Allocate(bytes - 100);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->data(), data);
  EXPECT_EQ((*second)->bytes(), bytes - 100);
  std::string twos(static_cast<size_t>(bytes - 100), '\2');
  ASSERT_TRUE(device->Write(**second, 0, twos.data(), bytes - 100).ok());
  std::string back(static_cast<size_t>(bytes - 100), '\0');
  ASSERT_TRUE(device->Read(**second, 0, back.data(), bytes - 100).ok());
  EXPECT_EQ(back, twos);
  second->reset();
  cache.SetCapacity(0);
}

TEST(CpuGemm, ShardWritesOnlyItsRows) {
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 2, 33, 7, 127, false, false, 1, 0);
  HostTensor out = testing::FilledTensor(DType::kFloat32, g.spec.out_shape, 0);
  ASSERT_TRUE(SharedDevice().Gemm(g.spec, {10, 20}, out.mutable_data()).ok());
  const std::vector<double> want = g.Reference();
  const std::vector<double> got = testing::Doubles(out);
  for (int64_t e = 0; e < 2; ++e) {
    for (int64_t i = 0; i < 33; ++i) {
      for (int64_t j = 0; j < 7; ++j) {
        const size_t idx = size_t((e * 33 + i) * 7 + j);
        if (i >= 10 && i < 20) {
          EXPECT_NEAR(got[idx], want[idx], 1e-4);
        } else {
          EXPECT_EQ(got[idx], 0.0) << "row " << i << " is outside the shard";
        }
      }
    }
  }
}

TEST(CpuGemm, NanInCIsNotReadWhenBetaIsZero) {
  for (DType dtype : kAllDTypes) {
    testing::GemmCase g = testing::MakeGemm(dtype, 1, 33, 7, 127);
    HostTensor c = testing::FilledTensor(dtype, {33, 7}, 0xff);  // NaN everywhere
    g.spec.c = c.view();
    g.spec.beta = 0;
    HostTensor out = testing::FilledTensor(dtype, g.spec.out_shape, 0xff);
    for (const char* variant : {"openblas", "naive"}) {
      g.spec.options.variant = variant;
      ASSERT_TRUE(SharedDevice().Gemm(g.spec, {0, 33}, out.mutable_data()).ok());
      for (double v : testing::Doubles(out)) ASSERT_TRUE(std::isfinite(v)) << variant;
    }
  }
}

TEST(CpuGemm, OutputDtypeDiffersFromInput) {
  testing::GemmCase g = testing::MakeGemm(DType::kBFloat16, 1, 127, 33, 64, false, true, 1, 0.5);
  g.spec.options.output_dtype = DType::kFloat32;
  HostTensor out = HostTensor::Allocate(DType::kFloat32, g.spec.out_shape);
  ASSERT_TRUE(SharedDevice().Gemm(g.spec, {0, 127}, out.mutable_data()).ok());
  const double rtol = reference::Rtol(DType::kFloat32, 64);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(out), g.Reference(), rtol * 10, rtol), "");

  testing::GemmCase h = testing::MakeGemm(DType::kFloat32, 1, 33, 127, 7);
  h.spec.options.output_dtype = DType::kFloat16;
  HostTensor half = HostTensor::Allocate(DType::kFloat16, h.spec.out_shape);
  ASSERT_TRUE(SharedDevice().Gemm(h.spec, {0, 33}, half.mutable_data()).ok());
  const double hrtol = reference::Rtol(DType::kFloat16, 7);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(half), h.Reference(), hrtol, hrtol), "");
}

TEST(CpuGemm, UnknownVariantIsInvalidArgument) {
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 7, 7, 7);
  g.spec.options.variant = "cutlass";
  HostTensor out = HostTensor::Allocate(DType::kFloat32, g.spec.out_shape);
  absl::StatusOr<ShardRun> run = SharedDevice().Gemm(g.spec, {0, 7}, out.mutable_data());
  ASSERT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(run.status().message().find("options.variant"), std::string::npos);
  EXPECT_NE(run.status().message().find("openblas"), std::string::npos);
}

// ---------------------------------------------------------------------------
// GEMV
// ---------------------------------------------------------------------------
struct GemvShape {
  int64_t m, k, ncols;
  bool trans_a;
  double alpha, beta;
};

const GemvShape kGemvShapes[] = {
    {1, 1, 1, false, 1, 0},      {7, 33, 1, true, 1, 0},      {33, 127, 3, false, 1, 0.5},
    {127, 1000, 1, false, 2, 0}, {1000, 7, 8, true, 1, -1},   {1000, 1000, 1, true, 1, 0},
    {1000, 127, 5, false, 1, 0}, {33, 1, 1, false, -1, 0.25}, {9, 0, 2, false, 1, 0.5},
};

using GemvParam = std::tuple<GemvShape, DType, std::string>;

class CpuGemvTest : public ::testing::TestWithParam<GemvParam> {};

TEST_P(CpuGemvTest, MatchesReference) {
  const auto& [shape, dtype, variant] = GetParam();
  testing::GemvCase g = testing::MakeGemv(dtype, shape.m, shape.k, shape.ncols, shape.trans_a,
                                          shape.alpha, shape.beta);
  g.spec.options.variant = variant;
  HostTensor out = testing::FilledTensor(dtype, g.spec.out_shape, 0xff);
  absl::StatusOr<ShardRun> run = SharedDevice().Gemv(g.spec, {0, shape.m}, out.mutable_data());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->variant, variant);
  const double rtol = reference::Rtol(dtype, shape.k);
  const double atol = rtol * (std::abs(shape.alpha) * std::sqrt(double(shape.k)) + 1.0);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(out), g.Reference(), atol, rtol), "");
}

std::string GemvName(const ::testing::TestParamInfo<GemvParam>& info) {
  const auto& [s, dtype, variant] = info.param;
  return absl::StrCat(variant, "_M", s.m, "_K", s.k, "_n", s.ncols, s.trans_a ? "_ta" : "",
                      s.beta != 0 ? "_beta" : "", "_", DTypeTag(dtype));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuGemvTest,
                         ::testing::Combine(::testing::ValuesIn(kGemvShapes),
                                            ::testing::ValuesIn(kAllDTypes),
                                            ::testing::Values("openblas", "naive")),
                         GemvName);

TEST(CpuGemv, NanInYIsNotReadWhenBetaIsZero) {
  testing::GemvCase g = testing::MakeGemv(DType::kFloat32, 127, 33, 1);
  HostTensor y = testing::FilledTensor(DType::kFloat32, {127}, 0xff);
  g.spec.y = y.view();
  HostTensor out = testing::FilledTensor(DType::kFloat32, {127}, 0xff);
  ASSERT_TRUE(SharedDevice().Gemv(g.spec, {0, 127}, out.mutable_data()).ok());
  for (double v : testing::Doubles(out)) ASSERT_TRUE(std::isfinite(v));
}

// ---------------------------------------------------------------------------
// Reduce
// ---------------------------------------------------------------------------
struct ReduceShape {
  std::vector<int64_t> shape;
  int axis;  // -1: every element
};

const ReduceShape kReduceShapes[] = {
    {{1}, -1},       {{7}, -1},         {{1000}, -1},    {{33, 127}, -1},    {{127, 33}, 0},
    {{127, 33}, 1},  {{7, 33, 127}, 1}, {{1000, 7}, 0},  {{7, 1000}, 1},     {{1, 1000, 7}, 2},
    {{33, 1, 7}, 1}, {{3, 70000}, 1},   {{70000, 3}, 0}, {{2, 40000, 9}, 1},
};

const ReduceKind kReduceKinds[] = {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMin,
                                   ReduceKind::kMean};

std::string KindName(ReduceKind k) {
  switch (k) {
    case ReduceKind::kSum:
      return "sum";
    case ReduceKind::kMax:
      return "max";
    case ReduceKind::kMin:
      return "min";
    case ReduceKind::kMean:
      return "mean";
  }
  return "?";
}

// Tolerances for a reduction of `n` elements in [-1, 1) stored in `dtype`.
void ReduceTolerance(ReduceKind kind, DType dtype, int64_t n, double* atol, double* rtol) {
  if (kind == ReduceKind::kMax || kind == ReduceKind::kMin) {
    *atol = 0;  // exact: the result is one of the inputs
    *rtol = 0;
    return;
  }
  *rtol = reference::Rtol(dtype, n);
  *atol = reference::Rtol(DType::kFloat32, n) * std::sqrt(double(std::max<int64_t>(n, 1)));
  if (kind == ReduceKind::kMean) *atol /= double(std::max<int64_t>(n, 1));
}

using ReduceParam = std::tuple<ReduceShape, ReduceKind, DType>;

class CpuReduceTest : public ::testing::TestWithParam<ReduceParam> {};

TEST_P(CpuReduceTest, MatchesReference) {
  const auto& [shape, kind, dtype] = GetParam();
  testing::ReduceCase r = testing::MakeReduce(dtype, shape.shape, shape.axis, kind);
  const ReduceSpec& s = r.spec;
  HostTensor out = testing::FilledTensor(dtype, s.out_shape, 0xff);
  absl::StatusOr<ShardRun> run =
      SharedDevice().Reduce(s, {0, s.outer}, {0, s.axis_len}, false, out.mutable_data());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->variant, "cpu");
  double atol, rtol;
  ReduceTolerance(kind, dtype, s.axis_len, &atol, &rtol);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(out), testing::RoundTo(dtype, r.Reference()),
                                    atol, rtol),
            "");
}

std::string ReduceName(const ::testing::TestParamInfo<ReduceParam>& info) {
  const auto& [s, kind, dtype] = info.param;
  std::string name = KindName(kind);
  for (int64_t d : s.shape) absl::StrAppend(&name, "_", d);
  absl::StrAppend(&name, s.axis < 0 ? "_all" : absl::StrCat("_axis", s.axis), "_", DTypeTag(dtype));
  return name;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kReduceShapes),
                                            ::testing::ValuesIn(kReduceKinds),
                                            ::testing::ValuesIn(kAllDTypes)),
                         ReduceName);

TEST(CpuReduce, PartialsOfAnAxisRange) {
  for (ReduceKind kind : kReduceKinds) {
    for (DType dtype : kAllDTypes) {
      SCOPED_TRACE(KindName(kind) + "_" + DTypeTag(dtype));
      testing::ReduceCase r = testing::MakeReduce(dtype, {5, 1000, 3}, 1, kind);
      const Range outer{1, 4}, axis{100, 900};
      std::vector<float> partial(size_t(outer.size() * 3), -1.0f);
      ASSERT_TRUE(SharedDevice().Reduce(r.spec, outer, axis, true, partial.data()).ok());
      // Reference over the same slice: partials are sums (MEAN too), maxima, minima.
      const std::vector<double> in = testing::Doubles(r.input);
      const ReduceKind ref_kind = kind == ReduceKind::kMean ? ReduceKind::kSum : kind;
      std::vector<double> slice;
      for (int64_t o = outer.begin; o < outer.end; ++o) {
        for (int64_t a = axis.begin; a < axis.end; ++a) {
          for (int64_t i = 0; i < 3; ++i) slice.push_back(in[size_t((o * 1000 + a) * 3 + i)]);
        }
      }
      const std::vector<double> want =
          reference::Reduce(slice, outer.size(), axis.size(), 3, testing::ReferenceOp(ref_kind));
      double atol, rtol;
      ReduceTolerance(ref_kind, DType::kFloat32, axis.size(), &atol, &rtol);
      EXPECT_EQ(reference::CompareClose(std::vector<double>(partial.begin(), partial.end()),
                                        testing::RoundTo(DType::kFloat32, want), atol, rtol),
                "");
    }
  }
}

TEST(CpuReduce, ChunkPartialsMatchOnePartialPerChunk) {
  for (ReduceKind kind : kReduceKinds) {
    for (DType dtype : kAllDTypes) {
      SCOPED_TRACE(KindName(kind) + "_" + DTypeTag(dtype));
      // [2, 3.5 chunks, 3]; the chunks from the second on (one partial each).
      const int64_t axis_len = 3 * kReduceChunk + kReduceChunk / 2;
      testing::ReduceCase r = testing::MakeReduce(dtype, {2, axis_len, 3}, 1, kind);
      const Range outer{0, 2}, axis{kReduceChunk, axis_len};
      const int64_t per_chunk = 2 * 3;
      std::vector<float> all(static_cast<size_t>(3 * per_chunk));
      std::vector<float> one(static_cast<size_t>(per_chunk));
      ASSERT_TRUE(SharedDevice().ReduceChunks(r.spec, outer, axis, all.data()).ok());
      for (int64_t c = 0; c < 3; ++c) {
        const Range chunk{axis.begin + c * kReduceChunk,
                          std::min(axis_len, axis.begin + (c + 1) * kReduceChunk)};
        ASSERT_TRUE(SharedDevice().Reduce(r.spec, outer, chunk, true, one.data()).ok());
        EXPECT_EQ(std::memcmp(one.data(), all.data() + c * per_chunk, one.size() * 4), 0)
            << "chunk " << c;
      }
    }
  }
}

TEST(CpuReduce, NanPropagates) {
  for (ReduceKind kind : kReduceKinds) {
    for (DType dtype : kAllDTypes) {
      SCOPED_TRACE(KindName(kind) + "_" + DTypeTag(dtype));
      testing::ReduceCase r = testing::MakeReduce(dtype, {4, 100000}, 1, kind);
      // Row 1: NaN in the middle; row 2: NaN at the end (after the maximum);
      // rows 0 and 3 clean.
      testing::SetElement(r.input, 1 * 100000 + 50000, std::nanf(""));
      testing::SetElement(r.input, 2 * 100000 + 99999, std::nanf(""));
      r.spec.input = r.input.view();
      HostTensor out = HostTensor::Allocate(dtype, {4});
      ASSERT_TRUE(
          SharedDevice().Reduce(r.spec, {0, 4}, {0, 100000}, false, out.mutable_data()).ok());
      const std::vector<double> got = testing::Doubles(out);
      EXPECT_FALSE(std::isnan(got[0]));
      EXPECT_TRUE(std::isnan(got[1]));
      EXPECT_TRUE(std::isnan(got[2]));
      EXPECT_FALSE(std::isnan(got[3]));
    }
  }
}

TEST(CpuReduce, InfinitiesAreKept) {
  testing::ReduceCase r = testing::MakeReduce(DType::kFloat32, {3, 7}, 1, ReduceKind::kMax);
  testing::SetElement(r.input, 3, std::numeric_limits<float>::infinity());
  testing::SetElement(r.input, 7 + 2, -std::numeric_limits<float>::infinity());
  r.spec.input = r.input.view();
  HostTensor out = HostTensor::Allocate(DType::kFloat32, {3});
  ASSERT_TRUE(SharedDevice().Reduce(r.spec, {0, 3}, {0, 7}, false, out.mutable_data()).ok());
  EXPECT_EQ(testing::Doubles(out), testing::RoundTo(DType::kFloat32, r.Reference()));
}

TEST(CpuReduce, TenMillionElementSumStaysAccurate) {
  // Positive values: a sequential fp32 sum would lose ~1e-3 relative here.
  testing::ReduceCase r =
      testing::MakeReduce(DType::kFloat32, {10'000'000}, -1, ReduceKind::kSum, 0.0, 1.0);
  HostTensor out = HostTensor::Allocate(DType::kFloat32, {});
  ASSERT_TRUE(
      SharedDevice().Reduce(r.spec, {0, 1}, {0, r.spec.axis_len}, false, out.mutable_data()).ok());
  const double want = r.Reference()[0];
  const double got = testing::Doubles(out)[0];
  // Pairwise: error grows with log2(n) ulps at most; allow 16 ulps of the sum.
  EXPECT_LE(std::abs(got - want), 16 * std::ldexp(1.0, -24) * want) << got << " vs " << want;
}

TEST(CpuReduce, EmptyAxisGivesIdentity) {
  HostTensor in = HostTensor::Allocate(DType::kFloat32, {3, 0});
  ReduceSpec s;
  s.input = in.view();
  s.outer = 3;
  s.axis_len = 0;
  s.inner = 1;
  s.out_shape = {3};
  s.options.output_dtype = DType::kFloat32;
  for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMean}) {
    s.kind = kind;
    HostTensor out = HostTensor::Allocate(DType::kFloat32, {3});
    ASSERT_TRUE(SharedDevice().Reduce(s, {0, 3}, {0, 0}, false, out.mutable_data()).ok());
    for (double v : testing::Doubles(out)) {
      if (kind == ReduceKind::kSum) {
        EXPECT_EQ(v, 0.0);
      } else {
        EXPECT_TRUE(std::isnan(v));
      }
    }
  }
}

TEST(CpuReduce, OutputDtypeDiffersFromInput) {
  testing::ReduceCase r = testing::MakeReduce(DType::kFloat16, {33, 127}, 1, ReduceKind::kSum);
  r.spec.options.output_dtype = DType::kFloat32;
  HostTensor out = HostTensor::Allocate(DType::kFloat32, {33});
  ASSERT_TRUE(SharedDevice().Reduce(r.spec, {0, 33}, {0, 127}, false, out.mutable_data()).ok());
  const double rtol = reference::Rtol(DType::kFloat32, 127);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(out), r.Reference(), rtol * 12, rtol), "");
}

// ---------------------------------------------------------------------------
// Transpose
// ---------------------------------------------------------------------------
struct TransposeShape {
  std::vector<int64_t> shape;
  std::vector<int> perm;
};

const TransposeShape kTransposeShapes[] = {
    {{1}, {0}},
    {{1000}, {0}},
    {{33, 127}, {1, 0}},
    {{1000, 7}, {1, 0}},
    {{7, 1000}, {1, 0}},
    {{1, 33}, {1, 0}},
    {{127, 127}, {0, 1}},
    {{7, 33, 127}, {0, 2, 1}},
    {{7, 33, 127}, {1, 0, 2}},
    {{7, 33, 127}, {1, 2, 0}},
    {{7, 33, 127}, {2, 0, 1}},
    {{7, 33, 127}, {2, 1, 0}},
    {{7, 1, 33, 5}, {3, 2, 1, 0}},
    {{7, 3, 33, 5}, {0, 2, 1, 3}},
    {{7, 3, 33, 5}, {2, 0, 3, 1}},
    {{5, 7, 3, 33}, {1, 3, 0, 2}},
    {{2, 33, 3, 1}, {3, 1, 0, 2}},
};

using TransposeParam = std::tuple<TransposeShape, DType>;

class CpuTransposeTest : public ::testing::TestWithParam<TransposeParam> {};

TEST_P(CpuTransposeTest, MatchesReferenceExactly) {
  const auto& [shape, dtype] = GetParam();
  testing::TransposeCase t = testing::MakeTranspose(dtype, shape.shape, shape.perm);
  HostTensor out = testing::FilledTensor(dtype, t.spec.out_shape, 0xff);
  // Every prefix length, the whole range.
  for (int prefix_axes = 0; prefix_axes < t.spec.rank; ++prefix_axes) {
    int64_t extent = 1;
    for (int a = 0; a < prefix_axes; ++a) extent *= t.spec.out_shape[a];
    absl::StatusOr<ShardRun> run =
        SharedDevice().Transpose(t.spec, prefix_axes, {0, extent}, out.mutable_data());
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->variant, "cpu_blocked");
    EXPECT_EQ(testing::Doubles(out), t.Reference()) << "prefix_axes " << prefix_axes;
  }
}

std::string TransposeName(const ::testing::TestParamInfo<TransposeParam>& info) {
  const auto& [s, dtype] = info.param;
  std::string name = "shape";
  for (int64_t d : s.shape) absl::StrAppend(&name, "_", d);
  absl::StrAppend(&name, "_perm");
  for (int p : s.perm) absl::StrAppend(&name, p);
  return absl::StrCat(name, "_", DTypeTag(dtype));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuTransposeTest,
                         ::testing::Combine(::testing::ValuesIn(kTransposeShapes),
                                            ::testing::ValuesIn(kAllDTypes)),
                         TransposeName);

TEST(CpuTranspose, ShardsWriteOnlyTheirBlocks) {
  // Out [127, 7, 33] from in [7, 33, 127] (perm 2, 0, 1); shards cut through
  // the prefix at odd places and together cover it once.
  testing::TransposeCase t = testing::MakeTranspose(DType::kFloat32, {7, 33, 127}, {2, 0, 1});
  const std::vector<double> want = t.Reference();
  for (int prefix_axes : {1, 2}) {
    const int64_t extent = prefix_axes == 1 ? 127 : 127 * 7;
    HostTensor out = testing::FilledTensor(DType::kFloat32, t.spec.out_shape, 0);
    const int64_t suffix = int64_t(want.size()) / extent;
    const std::vector<Range> shards = {{0, 5}, {5, 6}, {6, extent / 2}, {extent / 2, extent}};
    for (size_t s = 0; s < shards.size(); ++s) {
      ASSERT_TRUE(
          SharedDevice().Transpose(t.spec, prefix_axes, shards[s], out.mutable_data()).ok());
      const std::vector<double> got = testing::Doubles(out);
      for (size_t i = 0; i < got.size(); ++i) {
        const int64_t p = int64_t(i) / suffix;
        if (p < shards[s].end) {
          ASSERT_EQ(got[i], want[i]) << "element " << i;
        } else {
          ASSERT_EQ(got[i], 0.0) << "element " << i << " written by shard " << s;
        }
      }
    }
  }
}

TEST(CpuTranspose, ConvertsToTheOutputDtype) {
  testing::TransposeCase t = testing::MakeTranspose(DType::kFloat32, {33, 127}, {1, 0});
  for (DType out_dtype : {DType::kFloat16, DType::kBFloat16}) {
    t.spec.options.output_dtype = out_dtype;
    HostTensor out = HostTensor::Allocate(out_dtype, t.spec.out_shape);
    ASSERT_TRUE(SharedDevice().Transpose(t.spec, 1, {0, 127}, out.mutable_data()).ok());
    EXPECT_EQ(testing::Doubles(out), testing::RoundTo(out_dtype, t.Reference()));
  }
}

// ---------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------
struct AttentionShape {
  int64_t batch, heads_q, heads_kv, seq_q, seq_kv, head_dim;
  bool causal;
};

const AttentionShape kAttentionShapes[] = {
    {1, 1, 1, 1, 1, 64, false},     {1, 2, 1, 7, 33, 64, true},     {2, 4, 2, 33, 7, 64, true},
    {1, 1, 1, 127, 127, 128, true}, {1, 2, 2, 1000, 33, 64, false}, {1, 1, 1, 33, 1000, 128, true},
    {1, 3, 1, 7, 127, 128, false},  {2, 2, 1, 127, 1, 64, true},
};

using AttentionParam = std::tuple<AttentionShape, DType>;

class CpuAttentionTest : public ::testing::TestWithParam<AttentionParam> {};

TEST_P(CpuAttentionTest, MatchesReference) {
  const auto& [shape, dtype] = GetParam();
  testing::AttentionCase a =
      testing::MakeAttention(dtype, shape.batch, shape.heads_q, shape.heads_kv, shape.seq_q,
                             shape.seq_kv, shape.head_dim, shape.causal);
  HostTensor out = testing::FilledTensor(dtype, a.spec.out_shape, 0xff);
  HostTensor lse =
      testing::FilledTensor(DType::kFloat32, {shape.batch, shape.heads_q, shape.seq_q}, 0xff);
  absl::StatusOr<ShardRun> run =
      SharedDevice().Attention(a.spec, {0, shape.batch * shape.heads_q}, {0, shape.seq_q},
                               out.mutable_data(), reinterpret_cast<float*>(lse.mutable_data()));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->variant, "cpu_online_softmax");
  const reference::AttentionResult want = a.Reference();
  // O is a convex combination of V rows in [-1, 1).
  const double rtol = reference::Rtol(dtype, shape.head_dim);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(out), want.o, rtol + 1e-5, rtol), "");
  EXPECT_EQ(reference::CompareClose(testing::Doubles(lse), want.lse, 1e-4, 1e-5), "");
  for (double v : testing::Doubles(out)) ASSERT_FALSE(std::isnan(v));
}

std::string AttentionName(const ::testing::TestParamInfo<AttentionParam>& info) {
  const auto& [s, dtype] = info.param;
  return absl::StrCat("B", s.batch, "_Hq", s.heads_q, "_Hkv", s.heads_kv, "_Sq", s.seq_q, "_Skv",
                      s.seq_kv, "_D", s.head_dim, s.causal ? "_causal" : "", "_", DTypeTag(dtype));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuAttentionTest,
                         ::testing::Combine(::testing::ValuesIn(kAttentionShapes),
                                            ::testing::ValuesIn(kAllDTypes)),
                         AttentionName);

TEST(CpuAttention, RowsWithoutKeysAreZeroWithMinusInfLse) {
  // Causal with Sq > Skv: the first Sq - Skv query rows see no key.
  testing::AttentionCase a = testing::MakeAttention(DType::kFloat32, 1, 2, 1, 9, 4, 64, true);
  HostTensor out = testing::FilledTensor(DType::kFloat32, a.spec.out_shape, 0xff);
  std::vector<float> lse(2 * 9, 0.0f);
  ASSERT_TRUE(
      SharedDevice().Attention(a.spec, {0, 2}, {0, 9}, out.mutable_data(), lse.data()).ok());
  const std::vector<double> o = testing::Doubles(out);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 9; ++i) {
      const bool empty = i < 5;
      EXPECT_EQ(std::isinf(lse[size_t(h * 9 + i)]) && lse[size_t(h * 9 + i)] < 0, empty) << i;
      for (int64_t d = 0; d < 64; ++d) {
        const double v = o[size_t((h * 9 + i) * 64 + d)];
        ASSERT_FALSE(std::isnan(v));
        if (empty) {
          ASSERT_EQ(v, 0.0);
        }
      }
    }
  }
}

TEST(CpuAttention, NanScoresMakeNanRowsNotEmptyOnes) {
  // Causal, 9 query rows against 20 keys (row i sees keys 0..i+11). A NaN in
  // key 15 of the one kv head reaches rows 4-8 of both heads; a NaN in row 2
  // of head 1's Q reaches that row alone. Those rows are NaN (O and LSE), as
  // in float64 and PyTorch's SDPA; the others are what the same inputs
  // without the NaNs give, bit for bit.
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeTag(dtype));
    testing::AttentionCase a = testing::MakeAttention(dtype, 1, 2, 1, 9, 20, 64, true);
    auto run = [&](const testing::AttentionCase& c, std::vector<double>* o,
                   std::vector<float>* lse) {
      HostTensor out = testing::FilledTensor(dtype, c.spec.out_shape, 0xff);
      lse->assign(2 * 9, 0.0f);
      ASSERT_TRUE(
          SharedDevice().Attention(c.spec, {0, 2}, {0, 9}, out.mutable_data(), lse->data()).ok());
      *o = testing::Doubles(out);
    };
    std::vector<double> clean_o, o;
    std::vector<float> clean_lse, lse;
    run(a, &clean_o, &clean_lse);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    testing::SetElement(a.k, 15 * 64 + 5, nan);
    testing::SetElement(a.q, (9 + 2) * 64 + 0, nan);
    run(a, &o, &lse);
    const reference::AttentionResult want = a.Reference();
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 9; ++i) {
        const size_t row = size_t(h * 9 + i);
        const bool poisoned = i >= 4 || (h == 1 && i == 2);
        EXPECT_EQ(std::isnan(want.lse[row]), poisoned) << "reference row " << row;
        EXPECT_EQ(std::isnan(lse[row]), poisoned) << "row " << row;
        if (!poisoned) EXPECT_EQ(lse[row], clean_lse[row]) << "row " << row;
        for (int64_t d = 0; d < 64; ++d) {
          const size_t e = row * 64 + size_t(d);
          if (poisoned) {
            ASSERT_TRUE(std::isnan(o[e])) << "row " << row << " col " << d;
          } else {
            ASSERT_EQ(o[e], clean_o[e]) << "row " << row << " col " << d;
          }
        }
      }
    }
  }
}

TEST(CpuAttention, QueryRowShardsCoverTheWhole) {
  testing::AttentionCase a = testing::MakeAttention(DType::kBFloat16, 1, 1, 1, 100, 70, 64, true);
  HostTensor out = HostTensor::Allocate(DType::kBFloat16, a.spec.out_shape);
  std::vector<float> lse(100);
  for (Range rows : {Range{0, 37}, Range{37, 38}, Range{38, 100}}) {
    ASSERT_TRUE(
        SharedDevice().Attention(a.spec, {0, 1}, rows, out.mutable_data(), lse.data()).ok());
  }
  const reference::AttentionResult want = a.Reference();
  const double rtol = reference::Rtol(DType::kBFloat16, 64);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(out), want.o, rtol, rtol), "");
  EXPECT_EQ(
      reference::CompareClose(std::vector<double>(lse.begin(), lse.end()), want.lse, 1e-4, 1e-5),
      "");
}

// ---------------------------------------------------------------------------
// Work in blocks, and cancellation between them
// ---------------------------------------------------------------------------

// Rows `rows` of the GEMM of `g` in float64 (a sample: the whole reference of
// a large GEMM takes seconds).
std::vector<double> GemmReferenceRows(const testing::GemmCase& g,
                                      const std::vector<int64_t>& rows) {
  const GemmSpec& s = g.spec;
  const std::vector<double> a = testing::Doubles(g.a), b = testing::Doubles(g.b);
  std::vector<double> c;
  if (g.c) c = testing::Doubles(*g.c);
  std::vector<double> out;
  for (int64_t i : rows) {
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        sum += a[size_t(s.trans_a ? p * s.m + i : i * s.k + p)] *
               b[size_t(s.trans_b ? j * s.k + p : p * s.n + j)];
      }
      out.push_back(s.alpha * sum + (g.c ? s.beta * c[size_t(i * s.n + j)] : 0.0));
    }
  }
  return out;
}

TEST(CpuBlocks, GemmInCallsOfBoundedWorkMatchesReference) {
  // Large enough that the one task is cut into several CBLAS calls: along
  // the rows (2048 x 1024 x 1024), along both (512 x 4096 x 1024).
  std::unique_ptr<Device> device = OneThreadDevice();
  struct Case {
    int64_t m, n, k;
    bool trans_b;
    double beta;
    DType dtype;
  };
  for (const Case& c : {Case{2048, 1024, 1024, false, 0.5, DType::kFloat32},
                        Case{512, 4096, 1024, true, 0, DType::kBFloat16}}) {
    SCOPED_TRACE(absl::StrCat(c.m, "x", c.n, "x", c.k, " ", testing::DTypeTag(c.dtype)));
    testing::GemmCase g =
        testing::MakeGemm(c.dtype, 1, c.m, c.n, c.k, false, c.trans_b, 1.0, c.beta);
    HostTensor out = testing::FilledTensor(c.dtype, g.spec.out_shape, 0xff);
    ASSERT_TRUE(device->Gemm(g.spec, {0, c.m}, out.mutable_data()).ok());
    const std::vector<int64_t> rows = {0, 1, 255, 256, 511, c.m / 2, c.m / 2 + 1, c.m - 1};
    const std::vector<double> all = testing::Doubles(out);
    std::vector<double> got;
    for (int64_t i : rows) {
      got.insert(got.end(), all.begin() + i * c.n, all.begin() + (i + 1) * c.n);
    }
    const double rtol = reference::Rtol(c.dtype, c.k);
    EXPECT_EQ(reference::CompareClose(got, GemmReferenceRows(g, rows), rtol * std::sqrt(c.k), rtol),
              "");
  }
}

TEST(CpuBlocks, GemvInSubBlocksMatchesReference) {
  // fp32 A of 9000 x 1000: sub-blocks of 4194 rows.
  testing::GemvCase g = testing::MakeGemv(DType::kFloat32, 9000, 1000, 1, false, 1.0, 0.5);
  HostTensor out = testing::FilledTensor(DType::kFloat32, g.spec.out_shape, 0xff);
  ASSERT_TRUE(OneThreadDevice()->Gemv(g.spec, {0, 9000}, out.mutable_data()).ok());
  const double rtol = reference::Rtol(DType::kFloat32, 1000);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(out), g.Reference(), rtol * 32, rtol), "");
}

TEST(CpuBlocks, TransposeInPiecesIsExact) {
  // 2^24 elements and more on a device of one thread: its task moves them
  // in several pieces, through tiles (2-D) and as row copies (the last axis
  // kept).
  std::unique_ptr<Device> device = OneThreadDevice();
  struct Case {
    std::vector<int64_t> shape;
    std::vector<int> perm;
  };
  for (const Case& c : {Case{{4100, 4100}, {1, 0}}, Case{{64, 4100, 64}, {1, 0, 2}}}) {
    // Every element's bits differ from its neighbours' (random values would
    // take longer to make than the whole test).
    HostTensor input = HostTensor::Allocate(DType::kFloat16, c.shape);
    uint16_t* in = static_cast<uint16_t*>(input.mutable_data());
    for (int64_t i = 0; i < input.num_elements(); ++i) in[i] = uint16_t(i * 40503);
    TransposeSpec spec;
    spec.input = input.view();
    spec.rank = int(c.shape.size());
    for (int a = 0; a < spec.rank; ++a) {
      spec.in_shape[a] = c.shape[a];
      spec.perm[a] = c.perm[a];
      spec.out_shape.push_back(c.shape[c.perm[a]]);
    }
    spec.options.output_dtype = DType::kFloat16;
    HostTensor out = testing::FilledTensor(DType::kFloat16, spec.out_shape, 0xff);
    ASSERT_TRUE(device->Transpose(spec, 1, {0, spec.out_shape[0]}, out.mutable_data()).ok());
    // Element (i, j, l) of the output is element (j, i, l) of the input.
    const uint16_t* got = static_cast<const uint16_t*>(out.view().data);
    const int64_t d0 = c.shape[0], d1 = c.shape[1], d2 = c.shape.size() == 3 ? c.shape[2] : 1;
    int64_t wrong = 0;
    for (int64_t i = 0; i < d1; ++i) {
      for (int64_t j = 0; j < d0; ++j) {
        for (int64_t l = 0; l < d2; ++l) {
          wrong += got[(i * d0 + j) * d2 + l] != in[(j * d1 + i) * d2 + l];
        }
      }
    }
    EXPECT_EQ(wrong, 0) << "shape " << c.shape[0] << "x" << c.shape[1];
  }
}

TEST(CpuCancellation, EveryOperationOfACancelledCallStopsAtOnce) {
  const CancelCheck cancelled = [] { return true; };
  testing::GemmCase gemm = testing::MakeGemm(DType::kFloat32, 1, 64, 64, 64);
  gemm.spec.options.cancelled = cancelled;
  HostTensor c = testing::FilledTensor(DType::kFloat32, gemm.spec.out_shape, 0);
  EXPECT_EQ(SharedDevice().Gemm(gemm.spec, {0, 64}, c.mutable_data()).status().code(),
            absl::StatusCode::kCancelled);
  testing::GemvCase gemv = testing::MakeGemv(DType::kBFloat16, 64, 64, 1);
  gemv.spec.options.cancelled = cancelled;
  HostTensor y = testing::FilledTensor(DType::kBFloat16, gemv.spec.out_shape, 0);
  EXPECT_EQ(SharedDevice().Gemv(gemv.spec, {0, 64}, y.mutable_data()).status().code(),
            absl::StatusCode::kCancelled);
  testing::ReduceCase reduce = testing::MakeReduce(DType::kFloat32, {4, 1000}, 1, ReduceKind::kSum);
  reduce.spec.options.cancelled = cancelled;
  HostTensor r = testing::FilledTensor(DType::kFloat32, reduce.spec.out_shape, 0);
  EXPECT_EQ(SharedDevice()
                .Reduce(reduce.spec, {0, 4}, {0, 1000}, false, r.mutable_data())
                .status()
                .code(),
            absl::StatusCode::kCancelled);
  std::vector<float> partials(4 * 2);
  EXPECT_EQ(
      SharedDevice().ReduceChunks(reduce.spec, {0, 4}, {0, 1000}, partials.data()).status().code(),
      absl::StatusCode::kCancelled);
  testing::TransposeCase transpose = testing::MakeTranspose(DType::kFloat16, {33, 127}, {1, 0});
  transpose.spec.options.cancelled = cancelled;
  HostTensor t = testing::FilledTensor(DType::kFloat16, transpose.spec.out_shape, 0);
  EXPECT_EQ(SharedDevice().Transpose(transpose.spec, 1, {0, 127}, t.mutable_data()).status().code(),
            absl::StatusCode::kCancelled);
  testing::AttentionCase attention =
      testing::MakeAttention(DType::kFloat32, 1, 2, 1, 33, 65, 64, false);
  attention.spec.options.cancelled = cancelled;
  HostTensor o = testing::FilledTensor(DType::kFloat32, attention.spec.out_shape, 0);
  std::vector<float> lse(2 * 33);
  EXPECT_EQ(SharedDevice()
                .Attention(attention.spec, {0, 2}, {0, 33}, o.mutable_data(), lse.data())
                .status()
                .code(),
            absl::StatusCode::kCancelled);
}

TEST(CpuCancellation, GemmStopsBetweenBlocks) {
  // Naive 512^3 on one thread: four blocks of 128 rows, each many
  // milliseconds. The call is cancelled once the first block has started.
  std::unique_ptr<Device> device = OneThreadDevice();
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 512, 512, 512);
  g.spec.options.variant = "naive";
  std::atomic<int> asked{0};
  g.spec.options.cancelled = [&asked] { return ++asked > 1; };
  HostTensor out = testing::FilledTensor(DType::kFloat32, g.spec.out_shape, 0xff);
  absl::StatusOr<ShardRun> run = device->Gemm(g.spec, {0, 512}, out.mutable_data());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kCancelled) << run.status();
  EXPECT_EQ(asked.load(), 2) << "asked again after saying stop";
  // The last rows were never computed.
  const std::vector<double> got = testing::Doubles(out);
  EXPECT_TRUE(std::isnan(got.back()));
}

TEST(CpuCancellation, ACheckThatNeverFiresChangesNoBit) {
  for (const char* variant : {"openblas", "naive"}) {
    SCOPED_TRACE(variant);
    testing::GemmCase g =
        testing::MakeGemm(DType::kBFloat16, 2, 300, 200, 100, true, false, 1, 0.5);
    g.spec.options.variant = variant;
    HostTensor plain = testing::FilledTensor(DType::kBFloat16, g.spec.out_shape, 0);
    ASSERT_TRUE(SharedDevice().Gemm(g.spec, {0, 300}, plain.mutable_data()).ok());
    g.spec.options.cancelled = [] { return false; };
    HostTensor checked = testing::FilledTensor(DType::kBFloat16, g.spec.out_shape, 0);
    ASSERT_TRUE(SharedDevice().Gemm(g.spec, {0, 300}, checked.mutable_data()).ok());
    EXPECT_EQ(plain.data, checked.data);
  }
}

TEST(CpuDevices, FactoryDescribesEveryDevice) {
  std::vector<std::unique_ptr<Device>> devices = CreateCpuDevices(3, {1, 2, 0.5});
  ASSERT_EQ(devices.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const DeviceDescription& d = devices[i]->description();
    EXPECT_EQ(d.index, i);
    EXPECT_EQ(d.kind, "cpu");
    EXPECT_EQ(d.name.rfind(absl::StrCat("cpu:", i, " ("), 0), 0u) << d.name;
    EXPECT_GE(d.compute_units, 1);
    EXPECT_GT(d.memory_bytes, 0);
    EXPECT_EQ(d.peers.size(), 2u);
    EXPECT_TRUE(devices[i]->healthy());
    EXPECT_EQ(devices[i]->Variants(OpKind::kGemm), (std::vector<std::string>{"openblas", "naive"}));
    EXPECT_EQ(devices[i]->Variants(OpKind::kAttention),
              (std::vector<std::string>{"cpu_online_softmax"}));
  }
  EXPECT_EQ(devices[1]->description().weight, 2.0);
  EXPECT_EQ(devices[2]->description().weight, 0.5);
  EXPECT_EQ(CreateCpuDevices(2, {})[1]->description().weight, 1.0);
}

}  // namespace
}  // namespace gpucompute
