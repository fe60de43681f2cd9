// Tests of the transpose ladder and of LaunchPermute: every version x shape x
// dtype against a CPU reference, bit for bit. Inputs are fresh random bits each
// run; outputs (and a guard region after them) are poisoned with 0xFF (NaN)
// before each launch, and the guard must stay untouched.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpucompute/kernels/transpose.h"
#include "tests/kernels/gpu_test_util.h"

namespace gpucompute::testing {
namespace {

using kernels::PermuteArgs;
using kernels::TransposeArgs;

constexpr size_t kGuardBytes = 256;

std::vector<uint8_t> RandomBytes(size_t n) {
  static std::mt19937_64 rng(std::random_device{}());
  std::vector<uint8_t> v(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x = rng();
    std::memcpy(&v[i], &x, 8);
  }
  for (; i < n; ++i) v[i] = uint8_t(rng());
  return v;
}

// Runs `launch(in, out)` on fresh random input of `n` elements and compares
// the output bytes with `expect(in_host)`; checks the guard after the output.
template <typename Launch, typename Expect>
void RunAndCompare(size_t n, DType t, size_t offset_elems, Launch launch, Expect expect) {
  const size_t es = kernels::DTypeSize(t);
  const std::vector<uint8_t> h_in = RandomBytes(n * es);
  DeviceArray in(n * es, offset_elems * es);
  DeviceArray out(n * es + kGuardBytes, offset_elems * es);
  ASSERT_NE(in.get(), nullptr);
  in.Upload(h_in.data());
  out.Poison();
  GC_ASSERT_CUDA(launch(in.get(), out.get()));
  GC_ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> got(n * es + kGuardBytes);
  out.Download(got.data());
  const std::vector<uint8_t> want = expect(h_in);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&got[i * es], &want[i * es], es) != 0 && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << "elements differ; first at " << first;
  for (size_t i = n * es; i < got.size(); ++i) {
    if (got[i] != 0xFF) {
      ADD_FAILURE() << "write past the end of the output at byte " << i - n * es;
      break;
    }
  }
}

// ---- Transpose ladder -------------------------------------------------------
struct TransposeCase {
  std::string variant;  // "" = default
  int64_t batch, rows, cols;
  DType dtype;
  size_t offset_elems;
};

std::string Name(const ::testing::TestParamInfo<TransposeCase>& info) {
  const TransposeCase& c = info.param;
  std::string s = (c.variant.empty() ? std::string("default") : c.variant) + "_B" +
                  std::to_string(c.batch) + "_R" + std::to_string(c.rows) + "_C" +
                  std::to_string(c.cols) + "_" + DTypeName(c.dtype);
  if (c.offset_elems) s += "_off" + std::to_string(c.offset_elems);
  return s;
}

std::vector<TransposeCase> TransposeCases() {
  struct Shape {
    int64_t b, r, c;
    size_t off;
  };
  const Shape shapes[] = {{1, 1, 1, 0},      {1, 1, 1000003, 0}, {1, 1000003, 1, 0},
                          {1, 31, 33, 0},    {1, 33, 31, 0},     {3, 64, 128, 0},
                          {2, 136, 72, 0},   {5, 128, 256, 0},   {1, 4097, 4099, 0},
                          {1, 1024, 1024, 0}, {2, 64, 64, 1},    {1, 256, 520, 1},
                          {3, 258, 130, 0},  {2, 2, 1000002, 0}, {1, 1000002, 2, 0},
                          {2, 190, 66, 2}};
  std::vector<std::string> variants = kernels::TransposeVariants();
  variants.insert(variants.begin(), "");
  std::vector<TransposeCase> v;
  for (const std::string& var : variants)
    for (const Shape& s : shapes)
      for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
        v.push_back({var, s.b, s.r, s.c, t, s.off});
  return v;
}

class TransposeTest : public ::testing::TestWithParam<TransposeCase> {};

TEST_P(TransposeTest, MatchesReference) {
  GC_REQUIRE_GPU();
  const TransposeCase& c = GetParam();
  // Same alignment as the device arrays below (cudaMalloc bases are 256-byte aligned).
  void* like = reinterpret_cast<void*>((uintptr_t(1) << 20) + c.offset_elems * DTypeSize(c.dtype));
  TransposeArgs probe{like, like, c.batch, c.rows, c.cols, c.dtype};
  if (kernels::Support s = kernels::CanImplementTranspose(probe, c.variant); !s)
    GTEST_SKIP() << c.variant << " does not run this case: " << s.reason;
  const size_t n = size_t(c.batch * c.rows * c.cols);
  const size_t es = DTypeSize(c.dtype);
  RunAndCompare(
      n, c.dtype, c.offset_elems,
      [&](void* in, void* out) {
        return kernels::LaunchTranspose({in, out, c.batch, c.rows, c.cols, c.dtype}, c.variant,
                                        nullptr);
      },
      [&](const std::vector<uint8_t>& in) {
        std::vector<uint8_t> out(in.size());
        for (int64_t b = 0; b < c.batch; ++b)
          for (int64_t r = 0; r < c.rows; ++r)
            for (int64_t col = 0; col < c.cols; ++col) {
              const size_t src = size_t((b * c.rows + r) * c.cols + col);
              const size_t dst = size_t((b * c.cols + col) * c.rows + r);
              std::memcpy(&out[dst * es], &in[src * es], es);
            }
        return out;
      });
}

INSTANTIATE_TEST_SUITE_P(Ladder, TransposeTest, ::testing::ValuesIn(TransposeCases()), Name);

// ---- Permute ----------------------------------------------------------------
struct PermuteCase {
  std::vector<int64_t> shape;
  std::vector<int> perm;
  DType dtype;
  std::string variant;
  size_t offset_elems;
};

std::string PermName(const ::testing::TestParamInfo<PermuteCase>& info) {
  const PermuteCase& c = info.param;
  std::string s = "S";
  for (size_t i = 0; i < c.shape.size(); ++i) s += (i ? "x" : "") + std::to_string(c.shape[i]);
  s += "_P";
  for (int p : c.perm) s += std::to_string(p);
  s += std::string("_") + DTypeName(c.dtype) + "_" + (c.variant.empty() ? "default" : c.variant);
  if (c.offset_elems) s += "_off" + std::to_string(c.offset_elems);
  return s;
}

std::vector<PermuteCase> PermuteCases() {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int>>> perms = {
      {{1000003}, {0}},                     // identity, rank 1
      {{7, 9}, {0, 1}},                     // identity, rank 2
      {{33, 31}, {1, 0}},                   // 2-D transpose
      {{1, 33, 1, 31}, {3, 0, 2, 1}},       // size-1 axes dropped -> 2-D transpose
      {{5, 31, 33}, {0, 2, 1}},             // batched transpose
      {{6, 40, 24}, {1, 2, 0}},             // merges to a 2-D transpose
      {{4, 6, 40}, {1, 0, 2}},              // last axis kept: row copy
      {{3, 5, 7, 9}, {2, 0, 1, 3}},         // row copy, odd row length
      {{2, 3, 4, 16}, {1, 2, 0, 3}},        // row copy, 16-byte rows
      {{2, 3, 4, 5}, {3, 2, 1, 0}},         // general
      {{17, 5, 33}, {2, 1, 0}},             // general
      {{3, 4, 5, 6}, {0, 3, 1, 2}},         // general
      {{8, 1, 16, 2}, {2, 1, 3, 0}},        // general with a size-1 axis
      {{64, 4, 64}, {2, 0, 1}},             // merges to a 2-D transpose
      {{3, 70, 5, 128}, {0, 2, 1, 3}},      // head permutation: row copy of 16-byte rows
      {{2, 33, 3, 3}, {0, 2, 1, 3}},        // row copy, 6- / 12-byte rows
      {{3, 5, 7, 9}, {1, 3, 0, 2}},         // general, odd extents
      {{5, 6, 40, 33}, {2, 0, 3, 1}},       // general, partial tiles on both sides
      {{70, 3, 66}, {2, 1, 0}},             // general, tiles of more than one block
      {{130, 3, 2, 70}, {3, 2, 1, 0}},      // general, two batch axes, partial 64-tiles
      {{4, 130, 5, 67}, {3, 1, 0, 2}},      // general, short output rows, two batch axes
  };
  std::vector<PermuteCase> v;
  for (const auto& [shape, perm] : perms)
    for (DType t : {DType::kF32, DType::kBF16})
      for (const char* var :
           {"", "smem_padded", "coarsened_64", "pairs", "row_copy", "row_copy_grouped", "tiled",
            "gather", "copy"})
        v.push_back({shape, perm, t, var, 0});
  v.push_back({{4, 6, 40}, {1, 0, 2}, DType::kF32, "", 1});
  v.push_back({{64, 4, 64}, {2, 0, 1}, DType::kF16, "", 1});
  v.push_back({{17, 5, 33}, {2, 1, 0}, DType::kF16, "", 1});
  return v;
}

class PermuteTest : public ::testing::TestWithParam<PermuteCase> {};

TEST_P(PermuteTest, MatchesReference) {
  GC_REQUIRE_GPU();
  const PermuteCase& c = GetParam();
  const int rank = int(c.shape.size());
  PermuteArgs a;
  a.rank = rank;
  a.dtype = c.dtype;
  size_t n = 1;
  for (int d = 0; d < rank; ++d) {
    a.shape[d] = c.shape[d];
    a.perm[d] = c.perm[d];
    n *= size_t(c.shape[d]);
  }
  {  // A route that does not apply to this permutation is refused: nothing to run.
    PermuteArgs probe = a;
    probe.in = reinterpret_cast<void*>(0x10000);
    probe.out = reinterpret_cast<void*>(0x20000);
    if (kernels::Support s = kernels::CanImplementPermute(probe, c.variant); !s)
      GTEST_SKIP() << c.variant << " does not run this permutation: " << s.reason;
  }
  const size_t es = DTypeSize(c.dtype);
  RunAndCompare(
      n, c.dtype, c.offset_elems,
      [&](void* in, void* out) {
        a.in = in;
        a.out = out;
        kernels::Support s = kernels::CanImplementPermute(a, c.variant);
        EXPECT_TRUE(s.ok) << s.reason;
        EXPECT_FALSE(kernels::PermuteVariantName(a, c.variant).empty());
        return kernels::LaunchPermute(a, c.variant, nullptr);
      },
      [&](const std::vector<uint8_t>& in) {
        std::vector<uint8_t> out(in.size());
        int64_t in_stride[4];
        in_stride[rank - 1] = 1;
        for (int d = rank - 2; d >= 0; --d) in_stride[d] = in_stride[d + 1] * c.shape[d + 1];
        for (size_t i = 0; i < n; ++i) {
          int64_t rest = int64_t(i), off = 0;
          for (int d = rank - 1; d >= 0; --d) {
            const int64_t ext = c.shape[c.perm[d]];
            off += (rest % ext) * in_stride[c.perm[d]];
            rest /= ext;
          }
          std::memcpy(&out[i * es], &in[size_t(off) * es], es);
        }
        return out;
      });
}

INSTANTIATE_TEST_SUITE_P(Routes, PermuteTest, ::testing::ValuesIn(PermuteCases()), PermName);

// ---- Refusals (host-side checks; no device needed) --------------------------
void* FakePtr(uintptr_t addr) { return reinterpret_cast<void*>(addr); }

TEST(TransposeRefusals, RejectsBadArguments) {
  TransposeArgs a{FakePtr(0x10000), FakePtr(0x20000), 1, 64, 64, DType::kF32};
  EXPECT_TRUE(kernels::CanImplementTranspose(a, "").ok);
  EXPECT_FALSE(kernels::CanImplementTranspose(a, "warp_tiled").ok);
  EXPECT_EQ(kernels::LaunchTranspose(a, "warp_tiled", nullptr), cudaErrorInvalidValue);

  TransposeArgs null_in = a;
  null_in.in = nullptr;
  EXPECT_FALSE(kernels::CanImplementTranspose(null_in, "naive").ok);
  EXPECT_EQ(kernels::LaunchTranspose(null_in, "naive", nullptr), cudaErrorInvalidValue);

  TransposeArgs odd_ptr = a;
  odd_ptr.in = FakePtr(0x10002);  // not 4-byte aligned
  EXPECT_FALSE(kernels::CanImplementTranspose(odd_ptr, "coarsened").ok);

  TransposeArgs neg = a;
  neg.rows = -1;
  EXPECT_FALSE(kernels::CanImplementTranspose(neg, "naive").ok);

  TransposeArgs odd_cols = a;
  odd_cols.cols = 66;  // not a multiple of 4
  EXPECT_FALSE(kernels::CanImplementTranspose(odd_cols, "coarsened_vec").ok);
  EXPECT_TRUE(kernels::CanImplementTranspose(odd_cols, "").ok);  // default falls back

  TransposeArgs mis16 = a;
  mis16.out = FakePtr(0x20004);  // 4-byte but not 16-byte aligned
  kernels::Support s = kernels::CanImplementTranspose(mis16, "coarsened_vec");
  EXPECT_FALSE(s.ok);
  EXPECT_FALSE(s.reason.empty());
  EXPECT_EQ(kernels::LaunchTranspose(mis16, "coarsened_vec", nullptr), cudaErrorInvalidValue);

  TransposeArgs h16 = a;
  h16.dtype = DType::kBF16;
  h16.cols = 68;  // multiple of 4 but not of 8
  EXPECT_FALSE(kernels::CanImplementTranspose(h16, "coarsened_vec").ok);

  TransposeArgs empty{nullptr, nullptr, 0, 5, 5, DType::kF32};
  EXPECT_TRUE(kernels::CanImplementTranspose(empty, "").ok);
  EXPECT_EQ(kernels::LaunchTranspose(empty, "", nullptr), cudaSuccess);
}

TEST(PermuteRefusals, RejectsBadArguments) {
  PermuteArgs a;
  a.in = FakePtr(0x10000);
  a.out = FakePtr(0x20000);
  a.rank = 3;
  a.shape[0] = 2, a.shape[1] = 3, a.shape[2] = 4;
  a.perm[0] = 2, a.perm[1] = 1, a.perm[2] = 0;
  EXPECT_TRUE(kernels::CanImplementPermute(a, "").ok);
  EXPECT_FALSE(kernels::CanImplementPermute(a, "nope").ok);

  PermuteArgs dup = a;
  dup.perm[2] = 1;
  EXPECT_FALSE(kernels::CanImplementPermute(dup, "").ok);
  EXPECT_EQ(kernels::LaunchPermute(dup, "", nullptr), cudaErrorInvalidValue);

  PermuteArgs big = a;
  big.rank = 5;
  EXPECT_FALSE(kernels::CanImplementPermute(big, "").ok);
  PermuteArgs zero = a;
  zero.rank = 0;
  EXPECT_FALSE(kernels::CanImplementPermute(zero, "").ok);

  PermuteArgs range = a;
  range.perm[0] = 3;
  EXPECT_FALSE(kernels::CanImplementPermute(range, "").ok);

  // A batched 2-D transpose with a variant that cannot run it.
  PermuteArgs tr = a;
  tr.shape[2] = 6;  // 6 is not a multiple of 4
  tr.perm[0] = 0, tr.perm[1] = 2, tr.perm[2] = 1;
  EXPECT_FALSE(kernels::CanImplementPermute(tr, "coarsened_vec").ok);
  EXPECT_TRUE(kernels::CanImplementPermute(tr, "smem").ok);
}

// The name of what runs, as shard timings report it: the default's route or
// rung, or the asked one; refused names give an empty name.
TEST(PermuteNames, NameTheRouteThatRuns) {
  auto args = [](std::vector<int64_t> shape, std::vector<int> perm, DType t) {
    PermuteArgs a;
    a.in = FakePtr(0x10000);
    a.out = FakePtr(0x20000);
    a.dtype = t;
    a.rank = int(shape.size());
    for (int i = 0; i < a.rank; ++i) a.shape[i] = shape[i], a.perm[i] = perm[i];
    return a;
  };
  const PermuteArgs heads = args({8, 512, 16, 128}, {0, 2, 1, 3}, DType::kBF16);
  EXPECT_EQ(kernels::PermuteVariantName(heads, ""), "row_copy");
  EXPECT_EQ(kernels::PermuteVariantName(heads, "row_copy_grouped"), "row_copy_grouped");
  EXPECT_EQ(kernels::PermuteVariantName(heads, "tiled"), "");  // keeps the last axis
  const PermuteArgs odd_rows = args({4, 7, 300, 65}, {0, 2, 1, 3}, DType::kF32);  // 260-byte rows
  EXPECT_EQ(kernels::PermuteVariantName(odd_rows, ""), "row_copy");
  const PermuteArgs general = args({64, 32, 64}, {2, 1, 0}, DType::kF32);
  EXPECT_EQ(kernels::PermuteVariantName(general, ""), "tiled");
  EXPECT_EQ(kernels::PermuteVariantName(general, "gather"), "gather");
  const PermuteArgs tiny = args({2, 3, 4, 5}, {3, 1, 2, 0}, DType::kF32);  // under one tile
  EXPECT_EQ(kernels::PermuteVariantName(tiny, ""), "gather");
  EXPECT_EQ(kernels::PermuteVariantName(general, "tiled"), "tiled");
  EXPECT_EQ(kernels::PermuteVariantName(general, "row_copy"), "");
  const PermuteArgs square = args({64, 64}, {1, 0}, DType::kF32);
  EXPECT_EQ(kernels::PermuteVariantName(square, ""), "coarsened_64");
  EXPECT_EQ(kernels::PermuteVariantName(square, "smem"), "smem");
  const PermuteArgs big16 = args({512, 1024}, {1, 0}, DType::kBF16);
  EXPECT_EQ(kernels::PermuteVariantName(big16, ""), "pairs");
  const PermuteArgs narrow16 = args({32, 3136, 64}, {0, 2, 1}, DType::kF16);  // C under 128
  EXPECT_EQ(kernels::PermuteVariantName(narrow16, ""), "pairs_64");
  EXPECT_EQ(kernels::PermuteVariantName(narrow16, "pairs"), "pairs");
  const PermuteArgs odd16 = args({3001, 2000}, {1, 0}, DType::kBF16);  // odd rows: no pairs
  EXPECT_EQ(kernels::PermuteVariantName(odd16, ""), "coarsened_64");
  EXPECT_EQ(kernels::PermuteVariantName(odd16, "pairs"), "");
  EXPECT_EQ(kernels::PermuteVariantName(square, "pairs"), "");  // 4-byte elements
  const PermuteArgs odd = args({63, 65}, {1, 0}, DType::kF32);
  EXPECT_EQ(kernels::PermuteVariantName(odd, ""), "coarsened_64");
  const PermuteArgs same = args({7, 9}, {0, 1}, DType::kF32);
  EXPECT_EQ(kernels::PermuteVariantName(same, ""), "copy");
  const auto& names = kernels::PermuteVariants();
  for (const char* n : {"row_copy", "row_copy_grouped", "tiled", "gather", "copy", "coarsened"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
}

}  // namespace
}  // namespace gpucompute::testing
