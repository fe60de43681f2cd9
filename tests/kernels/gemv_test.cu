// Tests of the GEMV ladder: every version x shape x dtype against a float64 CPU
// reference, with fresh random inputs, NaN-poisoned outputs, odd sizes and
// misaligned base pointers; plus determinism and the CanImplement refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpucompute/kernels/gemv.h"
#include "kernels/src/heuristics/gemv_heuristics.h"
#include "tests/kernels/gpu_test_util.h"

namespace gpucompute::testing {
namespace {

using kernels::GemvArgs;

struct Case {
  int64_t m, k;
  int ncols;
  bool trans;
  float beta = 0.f;     // 0: y is poisoned with NaN, which must not leak
  int offset = 0;       // elements by which A and x are shifted off alignment
  bool y_f32 = false;   // y in fp32 whatever the input dtype
  int64_t lda_pad = 0;  // lda = (trans ? m : k) + lda_pad
};

std::vector<Case> Cases() {
  std::vector<Case> base = {
      {1, 1, 1, false},
      {31, 33, 1, false},
      {33, 31, 3, false, -0.75f},
      {257, 1024, 1, false},
      {257, 1024, 4, false},
      {129, 1000, 8, false, 0.5f, 0, true},
      {300, 2000, 5, false, -0.75f},
      {64, 8192, 2, false},
      {4097, 4099, 1, false, 0.f, 0, false, 5},  // lda 4104: vector rows, a k tail
      {4097, 4099, 4, false},                    // lda 4099: odd rows
      {1, 1000003, 1, false},
      {1000003, 1, 2, false},
      {512, 512, 1, false, 0.f, 1},  // misaligned A and x
      {200, 300, 4, false, 0.5f, 1, true},
      {256, 3000, 4, false, 0.5f},  // A^T: 16-byte rows, vector x
      {512, 700, 8, false},
      {1024, 600, 1, false, 0.f, 0, false, 3},  // lda 603 / 1027: scalar rows
      {1100, 2000, 2, false},                   // A^T: a partial last tile
      {8192, 1024, 4, false},                   // A^T: 128-column tiles, k split 4 ways
      {1024, 4096, 8, false, 0.5f, 0, true},    // A^T: 64-column tiles, k split 8 ways
      {3001, 2000, 6, false, -0.75f},           // A^T: odd lda, rows 2 bytes off 4-byte words
      {1000, 3000, 3, false},                   // A^T: cp.async rows, a partial last tile
      {1001, 2500, 5, false, 0.5f, 0, false,
       7},  // A^T: lda 1008, 41 columns in the last tile, a k tail
      // A x: lda 40016; mma_ring: k split 8 ways, a partial last step, 8 rows
      // in the last tile.
      {200, 40010, 7, false, 0.5f, 0, false, 6},
      // A x: mma_ring_32's tiles over a 2-way split, a partial last tile.
      {1000, 4096, 6, false, -0.75f},
      // A x: mma_ring_32 on 157 tiles (more than a CTA per SM), a partial step.
      {5000, 700, 5, false},
  };
  std::vector<Case> all;
  for (Case c : base) {
    all.push_back(c);
    c.trans = true;
    all.push_back(c);
  }
  return all;
}

std::string CaseName(const Case& c) {
  std::string s = "M" + std::to_string(c.m) + "_K" + std::to_string(c.k) + "_N" + std::to_string(c.ncols);
  if (c.trans) s += "_T";
  if (c.beta != 0.f) s += "_beta";
  if (c.offset) s += "_off" + std::to_string(c.offset);
  if (c.y_f32) s += "_yf32";
  if (c.lda_pad) s += "_lda" + std::to_string((c.trans ? c.m : c.k) + c.lda_pad);
  return s;
}

using Param = std::tuple<std::string, Case, DType>;

class GemvTest : public ::testing::TestWithParam<Param> {};

// Runs `variant` on fresh inputs and checks y against a float64 reference.
// Tolerance: the fp32 accumulation error, bounded relative to sum |a x| (plus
// |beta y|), and one rounding of y to its dtype.
TEST_P(GemvTest, MatchesFloat64Reference) {
  GC_REQUIRE_GPU();
  const auto& [variant, c, dtype] = GetParam();
  const DType y_type = c.y_f32 ? DType::kF32 : dtype;
  const size_t es = kernels::DTypeSize(dtype);
  const int64_t lda = (c.trans ? c.m : c.k) + c.lda_pad;
  const int64_t a_rows = c.trans ? c.k : c.m;

  DeviceArray da(size_t(a_rows * lda) * es, c.offset * es), dx(size_t(c.k * c.ncols) * es, c.offset * es);
  DeviceArray dy(size_t(c.m * c.ncols) * kernels::DTypeSize(y_type));
  ASSERT_NE(da.get(), nullptr);

  GemvArgs args;
  args.m = c.m;
  args.k = c.k;
  args.a = da.get();
  args.lda = lda;
  args.trans_a = c.trans;
  args.x = dx.get();
  args.y = dy.get();
  args.ncols = c.ncols;
  args.dtype = dtype;
  args.y_type = y_type;
  args.alpha = 1.5f;
  args.beta = c.beta;

  const kernels::Support support = kernels::CanImplementGemv(args, variant);
  if (!support) GTEST_SKIP() << "refused: " << support.reason;

  HostData a = RandomHost(size_t(a_rows * lda), dtype);
  HostData x = RandomHost(size_t(c.k * c.ncols), dtype);
  HostData y0 = RandomHost(size_t(c.m * c.ncols), y_type);
  da.Upload(a.bytes.data());
  dx.Upload(x.bytes.data());

  const size_t ws_bytes = kernels::GemvWorkspaceBytes(args, variant);
  DeviceArray ws(ws_bytes);
  ws.Poison();  // the launch must not depend on the workspace's contents

  // Reference.
  std::vector<double> ref(size_t(c.m * c.ncols)), bound(ref.size());
  for (int64_t i = 0; i < c.m; ++i) {
    for (int col = 0; col < c.ncols; ++col) {
      double s = 0, b = 0;
      for (int64_t j = 0; j < c.k; ++j) {
        const double av = c.trans ? a.values[size_t(j * lda + i)] : a.values[size_t(i * lda + j)];
        const double p = av * x.values[size_t(j * c.ncols + col)];
        s += p;
        b += std::fabs(p);
      }
      const size_t o = size_t(i * c.ncols + col);
      ref[o] = 1.5 * s + (c.beta != 0.f ? double(c.beta) * y0.values[o] : 0.0);
      bound[o] = 1.5 * b + (c.beta != 0.f ? std::fabs(double(c.beta) * y0.values[o]) : 0.0);
    }
  }

  // Two launches on the same workspace: the second checks that the first left
  // nothing behind that changes the result (bitwise the same output).
  std::vector<uint8_t> got(y0.bytes.size()), first(y0.bytes.size());
  for (int run = 0; run < 2; ++run) {
    if (c.beta != 0.f) dy.Upload(y0.bytes.data());
    else dy.Poison();
    GC_ASSERT_CUDA(kernels::LaunchGemv(args, variant, ws.get(), nullptr));
    GC_ASSERT_CUDA(cudaDeviceSynchronize());
    dy.Download(run == 0 ? first.data() : got.data());
  }
  EXPECT_EQ(got, first) << "two launches on the same inputs differ";

  const double rtol = DefaultRtol(y_type);
  size_t bad = 0;
  std::string msg;
  for (size_t o = 0; o < ref.size(); ++o) {
    const double g = LoadHost(got.data(), o, y_type);
    const double tol = 1e-5 * bound[o] + rtol * std::fabs(ref[o]) + 1e-6;
    if (!(std::fabs(g - ref[o]) <= tol) && bad++ < 5)
      msg += " [" + std::to_string(o) + "] got " + std::to_string(g) + " want " + std::to_string(ref[o]) + ";";
  }
  EXPECT_EQ(bad, 0u) << bad << " of " << ref.size() << " out of tolerance:" << msg;
}

std::vector<std::string> VariantsAndDefault() {
  std::vector<std::string> v = kernels::GemvVariants();
  v.insert(v.begin(), "");
  return v;
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto& [variant, c, dtype] = info.param;
  return (variant.empty() ? std::string("default") : variant) + "_" + CaseName(c) + "_" +
         kernels::DTypeName(dtype);
}

INSTANTIATE_TEST_SUITE_P(Ladder, GemvTest,
                         ::testing::Combine(::testing::ValuesIn(VariantsAndDefault()),
                                            ::testing::ValuesIn(Cases()),
                                            ::testing::Values(DType::kF32, DType::kF16, DType::kBF16)),
                         ParamName);

// The default's choice is named: what shard timings report.
TEST(GemvVariants, DefaultIsNamed) {
  kernels::GemvArgs a;
  a.a = reinterpret_cast<void*>(0x10000);
  a.x = reinterpret_cast<void*>(0x20000);
  a.y = reinterpret_cast<void*>(0x30000);
  a.m = 1024;
  a.k = 50000;
  a.lda = 50000;
  a.dtype = DType::kBF16;
  a.y_type = DType::kBF16;
  // Few rows, long ones: several warps share each row group.
  const std::string wide = kernels::GemvVariantName(a, "");
  EXPECT_EQ(wide.rfind("batched_w", 0), 0u) << wide;
  a.m = 1 << 20;
  a.k = 64;
  a.lda = 64;
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "batched");  // short rows
  a.k = a.lda = 4096;
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "vec16");  // rows that fill the machine alone
  a.ncols = 8;
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "cublas");  // 16-bit, many columns, 8 GiB: the vendor
  a.y_type = DType::kF16;  // an output dtype cuBLAS does not write from bf16: ours
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "mma_ring");
  a.y_type = DType::kBF16;
  a.m = 4096;  // 32 MiB of A: ours, on the tensor cores
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "mma_ring");
  a.x = reinterpret_cast<void*>(0x20002);  // x off 16 bytes: the vendor
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "cublas");
  a.x = reinterpret_cast<void*>(0x20000);
  a.m = 1 << 20;
  a.dtype = a.y_type = DType::kF32;
  EXPECT_EQ(kernels::GemvVariantName(a, "").rfind("scalar", 0), 0u);  // fp32, many columns
  a.ncols = 1;
  a.k = a.lda = 64;
  a.trans_a = true;
  a.lda = a.m;
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "cublas");  // A^T x: the vendor
  a.y_type = DType::kBF16;
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "trans_split");
  EXPECT_EQ(kernels::GemvVariantName(a, "cublas"), "");  // refused: fp32 in, bf16 out
  a.y_type = DType::kF32;
  EXPECT_EQ(kernels::GemvVariantName(a, "batched"), "");  // refused: A x only
  a.ncols = 4;
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "trans_split");  // fp32 A^T x, several columns: ours
  a.dtype = a.y_type = DType::kBF16;
  a.k = 8192;
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "trans_mma");  // 16-bit A^T x: the tensor cores
  a.y_type = DType::kF16;
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "trans_mma");  // and where cuBLAS cannot write y
  a.y_type = DType::kBF16;
  a.ncols = 1;
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "cublas");  // one column: the vendor's gemv
  a.ncols = 8;
  a.k = 1024;  // short columns over many tiles: the vendor
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "cublas");
  a.m = 3001;
  a.lda = 3001;  // odd lda, a few tiles: ours (register loads)
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "trans_mma");
  a.m = a.lda = 1 << 20;
  a.dtype = a.y_type = DType::kF32;
  a.ncols = 1;
  a.k = 64;
  a.trans_a = false;
  a.lda = 64;
  a.a = reinterpret_cast<void*>(0x10004);  // not 16-byte aligned
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "scalar");  // element loads, every column at once
  // fp16 rows that forbid 16-byte loads (odd lda), 4 columns, long rows: the
  // vendor; bf16 there, and fp16 on short rows: element loads.
  a.dtype = a.y_type = DType::kF16;
  a.a = reinterpret_cast<void*>(0x10000);
  a.m = 777;
  a.k = a.lda = 12345;
  a.ncols = 4;
  EXPECT_EQ(kernels::GemvVariantName(a, ""), "cublas");
  a.dtype = a.y_type = DType::kBF16;
  EXPECT_EQ(kernels::GemvVariantName(a, "").rfind("scalar", 0), 0u);
  a.dtype = a.y_type = DType::kF16;
  a.m = 12345;
  a.k = a.lda = 777;
  EXPECT_EQ(kernels::GemvVariantName(a, "").rfind("scalar", 0), 0u);
  a.ncols = 3;
  a.m = 777;
  a.k = a.lda = 12345;
  EXPECT_EQ(kernels::GemvVariantName(a, "").rfind("scalar", 0), 0u);
}

// Every listed variant name is lower-case and unique; the ladder is all there.
TEST(GemvVariants, NamesAreStable) {
  const auto& v = kernels::GemvVariants();
  for (const char* name : {"warp_row", "vec16", "smem_x", "batched", "trans_naive", "trans_split", "trans_wide"})
    EXPECT_NE(std::find(v.begin(), v.end(), name), v.end()) << name;
  for (const auto& n : v) {
    EXPECT_EQ(std::count(v.begin(), v.end(), n), 1) << n;
    for (char ch : n) EXPECT_FALSE(ch >= 'A' && ch <= 'Z') << n;
  }
}

// Refusals need no GPU: they are decided on the host before any launch.
TEST(GemvCanImplement, RefusesWhatItCannotRun) {
  alignas(16) static float buf[64];
  GemvArgs ok;
  ok.m = 4;
  ok.k = 8;
  ok.a = buf;
  ok.lda = 8;
  ok.x = buf;
  ok.y = buf;
  ASSERT_TRUE(kernels::CanImplementGemv(ok, "")) << kernels::CanImplementGemv(ok, "").reason;
  ASSERT_TRUE(kernels::CanImplementGemv(ok, "vec16"));

  auto refused = [](const GemvArgs& a, const char* variant) {
    const kernels::Support s = kernels::CanImplementGemv(a, variant);
    return !s.ok && !s.reason.empty();
  };
  EXPECT_TRUE(refused(ok, "no_such_variant"));
  GemvArgs b = ok;
  b.ncols = 0;
  EXPECT_TRUE(refused(b, ""));
  b.ncols = 9;
  EXPECT_TRUE(refused(b, "batched"));
  b = ok;
  b.ncols = 2;
  EXPECT_TRUE(refused(b, "vec16"));
  EXPECT_TRUE(refused(b, "smem_x"));
  EXPECT_FALSE(refused(b, "batched"));
  b = ok;
  b.lda = 7;
  EXPECT_TRUE(refused(b, "warp_row"));
  b = ok;
  b.a = buf + 1;  // 4-byte aligned only
  EXPECT_TRUE(refused(b, "vec16"));
  EXPECT_TRUE(refused(b, "batched"));
  EXPECT_FALSE(refused(b, "warp_row"));
  EXPECT_FALSE(refused(b, ""));  // the default falls back to a scalar version
  b = ok;
  b.lda = 10;  // rows not 16-byte aligned
  EXPECT_TRUE(refused(b, "smem_x"));
  b = ok;
  b.trans_a = true;  // A is [8, 4]: lda 8 >= m
  EXPECT_TRUE(refused(b, "warp_row"));
  EXPECT_FALSE(refused(b, "trans_split"));
  EXPECT_FALSE(refused(b, "trans_wide"));
  EXPECT_FALSE(refused(b, "trans_naive"));
  EXPECT_TRUE(refused(b, "trans_mma"));  // fp16/bf16 only
  b.dtype = b.y_type = DType::kBF16;
  EXPECT_FALSE(refused(b, "trans_mma"));
  b = ok;
  EXPECT_TRUE(refused(b, "trans_mma"));  // A x asked of a transposed-only version
  EXPECT_TRUE(refused(b, "mma_ring"));   // fp16/bf16 only
  b.dtype = b.y_type = DType::kBF16;
  EXPECT_FALSE(refused(b, "mma_ring"));
  b.lda = 12;  // rows not 16-byte aligned
  EXPECT_TRUE(refused(b, "mma_ring_16"));
  b.lda = 8;
  b.trans_a = true;  // A^T x asked of an A x version
  EXPECT_TRUE(refused(b, "mma_ring_32"));
  b = ok;
  EXPECT_TRUE(refused(b, "trans_split"));  // A x asked of a transposed-only version
  b.m = 0;
  EXPECT_TRUE(refused(b, ""));
  b = ok;
  b.y = nullptr;
  EXPECT_TRUE(refused(b, ""));

  EXPECT_EQ(kernels::LaunchGemv(ok, "no_such_variant", nullptr, nullptr), cudaErrorInvalidValue);
  b = ok;
  b.ncols = 9;
  EXPECT_EQ(kernels::LaunchGemv(b, "", nullptr, nullptr), cudaErrorInvalidValue);
}

// A transposed GEMV that splits k needs its workspace.
TEST(GemvWorkspace, SplitNeedsWorkspace) {
  GC_REQUIRE_GPU();
  DeviceArray a(size_t(65536) * 4 * sizeof(float)), x(65536 * sizeof(float)), y(4 * sizeof(float));
  GemvArgs args;
  args.m = 4;
  args.k = 65536;
  args.a = a.get();
  args.lda = 4;
  args.trans_a = true;
  args.x = x.get();
  args.y = y.get();
  ASSERT_GT(kernels::GemvWorkspaceBytes(args, "trans_split"), 0u);
  EXPECT_EQ(kernels::LaunchGemv(args, "trans_split", nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(kernels::GemvWorkspaceBytes(args, "trans_naive"), 0u);
}

// The launch plan of trans_mma and mma_ring (heuristics/gemv_heuristics.h),
// host only: every k index in exactly one split, splits a cluster can hold,
// one wave.
TEST(GemvTilePlan, CoversKInClusterSplits) {
  for (const auto& [m, k] : std::vector<std::pair<int64_t, int64_t>>{{1, 1},
                                                                     {1, 1000003},
                                                                     {1000003, 1},
                                                                     {16384, 16384},
                                                                     {4096, 4096},
                                                                     {1000, 100000},
                                                                     {50000, 1024},
                                                                     {3001, 2000},
                                                                     {100, 300},
                                                                     {8192, 1024}}) {
    for (int64_t resident : {264, 132, 1}) {
      for (int64_t step : {16, 128, 256}) {  // trans_mma's, mma_ring's
        const kernels::GemvTilePlan p = kernels::ChooseGemvTilePlan(m, k, resident, 0, step);
        SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(k) + " resident " +
                     std::to_string(resident) + " step " + std::to_string(step));
        EXPECT_TRUE(p.tile == 128 || p.tile == 64);
        EXPECT_EQ(p.tiles, (m + p.tile - 1) / p.tile);
        EXPECT_GE(p.splits, 1);
        EXPECT_LE(p.splits, kernels::kGemvMaxClusterSplits);
        EXPECT_EQ(p.rows_per_split % step, 0);
        EXPECT_GE(p.splits * p.rows_per_split, k);        // every row in a split
        EXPECT_LT((p.splits - 1) * p.rows_per_split, k);  // no empty split
        if (p.splits > 1) {
          EXPECT_LE(p.tiles * p.splits, std::max<int64_t>(resident, p.tiles));
          EXPECT_GE(p.rows_per_split, kernels::kGemvMinStepsPerSplit * step);
        }
      }
    }
  }
  // One CTA per SM on 132 SMs: the wide tile, split to fill the machine;
  // the narrow one where it fills as many CTAs with fewer splits.
  kernels::GemvTilePlan p = kernels::ChooseGemvTilePlan(16384, 16384, 132);
  EXPECT_EQ(p.tile, 128);
  EXPECT_EQ(p.splits, 1);
  p = kernels::ChooseGemvTilePlan(1000, 100000, 132);
  EXPECT_EQ(p.tile, 128);
  EXPECT_EQ(p.splits, 8);
  p = kernels::ChooseGemvTilePlan(4096, 4096, 132);
  EXPECT_EQ(p.tile, 64);
  EXPECT_EQ(p.splits, 2);
  EXPECT_EQ(kernels::ChooseGemvTilePlan(4096, 4096, 132, 128).splits, 4);  // a named width is kept
  // mma_ring: 1024 x 50000 in 64 tiles of 16 rows, 2 splits of 98 steps of
  // 256; tiles of 32 rows where they leave k unsplit.
  EXPECT_EQ(kernels::ChooseGemvRingTile(1024, 132), 16);
  p = kernels::ChooseGemvTilePlan(1024, 50000, 132, 16, 256);
  EXPECT_EQ(p.tiles, 64);
  EXPECT_EQ(p.splits, 2);
  EXPECT_EQ(p.rows_per_split, 25088);
  EXPECT_EQ(kernels::ChooseGemvRingTile(3001, 132), 32);
  EXPECT_EQ(kernels::ChooseGemvTilePlan(3001, 2000, 132, 32, 128).splits, 1);
  EXPECT_EQ(kernels::ChooseGemvRingTile(2000, 132), 16);
}

}  // namespace
}  // namespace gpucompute::testing
